"""Issue 15, items 6 and 7: legacy office files of other versions than 97–2003 (their import
filter chosen by their own header), and office documents encrypted with a password (typed by
their container at upload, so that the gateway refuses them at job creation with 415).

Real files (``tests/data/office-legacy/SOURCE.md``): an Excel 5.0/95 workbook written by Gnumeric,
Word, Excel and PowerPoint 97–2003 files encrypted by Office (msoffcrypto-tool's and oletools'
test files), an ODT and a ``.doc`` that LibreOffice saved with a password, and the plain ``.doc``,
``.xls``, ``.ppt`` LibreOffice writes (:func:`legacy_document`). No Word 6.0/95 writer exists here
(LibreOffice 7.4 imports Word 6/95 only, and no such file is on PyPI, npm or in Debian's
packages): :func:`word6_document` writes the smallest Word 6.0/95 document LibreOffice reads (a
FIB and 8-bit text, no style sheet, no formatting), and :func:`word6_fib` gives a LibreOffice
``.doc`` a Word 6/95 FIB header, for what the header alone decides.
"""

from __future__ import annotations

import io
import struct
import zipfile
from pathlib import Path

import olefile
import pypdfium2 as pdfium
import pytest

from hypermedia.core.errors import PermanentJobError
from hypermedia.engines.documents import office
from hypermedia.engines.documents.filters import IMPORT_FILTERS, LEGACY_IMPORT_FILTERS, import_filter
from hypermedia.intake import archives, contenttype, ole
from tests.helpers.legacy_office import (
    MSEXCEL,
    MSPOWERPOINT,
    MSWORD,
    OLE_STORAGE,
    WORD95_TEXT,
    compound_file,
    legacy_document,
    read_tree,
    word6_document,
)
from tests.helpers.office import flat_odf, libreoffice_convert, text_body

DATA = Path(__file__).resolve().parents[1] / "data" / "office-legacy"
EXCEL95 = DATA / "excel95-gnumeric.xls"
ODT_MIME = "application/vnd.oasis.opendocument.text"

ENCRYPTED_LEGACY = [
    ("msoffcrypto-rc4cryptoapi-password.doc", "Word encryption (the FIB's fEncrypted flag)"),
    ("libreoffice-password.doc", "Word encryption (the FIB's fEncrypted flag)"),
    ("msoffcrypto-rc4cryptoapi-password.xls", "Excel encryption (a FilePass record in the Workbook stream)"),
    (
        "msoffcrypto-rc4cryptoapi-password.ppt",
        "PowerPoint encryption (the Current User stream's header token)",
    ),
    ("oletools-encrypted.ppt", "PowerPoint encryption (an EncryptedSummary stream)"),
]


def word6_fib(document: bytes, ident: int = 0xA5DC, nfib: int = 0x0065, flags: int | None = None) -> bytes:
    """``document`` (a ``WordDocument`` stream) with its FIB's ``wIdent``, ``nFib`` and, when given,
    flags replaced: a Word 6.0 header (Word 6.0 for Windows: 0xA5DC, 101) by default."""
    head = struct.pack("<HH", ident, nfib) + document[4:10]
    if flags is None:
        flags = struct.unpack_from("<H", document, 10)[0]
    return head + struct.pack("<H", flags) + document[12:]


def doc_with_word_stream(document: bytes, keep_table: bool = True) -> bytes:
    """LibreOffice's ``.doc`` rebuilt with ``document`` as its ``WordDocument`` stream (and without
    its ``1Table``, as a Word 6/95 file has none, unless ``keep_table``)."""
    tree, clsid = read_tree(legacy_document("doc"))
    tree["WordDocument"] = document
    if not keep_table:
        tree.pop("1Table", None)
        tree.pop("0Table", None)
    return compound_file(tree, clsid)


def _word_stream() -> bytes:
    return olefile.OleFileIO(io.BytesIO(legacy_document("doc"))).openstream("WordDocument").read()


def _biff_with_filepass(workbook: bytes) -> bytes:
    """A BIFF5/8 stream with an XOR ``FilePass`` record ([MS-XLS] §2.4.117: wEncryptionType 0,
    key and verifier) right after its first ``BOF``, where Excel writes it."""
    _bof, size = struct.unpack_from("<HH", workbook, 0)
    filepass = struct.pack("<HHHHH", 0x002F, 6, 0, 0x1234, 0x5678)
    return workbook[: 4 + size] + filepass + workbook[4 + size :]


# -- typing at upload ------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "finding"), ENCRYPTED_LEGACY)
def test_encrypted_legacy_documents_are_ole_storage(name: str, finding: str) -> None:
    """Item 7: a Word, Excel or PowerPoint file encrypted in its own streams was typed by its main
    stream (an office kind: accepted, held, PARSE_ERROR in LibreOffice); it is a compound file of no
    office kind now, whatever its family."""
    data = (DATA / name).read_bytes()
    assert contenttype.identify(data) == OLE_STORAGE
    assert contenttype.kind(contenttype.identify(data)) == "other"
    _format, encryption = ole.legacy_format(data)
    assert encryption == finding


@pytest.mark.parametrize(("extension", "mime"), [("doc", MSWORD), ("xls", MSEXCEL), ("ppt", MSPOWERPOINT)])
def test_plain_legacy_documents_keep_their_type(extension: str, mime: str) -> None:
    data = legacy_document(extension)
    assert contenttype.identify(data) == mime
    assert ole.legacy_format(data)[1] is None


def test_an_encrypted_word6_file_and_an_encrypted_excel95_file_are_ole_storage() -> None:
    """The same flags in the older headers: Word 6/95's FIB ``fEncrypted``, a ``FilePass`` in an
    Excel 5.0/95 ``Book`` stream (Gnumeric's workbook rebuilt: no encrypted original exists here)."""
    plain6 = word6_document(WORD95_TEXT, nfib=0x0068)
    encrypted6 = word6_document(WORD95_TEXT, nfib=0x0068, flags=0x0100)
    assert contenttype.identify(plain6) == MSWORD
    assert ole.legacy_format(plain6) == (ole.WORD_6_95, None)
    assert contenttype.identify(encrypted6) == OLE_STORAGE

    tree, clsid = read_tree(EXCEL95.read_bytes())
    assert set(tree) >= {"Book"} and "Workbook" not in tree
    book = tree["Book"]
    assert isinstance(book, bytes)
    tree["Book"] = _biff_with_filepass(book)
    encrypted95 = compound_file(tree, clsid)
    assert contenttype.identify(EXCEL95.read_bytes()) == MSEXCEL
    assert contenttype.identify(encrypted95) == OLE_STORAGE
    assert ole.legacy_format(encrypted95) == (
        ole.EXCEL_5_95,
        "Excel encryption (a FilePass record in the Book stream)",
    )


def test_word_obfuscation_is_encryption() -> None:
    """[MS-DOC] ``fObfuscated`` (XOR obfuscation), bit 0x8000 of the FIB's flags."""
    word = _word_stream()
    flags = struct.unpack_from("<H", word, 10)[0]
    data = doc_with_word_stream(word[:10] + struct.pack("<H", flags | 0x8000) + word[12:])
    assert contenttype.identify(data) == OLE_STORAGE
    assert ole.legacy_format(data)[1] == "Word XOR obfuscation (the FIB's fObfuscated flag)"


def test_an_odt_saved_with_a_password_is_a_plain_zip() -> None:
    """ODF: LibreOffice encrypts every part but ``mimetype`` and the manifest, whose entries carry
    ``manifest:encryption-data``. The ``mimetype`` entry still says text: it was typed ODT, office."""
    data = (DATA / "libreoffice-password.odt").read_bytes()
    assert zipfile.ZipFile(io.BytesIO(data)).read("mimetype") == ODT_MIME.encode()
    assert contenttype.identify(data) == "application/zip"
    assert archives.find_encryption(archives.inspect(data)) == (
        "ODF encryption (encryption-data in META-INF/manifest.xml)"
    )
    plain = libreoffice_convert("minutes.fodt", flat_odf("text", text_body()), "odt")
    assert contenttype.identify(plain) == ODT_MIME
    assert archives.find_encryption(archives.inspect(plain)) is None


def _with_zip_encryption_flag(data: bytes, name: str) -> bytes:
    """``data`` with the traditional PKWARE encryption flag (bit 0 of the general purpose flags,
    APPNOTE §4.4.4) set on ``name`` in its local header and central record (Python's zipfile
    writes none: it clears the flags it does not set itself)."""
    out = bytearray(data)
    info = zipfile.ZipFile(io.BytesIO(data)).getinfo(name)
    out[info.header_offset + 6] |= 0x1
    central = data.index(b"PK\x01\x02" + data[info.header_offset + 4 : info.header_offset + 6])
    while data[central + 46 : central + 46 + len(name)] != name.encode():
        central = data.index(b"PK\x01\x02", central + 4)
    out[central + 8] |= 0x1
    return bytes(out)


def test_a_package_with_zip_encrypted_parts_is_refused_at_upload() -> None:
    """Zip encryption of a part (not what Office or LibreOffice write: they encrypt the parts'
    content) is refused before typing: the part cannot be read, ``422 ARCHIVE_CORRUPT``."""
    plain = libreoffice_convert("minutes.fodt", flat_odf("text", text_body()), "odt")
    data = _with_zip_encryption_flag(plain, "content.xml")
    assert zipfile.ZipFile(io.BytesIO(data)).getinfo("content.xml").flag_bits & 0x1
    with pytest.raises(archives.ArchiveRejected) as caught:
        contenttype.identify(data)
    assert (caught.value.http_status, caught.value.error_code) == (422, "ARCHIVE_CORRUPT")


# -- the import filter, by the file's own header ----------------------------------------------------


def _filter(tmp_path: Path, data: bytes, mime: str) -> str:
    path = tmp_path / "document"
    path.write_bytes(data)
    return import_filter(path, mime)


def test_the_import_filter_follows_the_header(tmp_path: Path) -> None:
    """Item 6: every .doc was opened with "MS Word 97", which refuses a Word 6/95 FIB."""
    word = _word_stream()
    assert _filter(tmp_path, legacy_document("doc"), MSWORD) == "MS Word 97"
    for nfib in (0x0065, 0x0067, 0x0068, 0x0069):  # Word 6.0, 6.0 for the Macintosh, Word 95
        data = doc_with_word_stream(word6_fib(word, nfib=nfib), keep_table=False)
        assert _filter(tmp_path, data, MSWORD) == "MS WinWord 6.0", nfib
    assert _filter(tmp_path, legacy_document("xls"), MSEXCEL) == "MS Excel 97"
    assert _filter(tmp_path, EXCEL95.read_bytes(), MSEXCEL) == "MS Excel 95"
    assert _filter(tmp_path, legacy_document("ppt"), MSPOWERPOINT) == "MS PowerPoint 97"
    assert _filter(tmp_path, b"PK\x03\x04", ODT_MIME) == "writer8"  # not read: ODF has one filter


@pytest.mark.parametrize(
    ("build", "mime", "code", "message"),
    [
        (lambda: doc_with_word_stream(word6_fib(_word_stream(), ident=0xA5DB, nfib=0x002D)), MSWORD,
         "UNSUPPORTED_FORMAT", "Word (FIB ident 0xA5DB, nFib 45) documents cannot be converted"),
        (lambda: (DATA / "msoffcrypto-rc4cryptoapi-password.xls").read_bytes(), MSEXCEL,
         "UNSUPPORTED_FORMAT", "encrypted with a password (Excel encryption"),
        (lambda: legacy_document("xls"), MSWORD, "UNSUPPORTED_FORMAT",
         "Excel 97–2003 documents cannot be converted"),
        (lambda: b"{\\rtf1 not a compound file}", MSWORD, "PARSE_ERROR", "could not open"),
        (lambda: legacy_document("doc")[:2048], MSWORD, "PARSE_ERROR", "could not open"),
    ],
)  # fmt: skip
def test_what_has_no_filter_is_refused_by_name(
    tmp_path: Path, build: object, mime: str, code: str, message: str
) -> None:
    """A format LibreOffice has no filter for is ``UNSUPPORTED_FORMAT`` naming it (Word for Windows
    2.0's FIB ident and nFib here), and so is an encrypted file stored before uploads typed it by its container;
    a file of another family than its type, or not a compound file, never picks a filter."""
    with pytest.raises(PermanentJobError) as caught:
        _filter(tmp_path, build(), mime)  # type: ignore[operator]
    assert caught.value.error_code == code
    assert message in str(caught.value)


def test_every_legacy_filter_is_a_libreoffice_import_filter() -> None:
    """The allowlist names filters LibreOffice registers (its ``filter/*.xcu`` fragments, installed
    under ``/usr/lib/libreoffice/share/registry``)."""
    registry = "".join(
        p.read_text(errors="replace") for p in Path("/usr/lib/libreoffice/share/registry").glob("*.xcd")
    )
    for filters in LEGACY_IMPORT_FILTERS.values():
        for name in filters.values():
            assert f'<node oor:name="{name}" oor:op="replace">' in registry, name


# -- conversion by LibreOffice ------------------------------------------------------------------------


def test_legacy_files_of_each_family_convert_with_their_text(tmp_path: Path) -> None:
    """Word 6.0 and Word 95 (:func:`word6_document`), Excel 5.0/95 (Gnumeric's), and Word, Excel,
    PowerPoint 97–2003 (LibreOffice's), through a real listener with the filter their header
    chose; the PDFs' text by PDFium. An encrypted ``.doc`` that reaches the worker (stored before
    uploads were typed by container) is ``UNSUPPORTED_FORMAT``, not ``PARSE_ERROR``."""
    from tests.helpers.office import run_pool

    documents = [
        (word6_document(WORD95_TEXT, nfib=0x0065), MSWORD),
        (word6_document(WORD95_TEXT, nfib=0x0068), MSWORD),
        (EXCEL95.read_bytes(), MSEXCEL),
        (legacy_document("doc"), MSWORD),
        (legacy_document("xls"), MSEXCEL),
        (legacy_document("ppt"), MSPOWERPOINT),
        ((DATA / "msoffcrypto-rc4cryptoapi-password.doc").read_bytes(), MSWORD),
    ]
    results = run_pool(tmp_path, None, documents)
    texts = []
    for result in results[:6]:
        assert isinstance(result, office.Conversion), result
        texts.append(" ".join(p.get_textpage().get_text_range() for p in pdfium.PdfDocument(result.pdf)))
    assert texts[0].strip() == texts[1].strip() == WORD95_TEXT
    assert "Quarterly sales" in texts[2] and "1995" in texts[2] and "Apples" in texts[2] and "42" in texts[2]
    assert "Minutes of the meeting" in texts[3]
    assert "Q2" in texts[4] and "120" in texts[4]
    assert "Slide one" in texts[5]
    assert isinstance(results[6], PermanentJobError) and results[6].error_code == "UNSUPPORTED_FORMAT"


def test_word97s_filter_cannot_open_a_word6_file(tmp_path: Path) -> None:
    """What every ``.doc`` was opened with before (issue 15, item 6): "MS Word 97" reads a Word
    6/95 FIB as Word 97's and LibreOffice refuses the file, ``PARSE_ERROR``."""
    from tests.helpers.office import run_pool

    [result] = run_pool(tmp_path, None, [(word6_document(WORD95_TEXT), MSWORD)], direct=True)
    assert IMPORT_FILTERS[MSWORD] == "MS Word 97"
    assert isinstance(result, PermanentJobError) and result.error_code == "PARSE_ERROR", result
