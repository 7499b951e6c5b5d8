"""Params of the ``ocr`` operation: checked when a job is created (the gateway) and again in the
worker (:func:`hypermedia.engines.ocr.engine.run`). Pure Python: the gateway imports this module, never
pyvips, PDFium or tesseract.

| param | accepted | normalised |
|---|---|---|
| ``languages`` | a list of tesseract language codes (``["eng", "deu"]``) or one string joined with ``+`` as on tesseract's command line (``"eng+deu"``); at most :data:`MAX_LANGUAGES`; default ``["eng"]`` | a list, duplicates removed, order kept (the first language is tesseract's primary one) |
| ``pages`` | page numbers (1-based) as a list or a string such as ``"1-3"`` or ``"1,4,6-8"``; pages of a PDF, or of a multi-page image (TIFF pages, GIF/WebP frames); at most :data:`MAX_OCR_PAGES`; default every page | a sorted list of distinct numbers, or ``None`` for every page |
| ``outputs`` | any of :data:`OUTPUTS`; default :data:`DEFAULT_OUTPUTS` | a list in the order of :data:`OUTPUTS` |
| ``table_detection`` | a boolean; default ``false``: blocks are classified text or table and each table returned as rows and cells (:mod:`hypermedia.engines.ocr.tables`), in the ``tables`` output (asking for that output turns it on too) | a boolean |
| ``skip_text_pages`` | a boolean; default ``false``: a PDF page that already has a text layer (at least :data:`TEXT_LAYER_MIN_CHARS` characters) is not rendered or OCRed; its text comes from the layer, it is in ``words`` with the engine ``text_layer`` and no words, left out of ``hocr``, and copied as it is into ``searchable_pdf``. Ignored for images | a boolean |
| ``escalate`` | a boolean; default ``true``: a page tesseract reads with a low mean confidence is read again by a second engine and the better reading kept (:mod:`hypermedia.engines.ocr.escalation`), its cost reported apart (``escalated_pages``) | a boolean |

Which languages exist is known only where tesseract is installed: the worker passes
:func:`hypermedia.engines.ocr.tesseract.installed_languages` as ``installed_languages``; the gateway passes
the list the ocrworker reports (its RPC, or the profile's docs). Without that list only the form
of each code is checked.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from typing import Any, Final

from hypermedia.core.errors import InvalidArgument
from hypermedia.engines.documents import params as document_params
from hypermedia.engines.documents.params import MAX_DOCUMENT_PAGES
from hypermedia.engines.params import params_object

__all__ = [
    "DEFAULT_ESCALATE",
    "DEFAULT_LANGUAGES",
    "DEFAULT_OUTPUTS",
    "INPUT_MIME_TYPES",
    "LANGUAGE_CODE",
    "MAX_DOCUMENT_PAGES",
    "MAX_FANNED_OCR_PAGES",
    "MAX_LANGUAGES",
    "MAX_OCR_PAGES",
    "NOT_RECOGNITION_MODELS",
    "OPERATIONS",
    "OUTPUTS",
    "TEXT_LAYER_MIN_CHARS",
    "escalation_pages",
    "parse_languages",
    "parse_pages",
    "validate_params",
]

OPERATIONS: Final = ("ocr",)

OUTPUTS: Final = ("text", "words", "hocr", "searchable_pdf", "tables")
"""``text``: plain UTF-8, pages separated by a form feed. ``words``: JSON, every word with its box,
confidence and block/paragraph/line ids, and the preprocessing of every page. ``hocr``: one hOCR
document, a ``ocr_page`` per page. ``searchable_pdf``: the page images with an invisible text layer."""
DEFAULT_OUTPUTS: Final = ("text", "words")

DEFAULT_LANGUAGES: Final = ("eng",)
MAX_LANGUAGES: Final = 8
"""Most languages one job may ask for. Every language is a model tesseract loads and tries on the
words the others read poorly: with six (eng, deu, fra, ita, spa, por, the languages of the corpus'
``eurotext.tif``) tesseract's peak resident set on the corpus' 8071 page is 143 MB against 52 MB
for ``eng`` alone (measured, tessdata_fast models), for about the same time."""

MAX_OCR_PAGES: Final = 20
"""Most pages one job OCRs (``pages`` may name at most this many). A page takes tesseract 0.3–3.7 s
on one core here and preprocessing 0.03–0.9 s more (measured on the corpus pages; issue 17 gated
the orientation detection, :mod:`hypermedia.engines.ocr.gate`). The worst page is the 3312 × 2550
page upside down: read, detected, turned and read again, about 7.5 s (the sum of its steps'
times), so 20 such pages take about 150 s, within the ``ocr`` profile's 300 s timeout with room for escalation (migration 0010); a
longer document fans out to child jobs, each reading at most this many (:data:`MAX_FANNED_OCR_PAGES`)."""

MAX_FANNED_OCR_PAGES: Final = 500
"""Most pages one job OCRs when it fans out (ADR 0082: more than the ocrworker's
``HM_OCR_FAN_OUT_PAGES`` selected): child jobs on any OCR worker read its pages in groups of at
most :data:`MAX_OCR_PAGES`, and each page is a checkpoint part the job restores (at most 500:
``services.ocrworker.OcrHandler.checkpoint_max_parts``)."""

LANGUAGE_CODE: Final = re.compile(r"(?:script/)?[A-Za-z][A-Za-z0-9_]{1,31}")
"""Form of a tesseract language: the name of a ``.traineddata`` file without its suffix (``eng``,
``chi_sim``, ``deu_latf``), or a script model (``script/Latin``). Nothing else reaches the command
line: no path separators (but the one of ``script/``), no ``+``, no option."""

DEFAULT_ESCALATE: Final = True
TEXT_LAYER_MIN_CHARS: Final = 16
"""Characters other than whitespace a PDF page's text layer must have to count as one for
``skip_text_pages``: a scanned page may carry a stamped page number or a few words of a
header as text, which is not its text."""
INPUT_MIME_TYPES: Final = frozenset(
    {
        "application/pdf",
        "image/jpeg",
        "image/png",
        "image/webp",
        "image/gif",
        "image/tiff",
        "image/avif",
        "image/heif",
    }
)
"""What the engine reads: PDFs and the raster types libvips decodes
(:data:`hypermedia.engines.ocr.engine.LOADERS`). An SVG's text is in its XML, not its pixels; the gateway
refuses it for ``ocr`` (415) before a job exists."""
_MULTI_PAGE_MIME_TYPES: Final = frozenset(
    {"application/pdf", "image/tiff", "image/gif", "image/webp", "image/heif", "image/avif"}
)

_ALLOWED_KEYS: Final = frozenset(
    {"languages", "pages", "outputs", "escalate", "table_detection", "skip_text_pages"}
)
NOT_RECOGNITION_MODELS: Final = frozenset({"osd", "equ"})
"""Tesseract models that are not languages to read text with: orientation and script detection,
and the equation model of tesseract 3. Never asked for, never listed."""
"""Models that are not for recognising text: orientation and script detection, and the legacy
equation detector."""


def _invalid(message: str) -> InvalidArgument:
    return InvalidArgument(message, "INVALID_PARAMS")


def parse_languages(value: Any, installed_languages: Collection[str] | None = None) -> list[str]:
    """``languages`` as a list of tesseract codes, duplicates removed, order kept.

    Args:
        value: ``None`` (→ :data:`DEFAULT_LANGUAGES`), a list of codes, or a string of codes joined
            with ``+``.
        installed_languages: the languages tesseract has (``tesseract --list-langs``); ``None``
            checks the form only.

    Raises:
        InvalidArgument: ``INVALID_PARAMS`` for another type, an empty list, a code that is not of
            the form :data:`LANGUAGE_CODE`, ``osd``, more than :data:`MAX_LANGUAGES`, or a language
            that is not installed (the message lists the installed ones).
    """
    if value is None:
        return list(DEFAULT_LANGUAGES)
    if isinstance(value, str):
        codes: list[Any] = value.split("+")
    elif isinstance(value, list):
        codes = value
    else:
        raise _invalid('languages must be a list of tesseract language codes such as ["eng", "deu"]')
    languages: list[str] = []
    for code in codes:
        if not isinstance(code, str) or LANGUAGE_CODE.fullmatch(code) is None:
            raise _invalid("languages must be tesseract language codes such as eng, deu or chi_sim")
        if code in NOT_RECOGNITION_MODELS:
            raise _invalid(f"{code} is not a language for recognising text")
        if code not in languages:
            languages.append(code)
    if not languages:
        raise _invalid("languages must name at least one language")
    if len(languages) > MAX_LANGUAGES:
        raise _invalid(f"at most {MAX_LANGUAGES} languages per job")
    if installed_languages is not None:
        missing = [code for code in languages if code not in installed_languages]
        if missing:
            available = sorted(set(installed_languages) - NOT_RECOGNITION_MODELS)
            raise _invalid(
                f"language{'s' if len(missing) > 1 else ''} not installed: {', '.join(missing)}; "
                f"installed: {', '.join(available) or 'none'}"
            )
    return languages


def parse_pages(value: Any) -> list[int] | None:
    """``pages`` as a sorted list of distinct page numbers (1-based), or ``None`` for every page:
    :func:`hypermedia.engines.documents.params.parse_pages` with at most :data:`MAX_OCR_PAGES` pages.

    Raises:
        InvalidArgument: ``INVALID_PARAMS``, as that function does.
    """
    return document_params.parse_pages(value, all_by_default=True, max_pages=MAX_OCR_PAGES)


def _parse_outputs(value: Any) -> list[str]:
    if value is None:
        return list(DEFAULT_OUTPUTS)
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise _invalid(f"outputs must be a list of: {', '.join(OUTPUTS)}")
    unknown = sorted(set(value) - set(OUTPUTS))
    if unknown:
        raise _invalid(f"unknown outputs {', '.join(unknown)}; choose from {', '.join(OUTPUTS)}")
    if not value:
        raise _invalid("outputs must name at least one output")
    return [name for name in OUTPUTS if name in value]


def _parse_escalate(value: Any) -> bool:
    if value is None:
        return DEFAULT_ESCALATE
    if not isinstance(value, bool):
        raise _invalid("escalate must be true or false")
    return value


def validate_params(
    operation: str, params: Any, *, installed_languages: Collection[str] | None = None
) -> dict:
    """Check the params of an OCR operation and fill in defaults.

    Args:
        operation: one of :data:`OPERATIONS`.
        params: JSON object from the request; ``None`` means ``{}``.
        installed_languages: see :func:`parse_languages`.

    Returns:
        A new dict ``{"languages": [...], "pages": [...] | None, "outputs": [...],
        "escalate": bool, "table_detection": bool, "skip_text_pages": bool}`` (see the module table); ``table_detection``
        is true exactly when ``tables`` is among the outputs (asking for either gives both).

    Raises:
        InvalidArgument: ``UNKNOWN_OPERATION`` for an unknown operation; ``INVALID_PARAMS`` for a
            non-object, unknown keys, an ``escalate`` that is not a boolean, and the cases of
            :func:`parse_languages` and :func:`parse_pages`.
    """
    params = params_object(operation, params, OPERATIONS, _ALLOWED_KEYS)
    outputs = _parse_outputs(params.get("outputs"))
    tables = params.get("table_detection")
    if tables is not None and not isinstance(tables, bool):
        raise _invalid("table_detection must be true or false")
    skip_text = params.get("skip_text_pages")
    if skip_text is None:
        skip_text = False
    elif not isinstance(skip_text, bool):
        raise _invalid("skip_text_pages must be true or false")
    if tables and "tables" not in outputs:
        outputs = [name for name in OUTPUTS if name in {*outputs, "tables"}]
    return {
        "languages": parse_languages(params.get("languages"), installed_languages),
        "pages": parse_pages(params.get("pages")),
        "outputs": outputs,
        "escalate": _parse_escalate(params.get("escalate")),
        "table_detection": "tables" in outputs,
        "skip_text_pages": skip_text,
    }


def escalation_pages(params: Mapping[str, Any], mime_type: str) -> int:
    """The most pages a job with these (validated) params may escalate: what the gateway holds
    the escalation line for. 0 without escalation; the pages asked for; else every page the job
    may OCR (:data:`MAX_OCR_PAGES`) for a PDF or a type with several pages or frames, 1 for
    the others (a JPEG or PNG has one page)."""
    if not params["escalate"]:
        return 0
    if params["pages"] is not None:
        return len(params["pages"])
    return MAX_OCR_PAGES if mime_type in _MULTI_PAGE_MIME_TYPES else 1
