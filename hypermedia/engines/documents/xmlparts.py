"""One XML part of an office package read for the linked-content check
(:mod:`hypermedia.engines.documents.links`): what counts as external in ODF, OOXML, SVG and
SpreadsheetML markup (:class:`XmlPart`: linked URLs and paths, ``file:`` URLs in any attribute,
DDE links, CSS ``url(`` in SVG styles, Word fields), OOXML external relationships and which
elements name them (:class:`Relationships`), and expat set up to refuse DTDs with an internal
subset (:func:`parse`).
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final
from xml.parsers import expat

from hypermedia.engines.documents.fields import Fields
from hypermedia.engines.documents.linkerrors import MalformedDocument

__all__ = [
    "DDE_ELEMENTS",
    "HYPERLINK_ELEMENTS",
    "HYPERLINK_RELATIONSHIP_TYPES",
    "ODF_HYPERLINK_ELEMENTS",
    "Relationships",
    "XmlPart",
    "parse",
]


_XLINK: Final = "http://www.w3.org/1999/xlink"
_TEXT: Final = "urn:oasis:names:tc:opendocument:xmlns:text:1.0"
_DRAW: Final = "urn:oasis:names:tc:opendocument:xmlns:drawing:1.0"
_OFFICE: Final = "urn:oasis:names:tc:opendocument:xmlns:office:1.0"
_TABLE: Final = "urn:oasis:names:tc:opendocument:xmlns:table:1.0"
_FORM: Final = "urn:oasis:names:tc:opendocument:xmlns:form:1.0"
_SCRIPT: Final = "urn:oasis:names:tc:opendocument:xmlns:script:1.0"
_PRESENTATION: Final = "urn:oasis:names:tc:opendocument:xmlns:presentation:1.0"
_SVG: Final = "http://www.w3.org/2000/svg"
_W: Final = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
_SML: Final = "http://schemas.openxmlformats.org/spreadsheetml/2006/main"

ODF_HYPERLINK_ELEMENTS: Final = frozenset(
    {
        (_TEXT, "a"),
        (_DRAW, "a"),
        (_SVG, "a"),
        (_TEXT, "bookmark-ref"),
        (_OFFICE, "event-listener"),
        (_SCRIPT, "event-listener"),
        (_PRESENTATION, "event-listener"),
        (_TEXT, "alphabetical-index-mark"),
    }
)
"""Elements whose ``xlink:href`` is a link the reader follows on request, not content loaded
with the document (event listeners run macros, which are refused at upload and never run)."""

DDE_ELEMENTS: Final = frozenset(
    {
        (_OFFICE, "dde-source"),
        (_TEXT, "dde-connection-decl"),
        (_TABLE, "dde-link"),
        (_SML, "ddeLink"),
        (_SML, "oleLink"),
    }
)
"""Elements that link content from another program or file by DDE or OLE (ODF 1.2 Part 1 §14.6,
§9.8; ECMA-376 Part 1 §18.14): always external."""

_URL_ATTRIBUTES: Final = frozenset({(_XLINK, "href"), (_FORM, "image-data"), (_SVG, "href"), (_SVG, "src")})
_LOCAL_URL_ATTRIBUTES: Final = {
    _SVG: frozenset({"href", "src"}),
    _SML: frozenset({"url", "sourceFile", "odcFile"}),
}
"""Attributes without a namespace that hold a URL or path, by their element's namespace: SVG 2's
``href``, SpreadsheetML data connections' web query ``url``, text import ``sourceFile`` and
connection file ``odcFile`` (ECMA-376 Part 1 §18.13)."""
_SCHEME: Final = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
_FILE_URL: Final = re.compile(r"(?<![A-Za-z0-9+.-])file:", re.IGNORECASE)
_CSS_URL: Final = re.compile(r"url\(\s*['\"]?([^'\")]*)|@import\s+['\"]([^'\"]*)", re.IGNORECASE)


_DML: Final = "http://schemas.openxmlformats.org/drawingml/2006/main"
_RELATIONSHIPS: Final = frozenset(
    {
        "http://schemas.openxmlformats.org/officeDocument/2006/relationships",
        "http://purl.oclc.org/ooxml/officeDocument/relationships",
    }
)
"""The namespaces of the attributes that name a relationship (``r:id``, ``r:embed``, ``r:link``,
``r:pict``, ``r:dm``…), transitional and strict."""
_VML_OFFICE: Final = "urn:schemas-microsoft-com:office:office"

HYPERLINK_RELATIONSHIP_TYPES: Final = frozenset(
    {
        "http://schemas.openxmlformats.org/officeDocument/2006/relationships/hyperlink",
        "http://purl.oclc.org/ooxml/officeDocument/relationships/hyperlink",
    }
)
"""The one relationship type whose external target may stay (ECMA-376 Part 1 §15.3,
transitional and strict), when only :data:`HYPERLINK_ELEMENTS` refer to it."""

HYPERLINK_ELEMENTS: Final = frozenset(
    {
        (_W, "hyperlink"),
        ("http://purl.oclc.org/ooxml/wordprocessingml/main", "hyperlink"),
        (_SML, "hyperlink"),
        ("http://purl.oclc.org/ooxml/spreadsheetml/main", "hyperlink"),
        *(
            (namespace, name)
            for namespace in (_DML, "http://purl.oclc.org/ooxml/drawingml/main")
            for name in ("hlinkClick", "hlinkHover", "hlinkMouseOver")
        ),
    }
)
"""OOXML elements whose relationship is a link the reader follows on request: WordprocessingML
``w:hyperlink``, SpreadsheetML ``hyperlink``, DrawingML ``a:hlinkClick``, ``a:hlinkHover`` and
``a:hlinkMouseOver`` (what Word, Excel, PowerPoint and LibreOffice write for hyperlinks, on text,
cells, pictures and shapes). A hyperlink relationship that any other element names (an
``a:blip r:link``, a ``v:imagedata r:id``) is content loaded from outside."""


def _is_external(href: str, folder: str = "") -> bool:
    """Whether ``href`` in a part in ``folder`` (``""`` at the package's top, ``"Object 1"``…)
    points outside the package."""
    href = href.strip()
    if not href or href.startswith("#") or href.lower().startswith("data:"):
        return False
    if _SCHEME.match(href) or href.startswith(("/", "\\")):
        return True
    joined = posixpath.normpath(posixpath.join(folder or ".", href.replace("\\", "/")))
    return joined == ".." or joined.startswith("../")


def _element(name: str) -> tuple[str, str]:
    namespace, _, local = name.rpartition(" ")
    return namespace, local


@dataclass
class XmlPart:
    """What one XML part holds: the first external reference, its Word fields, and for OOXML the
    relationships it declares (a ``.rels`` part) or names (any other)."""

    name: str
    folder: str
    rels: bool
    found: str | None = None
    in_instruction: bool = False
    in_deleted_instruction: bool = False
    in_text: bool = False
    in_style: bool = False

    def __post_init__(self) -> None:
        self.fields = Fields()
        self.hyperlinks: dict[str, str] = {}
        """In a ``.rels`` part: id → target of each external hyperlink relationship."""
        self.named: dict[str, str] = {}
        """Relationship id → the first element not a hyperlink that names it (any attribute in
        the relationships namespace, or VML's ``o:relid``)."""

    def start(self, name: str, attrs: dict[str, str]) -> None:
        if self.found is not None:
            return
        element = _element(name)
        self.in_instruction = element == (_W, "instrText")
        self.in_deleted_instruction = element == (_W, "delInstrText")
        self.in_text = element == (_W, "t")
        self.in_style = element[1] == "style" and element[0] in {_SVG, ""}
        if self.rels:
            if element[1] == "Relationship" and attrs.get("TargetMode", "").strip().lower() == "external":
                kind, target = attrs.get("Type", ""), attrs.get("Target", "")
                if kind in HYPERLINK_RELATIONSHIP_TYPES:
                    self.hyperlinks.setdefault(attrs.get("Id", ""), target)
                else:
                    self.found = f"an external {kind.rsplit('/', 1)[-1]} ({_clip(target)})"
            return
        if element in DDE_ELEMENTS:
            self.found = f"a DDE link ({element[1]})"
            return
        if element not in HYPERLINK_ELEMENTS:
            for key, value in attrs.items():
                attribute = _element(key)
                if attribute[0] in _RELATIONSHIPS or attribute == (_VML_OFFICE, "relid"):
                    self.named.setdefault(value, element[1])
        if element == (_W, "fldSimple"):
            self.fields.begin()
            self.fields.text(attrs.get(f"{_W} instr", ""))
            self.fields.separate()
        elif element == (_W, "fldChar"):
            kind = attrs.get(f"{_W} fldCharType", "")
            if kind == "begin":
                self.fields.begin()
            elif kind == "separate":
                self.fields.separate()
            elif kind == "end":
                self.fields.end()
        if element in ODF_HYPERLINK_ELEMENTS:
            return
        for key, value in attrs.items():
            attribute = _element(key)
            local_url = attribute[0] == "" and attribute[1] in _LOCAL_URL_ATTRIBUTES.get(element[0], ())
            if (attribute in _URL_ATTRIBUTES or local_url) and _is_external(value, self.folder):
                self.found = f"a linked {element[1]} ({_clip(value)})"
                return
            if _FILE_URL.search(value):
                self.found = f"a file URL in {element[1]}/@{attribute[1]} ({_clip(value)})"
                return

    def end(self, name: str) -> None:
        self.in_instruction = self.in_deleted_instruction = self.in_text = self.in_style = False
        if _element(name) == (_W, "fldSimple"):
            self.fields.end()

    def text(self, data: str) -> None:
        if self.in_instruction and not self.fields.open:
            self.fields.begin()  # an instruction without its begin mark is judged all the same
        if self.in_instruction or self.in_text:
            self.fields.text(data)  # a result's text (w:t) is the instruction of a field around it
        elif self.in_deleted_instruction:
            self.fields.text(data, evaluated=False)
        elif self.in_style and self.found is None:
            for match in _CSS_URL.finditer(data):
                target = match.group(1) or match.group(2) or ""
                if _is_external(target, self.folder):
                    self.found = f"a linked style sheet resource ({_clip(target)})"
                    return


@dataclass
class Relationships:
    """A package's external hyperlink relationships (by the part they belong to) and the
    relationship ids its parts name from elements that are not hyperlinks; part names are
    compared case-insensitively, as OPC does (ECMA-376 Part 2 §9.1.1.1)."""

    hyperlinks: dict[str, dict[str, str]]
    named: dict[str, dict[str, str]]

    def add(self, part: XmlPart) -> None:
        if part.rels:
            folder, base = posixpath.split(part.name)
            if posixpath.basename(folder) == "_rels" and base.lower().endswith(".rels"):
                source = posixpath.join(posixpath.dirname(folder), base[: -len(".rels")])
                self.hyperlinks.setdefault(source.casefold(), {}).update(part.hyperlinks)
        elif part.named:
            self.named.setdefault(part.name.casefold(), {}).update(part.named)

    def misused(self) -> str | None:
        """The first external hyperlink relationship that an element not a hyperlink names."""
        for source, hyperlinks in self.hyperlinks.items():
            named = self.named.get(source, {})
            for rid, target in hyperlinks.items():
                if rid in named:
                    return f"an external hyperlink used as {named[rid]} ({_clip(target)}) in {source}"
        return None


def parse(
    data: bytes,
    start: Callable[[str, dict[str, str]], None],
    end: Callable[[str], None],
    text: Callable[[str], None],
) -> None:
    """Expat over ``data`` with the three handlers (names as ``"namespace local"``); no internal
    DTD subset, no entities (a DOCTYPE that only names an external DTD passes: it is never
    loaded). A part whose prefixes are bound by its DTD alone (OpenOffice.org's wizard templates
    have manifests so: ``<manifest:manifest>`` and no ``xmlns``) is read again without namespace
    processing, its prefixes taken by their conventional names (:data:`_CONVENTIONAL_PREFIXES`)."""
    try:
        _expat(data, start, end, text, namespaces=True)
    except expat.ExpatError as exc:
        if exc.code != expat.errors.codes[expat.errors.XML_ERROR_UNBOUND_PREFIX]:
            raise
        _expat(
            data,
            lambda name, attrs: start(_by_prefix(name), {_by_prefix(k): v for k, v in attrs.items()}),
            lambda name: end(_by_prefix(name)),
            text,
            namespaces=False,
        )


_CONVENTIONAL_PREFIXES: Final = {
    "xlink": _XLINK,
    "text": _TEXT,
    "draw": _DRAW,
    "office": _OFFICE,
    "table": _TABLE,
    "form": _FORM,
    "script": _SCRIPT,
    "presentation": _PRESENTATION,
    "svg": _SVG,
    "w": _W,
}


def _by_prefix(name: str) -> str:
    prefix, _, local = name.rpartition(":")
    return f"{_CONVENTIONAL_PREFIXES.get(prefix, prefix)} {local}" if prefix else local


def _expat(
    data: bytes,
    start: Callable[[str, dict[str, str]], None],
    end: Callable[[str], None],
    text: Callable[[str], None],
    *,
    namespaces: bool,
) -> None:
    parser = expat.ParserCreate(namespace_separator=" " if namespaces else None)
    parser.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)
    parser.StartDoctypeDeclHandler = _refuse_internal_subset
    parser.EntityDeclHandler = _refuse_dtd
    parser.StartElementHandler = start
    parser.EndElementHandler = end
    parser.CharacterDataHandler = text
    parser.Parse(data, True)


def _refuse_dtd(*_: object) -> None:
    raise MalformedDocument("a document type declaration")


def _refuse_internal_subset(_name: str, _system: str | None, _public: str | None, internal: bool) -> None:
    """A DOCTYPE that only names a DTD (OpenOffice.org 2–3 wrote ``<!DOCTYPE manifest:manifest
    PUBLIC … "Manifest.dtd">`` into every manifest, SVG editors write the SVG 1.1 one) declares
    nothing: expat never loads it. One with an internal subset (entities) is refused."""
    if internal:
        _refuse_dtd()


def _clip(value: str, limit: int = 80) -> str:
    return value if len(value) <= limit else value[:limit] + "…"
