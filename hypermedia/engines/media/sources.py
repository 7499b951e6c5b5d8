"""Opening media input safely, and the checks and reads every media operation shares (probe,
waveform, poster, sprite, both transcodes):

- :func:`open_media`: the local file only (``protocol_whitelist=file``) and only through the
  demuxers of :data:`DEMUXERS` (``format_whitelist``, checked again in Python); a text playlist is
  ``UNSUPPORTED_FORMAT`` whatever its name; a file FFmpeg cannot open is ``CORRUPT_INPUT`` when its
  first bytes are those of an allowlisted container, ``UNSUPPORTED_FORMAT`` otherwise (see
  :mod:`hypermedia.engines.media.probe` for why the whitelist holds);
- :class:`MediaLimits` and the checks against it (:func:`check_size`, :func:`check_duration`);
- :func:`audio_stream`, :func:`header_seconds`, :func:`first_frame`,
  :func:`first_frame_orientation`, and :func:`demux_span` (every packet demuxed, nothing decoded).

Runs FFmpeg on untrusted input: call these in the sandbox child only. Importing this module is
fork-safe.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import av
import av.error
from av.audio.stream import AudioStream
from av.container import InputContainer
from av.stream import Disposition, Stream
from av.video.frame import VideoFrame
from av.video.stream import VideoStream

from hypermedia.core.errors import PermanentJobError
from hypermedia.engines.media.orientation import Orientation, frame_orientation

__all__ = [
    "DEFAULT_MAX_DURATION_SECONDS",
    "DEFAULT_MAX_PROBE_PACKETS",
    "DEMUXERS",
    "FIRST_FRAME_MAX_PACKETS",
    "MediaLimits",
    "PacketSpan",
    "audio_stream",
    "check_duration",
    "check_size",
    "demux_span",
    "first_frame",
    "first_frame_orientation",
    "header_seconds",
    "open_media",
]


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


DEFAULT_MAX_DURATION_SECONDS: Final = 4 * 3600.0
"""Longest input, in seconds: 4 hours."""
DEFAULT_MAX_PROBE_PACKETS: Final = 1_000_000
"""Most packets the exact-duration pass demuxes: 4 hours of 30 fps video with AAC at 48 kHz is
about 1.1 million packets."""


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
    part_seconds: float | None = None
    """A ``transcode_video`` of at least this many seconds (the header's, else the packets')
    with more than one rendition encodes them one at a time and keeps each but the last as a
    checkpoint (:mod:`hypermedia.engines.media.rendition_parts`); ``None``: in one pass, no
    checkpoints."""
    fan_out_seconds: float | None = None
    """A ``transcode_video`` of at least this many seconds is cut into chunks of
    :attr:`fan_out_chunk_seconds` and, with at least three, fanned out: each chunk but the last
    is encoded by a child job (ADR 0081, :mod:`hypermedia.worker.fanout`); ``None``: never."""
    fan_out_chunk_seconds: float = 30.0
    """Length of a fanned-out job's chunks, in seconds (longer beyond 60 chunks)."""
    fan_out: bool = True
    """Whether this run may ask to fan out: False for the run of a job whose children ran."""
    chunk: int | None = None
    """A child job's chunk of its parent's plan: the run encodes and keeps that chunk only."""


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
