"""Find what in an office document would make LibreOffice load content from outside the document
(a file on the host, a URL): checked by :class:`hypermedia.engines.documents.office.OfficePool` before a
listener opens the document, which is then refused with ``LINKED_CONTENT_NOT_ALLOWED``.

Why a check of our own: LibreOffice's settings (``UpdateDocMode`` NO_UPDATE, links from untrusted
documents blocked) stop most links but not all. Measured with LibreOffice 7.4 by the hostile
review: an RTF ``INCLUDEPICTURE`` field and an ODT paragraph ``style:background-image`` with a
``file://`` URL drew a host image (or the pages of a host PDF or SVG) into the output, and with an
``http://`` URL fetched it when the listener has a network. Hyperlinks (``text:a``, OOXML
hyperlink relationships named by hyperlink elements, ``HYPERLINK`` fields) are never followed by
a conversion and stay allowed. Since issue
14 the check is the first of two layers: the listener's Landlock view
(:func:`hypermedia.engines.documents.office.listener_view`) holds no host file to load.

**Every part is read.** A package is walked as LibreOffice may render it, not by a list of part
names (issue 14: a linked image in an embedded object's own ``Object 1/content.xml`` reached the
PDF past a check of ``content.xml`` and ``styles.xml``). In a zip package (ODF, OOXML) every
entry is sniffed by its first bytes, whatever its name (:func:`_kind`; one that starts with
white space only is read on): XML (``<`` in UTF-8 or UTF-16, as an XML reader detects it: content,
styles, meta, settings, manifest, embedded objects at any depth, charts,
headers, footers, notes, comments, glossary, custom XML, SVG pictures, ``.rels``) is parsed; a
zip (an embedded ``.docx``/``.xlsx``/``.odt``…) or an OLE compound file (``oleObject*.bin``,
``Object N`` in ODF, ``ObjectReplacements`` that are not pictures) is walked the same way, at
most :data:`MAX_NESTING` levels deep; RTF is checked as RTF; anything else (PNG, JPEG, WMF,
EMF: formats that cannot name another file) is not read. In an OLE file, every stream that is
itself a zip, compound file or RTF is walked, ``WordDocument`` is checked for fields, and a
``\\x01Ole`` stream whose flags say "linked" ([MS-OLEDS] 2.3.3) is a linked OLE object. At most
:data:`MAX_CHECKED_BYTES` are decompressed in all.

What counts as external, in any XML part:

- an ``xlink:href`` (any element but a hyperlink or a script event, :data:`ODF_HYPERLINK_ELEMENTS`;
  ``meta:template`` too), an ``href``/``src`` on an SVG element, a ``form:image-data``, a
  SpreadsheetML data connection's ``url``, ``sourceFile`` or ``odcFile``, whose
  value is not inside the package: a URL with a scheme other than ``data:``, an absolute path,
  or a relative path that leaves the package (``..`` past the part's folder; LibreOffice
  resolves it against the document's own location). ODF 1.2 Part 1 §19.910.
- any attribute of any element but a hyperlink that holds a ``file:`` URL (a formula's external
  reference ``'file:///…'#$Sheet1.A1``, a CSS ``url(file:…)`` in an SVG ``style``…), and
  ``url(`` or ``@import`` of something outside the package in an SVG ``style`` element;
- a DDE link (ODF ``office:dde-source``, ``text:dde-connection-decl``, ``table:dde-link``;
  SpreadsheetML ``ddeLink`` and ``oleLink``);
- in a ``.rels`` part, a relationship with ``TargetMode="External"`` whose type is not exactly
  the hyperlink type (:data:`HYPERLINK_RELATIONSHIP_TYPES`; ECMA-376 Part 2 §9.3), or is but is
  named by an element of its source part that is not a hyperlink (:data:`HYPERLINK_ELEMENTS`:
  LibreOffice draws an ``a:blip r:link`` to a hyperlink relationship as a linked image);
- a Word field whose instruction loads content (``INCLUDEPICTURE``, ``INCLUDETEXT``, ``IMPORT``,
  ``LINK``, ``DDE``, ``DDEAUTO``; ECMA-376 Part 1 §17.16.5) in ``w:instrText`` (the runs of one
  field joined, nested fields followed) or ``w:fldSimple/@w:instr``, in any part: the first word
  of the instruction decides (:func:`field_command`, one rule for every format).

And in the other containers:

- **RTF**: the same field instructions in every ``\\fldinst`` (nested ones too), read by a
  tokenizer as LibreOffice reads RTF (:func:`_rtf`: groups, control words and symbols, ``\\'hh``
  and ``\\uN`` escapes, destinations), not by a pattern over the bytes (issue 14: a doubled
  brace, a hex escape, a field split over groups passed the pattern), and linked objects
  (``\\objautlink``, ``\\objlink``; RTF 1.9.1 "Objects").
- **Word 97–2003**: the same field instructions between a field-begin mark (0x13) and its
  separator (0x14) or end (0x15) in the ``WordDocument`` stream, 8-bit or UTF-16 ([MS-DOC] 2.8.25).

Not covered (the Landlock view is what holds there): external references inside binary Excel
and PowerPoint records and inside an RTF's hex-encoded ``\\objdata`` (LibreOffice does not
update them on load: ``UpdateDocMode`` NO_UPDATE) and formulas such as ``WEBSERVICE`` (measured:
``Err:540``, no request made).
"""

from __future__ import annotations

import codecs
import functools
import io
import posixpath
import re
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final
from xml.parsers import expat

import olefile

from hypermedia.intake import archives, ole

__all__ = [
    "FIELD_INSTRUCTIONS",
    "HYPERLINK_ELEMENTS",
    "HYPERLINK_RELATIONSHIP_TYPES",
    "MAX_CHECKED_BYTES",
    "MAX_FIELD_NESTING",
    "MAX_NESTING",
    "MAX_RTF_NESTING",
    "CheckLimitExceeded",
    "MalformedDocument",
    "field_command",
    "find_external_content",
]

FIELD_INSTRUCTIONS: Final = frozenset({"INCLUDEPICTURE", "INCLUDETEXT", "IMPORT", "LINK", "DDE", "DDEAUTO"})
"""Word field instructions that load content from a file or another program."""

MAX_NESTING: Final = 3
"""Deepest package inside a package (a ``.docx`` holding an ``.xlsx`` holding an OLE object is 2)
that is read; a deeper one is :class:`CheckLimitExceeded`. Office writes one level; a chart or
object inside an embedded object makes two."""

MAX_CHECKED_BYTES: Final = 512 * 1024 * 1024
"""Most bytes decompressed in all by one check, over every part at every depth: the upload
checks' bound on one package (``archives.MAX_TOTAL_UNCOMPRESSED_BYTES``), which nesting could
otherwise multiply."""

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
_DOC_FIELD_MARKS: Final = re.compile("([\x13\x14\x15])")
_OLE_LINKED: Final = 0x00000001
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


MAX_FIELD_NESTING: Final = 20
"""Most fields open inside one another that the check follows (Office writes two or three: an
``IF`` around a ``MERGEFIELD``); past it the outermost is judged on the instruction text it has
and dropped, so that stray field marks in a Word 97 stream's binary parts cost nothing."""

MAX_RTF_NESTING: Final = 1000
"""Deepest RTF group nesting (``{`` inside ``{``) the check reads; deeper is
:class:`CheckLimitExceeded`. Word and LibreOffice write a few dozen at most."""

_FIELD_LEADING: Final = (
    "".join(map(chr, range(0x21)))
    + "\x7f\xa0\xad\u1680\u180e\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
    "\u200b\u200c\u200d\u2028\u2029\u202f\u205f\u2060\u3000\ufeff"
    "\"'`\\\u00ab\u00bb\u2018\u2019\u201a\u201b\u201c\u201d\u201e\u201f\u2039\u203a\uff02\uff07"
)
"""What may stand before a field's instruction word and is passed over: white space of any kind,
control characters, quotes of any kind, backslashes (LibreOffice's ``splitFieldCommand`` takes
a quoted first token and skips one leading backslash, tdf#54584)."""
_FIELD_WORD: Final = re.compile(r"[^\W\d_]+")
_FIELD_PREFIX: Final = 64
"""Characters kept of an instruction once its first one is seen: the longest instruction word
(``INCLUDEPICTURE``) is 14."""


def field_command(instruction: str) -> str | None:
    """The loading instruction (upper case, one of :data:`FIELD_INSTRUCTIONS`) that a Word field
    instruction ``instruction`` starts with, or None: the first word after white space, quotes
    and backslashes (:data:`_FIELD_LEADING`), letters only, compared without case. The one rule
    for OOXML, Word 97 and RTF fields; it takes more than Word and LibreOffice do (``\\u00a0``
    or a tab before the word, Unicode letters that upper-case to ASCII), never less."""
    match = _FIELD_WORD.match(instruction.lstrip(_FIELD_LEADING))
    if match is None:
        return None
    word = match.group().upper()
    return word if word in FIELD_INSTRUCTIONS else None


class _Field:
    """One open field: its instruction read two ways. ``evaluated`` is what Word and LibreOffice
    take as the instruction (its own text, and the result of a field nested in it); ``raw`` adds
    everything else inside (a nested field's own instruction, text of RTF destinations that the
    readers may or may not route elsewhere). Both keep :data:`_FIELD_PREFIX` characters from the
    first that is not leading (:data:`_FIELD_LEADING`)."""

    __slots__ = ("evaluated", "in_result", "raw")

    def __init__(self) -> None:
        self.raw = ""
        self.evaluated = ""
        self.in_result = False


def _keep(kept: str, text: str) -> str:
    if not kept:
        text = text.lstrip(_FIELD_LEADING)
    return kept + text[: _FIELD_PREFIX - len(kept)] if len(kept) < _FIELD_PREFIX else kept


class _Fields:
    """Word fields as a reader meets them, in any container: :meth:`begin`, instruction
    :meth:`text`, :meth:`separate` (the result follows), result :meth:`text`, :meth:`end`; fields
    nest. ``found`` is the first loading instruction (:func:`field_command`) of any field, in
    either reading of it (:class:`_Field`)."""

    def __init__(self) -> None:
        self.open: list[_Field] = []
        self.found: str | None = None

    def begin(self) -> None:
        if len(self.open) >= MAX_FIELD_NESTING:
            self._judge(self.open.pop(0))
        self.open.append(_Field())

    def text(self, text: str, *, evaluated: bool = True) -> None:
        """``text`` inside the innermost field (its instruction, or its result after
        :meth:`separate`); ``evaluated=False``: text that only the raw reading takes."""
        visible = evaluated
        for field in reversed(self.open):
            if not field.in_result:
                field.raw = _keep(field.raw, text)
                if visible:
                    field.evaluated = _keep(field.evaluated, text)
            visible = visible and field.in_result

    def separate(self) -> None:
        if self.open and not self.open[-1].in_result:
            self.open[-1].in_result = True
            self._judge(self.open[-1])

    def end(self) -> None:
        if self.open:
            field = self.open.pop()
            if not field.in_result:
                self._judge(field)

    def finish(self) -> str | None:
        """Judges the fields left open (a document may end inside one); returns ``found``."""
        while self.open:
            self.end()
        return self.found

    def _judge(self, field: _Field) -> None:
        if self.found is None:
            self.found = field_command(field.evaluated) or field_command(field.raw)


class MalformedDocument(ValueError):
    """A part this module reads is not well-formed XML or declares a DTD with an internal subset
    (entities), or a container (the document, or a package or compound file inside it) does not
    open: nothing is sure about what LibreOffice would make of it."""


class CheckLimitExceeded(MalformedDocument):
    """The document nests packages deeper than :data:`MAX_NESTING` or makes the check decompress
    more than :data:`MAX_CHECKED_BYTES`."""


def find_external_content(path: Path, mime_type: str) -> str | None:
    """What in the document at ``path`` (identified as ``mime_type`` at upload) would load content
    from outside it, or None. Reads every part of the package, and of the packages inside it (see
    the module doc); the upload checks (:mod:`hypermedia.intake.archives`) have bounded the top level's
    sizes, this check bounds the rest.

    Returns:
        A short description for the job's error message, e.g. ``"an RTF INCLUDEPICTURE field"``,
        naming the part for one inside a package (``"a linked image (file:///x) in Object 1/content.xml"``).

    Raises:
        CheckLimitExceeded: see there.
        MalformedDocument: see there.
        OSError: the file cannot be read.
    """
    if mime_type in {"application/rtf", "text/rtf"}:
        container = "rtf"
    elif mime_type in {"application/msword", "application/vnd.ms-excel", "application/vnd.ms-powerpoint"}:
        container = "ole"
    elif mime_type.startswith(_PACKAGE_TYPES):
        container = "zip"
    else:
        return None
    data = path.read_bytes()
    walker = _Walker()
    try:
        if container == "rtf":
            return _rtf(data)
        if container == "ole":
            return walker.ole(data, 0)
        with zipfile.ZipFile(io.BytesIO(data)) as package:
            return walker.package(package, 0)
    except MalformedDocument:
        raise
    except Exception as exc:  # hostile input: zipfile, expat, olefile raise many kinds of error
        raise MalformedDocument(f"{type(exc).__name__}: {exc}") from None


_PACKAGE_TYPES: Final = (
    "application/vnd.oasis.opendocument.",
    "application/vnd.openxmlformats-officedocument.",
)


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
class _XmlPart:
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
        self.fields = _Fields()
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
class _Relationships:
    """A package's external hyperlink relationships (by the part they belong to) and the
    relationship ids its parts name from elements that are not hyperlinks; part names are
    compared case-insensitively, as OPC does (ECMA-376 Part 2 §9.1.1.1)."""

    hyperlinks: dict[str, dict[str, str]]
    named: dict[str, dict[str, str]]

    def add(self, part: _XmlPart) -> None:
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


class _Walker:
    """Walks a package and every package inside it, keeping count of depth and bytes."""

    def __init__(self) -> None:
        self.checked_bytes = 0
        self.relationships = _Relationships({}, {})

    def _count(self, size: int) -> None:
        self.checked_bytes += size
        if self.checked_bytes > MAX_CHECKED_BYTES:
            raise CheckLimitExceeded(f"the document expands to more than {MAX_CHECKED_BYTES} bytes")

    def member(self, kind: str, name: str, data: bytes, depth: int) -> str | None:
        """``data``, an entry or stream named ``name`` of a container at ``depth``, as ``kind``
        (:func:`_kind`)."""
        if kind == "xml":
            return self.xml(name, data)
        if kind == "rtf":
            return _rtf(data)
        if depth + 1 > MAX_NESTING:
            raise CheckLimitExceeded(f"packages nested more than {MAX_NESTING} deep")
        if kind == "zip":
            archives.inspect(data)  # the upload checks' bounds, for the inner zip
            with zipfile.ZipFile(io.BytesIO(data)) as package:
                return self.package(package, depth + 1)
        ole.inspect(data)  # the upload checks' bounds on its directory
        return self.ole(data, depth + 1)

    def _read(self, head: bytes, size: int, read: Callable[[], bytes]) -> tuple[str, bytes] | None:
        """``(kind, content)`` of a part whose first bytes are ``head`` and whose size is
        ``size``, reading it whole (``read``, counted) only when it is one to check; a part
        whose head is all white space is read whole to decide."""
        kind = _kind(head)
        if kind is None and (size <= len(head) or not _blank(head)):
            return None
        self._count(size)
        data = read()
        kind = kind or _kind(data.lstrip(_WHITE_SPACE + b"\x00"))
        return None if kind is None else (kind, data)

    def package(self, package: zipfile.ZipFile, depth: int) -> str | None:
        outer, self.relationships = self.relationships, _Relationships({}, {})
        try:
            return self._entries(package, depth) or self.relationships.misused()
        finally:
            self.relationships = outer

    def _entries(self, package: zipfile.ZipFile, depth: int) -> str | None:
        for info in package.infolist():
            if info.is_dir() or info.file_size == 0:
                continue
            with package.open(info) as stream:
                head = stream.read(_HEAD)
            part = self._read(head, info.file_size, functools.partial(package.read, info))
            if part is None:
                continue
            found = self.member(part[0], info.filename, part[1], depth)
            if found is not None:
                return found if " in " in found else f"{found} in {info.filename}"
        return None

    def ole(self, data: bytes, depth: int) -> str | None:
        with olefile.OleFileIO(io.BytesIO(data)) as compound:
            for entry in compound.listdir(streams=True, storages=False):
                size = compound.get_size(entry)
                if size == 0:
                    continue
                with compound.openstream(entry) as stream:
                    head = stream.read(_HEAD)
                name = "/".join(entry)
                if (
                    entry[-1] == "\x01Ole"
                    and len(head) >= 8
                    and int.from_bytes(head[4:8], "little") & _OLE_LINKED
                ):
                    return "a linked OLE object"
                if entry == ["WordDocument"]:
                    self._count(size)
                    found = _word_fields(compound.openstream(entry).read())
                else:
                    part = self._read(head, size, functools.partial(_stream, compound, entry))
                    found = None if part is None else self.member(part[0], name, part[1], depth)
                if found is not None:
                    return found
        return None

    def xml(self, name: str, data: bytes) -> str | None:
        folder = posixpath.dirname(name)
        part = _XmlPart(name, folder, name.lower().endswith(".rels"))
        _parse(data, part.start, part.end, part.text)
        if part.found is not None:
            return f"{part.found} in {name}"
        self.relationships.add(part)
        # A field instruction may be split over several w:instrText runs anywhere (Word splits
        # them as it likes): the runs of one field are joined (:class:`_Fields`).
        command = part.fields.finish()
        return None if command is None else f"a Word {command} field in {name}"


_HEAD: Final = 512
_WHITE_SPACE: Final = b" \t\r\n"
_XML_ENCODINGS: Final = (
    (b"\xef\xbb\xbf", "utf-8"),
    (b"\xff\xfe", "utf-16-le"),
    (b"\xfe\xff", "utf-16-be"),
)
_EBCDIC_XML_DECLARATION: Final = b"\x4c\x6f\xa7\x94"  # "<?xm" (expat refuses EBCDIC: MalformedDocument)


def _kind(head: bytes) -> str | None:
    """What a part starting with ``head`` is to the check: ``"zip"``, ``"ole"``, ``"rtf"``,
    ``"xml"`` (``<`` after white space in UTF-8, after a byte order mark in UTF-8 or UTF-16, in
    UTF-16 without one, or EBCDIC ``<?xm``: what an XML reader detects, XML 1.0 Appendix F) or
    None (a picture, media, a font, a property set: nothing that names another file)."""
    if archives.is_zip(head[:4]):
        return "zip"
    if head.startswith(ole.SIGNATURE):
        return "ole"
    text = head.lstrip(_WHITE_SPACE)
    if text.startswith(b"{\\rtf"):
        return "rtf"
    if text.startswith(b"<") or head.startswith(_EBCDIC_XML_DECLARATION):
        return "xml"
    candidates = [*_XML_ENCODINGS]
    if head[1:2] == b"\x00":
        candidates.append((b"", "utf-16-le"))
    if head[:1] == b"\x00":
        candidates.append((b"", "utf-16-be"))
    for mark, codec in candidates:
        if head.startswith(mark) and head[len(mark) :].decode(codec, "ignore").lstrip(" \t\r\n").startswith(
            "<"
        ):
            return "xml"
    return None


def _stream(compound: olefile.OleFileIO, entry: list[str]) -> bytes:
    return bytes(compound.openstream(entry).read())


def _blank(head: bytes) -> bool:
    """Whether ``head`` is white space alone (in UTF-8 or UTF-16): the part must be read further
    to know what it is."""
    return not head.strip(_WHITE_SPACE + b"\x00")


def _parse(
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


_RTF_TOKEN: Final = re.compile(
    rb"\\([a-zA-Z]+)(-?[0-9]*) ?"  # a control word, its parameter, the space that ends it
    rb"|\\'[\r\n]*([0-9a-fA-F])[\r\n]*([0-9a-fA-F])"  # a hex escape (LibreOffice reads CR LF between)
    rb"|\\(.?)"  # a control symbol
    rb"|([{}])"
    rb"|[\r\n]+"  # ignored by readers
    rb"|([^\\{}\r\n]+)",
    re.DOTALL,
)
_RTF_SYMBOLS: Final = {
    b"~": "\xa0",
    b"_": "\u2011",
    b"\\": "\\",
    b"{": "{",
    b"}": "}",
    b"\n": " ",
    b"\r": " ",
}
"""Control symbols that stand for text (``\\~`` no-break space, ``\\_`` no-break hyphen, escaped
braces and backslash, a backslash before a line end is a paragraph); the others (``\\-``
optional hyphen, ``\\:``, ``\\|``) stand for none."""
_RTF_DESTINATIONS: Final = frozenset(
    (
        "annotation atnauthor atndate atnicn atnid atnparent atnref atntime atrfend atrfstart "
        "author background bkmkend bkmkstart blipuid buptim category colorschememapping colortbl "
        "comment company creatim datafield datastore defchp defpap do doccomm docvar dptxbxtext "
        "ebcend ebcstart factoidname falt fchars ffdeftext ffentrymcr ffexitmcr ffformat "
        "ffhelptext ffl ffname ffstattext file filetbl fldtype fname fontemb fontfile fonttbl "
        "footer footerf footerl footerr footnote formfield ftncn ftnsep ftnsepc g generator "
        "gridtbl header headerf headerl headerr hl hlfr hlinkbase hlloc hlsrc hsv htmltag info "
        "keycode keywords latentstyles lchars levelnumbers leveltext lfolevel linkval list "
        "listlevel listname listoverride listoverridetable listpicture liststylename listtable "
        "listtext lsdlockedexcept macc maccPr mailmerge manager mhtmltag mmath mmathPr "
        "nesttableprops nextfile nonesttables nonshppict objalias objclass objdata object "
        "objname objsect objtime oldcprops oldpprops oldsprops oldtprops oleclsid operator "
        "panose password passwordhash pgp pgptbl picprop pict pn pnseclvl pntext pntxta pntxtb "
        "printim private propname protend protstart protusertbl pxe result revtbl revtim rsidtbl "
        "rxe shp shpgrp shpinst shppict shprslt shptxt sn sp staticval stylesheet subject sv svb "
        "tc template themedata title txe ud upr userprops wgrffmtfilter windowcaption "
        "writereservation writereservhash xe xform xmlattrname xmlattrvalue xmlclose xmlname "
        "xmlnstbl xmlopen"
    ).split()
)
"""RTF 1.9.1's destinations (control words that send the rest of their group somewhere other
than the text), less ``field``, ``fldinst`` and ``fldrslt``: text in one of them, inside a field
instruction, is taken by the raw reading only (:class:`_Field`), in case a reader keeps it."""


@dataclass
class _RtfGroup:
    """What an RTF group inherits from its parent and restores when it ends."""

    uc: int = 1
    """Fallback characters after a ``\\uN`` (``\\ucN``)."""
    skip: int = 0
    """Fallback characters still to pass over."""
    evaluated: bool = True
    """False in a destination (:data:`_RTF_DESTINATIONS`): its text is the raw reading's only."""
    ignored: bool = False
    """In a ``{\\*\\dest …}`` group whose destination readers do not know (they skip it whole) or
    in a bookmark's name: no reading takes its text; a ``\\fldinst`` in it is read all the same.
    A ``\\*`` destination they know (:data:`_RTF_DESTINATIONS`) is a destination like another."""
    starred: bool = False
    """``\\*`` came last: the next control word names an ignorable destination."""
    fields: int = 0
    """Fields this group's ``\\fldinst`` groups began, ended with it (the ``\\field`` group)."""
    instruction: bool = False
    """The group is a ``\\fldinst``: its end separates the instruction from the result."""


def _rtf(data: bytes) -> str | None:
    """An RTF document's loading field (:func:`field_command`, in every ``\\fldinst``, nested
    ones too) or linked object (``\\objautlink``, ``\\objlink``), or None. Reads the document as
    LibreOffice's tokenizer does: groups, control words with their parameter and one space,
    control symbols, ``\\'hh`` in the ``\\ansicpg`` code page (or cp1252), ``\\uN`` and the
    ``\\ucN`` characters after it skipped, ``\\binN`` data passed over, CR and LF ignored.

    Raises:
        CheckLimitExceeded: groups nested deeper than :data:`MAX_RTF_NESTING`.
    """
    if not any(word in data for word in (b"\\fldinst", b"\\objlink", b"\\objautlink")):
        return None  # control words are plain ASCII in the bytes: nothing to find (29 MB of text: 3.6 s)
    fields = _Fields()
    stack = [_RtfGroup()]
    codec = "cp1252"
    pending = bytearray()  # hex escapes in a row, decoded together (double-byte code pages)

    def emit(text: str) -> None:
        group = stack[-1]
        if group.skip:
            taken = min(group.skip, len(text))
            group.skip -= taken
            text = text[taken:]
        if text and fields.open and not group.ignored:
            fields.text(text, evaluated=group.evaluated)

    def flush() -> None:
        if pending:
            text = bytes(pending).decode(codec, "replace")
            pending.clear()
            emit(text)

    position, size = 0, len(data)
    while position < size and fields.found is None:
        match = _RTF_TOKEN.match(data, position)
        if match is None:  # pragma: no cover - the pattern matches any byte
            break
        position = match.end()
        word, parameter, high, low, symbol, brace, text = match.groups()
        if high is not None:
            if stack[-1].skip:
                stack[-1].skip -= 1
            else:
                pending.append(int(high + low, 16))
            continue
        flush()
        group = stack[-1]
        if text is not None:
            emit(text.decode(codec, "replace"))
        elif brace == b"{":
            if len(stack) > MAX_RTF_NESTING:
                raise CheckLimitExceeded(f"RTF groups nested more than {MAX_RTF_NESTING} deep")
            stack.append(_RtfGroup(group.uc, group.skip, group.evaluated, group.ignored))
        elif brace == b"}":
            if len(stack) > 1:
                ended = stack.pop()
                if ended.instruction:
                    fields.separate()
                for _ in range(ended.fields):
                    fields.end()
        elif symbol is not None:
            group.starred = symbol == b"*"
            if symbol in _RTF_SYMBOLS:
                emit(_RTF_SYMBOLS[symbol])
        elif word is not None:
            name = word.decode("ascii")
            starred, group.starred = group.starred, False
            number = int(parameter) if 0 < len(parameter.lstrip(b"-")) <= 10 else None
            if number is not None and not -(2**31) <= number < 2**31:
                number = None  # past a 32-bit parameter readers differ: \\bin is not skipped
            if name in ("objautlink", "objlink"):
                return "an RTF linked object"
            if name == "fldinst":
                fields.begin()
                group.instruction = True
                group.evaluated, group.ignored = True, False
                stack[-2 if len(stack) > 1 else -1].fields += 1
            elif name in ("field", "fldrslt"):
                pass
            elif name == "ud":
                group.evaluated = True  # LibreOffice reads a \\upr's Unicode half as plain text
            elif (starred and name not in _RTF_DESTINATIONS) or name in ("bkmkstart", "bkmkend"):
                group.ignored = True  # skipped whole, or a bookmark's name
            elif name in _RTF_DESTINATIONS:
                group.evaluated = False
            elif name == "bin" and number is not None and number > 0:
                position += number
            elif name == "u" and number is not None:
                emit(chr(number % 0x10000))
                group.skip = group.uc
            elif name == "uc" and number is not None:
                group.uc = max(number, 0)
            elif name == "ansicpg" and number is not None:
                codec = _rtf_codec(number, codec)
    flush()
    found = fields.finish()
    return None if found is None else f"an RTF {found} field"


def _rtf_codec(code_page: int, current: str) -> str:
    """Python's codec for an RTF ``\\ansicpgN``, or ``current`` if it has none (an unknown or
    EBCDIC code page: the words the check looks for are ASCII in every ANSI code page)."""
    name = f"cp{code_page}"
    try:
        codecs.lookup(name)
    except LookupError:
        return current
    return current if code_page in _EBCDIC_CODE_PAGES else name


_EBCDIC_CODE_PAGES: Final = frozenset({37, 273, 500, 875, 1026, 1140})


def _word_fields(data: bytes) -> str | None:
    """A loading field instruction in a ``WordDocument`` stream, or None: the stream read as
    8-bit text and as UTF-16 at both alignments (the text's pieces may be either), its field
    marks (0x13 begin, 0x14 separate, 0x15 end) followed as :class:`_Fields`."""
    for text in (
        data.decode("latin-1"),
        data.decode("utf-16-le", "replace"),
        data[1:].decode("utf-16-le", "replace"),
    ):
        fields = _Fields()
        for piece in _DOC_FIELD_MARKS.split(text):
            if piece == "\x13":
                fields.begin()
            elif piece == "\x14":
                fields.separate()
            elif piece == "\x15":
                fields.end()
            elif fields.open:
                fields.text(piece)
            if fields.found is not None:
                break
        found = fields.finish()
        if found is not None:
            return f"a Word {found} field"
    return None


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
