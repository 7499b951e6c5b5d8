"""Which LibreOffice import filter opens an upload: by its identified type (:data:`IMPORT_FILTERS`)
and, for legacy Word, Excel and PowerPoint, by the version its own header says
(:data:`LEGACY_IMPORT_FILTERS`, :func:`import_filter`). The filter is named to LibreOffice, so a
file is never sniffed into another format by LibreOffice itself; the listeners that use it are
:mod:`hypermedia.engines.documents.office`'s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from hypermedia.core.errors import PermanentJobError
from hypermedia.intake import ole
from hypermedia.intake.archives import ArchiveRejected

__all__ = ["IMPORT_FILTERS", "LEGACY_IMPORT_FILTERS", "import_filter"]


IMPORT_FILTERS: Final[dict[str, str]] = {
    "application/vnd.openxmlformats-officedocument.wordprocessingml.document": "MS Word 2007 XML",
    "application/vnd.openxmlformats-officedocument.wordprocessingml.template": "MS Word 2007 XML Template",
    "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet": "Calc MS Excel 2007 XML",
    "application/vnd.openxmlformats-officedocument.spreadsheetml.template": "Calc MS Excel 2007 XML Template",
    "application/vnd.openxmlformats-officedocument.presentationml.presentation": "Impress MS PowerPoint 2007 XML",
    "application/vnd.openxmlformats-officedocument.presentationml.slideshow": (
        "Impress MS PowerPoint 2007 XML AutoPlay"
    ),
    "application/vnd.openxmlformats-officedocument.presentationml.template": (
        "Impress MS PowerPoint 2007 XML Template"
    ),
    "application/vnd.oasis.opendocument.text": "writer8",
    "application/vnd.oasis.opendocument.text-template": "writer8_template",
    "application/vnd.oasis.opendocument.spreadsheet": "calc8",
    "application/vnd.oasis.opendocument.spreadsheet-template": "calc8_template",
    "application/vnd.oasis.opendocument.presentation": "impress8",
    "application/vnd.oasis.opendocument.presentation-template": "impress8_template",
    "application/vnd.oasis.opendocument.graphics": "draw8",
    "application/msword": "MS Word 97",
    "application/vnd.ms-excel": "MS Excel 97",
    "application/vnd.ms-powerpoint": "MS PowerPoint 97",
    "application/rtf": "Rich Text Format",
    "text/rtf": "Rich Text Format",
}
"""Identified upload type → LibreOffice import filter (names as registered in LibreOffice's
``filter/source/config/fragments/filters/*.xcu``). Its keys are
:data:`hypermedia.intake.contenttype.OFFICE_MIME_TYPES` (the gateway refuses other types for the office
operations); a type not here is ``UNSUPPORTED_FORMAT``."""

LEGACY_IMPORT_FILTERS: Final[dict[str, dict[str, str]]] = {
    ole.MSWORD: {ole.WORD_97: "MS Word 97", ole.WORD_6_95: "MS WinWord 6.0"},
    ole.MSEXCEL: {ole.EXCEL_97: "MS Excel 97", ole.EXCEL_5_95: "MS Excel 95"},
    ole.MSPOWERPOINT: {ole.POWERPOINT_97: "MS PowerPoint 97"},
}
"""Legacy upload type → the format its header says (:func:`hypermedia.intake.ole.legacy_format`) → the
LibreOffice import filter for it: an allowlist, so a file chooses among these and nothing else
(it never reaches LibreOffice's own type detection, which could sniff it into another format).

- Word 6.0/95 (FIB ``wIdent`` 0xA5DC) needs LibreOffice's Word 6 reader: "MS Word 97" reads
  the FIB as Word 97's and refuses the file (issue 15: ``PARSE_ERROR``). LibreOffice's table of
  ``nFib`` by reader (``WW8Fib``) gives 101–105 to its Word 6 reader ("MS WinWord 6.0", user data
  ``CWW6``, "6 stands for 6 or 7") and 105 alone to Word 95's ("MS Word 95", ``CWW7``), so "MS
  WinWord 6.0" is chosen for every Word 6.0 and Word 95 file (measured: it opens both, nFib 101
  and 104, with their text).
- Excel 5.0/95 (a ``Book`` stream, BIFF5/7) opens with "MS Excel 95" (BIFF5 forced); "MS Excel
  97" finds either stream itself, and reads BIFF8 (measured, LibreOffice 7.4, on a Gnumeric
  BIFF7 workbook: both give its cells).
- PowerPoint: "MS PowerPoint 97" reads 97–2003; LibreOffice has no import of PowerPoint 95."""


def import_filter(source: Path, mime_type: str) -> str:
    """The LibreOffice import filter for ``source``, an upload identified as ``mime_type``: the
    one of :data:`IMPORT_FILTERS`, and for a legacy Word, Excel or PowerPoint file the one of
    :data:`LEGACY_IMPORT_FILTERS` for the format its own header says. Reads the whole file
    (a compound file's directory is at its end).

    Raises:
        PermanentJobError: ``UNSUPPORTED_FORMAT`` for a type without an import filter, a legacy
            format LibreOffice has no filter for (named in the message), or a document encrypted
            with a password (:func:`hypermedia.intake.ole.find_encryption`; uploads are typed
            ``application/x-ole-storage`` then, this catches what was stored before);
            ``PARSE_ERROR`` for a legacy file that is not a compound file olefile reads, or
            whose main stream is another family's.
    """
    default = IMPORT_FILTERS.get(mime_type)
    if default is None:
        raise PermanentJobError(f"{mime_type} documents cannot be converted to PDF.", "UNSUPPORTED_FORMAT")
    filters = LEGACY_IMPORT_FILTERS.get(mime_type)
    if filters is None:
        return default
    data = source.read_bytes()
    if not ole.is_ole(data):
        raise PermanentJobError("LibreOffice could not open the document.", "PARSE_ERROR")
    try:
        found, encryption = ole.legacy_format(data)
    except ArchiveRejected:
        raise PermanentJobError("LibreOffice could not open the document.", "PARSE_ERROR") from None
    if encryption:
        raise PermanentJobError(
            f"The document is encrypted with a password ({encryption}); password-protected office "
            "documents are not supported.",
            "UNSUPPORTED_FORMAT",
        )
    chosen = filters.get(found)
    if chosen is None:
        raise PermanentJobError(f"{found} documents cannot be converted to PDF.", "UNSUPPORTED_FORMAT")
    return chosen
