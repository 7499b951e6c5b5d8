"""The ``probe`` operation: the sandbox entry the mediaworker's children call (issue 7).

``run("probe", {}, input_path, out_dir, limits=…)`` describes one audio or video file in
``probe.json``: its container, duration and bit rate, every stream, and its chapters.

1. **Checks** before FFmpeg reads the file: the params (none); the file's size
   (``INPUT_TOO_LARGE``); a text playlist (``#EXTM3U``, ``ffconcat``) is ``UNSUPPORTED_FORMAT``
   whatever its name.
2. **Opening** (:func:`~hypermedia.engines.media.sources.open_media`, for every media operation):
   the local file only (``protocol_whitelist=file``) and only through the demuxers of
   :data:`~hypermedia.engines.media.sources.DEMUXERS` (``format_whitelist``). FFmpeg checks the
   whitelist after probing the format and *before* the demuxer reads its header, so a playlist
   demuxer (``hls``, ``dash``), ``concat``, ``image2`` sequences, ``sdp``/``rtp`` or any other
   demuxer that opens further files or URLs never runs (``UNSUPPORTED_FORMAT``); the detected format
   is checked again in Python. A file FFmpeg cannot open is ``CORRUPT_INPUT`` when its first bytes
   are those of an allowlisted container (an MP4 without its ``moov`` box says so),
   ``UNSUPPORTED_FORMAT`` otherwise.
3. **Header facts**: container, streams, chapters. A duration over
   :attr:`~hypermedia.engines.media.sources.MediaLimits.max_duration_seconds` is ``MEDIA_TOO_LONG``
   before any packet is decoded. An MP4/MOV whose sample index points past the end of the file is
   ``CORRUPT_INPUT`` (truncated).
4. **First frame** of every video stream that is not a cover picture is decoded (one thread), for
   the rotation and mirroring of its display matrix (:mod:`hypermedia.engines.media.orientation`): PyAV 18 exposes a stream's coded side data to writers
   only (``VideoStream.set_display_rotation``), while FFmpeg's decoder copies it onto every frame
   (``VideoFrame.side_data``). A first frame cut off or undecodable is ``CORRUPT_INPUT``.
5. **Exact duration** by demuxing (packets only, nothing decoded) when the header has none (Matroska
   written live, a raw stream) or FFmpeg only estimates it (:data:`ESTIMATED_DURATION`: ADTS AAC
   from its bit rate, MPEG-TS from its first and last timestamps): the last packet end minus the
   first packet start over all streams, at most
   :attr:`~hypermedia.engines.media.sources.MediaLimits.max_probe_packets` packets (beyond, the
   estimate stays and ``duration_source`` says so); passing
   :attr:`~hypermedia.engines.media.sources.MediaLimits.max_duration_seconds` stops the pass with
   ``MEDIA_TOO_LONG``.

Runs FFmpeg on untrusted input: call :func:`run` in the sandbox child only (a crash in a native
library then fails the attempt, not the worker). Importing this module is fork-safe.
"""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path
from typing import Any, Final

import av
import av.error
from av.audio.stream import AudioStream
from av.container import InputContainer
from av.stream import Disposition, Stream
from av.video.stream import VideoStream

from hypermedia.core.errors import InvalidArgument, PermanentJobError
from hypermedia.engines.contract import OutputFile
from hypermedia.engines.media.orientation import Orientation
from hypermedia.engines.media.params import validate_params
from hypermedia.engines.media.sources import (
    MediaLimits,
    check_duration,
    check_size,
    demux_span,
    first_frame_orientation,
    open_media,
)

__all__ = [
    "ESTIMATED_DURATION",
    "OutputFile",
    "run",
]

JSON_MIME: Final = "application/json"


ESTIMATED_DURATION: Final = frozenset({"aac", "mpegts"})
"""Demuxers whose duration FFmpeg estimates rather than reads: from the bit rate (ADTS AAC) or
from timestamps at both ends (MPEG-TS). A 6 s ADTS file of 1 s noise then 5 s silence is
estimated at 1.26 s. Not MP3: its Xing/Info frame (LAME writes one) gives the exact duration with
the encoder delay and padding removed, which the packets do not (3.0 s against 3.024 s); a
constant bit rate MP3 without one is estimated well from its bit rate."""

SAMPLE_INDEX_TAIL: Final = 4096
"""Entries at the end of each MP4/MOV track's sample index checked against the file's size."""
MAX_DECODED_VIDEO_STREAMS: Final = 8
"""Video streams whose first frame is decoded for its rotation (the file is opened once for each);
the streams after them report ``rotation`` and ``mirrored`` null (not read). Real files have one or two."""


def run(
    operation: str,
    params: dict,
    input_path: Path,
    out_dir: Path,
    *,
    limits: MediaLimits,
) -> list[OutputFile]:
    """Probes one audio or video file and writes ``probe.json`` into ``out_dir``.

    Args:
        operation: ``probe``.
        params: none (:func:`hypermedia.engines.media.params.validate_params`).
        input_path: the uploaded file.
        out_dir: existing directory for the output.
        limits: size checked before FFmpeg reads the file, duration before any frame is decoded.

    Returns:
        One :class:`OutputFile`, ``probe`` (``probe.json``, ``application/json``), holding::

            {"container": {"format": "mov,mp4,m4a,3gp,3g2,mj2", "long_name": "QuickTime / MOV"},
             "duration_seconds": 2.0,          # float or null; see duration_source
             "duration_source": "header",      # header | packets | estimate | unknown
             "start_seconds": 0.0,             # first timestamp, or null
             "bit_rate": 155532,               # bits/s over the file, or null
             "size_bytes": 38883,
             "streams": [<stream>, …],          # in file order
             "chapters": [{"start_seconds": 0.0, "end_seconds": 1.0, "title": "Intro" | null}]}

        A ``<stream>``: ``index``, ``type`` (``video``, ``audio``, ``subtitle``, ``data``,
        ``attachment``, ``unknown``), ``codec`` (FFmpeg's canonical name: ``h264``, ``aac``,
        ``mp3``…, or null), ``codec_long_name``, ``profile`` (``High``, ``LC``… or null),
        ``bit_rate`` (bits/s or null), ``duration_seconds`` (from the stream header, or null),
        ``language`` (the tag, ``und`` as null), ``title``, ``default`` (bool) and
        ``attached_picture`` (true for cover art: a picture stream, not video). Video adds
        ``width``, ``height`` (coded pixels), ``pix_fmt``, ``bit_depth`` (largest component
        depth of the pixel format: 8, 10, 12…), ``sample_aspect_ratio`` (``"1:1"`` or null),
        ``rotation`` (degrees counter-clockwise the picture is turned for display, from the display
        matrix, as ffprobe reports it: ``-90`` for a phone's portrait video; ``0`` without one),
        ``mirrored`` (the matrix also mirrors the picture, as a front camera's clip does: it is
        shown flipped top to bottom, then turned by ``rotation``; see
        :mod:`hypermedia.engines.media.orientation`), ``display_width``, ``display_height`` (the size
        after rotation), ``average_frame_rate``
        (frames/s over the stream), ``nominal_frame_rate`` (the base rate FFmpeg guesses:
        timestamps are multiples of it), both floats or null, and ``frame_count`` (from the
        header or counted while demuxing, or null). Audio adds ``sample_rate`` (Hz),
        ``channels``, ``channel_layout`` (``stereo``, ``5.1``…) and ``sample_format``.

        The output's metadata: ``container``, ``duration_seconds``, ``duration_source``,
        ``video_streams``, ``audio_streams`` (counts; cover pictures are not video streams),
        ``size_bytes`` (of ``probe.json``).

    Raises:
        InvalidArgument: ``UNKNOWN_OPERATION``, ``INVALID_PARAMS``.
        PermanentJobError: ``INPUT_TOO_LARGE``, ``UNSUPPORTED_FORMAT`` (not an allowlisted
            container, a playlist), ``CORRUPT_INPUT`` (truncated: no ``moov`` box, an index past
            the end of the file, a first video frame cut off; damaged headers),
            ``MEDIA_TOO_LONG``.
        MemoryError: FFmpeg hit the sandbox's memory limit.
    """
    if operation != "probe":
        raise InvalidArgument(f"unknown operation {operation!r}", "UNKNOWN_OPERATION")
    validate_params(operation, params)
    size = check_size(input_path, limits)
    with open_media(input_path) as container:
        report = _describe(container, size)
        check_duration(report["duration_seconds"], limits)
        if report["container"]["format"].startswith("mov,"):
            _check_sample_index(container, size)
    video = [
        s for s in report["streams"] if s["type"] == "video" and not s["attached_picture"] and s["codec"]
    ]
    for record in video[MAX_DECODED_VIDEO_STREAMS:]:
        record["rotation"] = record["mirrored"] = None  # not read
    for record in video[:MAX_DECODED_VIDEO_STREAMS]:
        # A container of its own per stream: one demux pass consumes the other streams' packets,
        # the keyframe of the next stream among them.
        with open_media(input_path) as container:
            stream = container.streams[record["index"]]
            assert isinstance(stream, VideoStream)
            _set_orientation(record, first_frame_orientation(stream))
    if report["duration_seconds"] is None or report["container"]["format"] in ESTIMATED_DURATION:
        with open_media(input_path) as container:
            _demux_duration(container, report, limits)
    data = json.dumps(report, ensure_ascii=False, separators=(",", ":")).encode()
    (out_dir / "probe.json").write_bytes(data)
    metadata = {
        "container": report["container"]["format"],
        "duration_seconds": report["duration_seconds"],
        "duration_source": report["duration_source"],
        "video_streams": len(video),
        "audio_streams": sum(1 for s in report["streams"] if s["type"] == "audio"),
        "size_bytes": len(data),
    }
    return [OutputFile("probe", "probe.json", JSON_MIME, metadata)]


# --- header facts --------------------------------------------------------------------------------


def _describe(container: InputContainer, size: int) -> dict[str, Any]:
    duration = _seconds(container.duration, Fraction(1, av.time_base))
    return {
        "container": {"format": container.format.name, "long_name": container.format.long_name},
        "duration_seconds": duration,
        "duration_source": "header" if duration is not None else "unknown",
        "start_seconds": _seconds(container.start_time, Fraction(1, av.time_base)),
        "bit_rate": container.bit_rate or None,
        "size_bytes": size,
        "streams": [_stream(stream) for stream in container.streams],
        "chapters": [_chapter(chapter) for chapter in container.chapters()],
    }


def _stream(stream: Stream) -> dict[str, Any]:
    ctx = stream.codec_context
    codec = ctx.codec if ctx is not None else None
    language = stream.metadata.get("language")
    record: dict[str, Any] = {
        "index": stream.index,
        "type": stream.type,
        "codec": codec.canonical_name if codec is not None else None,
        "codec_long_name": codec.long_name if codec is not None else None,
        "profile": stream.profile,
        "bit_rate": (ctx.bit_rate or None) if ctx is not None else None,
        "duration_seconds": _seconds(stream.duration, stream.time_base),
        "language": language if language and language != "und" else None,
        "title": stream.metadata.get("title"),
        "default": bool(stream.disposition & Disposition.default),
        "attached_picture": bool(stream.disposition & Disposition.attached_pic),
    }
    if isinstance(stream, VideoStream) and ctx is not None:
        pix_fmt = stream.codec_context.pix_fmt
        sar = stream.sample_aspect_ratio
        record.update(
            width=stream.codec_context.width,
            height=stream.codec_context.height,
            pix_fmt=pix_fmt,
            bit_depth=_bit_depth(pix_fmt),
            sample_aspect_ratio=f"{sar.numerator}:{sar.denominator}" if sar else None,
            rotation=0,
            mirrored=False,
            display_width=stream.codec_context.width,
            display_height=stream.codec_context.height,
            average_frame_rate=None if record["attached_picture"] else _rate(stream.average_rate),
            nominal_frame_rate=None if record["attached_picture"] else _rate(stream.base_rate),
            frame_count=stream.frames or None,
        )
    elif isinstance(stream, AudioStream) and ctx is not None:
        audio = stream.codec_context
        record.update(
            sample_rate=audio.sample_rate or None,
            channels=audio.channels or None,
            channel_layout=audio.layout.name if audio.layout is not None else None,
            sample_format=audio.format.name if audio.format is not None else None,
        )
    return record


def _chapter(chapter: Any) -> dict[str, Any]:
    time_base = chapter["time_base"] or Fraction(1, 1)
    return {
        "start_seconds": _seconds(chapter["start"], time_base),
        "end_seconds": _seconds(chapter["end"], time_base),
        "title": chapter["metadata"].get("title"),
    }


def _bit_depth(pix_fmt: str | None) -> int | None:
    """Largest component depth of a pixel format, in bits (``yuv420p10le`` → 10)."""
    if not pix_fmt:
        return None
    try:
        return max(component.bits for component in av.VideoFormat(pix_fmt).components)
    except (ValueError, av.error.FFmpegError):
        return None


def _seconds(value: int | None, time_base: Fraction | None) -> float | None:
    if value is None or time_base is None:
        return None
    return round(float(value * time_base), 6)


def _rate(rate: Fraction | None) -> float | None:
    if not rate:
        return None
    return round(float(rate), 6)


def _check_sample_index(container: InputContainer, size: int) -> None:
    """An MP4/MOV whose sample index points past the end of the file is truncated: its ``moov``
    came first (fast start) and the media data was cut."""
    for stream in container.streams:
        entries = stream.index_entries
        count = len(entries)
        if count == 0:
            continue
        if count > size:  # every sample takes a byte at least: a forged sample table
            raise PermanentJobError(
                "The MP4/MOV file's index lists more samples than the file has bytes.", "CORRUPT_INPUT"
            )
        # The last entries hold the highest offsets (a track's samples are stored in order); a
        # Python object per entry of a forged table of millions is what this must not build.
        last = (entries[i] for i in range(max(0, count - SAMPLE_INDEX_TAIL), count))
        if max(entry.pos + entry.size for entry in last) > size:
            raise PermanentJobError(
                "The MP4/MOV file is truncated: its index refers to media data past the end of the file.",
                "CORRUPT_INPUT",
            )


def _set_orientation(record: dict[str, Any], orientation: Orientation) -> None:
    record["rotation"] = orientation.rotation
    record["mirrored"] = orientation.mirrored
    if orientation.transpose:
        record["display_width"], record["display_height"] = record["height"], record["width"]


def _demux_duration(container: InputContainer, report: dict[str, Any], limits: MediaLimits) -> None:
    """Sets ``duration_seconds`` (and ``duration_source`` ``packets``) from the packets' timestamps
    (:func:`~hypermedia.engines.media.sources.demux_span`), and ``frame_count`` of video streams whose header has none.

    Raises:
        PermanentJobError: ``MEDIA_TOO_LONG``, ``CORRUPT_INPUT`` (:func:`~hypermedia.engines.media.sources.demux_span`).
    """
    span = demux_span(container, limits)
    if span.capped:
        if report["duration_seconds"] is not None:
            report["duration_source"] = "estimate"
        return
    start, end, counts = span.start, span.end, span.counts
    if start is None or end is None:
        return
    report["duration_seconds"] = round(end - start, 6)
    report["duration_source"] = "packets"
    for record in report["streams"]:
        if record["type"] == "video" and record.get("frame_count") is None and not record["attached_picture"]:
            record["frame_count"] = counts.get(record["index"])
