"""A pass over a video's frames into its renditions (:mod:`hypermedia.engines.media.transcode`,
step 3 of its module doc): :class:`Transcode`, the decode feeding every rendition's filter graph
and encoder, over the whole input or one chunk's window of it
(:mod:`hypermedia.engines.media.chunks`); :class:`Sound`, the source's audio as every rendition
gets it; :class:`Plan`, what every pass of one job shares; and the streams a transcode takes.

Runs FFmpeg on untrusted input: call it in the sandbox child only. Importing this module is
fork-safe.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, Final

import av
import av.error
from av.audio.stream import AudioStream
from av.container import InputContainer
from av.stream import Disposition
from av.video.frame import VideoFrame
from av.video.stream import VideoStream

from hypermedia.core.errors import PermanentJobError
from hypermedia.engines.contract import report_progress
from hypermedia.engines.media.audio import AudioConverter
from hypermedia.engines.media.decoding import DecodeErrors
from hypermedia.engines.media.encoding import (
    AUDIO_LAYOUT,
    AUDIO_RATE,
    CODECS,
    Encoded,
    EncoderFailure,
    Output,
    Rendition,
    encoder_error,
)
from hypermedia.engines.media.orientation import Orientation
from hypermedia.engines.media.sources import MediaLimits, audio_stream, check_duration, header_seconds

__all__ = ["MAX_PIXELS", "Plan", "Sound", "Transcode", "WindowUnreachable", "sound_stream", "video_stream"]

MAX_PIXELS: Final = 8192 * 4320
"""Largest coded frame transcoded (``INPUT_TOO_LARGE_PIXELS``): 8K UHD-2 (35.4 MP)."""


@dataclass(frozen=True)
class Plan:
    """What every pass over the input shares (:func:`prepare`)."""

    input_path: Path
    options: dict[str, Any]
    """The normalised params."""
    out_dir: Path
    limits: MediaLimits
    orientation: Orientation
    """The display matrix of the first frame, applied to every frame."""
    ladder: list[Rendition]
    """The renditions, highest first (:func:`plan_ladder`)."""
    frame_rate: Fraction | None
    """The video stream's average (else guessed) rate: the HLS master's ``FRAME-RATE``."""
    seconds: float | None
    """The header's duration, else the packets' span; ``None`` when neither is known."""


def video_stream(container: InputContainer) -> VideoStream:
    """The video stream to transcode: the first that is not cover art.

    Raises:
        PermanentJobError: ``NO_VIDEO_STREAM``.
    """
    for stream in container.streams.video:
        if stream.codec_context is not None and not stream.disposition & Disposition.attached_pic:
            return stream
    raise PermanentJobError("The input has no video stream to transcode.", "NO_VIDEO_STREAM")


def sound_stream(container: InputContainer) -> AudioStream | None:
    """The audio stream to encode; ``None`` for a silent video (an undecodable one still fails)."""
    try:
        return audio_stream(container, "")
    except PermanentJobError as exc:
        if exc.error_code == "NO_AUDIO_STREAM":
            return None
        raise


class Transcode:
    """One pass over the input feeding every rendition (module doc, step 3)."""

    def __init__(
        self,
        container: InputContainer,
        options: dict[str, Any],
        out_dir: Path,
        limits: MediaLimits,
        orientation: Orientation,
        ladder: list[Rendition],
        progress: tuple[float, float] = (0.0, 1.0),
        window: tuple[int | None, int | None] | None = None,
        names: str = "video_{rung}",
    ) -> None:
        self.container = container
        self.options = options
        self.out_dir = out_dir
        self.limits = limits
        self.orientation = orientation
        self.codec = CODECS[options["codec"]]
        self.video = video_stream(container)
        self.window = window
        """A chunk's frames only (:mod:`hypermedia.engines.media.chunks`): from the source's
        keyframe at the first presentation timestamp (in the video stream's time base), up to
        before the second (``None``: to the end); no sound (the join encodes it once)."""
        self.audio = sound_stream(container) if window is None else None
        context = self.video.codec_context
        context.thread_count = max(1, limits.threads)
        context.thread_type = "FRAME"  # type: ignore[assignment]  # PyAV takes the flag's name
        self.ladder = ladder
        self.progress = progress
        """Where this pass's progress starts, and its share of the job's (a pass per rendition)."""
        self.duration = header_seconds(container)
        start = container.start_time
        self.origin = start / av.time_base if start is not None else 0.0
        self.progress_from = 0.0
        """Where progress starts on the written timeline, in seconds (a chunk's start)."""
        if window is not None and self.video.time_base:
            first, end = (
                float(t * self.video.time_base) - self.origin if t is not None else None for t in window
            )
            self.progress_from = first or 0.0
            end = end if end is not None else self.duration
            self.duration = end - self.progress_from if end is not None else None
        self.last_video_pts: int | None = None
        self.errors = DecodeErrors(None if window is None else self._of_window)
        """Packets skipped because they did not decode (and a demuxer that gave up early)."""
        self.sound = (
            Sound(self.audio, self.origin, limits, self._encode_audio) if self.audio is not None else None
        )
        # The file keeps the source's timestamps exactly: the video track and the movie in the
        # source's time scale, or MP4 rounds the edit list that starts a video later than its
        # sound (and a chunk: chunks.py) to whole milliseconds, moving every frame by up to 1 ms.
        scale = str(self.video.time_base.denominator) if self.video.time_base else None
        exact = {"movie_timescale": scale, "video_track_timescale": scale} if scale else {}
        self.outputs_: list[Output] = [
            Output(
                rendition,
                self.codec,
                options,
                out_dir / f"{names.format(rung=rendition.name)}.{self.codec.extension}",
                self.video,
                self.audio,
                max(1, limits.threads),
                options["hls"],
                exact,
            )
            for rendition in self.ladder
        ]

    def encode(self) -> None:
        """Demuxes and decodes the whole input into every rendition. A packet that does not
        decode is skipped and counted (:attr:`errors`: :class:`hypermedia.engines.media.decoding.DecodeErrors`,
        whose bound fails a stream that mostly does not decode), as FFmpeg's command line goes on
        past a damaged packet; a demuxer that cannot go on ends the input there. A packet the
        demuxer flags corrupt is decoded all the same, as FFmpeg's command line does unless
        told ``-fflags discardcorrupt``: MPEG-TS flags the first packet after a continuity-counter
        jump, which every ``cat a.ts b.ts`` join has, and its frame is usually whole.

        With a window (a chunk), the bound on decode errors and the failure of a chunk without
        a frame are left to the caller, which judges the chunks together as one pass judges the
        whole (:mod:`hypermedia.engines.media.chunk_parts`).

        Raises:
            PermanentJobError: ``CORRUPT_INPUT`` when no video frame decodes at all or a stream
                mostly does not decode, and see :func:`hypermedia.engines.media.transcode.run`.
            WindowUnreachable: a chunk's seek landed more than the chunk's own length before it.
        """
        streams: list[Any] = [self.video] + ([self.audio] if self.audio is not None else [])
        if self.window is not None and self.window[0] is not None:
            self.container.seek(self.window[0], stream=self.video, backward=True, any_frame=False)
        try:
            for frame in self.errors.decode(self.container, streams):
                if isinstance(frame, VideoFrame):
                    if not self._in_window(frame):
                        if self._past_window(frame):
                            break  # the next chunk's first frame: presentation order goes on from it
                        self._before_window(frame)
                        continue
                    self._video_frame(frame)
                elif self.sound is not None:
                    self.sound.push(frame)
            if self.sound is not None:
                self.sound.push(None)
        except MemoryError:  # av.error.MemoryError is one, and an FFmpegError: not CORRUPT_INPUT
            raise
        except EncoderFailure as failure:
            raise encoder_error(failure) from failure.__cause__
        except av.error.FFmpegError as exc:  # a filter graph: what was encoded before stands
            if self.outputs_[0].frames == 0 and self.window is None:
                raise PermanentJobError(
                    "The video cannot be decoded: the file is truncated or damaged.", "CORRUPT_INPUT"
                ) from exc
            self.errors.ended_early = True
        if self.window is None:
            self.errors.check()
            if self.outputs_[0].frames == 0:
                raise PermanentJobError("No frame of the video can be decoded.", "CORRUPT_INPUT")
        try:
            for output in self.outputs_:
                output.close()
        except EncoderFailure as failure:
            raise encoder_error(failure) from failure.__cause__
        report_progress(self.out_dir, sum(self.progress))

    def _of_window(self, packet: Any) -> bool:
        """Whether a packet is presented within this pass's window (one without a timestamp is)."""
        assert self.window is not None
        first, end = self.window
        if packet.pts is None or packet.stream.index != self.video.index:
            return True
        return (first is None or packet.pts >= first) and (end is None or packet.pts < end)

    def _in_window(self, frame: VideoFrame) -> bool:
        """Whether ``frame`` is of this pass's chunk (every frame, without a window). A chunk's
        frames need a timestamp: :func:`hypermedia.engines.media.chunks.plan_chunks` fans out
        only a video whose every packet has one."""
        if self.window is None:
            return True
        first, end = self.window
        return (
            frame.pts is not None
            and (first is None or frame.pts >= first)
            and (end is None or frame.pts < end)
        )

    def _before_window(self, frame: VideoFrame) -> None:
        """A frame decoded before the chunk's window: the seek landed on an earlier keyframe than
        the chunk's own (an index listing few keyframes, Matroska cues pointing elsewhere). Up to
        the chunk's length is decoded to reach it; more would make the chunks cost a multiple of
        one pass (WindowUnreachable: the transcode is then made in one pass)."""
        first, end = self.window if self.window is not None else (None, None)
        if first is None or frame.pts is None or not self.video.time_base:
            return
        length = (end - first) if end is not None else round((self.duration or 0.0) / self.video.time_base)
        if first - frame.pts > max(length, round(1 / self.video.time_base)):
            raise WindowUnreachable(f"the seek to {first} landed at {frame.pts}")

    def _past_window(self, frame: VideoFrame) -> bool:
        end = self.window[1] if self.window is not None else None
        return end is not None and frame.pts is not None and frame.pts >= end

    def _video_frame(self, frame: VideoFrame) -> None:
        time_base = self.video.time_base
        shift = round(self.origin / time_base) if time_base else 0
        if (
            frame.pts is not None
            and self.last_video_pts is not None
            and frame.pts - shift <= self.last_video_pts
        ):
            # Presentation timestamps out of order (H.264 with B-frames in AVI carries decode
            # order): the decode timestamp, when it goes on, as FFmpeg's best-effort timestamp.
            if frame.dts is not None and frame.dts - shift > self.last_video_pts:
                frame.pts = frame.dts
        if frame.pts is None:
            # No timestamp (some raw streams): the previous one plus a frame at the nominal rate.
            rate = self.video.average_rate or Fraction(25)
            step = max(1, round(1 / (rate * time_base))) if time_base else 1
            frame.pts = (self.last_video_pts if self.last_video_pts is not None else -step) + step
        else:
            frame.pts -= shift
        if frame.pts < 0 or (self.last_video_pts is not None and frame.pts <= self.last_video_pts):
            return  # before the file's start, or a repeated timestamp: the muxer would refuse it
        self.last_video_pts = frame.pts
        if frame.width * frame.height > MAX_PIXELS:
            raise PermanentJobError(
                f"A frame is {frame.width}×{frame.height} pixels; at most {MAX_PIXELS} pixels are accepted.",
                "INPUT_TOO_LARGE_PIXELS",
            )
        seconds = float(frame.pts * time_base) if time_base else 0.0
        check_duration(seconds, self.limits)
        sar = self.video.codec_context.sample_aspect_ratio
        for output in self.outputs_:
            for filtered in output.filter(frame, self.orientation, sar):
                output.encode_video(filtered)
        if self.duration:
            start, share = self.progress
            done = max(0.0, seconds - self.progress_from) / self.duration
            report_progress(self.out_dir, start + share * 0.98 * min(1.0, done))

    def _encode_audio(self, frame: Any) -> None:
        for output in self.outputs_:
            output.encode_audio(frame)

    def encoded(self) -> list[Encoded]:
        """The renditions :meth:`encode` finished, in the ladder's order."""
        return [output.encoded(self.errors.count) for output in self.outputs_]


class WindowUnreachable(Exception):
    """A chunk's window cannot be reached for its share of the work (:meth:`Transcode._before_window`)."""


class Sound:
    """The source's audio as every rendition gets it (module doc, step 3): converted to stereo
    48 kHz float (:class:`hypermedia.engines.media.audio.AudioConverter`: a layout or rate change
    mid-stream rebuilds its graph; NaN and infinite samples are zeroed) and stamped by a sample
    count from where the first audio frame starts (``origin``, in seconds, is the file's start),
    so timestamps that go back or jump do not reach the muxer. Each converted frame goes to
    ``sink``."""

    def __init__(self, stream: AudioStream, origin: float, limits: MediaLimits, sink: Callable[[Any], None]):
        self.stream = stream
        self.origin = origin
        self.limits = limits
        self.sink = sink
        self.converter = AudioConverter("fltp", AUDIO_LAYOUT, 0.0)
        self.samples: int | None = None
        """Samples per channel written so far at 48 kHz, from the first audio frame's start."""

    def push(self, frame: Any) -> None:
        """One decoded frame of :attr:`stream`; ``None`` flushes the converter at the end."""
        if frame is not None and self.samples is None:
            start = 0.0
            if frame.pts is not None and self.stream.time_base:
                start = max(0.0, float(frame.pts * self.stream.time_base) - self.origin)
            self.samples = round(start * AUDIO_RATE)
        for converted in self.converter.convert(frame):
            assert self.samples is not None
            converted.pts, converted.time_base = self.samples, Fraction(1, AUDIO_RATE)
            self.samples += converted.samples
            check_duration(self.samples / AUDIO_RATE, self.limits)
            self.sink(converted)
