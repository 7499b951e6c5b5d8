"""The ``transcode_video`` operation (:mod:`hypermedia.engines.media.transcode`) on media these tests write
with PyAV; every output is decoded again with PyAV and its streams, sizes, durations and pixels
checked (issue 7's quality bar)."""

from __future__ import annotations

import itertools
import math
import re
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest

from hypermedia.core.errors import InvalidArgument, PermanentJobError
from hypermedia.engines.media import params as media_params
from hypermedia.engines.media.engine import OPERATION_ENTRIES
from hypermedia.engines.media.sources import MediaLimits
from hypermedia.engines.media.transcode import MAX_SIDE, plan_ladder, run, thread_need
from tests.helpers.media import RATE, _remux, with_a_late_audio_packet, write_mp3_with_cover, write_video

LIMITS = MediaLimits(max_input_bytes=100 * 1024 * 1024, threads=2)


def transcode(
    path: Path, tmp_path: Path, params: dict[str, Any] | None = None, limits: MediaLimits = LIMITS
) -> tuple[Path, list[Any]]:
    out_dir = tmp_path / "out"
    out_dir.mkdir(exist_ok=True)
    outputs = run("transcode_video", params or {}, path, out_dir, limits=limits)
    for output in outputs:
        assert (out_dir / output.filename).is_file()
        assert output.metadata["size_bytes"] == (out_dir / output.filename).stat().st_size
    return out_dir, outputs


def decoded(path: Path) -> dict[str, Any]:
    """The file decoded again: its streams, every video frame's pts and the first frame's pixels."""
    with av.open(str(path)) as container:
        video = container.streams.video[0]
        audio = container.streams.audio[0] if container.streams.audio else None
        facts: dict[str, Any] = {
            "format": container.format.name,
            "duration": container.duration / av.time_base,
            "metadata": dict(container.metadata),
            "video_codec": video.codec_context.name,
            "size": (video.codec_context.width, video.codec_context.height),
            "pix_fmt": video.codec_context.pix_fmt,
            "audio": None
            if audio is None
            else (audio.codec_context.name, audio.codec_context.sample_rate, audio.codec_context.channels),
            "streams": len(container.streams),
        }
        time_base = video.time_base
        pts: list[int] = []
        first = None
        for frame in container.decode(video=0):
            pts.append(frame.pts)
            if first is None:
                first = frame.to_ndarray(format="rgb24")
                facts["rotation"] = frame.rotation
        facts["pts"] = pts
        facts["time_base"] = time_base
        facts["first"] = first
        facts["video_seconds"] = float((pts[-1] - pts[0]) * time_base) + (
            float(np.median(np.diff(pts)) * time_base) if len(pts) > 1 else 0.0
        )
    return facts


def write_vfr(path: Path) -> Path:
    """2 s at 24 fps then 2 s at 30 fps (108 frames, 4.0 s) in a 1/90000 time base, with sound."""
    with av.open(str(path), "w") as container:
        video = container.add_stream("libx264", rate=30)
        video.width, video.height, video.pix_fmt = 320, 240, "yuv420p"
        video.codec_context.time_base = Fraction(1, 90000)
        video.options = {"preset": "ultrafast"}
        sound = container.add_stream("aac", rate=RATE, layout="stereo")
        stamps = [i * 3750 for i in range(48)] + [180000 + i * 3000 for i in range(60)]
        for i, pts in enumerate(stamps):
            image = np.zeros((240, 320, 3), np.uint8)
            image[:, : (i * 3) % 320] = 200
            frame = av.VideoFrame.from_ndarray(image, format="rgb24").reformat(format="yuv420p")
            frame.pts = pts
            container.mux(video.encode(frame))
        container.mux(video.encode(None))
        total = 4 * RATE
        for start in range(0, total, 1024):
            n = min(1024, total - start)
            t = np.arange(start, start + n) / RATE
            samples = (0.3 * np.sin(2 * math.pi * 440 * t)).astype(np.float32)
            frame = av.AudioFrame.from_ndarray(np.stack([samples, samples]), format="fltp", layout="stereo")
            frame.sample_rate, frame.pts = RATE, start
            container.mux(sound.encode(frame))
        container.mux(sound.encode(None))
    return path


def write_surround_with_tags(path: Path) -> Path:
    """1 s of video with 5.1 AAC at 44.1 kHz, a title and a location tag in the container."""
    with av.open(str(path), "w", options={"movflags": "+use_metadata_tags"}) as container:
        container.metadata["title"] = "secret title"
        container.metadata["location"] = "+48.8584+002.2945/"
        video = container.add_stream("libx264", rate=25)
        video.width, video.height, video.pix_fmt = 320, 240, "yuv420p"
        video.options = {"preset": "ultrafast"}
        sound = container.add_stream("aac", rate=44100, layout="5.1")
        for i in range(25):
            frame = av.VideoFrame.from_ndarray(np.full((240, 320, 3), i * 8, np.uint8), format="rgb24")
            frame = frame.reformat(format="yuv420p")
            frame.pts = i
            container.mux(video.encode(frame))
        container.mux(video.encode(None))
        for start in range(0, 44100, 1024):
            n = min(1024, 44100 - start)
            samples = np.full((6, n), 0.1, np.float32)
            frame = av.AudioFrame.from_ndarray(samples, format="fltp", layout="5.1")
            frame.sample_rate, frame.pts = 44100, start
            container.mux(sound.encode(frame))
        container.mux(sound.encode(None))
    return path


# --- the ladder ----------------------------------------------------------------------------------


def test_ladder_never_upscales_and_keeps_the_aspect_ratio() -> None:
    assert [(r.name, r.width, r.height) for r in plan_ladder(1920, 1080, [1080, 720, 480, 360])] == [
        ("1080p", 1920, 1080),
        ("720p", 1280, 720),
        ("480p", 854, 480),
        ("360p", 640, 360),
    ]
    assert [r.name for r in plan_ladder(640, 360, [1080, 720, 480, 360])] == ["360p"]
    # Nothing fits: the source's own size, sides even.
    assert [(r.name, r.width, r.height) for r in plan_ladder(321, 241, [720, 480])] == [("240p", 320, 240)]
    # Portrait: the rung is the short side.
    assert [(r.width, r.height) for r in plan_ladder(1080, 1920, [720])] == [(720, 1280)]
    # An extreme aspect ratio: the long side is held to MAX_SIDE.
    assert [(r.width, r.height) for r in plan_ladder(32000, 1000, [720])] == [(MAX_SIDE, 256)]


def test_params_are_normalised_and_checked() -> None:
    assert media_params.validate_params("transcode_video", None) == {
        "codec": "h264",
        "heights": [1080, 720, 480, 360],
        "quality": 23,
        "preset": "veryfast",
        "audio_bitrate": 128,
        "hls": False,
        "hls_segment_seconds": None,
    }
    # What the gateway stored is checked again by the worker: normalised params pass unchanged.
    for given in (None, {"codec": "vp9"}, {"hls": True}, {"hls": True, "hls_segment_seconds": 4}):
        normalised = media_params.validate_params("transcode_video", given)
        assert media_params.validate_params("transcode_video", normalised) == normalised
    for operation in ("transcode_audio", "poster", "waveform", "probe"):
        normalised = media_params.validate_params(operation, None)
        assert media_params.validate_params(operation, normalised) == normalised
    assert media_params.validate_params("transcode_video", {"codec": "vp9", "heights": [360, 720]})[
        "heights"
    ] == [720, 360]
    for bad in (
        {"codec": "hevc"},
        {"heights": []},
        {"heights": [720, 720]},
        {"heights": [100]},
        {"heights": "720"},
        {"quality": 52},
        {"codec": "vp9", "preset": "fast"},
        {"codec": "vp9", "hls": True},
        {"hls": "yes"},
        {"hls_segment_seconds": 4},
        {"hls_segment_seconds": 1},
        {"audio_bitrate": 8},
        {"bitrate": 1},
    ):
        with pytest.raises(InvalidArgument) as caught:
            media_params.validate_params("transcode_video", bad)
        assert caught.value.error_code == "INVALID_PARAMS", bad
    assert OPERATION_ENTRIES["transcode_video"] is run


def test_thread_need_covers_the_encoders() -> None:
    assert thread_need({"codec": "h264", "heights": [720, 480, 360]}, 2) == 5 + 3 * 5
    assert thread_need({"codec": "av1", "heights": [720]}, 1) == 4 + 48


# --- the quality bar -----------------------------------------------------------------------------


def test_h264_ladder_from_one_decode(tmp_path: Path) -> None:
    source = write_video(tmp_path / "in.mp4", seconds=2.0, width=640, height=360)
    out_dir, outputs = transcode(source, tmp_path, {"heights": [1080, 360, 240]})
    assert [o.output_type for o in outputs] == ["video_360p", "video_240p"]
    for output, size in zip(outputs, [(640, 360), (426, 240)], strict=True):
        assert output.mime_type == "video/mp4"
        facts = decoded(out_dir / output.filename)
        assert facts["format"].startswith("mov,mp4")
        assert (facts["video_codec"], facts["size"], facts["pix_fmt"]) == ("h264", size, "yuv420p")
        assert facts["audio"] == ("aac", 48000, 2)
        assert len(facts["pts"]) == 50 == output.metadata["frame_count"]
        assert abs(facts["video_seconds"] - 2.0) < 0.1
        assert abs(facts["duration"] - 2.0) < 0.1
        assert (output.metadata["width"], output.metadata["height"]) == size
    # Fast start: the index (moov) comes before the media data (mdat).
    data = (out_dir / outputs[0].filename).read_bytes()
    assert data.index(b"moov") < data.index(b"mdat")


def test_rotated_source_comes_out_upright(tmp_path: Path) -> None:
    source = write_video(tmp_path / "rot.mp4", seconds=0.8, rotation=-90)
    out_dir, [output] = transcode(source, tmp_path, {"heights": [240]})
    facts = decoded(out_dir / output.filename)
    assert facts["size"] == (240, 320)  # display size of the 320×240 source, swapped
    assert facts["rotation"] == 0 and output.metadata["rotation_applied"] == -90
    pixels = facts["first"]
    # The pattern's top half is blue; a quarter turn clockwise puts it on the right.
    assert pixels[:, 240 * 3 // 4 :, 2].mean() > 200
    assert pixels[:, : 240 // 4, 2].mean() < 100


def test_variable_frame_rate_keeps_every_frame_and_the_duration(tmp_path: Path) -> None:
    source = write_vfr(tmp_path / "vfr.mp4")
    out_dir, [output] = transcode(source, tmp_path, {"heights": [240]})
    facts = decoded(out_dir / output.filename)
    assert len(facts["pts"]) == 108
    steps = np.diff(facts["pts"]) * float(facts["time_base"])
    # 24 fps, then 30 fps: no run duplicated or dropped.
    assert np.allclose(steps[:47], 1 / 24, atol=1e-3) and np.allclose(steps[48:], 1 / 30, atol=1e-3)
    assert abs(facts["video_seconds"] - 4.0) < 0.1
    assert abs(facts["duration"] - 4.0) < 0.1


def write_ts_segment(
    path: Path,
    width: int,
    height: int,
    fill: int,
    first_pts: int,
    frames: int = 25,
    sar: Fraction | None = None,
) -> Path:
    """``frames`` frames (one second by default) of a flat grey picture as MPEG-TS at 25 fps
    without sound (:func:`write_video`)."""
    return write_video(
        path,
        seconds=frames / 25,
        width=width,
        height=height,
        audio=False,
        container_format="mpegts",
        fill=fill,
        first_pts=first_pts,
        sar=sar,
    )


def join(target: Path, *parts: Path) -> Path:
    """``cat parts > target``."""
    target.write_bytes(b"".join(part.read_bytes() for part in parts))
    return target


def frames_of(path: Path) -> list[Any]:
    with av.open(str(path)) as container:
        return [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]


def test_a_joined_recording_whose_size_changes_keeps_every_frame_and_its_shape(tmp_path: Path) -> None:
    """``cat a.ts b.ts``: 1 s of 320×240 grey, then 1 s of 160×240 white (a recording whose
    resolution changes, as browser and conference recordings do). The join's continuity-counter
    jump flags a packet corrupt; it is decoded all the same (it was dropped: 49 frames). The
    narrow part is fitted inside the 4:3 rendition with black bars, not stretched to it."""
    joined = join(
        tmp_path / "joined.ts",
        write_ts_segment(tmp_path / "a.ts", 320, 240, 128, 0),
        write_ts_segment(tmp_path / "b.ts", 160, 240, 255, 25),
    )
    out_dir, [output] = transcode(joined, tmp_path, {"heights": [240]})
    assert (output.metadata["width"], output.metadata["height"]) == (320, 240)
    assert output.metadata["frame_count"] == 50
    frames = frames_of(out_dir / output.filename)
    assert len(frames) == 50
    early, late = frames[10], frames[-1]
    assert abs(float(early.mean()) - 128) < 8  # the first part fills the picture
    # The 2:3 part: 160 px of white in the middle, 80 px of black on either side.
    assert float(late[:, 8:72].mean()) < 20 and float(late[:, 248:312].mean()) < 20
    assert float(late[:, 96:224].mean()) > 235


def test_a_broadcast_switching_from_4_3_to_16_9_is_letterboxed_not_stretched(tmp_path: Path) -> None:
    """720×576 throughout, the sample aspect ratio switching from 16:15 (4:3) to 64:45 (16:9), as
    DVB channels do between programmes: the ladder is 4:3 (the stream's first), and the 16:9 part
    is drawn 480×270 in the 480×360 rendition, bars above and below (it filled it, squashed)."""
    joined = join(
        tmp_path / "dvb.ts",
        write_ts_segment(tmp_path / "a.ts", 720, 576, 128, 0, sar=Fraction(16, 15)),
        write_ts_segment(tmp_path / "b.ts", 720, 576, 255, 25, sar=Fraction(64, 45)),
    )
    out_dir, [output] = transcode(joined, tmp_path, {"heights": [360]})
    assert (output.metadata["width"], output.metadata["height"]) == (480, 360)
    frames = frames_of(out_dir / output.filename)
    assert len(frames) == 50
    assert abs(float(frames[10].mean()) - 128) < 8
    late = frames[-1]  # 270 rows of white centred: 45 rows of black above and below
    assert float(late[4:40].mean()) < 20 and float(late[320:356].mean()) < 20
    assert float(late[60:300].mean()) > 235


def test_a_first_packet_flagged_corrupt_by_a_join_is_decoded(tmp_path: Path) -> None:
    """``cat`` of a two-frame piece and a second: MPEG-TS flags the packet before the join
    corrupt, here the first, and the job failed CORRUPT_INPUT; FFmpeg decodes all 27."""
    joined = join(
        tmp_path / "short-first.ts",
        write_ts_segment(tmp_path / "a.ts", 320, 240, 128, 0, frames=2),
        write_ts_segment(tmp_path / "b.ts", 320, 240, 128, 2),
    )
    with av.open(str(joined)) as container:
        assert next(container.demux(video=0)).is_corrupt
    out_dir, [output] = transcode(joined, tmp_path, {"heights": [240]})
    assert output.metadata["frame_count"] == 27 == len(frames_of(out_dir / output.filename))


@pytest.mark.parametrize("pix_fmt", ["yuv420p10le", "yuv444p"])
def test_ten_bit_and_444_become_8_bit_420(tmp_path: Path, pix_fmt: str) -> None:
    source = write_video(tmp_path / "in.mp4", seconds=0.8, pix_fmt=pix_fmt, audio=False)
    out_dir, [output] = transcode(source, tmp_path, {"heights": [240]})
    facts = decoded(out_dir / output.filename)
    assert facts["pix_fmt"] == "yuv420p" and len(facts["pts"]) == 20
    assert facts["audio"] is None and output.metadata["audio_codec"] is None
    assert facts["first"][:100, :, 2].mean() > 200  # the blue top half survives


def test_surround_audio_becomes_stereo_48k_and_metadata_is_stripped(tmp_path: Path) -> None:
    source = write_surround_with_tags(tmp_path / "tags.mp4")
    with av.open(str(source)) as container:
        assert container.metadata.get("title") == "secret title"
    out_dir, [output] = transcode(source, tmp_path, {"heights": [240]})
    facts = decoded(out_dir / output.filename)
    assert facts["audio"] == ("aac", 48000, 2)
    assert "title" not in facts["metadata"] and "location" not in facts["metadata"]
    assert facts["streams"] == 2


@pytest.mark.parametrize(
    ("codec", "container_format", "video_codec", "audio_codec", "mime"),
    [("vp9", "matroska,webm", "vp9", "opus", "video/webm"), ("av1", "mov,mp4", "av1", "aac", "video/mp4")],
)
def test_vp9_webm_and_av1(
    tmp_path: Path, codec: str, container_format: str, video_codec: str, audio_codec: str, mime: str
) -> None:
    source = write_video(tmp_path / "in.mp4", seconds=1.0)
    out_dir, [output] = transcode(source, tmp_path, {"codec": codec, "heights": [240]})
    assert output.mime_type == mime and output.metadata["codec"] == codec
    facts = decoded(out_dir / output.filename)
    assert facts["format"].startswith(container_format)
    assert facts["video_codec"] in (video_codec, f"lib{video_codec}", "libdav1d")
    assert facts["audio"][0] == audio_codec and facts["audio"][1:] == (48000, 2)
    assert len(facts["pts"]) == 25 and abs(facts["duration"] - 1.0) < 0.1


def test_hls_packaging(tmp_path: Path) -> None:
    source = write_video(tmp_path / "in.mp4", seconds=4.0, width=640, height=360)
    out_dir, outputs = transcode(
        source, tmp_path, {"heights": [360, 240], "hls": True, "hls_segment_seconds": 2}
    )
    by_type = {o.output_type: o for o in outputs}
    assert set(by_type) == {
        "video_360p",
        "video_240p",
        "hls_360p",
        "hls_360p_media",
        "hls_240p",
        "hls_240p_media",
        "hls_master",
    }
    master = (out_dir / by_type["hls_master"].filename).read_text()
    assert by_type["hls_master"].mime_type == "application/vnd.apple.mpegurl"
    variants = re.findall(r"#EXT-X-STREAM-INF:(.*)\n(\S+)", master)
    assert [uri for _, uri in variants] == ["hls_360p", "hls_240p"]
    assert "RESOLUTION=640x360" in variants[0][0] and 'CODECS="avc1.' in variants[0][0]
    assert all("FRAME-RATE=25.000" in attributes for attributes, _ in variants)
    for name in ("hls_360p", "hls_240p"):
        playlist = (out_dir / by_type[name].filename).read_text()
        media = (out_dir / by_type[f"{name}_media"].filename).read_bytes()
        assert "#EXT-X-ENDLIST" in playlist and f'#EXT-X-MAP:URI="{name}_media"' in playlist
        durations = [float(d) for d in re.findall(r"#EXTINF:([0-9.]+)", playlist)]
        assert durations == [2.0, 2.0]  # keyframes forced on the segment grid
        ranges = [(int(n), int(o)) for n, o in re.findall(r"BYTERANGE[:=]\"?(\d+)@(\d+)", playlist)]
        # Init section then the segments, back to back, covering the file.
        assert ranges[0][1] == 0 and sum(n for n, _ in ranges) == len(media)
        for (length, offset), (_, following) in itertools.pairwise(ranges):
            assert offset + length == following
        # The init section plus one segment decode on their own (what a player fetches).
        init_length = ranges[0][0]
        length, offset = ranges[2]
        piece = tmp_path / f"{name}_piece.mp4"
        piece.write_bytes(media[:init_length] + media[offset : offset + length])
        with av.open(str(piece)) as container:
            frames = sum(1 for _ in container.decode(video=0))
        assert frames == 50
        assert by_type[name].metadata["segments"] == 2


def test_video_without_sound(tmp_path: Path) -> None:
    source = write_video(tmp_path / "mute.mp4", seconds=0.8, audio=False)
    out_dir, [output] = transcode(source, tmp_path, {"heights": [240]})
    assert decoded(out_dir / output.filename)["streams"] == 1


# --- bad input -----------------------------------------------------------------------------------


def _error(
    path: Path, tmp_path: Path, params: dict[str, Any] | None = None, limits: MediaLimits = LIMITS
) -> PermanentJobError:
    with pytest.raises(PermanentJobError) as caught:
        transcode(path, tmp_path, params, limits)
    assert list((tmp_path / "out").iterdir()) == [] or caught.value.error_code == "MEDIA_TOO_LONG"
    return caught.value


def test_audio_only_has_no_video_stream(tmp_path: Path) -> None:
    error = _error(write_mp3_with_cover(tmp_path / "song.mp3", seconds=1.0), tmp_path)
    assert error.error_code == "NO_VIDEO_STREAM"


def test_truncated_mp4_is_corrupt(tmp_path: Path) -> None:
    source = write_video(tmp_path / "in.mp4", seconds=1.0)
    data = source.read_bytes()
    cut = tmp_path / "cut.mp4"
    cut.write_bytes(data[: data.index(b"moov") - 4])
    assert _error(cut, tmp_path).error_code == "CORRUPT_INPUT"


def test_longer_than_the_profile_allows_is_refused_before_encoding(tmp_path: Path) -> None:
    source = write_video(tmp_path / "in.mp4", seconds=2.0)
    limits = MediaLimits(max_input_bytes=LIMITS.max_input_bytes, max_duration_seconds=1.0, threads=1)
    error = _error(source, tmp_path, limits=limits)
    assert error.error_code == "MEDIA_TOO_LONG"
    assert list((tmp_path / "out").iterdir()) == []


def test_unknown_operation(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument):
        run("transcode", {}, tmp_path / "x", tmp_path, limits=LIMITS)


_GRAPH_THREADS = """
import os, sys
import av, av.filter
from hypermedia.engines.media.engine import bound_ffmpeg_cpus
assert bound_ffmpeg_cpus(int(sys.argv[1]))
before = len(os.listdir("/proc/self/task"))
graph = av.filter.Graph()  # threads left to FFmpeg, as PyAV's own resampler graphs are
source = graph.add_abuffer(format="fltp", sample_rate=48000, layout="stereo")
sink = graph.add("abuffersink")
source.link_to(sink)
graph.configure()
print(len(os.listdir("/proc/self/task")) - before)
"""


def test_ffmpeg_thread_pools_follow_the_job_not_the_node() -> None:
    """A filter graph left to FFmpeg starts a thread pool as large as FFmpeg's CPU count: told
    the node has 4 CPUs it starts 3 or more threads, bound to a job's one thread none."""
    import subprocess
    import sys

    def extra_threads(cpus: int) -> int:
        done = subprocess.run(
            [sys.executable, "-c", _GRAPH_THREADS, str(cpus)],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return int(done.stdout.strip())

    assert extra_threads(4) >= 3
    assert extra_threads(1) == 0


_TRANSCODE_THREADS = """
import os, sys, threading, time
from pathlib import Path
from hypermedia.engines.media import engine, transcode
from hypermedia.engines.media.sources import MediaLimits
engine.bound_ffmpeg_cpus(16)  # a 16-CPU node as FFmpeg sees it; engine.run bounds it again
params = {"codec": sys.argv[3], "heights": [360, 240, 144]}
base, peak, done = len(os.listdir("/proc/self/task")), [0], [False]
def watch():
    while not done[0]:
        peak[0] = max(peak[0], len(os.listdir("/proc/self/task")))
        time.sleep(0.001)
threading.Thread(target=watch, daemon=True).start()
engine.run("transcode_video", params, Path(sys.argv[1]), Path(sys.argv[2]), limits=MediaLimits(1 << 30, threads=2))
done[0] = True
print(peak[0] - base - 1, transcode.thread_need(params, 2))
"""


@pytest.mark.parametrize("codec", ["h264", "vp9"])
def test_a_ladder_stays_within_its_thread_need(tmp_path: Path, codec: str) -> None:
    """Three renditions with sound at 2 threads, on what FFmpeg is told is a 16-CPU node: the
    threads the job starts stay within :func:`thread_need`, which the worker adds to its
    ``RLIMIT_NPROC``."""
    import subprocess
    import sys

    source = write_video(tmp_path / "in.mp4", seconds=1.0, width=640, height=360)
    (tmp_path / "out").mkdir()
    done = subprocess.run(
        [sys.executable, "-c", _TRANSCODE_THREADS, str(source), str(tmp_path / "out"), codec],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    started, need = map(int, done.stdout.split())
    assert 0 < started <= need


# --- hostile timelines and packets (found by a hostile review) ----------------------------------


def test_a_damaged_packet_is_skipped_and_the_rest_transcoded(tmp_path: Path) -> None:
    """One video packet at 1 s of a 4 s clip replaced by noise: the transcode goes on past it (it
    used to stop there and complete with a quarter of the clip)."""
    source = write_video(tmp_path / "in.mp4", seconds=4.0)
    rng = np.random.default_rng(2)
    damaged = [False]

    def noise(packet: Any) -> Any:
        if packet.stream.type == "video" and not damaged[0] and packet.pts * packet.time_base >= 1:
            damaged[0] = True
            garbage = av.Packet(rng.integers(0, 256, packet.size, dtype=np.uint8).tobytes())
            garbage.pts, garbage.dts, garbage.time_base = packet.pts, packet.dts, packet.time_base
            return garbage
        return None

    out_dir, [output] = transcode(
        _remux(source, tmp_path / "damaged.mkv", noise), tmp_path, {"heights": [240]}
    )
    assert output.metadata["frame_count"] >= 95 and output.metadata["decode_errors"] >= 1
    assert abs(decoded(out_dir / output.filename)["duration"] - 4.0) < 0.1


def test_a_header_that_understates_the_length_is_refused_before_encoding(tmp_path: Path) -> None:
    """2 s of video and sound, then one audio packet stamped at 5 h: MEDIA_TOO_LONG from the
    demux pass, nothing encoded (it used to encode a 5-hour audio track)."""
    source = write_video(tmp_path / "in.mp4", seconds=2.0)
    error = _error(with_a_late_audio_packet(source, tmp_path / "late.mkv"), tmp_path)
    assert error.error_code == "MEDIA_TOO_LONG" and list((tmp_path / "out").iterdir()) == []


def test_timestamps_that_start_over_are_restamped(tmp_path: Path) -> None:
    """Two MPEG-TS recordings of 2 s joined byte for byte (the second starts its clock again):
    the sound's timestamps go back; the muxer used to refuse them (INTERNAL). The video keeps
    the frames whose time goes on, the sound is stamped by its sample count."""
    part = write_video(tmp_path / "part.ts", seconds=2.0, container_format="mpegts").read_bytes()
    joined = tmp_path / "joined.ts"
    joined.write_bytes(part + part)
    out_dir, [output] = transcode(joined, tmp_path, {"heights": [240]})
    facts = decoded(out_dir / output.filename)
    assert facts["audio"] == ("aac", 48000, 2) and output.metadata["frame_count"] >= 50
