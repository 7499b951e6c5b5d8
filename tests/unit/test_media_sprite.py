"""The ``poster`` operation's sprite sheet (:mod:`hypermedia.engines.media.sprite`) on videos these tests
write with PyAV: every frame shows its own index in binary, so that each thumbnail of the sheet
can be read back and compared with the frame its time asks for."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest

from hypermedia.core.errors import PermanentJobError
from hypermedia.engines.contract import PROGRESS_FILE
from hypermedia.engines.media import params as media_params
from hypermedia.engines.media.poster import run
from hypermedia.engines.media.sources import MediaLimits
from hypermedia.engines.media.sprite import SPRITE_MAX_PIXELS, SPRITE_MAX_SIDE
from tests.helpers.media import write_mp3_with_cover, write_tone

LIMITS = MediaLimits(max_input_bytes=100 * 1024 * 1024)
FPS = 25
BITS = 9
"""The frame index is drawn as 9 stripes, most significant first: white is 1, black 0."""


# --- media the tests write ---------------------------------------------------------------------


def counter_picture(index: int, width: int, height: int) -> np.ndarray:
    image = np.zeros((height, width, 3), np.uint8)
    for bit in range(BITS):
        if index >> (BITS - 1 - bit) & 1:
            image[:, bit * width // BITS : (bit + 1) * width // BITS] = 255
    return image


def write_counter_video(
    path: Path,
    *,
    seconds: float = 8.0,
    width: int = 320,
    height: int = 180,
    keyframe_interval: int = 50,
    pix_fmt: str = "yuv420p",
    rotation: float | None = None,
    container_format: str | None = None,
    options: dict[str, str] | None = None,
) -> Path:
    """H.264 at 25 fps, with B-frames (x264's superfast preset) and a keyframe every
    ``keyframe_interval`` frames; frame ``i`` shows ``i`` (:func:`counter_picture`)."""
    with av.open(str(path), "w", format=container_format, options=options or {}) as container:
        video = container.add_stream("libx264", rate=FPS)
        video.width, video.height, video.pix_fmt = width, height, pix_fmt
        video.options = {"preset": "superfast", "x264-params": f"keyint={keyframe_interval}:scenecut=0"}
        if rotation is not None:
            video.set_display_rotation(rotation)
        for i in range(round(seconds * FPS)):
            frame = av.VideoFrame.from_ndarray(counter_picture(i, width, height), format="rgb24")
            frame = frame.reformat(format=pix_fmt)
            frame.pts = i
            container.mux(video.encode(frame))
        container.mux(video.encode(None))
    return path


# --- reading the outputs -----------------------------------------------------------------------


def sprite(
    path: Path, tmp_path: Path, options: dict[str, Any]
) -> tuple[dict[str, Any], np.ndarray, list[tuple[float, float, tuple[int, ...]]]]:
    """Runs the poster with ``sprite``; returns the sheet's metadata, its pixels and the cues."""
    out_dir = tmp_path / "out"
    out_dir.mkdir(exist_ok=True)
    outputs = run("poster", {"sprite": options}, path, out_dir, limits=LIMITS)
    assert [(o.output_type, o.filename, o.mime_type) for o in outputs[1:]] == [
        ("sprite", "sprite.jpg", "image/jpeg"),
        ("sprite_vtt", "sprite.vtt", "text/vtt"),
    ]
    meta, vtt_meta = outputs[1].metadata, outputs[2].metadata
    with av.open(str(out_dir / "sprite.jpg")) as container:
        pixels = next(container.decode(video=0)).to_ndarray(format="rgb24")
    assert (pixels.shape[1], pixels.shape[0]) == (meta["width"], meta["height"])
    assert meta["size_bytes"] == (out_dir / "sprite.jpg").stat().st_size
    text = (out_dir / "sprite.vtt").read_text()
    assert vtt_meta == {"cues": meta["count"], "size_bytes": len(text.encode())}
    cues = parse_webvtt(text)
    assert len(cues) == meta["count"]
    check_cues(cues, meta)
    assert (tmp_path / PROGRESS_FILE).read_text() == "1.0000"
    return meta, pixels, cues


CUE = re.compile(
    r"(\d\d):(\d\d):(\d\d)\.(\d\d\d) --> (\d\d):(\d\d):(\d\d)\.(\d\d\d)\nsprite#xywh=(\d+),(\d+),(\d+),(\d+)"
)


def parse_webvtt(text: str) -> list[tuple[float, float, tuple[int, ...]]]:
    header, *blocks = text.strip("\n").split("\n\n")
    assert header == "WEBVTT"
    cues = []
    for block in blocks:
        match = CUE.fullmatch(block)
        assert match is not None, block
        n = [int(g) for g in match.groups()]
        start = n[0] * 3600 + n[1] * 60 + n[2] + n[3] / 1000
        end = n[4] * 3600 + n[5] * 60 + n[6] + n[7] / 1000
        cues.append((start, end, tuple(n[8:])))
    return cues


def check_cues(cues: list[tuple[float, float, tuple[int, ...]]], meta: dict[str, Any]) -> None:
    """Contiguous cues from 0 to the duration, each the grid cell of its thumbnail."""
    assert cues[0][0] == 0.0
    assert cues[-1][1] == pytest.approx(meta["duration_seconds"], abs=0.0005)
    for i, (start, end, xywh) in enumerate(cues):
        assert start < end
        assert end - start == pytest.approx(meta["interval_seconds"], abs=0.002)
        if i:
            assert start == cues[i - 1][1]
        x, y, w, h = xywh
        assert (w, h) == (meta["thumbnail_width"], meta["thumbnail_height"])
        assert (x, y) == ((i % meta["columns"]) * w, (i // meta["columns"]) * h)
        assert x + w <= meta["width"] and y + h <= meta["height"]


def cell(pixels: np.ndarray, xywh: tuple[int, ...]) -> np.ndarray:
    x, y, w, h = xywh
    return pixels[y : y + h, x : x + w]


def read_counter(thumbnail: np.ndarray, *, turned: bool = False) -> int:
    """The index a thumbnail shows: the stripes left to right, or top to bottom when the picture
    was turned a quarter clockwise; each read in its middle, away from the edges JPEG blurs."""
    gray = thumbnail.astype(np.float32).mean(axis=2)
    if turned:
        gray = gray.T
    height, width = gray.shape
    value = 0
    for bit in range(BITS):
        left, right = bit * width / BITS, (bit + 1) * width / BITS
        stripe = gray[
            height // 4 : height * 3 // 4,
            round(left + (right - left) / 4) : round(right - (right - left) / 4),
        ]
        value = value << 1 | int(stripe.mean() > 128)
    return value


def expected_frames(meta: dict[str, Any], frames: int) -> list[int]:
    """The first frame at or after the middle of each thumbnail's interval (the last frame past
    the end of the video)."""
    interval = meta["duration_seconds"] / meta["count"]
    return [min(frames - 1, math.ceil(round((i + 0.5) * interval * FPS, 6))) for i in range(meta["count"])]


# --- tests -------------------------------------------------------------------------------------


def test_sprite_params() -> None:
    assert media_params.validate_params("poster", {"sprite": True})["sprite"] == {
        "count": 60,
        "columns": 10,
        "width": 160,
    }
    assert media_params.validate_params("poster", {"sprite": False})["sprite"] is None
    assert media_params.validate_params("poster", {"sprite": {"count": 4, "columns": 20, "width": 480}})[
        "sprite"
    ] == {"count": 4, "columns": 20, "width": 480}


@pytest.mark.parametrize(
    ("name", "pix_fmt", "container_format", "options"),
    [
        ("v.mp4", "yuv420p", None, None),
        ("live.mkv", "yuv420p10le", "matroska", {"live": "1"}),  # no duration in the header
        # Starts at 0.08 s; its seeks land past keyframes, and the first one after the target.
        ("v.ts", "yuv420p", None, None),
    ],
)
def test_thumbnails_show_their_times(
    tmp_path: Path, name: str, pix_fmt: str, container_format: str | None, options: dict[str, str] | None
) -> None:
    path = write_counter_video(
        tmp_path / name, pix_fmt=pix_fmt, container_format=container_format, options=options
    )
    meta, pixels, cues = sprite(path, tmp_path, {"count": 10, "columns": 4, "width": 160})
    assert {k: meta[k] for k in ("count", "columns", "rows", "thumbnail_width", "thumbnail_height")} == {
        "count": 10,
        "columns": 4,
        "rows": 3,
        "thumbnail_width": 160,
        "thumbnail_height": 90,
    }
    assert (meta["width"], meta["height"]) == (640, 270)
    assert meta["duration_seconds"] == pytest.approx(8.0, abs=0.05)
    assert meta["interval_seconds"] == pytest.approx(meta["duration_seconds"] / 10, abs=1e-6)
    assert not meta["reduced_to_fit"]
    shown = [read_counter(cell(pixels, xywh)) for _, _, xywh in cues]
    assert shown == expected_frames(meta, 200)
    assert meta["max_offset_seconds"] < 1 / FPS
    assert pixels[180:, 320:].max() < 40  # the last row's two empty cells are black


def test_long_keyframe_interval_bounds_the_work(tmp_path: Path) -> None:
    """One keyframe in 12 s: a thumbnail decodes at most 2 s (50 frames) of packets, then takes
    the last frame; the index lets the next thumbnail go on from there instead of seeking back."""
    path = write_counter_video(tmp_path / "gop.mp4", seconds=12.0, keyframe_interval=1000)
    meta, pixels, cues = sprite(path, tmp_path, {"count": 4, "columns": 4, "width": 160})
    shown = [read_counter(cell(pixels, xywh)) for _, _, xywh in cues]
    wanted = expected_frames(meta, 300)  # 37.5 → 38, 113, 188, 263
    assert shown[0] == wanted[0]
    assert all(s <= w for s, w in zip(shown, wanted, strict=True))
    assert shown == sorted(shown) and shown[1] > shown[0] + 40  # forward, not back to the keyframe
    assert shown[3] < wanted[3] - 50  # bounded: late thumbnails lag
    assert meta["max_offset_seconds"] == pytest.approx(
        max(w - s for s, w in zip(shown, wanted, strict=True)) / FPS, abs=0.021
    )


def test_fewer_frames_than_thumbnails(tmp_path: Path) -> None:
    path = write_counter_video(tmp_path / "short.mp4", seconds=0.4)  # 10 frames
    meta, pixels, cues = sprite(path, tmp_path, {"count": 24, "columns": 5, "width": 64})
    assert (meta["rows"], meta["thumbnail_width"], meta["thumbnail_height"]) == (5, 64, 36)
    shown = [read_counter(cell(pixels, xywh)) for _, _, xywh in cues]
    assert shown == expected_frames(meta, 10)
    assert set(shown) == set(range(1, 10))  # t_0 = 0.008 s: frame 0 (at 0 s) is before it


def test_rotated_video_gives_portrait_thumbnails(tmp_path: Path) -> None:
    path = write_counter_video(tmp_path / "rot.mp4", seconds=4.0, rotation=-90)
    meta, pixels, cues = sprite(path, tmp_path, {"count": 4, "columns": 2, "width": 90})
    assert (meta["thumbnail_width"], meta["thumbnail_height"]) == (90, 160)
    # A quarter turn clockwise: the stripes, left to right in the coded picture, run top to bottom.
    shown = [read_counter(cell(pixels, xywh), turned=True) for _, _, xywh in cues]
    assert shown == expected_frames(meta, 100)


@pytest.mark.parametrize(
    ("width", "height", "options", "cell"),
    [
        # One column of 400: 400 × 180 px (the source's 320 px, not the 480 asked) would be
        # taller than a JPEG can be (65 500 px).
        (320, 180, {"count": 400, "columns": 1, "width": 480}, (289, 162)),
        # 20 × 20 of 480 × 360 would be 69 MP: narrowed to 462 × 346, 63.9 MP.
        (640, 480, {"count": 400, "columns": 20, "width": 480}, (462, 346)),
    ],
)
def test_a_sheet_over_its_limits_gets_narrower_thumbnails(
    tmp_path: Path, width: int, height: int, options: dict[str, int], cell: tuple[int, int]
) -> None:
    path = write_counter_video(tmp_path / "v.mp4", seconds=1.0, width=width, height=height)
    meta, _, _ = sprite(path, tmp_path, options)
    assert meta["reduced_to_fit"]
    assert (meta["thumbnail_width"], meta["thumbnail_height"]) == cell
    assert max(meta["width"], meta["height"]) <= SPRITE_MAX_SIDE
    assert meta["width"] * meta["height"] <= SPRITE_MAX_PIXELS


def test_avi_without_its_index(tmp_path: Path) -> None:
    """An AVI cut before its ``idx1`` chunk: FFmpeg seeks by reading on, lands after the target,
    and refuses the earlier time the retry asks for (before the start): the sampler seeks to the
    start instead. AVI has no presentation times: FFmpeg's (frame ``i`` at ``i + 1``) are what
    the thumbnails follow."""
    whole = write_counter_video(tmp_path / "whole.avi", seconds=8.0).read_bytes()
    path = tmp_path / "cut.avi"
    path.write_bytes(whole[: whole.rindex(b"idx1")])
    meta, pixels, cues = sprite(path, tmp_path, {"count": 10, "columns": 4, "width": 160})
    shown = [read_counter(cell(pixels, xywh)) for _, _, xywh in cues]
    with av.open(str(path)) as container:
        timeline = [
            (frame.time, read_counter(frame.to_ndarray(format="rgb24")))
            for frame in container.decode(video=0)
        ]
    interval = meta["duration_seconds"] / meta["count"]
    wanted = [next(n for t, n in timeline if t >= (i + 0.5) * interval - 1e-6) for i in range(meta["count"])]
    assert wanted[0] == 9  # not 10: the file puts frame 9 at 0.4 s
    assert shown == wanted


@pytest.mark.parametrize("count", [4, 10])  # thumbnails reached by seeking; by decoding on
def test_a_file_cut_short_repeats_its_last_frame(tmp_path: Path, count: int) -> None:
    """An MP4 whose index (at the front) points past the end: the thumbnails after the cut repeat
    the last one that decoded, and ``max_offset_seconds`` says how far off they are."""
    whole = write_counter_video(tmp_path / "whole.mp4", seconds=12.0, options={"movflags": "faststart"})
    with av.open(str(whole)) as container:
        cut_at = next(
            p.pos for p in container.demux(video=0) if p.pts is not None and p.pts * p.time_base >= 4.0
        )
    path = tmp_path / "cut.mp4"
    path.write_bytes(whole.read_bytes()[:cut_at])
    meta, pixels, cues = sprite(path, tmp_path, {"count": count, "columns": 4, "width": 160})
    shown = [read_counter(cell(pixels, xywh)) for _, _, xywh in cues]
    assert shown[0] == expected_frames(meta, 300)[0]
    assert shown == sorted(shown) and shown[-1] < 100  # nothing from 4 s on decodes
    assert shown[-2] == shown[-1]
    assert meta["max_offset_seconds"] > 6.0


def test_sprite_of_audio_is_no_video_stream(tmp_path: Path) -> None:
    """A cover picture makes a poster but no sprite; the request fails before anything decodes."""
    cover = write_mp3_with_cover(tmp_path / "cover.mp3", seconds=1.0)
    tone = write_tone(tmp_path / "tone.flac", "flac", "flac", "s16")
    for path in (cover, tone):
        with pytest.raises(PermanentJobError) as err:
            run("poster", {"sprite": True}, path, tmp_path, limits=LIMITS)
        assert err.value.error_code == "NO_VIDEO_STREAM", path
    assert "sprite" not in err.value.public_message  # no cover either: the poster's own error
    with pytest.raises(PermanentJobError) as err:
        run("poster", {"sprite": True}, cover, tmp_path, limits=LIMITS)
    assert "sprite sheet needs a video stream" in err.value.public_message
    assert list(tmp_path.glob("*.jpg")) == []


def test_a_short_mpeg_ts_with_one_keyframe(tmp_path: Path) -> None:
    """6 s of MPEG-TS with a single keyframe (x264's default GOP is longer than the file): a seek
    lands after it and nothing decodes; the sampler used to fail CORRUPT_INPUT, it now seeks
    further back and at last decodes from the start."""
    path = write_counter_video(
        tmp_path / "one-keyframe.ts", seconds=6.0, keyframe_interval=250, container_format="mpegts"
    )
    meta, pixels, cues = sprite(path, tmp_path, {"count": 6, "columns": 6, "width": 80})
    shown = [read_counter(cell(pixels, xywh)) for _, _, xywh in cues]
    assert shown == expected_frames(meta, 150)
