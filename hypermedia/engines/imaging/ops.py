"""The four image operations, on libvips through pyvips.

Every operation goes through the same pipeline, so every output is treated alike:

1. **Size** of the file against ``ImageLimits.max_input_bytes``.
2. **Format** from the magic bytes (:func:`~hypermedia.engines.imaging.sources.sniff_mime`); only
   the loader chosen for that format reads the file, and the ``vips-loader`` libvips reports must be
   that loader (one of :data:`~hypermedia.engines.imaging.sources.ALLOWED_LOADERS`, or
   :data:`~hypermedia.engines.imaging.sources.SVG_LOADER` for SVG). PDF, ImageMagick, matrix, CSV,
   raw and ``.vips`` files are ``UNSUPPORTED_FORMAT``; libvips' untrusted operations stay blocked.
   An HEIF (``image/heif``, ``image/avif``) goes by the codec of its primary image, read from its
   boxes (:func:`~hypermedia.engines.imaging.sources.heif_decoder`): AV1 to libvips' ``heifload``,
   HEVC (iPhone photos) to libheif with libde265 (:mod:`hypermedia.engines.imaging.hevc`, from
   memory, feeding ``thumbnail_image``), any other codec ``UNSUPPORTED_FORMAT`` naming it; a libvips
   error saying a codec has no decoder is ``UNSUPPORTED_FORMAT`` too
   (:func:`~hypermedia.engines.imaging.sources.missing_decoder`), never ``CORRUPT_INPUT``. A TIFF's
   first-page compression picks its decoder (:mod:`hypermedia.engines.imaging.tiff`): libvips,
   Pillow for the codecs libvips' libtiff lacks (old-style JPEG, LZMA, ZSTD) and for tiles with
   separate planes, else ``UNSUPPORTED_FORMAT`` naming the compression.
3. **SVG** only after :func:`hypermedia.engines.imaging.svg.vet` accepted it (references local to the
   document, no DTD subset, XInclude, script, ``foreignObject``…: ``SVG_EXTERNAL_REFERENCE``,
   ``SVG_FORBIDDEN``). libvips flags ``svgload`` untrusted (``VIPS_OPERATION_UNTRUSTED``, libvips
   ``VipsOperationFlags`` docs), so ``block_untrusted`` blocks it: the block on ``svgload_buffer``
   alone is lifted while a vetted document is loaded and rendered, and restored afterwards. The
   document is loaded from memory, never from its path, so librsvg has no base file and refuses
   every reference that is not a ``data:`` URL (librsvg ``rsvg/src/url_resolver.rs``; loaded by
   path, librsvg includes the file's siblings, measured with ``xi:include``).
4. **Pixels** from the header (``width × height`` of the first frame; for SVG the declared size,
   the embedded images and libvips' header) against ``ImageLimits.max_pixels``, and frames/pages
   (``n-pages``) against ``ImageLimits.max_pages``, before a single pixel is decoded or rendered.
5. ``pyvips.Image.thumbnail`` (shrink-on-load) sizes the image, applies the EXIF orientation and
   converts embedded ICC profiles and CMYK to sRGB; operations that do not resize ask it for a box
   that is never smaller than the image, which leaves pixels untouched. An HEVC HEIF's primary
   image is decoded upright (``irot``/``imir``) by libheif and sized by ``thumbnail_image``.
6. **Animated input** (GIF, WebP, multi-page TIFF/HEIF, animated AVIF): the first frame only, on
   purpose; the output is always a single still image. ``metadata["source_pages"]`` tells when
   frames were dropped. An animated AVIF gives its primary image (the still encoders write as the
   first frame); its frames are counted from its track (:mod:`hypermedia.engines.imaging.sequence`).
   Only the first frame is decoded, so its size is what the pixel limit bounds; the page count
   bounds the header parsing that counts them (100,000 TIFF pages: 1.1 s for the header, 3.4 s
   for a thumbnail, measured).
7. **Save** with ``keep="none"``: EXIF, GPS, XMP, IPTC, ICC and PNG text chunks are not copied to
   the output, in every output format (without a profile, viewers assume sRGB, which the pixels
   are). Alpha is flattened onto white for JPEG. Encoders are called with fixed options, so the
   same input and params give the same bytes.

Truncated or undecodable input fails with ``CORRUPT_INPUT`` (``fail_on="truncated"`` on the header
load and on ``thumbnail``, which reads sequentially): a truncated JPEG or PNG gives no partial
output. libvips decodes lazily, so that error can surface during the save.

Steps 1–4 open and check the source (:func:`hypermedia.engines.imaging.sources.open_source`); this
module sizes and saves (steps 5–7).

This module runs libvips operations: call :func:`run` only in a process that will not fork again
(the sandbox child). Importing it is fork-safe.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

import pyvips

from hypermedia.core.errors import InvalidArgument, PermanentJobError
from hypermedia.engines.contract import OutputFile
from hypermedia.engines.imaging import hevc, tiff
from hypermedia.engines.imaging.params import OPERATIONS
from hypermedia.engines.imaging.sources import (
    ImageLimits,
    Source,
    check_loader,
    open_source,
    read_header,
    reraise_vips_error,
    svgload_unblocked,
)
from hypermedia.engines.params import params_object

__all__ = [
    "OPERATIONS",
    "ImageLimits",
    "OutputFile",
    "run",
    "validate_params",
]


MAX_OUTPUT_PIXELS: Final = 100_000_000
"""Largest output (width × height) a resize may ask for: the default profile pixel limit."""
MAX_DIMENSION: Final = 16384
"""Largest width or height ``resize`` accepts, in pixels."""

MAX_THUMBNAIL_SIZE: Final = 4096
"""Largest thumbnail box side, in pixels."""


# --- formats -------------------------------------------------------------------------------------


# Format written by resize and compress when the caller names none: formats we cannot (GIF, HEIC
# needs an HEVC encoder) or should not (TIFF) write become PNG, which loses nothing.
_SAME_FORMAT: Final = {
    "image/jpeg": "jpeg",
    "image/png": "png",
    "image/webp": "webp",
    "image/avif": "avif",
    "image/gif": "png",
    "image/tiff": "png",
    "image/heif": "png",
    "image/svg+xml": "png",
}

_OUTPUT_FORMATS: Final = ("jpeg", "png", "webp", "avif")
_MIME_BY_FORMAT: Final = {
    "jpeg": "image/jpeg",
    "png": "image/png",
    "webp": "image/webp",
    "avif": "image/avif",
}
_EXTENSION_BY_FORMAT: Final = {"jpeg": "jpg", "png": "png", "webp": "webp", "avif": "avif"}


# --- parameters ----------------------------------------------------------------------------------


def _int_param(params: Mapping[str, Any], key: str, low: int, high: int, default: int | None) -> int | None:
    value = params.get(key)
    if value is None:  # absent or an explicit null: the default
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{key} must be an integer", "INVALID_PARAMS")
    if not low <= value <= high:
        raise InvalidArgument(f"{key} must be between {low} and {high}", "INVALID_PARAMS")
    return value


def _choice_param(
    params: Mapping[str, Any], key: str, choices: tuple[str, ...], default: str | None
) -> str | None:
    value = params.get(key)
    if value is None:  # absent or an explicit null: the default
        return default
    if value not in choices:
        raise InvalidArgument(f"{key} must be one of {', '.join(choices)}", "INVALID_PARAMS")
    return str(value)


_ALLOWED_KEYS: Final = {
    "thumbnail": frozenset({"size"}),
    "resize": frozenset({"width", "height", "fit", "format"}),
    "compress": frozenset({"quality"}),
    "convert": frozenset({"format", "quality"}),
}


def validate_params(operation: str, params: Any) -> dict:
    """Check an operation's params and fill in defaults.

    Args:
        operation: one of :data:`OPERATIONS`.
        params: JSON object from the request; ``None`` means ``{}``.

    Returns:
        A new dict with every accepted key that has a value; optional keys left out stay absent:
        ``thumbnail`` → ``{"size"}`` (1..4096, default 256); ``resize`` → ``{"fit", "width"?,
        "height"?, "format"?}`` (fit ``contain``|``cover``|``fill``, default ``contain``; sides
        1..16384; ``cover`` and ``fill`` need both); ``compress`` → ``{"quality"}`` (1..100, default
        75); ``convert`` → ``{"format", "quality"?}`` (format ``jpeg``|``png``|``webp``|``avif``).

    Raises:
        InvalidArgument: ``UNKNOWN_OPERATION`` for an unknown operation; ``INVALID_PARAMS`` for a
            non-object, unknown keys, wrong types (booleans are not integers) or values out of range.
    """
    params = params_object(operation, params, OPERATIONS, _ALLOWED_KEYS.get(operation, ()))

    result: dict[str, Any] = {}
    if operation == "thumbnail":
        result["size"] = _int_param(params, "size", 1, MAX_THUMBNAIL_SIZE, 256)
    elif operation == "resize":
        width = _int_param(params, "width", 1, MAX_DIMENSION, None)
        height = _int_param(params, "height", 1, MAX_DIMENSION, None)
        fit = _choice_param(params, "fit", ("contain", "cover", "fill"), "contain")
        output_format = _choice_param(params, "format", _OUTPUT_FORMATS, None)
        if width is None and height is None:
            raise InvalidArgument("resize needs width, height or both", "INVALID_PARAMS")
        if fit != "contain" and (width is None or height is None):
            raise InvalidArgument(f"fit={fit} needs both width and height", "INVALID_PARAMS")
        if (
            fit != "contain"
            and width is not None
            and height is not None
            and width * height > MAX_OUTPUT_PIXELS
        ):
            # cover/fill produce exactly width × height: refuse at creation what could only fail
            # (or time out) in the worker.
            raise InvalidArgument(
                f"width × height may be at most {MAX_OUTPUT_PIXELS} pixels", "INVALID_PARAMS"
            )
        result["fit"] = fit
        for key, value in (("width", width), ("height", height), ("format", output_format)):
            if value is not None:
                result[key] = value
    elif operation == "compress":
        result["quality"] = _int_param(params, "quality", 1, 100, 75)
    else:
        output_format = _choice_param(params, "format", _OUTPUT_FORMATS, None)
        if output_format is None:
            raise InvalidArgument("convert needs format", "INVALID_PARAMS")
        result["format"] = output_format
        quality = _int_param(params, "quality", 1, 100, None)
        if quality is not None:
            result["quality"] = quality
    return result


# --- pipeline ------------------------------------------------------------------------------------

# Side of the box asked of thumbnail() with size="down" when the image must keep its size.
_NO_RESIZE_BOX: Final = 10_000_000
_WHITE: Final = [255.0, 255.0, 255.0]
_FRAME_FIELDS: Final = ("page-height", "n-pages", "delay", "loop", "gif-delay", "gif-loop")


_SHRINKING_LOADERS: Final = frozenset({"jpegload"})
"""Loaders :func:`_thumbnail_with_loader` can run itself, shrinking on load by their ``shrink``."""


def _sniffed_loader(path: Path) -> str:
    """The loader libvips' own sniffing picks for ``path`` (what ``thumbnail()`` would run), as
    ``vips-loader`` names it: ``uhdrload`` for an Ultra HDR JPEG (a JPEG with a gain map, which
    recent Android and Pixel cameras write), ``jpegload`` for a plain one; ``load`` when it picks
    none (an animated AVIF: libvips' HEIF sniffing knows the ``avif`` major brand, not ``avis``)."""
    name = pyvips.vips_lib.vips_foreign_find_load(str(path).encode())
    if name == pyvips.ffi.NULL:
        pyvips.vips_lib.vips_error_clear()  # "not a known file format": not this job's error
    nickname = pyvips.ffi.string(name).decode() if name != pyvips.ffi.NULL else ""
    # "VipsForeignLoadJpegFile" → "jpegload"
    return nickname.removeprefix("VipsForeignLoad").removesuffix("File").lower() + "load"


def _thumbnail_with_loader(source: Source, width: int, options: dict[str, Any]) -> pyvips.Image:
    """``thumbnail()`` of a file libvips' sniffing opens with another loader than the checked one,
    or with none, read by the checked loader:

    * an Ultra HDR JPEG (``uhdrload``, libultrahdr, not allowed): ``jpegload`` reads the base
      image only (the gain map is not read), shrinking on load by the largest power of two that
      keeps both sides at least the box's (either orientation), as ``thumbnail()`` does;
    * an animated AVIF (major brand ``avis``, which libvips' sniffing does not know: ``thumbnail()``
      failed "not a known file format"): ``heifload`` reads its primary image, the still that
      encoders write as the first frame (libavif, FFmpeg), not the frames of its track.
    """
    shrink: dict[str, int] = {}
    if source.loader in _SHRINKING_LOADERS:
        header = read_header(source.loader, str(source.path))
        box = max(width, options["height"])
        fit = min(header.width, header.height) / box if box else 1
        shrink["shrink"] = next((f for f in (8, 4, 2) if f <= fit), 1)
    image = pyvips.Operation.call(
        source.loader, str(source.path), access="sequential", fail_on="truncated", **shrink
    )
    return pyvips.Image.thumbnail_image(image, width, **_without_fail_on(options))


def _without_fail_on(options: dict[str, Any]) -> dict[str, Any]:
    """``thumbnail()`` options for ``thumbnail_image()``, which takes no ``fail_on`` (the loader did)."""
    return {k: v for k, v in options.items() if k != "fail_on"}


def _thumbnail_of_pillow_tiff(
    path: Path, size: tuple[int, int], width: int, options: dict[str, Any]
) -> pyvips.Image:
    """``thumbnail()`` of a TIFF whose first page Pillow decodes (:mod:`hypermedia.engines.imaging.tiff`;
    ``size`` is that page's in libvips' header): the decoded page in memory (upright: Pillow
    applies the orientation tag), sized and converted from its ICC profile (or CMYK) to sRGB by
    ``thumbnail_image``, as ``thumbnail()`` would."""
    decoded = tiff.decode_page(path, *size)
    return pyvips.Image.thumbnail_image(decoded, width, **_without_fail_on(options))


def _sized(source: Source, width: int, height: int, *, size: str, crop: str = "none") -> pyvips.Image:
    """Opens the first frame through thumbnail(): shrink-on-load (SVG: rendered at the target
    scale), EXIF orientation applied, embedded ICC profile or CMYK converted to sRGB, 8-bit sRGB
    out (alpha kept). A :attr:`~Source.plain_srgb` source is sRGB already: no colour transform."""
    options: dict[str, Any] = {"height": height, "size": size, "crop": crop, "fail_on": "truncated"}
    if not source.plain_srgb:
        options["output_profile"] = "srgb"
    if source.hevc is not None:
        return _plain(_thumbnail_hevc(source.hevc, width, options))
    if source.document is not None:
        image = pyvips.Image.thumbnail_buffer(source.document, width, **options)
    elif source.pillow_size is not None:
        image = _thumbnail_of_pillow_tiff(source.path, source.pillow_size, width, options)
    elif _sniffed_loader(source.path) != source.loader:
        image = _thumbnail_with_loader(source, width, options)
    else:
        image = pyvips.Image.thumbnail(str(source.path), width, **options)
    if source.pillow_size is None:  # Pillow's decode comes from memory, with no loader to check
        check_loader(image, source.loader)
    return _plain(image)


def _plain(image: pyvips.Image) -> pyvips.Image:
    """sRGB, without the frame fields of an animation."""
    if image.interpretation != "srgb":
        image = image.colourspace("srgb")
    image = image.copy()
    for field in _FRAME_FIELDS:
        if image.get_typeof(field):
            image.remove(field)
    return image


def _thumbnail_hevc(opened: hevc.HevcFile, width: int, options: dict[str, Any]) -> pyvips.Image:
    """``thumbnail()`` of the primary image of an HEVC HEIF: libheif decodes it (upright, at full
    size: HEVC has no shrink-on-load), ``thumbnail_image`` sizes it and converts its ICC profile
    to sRGB."""
    image = hevc.decode(opened)
    return pyvips.Image.thumbnail_image(image, width, **{k: v for k, v in options.items() if k != "fail_on"})


def _save(image: pyvips.Image, output_format: str, path: Path, quality: int | None, *, png_max: bool) -> None:
    """Writes with fixed encoder options and no metadata. ``quality`` None = the encoder's default."""
    q = {} if quality is None else {"Q": quality}
    if output_format == "jpeg":
        if image.hasalpha():
            image = image.flatten(background=_WHITE)
        image.jpegsave(str(path), optimize_coding=True, keep="none", **q)
    elif output_format == "webp":
        image.webpsave(str(path), keep="none", **q)
    elif output_format == "avif":
        # effort 0 (aom speed 9): measured 0.2 s against 5.7 s for the default effort 4 on a
        # 1800×1200 photo, for a file 1 % larger.
        image.heifsave(str(path), compression="av1", effort=0, keep="none", **q)
    elif png_max:
        # compress: palette quantisation (lossy, libimagequant) unless quality is 100.
        if quality is not None and quality < 100:
            image.pngsave(str(path), compression=9, palette=True, Q=quality, keep="none")
        else:
            image.pngsave(str(path), compression=9, keep="none")
    else:
        image.pngsave(str(path), keep="none")


_OUTPUT_TYPE: Final = {
    "thumbnail": "thumbnail",
    "resize": "resized",
    "compress": "compressed",
    "convert": "converted",
}


def run(
    operation: str, params: dict, input_path: Path, out_dir: Path, limits: ImageLimits
) -> list[OutputFile]:
    """Runs one operation on one image file and writes one output file into ``out_dir``.

    Runs libvips: call it in the sandbox child, never in a process that forks afterwards.

    Args:
        operation: one of :data:`OPERATIONS`.
        params: as accepted by :func:`validate_params` (validated again here).
        input_path: the uploaded file.
        out_dir: existing directory; the output is written as ``{output_type}.{ext}``.
        limits: checked before decoding.

    Returns:
        One :class:`OutputFile`; ``metadata`` holds ``width``, ``height`` (pixels), ``format``
        (``jpeg``|``png``|``webp``|``avif``), ``size_bytes``, ``source_format`` (``jpeg``, ``png``,
        ``webp``, ``gif``, ``tiff``, ``avif``, ``heif`` or ``svg``), ``source_pages`` (frames in
        the input; only the first is used), ``source_width`` and ``source_height`` (the input's
        size in pixels, before its EXIF orientation, after an HEIF's ``irot``: the pixels the job
        decodes; kept as the object's facts, :mod:`hypermedia.jobs.facts`). Thumbnails are WebP and never enlarged; SVG input keeps
        the format ``png`` where the operation keeps the input's format.

    Raises:
        InvalidArgument: ``UNKNOWN_OPERATION`` or ``INVALID_PARAMS``.
        PermanentJobError: ``INPUT_TOO_LARGE``, ``UNSUPPORTED_FORMAT``, ``INPUT_TOO_LARGE_PIXELS``,
            ``INPUT_TOO_MANY_PAGES``, ``CORRUPT_INPUT``, ``SVG_EXTERNAL_REFERENCE``,
            ``SVG_FORBIDDEN`` (see :mod:`hypermedia.engines.imaging.svg`); ``INVALID_PARAMS`` when the
            requested output would exceed ``limits.max_pixels``.
        MemoryError, OSError(EFBIG): libvips hit the sandbox's memory or file size limit.
    """
    params = validate_params(operation, params)
    source = open_source(input_path, limits)
    build: Callable[[Source, dict], tuple[pyvips.Image, str, int | None, bool]] = _BUILDERS[operation]
    # SVG renders lazily, during the save: the loader stays unblocked until the file is written.
    loading = svgload_unblocked() if source.document is not None else contextlib.nullcontext()
    try:
        with loading:
            image, output_format, quality, png_max = build(source, params)
            if image.width * image.height > limits.max_pixels:
                raise PermanentJobError(
                    f"The requested output has more than {limits.max_pixels} pixels.", "INVALID_PARAMS"
                )
            filename = f"{_OUTPUT_TYPE[operation]}.{_EXTENSION_BY_FORMAT[output_format]}"
            _save(image, output_format, out_dir / filename, quality, png_max=png_max)
    except pyvips.Error as exc:
        reraise_vips_error(exc)
        raise  # unreachable
    return [
        OutputFile(
            output_type=_OUTPUT_TYPE[operation],
            filename=filename,
            mime_type=_MIME_BY_FORMAT[output_format],
            metadata={
                "width": image.width,
                "height": image.height,
                "format": output_format,
                "size_bytes": os.stat(out_dir / filename).st_size,
                "source_format": source.mime.removeprefix("image/").removesuffix("+xml"),
                "source_pages": source.pages,
                "source_width": source.width,
                "source_height": source.height,
            },
        )
    ]


def _thumbnail(source: Source, params: dict) -> tuple[pyvips.Image, str, int | None, bool]:
    size = params["size"]
    return _sized(source, size, size, size="down"), "webp", None, False


def _resize(source: Source, params: dict) -> tuple[pyvips.Image, str, int | None, bool]:
    width, height, fit = params.get("width"), params.get("height"), params["fit"]
    output_format = params.get("format") or _SAME_FORMAT[source.mime]
    if fit == "contain":
        # One side given: the other is unbounded.
        image = _sized(source, width or _NO_RESIZE_BOX, height or _NO_RESIZE_BOX, size="both")
    elif fit == "cover":
        image = _sized(source, params["width"], params["height"], size="both", crop="centre")
    else:
        image = _sized(source, params["width"], params["height"], size="force")
    return image, output_format, None, False


def _compress(source: Source, params: dict) -> tuple[pyvips.Image, str, int | None, bool]:
    image = _sized(source, _NO_RESIZE_BOX, _NO_RESIZE_BOX, size="down")
    return image, _SAME_FORMAT[source.mime], params["quality"], True


def _convert(source: Source, params: dict) -> tuple[pyvips.Image, str, int | None, bool]:
    image = _sized(source, _NO_RESIZE_BOX, _NO_RESIZE_BOX, size="down")
    return image, params["format"], params.get("quality"), False


_BUILDERS: Final = {
    "thumbnail": _thumbnail,
    "resize": _resize,
    "compress": _compress,
    "convert": _convert,
}
