"""Legacy and other office formats at upload: Word, Excel and PowerPoint 97–2003 (OLE2 compound
files), RTF and flat ODF, typed from their content and refused when they carry macros.

**Real files.** Every document is written by LibreOffice (``soffice --headless --convert-to``, in a
throwaway profile) from a flat ODF text, a CSV or a flat ODF presentation generated here: ``.doc``
(filter "MS Word 97"), ``.xls`` ("MS Excel 97"), ``.ppt`` ("MS PowerPoint 97"), ``.rtf``,
``.fodt``/``.fods``/``.fodp``, and an ``.odt`` that LibreOffice then rewrites as ``.fodt``.

**Macro documents.** LibreOffice writes no VBA, and ``olefile`` cannot add a storage to a compound
file, so the VBA cases are rebuilt here: the streams of a LibreOffice ``.doc``/``.xls``/``.ppt`` are
read with olefile and written again, with the VBA storages added, by :func:`compound_file`, a small
writer of the [MS-CFB] version 3 format (512-byte sectors, streams under 4,096 bytes in the mini
stream, a balanced all-black sibling tree, [MS-CFB] §2.6.4). The writer is checked against
LibreOffice itself: a ``.doc``, ``.xls`` and ``.ppt`` it rebuilt open in LibreOffice with their text
(:func:`test_the_compound_file_writer_makes_files_libreoffice_reads`). The VBA streams
(``PROJECT``, ``VBA/_VBA_PROJECT``, ``VBA/dir``, a module) have the names and places of
[MS-OVBA] §2.2 but placeholder contents: detection, like oletools' olevba
(``find_vba_projects``), goes by the structure and never reads code. The ``.ppt`` case is a
LibreOffice presentation with a VBAInfoContainer record ([MS-PPT]) appended to its
``PowerPoint Document`` stream (an unreferenced record, as incremental saves leave them; LibreOffice
still opens the file); the Excel 4.0 case is a LibreOffice workbook whose sheet's ``BoundSheet8.dt``
([MS-XLS] §2.4.28) says "macro sheet". Flat ODF with Basic is LibreOffice's own output.
"""

from __future__ import annotations

import functools
import io
import os
import struct
import time
from typing import Any

import olefile
import puremagic
import pytest

from hypermedia.intake import archives, contenttype, ole
from tests.helpers.legacy_office import (
    MSEXCEL,
    MSPOWERPOINT,
    MSWORD,
    OLE_STORAGE,
    OTHER_COMPOUND_FILES,
    SECTOR,
    compound_file,
    doc_with_vba,
    legacy_document,
    read_tree,
    rebuilt,
    vba_project,
)
from tests.helpers.office import (
    SLIDE,
    TEXT,
    flat_odf,
    fodt_with_basic,
    libreoffice_convert,
    odt_with_basic,
    text_body,
)

RTF = "application/rtf"
FODT = "application/vnd.oasis.opendocument.text-flat-xml"
FODS = "application/vnd.oasis.opendocument.spreadsheet-flat-xml"
FODP = "application/vnd.oasis.opendocument.presentation-flat-xml"

# -- LibreOffice ---------------------------------------------------------------------------------


@functools.cache
def libreoffice_flat(extension: str) -> bytes:
    """A real flat ODF file written by LibreOffice: ``fodt``, ``fods`` (from a CSV) or ``fodp``."""
    if extension == "fods":
        return libreoffice_convert("figures.csv", b"quarter,revenue\nQ1,100\n", "fods")
    if extension == "fodp":
        return libreoffice_convert("slides.ppt", legacy_document("ppt"), "fodp")
    return libreoffice_convert("minutes.doc", legacy_document("doc"), "fodt")


# -- a compound file writer ([MS-CFB] version 3) -----------------------------------------------


def xls_with_vba() -> bytes:
    """A LibreOffice ``.xls`` with a VBA project in ``_VBA_PROJECT_CUR``, where Excel keeps it."""
    return rebuilt("xls", {"_VBA_PROJECT_CUR": vba_project("ThisWorkbook")})


def doc_with_vba_in_an_embedded_object() -> bytes:
    """A LibreOffice ``.doc`` whose ``ObjectPool`` holds an embedded object with a VBA project
    under a storage name of its own (any storage holding ``VBA/dir`` counts, as in olevba)."""
    embedded = {"\x01CompObj": b"\x01\xfe\x00\x00", "Project": vba_project("Sheet1")}
    return rebuilt("doc", {"ObjectPool": {"_1234567890": embedded}})


def vba_info(has_macros: int) -> bytes:
    """A VBAInfoContainer holding a VBAInfoAtom ([MS-PPT]): persistIdRef 1,
    ``fHasMacros``, version 2."""
    return struct.pack("<HHI", 0x001F, 0x03FF, 0x14) + struct.pack(
        "<HHIIII", 0x0002, 0x0400, 0x0C, 1, has_macros, 2
    )


def ppt_with_vba_info(has_macros: int = 1) -> bytes:
    """A LibreOffice ``.ppt`` with a VBAInfoContainer record appended to its document stream."""
    tree, _ = read_tree(legacy_document("ppt"))
    document = tree["PowerPoint Document"]
    assert isinstance(document, bytes)
    return rebuilt("ppt", replace={"PowerPoint Document": document + vba_info(has_macros)})


def xls_with_sheet_type(dt: int) -> bytes:
    """A LibreOffice ``.xls`` whose first sheet's ``BoundSheet8.dt`` is ``dt`` (1: Excel 4.0
    macro sheet, [MS-XLS] §2.4.28)."""
    tree, _ = read_tree(legacy_document("xls"))
    stream = tree["Workbook"]
    assert isinstance(stream, bytes)
    workbook = bytearray(stream)
    pos = 0
    while True:
        record, size = struct.unpack_from("<HH", workbook, pos)
        if record == 0x0085:
            assert workbook[pos + 9] == 0, "LibreOffice writes a worksheet"
            workbook[pos + 9] = dt
            return rebuilt("xls", replace={"Workbook": bytes(workbook)})
        pos += 4 + size


# -- typing --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extension", "main_stream", "mime"),
    [
        ("doc", "WordDocument", MSWORD),
        ("xls", "Workbook", MSEXCEL),
        ("ppt", "PowerPoint Document", MSPOWERPOINT),
    ],
)
def test_libreoffice_legacy_documents_are_typed_from_their_streams(
    extension: str, main_stream: str, mime: str
) -> None:
    data = legacy_document(extension)
    assert data.startswith(ole.SIGNATURE)
    assert olefile.OleFileIO(io.BytesIO(data)).exists(main_stream)
    assert puremagic.from_string(data[:4096], mime=True) == MSWORD  # puremagic: every OLE2 is "Word"
    assert contenttype.detect(data[:4096]) == OLE_STORAGE  # the head alone cannot tell
    assert contenttype.identify(data) == mime
    assert contenttype.kind(mime) == "office"
    assert contenttype.name_mime(f"report.{extension}") == mime


def test_libreoffice_rtf_is_typed_and_office() -> None:
    data = legacy_document("rtf")
    assert data.startswith(b"{\\rtf1")
    assert contenttype.identify(data) == RTF
    assert contenttype.kind(RTF) == contenttype.kind("text/rtf") == "office"
    assert contenttype.claimed_mime("text/rtf") == RTF
    assert contenttype.name_mime("letter.rtf") == RTF
    assert not contenttype.type_mismatch(
        RTF, contenttype.claimed_mime("text/rtf"), contenttype.name_mime("a.rtf")
    )


def test_the_compound_file_writer_makes_files_libreoffice_reads() -> None:
    for extension, target, expected in [
        ("doc", "txt:Text", TEXT),
        ("xls", "csv", "Q2,120"),
        ("ppt", "fodp", SLIDE),
    ]:
        data = rebuilt(extension)
        assert read_tree(data) == read_tree(legacy_document(extension))
        converted = libreoffice_convert(f"rebuilt.{extension}", data, target)
        assert expected in converted.decode("utf-8-sig"), (extension, converted[:400])
        assert contenttype.identify(data) == contenttype.identify(legacy_document(extension))


@pytest.mark.parametrize("name", list(OTHER_COMPOUND_FILES))
def test_other_compound_files_are_ole_storage_and_not_office(name: str) -> None:
    data = compound_file(OTHER_COMPOUND_FILES[name])
    # Before: puremagic's answer, which is no type at all for a version 3 header with the minor
    # version Office writes (0x3E: its best match is "Quattro Pro for Windows 7.0", without a MIME
    # type), and application/msword for LibreOffice's (0x3B). Never an office kind either way.
    assert puremagic.from_string(data[:4096], mime=True) == ""
    assert contenttype.identify(data) == OLE_STORAGE
    assert contenttype.kind(OLE_STORAGE) == "other"


# -- macros --------------------------------------------------------------------------------------


def _macros(data: bytes) -> str:
    with pytest.raises(archives.MacrosNotAllowed) as caught:
        contenttype.identify(data)
    assert (caught.value.http_status, caught.value.error_code) == (415, "MACROS_NOT_ALLOWED")
    return caught.value.public_message


@pytest.mark.parametrize(
    ("build", "finding"),
    [
        (doc_with_vba, "the Macros storage"),
        (xls_with_vba, "the _VBA_PROJECT_CUR storage"),
        (doc_with_vba_in_an_embedded_object, "ObjectPool/_1234567890/Project/VBA/dir"),
        (ppt_with_vba_info, "PowerPoint VBAInfo record"),
        (lambda: xls_with_sheet_type(1), "an Excel 4.0 macro sheet"),
        (lambda: xls_with_sheet_type(6), "an Excel VBA module sheet"),
        (
            lambda: rebuilt(
                "ppt", replace={"PowerPoint Document": vba_info(0) * (ole.MAX_PPT_VBA_INFOS + 1)}
            ),
            "PowerPoint VBAInfo record",
        ),
        (lambda: compound_file({"Macros": vba_project("ThisDocument")}), "the Macros storage"),
    ],
    ids=[
        "doc_vba",
        "xls_vba",
        "embedded_vba",
        "ppt_vba",
        "xls_excel4_macro_sheet",
        "xls_vba_module_sheet",
        "ppt_1001_empty_vba_infos",
        "vba_without_a_document",
    ],
)
def test_legacy_documents_with_macros_are_refused(build: Any, finding: str) -> None:
    message = _macros(build())
    assert message.startswith("documents with macros are not accepted")
    assert finding in message


def test_the_macro_files_are_otherwise_what_they_claim() -> None:
    """The macro documents are the LibreOffice documents plus the macro parts: without those
    they are accepted and typed (so the refusals above are for the macros alone)."""
    tree, _ = read_tree(doc_with_vba())
    assert set(tree) - set(read_tree(legacy_document("doc"))[0]) == {"Macros"}
    macros = tree["Macros"]
    assert isinstance(macros, dict) and isinstance(macros["VBA"], dict)
    assert set(macros) == {"PROJECT", "PROJECTwm", "VBA"}
    assert set(macros["VBA"]) == {"_VBA_PROJECT", "dir", "ThisDocument"}
    assert contenttype.identify(ppt_with_vba_info(has_macros=0)) == MSPOWERPOINT  # an empty VBA storage
    assert contenttype.identify(xls_with_sheet_type(0)) == MSEXCEL
    # LibreOffice still opens the presentation with the record appended.
    assert SLIDE in libreoffice_convert("vba.ppt", ppt_with_vba_info(), "fodp").decode()


# -- corrupt and hostile compound files ----------------------------------------------------------


def _refused(data: bytes) -> tuple[str, str]:
    with pytest.raises(archives.ArchiveRejected) as caught:
        contenttype.identify(data)
    assert caught.value.http_status == 422
    return caught.value.error_code, caught.value.public_message


def _duplicate_names() -> bytes:
    """Two root streams named WordDocument: written as WordDocument and WordDocumenT (the same
    length, so the tree order holds), then the second renamed in the directory."""
    tree, _ = read_tree(legacy_document("doc"))
    tree["WordDocumenT"] = b"\0" * 600
    data = compound_file(tree)
    twin = "WordDocumenT".encode("utf-16-le")
    assert data.count(twin) == 1
    return data.replace(twin, "WordDocument".encode("utf-16-le"))


def _self_sibling() -> bytes:
    """A directory entry that is its own right sibling (a loop in the tree)."""
    data = bytearray(compound_file({"a": b"x", "b": b"y", "c": b"z"}))
    directory = (struct.unpack_from("<I", data, 48)[0] + 1) * SECTOR
    for sid in range(1, 4):
        entry = directory + sid * 128
        if data[entry : entry + 2] == "b".encode("utf-16-le"):
            struct.pack_into("<I", data, entry + 72, sid)
    return bytes(data)


@pytest.mark.parametrize(
    ("build", "code", "detail"),
    [
        (lambda: legacy_document("doc")[:2048], "ARCHIVE_CORRUPT", "the compound file is corrupt: incorrect"),
        (
            lambda: ole.SIGNATURE + os.urandom(4000),
            "ARCHIVE_CORRUPT",
            "the compound file is corrupt: incorrect",
        ),
        (_duplicate_names, "ARCHIVE_CORRUPT", "Duplicate filename"),
        (_self_sibling, "ARCHIVE_CORRUPT", "double reference"),
        (
            lambda: compound_file({f"s{i}": b"" for i in range(3000)}, chain=True),
            "ARCHIVE_CORRUPT",
            "too deep",
        ),
        (
            lambda: rebuilt("xls", replace={"Workbook": bytes(4 * (ole.MAX_BIFF_GLOBAL_RECORDS + 1))}),
            "ARCHIVE_CORRUPT",
            "the workbook globals run past 1000000 records",
        ),
        (
            lambda: compound_file({f"s{i}": b"" for i in range(archives.MAX_ENTRIES)}),
            "ARCHIVE_TOO_MANY_ENTRIES",
            "at most 10000 directory entries",
        ),
    ],
    ids=[
        "truncated",
        "garbage_after_signature",
        "duplicate_names",
        "sibling_loop",
        "degenerate_tree",
        "endless_workbook_globals",
        "10001_entries",
    ],
)
def test_corrupt_or_hostile_compound_files_are_refused(build: Any, code: str, detail: str) -> None:
    data = build()
    started = time.monotonic()
    refused_code, message = _refused(data)
    assert time.monotonic() - started < 5
    assert refused_code == code
    assert detail in message


def test_a_compound_file_at_the_entry_limit_passes() -> None:
    data = compound_file({f"s{i}": b"" for i in range(archives.MAX_ENTRIES - 4)})  # + root, padding
    assert contenttype.identify(data) == OLE_STORAGE


# -- flat ODF ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("extension", "mime"), [("fodt", FODT), ("fods", FODS), ("fodp", FODP)])
def test_libreoffice_flat_odf_is_typed_and_not_office(extension: str, mime: str) -> None:
    data = libreoffice_flat(extension)
    assert b"<office:scripts>" in data  # LibreOffice writes an empty Basic container into each
    if extension == "fodt":  # from a .doc: an empty "Standard" library too, which is no macro
        assert b'<ooo:library-embedded ooo:name="Standard"/>' in data
    assert puremagic.from_string(data[:4096], mime=True) == "application/xml"
    assert contenttype.identify(data) == mime
    assert contenttype.kind(mime) == "other"
    assert contenttype.name_mime(f"x.{extension}") == mime


def test_libreoffice_flat_odf_with_basic_is_refused_like_packaged_odf() -> None:
    assert "ODF macros (Basic/ or Scripts/)" in _macros(odt_with_basic())
    flat = fodt_with_basic()
    assert b"<ooo:library-embedded" in flat and b"Shell(" in flat  # LibreOffice kept the module
    assert "flat ODF macros (ooo:module)" in _macros(flat)


FLAT_MACROS = [
    ("script_module", flat_odf("text", text_body(), '<office:script script:language="ooo:Basic">'
     '<script:module xmlns:script="http://openoffice.org/2000/script" script:name="M">Sub Main\nEnd Sub'
     "</script:module></office:script>"), "script:module"),
    ("linked_library", flat_odf("text", text_body(), '<office:script script:language="ooo:Basic"><ooo:libraries>'
     '<ooo:library-linked ooo:name="Evil" xlink:href="file:///tmp/evil.xlb/"/></ooo:libraries></office:script>'),
     "ooo:library-linked"),
    ("inline_source", flat_odf("text", text_body(), '<office:script script:language="ooo:Basic">Sub Main\nEnd Sub'
     "</office:script>"), "script source in office:script"),
    ("other_script_element", flat_odf("text", text_body(), '<office:script script:language="ooo:Basic">'
     "<ooo:libraries><ooo:evil/></ooo:libraries></office:script>"), "evil in office:scripts"),
    ("event_listener_in_the_body", flat_odf("text", text_body(extra=(
        '<office:event-listeners><script:event-listener script:language="ooo:script" '
        'script:event-name="dom:load" xlink:href="vnd.sun.star.script:Standard.Module1.Main?language=Basic&amp;'
        'location=application"/></office:event-listeners>'))), "script:event-listener"),
]  # fmt: skip


@pytest.mark.parametrize(("what", "data", "finding"), FLAT_MACROS, ids=[f[0] for f in FLAT_MACROS])
def test_flat_odf_macros_are_refused(what: str, data: bytes, finding: str) -> None:
    assert f"flat ODF macros ({finding})" in _macros(data), what


def test_flat_odf_that_does_not_parse_is_plain_xml_and_not_checked() -> None:
    empty_scripts = flat_odf(
        "text", text_body(), '<office:script script:language="ooo:Basic"><ooo:libraries/></office:script>'
    )
    assert contenttype.identify(empty_scripts) == FODT
    doctype = flat_odf("text", text_body(), prolog='<!DOCTYPE office:document [<!ENTITY x "y">]>')
    assert contenttype.identify(doctype) == "application/xml"
    assert contenttype.identify(flat_odf("text", text_body())[:-10]) == "application/xml"  # cut short
    unknown = flat_odf("text", text_body()).replace(b"opendocument.text", b"opendocument.chart")
    assert contenttype.identify(unknown) == "application/xml"
    assert contenttype.kind("application/xml") == "other"
