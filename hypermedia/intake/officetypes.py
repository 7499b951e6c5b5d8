"""Office packages and flat ODF typed from inside, for :func:`hypermedia.intake.contenttype.identify`:
an OOXML package by the content type of its main part (:func:`ooxml_mime`), a flat ODF document
(one XML file) by its root element (:func:`flat_odf_mime`), and the macros a flat ODF document
may carry (:func:`find_flat_odf_macros`). Magic-byte sniffing stays in
:mod:`hypermedia.intake.contenttype`; compound files (OLE2) are typed by :mod:`hypermedia.intake.ole`.
"""

from __future__ import annotations

from xml.parsers import expat

from hypermedia.intake import archives

OOXML_MIME_BY_MAIN_PART = {
    "application/vnd.openxmlformats-officedocument.wordprocessingml.document.main+xml": (
        "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
    ),
    "application/vnd.openxmlformats-officedocument.wordprocessingml.template.main+xml": (
        "application/vnd.openxmlformats-officedocument.wordprocessingml.template"
    ),
    "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet.main+xml": (
        "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"
    ),
    "application/vnd.openxmlformats-officedocument.spreadsheetml.template.main+xml": (
        "application/vnd.openxmlformats-officedocument.spreadsheetml.template"
    ),
    "application/vnd.openxmlformats-officedocument.presentationml.presentation.main+xml": (
        "application/vnd.openxmlformats-officedocument.presentationml.presentation"
    ),
    "application/vnd.openxmlformats-officedocument.presentationml.slideshow.main+xml": (
        "application/vnd.openxmlformats-officedocument.presentationml.slideshow"
    ),
    "application/vnd.openxmlformats-officedocument.presentationml.template.main+xml": (
        "application/vnd.openxmlformats-officedocument.presentationml.template"
    ),
    # Macro-enabled: recognised so that they can be named, and always refused at upload.
    "application/vnd.ms-word.document.macroenabled.main+xml": "application/vnd.ms-word.document.macroEnabled.12",
    "application/vnd.ms-word.template.macroenabledtemplate.main+xml": (
        "application/vnd.ms-word.template.macroEnabled.12"
    ),
    "application/vnd.ms-excel.sheet.macroenabled.main+xml": "application/vnd.ms-excel.sheet.macroEnabled.12",
    "application/vnd.ms-excel.template.macroenabled.main+xml": "application/vnd.ms-excel.template.macroEnabled.12",
    "application/vnd.ms-excel.addin.macroenabled.main+xml": "application/vnd.ms-excel.addin.macroEnabled.12",
    "application/vnd.ms-excel.sheet.binary.macroenabled.main": (
        "application/vnd.ms-excel.sheet.binary.macroEnabled.12"
    ),
    "application/vnd.ms-powerpoint.presentation.macroenabled.main+xml": (
        "application/vnd.ms-powerpoint.presentation.macroEnabled.12"
    ),
    "application/vnd.ms-powerpoint.slideshow.macroenabled.main+xml": (
        "application/vnd.ms-powerpoint.slideshow.macroEnabled.12"
    ),
    "application/vnd.ms-powerpoint.template.macroenabled.main+xml": (
        "application/vnd.ms-powerpoint.template.macroEnabled.12"
    ),
    "application/vnd.ms-powerpoint.addin.macroenabled.main+xml": (
        "application/vnd.ms-powerpoint.addin.macroEnabled.12"
    ),
}
"""Content type of an OOXML package's main part (lowercase, as :func:`hypermedia.intake.archives.package_types`
returns it) → the MIME type of the file (ECMA-376 Part 1 §11–13 and [MS-OFFMACRO2] for the
macro-enabled variants; file types as registered with IANA and in Office's MIME map)."""


def ooxml_mime(types: archives.PackageTypes) -> str | None:
    """The file MIME type of an OOXML package from its declared main part (overrides first), or
    None when no known main part is declared."""
    for content_type in types.all_types():
        if content_type in OOXML_MIME_BY_MAIN_PART:
            return OOXML_MIME_BY_MAIN_PART[content_type]
    return None


ODF_OFFICE_NS = "urn:oasis:names:tc:opendocument:xmlns:office:1.0"
_ODF_SCRIPT_NS = "urn:oasis:names:tc:opendocument:xmlns:script:1.0"
_OOO_NS = "http://openoffice.org/2004/office"
_OOO_SCRIPT_NS = "http://openoffice.org/2000/script"
_ODF_NS_MARKERS = tuple(ODF_OFFICE_NS.encode(codec) for codec in ("utf-8", "utf-16-le", "utf-16-be"))

FLAT_ODF_MIME_BY_DECLARED = {
    "application/vnd.oasis.opendocument.text": "application/vnd.oasis.opendocument.text-flat-xml",
    "application/vnd.oasis.opendocument.spreadsheet": "application/vnd.oasis.opendocument.spreadsheet-flat-xml",
    "application/vnd.oasis.opendocument.presentation": (
        "application/vnd.oasis.opendocument.presentation-flat-xml"
    ),
    "application/vnd.oasis.opendocument.graphics": "application/vnd.oasis.opendocument.graphics-flat-xml",
}
"""Flat ODF (ODF 1.2 Part 1: the whole document as one XML file whose root element is
``office:document``; ``.fodt``, ``.fods``, ``.fodp``, ``.fodg``): the ``office:mimetype`` its root
declares → its MIME type (the names of freedesktop's shared-mime-info; none is registered with
IANA).

**Decision.** Flat ODF is typed as such (so the record says what it is, and macros in it are refused
like those of packaged ODF, :func:`find_flat_odf_macros`) but is not an office *kind*
(:func:`~hypermedia.intake.contenttype.kind`): the docworker has no import filter for it yet. A file is typed flat ODF only when
it parses completely (expat, no DTD): one whose head looks like flat ODF but that does not parse,
or has a DOCTYPE, keeps puremagic's type (``application/xml``), which no operation opens."""

_FLAT_ODF_MACRO_ELEMENTS = {
    (_OOO_NS, "library-linked"): "ooo:library-linked",
    (_OOO_NS, "module"): "ooo:module",
    (_OOO_NS, "source-code"): "ooo:source-code",
    (_OOO_SCRIPT_NS, "module"): "script:module",
    (_ODF_SCRIPT_NS, "event-listener"): "script:event-listener",
}
"""Elements that are macros, or bind an event to one, wherever they are in a flat ODF document:
LibreOffice writes a document's Basic modules into ``office:scripts`` as
``ooo:libraries/ooo:library-embedded/ooo:module/ooo:source-code`` (or links a library with
``ooo:library-linked``); packaged ODF keeps them as ``script:module`` files under ``Basic/``;
``script:event-listener`` (ODF 1.2 Part 1) runs a script on a document or control event."""

_FLAT_ODF_SCRIPTS_CONTAINERS = frozenset(
    {
        (ODF_OFFICE_NS, "script"),
        (_OOO_NS, "libraries"),
        (_OOO_NS, "library-embedded"),
        (ODF_OFFICE_NS, "event-listeners"),
    }
)
"""What ``office:scripts`` may hold in a document without macros: LibreOffice writes
``<office:script script:language="ooo:Basic"><ooo:libraries/></office:script>`` into every flat
file it saves, and an empty ``<ooo:library-embedded ooo:name="Standard"/>`` inside it for a
document it read from a Word file (measured, LibreOffice 7.4; its packaged ODF then has no
``Basic/`` folder at all)."""


class _XMLRefused(Exception):
    """A DOCTYPE or an entity declaration: flat ODF has neither (and no entity may expand)."""


class _Stop(Exception):
    pass


def _expat_parser() -> expat.XMLParserType:
    parser = expat.ParserCreate(namespace_separator=" ")

    def refuse(*_args: object) -> None:
        raise _XMLRefused

    parser.StartDoctypeDeclHandler = refuse
    parser.EntityDeclHandler = refuse
    return parser


def _split(name: str) -> tuple[str, str]:
    namespace, _, local = name.rpartition(" ")
    return namespace, local


def flat_odf_mime(head: bytes) -> str | None:
    """The flat ODF type (:data:`FLAT_ODF_MIME_BY_DECLARED`) of XML content starting with ``head``
    whose root element is ``office:document`` (in the ODF office namespace) declaring a known
    ``office:mimetype``; None for anything else, including XML with a DOCTYPE. Only the head is
    parsed (expat, until the root's start tag): :func:`~hypermedia.intake.contenttype.identify` parses the whole file."""
    if not any(marker in head for marker in _ODF_NS_MARKERS):
        return None
    parser = _expat_parser()
    root: list[tuple[str, dict[str, str]]] = []

    def start(name: str, attrs: dict[str, str]) -> None:
        root.append((name, attrs))
        raise _Stop

    parser.StartElementHandler = start
    try:
        parser.Parse(head, False)
    except _Stop:
        pass
    except (expat.ExpatError, _XMLRefused, ValueError):
        return None
    if not root or _split(root[0][0]) != (ODF_OFFICE_NS, "document"):
        return None
    return FLAT_ODF_MIME_BY_DECLARED.get(root[0][1].get(f"{ODF_OFFICE_NS} mimetype", ""))


class NotFlatODF(ValueError):
    """The document does not parse as XML without a DOCTYPE (:func:`find_flat_odf_macros`)."""


class _MacrosFound(Exception):
    pass


def find_flat_odf_macros(content: bytes) -> str | None:
    """What makes a flat ODF document carry macros, or None; the whole file is parsed (expat, as a
    stream of events: nothing is kept, no DTD, no entity).

    Args:
        content: the whole file; :func:`flat_odf_mime` of its start is not None.

    Returns:
        A short description for the refusal's message: an element of
        :data:`_FLAT_ODF_MACRO_ELEMENTS` anywhere, any element inside ``office:scripts`` other than
        the empty containers LibreOffice writes (:data:`_FLAT_ODF_SCRIPTS_CONTAINERS`), or text
        inside ``office:script`` (inline script source). Parsing stops at the first finding.

    Raises:
        NotFlatODF: the file is not well-formed XML, or has a DOCTYPE or an entity declaration,
            before anything was found.
    """
    parser = _expat_parser()
    depth = 0
    scripts_depth = 0  # depth of the open office:scripts element, 0 outside one
    script_depth = 0  # depth of the open office:script element inside it, 0 outside one

    def start(name: str, _attrs: dict[str, str]) -> None:
        nonlocal depth, scripts_depth, script_depth
        depth += 1
        key = _split(name)
        if key in _FLAT_ODF_MACRO_ELEMENTS:
            raise _MacrosFound(_FLAT_ODF_MACRO_ELEMENTS[key])
        if scripts_depth and key not in _FLAT_ODF_SCRIPTS_CONTAINERS:
            raise _MacrosFound(f"{key[1]} in office:scripts")
        if key == (ODF_OFFICE_NS, "scripts") and not scripts_depth:
            scripts_depth = depth
        elif key == (ODF_OFFICE_NS, "script") and scripts_depth and not script_depth:
            script_depth = depth

    def end(_name: str) -> None:
        nonlocal depth, scripts_depth, script_depth
        if depth == script_depth:
            script_depth = 0
        if depth == scripts_depth:
            scripts_depth = 0
        depth -= 1

    def text(data: str) -> None:
        if script_depth and data.strip():
            raise _MacrosFound("script source in office:script")

    parser.StartElementHandler = start
    parser.EndElementHandler = end
    parser.CharacterDataHandler = text
    try:
        parser.Parse(content, True)
    except _MacrosFound as found:
        return f"flat ODF macros ({found})"
    except (expat.ExpatError, _XMLRefused, ValueError):
        raise NotFlatODF("the document is not XML without a DTD") from None
    return None


FLAT_ODF_HEAD_BYTES = 64 * 1024
"""How much of an XML file :func:`~hypermedia.intake.contenttype.identify` gives :func:`flat_odf_mime`: the root start tag of a
flat file LibreOffice writes declares about 40 namespaces (2–3 KB), and may declare more."""
