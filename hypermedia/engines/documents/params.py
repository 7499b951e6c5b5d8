"""Params of the document operations: checked when a job is created (the gateway's
``PARAM_VALIDATORS["documents"]``) and again in the worker. Pure Python: the gateway imports this
module, never PDFium.

| operation | params | normalised |
|---|---|---|
| ``pdf_info`` | none | ``{}`` |
| ``text_extract`` | none | ``{}`` |
| ``office_to_pdf`` | none | ``{}`` |
| ``pdf_preview`` | ``pages`` (list of page numbers, or a string such as ``"1-3"`` or ``"1,4,6-8"``; default ``[1]``; at most :data:`MAX_PREVIEW_PAGES`), ``width`` (px) **or** ``dpi``, ``format`` (``webp`` default, ``png``, ``jpeg``) | ``{"pages": [sorted, unique], "format": …, "width": …}`` or ``{…, "dpi": …}`` (``dpi`` :data:`DEFAULT_DPI` when neither is given) |

``password`` is not a param here. The gateway takes it out of a request's params before it calls
:func:`validate_params` (:func:`hypermedia.jobs.secrets.take_password`) and keeps it in
``job_secrets``, never in the job's stored params, so the worker's check never sees it either. A
``password`` reaching :func:`validate_params` means a caller skipped that step: it is refused, so
that it is never normalised into params that would be stored.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

from hypermedia.core.errors import InvalidArgument
from hypermedia.engines.params import params_object

__all__ = [
    "DEFAULT_DPI",
    "MAX_DOCUMENT_PAGES",
    "MAX_DPI",
    "MAX_PREVIEW_PAGES",
    "MAX_WIDTH",
    "MIN_DPI",
    "MIN_WIDTH",
    "OPERATIONS",
    "PREVIEW_FORMATS",
    "parse_pages",
    "validate_params",
]

OPERATIONS: Final = ("pdf_info", "pdf_preview", "text_extract", "office_to_pdf")

MAX_DOCUMENT_PAGES: Final = 10_000
"""Most pages a PDF may have for any operation (``PDF_PAGE_LIMIT`` above it). PDFium extracts the
text of a page in about 0.5 ms (measured on the corpus' ``multicolumn.pdf``), so the text of
10,000 pages takes seconds, well inside the profiles' timeouts; the attack corpus' 50,000-page
PDF is refused before any page is loaded."""

MAX_PREVIEW_PAGES: Final = 20
"""Most pages one ``pdf_preview`` job renders (one output each)."""

MIN_WIDTH: Final = 16
MAX_WIDTH: Final = 4096
"""``pdf_preview`` ``width`` bounds, in pixels: the width of every rendered page."""
MIN_DPI: Final = 18
MAX_DPI: Final = 600
"""``pdf_preview`` ``dpi`` bounds (pixels per inch; 1 PDF point is 1/72 inch)."""
DEFAULT_DPI: Final = 96
"""Resolution when neither ``width`` nor ``dpi`` is given: an A4 page is 794 × 1123 pixels."""

PREVIEW_FORMATS: Final = ("webp", "png", "jpeg")

_ALLOWED_KEYS: Final = {
    "pdf_info": frozenset(),
    "text_extract": frozenset(),
    "office_to_pdf": frozenset(),
    "pdf_preview": frozenset({"pages", "width", "dpi", "format"}),
}
_PAGE_SPEC: Final = re.compile(r"\s*([0-9]{1,9})\s*(?:-\s*([0-9]{1,9})\s*)?")


def _invalid(message: str) -> InvalidArgument:
    return InvalidArgument(message, "INVALID_PARAMS")


def _page_number(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _invalid("pages must be page numbers (integers from 1)")
    if not 1 <= value <= MAX_DOCUMENT_PAGES:
        raise _invalid(f"page numbers must be between 1 and {MAX_DOCUMENT_PAGES}")
    return value


def parse_pages(
    value: Any, *, all_by_default: bool = False, max_pages: int = MAX_PREVIEW_PAGES
) -> list[int] | None:
    """``pages`` as a sorted list of distinct page numbers (1-based), shared by the document and
    OCR operations.

    Accepts ``None`` (→ ``[1]``, or ``None`` meaning every page with ``all_by_default``), a list
    of integers, or a string of numbers and ranges separated by commas (``"3"``, ``"1-3"``,
    ``"1,4,6-8"``). A range's size is checked before it is expanded.

    Raises:
        InvalidArgument: ``INVALID_PARAMS`` for another type, an empty selection, a page number
            outside 1..:data:`MAX_DOCUMENT_PAGES`, a range that runs backwards, or more than
            ``max_pages`` pages (:data:`MAX_PREVIEW_PAGES` by default).
    """
    if value is None:
        return None if all_by_default else [1]
    pages: set[int] = set()
    if isinstance(value, list):
        pages = {_page_number(item) for item in value}
    elif isinstance(value, str):
        for part in value.split(","):
            match = _PAGE_SPEC.fullmatch(part)
            if match is None:
                raise _invalid('pages must be a list of page numbers or a string such as "1-3" or "1,4"')
            first = _page_number(int(match.group(1)))
            last = _page_number(int(match.group(2))) if match.group(2) else first
            if last < first:
                raise _invalid(f"the page range {first}-{last} runs backwards")
            if last - first + 1 > max_pages:
                raise _invalid(f"at most {max_pages} pages per job")
            pages.update(range(first, last + 1))
    else:
        raise _invalid('pages must be a list of page numbers or a string such as "1-3"')
    if not pages:
        raise _invalid("pages must name at least one page")
    if len(pages) > max_pages:
        raise _invalid(f"at most {max_pages} pages per job")
    return sorted(pages)


def _int_param(params: Mapping[str, Any], key: str, low: int, high: int) -> int | None:
    value = params.get(key)
    if value is None:  # absent or an explicit null
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _invalid(f"{key} must be an integer")
    if not low <= value <= high:
        raise _invalid(f"{key} must be between {low} and {high}")
    return value


def validate_params(operation: str, params: Any) -> dict:
    """Check an operation's params and fill in defaults.

    Args:
        operation: one of :data:`OPERATIONS`.
        params: JSON object from the request; ``None`` means ``{}``.

    Returns:
        A new dict (see the module table). ``pdf_info``, ``text_extract`` and ``office_to_pdf``
        take no params.

    Raises:
        InvalidArgument: ``UNKNOWN_OPERATION`` for an unknown operation; ``INVALID_PARAMS`` for a
            non-object, unknown keys, wrong types (booleans are not integers), values out of range,
            both ``width`` and ``dpi``, and ``password``: the password of an encrypted PDF travels
            beside the params (the gateway takes it out first and stores it in ``job_secrets``;
            see :mod:`hypermedia.jobs.secrets`), so one still inside them is a caller's bug and
            must not end up in ``processing_jobs.params``. The message never contains the value.
    """
    if operation in OPERATIONS and isinstance(params, Mapping) and "password" in params:
        raise _invalid(
            "password is not accepted inside the params to validate: the gateway takes it out "
            "first and keeps it apart from the job"
        )
    params = params_object(operation, params, OPERATIONS, _ALLOWED_KEYS.get(operation, ()))
    if operation != "pdf_preview":
        return {}

    output_format = params.get("format")
    if output_format is None:
        output_format = "webp"
    elif output_format not in PREVIEW_FORMATS:
        raise _invalid(f"format must be one of {', '.join(PREVIEW_FORMATS)}")
    width = _int_param(params, "width", MIN_WIDTH, MAX_WIDTH)
    dpi = _int_param(params, "dpi", MIN_DPI, MAX_DPI)
    if width is not None and dpi is not None:
        raise _invalid("give width or dpi, not both")
    result: dict[str, Any] = {"pages": parse_pages(params.get("pages")), "format": output_format}
    if width is not None:
        result["width"] = width
    else:
        result["dpi"] = DEFAULT_DPI if dpi is None else dpi
    return result
