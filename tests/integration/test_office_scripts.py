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
import hashlib
import os
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pypdfium2 as pdfium
import pypdfium2.raw as pdfium_c
import pytest

from hypermedia.core import config
from hypermedia.engines.documents.office import OfficePool
from hypermedia.engines.documents.settings import OfficeSettings
from hypermedia.sandbox import Sandbox
from tests.helpers.glyphs import (
    GRID,
    SCALE,
    SCRIPTS,
    check_glyphs,
    grey,
    is_notdef_box,
    non_embedded_cjk_pdf,
    render,
    shape,
)
from tests.helpers.office import DOCX_MIME, ODT_MIME, docx, odt
from tests.helpers.pdf import run_job

RTF_MIME = "application/rtf"
LISTENER_UID = 59_910
"""A uid no other test uses (the listener tests' is 59,900)."""
IS_ROOT = os.geteuid() == 0


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
    cache of its own into the listener's throwaway HOME. LibreOffice's own font directories
    (a few fonts it adds as application fonts, which ``fc-cache`` never sees, e.g.
    ``share/fonts/truetype`` of libreoffice-common 7.4) are cached there at each start; fontconfig
    names a cache file after the MD5 of its directory's path."""
    libreoffice_dirs = {str(d) for d in Path("/usr/lib/libreoffice").rglob("*") if d.is_dir()}
    app_font_caches = {hashlib.md5(d.encode()).hexdigest() for d in libreoffice_dirs}
    system_caches = [
        f
        for f in converted.own_fontconfig_cache
        if ".cache-" in f and Path(f).name.split("-", 1)[0] not in app_font_caches
    ]
    assert system_caches == [], converted.own_fontconfig_cache


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
