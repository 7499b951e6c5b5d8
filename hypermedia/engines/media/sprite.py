"""The ``poster`` operation's sprite sheet: thumbnails of a video at even intervals in one JPEG,
with a WebVTT index for scrubbing previews (issue 7). :func:`hypermedia.engines.media.poster.run` calls
:func:`write_sprite` when its params ask for ``sprite``.

``write_sprite(input_path, stream_index, options, out_dir, limits=…)``:

1. **Timeline**: the duration from the container's header, else the video stream's, else the
   span of the packets' timestamps over all streams (demuxed, nothing decoded; at most
   :attr:`MediaLimits.max_probe_packets` packets, beyond which the span seen so far is the
   duration; over :attr:`MediaLimits.max_duration_seconds` is ``MEDIA_TOO_LONG``); it starts at
   the container's start time. ``count`` thumbnails split it into equal intervals; thumbnail
   ``i`` shows the middle of its interval, ``t_i = (i + 0.5) × duration / count``.
2. **Frames** (:class:`_Sampler`, one decoder thread): the first frame at or after ``t_i``.
   *Seek* (``container.seek`` in the stream's time base, ``backward``: to the keyframe at or
   before ``t_i``; not ``any_frame``, which would start decoding at a frame that is not a
   keyframe) and decode forward, unless decoding on from the last frame is cheaper: ``t_i`` is
   at most :data:`SPRITE_SEEK_SECONDS` past it, or the demuxer's index says the seek would land
   on a keyframe before it. *Bound*: at most :data:`SPRITE_SEEK_SECONDS` of packets (twice the
   nominal frame rate; at most :data:`SPRITE_MAX_PACKETS`) go to the decoder per thumbnail,
   then the last decoded frame is taken: a keyframe interval longer than that makes thumbnails
   early, by up to ``max_offset_seconds``. Packets before ``t_i`` are decoded with
   ``skip_frame`` ``NONREF``: frames no other frame refers to (most B-frames) are dropped
   undecoded, the rest are needed for the frames after them (on x264's output, about 30 % less
   decoding time). *Late landing*: when the first frame after a seek is already past ``t_i`` (MPEG-TS
   seeks by bisecting on timestamps, blind to keyframes, and the decoder then waits for the next
   keyframe), the seek is repeated :data:`SPRITE_SEEK_SECONDS` further back, up to
   :data:`SPRITE_SEEK_RETRIES` times, each with that much more to decode; a time before the
   start that the demuxer refuses (AVI) is a seek to the start. Any other seek FFmpeg refuses is
   ``CORRUPT_INPUT``. Times past the end of the video (a longer audio track) repeat its last
   frame; a video with fewer frames than thumbnails repeats frames; where nothing decodes (a
   file cut short, its index pointing past the end) the last thumbnail's frame is repeated, and
   only a first thumbnail without any frame is ``CORRUPT_INPUT``.
3. **Thumbnails**: every frame is scaled by swscale (area averaging) straight to the
   thumbnail's size in its coded orientation, then put upright from the frame's display matrix
   (:meth:`~hypermedia.engines.media.orientation.Orientation.upright`: quarter turns and mirroring, as
   the poster). The size is
   that of the poster's picture (:func:`~hypermedia.engines.media.frames.display_size`: the sample
   aspect ratio applied, turned upright): ``width`` wide, never wider than the display width,
   and the display aspect's height rounded to an even number (at least 2). When the sheet would
   exceed :data:`SPRITE_MAX_PIXELS` or :data:`SPRITE_MAX_SIDE`, the thumbnails are made narrower
   (``reduced_to_fit``). A frame over :data:`~hypermedia.engines.media.frames.MAX_PIXELS` is
   ``INPUT_TOO_LARGE_PIXELS`` before it is converted.
4. **Sheet**: the thumbnails row-major in ``min(columns, count)`` columns (empty cells of the last
   row black), JPEG quality :data:`SPRITE_QUALITY` without metadata (optimised Huffman tables up
   to :data:`SPRITE_OPTIMIZE_MAX_PIXELS`); the index is WebVTT, one cue
   per thumbnail whose payload ``sprite#xywh=x,y,w,h`` names the sheet by its output type (the
   gateway rewrites it into the sheet's download URL).

Progress is reported after each thumbnail (:func:`hypermedia.sandbox.report_progress`).

Runs FFmpeg on untrusted input: call it in the sandbox child only. Importing this module is
fork-safe (pyvips is imported when the sheet is encoded).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterator, Mapping
from fractions import Fraction
from pathlib import Path
from typing import Final

import av
import av.error
import numpy as np
from av.container import InputContainer
from av.packet import Packet
from av.video.frame import VideoFrame
from av.video.stream import VideoStream

from hypermedia.core.errors import PermanentJobError
from hypermedia.engines.contract import OutputFile, report_progress
from hypermedia.engines.media.frames import MAX_PIXELS, check_pixels, display_size, one_thread
from hypermedia.engines.media.orientation import frame_orientation
from hypermedia.engines.media.sources import MediaLimits, demux_span, open_media

__all__ = [
    "SPRITE_MAX_PACKETS",
    "SPRITE_MAX_PIXELS",
    "SPRITE_MAX_SIDE",
    "SPRITE_OPTIMIZE_MAX_PIXELS",
    "SPRITE_QUALITY",
    "SPRITE_SEEK_RETRIES",
    "SPRITE_SEEK_SECONDS",
    "write_sprite",
]

SPRITE_SEEK_SECONDS: Final = 2.0
"""Stream time decoded at most per thumbnail (counted in packets at the nominal frame rate); also
how far past the last decoded frame a thumbnail is reached by decoding on rather than seeking."""
SPRITE_MAX_PACKETS: Final = 240
"""Most packets sent to the decoder per thumbnail, whatever the frame rate claims (2 s at 120 fps);
:data:`SPRITE_DEFAULT_RATE` stands in for a rate the stream does not give."""
SPRITE_DEFAULT_RATE: Final = 30.0
SPRITE_FIRST_FRAME_PACKETS: Final = 256
"""Packets sent beyond the per-thumbnail bound while no frame has come out since the seek (a
decoder delay, damaged packets); then the thumbnail is ``CORRUPT_INPUT``."""
SPRITE_MAX_PIXELS: Final = MAX_PIXELS
"""Largest sheet, in pixels (192 MB as 8-bit RGB, held in memory while encoded): 400 thumbnails
of 480 × 270 are 51.8 million; 400 of 480 × 360 (4:3) are made narrower to fit."""
SPRITE_MAX_SIDE: Final = 65_500
"""Longest side of the sheet: the largest JPEG libjpeg writes (``JPEG_MAX_DIMENSION``)."""
SPRITE_SEEK_RETRIES: Final = 3
"""Seeks again, each :data:`SPRITE_SEEK_SECONDS` further back, when a seek landed after the
target (:meth:`_Sampler._seek_to`)."""
SPRITE_QUALITY: Final = 75
SPRITE_OPTIMIZE_MAX_PIXELS: Final = 16_000_000
"""Largest sheet encoded with optimised Huffman tables (about a third smaller on test sheets):
libjpeg then holds every DCT coefficient of the image, 375 MB more for a 64 MP sheet (measured)
against 30 MB without."""
SPRITE_OUTPUT: Final = "sprite"
"""The sheet's output type, which is also the URI in the index's cues."""


def write_sprite(
    input_path: Path,
    stream_index: int,
    options: Mapping[str, int],
    out_dir: Path,
    *,
    limits: MediaLimits,
) -> list[OutputFile]:
    """Writes ``sprite.jpg`` and ``sprite.vtt`` of one video stream into ``out_dir``.

    Args:
        input_path: the uploaded file (size already checked).
        stream_index: the video stream (not a cover picture).
        options: the normalised ``sprite`` params: ``count``, ``columns``, ``width``
            (:func:`hypermedia.engines.media.params.validate_params`).
        out_dir: existing directory for the outputs; its parent receives the progress file.
        limits: the duration limit, and the packets demuxed when no header gives a duration.

    Returns:
        Two :class:`OutputFile`: ``sprite`` (``sprite.jpg``, ``image/jpeg``; metadata ``count``,
        ``columns``, ``rows``, ``thumbnail_width``, ``thumbnail_height``, ``interval_seconds``,
        ``duration_seconds``, ``width``, ``height`` (of the sheet), ``reduced_to_fit`` (the
        thumbnails are narrower than asked and than the source, to keep the sheet within
        :data:`SPRITE_MAX_PIXELS` and :data:`SPRITE_MAX_SIDE`), ``max_offset_seconds`` (largest
        distance between a thumbnail's ``t_i`` and its frame's time) and ``size_bytes``), then
        ``sprite_vtt`` (``sprite.vtt``, ``text/vtt``; metadata ``cues``, ``size_bytes``).

    Raises:
        PermanentJobError: ``MEDIA_TOO_LONG`` (the demuxed duration), ``CORRUPT_INPUT`` (the
            packets cannot be read while demuxing for the duration; no frame decodes for the first
            thumbnail; FFmpeg refuses a seek), ``INPUT_TOO_LARGE_PIXELS``.
        MemoryError: FFmpeg hit the sandbox's memory limit.
    """
    count = options["count"]
    columns = min(options["columns"], count)
    rows = math.ceil(count / columns)
    with open_media(input_path) as container:
        stream = container.streams[stream_index]
        assert isinstance(stream, VideoStream)
        origin, duration = _timeline(container, stream, limits)
        one_thread(stream)
        sampler = _Sampler(container, stream, _packet_bound(stream))
        interval = duration / count
        sheet: np.ndarray | None = None
        cell_width = cell_height = 0
        reduced = False
        offset = 0.0
        last: tuple[VideoFrame, np.ndarray] | None = None
        for i in range(count):
            seconds = origin + (i + 0.5) * interval
            frame = sampler.frame_at(seconds)
            if sheet is None:
                cell_width, cell_height, reduced = _cell_size(frame, stream, options["width"], columns, rows)
                sheet = np.zeros((rows * cell_height, columns * cell_width, 3), np.uint8)
            if last is None or last[0] is not frame:
                last = frame, _thumbnail(frame, cell_width, cell_height)
            x, y = (i % columns) * cell_width, (i // columns) * cell_height
            sheet[y : y + cell_height, x : x + cell_width] = last[1]
            shown = sampler.seconds(frame)
            if shown is not None:
                offset = max(offset, abs(shown - seconds))
            report_progress(out_dir, (i + 1) / count)
    assert sheet is not None  # count ≥ 1
    data = _encode(sheet)
    (out_dir / "sprite.jpg").write_bytes(data)
    vtt = _webvtt(duration, count, columns, cell_width, cell_height).encode()
    (out_dir / "sprite.vtt").write_bytes(vtt)
    sheet_metadata = {
        "count": count,
        "columns": columns,
        "rows": rows,
        "thumbnail_width": cell_width,
        "thumbnail_height": cell_height,
        "interval_seconds": round(interval, 6),
        "duration_seconds": round(duration, 6),
        "width": columns * cell_width,
        "height": rows * cell_height,
        "reduced_to_fit": reduced,
        "max_offset_seconds": round(offset, 6),
        "size_bytes": len(data),
    }
    return [
        OutputFile(SPRITE_OUTPUT, "sprite.jpg", "image/jpeg", sheet_metadata),
        OutputFile("sprite_vtt", "sprite.vtt", "text/vtt", {"cues": count, "size_bytes": len(vtt)}),
    ]


# --- the timeline --------------------------------------------------------------------------------


def _timeline(container: InputContainer, stream: VideoStream, limits: MediaLimits) -> tuple[float, float]:
    """The start and the duration of the file, in seconds (module doc, step 1).

    Raises:
        PermanentJobError: ``MEDIA_TOO_LONG``; ``CORRUPT_INPUT`` when the packets cannot be read
            or none has a timestamp.
    """
    start: float | None = None
    if container.start_time is not None:
        start = container.start_time / av.time_base
    elif stream.start_time is not None and stream.time_base:
        start = float(stream.start_time * stream.time_base)
    if container.duration is not None and container.duration > 0:
        return start or 0.0, container.duration / av.time_base
    if stream.duration and stream.time_base:
        return start or 0.0, float(stream.duration * stream.time_base)
    first, end = _demux_span(container, limits)
    start = first if start is None else start
    # One frame and nothing else has no span: then a thumbnail's time is its start.
    return start, max(end - start, 0.0) or 1.0 / _frame_rate(stream)


def _demux_span(container: InputContainer, limits: MediaLimits) -> tuple[float, float]:
    """The first packet's start and the last packet's end over all streams, in seconds
    (:func:`hypermedia.engines.media.sources.demux_span`; a pass stopped at the packet limit keeps what it saw).

    Raises:
        PermanentJobError: ``CORRUPT_INPUT`` without a timestamped packet; ``MEDIA_TOO_LONG``.
    """
    span = demux_span(container, limits)
    if span.start is None or span.end is None:
        raise PermanentJobError("The video has no packet with a timestamp.", "CORRUPT_INPUT")
    return span.start, span.end


def _frame_rate(stream: VideoStream) -> float:
    rate = stream.base_rate or stream.average_rate
    return float(rate) if rate and rate > 0 else SPRITE_DEFAULT_RATE


def _packet_bound(stream: VideoStream) -> int:
    return max(1, min(SPRITE_MAX_PACKETS, math.ceil(SPRITE_SEEK_SECONDS * _frame_rate(stream))))


# --- frames --------------------------------------------------------------------------------------


class _Sampler:
    """Frames of one video stream at increasing times, each the first at or after its time,
    found with bounded work (module doc, step 2)."""

    def __init__(self, container: InputContainer, stream: VideoStream, max_packets: int) -> None:
        self._container = container
        self._stream = stream
        self._time_base = stream.time_base or Fraction(1, av.time_base)
        self._start = stream.start_time or 0
        self._max_packets = max_packets
        self._packets: Iterator[Packet] | None = None
        self._pending: deque[VideoFrame] = deque()
        """Frames out of the decoder not yet looked at (a packet can complete several)."""
        self._frame: VideoFrame | None = None
        """The last frame looked at since the last seek."""
        self._first_pts: int | None = None
        """The timestamp of the first frame out of the decoder since the last seek."""
        self._ended = False
        """The decoder is flushed: no frame comes out until the next seek."""
        self._shown: VideoFrame | None = None
        """The frame returned last."""

    def frame_at(self, seconds: float) -> VideoFrame:
        """The first frame at or after ``seconds`` (on the stream's timestamps), or the last one
        decoded within the bound; never one before the frame returned last.

        Raises:
            PermanentJobError: ``CORRUPT_INPUT`` when no frame comes out or FFmpeg cannot seek.
        """
        target = math.ceil(seconds / self._time_base - 1e-6)
        pts = _pts(self._frame) if self._frame is not None else None
        if self._frame is not None and (
            (pts is not None and pts >= target) or (self._ended and not self._pending)
        ):
            return self._frame  # a later time than the last one: the same frame still shows
        if self._packets is not None and self._forward(pts, target, seconds):
            frame = self._decode_to(target, seconds, 0)
        else:
            frame = self._seek_to(target, seconds)
        self._shown = frame
        return frame

    def seconds(self, frame: VideoFrame) -> float | None:
        """The frame's time on the stream's timestamps. Not ``frame.time``: PyAV leaves the
        frames of the decoder's final flush without a time base."""
        pts = _pts(frame)
        return None if pts is None else float(pts * self._time_base)

    def _forward(self, pts: int | None, target: int, seconds: float) -> bool:
        """Whether decoding on from the last frame (at ``pts``) is cheaper than seeking: the
        target is near, or the keyframe a seek would land on (from the demuxer's index, when it
        has one) is not after the last frame: seeking would decode again what was decoded."""
        if pts is None:
            return False
        if seconds - float(pts * self._time_base) <= SPRITE_SEEK_SECONDS:
            return True
        entries = self._stream.index_entries
        found = entries.search_timestamp(target, backward=True) if len(entries) else -1
        return found >= 0 and entries[found].timestamp <= pts

    def _seek_to(self, target: int, seconds: float) -> VideoFrame:
        """Seeks to the keyframe before ``target`` and decodes to it. When the first frame out is
        already past ``target``, the demuxer landed after the keyframe it should have found (the
        MPEG-TS demuxer seeks by timestamps and does not know where keyframes are; the decoder
        then waits for the next one): seeks again :data:`SPRITE_SEEK_SECONDS` further back, up to
        :data:`SPRITE_SEEK_RETRIES` times, each time with that much more stream to decode."""
        frame: VideoFrame | None = None
        for attempt in range(SPRITE_SEEK_RETRIES + 1):
            position = target - round(attempt * SPRITE_SEEK_SECONDS / self._time_base)
            self._seek(position)
            try:
                frame = self._decode_to(target, seconds, attempt * self._max_packets)
            except PermanentJobError:
                # Nothing decoded after the seek: it landed after the only keyframe in reach (a
                # short MPEG-TS file with one keyframe). Further back, and last from the start.
                if position < self._start:
                    break
                continue
            landed_late = self._first_pts is not None and self._first_pts > target
            # Before the stream's start a seek lands on its first packet: nothing earlier to find.
            # Not at the start itself: MPEG-TS bisects on decoding timestamps, which run behind.
            if not landed_late or position < self._start:
                return frame
        if frame is not None:
            return frame
        self._seek(self._start)
        return self._decode_to(target, seconds, SPRITE_SEEK_RETRIES * self._max_packets)

    def _seek(self, position: int) -> None:
        """Seeks to the keyframe at or before ``position``; the decoder starts afresh."""
        try:
            self._container.seek(position, backward=True, stream=self._stream)
        except MemoryError:  # av.error.MemoryError is one, and an FFmpegError
            raise
        except av.error.FFmpegError as exc:
            if position < self._start:  # AVI refuses a time before its start (EPERM)
                self._seek(self._start)
                return
            at = float(position * self._time_base)
            raise PermanentJobError(
                f"Video stream {self._stream.index} cannot be read from {at:.3f} s: the file is damaged.",
                "CORRUPT_INPUT",
            ) from exc
        self._packets = iter(self._container.demux(self._stream))
        self._pending.clear()
        self._frame = self._first_pts = None
        self._ended = False

    def _decode_to(self, target: int, seconds: float, extra_packets: int) -> VideoFrame:
        """Looks at frames until one is at or after ``target``: at most the bound plus
        ``extra_packets`` packets are sent to the decoder, then the last frame is taken."""
        assert self._packets is not None
        context = self._stream.codec_context
        bound = self._max_packets + extra_packets
        sent = 0
        while True:
            while self._pending:
                self._frame = self._pending.popleft()
                pts = _pts(self._frame)
                if self._first_pts is None:
                    self._first_pts = pts
                if pts is not None and pts >= target:
                    return self._frame
            if self._ended:
                break
            if sent >= bound and (self._frame is not None or sent >= bound + SPRITE_FIRST_FRAME_PACKETS):
                break
            sent += 1
            packet = self._next_packet()
            if packet is None or packet.size == 0:
                self._ended = True
                self._pending.extend(self._decode(None))
            elif not packet.is_corrupt:
                before = packet.pts is not None and packet.pts < target
                context.skip_frame = "NONREF" if before else "DEFAULT"
                self._pending.extend(self._decode(packet))
        if self._frame is not None:
            return self._frame
        if self._shown is not None:  # nothing decodes here (a file cut short): the last frame stays
            return self._shown
        raise PermanentJobError(
            f"No frame of video stream {self._stream.index} near {seconds:.3f} s can be decoded: "
            "the file is truncated or damaged.",
            "CORRUPT_INPUT",
        )

    def _next_packet(self) -> Packet | None:
        """The stream's next packet; None at the end, or when the demuxer fails (the file is cut
        off: what decoded before stands)."""
        assert self._packets is not None
        try:
            return next(self._packets, None)
        except MemoryError:  # av.error.MemoryError is one, and an FFmpegError
            raise
        except av.error.FFmpegError:
            return None

    def _decode(self, packet: Packet | None) -> list[VideoFrame]:
        """The frames the packet completes; none when the decoder rejects it (a damaged packet
        is skipped, as FFmpeg's command line does)."""
        try:
            frames = self._stream.codec_context.decode(packet)
        except MemoryError:  # av.error.MemoryError is one, and an FFmpegError
            raise
        except av.error.FFmpegError:
            return []
        for frame in frames:
            check_pixels(frame.width, frame.height)
        return frames


def _pts(frame: VideoFrame) -> int | None:
    """The frame's timestamp in its stream's time base: its ``pts``, else its packet's ``dts``
    (an AVI without presentation times), else None (never at or after a target)."""
    return frame.pts if frame.pts is not None else frame.dts


# --- thumbnails and the sheet --------------------------------------------------------------------


def _cell_size(
    frame: VideoFrame, stream: VideoStream, width: int, columns: int, rows: int
) -> tuple[int, int, bool]:
    """One thumbnail's width and height, and whether they were reduced to fit the sheet's limits
    (module doc, step 3)."""
    sar = stream.codec_context.sample_aspect_ratio or stream.sample_aspect_ratio
    display_width, display_height = display_size(frame.width, frame.height, sar, frame_orientation(frame))
    aspect = display_height / display_width
    wanted = max(1, min(width, round(display_width)))
    cell_width = wanted
    while cell_width > 1 and not _fits(cell_width, _even(cell_width * aspect), columns, rows):
        cell_width -= 1
    cell_height = _even(cell_width * aspect)
    if not _fits(cell_width, cell_height, columns, rows):  # an absurd aspect ratio: squeezed
        cell_height = max(2, (SPRITE_MAX_SIDE // rows) // 2 * 2)
    return cell_width, cell_height, cell_width < wanted


def _even(height: float) -> int:
    return max(2, 2 * round(height / 2))


def _fits(cell_width: int, cell_height: int, columns: int, rows: int) -> bool:
    width, height = columns * cell_width, rows * cell_height
    return width <= SPRITE_MAX_SIDE and height <= SPRITE_MAX_SIDE and width * height <= SPRITE_MAX_PIXELS


def _thumbnail(frame: VideoFrame, cell_width: int, cell_height: int) -> np.ndarray:
    """The frame as an upright ``cell_height`` × ``cell_width`` RGB array."""
    orientation = frame_orientation(frame)
    width, height = (cell_height, cell_width) if orientation.transpose else (cell_width, cell_height)
    small = frame.reformat(width=width, height=height, format="rgb24", interpolation="AREA")
    return orientation.upright(small.to_ndarray(format="rgb24"))


def _encode(sheet: np.ndarray) -> bytes:
    import pyvips  # here, not at import time: the module stays fork-safe and light

    height, width, bands = sheet.shape
    image = pyvips.Image.new_from_memory(sheet.data, width, height, bands, "uchar")
    image = image.copy(interpretation="srgb")
    optimize = width * height <= SPRITE_OPTIMIZE_MAX_PIXELS
    return bytes(image.jpegsave_buffer(Q=SPRITE_QUALITY, optimize_coding=optimize, keep="none"))


def _webvtt(duration: float, count: int, columns: int, cell_width: int, cell_height: int) -> str:
    """The index: one cue per thumbnail over its interval, the last ending at ``duration``; the
    boundaries rounded to milliseconds once, so that each cue ends where the next starts."""
    bounds = [round(duration * i / count * 1000) for i in range(count + 1)]
    lines = ["WEBVTT", ""]
    for i in range(count):
        x, y = (i % columns) * cell_width, (i // columns) * cell_height
        lines += [
            f"{_timestamp(bounds[i])} --> {_timestamp(bounds[i + 1])}",
            f"{SPRITE_OUTPUT}#xywh={x},{y},{cell_width},{cell_height}",
            "",
        ]
    return "\n".join(lines)


def _timestamp(milliseconds: int) -> str:
    seconds, millis = divmod(milliseconds, 1000)
    minutes, seconds = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours:02d}:{minutes:02d}:{seconds:02d}.{millis:03d}"
