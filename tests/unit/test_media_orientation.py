"""Display matrices that turn and mirror the picture (issue 15, item 8): the posters, sprite
thumbnails and transcodes of the eight clips of ``tests/data/display-matrix`` (every quarter turn,
with and without mirroring) against the first frame FFmpeg's command line writes of each with its
``autorotate`` (the references beside them, see their ``SOURCE.md``). Outputs are decoded with
Pillow (PNG, JPEG) and PyAV (H.264); a picture is compared by its size and the colour at the
centre of each quadrant."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import av
import numpy as np
import pytest
from PIL import Image

from hypermedia.engines.media import poster, probe, transcode
from hypermedia.engines.media.orientation import matrix_orientation
from hypermedia.engines.media.sources import MediaLimits

DATA = Path(__file__).resolve().parents[1] / "data" / "display-matrix"
CLIPS = ["cw0", "cw0-hflip", "cw90", "cw90-hflip", "cw180", "cw180-hflip", "cw270", "cw270-hflip"]
LIMITS = MediaLimits(max_input_bytes=10 * 1024 * 1024)
COLOURS = {"R": (255, 0, 0), "G": (0, 255, 0), "B": (0, 0, 255), "W": (255, 255, 255)}
PROBED = {  # clip: (rotation, mirrored), as ffprobe reports the rotation (SOURCE.md; 180 for -180)
    "cw0": (0, False),
    "cw0-hflip": (180, True),
    "cw90": (-90, False),
    "cw90-hflip": (-90, True),
    "cw180": (180, False),
    "cw180-hflip": (0, True),
    "cw270": (90, False),
    "cw270-hflip": (90, True),
}


def quadrants(pixels: np.ndarray) -> str:
    """The colours at the centres of the quadrants (top left, top right, bottom left, bottom
    right) of an RGB array, each the nearest of :data:`COLOURS`: ``"RGBW"`` for the coded picture."""
    height, width = pixels.shape[:2]
    names = ""
    for y, x in ((1, 1), (1, 3), (3, 1), (3, 3)):
        value = pixels[y * height // 4, x * width // 4, :3].astype(np.int32)
        names += min(COLOURS, key=lambda name: int(np.abs(value - COLOURS[name]).sum()))
    return names


def reference(clip: str) -> tuple[tuple[int, int], str]:
    """The size and quadrants of the first frame as FFmpeg's command line wrote it."""
    pixels = np.asarray(Image.open(DATA / f"{clip}.ffmpeg.png").convert("RGB"))
    return (pixels.shape[1], pixels.shape[0]), quadrants(pixels)


def test_the_references_are_every_turn_and_mirror_image() -> None:
    """The eight references are the eight orientations of the pattern, all different."""
    seen = {reference(clip) for clip in CLIPS}
    assert len(seen) == 8
    assert reference("cw0") == ((96, 64), "RGBW")


@pytest.mark.parametrize("clip", CLIPS)
def test_poster_and_sprite_match_ffmpeg(clip: str, tmp_path: Path) -> None:
    size, expected = reference(clip)
    params = {"format": "png", "sprite": {"count": 4, "columns": 4}}
    outputs = poster.run("poster", params, DATA / f"{clip}.mp4", tmp_path, limits=LIMITS)
    by_type = {output.output_type: output for output in outputs}
    picture = np.asarray(Image.open(tmp_path / by_type["poster"].filename).convert("RGB"))
    assert (picture.shape[1], picture.shape[0]) == size
    assert quadrants(picture) == expected
    sheet = np.asarray(Image.open(tmp_path / by_type["sprite"].filename).convert("RGB"))
    cell_width = by_type["sprite"].metadata["thumbnail_width"]
    cell_height = by_type["sprite"].metadata["thumbnail_height"]
    assert (cell_width > cell_height) == (size[0] > size[1])
    for i in range(4):
        thumbnail = sheet[:cell_height, i * cell_width : (i + 1) * cell_width]
        assert quadrants(thumbnail) == expected, i


@pytest.mark.parametrize("clip", CLIPS)
def test_transcode_matches_ffmpeg(clip: str, tmp_path: Path) -> None:
    size, expected = reference(clip)
    params = {"heights": [144], "preset": "ultrafast"}  # above the source: its own size
    [output] = transcode.run("transcode_video", params, DATA / f"{clip}.mp4", tmp_path, limits=LIMITS)
    rotation, mirrored = PROBED[clip]
    changed = clip != "cw0"
    assert output.metadata["rotation_applied"] == (rotation if changed else 0)
    assert output.metadata["mirror_applied"] is mirrored
    with av.open(str(tmp_path / output.filename)) as container:
        frames = [frame for frame in container.decode(video=0)]
        assert not any(side.type.name == "DISPLAYMATRIX" for side in frames[0].side_data)
    assert len(frames) == 10
    for frame in frames:
        pixels = frame.to_ndarray(format="rgb24")
        assert (pixels.shape[1], pixels.shape[0]) == size
        assert quadrants(pixels) == expected


@pytest.mark.parametrize("clip", CLIPS)
def test_probe_reports_rotation_and_mirroring(clip: str, tmp_path: Path) -> None:
    size, _ = reference(clip)
    probe.run("probe", {}, DATA / f"{clip}.mp4", tmp_path, limits=LIMITS)
    [stream] = json.loads((tmp_path / "probe.json").read_text())["streams"]
    assert (stream["rotation"], stream["mirrored"]) == PROBED[clip]
    assert (stream["display_width"], stream["display_height"]) == size
    assert (stream["width"], stream["height"]) == (96, 64)


def test_an_angle_that_is_not_a_quarter_turn_is_left_as_coded() -> None:
    """30° (FFmpeg's command line would insert its ``rotate`` filter): not turned, not flipped."""
    cos, sin = round(np.cos(np.pi / 6) * 65536), round(np.sin(np.pi / 6) * 65536)
    orientation = matrix_orientation(struct.pack("=9i", cos, -sin, 0, sin, cos, 0, 0, 0, 1 << 30))
    assert orientation.rotation == 30 and not orientation.applied and orientation.filters() == []
    mirrored = matrix_orientation(struct.pack("=9i", -cos, -sin, 0, -sin, cos, 0, 0, 0, 1 << 30))
    assert mirrored.mirrored and not mirrored.applied
