"""The OCR engine (hypermedia.engines.ocr) with the real tesseract on the corpus pages in ``tests/data/ocr/``
(see its ``SOURCE.md``) and on pages made here from them with libvips: character error rates
against the ground truths, preprocessing steps, the four outputs, bad input; and one job through a
real sandbox child, as the ocrworker will run it.

The CER of ``8071_093.3B.tif`` with and without preprocessing is printed (``pytest -s``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import secrets
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pypdfium2 as pdfium
import pytest
import pyvips

from hypermedia.core.errors import DomainError, InvalidArgument, PermanentJobError
from hypermedia.engines.contract import OutputFile
from hypermedia.engines.ocr import assemble, geometry, params, preprocess, tesseract
from hypermedia.engines.ocr.engine import OcrLimits
from hypermedia.engines.ocr.metrics import cer, levenshtein, normalise_whitespace
from hypermedia.jobs import charges
from hypermedia.sandbox import Sandbox, SandboxLimits
from tests.helpers.jobs import claimed_job
from tests.helpers.ocr import (
    EUROTEXT_LANGUAGES,
    GOLD,
    LIMITS,
    OCR_DIR,
    PHOTOTEST,
    grey_page,
    needs_tesseract,
    ocr,
    save_png,
    system_models,
)

ALL_OUTPUTS = ["text", "words", "hocr", "searchable_pdf"]


# --- params (pure Python) --------------------------------------------------------------------------


def test_params_defaults() -> None:
    assert params.validate_params("ocr", None) == {
        "languages": ["eng"],
        "pages": None,
        "outputs": ["text", "words"],
        "escalate": True,
        "table_detection": False,
        "skip_text_pages": False,
    }


def test_params_normalised() -> None:
    checked = params.validate_params(
        "ocr",
        {"languages": "deu+eng+deu", "pages": "3,1-2", "outputs": ["searchable_pdf", "text", "text"]},
        installed_languages=["eng", "deu"],
    )
    assert checked == {
        "languages": ["deu", "eng"],
        "pages": [1, 2, 3],
        "outputs": ["text", "searchable_pdf"],
        "escalate": True,
        "table_detection": False,
        "skip_text_pages": False,
    }


def test_unknown_language_lists_the_installed_ones() -> None:
    with pytest.raises(InvalidArgument) as caught:
        params.validate_params(
            "ocr", {"languages": ["eng", "klingon"]}, installed_languages=["eng", "deu", "osd"]
        )
    assert caught.value.error_code == "INVALID_PARAMS"
    assert "klingon" in caught.value.public_message
    assert "installed: deu, eng" in caught.value.public_message


@pytest.mark.parametrize(
    "bad",
    [
        {"languages": ["../../etc/passwd"]},
        {"languages": ["-c"]},
        {"languages": ["eng+deu"]},
        {"languages": ["osd"]},
        {"languages": []},
        {"languages": 5},
        {"languages": ["eng", "deu", "fra", "ita", "spa", "por", "nld", "pol", "ces"]},
        {"outputs": ["text", "pdf"]},
        {"outputs": []},
        {"outputs": "text"},
        {"pages": "3-1"},
        {"pages": [0]},
        {"pages": [True]},
        {"pages": f"1-{params.MAX_OCR_PAGES + 1}"},
        {"pages": list(range(1, params.MAX_OCR_PAGES + 2))},
        {"dpi": 300},
        {"escalate": "yes"},
        {"escalate": 1},
        {"table_detection": "yes"},
        {"table_detection": 1},
        {"skip_text_pages": "yes"},
        {"skip_text_pages": 0},
    ],
)
def test_bad_params(bad: dict) -> None:
    with pytest.raises(InvalidArgument) as caught:
        params.validate_params("ocr", bad)
    assert caught.value.error_code == "INVALID_PARAMS"


def test_unknown_operation() -> None:
    with pytest.raises(InvalidArgument) as caught:
        params.validate_params("table_detection", {})
    assert caught.value.error_code == "UNKNOWN_OPERATION"


# --- metrics, parsers, transforms (no tesseract) ---------------------------------------------------


def _levenshtein_table(a: str, b: str) -> int:
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        previous, row[0] = row[0], i
        for j, cb in enumerate(b, 1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (ca != cb))
    return row[-1]


def test_levenshtein_agrees_with_the_textbook_recurrence() -> None:
    rng = random.Random(6)
    for _ in range(300):
        a = "".join(rng.choice("abcü ") for _ in range(rng.randint(0, 90)))
        b = "".join(rng.choice("abcü ") for _ in range(rng.randint(0, 90)))
        assert levenshtein(a, b) == _levenshtein_table(a, b), (a, b)


def test_cer_is_whitespace_normalised() -> None:
    assert cer("The  quick\nbrown\f fox ", "The quick brown fox") == 0.0
    assert cer("The quick brawn fox", "The quick brown fox") == pytest.approx(1 / 19)
    assert cer("“It’s”", '"It\'s"', ascii_typography=True) == 0.0
    assert normalise_whitespace(" a \n\n b ") == "a b"
    assert cer("", "") == 0.0 and cer("x", "") == 1.0


def test_parse_tsv_keeps_words_and_their_ids() -> None:
    tsv = (
        "level\tpage_num\tblock_num\tpar_num\tline_num\tword_num\tleft\ttop\twidth\theight\tconf\ttext\n"
        "1\t1\t0\t0\t0\t0\t0\t0\t640\t480\t-1\t\n"
        "4\t1\t1\t1\t1\t0\t36\t92\t544\t30\t-1\t\n"
        "5\t1\t1\t1\t1\t1\t36\t92\t60\t24\t96.579834\tThis\n"
        "5\t1\t2\t1\t3\t2\t109\t92\t20\t24\t0\t \n"
        "5\t1\t2\t1\t3\t4\t109\t92\t20\t24\t91.2\tüber\n"
    )
    words = tesseract.parse_tsv(tsv)
    assert [w.as_json() for w in words] == [
        {"text": "This", "bbox": [36, 92, 60, 24], "conf": 96.58, "block": 1, "par": 1, "line": 1, "word": 1},
        {"text": "über", "bbox": [109, 92, 20, 24], "conf": 91.2, "block": 2, "par": 1, "line": 3, "word": 4},
    ]


def test_parse_osd() -> None:
    found = tesseract.parse_osd(
        "Page number: 0\nOrientation in degrees: 90\nRotate: 270\nOrientation confidence: 9.30\n"
        "Script: Latin\nScript confidence: 8.06\n"
    )
    assert found == tesseract.Orientation(270, 90, 9.3, "Latin", 8.06)
    assert tesseract.parse_osd("Too few characters. Skipping this page\n") is None


def _dot(image: pyvips.Image) -> tuple[int, int]:
    _, where = image.max(x=True, y=True)
    return where["x"], where["y"]


@pytest.mark.parametrize("rotate", [90, 180, 270])
def test_rotation_transform_maps_back(rotate: int) -> None:
    page = pyvips.Image.black(200, 100).draw_rect(255, 150, 20, 1, 1, fill=True).cast("uchar")
    turned = page.rot(f"d{rotate}")
    x, y = _dot(turned)
    back = geometry.rotation_transform(rotate, page.width, page.height)
    assert back.apply(x + 0.5, y + 0.5) == pytest.approx((150.5, 20.5))


@pytest.mark.parametrize("angle", [-4.0, -0.7, 2.5])
def test_deskew_transform_maps_back(angle: float) -> None:
    page = pyvips.Image.black(400, 300).draw_rect(255, 310, 40, 2, 2, fill=True).cast("uchar")
    x, y = _dot(page.rotate(angle))
    back = geometry.deskew_transform(angle, page.width, page.height)
    bx, by = back.apply(x + 0.5, y + 0.5)
    assert abs(bx - 311) < 1.5 and abs(by - 41) < 1.5


def test_otsu_threshold_splits_two_levels() -> None:
    histogram = [0] * 256
    histogram[40], histogram[200] = 100, 900
    assert 40 < preprocess.otsu_threshold(histogram) <= 200


# --- real tesseract: corpus pages --------------------------------------------------------------


@needs_tesseract
def test_installed_languages_cover_the_corpus() -> None:
    installed = tesseract.installed_languages()
    assert set(EUROTEXT_LANGUAGES) <= set(installed)
    assert "osd" not in installed and tesseract.has_osd()


@needs_tesseract
def test_phototest_matches_the_gold_text(tmp_path: Path) -> None:
    result = ocr(PHOTOTEST, tmp_path)
    assert cer(result.text, GOLD) < 0.02
    assert set(result.outputs) == {"text", "words"}
    meta = result.outputs["text"].metadata
    assert meta["page_count"] == 1 and meta["pages"] == [1] and meta["languages"] == ["eng"]
    assert meta["source_format"] == "tiff" and meta["mean_confidence"] > 80
    page = result.words["pages"][0]
    words = page["words"]
    assert " ".join(w["text"] for w in words) == normalise_whitespace(result.text)
    assert words[0]["text"] == "This" and words[0]["block"] == 1 and words[0]["line"] == 1
    # Upscaled from the stated 200 dpi to 300: boxes are in the prepared page's pixels.
    assert result.steps()["upscale"]["applied"] and page["dpi"] == 300
    assert (page["width"], page["height"]) == (960, 720)
    assert page["source"] == {"width": 640, "height": 480, "dpi": 200.0}
    x, y = words[0]["bbox"][:2]
    sx, sy = preprocess.Transform(*page["to_source"]).apply(x, y)
    assert abs(sx - 36) <= 3 and abs(sy - 92) <= 3  # "This" in phototest.tif (tesseract's own box)


@needs_tesseract
def test_rotated_page_gives_the_same_text_and_records_the_rotation(tmp_path: Path) -> None:
    result = ocr(OCR_DIR / "phototest-rotated-R.png", tmp_path)
    assert cer(result.text, GOLD) < 0.02
    orientation = result.steps()["orientation"]
    assert orientation["applied"] and orientation["rotate"] in (90, 270)
    assert orientation["confidence"] >= tesseract.OSD_MIN_CONFIDENCE and orientation["script"] == "Latin"
    # "This" is at (36, 92)–(96, 116) of the upright page; turned right, at (364, 36)–(388, 96).
    page = result.words["pages"][0]
    x, y, w, h = page["words"][0]["bbox"]
    back = preprocess.Transform(*page["to_source"])
    corners = [back.apply(x, y), back.apply(x + w, y + h)]
    xs, ys = sorted(c[0] for c in corners), sorted(c[1] for c in corners)
    assert abs(xs[0] - 364) <= 4 and abs(xs[1] - 388) <= 4
    assert abs(ys[0] - 36) <= 4 and abs(ys[1] - 96) <= 4


@needs_tesseract
@pytest.mark.parametrize(("turn", "rotate"), [("d180", 180), ("d270", 90)])
def test_upside_down_and_left_turned_pages_are_turned_back(tmp_path: Path, turn: str, rotate: int) -> None:
    source = save_png(grey_page(PHOTOTEST).rot(turn), tmp_path / "turned.png", dpi=200)
    result = ocr(source, tmp_path)
    orientation = result.steps()["orientation"]
    assert orientation["applied"] and orientation["rotate"] == rotate
    assert cer(result.text, GOLD) < 0.02
    if rotate == 180:  # tesseract alone reads an upside-down page as noise
        assert cer(ocr(source, tmp_path, preprocessing=False).text, GOLD) > 0.5


@needs_tesseract
def test_eurotext_keeps_its_accented_letters(tmp_path: Path) -> None:
    result = ocr(OCR_DIR / "eurotext.tif", tmp_path, languages=EUROTEXT_LANGUAGES)
    text = result.text
    for word in ("„schnelle”", "über", "«rapide»", "marrón", "rápido", "rápida", "cão", "preguiçoso"):
        assert word in text, word
    assert cer(text, (OCR_DIR / "eurotext.txt").read_text(encoding="utf-8")) < 0.02
    assert result.steps()["deskew"]["applied"]  # the page is skewed by about 0.8°
    # English alone has no such letters: the languages are what keeps them.
    english = ocr(OCR_DIR / "eurotext.tif", tmp_path).text
    assert "über" not in english and "preguiçoso" not in english


@needs_tesseract
def test_8071_preprocessing_lowers_the_error_rate(tmp_path: Path) -> None:
    """The UNLV page: CER printed with and without preprocessing (the benchmark's table)."""
    reference = (OCR_DIR / "8071_093.3B.txt").read_text(encoding="utf-8")
    bare = ocr(OCR_DIR / "8071_093.3B.tif", tmp_path, preprocessing=False).text
    prepared = ocr(OCR_DIR / "8071_093.3B.tif", tmp_path)
    rates = {
        "bare": (cer(bare, reference), cer(bare, reference, ascii_typography=True)),
        "preprocessed": (cer(prepared.text, reference), cer(prepared.text, reference, ascii_typography=True)),
    }
    for name, (raw, ascii_folded) in rates.items():
        print(
            f"\n8071_093.3B.tif {name:>12}: CER {raw:.2%} (typographic quotes folded to ASCII: {ascii_folded:.2%})"
        )
    print("8071_093.3B.tif preprocessing:", json.dumps(prepared.words["pages"][0]["preprocessing"]))
    assert rates["preprocessed"][0] <= rates["bare"][0]
    assert rates["preprocessed"][0] < 0.08


# --- real tesseract: pages made here -------------------------------------------------------------


@needs_tesseract
def test_skewed_page_is_deskewed(tmp_path: Path) -> None:
    skewed = grey_page(PHOTOTEST).rotate(3.0, background=[255])
    result = ocr(save_png(skewed, tmp_path / "skewed.png", dpi=200), tmp_path)
    deskew = result.steps()["deskew"]
    assert deskew["applied"] and deskew["angle"] == pytest.approx(-3.0, abs=0.2)
    assert cer(result.text, GOLD) < 0.02


@needs_tesseract
def test_uneven_background_is_normalised(tmp_path: Path) -> None:
    """phototest.tif under a shadow: paper from 30 % to 100 % brightness, ink at 44 % of it.
    Tesseract's global Otsu threshold loses most of the page; after the background step it reads
    it all."""
    page = grey_page(PHOTOTEST).cast("float")
    xy = pyvips.Image.xyz(page.width, page.height)
    light = 0.3 + 0.7 * (xy[0] / page.width) * (0.6 + 0.4 * xy[1] / page.height)
    shadowed = ((page / 255 * 110 + 90) * light).cast("uchar").copy(interpretation="b-w")
    source = save_png(shadowed, tmp_path / "shadow.png", dpi=200)
    bare = ocr(source, tmp_path, preprocessing=False)
    prepared = ocr(source, tmp_path)
    background = prepared.steps()["background"]
    assert background["applied"] and background["spread"] > preprocess.BACKGROUND_MIN_SPREAD
    assert cer(bare.text, GOLD) > 0.3
    assert cer(prepared.text, GOLD) < 0.02


@needs_tesseract
def test_low_contrast_alone_is_left_to_tesseract(tmp_path: Path) -> None:
    """phototest.tif, softened (grey edges), with ink at 150 on paper at 190 (16 % contrast):
    tesseract's Otsu separates them; the background step leaves an even page alone."""
    faint = (grey_page(PHOTOTEST).gaussblur(0.8).cast("float") / 255 * 40 + 150).cast("uchar")
    result = ocr(save_png(faint.copy(interpretation="b-w"), tmp_path / "faint.png", dpi=200), tmp_path)
    background = result.steps()["background"]
    assert not background["applied"] and background["reason"] == "even" and background["spread"] < 0.05
    assert cer(result.text, GOLD) < 0.02


@needs_tesseract
def test_small_text_without_a_resolution_is_upscaled_by_its_line_height(tmp_path: Path) -> None:
    """phototest.tif at half size (lines 15 px high) in a PNG that states no resolution."""
    small = grey_page(PHOTOTEST).resize(0.5)
    source = save_png(small, tmp_path / "small.png", dpi=25.4)  # libvips' "no resolution"
    assert pyvips.Image.new_from_file(str(source)).xres == pytest.approx(1.0)
    result = ocr(source, tmp_path)
    upscale = result.steps()["upscale"]
    assert upscale["applied"] and upscale["source"] == "line_height"
    assert upscale["line_height"] == pytest.approx(15, abs=2)
    assert upscale["scale"][0] == pytest.approx(
        preprocess.TARGET_LINE_HEIGHT / upscale["line_height"], rel=0.01
    )
    assert cer(result.text, GOLD) < 0.02


def _multi_page_tiff(path: Path) -> Path:
    """Two pages, 1024 × 800 each: phototest.tif (on a white page of eurotext's size) and eurotext.tif."""
    euro = grey_page(OCR_DIR / "eurotext.tif")
    photo = grey_page(PHOTOTEST).embed(0, 0, euro.width, euro.height, extend="white")
    pages = pyvips.Image.arrayjoin([photo, euro], across=1)
    pages = pages.copy(xres=300 / 25.4, yres=300 / 25.4)
    pages.set_type(pyvips.GValue.gint_type, "page-height", euro.height)
    pages.tiffsave(str(path), compression="deflate")
    return path


@needs_tesseract
def test_multi_page_tiff_gives_every_page_in_every_output(tmp_path: Path) -> None:
    source = _multi_page_tiff(tmp_path / "two.tif")
    result = ocr(source, tmp_path, outputs=ALL_OUTPUTS, languages=EUROTEXT_LANGUAGES)
    texts = result.text.split(assemble.PAGE_SEPARATOR)
    assert len(texts) == 2
    assert cer(texts[0], GOLD) < 0.03
    assert "preguiçoso" in texts[1]
    words = result.words
    assert words["page_count"] == 2 and [p["page"] for p in words["pages"]] == [1, 2]
    assert result.outputs["words"].metadata["pages"] == [1, 2]
    hocr = result.path("hocr").read_text(encoding="utf-8")
    assert hocr.count("class='ocr_page'") == 2
    assert "id='page_1'" in hocr and "id='page_2'" in hocr and "id='word_2_1'" in hocr
    assert "ppageno 1" in hocr and 'image "' not in hocr
    ids = [part.split("'")[0] for part in hocr.split(" id='")[1:]]
    assert len(ids) == len(set(ids))  # unique across pages
    document = pdfium.PdfDocument(str(result.path("searchable_pdf")))
    assert len(document) == 2
    document.close()
    only_second = ocr(source, tmp_path, pages=[2], languages=EUROTEXT_LANGUAGES)
    assert assemble.PAGE_SEPARATOR not in only_second.text and "preguiçoso" in only_second.text
    assert only_second.words["pages"][0]["page"] == 2


@needs_tesseract
def test_searchable_pdf_has_the_gold_text_as_its_text_layer(tmp_path: Path) -> None:
    result = ocr(PHOTOTEST, tmp_path, outputs=["searchable_pdf", "hocr"])
    assert set(result.outputs) == {"searchable_pdf", "hocr"}
    assert result.outputs["searchable_pdf"].mime_type == "application/pdf"
    document = pdfium.PdfDocument(str(result.path("searchable_pdf")))
    try:
        assert len(document) == 1
        width, height = document.get_page_size(0)
        assert (width, height) == pytest.approx((640 / 200 * 72, 480 / 200 * 72), abs=1)  # 3.2 × 2.4 in
        page = document[0]
        textpage = page.get_textpage()
        layer = textpage.get_text_range()
        textpage.close()
        page.close()
    finally:
        document.close()
    assert cer(layer, GOLD) < 0.05
    hocr = result.path("hocr").read_text(encoding="utf-8")
    assert hocr.startswith("<?xml") and hocr.rstrip().endswith("</html>") and "ocrx_word" in hocr


@needs_tesseract
def test_pdf_input_is_rendered_and_read(tmp_path: Path) -> None:
    """A PDF of a scanned page (the searchable PDF of phototest.tif) read again: rendered at 300 dpi."""
    scan = ocr(PHOTOTEST, tmp_path, outputs=["searchable_pdf"]).path("searchable_pdf")
    result = ocr(scan, tmp_path)
    assert cer(result.text, GOLD) < 0.02
    page = result.words["pages"][0]
    assert page["source"]["dpi"] == 300 and result.outputs["text"].metadata["source_format"] == "pdf"
    assert result.steps()["upscale"] == {"step": "upscale", "applied": False, "source": "render", "dpi": 300}


@needs_tesseract
def test_empty_page_is_empty_text_not_an_error(tmp_path: Path) -> None:
    white = (pyvips.Image.black(2480, 3508) + 255).cast("uchar").copy(interpretation="b-w")
    result = ocr(save_png(white, tmp_path / "white.png", dpi=300), tmp_path, outputs=ALL_OUTPUTS)
    assert result.text == ""
    page = result.words["pages"][0]
    assert page["words"] == [] and page["mean_confidence"] is None
    assert result.outputs["text"].metadata["mean_confidence"] is None
    assert result.steps()["orientation"] == {
        "step": "orientation",
        "applied": False,
        "reason": "too_few_characters",
    }
    assert result.steps()["deskew"]["reason"] == "no_ink"
    assert len(pdfium.PdfDocument(str(result.path("searchable_pdf")))) == 1


# --- real tesseract: bad input ---------------------------------------------------------------------


def _code(exc: pytest.ExceptionInfo[DomainError]) -> str:
    return exc.value.error_code


@needs_tesseract
def test_language_not_installed_is_invalid_params(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument) as caught:
        ocr(PHOTOTEST, tmp_path, languages=["eng", "tlh"])
    assert _code(caught) == "INVALID_PARAMS" and "tlh" in caught.value.public_message
    assert "eng" in caught.value.public_message.split("; installed: ")[1]


@needs_tesseract
def test_page_over_the_pixel_limit_is_refused_before_decoding(tmp_path: Path) -> None:
    with pytest.raises(PermanentJobError) as caught:
        ocr(PHOTOTEST, tmp_path, OcrLimits(max_input_bytes=1 << 20, max_page_pixels=640 * 480 - 1))
    assert _code(caught) == "INPUT_TOO_LARGE_PIXELS"


@needs_tesseract
def test_256_megapixel_image_is_refused_from_its_header(tmp_path: Path) -> None:
    """16,000 × 16,000 pixels in a small file (a PNG of one colour): refused by the pixel limit
    before libvips decodes a row or tesseract starts."""
    big = (pyvips.Image.black(16000, 16000) + 255).cast("uchar").copy(interpretation="b-w")
    source = tmp_path / "big.png"
    big.pngsave(str(source), compression=9)
    assert source.stat().st_size < 1 << 20
    with pytest.raises(PermanentJobError) as caught:
        ocr(source, tmp_path)
    assert _code(caught) == "INPUT_TOO_LARGE_PIXELS"
    assert "16000 × 16000" in caught.value.public_message


@needs_tesseract
def test_page_limits(tmp_path: Path) -> None:
    source = _multi_page_tiff(tmp_path / "two.tif")
    with pytest.raises(PermanentJobError) as too_many:
        ocr(source, tmp_path, OcrLimits(max_input_bytes=1 << 24, max_page_pixels=10**8, max_pages=1))
    assert _code(too_many) == "OCR_PAGE_LIMIT"
    with pytest.raises(InvalidArgument) as missing:
        ocr(source, tmp_path, pages=[3])
    assert _code(missing) == "INVALID_PARAMS"
    with pytest.raises(PermanentJobError) as document:
        ocr(source, tmp_path, OcrLimits(max_input_bytes=1 << 24, max_page_pixels=10**8, max_document_pages=1))
    assert _code(document) == "INPUT_TOO_MANY_PAGES"


@needs_tesseract
def test_500_page_pdf_is_refused_before_rendering_unless_pages_are_chosen(tmp_path: Path) -> None:
    document = pdfium.PdfDocument.new()
    for _ in range(500):
        document.new_page(595, 842).close()
    source = tmp_path / "500.pdf"
    document.save(str(source))
    document.close()
    with pytest.raises(PermanentJobError) as caught:
        ocr(source, tmp_path)
    assert _code(caught) == "OCR_PAGE_LIMIT" and "500 pages" in caught.value.public_message
    chosen = ocr(source, tmp_path, pages="499-500")  # blank pages: empty text, not an error
    assert chosen.text == assemble.PAGE_SEPARATOR
    assert chosen.outputs["text"].metadata["page_count"] == 500
    assert chosen.outputs["text"].metadata["pages"] == [499, 500]


@needs_tesseract
@pytest.mark.parametrize(
    ("content", "code"),
    [
        (b"<svg xmlns='http://www.w3.org/2000/svg' width='10' height='10'/>", "UNSUPPORTED_FORMAT"),
        (b"BM" + b"\0" * 100, "UNSUPPORTED_FORMAT"),
        (b"\x89PNG\r\n\x1a\n" + b"\0" * 40, "CORRUPT_INPUT"),
        (b"%PDF-1.7\nnot really\n", "PARSE_ERROR"),
    ],
)
def test_unreadable_input(tmp_path: Path, content: bytes, code: str) -> None:
    source = tmp_path / "input"
    source.write_bytes(content)
    with pytest.raises(PermanentJobError) as caught:
        ocr(source, tmp_path)
    assert _code(caught) == code


@needs_tesseract
def test_truncated_image_is_corrupt_input(tmp_path: Path) -> None:
    data = (OCR_DIR / "phototest-rotated-R.png").read_bytes()
    source = tmp_path / "cut.png"
    source.write_bytes(data[: len(data) // 2])
    with pytest.raises(PermanentJobError) as caught:
        ocr(source, tmp_path)
    assert _code(caught) == "CORRUPT_INPUT"


@needs_tesseract
def test_encrypted_pdf_needs_a_password(tmp_path: Path) -> None:
    encrypted = Path(__file__).resolve().parents[1] / "data" / "pdf" / "libreoffice-writer-password.pdf"
    with pytest.raises(PermanentJobError) as caught:
        ocr(encrypted, tmp_path)
    assert _code(caught) == "PASSWORD_REQUIRED"


@needs_tesseract
def test_page_timeout_is_cpu_time_and_permanent(tmp_path: Path) -> None:
    """The 8071 page takes tesseract about 3.7 s of CPU: with 1 s per page it is killed by its
    own RLIMIT_CPU (SIGXCPU), which load does not change: OCR_PAGE_TIMEOUT, permanent."""
    limits = OcrLimits(max_input_bytes=1 << 24, max_page_pixels=10**8, page_timeout_seconds=1.0)
    with pytest.raises(PermanentJobError) as caught:
        ocr(OCR_DIR / "8071_093.3B.tif", tmp_path, limits, preprocessing=False)
    assert _code(caught) == "OCR_PAGE_TIMEOUT" and "CPU time" in caught.value.public_message


@needs_tesseract
def test_page_wall_clock_limit_is_transient(tmp_path: Path) -> None:
    """The wall-clock limit (three times the CPU limit) is what an overloaded worker hits first:
    TIMEOUT, which another attempt may pass. The 8071 page (about 3.7 s of tesseract CPU), not
    phototest (about 0.3 s): the wall clock starts when the parent waits, and a parent paused
    between starting tesseract and waiting for it (a full garbage collection of the large test
    process after ~900 tests, a loaded machine) found phototest done already — seen in full
    suite runs: 0.2 ms of waiting, exit 0."""
    limits = OcrLimits(max_input_bytes=1 << 24, max_page_pixels=10**8, page_timeout_seconds=0.01)
    with pytest.raises(DomainError) as caught:
        ocr(OCR_DIR / "8071_093.3B.tif", tmp_path, limits, preprocessing=False)
    assert (caught.value.error_code, caught.value.retryable) == ("TIMEOUT", True)


@needs_tesseract
def test_a_models_directory_without_configs_is_a_clear_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tesseract exits 0 without the TSV when ``TESSDATA_PREFIX`` holds models but no
    ``configs/tsv``: the failure says so (it was a FileNotFoundError traceback)."""
    system = system_models()
    models = tmp_path / "models"
    models.mkdir()
    (models / "eng.traineddata").symlink_to(system / "eng.traineddata")
    monkeypatch.setenv("TESSDATA_PREFIX", str(models))
    page = tmp_path / "page" / "phototest.tif"
    page.parent.mkdir()
    shutil.copy(PHOTOTEST, page)
    with pytest.raises(tesseract.TesseractFailure, match=r"wrote no tsv output on a page .*configs/"):
        tesseract.Tesseract(timeout_seconds=60).recognise(page, languages=["eng"], dpi=300)


@needs_tesseract
def test_input_over_the_size_limit(tmp_path: Path) -> None:
    with pytest.raises(PermanentJobError) as caught:
        ocr(PHOTOTEST, tmp_path, OcrLimits(max_input_bytes=1000, max_page_pixels=10**8))
    assert _code(caught) == "INPUT_TOO_LARGE"


# --- in a real sandbox child -----------------------------------------------------------------------


@pytest.fixture(scope="module")
async def sandbox(tmp_root: Path) -> AsyncIterator[Sandbox]:
    """A zygote as the ocrworker will have one: pyvips, PDFium and the engine imported, children
    dropped to a sandbox uid (own range, apart from the other tests' uids)."""
    work_dir = tmp_root / f"ocr-{secrets.token_hex(4)}"
    work_dir.mkdir(mode=0o755)
    uids = range(63100, 63102) if os.geteuid() == 0 else None
    box = Sandbox(work_dir, preload=("pyvips", "pypdfium2", "hypermedia.engines.ocr.engine"), uid=uids)
    await box.start()
    yield box
    await box.close()


@needs_tesseract
@pytest.mark.parametrize("make_pdf", [False, True], ids=["tiff", "pdf"])
async def test_ocr_in_a_sandbox_child(sandbox: Sandbox, tmp_path: Path, make_pdf: bool) -> None:
    """The entry as the ocrworker calls it: a forked, rlimited child with its own uid, network and
    mount namespaces, ``/tmp`` hidden; tesseract runs as its child. A PDF also goes through the
    PDFium engine process."""
    source = PHOTOTEST
    if make_pdf:
        source = ocr(PHOTOTEST, tmp_path, outputs=["searchable_pdf"]).path("searchable_pdf")
    job_id = f"job-{secrets.token_hex(6)}"
    job_dir = sandbox.prepare(job_id)
    input_path = job_dir / "input" / "source"
    shutil.copy(source, input_path)
    os.chmod(input_path, 0o600)  # readable only once handed to the sandbox uid
    limits = SandboxLimits(cpu_seconds=60, wall_seconds=90, memory_bytes=2 << 30, fsize_bytes=1 << 30)
    try:
        result = await sandbox.run(
            job_id,
            "hypermedia.engines.ocr.engine:run",
            "ocr",
            {"outputs": ALL_OUTPUTS},
            input_path,
            limits,
            entry_kwargs={"limits": LIMITS},
        )
        assert result.error_code is None, result
        files = {o.output_type: (job_dir / "output" / o.filename).read_bytes() for o in result.outputs}
    finally:
        sandbox.cleanup(job_id)
    assert set(files) == set(ALL_OUTPUTS)
    assert cer(files["text"].decode(), GOLD) < 0.02
    assert json.loads(files["words"])["pages"][0]["word_count"] > 50


@needs_tesseract
@pytest.mark.parametrize(
    ("pages", "cpu_seconds", "wall_seconds"),
    [(1, 1, 30), (16, 2, 5)],
    ids=["one-page-over-the-jobs-cpu", "pages-that-together-use-it-up"],
)
async def test_ocr_that_uses_up_the_jobs_cpu_time_is_a_cpu_timeout(
    sandbox: Sandbox, tmp_path: Path, pages: int, cpu_seconds: int, wall_seconds: float
) -> None:
    """tesseract runs in a process of its own per page. One page needing more CPU than the job has
    (the 8071 page, about 3.7 s, against 1 s) dies of the job's RLIMIT_CPU it inherits; phototest
    pages (about 0.3 s each) never do, but together they use up the job's 2 s before the wall
    clock's 5 s (on a core at least 40 % theirs). Either way the job ends ``TIMEOUT`` stopped by ``cpu_time``: the input's fault,
    charged (``charges.input_fault``), not a wall-clock kill a starved host could have caused."""
    page = pyvips.Image.new_from_file(str(OCR_DIR / "8071_093.3B.tif" if pages == 1 else PHOTOTEST))
    job_id = f"job-{secrets.token_hex(6)}"
    job_dir = sandbox.prepare(job_id)
    input_path = job_dir / "input" / "source"
    pyvips.Image.arrayjoin([page] * pages, across=1).tiffsave(
        str(tmp_path / "pages.tif"), page_height=page.height, compression="lzw"
    )
    shutil.copy(tmp_path / "pages.tif", input_path)
    os.chmod(input_path, 0o600)
    limits = SandboxLimits(
        cpu_seconds=cpu_seconds, wall_seconds=wall_seconds, memory_bytes=2 << 30, fsize_bytes=1 << 30
    )
    try:
        result = await sandbox.run(
            job_id,
            "hypermedia.engines.ocr.engine:run",
            "ocr",
            {"outputs": ["text"], "escalate": False},
            input_path,
            limits,
            entry_kwargs={"limits": LIMITS},
        )
    finally:
        sandbox.cleanup(job_id)
    assert (result.error_code, result.killed) == ("TIMEOUT", "cpu_time"), result
    assert result.error_message == "The job exceeded its CPU time limit."
    assert charges.input_fault(result.error_code, result.killed)


def test_asking_for_tables_either_way_gives_both() -> None:
    by_flag = params.validate_params("ocr", {"table_detection": True})
    by_output = params.validate_params("ocr", {"outputs": ["text", "tables"]})
    assert by_flag["outputs"] == ["text", "words", "tables"] and by_flag["table_detection"] is True
    assert by_output["outputs"] == ["text", "tables"] and by_output["table_detection"] is True


# --- what the gateway and the ocrworker take from the params -----------------------------------------


def test_input_types_are_what_the_engine_reads() -> None:
    """The gateway's list (pure Python) and the engine's loaders (libvips) name the same types."""
    from hypermedia.engines.ocr import engine

    assert params.INPUT_MIME_TYPES == {*engine.LOADERS, "application/pdf"}
    assert "image/svg+xml" not in params.INPUT_MIME_TYPES


@pytest.mark.parametrize(
    ("job_params", "mime_type", "pages"),
    [
        ({}, "image/png", 1),
        ({}, "image/jpeg", 1),
        ({}, "image/tiff", params.MAX_OCR_PAGES),
        ({}, "application/pdf", params.MAX_OCR_PAGES),
        ({"pages": "2-4"}, "application/pdf", 3),
        ({"escalate": False}, "application/pdf", 0),
    ],
)
def test_escalation_pages_bound_what_the_gateway_holds(job_params: dict, mime_type: str, pages: int) -> None:
    assert params.escalation_pages(params.validate_params("ocr", job_params), mime_type) == pages


def test_the_ocrworker_charges_escalated_pages_as_a_line() -> None:
    from services.ocrworker.__main__ import OcrHandler

    job = dataclasses.replace(_claimed_job(), escalation_per_page=300)
    handler = OcrHandler()
    meta = {"escalated_pages": 2}
    outputs = [OutputFile("text", "text.txt", "text/plain", meta), OutputFile("words", "w.json", "x", meta)]
    assert handler.charge_lines(job, outputs) == {"ocr_escalation": 600}
    assert handler.charge_lines(job, [OutputFile("text", "t", "x", {"escalated_pages": 0})]) == {}
    assert handler.charge_lines(dataclasses.replace(job, escalation_per_page=0), outputs) == {}
    limits = handler.entry_kwargs(job)["limits"]
    assert (limits.max_input_bytes, limits.max_page_pixels) == (job.max_input_bytes, job.max_pixels)


def _claimed_job() -> Any:
    return claimed_job("ocr", "ocr", estimated_credits=1500, timeout_seconds=300, max_pixels=64_000_000)


def _image_only_page(document: pdfium.PdfDocument, image: Path) -> None:
    """Appends a page that is only ``image`` (a scan: no text layer), A4-wide at its aspect."""
    from PIL import Image

    picture = Image.open(image).convert("L")
    width = 595.0
    height = width * picture.height / picture.width
    page = document.new_page(width, height)
    obj = pdfium.PdfImage.new(document)
    obj.set_bitmap(pdfium.PdfBitmap.from_pil(picture))
    obj.set_matrix(pdfium.PdfMatrix().scale(width, height))
    page.insert_obj(obj)
    page.gen_content()
    page.close()


def _page_text(pdf: Path, index: int) -> str:
    """Page ``index``'s text layer as ``text_extract`` reads it."""
    from hypermedia.engines.documents.pdf import page_text

    document = pdfium.PdfDocument(str(pdf))
    try:
        return page_text(document, index)
    finally:
        document.close()


@needs_tesseract
def test_skip_text_pages_takes_the_text_layer_and_ocrs_the_scans(tmp_path: Path) -> None:
    """Page 1 born digital (the first page of a pdfLaTeX PDF), page 2 a scan of phototest.tif:
    with ``skip_text_pages`` page 1's text is its layer's (not OCRed, not rendered), page 2 is
    OCRed; the searchable PDF has both, page 1 copied as it was."""
    born_digital = Path(__file__).resolve().parents[1] / "data" / "pdf" / "pdflatex-4-pages.pdf"
    document = pdfium.PdfDocument.new()
    source = pdfium.PdfDocument(str(born_digital))
    document.import_pages(source, [0])
    source.close()
    _image_only_page(document, PHOTOTEST)
    mixed = tmp_path / "mixed.pdf"
    document.save(str(mixed))
    document.close()
    layer = _page_text(mixed, 0)

    result = ocr(mixed, tmp_path, skip_text_pages=True, outputs=["text", "words", "hocr", "searchable_pdf"])
    first, second = result.text.split(assemble.PAGE_SEPARATOR)
    assert first == layer and len(layer) > 1000
    assert cer(second, GOLD) < 0.02
    pages = result.words["pages"]
    assert (pages[0]["engine"], pages[0]["skipped"], pages[0]["words"]) == ("text_layer", "text_layer", [])
    assert pages[1]["engine"] == "tesseract" and pages[1]["word_count"] > 50
    assert result.outputs["text"].metadata["skipped_pages"] == [1]
    hocr = result.path("hocr").read_text()
    assert hocr.count("class='ocr_page'") == 1 and "ppageno 1" in hocr
    searchable = result.path("searchable_pdf")
    assert _page_text(searchable, 0) == layer
    assert cer(_page_text(searchable, 1), GOLD) < 0.02

    everything = ocr(mixed, tmp_path, outputs=["text", "words"])  # the default: every page OCRed
    assert everything.outputs["text"].metadata["skipped_pages"] == []
    assert [p["engine"] for p in everything.words["pages"]] == ["tesseract", "tesseract"]


@needs_tesseract
def test_a_job_whose_pages_all_have_text_layers_ocrs_nothing(tmp_path: Path) -> None:
    born_digital = Path(__file__).resolve().parents[1] / "data" / "pdf" / "pdflatex-4-pages.pdf"
    result = ocr(born_digital, tmp_path, skip_text_pages=True, pages="1-2", outputs=["text", "hocr"])
    assert result.outputs["text"].metadata["skipped_pages"] == [1, 2]
    assert result.text.split(assemble.PAGE_SEPARATOR)[1] == _page_text(born_digital, 1)
    assert result.path("hocr").read_text() == assemble.EMPTY_HOCR


def _pdf_with_text(pages: list[str]) -> bytes:
    """A PDF whose pages carry ``pages`` as text in Helvetica 1 pt, 1,000 characters per line (so
    that it stays on the page), with a correct cross-reference table: born-digital text, no image."""
    objects = ["<< /Type /Catalog /Pages 2 0 R >>", ""]
    kids = []
    for text in pages:
        lines = " T* ".join(f"({text[i : i + 1000]}) Tj" for i in range(0, len(text), 1000))
        content = f"BT /F1 1 Tf 1 TL 10 800 Td {lines} ET".encode("latin-1")
        objects.append(f"<< /Length {len(content)} >>\nstream\n{content.decode('latin-1')}\nendstream")
        objects.append(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 595 842] /Contents {len(objects)} 0 R "
            "/Resources << /Font << /F1 << /Type /Font /Subtype /Type1 /BaseFont /Helvetica >> >> >> >>"
        )
        kids.append(f"{len(objects)} 0 R")
    objects[1] = f"<< /Type /Pages /Kids [{' '.join(kids)}] /Count {len(kids)} >>"
    out = bytearray(b"%PDF-1.7\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += f"{number} 0 obj\n{body}\nendobj\n".encode("latin-1")
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    out += "".join(f"{offset:010d} 00000 n \n" for offset in offsets).encode()
    out += f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    return bytes(out)


@needs_tesseract
def test_skip_text_pages_with_megabytes_of_text(tmp_path: Path) -> None:
    """20 pages of 60,000 characters each: 1.2 MB of text layers, more than the PDF engine
    process may return as its result (1 MiB): they come back as files."""
    source = tmp_path / "dense-text.pdf"
    source.write_bytes(_pdf_with_text([f"page{n:02d} " + "x" * 59_993 for n in range(1, 21)]))
    result = ocr(source, tmp_path, skip_text_pages=True, outputs=["text"], escalate=False)
    pages = result.text.split(assemble.PAGE_SEPARATOR)
    assert result.outputs["text"].metadata["skipped_pages"] == list(range(1, 21))
    assert [page.split()[0] for page in pages] == [f"page{n:02d}" for n in range(1, 21)]
    assert sum(len(page) for page in pages) >= 20 * 60_000


def test_a_page_exactly_at_the_pixel_limit_is_rendered_within_it() -> None:
    """1920 pt at 300 dpi is 8000 px, but 1920 × 300 / 72 is 8000.000000000001 in floating point
    and the render rounds up to 8001: the resolution steps down until the rounded size fits."""
    from hypermedia.engines.ocr.pages import _pixel_size, _render_dpi

    dpi = _render_dpi(1920, 1920, 64_000_000)
    width, height = _pixel_size(1920, 1920, dpi)
    assert width * height <= 64_000_000 and dpi == 299
    assert _render_dpi(595, 842, 64_000_000) == 300  # A4 at 300 dpi is 8.7 M pixels
    assert _render_dpi(14_400, 14_400, 64_000_000) == 150  # too large even at 150 dpi: refused


@needs_tesseract
def test_a_skipped_page_is_copied_without_its_form_fields_but_with_their_values(tmp_path: Path) -> None:
    """The filled form (three widget annotations, "Ada Lovelace" typed into one): its copy in the
    searchable PDF has no annotation left (no field, link or action of the upload is served),
    and the typed value is still there, flattened into the page."""
    import pypdfium2.raw as pdfium_c

    from tests.helpers.pdf import FILLED_NAME, filled_forms_pdf

    source = tmp_path / "filled.pdf"
    source.write_bytes(filled_forms_pdf())
    result = ocr(source, tmp_path, skip_text_pages=True, outputs=["searchable_pdf"], escalate=False)
    assert result.outputs["searchable_pdf"].metadata["skipped_pages"] == [1]
    document = pdfium.PdfDocument(str(result.path("searchable_pdf")))
    try:
        page = document[0]
        annotations = pdfium_c.FPDFPage_GetAnnotCount(page.raw)
        page.close()
    finally:
        document.close()
    assert annotations == 0
    assert FILLED_NAME in _page_text(result.path("searchable_pdf"), 0)
