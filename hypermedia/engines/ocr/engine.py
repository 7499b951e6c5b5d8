"""The ``ocr`` operation: the sandbox entry the ocrworker's children call.

``run("ocr", params, input_path, out_dir, limits=…)`` OCRs every selected page of one image or
PDF and writes the outputs the params ask for (:mod:`hypermedia.engines.ocr.params`):

1. **Checks** before any pixel is decoded: the params (languages against the installed ones);
   the file's size (``INPUT_TOO_LARGE``); its format from the magic bytes (a PDF, or an image
   format of :data:`LOADERS`; anything else, SVG included, is ``UNSUPPORTED_FORMAT``: an SVG's
   text is in its XML); the page count (``PDF_PAGE_LIMIT`` / ``INPUT_TOO_MANY_PAGES`` over
   :attr:`OcrLimits.max_document_pages`; ``OCR_PAGE_LIMIT`` when more than
   :attr:`OcrLimits.max_pages` pages are selected; ``INVALID_PARAMS`` for a page past the end);
   every selected page's pixel size from the image header, or from the PDF page's size in points
   at the render resolution (``INPUT_TOO_LARGE_PIXELS`` over :attr:`OcrLimits.max_page_pixels`
   or :data:`MAX_SIDE`), so a 256-megapixel image never reaches libvips' decoder or tesseract.
2. **Pages.** Images are decoded by libvips with the loader the magic bytes chose (libvips'
   untrusted loaders stay blocked; the loader it reports must be that one), one page at a time
   (``page=i`` of a multi-page TIFF, GIF, WebP or HEIF), the EXIF orientation applied; an
   HEVC-coded HEIF (an iPhone photo: :func:`hypermedia.engines.imaging.sources.heif_decoder` reads its
   codec from its boxes) is decoded by libheif instead (:mod:`hypermedia.engines.imaging.hevc`), one
   top-level image per page, ``irot``/``imir`` applied. PDFs are
   rendered by PDFium at :data:`PDF_DPI` (lower, down to :data:`MIN_PDF_DPI`, for a page that
   would exceed the pixel limit), in grey, with form fields drawn, in an engine process of their
   own (:mod:`hypermedia.engines.documents.engine_process`: PDFium aborting on a failed allocation is
   then ``RESOURCE_LIMIT``), before this process runs libvips; the renders wait as raw files (one
   byte per pixel: at most ``max_pages × max_page_pixels`` bytes, 174 MB for 20 A4 pages at 300 dpi) in a
   temporary directory under ``TMPDIR`` (the job directory in the sandbox), each deleted once
   loaded.
3. **Preprocessing** (:mod:`hypermedia.engines.ocr.preprocess`), then **one tesseract process per page**
   (:class:`hypermedia.engines.ocr.tesseract.Tesseract`) writing text, TSV and, when asked, hOCR and PDF
   in one run; :attr:`OcrLimits.page_timeout_seconds` of CPU per process (``OCR_PAGE_TIMEOUT``). The
   searchable PDF embeds the page as tesseract read it: grey, and upscaled or turned where
   preprocessing did so (the corpus' bilevel 8071 page: 850 KB after deskewing, 270 KB without;
   binarising it again would make 184 KB at a slightly higher CER, 4.99 % against 4.88 %).
4. **Escalation** (:mod:`hypermedia.engines.ocr.escalation`), unless the ``escalate`` param is false: a
   page whose tesseract words have a mean confidence under
   :data:`~hypermedia.engines.ocr.escalation.ESCALATION_THRESHOLD` is read again, from the same
   preprocessed image, by RapidOCR (:class:`hypermedia.engines.ocr.rapid_ocr.RapidOcrEngine`, in this
   process, one thread), ordered by tesseract's blocks, and the better reading kept. Where
   RapidOCR wins, the page's text and words are its; its hOCR and searchable PDF page stay
   tesseract's (RapidOCR makes neither), and the words document says so. The CPU seconds RapidOCR
   took are reported (``escalation_cpu_seconds``); the escalated pages (``escalated_pages``) are
   billed as a line of their own (the ocrworker's ``charge_lines``). Escalation never fails a
   job: a page is not escalated when the job has less than :data:`ESCALATION_CPU_RESERVE` CPU
   seconds left, and when RapidOCR runs out of memory or time on a page, that page keeps
   tesseract's reading and no later page of the job is escalated (RapidOCR's memory grows from
   page to page: 2.3 GB of address space after two dense, blurred A4 pages).
5. **Outputs** (:mod:`hypermedia.engines.ocr.assemble`), see :func:`run`. A page without text is an empty
   page in every output, not an error.

Runs libvips and PDFium: call :func:`run` in the sandbox child only; it forks (the PDF engine
process) before libvips has done any work. Importing this module is fork-safe.
"""

from __future__ import annotations

import errno
import functools
import itertools
import json
import logging
import math
import os
import resource
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

import pypdfium2 as pdfium
import pypdfium2.raw as pdfium_c
import pyvips

from hypermedia.core.errors import DomainError, InvalidArgument, PermanentJobError
from hypermedia.engines.contract import OutputFile
from hypermedia.engines.documents import engine_process, pdf
from hypermedia.engines.imaging import hevc, tiff
from hypermedia.engines.imaging.sources import RASTER_LOADER_BY_MIME, heif_decoder, missing_decoder
from hypermedia.engines.ocr import assemble, escalation, preprocess, rapid_ocr, tables, tesseract
from hypermedia.engines.ocr.escalation import ESCALATION_THRESHOLD
from hypermedia.engines.ocr.params import (
    MAX_DOCUMENT_PAGES,
    MAX_OCR_PAGES,
    OPERATIONS,
    TEXT_LAYER_MIN_CHARS,
    validate_params,
)
from hypermedia.engines.ocr.recognition import PageText
from hypermedia.intake import contenttype

__all__ = [
    "DEFAULT_PAGE_TIMEOUT",
    "ESCALATION_THRESHOLD",
    "LOADERS",
    "MAX_SIDE",
    "MIN_PDF_DPI",
    "OPERATIONS",
    "PDF_DPI",
    "OcrLimits",
    "OutputFile",
    "installed_languages",
    "run",
]

log = logging.getLogger(__name__)

installed_languages = tesseract.installed_languages
"""The languages an ``ocr`` job may ask for on this worker (for the RPC that lists them)."""

PDF_DPI: Final = 300
"""Resolution PDF pages are rendered at (issue 6), pixels per inch."""
MIN_PDF_DPI: Final = 150
"""Lowest resolution a large PDF page is rendered at to stay within the pixel limit (an A0 page at
300 dpi is 139 megapixels); a page that exceeds the limit even so is ``INPUT_TOO_LARGE_PIXELS``."""
MAX_SIDE: Final = preprocess.MAX_SIDE
"""Largest width or height of a page, in pixels: tesseract keeps coordinates in 16-bit integers."""
MAX_TABLE_OUTPUTS: Final = 50
"""Most CSV outputs of one job (each a stored object of its own); the ``tables`` JSON holds every
table with its CSV whatever their number. A hostile page of number grids made 831 tables in 20 pages."""
ESCALATION_CPU_RESERVE: Final = 60.0
"""CPU seconds the job's process must have left under its ``RLIMIT_CPU`` for a page to be
escalated: RapidOCR took up to 38 s of CPU on one dense, blurred A4 page at 300 dpi (measured by
the hostile review). Below it the page keeps tesseract's reading (``cpu_budget``) rather than the
whole job failing with ``TIMEOUT``."""
DEFAULT_PAGE_TIMEOUT: Final = 60.0
"""Seconds one tesseract process (one page) may take: 16 times the slowest corpus page (3.7 s)."""

LOADERS: Final = RASTER_LOADER_BY_MIME
"""libvips loader per image type (as :mod:`hypermedia.engines.imaging.sources`, without SVG)."""
_MULTI_PAGE_LOADERS: Final = frozenset({"webpload", "gifload", "tiffload", "heifload"})

TEXT_MIME: Final = "text/plain; charset=utf-8"
JSON_MIME: Final = "application/json"
HOCR_MIME: Final = "text/html; charset=utf-8"
PDF_MIME: Final = "application/pdf"
CSV_MIME: Final = "text/csv; charset=utf-8"
_PDF_MAGIC: Final = b"%PDF-"

# libvips loads and encodes here; every untrusted loader stays blocked. The operation cache is
# useless in a one-job process.
pyvips.block_untrusted_set(True)
pyvips.cache_set_max(0)


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


@dataclass(frozen=True)
class _Page:
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


def run(
    operation: str,
    params: dict,
    input_path: Path,
    out_dir: Path,
    *,
    limits: OcrLimits,
    preprocessing: bool = True,
) -> list[OutputFile]:
    """OCRs the selected pages of one image or PDF and writes the outputs into ``out_dir``.

    Args:
        operation: ``ocr``.
        params: as accepted by :func:`hypermedia.engines.ocr.params.validate_params` (validated again,
            languages against :func:`installed_languages`).
        input_path: the uploaded file.
        out_dir: existing directory for the outputs.
        limits: checked before any page is decoded or rendered.
        preprocessing: ``False`` skips :mod:`hypermedia.engines.ocr.preprocess` (the page is only made
            grey): bare tesseract, for the benchmark's comparison.

    Returns:
        One :class:`OutputFile` per requested output, in the order of
        :data:`hypermedia.engines.ocr.params.OUTPUTS`: ``text`` (``text.txt``, UTF-8, pages separated by a
        form feed), ``words`` (``words.json``, see :func:`_words_document`), ``hocr``
        (``text.hocr``, one hOCR document), ``searchable_pdf`` (``searchable.pdf``: every page
        image, as tesseract read it after preprocessing, with an invisible text layer; its page
        size is the image's at its resolution). Every output's metadata: ``page_count`` (pages
        in the input), ``pages`` (the numbers OCRed), ``languages``, ``chars``, ``word_count``,
        ``mean_confidence`` (0–100 over all words kept, whichever engine's, or null),
        ``source_format`` (``pdf``, ``tiff``, ``png``…), ``escalated_pages`` (how many pages
        RapidOCR read again: the extra work to charge), ``escalation_cpu_seconds`` (the CPU time
        it took, its imports and model loads included; 0.0 without escalation),
        ``skipped_pages`` (the numbers of PDF pages taken from their text layer, with
        ``skip_text_pages``), ``size_bytes``.

    Raises:
        InvalidArgument: ``UNKNOWN_OPERATION``, ``INVALID_PARAMS`` (also a page past the end).
        PermanentJobError: ``INPUT_TOO_LARGE``, ``UNSUPPORTED_FORMAT``, ``CORRUPT_INPUT``,
            ``INPUT_TOO_LARGE_PIXELS``, ``INPUT_TOO_MANY_PAGES``, ``PDF_PAGE_LIMIT``,
            ``OCR_PAGE_LIMIT``, ``PASSWORD_REQUIRED``, ``PDF_UNSUPPORTED_ENCRYPTION``,
            ``PARSE_ERROR``, ``OCR_PAGE_TIMEOUT``.
        TransientError: ``TIMEOUT`` (``RLIMIT_CPU``), ``OCR_ENGINE_UNAVAILABLE`` (no tesseract
            on this worker).
        MemoryError, OSError(EFBIG): libvips, PDFium, tesseract or RapidOCR hit the sandbox's
            memory or file size limit.
        hypermedia.engines.ocr.tesseract.TesseractFailure: tesseract failed otherwise (``INTERNAL``).
    """
    params = validate_params(operation, params, installed_languages=installed_languages())
    if input_path.stat().st_size > limits.max_input_bytes:
        raise PermanentJobError(
            f"The input is larger than the {limits.max_input_bytes} byte limit.", "INPUT_TOO_LARGE"
        )
    with input_path.open("rb") as f:
        head = f.read(contenttype.HEAD_BYTES)
    engine = tesseract.Tesseract(timeout_seconds=limits.page_timeout_seconds)
    second = (
        rapid_ocr.RapidOcrEngine(timeout_seconds=limits.page_timeout_seconds) if params["escalate"] else None
    )
    with tempfile.TemporaryDirectory(prefix="ocr-") as work:
        work_dir = Path(work)
        if head.startswith(_PDF_MAGIC):
            source_format = "pdf"
            page_count, pages = _pdf_pages(
                input_path, work_dir, params["pages"], limits, skip_text=params["skip_text_pages"]
            )
        else:
            mime = contenttype.image_mime(head)
            if mime not in LOADERS:
                raise PermanentJobError(
                    "The input is not an image or PDF that OCR can read.", "UNSUPPORTED_FORMAT"
                )
            source_format = mime.removeprefix("image/")
            if LOADERS[mime] == "heifload" and heif_decoder(data := input_path.read_bytes()) == "hevc":
                page_count, pages = _hevc_pages(data, params["pages"], limits)
            else:
                page_count, pages = _image_pages(input_path, LOADERS[mime], params["pages"], limits)
        records: list[dict[str, Any]] = []
        texts: list[str] = []
        hocr_pages: list[tuple[int, Path]] = []
        pdf_pages: list[Path] = []
        failed_before = False
        for page in pages:
            if page.text_layer is not None:
                records.append(_text_layer_record(page.number, page.text_layer))
                texts.append(page.text_layer)
                if page.original_pdf is not None:
                    pdf_pages.append(page.original_pdf)
                continue
            result, record = _ocr_page(page, engine, second, work_dir, params, limits, preprocessing)
            if failed_before and record["escalation"]["reason"] == "disabled":
                record["escalation"]["reason"] = "failed_earlier"
            if record["escalation"]["reason"].startswith("failed_"):
                # Not tried again in this job: what ran out (memory, time) has not come back.
                second, failed_before = None, True
            records.append(record)
            texts.append(result.text)
            if result.hocr_path is not None:
                hocr_pages.append((page.number, result.hocr_path))
            if result.pdf_path is not None:
                pdf_pages.append(result.pdf_path)
        summary = _summary(records, page_count, params["languages"], source_format)
        return list(
            _write_outputs(params["outputs"], out_dir, summary, records, texts, hocr_pages, pdf_pages)
        )


# --- pages ---------------------------------------------------------------------------------------


def _select(requested: list[int] | None, count: int, limits: OcrLimits, unit: str) -> list[int]:
    """The page numbers to OCR: checks they exist and are not too many."""
    if requested is None:
        if count > limits.max_pages:
            raise PermanentJobError(
                f"The {unit} has {count} pages; one job OCRs at most {limits.max_pages}. "
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
    if len(requested) > limits.max_pages:
        raise PermanentJobError(
            f"{len(requested)} pages selected; one job OCRs at most {limits.max_pages}.", "OCR_PAGE_LIMIT"
        )
    return requested


def _too_many_pixels(what: str, width: int, height: int, limits: OcrLimits) -> PermanentJobError:
    return PermanentJobError(
        f"{what} is {width} × {height} pixels; the limit is {limits.max_page_pixels} pixels and "
        f"{MAX_SIDE} per side.",
        "INPUT_TOO_LARGE_PIXELS",
    )


def _corrupt() -> PermanentJobError:
    return PermanentJobError("The image data is truncated or cannot be decoded.", "CORRUPT_INPUT")


def _vips_error(exc: pyvips.Error) -> BaseException:
    """The error a libvips failure stands for: the input is to blame unless a resource ran out
    (the same reading as :mod:`hypermedia.engines.imaging.sources`)."""
    text = f"{exc.message} {exc.detail}".lower()
    if any(marker in text for marker in ("out of memory", "cannot allocate memory", "failed to allocate")):
        return MemoryError("libvips ran out of memory")
    if "file too large" in text:
        return OSError(errno.EFBIG, "output exceeds the file size limit")
    return missing_decoder(f"{exc.message} {exc.detail}") or _corrupt()


def _image_pages(
    input_path: Path, loader: str, requested: list[int] | None, limits: OcrLimits
) -> tuple[int, list[_Page]]:
    """The selected pages of an image, each checked from its header; decodes nothing."""
    multi_page = loader in _MULTI_PAGE_LOADERS

    def header(index: int) -> pyvips.Image:
        options: dict[str, Any] = {"access": "sequential", "fail_on": "truncated"}
        if multi_page:
            options["page"] = index
        try:
            image = pyvips.Operation.call(loader, str(input_path), **options)
        except pyvips.Error as exc:
            raise _vips_error(exc) from exc
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
            raise _vips_error(exc) from exc

    return count, [_Page(number, functools.partial(load, number - 1)) for number in numbers]


def _hevc_pages(data: bytes, requested: list[int] | None, limits: OcrLimits) -> tuple[int, list[_Page]]:
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
        _Page(number, functools.partial(hevc.decode, opened, number - 1)) for number in numbers
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


def _pdf_pages(
    input_path: Path,
    work_dir: Path,
    requested: list[int] | None,
    limits: OcrLimits,
    *,
    skip_text: bool = False,
) -> tuple[int, list[_Page]]:
    """Renders the selected pages of a PDF in an engine process (see the module docstring); with
    ``skip_text``, a page with a text layer is not rendered but comes with its text."""
    rendered = engine_process.call(_render_pdf, str(input_path), str(work_dir), requested, limits, skip_text)

    def load(path: str, width: int, height: int) -> pyvips.Image:
        data = Path(path).read_bytes()
        Path(path).unlink()
        return pyvips.Image.new_from_memory(data, width, height, 1, "uchar").copy(interpretation="b-w")

    pages = [
        _Page(
            entry["page"],
            _not_rendered,
            text_layer=Path(entry["text"]).read_text(encoding="utf-8"),
            original_pdf=Path(entry["pdf"]),
        )
        if "text" in entry
        else _Page(
            entry["page"],
            functools.partial(load, entry["path"], entry["width"], entry["height"]),
            render_dpi=entry["dpi"],
        )
        for entry in rendered["pages"]
    ]
    return rendered["page_count"], pages


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
    input_path: str, work_dir: str, requested: list[int] | None, limits: OcrLimits, skip_text: bool = False
) -> dict:
    """Engine process: renders the selected pages to raw 8-bit grey files (no libvips here). With
    ``skip_text``, a page whose text layer has at least
    :data:`~hypermedia.engines.ocr.params.TEXT_LAYER_MIN_CHARS` characters other than whitespace is not
    rendered: its text is returned, and the page copied into a one-page PDF of its own.

    Returns:
        ``{"page_count": n, "pages": [{"page", "path", "width", "height", "dpi"} |
        {"page", "text", "pdf"}]}``: ``text`` the path of a UTF-8 file with the page's layer.
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
        layers = {number: _text_layer(document, number) for number in numbers} if skip_text else {}
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
                raise _too_many_pixels(f"Page {number} at {dpi} dpi", width, height, limits)
            plan.append((number, dpi))
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
        return {"page_count": count, "pages": sorted(pages, key=lambda entry: entry["page"])}
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


# --- one page ------------------------------------------------------------------------------------


def _ocr_page(
    page: _Page,
    engine: tesseract.Tesseract,
    second: rapid_ocr.RapidOcrEngine | None,
    work_dir: Path,
    params: dict,
    limits: OcrLimits,
    preprocessing: bool,
) -> tuple[PageText, dict[str, Any]]:
    """Preprocesses and recognises one page, escalating it to ``second`` when tesseract's mean
    confidence is under :attr:`OcrLimits.escalation_threshold`; returns the reading kept (with
    tesseract's hOCR and PDF) and the page's record in the words document."""
    what = f"page {page.number}"
    image_path = work_dir / f"page-{page.number:05d}.png"
    record = _prepare(page, image_path, work_dir, limits, preprocessing, what)
    result = engine.recognise(
        image_path,
        languages=params["languages"],
        dpi=record["dpi"],
        hocr="hocr" in params["outputs"],
        pdf="searchable_pdf" in params["outputs"],
        what=what,
    )
    first_mean = result.mean_confidence
    confidences: dict[str, float | None] = {engine.name: _rounded(first_mean)}
    escalated, reason, cpu_seconds = False, "not_needed", 0.0
    if second is None:
        reason = "disabled"
    elif escalation.needs_escalation(result, limits.escalation_threshold):
        if _cpu_seconds_left() < ESCALATION_CPU_RESERVE:
            reason = "cpu_budget"
        else:
            started = time.process_time()
            try:
                other = second.recognise(
                    image_path,
                    languages=params["languages"],
                    dpi=record["dpi"],
                    what=what,
                    layout=result.words,
                )
            except (MemoryError, DomainError) as exc:
                # tesseract's reading stands; the job goes on without the second engine.
                failure = "resource_limit" if isinstance(exc, MemoryError) else exc.error_code.lower()
                reason = f"failed_{failure}"
                log.warning("escalation of %s failed (%s); tesseract's reading is kept", what, failure)
            else:
                escalated = True
                confidences[second.name] = _rounded(other.mean_confidence)
                choice = escalation.choose(result, other)
                reason = choice.reason
                if choice.kept is other:
                    result = replace(other, hocr_path=result.hocr_path, pdf_path=result.pdf_path)
            cpu_seconds = time.process_time() - started
    elif first_mean is None:
        reason = "no_words"
    if params.get("table_detection"):
        # On the page as recognised: word boxes and pixels line up (rules are found in it).
        try:
            page_image = pyvips.Image.new_from_file(str(image_path), access="random")
            found = tables.detect_tables(result.words, page_image)
        except pyvips.Error as exc:
            raise _vips_error(exc) from exc
        del page_image
        record["blocks"] = [block.as_json() for block in tables.classify_blocks(result.words, found)]
        record["tables"] = [{**tables.to_json(t), "csv": tables.to_csv(t)} for t in found]
    image_path.unlink()
    record.update(
        engine=result.engine,
        mean_confidence=_rounded(result.mean_confidence),
        escalated=escalated,
        confidences=confidences,
        escalation={"reason": reason, "cpu_seconds": round(cpu_seconds, 3)},
        hocr_pdf_engine=engine.name,
        chars=len(result.text),
        word_count=len(result.words),
        words=[word.as_json() for word in result.words],
    )
    return result, record


def _text_layer_record(number: int, text: str) -> dict[str, Any]:
    """The words-document record of a page skipped for its text layer: no words (the layer has
    no boxes in the OCR's pixels), its text's length, and the reason."""
    return {
        "page": number,
        "skipped": "text_layer",
        "preprocessing": [],
        "engine": "text_layer",
        "mean_confidence": None,
        "escalated": False,
        "confidences": {},
        "escalation": {"reason": "skipped", "cpu_seconds": 0.0},
        "chars": len(text),
        "word_count": 0,
        "words": [],
    }


def _cpu_seconds_left() -> float:
    """CPU seconds this process may still use under its soft ``RLIMIT_CPU`` (infinite without one)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_CPU)
    if soft == resource.RLIM_INFINITY:
        return math.inf
    return soft - time.process_time()


def _rounded(value: float | None) -> float | None:
    return round(value, 2) if value is not None else None


def _prepare(
    page: _Page, image_path: Path, work_dir: Path, limits: OcrLimits, preprocessing: bool, what: str
) -> dict[str, Any]:
    """Loads, preprocesses and saves the page as ``image_path``; returns the start of its record.
    The pixels are released on return, before tesseract starts."""
    try:
        prepared = preprocess.prepare(
            page.load(),
            work_dir=work_dir,
            max_pixels=limits.max_page_pixels,
            osd_timeout=limits.page_timeout_seconds,
            render_dpi=page.render_dpi,
            enabled=preprocessing,
            what=what,
        )
        preprocess.save(prepared, image_path)
    except pyvips.Error as exc:
        raise _vips_error(exc) from exc
    return {
        "page": page.number,
        "width": prepared.image.width,
        "height": prepared.image.height,
        "dpi": prepared.dpi,
        "source": {
            "width": prepared.source_width,
            "height": prepared.source_height,
            "dpi": page.render_dpi or prepared.source_dpi,
        },
        "to_source": prepared.to_source.as_list(),
        "preprocessing": prepared.steps,
    }


# --- outputs -------------------------------------------------------------------------------------


def _summary(
    records: list[dict[str, Any]], page_count: int, languages: list[str], source_format: str
) -> dict:
    words = sum(record["word_count"] for record in records)
    confidence = sum(
        record["mean_confidence"] * record["word_count"] for record in records if record["word_count"]
    )
    return {
        "page_count": page_count,
        "pages": [record["page"] for record in records],
        "languages": languages,
        "chars": sum(record["chars"] for record in records),
        "word_count": words,
        "mean_confidence": round(confidence / words, 2) if words else None,
        "source_format": source_format,
        "escalated_pages": sum(1 for record in records if record["escalated"]),
        "skipped_pages": [record["page"] for record in records if record.get("skipped")],
        "escalation_cpu_seconds": round(sum(record["escalation"]["cpu_seconds"] for record in records), 3),
    }


def _words_document(summary: dict, records: list[dict[str, Any]]) -> dict:
    """``words.json``::

        {"engine": {"name": "tesseract", "version": "5.3.0"}, "languages": ["eng"],
         "page_count": 1,
         "pages": [{"page": 1, "width": 960, "height": 720, "dpi": 300,
                    "source": {"width": 640, "height": 480, "dpi": 200.0},
                    "to_source": [a, b, c, d, e, f],
                    "preprocessing": [{"step": "background", "applied": false, "reason": "bilevel"}, …],
                    "engine": "tesseract", "mean_confidence": 95.1, "escalated": false,
                    "confidences": {"tesseract": 95.1},
                    "escalation": {"reason": "not_needed", "cpu_seconds": 0.0},
                    "hocr_pdf_engine": "tesseract", "chars": 286, "word_count": 58,
                    "words": [{"text": "This", "bbox": [x, y, w, h], "conf": 96.3,
                               "block": 1, "par": 1, "line": 1, "word": 1}, …]}]}

    ``width``/``height``/``dpi`` are the page as tesseract read it (after preprocessing), word
    boxes in its pixels; ``to_source`` maps such a point ``(x, y)`` to the source page (``source``,
    as displayed): ``(a·x + b·y + c, d·x + e·y + f)``. ``source.dpi`` is the render resolution of a
    PDF page, the believable resolution an image states, or null.

    Escalation, per page: ``engine`` is the engine whose text and words were kept (``tesseract``
    or ``rapidocr``) and ``mean_confidence`` that reading's mean (0–100); ``escalated`` is true
    when RapidOCR read the page too; ``confidences`` holds each engine's raw mean word confidence
    (0–100; ``rapidocr`` only when escalated; these are not on one scale, see
    :mod:`hypermedia.engines.ocr.escalation`); ``escalation.reason`` is ``not_needed``, ``no_words``,
    ``disabled``, ``skipped`` (a page taken from its text layer), ``cpu_budget`` (the page needed
    escalation but the job had less than :data:`ESCALATION_CPU_RESERVE` CPU seconds left),
    ``failed_resource_limit`` / ``failed_ocr_page_timeout`` (RapidOCR ran out of memory or time
    on it: tesseract's reading is kept, the page is not charged as escalated, and no later page
    of the job is escalated: ``failed_earlier``) or, when escalated,
    :attr:`hypermedia.engines.ocr.escalation.Choice.reason`; ``escalation.cpu_seconds`` the CPU time
    RapidOCR took on it. ``hocr_pdf_engine`` is always
    ``tesseract``: the hOCR and the searchable PDF page come from tesseract's run even where
    RapidOCR's words were kept. ``escalation_engine`` (top level) names RapidOCR's version when a
    page was escalated.
    """
    document: dict[str, Any] = {
        "engine": {"name": tesseract.Tesseract.name, "version": tesseract.version()},
        "languages": summary["languages"],
        "page_count": summary["page_count"],
        "pages": records,
    }
    if summary["escalated_pages"]:
        document["escalation_engine"] = {
            "name": rapid_ocr.RapidOcrEngine.name,
            "version": rapid_ocr.version(),
        }
    return document


def _write(path: Path, data: bytes) -> int:
    with path.open("wb") as f:
        f.write(data)
    return len(data)


def _table_outputs(out_dir: Path, summary: dict, records: list[dict[str, Any]]) -> Iterator[OutputFile]:
    """``tables``: one JSON document (per page: blocks classified text/table, every table's rows
    and cells and its CSV, see :func:`hypermedia.engines.ocr.tables.to_json`), and one CSV output per
    table, output type ``table_p{page}_{n}``, for the first :data:`MAX_TABLE_OUTPUTS` tables (the
    ``tables`` output's metadata: ``table_count``, ``csv_outputs``)."""
    pages = [
        {"page": r["page"], "blocks": r.get("blocks", []), "tables": r.get("tables", [])} for r in records
    ]
    data = json.dumps({"pages": pages}, ensure_ascii=False, separators=(",", ":")).encode()
    size = _write(out_dir / "tables.json", data)
    count = sum(len(p["tables"]) for p in pages)
    csv_outputs = min(count, MAX_TABLE_OUTPUTS)
    yield OutputFile(
        "tables",
        "tables.json",
        JSON_MIME,
        {**summary, "size_bytes": size, "table_count": count, "csv_outputs": csv_outputs},
    )
    numbered = ((page, i, table) for page in pages for i, table in enumerate(page["tables"], 1))
    for page, i, table in itertools.islice(numbered, csv_outputs):
        filename = f"page-{page['page']:03d}-table-{i}.csv"
        size = _write(out_dir / filename, table["csv"].encode())
        metadata = {"page": page["page"], "table": i, "rows": table["n_rows"], "columns": table["n_cols"]}
        # One output type per table (a rendition's key is made from its type). Its own facts only:
        # the job's summary is on the other outputs (hundreds of tables would repeat it).
        yield OutputFile(f"table_p{page['page']}_{i}", filename, CSV_MIME, {"size_bytes": size, **metadata})


def _write_outputs(
    outputs: list[str],
    out_dir: Path,
    summary: dict,
    records: list[dict[str, Any]],
    texts: list[str],
    hocr_pages: list[tuple[int, Path]],
    pdf_pages: list[Path],
) -> Iterator[OutputFile]:
    for name in outputs:
        if name == "text":
            size = _write(out_dir / "text.txt", assemble.join_text(texts).encode())
            yield OutputFile("text", "text.txt", TEXT_MIME, {**summary, "size_bytes": size})
        elif name == "words":
            document = _words_document(summary, records)
            data = json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode()
            size = _write(out_dir / "words.json", data)
            yield OutputFile("words", "words.json", JSON_MIME, {**summary, "size_bytes": size})
        elif name == "hocr":
            size = _write(out_dir / "text.hocr", assemble.merge_hocr(hocr_pages).encode())
            yield OutputFile("hocr", "text.hocr", HOCR_MIME, {**summary, "size_bytes": size})
        elif name == "searchable_pdf":
            target = out_dir / "searchable.pdf"
            assemble.merge_pdfs(pdf_pages, target)
            yield OutputFile(
                "searchable_pdf", "searchable.pdf", PDF_MIME, {**summary, "size_bytes": target.stat().st_size}
            )
        elif name == "tables":
            yield from _table_outputs(out_dir, summary, records)
