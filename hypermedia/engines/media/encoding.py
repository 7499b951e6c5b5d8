"""One rendition of ``transcode_video`` being written (:mod:`hypermedia.engines.media.transcode`, step
3 and 4 of its module doc): the codecs a job may ask for (:data:`CODECS`), a planned rung
(:class:`Rendition`), and :class:`Output`, the rendition's container, video and audio encoders
and the FFmpeg filter graph that puts each decoded frame upright, scaled and 8-bit 4:2:0 into it
(:func:`fit_inside` for a frame whose size changed mid-stream). Failures on the writing side are
kept apart from the decoding side's (:class:`EncoderFailure`, :func:`encoder_error`).

Runs FFmpeg encoders: call it in the sandbox child only. Importing this module is fork-safe.
"""

from __future__ import annotations

import errno
import itertools
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, Final

import av
import av.error
import av.filter
from av.audio.stream import AudioStream
from av.container import OutputContainer
from av.video.frame import PictureType, VideoFrame
from av.video.stream import VideoStream

from hypermedia.core.errors import PermanentJobError
from hypermedia.engines.media.frames import display_size
from hypermedia.engines.media.orientation import Orientation

__all__ = [
    "AUDIO_LAYOUT",
    "AUDIO_RATE",
    "CODECS",
    "Codec",
    "Encoded",
    "EncoderFailure",
    "Output",
    "Rendition",
    "encoder_error",
    "even",
    "fit_inside",
    "writing",
]


AUDIO_RATE: Final = 48_000
AUDIO_LAYOUT: Final = "stereo"


@dataclass(frozen=True)
class Codec:
    """One ``codec`` param: its encoders, container and how quality is set."""

    video_encoder: str
    audio_encoder: str
    muxer: str
    extension: str
    mime_type: str
    mux_options: dict[str, str] = field(default_factory=dict)


CODECS: Final[dict[str, Codec]] = {
    "h264": Codec("libx264", "aac", "mp4", "mp4", "video/mp4", {"movflags": "+faststart"}),
    "vp9": Codec("libvpx-vp9", "libopus", "webm", "webm", "video/webm"),
    "av1": Codec("libsvtav1", "aac", "mp4", "mp4", "video/mp4", {"movflags": "+faststart"}),
}
"""``codec`` param → encoders and container."""


@dataclass(frozen=True)
class Rendition:
    """One rung of the ladder as planned: ``name`` is ``{short side}p``."""

    name: str
    width: int
    height: int


@dataclass(frozen=True)
class Encoded:
    """One finished rendition file: what describing it and packaging it as HLS need."""

    rendition: Rendition
    path: Path
    """The written file (``video_720p.mp4``) in the job's output directory."""
    frames: int
    """Video frames encoded."""
    extradata: bytes
    """The video encoder's global header (the H.264 SPS/PPS), for the HLS ``CODECS`` attribute."""
    has_audio: bool
    decode_errors: int
    """Packets of the source skipped because they did not decode."""
    resumed: bool = False
    """Taken from an earlier attempt's checkpoint rather than encoded by this one."""


def even(value: float) -> int:
    return max(2, 2 * round(value / 2))


# --- encoding ------------------------------------------------------------------------------------


class Output:
    """One rendition being written: its container, encoders and filter graph."""

    def __init__(
        self,
        rendition: Rendition,
        codec: Codec,
        options: dict[str, Any],
        path: Path,
        source: VideoStream,
        audio: AudioStream | None,
        threads: int,
        hls: bool,
        mux_options: dict[str, str] | None = None,
    ) -> None:
        self.rendition = rendition
        self.path = path
        self.frames = 0
        self.container: OutputContainer = av.open(
            str(path), mode="w", format=codec.muxer, options={**codec.mux_options, **(mux_options or {})}
        )
        rate = source.average_rate or source.guessed_rate or Fraction(25)
        if codec.video_encoder == "libsvtav1":
            os.environ["SVT_LOG"] = "1"  # errors only: SVT-AV1 prints its configuration to stderr
        video = self.container.add_stream(
            codec.video_encoder, rate=rate, options=_encoder_options(options, threads, rate, hls)
        )
        assert isinstance(video, VideoStream)
        self.video: VideoStream = video
        context = video.codec_context
        context.width, context.height = rendition.width, rendition.height
        context.pix_fmt = "yuv420p"
        context.time_base = source.time_base or Fraction(1, 90_000)
        context.thread_count = threads
        context.thread_type = "AUTO"  # type: ignore[assignment]  # frame threads, as FFmpeg's CLI
        video.time_base = context.time_base
        self.audio: AudioStream | None = None
        if audio is not None:
            sound = self.container.add_stream(codec.audio_encoder, rate=AUDIO_RATE)
            assert isinstance(sound, AudioStream)
            sound.layout = AUDIO_LAYOUT
            sound.bit_rate = options["audio_bitrate"] * 1000
            sound.codec_context.thread_count = 1
            self.audio = sound
        self.extradata = b""
        """The video encoder's global header (SPS/PPS), copied by :meth:`close`."""
        self.graph: av.filter.Graph | None = None
        self.graph_key: tuple[int, int, str | None, Fraction | None] | None = None
        context = source.codec_context
        self.planned = (context.width, context.height, _square(context.sample_aspect_ratio))
        """The coded size and sample aspect ratio the ladder was planned for: the stream's, as
        FFmpeg's probe found them (``hypermedia.engines.media.transcode._display_size``)."""

    def filter(self, frame: VideoFrame, orientation: Orientation, sar: Fraction | None) -> list[VideoFrame]:
        """``frame`` upright, scaled and 8-bit 4:2:0; the graph is rebuilt when the input's size,
        pixel format or sample aspect ratio ``sar`` (the decoder's, as of this frame: PyAV's
        frames carry none) changes mid-stream. A frame whose size or ``sar`` differs from the
        planned ones (a recording whose resolution changes, a broadcast switching between 4:3 and
        16:9) is fitted inside the rendition, display aspect kept, and centred on black
        (:func:`fit_inside`), never stretched to the rendition's shape."""
        sar = _square(sar)
        key = (frame.width, frame.height, frame.format.name, sar)
        if self.graph is None or key != self.graph_key:
            fit = None
            if (frame.width, frame.height, sar) != self.planned:
                fit = fit_inside(frame.width, frame.height, sar, orientation, self.rendition)
            self.graph, self.graph_key = _graph(frame, orientation, self.rendition, fit), key
        self.graph.push(frame)
        return _pull(self.graph)

    def encode_video(self, frame: VideoFrame | None) -> None:
        if frame is not None:
            # The decoder marks the source's keyframes; an encoder given an I frame makes it a
            # keyframe (libx264 does), which would put the source's GOPs, scene cuts included,
            # into every rendition and break the HLS segment grid. FFmpeg's CLI resets it too.
            frame.pict_type = PictureType.NONE
        with writing():
            for packet in self.video.encode(frame):
                self.container.mux(packet)
        if frame is not None:
            self.frames += 1

    def encode_audio(self, frame: Any) -> None:
        assert self.audio is not None
        with writing():
            for packet in self.audio.encode(frame):
                self.container.mux(packet)

    def close(self) -> None:
        """Flushes the encoders and closes the file. The streams belong to the container: what is
        needed of them later (the H.264 parameter sets) is copied first, never read after."""
        self.encode_video(None)
        if self.audio is not None:
            self.encode_audio(None)
        self.extradata = bytes(self.video.codec_context.extradata or b"")
        with writing():
            self.container.close()

    def encoded(self, decode_errors: int) -> Encoded:
        """What :meth:`close` finished, with the source's ``decode_errors``."""
        return Encoded(
            self.rendition, self.path, self.frames, self.extradata, self.audio is not None, decode_errors
        )


class EncoderFailure(Exception):
    """An FFmpeg error on the writing side (encoder or muxer), kept apart from the decoding
    side's: the input is not to blame for it."""


@contextmanager
def writing() -> Iterator[None]:
    """Turns an FFmpeg error on the writing side (an encoder or a muxer) into :class:`EncoderFailure`."""
    try:
        yield
    except MemoryError:
        raise
    except av.error.FFmpegError as exc:
        raise EncoderFailure(str(exc)) from exc


def encoder_error(failure: EncoderFailure) -> Exception:
    """What a failed encoder or muxer means for the job. An encoder that cannot open — libx264's
    ``x264_encoder_open`` fails with FFmpeg's "generic error in an external library" when it
    cannot start its threads under ``RLIMIT_NPROC`` — or runs out of threads or memory
    (``EAGAIN``, ``ENOMEM``) is ``RESOURCE_LIMIT``; anything else is a fault of ours (an
    internal error, not blamed on the input)."""
    cause = failure.__cause__
    if isinstance(cause, av.error.ExternalError) or getattr(cause, "errno", None) in (
        errno.EAGAIN,
        errno.ENOMEM,
    ):
        return PermanentJobError(
            "An encoder could not start or run within the job's thread and memory limits.", "RESOURCE_LIMIT"
        )
    return RuntimeError(f"encoding failed: {failure}")


def _encoder_options(options: dict[str, Any], threads: int, rate: Fraction, hls: bool) -> dict[str, str]:
    """AVOptions of the video encoder for the ``codec`` param (CRF, preset, threads, GOP)."""
    quality = str(options["quality"])
    codec = options["codec"]
    if codec == "h264":
        encoder = {"preset": options["preset"], "crf": quality}
        if hls:
            keyint = max(1, round(float(rate) * options["hls_segment_seconds"]))
            encoder["x264-params"] = f"keyint={keyint}:min-keyint={keyint}:scenecut=0:open-gop=0"
        return encoder
    if codec == "vp9":
        return {"crf": quality, "b": "0", "row-mt": "1", "deadline": "good", "cpu-used": "4"}
    return {"crf": quality, "preset": "8", "svtav1-params": f"lp={threads}"}


def _square(sar: Fraction | None) -> Fraction | None:
    """``sar``, or ``None`` for square or unknown pixels (FFmpeg's 0:1 and 1:1 alike)."""
    return sar if sar and sar != 1 else None


def fit_inside(
    width: int, height: int, sar: Fraction | None, orientation: Orientation, rendition: Rendition
) -> tuple[int, int]:
    """The even size, at most the rendition's, that a ``width`` × ``height`` frame (sample aspect
    ratio ``sar``, put upright by ``orientation``) scales to with its display aspect ratio kept: the
    picture of a frame whose size differs from the one the ladder was planned for."""
    display_width, display_height = display_size(width, height, sar, orientation)
    scale = min(rendition.width / display_width, rendition.height / display_height)
    return (
        min(rendition.width, even(display_width * scale)),
        min(rendition.height, even(display_height * scale)),
    )


def _graph(
    frame: VideoFrame, orientation: Orientation, rendition: Rendition, fit: tuple[int, int] | None = None
) -> av.filter.Graph:
    """buffer → upright (:meth:`~hypermedia.engines.media.orientation.Orientation.filters`) → scale to the rendition's size (the sample aspect ratio is in that
    size already: ``transcode._display_size``) → square pixels → 8-bit 4:2:0 → buffersink. With
    ``fit``, the scale is to that size and a black ``pad`` centres it in the rendition's."""
    graph = av.filter.Graph()
    graph.threads = 1  # else FFmpeg starts a pool of one thread per CPU of the node per graph
    chain = [
        graph.add_buffer(
            width=frame.width,
            height=frame.height,
            format=frame.format,
            time_base=frame.time_base or Fraction(1, 90_000),
        )
    ]
    chain += [graph.add(name, args) for name, args in orientation.filters()]
    if fit is None:
        chain.append(graph.add("scale", f"{rendition.width}:{rendition.height}:flags=bicubic"))
    else:
        x, y = (rendition.width - fit[0]) // 4 * 2, (rendition.height - fit[1]) // 4 * 2
        chain += [
            graph.add("scale", f"{fit[0]}:{fit[1]}:flags=bicubic"),
            graph.add("pad", f"{rendition.width}:{rendition.height}:{x}:{y}:black"),
        ]
    chain += [
        graph.add("setsar", "1"),
        graph.add("format", "yuv420p"),
        graph.add("buffersink"),
    ]
    for upstream, downstream in itertools.pairwise(chain):
        upstream.link_to(downstream)
    graph.configure()
    return graph


def _pull(graph: av.filter.Graph) -> list[VideoFrame]:
    frames: list[VideoFrame] = []
    while True:
        try:
            frame = graph.pull()
        except (av.error.BlockingIOError, av.error.EOFError):
            return frames
        assert isinstance(frame, VideoFrame)
        frames.append(frame)
