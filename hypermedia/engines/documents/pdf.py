"""``pdf_info``, ``pdf_preview``, ``text_extract`` and ``office_to_pdf`` of PDFs, with PDFium through
pypdfium2. For ``office_to_pdf`` (and ``text_extract`` of an office document) the input is the PDF
the worker's LibreOffice listener made (:mod:`hypermedia.engines.documents.office`): this module checks it
like any PDF before it becomes an output.

The entry point :func:`run` is what the docworker's sandbox children call. Every operation:

1. checks the file's size against :attr:`DocumentLimits.max_input_bytes` and its magic bytes
   (``%PDF-``; anything else is ``UNSUPPORTED_FORMAT``);
2. runs the PDFium work in an engine process of its own (:mod:`hypermedia.engines.documents.engine_process`),
   so that PDFium aborting on a failed allocation (a flate bomb) is ``RESOURCE_LIMIT``;
3. opens the document: an empty user password is tried by PDFium itself; a document that needs
   another is ``PASSWORD_REQUIRED`` (``PASSWORD_INCORRECT`` when a password was given and is wrong;
   the API does not accept one yet, see :mod:`hypermedia.engines.documents.params`); a document PDFium
   cannot parse even after rebuilding a broken cross-reference table is ``PARSE_ERROR``;
4. refuses more than :attr:`DocumentLimits.max_pages` pages (``PDF_PAGE_LIMIT``) before any page
   is loaded.

``pdf_preview`` renders with the form-fill environment initialised, so AcroForm field appearances
and annotations are drawn (this PDFium build has no JavaScript and no XFA: nothing in the document
runs); PDFium applies the page's ``/Rotate`` and clips to its CropBox. Each page's pixel size is
computed from its size in points (``FPDF_GetPageSizeByIndexF``: after ``/Rotate`` and CropBox,
without parsing the page) and checked against :attr:`DocumentLimits.max_page_pixels` and
:data:`MAX_SIDE`, and the pages together against :attr:`DocumentLimits.max_job_pixels`, before the
first page is rendered. Images are encoded by libvips with ``keep="none"``: no metadata.

``text_extract`` returns PDFium's text layer page by page, in the order of the page's content
stream, which is the order producers write (pdfTeX, LibreOffice, Word and Google Docs write a
multi-column page column by column; ``tests/data/pdf/multicolumn.pdf`` comes out so). No layout
analysis reorders it: a producer that interleaves the lines of two columns is returned as written.

Run PDFium and libvips only in a process that will not fork again: :func:`run` itself only forks
(the engine process) before either has done any work. Importing this module is fork-safe: PDFium
is initialised at import (``FPDF_InitLibraryWithConfig``) and starts no thread, before or after
rendering (measured: one thread in ``/proc/self/status`` after import and after a render), and the
pypdfium2 documentation asks for processes, not threads, to run PDFium in parallel.
"""

from __future__ import annotations

import codecs
import json
import math
import os
import re
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

import pypdfium2 as pdfium
import pypdfium2.raw as pdfium_c
import pyvips

from hypermedia.core.errors import InvalidArgument, PermanentJobError
from hypermedia.engines.contract import OutputFile, keep_part, resumed_part, resumed_parts
from hypermedia.engines.documents import engine_process
from hypermedia.engines.documents.params import MAX_DOCUMENT_PAGES, OPERATIONS, validate_params

__all__ = [
    "MAX_JOB_PIXELS",
    "MAX_SIDE",
    "MAX_TEXT_CHARS",
    "OPERATIONS",
    "DocumentLimits",
    "OutputFile",
    "run",
]

MAX_SIDE: Final = 16383
"""Largest width or height of a preview in pixels (WebP's limit, applied to every format)."""
MAX_JOB_PIXELS: Final = 200_000_000
"""Most pixels one ``pdf_preview`` job renders over all its pages: 20 A4 pages at 300 dpi
(8.7 M pixels each), or 5 at 600 dpi. Encoding 35 M pixels as WebP takes about 1.4 s here, so a
job stays far inside its timeout."""
KEEP_EVERY_SECONDS: Final = 1.0
"""Seconds of rendering after which a ``pdf_preview`` keeps the pages rendered since its last
part (:class:`_PreviewParts`)."""
_PREVIEW_PART: Final = re.compile(r"p[0-9]{3}-[0-9]{3}")
PREVIEW_CHECKPOINT_FORMAT: Final = 1
"""Version of a preview part's layout (``made_by.json`` and the pages' files by output name), and
of how pages are rendered and encoded: raise it when ``_encode``'s options or the plan's scale
change, so that a part kept before is rendered again rather than mixed in."""
MAX_TEXT_CHARS: Final = 20_000_000
"""Most characters ``text_extract`` returns for one document (``PDF_TEXT_LIMIT`` above it)."""
MAX_INFO_STRING: Final = 1024
"""Document-information strings (``producer``) are cut to this many characters."""

_MAGIC: Final = b"%PDF-"
_FORM_TYPES: Final = {
    pdfium_c.FORMTYPE_NONE: None,
    pdfium_c.FORMTYPE_ACRO_FORM: "acroform",
    pdfium_c.FORMTYPE_XFA_FULL: "xfa_full",
    pdfium_c.FORMTYPE_XFA_FOREGROUND: "xfa_foreground",
}
_MIME_BY_FORMAT: Final = {"webp": "image/webp", "png": "image/png", "jpeg": "image/jpeg"}
_EXTENSION_BY_FORMAT: Final = {"webp": "webp", "png": "png", "jpeg": "jpg"}
TEXT_MIME: Final = "text/plain; charset=utf-8"
JSON_MIME: Final = "application/json"
PDF_MIME: Final = "application/pdf"

# PDFium hands out text as UTF-16LE; pypdfium2 decodes it with this codec. Looked up here, so that
# the zygote has it: a sandbox child may not be able to read the interpreter's files to import it
# later (an interpreter under /root, mode 0700, as on a development machine).
codecs.lookup("utf-16-le")

# libvips only encodes here (new_from_memory and the savers); every loader stays blocked. The
# operation cache is useless in a one-job process.
pyvips.block_untrusted_set(True)
pyvips.cache_set_max(0)


@dataclass(frozen=True)
class DocumentLimits:
    """Bounds of one document job, from its processing profile and this module's constants; the
    sandbox's rlimits (``RLIMIT_AS``, ``RLIMIT_CPU``) are the backstop behind them."""

    max_input_bytes: int
    """Largest input file, in bytes (``processing_profiles.max_input_bytes``)."""
    max_page_pixels: int
    """Largest rendered page, width × height in pixels (``processing_profiles.max_pixels``)."""
    max_pages: int = MAX_DOCUMENT_PAGES
    """Most pages the document may have (``PDF_PAGE_LIMIT``)."""
    max_job_pixels: int = MAX_JOB_PIXELS
    """Most pixels of all pages a ``pdf_preview`` job renders."""
    max_text_chars: int = MAX_TEXT_CHARS
    """Most characters ``text_extract`` returns."""


def run(
    operation: str,
    params: dict,
    input_path: Path,
    out_dir: Path,
    *,
    limits: DocumentLimits,
    password: str | None = None,
    converted: dict[str, Any] | None = None,
) -> list[OutputFile]:
    """Runs one document operation on one PDF and writes its outputs into ``out_dir``.

    Args:
        operation: one of :data:`OPERATIONS`.
        params: as accepted by :func:`hypermedia.engines.documents.params.validate_params` (validated again).
        input_path: the uploaded file.
        out_dir: existing directory for the outputs.
        limits: checked before any page is loaded or rendered.
        password: the document's user password, for encrypted PDFs. Never part of ``params`` (those
            are stored with the job).
        converted: for an office document converted to PDF by the worker, facts about the
            conversion (``source_mime_type``, ``libreoffice_pages``, ``conversion_ms``), added to
            every output's metadata.

    Returns:
        ``pdf_info``: one ``info`` output (``application/json``, see :func:`_info`); its metadata
        repeats the summary (without the page list). ``pdf_preview``: one ``preview_p{N}`` image per
        requested page N, in page order; metadata ``page``, ``width``, ``height`` (pixels),
        ``format``, ``size_bytes``, ``page_count``. ``text_extract``: ``text`` (plain UTF-8, pages
        separated by a form feed, U+000C) and ``text_json`` (``application/json``: ``page_count``,
        ``has_text_layer``, ``chars``, ``pages[{page, text, chars}]``); metadata ``page_count``,
        ``has_text_layer``, ``chars``, ``size_bytes``. ``office_to_pdf``: one ``pdf`` output
        (``application/pdf``, the converted document as LibreOffice exported it); metadata
        ``page_count``, ``has_text_layer``, ``size_bytes``.

    Raises:
        InvalidArgument: ``UNKNOWN_OPERATION``, ``INVALID_PARAMS``.
        PermanentJobError: ``INPUT_TOO_LARGE``, ``UNSUPPORTED_FORMAT``, ``PASSWORD_REQUIRED``,
            ``PASSWORD_INCORRECT``, ``PDF_UNSUPPORTED_ENCRYPTION``, ``PARSE_ERROR``,
            ``PDF_PAGE_LIMIT``, ``PDF_PAGE_TOO_LARGE``, ``PDF_TEXT_LIMIT``, ``INVALID_PARAMS`` (a
            page past the end, or too many pixels in all).
        TransientError: ``TIMEOUT`` (the engine hit its CPU limit).
        MemoryError, OSError(EFBIG): the engine hit the sandbox's memory or file size limit.
    """
    params = validate_params(operation, params)
    size = input_path.stat().st_size
    if size > limits.max_input_bytes:
        raise PermanentJobError(
            f"The input is larger than the {limits.max_input_bytes} byte limit.", "INPUT_TOO_LARGE"
        )
    with input_path.open("rb") as f:
        if f.read(len(_MAGIC)) != _MAGIC:
            raise PermanentJobError("The input is not a PDF.", "UNSUPPORTED_FORMAT")
    # The engine process is a fork: its arguments are not copied anywhere, only its result is
    # sent back (as JSON).
    raw_outputs = engine_process.call(
        _engine, operation, params, str(input_path), str(out_dir), limits, password
    )
    outputs = [OutputFile(**raw) for raw in raw_outputs]
    for output in outputs:
        output.metadata.update(converted or {})
    return outputs


# --- engine side: everything below runs in the engine process ------------------------------------


def _engine(
    operation: str, params: dict, input_path: str, out_dir: str, limits: DocumentLimits, password: str | None
) -> list[dict]:
    """One operation in the engine process; returns its outputs as dicts (JSON-safe). A PDFium
    call that fails on the document (a page that does not load) is ``PARSE_ERROR``."""
    try:
        return _ENGINES[operation](params, input_path, out_dir, limits, password)
    except pdfium.PdfiumError:
        raise _parse_error() from None


def _open(input_path: str, limits: DocumentLimits, password: str | None) -> pdfium.PdfDocument:
    """Opens the document and checks its page count; loads no page."""
    try:
        document = pdfium.PdfDocument(input_path, password=password)
    except pdfium.PdfiumError as exc:
        if exc.err_code == pdfium_c.FPDF_ERR_PASSWORD:
            if not password:
                raise PermanentJobError(
                    "The PDF is encrypted and needs a password to open.", "PASSWORD_REQUIRED"
                ) from None
            raise PermanentJobError("The password does not open the PDF.", "PASSWORD_INCORRECT") from None
        if exc.err_code == pdfium_c.FPDF_ERR_SECURITY:
            raise PermanentJobError(
                "The PDF uses an encryption scheme that is not supported.", "PDF_UNSUPPORTED_ENCRYPTION"
            ) from None
        raise _parse_error() from None
    pages = len(document)
    if pages > limits.max_pages:
        raise PermanentJobError(
            f"The PDF has {pages} pages; at most {limits.max_pages} are processed.", "PDF_PAGE_LIMIT"
        )
    if pages < 1:
        raise _parse_error()
    return document


def _parse_error() -> PermanentJobError:
    return PermanentJobError("The PDF is damaged and cannot be read.", "PARSE_ERROR")


def _clip(value: str | None) -> str | None:
    return value[:MAX_INFO_STRING] if value else None


_CONTROLS: Final = dict.fromkeys([c for c in (*range(0x20), *range(0x7F, 0xA0)) if chr(c) not in "\t\n\f"])
"""C0 controls but tab, line feed and form feed, DEL and the C1 controls: dropped from page text.
PDFium passes some through from the content stream (U+0003 in real files; issue 15), and no
reader of a ``text`` output wants them (``\\r`` is a line end, mapped before)."""


def page_text(document: pdfium.PdfDocument, index: int) -> str:
    """The text layer of page ``index`` (0-based) in content-stream order, with ``\\n`` line ends
    and no control characters but tab, line feed and form feed (:data:`_CONTROLS`); also the OCR
    engine's for a page it skips for its text layer. Raises pypdfium2.PdfiumError."""
    page = document[index]
    try:
        textpage = page.get_textpage()
        try:
            text = textpage.get_text_bounded()
        finally:
            textpage.close()
    finally:
        page.close()
    return text.replace("\r\n", "\n").replace("\r", "\n").translate(_CONTROLS)


def _has_text_layer(document: pdfium.PdfDocument, pages: int) -> bool:
    """True when a page has text other than white space; stops at the first such page."""
    return any(page_text(document, index).strip() for index in range(pages))


def _write_json(path: str, value: Any) -> int:
    data = json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()
    with open(path, "wb") as f:
        f.write(data)
    return len(data)


def _info(
    params: dict, input_path: str, out_dir: str, limits: DocumentLimits, password: str | None
) -> list[dict]:
    """``info.json``: ``page_count``, ``pdf_version`` (``"1.7"``, or null), ``encrypted`` (a
    security handler is present, also when the user password is empty), ``producer`` (document
    information, at most :data:`MAX_INFO_STRING` characters, or null), ``has_text_layer`` (some
    page has text other than white space), ``has_forms`` and ``form_type`` (``acroform``,
    ``xfa_full``, ``xfa_foreground`` or null), ``pages[{page, width, height}]`` in points as
    displayed (after ``/Rotate`` and CropBox)."""
    document = _open(input_path, limits, password)
    count = len(document)
    version = document.get_version()
    form_type = _FORM_TYPES.get(document.get_formtype())
    sizes = [document.get_page_size(i) for i in range(count)]
    summary = {
        "page_count": count,
        "pdf_version": f"{version // 10}.{version % 10}" if version else None,
        "encrypted": pdfium_c.FPDF_GetSecurityHandlerRevision(document) != -1,
        "producer": _clip(document.get_metadata_value("Producer")),
        "has_text_layer": _has_text_layer(document, count),
        "has_forms": form_type is not None,
        "form_type": form_type,
    }
    info = {
        **summary,
        "pages": [
            {"page": i + 1, "width": round(w, 2), "height": round(h, 2)} for i, (w, h) in enumerate(sizes)
        ],
    }
    size = _write_json(os.path.join(out_dir, "info.json"), info)
    return [
        asdict(
            OutputFile(
                output_type="info",
                filename="info.json",
                mime_type=JSON_MIME,
                metadata={**summary, "size_bytes": size},
            )
        )
    ]


def _text(
    params: dict, input_path: str, out_dir: str, limits: DocumentLimits, password: str | None
) -> list[dict]:
    document = _open(input_path, limits, password)
    count = len(document)
    texts: list[str] = []
    total = 0
    for index in range(count):
        text = page_text(document, index)
        total += len(text)
        if total > limits.max_text_chars:
            raise PermanentJobError(
                f"The PDF has more than {limits.max_text_chars} characters of text.", "PDF_TEXT_LIMIT"
            )
        texts.append(text)
    has_text = any(t.strip() for t in texts)
    summary = {"page_count": count, "has_text_layer": has_text, "chars": total}
    plain = "\f".join(texts).encode()
    with open(os.path.join(out_dir, "text.txt"), "wb") as f:
        f.write(plain)
    json_size = _write_json(
        os.path.join(out_dir, "text.json"),
        {
            **summary,
            "pages": [{"page": i + 1, "text": t, "chars": len(t)} for i, t in enumerate(texts)],
        },
    )
    return [
        asdict(OutputFile("text", "text.txt", TEXT_MIME, {**summary, "size_bytes": len(plain)})),
        asdict(OutputFile("text_json", "text.json", JSON_MIME, {**summary, "size_bytes": json_size})),
    ]


def _pixel_size(width_pt: float, height_pt: float, scale: float) -> tuple[int, int]:
    """The bitmap pypdfium2 renders for a page of that size (it rounds up)."""
    return max(1, math.ceil(width_pt * scale)), max(1, math.ceil(height_pt * scale))


def _preview(
    params: dict, input_path: str, out_dir: str, limits: DocumentLimits, password: str | None
) -> list[dict]:
    document = _open(input_path, limits, password)
    count = len(document)
    pages: list[int] = params["pages"]
    missing = [p for p in pages if p > count]
    if missing:
        raise InvalidArgument(
            f"The PDF has {count} page{'s' if count != 1 else ''}; page {missing[0]} does not exist.",
            "INVALID_PARAMS",
        )
    # Every page's size is checked before the first is rendered.
    plan = []
    total = 0
    for number in pages:
        width_pt, height_pt = document.get_page_size(number - 1)
        if width_pt <= 0 or height_pt <= 0:
            raise _parse_error()
        scale = params["width"] / width_pt if "width" in params else params["dpi"] / 72
        width, height = _pixel_size(width_pt, height_pt, scale)
        if width * height > limits.max_page_pixels or max(width, height) > MAX_SIDE:
            raise PermanentJobError(
                f"Page {number} would render to {width} × {height} pixels; the limit is "
                f"{limits.max_page_pixels} pixels and {MAX_SIDE} per side. Ask for a smaller width or dpi.",
                "PDF_PAGE_TOO_LARGE",
            )
        total += width * height
        plan.append((number, scale, width, height))
    if total > limits.max_job_pixels:
        raise InvalidArgument(
            f"The pages would render to {total} pixels in all; the limit is {limits.max_job_pixels}. "
            "Ask for fewer pages or a smaller width or dpi.",
            "INVALID_PARAMS",
        )

    document.init_forms()  # before any page is loaded: form fields are drawn on the pages
    output_format = params["format"]
    outputs = []
    names = [f"preview_p{number}.{_EXTENSION_BY_FORMAT[output_format]}" for number, *_ in plan]
    parts = _PreviewParts(Path(out_dir), params, set(names[:-1]))
    for position, (number, scale, width, height) in enumerate(plan, 1):
        filename = names[position - 1]
        path = os.path.join(out_dir, filename)
        resumed = parts.restore(filename, path)
        if not resumed:
            page = document[number - 1]
            try:
                bitmap = page.render(
                    scale=scale, may_draw_forms=True, draw_annots=True, rev_byteorder=True, prefer_bgrx=True
                )
                try:
                    _encode(bitmap, output_format, path)
                finally:
                    bitmap.close()
            finally:
                page.close()
            if position < len(plan):  # after the last page nothing is left to resume
                parts.rendered(position, filename, path)
        outputs.append(
            asdict(
                OutputFile(
                    output_type=f"preview_p{number}",
                    filename=filename,
                    mime_type=_MIME_BY_FORMAT[output_format],
                    metadata={
                        "page": number,
                        "width": width,
                        "height": height,
                        "format": output_format,
                        "size_bytes": os.stat(path).st_size,
                        "page_count": count,
                        "resumed": resumed,
                    },
                )
            )
        )
    return outputs


class _PreviewParts:
    """A preview's checkpoints (ADR 0069): the pages rendered since the last kept part become one
    part (``p{first}-{last}``, ``p004-006``: positions in the job's page list) once
    :data:`KEEP_EVERY_SECONDS` of rendering passed, so a drained job renders again at most that
    much and a fast preview keeps a part a second, not one a page. A part is taken back only when
    its ``made_by.json`` is this part format's, this PDFium's and libvips', and the job's params'
    (a drain during a deploy renders again rather than mixing encoders), and only its files that
    are ``wanted``: the pages of the plan but the last, which is never kept."""

    def __init__(self, out_dir: Path, params: dict, wanted: set[str]) -> None:
        self._out_dir = out_dir
        made_by = {
            "format": PREVIEW_CHECKPOINT_FORMAT,
            "pdfium": str(pdfium.PDFIUM_INFO),
            "libvips": ".".join(str(pyvips.version(i)) for i in range(3)),
            "params": params,
        }
        self._made_by = json.dumps(made_by, sort_keys=True, separators=(",", ":")).encode()
        self._kept: dict[str, bytes] = {}
        for part in resumed_parts(out_dir):
            files = resumed_part(out_dir, part) if _PREVIEW_PART.fullmatch(part) else None
            if files is not None and files.pop("made_by.json", None) == self._made_by:
                self._kept |= {name: data for name, data in files.items() if name in wanted}
        self._pending: dict[str, bytes] = {}
        self._first = 0
        self._since = time.monotonic()

    def restore(self, filename: str, path: str) -> bool:
        """Writes ``filename`` as an earlier attempt rendered it to ``path``; False when none did."""
        data = self._kept.get(filename)
        if data is None:
            return False
        with open(path, "wb") as f:
            f.write(data)
        self._since = time.monotonic()
        return True

    def rendered(self, position: int, filename: str, path: str) -> None:
        """Notes the page at ``position`` (1-based) rendered to ``path``, and keeps the pages
        pending as a part once :data:`KEEP_EVERY_SECONDS` passed since the last one."""
        with open(path, "rb") as f:
            self._pending[filename] = f.read()
        self._first = self._first or position
        if time.monotonic() - self._since >= KEEP_EVERY_SECONDS:
            part = f"p{self._first:03d}-{position:03d}"
            keep_part(self._out_dir, part, self._pending | {"made_by.json": self._made_by})
            self._pending, self._first, self._since = {}, 0, time.monotonic()


def _encode(bitmap: pdfium.PdfBitmap, output_format: str, path: str) -> None:
    """Writes an RGBx bitmap as ``output_format`` with fixed encoder options and no metadata."""
    if bitmap.stride != bitmap.width * 4:
        raise RuntimeError(f"unexpected bitmap stride {bitmap.stride} for width {bitmap.width}")
    # libvips reads PDFium's buffer in place (no copy); the bitmap outlives the save.
    image = pyvips.Image.new_from_memory(bitmap.buffer, bitmap.width, bitmap.height, 4, "uchar")
    image = image.extract_band(0, n=3).copy(interpretation="srgb")
    if output_format == "webp":
        image.webpsave(path, keep="none")
    elif output_format == "png":
        image.pngsave(path, keep="none")
    else:
        image.jpegsave(path, optimize_coding=True, keep="none")


def _office_pdf(
    params: dict, input_path: str, out_dir: str, limits: DocumentLimits, password: str | None
) -> list[dict]:
    """``document.pdf``: the converted document, once PDFium has opened it and counted its pages
    (a conversion is held to the same page limit as an uploaded PDF)."""
    document = _open(input_path, limits, password)
    count = len(document)
    has_text = _has_text_layer(document, count)
    document.close()
    target = os.path.join(out_dir, "document.pdf")
    shutil.copyfile(input_path, target)
    summary = {"page_count": count, "has_text_layer": has_text, "size_bytes": os.path.getsize(target)}
    return [asdict(OutputFile("pdf", "document.pdf", PDF_MIME, summary))]


_ENGINES: Final = {
    "pdf_info": _info,
    "pdf_preview": _preview,
    "text_extract": _text,
    "office_to_pdf": _office_pdf,
}
