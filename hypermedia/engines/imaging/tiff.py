"""TIFF pages libvips decodes here, the ones Pillow decodes instead (by compression and layout), the rest refused.

The libtiff inside the ``pyvips-binary`` wheel is built without some codecs. For a TIFF whose
strips use one of them, libvips reads the header, then either fails the decode (old-style JPEG:
"Old-style JPEG compression support is not configured", which the pipeline reported as
``CORRUPT_INPUT``) or, with ``fail_on="truncated"``, returns **black pixels without an error**
(LZMA, ZSTD, JBIG, LERC, PixarLog and the schemes libtiff does not know: libtiff reports those as
errors libvips only fails on at ``fail_on="error"``). So the compression of a page is read from
its IFD before anything is decoded, and decides the decoder:

* :data:`LIBVIPS_COMPRESSIONS`: libvips' ``tiffload``, as before, except tiles with separate
  planes (``PlanarConfiguration`` 2), which libvips refuses and Pillow decodes;
* :data:`PILLOW_COMPRESSIONS` (old-style JPEG, LZMA, ZSTD): Pillow's TIFF plugin, whose libtiff
  (inside the Pillow wheel) has these codecs, in the sandbox child like libvips, after the same
  pixel limit was checked on libvips' header of the file (:func:`decode_page` checks that
  Pillow's header says the same size);
* any other: ``UNSUPPORTED_FORMAT`` naming the compression (:func:`decoder_for`).

The image operations decode the first page only; OCR (:mod:`hypermedia.engines.ocr.engine`) decides for
each selected page of a multi-page TIFF by that page's own IFD (:func:`page_compression`).

Both sets were measured on ``pyvips-binary`` 8.18.7 and Pillow 13.0.0 (a TIFF of each compression
scheme libtiff 4.7 names, decoded with ``fail_on="error"``); ``tests/unit/test_imaging_avif_tiff.py`` measures
them again, so an upgrade that changes a build's codecs fails there.

Importing this module is fork-safe (the zygote preloads it); :func:`decode_page` runs
Pillow's decoder: call it in the sandbox child.
"""

from __future__ import annotations

import struct
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, Literal

import pyvips
from PIL import Image, TiffImagePlugin, UnidentifiedImageError

from hypermedia.core.errors import PermanentJobError

__all__ = [
    "COMPRESSION_NAMES",
    "LIBVIPS_COMPRESSIONS",
    "PILLOW_COMPRESSIONS",
    "decode_page",
    "decoder_for",
    "page_compression",
]

COMPRESSION_NAMES: Final = {
    1: "none",
    2: "CCITT modified Huffman RLE",
    3: "CCITT Group 3 fax",
    4: "CCITT Group 4 fax",
    5: "LZW",
    6: "old-style JPEG",
    7: "JPEG",
    8: "Deflate (Adobe)",
    9: "JBIG (T.85)",
    10: "JBIG (T.43)",
    32766: "NeXT 2-bit RLE",
    32771: "CCITT RLE (word-aligned)",
    32773: "PackBits",
    32809: "ThunderScan RLE",
    32895: "IT8 CT padding",
    32896: "IT8 linework RLE",
    32897: "IT8 monochrome picture",
    32898: "IT8 binary line art",
    32908: "Pixar 10-bit LZW",
    32909: "PixarLog",
    32946: "Deflate",
    32947: "Kodak DCS",
    34661: "ISO JBIG",
    34676: "SGI LogLuv",
    34677: "SGI LogLuv 24-bit",
    34712: "JPEG 2000",
    34887: "LERC",
    34925: "LZMA",
    50000: "ZSTD",
    50001: "WebP",
    50002: "JPEG XL",
}
"""TIFF ``Compression`` (tag 259) values and their names: TIFF 6.0 §3 and libtiff's ``tiff.h``."""

LIBVIPS_COMPRESSIONS: Final = frozenset(
    {1, 2, 3, 4, 5, 7, 8, 32766, 32771, 32773, 32809, 32946, 34676, 34677, 50001}
)
"""Compressions the libtiff inside ``pyvips-binary`` 8.18.7 has a codec for (measured)."""

PILLOW_COMPRESSIONS: Final = frozenset({6, 34925, 50000})
"""Compressions that libtiff lacks and Pillow 13.0's libtiff decodes: old-style JPEG, LZMA, ZSTD."""

_COMPRESSION_TAG: Final = 259
_PLANAR_CONFIGURATION_TAG: Final = 284
_TILE_WIDTH_TAG: Final = 322
_LAYOUT_TAGS: Final = frozenset({_COMPRESSION_TAG, _PLANAR_CONFIGURATION_TAG, _TILE_WIDTH_TAG})
_ORIENTATION_TAG: Final = 274
_MAX_IFD_ENTRIES: Final = 4096
"""Most IFD entries read while looking for the compression (a real first IFD has a few dozen)."""


def page_compression(path: Path, page: int = 0) -> int | None:
    """The ``Compression`` of IFD ``page`` (0 = the first page) of a TIFF or BigTIFF file, read
    without decoding, following the chain of next-IFD offsets.

    Returns:
        The tag's value; 1 (none, the TIFF 6.0 default) when the IFD has no such tag; ``None``
        when the header or the IFDs up to ``page`` cannot be read (libvips then judges the file).
    """
    tags = _page_tags(path, page)
    return None if tags is None else tags.get(_COMPRESSION_TAG, 1)


def _page_tags(path: Path, page: int) -> dict[int, int] | None:
    """The single SHORT or LONG values of :data:`_LAYOUT_TAGS` in IFD ``page``; ``None`` when the
    header or the IFDs up to ``page`` cannot be read."""
    with path.open("rb") as f:
        head = f.read(16)
        if head[:2] == b"II":
            order = "<"
        elif head[:2] == b"MM":
            order = ">"
        else:
            return None
        if len(head) < 16:
            return None
        (version,) = struct.unpack(order + "H", head[2:4])
        if version == 42:  # classic TIFF: 2-byte count, 12-byte entries, 4-byte values and offsets
            (offset,) = struct.unpack(order + "I", head[4:8])
            count_format, entry_size, value_format = "H", 12, "I"
        elif version == 43:  # BigTIFF: 8-byte count, 20-byte entries, 8-byte values and offsets
            (offset,) = struct.unpack(order + "Q", head[8:16])
            count_format, entry_size, value_format = "Q", 20, "Q"
        else:
            return None
        count_size, value_size = struct.calcsize(count_format), struct.calcsize(value_format)
        seen: set[int] = set()
        for _ in range(page):  # skip to IFD `page`: count, entries, then the next IFD's offset
            if offset in seen:
                return None  # a loop of IFDs
            seen.add(offset)
            f.seek(offset)
            raw = f.read(count_size)
            if len(raw) != count_size:
                return None
            (count,) = struct.unpack(order + count_format, raw)
            f.seek(offset + count_size + count * entry_size)
            raw = f.read(value_size)
            if len(raw) != value_size:
                return None
            (offset,) = struct.unpack(order + value_format, raw)
            if offset == 0:
                return None  # no such page
        f.seek(offset)
        raw = f.read(count_size)
        if len(raw) != count_size:
            return None
        (count,) = struct.unpack(order + count_format, raw)
        entries = f.read(min(count, _MAX_IFD_ENTRIES) * entry_size)
    tags: dict[int, int] = {}
    for start in range(0, len(entries) - entry_size + 1, entry_size):
        tag, kind = struct.unpack(order + "HH", entries[start : start + 4])
        if tag not in _LAYOUT_TAGS:
            continue
        value = entries[start + entry_size - value_size : start + entry_size]
        if kind == 3:  # SHORT, left-justified in the value field
            tags[tag] = int(struct.unpack(order + "H", value[:2])[0])
        elif kind == 4:  # LONG
            tags[tag] = int(struct.unpack(order + "I", value[:4])[0])
        elif tag == _COMPRESSION_TAG:
            return None  # a compression of another type: unreadable
    return tags


def compression_name(compression: int) -> str:
    """``"LZMA (34925)"``: the name of a ``Compression`` value and the value."""
    name = COMPRESSION_NAMES.get(compression, "unknown")
    return f"{name} ({compression})"


def decoder_for(path: Path, page: int = 0) -> Literal["libvips", "pillow"]:
    """Which decoder reads page ``page`` (0 = the first) of the TIFF at ``path``: Pillow for the
    :data:`PILLOW_COMPRESSIONS`, and for tiles with separate planes (``PlanarConfiguration`` 2 and
    ``TileWidth``: libvips' tiff2vips fails "tiled separate planes not supported", which was
    ``CORRUPT_INPUT``), libvips for everything else it has a codec for.

    Raises:
        PermanentJobError: ``UNSUPPORTED_FORMAT`` naming the compression when neither has a codec
            for it (JBIG, LERC, PixarLog, JPEG 2000, JPEG XL, unknown values).
    """
    tags = _page_tags(path, page)
    if tags is None:
        return "libvips"
    compression = tags.get(_COMPRESSION_TAG, 1)
    if compression in PILLOW_COMPRESSIONS:
        return "pillow"
    if compression in LIBVIPS_COMPRESSIONS:
        planar_tiles = tags.get(_PLANAR_CONFIGURATION_TAG) == 2 and _TILE_WIDTH_TAG in tags
        return "pillow" if planar_tiles else "libvips"
    raise PermanentJobError(
        f"TIFF compression {compression_name(compression)} is not supported.", "UNSUPPORTED_FORMAT"
    )


def _corrupt() -> PermanentJobError:
    return PermanentJobError("The image data is truncated or cannot be decoded.", "CORRUPT_INPUT")


_INTERPRETATION: Final = {"L": "b-w", "LA": "b-w", "RGB": "srgb", "RGBA": "srgb", "CMYK": "cmyk"}


def _eight_bit(picture: Image.Image) -> Image.Image:
    """``picture`` in one of :data:`_INTERPRETATION`'s modes, 8 bits a sample (16-bit grey
    scaled down, not clipped)."""
    if picture.mode in _INTERPRETATION:
        return picture
    if picture.mode.startswith("I;16"):
        return picture.convert("I").point(lambda v: v / 256).convert("L")
    has_alpha = "A" in picture.getbands() or "transparency" in picture.info
    return picture.convert("RGBA" if has_alpha else "RGB")


_EXTENTS: Final = ((273, 279), (324, 325), (513, 514))
"""(offsets, byte counts) tags of the data a page decodes: strips, tiles, and the JPEG stream of
an old-style JPEG page (JPEGInterchangeFormat and its length); TIFF 6.0 §3, §15, §22."""


def _data_past_the_end(tags: Mapping[int, Any], file_size: int) -> bool:
    """Whether the IFD points at strip, tile or JPEG data beyond the end of the file: a truncated
    file, which libtiff's old-style JPEG decoder would decode as grey without an error."""
    for offsets_tag, counts_tag in _EXTENTS:
        offsets, counts = tags.get(offsets_tag), tags.get(counts_tag)
        offsets = (offsets,) if isinstance(offsets, int) else offsets or ()
        counts = (counts,) if isinstance(counts, int) else counts or (0,) * len(offsets)
        if any(
            offset + count > file_size or offset >= file_size
            for offset, count in zip(offsets, counts, strict=False)
        ):
            return True
    return False


def decode_page(path: Path, width: int, height: int, page: int = 0) -> pyvips.Image:
    """Decodes one page of a TIFF with Pillow's TIFF plugin (its libtiff), into memory.

    Args:
        path: a TIFF :func:`decoder_for` sent to Pillow.
        width, height: the page's size in libvips' header, which the pixel limit was checked
            against; Pillow's header must say the same (turned, for orientations 5–8).
        page: 0 for the first page.

    Returns:
        An 8-bit image (``b-w``, ``srgb`` or ``cmyk``, alpha kept), already upright (Pillow 13's
        TIFF plugin applies the orientation tag as it loads), carrying the file's ICC profile
        (``icc-profile-data``) for ``thumbnail_image`` to convert from; no other metadata.

    Raises:
        PermanentJobError: ``CORRUPT_INPUT`` when Pillow cannot read or decode it, reads another
            size than libvips did, or the page's data runs past the end of the file (truncated);
            ``INPUT_TOO_LARGE_PIXELS`` past Pillow's own bomb limit (``2 ×
            PIL.Image.MAX_IMAGE_PIXELS``, 179 million pixels), only reached when the profile's
            pixel limit is larger.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Pillow's warnings about odd tags; the size is checked
            with Image.open(path, formats=("TIFF",)) as picture:
                if not isinstance(picture, TiffImagePlugin.TiffImageFile):
                    raise _corrupt()
                if page:
                    picture.seek(page)
                # Pillow reports (and decodes) the page turned upright by its orientation tag.
                turned = picture.tag_v2.get(_ORIENTATION_TAG) in (5, 6, 7, 8)
                if picture.size != ((height, width) if turned else (width, height)):
                    raise _corrupt()
                if _data_past_the_end(picture.tag_v2, path.stat().st_size):
                    raise _corrupt()
                picture.load()  # this page only
                icc = picture.info.get("icc_profile")
                decoded = _eight_bit(picture)
                data = decoded.tobytes()
                mode, size = decoded.mode, decoded.size
    except Image.DecompressionBombError as exc:  # only when the profile allows more than Pillow
        raise PermanentJobError(
            f"The image has more than {2 * (Image.MAX_IMAGE_PIXELS or 0)} pixels, the most the TIFF "
            "fallback decoder reads.",
            "INPUT_TOO_LARGE_PIXELS",
        ) from exc
    except (UnidentifiedImageError, SyntaxError, ValueError, struct.error, EOFError, OSError) as exc:
        # OSError: Pillow's "decoder error -2", "image file is truncated".
        raise _corrupt() from exc
    image = pyvips.Image.new_from_memory(data, size[0], size[1], len(mode), "uchar")
    image = image.copy(interpretation=_INTERPRETATION[mode])
    if icc:
        image.set_type(pyvips.GValue.blob_type, "icc-profile-data", icc)
    return image
