"""Find what in an office document would make LibreOffice load content from outside the document
(a file on the host, a URL): checked by :class:`hypermedia.documents.office.OfficePool` before a
listener opens the document, which is then refused with ``LINKED_CONTENT_NOT_ALLOWED``.

Why a check of our own: LibreOffice's settings (``UpdateDocMode`` NO_UPDATE, links from untrusted
documents blocked) stop most links but not all. Measured with LibreOffice 7.4 by the hostile
review: an RTF ``INCLUDEPICTURE`` field and an ODT paragraph ``style:background-image`` with a
``file://`` URL drew a host image (or the pages of a host PDF or SVG) into the output, and with an
``http://`` URL fetched it when the listener has a network. Without root a listener has the
worker's uid, so such a link could reach other jobs' files. Hyperlinks (``text:a``, OOXML
``…/hyperlink`` relationships) are never followed by a conversion and stay allowed.

What counts as external, per format:

- **ODF** (``content.xml``, ``styles.xml``): an ``xlink:href`` on any element but a hyperlink
  (``text:a``, ``draw:a``, ``text:alphabetical-index-mark``…, see :data:`ODF_HYPERLINK_ELEMENTS`)
  or a script event (refused at upload anyway) whose value is not a path inside the package: a
  URL with a scheme, an absolute path, or a path with ``..`` (LibreOffice resolves relative
  paths against the document's own location). ODF 1.2 Part 1 §19.910 (``xlink:href``).
- **OOXML**: a relationship with ``TargetMode="External"`` whose type is not ``…/hyperlink``
  (ECMA-376 Part 2 §9.3), and a field whose instruction loads content (``INCLUDEPICTURE``,
  ``INCLUDETEXT``, ``IMPORT``, ``LINK``, ``DDE``, ``DDEAUTO``; ECMA-376 Part 1 §17.16.5) in
  ``w:instrText`` or ``w:fldSimple/@w:instr``.
- **RTF**: the same field instructions in ``\\fldinst``, and linked objects (``\\objautlink``,
  ``\\objlink``; RTF 1.9.1 "Objects").
- **Word 97–2003**: the same field instructions after a field-begin mark (0x13) in the
  ``WordDocument`` stream, 8-bit or UTF-16 ([MS-DOC] 2.8.25).

Not covered: external references inside binary Excel and PowerPoint records (LibreOffice does not
update them on load: ``UpdateDocMode`` NO_UPDATE) and formulas such as ``WEBSERVICE`` (measured:
``Err:540``, no request made).
"""

from __future__ import annotations

import re
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Final
from xml.parsers import expat

import olefile

__all__ = ["FIELD_INSTRUCTIONS", "MalformedDocument", "find_external_content"]

FIELD_INSTRUCTIONS: Final = frozenset({"INCLUDEPICTURE", "INCLUDETEXT", "IMPORT", "LINK", "DDE", "DDEAUTO"})
"""Word field instructions that load content from a file or another program."""

_XLINK: Final = "http://www.w3.org/1999/xlink"
_TEXT: Final = "urn:oasis:names:tc:opendocument:xmlns:text:1.0"
_DRAW: Final = "urn:oasis:names:tc:opendocument:xmlns:drawing:1.0"
_OFFICE: Final = "urn:oasis:names:tc:opendocument:xmlns:office:1.0"
_SCRIPT: Final = "urn:oasis:names:tc:opendocument:xmlns:script:1.0"
_PRESENTATION: Final = "urn:oasis:names:tc:opendocument:xmlns:presentation:1.0"
_W: Final = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"

ODF_HYPERLINK_ELEMENTS: Final = frozenset(
    {
        (_TEXT, "a"),
        (_DRAW, "a"),
        (_TEXT, "bookmark-ref"),
        (_OFFICE, "event-listener"),
        (_SCRIPT, "event-listener"),
        (_PRESENTATION, "event-listener"),
        (_TEXT, "alphabetical-index-mark"),
    }
)
"""ODF elements whose ``xlink:href`` is a link the reader follows on request, not content loaded
with the document (event listeners run macros, which are refused at upload and never run)."""

_ODF_PARTS: Final = ("content.xml", "styles.xml")
_SCHEME: Final = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
_RTF_FIELD: Final = re.compile(rb"\\fldinst\s*(?:\{\s*)?(?:\\[a-zA-Z]+-?\d*\s?)*\s*([A-Za-z]+)")
_RTF_LINKED_OBJECT: Final = re.compile(rb"\\obj(?:aut)?link(?![a-zA-Z])")
_DOC_FIELD_8BIT: Final = re.compile(rb"\x13\s*([A-Za-z]+)")
_DOC_FIELD_UTF16: Final = re.compile(rb"\x13\x00(?:\x20\x00)*((?:[A-Za-z]\x00)+)")


class MalformedDocument(ValueError):
    """A part this module reads is not well-formed XML, declares a DTD, or the container does not
    open: nothing is sure about what LibreOffice would make of it."""


def find_external_content(path: Path, mime_type: str) -> str | None:
    """What in the document at ``path`` (identified as ``mime_type`` at upload) would load content
    from outside it, or None. Reads only the parts named in the module doc; the upload checks
    (:mod:`hypermedia.archives`) have bounded their sizes.

    Returns:
        A short description for the job's error message, e.g. ``"an RTF INCLUDEPICTURE field"``.

    Raises:
        MalformedDocument: see there.
        OSError: the file cannot be read.
    """
    try:
        if mime_type in {"application/rtf", "text/rtf"}:
            return _rtf(path.read_bytes())
        if mime_type == "application/msword":
            return _word97(path)
        if mime_type.startswith("application/vnd.oasis.opendocument."):
            return _odf(path)
        if mime_type.startswith("application/vnd.openxmlformats-officedocument."):
            return _ooxml(path)
    except (zipfile.BadZipFile, expat.ExpatError, ValueError) as exc:
        raise MalformedDocument(str(exc)) from None
    return None  # binary Excel and PowerPoint: see the module doc


def _is_external(href: str) -> bool:
    href = href.strip()
    if not href or href.startswith("#"):
        return False
    if _SCHEME.match(href) or href.startswith(("/", "\\")):
        return True
    parts = re.split(r"[/\\]", href)
    return ".." in parts


def _parse(data: bytes, start: Callable[[str, dict[str, str]], None]) -> None:
    """Expat over ``data`` calling ``start(name, attrs)`` per element; no DTD, no entities."""
    parser = expat.ParserCreate(namespace_separator=" ")
    parser.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)

    parser.StartDoctypeDeclHandler = _refuse_dtd
    parser.EntityDeclHandler = _refuse_dtd
    parser.StartElementHandler = start
    parser.Parse(data, True)


def _odf(path: Path) -> str | None:
    found: list[str] = []

    def start(name: str, attrs: dict[str, str]) -> None:
        href = attrs.get(f"{_XLINK} href")
        if href is None or found:
            return
        element = tuple(name.split(" ", 1)) if " " in name else ("", name)
        if element not in ODF_HYPERLINK_ELEMENTS and _is_external(href):
            found.append(f"a linked {element[1]} ({_clip(href)})")

    with zipfile.ZipFile(path) as package:
        names = set(package.namelist())
        for part in _ODF_PARTS:
            if part in names and not found:
                _parse(package.read(part), start)
    return found[0] if found else None


def _ooxml(path: Path) -> str | None:
    found: list[str] = []
    instructions: list[str] = []
    in_instr = [False]

    def start_rels(name: str, attrs: dict[str, str]) -> None:
        if name.endswith("Relationship") and attrs.get("TargetMode") == "External":
            if not attrs.get("Type", "").endswith("/hyperlink") and not found:
                found.append(
                    f"an external {attrs.get('Type', '').rsplit('/', 1)[-1]} ({_clip(attrs.get('Target', ''))})"
                )

    def start_part(name: str, attrs: dict[str, str]) -> None:
        if name == f"{_W} fldSimple":
            instructions.append(attrs.get(f"{_W} instr", ""))
        in_instr[0] = name == f"{_W} instrText"

    def text(data: str) -> None:
        if in_instr[0]:
            instructions.append(data)

    with zipfile.ZipFile(path) as package:
        for info in package.infolist():
            if found:
                break
            if info.filename.endswith(".rels"):
                _parse(package.read(info), start_rels)
            elif info.filename.startswith("word/") and info.filename.endswith(".xml"):
                parser = expat.ParserCreate(namespace_separator=" ")
                parser.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)
                parser.StartElementHandler = start_part
                parser.EndElementHandler = lambda _name: in_instr.__setitem__(0, False)
                parser.CharacterDataHandler = text
                parser.StartDoctypeDeclHandler = _refuse_dtd
                parser.Parse(package.read(info), True)
    if found:
        return found[0]
    # A field instruction may be split over several w:instrText runs: join them, then look at
    # the first word after each field start.
    for word in re.findall(r"(?:^|\s)([A-Za-z]+)", " ".join(instructions)):
        if word.upper() in FIELD_INSTRUCTIONS:
            return f"a Word {word.upper()} field"
    return None


def _rtf(data: bytes) -> str | None:
    if _RTF_LINKED_OBJECT.search(data):
        return "an RTF linked object"
    for match in _RTF_FIELD.finditer(data):
        if match.group(1).decode("ascii").upper() in FIELD_INSTRUCTIONS:
            return f"an RTF {match.group(1).decode('ascii').upper()} field"
    return None


def _word97(path: Path) -> str | None:
    with olefile.OleFileIO(str(path)) as ole:
        if not ole.exists("WordDocument"):
            return None
        data = ole.openstream("WordDocument").read()
    for pattern, encoding in ((_DOC_FIELD_8BIT, "latin-1"), (_DOC_FIELD_UTF16, "utf-16-le")):
        for match in pattern.finditer(data):
            word = match.group(1).decode(encoding, "replace").upper()
            if word in FIELD_INSTRUCTIONS:
                return f"a Word {word} field"
    return None


def _refuse_dtd(*_: object) -> None:
    raise MalformedDocument("a document type declaration")


def _clip(value: str, limit: int = 80) -> str:
    return value if len(value) <= limit else value[:limit] + "…"
