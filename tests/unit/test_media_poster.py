"""The ``poster`` operation (:mod:`hypermedia.engines.media.poster`) on media these tests write with PyAV."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest

from hypermedia.core.errors import InvalidArgument, PermanentJobError
from hypermedia.engines.media import params as media_params
from hypermedia.engines.media.engine import OPERATION_ENTRIES
from hypermedia.engines.media.poster import run
from hypermedia.engines.media.sources import MediaLimits
from tests.helpers.media import write_mp3_with_cover, write_video

LIMITS = MediaLimits(max_input_bytes=100 * 1024 * 1024)


def write_black_then_pattern(path: Path, *, black_seconds: float = 1.0, seconds: float = 2.0) -> Path:
    """H.264 at 25 fps: black for ``black_seconds``, then a bright test pattern."""
    fps, width, height = 25, 320, 240
    with av.open(str(path), "w") as container:
        video = container.add_stream("libx264", rate=fps)
        video.width, video.height, video.pix_fmt = width, height, "yuv420p"
        video.options = {"preset": "ultrafast"}
        for i in range(round(seconds * fps)):
            image = np.zeros((height, width, 3), np.uint8)
            if i >= black_seconds * fps:
                image[:, : width // 2] = (220, 180, 40)
                image[height // 2 :, width // 2 :] = (40, 90, 230)
            frame = av.VideoFrame.from_ndarray(image, format="rgb24").reformat(format="yuv420p")
            frame.pts = i
            container.mux(video.encode(frame))
        container.mux(video.encode(None))
    return path


def poster(path: Path, tmp_path: Path, params: dict[str, Any] | None = None) -> tuple[Any, np.ndarray]:
    out_dir = tmp_path / "out"
    out_dir.mkdir(exist_ok=True)
    outputs = run("poster", params or {}, path, out_dir, limits=LIMITS)
    assert len(outputs) == 1
    output = outputs[0]
    assert output.output_type == "poster"
    with av.open(str(out_dir / output.filename)) as container:
        frame = next(container.decode(video=0))
        pixels = frame.to_ndarray(format="rgb24")
    assert (pixels.shape[1], pixels.shape[0]) == (output.metadata["width"], output.metadata["height"])
    assert output.metadata["size_bytes"] == (out_dir / output.filename).stat().st_size
    return output, pixels


def luma(pixels: np.ndarray) -> float:
    return float((pixels.astype(np.float32) @ np.array([0.299, 0.587, 0.114], np.float32)).mean())


def test_poster_params() -> None:
    assert media_params.validate_params("poster", None) == {
        "width": 640,
        "format": "jpeg",
        "quality": 82,
        "sprite": None,
    }
    assert media_params.validate_params("poster", {"width": 16, "format": "png", "quality": 100}) == {
        "width": 16,
        "format": "png",
        "quality": 100,
        "sprite": None,
    }
    bad: Any
    for bad in (
        {"width": 15},
        {"width": 3841},
        {"width": True},
        {"width": "640"},
        {"format": "gif"},
        {"quality": 0},
        {"quality": 101},
        {"sprite": "yes"},
        {"sprite": {"count": 3}},
        {"sprite": {"count": 401}},
        {"sprite": {"columns": 0}},
        {"sprite": {"columns": 21}},
        {"sprite": {"width": 31}},
        {"sprite": {"width": 481}},
        {"sprite": {"rows": 2}},
        [],
    ):
        with pytest.raises(InvalidArgument) as err:
            media_params.validate_params("poster", bad)
        assert err.value.error_code == "INVALID_PARAMS", bad
    assert OPERATION_ENTRIES["poster"] is run


def test_bad_params_rejected_by_run(tmp_path: Path) -> None:
    path = write_video(tmp_path / "v.mp4", seconds=0.4, audio=False)
    with pytest.raises(InvalidArgument) as err:
        run("poster", {"format": "bmp"}, path, tmp_path, limits=LIMITS)
    assert err.value.error_code == "INVALID_PARAMS"


def test_black_leader_is_skipped(tmp_path: Path) -> None:
    path = write_black_then_pattern(tmp_path / "black.mp4")
    output, pixels = poster(path, tmp_path)
    assert output.mime_type == "image/jpeg" and output.filename == "poster.jpg"
    meta = output.metadata
    assert meta["source"] == "video_frame"
    assert meta["time_seconds"] >= 1.0
    assert meta["skipped_blank_frames"] >= 25
    assert (meta["width"], meta["height"]) == (320, 240)  # 640 asked: never upscaled
    assert luma(pixels) > 60


def test_all_black_takes_the_most_varied_frame(tmp_path: Path) -> None:
    path = write_black_then_pattern(tmp_path / "black.mp4", black_seconds=2.0, seconds=1.0)
    output, pixels = poster(path, tmp_path, {"format": "png"})
    assert output.mime_type == "image/png"
    assert output.metadata["skipped_blank_frames"] == 25
    assert luma(pixels) < 16


def test_rotated_video_is_upright(tmp_path: Path) -> None:
    path = write_video(tmp_path / "rot.mp4", seconds=0.4, rotation=-90, audio=False)
    output, pixels = poster(path, tmp_path, {"format": "png"})
    assert (output.metadata["width"], output.metadata["height"]) == (240, 320)
    height, width, _ = pixels.shape
    assert height > width
    # The pattern's top half is blue; a quarter turn clockwise puts it on the right.
    assert pixels[:, width * 3 // 4 :, 2].mean() > 200
    assert pixels[:, : width // 4, 2].mean() < 100


def test_ten_bit_video_and_scaling(tmp_path: Path) -> None:
    path = write_video(tmp_path / "ten.mp4", seconds=0.4, pix_fmt="yuv420p10le", audio=False)
    output, pixels = poster(path, tmp_path, {"width": 160, "format": "webp", "quality": 60})
    assert output.mime_type == "image/webp"
    assert (output.metadata["width"], output.metadata["height"]) == (160, 120)
    assert pixels[: 60 - 8, :, 2].mean() > 200  # blue top half survives


def test_mp3_cover_art(tmp_path: Path) -> None:
    path = write_mp3_with_cover(tmp_path / "cover.mp3", seconds=1.0)
    output, pixels = poster(path, tmp_path, {"format": "png"})
    meta = output.metadata
    assert meta["source"] == "cover_art"
    assert (meta["width"], meta["height"]) == (64, 64)
    assert meta["time_seconds"] == 0.0
    assert tuple(pixels[32, 32]) == (200, 30, 30)


def test_audio_without_cover(tmp_path: Path) -> None:
    path = tmp_path / "tone.m4a"
    with av.open(str(path), "w", format="mp4") as container:
        sound = container.add_stream("aac", rate=48000, layout="stereo")
        samples = np.zeros((2, 1024), np.float32)
        for i in range(20):
            frame = av.AudioFrame.from_ndarray(samples, format="fltp", layout="stereo")
            frame.sample_rate, frame.pts = 48000, i * 1024
            container.mux(sound.encode(frame))
        container.mux(sound.encode(None))
    with pytest.raises(PermanentJobError) as err:
        run("poster", {}, path, tmp_path, limits=LIMITS)
    assert err.value.error_code == "NO_VIDEO_STREAM"


def test_too_long_is_rejected(tmp_path: Path) -> None:
    path = write_video(tmp_path / "v.mp4", seconds=1.0, audio=False)
    limits = MediaLimits(max_input_bytes=LIMITS.max_input_bytes, max_duration_seconds=0.5)
    with pytest.raises(PermanentJobError) as err:
        run("poster", {}, path, tmp_path, limits=limits)
    assert err.value.error_code == "MEDIA_TOO_LONG"
