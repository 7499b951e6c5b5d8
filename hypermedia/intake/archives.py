"""Zip containers (OOXML, ODF, any zip) inspected from their central directory before anything
unpacks them, and the office macros they may carry.

:func:`inspect` reads only the end-of-central-directory record, the central directory and each
entry's 30-byte local header; no entry is decompressed. It refuses, each with its own
``error_code`` (HTTP 422):

- ``ARCHIVE_CORRUPT``: an end record or central directory that does not parse, bytes hidden before
  or after the archive's structures, a local header that is missing or names another file, an entry
  that runs past the central directory, a stored entry whose sizes differ, two entries with one name
  (and, in an office package, :func:`check_part_names`: two names that differ only in case or in
  ``/`` against ``\\``).
- ``ARCHIVE_TOO_MANY_ENTRIES``: more than :data:`MAX_ENTRIES` entries (declared or present).
- ``ARCHIVE_UNSAFE_PATH``: an entry name that is absolute (``/x``, ``\\x``, ``C:x``), has a ``..``
  component or a NUL.
- ``ARCHIVE_OVERLAPPING_ENTRIES``: two entries whose local records share bytes or a header offset.
  This is the "overlapping files" zip bomb of David Fifield, *A better zip bomb* (WOOT '19,
  https://www.bamsoftware.com/hacks/zipbomb/): many central directory entries point into one
  highly compressed kernel, which reaches ratios of 28 million:1 without any single entry looking
  unusual. Legitimate archives never share bytes between entries.
- ``ARCHIVE_COMPRESSION_RATIO``: an entry above :data:`RATIO_GRACE_BYTES` that declares more than
  :data:`MAX_COMPRESSION_RATIO` times its compressed size (DEFLATE itself cannot exceed about
  1032:1, zlib's technical notes; the classic single-entry bomb sits near that ceiling).
- ``ARCHIVE_TOO_LARGE``: declared uncompressed sizes adding up to more than
  :data:`MAX_TOTAL_UNCOMPRESSED_BYTES`.
- ``ARCHIVE_NESTED_TOO_DEEP`` (from :mod:`hypermedia.intake.nested`, which checks the packages inside an
  office package as packages of their own): packages nested deeper than ``nested.MAX_DEPTH``.

Declared sizes are what a later reader trusts to bound its output (Python's ``zipfile`` stops at
the declared size and checks the CRC), so checking declared sizes is enough for readers that do.
:func:`find_macros` then names macro content: ``vbaProject.bin`` anywhere, macro-enabled or macro
parts in an OOXML package's ``[Content_Types].xml``, ODF ``Basic/`` and ``Scripts/`` (at any
depth: an embedded ODF object's own ``Object 1/Basic/``); :mod:`hypermedia.intake.nested` applies it
to every package inside the package.
"""

from __future__ import annotations

import io
import itertools
import re
import struct
import zipfile
from dataclasses import dataclass, field
from xml.parsers import expat

from hypermedia.core.errors import InvalidArgument, UnsupportedInput

MAX_ENTRIES = 10_000
"""Most entries an archive may have. A large real workbook or presentation has a few hundred to a
few thousand parts (one per sheet, slide, image and relationship file); zip bombs of the
"many small files" kind (e.g. 42.zip's 16 × 16 × … fan-out, or Fifield's bomb with 65,534 entries)
need far more."""

MAX_TOTAL_UNCOMPRESSED_BYTES = 512 * 1024 * 1024
"""Largest sum of declared uncompressed entry sizes (bytes): 512 MiB, five times the largest
upload (``HM_MAX_UPLOAD_BYTES``, 100 MiB) and a quarter of a sandbox's 2 GiB address space, so an
archive that passes cannot by itself exhaust a worker's memory or disk."""

MAX_COMPRESSION_RATIO = 100
"""Highest accepted ratio of an entry's declared uncompressed size to its compressed size. Apache
POI's ``ZipSecureFile`` (the reader most OOXML servers use) refuses the same 1:100
(``MIN_INFLATE_RATIO = 0.01``); text-heavy XML parts of real documents compress 5–30:1."""

RATIO_GRACE_BYTES = 100 * 1024
"""Entries of at most this many declared uncompressed bytes skip the ratio check: tiny, repetitive
parts (an empty sheet, a styles part) legitimately compress far better than 100:1 and cannot hurt.
Apache POI's ``GRACE_ENTRY_SIZE`` is the same 100 KiB."""

MAX_CONTENT_TYPES_BYTES = 1024 * 1024
"""Largest ``[Content_Types].xml`` that is read to type an OOXML package (bytes); real ones are a
few kilobytes."""

_EOCD = struct.Struct("<4s4H2LH")
_EOCD64_LOCATOR = struct.Struct("<4sLQL")
_EOCD64 = struct.Struct("<4sQ2H2L4Q")
_CENTRAL = struct.Struct("<4s4B4HL2L5H2L")
_LOCAL = struct.Struct("<4s2B4HL2L2H")
_MAX_COMMENT = 0xFFFF
_DRIVE = re.compile(r"^[A-Za-z]:")

ZIP_SIGNATURES = (b"PK\x03\x04", b"PK\x05\x06")
"""How a zip starts: a local file header, or the end record of an empty archive."""


class ArchiveRejected(InvalidArgument):
    """An archive refused from its central directory, before anything unpacked it (HTTP 422).
    ``error_code`` is one of the ``ARCHIVE_*`` codes of this module."""

    default_code = "ARCHIVE_CORRUPT"


class MacrosNotAllowed(UnsupportedInput):
    """An office document that carries macros (HTTP 415, ``MACROS_NOT_ALLOWED``), whatever its
    name or claimed type."""

    default_code = "MACROS_NOT_ALLOWED"


def _corrupt(detail: str) -> ArchiveRejected:
    return ArchiveRejected(f"the archive is corrupt: {detail}", "ARCHIVE_CORRUPT")


def is_zip(head: bytes) -> bool:
    """Whether content starting with ``head`` is a zip container and must pass :func:`inspect`."""
    return head.startswith(ZIP_SIGNATURES)


@dataclass(frozen=True)
class PackageTypes:
    """The content types an OOXML package's ``[Content_Types].xml`` declares (lowercased, without
    parameters): ``defaults`` by file extension, ``overrides`` by part name."""

    defaults: dict[str, str] = field(default_factory=dict)
    overrides: dict[str, str] = field(default_factory=dict)

    def all_types(self) -> list[str]:
        """Every declared content type, overrides first."""
        return [*self.overrides.values(), *self.defaults.values()]


class Archive:
    """A zip that passed :func:`inspect`: its entries, and bounded reads of small ones."""

    def __init__(self, zf: zipfile.ZipFile) -> None:
        self._zf = zf
        self.entries: list[zipfile.ZipInfo] = zf.infolist()

    @property
    def total_uncompressed_bytes(self) -> int:
        return sum(i.file_size for i in self.entries)

    def find(self, name: str) -> list[zipfile.ZipInfo]:
        """Entries named ``name``, compared case-insensitively (OPC part names are)."""
        wanted = name.lower()
        return [i for i in self.entries if i.filename.lower() == wanted]

    def read_head(self, info: zipfile.ZipInfo, size: int) -> bytes:
        """The first ``size`` decompressed bytes of one entry (fewer for a shorter one). Raises
        ArchiveRejected (ARCHIVE_CORRUPT) when they cannot be decompressed."""
        try:
            with self._zf.open(info) as stream:
                return stream.read(size)
        except Exception:  # as read: CRC, method, encryption
            raise _corrupt(f"{info.filename} cannot be read") from None

    def read(self, info: zipfile.ZipInfo, limit: int) -> bytes:
        """The decompressed bytes of one entry of at most ``limit`` declared bytes. Raises
        ArchiveRejected (ARCHIVE_CORRUPT) when it is larger, unreadable or fails its CRC."""
        if info.file_size > limit:
            raise _corrupt(f"{info.filename} is larger than {limit} bytes")
        try:
            with self._zf.open(info) as stream:
                data = stream.read(limit + 1)
        except Exception:  # any failure to decompress one small part: CRC, method, encryption
            raise _corrupt(f"{info.filename} cannot be read") from None
        if len(data) > limit:
            raise _corrupt(f"{info.filename} is larger than {limit} bytes")
        return data


def _end_record(data: bytes) -> tuple[int, int, int, int]:
    """``(entries, cd_offset, cd_size, cd_end)`` from the end of central directory record (zip64
    when present), where ``cd_end`` is where the central directory must end. Requires the record
    and its comment to end the file, and a single-disk archive."""
    start = data.rfind(b"PK\x05\x06", max(0, len(data) - _EOCD.size - _MAX_COMMENT))
    if start < 0 or start + _EOCD.size > len(data):
        raise _corrupt("no end of central directory record")
    _sig, disk, cd_disk, on_disk, entries, cd_size, cd_offset, comment = _EOCD.unpack_from(data, start)
    if start + _EOCD.size + comment != len(data):
        raise _corrupt("bytes after the end of central directory record")
    cd_end = start
    locator = start - _EOCD64_LOCATOR.size
    if locator >= 0 and data[locator : locator + 4] == b"PK\x06\x07":
        _sig, _disk, record, _disks = _EOCD64_LOCATOR.unpack_from(data, locator)
        if record + _EOCD64.size > locator or data[record : record + 4] != b"PK\x06\x06":
            raise _corrupt("bad zip64 end of central directory record")
        (_sig, _size, _made, _needed, disk, cd_disk, on_disk, entries, cd_size, cd_offset) = (
            _EOCD64.unpack_from(data, record)
        )
        cd_end = record
    if disk != 0 or cd_disk != 0 or on_disk != entries:
        raise _corrupt("multi-disk archives are not supported")
    if cd_offset + cd_size != cd_end:
        raise _corrupt("the central directory is not where the end record says")
    return entries, cd_offset, cd_size, cd_end


def _count_central_entries(data: bytes, cd_offset: int, cd_end: int) -> int:
    """Walk the central directory's fixed headers, stopping after ``MAX_ENTRIES + 1`` (so a
    directory of millions of records costs nothing to refuse)."""
    pos, count = cd_offset, 0
    while pos < cd_end:
        if count == MAX_ENTRIES:
            raise ArchiveRejected(
                f"archives may have at most {MAX_ENTRIES} entries", "ARCHIVE_TOO_MANY_ENTRIES"
            )
        if pos + _CENTRAL.size > cd_end or data[pos : pos + 4] != b"PK\x01\x02":
            raise _corrupt("bad central directory record")
        fields = _CENTRAL.unpack_from(data, pos)
        pos += _CENTRAL.size + fields[12] + fields[13] + fields[14]
        count += 1
    if pos != cd_end:
        raise _corrupt("the central directory overruns its declared size")
    return count


def _check_name(info: zipfile.ZipInfo) -> None:
    raw = info.orig_filename
    parts = re.split(r"[/\\]", raw)
    if "\x00" in raw or raw.startswith(("/", "\\")) or _DRIVE.match(raw) or ".." in parts:
        raise ArchiveRejected(
            "the archive has an entry with an absolute path or a '..' component", "ARCHIVE_UNSAFE_PATH"
        )


def fold_name(name: str) -> str:
    """An entry name as a case-insensitive reader sees it: lowercased, ``\\`` as ``/``.

    OPC part names are case-insensitive (ECMA-376 Part 2 §9.1.1.1), Windows file systems match names
    without case, and :meth:`Archive.find` does too; LibreOffice 7.4 and Python's ``zipfile`` match
    them exactly (measured: of ``word/document.xml`` and ``Word/Document.xml`` in one docx,
    LibreOffice reads the first in either order, and does not open a docx holding only the
    second). So ``word/document.xml`` and ``Word/Document.xml`` are one part to some readers and
    two to others, and which one a reader takes differs: :func:`check_part_names` refuses such
    pairs in office packages."""
    return name.replace("\\", "/").lower()


def check_part_names(archive: Archive) -> None:
    """Refuses an office package (OOXML or ODF) two of whose entry names are one name to a
    case-insensitive reader (:func:`fold_name`). Only for office packages: a plain zip may hold
    ``xt_DSCP.c`` and ``xt_dscp.c`` (the Linux tree does), and nothing here opens plain zips.

    Raises:
        ArchiveRejected: ``ARCHIVE_CORRUPT``.
    """
    folded: set[str] = set()
    for info in archive.entries:
        name = fold_name(info.orig_filename)
        if name in folded:
            raise _corrupt("two entries have names that differ only in case or in '/' against '\\'")
        folded.add(name)


def _local_span(data: bytes, info: zipfile.ZipInfo, cd_offset: int) -> tuple[int, int]:
    """``[start, end)`` of an entry's local header, name, extra field and compressed data."""
    start = info.header_offset
    if start < 0 or start + _LOCAL.size > cd_offset or data[start : start + 4] != b"PK\x03\x04":
        raise _corrupt("an entry's local header is missing")
    fields = _LOCAL.unpack_from(data, start)
    end = start + _LOCAL.size + fields[10] + fields[11] + info.compress_size
    if end > cd_offset:
        raise _corrupt("an entry runs past the central directory")
    return start, end


def _local_name_matches(data: bytes, info: zipfile.ZipInfo) -> bool:
    """Whether the local header names the same file as the central record (readers differ on
    which one they believe)."""
    start = info.header_offset + _LOCAL.size
    name = data[start : start + _LOCAL.unpack_from(data, info.header_offset)[10]]
    return name.decode("utf-8" if info.flag_bits & 0x800 else "cp437", "replace") == info.orig_filename


def inspect(data: bytes) -> Archive:
    """Check a zip from its central directory; nothing is decompressed.

    Args:
        data: the whole file (a zip: :func:`is_zip` of its head is true).

    Returns:
        The archive, for :func:`package_types` and :func:`find_macros`.

    Raises:
        ArchiveRejected: ``ARCHIVE_CORRUPT``, ``ARCHIVE_TOO_MANY_ENTRIES``, ``ARCHIVE_UNSAFE_PATH``,
            ``ARCHIVE_OVERLAPPING_ENTRIES``, ``ARCHIVE_COMPRESSION_RATIO`` or ``ARCHIVE_TOO_LARGE``
            (see the module docstring), checked in that order except that ``ARCHIVE_CORRUPT`` is
            raised at the step that finds the fault.
    """
    declared, cd_offset, _cd_size, cd_end = _end_record(data)
    if declared > MAX_ENTRIES:
        raise ArchiveRejected(f"archives may have at most {MAX_ENTRIES} entries", "ARCHIVE_TOO_MANY_ENTRIES")
    if _count_central_entries(data, cd_offset, cd_end) != declared:
        raise _corrupt("the central directory and its end record disagree on the number of entries")
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, struct.error, OverflowError, EOFError):
        raise _corrupt("the central directory does not parse") from None
    archive = Archive(zf)
    if len(archive.entries) != declared:
        raise _corrupt("the central directory does not parse")

    seen: set[str] = set()
    for info in archive.entries:
        _check_name(info)
        if info.orig_filename in seen:
            raise _corrupt("two entries have the same name")
        seen.add(info.orig_filename)

    spans = sorted(_local_span(data, info, cd_offset) for info in archive.entries)
    for (start, end), (next_start, _next_end) in itertools.pairwise(spans):
        if next_start < end or next_start == start:
            raise ArchiveRejected("the archive has overlapping entries", "ARCHIVE_OVERLAPPING_ENTRIES")
    if not all(_local_name_matches(data, info) for info in archive.entries):
        raise _corrupt("an entry's local header names another file")

    for info in archive.entries:
        if info.compress_type == zipfile.ZIP_STORED and info.file_size != info.compress_size:
            raise _corrupt("a stored entry declares two different sizes")
        if info.file_size > RATIO_GRACE_BYTES and info.file_size > MAX_COMPRESSION_RATIO * info.compress_size:
            raise ArchiveRejected(
                f"an entry expands more than {MAX_COMPRESSION_RATIO} times (a zip bomb)",
                "ARCHIVE_COMPRESSION_RATIO",
            )
    if archive.total_uncompressed_bytes > MAX_TOTAL_UNCOMPRESSED_BYTES:
        raise ArchiveRejected(
            f"archives may expand to at most {MAX_TOTAL_UNCOMPRESSED_BYTES} bytes", "ARCHIVE_TOO_LARGE"
        )
    return archive


class _DoctypeForbidden(Exception):
    pass


def _forbid(*_args: object) -> None:
    raise _DoctypeForbidden


def _media_type(value: str) -> str:
    return value.split(";", 1)[0].strip().lower()


def package_types(archive: Archive) -> PackageTypes | None:
    """The parsed ``[Content_Types].xml`` of an OOXML package (ECMA-376 Part 2, Open Packaging
    Conventions §10.1.2), or None when the archive has none. Call only after :func:`inspect`.

    The part is read with a bound of :data:`MAX_CONTENT_TYPES_BYTES`, and parsed by expat with
    DOCTYPE and entity declarations refused (OPC forbids DTDs), so no entity can expand.

    Raises:
        ArchiveRejected: ``ARCHIVE_CORRUPT`` for several such parts, an oversized or unreadable
            one, or XML that does not parse.
    """
    found = archive.find("[Content_Types].xml")
    if not found:
        return None
    if len(found) > 1:
        raise _corrupt("more than one [Content_Types].xml")
    raw = archive.read(found[0], MAX_CONTENT_TYPES_BYTES)
    types = PackageTypes()
    parser = expat.ParserCreate(namespace_separator=" ")
    parser.StartDoctypeDeclHandler = _forbid
    parser.EntityDeclHandler = _forbid

    def start(name: str, attrs: dict[str, str]) -> None:
        local = name.rsplit(" ", 1)[-1]
        content_type = _media_type(attrs.get("ContentType", ""))
        if local == "Default" and content_type:
            types.defaults[attrs.get("Extension", "").lower()] = content_type
        elif local == "Override" and content_type:
            types.overrides[attrs.get("PartName", "").lower()] = content_type

    parser.StartElementHandler = start
    try:
        parser.Parse(raw, True)
    except (expat.ExpatError, _DoctypeForbidden, ValueError):
        raise _corrupt("[Content_Types].xml is not valid") from None
    return types


MACRO_CONTENT_TYPES = frozenset(
    {
        "application/vnd.ms-office.vbaproject",
        "application/vnd.ms-office.vbaprojectsignature",
        "application/vnd.ms-office.vbaprojectsignatureagile",
        "application/vnd.ms-office.vbaprojectsignaturev3",
        "application/vnd.ms-word.vbadata+xml",
        "application/vnd.ms-excel.macrosheet+xml",
        "application/vnd.ms-excel.intlmacrosheet+xml",
    }
)
"""OOXML part content types that hold macros ([MS-OFFMACRO2]: the VBA project, its signatures and
data; [MS-XLSX] §2.1: Excel 4.0 macro sheets). Any type containing ``macroenabled`` also counts."""

ODF_MACRO_FOLDERS = frozenset({"basic", "scripts"})
"""Folders of an ODF package (at the top, or of an embedded object) that hold macros: StarBasic libraries (``Basic/``) and
scripts in other languages (``Scripts/``, e.g. Python, JavaScript, BeanShell)."""


def find_macros(archive: Archive, types: PackageTypes | None) -> str | None:
    """What makes the archive carry macros, or None: an entry named ``vbaProject.bin``
    (case-insensitive, in any folder), a macro-enabled or macro part content type in
    ``[Content_Types].xml``, or, in an ODF package (a ``mimetype`` entry or
    ``META-INF/manifest.xml``), a ``Basic/`` or ``Scripts/`` folder at any depth (an embedded
    object ``Object 1/`` is a sub-document with its own; LibreOffice loads its libraries)."""
    for info in archive.entries:
        if re.split(r"[/\\]", info.filename)[-1].lower() == "vbaproject.bin":
            return "a VBA project (vbaProject.bin)"
    for content_type in types.all_types() if types else ():
        if "macroenabled" in content_type or content_type in MACRO_CONTENT_TYPES:
            return f"a macro part ({content_type})"
    if archive.find("mimetype") or archive.find("META-INF/manifest.xml"):
        for info in archive.entries:
            if any(part.lower() in ODF_MACRO_FOLDERS for part in re.split(r"[/\\]", info.filename)[:-1]):
                return "ODF macros (Basic/ or Scripts/)"
    return None


ODF_MANIFEST_NS = "urn:oasis:names:tc:opendocument:xmlns:manifest:1.0"

MAX_MANIFEST_BYTES = 16 * 1024 * 1024
"""Largest ODF ``META-INF/manifest.xml`` read for :func:`find_encryption` (bytes): a file entry
takes about 150 bytes, with its ``encryption-data`` about 700, so 10,000 entries (:data:`MAX_ENTRIES`)
of an encrypted package fit."""


class _Found(Exception):
    pass


def find_encryption(archive: Archive) -> str | None:
    """What says an ODF package is encrypted with a password, or None: a
    ``manifest:encryption-data`` element in ``META-INF/manifest.xml`` (ODF 1.2 Part 3 §4.4: each
    encrypted part's file entry carries one; LibreOffice writes it for every part of a document
    saved with a password, only ``mimetype`` and the manifest stay plain; measured, LibreOffice
    7.4). The manifest is parsed by expat (namespaces resolved, a DOCTYPE allowed as old
    OpenOffice.org manifests name one, entity declarations refused), at most
    :data:`MAX_MANIFEST_BYTES`; one that does not parse is not judged here (LibreOffice refuses
    it later, ``PARSE_ERROR``). A part encrypted by the zip itself (bit 0 of its flags) never gets
    here: the check for embedded packages cannot read it (``ARCHIVE_CORRUPT``).

    Raises:
        ArchiveRejected: ``ARCHIVE_CORRUPT`` for a manifest that is larger or cannot be
            decompressed.
    """
    manifests = archive.find("META-INF/manifest.xml")
    if not manifests:
        return None
    manifest = archive.read(manifests[0], MAX_MANIFEST_BYTES)
    parser = expat.ParserCreate(namespace_separator=" ")
    parser.EntityDeclHandler = _forbid

    def start(name: str, _attrs: dict[str, str]) -> None:
        if name == f"{ODF_MANIFEST_NS} encryption-data":
            raise _Found

    parser.StartElementHandler = start
    try:
        parser.Parse(manifest, True)
    except _Found:
        return "ODF encryption (encryption-data in META-INF/manifest.xml)"
    except (expat.ExpatError, _DoctypeForbidden, ValueError):
        return None
    return None
