"""Params of the media operations (issue 7): checked when a job is created (the gateway) and again
in the worker (:func:`hypermedia.engines.media.probe.run`, :func:`hypermedia.engines.media.waveform.run`,
:func:`hypermedia.engines.media.poster.run`, :func:`hypermedia.engines.media.transcode.run`,
:func:`hypermedia.engines.media.audio.run`). Pure Python: the gateway imports this module, never PyAV.

| operation | params |
|---|---|
| ``probe`` | none: ``{}`` or ``null``; any key is ``INVALID_PARAMS`` |
| ``poster`` | ``width`` (integer 16–3840, default 640: the poster's width in pixels; the height follows the display aspect ratio; never wider than the source's display width); ``format``: ``"jpeg"`` (default), ``"webp"`` or ``"png"``; ``quality`` (integer 1–100, default 82; used by JPEG and WebP); ``sprite``: ``false`` (default), ``true`` or an object of ``count`` (thumbnails, 4–400, default 60), ``columns`` (1–20, default 10) and ``width`` (one thumbnail's width, 32–480 px, default 160): a JPEG sprite sheet of thumbnails at even intervals plus a WebVTT index (``#xywh=`` cues) for scrubbing previews; for video only |
| ``transcode_video`` | ``codec``: ``"h264"`` (default: H.264 + AAC in MP4, fast start), ``"vp9"`` (VP9 + Opus in WebM) or ``"av1"`` (AV1 + AAC in MP4); ``heights``: the rendition ladder, distinct integers 144–2160 (the *short* side of the upright picture: 720 is 1280 × 720 landscape and 720 × 1280 portrait), at most 6, default ``[1080, 720, 480, 360]``: rungs above the source are skipped, and when none fits one rendition at the source's size is made; ``quality``: the encoder's constant-quality number (CRF; h264 0–51, default 23; vp9 0–63, default 32; av1 1–63, default 35); ``preset``: x264's preset, h264 only (``"ultrafast"`` … ``"veryslow"``, default ``"veryfast"``); ``audio_bitrate``: kbit/s 32–320, default 128; ``hls``: ``true`` to package every rendition as HLS (h264 only; fMP4 segments, a media playlist per rendition and a master playlist), default ``false``; ``hls_segment_seconds``: 2–10, default 6 |
| ``transcode_audio`` | ``format``: ``"aac"`` (default: AAC-LC in an M4A), ``"mp3"`` or ``"opus"`` (Ogg Opus); ``bitrate``: kbit/s 32–320, default 128; ``channels``: 1 or 2, default 2; ``loudness``: ``false`` (default: levels kept), ``true`` (EBU R128: −23 LUFS integrated, true peak at most −1 dBTP) or an object of ``target_lufs`` (−36 to −10, default −23) and ``true_peak_db`` (−9 to 0, default −1) |
| ``waveform`` | ``buckets_per_second`` (integer 1–1000, default 100) **or** ``buckets`` (the total, integer 16–100 000), not both; ``channels``: ``"all"`` (default: peaks per channel) or ``"mix"`` (one channel, the mean of all); ``image``: ``false`` for no PNG, or an object of ``width`` (64–8192 px, default 1800), ``height`` (32–2048 px, default 280), ``color`` (``"#RRGGBB"``, default ``"#3B82F6"``), ``background`` (``"#RRGGBB"`` or ``"transparent"``, the default); ``true`` or absent is the defaults |

Normalised ``waveform`` params: ``{"buckets_per_second": int | None, "buckets": int | None,
"channels": "all" | "mix", "image": {"width", "height", "color", "background"} | false}`` with
exactly one of the first two set and colours upper-case. Normalised ``poster`` params:
``{"width": int, "format": "jpeg" | "webp" | "png", "quality": int, "sprite": {"count", "columns",
"width"} | None}``. Normalised ``transcode_video`` params: ``{"codec", "heights" (sorted high to
low), "quality", "preset" (None unless h264), "audio_bitrate", "hls", "hls_segment_seconds" (None
unless hls)}``. Normalised params validate again to themselves (the worker checks them again).
Normalised ``transcode_audio`` params: ``{"format", "bitrate", "channels", "loudness":
{"target_lufs": float, "true_peak_db": float} | None}``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

from hypermedia.core.errors import InvalidArgument
from hypermedia.engines.params import params_object

__all__ = [
    "AUDIO_FORMATS",
    "BUCKETS_PER_SECOND_RANGE",
    "BUCKETS_RANGE",
    "DEFAULT_BUCKETS_PER_SECOND",
    "DEFAULT_IMAGE",
    "IMAGE_HEIGHT_RANGE",
    "IMAGE_WIDTH_RANGE",
    "LOUDNESS_DEFAULTS",
    "OPERATIONS",
    "POSTER_DEFAULT_QUALITY",
    "POSTER_DEFAULT_WIDTH",
    "POSTER_FORMATS",
    "POSTER_QUALITY_RANGE",
    "POSTER_WIDTH_RANGE",
    "SPRITE_DEFAULTS",
    "VIDEO_CODECS",
    "VIDEO_DEFAULT_HEIGHTS",
    "WAVEFORM_CHANNELS",
    "X264_PRESETS",
    "validate_params",
]

OPERATIONS: Final = ("probe", "waveform", "poster", "transcode_video", "transcode_audio")
"""The media operations."""

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

SPRITE_DEFAULTS: Final[Mapping[str, int]] = {"count": 60, "columns": 10, "width": 160}
SPRITE_RANGES: Final[Mapping[str, tuple[int, int]]] = {
    "count": (4, 400),
    "columns": (1, 20),
    "width": (32, 480),
}

VIDEO_CODECS: Final = ("h264", "vp9", "av1")
VIDEO_DEFAULT_HEIGHTS: Final = (1080, 720, 480, 360)
VIDEO_HEIGHT_RANGE: Final = (144, 2160)
VIDEO_MAX_RENDITIONS: Final = 6
VIDEO_QUALITY: Final[Mapping[str, tuple[int, int, int]]] = {
    "h264": (0, 51, 23),
    "vp9": (0, 63, 32),
    "av1": (1, 63, 35),
}
"""Per codec: the CRF range and default (x264's 23, libvpx-vp9's commonly advised 31–33 for
1080p, SVT-AV1's 35 default)."""
X264_PRESETS: Final = (
    "ultrafast",
    "superfast",
    "veryfast",
    "faster",
    "fast",
    "medium",
    "slow",
    "slower",
    "veryslow",
)
X264_DEFAULT_PRESET: Final = "veryfast"
AUDIO_BITRATE_RANGE: Final = (32, 320)
DEFAULT_AUDIO_BITRATE: Final = 128
HLS_SEGMENT_RANGE: Final = (2, 10)
DEFAULT_HLS_SEGMENT_SECONDS: Final = 6

AUDIO_FORMATS: Final = ("aac", "mp3", "opus")
LOUDNESS_DEFAULTS: Final[Mapping[str, float]] = {"target_lufs": -23.0, "true_peak_db": -1.0}
"""EBU R128: programme loudness −23 LUFS, maximum true peak −1 dBTP (EBU R 128, 2020; the true
peak limit as EBU Tech 3343 advises for delivery)."""
LOUDNESS_RANGES: Final[Mapping[str, tuple[float, float]]] = {
    "target_lufs": (-36.0, -10.0),
    "true_peak_db": (-9.0, 0.0),
}

_ALLOWED_KEYS: Final[dict[str, frozenset[str]]] = {
    "probe": frozenset(),
    "poster": frozenset({"width", "format", "quality", "sprite"}),
    "transcode_video": frozenset(
        {"codec", "heights", "quality", "preset", "audio_bitrate", "hls", "hls_segment_seconds"}
    ),
    "transcode_audio": frozenset({"format", "bitrate", "channels", "loudness"}),
    "waveform": frozenset({"buckets_per_second", "buckets", "channels", "image"}),
}
_COLOR: Final = re.compile(r"#[0-9A-Fa-f]{6}")


def _invalid(message: str) -> InvalidArgument:
    return InvalidArgument(message, "INVALID_PARAMS")


def validate_params(operation: str, params: Any) -> dict[str, Any]:
    """The params of one media operation, normalised.

    Args:
        operation: one of :data:`OPERATIONS`.
        params: the request's params: a mapping, or ``None`` for none.

    Returns:
        ``{}`` for ``probe``; for the other operations the normalised params of the module doc.

    Raises:
        InvalidArgument: ``UNKNOWN_OPERATION`` for an operation not in :data:`OPERATIONS`;
            ``INVALID_PARAMS`` for params that are not an object, that have unknown keys, or
            values out of their type or range; both ``buckets_per_second`` and ``buckets``;
            ``preset`` or ``hls`` with a codec other than h264; ``hls_segment_seconds`` without
            ``hls``; repeated ``heights``.
    """
    checked = params_object(operation, params, OPERATIONS, _ALLOWED_KEYS.get(operation, ()))
    if operation == "waveform":
        return _waveform(checked)
    if operation == "poster":
        return _poster(checked)
    if operation == "transcode_video":
        return _transcode_video(checked)
    if operation == "transcode_audio":
        return _transcode_audio(checked)
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
    return {
        "width": width,
        "format": image_format,
        "quality": quality,
        "sprite": _sprite(params.get("sprite")),
    }


def _group(
    name: str, value: Any, defaults: Mapping[str, Any], *, absent: bool = False
) -> dict[str, Any] | None:
    """An optional group of settings (``sprite``, ``loudness``, ``image``): ``false`` is none,
    ``true`` the defaults, an object the defaults updated by its keys (checked by the caller);
    ``absent`` (``None``) is none or, with ``absent=True``, the defaults.

    Raises:
        InvalidArgument: ``INVALID_PARAMS`` for another type or an unknown key (all named).
    """
    if value is False or (value is None and not absent):
        return None
    if value is True or value is None:
        return dict(defaults)
    if not isinstance(value, Mapping):
        raise _invalid(f"{name} must be an object, true or false")
    unknown = sorted(str(key) for key in value if key not in defaults)
    if unknown:
        raise _invalid(f"unknown {name} params: {', '.join(unknown)}")
    return dict(defaults)


def _sprite(value: Any) -> dict[str, Any] | None:
    sprite = _group("sprite", value, SPRITE_DEFAULTS)
    if sprite is not None and isinstance(value, Mapping):
        for key, bounds in SPRITE_RANGES.items():
            if value.get(key) is not None:
                sprite[key] = _integer(f"sprite.{key}", value[key], bounds)
    return sprite


def _choice(name: str, value: Any, choices: tuple[str, ...], default: str) -> str:
    if value is None:
        return default
    if value not in choices:
        raise _invalid(f"{name} must be one of {', '.join(repr(c) for c in choices)}")
    return str(value)


def _flag(name: str, value: Any) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        raise _invalid(f"{name} must be true or false")
    return value


def _transcode_video(params: Mapping[str, Any]) -> dict[str, Any]:
    codec = _choice("codec", params.get("codec"), VIDEO_CODECS, VIDEO_CODECS[0])
    heights_value = params.get("heights")
    if heights_value is None:
        heights = list(VIDEO_DEFAULT_HEIGHTS)
    else:
        if not isinstance(heights_value, list) or not 1 <= len(heights_value) <= VIDEO_MAX_RENDITIONS:
            raise _invalid(f"heights must be a list of 1 to {VIDEO_MAX_RENDITIONS} integers")
        heights = [_integer("heights[]", h, VIDEO_HEIGHT_RANGE) for h in heights_value]
        if len(set(heights)) != len(heights):
            raise _invalid("heights must not repeat a height")
        heights.sort(reverse=True)
    low, high, default_quality = VIDEO_QUALITY[codec]
    quality = params.get("quality")
    quality = default_quality if quality is None else _integer("quality", quality, (low, high))
    preset = params.get("preset")
    if codec == "h264":
        preset = _choice("preset", preset, X264_PRESETS, X264_DEFAULT_PRESET)
    elif preset is not None:
        raise _invalid("preset is for codec h264 only")
    audio_bitrate = params.get("audio_bitrate")
    audio_bitrate = (
        DEFAULT_AUDIO_BITRATE
        if audio_bitrate is None
        else _integer("audio_bitrate", audio_bitrate, AUDIO_BITRATE_RANGE)
    )
    hls = _flag("hls", params.get("hls"))
    if hls and codec != "h264":
        raise _invalid("hls is for codec h264 only")
    segment = params.get("hls_segment_seconds")
    if segment is not None and not hls:
        raise _invalid("hls_segment_seconds is for hls: true only")
    if hls:  # normalised to null without hls, so that normalised params pass this check again
        segment = (
            DEFAULT_HLS_SEGMENT_SECONDS
            if segment is None
            else _integer("hls_segment_seconds", segment, HLS_SEGMENT_RANGE)
        )
    return {
        "codec": codec,
        "heights": heights,
        "quality": quality,
        "preset": preset,
        "audio_bitrate": audio_bitrate,
        "hls": hls,
        "hls_segment_seconds": segment,
    }


def _transcode_audio(params: Mapping[str, Any]) -> dict[str, Any]:
    audio_format = _choice("format", params.get("format"), AUDIO_FORMATS, AUDIO_FORMATS[0])
    bitrate = params.get("bitrate")
    bitrate = DEFAULT_AUDIO_BITRATE if bitrate is None else _integer("bitrate", bitrate, AUDIO_BITRATE_RANGE)
    channels = params.get("channels")
    channels = 2 if channels is None else _integer("channels", channels, (1, 2))
    return {
        "format": audio_format,
        "bitrate": bitrate,
        "channels": channels,
        "loudness": _loudness(params.get("loudness")),
    }


def _loudness(value: Any) -> dict[str, Any] | None:
    loudness = _group("loudness", value, LOUDNESS_DEFAULTS)
    if loudness is not None and isinstance(value, Mapping):
        for key, (low, high) in LOUDNESS_RANGES.items():
            number = value.get(key)
            if number is None:
                continue
            if isinstance(number, bool) or not isinstance(number, int | float) or not low <= number <= high:
                raise _invalid(f"loudness.{key} must be a number from {low:g} to {high:g}")
            loudness[key] = float(number)
    return loudness


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
        # False, not None, for "no PNG": None is what an absent image means (the defaults), and
        # the worker validates these normalised params again (a stored null made a PNG anyway).
        "image": _image(params.get("image")) or False,
    }


def _image(value: Any) -> dict[str, Any] | None:
    image = _group("image", value, DEFAULT_IMAGE, absent=True)
    if image is None or not isinstance(value, Mapping):
        return image
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
