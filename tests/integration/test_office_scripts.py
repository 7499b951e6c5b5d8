"""Documents in Chinese, Japanese, Korean, Arabic, Hebrew, Devanagari and Thai convert with real
glyphs, not empty boxes (issue 15): the docworker's fonts (the Makefile's ``DOCWORKER_PACKAGES``:
fonts-noto-cjk, fonts-noto-core) reach its confined LibreOffice listeners and the PDFium that
renders its previews.

Documents the test writes (ODT, DOCX and RTF, one line per script, in fonts that have none of these
scripts: LibreOffice must fall back through fontconfig) go through a real listener
(:class:`hypermedia.engines.documents.office.OfficePool`, confined and under its Landlock view as in the
docworker); the PDFs are read with PDFium in this process. For every character the test checks
the text layer, the font that draws it (embedded, one that has the script) and the shape it draws:
each character's rendered bitmap, cut out at its glyph box, must have ink, must not be the
.notdef box (a hollow rectangle, what LibreOffice draws for a character no installed font has),
and distinct characters must draw distinct shapes (without the fonts every CJK, Devanagari and
Thai character drew the same box). The docworker's own ``pdf_preview`` (a real sandbox child, as
the docworker runs it) of the converted PDF and of a PDF whose CJK fonts are not embedded (the
Adobe CJK fonts iText and ReportLab name without embedding; PDFium then substitutes an installed
font, and without one draws nothing) is checked the same way. The listener must also read the
fonts' fontconfig cache through its Landlock view rather than build one of its own at each start.
"""

from __future__ import annotations

import asyncio
import ctypes
import itertools
import os
import re
import unicodedata
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pypdfium2 as pdfium
import pypdfium2.raw as pdfium_c
import pytest
import pyvips

from hypermedia.core import config
from hypermedia.engines.documents.office import OfficePool
from hypermedia.engines.documents.settings import OfficeSettings
from hypermedia.sandbox import Sandbox
from tests.e2e.test_office_rest import DOCX_MIME, ODT_MIME, docx
from tests.security.test_office_listener import odt
from tests.unit.test_pdf import run_job

RTF_MIME = "application/rtf"
LISTENER_UID = 59_910
"""A uid no other test uses (the listener tests' is 59,900)."""
IS_ROOT = os.geteuid() == 0

SCRIPTS: dict[str, tuple[str, str]] = {
    "Simplified Chinese": ("简体中文汉字测试", r"NotoS(ans|erif)CJK"),
    "Traditional Chinese": ("繁體中文漢字測試", r"NotoS(ans|erif)CJK"),
    "Japanese": ("日本語のひらがなとカタカナ", r"NotoS(ans|erif)CJK"),
    "Korean": ("한국어 한글 시험", r"NotoS(ans|erif)CJK"),
    "Arabic": ("العربية نص تجريبي", r"(Noto(Naskh|Sans|Kufi)Arabic|DejaVuSans)"),
    "Hebrew": ("עברית טקסט לדוגמה", r"(NotoS(ans|erif)Hebrew|DejaVuSans)"),
    "Devanagari": ("हिन्दी देवनागरी परीक्षण", r"NotoS(ans|erif)Devanagari"),
    "Thai": ("ภาษาไทย ทดสอบ", r"(NotoS(ans|erif)Thai|NotoLoopedThai)"),
}
"""Script → (a line of it, the base font names that may draw it: the Noto face of the script, or
DejaVu Sans, which has Arabic and Hebrew: fontconfig depends on fonts-dejavu-core). No line holds
a character whose real glyph is itself a hollow rectangle (such as 口)."""

SCALE = 4.0
"""Rendering scale of the test's own renders (288 dpi: an 11 pt character is about 44 px high)."""
GRID = 32
"""Side of the square each character's ink is resampled to before shapes are compared."""


# --- documents the test writes -------------------------------------------------------------------


def rtf(lines: list[str]) -> bytes:
    """An RTF document (RTF 1.9.1 specification): one paragraph per line in Times New Roman, every
    non-ASCII character as ``\\uN?`` (N the UTF-16 code unit as a signed 16-bit number)."""

    def escaped(text: str) -> str:
        units = text.encode("utf-16-le")
        out = []
        for i in range(0, len(units), 2):
            unit = int.from_bytes(units[i : i + 2], "little", signed=True)
            out.append(chr(unit) if 0 <= unit < 128 and chr(unit) not in "\\{}" else f"\\u{unit}?")
        return "".join(out)

    body = "".join(f"{{\\pard {escaped(line)}\\par}}\n" for line in lines)
    return (r"{\rtf1\ansi\deff0{\fonttbl{\f0\froman Times New Roman;}}\f0\fs22" + "\n" + body + "}").encode()


def non_embedded_cjk_pdf() -> bytes:
    """A one-page PDF with a line in each of the four Adobe CJK character collections, each in a
    Type 0 font that is not embedded (ISO 32000-1 9.7: a CIDFontType0 without ``FontFile``, a
    predefined UCS-2 CMap), named as the Adobe CJK fonts iText and ReportLab write:
    STSong-Light (Adobe-GB1), MSung-Light (Adobe-CNS1), HeiseiMin-W3 (Adobe-Japan1),
    HYSMyeongJo-Medium (Adobe-Korea1). Returns the PDF; its lines are ``SCRIPTS``' first four."""
    fonts = [
        ("STSong-Light", "UniGB-UCS2-H", "GB1", 2, "Simplified Chinese"),
        ("MSung-Light", "UniCNS-UCS2-H", "CNS1", 0, "Traditional Chinese"),
        ("HeiseiMin-W3", "UniJIS-UCS2-H", "Japan1", 2, "Japanese"),
        ("HYSMyeongJo-Medium", "UniKS-UCS2-H", "Korea1", 1, "Korean"),
    ]
    content = "\n".join(
        f"BT /F{i} 24 Tf 40 {760 - 60 * i} Td <{SCRIPTS[script][0].encode('utf-16-be').hex()}> Tj ET"
        for i, (_, _, _, _, script) in enumerate(fonts)
    ).encode()
    resources = " ".join(f"/F{i} {5 + 2 * i} 0 R" for i in range(len(fonts)))
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 595 842] /Resources << /Font << {resources} >> >> "
        "/Contents 4 0 R >>".encode(),
        b"<< /Length %d >>\nstream\n%s\nendstream" % (len(content), content),
    ]
    for i, (name, cmap, ordering, supplement, _) in enumerate(fonts):
        objects.append(
            f"<< /Type /Font /Subtype /Type0 /BaseFont /{name}-{cmap} /Encoding /{cmap} "
            f"/DescendantFonts [{6 + 2 * i} 0 R] >>".encode()
        )
        objects.append(
            f"<< /Type /Font /Subtype /CIDFontType0 /BaseFont /{name} /CIDSystemInfo << /Registry (Adobe) "
            f"/Ordering ({ordering}) /Supplement {supplement} >> /FontDescriptor << /Type /FontDescriptor "
            f"/FontName /{name} /Flags 6 /FontBBox [0 -200 1000 900] /ItalicAngle 0 /Ascent 880 "
            "/Descent -120 /CapHeight 700 /StemV 80 >> /DW 1000 >>".encode()
        )
    out = b"%PDF-1.7\n"
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (number, body)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return out


# --- reading PDFs and pictures -------------------------------------------------------------------


def char_fonts(page: pdfium.PdfPage) -> list[tuple[str, str, bool]]:
    """Every character of the page's text layer (PDFium): (character, base font name without the
    subset tag, embedded)."""
    textpage = page.get_textpage()
    result = []
    for index in range(textpage.count_chars()):
        char = chr(pdfium_c.FPDFText_GetUnicode(textpage.raw, index))
        obj = pdfium_c.FPDFText_GetTextObject(textpage.raw, index)
        if not obj:
            continue
        font = pdfium_c.FPDFTextObj_GetFont(obj)
        size = pdfium_c.FPDFFont_GetBaseFontName(font, None, 0)
        buffer = ctypes.create_string_buffer(size)
        pdfium_c.FPDFFont_GetBaseFontName(font, buffer, size)
        name = buffer.value.decode("latin-1").split("+", 1)[-1]
        result.append((char, name, bool(pdfium_c.FPDFFont_GetIsEmbedded(font))))
    return result


def letter_boxes(page: pdfium.PdfPage, line: str) -> list[tuple[str, tuple[float, float, float, float]]]:
    """The letters (Unicode category L*) of ``line`` on the page, each with its glyph box in PDF
    points (PDFium's tight char box: left, bottom, right, top); letters that share one box with
    the letter before them (a Devanagari conjunct, drawn as one glyph) are left out."""
    textpage = page.get_textpage()
    text = textpage.get_text_range()
    start = text.find(line)
    assert start >= 0, f"{line!r} is not in the text layer {text!r}"
    boxes: list[tuple[str, tuple[float, float, float, float]]] = []
    for index in range(start, start + len(line)):
        char = text[index]
        box = textpage.get_charbox(index)
        if unicodedata.category(char).startswith("L") and (not boxes or boxes[-1][1] != box):
            boxes.append((char, box))
    return boxes


def shape(
    pixels: np.ndarray, box: tuple[float, float, float, float], scale: float, *, square: bool = False
) -> np.ndarray:
    """The ink (pixels darker than mid grey) of a ``GRID`` × ``GRID`` resampling of the part of
    ``pixels`` (a grey page picture, row 0 at the top, ``scale`` pixels per point) inside ``box``
    (points, PDF coordinates), trimmed to the ink's own bounding box (``square``: centred in the
    square around it first, keeping its proportions); all False when there is none."""
    left, bottom, right, top = box
    height = pixels.shape[0]
    crop = pixels[
        max(0, int(height - top * scale) - 1) : int(height - bottom * scale) + 2,
        max(0, int(left * scale) - 1) : int(right * scale) + 2,
    ]
    ink = crop < 128
    rows, cols = np.flatnonzero(ink.any(axis=1)), np.flatnonzero(ink.any(axis=0))
    if not rows.size:
        return np.zeros((GRID, GRID), bool)
    ink = ink[rows[0] : rows[-1] + 1, cols[0] : cols[-1] + 1]
    if square:
        side = max(ink.shape)
        padded = np.zeros((side, side), bool)
        top_pad, left_pad = (side - ink.shape[0]) // 2, (side - ink.shape[1]) // 2
        padded[top_pad : top_pad + ink.shape[0], left_pad : left_pad + ink.shape[1]] = ink
        ink = padded
    y = np.arange(GRID) * ink.shape[0] // GRID
    x = np.arange(GRID) * ink.shape[1] // GRID
    return ink[np.ix_(y, x)]


def is_notdef_box(ink: np.ndarray) -> bool:
    """Whether ``ink`` (a :func:`shape`) is the .notdef box, a hollow rectangle: each edge band
    (the outer eighth of the rows or columns) inked along at least 90 % of its length, and the
    inside (all but the outer fifth on each side) empty, below 2 % ink. A glyph that is a frame
    with strokes inside it (日) has ink inside; one with an open or round side misses an edge."""
    band = GRID // 8
    edges = [
        ink[:band].any(axis=0).mean(),
        ink[-band:].any(axis=0).mean(),
        ink[:, :band].any(axis=1).mean(),
        ink[:, -band:].any(axis=1).mean(),
    ]
    inside = ink[GRID // 5 : GRID - GRID // 5, GRID // 5 : GRID - GRID // 5]
    return bool(min(edges) >= 0.9 and inside.mean() < 0.02)


def grey(image: pyvips.Image) -> np.ndarray:
    """A picture as a grey numpy array (first band, alpha flattened onto white)."""
    if image.hasalpha():
        image = image.flatten(background=255)
    return np.asarray(image.colourspace("b-w")[0].numpy())


def check_glyphs(page: pdfium.PdfPage, pixels: np.ndarray, scale: float, scripts: list[str]) -> None:
    """Every letter of each script's line in ``pixels`` (a picture of ``page`` at ``scale``) has
    ink, is not the .notdef box, and differs from every other letter of the line."""
    for script in scripts:
        line = SCRIPTS[script][0]
        letters = letter_boxes(page, line)
        assert len({char for char, _ in letters}) >= 4, (script, letters)
        for char, box in letters:
            ink = shape(pixels, box, scale)
            assert ink.mean() > 0.05, f"{script}: {char!r} draws nothing"
            assert not is_notdef_box(ink), f"{script}: {char!r} is drawn as an empty box"
        shapes = [(char, shape(pixels, box, scale, square=True)) for char, box in letters]
        for (a, ink_a), (b, ink_b) in itertools.combinations(shapes, 2):
            if a != b:
                assert (ink_a != ink_b).mean() > 0.05, f"{script}: {a!r} and {b!r} draw the same shape"


def render(page: pdfium.PdfPage) -> np.ndarray:
    """The page drawn by PDFium at ``SCALE``, grey, row 0 at the top."""
    pixels = np.asarray(page.render(scale=SCALE, grayscale=True).to_numpy())
    return pixels[..., 0] if pixels.ndim == 3 else pixels


def odt_in_languages(lines: list[tuple[str, str, str]]) -> bytes:
    """An ODT with one paragraph per ``(language, country, text)``, the text's Asian language set
    on the paragraph's style (ODF 1.2 ``style:language-asian``, ``style:country-asian``)."""
    styles = "".join(
        f'<style:style style:name="P{i}" style:family="paragraph"><style:text-properties '
        f'style:language-asian="{language}" style:country-asian="{country}"/></style:style>'
        for i, (language, country, _) in enumerate(lines)
    )
    head = (
        '<office:automatic-styles xmlns:style="urn:oasis:names:tc:opendocument:xmlns:style:1.0">'
        f"{styles}</office:automatic-styles>"
    )
    body = "".join(f'<text:p text:style-name="P{i}">{text}</text:p>' for i, (_, _, text) in enumerate(lines))
    return odt(body, head=head)


HAN_LINES = [("zh", "CN", "简体中文的直"), ("ja", "JP", "日本語の直")]
"""直 (U+76F4) has a Chinese and a Japanese form (the Noto CJK faces SC and JP draw it apart: a third
of the pixels of its shape differ)."""


# --- the conversions -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Conversions:
    pdfs: dict[str, bytes]
    """Document name → the PDF the listener made of it."""
    own_fontconfig_cache: list[str]
    """The files of a fontconfig cache the listener wrote in its own HOME (none when it could read
    the system's, ``/var/cache/fontconfig``, through its Landlock view)."""


@pytest.fixture(scope="module")
def converted(tmp_root: Path) -> Conversions:
    """The documents converted to PDF by one real listener."""
    lines = [line for line, _ in SCRIPTS.values()]
    documents = {
        "odt": (odt("".join(f"<text:p>{line}</text:p>" for line in lines)), ODT_MIME),
        "docx": (docx(lines), DOCX_MIME),
        "rtf": (rtf(lines), RTF_MIME),
        "odt-languages": (odt_in_languages(HAN_LINES), ODT_MIME),
    }
    base = tmp_root / "office-scripts"

    async def go() -> Conversions:
        pool = OfficePool(
            base / "office",
            [(LISTENER_UID, LISTENER_UID) if IS_ROOT else None],
            config.load(OfficeSettings),
        )
        pool.start()
        await pool.started()
        pdfs = {}
        try:
            for name, (content, mime) in documents.items():
                path = base / f"document.{name}"
                path.write_bytes(content)
                pdfs[name] = (await pool.convert(path, mime, 60)).pdf
            home = pool.listeners[0].dir / "tmp"  # the listener's HOME
            own_cache = sorted(str(p.relative_to(home)) for p in home.glob(".cache/fontconfig/*"))
        finally:
            await pool.close()
        return Conversions(pdfs, own_cache)

    base.mkdir(mode=0o755)
    return asyncio.run(go())


@pytest.mark.parametrize("document", ["odt", "docx", "rtf"])
def test_every_script_is_drawn_in_a_font_that_has_it(converted: Conversions, document: str) -> None:
    page = pdfium.PdfDocument(converted.pdfs[document])[0]
    text = re.sub(r"\s+", " ", page.get_textpage().get_text_range())
    fonts = char_fonts(page)
    for script, (line, font_pattern) in SCRIPTS.items():
        assert line in text, (script, text)
        drawn = {(name, embedded) for char, name, embedded in fonts if char in line and not char.isspace()}
        assert drawn, script
        for name, embedded in drawn:
            assert embedded, f"{document}, {script}: {name} is not embedded"
            assert re.match(font_pattern, name), f"{document}, {script}: drawn in {name}, not {font_pattern}"


@pytest.mark.parametrize("document", ["odt", "docx", "rtf"])
def test_every_character_is_a_real_glyph_not_a_box(converted: Conversions, document: str) -> None:
    page = pdfium.PdfDocument(converted.pdfs[document])[0]
    check_glyphs(page, render(page), SCALE, list(SCRIPTS))


def test_the_listener_reads_the_system_fontconfig_cache(converted: Conversions) -> None:
    """The fonts' cache, built when they were installed, is in the listener's view: without it
    fontconfig would scan every font file (250 MB of them) at each listener start and write a
    cache of its own into the listener's throwaway HOME."""
    assert converted.own_fontconfig_cache == []


def test_han_characters_take_the_form_of_the_language_the_document_gives_them(
    converted: Conversions,
) -> None:
    """A Chinese paragraph and a Japanese one draw the same character in different forms: with
    the text's language LibreOffice asks fontconfig for that language's face of Noto CJK (a font
    with one face for all, or glyphs picked without the language, would draw them alike)."""
    page = pdfium.PdfDocument(converted.pdfs["odt-languages"])[0]
    pixels = render(page)
    textpage = page.get_textpage()
    text = textpage.get_text_range()
    forms = [
        shape(pixels, textpage.get_charbox(i), SCALE, square=True) for i, c in enumerate(text) if c == "直"
    ]
    assert len(forms) == len(HAN_LINES), text
    chinese, japanese = forms
    assert not is_notdef_box(chinese) and chinese.mean() > 0.05
    assert (chinese != japanese).mean() > 0.15


def test_the_notdef_box_is_recognised() -> None:
    """The box test can fail: a hollow rectangle (what LibreOffice drew for every CJK, Devanagari
    and Thai character before the fonts, DejaVu Sans' .notdef) is a box; real glyphs of
    the same fonts are not."""
    hollow = np.zeros((GRID, GRID), bool)
    hollow[:3], hollow[-3:], hollow[:, :3], hollow[:, -3:] = True, True, True, True
    assert is_notdef_box(hollow)
    crossed = hollow.copy()
    crossed[GRID // 2 - 1 : GRID // 2 + 2] = True  # 日's middle stroke
    assert not is_notdef_box(crossed)
    opened = hollow.copy()
    opened[:3, GRID // 3 :] = False  # a side open for two thirds of its length
    assert not is_notdef_box(opened)


# --- previews (the docworker's pdf_preview, in a real sandbox child) ------------------------------


@pytest.fixture(scope="module")
async def sandbox(tmp_root: Path) -> AsyncIterator[Sandbox]:
    """A zygote like the docworker's (its uids apart from test_pdf's 63,000–63,003)."""
    uids = range(63010, 63012) if IS_ROOT else None
    box = Sandbox(
        tmp_root / "scripts-sandbox",
        preload=("pyvips", "pypdfium2", "hypermedia.engines.documents.pdf"),
        uid=uids,
    )
    await box.start()
    yield box
    await box.close()


async def test_a_preview_of_the_converted_pdf_draws_every_script(
    converted: Conversions, sandbox: Sandbox
) -> None:
    dpi = 288
    job = await run_job(sandbox, "pdf_preview", converted.pdfs["odt"], {"format": "png", "dpi": dpi})
    page = pdfium.PdfDocument(converted.pdfs["odt"])[0]
    check_glyphs(page, grey(job.image("preview_p1")), dpi / 72, list(SCRIPTS))


async def test_a_preview_draws_cjk_fonts_that_are_not_embedded(sandbox: Sandbox) -> None:
    """PDFium substitutes an installed font with the character collection (its Linux font info
    scans /usr/share/fonts); without one it draws nothing at all."""
    data = non_embedded_cjk_pdf()
    page = pdfium.PdfDocument(data)[0]
    assert all(not embedded for _, _, embedded in char_fonts(page))
    dpi = 144
    job = await run_job(sandbox, "pdf_preview", data, {"format": "png", "dpi": dpi})
    check_glyphs(page, grey(job.image("preview_p1")), dpi / 72, list(SCRIPTS)[:4])
