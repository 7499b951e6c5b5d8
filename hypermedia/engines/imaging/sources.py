"""Opening and checking an image source, before a pixel is decoded: steps 1–4 of
:mod:`hypermedia.engines.imaging.ops`' pipeline. :func:`open_source` checks the file's size, its format
from the magic bytes (:func:`sniff_mime`), the loader libvips reports (:data:`ALLOWED_LOADERS`,
:data:`SVG_LOADER`), the header's pixels and pages against :class:`ImageLimits`, and picks the
decoder: libvips, libheif for an HEVC HEIF (:func:`heif_decoder`), Pillow for a TIFF libvips'
libtiff cannot decode, librsvg from memory for a vetted SVG (:func:`svgload_unblocked`). libvips
errors become the platform's codes here (:func:`reraise_vips_error`, :func:`missing_decoder`).

Importing this module blocks libvips' untrusted operations for the process (as importing
:mod:`~hypermedia.engines.imaging.ops` does, which imports it). It runs libvips loaders: call
:func:`open_source` only in the sandbox child.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final, NoReturn

import pyvips

from hypermedia.core.errors import PermanentJobError
from hypermedia.engines.imaging import heifcodec, hevc, sequence, svg, tiff
from hypermedia.intake import contenttype

log = logging.getLogger(__name__)

__all__ = [
    "ALLOWED_LOADERS",
    "MAX_PAGES",
    "RASTER_LOADER_BY_MIME",
    "SVG_LOADER",
    "ImageLimits",
    "Source",
    "check_loader",
    "heif_decoder",
    "missing_decoder",
    "open_source",
    "read_header",
    "reraise_vips_error",
    "sniff_mime",
    "svgload_unblocked",
]


ALLOWED_LOADERS: Final = frozenset({"jpegload", "pngload", "webpload", "gifload", "tiffload", "heifload"})
"""libvips loaders allowed to read untrusted raster input; ``vips-loader`` of every opened image
must be the loader chosen for its format."""


SVG_LOADER: Final = "svgload_buffer"
"""The loader of SVG input and of nothing else. Blocked like every untrusted operation, except while
a document :func:`hypermedia.engines.imaging.svg.vet` accepted is loaded and rendered."""
_SVG_LOADER_CLASS: Final = "VipsForeignLoadSvgBuffer"


MAX_PAGES: Final = 10_000
"""Default most frames or pages an input may declare (``n-pages``): a 10-minute animation at 15 fps
is 9,000 frames."""


# Untrusted loaders (ImageMagick, PDFium, OpenSlide, ...) refuse to run at all, whatever the caller
# asks; the allowlist below is the second fence. The operation cache is useless in a one-job
# process and would hide a changed file behind its old name in long-lived ones.
pyvips.block_untrusted_set(True)
pyvips.cache_set_max(0)


@dataclass(frozen=True)
class ImageLimits:
    """Bounds checked before decoding; the sandbox's rlimits are the backstop behind them."""

    max_pixels: int
    """Largest ``width × height`` of the first frame, read from the header."""
    max_input_bytes: int
    """Largest input file, in bytes."""
    max_pages: int = MAX_PAGES
    """Most frames or pages the header may declare; only the first is decoded."""


RASTER_LOADER_BY_MIME: Final = {
    "image/jpeg": "jpegload",
    "image/png": "pngload",
    "image/webp": "webpload",
    "image/gif": "gifload",
    "image/tiff": "tiffload",
    "image/avif": "heifload",
    "image/heif": "heifload",
}
"""libvips loader of each raster type the platform decodes (the OCR engine uses these too)."""
_LOADER_BY_MIME: Final = {**RASTER_LOADER_BY_MIME, "image/svg+xml": SVG_LOADER}
# Raster images embedded in an SVG as data: URIs; their headers are checked before rendering.
_EMBEDDED_LOADER: Final = {"image/png": "pngload_buffer", "image/jpeg": "jpegload_buffer"}


# The image signatures live in hypermedia.intake.contenttype (pure Python, shared with the gateway).
sniff_mime = contenttype.image_mime


def _corrupt() -> PermanentJobError:
    return PermanentJobError("The image data is truncated or cannot be decoded.", "CORRUPT_INPUT")


def reraise_vips_error(exc: pyvips.Error) -> NoReturn:
    """Turn a libvips failure into the error the sandbox maps; the input is to blame unless the
    message says a resource ran out (RLIMIT_AS, RLIMIT_FSIZE)."""
    text = f"{exc.message} {exc.detail}".lower()
    # libvips says "out of memory"; encoders under RLIMIT_AS word it their own way (libaom via
    # libheif: "Failed to allocate context buffers"; glib: "failed to allocate N bytes").
    if any(marker in text for marker in ("out of memory", "cannot allocate memory", "failed to allocate")):
        log.warning("libvips ran out of memory: %s", text.strip()[:300])
        raise MemoryError("libvips ran out of memory") from exc
    if "file too large" in text:
        raise OSError(errno.EFBIG, "output exceeds the file size limit") from exc
    missing = missing_decoder(f"{exc.message} {exc.detail}")
    if missing is not None:
        raise missing from exc
    raise _corrupt() from exc


_MISSING_DECODER: Final = ("has not been built in", "no decoder", "unsupported codec")
"""How libheif (through libvips) says it has no decoder for a file's codec (libheif
``heif_suberror_Unsupported_codec``, ``heif_error_Plugin_loading_error``)."""


_MISSING_CODEC: Final = re.compile(r"has not been built in: ([A-Za-z0-9.-]+)")


def missing_decoder(text: str) -> PermanentJobError | None:
    """``UNSUPPORTED_FORMAT`` when a libvips error ``text`` says the codec has no decoder here
    (naming the codec when libheif did: "…has not been built in: HEVC…"); ``None`` otherwise. A
    valid file in a codec this platform cannot decode is not ``CORRUPT_INPUT``. The full text is
    logged, not sent."""
    if not any(marker in text.lower() for marker in _MISSING_DECODER):
        return None
    log.info("libvips has no decoder: %s", " ".join(text.split())[:300])
    codec = _MISSING_CODEC.search(text)
    what = f"coded with {codec.group(1)}" if codec else "in a codec"
    return PermanentJobError(f"The image is {what}, which cannot be decoded here.", "UNSUPPORTED_FORMAT")


@dataclass(frozen=True)
class Source:
    """An input that passed :func:`open_source`'s checks, and how the operations decode it."""

    path: Path
    mime: str
    loader: str
    """The loader chosen from the magic bytes; every image opened from this source must report it."""
    pages: int
    width: int = 0
    height: int = 0
    """The size in pixels the header gives (before any EXIF orientation; an HEVC HEIF's displayed
    size); 0 when unknown."""
    document: bytes | None = None
    """SVG only: the vetted document, loaded from memory (librsvg then has no base file)."""
    hevc: hevc.HevcFile | None = None
    """An HEVC-coded HEIF only: opened by libheif (:mod:`hypermedia.engines.imaging.hevc`), not by libvips."""
    pillow_size: tuple[int, int] | None = None
    """TIFF whose first page Pillow decodes (:mod:`hypermedia.engines.imaging.tiff`): that page's width and
    height in libvips' header, which the pixel limit bounded; ``None`` when libvips decodes."""
    plain_srgb: bool = False
    """8-bit sRGB pixels with no embedded ICC profile (most camera and web JPEGs): converting them
    to sRGB is the identity, so the operations skip the colour transform (measured 8–12 ms of CPU
    per 12 MP photo, most of it building the transform, see docs/performance.md)."""


def _too_many_pixels(what: str, limits: ImageLimits) -> PermanentJobError:
    return PermanentJobError(f"{what} more than {limits.max_pixels} pixels.", "INPUT_TOO_LARGE_PIXELS")


def read_header(loader: str, source: str | bytes) -> pyvips.Image:
    """Runs ``loader`` on a file name or bytes for the header only: nothing is decoded until pixels
    are asked for. Sequential access, and truncation is an error."""
    try:
        return pyvips.Operation.call(loader, source, access="sequential", fail_on="truncated")
    except pyvips.Error as exc:
        reraise_vips_error(exc)
        raise  # unreachable: reraise_vips_error always raises


def open_source(input_path: Path, limits: ImageLimits) -> Source:
    """Checks size, format, loader, header pixels and pages (for SVG, vets the document first);
    decodes and renders nothing."""
    size = input_path.stat().st_size
    if size > limits.max_input_bytes:
        raise PermanentJobError(
            f"The input is larger than the {limits.max_input_bytes} byte limit.", "INPUT_TOO_LARGE"
        )
    with input_path.open("rb") as f:
        head = f.read(contenttype.HEAD_BYTES)
    mime = sniff_mime(head)
    if mime is None:
        raise PermanentJobError("The input is not a supported image format.", "UNSUPPORTED_FORMAT")
    if mime == "image/svg+xml":
        return _open_svg(input_path, limits)
    loader = _LOADER_BY_MIME[mime]
    if loader == "heifload":
        data = input_path.read_bytes()
        if heif_decoder(data) == "hevc":
            return _open_hevc(data, input_path, mime, limits)
    header = read_header(loader, str(input_path))
    check_loader(header, loader)
    if header.width * header.height > limits.max_pixels:
        raise _too_many_pixels("The image has", limits)
    pages = int(header.get("n-pages")) if header.get_typeof("n-pages") else 1
    if loader == "heifload":
        pages = max(pages, _sequence_frames(input_path))
    if pages > limits.max_pages:
        raise PermanentJobError(
            f"The image has more than {limits.max_pages} frames or pages.", "INPUT_TOO_MANY_PAGES"
        )
    pillow_size = _tiff_pillow_size(input_path, header) if loader == "tiffload" else None
    plain_srgb = (
        header.interpretation == "srgb"
        and header.format == "uchar"
        and not header.get_typeof("icc-profile-data")
    )
    return Source(
        path=input_path,
        mime=mime,
        loader=loader,
        pages=pages,
        width=header.width,
        height=header.height,
        pillow_size=pillow_size,
        plain_srgb=plain_srgb,
    )


def _sequence_frames(path: Path) -> int:
    """Frames of an animated AVIF's or HEIF sequence's track (:mod:`hypermedia.engines.imaging.sequence`),
    which libvips' ``n-pages`` (still images only) does not count; 0 for a still image."""
    return sequence.track_frames(path) or 0


def _tiff_pillow_size(path: Path, header: pyvips.Image) -> tuple[int, int] | None:
    """The first page's size when Pillow decodes it (a compression libvips' libtiff lacks: old-style
    JPEG, LZMA, ZSTD; or tiles with separate planes), ``None`` when libvips does;
    ``UNSUPPORTED_FORMAT`` naming a compression neither decodes
    (:func:`hypermedia.engines.imaging.tiff.decoder_for`)."""
    if tiff.decoder_for(path) == "pillow":
        return header.width, header.height
    return None


def heif_decoder(data: bytes) -> str:
    """Which decoder reads an HEIF file (``image/heif`` or ``image/avif``), from the codec of its
    primary image (:func:`hypermedia.engines.imaging.heifcodec.primary_codec`: the ``hvc1``/``av01``
    item type and its ``hvcC``/``av1C`` configuration), never by trying one.

    Args:
        data: the whole file.

    Returns:
        ``"hevc"``: libheif with libde265 (:mod:`hypermedia.engines.imaging.hevc`); ``"heifload"``:
        libvips' loader, whose libheif decodes AV1 (also a file with only an AV1 sequence).

    Raises:
        PermanentJobError: ``UNSUPPORTED_FORMAT`` naming the codec for any other (JPEG, JPEG
            2000, H.264, VVC, uncompressed…) and for an HEVC sequence without a still image;
            ``CORRUPT_INPUT`` for damaged boxes.
    """
    codec = heifcodec.primary_codec(data)
    if codec.is_av1:
        return "heifload"
    if codec.is_hevc and not codec.sequence_only:
        return "hevc"
    what = "image sequences without a still image" if codec.sequence_only else "images"
    raise PermanentJobError(
        f"HEIF {what} coded with {codec.name} are not supported (HEVC and AV1 images are).",
        "UNSUPPORTED_FORMAT",
    )


def _open_hevc(data: bytes, input_path: Path, mime: str, limits: ImageLimits) -> Source:
    """Opens an HEVC HEIF with libheif and checks the primary image's displayed size and the
    image count against the limits; decodes nothing."""
    opened = hevc.open_hevc(data)
    if opened.width * opened.height > limits.max_pixels:
        raise _too_many_pixels("The image has", limits)
    if opened.pages > limits.max_pages:
        raise PermanentJobError(
            f"The image has more than {limits.max_pages} frames or pages.", "INPUT_TOO_MANY_PAGES"
        )
    return Source(
        path=input_path,
        mime=mime,
        loader="heifload",
        pages=opened.pages,
        width=opened.width,
        height=opened.height,
        hevc=opened,
    )


def _open_svg(input_path: Path, limits: ImageLimits) -> Source:
    """Vets the document, then checks its declared size, the headers of its embedded images (all
    together within the pixel limit, as librsvg decodes each in full) and libvips' header."""
    document = svg.vet(input_path.read_bytes())
    if document.declared_size is not None:
        width, height = document.declared_size
        if width * height > limits.max_pixels:
            raise _too_many_pixels("The SVG declares", limits)
    embedded = 0
    for image in document.images:
        loader = _EMBEDDED_LOADER[image.mime]
        header = read_header(loader, image.data)
        check_loader(header, loader)
        embedded += header.width * header.height
    if embedded > limits.max_pixels:
        raise _too_many_pixels("The SVG's embedded images have", limits)
    with svgload_unblocked():
        header = read_header(SVG_LOADER, document.data)
    check_loader(header, SVG_LOADER)
    if header.width * header.height > limits.max_pixels:
        raise _too_many_pixels("The SVG has", limits)
    return Source(
        path=input_path,
        mime="image/svg+xml",
        loader=SVG_LOADER,
        pages=1,
        width=header.width,
        height=header.height,
        document=document.data,
    )


@contextlib.contextmanager
def svgload_unblocked() -> Iterator[None]:
    """Lifts libvips' block on ``svgload_buffer`` (only; not the file or source loaders) for a
    vetted document, and puts it back: the sandbox child is one job, but tests run in one process."""
    pyvips.operation_block_set(_SVG_LOADER_CLASS, False)
    try:
        yield
    finally:
        pyvips.operation_block_set(_SVG_LOADER_CLASS, True)


def check_loader(image: pyvips.Image, expected: str) -> None:
    """``UNSUPPORTED_FORMAT`` unless ``image`` reports ``expected`` as its ``vips-loader``."""
    loader = image.get("vips-loader") if image.get_typeof("vips-loader") else None
    if loader != expected:
        raise PermanentJobError("The input is not a supported image format.", "UNSUPPORTED_FORMAT")
