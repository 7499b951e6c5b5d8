"""OLE2 compound files (the legacy Office formats ``.doc``, ``.xls``, ``.ppt``) typed by their
streams and checked for macros before anything stores them.

A compound file ([MS-CFB]) is a small file system inside a file: a FAT of 512- or 4096-byte
sectors, a directory of 128-byte entries arranged as one red-black tree of storages (folders) and
streams (files) per storage. Every legacy Office file is one, and so are Outlook ``.msg`` files,
MSI installers, Visio and Publisher files, Office files encrypted with a password
([MS-OFFCRYPTO]) and many more, all starting with the same 8 bytes (:data:`SIGNATURE`). What it
*is* is decided by its root streams, never by its name:

==========================  ===================================  ==============================
root stream                 format                               MIME type
==========================  ===================================  ==============================
``WordDocument``            Word 97–2003 ([MS-DOC])              ``application/msword``
``Workbook`` (BIFF8) or     Excel 97–2003 ([MS-XLS]),            ``application/vnd.ms-excel``
``Book`` (BIFF5)            Excel 5.0/95
``PowerPoint Document``     PowerPoint 97–2003 ([MS-PPT])        ``application/vnd.ms-powerpoint``
anything else               not an Office document               ``application/x-ole-storage``
==========================  ===================================  ==============================

(checked in that order, after ``EncryptedPackage`` or ``EncryptionInfo``, which make any file an
encrypted OOXML package, ``application/x-ole-storage``: :data:`ENCRYPTED_PACKAGE_STREAMS`; names
compare case-insensitively, as [MS-CFB] §2.6.4 says). A Word, Excel or PowerPoint file encrypted
in its own streams (:func:`find_encryption`: the FIB's flags, a ``FilePass`` record, PowerPoint's
``Current User`` token) is ``application/x-ole-storage`` too: LibreOffice gets no password, so no
operation could open it, and the gateway refuses it at job creation (415) instead of holding
credits for a job that fails ``PARSE_ERROR`` (issue 15). The last type is the name puremagic's own
database and freedesktop's shared-mime-info give a compound file of no known kind; it is not an
office kind, so no operation accepts it.

Which version of its family a file is (Word 6.0/95 or 97–2003, Excel 5.0/95 or 97–2003) is read
from its header by :func:`legacy_format`, for the docworker's choice of LibreOffice's import
filter.

The directory is parsed by ``olefile`` (PyPI, Philippe Lagadec; the parser under oletools), from
memory, with every defect from ``DEFECT_INCORRECT`` up raised instead of logged: a directory
entry referenced twice, two siblings with one name, a stream whose sectors another stream uses,
a chain that ends early. Such files are refused as ``ARCHIVE_CORRUPT`` like a zip whose
directories disagree: readers differ on them, and LibreOffice must never read another file than
the one that was checked. More than :data:`archives.MAX_ENTRIES` directory entries are refused
before any entry is built (``ARCHIVE_TOO_MANY_ENTRIES``; olefile builds about 15,000 entries a
second, so an upload of 100 MiB of directory would hold the gateway for a minute).

Macros (:func:`find_macros`) are found the way oletools' olevba finds them
(``VBA_Parser.find_vba_projects``, ``detect_vba_macros``; ``ppt_parser.search_vba_info``), by
structure, without decompressing or reading any code.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import olefile

from hypermedia.intake.archives import MAX_ENTRIES, ArchiveRejected

SIGNATURE = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"
"""The first 8 bytes of every compound file ([MS-CFB] §2.2, Header Signature)."""

MSWORD = "application/msword"
MSEXCEL = "application/vnd.ms-excel"
MSPOWERPOINT = "application/vnd.ms-powerpoint"
OLE_STORAGE = "application/x-ole-storage"
"""A compound file that is none of the Office formats above (``.msg``, MSI, encrypted OOXML, …)."""

MIME_BY_MAIN_STREAM = (
    ("worddocument", MSWORD),
    ("workbook", MSEXCEL),
    ("book", MSEXCEL),
    ("powerpoint document", MSPOWERPOINT),
)
"""Lowercased root stream name → the file's MIME type, in the order they are tried."""

ENCRYPTED_PACKAGE_STREAMS = frozenset({"encryptedpackage", "encryptioninfo"})
"""Root streams of an OOXML package encrypted with a password ([MS-OFFCRYPTO] §2.3.4: the
package itself is ``EncryptedPackage``, its key material ``EncryptionInfo``). Such a file is
:data:`OLE_STORAGE` whatever other streams it also holds: Office may put a ``WordDocument`` stub
beside them, which made one typed ``application/msword``, accepted, held, and failed
``PARSE_ERROR`` (issue 15)."""

VBA_PROJECT_STORAGES = frozenset({"macros", "_vba_project_cur"})
"""Storages that hold a VBA project in legacy Office files: ``Macros`` in Word ([MS-DOC], the Macros
storage), ``_VBA_PROJECT_CUR`` in Excel ([MS-XLS], the workbook's VBA project storage); olevba's
``find_vba_projects`` names the same two. Refused by name alone, at any depth (an embedded document
has its own)."""

_BIFF_BOUNDSHEET = 0x0085
_BIFF_EOF = 0x000A
_BIFF_FILEPASS = 0x002F
_BIFF_SHEET_TYPES = {1: "an Excel 4.0 macro sheet", 6: "an Excel VBA module sheet"}
"""``BoundSheet8.dt`` ([MS-XLS] §2.4.28) of sheets that are code, not data."""

MAX_BIFF_GLOBAL_RECORDS = 1_000_000
"""Most records read from a workbook's globals substream while looking for its sheets (a large
real workbook's globals have thousands: fonts, formats, styles, the shared strings and their
CONTINUE records; each sheet's BoundSheet8 comes before the shared strings). A stream of empty
records would otherwise cost a Python loop per 4 bytes."""

MAX_PPT_VBA_INFOS = 1000
"""Most VBAInfoContainer records looked at in a presentation before it counts as carrying macros."""

# [MS-PPT] VBAInfoContainer (recVer 0xF, recInstance 1, recType RT_VbaInfo 0x03FF,
# recLen 0x14) and VBAInfoAtom (recVer 2, recInstance 0, recType RT_VbaInfoAtom 0x0400,
# recLen 0x0C), then persistIdRef and fHasMacros (4 bytes each). The same bytes olevba's
# ppt_parser.search_vba_info looks for: the VBA project of a .ppt is a compressed storage inside
# the "PowerPoint Document" stream, not a storage of the compound file.
_PPT_VBA_INFO = struct.pack("<HHI", 0x001F, 0x03FF, 0x14) + struct.pack("<HHI", 0x0002, 0x0400, 0x0C)


@dataclass(frozen=True)
class CompoundFile:
    """What :func:`inspect` found in a compound file."""

    mime_type: str
    """:data:`MSWORD`, :data:`MSEXCEL`, :data:`MSPOWERPOINT` or :data:`OLE_STORAGE`."""
    macros: str | None
    """What makes the file carry macros (for the refusal's message), or None."""
    encryption: str | None = None
    """What says the document is encrypted with a password (:func:`find_encryption`), or None;
    such a file is :data:`OLE_STORAGE` whatever its streams."""


def is_ole(head: bytes) -> bool:
    """Whether content starting with ``head`` is a compound file and must pass :func:`inspect`."""
    return head.startswith(SIGNATURE)


def _corrupt(detail: str) -> ArchiveRejected:
    return ArchiveRejected(f"the compound file is corrupt: {detail}", "ARCHIVE_CORRUPT")


class _TooManyEntries(Exception):
    pass


class _BoundedOleFile(olefile.OleFileIO):  # type: ignore[misc]
    """olefile's reader, refusing a directory of more than :data:`MAX_ENTRIES` entries before it
    builds any (``loaddirectory`` and ``_open`` are olefile 0.47's own; the version is pinned)."""

    def loaddirectory(self, sect: int) -> None:
        size = self._open(sect, force_FAT=True).size
        if size // 128 > MAX_ENTRIES:
            raise _TooManyEntries
        super().loaddirectory(sect)


def _open(data: bytes) -> olefile.OleFileIO:
    # Always a file object: olefile reads bytes shorter than 1,536 as a *path* to open.
    try:
        return _BoundedOleFile(io.BytesIO(data), raise_defects=olefile.DEFECT_INCORRECT)
    except _TooManyEntries:
        raise ArchiveRejected(
            f"compound files may have at most {MAX_ENTRIES} directory entries", "ARCHIVE_TOO_MANY_ENTRIES"
        ) from None
    except RecursionError:  # olefile walks each storage's sibling tree recursively
        raise _corrupt("its directory tree is too deep") from None
    except Exception as exc:  # olefile raises OleFileError, and struct/index errors on garbage
        raise _corrupt(str(exc) or type(exc).__name__) from None


def _walk(ole: olefile.OleFileIO) -> Iterator[tuple[list[str], Any]]:
    """Every directory entry below the root, with its path (names as stored), depth first."""
    pending: list[tuple[list[str], Any]] = [([], ole.root)]
    while pending:
        path, entry = pending.pop()
        for kid in entry.kids:
            kid_path = [*path, kid.name]
            yield kid_path, kid
            if kid.entry_type == olefile.STGTY_STORAGE:
                pending.append((kid_path, kid))


def _stream(ole: olefile.OleFileIO, path: list[str]) -> bytes:
    try:
        return bytes(ole.openstream(path).read())
    except Exception as exc:
        raise _corrupt(f"the stream {'/'.join(path)!r} cannot be read ({exc})") from None


def _stream_head(ole: olefile.OleFileIO, path: list[str], size: int) -> bytes:
    try:
        return bytes(ole.openstream(path).read(size))
    except Exception as exc:
        raise _corrupt(f"the stream {'/'.join(path)!r} cannot be read ({exc})") from None


def _root_stream(ole: olefile.OleFileIO, lowered: str) -> list[str] | None:
    for kid in ole.root.kids:
        if kid.entry_type == olefile.STGTY_STREAM and kid.name.lower() == lowered:
            return [kid.name]
    return None


def _workbook_globals(workbook: bytes) -> Iterator[tuple[int, int, int]]:
    """``(record type, offset, size)`` of each record of the workbook globals substream of a
    BIFF5/BIFF8 ``Workbook``/``Book`` stream ([MS-XLS] §2.1.4: records of a 2-byte type and a
    2-byte size), up to its ``EOF`` record or the stream's end. Raises ArchiveRejected
    (``ARCHIVE_CORRUPT``) for globals of more than :data:`MAX_BIFF_GLOBAL_RECORDS` records."""
    pos = 0
    for _record in range(MAX_BIFF_GLOBAL_RECORDS):
        if pos + 4 > len(workbook):
            return
        record, size = struct.unpack_from("<HH", workbook, pos)
        if record == _BIFF_EOF:
            return
        yield record, pos, size
        pos += 4 + size
    raise _corrupt(f"the workbook globals run past {MAX_BIFF_GLOBAL_RECORDS} records")


def _excel_code_sheet(workbook: bytes) -> str | None:
    """The first code sheet in the workbook globals of a BIFF5/BIFF8 ``Workbook``/``Book`` stream
    (its ``BoundSheet8`` records, [MS-XLS] §2.4.28; olevba reads the same through oledump's
    plugin_biff), or None. Past a ``FilePass`` record the sheet types are encrypted
    ([MS-XLS] §2.2.10) and are not read. Raises ArchiveRejected (``ARCHIVE_CORRUPT``) for globals
    of more than :data:`MAX_BIFF_GLOBAL_RECORDS` records."""
    for record, pos, size in _workbook_globals(workbook):
        if record == _BIFF_FILEPASS:
            return None
        if record == _BIFF_BOUNDSHEET and size >= 6 and pos + 10 <= len(workbook):
            found = _BIFF_SHEET_TYPES.get(workbook[pos + 9])
            if found:
                return found
    return None


def _ppt_has_vba(document: bytes) -> bool:
    """Whether a ``PowerPoint Document`` stream holds a VBAInfoContainer whose VBAInfoAtom says
    the VBA project storage has data (``fHasMacros`` not 0), or more than
    :data:`MAX_PPT_VBA_INFOS` of them (a real presentation has at most one)."""
    at = document.find(_PPT_VBA_INFO)
    for _found in range(MAX_PPT_VBA_INFOS):
        if at < 0:
            return False
        flag = document[at + 20 : at + 24]
        if len(flag) == 4 and struct.unpack("<I", flag)[0] != 0:
            return True
        at = document.find(_PPT_VBA_INFO, at + 1)
    return at >= 0


def find_macros(ole: olefile.OleFileIO, mime_type: str) -> str | None:
    """What makes an opened compound file carry macros, or None.

    Args:
        ole: the file, opened by :func:`inspect`.
        mime_type: its type from its root streams (decides which main stream is read).

    Returns:
        A short description for the refusal's message: a VBA project storage
        (:data:`VBA_PROJECT_STORAGES`, at any depth); any storage holding a ``VBA`` storage with a
        ``dir`` stream (the VBA project layout of [MS-OVBA] §2.2.1, wherever it is: olevba's
        ``find_vba_projects`` also wants ``PROJECT`` and ``VBA/_VBA_PROJECT``, this takes less);
        in a workbook, an Excel 4.0 macro sheet or VBA module sheet; in a presentation, a
        VBAInfoAtom with ``fHasMacros`` set ([MS-PPT]).

    Raises:
        ArchiveRejected: ``ARCHIVE_CORRUPT`` when a main stream cannot be read.
    """
    for path, entry in _walk(ole):
        if entry.entry_type != olefile.STGTY_STORAGE:
            continue
        name = entry.name.lower()
        if name in VBA_PROJECT_STORAGES:
            return f"a VBA project (the {entry.name} storage)"
        if name == "vba" and any(
            kid.entry_type == olefile.STGTY_STREAM and kid.name.lower() == "dir" for kid in entry.kids
        ):
            return f"a VBA project ({'/'.join(path)}/dir)"
    if mime_type == MSEXCEL:
        workbook = _root_stream(ole, "workbook") or _root_stream(ole, "book")
        if workbook:
            return _excel_code_sheet(_stream(ole, workbook))
    if mime_type == MSPOWERPOINT:
        document = _root_stream(ole, "powerpoint document")
        if document and _ppt_has_vba(_stream(ole, document)):
            return "a VBA project (a PowerPoint VBAInfo record)"
    return None


_FIB_IDENT_WORD97 = 0xA5EC
_FIB_IDENT_WORD6 = 0xA5DC
_FIB_NFIB_WORD6_95 = range(0x0065, 0x006A)
_FIB_ENCRYPTED = 0x0100
_FIB_OBFUSCATED = 0x8000
_PPT_ENCRYPTED_TOKEN = 0xF3D1C4DF

WORD_97 = "Word 97–2003"
WORD_6_95 = "Word 6.0/95"
EXCEL_97 = "Excel 97–2003"
EXCEL_5_95 = "Excel 5.0/95"
POWERPOINT_97 = "PowerPoint 97–2003"
"""The legacy formats :func:`legacy_format` tells apart, by the file's own header (the names are
the refusal messages' and the docs'; ``hypermedia.engines.documents.filters.LEGACY_IMPORT_FILTERS`` maps
each to a LibreOffice import filter)."""


def _fib(word_document: bytes) -> tuple[int, int, int]:
    """``(wIdent, nFib, flags)`` of the FIB at the start of a ``WordDocument`` stream: the first
    12 bytes of [MS-DOC] §2.5.2 FibBase (Word 97 and later), laid out the same in Word 6.0 and
    Word 95's FIB (LibreOffice's ``WW8Fib`` reads both with one code path). Raises
    ArchiveRejected (``ARCHIVE_CORRUPT``) for a stream shorter than that."""
    if len(word_document) < 12:
        raise _corrupt("the WordDocument stream is too short for a FIB")
    ident, nfib = struct.unpack_from("<HH", word_document, 0)
    (flags,) = struct.unpack_from("<H", word_document, 10)
    return ident, nfib, flags


def find_encryption(ole: olefile.OleFileIO, mime_type: str) -> str | None:
    """What says an opened compound file of ``mime_type`` (from its root streams) is encrypted
    with a password, or None. Only headers are read, never anything encrypted.

    - Word 97–2003 and Word 6.0/95: the FIB's ``fEncrypted`` bit (0x0100 of the flags at offset
      10; [MS-DOC] §2.5.2, and the same bit in Word 6/95's FIB) or ``fObfuscated`` (0x8000, XOR
      obfuscation; [MS-DOC] says it implies ``fEncrypted``, both are looked at).
    - Excel 97–2003 (``Workbook``, BIFF8) and Excel 5.0/95 (``Book``, BIFF5/7): a ``FilePass``
      record (0x002F, [MS-XLS] §2.4.117) in the workbook globals, before their ``EOF``.
    - PowerPoint 97–2003: the ``Current User`` stream's ``CurrentUserAtom.headerToken``
      ([MS-PPT] §2.3.2: 0xF3D1C4DF for an encrypted document, 0xE391C05F otherwise), or an
      ``EncryptedSummary`` root stream ([MS-PPT] §2.3.7, where an encrypted presentation keeps its
      summary information).

    Measured on real encrypted files (msoffcrypto-tool's and oletools' test files): the
    ``.doc`` has flags 0x13F0, the ``.xls`` a ``FilePass`` second, the ``.ppt`` the token.

    Raises:
        ArchiveRejected: ``ARCHIVE_CORRUPT`` when a stream cannot be read, or a
            ``WordDocument`` stream is too short for a FIB.
    """
    if mime_type == MSWORD:
        word = _root_stream(ole, "worddocument")
        if word:
            _ident, _nfib, flags = _fib(_stream_head(ole, word, 12))
            if flags & _FIB_OBFUSCATED:
                return "Word XOR obfuscation (the FIB's fObfuscated flag)"
            if flags & _FIB_ENCRYPTED:
                return "Word encryption (the FIB's fEncrypted flag)"
    if mime_type == MSEXCEL:
        workbook = _root_stream(ole, "workbook") or _root_stream(ole, "book")
        if workbook and any(r == _BIFF_FILEPASS for r, _p, _s in _workbook_globals(_stream(ole, workbook))):
            return f"Excel encryption (a FilePass record in the {workbook[0]} stream)"
    if mime_type == MSPOWERPOINT:
        if _root_stream(ole, "encryptedsummary"):
            return "PowerPoint encryption (an EncryptedSummary stream)"
        current_user = _root_stream(ole, "current user")
        if current_user:
            atom = _stream_head(ole, current_user, 16)
            if len(atom) == 16 and struct.unpack_from("<I", atom, 12)[0] == _PPT_ENCRYPTED_TOKEN:
                return "PowerPoint encryption (the Current User stream's header token)"
    return None


def legacy_format(data: bytes) -> tuple[str, str | None]:
    """Which legacy Office format a compound file is, by its own header, and whether it is
    encrypted: what the docworker chooses LibreOffice's import filter by (issue 15: every
    ``.doc`` was opened with Word 97's filter, and a Word 6.0/95 file failed ``PARSE_ERROR``).

    - ``WordDocument``: the FIB's ``wIdent`` 0xA5EC is :data:`WORD_97`; 0xA5DC with ``nFib``
      101–105 (Word 6.0 for Windows 101, for the Macintosh 103, Word 95 104; the range
      LibreOffice's Word 6 reader accepts) is :data:`WORD_6_95`. Word 97's FIB also has its
      tables in a ``0Table``/``1Table`` stream, which Word 6/95 files lack (LibreOffice's own type
      detection tells the two apart by those streams, ``SwIoSystem::IsValidStgFilter``).
    - ``Workbook`` is :data:`EXCEL_97` (BIFF8; LibreOffice's Excel 97 filter also reads a BIFF5
      ``Workbook``); a ``Book`` stream without it is :data:`EXCEL_5_95` (BIFF5, or Excel 95's
      BIFF7).
    - ``PowerPoint Document`` is :data:`POWERPOINT_97`.

    Returns:
        ``(format, encryption)``: one of the names above, or a description of what the file is
        instead (``"Word (FIB ident 0xA5DB, nFib 45)"``, ``"a compound file of no Office
        format"``), and :func:`find_encryption` of it.

    Raises:
        ArchiveRejected: as :func:`inspect`.
    """
    ole = _open(data)
    try:
        mime_type = next((mime for name, mime in MIME_BY_MAIN_STREAM if _root_stream(ole, name)), OLE_STORAGE)
        encryption = find_encryption(ole, mime_type)
        if any(_root_stream(ole, name) for name in ENCRYPTED_PACKAGE_STREAMS):
            encryption = "an encrypted OOXML package"
        if mime_type == MSWORD:
            word = _root_stream(ole, "worddocument")
            assert word is not None
            ident, nfib, _flags = _fib(_stream_head(ole, word, 12))
            if ident == _FIB_IDENT_WORD97:
                return WORD_97, encryption
            if ident == _FIB_IDENT_WORD6 and nfib in _FIB_NFIB_WORD6_95:
                return WORD_6_95, encryption
            return f"Word (FIB ident 0x{ident:04X}, nFib {nfib})", encryption
        if mime_type == MSEXCEL:
            return (EXCEL_97 if _root_stream(ole, "workbook") else EXCEL_5_95), encryption
        if mime_type == MSPOWERPOINT:
            return POWERPOINT_97, encryption
        return "a compound file of no Office format", encryption
    finally:
        ole.close()


def inspect(data: bytes) -> CompoundFile:
    """Parse a compound file's directory and say what it is and whether it carries macros.

    Args:
        data: the whole file (:func:`is_ole` of its head is true).

    Returns:
        Its MIME type from its root streams (see the module docstring; :data:`OLE_STORAGE` for a
        document encrypted with a password, :func:`find_encryption`, or an encrypted OOXML
        package), what makes it carry macros (:func:`find_macros`, judged by its root streams'
        family, encrypted or not: VBA storages are not encrypted), or None, and what says it is
        encrypted, or None.

    Raises:
        ArchiveRejected: ``ARCHIVE_CORRUPT`` for a file olefile cannot parse or finds incorrect
            ([MS-CFB]: header, FAT, DIFAT, directory, sector chains; a sibling tree deeper than
            Python's recursion limit), ``ARCHIVE_TOO_MANY_ENTRIES`` for a directory of more than
            :data:`archives.MAX_ENTRIES` entries.
    """
    ole = _open(data)
    try:
        if any(_root_stream(ole, name) for name in ENCRYPTED_PACKAGE_STREAMS):
            return CompoundFile(OLE_STORAGE, find_macros(ole, OLE_STORAGE), "an encrypted OOXML package")
        mime_type = next((mime for name, mime in MIME_BY_MAIN_STREAM if _root_stream(ole, name)), OLE_STORAGE)
        macros = find_macros(ole, mime_type)
        encryption = find_encryption(ole, mime_type)
        return CompoundFile(OLE_STORAGE if encryption else mime_type, macros, encryption)
    finally:
        ole.close()
