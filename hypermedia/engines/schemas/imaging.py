"""Params schemas of the image operations, as
:func:`hypermedia.engines.imaging.ops.validate_params` checks them.

That module imports pyvips (libvips), which this one must not: its limits are copied here, and
``tests/unit/test_params_schemas.py`` asserts each copy equals the validator's constant."""

from __future__ import annotations

from typing import Any, Final

from hypermedia.engines.schemas.common import INTEGERS, choice, given, integer, operation

MAX_THUMBNAIL_SIZE: Final = 4096
"""``hypermedia.engines.imaging.ops.MAX_THUMBNAIL_SIZE``."""
MAX_DIMENSION: Final = 16384
"""``hypermedia.engines.imaging.ops.MAX_DIMENSION``."""
MAX_OUTPUT_PIXELS: Final = 100_000_000
"""``hypermedia.engines.imaging.ops.MAX_OUTPUT_PIXELS``."""
OUTPUT_FORMATS: Final = ("jpeg", "png", "webp", "avif")
"""``hypermedia.engines.imaging.ops._OUTPUT_FORMATS``."""
FITS: Final = ("contain", "cover", "fill")
"""The ``resize`` fit modes; the first is the default."""

_SOURCE_FORMAT = "JPEG, PNG, WebP and AVIF keep their format; GIF, TIFF, HEIF and SVG become PNG"
_OUTPUT = "Output is 8-bit sRGB, upright (EXIF orientation applied), without metadata; only an animation's first frame is used."


def _thumbnail() -> dict[str, Any]:
    return operation(
        "thumbnail",
        f"A WebP thumbnail that fits a size × size box: aspect ratio kept, never enlarged. {_OUTPUT}",
        {"size": integer("Side of the square box, in pixels.", 1, MAX_THUMBNAIL_SIZE, 256)},
        also_checked=[INTEGERS],
    )


def _resize() -> dict[str, Any]:
    side = "Output {}, in pixels. With fit contain it may be left out (that side is then unbounded)."
    return operation(
        "resize",
        "The image resized to width × height. Give width, height or both; fit cover and fill need "
        f"both. Written in format, or else in the source's format ({_SOURCE_FORMAT}). {_OUTPUT}",
        {
            "width": integer(side.format("width"), 1, MAX_DIMENSION),
            "height": integer(side.format("height"), 1, MAX_DIMENSION),
            "fit": choice(
                "contain: fit inside the box, aspect ratio kept, may enlarge; cover: fill the box, "
                "aspect ratio kept, the centre cropped; fill: exactly width × height, aspect ratio changed.",
                FITS,
                FITS[0],
            ),
            "format": choice(f"Output format; when absent, the source's ({_SOURCE_FORMAT}).", OUTPUT_FORMATS),
        },
        also_checked=[
            f"with fit cover or fill, width × height is at most {MAX_OUTPUT_PIXELS:,} pixels",
            INTEGERS,
        ],
        rules={
            "anyOf": [given("width"), given("height")],
            "if": {"required": ["fit"], "properties": {"fit": {"enum": list(FITS[1:])}}},
            "then": given("width", "height"),
        },
    )


def _compress() -> dict[str, Any]:
    return operation(
        "compress",
        f"The image re-encoded in the source's format ({_SOURCE_FORMAT}) at quality. {_OUTPUT}",
        {
            "quality": integer(
                "Encoder quality, 1 (smallest) to 100 (best). For PNG output, below 100 quantises "
                "to a palette (lossy); 100 is lossless, maximum compression.",
                1,
                100,
                75,
            )
        },
        also_checked=[INTEGERS],
    )


def _convert() -> dict[str, Any]:
    return operation(
        "convert",
        f"The image written in format (required). {_OUTPUT}",
        {
            "format": choice("Output format.", OUTPUT_FORMATS, required=True),
            "quality": integer(
                "Encoder quality, 1 (smallest) to 100 (best); when absent, the encoder's default. "
                "Ignored for PNG.",
                1,
                100,
            ),
        },
        also_checked=[INTEGERS],
        rules={"required": ["format"]},
    )


SCHEMAS: Final[dict[str, dict[str, Any]]] = {
    "thumbnail": _thumbnail(),
    "resize": _resize(),
    "compress": _compress(),
    "convert": _convert(),
}
"""Operation name → JSON Schema of its params."""
