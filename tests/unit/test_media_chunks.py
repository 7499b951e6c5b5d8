"""A long ``transcode_video`` cut into chunks, each encoded apart, then joined
(:mod:`hypermedia.engines.media.chunks`, issue 23 item 2): the joined renditions are checked
against one pass over the same file by decoding both (every frame, its timestamp and picture, the
sound, the duration), the HLS master is played through, and chunk files that are not what a
chunk encode writes for their place are refused."""

from __future__ import annotations

import itertools
import re
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest

from hypermedia.engines.media import chunks, transcode
from hypermedia.engines.media.chunks import Chunk, ChunkRefused
from hypermedia.engines.media.encoding import Encoded
from hypermedia.engines.media.hls import package_hls
from hypermedia.engines.media.passes import Plan
from hypermedia.engines.media.sources import MediaLimits
from tests.helpers.media import write_testsrc

LIMITS = MediaLimits(max_input_bytes=100 * 1024 * 1024, threads=2)
SECONDS, FPS = 24, 25


def write_source(path: Path, *extra: str, gop: int = FPS) -> Path:
    """24 s at 25 fps with sound, a keyframe every ``gop`` frames (:func:`write_testsrc`)."""
    return write_testsrc(path, *extra, seconds=SECONDS, fps=FPS, gop=gop)


def fan_out(source: Path, out_dir: Path, params: dict[str, Any], chunk_seconds: float = 8.0) -> list[Encoded]:
    """What the fanned-out job does: plan, every chunk apart (here one after the other), join."""
    out_dir.mkdir()
    plan = transcode.prepare("transcode_video", params, source, out_dir, LIMITS)
    planned = chunks.plan_chunks(plan, chunk_seconds)
    assert len(planned) == 3
    files: dict[str, list[Path]] = {r.name: [] for r in plan.ladder}
    errors = 0
    for chunk in planned:
        for encoded in chunks.encode_chunk(plan, chunk):
            files[encoded.rendition.name].append(encoded.path)
            errors += encoded.decode_errors
    return chunks.join(plan, planned, files, errors)


def pictures(path: Path) -> tuple[list[float], list[np.ndarray], int, float]:
    """Every video frame's presentation time (s) and grey picture, the sound's samples at 48 kHz,
    and the file's duration (s)."""
    with av.open(str(path)) as container:
        assert container.duration is not None
        duration = container.duration / av.time_base
        video = container.streams.video[0]
        assert video.time_base is not None
        times: list[float] = []
        grey: list[np.ndarray] = []
        for frame in container.decode(video):
            assert frame.pts is not None
            times.append(float(frame.pts * video.time_base))
            grey.append(frame.to_ndarray(format="gray").astype(np.int16))
    with av.open(str(path)) as container:
        samples = sum(frame.samples for frame in container.decode(audio=0))
    return times, grey, samples, duration


@pytest.mark.parametrize(
    "extra",
    [[], ["-output_ts_offset", "1.5"], ["-f", "matroska"]],
    ids=["mp4", "mp4 starting at 1.5 s", "matroska"],
)
def test_joined_chunks_are_one_passs_renditions(tmp_path: Path, extra: list[str]) -> None:
    source = write_source(tmp_path / ("in.mkv" if "matroska" in extra else "in.mp4"), *extra)
    params = {"heights": [240, 144]}
    (tmp_path / "one").mkdir()
    one = transcode.run("transcode_video", params, source, tmp_path / "one", limits=LIMITS)
    joined = fan_out(source, tmp_path / "joined", params)
    assert [e.rendition.name for e in joined] == ["240p", "144p"]
    for encoded, single in zip(joined, one, strict=True):
        times, grey, samples, duration = pictures(encoded.path)
        one_times, one_grey, one_samples, one_duration = pictures(tmp_path / "one" / single.filename)
        # Every frame at one pass's time: 600 frames 40 ms apart, across both joins (the
        # source starting at 1.5 s has its video 23 ms after its sound, as one pass has it).
        assert encoded.frames == len(times) == len(one_times) == SECONDS * FPS
        assert times == one_times and times[0] < 0.03
        assert set(np.round(np.diff(times), 6)) == {0.04}
        # One pass's duration is in MP4's default whole milliseconds, the join's in the video's
        # time scale (chunks.py: _Joined).
        assert abs(duration - one_duration) < 0.001 and samples == one_samples
        assert abs(samples / 48_000 - SECONDS) < 0.05
        # Each joined frame is the same picture as one pass's: closer to it than any two
        # consecutive pictures of the moving pattern are to each other (no frame shifted).
        same = [np.abs(a - b).mean() for a, b in zip(grey, one_grey, strict=True)]
        consecutive = [np.abs(a - b).mean() for a, b in itertools.pairwise(one_grey)]
        assert max(same) < min(consecutive)
        assert encoded.has_audio and encoded.decode_errors == 0 and not encoded.resumed


def play_hls(out_dir: Path, master: str) -> tuple[list[float], int]:
    """What a player of ``master`` does for each rendition it lists: the init section and every
    segment's byte range of the media file, in order, decoded. Returns each rendition's frame
    count (asserted equal) and the segment lengths of the first."""
    variants = re.findall(r"#EXT-X-STREAM-INF:.*\n(\S+)", (out_dir / master).read_text())
    assert variants
    counts: set[int] = set()
    lengths: list[float] = []
    for name in variants:
        playlist = (out_dir / f"{name}.m3u8").read_text()
        media = (out_dir / f"{name}_media.mp4").read_bytes()
        ranges = [(int(n), int(o)) for n, o in re.findall(r"BYTERANGE[:=]\"?(\d+)@(\d+)", playlist)]
        played = out_dir / f"{name}_played.mp4"
        played.write_bytes(b"".join(media[o : o + n] for n, o in ranges))
        times, _, _, _ = pictures(played)
        assert set(np.round(np.diff(times), 6)) == {0.04}
        counts.add(len(times))
        lengths = lengths or [float(d) for d in re.findall(r"#EXTINF:([0-9.]+)", playlist)]
    [count] = counts
    return lengths, count


def test_hls_of_joined_chunks_plays_through_with_every_segment_on_the_grid(tmp_path: Path) -> None:
    source = write_source(tmp_path / "in.mp4")
    params = {"heights": [240, 144], "hls": True, "hls_segment_seconds": 2}
    plan = transcode.prepare("transcode_video", params, source, tmp_path, LIMITS)
    # Chunks start on the segment grid, though 8 s falls between keyframes every second too.
    assert [c.start_seconds for c in chunks.plan_chunks(plan, 7.0)] == [0.0, 8.0, 16.0]
    joined = fan_out(source, tmp_path / "joined", params, chunk_seconds=7.0)
    outputs = package_hls(joined, tmp_path / "joined", plan.frame_rate, 2)
    assert [o.output_type for o in outputs][-1] == "hls_master"
    lengths, frames = play_hls(tmp_path / "joined", "hls_master.m3u8")
    assert frames == SECONDS * FPS
    assert lengths == [2.0] * 12


def test_plans_cut_only_what_can_be_joined(tmp_path: Path) -> None:
    source = write_source(tmp_path / "in.mp4")

    def planned(params: dict[str, Any], seconds: float, path: Path = source) -> list[Chunk]:
        plan = transcode.prepare("transcode_video", params, path, tmp_path, LIMITS)
        return chunks.plan_chunks(plan, seconds)

    whole = [Chunk(0, None, None, 0.0)]
    assert [c.start_seconds for c in planned({"heights": [240]}, 10.0)] == [0.0, 10.0]  # 4 s tail joined
    assert [c.start_seconds for c in planned({"heights": [240]}, 9.0)] == [0.0, 9.0, 18.0]
    cut = planned({"heights": [240]}, 9.0)
    assert cut[1].first_pts == cut[0].end_pts and cut[2].end_pts is None
    assert planned({"heights": [240]}, 30.0) == whole  # shorter than two chunks
    assert planned({"heights": [240], "codec": "vp9"}, 9.0) == whole  # H.264 joins only
    avi = write_source(tmp_path / "in.avi", "-f", "avi")
    assert planned({"heights": [240]}, 9.0, avi) == whole  # AVI stamps decode order
    # Keyframes every 10 s: the last chunk starts at the last keyframe and runs 4 s to the end.
    sparse = write_source(tmp_path / "sparse.mp4", gop=250)
    assert [c.start_seconds for c in planned({"heights": [240]}, 8.0, sparse)] == [0.0, 10.0, 20.0]
    one_keyframe = write_source(tmp_path / "long_gop.mp4", gop=10_000)
    assert planned({"heights": [240]}, 9.0, one_keyframe) == whole


@pytest.fixture(scope="module")
def chunk_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Plan, list[Chunk], dict[str, list[Path]]]:
    """A plan of three chunks of 8 s and their encoded files, per rendition."""
    tmp_path = tmp_path_factory.mktemp("chunks")
    source = write_source(tmp_path / "in.mp4")
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    plan = transcode.prepare("transcode_video", {"heights": [240, 144]}, source, out_dir, LIMITS)
    planned = chunks.plan_chunks(plan, 8.0)
    files: dict[str, list[Path]] = {r.name: [] for r in plan.ladder}
    for chunk in planned:
        for encoded in chunks.encode_chunk(plan, chunk):
            files[encoded.rendition.name].append(encoded.path)
    return plan, planned, files


def test_chunks_out_of_place_are_refused(
    chunk_files: tuple[Plan, list[Chunk], dict[str, list[Path]]], tmp_path: Path
) -> None:
    plan, planned, files = chunk_files
    high, low = files["240p"], files["144p"]

    def refused(*chunks_240p: Path) -> tuple[int, str]:
        with pytest.raises(ChunkRefused) as caught:
            chunks.join(plan, planned, {"240p": list(chunks_240p), "144p": low}, 0)
        return caught.value.index, caught.value.reason

    at_its_start = "it does not start with a keyframe at its chunk's start"
    assert refused(high[0], low[1], high[2]) == (1, "not H.264 at 320×240")  # another rendition's
    assert refused(high[0], high[2], high[1]) == (1, at_its_start)  # out of order
    assert refused(high[0], high[1], high[1]) == (2, at_its_start)  # one twice
    assert refused(high[0], high[1]) == (2, "chunks missing or too many")  # the last missing
    # A chunk that runs on into the next one's frames.
    (tmp_path / "long").mkdir()
    longer = replace(plan, out_dir=tmp_path / "long")
    [too_long, _] = chunks.encode_chunk(longer, replace(planned[1], end_pts=None))
    assert refused(high[0], too_long.path, high[2]) == (1, "it has frames of the next chunk")
    # Not a chunk at all: text, a Matroska file, a chunk of other encoder settings.
    text = tmp_path / "text.mp4"
    text.write_text("not a video")
    assert refused(high[0], text, high[2])[1].startswith("unreadable")
    mkv = tmp_path / "chunk.mkv"
    subprocess.run(
        ["ffmpeg", "-v", "error", "-i", str(high[1]), "-c", "copy", "-f", "matroska", str(mkv)], check=True
    )
    assert refused(high[0], mkv, high[2])[0] == 1
    other = tmp_path / "other.mp4"
    subprocess.run(
        ["ffmpeg", "-v", "error", "-i", str(high[1]), "-c:v", "libx264", "-preset", "ultrafast", str(other)],
        check=True,
    )
    assert refused(high[0], other, high[2]) == (1, "its parameter sets differ from the other chunks'")
    # And the chunks in their places join.
    assert [e.frames for e in chunks.join(plan, planned, files, 0)] == [SECONDS * FPS] * 2


# --- files a hostile review found (each once broke the contract: made in chunks, a file gives
# --- what one pass gives, or is made without chunks) ---------------------------------------


def _one_pass_and_chunked(source: Path, tmp_path: Path, params: dict[str, Any] | None = None) -> list[Any]:
    """The file's outputs in one pass and through ``run`` with chunks of 4 s (or without chunks,
    where it cannot be cut): the same frame times, sound samples and decode errors."""
    params = params or {"heights": [240]}
    results = []
    for name, seconds in (("one", None), ("chunked", 4.0)):
        out = tmp_path / name / "output"
        out.mkdir(parents=True)
        limits = MediaLimits(max_input_bytes=1 << 30, threads=2, part_seconds=seconds)
        [video] = [
            o
            for o in transcode.run("transcode_video", params, source, out, limits=limits)
            if o.output_type == "video_240p"
        ]
        times, _, samples, _ = pictures(out / video.filename)
        results.append((times, samples, video.metadata["decode_errors"], video.metadata["frame_count"]))
    assert results[0] == results[1]
    return sorted(p.name for p in (tmp_path / "chunked" / "checkpoints").glob("*.zip"))


def test_a_frame_rate_that_drops_at_a_chunks_start_joins(tmp_path: Path) -> None:
    """30, 20 then 30 fps, keyframes where the rate changes: x264 starts the 20 fps chunk's
    decode times further before its first frame than the chunk before ends them; the join
    moves them up (a phone in low light)."""
    source = tmp_path / "vfr.mp4"
    parts = "testsrc2=s=320x240:r=30:d=8[a];testsrc2=s=320x240:r=20:d=8[b];testsrc2=s=320x240:r=30:d=8[c]"
    picture = ["-f", "lavfi", "-i", f"{parts};[a][b][c]concat=n=3"]
    video = [
        "-c:v",
        "libx264",
        "-preset",
        "veryfast",
        "-g",
        "250",
        "-force_key_frames",
        "8,16",
        "-fps_mode",
        "vfr",
    ]
    sound = ["-f", "lavfi", "-i", "sine=sample_rate=44100"]
    video += ["-video_track_timescale", "90000", "-c:a", "aac"]
    subprocess.run(["ffmpeg", "-v", "error", *picture, *sound, "-t", "24", *video, str(source)], check=True)
    assert _one_pass_and_chunked(source, tmp_path) == ["c-0000.zip", "c-0001.zip"]


def test_recovery_points_flagged_as_keyframes_are_no_chunk_starts(tmp_path: Path) -> None:
    """x264's periodic intra refresh: FFmpeg flags its recovery points as keyframes, but
    decoding from one shows nothing until the refresh is complete. Only the first frame is an
    IDR picture: no chunks (the ladder of one rendition is then made in one pass)."""
    source = write_source(tmp_path / "refresh.mp4", "-x264-params", "intra-refresh=1:keyint=25")
    plan = transcode.prepare("transcode_video", {"heights": [240]}, source, tmp_path, LIMITS)
    assert chunks.plan_chunks(plan, 4.0) == [Chunk(0, None, None, 0.0)]
    assert _one_pass_and_chunked(source, tmp_path) == []


def _remux(source: Path, target: Path, change: Any) -> Path:
    """``source``'s packets into ``target`` (MP4), each video packet through ``change``."""
    with av.open(str(source)) as given, av.open(str(target), "w", format="mp4") as out:
        streams = {s.index: out.add_stream_from_template(s) for s in given.streams}
        for packet in given.demux():
            if packet.dts is None:
                continue
            index = packet.stream.index
            if packet.stream.type == "video":
                packet = change(packet)
            packet.stream = streams[index]
            out.mux(packet)
    return target


def test_damage_bunched_in_one_chunk_is_judged_over_the_whole_file(tmp_path: Path) -> None:
    """Non-key packets between 8 s and 11.2 s made undecodable: 76 of 600 attempts fail, within
    one pass's bound; within their chunk they would pass it. Counted once, not again by the
    chunk before (which decodes a few packets past its end)."""
    source = write_source(tmp_path / "in.mp4")

    def damaged(packet: Any) -> Any:
        if packet.is_keyframe or not 8.0 <= float(packet.pts * packet.time_base) < 11.2:
            return packet
        broken = av.Packet(b"\x7f\xff\xff\xff" + bytes(packet)[4:])
        broken.pts, broken.dts, broken.time_base = packet.pts, packet.dts, packet.time_base
        return broken

    target = _remux(source, tmp_path / "damaged.mp4", damaged)
    assert len(_one_pass_and_chunked(target, tmp_path)) == 5


def test_an_index_listing_only_the_first_keyframe_is_made_without_chunks(tmp_path: Path) -> None:
    """Every sync-sample entry of the MP4 index points at the first frame, though an IDR picture
    starts every second: each chunk's seek would land at 0 and decode the file again up to its
    window (60 chunks: 30 times the decoding). A seek that lands more than a chunk before its
    window gives the file up to one pass."""
    data = bytearray(write_source(tmp_path / "in.mp4").read_bytes())
    at = data.find(b"stss")
    count = int.from_bytes(data[at + 8 : at + 12], "big")
    data[at + 12 : at + 12 + 4 * count] = (1).to_bytes(4, "big") * count
    (tmp_path / "one_sync_sample.mp4").write_bytes(bytes(data))
    parts = _one_pass_and_chunked(tmp_path / "one_sync_sample.mp4", tmp_path)
    # Chunk 1's seek landed 4 s before it, its own length; chunk 2's 8 s: given up there.
    assert parts == ["c-0000.zip", "c-0001.zip"]


def test_a_frame_stamped_into_the_next_chunk_is_no_file_to_cut(tmp_path: Path) -> None:
    """No B-frames, the 61st packet of every 100 stamped 2 s later than it is: one pass drops the
    frames shown before that time until time passes it; a chunk's window would keep them (361
    frames against one pass's 316, found at the end of a review). A packet decoded before a
    clean keyframe but shown at or after it makes the plan untrusted: no chunks."""
    source = write_source(tmp_path / "in.mp4", "-bf", "0")
    moved = tmp_path / "moved.mp4"
    with av.open(str(source)) as given, av.open(str(moved), "w", format="mp4") as out:
        streams = {s.index: out.add_stream_from_template(s) for s in given.streams}
        video_packets = 0
        for packet in given.demux():
            if packet.dts is None:
                continue
            index = packet.stream.index
            if packet.stream.type == "video":
                if video_packets % 100 == 60:
                    assert packet.pts is not None and packet.time_base is not None
                    packet.pts += round(2.0 / packet.time_base)
                video_packets += 1
            packet.stream = streams[index]
            out.mux(packet)
    plan = transcode.prepare("transcode_video", {"heights": [240]}, moved, tmp_path, LIMITS)
    assert chunks.plan_chunks(plan, 4.0) == [Chunk(0, None, None, 0.0)]
    assert _one_pass_and_chunked(moved, tmp_path) == []
