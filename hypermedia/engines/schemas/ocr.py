"""Params schema of the ``ocr`` operation, as :func:`hypermedia.engines.ocr.params.validate_params`
checks it (its limits, outputs and language form imported; the module is pure Python, never
tesseract)."""

from __future__ import annotations

from typing import Any, Final

from hypermedia.engines.ocr.params import (
    DEFAULT_ESCALATE,
    DEFAULT_LANGUAGES,
    DEFAULT_OUTPUTS,
    LANGUAGE_CODE,
    MAX_LANGUAGES,
    MAX_OCR_PAGES,
    NOT_RECOGNITION_MODELS,
    OUTPUTS,
    TEXT_LAYER_MIN_CHARS,
)
from hypermedia.engines.schemas.common import INTEGERS, flag, operation, pages, whole
from hypermedia.engines.schemas.documents import PAGES_ALSO_CHECKED


def _languages() -> dict[str, Any]:
    code = LANGUAGE_CODE.pattern
    models = sorted(NOT_RECOGNITION_MODELS)
    return {
        "type": ["array", "string", "null"],
        "items": {"type": "string", "pattern": whole(code), "not": {"enum": models}},
        "minItems": 1,
        "pattern": whole(f"{code}(?:\\+{code})*"),
        # The string form names no model that is not a language either.
        "not": {"type": "string", "pattern": f"(?:^|\\+)(?:{'|'.join(models)})(?:\\+|$)"},
        "description": 'Tesseract languages to read with, as a list (["eng", "deu"]) or joined '
        'with + ("eng+deu"); the first is the primary one. A code is a traineddata name (eng, '
        f"chi_sim) or a script model (script/Latin); not {', '.join(models)}. At most {MAX_LANGUAGES} "
        "different languages, each installed on the ocrworkers (GET /v1/ocr/languages).",
        "default": list(DEFAULT_LANGUAGES),
    }


def _ocr() -> dict[str, Any]:
    return operation(
        "ocr",
        "The text of an image or PDF read by tesseract (pages read poorly read again by a second "
        "engine when escalate is true), as the outputs asked for.",
        {
            "languages": _languages(),
            "pages": pages(
                "The pages (of a PDF) or frames (of a multi-page image) to read, 1-based: a list "
                f'([1, 3]) or a string of numbers and ranges ("1-3", "1,4,6-8"); at most {MAX_OCR_PAGES} '
                "different pages. Absent: every page.",
                None,
            ),
            "outputs": {
                "type": ["array", "null"],
                "items": {"type": "string", "enum": list(OUTPUTS)},
                "minItems": 1,
                "description": "What to return: text (plain UTF-8), words (JSON with boxes and "
                "confidences), hocr, searchable_pdf (the pages with an invisible text layer), tables "
                "(turns table_detection on).",
                "default": list(DEFAULT_OUTPUTS),
            },
            "table_detection": flag(
                "Find tables and return them, as rows and cells, in the tables output (asking for "
                "that output turns this on too).",
                False,
            ),
            "skip_text_pages": flag(
                "A PDF page that already has a text layer (at least "
                f"{TEXT_LAYER_MIN_CHARS} characters other than white space) is not OCRed: its text "
                "comes from the layer. Ignored for images.",
                False,
            ),
            "escalate": flag(
                "Read a page tesseract reads with low confidence again with a second engine, and "
                "keep the better reading (charged per page escalated).",
                DEFAULT_ESCALATE,
            ),
        },
        also_checked=[
            f"at most {MAX_LANGUAGES} different languages",
            "every language is installed on the ocrworkers (GET /v1/ocr/languages lists them; "
            "until one has reported its languages, only their form is checked)",
            f"at most {MAX_OCR_PAGES} different pages",
            PAGES_ALSO_CHECKED,
            INTEGERS,
        ],
    )


SCHEMAS: Final[dict[str, dict[str, Any]]] = {"ocr": _ocr()}
"""Operation name → JSON Schema of its params."""
