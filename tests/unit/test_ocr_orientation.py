"""Pages turned as a whole by a quarter turn: a clean printed paragraph typeset here (Pango, DejaVu
Serif, at 9, 12 and 20 pt at 300 dpi and at 12 pt at 150 dpi), turned by libvips in every quarter
turn and read by the real tesseract. Each turn must read exactly as the upright page does: the
orientation step finds the turn, and the page is turned back before it is resampled, so tesseract
reads the same pixels (issue 15, item 11).

The paragraph is short on purpose: tesseract's orientation confidence grows with the number of
characters it samples (up to 250), and this one scores 6.6–9.9 (measured), so that at 12 pt
upside down (6.63) it was under the margin of 7 the orientation step trusted before, and stayed
upside down. Its script confidence is 18–217: one clear script.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import pyvips
from PIL import Image

from hypermedia.engines.ocr import preprocess, tesseract
from hypermedia.engines.ocr.metrics import cer
from tests.helpers.ocr import PARAGRAPH, PHOTOTEST, grey_page, needs_tesseract, ocr, save_png, typeset

SIZES = [(9, 300), (12, 300), (20, 300), (12, 150)]
"""``(points, dots per inch)``: body, small and large print at the working resolution, and body
text at half of it (upscaled by the preprocessing)."""
TURNS = [90, 180, 270]
"""Clockwise quarter turns applied to the upright page (libvips ``rot``, lossless)."""


def decoded(path: Path) -> np.ndarray:
    """The pixels of an image file, decoded by Pillow (not libvips, which wrote it)."""
    with Image.open(path) as image:
        return np.asarray(image.convert("L"))


@needs_tesseract
@pytest.mark.parametrize(("points", "dpi"), SIZES)
def test_every_quarter_turn_reads_as_the_upright_page(tmp_path: Path, points: int, dpi: int) -> None:
    upright = typeset(points, dpi)
    read = ocr(save_png(upright, tmp_path / "upright.png", dpi=dpi), tmp_path)
    reference = cer(read.text, PARAGRAPH)
    assert reference < 0.02, read.text
    assert not read.steps()["orientation"]["applied"]
    for turn in TURNS:
        turned = ocr(save_png(upright.rot(f"d{turn}"), tmp_path / f"turned-{turn}.png", dpi=dpi), tmp_path)
        orientation = turned.steps()["orientation"]
        assert orientation["applied"], (turn, orientation)
        assert orientation["rotate"] == (360 - turn) % 360, (turn, orientation)
        # The same pixels reach tesseract, so the same text comes back, to the character.
        assert turned.text == read.text, (turn, cer(turned.text, PARAGRAPH), reference)
        assert turned.steps()["upscale"] == read.steps()["upscale"]


@needs_tesseract
@pytest.mark.parametrize("turn", TURNS)
def test_a_turned_page_is_prepared_pixel_for_pixel_as_the_upright_one(tmp_path: Path, turn: int) -> None:
    """phototest.tif (200 dpi, upscaled 1.5 times): the prepared page of each turn, decoded by
    Pillow, equals the upright page's; its words map back onto the turned source."""
    upright = grey_page(PHOTOTEST)
    pages = {}
    for name, image in (("upright", upright), ("turned", upright.rot(f"d{turn}"))):
        prepared = preprocess.prepare(
            image.copy(xres=200 / 25.4, yres=200 / 25.4),
            work_dir=tmp_path,
            max_pixels=100_000_000,
            osd_timeout=60,
        )
        preprocess.save(prepared, tmp_path / f"{name}.png")
        pages[name] = prepared
    assert pages["turned"].dpi == pages["upright"].dpi == 300
    assert np.array_equal(decoded(tmp_path / "turned.png"), decoded(tmp_path / "upright.png"))
    # A point of the prepared page maps back to where the turn put it on the turned source:
    # (x, y) of the upright source is (H − y, x) after a turn of 90 degrees clockwise, and so on.
    width, height = upright.width, upright.height
    x, y = pages["upright"].to_source.apply(300.0, 120.0)
    expected = {90: (height - y, x), 180: (width - x, height - y), 270: (y, width - x)}[turn]
    assert pages["turned"].to_source.apply(300.0, 120.0) == pytest.approx(expected)
    assert (pages["turned"].source_width, pages["turned"].source_height) == (
        (height, width) if turn in (90, 270) else (width, height)
    )


@needs_tesseract
@pytest.mark.parametrize("seed", [2, 7])
@pytest.mark.parametrize("turn", [0, *TURNS])
def test_a_page_of_noise_is_not_turned(tmp_path: Path, turn: int, seed: int) -> None:
    """phototest.tif faded to a quarter of its contrast under Gaussian noise (σ 40 grey levels):
    tesseract's orientation detection guesses there, wrongly in most turns, at orientation
    confidences up to 3.05 (over :data:`~hypermedia.engines.ocr.tesseract.OSD_MIN_CONFIDENCE_CLEAR_SCRIPT`;
    seed 2 upright: 180 degrees at 2.73) but script confidences of at most 1.23 ("Bengali"):
    measured. A guess must not turn the page."""
    page = grey_page(PHOTOTEST).resize(1.5)
    noise = pyvips.Image.gaussnoise(page.width, page.height, sigma=40, mean=0, seed=seed)
    noisy = (page.cast("float") * 0.25 + 150 + noise).cast("uchar").copy(interpretation="b-w")
    image = noisy if turn == 0 else noisy.rot(f"d{turn}")
    prepared = preprocess.prepare(
        image.copy(xres=300 / 25.4, yres=300 / 25.4),
        work_dir=tmp_path,
        max_pixels=100_000_000,
        osd_timeout=60,
    )
    [orientation] = [s for s in prepared.steps if s["step"] == "orientation"]
    assert not orientation["applied"], orientation
    assert prepared.to_source == preprocess.Transform()


def test_trusted_orientation() -> None:
    """The two rules, at their edges (values from the measurements of
    :data:`~hypermedia.engines.ocr.tesseract.OSD_MIN_CONFIDENCE_CLEAR_SCRIPT`)."""

    def found(confidence: float, script_confidence: float) -> tesseract.Orientation:
        return tesseract.Orientation(180, 180, confidence, "Latin", script_confidence)

    assert found(tesseract.OSD_MIN_CONFIDENCE, 0.0).trusted  # tesseract's own margin
    assert found(4.66, 38.33).trusted  # the 17-word paragraph at 12 pt, upside down
    assert found(2.0, tesseract.OSD_MIN_SCRIPT_CONFIDENCE).trusted
    assert not found(3.84, 2.05).trusted  # 8071_093.3B.tif blurred by 4 px, turned the wrong way
    assert not found(3.05, 1.11).trusted  # the faded page under noise
    assert not found(1.99, 95.0).trusted
    assert not found(6.99, 4.99).trusted
