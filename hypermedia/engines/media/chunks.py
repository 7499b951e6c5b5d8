"""A long ``transcode_video`` in chunks (issue 23, items 1 and 2; ADR 0080): the video cut at its
own keyframes into chunks, each chunk's frames encoded into every rendition apart from the
others, then joined into the renditions one pass would have written, without a second encode.

1. **Plan** (:func:`plan_chunks`): the video stream's packets are demuxed (nothing decoded) and a
   chunk starts at the first clean keyframe at least ``chunk_seconds`` after the previous chunk's
   start; a last chunk shorter than half of that joins the one before. A clean keyframe is one
   decoding can start from, read in the packet (an H.264 IDR or an HEVC IRAP picture): FFmpeg
   flags recovery points as keyframes too (:func:`_clean_start`), so only H.264 and HEVC sources
   are cut. With HLS, a chunk starts on the segment grid (a multiple of ``hls_segment_seconds``
   from the first frame, within half a frame) when a clean keyframe there comes within twice
   ``chunk_seconds``, so that every segment keeps its length. Only a file whose timestamps can be
   trusted is cut: an MP4/MOV or Matroska/WebM whose every video packet has a presentation
   timestamp (Matroska keeps no decode timestamps), whose first packet is a clean keyframe and
   whose keyframes go forward. Anything else (an AVI carrying decode order, a stream that starts
   mid-GOP, a VP9 source) gets no plan and is transcoded without chunks.
2. **Chunks** (:func:`encode_chunk`): each chunk is a :class:`~hypermedia.engines.media.passes.Transcode`
   pass with a window: a seek to the chunk's keyframe, the frames presented from it up to before
   the next chunk's keyframe (the pictures that follow a keyframe in decoding order but are shown
   before it belong to the chunk before, which decodes them), the same filters and encoder
   settings as one pass, and the same timeline (the source's timestamps and time scale, shifted
   so the file starts at 0). No sound: it is encoded once, in the join. Every chunk of one
   rendition starts with an IDR picture and libx264 writes the same parameter sets for the same
   settings and size, so the chunks' packets follow each other as one stream's.
3. **Join** (:func:`join`): per rendition, the chunks' packets are copied in order into one MP4
   (fast start; decode times that crowd the chunk before are moved up, presentation times kept:
   :meth:`_Joined._copy_until`), and the source's sound is decoded once, converted and stamped as
   in one pass (:class:`~hypermedia.engines.media.passes.Sound`) and encoded into every
   rendition, interleaved with the video by time. The chunks are files another process wrote
   from a hostile input, so nothing in them is trusted (:func:`check_chunk`): a chunk must be an
   MP4 of exactly one H.264 stream of the rendition's size with the parameter sets and time base
   of a chunk this attempt encoded, start with a keyframe at its chunk's start, hold no frame of
   the next chunk, and have rising decode times; otherwise :class:`ChunkRefused` names the chunk,
   to be encoded again (a chunk of this attempt refused: the file is made without chunks,
   :mod:`hypermedia.engines.media.chunk_parts`). HLS is packaged from the joined files as after
   one pass.

What it keeps: the same frames, frame times, sound samples and sizes as one pass; with HLS,
segments align across renditions (every rendition's keyframes are at the same chunk starts); a
chunk that could not start on the segment grid makes one segment shorter and the next longer.
Not the same bytes: x264's rate control restarts at each chunk, and with frame threads it never
writes the same bytes twice (ADR 0050 addendum). H.264 output only for now (VP9's and AV1's
joins are not verified): :func:`plan_chunks` returns no plan for the other codecs.

Runs FFmpeg on untrusted input: call it in the sandbox child only. Importing this module is
fork-safe.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, Final

import av
import av.error
from av.container import InputContainer, OutputContainer
from av.packet import Packet

from hypermedia.engines.media.decoding import DecodeErrors
from hypermedia.engines.media.encoding import (
    AUDIO_LAYOUT,
    AUDIO_RATE,
    CODECS,
    Encoded,
    EncoderFailure,
    Rendition,
    encoder_error,
    writing,
)
from hypermedia.engines.media.passes import Plan, Sound, Transcode, sound_stream, video_stream
from hypermedia.engines.media.sources import open_media

__all__ = [
    "CHUNK_FORMATS",
    "CheckedChunk",
    "Chunk",
    "ChunkRefused",
    "check_chunk",
    "chunk_name",
    "chunk_windows",
    "encode_chunk",
    "join",
    "plan_chunks",
]

CHUNK_FORMATS: Final = ("mov,mp4,m4a,3gp,3g2,mj2", "matroska,webm")
"""Demuxers (FFmpeg's names) of the files cut into chunks: their timestamps are the frames'."""
CHUNK_OPEN_OPTIONS: Final = {"protocol_whitelist": "file", "format_whitelist": "mov,mp4,m4a,3gp,3g2,mj2"}
"""A chunk is read as the MP4 :func:`encode_chunk` writes, and as nothing else."""


@dataclass(frozen=True)
class Chunk:
    """One chunk of the source's video: the frames presented from the keyframe at ``first_pts``
    up to before ``end_pts`` (the next chunk's keyframe), in the video stream's time base; the
    first chunk has no ``first_pts`` (from the start), the last no ``end_pts`` (to the end).
    ``start_seconds`` is ``first_pts`` on the source's timeline (0 for the first)."""

    index: int
    first_pts: int | None
    end_pts: int | None
    start_seconds: float

    def as_json(self) -> dict[str, Any]:
        """The chunk as a child job's params carry it."""
        return {
            "index": self.index,
            "first_pts": self.first_pts,
            "end_pts": self.end_pts,
            "start_seconds": self.start_seconds,
        }


class ChunkRefused(Exception):
    """A chunk file is not what :func:`encode_chunk` writes for its place (:func:`check_chunk`):
    encode that chunk again. ``index`` is the chunk's."""

    def __init__(self, index: int, reason: str) -> None:
        super().__init__(f"chunk {index}: {reason}")
        self.index = index
        self.reason = reason


def chunk_name(index: int, rung: str) -> str:
    """A chunk file's stem: ``chunk_0003_720p``."""
    return f"chunk_{index:04d}_{rung}"


def plan_chunks(plan: Plan, chunk_seconds: float) -> list[Chunk]:
    """The chunks of the planned transcode (module doc, step 1); at most one (no fan-out) for a
    codec other than H.264, a file whose timestamps cannot be trusted, or a video shorter than
    two chunks. Demuxes at most ``plan.limits.max_probe_packets`` packets (none over it: one
    chunk).

    Raises:
        PermanentJobError: ``UNSUPPORTED_FORMAT``, ``CORRUPT_INPUT`` (from opening the file).
    """
    whole = [Chunk(0, None, None, 0.0)]
    if plan.options["codec"] != "h264" or chunk_seconds <= 0:
        return whole
    with open_media(plan.input_path) as container:
        if container.format.name not in CHUNK_FORMATS:
            return whole
        video = video_stream(container)
        if not video.time_base:
            return whole
        start = container.start_time
        starts_cleanly = _clean_start(video)
        if starts_cleanly is None:
            return whole
        keyframes, end = _keyframes(container, video, plan.limits.max_probe_packets, starts_cleanly)
    if len(keyframes) < 2:
        return whole
    step = round(chunk_seconds / video.time_base)
    segment = plan.options["hls_segment_seconds"]
    grid = round(segment / video.time_base) if plan.options["hls"] else None
    slack = round(1 / (2 * (plan.frame_rate or 25) * video.time_base))  # half a frame
    starts = [keyframes[0]]
    for pts in keyframes[1:]:
        since = pts - starts[-1]
        if grid is not None and since < 2 * step:
            offset = (pts - keyframes[0]) % grid
            if min(offset, grid - offset) > slack:
                continue  # off the HLS segment grid: a later keyframe may be on it
        if since >= step:
            starts.append(pts)
    if len(starts) > 1 and end - starts[-1] < step // 2:
        del starts[-1]  # a short tail is not worth a job
    origin = start / av.time_base if start is not None else 0.0
    chunks = []
    for n, first in enumerate(starts):
        following = starts[n + 1] if n + 1 < len(starts) else None
        seconds = max(0.0, float(first * video.time_base) - origin) if n else 0.0
        chunks.append(Chunk(n, first if n else None, following, round(seconds, 6)))
    return chunks


def _clean_start(video: Any) -> Callable[[bytes], bool] | None:
    """For an H.264 or HEVC stream stored with length-prefixed NAL units (``avcC``/``hvcC``: MP4
    and Matroska), a test of whether a packet holds a picture decoding can start from: an IDR
    picture (H.264 NAL type 5), an IRAP picture (HEVC types 16–21: BLA, IDR, CRA; a CRA's
    leading pictures belong to the chunk before, which decodes them). A keyframe flag is not
    proof of one: FFmpeg flags recovery points (x264's periodic intra refresh, a recovery-point
    SEI) as keyframes, and decoding from such a frame gives other pictures, or none until the
    recovery is complete. ``None`` for other codecs and forms: no chunks."""
    extradata = bytes(video.codec_context.extradata or b"")
    name = video.codec_context.name
    if name == "h264" and len(extradata) > 4 and extradata[0] == 1:
        size, starts = (extradata[4] & 3) + 1, lambda header: header & 0x1F == 5
    elif name == "hevc" and len(extradata) > 21 and extradata[0] == 1:
        size, starts = (extradata[21] & 3) + 1, lambda header: 16 <= (header >> 1) & 0x3F <= 21
    else:
        return None

    def clean(data: bytes) -> bool:
        at = 0
        while at + size < len(data):
            length = int.from_bytes(data[at : at + size], "big")
            if starts(data[at + size]):
                return True
            at += size + length
        return False

    return clean


def _keyframes(
    container: InputContainer, video: Any, max_packets: int, clean: Callable[[bytes], bool]
) -> tuple[list[int], int]:
    """The presentation timestamps of the video's keyframes that ``clean`` takes for a clean
    start (:func:`_clean_start`), in decoding order, and the end of the last frame (in the
    stream's time base); no keyframes when the timestamps cannot be trusted (module doc, step 1:
    also a packet decoded before a clean keyframe but shown at or after it, which one pass drops
    and a chunk would keep) or there are more than ``max_packets``."""
    keyframes: list[int] = []
    end = latest = 0
    packets = 0
    try:
        for packet in container.demux(video):
            if packet.size == 0:
                continue
            packets += 1
            if packets > max_packets or packet.pts is None or (packets == 1 and not clean(bytes(packet))):
                return [], 0
            if packet.is_keyframe and clean(bytes(packet)):
                if packets > 1 and packet.pts <= latest:
                    return [], 0  # a packet decoded before it is shown at or after it
                keyframes.append(packet.pts)
            latest = packet.pts if packets == 1 else max(latest, packet.pts)
            end = max(end, packet.pts + (packet.duration or 0))
    except MemoryError:
        raise
    except av.error.FFmpegError:
        return [], 0  # a damaged file: one pass decodes what it can
    return keyframes, end


def encode_chunk(plan: Plan, chunk: Chunk, progress: tuple[float, float] = (0.0, 1.0)) -> list[Encoded]:
    """Encodes one chunk into every rendition of ``plan.ladder`` (module doc, step 2), as MP4
    files ``chunk_0003_720p.mp4`` in ``plan.out_dir``, highest first; video only. Progress is
    reported from ``progress[0]`` over a share of ``progress[1]``.

    Raises:
        PermanentJobError: ``CORRUPT_INPUT``, ``MEDIA_TOO_LONG``, ``RESOURCE_LIMIT``, and as
            :meth:`~hypermedia.engines.media.passes.Transcode.encode`.
        MemoryError: FFmpeg or an encoder hit the sandbox's memory limit.
    """
    with open_media(plan.input_path) as container:
        job = Transcode(
            container,
            plan.options,
            plan.out_dir,
            plan.limits,
            plan.orientation,
            plan.ladder,
            progress,
            window=(chunk.first_pts, chunk.end_pts),
            names=chunk_name(chunk.index, "{rung}"),
        )
        job.encode()
    return job.encoded()


@dataclass(frozen=True)
class CheckedChunk:
    """What :func:`check_chunk` read of a chunk file."""

    extradata: bytes
    """Its H.264 parameter sets."""
    time_base: Fraction | None
    """Its video track's time base."""
    frames: int
    """Its video packets."""


def check_chunk(
    path: Path,
    index: int,
    rendition: Rendition,
    extradata: bytes | None,
    window: tuple[float | None, float | None],
    slack: float,
) -> CheckedChunk:
    """Checks a chunk file (module doc, step 3) without decoding it: an MP4 of exactly one H.264
    stream of ``rendition``'s size whose parameter sets are ``extradata`` (``None``: any, the
    chunk's own are returned), every packet stamped, decode times increasing, the first
    packet a keyframe presented at the window's start and none at or past its end (``window``:
    the chunk's and the next chunk's :attr:`Chunk.start_seconds`, ``None`` for none), each
    within ``slack`` seconds (half a frame: the muxer rounds).

    Raises:
        ChunkRefused: anything else (the reason says what).
    """
    first, end = window
    try:
        with av.open(str(path), options=dict(CHUNK_OPEN_OPTIONS)) as container:
            streams = container.streams
            if container.format.name != CHUNK_FORMATS[0] or len(streams) != 1 or len(streams.video) != 1:
                raise ChunkRefused(index, "not an MP4 of one video stream")
            context = streams.video[0].codec_context
            if context.name != "h264" or (context.width, context.height) != (
                rendition.width,
                rendition.height,
            ):
                raise ChunkRefused(index, f"not H.264 at {rendition.width}×{rendition.height}")
            own, time_base = bytes(context.extradata or b""), streams.video[0].time_base
            if not own or (extradata is not None and own != extradata):
                raise ChunkRefused(index, "its parameter sets differ from the other chunks'")
            frames, last_decoded = 0, 0.0
            for packet in container.demux(streams.video[0]):
                if packet.size == 0:
                    continue
                if packet.pts is None or packet.dts is None or packet.time_base is None:
                    raise ChunkRefused(index, "a packet without timestamps")
                shown, decoded = float(packet.pts * packet.time_base), float(packet.dts * packet.time_base)
                if frames == 0:
                    if not packet.is_keyframe or (first is not None and abs(shown - first) > slack):
                        raise ChunkRefused(index, "it does not start with a keyframe at its chunk's start")
                elif decoded <= last_decoded:
                    raise ChunkRefused(index, "its decode times do not increase")
                if end is not None and shown >= end - slack:
                    raise ChunkRefused(index, "it has frames of the next chunk")
                frames, last_decoded = frames + 1, decoded
    except ChunkRefused:
        raise
    except MemoryError:
        raise
    except (av.error.FFmpegError, OSError) as exc:
        raise ChunkRefused(index, f"unreadable ({exc})") from exc
    if frames == 0:
        raise ChunkRefused(index, "no frame")
    return CheckedChunk(own, time_base, frames)


def chunk_windows(plan: Plan, planned: list[Chunk]) -> tuple[list[tuple[float | None, float | None]], float]:
    """Each planned chunk's window as :func:`check_chunk` takes it (its start and the next
    chunk's, in seconds; ``None`` for none), and the slack: half a frame at the video's rate."""
    starts: list[float | None] = [c.start_seconds if c.index else None for c in planned] + [None]
    return [(starts[n], starts[n + 1]) for n in range(len(planned))], 1 / (2 * float(plan.frame_rate or 25))


def join(
    plan: Plan,
    planned: list[Chunk],
    chunk_files: dict[str, list[Path]],
    decode_errors: int,
    trusted: set[int] | None = None,
) -> list[Encoded]:
    """Joins every rendition's chunks, in order, into ``video_{rung}.mp4`` in ``plan.out_dir``
    with the source's sound (module doc, step 3). ``planned`` is :func:`plan_chunks`'s plan,
    ``chunk_files`` maps each rendition's name to its chunk files in the plan's order,
    ``decode_errors`` is the chunks' sum. ``trusted`` are the chunks this attempt encoded (all,
    when ``None``): every chunk must have the parameter sets and time base of the first of them,
    whose stream is the joined one's template, and when two chunks' decode times do not follow,
    the one refused is the untrusted one (a kept chunk of an earlier attempt is not trusted).

    Returns:
        The finished renditions, highest first, as one pass returns them.

    Raises:
        ChunkRefused: a chunk file is not what :func:`encode_chunk` writes for its place
            (:func:`check_chunk`), or the decode times do not increase from one chunk to the next.
        PermanentJobError: ``CORRUPT_INPUT`` (the sound), ``MEDIA_TOO_LONG``, ``RESOURCE_LIMIT``.
        MemoryError: FFmpeg or an encoder hit the sandbox's memory limit.
    """
    codec = CODECS[plan.options["codec"]]
    windows, slack = chunk_windows(plan, planned)
    trusted = set(range(len(planned))) if trusted is None else trusted
    reference = min(trusted)
    joins = []
    try:
        with open_media(plan.input_path) as source:
            audio = sound_stream(source)
            for rendition in plan.ladder:
                files = chunk_files.get(rendition.name, [])
                if len(files) != len(planned):
                    raise ChunkRefused(min(len(files), len(planned) - 1), "chunks missing or too many")
                model = check_chunk(files[reference], reference, rendition, None, windows[reference], slack)
                for n, path in enumerate(files):
                    checked = check_chunk(path, n, rendition, model.extradata, windows[n], slack)
                    if checked.time_base != model.time_base:
                        raise ChunkRefused(n, "its time base differs from the other chunks'")
                dest = plan.out_dir / f"video_{rendition.name}.{codec.extension}"
                joins.append(
                    _Joined(rendition, files, trusted, dest, model.extradata, audio is not None, plan.options)
                )
            if audio is not None:
                start = source.start_time
                origin = start / av.time_base if start is not None else 0.0

                def sink(frame: Any) -> None:
                    for joined in joins:
                        joined.audio(frame)

                sound = Sound(audio, origin, plan.limits, sink)
                errors = DecodeErrors()
                for frame in errors.decode(source, [audio]):
                    sound.push(frame)
                sound.push(None)
                errors.check()
                decode_errors += errors.count
        for joined in joins:
            joined.close()
    except EncoderFailure as failure:
        raise encoder_error(failure) from failure.__cause__
    finally:
        for joined in joins:
            joined.abort()
    return [j.encoded(decode_errors) for j in joins]


class _Joined:
    """One rendition being joined: its chunks' packets copied in order, the sound encoded in."""

    def __init__(
        self,
        rendition: Rendition,
        files: list[Path],
        trusted: set[int],
        dest: Path,
        extradata: bytes,
        sound: bool,
        options: dict,
    ) -> None:
        self.rendition = rendition
        self.dest = dest
        self.extradata = extradata
        self.frames = 0
        codec = CODECS[options["codec"]]
        self.trusted = trusted
        with av.open(str(files[min(trusted)]), options=dict(CHUNK_OPEN_OPTIONS)) as model:
            template = model.streams.video[0]
            # The movie's time scale is the video track's, as the pass writes its files
            # (passes.py): at MP4's default of 1000 the edit list that starts the video after
            # the sound is cut to whole milliseconds, moving every frame by up to 1 ms.
            scale = template.time_base.denominator if template.time_base else 1000
            self.container: OutputContainer | None = av.open(
                str(dest),
                mode="w",
                format=codec.muxer,
                options={**codec.mux_options, "movie_timescale": str(scale)},
            )
            self.video = self.container.add_stream_from_template(template)
        self.packets = self._packets(files)
        self.pending: tuple[int, Packet] | None = None
        self.last_dts: int | None = None
        self.audio_stream: Any = None
        self.sound_muxed = False
        if sound:
            self.audio_stream = self.container.add_stream(codec.audio_encoder, rate=AUDIO_RATE)
            self.audio_stream.layout = AUDIO_LAYOUT
            self.audio_stream.bit_rate = options["audio_bitrate"] * 1000
            self.audio_stream.codec_context.thread_count = 1

    def _packets(self, files: list[Path]) -> Generator[tuple[int, Packet], None, None]:
        """The chunks' packets in order, each with its chunk's index (checked by :func:`check_chunk`)."""
        for n, path in enumerate(files):
            with av.open(str(path), options=dict(CHUNK_OPEN_OPTIONS)) as chunk:
                for packet in chunk.demux(chunk.streams.video[0]):
                    if packet.size:
                        yield n, packet

    def _copy_until(self, seconds: float | None) -> None:
        """Copies the video packets whose decode time is before ``seconds`` (all: ``None``).

        x264 starts a chunk's decode times before its first frame by the span of its first few
        frames, and the chunk before ends its decode times a few of its own frames before its
        last; where the frame rate drops at a chunk's start (a phone in low light) or frames
        are missing there (damaged packets), the first decode times of a chunk fall at or before
        the last of the chunk before. They are moved up to one tick after it, as long as each
        stays at or before its presentation time (a decode time stamps only the order of
        decoding; when a frame is shown is its presentation time, kept); otherwise the chunk is
        refused (:class:`ChunkRefused`: the untrusted one of the two)."""
        assert self.container is not None
        while True:
            if self.pending is None:
                self.pending = next(self.packets, None)
                if self.pending is None:
                    return
            index, packet = self.pending
            assert packet.dts is not None and packet.pts is not None and packet.time_base is not None
            if seconds is not None and float(packet.dts * packet.time_base) >= seconds:
                return
            if self.last_dts is not None and packet.dts <= self.last_dts:
                if self.last_dts + 1 > packet.pts:
                    blamed = index if index not in self.trusted or index - 1 in self.trusted else index - 1
                    raise ChunkRefused(blamed, "its decode times cannot follow the chunk before's")
                packet.dts = self.last_dts + 1
            self.last_dts = packet.dts
            packet.stream = self.video
            with writing():
                self.container.mux(packet)
            self.frames += 1
            self.pending = None

    def audio(self, frame: Any) -> None:
        """Encodes one converted, stamped sound frame, then copies the video before it. No video
        goes before the first sound packet, as in one pass, where the video encoder's delay
        lets the sound's first packet reach the muxer first."""
        assert self.container is not None
        with writing():
            for packet in self.audio_stream.encode(frame):
                self.container.mux(packet)
                self.sound_muxed = True
        if self.sound_muxed:
            self._copy_until(frame.pts / AUDIO_RATE)

    def close(self) -> None:
        assert self.container is not None
        self._copy_until(None)
        with writing():
            if self.audio_stream is not None:
                for packet in self.audio_stream.encode(None):
                    self.container.mux(packet)
            self.container.close()
        self.container = None

    def abort(self) -> None:
        """Closes what :meth:`close` did not (a failed join); the partial file is the caller's."""
        self.packets.close()  # the chunk file being read
        if self.container is not None:
            container, self.container = self.container, None
            try:
                container.close()
            except av.error.FFmpegError:
                pass

    def encoded(self, decode_errors: int) -> Encoded:
        return Encoded(
            self.rendition,
            self.dest,
            self.frames,
            self.extradata,
            self.audio_stream is not None,
            decode_errors,
        )
