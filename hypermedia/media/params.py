"""Params of the media operations (issue 7): checked when a job is created (the gateway) and again
in the worker (:func:`hypermedia.media.probe.run`, :func:`hypermedia.media.waveform.run`,
:func:`hypermedia.media.poster.run`). Pure Python: the gateway imports this module, never PyAV.

| operation | params |
|---|---|
| ``probe`` | none: ``{}`` or ``null``; any key is ``INVALID_PARAMS`` |
| ``poster`` | ``width`` (integer 16–3840, default 640: the poster's width in pixels; the height follows the display aspect ratio; never wider than the source's display width); ``format``: ``"jpeg"`` (default), ``"webp"`` or ``"png"``; ``quality`` (integer 1–100, default 82; used by JPEG and WebP) |
| ``waveform`` | ``buckets_per_second`` (integer 1–1000, default 100) **or** ``buckets`` (the total, integer 16–100 000), not both; ``channels``: ``"all"`` (default: peaks per channel) or ``"mix"`` (one channel, the mean of all); ``image``: ``false`` for no PNG, or an object of ``width`` (64–8192 px, default 1800), ``height`` (32–2048 px, default 280), ``color`` (``"#RRGGBB"``, default ``"#3B82F6"``), ``background`` (``"#RRGGBB"`` or ``"transparent"``, the default); ``true`` or absent is the defaults |

Normalised ``waveform`` params: ``{"buckets_per_second": int | None, "buckets": int | None,
"channels": "all" | "mix", "image": {"width", "height", "color", "background"} | None}`` with
exactly one of the first two set and colours upper-case. Normalised ``poster`` params:
``{"width": int, "format": "jpeg" | "webp" | "png", "quality": int}``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

from hypermedia.errors import InvalidArgument
from hypermedia.jobparams import params_object

__all__ = [
    "BUCKETS_PER_SECOND_RANGE",
    "BUCKETS_RANGE",
    "DEFAULT_BUCKETS_PER_SECOND",
    "DEFAULT_IMAGE",
    "IMAGE_HEIGHT_RANGE",
    "IMAGE_WIDTH_RANGE",
    "OPERATIONS",
    "POSTER_DEFAULT_QUALITY",
    "POSTER_DEFAULT_WIDTH",
    "POSTER_FORMATS",
    "POSTER_QUALITY_RANGE",
    "POSTER_WIDTH_RANGE",
    "WAVEFORM_CHANNELS",
    "validate_params",
]

OPERATIONS: Final = ("probe", "waveform", "poster")
"""The media operations this package implements so far (``transcode_video`` and
``transcode_audio`` are to come)."""

DEFAULT_BUCKETS_PER_SECOND: Final = 100
BUCKETS_PER_SECOND_RANGE: Final = (1, 1000)
BUCKETS_RANGE: Final = (16, 100_000)
WAVEFORM_CHANNELS: Final = ("all", "mix")
IMAGE_WIDTH_RANGE: Final = (64, 8192)
IMAGE_HEIGHT_RANGE: Final = (32, 2048)
DEFAULT_IMAGE: Final[Mapping[str, Any]] = {
    "width": 1800,
    "height": 280,
    "color": "#3B82F6",
    "background": "transparent",
}

POSTER_WIDTH_RANGE: Final = (16, 3840)
POSTER_DEFAULT_WIDTH: Final = 640
POSTER_FORMATS: Final = ("jpeg", "webp", "png")
POSTER_QUALITY_RANGE: Final = (1, 100)
POSTER_DEFAULT_QUALITY: Final = 82

_ALLOWED_KEYS: Final[dict[str, frozenset[str]]] = {
    "probe": frozenset(),
    "poster": frozenset({"width", "format", "quality"}),
    "waveform": frozenset({"buckets_per_second", "buckets", "channels", "image"}),
}
_IMAGE_KEYS: Final = frozenset(DEFAULT_IMAGE)
_COLOR: Final = re.compile(r"#[0-9A-Fa-f]{6}")


def _invalid(message: str) -> InvalidArgument:
    return InvalidArgument(message, "INVALID_PARAMS")


def validate_params(operation: str, params: Any) -> dict[str, Any]:
    """The params of one media operation, normalised.

    Args:
        operation: one of :data:`OPERATIONS`.
        params: the request's params: a mapping, or ``None`` for none.

    Returns:
        ``{}`` for ``probe``; for ``waveform`` and ``poster`` the normalised params of the
        module doc.

    Raises:
        InvalidArgument: ``UNKNOWN_OPERATION`` for an operation not in :data:`OPERATIONS`;
            ``INVALID_PARAMS`` for params that are not an object, that have unknown keys, or
            (``waveform``, ``poster``) values out of their type or range, or both
            ``buckets_per_second`` and ``buckets``.
    """
    checked = params_object(operation, params, OPERATIONS, _ALLOWED_KEYS.get(operation, ()))
    if operation == "waveform":
        return _waveform(checked)
    if operation == "poster":
        return _poster(checked)
    return {}


def _poster(params: Mapping[str, Any]) -> dict[str, Any]:
    width = params.get("width")
    width = POSTER_DEFAULT_WIDTH if width is None else _integer("width", width, POSTER_WIDTH_RANGE)
    image_format = params.get("format")
    if image_format is None:
        image_format = POSTER_FORMATS[0]
    if image_format not in POSTER_FORMATS:
        raise _invalid('format must be "jpeg", "webp" or "png"')
    quality = params.get("quality")
    quality = (
        POSTER_DEFAULT_QUALITY if quality is None else _integer("quality", quality, POSTER_QUALITY_RANGE)
    )
    return {"width": width, "format": image_format, "quality": quality}


def _waveform(params: Mapping[str, Any]) -> dict[str, Any]:
    per_second = params.get("buckets_per_second")
    total = params.get("buckets")
    if per_second is not None and total is not None:
        raise _invalid("give buckets_per_second or buckets, not both")
    if total is not None:
        total = _integer("buckets", total, BUCKETS_RANGE)
    else:
        per_second = (
            DEFAULT_BUCKETS_PER_SECOND
            if per_second is None
            else _integer("buckets_per_second", per_second, BUCKETS_PER_SECOND_RANGE)
        )
    channels = params.get("channels", "all")
    if channels is None:
        channels = "all"
    if channels not in WAVEFORM_CHANNELS:
        raise _invalid('channels must be "all" or "mix"')
    return {
        "buckets_per_second": per_second,
        "buckets": total,
        "channels": channels,
        "image": _image(params.get("image")),
    }


def _image(value: Any) -> dict[str, Any] | None:
    if value is False:
        return None
    if value is None or value is True:
        return dict(DEFAULT_IMAGE)
    if not isinstance(value, Mapping):
        raise _invalid("image must be an object or false")
    unknown = sorted(str(key) for key in value if key not in _IMAGE_KEYS)
    if unknown:
        raise _invalid(f"unknown image params: {', '.join(unknown)}")
    image = dict(DEFAULT_IMAGE)
    for key, bounds in (("width", IMAGE_WIDTH_RANGE), ("height", IMAGE_HEIGHT_RANGE)):
        if value.get(key) is not None:
            image[key] = _integer(f"image.{key}", value[key], bounds)
    color = value.get("color")
    if color is not None:
        if not isinstance(color, str) or _COLOR.fullmatch(color) is None:
            raise _invalid('image.color must be a colour "#RRGGBB"')
        image["color"] = color.upper()
    background = value.get("background")
    if background is not None:
        if background == "transparent":
            image["background"] = background
        elif isinstance(background, str) and _COLOR.fullmatch(background) is not None:
            image["background"] = background.upper()
        else:
            raise _invalid('image.background must be a colour "#RRGGBB" or "transparent"')
    return image


def _integer(name: str, value: Any, bounds: tuple[int, int]) -> int:
    low, high = bounds
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise _invalid(f"{name} must be an integer from {low} to {high}")
    return value
