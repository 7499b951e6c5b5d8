"""The ``probe`` operation (:mod:`hypermedia.engines.media.probe`) on media these tests write with PyAV:
test patterns and tones, no fixture files."""

from __future__ import annotations

import json
import os
import threading
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest

from hypermedia.core.errors import InvalidArgument, PermanentJobError
from hypermedia.engines.media import params as media_params
from hypermedia.engines.media import sources as sources_module
from hypermedia.engines.media.probe import run
from hypermedia.engines.media.sources import MediaLimits
from tests.helpers.media import RATE, _mux_audio, _pattern, write_adts, write_mp3_with_cover, write_video

LIMITS = MediaLimits(max_input_bytes=100 * 1024 * 1024)


# --- media the tests write ---------------------------------------------------------------------


def probe(path: Path, tmp_path: Path, limits: MediaLimits = LIMITS) -> dict[str, Any]:
    out_dir = tmp_path / "out"
    out_dir.mkdir(exist_ok=True)
    outputs = run("probe", {}, path, out_dir, limits=limits)
    assert [(o.output_type, o.filename, o.mime_type) for o in outputs] == [
        ("probe", "probe.json", "application/json")
    ]
    report = json.loads((out_dir / "probe.json").read_text())
    assert outputs[0].metadata["duration_seconds"] == report["duration_seconds"]
    assert outputs[0].metadata["size_bytes"] == (out_dir / "probe.json").stat().st_size
    return report


def video_streams(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for s in report["streams"] if s["type"] == "video" and not s["attached_picture"]]


# --- params ------------------------------------------------------------------------------------


def test_probe_takes_no_params() -> None:
    assert media_params.validate_params("probe", None) == {}
    assert media_params.validate_params("probe", {}) == {}
    with pytest.raises(InvalidArgument) as err:
        media_params.validate_params("probe", {"deep": True})
    assert err.value.error_code == "INVALID_PARAMS"
    with pytest.raises(InvalidArgument) as err:
        media_params.validate_params("probe", ["deep"])
    assert err.value.error_code == "INVALID_PARAMS"
    with pytest.raises(InvalidArgument) as err:
        media_params.validate_params("transcode", {})
    assert err.value.error_code == "UNKNOWN_OPERATION"


# --- what probe reports ------------------------------------------------------------------------


def test_mp4_h264_aac(tmp_path: Path) -> None:
    path = write_video(tmp_path / "pattern.mp4")
    report = probe(path, tmp_path)
    assert report["container"]["format"] == "mov,mp4,m4a,3gp,3g2,mj2"
    assert report["container"]["long_name"]
    assert report["duration_seconds"] == pytest.approx(2.0, abs=0.05)
    assert report["duration_source"] == "header"
    assert report["size_bytes"] == path.stat().st_size
    assert report["bit_rate"] > 0
    assert report["chapters"] == []
    video, audio = report["streams"]
    assert video["type"] == "video" and video["index"] == 0
    assert video["codec"] == "h264"
    assert video["profile"]  # libx264 ultrafast: Constrained Baseline
    assert (video["width"], video["height"]) == (320, 240)
    assert (video["display_width"], video["display_height"]) == (320, 240)
    assert video["rotation"] == 0
    assert video["pix_fmt"] == "yuv420p" and video["bit_depth"] == 8
    assert video["average_frame_rate"] == pytest.approx(25.0)
    assert video["nominal_frame_rate"] == pytest.approx(25.0)
    assert video["frame_count"] == 50
    assert video["attached_picture"] is False
    assert audio["type"] == "audio" and audio["codec"] == "aac" and audio["profile"] == "LC"
    assert audio["sample_rate"] == RATE
    assert audio["channels"] == 2 and audio["channel_layout"] == "stereo"
    assert audio["duration_seconds"] == pytest.approx(2.0, abs=0.05)


def test_display_matrix_rotation_swaps_the_display_size(tmp_path: Path) -> None:
    path = write_video(tmp_path / "portrait.mp4", rotation=-90, audio=False)
    (video,) = video_streams(probe(path, tmp_path))
    assert video["rotation"] == -90  # as ffprobe reports a phone's portrait video
    assert (video["width"], video["height"]) == (320, 240)
    assert (video["display_width"], video["display_height"]) == (240, 320)


def test_ten_bit_video(tmp_path: Path) -> None:
    path = write_video(tmp_path / "ten.mkv", pix_fmt="yuv420p10le", seconds=0.4, audio=False)
    report = probe(path, tmp_path)
    assert report["container"]["format"] == "matroska,webm"
    (video,) = video_streams(report)
    assert video["codec"] == "h264" and video["profile"] == "High 10"
    assert video["pix_fmt"] == "yuv420p10le"
    assert video["bit_depth"] == 10


def test_mp3_cover_art_is_an_attached_picture(tmp_path: Path) -> None:
    report = probe(write_mp3_with_cover(tmp_path / "song.mp3"), tmp_path)
    assert report["container"]["format"] == "mp3"
    assert report["duration_seconds"] == pytest.approx(3.0, abs=0.05)
    (audio,) = [s for s in report["streams"] if s["type"] == "audio"]
    assert audio["codec"] == "mp3" and audio["sample_rate"] == RATE and audio["channels"] == 2
    (cover,) = [s for s in report["streams"] if s["attached_picture"]]
    assert cover["codec"] == "png" and (cover["width"], cover["height"]) == (64, 64)
    assert cover["average_frame_rate"] is None
    assert video_streams(report) == []


def test_adts_without_a_header_duration_is_demuxed(tmp_path: Path) -> None:
    path = write_adts(tmp_path / "speech.aac", seconds=6.0, noise_seconds=1.0)
    with av.open(str(path)) as container:  # what FFmpeg alone says: an estimate from the bit rate
        assert container.duration is not None
        assert abs(container.duration / av.time_base - 6.0) > 1.0
    report = probe(path, tmp_path)
    assert report["container"]["format"] == "aac"
    assert report["duration_source"] == "packets"
    # 6.0 s of samples, plus the encoder's 1024 samples of priming (21 ms), in whole frames.
    assert report["duration_seconds"] == pytest.approx(6.0, abs=0.05)


def test_matroska_without_duration_is_demuxed(tmp_path: Path) -> None:
    path = write_video(tmp_path / "live.mkv", container_format="matroska", options={"live": "1"})
    with av.open(str(path)) as container:
        assert container.duration is None
    report = probe(path, tmp_path)
    assert report["duration_source"] == "packets"
    assert report["duration_seconds"] == pytest.approx(2.0, abs=0.05)
    (video,) = video_streams(report)
    assert video["frame_count"] == 50  # counted while demuxing


def test_mpeg_ts_duration_from_packets(tmp_path: Path) -> None:
    report = probe(write_video(tmp_path / "stream.ts", container_format="mpegts"), tmp_path)
    assert report["container"]["format"] == "mpegts"
    assert report["duration_source"] == "packets"
    assert report["duration_seconds"] == pytest.approx(2.0, abs=0.05)


def test_chapters(tmp_path: Path) -> None:
    path = tmp_path / "chapters.mkv"
    with av.open(str(path), "w") as container:
        video = container.add_stream("libx264", rate=25)
        video.width, video.height, video.pix_fmt = 64, 48, "yuv420p"
        container.set_chapters(
            [
                {
                    "id": 1,
                    "start": 0,
                    "end": 1000,
                    "time_base": Fraction(1, 1000),
                    "metadata": {"title": "One"},
                },
                {"id": 2, "start": 1000, "end": 2000, "time_base": Fraction(1, 1000), "metadata": {}},
            ]
        )
        for i in range(50):
            frame = av.VideoFrame.from_ndarray(_pattern(i, 64, 48), format="rgb24").reformat(format="yuv420p")
            frame.pts = i
            container.mux(video.encode(frame))
        container.mux(video.encode(None))
    report = probe(path, tmp_path)
    assert report["chapters"] == [
        {"start_seconds": 0.0, "end_seconds": 1.0, "title": "One"},
        {"start_seconds": 1.0, "end_seconds": 2.0, "title": None},
    ]


# --- bad input ---------------------------------------------------------------------------------


def _error(path: Path, tmp_path: Path, limits: MediaLimits = LIMITS) -> PermanentJobError:
    with pytest.raises(PermanentJobError) as err:
        probe(path, tmp_path, limits)
    assert str(tmp_path) not in err.value.public_message
    return err.value


def test_mp4_without_moov_is_corrupt(tmp_path: Path) -> None:
    whole = write_video(tmp_path / "whole.mp4").read_bytes()
    assert whole.find(b"moov") > len(whole) // 2  # PyAV writes the index at the end
    cut = tmp_path / "cut.mp4"
    cut.write_bytes(whole[: len(whole) // 2])
    error = _error(cut, tmp_path)
    assert error.error_code == "CORRUPT_INPUT"
    assert "moov" in error.public_message


def test_mp4_cut_inside_its_first_frame_is_corrupt(tmp_path: Path) -> None:
    path = write_video(tmp_path / "faststart.mp4", options={"movflags": "faststart"})
    whole = path.read_bytes()
    mdat = whole.find(b"mdat")
    assert 0 < whole.find(b"moov") < mdat  # the index first
    cut = tmp_path / "cut.mp4"
    cut.write_bytes(whole[: mdat + 4 + 100])  # 100 bytes into the first frame
    error = _error(cut, tmp_path)
    assert error.error_code == "CORRUPT_INPUT"
    assert "truncated" in error.public_message


def test_matroska_cut_inside_its_first_frame_is_corrupt(tmp_path: Path) -> None:
    # Matroska has no sample index to check: the first frame's decode finds the cut.
    whole = write_video(tmp_path / "whole.mkv", audio=False).read_bytes()
    cluster = whole.find(b"\x1f\x43\xb6\x75")  # the first Cluster
    cut = tmp_path / "cut.mkv"
    cut.write_bytes(whole[: cluster + 40])
    assert _error(cut, tmp_path).error_code == "CORRUPT_INPUT"


@pytest.mark.parametrize("sniff", [True, False], ids=["sniffed", "whitelist-only"])
def test_hls_playlist_is_refused_without_reading_its_segments(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sniff: bool
) -> None:
    segment = write_video(tmp_path / "segment.ts", container_format="mpegts")
    playlist = "#EXTM3U\n#EXT-X-TARGETDURATION:10\n#EXTINF:2.0,\n{}\n#EXT-X-ENDLIST\n"
    readable = tmp_path / "readable.m3u8"
    readable.write_text(playlist.format(segment))
    with av.open(str(readable)) as container:  # FFmpeg unguarded: the hls demuxer reads the segment
        assert container.format.name == "hls" and len(container.streams.video) == 1
    if not sniff:
        # Without the #EXTM3U check, FFmpeg's format whitelist alone must refuse the hls demuxer
        # it probed, before that demuxer reads its header (and the segments).
        monkeypatch.setattr(sources_module, "_PLAYLIST_PREFIXES", ())
    # The segment is a FIFO: opening it would block, so a probe that returns opened no segment.
    fifo = tmp_path / "segment-fifo.ts"
    os.mkfifo(fifo)
    for name, target in (
        ("passwd.m3u8", "/etc/passwd"),
        ("fifo.m3u8", str(fifo)),
        ("fifo-as.mp4", str(fifo)),
    ):
        path = tmp_path / name
        path.write_text(playlist.format(target))
        outcome: list[BaseException] = []
        worker = threading.Thread(target=_run_catching, args=(path, tmp_path, outcome))
        worker.start()
        worker.join(timeout=20)
        if worker.is_alive():
            os.close(os.open(fifo, os.O_WRONLY))  # release the blocked reader, then fail
            worker.join()
            pytest.fail(f"probing {name} opened the playlist's segment")
        (error,) = outcome
        assert isinstance(error, PermanentJobError), error
        assert error.error_code == "UNSUPPORTED_FORMAT"


def _run_catching(path: Path, tmp_path: Path, outcome: list[BaseException]) -> None:
    out_dir = tmp_path / f"out-{path.name}"
    out_dir.mkdir()
    try:
        run("probe", {}, path, out_dir, limits=LIMITS)
    except BaseException as exc:
        outcome.append(exc)
    else:
        outcome.append(AssertionError("probe accepted a playlist"))


def test_demuxers_off_the_allowlist_are_unsupported(tmp_path: Path) -> None:
    # A PNG is probed by FFmpeg as png_pipe (an image2 demuxer): not on the whitelist.
    image = tmp_path / "still.png"
    with av.open(str(image), "w", format="image2") as container:
        stream = container.add_stream("png", rate=1)
        stream.width, stream.height, stream.pix_fmt = 16, 16, "rgb24"
        frame = av.VideoFrame.from_ndarray(np.zeros((16, 16, 3), np.uint8), format="rgb24")
        container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    with av.open(str(image)) as container:
        assert container.format.name not in sources_module.DEMUXERS
    assert _error(image, tmp_path).error_code == "UNSUPPORTED_FORMAT"


def test_text_and_random_bytes_are_unsupported(tmp_path: Path) -> None:
    text = tmp_path / "notes"
    text.write_text("hello, this is not a video\n" * 20)
    assert _error(text, tmp_path).error_code == "UNSUPPORTED_FORMAT"
    noise = tmp_path / "noise"
    noise.write_bytes(np.random.default_rng(3).integers(0, 256, 8192, dtype=np.uint8).tobytes())
    assert _error(noise, tmp_path).error_code == "UNSUPPORTED_FORMAT"


def test_longer_than_the_limit(tmp_path: Path) -> None:
    path = write_video(tmp_path / "long.mp4", seconds=3.0, audio=False)
    limits = MediaLimits(max_input_bytes=LIMITS.max_input_bytes, max_duration_seconds=2.0)
    assert _error(path, tmp_path, limits).error_code == "MEDIA_TOO_LONG"


def test_longer_than_the_limit_found_while_demuxing(tmp_path: Path) -> None:
    path = write_adts(tmp_path / "long.aac", seconds=6.0, noise_seconds=1.0)  # estimated at ~1.3 s
    limits = MediaLimits(max_input_bytes=LIMITS.max_input_bytes, max_duration_seconds=4.0)
    assert _error(path, tmp_path, limits).error_code == "MEDIA_TOO_LONG"


def test_packet_limit_keeps_the_estimate(tmp_path: Path) -> None:
    path = write_adts(tmp_path / "speech.aac", seconds=6.0, noise_seconds=1.0)
    limits = MediaLimits(max_input_bytes=LIMITS.max_input_bytes, max_probe_packets=10)
    report = probe(path, tmp_path, limits)
    assert report["duration_source"] == "estimate"
    assert report["duration_seconds"] < 6.0 - 1.0


def test_larger_than_the_limit(tmp_path: Path) -> None:
    path = write_video(tmp_path / "big.mp4", seconds=0.4, audio=False)
    limits = MediaLimits(max_input_bytes=path.stat().st_size - 1)
    assert _error(path, tmp_path, limits).error_code == "INPUT_TOO_LARGE"


def test_ogg_and_mpeg_ts_uploads_are_typed_as_media(tmp_path: Path) -> None:
    """Both containers are on the demuxer allowlist; typed from their heads as audio/video (not
    ``application/ogg`` or ``application/octet-stream``, kind ``other``), so probe accepts them."""
    from hypermedia.intake import contenttype

    ogg = tmp_path / "sine.ogg"
    with av.open(str(ogg), "w", format="ogg") as container:
        stream = container.add_stream("libopus", rate=RATE, layout="stereo")
        _mux_audio(container, stream, 1.0)
    ts = write_video(tmp_path / "clip.ts", seconds=1.0, container_format="mpegts")
    assert contenttype.detect(ogg.read_bytes()[: contenttype.HEAD_BYTES]) == "audio/ogg"
    assert contenttype.detect(ts.read_bytes()[: contenttype.HEAD_BYTES]) == "video/mp2t"
    assert contenttype.kind("audio/ogg") == "audio" and contenttype.kind("video/mp2t") == "video"
    assert abs(probe(ogg, tmp_path)["duration_seconds"] - 1.0) < 0.05
    assert contenttype.detect(b"OggS" + b"\0" * 24 + b"\x80theora" + b"\0" * 100) == "video/ogg"
    assert contenttype.detect(bytes([0x47]) + b"\0" * 187 + bytes([0x47]) + b"\0" * 187) != "video/mp2t"


def test_every_video_stream_of_a_long_gop_file_is_read(tmp_path: Path) -> None:
    """Two H.264 streams with one keyframe each, interleaved: the pass over stream 0 must not use
    up stream 1's keyframe (it once did: CORRUPT_INPUT for a valid file)."""
    path = tmp_path / "two.mp4"
    with av.open(str(path), "w") as container:
        streams = []
        for _ in range(2):
            stream = container.add_stream("libx264", rate=25, options={"g": "1000", "sc_threshold": "0"})
            stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
            streams.append(stream)
        for i in range(60):
            for k, stream in enumerate(streams):
                image = np.full((48, 64, 3), (i * 4 + k * 50) % 256, np.uint8)
                container.mux(stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")))
        for stream in streams:
            container.mux(stream.encode(None))
    report = probe(path, tmp_path)
    assert [(s["codec"], s["rotation"]) for s in video_streams(report)] == [("h264", 0), ("h264", 0)]


def test_a_codec_without_a_decoder_is_described_not_an_error(tmp_path: Path) -> None:
    """A Matroska audio track whose CodecID no decoder knows: probe lists it with codec null;
    waveform has nothing to decode (UNSUPPORTED_FORMAT), not an INTERNAL failure."""
    from hypermedia.engines.media import engine

    path = tmp_path / "pcm.mkv"
    with av.open(str(path), "w") as container:
        stream = container.add_stream("pcm_s16le", rate=8000, layout="mono")
        frame = av.AudioFrame.from_ndarray(np.zeros((1, 800), np.int16), format="s16", layout="mono")
        frame.sample_rate, frame.pts = 8000, 0
        container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    data = path.read_bytes()
    assert b"A_PCM/INT/LIT" in data
    path.write_bytes(data.replace(b"A_PCM/INT/LIT", b"A_ZZZ/INT/LIT"))
    [stream_record] = probe(path, tmp_path)["streams"]
    assert (stream_record["type"], stream_record["codec"]) == ("audio", None)
    out = tmp_path / "waveform"
    out.mkdir()
    with pytest.raises(PermanentJobError) as caught:
        engine.run("waveform", {}, path, out, limits=LIMITS)
    assert caught.value.error_code == "UNSUPPORTED_FORMAT"
