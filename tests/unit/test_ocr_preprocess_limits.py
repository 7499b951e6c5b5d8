"""Preprocessing (hypermedia.engines.ocr.preprocess) never takes a page past the limits the engine checked
before decoding it: the page pixel limit and :data:`~hypermedia.engines.ocr.preprocess.MAX_SIDE`.

Hostile pages found by review, each made here with libvips: all-black pages a side of 32,767 pixels
long (deskewed by up to 4.4 degrees, to 109 megapixels or 32,809 pixels high, which tesseract
refuses), a PNG stating 300 × 75 dpi (upscaled on one axis only, past the pixel limit); and skewed
text at the limits, which is turned and shrunk to fit. :func:`preprocess.prepare` is called with
the arguments :func:`hypermedia.engines.ocr.engine._prepare` gives it; the 1953 × 32,767 black page also
goes through :func:`hypermedia.engines.ocr.engine.run`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import pyvips

from hypermedia.engines.ocr import preprocess
from hypermedia.engines.ocr.engine import OcrLimits, run
from hypermedia.engines.ocr.metrics import cer

OCR_DIR = Path(__file__).resolve().parents[1] / "data" / "ocr"
PHOTOTEST = OCR_DIR / "phototest.tif"
GOLD = (OCR_DIR / "phototest.gold.txt").read_text(encoding="utf-8")
PRODUCTION_MAX_PIXELS = 64_000_000
"""The page pixel limit of the production profile."""

needs_tesseract = pytest.mark.skipif(
    shutil.which("tesseract") is None,
    reason="tesseract is not installed (scripts/ensure_debian_packages.sh tesseract-ocr tesseract-ocr-eng …)",
)


def _filled(width: int, height: int, level: int) -> pyvips.Image:
    return (pyvips.Image.black(width, height) + level).cast("uchar").copy(interpretation="b-w")


def _png(image: pyvips.Image, path: Path, dpi: tuple[float, float] | None = None) -> pyvips.Image:
    """``image`` saved as a PNG (stating ``dpi``, x and y) and opened as the engine opens it."""
    if dpi is not None:
        image = image.copy(xres=dpi[0] / 25.4, yres=dpi[1] / 25.4)
    image.pngsave(str(path))
    return pyvips.Image.new_from_file(str(path))


def _prepare(image: pyvips.Image, tmp_path: Path, max_pixels: int) -> preprocess.PreparedPage:
    """As :func:`hypermedia.engines.ocr.engine._prepare` calls it for an image page."""
    return preprocess.prepare(
        image,
        work_dir=tmp_path,
        max_pixels=max_pixels,
        osd_timeout=60.0,
        render_dpi=None,
        enabled=True,
        what="page 1",
    )


def _steps(page: preprocess.PreparedPage) -> dict[str, dict[str, Any]]:
    return {step["step"]: step for step in page.steps}


def _assert_within(page: preprocess.PreparedPage, max_pixels: int) -> None:
    width, height = page.image.width, page.image.height
    assert width * height <= max_pixels, (width, height, page.steps)
    assert max(width, height) <= preprocess.MAX_SIDE, (width, height, page.steps)


# --- pages without text lines are not turned -------------------------------------------------------


@needs_tesseract
@pytest.mark.parametrize(
    ("width", "height"),
    [(1000, 32767), (2, 32767), (1200, 900)],
    ids=["1000x32767", "2x32767", "1200x900"],
)
def test_all_black_page_is_not_deskewed(tmp_path: Path, width: int, height: int) -> None:
    """Was turned by 4.1 degrees to 3340 × 32755 (109 megapixels), and a 2-pixel-wide strip by
    −4.4 degrees to 2516 × 32671: its row profile is flat, any turn "gained" over a score of 0."""
    page = _prepare(_png(_filled(width, height, 0), tmp_path / "black.png"), tmp_path, PRODUCTION_MAX_PIXELS)
    _assert_within(page, PRODUCTION_MAX_PIXELS)
    deskew = _steps(page)["deskew"]
    assert deskew["applied"] is False and deskew["reason"] == "no_text_lines"
    assert (page.image.width, page.image.height) == (width, height)
    assert page.to_source == preprocess.Transform()


@needs_tesseract
def test_page_of_one_grey_is_not_deskewed(tmp_path: Path) -> None:
    page = _prepare(_png(_filled(1200, 900, 100), tmp_path / "grey.png"), tmp_path, PRODUCTION_MAX_PIXELS)
    assert _steps(page)["deskew"]["reason"] == "no_text_lines"
    assert (page.image.width, page.image.height) == (1200, 900)


# --- a non-square resolution is upscaled within the limits -----------------------------------------


@needs_tesseract
@pytest.mark.parametrize(
    ("width", "height", "max_pixels", "expected"),
    [
        (2000, 1000, 4_000_000, (2000, 2000)),
        (8000, 4000, PRODUCTION_MAX_PIXELS, (8000, 8000)),
    ],
    ids=["2000x1000", "8000x4000"],
)
def test_non_square_resolution_is_upscaled_within_the_pixel_limit(
    tmp_path: Path, width: int, height: int, max_pixels: int, expected: tuple[int, int]
) -> None:
    """300 × 75 dpi: the y axis wants 4 times. The fit to the limit scaled both axes by 0.71 and the
    floor at 1 then undid it on x (8000 × 11314 = 90 megapixels against 64): now y gets the room
    the limit leaves."""
    source = _png(_filled(width, height, 255), tmp_path / "fax.png", dpi=(300, 75))
    page = _prepare(source, tmp_path, max_pixels)
    _assert_within(page, max_pixels)
    upscale = _steps(page)["upscale"]
    assert upscale["applied"] is True and upscale["limited_by"] == "page_limits"
    assert upscale["scale"][0] == 1.0 and upscale["scale"][1] > 1.05
    assert (page.image.width, page.image.height) == expected
    assert page.to_source.apply(page.image.width, page.image.height) == pytest.approx((width, height))


@needs_tesseract
def test_non_square_resolution_at_the_pixel_limit_is_not_upscaled(tmp_path: Path) -> None:
    """8000 × 8000 at 300 × 75 dpi is the whole 64-megapixel limit: was upscaled to 8000 × 16000
    (twice the limit); no enlargement fits."""
    source = _png(_filled(8000, 8000, 255), tmp_path / "fax.png", dpi=(300, 75))
    page = _prepare(source, tmp_path, PRODUCTION_MAX_PIXELS)
    _assert_within(page, PRODUCTION_MAX_PIXELS)
    upscale = _steps(page)["upscale"]
    assert upscale["applied"] is False
    assert (upscale["limited_by"], upscale["reason"]) == ("page_limits", "page_limits")
    assert (page.image.width, page.image.height) == (8000, 8000)


@needs_tesseract
def test_square_upscale_limited_by_the_pixel_limit_stays_within_it(tmp_path: Path) -> None:
    """phototest.tif at half size without a resolution wants 2.7 times by its line height; the
    limit allows twice its pixels."""
    small = preprocess.to_grey(pyvips.Image.new_from_file(str(PHOTOTEST))).resize(0.5)
    source = _png(small, tmp_path / "small.png", dpi=(25.4, 25.4))
    max_pixels = 2 * source.width * source.height
    page = _prepare(source, tmp_path, max_pixels)
    _assert_within(page, max_pixels)
    upscale = _steps(page)["upscale"]
    assert upscale["applied"] is True and upscale["limited_by"] == "page_limits"


# --- skewed text at the limits is turned and shrunk to fit -----------------------------------------


@needs_tesseract
def test_skewed_page_at_the_pixel_limit_is_deskewed_within_it(tmp_path: Path) -> None:
    """phototest.tif turned by 3 degrees, 300 dpi, the limit its own pixel count: turned back it
    would be 690 × 547 (11 % more); it is shrunk to fit in the same resampling, and still read."""
    skewed = preprocess.to_grey(pyvips.Image.new_from_file(str(PHOTOTEST))).rotate(3.0, background=[255])
    source = _png(skewed, tmp_path / "skewed.png", dpi=(300, 300))
    max_pixels = source.width * source.height
    page = _prepare(source, tmp_path, max_pixels)
    _assert_within(page, max_pixels)
    deskew = _steps(page)["deskew"]
    assert deskew["applied"] is True and deskew["angle"] == pytest.approx(-3.0, abs=0.2)
    assert deskew["limited_by"] == "page_limits" and 0.9 < deskew["scale"] < 1
    assert page.dpi == round(300 * deskew["scale"])
    # The shrunk page still maps back onto the source: its centre onto the source's centre.
    centre = page.to_source.apply(page.image.width / 2, page.image.height / 2)
    assert centre == pytest.approx((source.width / 2, source.height / 2), abs=1.5)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    run(
        "ocr",
        {},
        tmp_path / "skewed.png",
        out_dir,
        limits=OcrLimits(max_input_bytes=100 << 20, max_page_pixels=max_pixels),
    )
    assert cer((out_dir / "text.txt").read_text(encoding="utf-8"), GOLD) < 0.02


@needs_tesseract
def test_skewed_long_page_is_deskewed_within_the_side_limit(tmp_path: Path) -> None:
    """Bars like text lines on a 1900 × 32767 page, skewed by 3 degrees: turned back it would be
    32821 pixels high, past the 16-bit coordinates of tesseract."""
    width, height = 1900, preprocess.MAX_SIDE
    rows = pyvips.Image.xyz(width + 4000, height + 4000)[1]
    bars = ((rows % 600) < 300).ifthenelse(0, 255).cast("uchar").rotate(3.0, background=[255])
    page_image = bars.crop((bars.width - width) // 2, (bars.height - height) // 2, width, height)
    source = _png(page_image.copy(interpretation="b-w"), tmp_path / "long.png")
    max_pixels = 200_000_000  # only the side limit binds
    page = _prepare(source, tmp_path, max_pixels)
    _assert_within(page, max_pixels)
    deskew = _steps(page)["deskew"]
    assert deskew["applied"] is True and deskew["angle"] == pytest.approx(-3.0, abs=0.2)
    assert deskew["limited_by"] == "page_limits" and 0.99 < deskew["scale"] < 1
    assert page.image.height == preprocess.MAX_SIDE


# --- through the engine ----------------------------------------------------------------------------


@needs_tesseract
def test_black_page_of_the_largest_height_is_read_as_empty(tmp_path: Path) -> None:
    """1953 × 32767, black: was deskewed by 1.6 degrees to 2867 × 32809, which tesseract refused
    ("Image too large"), and the job failed as an internal error."""
    source = tmp_path / "black.png"
    _filled(1953, 32767, 0).pngsave(str(source))
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    limits = OcrLimits(max_input_bytes=100 << 20, max_page_pixels=PRODUCTION_MAX_PIXELS)
    outputs = run("ocr", {"outputs": ["text", "words"]}, source, out_dir, limits=limits)
    files = {o.output_type: out_dir / o.filename for o in outputs}
    assert files["text"].read_text(encoding="utf-8") == ""
    page = json.loads(files["words"].read_text(encoding="utf-8"))["pages"][0]
    assert (page["width"], page["height"]) == (1953, 32767) and page["words"] == []
    deskew = {step["step"]: step for step in page["preprocessing"]}["deskew"]
    assert deskew["applied"] is False and deskew["reason"] == "no_text_lines"
