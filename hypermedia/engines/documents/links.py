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

- an ``xlink:href`` (any element but a hyperlink or a script event,
  :data:`~hypermedia.engines.documents.xmlparts.ODF_HYPERLINK_ELEMENTS`; ``meta:template`` too),
  an ``href``/``src`` on an SVG element, a ``form:image-data``, a
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
  the hyperlink type (:data:`~hypermedia.engines.documents.xmlparts.HYPERLINK_RELATIONSHIP_TYPES`;
  ECMA-376 Part 2 §9.3), or is but is named by an element of its source part that is not a
  hyperlink (:data:`~hypermedia.engines.documents.xmlparts.HYPERLINK_ELEMENTS`: LibreOffice draws
  an ``a:blip r:link`` to a hyperlink relationship as a linked image);
- a Word field whose instruction loads content (``INCLUDEPICTURE``, ``INCLUDETEXT``, ``IMPORT``,
  ``LINK``, ``DDE``, ``DDEAUTO``; ECMA-376 Part 1 §17.16.5) in ``w:instrText`` (the runs of one
  field joined, nested fields followed) or ``w:fldSimple/@w:instr``, in any part: the first word
  of the instruction decides (:func:`~hypermedia.engines.documents.fields.field_command`, one rule
  for every format).

And in the other containers:

- **RTF**: the same field instructions in every ``\\fldinst`` (nested ones too), read by a
  tokenizer as LibreOffice reads RTF (:mod:`hypermedia.engines.documents.rtf`: groups, control
  words and symbols, ``\\'hh`` and ``\\uN`` escapes, destinations), not by a pattern over the
  bytes (issue 14: a doubled brace, a hex escape, a field split over groups passed the pattern),
  and linked objects
  (``\\objautlink``, ``\\objlink``; RTF 1.9.1 "Objects").
- **Word 97–2003**: the same field instructions between a field-begin mark (0x13) and its
  separator (0x14) or end (0x15) in the ``WordDocument`` stream, 8-bit or UTF-16 ([MS-DOC] 2.8.25).

Not covered (the Landlock view is what holds there): external references inside binary Excel
and PowerPoint records and inside an RTF's hex-encoded ``\\objdata`` (LibreOffice does not
update them on load: ``UpdateDocMode`` NO_UPDATE) and formulas such as ``WEBSERVICE`` (measured:
``Err:540``, no request made).

This module walks the containers and bounds the check; the readers it uses are
:mod:`~hypermedia.engines.documents.xmlparts` (one XML part, OOXML relationships),
:mod:`~hypermedia.engines.documents.rtf` (RTF), :mod:`~hypermedia.engines.documents.fields` (Word
fields, and a ``WordDocument`` stream's) and :mod:`~hypermedia.engines.documents.linkerrors` (what
it raises).
"""

from __future__ import annotations

import functools
import io
import posixpath
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Final

import olefile

from hypermedia.engines.documents import rtf
from hypermedia.engines.documents.fields import word_fields
from hypermedia.engines.documents.linkerrors import CheckLimitExceeded, MalformedDocument
from hypermedia.engines.documents.xmlparts import Relationships, XmlPart, parse
from hypermedia.intake import archives, ole

__all__ = [
    "MAX_CHECKED_BYTES",
    "MAX_NESTING",
    "CheckLimitExceeded",
    "MalformedDocument",
    "find_external_content",
]


MAX_NESTING: Final = 3
"""Deepest package inside a package (a ``.docx`` holding an ``.xlsx`` holding an OLE object is 2)
that is read; a deeper one is :class:`CheckLimitExceeded`. Office writes one level; a chart or
object inside an embedded object makes two."""

MAX_CHECKED_BYTES: Final = 512 * 1024 * 1024
"""Most bytes decompressed in all by one check, over every part at every depth: the upload
checks' bound on one package (``archives.MAX_TOTAL_UNCOMPRESSED_BYTES``), which nesting could
otherwise multiply."""

_OLE_LINKED: Final = 0x00000001


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
            return rtf.find_external(data)
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


class _Walker:
    """Walks a package and every package inside it, keeping count of depth and bytes."""

    def __init__(self) -> None:
        self.checked_bytes = 0
        self.relationships = Relationships({}, {})

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
            return rtf.find_external(data)
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
        outer, self.relationships = self.relationships, Relationships({}, {})
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
                    found = word_fields(compound.openstream(entry).read())
                else:
                    part = self._read(head, size, functools.partial(_stream, compound, entry))
                    found = None if part is None else self.member(part[0], name, part[1], depth)
                if found is not None:
                    return found
        return None

    def xml(self, name: str, data: bytes) -> str | None:
        folder = posixpath.dirname(name)
        part = XmlPart(name, folder, name.lower().endswith(".rels"))
        parse(data, part.start, part.end, part.text)
        if part.found is not None:
            return f"{part.found} in {name}"
        self.relationships.add(part)
        # A field instruction may be split over several w:instrText runs anywhere (Word splits
        # them as it likes): the runs of one field are joined (:class:`~hypermedia.engines.documents.fields.Fields`).
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
