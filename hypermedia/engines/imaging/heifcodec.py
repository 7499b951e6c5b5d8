"""Which codec an HEIF file's primary image is coded with, read from its boxes (ISO/IEC 23008-12).

An HEIF file (``.heic``, ``.heif``, ``.avif``) is an ISO base media file (ISO/IEC 14496-12) whose
``meta`` box lists items: ``pitm`` names the primary item, ``iinf`` gives each item's type
(``hvc1`` HEVC, ``av01`` AV1, ``grid``/``iden``/``iovl`` derived from other items, ``jpeg``,
``j2k1``, ``vvc1``, ``avc1``, ``unci``…), ``iref``'s ``dimg`` references name the items a derived
image is made of, and ``iprp`` holds the item properties (``hvcC``, ``av1C``: the decoder
configurations) with ``ipma`` associating them to items. An image sequence (``msf1``, ``avis``,
``hevs`` brands) keeps its frames in a ``moov`` track whose sample entry (``stsd``) names the codec.

:func:`primary_codec` reads those boxes and nothing else: which decoder may read the file is
decided from them, before any decoder runs (libvips' ``heifload`` has AV1 only, libheif in
``pillow-heif`` has HEVC only: :mod:`hypermedia.engines.imaging.hevc`). Pure Python, no decoding;
every loop is bounded by the data it walks.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

from hypermedia.core.errors import PermanentJobError

__all__ = ["CODEC_NAMES", "HeifCodec", "primary_codec"]

CODEC_NAMES: Final = {
    "hvc1": "HEVC",
    "hev1": "HEVC",
    "av01": "AV1",
    "avc1": "H.264 (AVC)",
    "avc3": "H.264 (AVC)",
    "vvc1": "H.266 (VVC)",
    "vvi1": "H.266 (VVC)",
    "jpeg": "JPEG",
    "j2k1": "JPEG 2000",
    "unci": "uncompressed (ISO/IEC 23001-17)",
    "mski": "mask",
    "evc1": "EVC",
}
"""Readable names of the coded item types and sample entries (ISO/IEC 23008-12 Annex E, AV1
Image File Format §2.1, ISO/IEC 23001-17): the names error messages use."""

_CONFIG_PROPERTY: Final = {"hvc1": b"hvcC", "av01": b"av1C"}
"""The decoder configuration property an item of these types must have (23008-12 §E.2.2, AVIF §2.2)."""

_DERIVED: Final = frozenset({"grid", "iden", "iovl", "tmap"})
"""Derived image items (23008-12 §6.6.2; ``tmap``, an ISO 21496-1 gain-map tone map, whose first
input is the base image)."""
_MAX_DERIVATION_DEPTH: Final = 4
"""A derived image's inputs may be derived in turn; deeper chains are refused as corrupt."""


@dataclass(frozen=True)
class HeifCodec:
    """What codes an HEIF file's primary image."""

    item_type: str
    """The coded item's type (``hvc1``, ``av01``, ``j2k1``…): for a derived primary image (a
    ``grid`` of tiles, ``iden``, ``iovl``), the type of the first image it is made of; for a
    sequence without a primary item, its track's sample entry type."""
    sequence_only: bool = False
    """True when the file has no primary item, only a ``moov`` track of frames."""

    @property
    def name(self) -> str:
        """A readable codec name: ``HEVC``, ``AV1``… (the four-character code when unknown)."""
        return CODEC_NAMES.get(self.item_type, f"'{self.item_type}'")

    @property
    def is_hevc(self) -> bool:
        return self.item_type in ("hvc1", "hev1")

    @property
    def is_av1(self) -> bool:
        return self.item_type == "av01"


def _corrupt(why: str) -> PermanentJobError:
    return PermanentJobError(f"The HEIF container is damaged: {why}.", "CORRUPT_INPUT")


def _boxes(data: bytes, start: int, end: int) -> Iterator[tuple[bytes, int, int]]:
    """``(type, payload start, box end)`` of each box in ``data[start:end]`` (14496-12 §4.2:
    32-bit size, or 1 then a 64-bit size, or 0 for "to the end")."""
    offset = start
    while offset + 8 <= end:
        size, kind = struct.unpack_from(">I4s", data, offset)
        header = 8
        if size == 1:
            if offset + 16 > end:
                raise _corrupt("a box header is cut off")
            (size,) = struct.unpack_from(">Q", data, offset + 8)
            header = 16
        elif size == 0:
            size = end - offset
        if size < header or offset + size > end:
            raise _corrupt(f"the '{kind.decode('latin-1')}' box runs past its parent")
        yield kind, offset + header, offset + size
        offset += size


def _find(data: bytes, start: int, end: int, kind: bytes) -> tuple[int, int] | None:
    for box, payload, box_end in _boxes(data, start, end):
        if box == kind:
            return payload, box_end
    return None


def _u(data: bytes, offset: int, size: int, end: int) -> int:
    if offset + size > end:
        raise _corrupt("a box is shorter than its fields")
    return int.from_bytes(data[offset : offset + size], "big")


def primary_codec(data: bytes) -> HeifCodec:
    """The codec of the primary image of an HEIF file.

    Args:
        data: the whole file (the ``meta`` box may sit after the media data).

    Returns:
        The coded item type of the primary image (for a derived image, of its first input; for a
        file with only an image sequence, of the track's first sample entry).

    Raises:
        PermanentJobError: ``CORRUPT_INPUT`` when boxes overrun their parents, the primary item
            is missing from ``iinf``, a derived image has no inputs, or a ``hvc1``/``av01`` item
            lacks its ``hvcC``/``av1C`` configuration.
    """
    top = _top_level(data)
    if b"meta" not in top:
        if b"moov" in top:
            return HeifCodec(_sample_entry(data, *top[b"moov"]), sequence_only=True)
        raise _corrupt("it has no 'meta' box")
    meta_start, meta_end = top[b"meta"]
    meta_start += 4  # FullBox: version and flags
    children = {kind: (payload, end) for kind, payload, end in _boxes(data, meta_start, meta_end)}
    if b"pitm" not in children or b"iinf" not in children:
        if b"moov" in top:
            return HeifCodec(_sample_entry(data, *top[b"moov"]), sequence_only=True)
        raise _corrupt("it names no primary item")
    primary = _primary_item(data, *children[b"pitm"])
    types = _item_types(data, *children[b"iinf"])
    inputs = _derived_inputs(data, *children[b"iref"]) if b"iref" in children else {}
    item = primary
    for _ in range(_MAX_DERIVATION_DEPTH):
        if item not in types:
            raise _corrupt(f"item {item} has no entry in 'iinf'")
        if types[item] not in _DERIVED:
            break
        if not inputs.get(item):
            raise _corrupt(f"the derived image {item} has no input images")
        item = inputs[item][0]
    else:
        raise _corrupt("derived images nest too deep")
    item_type = types[item]
    config = _CONFIG_PROPERTY.get(item_type)
    if config is not None and b"iprp" in children:
        if config not in _item_properties(data, *children[b"iprp"], item):
            raise _corrupt(f"the {CODEC_NAMES[item_type]} image has no '{config.decode()}' configuration")
    return HeifCodec(item_type)


def _top_level(data: bytes) -> dict[bytes, tuple[int, int]]:
    """The file's top-level boxes, up to the first that is cut off or overruns the file: a
    truncated ``mdat`` at the end is for the decoder to report, the boxes before it are read."""
    top: dict[bytes, tuple[int, int]] = {}
    try:
        for kind, payload, end in _boxes(data, 0, len(data)):
            top.setdefault(kind, (payload, end))
    except PermanentJobError:
        pass
    return top


def _primary_item(data: bytes, start: int, end: int) -> int:
    version = _u(data, start, 1, end)
    return _u(data, start + 4, 2 if version == 0 else 4, end)


def _item_types(data: bytes, start: int, end: int) -> dict[int, str]:
    """``item_ID → item_type`` from ``iinf`` (``infe`` versions 2 and 3; earlier versions have no
    item type and describe no image items)."""
    version = _u(data, start, 1, end)
    offset = start + 4 + (2 if version == 0 else 4)
    types: dict[int, str] = {}
    for kind, payload, box_end in _boxes(data, offset, end):
        if kind != b"infe":
            continue
        infe_version = _u(data, payload, 1, box_end)
        if infe_version < 2:
            continue
        id_size = 2 if infe_version == 2 else 4
        item_id = _u(data, payload + 4, id_size, box_end)
        type_at = payload + 4 + id_size + 2  # after item_protection_index
        if type_at + 4 > box_end:
            raise _corrupt("an 'infe' box is shorter than its fields")
        types[item_id] = data[type_at : type_at + 4].decode("latin-1")
    return types


def _derived_inputs(data: bytes, start: int, end: int) -> dict[int, list[int]]:
    """``from_item_ID → [to_item_ID, …]`` of the ``dimg`` references in ``iref``."""
    version = _u(data, start, 1, end)
    id_size = 2 if version == 0 else 4
    inputs: dict[int, list[int]] = {}
    for kind, payload, box_end in _boxes(data, start + 4, end):
        if kind != b"dimg":
            continue
        source = _u(data, payload, id_size, box_end)
        count = _u(data, payload + id_size, 2, box_end)
        first = payload + id_size + 2
        inputs[source] = [_u(data, first + i * id_size, id_size, box_end) for i in range(count)]
    return inputs


def _item_properties(data: bytes, start: int, end: int, item: int) -> set[bytes]:
    """The types of the properties ``ipma`` associates with ``item``."""
    ipco = _find(data, start, end, b"ipco")
    ipma = _find(data, start, end, b"ipma")
    if ipco is None or ipma is None:
        raise _corrupt("its item properties are incomplete")
    properties = [kind for kind, _, _ in _boxes(data, *ipco)]
    ipma_start, ipma_end = ipma
    version = _u(data, ipma_start, 1, ipma_end)
    large_index = _u(data, ipma_start + 3, 1, ipma_end) & 1
    offset = ipma_start + 4
    count = _u(data, offset, 4, ipma_end)
    offset += 4
    id_size = 2 if version < 1 else 4
    index_size = 2 if large_index else 1
    found: set[bytes] = set()
    for _ in range(count):
        item_id = _u(data, offset, id_size, ipma_end)
        associations = _u(data, offset + id_size, 1, ipma_end)
        offset += id_size + 1
        for _ in range(associations):
            index = _u(data, offset, index_size, ipma_end) & (0x7FFF if large_index else 0x7F)
            offset += index_size
            if item_id == item and 1 <= index <= len(properties):
                found.add(properties[index - 1])
    return found


def _sample_entry(data: bytes, start: int, end: int) -> str:
    """The first sample entry type of the first track (``moov/trak/mdia/minf/stbl/stsd``)."""
    box: tuple[int, int] | None = (start, end)
    for kind in (b"trak", b"mdia", b"minf", b"stbl", b"stsd"):
        box = _find(data, *box, kind) if box else None
    if box is None:
        raise _corrupt("its image sequence has no sample description")
    stsd_start, stsd_end = box
    for kind, _, _ in _boxes(data, stsd_start + 8, stsd_end):  # after version, flags, entry_count
        return kind.decode("latin-1")
    raise _corrupt("its image sequence has no sample description")
