"""What the gateway accepts as office input and what the docworker can open must be one list."""

from __future__ import annotations

from hypermedia.engines.documents.filters import IMPORT_FILTERS
from hypermedia.intake import contenttype


def test_every_office_type_has_an_import_filter_and_no_other_type_does() -> None:
    assert set(IMPORT_FILTERS) == contenttype.OFFICE_MIME_TYPES
    assert all(contenttype.kind(mime) == "office" for mime in IMPORT_FILTERS)


def test_office_types_without_a_filter_are_not_office() -> None:
    for mime in (
        "application/vnd.oasis.opendocument.formula",
        "application/vnd.oasis.opendocument.chart",
        "application/vnd.oasis.opendocument.database",
        "application/vnd.oasis.opendocument.text-flat-xml",
        "application/vnd.ms-word.document.macroEnabled.12",
        "application/x-ole-storage",
    ):
        assert contenttype.kind(mime) == "other", mime
