"""Where an ``ocr`` job's pages come from: the selected pages of an image (multi-page TIFF, WebP,
GIF, HEIF; an HEVC HEIF through libheif; TIFF pages in a compression libvips lacks through
Pillow) or of a PDF (its text layer where it has one, else rendered by PDFium at :data:`PDF_DPI`,
or less to fit the pixel limit), each checked against :class:`OcrLimits` from its header before
it is decoded or rendered, and loaded only when its turn comes (see :mod:`hypermedia.engines.ocr.engine`)."""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pypdfium2 as pdfium
import pypdfium2.raw as pdfium_c
import pyvips

from hypermedia.core.errors import InvalidArgument, PermanentJobError
from hypermedia.engines.documents import engine_process, pdf
from hypermedia.engines.imaging import hevc, tiff
from hypermedia.engines.imaging.sources import RASTER_LOADER_BY_MIME, reraise_vips_error
from hypermedia.engines.ocr import preprocess
from hypermedia.engines.ocr.escalation import ESCALATION_THRESHOLD
from hypermedia.engines.ocr.params import (
    MAX_DOCUMENT_PAGES,
    MAX_FANNED_OCR_PAGES,
    MAX_OCR_PAGES,
    TEXT_LAYER_MIN_CHARS,
)

PDF_DPI: Final = 300

"""Resolution PDF pages are rendered at (issue 6), pixels per inch."""

MIN_PDF_DPI: Final = 150

"""Lowest resolution a large PDF page is rendered at to stay within the pixel limit (an A0 page at
300 dpi is 139 megapixels); a page that exceeds the limit even so is ``INPUT_TOO_LARGE_PIXELS``."""

MAX_SIDE: Final = preprocess.MAX_SIDE

"""Largest width or height of a page, in pixels: tesseract keeps coordinates in 16-bit integers."""

DEFAULT_PAGE_TIMEOUT: Final = 60.0

"""Seconds one tesseract process (one page) may take: 16 times the slowest corpus page (3.7 s)."""

LOADERS: Final = RASTER_LOADER_BY_MIME

"""libvips loader per image type (as :mod:`hypermedia.engines.imaging.ops`, without SVG)."""

_MULTI_PAGE_LOADERS: Final = frozenset({"webpload", "gifload", "tiffload", "heifload"})


@dataclass(frozen=True)
class OcrLimits:
    """Bounds of one OCR job, from its processing profile and this module's constants; the
    sandbox's rlimits (``RLIMIT_AS``, ``RLIMIT_CPU``, ``RLIMIT_FSIZE``), which tesseract inherits,
    are the backstop behind them."""

    max_input_bytes: int
    """Largest input file, in bytes (``INPUT_TOO_LARGE``)."""
    max_page_pixels: int
    """Largest page, width × height in pixels: of an image page as decoded and of a PDF page as
    rendered (``INPUT_TOO_LARGE_PIXELS``); preprocessing keeps every page within it and within
    :data:`MAX_SIDE` after each step (:func:`hypermedia.engines.ocr.preprocess.prepare`)."""
    max_pages: int = MAX_OCR_PAGES
    """Most pages one job OCRs (``OCR_PAGE_LIMIT``)."""
    max_document_pages: int = MAX_DOCUMENT_PAGES
    """Most pages the input may have at all (``PDF_PAGE_LIMIT``, ``INPUT_TOO_MANY_PAGES``)."""
    page_timeout_seconds: float = DEFAULT_PAGE_TIMEOUT
    """CPU seconds each tesseract process may take (``OCR_PAGE_TIMEOUT``; three times that in wall
    time: ``TIMEOUT``, transient), and wall-clock seconds RapidOCR may take on an escalated page
    (after which the page keeps tesseract's reading)."""
    escalation_threshold: float = ESCALATION_THRESHOLD
    """Mean tesseract word confidence (0–100) under which a page is escalated (when the job's
    ``escalate`` param is true)."""
    fan_out_pages: int | None = None
    """A job selecting more pages than this is read in groups by child jobs (ADR 0082,
    :func:`~hypermedia.engines.ocr.fanning.page_groups`), and may select up to
    :attr:`max_fanned_pages`; None: never (the cap is :attr:`max_pages`)."""
    fan_out_group_pages: int = 10
    """Pages of a group (fewer where a job would have fewer than three groups, more where it would
    have more than 60)."""
    max_fanned_pages: int = MAX_FANNED_OCR_PAGES
    """Most pages a job that fans out selects (``OCR_PAGE_LIMIT``)."""
    fan_out: bool = False
    """Whether this run may ask to fan out (not a child, not a job that fanned out before)."""
    group: int | None = None
    """A child job's run: the index of the group it reads (its ``chunk_index``)."""

    def fans_out(self, selected: int) -> bool:
        """Whether a job selecting ``selected`` pages is read in groups by children."""
        return self.fan_out_pages is not None and selected > self.fan_out_pages

    def page_cap(self, selected: int) -> int:
        """Most pages a job selecting ``selected`` pages may OCR: :attr:`max_fanned_pages` when it
        fans out, else :attr:`max_pages`."""
        return self.max_fanned_pages if self.fans_out(selected) else self.max_pages


@dataclass(frozen=True)
class Page:
    """One selected page: its number and how to load its image (decoded only when called)."""

    number: int
    """1-based."""
    load: Callable[[], pyvips.Image]
    render_dpi: int | None = None
    """Set for a rendered PDF page."""
    text_layer: str | None = None
    """The text of a PDF page skipped for its text layer (``skip_text_pages``); ``load`` is not
    called then."""
    original_pdf: Path | None = None
    """The skipped page as a one-page PDF, copied by PDFium from the input (for ``searchable_pdf``)."""


def _select(requested: list[int] | None, count: int, limits: OcrLimits, unit: str) -> list[int]:
    """The page numbers to OCR: checks they exist and are not too many (:meth:`OcrLimits.page_cap`)."""
    if requested is None:
        if count > (cap := limits.page_cap(count)):
            raise PermanentJobError(
                f"The {unit} has {count} pages; one job OCRs at most {cap}. "
                "Choose pages with the pages param.",
                "OCR_PAGE_LIMIT",
            )
        return list(range(1, count + 1))
    missing = [p for p in requested if p > count]
    if missing:
        raise InvalidArgument(
            f"The {unit} has {count} page{'s' if count != 1 else ''}; page {missing[0]} does not exist.",
            "INVALID_PARAMS",
        )
    if len(requested) > (cap := limits.page_cap(len(requested))):
        raise PermanentJobError(
            f"{len(requested)} pages selected; one job OCRs at most {cap}.", "OCR_PAGE_LIMIT"
        )
    return requested


def _too_many_pixels(what: str, width: int, height: int, limits: OcrLimits) -> PermanentJobError:
    return PermanentJobError(
        f"{what} is {width} × {height} pixels; the limit is {limits.max_page_pixels} pixels and "
        f"{MAX_SIDE} per side.",
        "INPUT_TOO_LARGE_PIXELS",
    )


def image_sources(
    input_path: Path, loader: str, requested: list[int] | None, limits: OcrLimits
) -> tuple[int, list[Page]]:
    """The selected pages of an image, each checked from its header; decodes nothing."""
    multi_page = loader in _MULTI_PAGE_LOADERS

    def header(index: int) -> pyvips.Image:
        options: dict[str, Any] = {"access": "sequential", "fail_on": "truncated"}
        if multi_page:
            options["page"] = index
        try:
            image = pyvips.Operation.call(loader, str(input_path), **options)
        except pyvips.Error as exc:
            reraise_vips_error(exc)
        if (image.get("vips-loader") if image.get_typeof("vips-loader") else None) != loader:
            raise PermanentJobError(
                "The input is not an image or PDF that OCR can read.", "UNSUPPORTED_FORMAT"
            )
        return image

    first = header(0)
    count = int(first.get("n-pages")) if multi_page and first.get_typeof("n-pages") else 1
    if count > limits.max_document_pages:
        raise PermanentJobError(
            f"The image has more than {limits.max_document_pages} pages.", "INPUT_TOO_MANY_PAGES"
        )
    numbers = _select(requested, count, limits, "image")
    sizes: dict[int, tuple[int, int]] = {}
    for number in numbers:
        image = first if number == 1 else header(number - 1)
        if image.width * image.height > limits.max_page_pixels or max(image.width, image.height) > MAX_SIDE:
            raise _too_many_pixels(
                f"Page {number}" if count > 1 else "The image", image.width, image.height, limits
            )
        sizes[number] = image.width, image.height
    by_pillow = _pillow_tiff_pages(input_path, numbers) if loader == "tiffload" else frozenset()

    def load(index: int) -> pyvips.Image:
        if index + 1 in by_pillow:  # already upright: Pillow applies the orientation tag
            return tiff.decode_page(input_path, *sizes[index + 1], index)
        options: dict[str, Any] = {"fail_on": "truncated"}
        if multi_page:
            options["page"] = index
        try:
            return pyvips.Operation.call(loader, str(input_path), **options).autorot()
        except pyvips.Error as exc:
            reraise_vips_error(exc)

    return count, [Page(number, functools.partial(load, number - 1)) for number in numbers]


def hevc_sources(data: bytes, requested: list[int] | None, limits: OcrLimits) -> tuple[int, list[Page]]:
    """The selected top-level images of an HEVC HEIF (an iPhone photo), each checked from its
    header; decoded by libheif (:mod:`hypermedia.engines.imaging.hevc`, upright) only when loaded."""
    opened = hevc.open_hevc(data)
    if opened.pages > limits.max_document_pages:
        raise PermanentJobError(
            f"The image has more than {limits.max_document_pages} pages.", "INPUT_TOO_MANY_PAGES"
        )
    numbers = _select(requested, opened.pages, limits, "image")
    for number in numbers:
        width, height = hevc.page_size(opened, number - 1)
        if width * height > limits.max_page_pixels or max(width, height) > MAX_SIDE:
            raise _too_many_pixels(
                f"Page {number}" if opened.pages > 1 else "The image", width, height, limits
            )
    return opened.pages, [
        Page(number, functools.partial(hevc.decode, opened, number - 1)) for number in numbers
    ]


def _pillow_tiff_pages(path: Path, numbers: list[int]) -> frozenset[int]:
    """The selected TIFF pages (1-based) in a compression libvips' libtiff lacks and Pillow decodes
    (old-style JPEG, LZMA, ZSTD: :mod:`hypermedia.engines.imaging.tiff`), which libvips would read as blank
    pages without an error, or fail.

    Raises:
        PermanentJobError: ``UNSUPPORTED_FORMAT`` naming a compression neither decodes (JBIG,
            LERC, unknown values).
    """
    return frozenset(number for number in numbers if tiff.decoder_for(path, number - 1) == "pillow")


def pdf_sources(
    input_path: Path,
    work_dir: Path,
    requested: list[int] | None,
    limits: OcrLimits,
    *,
    skip_text: bool = False,
    only: list[int] | None = None,
    most: int | None = None,
) -> tuple[int, list[int], list[Page]]:
    """Renders the selected pages of a PDF in an engine process (see the module docstring); with
    ``skip_text``, a page with a text layer is not rendered but comes with its text. Every
    selected page is checked, but only those of ``only`` are rendered (a fanned-out job's:
    :func:`~hypermedia.engines.ocr.fanning.page_groups`), and none when more than ``most`` are
    selected (the caller plans first). Returns the page count, the selected numbers and the pages."""
    rendered = engine_process.call(
        _render_pdf, str(input_path), str(work_dir), requested, limits, skip_text, only, most
    )

    def load(path: str, width: int, height: int) -> pyvips.Image:
        data = Path(path).read_bytes()
        Path(path).unlink()
        return pyvips.Image.new_from_memory(data, width, height, 1, "uchar").copy(interpretation="b-w")

    pages = [
        Page(
            entry["page"],
            _not_rendered,
            text_layer=Path(entry["text"]).read_text(encoding="utf-8"),
            original_pdf=Path(entry["pdf"]),
        )
        if "text" in entry
        else Page(
            entry["page"],
            functools.partial(load, entry["path"], entry["width"], entry["height"]),
            render_dpi=entry["dpi"],
        )
        for entry in rendered["pages"]
    ]
    return rendered["page_count"], rendered["selected"], pages


def _not_rendered() -> pyvips.Image:
    raise AssertionError("a page skipped for its text layer is not loaded")


def _pdf_error(exc: pdfium.PdfiumError) -> PermanentJobError:
    if exc.err_code == pdfium_c.FPDF_ERR_PASSWORD:
        return PermanentJobError("The PDF is encrypted and needs a password to open.", "PASSWORD_REQUIRED")
    if exc.err_code == pdfium_c.FPDF_ERR_SECURITY:
        return PermanentJobError(
            "The PDF uses an encryption scheme that is not supported.", "PDF_UNSUPPORTED_ENCRYPTION"
        )
    return PermanentJobError("The PDF is damaged and cannot be read.", "PARSE_ERROR")


def _render_pdf(
    input_path: str,
    work_dir: str,
    requested: list[int] | None,
    limits: OcrLimits,
    skip_text: bool = False,
    only: list[int] | None = None,
    most: int | None = None,
) -> dict:
    """Engine process: renders the selected pages (of those, ``only``'s when given; none when more
    than ``most`` are selected; every selected page's size is checked all the same) to raw 8-bit
    grey files (no libvips here). With
    ``skip_text``, a page whose text layer has at least
    :data:`~hypermedia.engines.ocr.params.TEXT_LAYER_MIN_CHARS` characters other than whitespace is not
    rendered: its text is returned, and the page copied into a one-page PDF of its own.

    Returns:
        ``{"page_count": n, "selected": [numbers], "pages": [{"page", "path", "width", "height",
        "dpi"} | {"page", "text", "pdf"}]}``: ``text`` the path of a UTF-8 file with the page's layer.
    """
    try:
        document = pdfium.PdfDocument(input_path)
    except pdfium.PdfiumError as exc:
        raise _pdf_error(exc) from None
    try:
        count = len(document)
        if count > limits.max_document_pages:
            raise PermanentJobError(
                f"The PDF has {count} pages; at most {limits.max_document_pages} are processed.",
                "PDF_PAGE_LIMIT",
            )
        if count < 1:
            raise PermanentJobError("The PDF is damaged and cannot be read.", "PARSE_ERROR")
        numbers = _select(requested, count, limits, "PDF")
        document.init_forms()  # before any page is loaded: form fields are drawn
        chosen = set() if most is not None and len(numbers) > most else set(numbers if only is None else only)
        wanted = [number for number in numbers if number in chosen]
        layers = {number: _text_layer(document, number) for number in wanted} if skip_text else {}
        plan = []
        pages: list[dict[str, Any]] = []
        for number in numbers:  # every page's size is checked before the first is rendered
            if layers.get(number) is not None:
                continue
            width_pt, height_pt = document.get_page_size(number - 1)
            if width_pt <= 0 or height_pt <= 0:
                raise PermanentJobError("The PDF is damaged and cannot be read.", "PARSE_ERROR")
            dpi = _render_dpi(width_pt, height_pt, limits.max_page_pixels)
            width, height = _pixel_size(width_pt, height_pt, dpi)
            if width * height > limits.max_page_pixels or max(width, height) > MAX_SIDE:
                # A page not rendered here that has a text layer is never rendered: one run takes it too.
                if not (skip_text and number not in chosen and _text_layer(document, number) is not None):
                    raise _too_many_pixels(f"Page {number} at {dpi} dpi", width, height, limits)
            plan.append((number, dpi))
        plan = [(number, dpi) for number, dpi in plan if number in chosen]
        for number, layer in layers.items():
            if layer is not None:
                pdf_path = os.path.join(work_dir, f"original-{number:05d}.pdf")
                _copy_page(document, number, pdf_path)
                # As a file: the engine process's result is small JSON, and a layer may be megabytes.
                text_path = os.path.join(work_dir, f"layer-{number:05d}.txt")
                with open(text_path, "w", encoding="utf-8") as f:
                    f.write(layer)
                pages.append({"page": number, "text": text_path, "pdf": pdf_path})
        for number, dpi in plan:
            page = document[number - 1]
            try:
                bitmap = page.render(scale=dpi / 72, grayscale=True, may_draw_forms=True, draw_annots=True)
                try:
                    path = os.path.join(work_dir, f"render-{number:05d}.gray")
                    _write_rows(bitmap, path)
                    pages.append(
                        {
                            "page": number,
                            "path": path,
                            "width": bitmap.width,
                            "height": bitmap.height,
                            "dpi": dpi,
                        }
                    )
                finally:
                    bitmap.close()
            finally:
                page.close()
        return {
            "page_count": count,
            "selected": numbers,
            "pages": sorted(pages, key=lambda entry: entry["page"]),
        }
    except pdfium.PdfiumError as exc:
        raise _pdf_error(exc) from None
    finally:
        document.close()


def _text_layer(document: pdfium.PdfDocument, number: int) -> str | None:
    """The text of page ``number`` (as ``text_extract`` reads it) when it has a text layer worth
    the name (see :func:`_render_pdf`), else None. Engine process."""
    text = pdf.page_text(document, number - 1)
    return text if sum(not c.isspace() for c in text) >= TEXT_LAYER_MIN_CHARS else None


def _copy_page(document: pdfium.PdfDocument, number: int, path: str) -> None:
    """Page ``number`` of ``document`` as a one-page PDF at ``path`` (PDFium copies its objects),
    its annotations flattened into its content as printed (``FPDFPage_Flatten``: form field
    values stay visible) and any left removed: the platform serves this page from its own store,
    so no link, form field or JavaScript action of the upload travels with it. The document's
    own JavaScript and open actions are not copied (``FPDF_ImportPages`` copies pages); a page's
    own additional actions (``/AA``) are (no PDFium call removes them)."""
    single = pdfium.PdfDocument.new()
    try:
        single.import_pages(document, [number - 1])
        page = single[0]
        try:
            pdfium_c.FPDFPage_Flatten(page.raw, pdfium_c.FLAT_PRINT)
        finally:
            page.close()
        page = single[0]  # reloaded: flattening rewrote its content
        try:
            for index in reversed(range(pdfium_c.FPDFPage_GetAnnotCount(page.raw))):
                pdfium_c.FPDFPage_RemoveAnnot(page.raw, index)
        finally:
            page.close()
        single.save(path)
    finally:
        single.close()


def _render_dpi(width_pt: float, height_pt: float, max_pixels: int) -> int:
    """:data:`PDF_DPI`, or the highest lower resolution (not under :data:`MIN_PDF_DPI`) at which
    the page, as :func:`_pixel_size` rounds it up, fits ``max_pixels`` and :data:`MAX_SIDE`;
    :data:`MIN_PDF_DPI` when none does (the caller refuses the page then)."""
    fit = math.sqrt(max_pixels / (width_pt / 72 * height_pt / 72))
    side = MAX_SIDE / (max(width_pt, height_pt) / 72)
    dpi = max(MIN_PDF_DPI, min(PDF_DPI, math.floor(min(fit, side))))
    while dpi > MIN_PDF_DPI:  # a size in points times the scale may round up past the limit
        width, height = _pixel_size(width_pt, height_pt, dpi)
        if width * height <= max_pixels and max(width, height) <= MAX_SIDE:
            break
        dpi -= 1
    return dpi


def _pixel_size(width_pt: float, height_pt: float, dpi: int) -> tuple[int, int]:
    """The bitmap pypdfium2 renders for a page of that size (it rounds up)."""
    scale = dpi / 72
    return max(1, math.ceil(width_pt * scale)), max(1, math.ceil(height_pt * scale))


def _write_rows(bitmap: pdfium.PdfBitmap, path: str) -> None:
    """The bitmap's rows without the stride's padding, one byte per pixel."""
    buffer = memoryview(bitmap.buffer).cast("B")
    with open(path, "wb") as f:
        if bitmap.stride == bitmap.width:
            f.write(buffer[: bitmap.width * bitmap.height])
            return
        for row in range(bitmap.height):
            start = row * bitmap.stride
            f.write(buffer[start : start + bitmap.width])
