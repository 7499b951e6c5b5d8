"""Validation at upload: hostile archives, macro documents, lying names and types, hostile file
names. Every file is generated here. The archive checks are unit-tested on ``hypermedia.intake.archives``;
every case is then sent through REST to a real platform (`hypermedia up` on its own database),
checking the status, the ``error_code`` and that a refused upload left no row and no bytes."""

from __future__ import annotations

import asyncio
import functools
import io
import json
import os
import re
import secrets
import struct
import time
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import psycopg
import pytest
import pyvips

from hypermedia.api.jobs.v1 import jobs_pb2, jobs_pb2_grpc
from hypermedia.intake import archives, contenttype
from services.gateway.uploads import display_name
from tests.e2e.conftest import RunningPlatform, isolated_platform, wait_job
from tests.helpers.legacy_office import doc_with_vba, legacy_document
from tests.helpers.office import BASIC_LIBRARY, fodt_with_basic

# -- generated files -----------------------------------------------------------------------------

DOCX = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
XLSX = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"
PPTX = "application/vnd.openxmlformats-officedocument.presentationml.presentation"
ODT = "application/vnd.oasis.opendocument.text"
MSWORD = "application/msword"
MAIN_DOCX = DOCX + ".main+xml"
MAIN_DOCM = "application/vnd.ms-word.document.macroEnabled.main+xml"
MAIN_XLSX = XLSX + ".main+xml"
MAIN_XLSM = "application/vnd.ms-excel.sheet.macroEnabled.main+xml"
MAIN_PPTX = PPTX + ".main+xml"
GiB = 1 << 30
MiB = 1 << 20

_RELS = (
    '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>'
    '<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">'
    '<Relationship Id="rId1" Target="{target}" '
    'Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/officeDocument"/>'
    "</Relationships>"
)
_WORD = (
    '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>'
    '<w:document xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main">'
    "<w:body><w:p><w:r><w:t>Quarterly report</w:t></w:r></w:p></w:body></w:document>"
)


def content_types(main_part: str, main_type: str, extra: str = "") -> bytes:
    return (
        '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>'
        '<Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types">'
        '<Default Extension="rels" ContentType="application/vnd.openxmlformats-package.relationships+xml"/>'
        '<Default Extension="xml" ContentType="application/xml"/>'
        f'<Override PartName="/{main_part}" ContentType="{main_type}"/>{extra}</Types>'
    ).encode()


def ooxml(
    main_part: str = "word/document.xml",
    main_type: str = MAIN_DOCX,
    body: str = _WORD,
    extra: dict[str, bytes] | None = None,
    extra_types: str = "",
) -> bytes:
    """A minimal OOXML package (what Word needs to open a docx: content types, the package
    relationship and the main part), written with zipfile."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("[Content_Types].xml", content_types(main_part, main_type, extra_types))
        zf.writestr("_rels/.rels", _RELS.format(target=main_part))
        zf.writestr(main_part, body)
        for name, data in (extra or {}).items():
            zf.writestr(name, data)
    return out.getvalue()


def odt(extra: dict[str, bytes] | None = None) -> bytes:
    """A minimal ODF text document: ``mimetype`` first and stored, the manifest, the content."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(zipfile.ZipInfo("mimetype"), ODT, compress_type=zipfile.ZIP_STORED)
        zf.writestr(
            "META-INF/manifest.xml",
            '<?xml version="1.0" encoding="UTF-8"?>'
            '<manifest:manifest xmlns:manifest="urn:oasis:names:tc:opendocument:xmlns:manifest:1.0" '
            'manifest:version="1.2"><manifest:file-entry manifest:full-path="/" '
            f'manifest:media-type="{ODT}"/><manifest:file-entry manifest:full-path="content.xml" '
            'manifest:media-type="text/xml"/></manifest:manifest>',
        )
        zf.writestr(
            "content.xml",
            '<?xml version="1.0" encoding="UTF-8"?><office:document-content '
            'xmlns:office="urn:oasis:names:tc:opendocument:xmlns:office:1.0" '
            'xmlns:text="urn:oasis:names:tc:opendocument:xmlns:text:1.0" office:version="1.2">'
            "<office:body><office:text><text:p>Minutes</text:p></office:text></office:body>"
            "</office:document-content>",
        )
        for name, data in (extra or {}).items():
            zf.writestr(name, data)
    return out.getvalue()


@dataclass
class Raw:
    """One entry of a hand-written zip: the bytes after its local header as they are, sizes as
    declared. ``same_local_as`` makes its central record point at another entry's local header."""

    name: str
    payload: bytes = b""
    method: int = zipfile.ZIP_STORED
    crc: int | None = None
    size: int | None = None
    same_local_as: int | None = None
    local_name: str | None = None
    compressed_size: int | None = None


def raw_zip(entries: list[Raw], *, trailing: bytes = b"", declared_entries: int | None = None) -> bytes:
    """A zip written field by field (APPNOTE.TXT §4.3), for archives zipfile refuses to write."""
    out = bytearray()
    offsets: list[int] = []
    for entry in entries:
        if entry.same_local_as is not None:
            offsets.append(offsets[entry.same_local_as])
            continue
        offsets.append(len(out))
        name = (entry.local_name or entry.name).encode()
        crc = zlib.crc32(entry.payload) if entry.crc is None else entry.crc
        size = len(entry.payload) if entry.size is None else entry.size
        out += struct.pack(
            "<4s2B4HL2L2H", b"PK\x03\x04", 20, 0, 0x800, entry.method, 0, 0x21, crc,
            len(entry.payload) if entry.compressed_size is None else entry.compressed_size, size, len(name), 0,
        )  # fmt: skip
        out += name + entry.payload
    cd_offset = len(out)
    for entry, offset in zip(entries, offsets, strict=True):
        source = entries[entry.same_local_as] if entry.same_local_as is not None else entry
        name = entry.name.encode()
        crc = zlib.crc32(source.payload) if source.crc is None else source.crc
        size = len(source.payload) if source.size is None else source.size
        out += struct.pack(
            "<4s4B4HL2L5H2L", b"PK\x01\x02", 20, 3, 20, 0, 0x800, source.method, 0, 0x21, crc,
            len(source.payload) if source.compressed_size is None else source.compressed_size, size,
            len(name), 0, 0, 0, 0, 0, offset,
        )  # fmt: skip
        out += name
    count = len(entries) if declared_entries is None else declared_entries
    out += struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, count, count, len(out) - cd_offset, cd_offset, 0)
    return bytes(out + trailing)


@functools.cache
def zeros_deflated(total: int) -> tuple[bytes, int]:
    """A raw DEFLATE stream of ``total`` zero bytes and its CRC-32, made cheaply: one MiB of zeros
    compressed with a full flush (which resets the compressor, so the same bytes encode every
    further MiB) repeated, then an empty final block. About 1 KiB per MiB."""
    comp = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = comp.compress(bytes(MiB)) + comp.flush(zlib.Z_FULL_FLUSH)
    crc = 0
    zeros = bytes(MiB)
    for _ in range(total // MiB):
        crc = zlib.crc32(zeros, crc)
    return block * (total // MiB) + zlib.compressobj(9, zlib.DEFLATED, -15).flush(), crc


@functools.cache
def ooxml_bomb() -> bytes:
    """A docx whose word/document.xml inflates to 1 GiB of zeros (about 1 MiB compressed)."""
    stream, crc = zeros_deflated(GiB)
    return raw_zip(
        [
            Raw("[Content_Types].xml", content_types("word/document.xml", MAIN_DOCX)),
            Raw("_rels/.rels", _RELS.format(target="word/document.xml").encode()),
            Raw("word/document.xml", stream, zipfile.ZIP_DEFLATED, crc=crc, size=GiB),
        ]
    )


@functools.cache
def many_entries() -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as zf:
        for i in range(archives.MAX_ENTRIES + 1):
            zf.writestr(f"e/{i}", b"")
    return out.getvalue()


def overlapping() -> bytes:
    """David Fifield's overlap, at its simplest: the central directory lists three files whose
    records all point at one local file (a real docx's main part)."""
    body = zlib.compressobj(9, zlib.DEFLATED, -15)
    stream = body.compress(_WORD.encode()) + body.flush()
    return raw_zip(
        [
            Raw("[Content_Types].xml", content_types("word/document.xml", MAIN_DOCX)),
            Raw("_rels/.rels", _RELS.format(target="word/document.xml").encode()),
            Raw(
                "word/document.xml",
                stream,
                zipfile.ZIP_DEFLATED,
                crc=zlib.crc32(_WORD.encode()),
                size=len(_WORD),
            ),
            Raw("word/document2.xml", same_local_as=2),
            Raw("word/document3.xml", same_local_as=2),
        ]
    )


def too_large() -> bytes:
    """Six entries of 1 MiB compressed each declaring 99 MiB (99:1, under the ratio cap): 594 MiB
    declared in all, above the 512 MiB total."""
    return raw_zip(
        [Raw(f"part{i}.bin", os.urandom(MiB), zipfile.ZIP_DEFLATED, size=99 * MiB) for i in range(6)]
    )


def png(width: int = 64, height: int = 48) -> bytes:
    """An RGB gradient PNG, written chunk by chunk."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(
        b"\x00" + bytes(v for x in range(width) for v in (x * 4 % 256, y * 5 % 256, 128))
        for y in range(height)
    )
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


PDF = (
    b"%PDF-1.4\n1 0 obj<</Type/Catalog/Pages 2 0 R>>endobj\n"
    b"2 0 obj<</Type/Pages/Kids[3 0 R]/Count 1>>endobj\n"
    b"3 0 obj<</Type/Page/Parent 2 0 R/MediaBox[0 0 200 200]>>endobj\n"
    b"trailer<</Root 1 0 R>>\n%%EOF\n"
)


def polyglot() -> bytes:
    """A real PNG with a zip appended after IEND: image viewers see the picture, unzip the payload."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zf:
        zf.writestr("payload.txt", "POLYGLOT-PAYLOAD-7d1f")
    return png() + out.getvalue()


# -- unit: hypermedia.intake.archives and contenttype -----------------------------------------------------


def _rejected(data: bytes) -> str:
    with pytest.raises(archives.ArchiveRejected) as caught:
        archives.inspect(data)
    assert caught.value.http_status == 422
    return caught.value.error_code


def test_generated_office_documents_pass_and_are_typed_from_inside() -> None:
    docx = ooxml()
    archive = archives.inspect(docx)
    assert [i.filename for i in archive.entries] == [
        "[Content_Types].xml",
        "_rels/.rels",
        "word/document.xml",
    ]
    assert contenttype.identify(docx) == DOCX
    assert contenttype.identify(ooxml("xl/workbook.xml", MAIN_XLSX, "<workbook/>")) == XLSX
    assert contenttype.identify(ooxml("ppt/presentation.xml", MAIN_PPTX, "<presentation/>")) == PPTX
    assert contenttype.identify(odt()) == ODT
    assert contenttype.kind(DOCX) == contenttype.kind(ODT) == "office"


def test_a_zip_is_typed_by_what_it_declares_not_by_the_names_in_its_head() -> None:
    plain = io.BytesIO()
    with zipfile.ZipFile(plain, "w") as zf:
        zf.writestr("notes.txt", "hello")
    # puremagic alone calls any zip a docx; a zip without an OOXML main part is a plain zip.
    assert contenttype.detect(plain.getvalue()) == DOCX
    assert contenttype.identify(plain.getvalue()) == "application/zip"
    no_main = ooxml(main_type="application/xml")
    assert contenttype.identify(no_main) == "application/zip"
    assert contenttype.identify(raw_zip([])) == "application/zip"


def test_the_ooxml_bomb_is_real_and_is_refused_for_its_ratio() -> None:
    bomb = ooxml_bomb()
    assert len(bomb) < 2 * MiB
    with zipfile.ZipFile(io.BytesIO(bomb)) as zf:
        info = zf.getinfo("word/document.xml")
        assert info.file_size == GiB
        with zf.open(info) as stream:
            assert stream.read(4 * MiB) == bytes(4 * MiB)  # it really inflates (we stop early)
    assert _rejected(bomb) == "ARCHIVE_COMPRESSION_RATIO"


def test_compression_ratio_cap_spares_small_entries_and_catches_large_ones() -> None:
    small = zlib.compressobj(9, zlib.DEFLATED, -15)
    tiny = small.compress(bytes(archives.RATIO_GRACE_BYTES)) + small.flush()
    assert archives.RATIO_GRACE_BYTES / len(tiny) > archives.MAX_COMPRESSION_RATIO
    archives.inspect(
        raw_zip([Raw("styles.xml", tiny, zipfile.ZIP_DEFLATED, size=archives.RATIO_GRACE_BYTES)])
    )
    stream, crc = zeros_deflated(2 * MiB)
    assert _rejected(raw_zip([Raw("a.xml", stream, zipfile.ZIP_DEFLATED, crc=crc, size=2 * MiB)])) == (
        "ARCHIVE_COMPRESSION_RATIO"
    )
    # A stored entry claiming more than it holds is a lie, not a ratio.
    assert _rejected(raw_zip([Raw("a.bin", b"x" * 10, size=10 * MiB)])) == "ARCHIVE_CORRUPT"


def test_total_declared_size_is_capped() -> None:
    assert _rejected(too_large()) == "ARCHIVE_TOO_LARGE"
    # Five of them (495 MiB declared) pass.
    archives.inspect(
        raw_zip([Raw(f"p{i}", os.urandom(MiB), zipfile.ZIP_DEFLATED, size=99 * MiB) for i in range(5)])
    )


def test_entry_count_is_capped_from_the_end_record_and_from_the_directory() -> None:
    assert _rejected(many_entries()) == "ARCHIVE_TOO_MANY_ENTRIES"
    exactly = io.BytesIO()
    with zipfile.ZipFile(exactly, "w") as zf:
        for i in range(archives.MAX_ENTRIES):
            zf.writestr(f"e/{i}", b"")
    assert len(archives.inspect(exactly.getvalue()).entries) == archives.MAX_ENTRIES
    # An end record that under-declares: the walk of the directory still counts.
    data = bytearray(many_entries())
    struct.pack_into("<2H", data, len(data) - 22 + 8, 5, 5)
    assert _rejected(bytes(data)) == "ARCHIVE_TOO_MANY_ENTRIES"
    # An end record declaring 65,535 entries: refused before the directory is read.
    started = time.monotonic()
    assert _rejected(raw_zip([Raw("a")], declared_entries=65535)) == "ARCHIVE_TOO_MANY_ENTRIES"
    assert time.monotonic() - started < 1


def test_overlapping_entries_are_refused() -> None:
    assert _rejected(overlapping()) == "ARCHIVE_OVERLAPPING_ENTRIES"
    # Partial overlap: an entry's local header sits inside the previous entry's data.
    first = Raw("a", b"A" * 100)
    data = bytearray(raw_zip([first, Raw("b", b"B" * 10)]))
    cd = struct.unpack_from("<L", data, len(data) - 22 + 16)[0]
    second_record = cd + 46 + 1
    struct.pack_into("<L", data, second_record + 42, 30 + 1 + 50)  # b's header offset: inside a's data
    data[30 + 1 + 50 : 30 + 1 + 50 + 31] = data[30 + 1 + 100 : 30 + 1 + 100 + 31]  # a copy of b's header
    assert _rejected(bytes(data)) == "ARCHIVE_OVERLAPPING_ENTRIES"


@pytest.mark.parametrize(
    "name",
    [
        "/etc/passwd",
        "\\windows\\win.ini",
        "C:/x.txt",
        "../evil.sh",
        "word/../../evil",
        "a\\..\\b",
        "a\x00.xml",
    ],
)
def test_entry_names_with_absolute_paths_or_dotdot_are_refused(name: str) -> None:
    assert _rejected(raw_zip([Raw("ok.txt", b"x"), Raw(name, b"y")])) == "ARCHIVE_UNSAFE_PATH"


def _doctype_package() -> bytes:
    evil = (
        b'<?xml version="1.0"?><!DOCTYPE Types [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;">]>'
        b'<Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types">'
        b'<Override PartName="/word/document.xml" ContentType="&b;"/></Types>'
    )
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zf:
        zf.writestr("[Content_Types].xml", evil)
        zf.writestr("word/document.xml", _WORD)
    return out.getvalue()


def _big_content_types_package() -> bytes:
    types = content_types(
        "word/document.xml",
        MAIN_DOCX,
        "<!--" + os.urandom(archives.MAX_CONTENT_TYPES_BYTES // 2).hex() + "-->",
    )
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("[Content_Types].xml", types)
        zf.writestr("word/document.xml", _WORD)
    return out.getvalue()


@pytest.mark.parametrize(
    ("what", "data"),
    [
        ("truncated central directory", ooxml()[:-30]),
        ("bytes after the end record", ooxml() + b"trailing"),
        ("garbage with a zip signature", b"PK\x03\x04" + os.urandom(200)),
        ("local header names another file", raw_zip([Raw("a.txt", b"x", local_name="b.txt")])),
        ("duplicate names", raw_zip([Raw("a.txt", b"x"), Raw("a.txt", b"y")])),
        ("entry runs into the central directory", raw_zip([Raw("a.txt", b"x" * 10, compressed_size=500)])),
        ("end record declares another count", raw_zip([Raw("a"), Raw("b")], declared_entries=1)),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_archives_that_do_not_parse_are_corrupt(what: str, data: bytes) -> None:
    assert _rejected(data) == "ARCHIVE_CORRUPT", what


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("word/document.xml", "Word/Document.xml"),
        ("[Content_Types].xml", "[content_types].XML"),
        ("word/media/image1.png", "word\\media\\image1.png"),
        ("xl/worksheets/sheet1.xml", "XL\\Worksheets\\Sheet1.XML"),
    ],
)
def test_entry_names_that_differ_only_in_case_or_separator_are_refused(first: str, second: str) -> None:
    archive = archives.inspect(raw_zip([Raw(first, b"x"), Raw("other.xml", b"z"), Raw(second, b"y")]))
    with pytest.raises(archives.ArchiveRejected) as caught:
        archives.check_part_names(archive)
    assert caught.value.error_code == "ARCHIVE_CORRUPT"
    assert "differ only in case" in caught.value.public_message
    # A plain zip may hold such names (the Linux tree has xt_DSCP.c and xt_dscp.c): it is a zip.
    linux = raw_zip([Raw("netfilter/xt_DSCP.c", b"x"), Raw("netfilter/xt_dscp.c", b"y")])
    assert contenttype.identify(linux) == "application/zip"
    # The docx form: the main part twice, once as Word writes it and once in other case.
    with pytest.raises(archives.ArchiveRejected) as caught:
        contenttype.identify(ooxml(extra={"Word/Document.xml": _WORD.replace("Quarterly", "Other").encode()}))
    assert caught.value.error_code == "ARCHIVE_CORRUPT"
    # Names that only look alike are fine.
    archives.check_part_names(
        archives.inspect(raw_zip([Raw("word/document.xml", b"x"), Raw("word/document2.xml", b"y")]))
    )
    archives.check_part_names(
        archives.inspect(raw_zip([Raw("a/b.xml", b"x"), Raw("a/b.xml.rels", b"y"), Raw("A/c.xml", b"z")]))
    )


@pytest.mark.parametrize("build", [_doctype_package, _big_content_types_package])
def test_content_types_with_a_dtd_or_above_1_mib_are_corrupt(build: Any) -> None:
    archives.inspect(build())  # the archive itself is fine
    with pytest.raises(archives.ArchiveRejected) as caught:
        contenttype.identify(build())
    assert caught.value.error_code == "ARCHIVE_CORRUPT"


def _macros(data: bytes) -> str:
    with pytest.raises(archives.MacrosNotAllowed) as caught:
        contenttype.identify(data)
    assert (caught.value.http_status, caught.value.error_code) == (415, "MACROS_NOT_ALLOWED")
    return caught.value.public_message


@pytest.mark.parametrize(
    ("finding", "data"),
    [
        ("vbaProject.bin", ooxml(extra={"word/vbaProject.bin": b"\xd0\xcf\x11\xe0"})),
        ("vbaProject.bin", ooxml(extra={"custom/x/VBAPROJECT.BIN": b"\xd0\xcf\x11\xe0"})),
        ("document.macroenabled.main+xml", ooxml(main_type=MAIN_DOCM)),
        ("sheet.macroenabled.main+xml", ooxml("xl/workbook.xml", MAIN_XLSM, "<workbook/>")),
        (
            "macrosheet+xml",
            ooxml(
                "xl/workbook.xml",
                MAIN_XLSX,
                "<workbook/>",
                extra_types='<Override PartName="/xl/macrosheets/sheet1.xml" '
                'ContentType="application/vnd.ms-excel.macrosheet+xml"/>',
            ),
        ),
        (
            "vnd.ms-office.vbaproject",
            ooxml(
                extra_types='<Default Extension="bin" ContentType="application/vnd.ms-office.vbaProject"/>'
            ),
        ),
        ("ODF macros", odt(BASIC_LIBRARY)),
        ("ODF macros", odt({"Scripts/python/evil.py": b"import os\nos.system('id')\n"})),
    ],
)
def test_macro_documents_are_refused_by_content(finding: str, data: bytes) -> None:
    assert finding in _macros(data)


def _nested(depth: int, inner: bytes) -> bytes:
    """``inner`` embedded ``depth`` times, each time as ``word/embeddings/inner.docx`` of a docx."""
    for _ in range(depth):
        inner = ooxml(extra={"word/embeddings/inner.docx": inner})
    return inner


@pytest.mark.parametrize(
    ("finding", "build"),
    [
        ("in word/embeddings/inner.docx", lambda: _nested(1, ooxml(main_type=MAIN_DOCM))),
        ("vbaProject.bin", lambda: _nested(1, ooxml(extra={"word/vbaProject.bin": b"\xd0\xcf\x11\xe0"}))),
        ("ODF macros", lambda: _nested(2, odt(BASIC_LIBRARY))),
        ("ODF macros", lambda: odt({f"Object 1/{k}": v for k, v in BASIC_LIBRARY.items()})),
        ("VBA project", lambda: ooxml(extra={"word/embeddings/oleObject1.bin": doc_with_vba()})),
        ("VBA project", lambda: odt({"Object 2": doc_with_vba()})),
    ],
    ids=[
        "docm-in-docx",
        "vba-in-docx-in-docx",
        "basic-two-levels-down",
        "basic-in-an-odf-object",
        "vba-in-an-ole-object",
        "vba-in-an-odf-ole-object",
    ],
)
def test_macros_in_embedded_packages_are_refused(finding: str, build: Any) -> None:
    """Issue 14: an embedded object is a document of its own; its macros are refused as the
    package's are (:mod:`hypermedia.intake.nested`), whatever the container and at any depth."""
    assert finding in _macros(build())


def test_packages_nested_too_deep_are_refused() -> None:
    from hypermedia.intake import nested

    assert contenttype.identify(_nested(nested.MAX_DEPTH, odt())) == DOCX
    with pytest.raises(archives.ArchiveRejected) as caught:
        contenttype.identify(_nested(nested.MAX_DEPTH + 1, odt()))
    assert (caught.value.http_status, caught.value.error_code) == (422, "ARCHIVE_NESTED_TOO_DEEP")


def test_folders_named_like_odf_macros_are_fine_in_a_plain_zip() -> None:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zf:
        zf.writestr("Scripts/build.sh", "make\n")
        zf.writestr("Basic/readme.txt", "hi\n")
    assert contenttype.identify(out.getvalue()) == "application/zip"


def test_a_png_zip_polyglot_is_a_png_and_not_inspected_as_an_archive() -> None:
    assert contenttype.identify(polyglot()) == "image/png"
    assert contenttype.identify(png() + ooxml_bomb()) == "image/png"  # nothing here will unpack it


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("photo.jpg", "photo.jpg"),
        ("../../etc/passwd", ".._.._etc_passwd"),
        ("..\\..\\windows\\win.ini", ".._.._windows_win.ini"),
        ("evil\x00.png", "evil.png"),
        ("a\x01b\x1bc\x7fd\x85e\tf\n.png", "abcdef.png"),
        ("invoice\u202egpj.exe", "invoicegpj.exe"),
        ("\u2066x\u2069\u200f\u202a\u202b\u202c\u202d.txt", "x.txt"),
        ("line\u2028break.txt", "linebreak.txt"),
        ("  spaced.txt  ", "spaced.txt"),
        ("..", ""),
        ("", ""),
        ("Cafe\u0301.png", "Caf\u00e9.png"),
        ("x" * 300 + ".png", "x" * 251 + ".png"),
        ("y" * 300, "y" * 255),
        ("\ud800lone.png", "lone.png"),
    ],
)
def test_display_names(raw: str, expected: str) -> None:
    assert display_name(raw) == expected
    assert len(display_name(raw)) <= 255


def test_claimed_types_are_normalised_and_compared() -> None:
    assert contenttype.claimed_mime("IMAGE/JPG; q=1") == "image/jpeg"
    assert contenttype.claimed_mime("application/octet-stream") is None
    assert contenttype.claimed_mime("../../etc/passwd") is None
    assert contenttype.name_mime("report.docx") == DOCX
    assert contenttype.name_mime("x.heic") == "image/heif"
    assert contenttype.name_mime("archive.tar.gz") == "application/gzip"
    assert contenttype.name_mime("no-extension") is None
    assert contenttype.type_mismatch("application/pdf", "image/jpeg", None)
    assert not contenttype.type_mismatch("image/jpeg", "image/jpeg", "image/jpeg")
    assert not contenttype.type_mismatch("application/x-gzip", None, "application/gzip")
    assert not contenttype.type_mismatch("image/png", None, None)


# -- end to end through REST ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def validation_platform(tmp_root: Path, database_url: str, nats_url: str) -> Iterator[RunningPlatform]:
    """A platform on a database of its own (its jobs meet no other platform's reaper)."""
    with isolated_platform(
        tmp_root, database_url, nats_url, "validation", "credits,storage,gateway,imageworker"
    ) as running:
        yield running


@pytest.fixture
def account(validation_platform: RunningPlatform) -> dict[str, Any]:
    return validation_platform.admin("create-account", "--credits", "1000")


@pytest.fixture
def client(validation_platform: RunningPlatform, account: dict[str, Any]) -> Iterator[httpx.Client]:
    with validation_platform.client(account, timeout=60) as c:
        yield c


def _sql(platform: RunningPlatform, query: str, *args: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(platform.info["database_url"]) as conn:
        return conn.execute(query, args).fetchall()


def _stored(platform: RunningPlatform, account: dict[str, Any]) -> tuple[int, list[str]]:
    """Rows of objects in the account's pool, and the files under its originals/ folder."""
    [(rows,)] = _sql(platform, "SELECT count(*) FROM objects WHERE pool_id = %s", account["pool_id"])
    folder = Path(platform.info["objects_dir"]) / "originals" / account["pool_id"]
    files = sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) if folder.exists() else []
    return rows, files


REFUSED = [
    ("ooxml zip bomb (1 GiB declared)", ooxml_bomb, "report.docx", DOCX, 422, "ARCHIVE_COMPRESSION_RATIO"),
    ("10,001 entries", many_entries, "many.zip", "application/zip", 422, "ARCHIVE_TOO_MANY_ENTRIES"),
    ("overlapping entries (Fifield)", overlapping, "overlap.docx", DOCX, 422, "ARCHIVE_OVERLAPPING_ENTRIES"),
    ("594 MiB declared in all", too_large, "big.zip", "application/zip", 422, "ARCHIVE_TOO_LARGE"),
    (
        "traversal entry",
        lambda: raw_zip([Raw("../../etc/cron.d/x", b"* * * * * root id\n")]),
        "t.zip",
        "application/zip",
        422,
        "ARCHIVE_UNSAFE_PATH",
    ),
    ("corrupt central directory", lambda: ooxml()[:-30], "c.docx", DOCX, 422, "ARCHIVE_CORRUPT"),
    (
        "macro document renamed .docx",
        lambda: ooxml(extra={"word/vbaProject.bin": b"\xd0\xcf\x11\xe0" + os.urandom(64)}),
        "invoice.docx",
        DOCX,
        415,
        "MACROS_NOT_ALLOWED",
    ),
    (
        "docm by content type",
        lambda: ooxml(main_type=MAIN_DOCM),
        "plain.docx",
        DOCX,
        415,
        "MACROS_NOT_ALLOWED",
    ),
    ("ODF with Basic macros", lambda: odt(BASIC_LIBRARY), "minutes.odt", ODT, 415, "MACROS_NOT_ALLOWED"),
    (
        "case-only duplicate names",
        lambda: ooxml(extra={"Word/Document.xml": _WORD.encode()}),
        "twice.docx",
        DOCX,
        422,
        "ARCHIVE_CORRUPT",
    ),
    ("LibreOffice .doc with a VBA project", doc_with_vba, "invoice.doc", MSWORD, 415, "MACROS_NOT_ALLOWED"),
    (
        "LibreOffice flat ODF with Basic",
        fodt_with_basic,
        "minutes.fodt",
        "application/vnd.oasis.opendocument.text-flat-xml",
        415,
        "MACROS_NOT_ALLOWED",
    ),
    (
        "truncated compound file",
        lambda: legacy_document("doc")[:2048],
        "cut.doc",
        MSWORD,
        422,
        "ARCHIVE_CORRUPT",
    ),
]


@pytest.mark.parametrize(
    ("what", "build", "name", "claimed", "status", "error_code"), REFUSED, ids=[r[0] for r in REFUSED]
)
def test_hostile_archives_are_refused_at_upload_and_nothing_is_stored(
    validation_platform: RunningPlatform,
    account: dict[str, Any],
    client: httpx.Client,
    what: str,
    build: Any,
    name: str,
    claimed: str,
    status: int,
    error_code: str,
) -> None:
    before = _stored(validation_platform, account)
    response = client.post("/v1/objects", files={"file": (name, build(), claimed)})
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    problem = response.json()
    assert problem["error_code"] == error_code
    assert problem["status"] == status
    assert name not in problem["detail"]
    assert _stored(validation_platform, account) == before == (0, [])


def test_a_macro_document_is_refused_over_grpc_too(
    validation_platform: RunningPlatform, account: dict[str, Any]
) -> None:
    async def upload() -> grpc.aio.AioRpcError:
        async with grpc.aio.insecure_channel(validation_platform.grpc_addr) as chan:
            stub = jobs_pb2_grpc.JobServiceStub(chan)
            request = jobs_pb2.UploadObjectRequest(
                content=ooxml(extra={"word/vbaProject.bin": b"\xd0\xcf\x11\xe0"}), filename="a.docx"
            )
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.UploadObject(
                    request, metadata=(("authorization", f"Bearer {account['api_key']}"),)
                )
            ok = await stub.UploadObject(
                jobs_pb2.UploadObjectRequest(content=ooxml(), filename="fine.docx"),
                metadata=(("authorization", f"Bearer {account['api_key']}"),),
            )
            assert ok.mime_type == DOCX
            return caught.value

    error = asyncio.run(upload())
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert dict(error.trailing_metadata() or ())["hm-error-code"] == "MACROS_NOT_ALLOWED"


@pytest.mark.parametrize(
    ("name", "build", "mime"),
    [
        ("report.docx", ooxml, DOCX),
        ("sheet.xlsx", lambda: ooxml("xl/workbook.xml", MAIN_XLSX, "<workbook/>"), XLSX),
        ("slides.pptx", lambda: ooxml("ppt/presentation.xml", MAIN_PPTX, "<presentation/>"), PPTX),
        ("minutes.odt", odt, ODT),
        ("report.doc", lambda: legacy_document("doc"), MSWORD),
        ("figures.xls", lambda: legacy_document("xls"), "application/vnd.ms-excel"),
        ("slides.ppt", lambda: legacy_document("ppt"), "application/vnd.ms-powerpoint"),
        ("letter.rtf", lambda: legacy_document("rtf"), "application/rtf"),
    ],
)
def test_normal_office_documents_are_accepted_and_typed(
    validation_platform: RunningPlatform, client: httpx.Client, name: str, build: Any, mime: str
) -> None:
    response = client.post("/v1/objects", files={"file": (name, build(), "application/octet-stream")})
    assert response.status_code == 201, response.text
    obj = response.json()
    assert obj["mime_type"] == mime
    assert obj["filename"] == name
    assert obj["claimed_mime_type"] is None  # application/octet-stream claims nothing
    assert obj["name_mime_type"] == mime
    assert obj["type_mismatch"] is False
    [(key, stored_mime)] = _sql(
        validation_platform, "SELECT key, mime_type FROM objects WHERE object_id = %s", obj["object_id"]
    )
    assert (key, stored_mime) == (f"originals/{obj['pool_id']}/{obj['object_id']}", mime)


def _gateway_log_entries(platform: RunningPlatform, object_id: str) -> list[dict[str, Any]]:
    entries = []
    for line in (Path(platform.info["logs_dir"]) / "gateway.log").read_text(errors="replace").splitlines():
        if object_id in line and line.startswith("{"):
            entries.append(json.loads(line))
    return entries


def test_a_pdf_named_jpg_is_stored_as_pdf_with_the_mismatch_recorded(
    validation_platform: RunningPlatform, client: httpx.Client
) -> None:
    response = client.post("/v1/objects", files={"file": ("holiday.jpg", PDF, "image/jpeg")})
    assert response.status_code == 201, response.text
    obj = response.json()
    assert obj["mime_type"] == "application/pdf"
    assert (obj["claimed_mime_type"], obj["name_mime_type"], obj["type_mismatch"]) == (
        "image/jpeg",
        "image/jpeg",
        True,
    )
    [row] = _sql(
        validation_platform,
        "SELECT mime_type, claimed_mime_type, name_mime_type, type_mismatch, filename FROM objects"
        " WHERE object_id = %s",
        obj["object_id"],
    )
    assert row == ("application/pdf", "image/jpeg", "image/jpeg", True, "holiday.jpg")
    deadline = time.monotonic() + 10
    while not (logged := _gateway_log_entries(validation_platform, obj["object_id"])):
        assert time.monotonic() < deadline, "no log line for the upload"
        time.sleep(0.1)
    [entry] = logged
    assert entry["level"] == "INFO"
    assert (entry["mime_type"], entry["claimed_mime_type"], entry["type_mismatch"]) == (
        "application/pdf",
        "image/jpeg",
        True,
    )

    created = client.post(
        "/v1/hypermedia/process", json={"object_id": obj["object_id"], "operations": ["thumbnail"]}
    )
    assert created.status_code == 415, created.text
    assert created.json()["error_code"] == "UNSUPPORTED_FORMAT"
    assert _sql(
        validation_platform, "SELECT count(*) FROM processing_jobs WHERE object_id = %s", obj["object_id"]
    ) == [(0,)]


def test_a_png_zip_polyglot_is_a_png_and_its_outputs_are_clean(
    validation_platform: RunningPlatform, client: httpx.Client
) -> None:
    response = client.post("/v1/objects", files={"file": ("cat.zip", polyglot(), "application/zip")})
    assert response.status_code == 201, response.text
    obj = response.json()
    assert obj["mime_type"] == "image/png"
    assert obj["type_mismatch"] is True
    created = client.post(
        "/v1/hypermedia/process",
        json={
            "object_id": obj["object_id"],
            "operations": ["thumbnail", {"name": "convert", "params": {"format": "png"}}],
        },
    )
    assert created.status_code == 202, created.text
    jobs = [wait_job(client, job_id) for job_id in created.json()["job_ids"]]
    assert [j["status"] for j in jobs] == ["completed", "completed"], jobs
    for job, (loader, mime) in zip(jobs, [("webpload", "image/webp"), ("pngload", "image/png")], strict=True):
        [output] = job["outputs"]
        assert output["mime_type"] == mime
        data = httpx.get(output["url"], timeout=30).content
        assert b"PK\x03\x04" not in data and b"PK\x05\x06" not in data
        assert b"POLYGLOT-PAYLOAD" not in data and b"payload.txt" not in data
        image = pyvips.Image.new_from_buffer(data, "")
        assert image.get("vips-loader").startswith(loader)
        assert (image.width, image.height) == (64, 48)  # thumbnails never enlarge
    png_out = httpx.get(jobs[1]["outputs"][0]["url"], timeout=30).content
    assert png_out.startswith(b"\x89PNG\r\n\x1a\n") and png_out.endswith(b"IEND\xaeB`\x82")


def _multipart(filename: bytes, content: bytes, content_type: bytes = b"image/png") -> tuple[bytes, str]:
    """A multipart body written by hand: httpx percent-escapes control characters in file names,
    a hostile client does not."""
    boundary = "hm" + secrets.token_hex(12)
    body = (
        b"--" + boundary.encode() + b"\r\n"
        b'Content-Disposition: form-data; name="file"; filename="' + filename + b'"\r\n'
        b"Content-Type: " + content_type + b"\r\n\r\n" + content + b"\r\n--" + boundary.encode() + b"--\r\n"
    )
    return body, f"multipart/form-data; boundary={boundary}"


HOSTILE_NAMES = [
    (b"../../etc/passwd", ".._.._etc_passwd"),
    (b"..\\..\\windows\\win.ini", ".._.._windows_win.ini"),
    (b"evil\x00.png", "evil.png"),
    (b"ctl\x01\x07\x1b[31m\x7f.png", "ctl[31m.png"),
    ("invoice\u202egnp.exe".encode(), "invoicegnp.exe"),
    (("z" * 296 + ".png").encode(), "z" * 251 + ".png"),
]


def test_hostile_file_names_are_sanitised_metadata_and_never_a_path(
    validation_platform: RunningPlatform, account: dict[str, Any], client: httpx.Client, tmp_root: Path
) -> None:
    passwd_before = Path("/etc/passwd").read_bytes()
    objects_dir = Path(validation_platform.info["objects_dir"])
    for raw, expected in HOSTILE_NAMES:
        body, content_type = _multipart(raw, png())
        response = client.post("/v1/objects", content=body, headers={"Content-Type": content_type})
        assert response.status_code == 201, (raw, response.text)
        obj = response.json()
        assert obj["filename"] == expected, raw
        assert obj["mime_type"] == "image/png"
        [(key, filename)] = _sql(
            validation_platform, "SELECT key, filename FROM objects WHERE object_id = %s", obj["object_id"]
        )
        assert key == f"originals/{account['pool_id']}/{obj['object_id']}"
        assert filename == expected
        assert (objects_dir / key).read_bytes() == png()

    assert Path("/etc/passwd").read_bytes() == passwd_before
    uuid = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
    for path in objects_dir.rglob("*"):
        relative = str(path.relative_to(objects_dir))
        assert re.fullmatch(
            rf"(originals|derived)(/{uuid}(/{uuid}(/\d+(/[a-z0-9][a-z0-9_.-]*)?)?)?)?", relative
        ), relative
    fragments = ("etc_passwd", "win.ini", "evil.png", "ctl[31m", "invoicegnp", "gnp.exe", "z" * 32, "\u202e")
    for _dirpath, dirnames, filenames in os.walk(tmp_root):  # the platform's state, objects, job dirs
        for entry in dirnames + filenames:
            assert not any(f in entry for f in fragments), entry
    for folder in (Path.cwd(), Path("/tmp"), Path("/etc")):
        for entry in os.listdir(folder):
            assert not any(f in entry for f in fragments), (folder, entry)


def test_the_profile_input_size_limit_is_checked_at_job_creation(
    validation_platform: RunningPlatform, client: httpx.Client
) -> None:
    [(limit,)] = _sql(
        validation_platform,
        "SELECT max_input_bytes FROM processing_profiles WHERE operation = 'thumbnail' AND active",
    )
    assert limit == 50 * MiB
    big = png()[:33] + os.urandom(limit + 1 - 33)  # a PNG header, then one byte over the profile's limit
    response = client.post("/v1/objects", files={"file": ("big.png", big)})
    assert response.status_code == 201, response.text
    obj = response.json()
    assert obj["size_bytes"] == limit + 1 and obj["mime_type"] == "image/png"
    created = client.post(
        "/v1/hypermedia/process", json={"object_id": obj["object_id"], "operations": ["thumbnail"]}
    )
    assert created.status_code == 413, created.text
    assert created.json()["error_code"] == "INPUT_TOO_LARGE"
    assert _sql(
        validation_platform, "SELECT count(*) FROM processing_jobs WHERE object_id = %s", obj["object_id"]
    ) == [(0,)]
    fits = client.post("/v1/objects", files={"file": ("fits.png", big[:limit])})
    assert fits.status_code == 201
    accepted = client.post(
        "/v1/hypermedia/process", json={"object_id": fits.json()["object_id"], "operations": ["thumbnail"]}
    )
    assert accepted.status_code == 202, accepted.text
    job = wait_job(client, accepted.json()["job_ids"][0])
    assert (job["status"], job["error_code"]) == ("failed", "CORRUPT_INPUT")  # random bytes after the header
