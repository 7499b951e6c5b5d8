"""The ``probe`` operation: the sandbox entry the mediaworker's children call (issue 7).

``run("probe", {}, input_path, out_dir, limits=…)`` describes one audio or video file in
``probe.json``: its container, duration and bit rate, every stream, and its chapters.

1. **Checks** before FFmpeg reads the file: the params (none); the file's size
   (``INPUT_TOO_LARGE``); a text playlist (``#EXTM3U``, ``ffconcat``) is ``UNSUPPORTED_FORMAT``
   whatever its name.
2. **Opening** (:func:`open_media`, for every media operation): the local file only
   (``protocol_whitelist=file``) and only through the demuxers of :data:`DEMUXERS`
   (``format_whitelist``). FFmpeg checks the whitelist after probing the format and *before* the
   demuxer reads its header, so a playlist demuxer (``hls``, ``dash``), ``concat``, ``image2``
   sequences, ``sdp``/``rtp`` or any other demuxer that opens further files or URLs never runs
   (``UNSUPPORTED_FORMAT``); the detected format is checked again in Python. A file FFmpeg cannot
   open is ``CORRUPT_INPUT`` when its first bytes are those of an allowlisted container
   (an MP4 without its ``moov`` box says so), ``UNSUPPORTED_FORMAT`` otherwise.
3. **Header facts**: container, streams, chapters. A duration over
   :attr:`MediaLimits.max_duration_seconds` is ``MEDIA_TOO_LONG`` before any packet is decoded.
   An MP4/MOV whose sample index points past the end of the file is ``CORRUPT_INPUT``
   (truncated).
4. **First frame** of every video stream that is not a cover picture is decoded (one thread), for
   the rotation and mirroring of its display matrix (:mod:`hypermedia.engines.media.orientation`): PyAV 18 exposes a stream's coded side data to writers
   only (``VideoStream.set_display_rotation``), while FFmpeg's decoder copies it onto every frame
   (``VideoFrame.side_data``). A first frame cut off or undecodable is ``CORRUPT_INPUT``.
5. **Exact duration** by demuxing (packets only, nothing decoded) when the header has none
   (Matroska written live, a raw stream) or FFmpeg only estimates it (:data:`ESTIMATED_DURATION`:
   ADTS AAC from its bit rate, MPEG-TS from its first and last timestamps): the last
   packet end minus the first packet start over all streams, at most
   :attr:`MediaLimits.max_probe_packets` packets (beyond, the estimate stays and
   ``duration_source`` says so); passing :attr:`MediaLimits.max_duration_seconds` stops the pass
   with ``MEDIA_TOO_LONG``.

Runs FFmpeg on untrusted input: call :func:`run` in the sandbox child only (a crash in a native
library then fails the attempt, not the worker). Importing this module is fork-safe.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, Final

import av
import av.error
from av.audio.stream import AudioStream
from av.container import InputContainer
from av.stream import Disposition, Stream
from av.video.frame import VideoFrame
from av.video.stream import VideoStream

from hypermedia.core.errors import InvalidArgument, PermanentJobError
from hypermedia.engines.contract import OutputFile
from hypermedia.engines.media.orientation import Orientation, frame_orientation
from hypermedia.engines.media.params import validate_params

__all__ = [
    "DEFAULT_MAX_DURATION_SECONDS",
    "DEFAULT_MAX_PROBE_PACKETS",
    "DEMUXERS",
    "ESTIMATED_DURATION",
    "MediaLimits",
    "OutputFile",
    "PacketSpan",
    "audio_stream",
    "check_duration",
    "check_size",
    "demux_span",
    "first_frame",
    "first_frame_orientation",
    "header_seconds",
    "open_media",
    "run",
]

JSON_MIME: Final = "application/json"

DEMUXERS: Final = (
    "mov,mp4,m4a,3gp,3g2,mj2",
    "matroska,webm",
    "mp3",
    "aac",
    "ogg",
    "wav",
    "flac",
    "avi",
    "mpegts",
)
"""FFmpeg demuxers (their ``AVInputFormat.name``) media files are opened with: real media
containers that read nothing but the file itself (the MOV demuxer's external data references
stay off, its default). ``aac`` is raw ADTS AAC. Everything else FFmpeg could detect is
``UNSUPPORTED_FORMAT``: playlists and manifests (``hls``, ``dash``), ``concat``, image sequences
(``image2``), network descriptions (``sdp``, ``rtsp``), and the many rarely used demuxers."""

ESTIMATED_DURATION: Final = frozenset({"aac", "mpegts"})
"""Demuxers whose duration FFmpeg estimates rather than reads: from the bit rate (ADTS AAC) or
from timestamps at both ends (MPEG-TS). A 6 s ADTS file of 1 s noise then 5 s silence is
estimated at 1.26 s. Not MP3: its Xing/Info frame (LAME writes one) gives the exact duration with
the encoder delay and padding removed, which the packets do not (3.0 s against 3.024 s); a
constant bit rate MP3 without one is estimated well from its bit rate."""

DEFAULT_MAX_DURATION_SECONDS: Final = 4 * 3600.0
"""Longest input, in seconds: 4 hours."""
DEFAULT_MAX_PROBE_PACKETS: Final = 1_000_000
"""Most packets the exact-duration pass demuxes: 4 hours of 30 fps video with AAC at 48 kHz is
about 1.1 million packets."""
SAMPLE_INDEX_TAIL: Final = 4096
"""Entries at the end of each MP4/MOV track's sample index checked against the file's size."""
MAX_DECODED_VIDEO_STREAMS: Final = 8
"""Video streams whose first frame is decoded for its rotation (the file is opened once for each);
the streams after them report ``rotation`` and ``mirrored`` null (not read). Real files have one or two."""
FIRST_FRAME_MAX_PACKETS: Final = 256
"""Most packets of one video stream sent to its decoder for the first frame (an open GOP or
a decoder delay needs a few)."""

_FILE_SIGNATURES: Final = (
    (0, b"\x1a\x45\xdf\xa3"),  # EBML: Matroska, WebM
    (0, b"ID3"),  # MP3 (or AAC) with an ID3v2 tag
    (0, b"OggS"),
    (0, b"fLaC"),
    (0, b"RIFF"),  # WAV, AVI
)
_ISO_BMFF_BOXES: Final = frozenset({b"ftyp", b"moov", b"mdat", b"free", b"skip", b"wide", b"pnot"})
_TS_PACKET: Final = 188
_PLAYLIST_PREFIXES: Final = (b"#EXTM3U", b"#EXT-X-", b"ffconcat")


@dataclass(frozen=True)
class MediaLimits:
    """Bounds of one media job, from its processing profile; the sandbox's rlimits
    (``RLIMIT_AS``, ``RLIMIT_CPU``, ``RLIMIT_FSIZE``) are the backstop behind them."""

    max_input_bytes: int
    """Largest input file, in bytes (``INPUT_TOO_LARGE``)."""
    max_duration_seconds: float = DEFAULT_MAX_DURATION_SECONDS
    """Longest input, in seconds (``MEDIA_TOO_LONG``), from the header or from demuxing."""
    max_probe_packets: int = DEFAULT_MAX_PROBE_PACKETS
    """Most packets demuxed to find an exact duration the header does not give."""
    threads: int = 1
    """Threads an encoder (and the decoder feeding it) of a transcode may use; the worker counts
    them against the job's ``RLIMIT_NPROC``. The other operations decode with one thread."""


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


# --- opening -------------------------------------------------------------------------------------


@contextmanager
def open_media(path: Path) -> Iterator[InputContainer]:
    """Opens a media file for demuxing with the allowlisted demuxers only (see the module doc).

    Yields:
        The open container; closed on exit.

    Raises:
        PermanentJobError: ``UNSUPPORTED_FORMAT``, ``CORRUPT_INPUT``.
        MemoryError: FFmpeg could not allocate.
    """
    with path.open("rb") as f:
        head = f.read(4096)
    if head.removeprefix(b"\xef\xbb\xbf").lstrip().startswith(_PLAYLIST_PREFIXES):
        raise PermanentJobError(
            "The input is a playlist, not a media file; playlists are not read.", "UNSUPPORTED_FORMAT"
        )
    options = {"protocol_whitelist": "file", "format_whitelist": ",".join(DEMUXERS)}
    try:
        container = av.open(f"file:{path.resolve()}", mode="r", options=options)
    except MemoryError:  # av.error.MemoryError is one, and an FFmpegError: not CORRUPT_INPUT
        raise
    except av.error.ArgumentError as exc:
        # EINVAL from avformat_open_input: the probed format is not on the whitelist.
        raise PermanentJobError(
            "The input is not an audio or video format this service reads.", "UNSUPPORTED_FORMAT"
        ) from exc
    except av.error.FFmpegError as exc:
        raise _unreadable(head) from exc
    try:
        if container.format.name not in DEMUXERS:  # the whitelist held; this is the second check
            raise PermanentJobError(
                "The input is not an audio or video format this service reads.", "UNSUPPORTED_FORMAT"
            )
        yield container
    finally:
        container.close()


def _unreadable(head: bytes) -> PermanentJobError:
    """The error for a file FFmpeg could not open: corrupt when it starts as a known container."""
    if _iso_bmff(head):
        if b"moov" not in _top_level_boxes(head):
            return PermanentJobError(
                "The MP4/MOV file has no index (moov box) where FFmpeg looked: it is truncated or was "
                "never finalised.",
                "CORRUPT_INPUT",
            )
        return PermanentJobError("The MP4/MOV file is damaged: its header cannot be read.", "CORRUPT_INPUT")
    if any(head[offset:].startswith(magic) for offset, magic in _FILE_SIGNATURES) or _mpeg_audio(head):
        return PermanentJobError("The media file is damaged: its header cannot be read.", "CORRUPT_INPUT")
    if len(head) > _TS_PACKET and head[0] == 0x47 and head[_TS_PACKET] == 0x47:
        return PermanentJobError("The MPEG-TS file is damaged: it cannot be read.", "CORRUPT_INPUT")
    return PermanentJobError(
        "The input is not an audio or video format this service reads.", "UNSUPPORTED_FORMAT"
    )


def _iso_bmff(head: bytes) -> bool:
    return len(head) >= 8 and head[4:8] in _ISO_BMFF_BOXES


def _top_level_boxes(head: bytes) -> list[bytes]:
    """Types of the ISO BMFF boxes that start within ``head`` (the first 4 KiB): ``moov`` is
    among them when it comes first (fast start) or follows a small ``mdat``. A ``moov`` at the
    end of a long file is not seen here; :func:`_unreadable` only uses this once FFmpeg has
    failed to find one itself."""
    boxes: list[bytes] = []
    offset = 0
    while offset + 8 <= len(head):
        size, kind = struct.unpack(">I4s", head[offset : offset + 8])
        boxes.append(kind)
        if size == 1 and offset + 16 <= len(head):
            size = struct.unpack(">Q", head[offset + 8 : offset + 16])[0]
        if size < 8:
            break
        offset += size
    return boxes


def _mpeg_audio(head: bytes) -> bool:
    """An MPEG audio frame sync (MP3, ADTS AAC) at the start."""
    return len(head) >= 2 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0


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


def audio_stream(container: InputContainer, purpose: str) -> AudioStream:
    """The first audio stream that is not a cover picture and that this FFmpeg can decode, for
    every media operation that reads sound (``purpose`` ends the error message: "to transcode").

    Raises:
        PermanentJobError: ``NO_AUDIO_STREAM``; ``UNSUPPORTED_FORMAT`` when the only audio is in a
            codec this build has no decoder for (PyAV gives such a stream no codec context).
    """
    undecodable = False
    for stream in container.streams.audio:
        if stream.disposition & Disposition.attached_pic:
            continue
        if stream.codec_context is None:
            undecodable = True
            continue
        return stream
    if undecodable:
        raise PermanentJobError("The audio is in a codec this service cannot decode.", "UNSUPPORTED_FORMAT")
    raise PermanentJobError(f"The input has no audio stream {purpose}.", "NO_AUDIO_STREAM")


def header_seconds(container: InputContainer, stream: Stream | None = None) -> float | None:
    """The duration the header gives (the container's, else ``stream``'s), in seconds, or ``None``."""
    if container.duration is not None:
        return container.duration / av.time_base
    if stream is not None and stream.duration is not None and stream.time_base is not None:
        return float(stream.duration * stream.time_base)
    return None


def check_size(input_path: Path, limits: MediaLimits) -> int:
    """The input's size in bytes. Raises PermanentJobError ``INPUT_TOO_LARGE`` over
    :attr:`MediaLimits.max_input_bytes` (every media operation checks it before FFmpeg reads)."""
    size = input_path.stat().st_size
    if size > limits.max_input_bytes:
        raise PermanentJobError(
            f"The input is larger than the {limits.max_input_bytes} byte limit.", "INPUT_TOO_LARGE"
        )
    return size


def check_duration(seconds: float | None, limits: MediaLimits) -> None:
    """Raises PermanentJobError ``MEDIA_TOO_LONG`` when ``seconds`` (None: unknown) is over
    :attr:`MediaLimits.max_duration_seconds`; shared by every media operation."""
    if seconds is not None and seconds > limits.max_duration_seconds:
        raise PermanentJobError(
            f"The input lasts {seconds:.1f} s; at most {limits.max_duration_seconds:.0f} s are accepted.",
            "MEDIA_TOO_LONG",
        )


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


# --- first frames --------------------------------------------------------------------------------


def first_frame_orientation(stream: VideoStream) -> Orientation:
    """The display matrix on the stream's first decoded frame
    (:func:`hypermedia.engines.media.orientation.frame_orientation`; upright without one).

    Raises:
        PermanentJobError: ``CORRUPT_INPUT`` (:func:`first_frame`).
    """
    return frame_orientation(first_frame(stream))


def first_frame(stream: VideoStream) -> VideoFrame:
    """The stream's first decoded frame, with one decoder thread, from at most
    :data:`FIRST_FRAME_MAX_PACKETS` packets (a cover picture's one packet included).

    A packet the demuxer flags corrupt is held back: decoded once another packet follows it (a
    flag mid-stream: MPEG-TS sets it around a continuity-counter jump, the frame usually whole),
    refused when the stream ends with it (a file cut inside its first frame).

    Raises:
        PermanentJobError: ``CORRUPT_INPUT`` when the first packets are cut off or no frame decodes.
        MemoryError: FFmpeg could not allocate.
    """
    container = stream.container
    assert isinstance(container, InputContainer)
    stream.codec_context.thread_count = 1
    packets = 0
    held: Any = None
    try:
        for packet in container.demux(stream):
            if packet.size == 0:
                if held is not None:
                    break  # the stream ends in the flagged packet: cut off
                batch: list[Any] = [None]  # end of the stream: flush
            elif packet.is_corrupt and held is None:
                held = packet
                continue
            else:
                batch = [held, packet] if held is not None else [packet]
                held = None
            for item in batch:
                for frame in stream.codec_context.decode(item):
                    assert isinstance(frame, VideoFrame)
                    return frame
            packets += len(batch)
            if packets >= FIRST_FRAME_MAX_PACKETS:
                break
    except MemoryError:  # av.error.MemoryError is one, and an FFmpegError: not CORRUPT_INPUT
        raise
    except av.error.FFmpegError as exc:
        raise _bad_first_frame(stream.index) from exc
    raise _bad_first_frame(stream.index)


def _bad_first_frame(index: int) -> PermanentJobError:
    return PermanentJobError(
        f"The first frame of video stream {index} cannot be decoded: the file is truncated or damaged.",
        "CORRUPT_INPUT",
    )


def _set_orientation(record: dict[str, Any], orientation: Orientation) -> None:
    record["rotation"] = orientation.rotation
    record["mirrored"] = orientation.mirrored
    if orientation.transpose:
        record["display_width"], record["display_height"] = record["height"], record["width"]


# --- exact duration ------------------------------------------------------------------------------


@dataclass(frozen=True)
class PacketSpan:
    """What demuxing every packet (nothing decoded) tells about a file's timeline."""

    start: float | None
    """The earliest packet start over all streams, in seconds; None without a timestamped packet."""
    end: float | None
    """The latest packet end (pts + duration) over all streams, in seconds."""
    counts: dict[int, int]
    """Packets per stream index."""
    capped: bool
    """True when :attr:`MediaLimits.max_probe_packets` stopped the pass (start/end are partial)."""


def demux_span(container: InputContainer, limits: MediaLimits) -> PacketSpan:
    """Demuxes the whole file from where ``container`` stands, at most
    :attr:`MediaLimits.max_probe_packets` packets, for the span of its timestamps.

    Raises:
        PermanentJobError: ``MEDIA_TOO_LONG`` as soon as the packets span more than the limit;
            ``CORRUPT_INPUT`` when demuxing fails.
    """
    start: float | None = None
    end: float | None = None
    counts: dict[int, int] = {}
    packets = 0
    try:
        for packet in container.demux():
            if packet.size == 0 or packet.pts is None or packet.time_base is None:
                continue
            packets += 1
            if packets > limits.max_probe_packets:
                return PacketSpan(start, end, counts, True)
            counts[packet.stream_index] = counts.get(packet.stream_index, 0) + 1
            first = float(packet.pts * packet.time_base)
            last = float((packet.pts + (packet.duration or 0)) * packet.time_base)
            start = first if start is None else min(start, first)
            end = last if end is None else max(end, last)
            check_duration(end - start, limits)
    except MemoryError:  # av.error.MemoryError is one, and an FFmpegError: not CORRUPT_INPUT
        raise
    except av.error.FFmpegError as exc:
        raise PermanentJobError(
            "The media file is damaged: its packets cannot be read.", "CORRUPT_INPUT"
        ) from exc
    return PacketSpan(start, end, counts, False)


def _demux_duration(container: InputContainer, report: dict[str, Any], limits: MediaLimits) -> None:
    """Sets ``duration_seconds`` (and ``duration_source`` ``packets``) from the packets' timestamps
    (:func:`demux_span`), and ``frame_count`` of video streams whose header has none.

    Raises:
        PermanentJobError: ``MEDIA_TOO_LONG``, ``CORRUPT_INPUT`` (:func:`demux_span`).
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
