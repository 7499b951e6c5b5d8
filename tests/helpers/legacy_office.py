"""Legacy office documents (OLE2 compound files: Word, Excel, PowerPoint) the tests build."""

from __future__ import annotations

import functools
import io
import itertools
import math
import os
import struct
import uuid
from dataclasses import dataclass
from typing import Any

import olefile

from hypermedia.intake import ole
from tests.helpers.office import SLIDES_BODY, flat_odf, libreoffice_convert, text_body

MSWORD = "application/msword"
MSEXCEL = "application/vnd.ms-excel"
MSPOWERPOINT = "application/vnd.ms-powerpoint"
OLE_STORAGE = "application/x-ole-storage"


@functools.cache
def legacy_document(extension: str) -> bytes:
    """A real ``.doc``, ``.xls``, ``.ppt`` or ``.rtf`` written by LibreOffice."""
    if extension in ("doc", "rtf"):
        return libreoffice_convert("minutes.fodt", flat_odf("text", text_body()), extension)
    if extension == "xls":
        return libreoffice_convert("figures.csv", b"quarter,revenue\nQ1,100\nQ2,120\n", "xls")
    if extension == "ppt":
        return libreoffice_convert("slides.fodp", flat_odf("presentation", SLIDES_BODY), "ppt")
    raise ValueError(extension)


FREESECT, ENDOFCHAIN, FATSECT, NOSTREAM = 0xFFFFFFFF, 0xFFFFFFFE, 0xFFFFFFFD, 0xFFFFFFFF
SECTOR, MINI_SECTOR, MINI_CUTOFF = 512, 64, 4096
_DIRENTRY = struct.Struct("<64sHBB3I16sIQQIQ")
Tree = dict[str, "bytes | Tree"]


@dataclass
class _Entry:
    name: str
    kind: int  # 1 storage, 2 stream, 5 root ([MS-CFB] §2.6.1)
    data: bytes = b""
    left: int = NOSTREAM
    right: int = NOSTREAM
    child: int = NOSTREAM
    start: int = ENDOFCHAIN
    size: int = 0
    clsid: bytes = bytes(16)

    def pack(self) -> bytes:
        name = (self.name + "\0").encode("utf-16-le")
        assert len(name) <= 64, self.name
        return _DIRENTRY.pack(
            name, len(name), self.kind, 1, self.left, self.right, self.child, self.clsid, 0, 0, 0,
            self.start, self.size,
        )  # fmt: skip


def compound_file(tree: Tree, root_clsid: bytes = bytes(16), chain: bool = False) -> bytes:
    """A version 3 compound file holding ``tree`` (name → stream bytes, or a dict for a storage):
    header, streams of 4,096 bytes or more in their own sectors, the others in the mini stream
    (64-byte mini sectors chained by the mini FAT), the directory, then the FAT (at most 109
    sectors, so no DIFAT: files up to about 7 MB). Siblings form a balanced binary search tree in
    [MS-CFB] order (name length, then upper-cased names), every node black; ``chain`` makes each
    sibling the right child of the one before instead (a degenerate tree)."""
    entries = [_Entry("Root Entry", 5, clsid=root_clsid)]

    def sibling_tree(ids: list[int]) -> int:
        if not ids:
            return NOSTREAM
        if chain:
            for before, after in itertools.pairwise(ids):
                entries[before].right = after
            return ids[0]
        mid = len(ids) // 2
        entries[ids[mid]].left = sibling_tree(ids[:mid])
        entries[ids[mid]].right = sibling_tree(ids[mid + 1 :])
        return ids[mid]

    def add(parent: int, children: Tree) -> None:
        ids = []
        for name, value in children.items():
            ids.append(len(entries))
            if isinstance(value, dict):
                entries.append(_Entry(name, 1))
                add(ids[-1], value)
            else:
                entries.append(_Entry(name, 2, value))
        ids.sort(key=lambda i: (len(entries[i].name), entries[i].name.upper()))
        entries[parent].child = sibling_tree(ids)

    add(0, tree)
    sectors: list[bytes] = []
    fat: list[int] = []

    def place(data: bytes) -> int:
        start, count = len(sectors), math.ceil(len(data) / SECTOR)
        sectors.extend(data[i * SECTOR : (i + 1) * SECTOR].ljust(SECTOR, b"\0") for i in range(count))
        fat.extend([*range(start + 1, start + count), ENDOFCHAIN])
        return start

    mini = bytearray()
    minifat: list[int] = []
    for entry in entries:
        if entry.kind != 2 or not entry.data:
            continue
        entry.size = len(entry.data)
        if entry.size >= MINI_CUTOFF:
            entry.start = place(entry.data)
            continue
        entry.start, count = len(mini) // MINI_SECTOR, math.ceil(entry.size / MINI_SECTOR)
        minifat.extend([*range(entry.start + 1, entry.start + count), ENDOFCHAIN])
        mini += entry.data.ljust(count * MINI_SECTOR, b"\0")
    if mini:
        entries[0].start, entries[0].size = place(bytes(mini)), len(mini)
    minifat_start, minifat_sectors = ENDOFCHAIN, math.ceil(len(minifat) / 128)
    if minifat:
        minifat += [FREESECT] * (minifat_sectors * 128 - len(minifat))
        minifat_start = place(struct.pack(f"<{len(minifat)}I", *minifat))
    unused = _DIRENTRY.pack(b"", 0, 0, 0, NOSTREAM, NOSTREAM, NOSTREAM, bytes(16), 0, 0, 0, 0, 0)
    directory_start = place(b"".join(e.pack() for e in entries) + unused * (-len(entries) % 4))
    fat_sectors = 0
    while fat_sectors * 128 < len(sectors) + fat_sectors:
        fat_sectors += 1
    assert fat_sectors <= 109, "too large for a header-only DIFAT"
    fat_ids = list(range(len(sectors), len(sectors) + fat_sectors))
    fat += [FATSECT] * fat_sectors
    fat += [FREESECT] * (fat_sectors * 128 - len(fat))
    header = struct.pack(
        "<8s16s5H6s9I", ole.SIGNATURE, bytes(16), 0x3E, 3, 0xFFFE, 9, 6, bytes(6), 0, fat_sectors,
        directory_start, 0, MINI_CUTOFF, minifat_start, minifat_sectors, ENDOFCHAIN, 0,
    )  # fmt: skip
    header += struct.pack("<109I", *fat_ids, *[FREESECT] * (109 - fat_sectors))
    return header + b"".join(sectors) + struct.pack(f"<{len(fat)}I", *fat)


def read_tree(data: bytes) -> tuple[Tree, bytes]:
    """Every storage and stream of a compound file (read with olefile), and its root CLSID."""
    compound = olefile.OleFileIO(io.BytesIO(data), raise_defects=olefile.DEFECT_INCORRECT)

    def walk(entry: Any, path: list[str]) -> Tree:
        tree: Tree = {}
        for kid in entry.kids:
            if kid.entry_type == olefile.STGTY_STORAGE:
                tree[kid.name] = walk(kid, [*path, kid.name])
            else:
                tree[kid.name] = compound.openstream([*path, kid.name]).read()
        return tree

    clsid = uuid.UUID(compound.root.clsid).bytes_le if compound.root.clsid else bytes(16)
    return walk(compound.root, []), clsid


def rebuilt(extension: str, add: Tree | None = None, replace: Tree | None = None) -> bytes:
    """A LibreOffice document's compound file written again by :func:`compound_file`, with the
    storages and streams of ``add`` added and those of ``replace`` replaced."""
    tree, clsid = read_tree(legacy_document(extension))
    tree.update(add or {})
    tree.update(replace or {})
    return compound_file(tree, clsid)


def vba_project(module: str) -> Tree:
    """A VBA project storage's layout ([MS-OVBA] §2.2.1): the ``PROJECT`` stream (text),
    ``PROJECTwm``, and the ``VBA`` storage with ``_VBA_PROJECT`` (its 7-byte header),
    ``dir`` and one module stream. ``dir`` and the module hold placeholder bytes, not compressed
    code: the layout is what is detected."""
    return {
        "PROJECT": f'ID="{{{uuid.uuid4()}}}"\r\nDocument={module}/&H00000000\r\nName="Project"\r\n'.encode(),
        "PROJECTwm": module.encode() + b"\0" + module.encode("utf-16-le") + b"\0\0\0\0",
        "VBA": {
            "_VBA_PROJECT": b"\xcc\x61\xff\xff\x00\x00\x00",
            "dir": b"\x01" + os.urandom(300),
            module: b"\x01" + os.urandom(200),
        },
    }


def doc_with_vba() -> bytes:
    """A LibreOffice ``.doc`` with a VBA project in a ``Macros`` storage, where Word keeps it."""
    return rebuilt("doc", {"Macros": vba_project("ThisDocument")})


OTHER_COMPOUND_FILES = {
    # Outlook message ([MS-OXMSG]: property streams __substg1.0_<tag><type>, the
    # __properties_version1.0 stream, the __nameid_version1.0 storage).
    "outlook_msg": {
        "__properties_version1.0": bytes(32),
        "__substg1.0_0037001F": "Quarterly report".encode("utf-16-le"),
        "__substg1.0_1000001F": "See attached.".encode("utf-16-le"),
        "__nameid_version1.0": {"__substg1.0_00020102": bytes(16)},
    },
    # An OOXML file encrypted with a password ([MS-OFFCRYPTO]: EncryptionInfo,
    # EncryptedPackage, the \x06DataSpaces storage).
    "encrypted_ooxml": {
        "EncryptionInfo": b"\x04\x00\x04\x00\x40\x00\x00\x00" + os.urandom(200),
        "EncryptedPackage": struct.pack("<Q", 9000) + os.urandom(9008),
        "\x06DataSpaces": {
            "Version": b"\x3c\x00\x00\x00" + "Microsoft.Container.DataSpaces".encode("utf-16-le")
        },
    },
    # The same with a WordDocument stream beside the package (issue 15, item 7: it was typed
    # application/msword, accepted, held, and failed PARSE_ERROR in LibreOffice).
    "encrypted_ooxml_with_a_word_stream": {
        "EncryptionInfo": b"\x04\x00\x04\x00\x40\x00\x00\x00" + os.urandom(200),
        "EncryptedPackage": struct.pack("<Q", 9000) + os.urandom(9008),
        "WordDocument": b"\xec\xa5" + bytes(4094),
    },
}


WORD95_TEXT = "Minutes of the meeting held in nineteen ninety five"


def word6_document(text: str, nfib: int = 0x0065, flags: int = 0) -> bytes:
    """A Word 6.0 (``nFib`` 101) or Word 95 (104) document holding ``text`` as one paragraph: a
    compound file whose ``WordDocument`` stream is a Word 6/95 FIB and the text after it.

    The FIB's layout is the one LibreOffice's ``WW8Fib`` reads for Word 6/95 (no ``csw``/``rgsw``
    block of Word 97; offsets in bytes): ``wIdent`` 0xA5DC at 0, ``nFib`` 2, ``nProduct`` 4,
    ``lid`` 6, ``pnNext`` 8, the flags 10 (``fComplex`` clear: the text is one run from ``fcMin``,
    8-bit, code page 1252), ``nFibBack`` 12, ``fcMin`` 24 and ``fcMac`` 28 (where the text starts
    and ends), ``cbMac`` 32 (the stream's length), ``ccpText`` 52 (characters of main text,
    the final paragraph mark included); every FC/LCB pair from 88 on is empty (no style sheet,
    no character or paragraph formatting, no sections: LibreOffice's defaults). ``fcMin`` is
    0x300, as LibreOffice's own (export) code for Word 6 sets it."""
    body = text.encode("cp1252") + b"\r"
    fc_min = 0x300
    stream = bytearray(fc_min) + body
    stream += bytes((-len(stream)) % 512)
    struct.pack_into("<HHHhhH", stream, 0, 0xA5DC, nfib, 0xC02D, 0x0409, 0, flags)
    struct.pack_into("<H", stream, 12, 0x0065)
    struct.pack_into("<iii", stream, 24, fc_min, fc_min + len(body), len(stream))
    struct.pack_into("<i", stream, 52, len(body))
    return compound_file({"WordDocument": bytes(stream)})
