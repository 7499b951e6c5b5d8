"""Params schemas of the media operations, as :func:`hypermedia.engines.media.params.validate_params`
checks them (its limits, defaults and choices imported; the module is pure Python, never PyAV)."""

from __future__ import annotations

from typing import Any, Final

from hypermedia.engines.media.params import (
    AUDIO_BITRATE_RANGE,
    AUDIO_FORMATS,
    BUCKETS_PER_SECOND_RANGE,
    BUCKETS_RANGE,
    DEFAULT_AUDIO_BITRATE,
    DEFAULT_BUCKETS_PER_SECOND,
    DEFAULT_HLS_SEGMENT_SECONDS,
    DEFAULT_IMAGE,
    HLS_SEGMENT_RANGE,
    IMAGE_HEIGHT_RANGE,
    IMAGE_WIDTH_RANGE,
    LOUDNESS_DEFAULTS,
    LOUDNESS_RANGES,
    POSTER_DEFAULT_QUALITY,
    POSTER_DEFAULT_WIDTH,
    POSTER_FORMATS,
    POSTER_QUALITY_RANGE,
    POSTER_WIDTH_RANGE,
    SPRITE_DEFAULTS,
    SPRITE_RANGES,
    VIDEO_CODECS,
    VIDEO_DEFAULT_HEIGHTS,
    VIDEO_HEIGHT_RANGE,
    VIDEO_MAX_RENDITIONS,
    VIDEO_QUALITY,
    WAVEFORM_CHANNELS,
    X264_DEFAULT_PRESET,
    X264_PRESETS,
)
from hypermedia.engines.schemas.common import (
    INTEGERS,
    choice,
    flag,
    given,
    group,
    integer,
    number,
    operation,
    whole,
)

COLOR: Final = "#[0-9A-Fa-f]{6}"
"""A ``#RRGGBB`` colour: ``hypermedia.engines.media.params._COLOR`` (private there; the test
compares them)."""

H264: Final = "h264"
"""The codec ``preset`` and ``hls`` are for (named so in the validator's checks)."""


def _poster() -> dict[str, Any]:
    sprite = {
        "count": integer(
            "Thumbnails in the sheet, at even intervals.", *SPRITE_RANGES["count"], SPRITE_DEFAULTS["count"]
        ),
        "columns": integer("Thumbnails per row.", *SPRITE_RANGES["columns"], SPRITE_DEFAULTS["columns"]),
        "width": integer(
            "Width of one thumbnail, in pixels.", *SPRITE_RANGES["width"], SPRITE_DEFAULTS["width"]
        ),
    }
    return operation(
        "poster",
        "One upright picture of a video (or an audio file's cover picture), and optionally a sprite "
        "sheet of thumbnails for scrubbing previews.",
        {
            "width": integer(
                "Width of the picture in pixels; the height follows the display aspect ratio. Never "
                "wider than the source's display width.",
                *POSTER_WIDTH_RANGE,
                POSTER_DEFAULT_WIDTH,
            ),
            "format": choice("Image format of the picture.", POSTER_FORMATS, POSTER_FORMATS[0]),
            "quality": integer(
                "Encoder quality for JPEG and WebP, 1 (smallest) to 100 (best); ignored for PNG.",
                *POSTER_QUALITY_RANGE,
                POSTER_DEFAULT_QUALITY,
            ),
            "sprite": group(
                "false: no sprite sheet; true: one with the defaults; an object: one with these "
                "settings. A JPEG sheet of thumbnails at even intervals plus a WebVTT index "
                "(#xywh= cues). Video only.",
                sprite,
                False,
            ),
        },
        also_checked=[INTEGERS],
    )


def _codec_rule(codec: str, quality: tuple[int, int, int]) -> dict[str, Any]:
    """What ``codec`` (the default codec also when absent) implies: its quality range and
    default; no ``preset`` and no ``hls`` unless h264."""
    low, high, default = quality
    if codec == VIDEO_CODECS[0]:
        condition: dict[str, Any] = {"properties": {"codec": {"enum": [codec, None]}}}
    else:
        condition = {"required": ["codec"], "properties": {"codec": {"const": codec}}}
    implied: dict[str, Any] = {"quality": {"minimum": low, "maximum": high, "default": default}}
    if codec != H264:
        implied["preset"] = {"type": "null"}
        implied["hls"] = {"enum": [False, None]}
    return {"if": condition, "then": {"properties": implied}}


def _transcode_video() -> dict[str, Any]:
    ranges = "; ".join(
        f"{codec} {low}–{high}, default {d}" for codec, (low, high, d) in VIDEO_QUALITY.items()
    )
    hls_on = {"required": ["hls"], "properties": {"hls": {"const": True}}}
    return operation(
        "transcode_video",
        "A ladder of renditions: H.264 + AAC in MP4 (fast start), VP9 + Opus in WebM or AV1 + AAC "
        "in MP4, optionally packaged as HLS (h264 only). preset and hls are for codec h264 only; "
        "hls_segment_seconds for hls true only.",
        {
            "codec": choice(
                "h264: H.264 + AAC in MP4; vp9: VP9 + Opus in WebM; av1: AV1 + AAC in MP4.",
                VIDEO_CODECS,
                VIDEO_CODECS[0],
            ),
            "heights": {
                "type": ["array", "null"],
                "items": {
                    "type": "integer",
                    "minimum": VIDEO_HEIGHT_RANGE[0],
                    "maximum": VIDEO_HEIGHT_RANGE[1],
                },
                "minItems": 1,
                "maxItems": VIDEO_MAX_RENDITIONS,
                "uniqueItems": True,
                "description": "The rendition ladder: each rung the short side of the upright picture "
                "in pixels (720 is 1280 × 720 landscape, 720 × 1280 portrait). Rungs above the source "
                "are skipped; when none fits, one rendition at the source's size is made.",
                "default": list(VIDEO_DEFAULT_HEIGHTS),
            },
            "quality": integer(
                f"Constant quality (CRF; lower is better and larger), per codec: {ranges}.",
                min(low for low, _, _ in VIDEO_QUALITY.values()),
                max(high for _, high, _ in VIDEO_QUALITY.values()),
            ),
            "preset": choice(
                "x264's preset, h264 only: slower presets make smaller files.",
                X264_PRESETS,
                X264_DEFAULT_PRESET,
            ),
            "audio_bitrate": integer(
                "Bitrate of the sound of every rendition, kbit/s.",
                *AUDIO_BITRATE_RANGE,
                DEFAULT_AUDIO_BITRATE,
            ),
            "hls": flag(
                "true: also package every rendition as HLS (fMP4 segments, a media playlist per "
                "rendition and a master playlist). h264 only.",
                False,
            ),
            "hls_segment_seconds": integer(
                f"HLS segment length in seconds, for hls true only (default {DEFAULT_HLS_SEGMENT_SECONDS} then).",
                *HLS_SEGMENT_RANGE,
            ),
        },
        also_checked=[INTEGERS],
        rules={
            "allOf": [
                *(_codec_rule(codec, quality) for codec, quality in VIDEO_QUALITY.items()),
                {
                    "if": hls_on,
                    "then": {"properties": {"hls_segment_seconds": {"default": DEFAULT_HLS_SEGMENT_SECONDS}}},
                    "else": {"properties": {"hls_segment_seconds": {"type": "null"}}},
                },
            ]
        },
    )


def _transcode_audio() -> dict[str, Any]:
    loudness = {
        "target_lufs": number(
            "Integrated loudness to reach, LUFS.",
            *LOUDNESS_RANGES["target_lufs"],
            LOUDNESS_DEFAULTS["target_lufs"],
        ),
        "true_peak_db": number(
            "Highest true peak, dBTP.", *LOUDNESS_RANGES["true_peak_db"], LOUDNESS_DEFAULTS["true_peak_db"]
        ),
    }
    return operation(
        "transcode_audio",
        "The sound as AAC-LC in M4A, MP3 or Opus in Ogg, optionally loudness-normalised.",
        {
            "format": choice("aac: AAC-LC in M4A; mp3; opus: Opus in Ogg.", AUDIO_FORMATS, AUDIO_FORMATS[0]),
            "bitrate": integer("Bitrate, kbit/s.", *AUDIO_BITRATE_RANGE, DEFAULT_AUDIO_BITRATE),
            "channels": integer("1 (mono) or 2 (stereo).", 1, 2, 2),
            "loudness": group(
                "false: levels kept; true: EBU R 128 (-23 LUFS integrated, true peak at most -1 "
                "dBTP); an object: these targets.",
                loudness,
                False,
            ),
        },
        also_checked=[INTEGERS],
    )


def _waveform() -> dict[str, Any]:
    image = {
        "width": integer("Image width, pixels.", *IMAGE_WIDTH_RANGE, DEFAULT_IMAGE["width"]),
        "height": integer("Image height, pixels.", *IMAGE_HEIGHT_RANGE, DEFAULT_IMAGE["height"]),
        "color": {
            "type": ["string", "null"],
            "pattern": whole(COLOR),
            "description": 'Colour of the peaks, "#RRGGBB".',
            "default": DEFAULT_IMAGE["color"],
        },
        "background": {
            "type": ["string", "null"],
            "pattern": whole(f"transparent|{COLOR}"),
            "description": 'Background colour, "#RRGGBB", or "transparent".',
            "default": DEFAULT_IMAGE["background"],
        },
    }
    return operation(
        "waveform",
        "The peaks of the sound as JSON (per second of audio, or a total number of them), and a "
        "PNG of them. Give buckets_per_second or buckets, not both.",
        {
            "buckets_per_second": integer(
                "Peaks per second of audio (when buckets is not given).",
                *BUCKETS_PER_SECOND_RANGE,
                DEFAULT_BUCKETS_PER_SECOND,
            ),
            "buckets": integer("The total number of peaks, whatever the duration.", *BUCKETS_RANGE),
            "channels": choice(
                "all: peaks per channel; mix: one channel, the mean of all.", WAVEFORM_CHANNELS, "all"
            ),
            "image": group(
                "false: no PNG; true: a PNG with the defaults; an object: a PNG with these settings.",
                image,
                dict(DEFAULT_IMAGE),
            ),
        },
        also_checked=[INTEGERS],
        rules={"not": given("buckets_per_second", "buckets")},
    )


SCHEMAS: Final[dict[str, dict[str, Any]]] = {
    "probe": operation(
        "probe",
        "An audio or video file's container, duration, bit rate, streams and chapters, as JSON. Takes no params: {}.",
    ),
    "waveform": _waveform(),
    "poster": _poster(),
    "transcode_video": _transcode_video(),
    "transcode_audio": _transcode_audio(),
}
"""Operation name → JSON Schema of its params."""
