"""Find what in an office document would make LibreOffice load content from outside the document
(a file on the host, a URL): checked by :class:`hypermedia.documents.office.OfficePool` before a
listener opens the document, which is then refused with ``LINKED_CONTENT_NOT_ALLOWED``.

Why a check of our own: LibreOffice's settings (``UpdateDocMode`` NO_UPDATE, links from untrusted
documents blocked) stop most links but not all. Measured with LibreOffice 7.4 by the hostile
review: an RTF ``INCLUDEPICTURE`` field and an ODT paragraph ``style:background-image`` with a
``file://`` URL drew a host image (or the pages of a host PDF or SVG) into the output, and with an
``http://`` URL fetched it when the listener has a network. Hyperlinks (``text:a``, OOXML
``…/hyperlink`` relationships) are never followed by a conversion and stay allowed. Since issue
14 the check is the first of two layers: the listener's Landlock view
(:func:`hypermedia.documents.office.listener_view`) holds no host file to load.

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
- in a ``.rels`` part, a relationship with ``TargetMode="External"`` whose type is not
  ``…/hyperlink`` (ECMA-376 Part 2 §9.3);
- a Word field whose instruction loads content (``INCLUDEPICTURE``, ``INCLUDETEXT``, ``IMPORT``,
  ``LINK``, ``DDE``, ``DDEAUTO``; ECMA-376 Part 1 §17.16.5) in ``w:instrText`` or
  ``w:fldSimple/@w:instr``, in any part.

And in the other containers:

- **RTF**: the same field instructions in ``\\fldinst``, and linked objects (``\\objautlink``,
  ``\\objlink``; RTF 1.9.1 "Objects").
- **Word 97–2003**: the same field instructions after a field-begin mark (0x13) in the
  ``WordDocument`` stream, 8-bit or UTF-16 ([MS-DOC] 2.8.25).

Not covered (the Landlock view is what holds there): external references inside binary Excel
and PowerPoint records and inside an RTF's hex-encoded ``\\objdata`` (LibreOffice does not
update them on load: ``UpdateDocMode`` NO_UPDATE) and formulas such as ``WEBSERVICE`` (measured:
``Err:540``, no request made).
"""

from __future__ import annotations

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

from hypermedia import archives, ole

__all__ = [
    "FIELD_INSTRUCTIONS",
    "MAX_CHECKED_BYTES",
    "MAX_NESTING",
    "CheckLimitExceeded",
    "MalformedDocument",
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
_RTF_FIELD: Final = re.compile(rb"\\fldinst\s*(?:\{\s*)?(?:\\[a-zA-Z]+-?\d*\s?)*\s*([A-Za-z]+)")
_RTF_LINKED_OBJECT: Final = re.compile(rb"\\obj(?:aut)?link(?![a-zA-Z])")
_DOC_FIELD_8BIT: Final = re.compile(rb"\x13\s*([A-Za-z]+)")
_DOC_FIELD_UTF16: Final = re.compile(rb"\x13\x00(?:\x20\x00)*((?:[A-Za-z]\x00)+)")
_OLE_LINKED: Final = 0x00000001


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
    the module doc); the upload checks (:mod:`hypermedia.archives`) have bounded the top level's
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
        return _rtf(path.read_bytes())
    if mime_type in {"application/msword", "application/vnd.ms-excel", "application/vnd.ms-powerpoint"}:
        container = "ole"
    elif mime_type.startswith(_PACKAGE_TYPES):
        container = "zip"
    else:
        return None
    data = path.read_bytes()
    walker = _Walker()
    try:
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
    """What one XML part holds: the first external reference, and Word field instructions."""

    name: str
    folder: str
    rels: bool
    found: str | None = None
    in_instruction: bool = False
    in_style: bool = False

    def __post_init__(self) -> None:
        self.instructions: list[str] = []

    def start(self, name: str, attrs: dict[str, str]) -> None:
        if self.found is not None:
            return
        element = _element(name)
        self.in_instruction = element == (_W, "instrText")
        self.in_style = element[1] == "style" and element[0] in {_SVG, ""}
        if self.rels:
            if element[1] == "Relationship" and attrs.get("TargetMode") == "External":
                kind = attrs.get("Type", "")
                if not kind.endswith("/hyperlink"):
                    self.found = f"an external {kind.rsplit('/', 1)[-1]} ({_clip(attrs.get('Target', ''))})"
            return
        if element in DDE_ELEMENTS:
            self.found = f"a DDE link ({element[1]})"
            return
        if element == (_W, "fldSimple"):
            self.instructions.append(f" {attrs.get(f'{_W} instr', '')} ")
        elif element == (_W, "fldChar"):
            self.instructions.append(" ")  # a field starts or ends: the runs between are one instruction
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

    def end(self, _name: str) -> None:
        self.in_instruction = self.in_style = False

    def text(self, data: str) -> None:
        if self.in_instruction:
            self.instructions.append(data)
        elif self.in_style and self.found is None:
            for match in _CSS_URL.finditer(data):
                target = match.group(1) or match.group(2) or ""
                if _is_external(target, self.folder):
                    self.found = f"a linked style sheet resource ({_clip(target)})"
                    return


class _Walker:
    """Walks a package and every package inside it, keeping count of depth and bytes."""

    def __init__(self) -> None:
        self.checked_bytes = 0

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
        # A field instruction may be split over several w:instrText runs anywhere (Word splits
        # them as it likes): join them, then look at each word.
        for word in re.findall(r"(?:^|\s)([A-Za-z]+)", "".join(part.instructions)):
            if word.upper() in FIELD_INSTRUCTIONS:
                return f"a Word {word.upper()} field in {name}"
        return None


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


def _rtf(data: bytes) -> str | None:
    if _RTF_LINKED_OBJECT.search(data):
        return "an RTF linked object"
    for match in _RTF_FIELD.finditer(data):
        if match.group(1).decode("ascii").upper() in FIELD_INSTRUCTIONS:
            return f"an RTF {match.group(1).decode('ascii').upper()} field"
    return None


def _word_fields(data: bytes) -> str | None:
    """A loading field instruction in a ``WordDocument`` stream, or None."""
    for pattern, encoding in ((_DOC_FIELD_8BIT, "latin-1"), (_DOC_FIELD_UTF16, "utf-16-le")):
        for match in pattern.finditer(data):
            word = match.group(1).decode(encoding, "replace").upper()
            if word in FIELD_INSTRUCTIONS:
                return f"a Word {word} field"
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
