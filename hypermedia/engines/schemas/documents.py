"""Params schemas of the document operations, as
:func:`hypermedia.engines.documents.params.validate_params` checks them (its limits imported)."""

from __future__ import annotations

from typing import Any, Final

from hypermedia.engines.documents.params import (
    DEFAULT_DPI,
    MAX_DOCUMENT_PAGES,
    MAX_DPI,
    MAX_PREVIEW_PAGES,
    MAX_WIDTH,
    MIN_DPI,
    MIN_WIDTH,
    PREVIEW_FORMATS,
)
from hypermedia.engines.schemas.common import INTEGERS, choice, given, integer, operation, pages

PASSWORD: Final = (
    "An encrypted PDF's password is sent as password beside these params; the gateway takes it "
    "out (and keeps it out of the job) before the params are checked, so it is not one of them."
)

PAGES_ALSO_CHECKED: Final = f"each page number in a pages string is from 1 to {MAX_DOCUMENT_PAGES:,}, and no range runs backwards (3-1)"


def _none(title: str, description: str, note: str) -> dict[str, Any]:
    return operation(title, f"{description} Takes no params: {{}}. {note}")


def _pdf_preview() -> dict[str, Any]:
    return operation(
        "pdf_preview",
        "One image per requested page of a PDF (preview_p1, preview_p2, …), /Rotate and CropBox "
        "applied, forms and annotations drawn, on white. Give width or dpi, not both; neither means "
        f"dpi {DEFAULT_DPI}. {PASSWORD}",
        {
            "pages": pages(
                "The pages to render (1-based): a list of page numbers ([1, 3]) or a string of "
                f'numbers and ranges ("1-3", "1,4,6-8"); at most {MAX_PREVIEW_PAGES} different pages.',
                [1],
            ),
            "width": integer(
                "Width of every rendered page in pixels; the height follows the page's aspect ratio.",
                MIN_WIDTH,
                MAX_WIDTH,
            ),
            "dpi": integer(
                "Resolution in pixels per inch (a page of w × h points is w × dpi / 72 pixels "
                f"wide); {DEFAULT_DPI} when width is not given either.",
                MIN_DPI,
                MAX_DPI,
                DEFAULT_DPI,
            ),
            "format": choice("Image format of the previews.", PREVIEW_FORMATS, "webp"),
        },
        also_checked=[f"at most {MAX_PREVIEW_PAGES} different pages", PAGES_ALSO_CHECKED, INTEGERS],
        rules={"not": given("width", "dpi")},
    )


SCHEMAS: Final[dict[str, dict[str, Any]]] = {
    "pdf_info": _none(
        "pdf_info",
        "A PDF's page count and page sizes, version, producer, encryption, text layer and forms, as JSON.",
        PASSWORD,
    ),
    "pdf_preview": _pdf_preview(),
    "text_extract": _none(
        "text_extract",
        "The text layer of a PDF (or of an office document, converted to PDF first), as plain "
        "text and as JSON per page.",
        f"{PASSWORD} A password opens PDFs only.",
    ),
    "office_to_pdf": _none(
        "office_to_pdf",
        "An office document converted to PDF by LibreOffice.",
        "Takes no password either: password-protected office documents are not supported.",
    ),
}
"""Operation name → JSON Schema of its params."""
