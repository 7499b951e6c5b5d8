"""HEVC-coded HEIF (iPhone ``.heic`` photos) decoded by libheif with libde265, handed to libvips.

The libvips in ``pyvips-binary`` reads HEIF through a libheif that has an AV1 decoder only: its
``heifload`` opens an HEIC's header and then fails on the first pixel ("Support for this
compression format has not been built in: HEVC"). ``pillow-heif`` ships libheif 1.23 with
libde265 (and x265, which the tests use to make samples; its wheels are GPLv2 for that reason,
see ``docs/adr/0031-hevc-heif-decoded-by-libheif-from-pillow-heif.md``). This module opens such
a file from memory with it, reports the primary image's size and the image count before anything
is decoded (:func:`open_hevc`), and decodes one image into a libvips image in memory
(:func:`decode`), so that the rest of the pipeline (thumbnail, colour, metadata-free save) is the
one every other format goes through.

* **Orientation:** libheif applies the ``irot``, ``imir`` and ``clap`` transformations while it
  decodes (``heif_decoding_options.ignore_transformations`` false), and the reported size is the
  transformed one. The EXIF orientation of an HEIF is *not* applied on top: ISO/IEC 23008-12
  §6.5.1 makes the transformative properties authoritative (the EXIF tag describes the coded
  image, which cameras keep beside a matching ``irot``), as libvips' ``heifload`` and libheif do.
* **Colour:** an ICC profile (``colr`` of type ``prof`` or ``rICC``) is attached as
  ``icc-profile-data``, which ``thumbnail()`` converts to sRGB as for a JPEG. An ``nclx``
  colour description with Display P3 primaries (colour_primaries 12, ITU-T H.273) is converted
  from libvips' built-in P3 profile here; other nclx primaries are read as sRGB.
* **Depth:** 10- and 12-bit colour images are decoded to 8 bits by libheif; a high bit depth
  monochrome image comes as 16-bit grey, which libvips converts.
* **Threads:** ``DECODE_THREADS = 0``, so libheif decodes tiles in the calling thread; libde265
  still runs one worker thread (measured: one thread beside the caller while a 12-megapixel
  iPhone grid decodes, against eight with pillow-heif's default of 4). The sandbox counts every
  thread against ``RLIMIT_NPROC``.
* **Auxiliary images:** thumbnails, depth maps and auxiliary images (HDR gain maps, alpha of
  another item) are not listed, so only top-level images are opened.

Importing this module loads libheif and starts no thread (measured), so the zygote may import it
before it forks. :func:`decode` starts libde265's thread: call it only in the sandbox child.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Final

import pillow_heif
import pyvips

from hypermedia.core.errors import PermanentJobError

__all__ = ["HevcFile", "decode", "open_hevc", "page_size"]

log = logging.getLogger(__name__)

pillow_heif.options.DECODE_THREADS = 0
pillow_heif.options.THUMBNAILS = False
pillow_heif.options.DEPTH_IMAGES = False
pillow_heif.options.AUX_IMAGES = False

_FORMAT_BY_MODE: Final = {
    # pillow-heif mode → (libvips band format, bands, interpretation)
    "L": ("uchar", 1, "b-w"),
    "I;16": ("ushort", 1, "grey16"),
    "RGB": ("uchar", 3, "srgb"),
    "RGBA": ("uchar", 4, "srgb"),
    "RGBa": ("uchar", 4, "srgb"),
}
_BYTES_PER_SAMPLE: Final = {"uchar": 1, "ushort": 2}
_NCLX_DISPLAY_P3: Final = 12
"""colour_primaries of SMPTE EG 432-1 (Display P3), ITU-T H.273 Table 2."""


@dataclass(frozen=True)
class HevcFile:
    """An opened HEVC HEIF: its headers parsed, nothing decoded."""

    images: pillow_heif.HeifFile
    width: int
    """Of the primary image as displayed (after ``irot``/``clap``), in pixels."""
    height: int
    pages: int
    """Top-level images in the file (a burst or a stereo pair has several)."""
    primary: int
    """Index of the primary image among them, 0-based."""


def _error(exc: Exception) -> BaseException:
    """The error a libheif failure (as pillow-heif raises it: ``"<error>: <suberror>: <detail>"``)
    stands for."""
    text = str(exc)
    lowered = text.lower()
    if "memory allocation" in lowered:
        return MemoryError("libheif ran out of memory")
    if "security limit" in lowered:
        return PermanentJobError(
            f"The HEIF file exceeds the decoder's limits ({text[:200]}).", "UNSUPPORTED_FORMAT"
        )
    if "unsupported" in lowered or "not been built in" in lowered:
        return PermanentJobError(
            f"The HEIF file uses a feature this decoder lacks ({text[:200]}).", "UNSUPPORTED_FORMAT"
        )
    return PermanentJobError("The image data is truncated or cannot be decoded.", "CORRUPT_INPUT")


def open_hevc(data: bytes) -> HevcFile:
    """Parses an HEVC HEIF's boxes and image headers; decodes no pixel.

    Args:
        data: the whole file (:func:`hypermedia.engines.imaging.heifcodec.primary_codec` said HEVC).

    Returns:
        The opened file, with the primary image's displayed size and the top-level image count.

    Raises:
        PermanentJobError: ``CORRUPT_INPUT`` when libheif cannot parse it or it holds no image;
            ``UNSUPPORTED_FORMAT`` for a feature libheif lacks or a file past libheif's security
            limits (more than 1,000 items, for example).
        MemoryError: libheif could not allocate.
    """
    try:
        images = pillow_heif.open_heif(data, convert_hdr_to_8bit=True)
    except (ValueError, EOFError, SyntaxError, RuntimeError, OSError) as exc:
        raise _error(exc) from exc
    if len(images) == 0:
        raise PermanentJobError("The HEIF file holds no image.", "CORRUPT_INPUT")
    width, height = images[images.primary_index].size
    return HevcFile(images, width, height, pages=len(images), primary=images.primary_index)


def page_size(file: HevcFile, index: int) -> tuple[int, int]:
    """Displayed ``(width, height)`` of top-level image ``index`` (0-based), from its header."""
    width, height = file.images[index].size
    return width, height


def decode(file: HevcFile, index: int | None = None) -> pyvips.Image:
    """Decodes one image of an opened file into a libvips image in memory.

    Args:
        file: from :func:`open_hevc`; check its size against the pixel limit first.
        index: 0-based top-level image; ``None`` for the primary image.

    Returns:
        An 8-bit sRGB (3 or 4 bands, alpha not premultiplied), 8-bit ``b-w`` or 16-bit ``grey16``
        image, upright (``irot``/``imir`` applied), with the file's ICC profile attached as
        ``icc-profile-data`` when it has one (already converted to sRGB for an nclx Display P3
        image). No other metadata.

    Raises:
        PermanentJobError: ``CORRUPT_INPUT`` when the HEVC data does not decode;
            ``UNSUPPORTED_FORMAT`` for a pixel layout libvips is not given here.
        MemoryError: libheif or libvips could not allocate.
    """
    image = file.images[file.primary if index is None else index]
    try:
        data = image.data
    except (ValueError, EOFError, SyntaxError, RuntimeError, OSError) as exc:
        raise _error(exc) from exc
    if image.mode not in _FORMAT_BY_MODE:
        raise PermanentJobError(
            f"HEIF images decoded as {image.mode} are not supported.", "UNSUPPORTED_FORMAT"
        )
    band_format, bands, interpretation = _FORMAT_BY_MODE[image.mode]
    width, height = image.size
    row = width * bands * _BYTES_PER_SAMPLE[band_format]
    if image.stride != row:  # pillow-heif removes the row padding (remove_stride, its default)
        data = b"".join(data[y * image.stride : y * image.stride + row] for y in range(height))
    vips_image = pyvips.Image.new_from_memory(data, width, height, bands, band_format)
    vips_image = vips_image.copy(interpretation=interpretation)
    if image.mode == "RGBa":
        vips_image = vips_image.unpremultiply().cast("uchar")
    info: dict[str, Any] = image.info
    icc = info.get("icc_profile")
    if icc:
        vips_image.set_type(pyvips.GValue.blob_type, "icc-profile-data", bytes(icc))
    elif bands >= 3 and (info.get("nclx_profile") or {}).get("color_primaries") == _NCLX_DISPLAY_P3:
        vips_image = vips_image.icc_transform("srgb", input_profile="p3", embedded=False)
    return vips_image
