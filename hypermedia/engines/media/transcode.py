"""The ``transcode_video`` operation: a ladder of upright, 8-bit 4:2:0 renditions of a video, each
with stereo 48 kHz sound, optionally packaged as HLS (issue 7).

``run("transcode_video", params, input_path, out_dir, limits=…)``:

1. **Checks** before FFmpeg decodes anything: the params
   (:func:`hypermedia.engines.media.params.validate_params`), the file's size (``INPUT_TOO_LARGE``),
   the opening (:func:`hypermedia.engines.media.sources.open_media`: allowlisted demuxers, the local
   file only), a header duration over
   :attr:`~hypermedia.engines.media.sources.MediaLimits.max_duration_seconds` (``MEDIA_TOO_LONG``),
   a video stream that is not cover art (``NO_VIDEO_STREAM``), at most :data:`MAX_PIXELS` coded
   pixels (``INPUT_TOO_LARGE_PIXELS``).
2. **Geometry**: the display size is the coded size with the sample aspect ratio applied, turned by
   the display matrix of the first decoded frame (:func:`hypermedia.engines.media.sources.first_frame_orientation`:
   quarter turns and the flip of a mirrored matrix, as FFmpeg's ``autorotate``:
   :mod:`hypermedia.engines.media.orientation`). :func:`plan_ladder` picks the renditions: a rung is
   the *short* side of the upright picture; rungs above the source's short side are left out
   (never upscaled); when none is left, one rendition keeps the source's size. Sides are even
   (4:2:0 needs it).
3. **One decode, every encoder at once**: the video is decoded once (frame threads:
   :attr:`~hypermedia.engines.media.sources.MediaLimits.threads`); each decoded frame goes through
   one FFmpeg filter graph per rendition (:class:`hypermedia.engines.media.encoding.Output`) — the
   ``transpose``, ``hflip`` or ``vflip`` that ``autorotate`` inserts for the display matrix
   (:meth:`~hypermedia.engines.media.orientation.Orientation.filters`), ``scale`` (bicubic),
   ``setsar=1``, ``format=yuv420p`` (10-bit, 4:2:2 and 4:4:4 input become 8-bit 4:2:0) — into that
   rendition's encoder. Timestamps pass through unchanged (shifted so the file starts at 0): a
   variable frame rate stays variable, nothing is duplicated or dropped, each frame keeps its
   duration (a frame whose time does not go on takes its decode timestamp, else is dropped). The
   first audio stream (if any) is converted to stereo 48 kHz float
   (:class:`hypermedia.engines.media.audio.AudioConverter`: layout and rate changes mid-stream, NaN
   and infinite samples zeroed), stamped by its sample count, and encoded into every rendition. A
   packet that does not decode is skipped and counted (``decode_errors``), as FFmpeg's command line
   goes on past it. Before any of this, every packet's timestamp is read (nothing decoded:
   :func:`hypermedia.engines.media.sources.demux_span`), so a header that understates the length is
   ``MEDIA_TOO_LONG`` before anything is encoded. Nothing of the source's metadata (tags, chapters,
   the display matrix, subtitles, data streams, cover art) is written.
4. **Codecs** (:data:`hypermedia.engines.media.encoding.CODECS`): H.264 (libx264, CRF, the params'
   preset) + AAC-LC in MP4 with the index first (``movflags=+faststart``); VP9 (libvpx-vp9, constant
   quality, ``row-mt``) + Opus in WebM; AV1 (SVT-AV1, CRF, preset 8) + AAC in MP4.
5. **HLS** (h264 only, on request; :mod:`hypermedia.engines.media.hls`): each finished MP4 is
   remuxed (no second encode) by FFmpeg's ``hls`` muxer into one fragmented MP4 per rendition
   (``hls_flags=single_file``: the initialisation section and every segment are byte ranges of it)
   and a VOD media playlist; keyframes are forced every ``hls_segment_seconds`` (closed GOPs, no
   scene-cut keyframes) so segments of all renditions align. A master playlist lists the renditions
   with ``BANDWIDTH`` (the peak segment bit rate), ``AVERAGE-BANDWIDTH``, ``RESOLUTION``,
   ``FRAME-RATE`` and ``CODECS`` (RFC 8216 §4.3.4.2). URIs inside the playlists are the sibling
   outputs' ``output_type`` names (``hls_720p``, ``hls_720p_media``); the gateway's resolved-output
   endpoint turns them into download URLs.
6. **Checkpoints** (issue 23, ADRs 0079 and 0080): a video of at least
   :attr:`~hypermedia.engines.media.sources.MediaLimits.part_seconds` that can be cut at its
   keyframes (:func:`hypermedia.engines.media.chunks.plan_chunks`) is encoded in chunks, each a
   pass over its part of the input into every rendition, each chunk but the last kept, and then
   joined without a second encode (:mod:`hypermedia.engines.media.chunk_parts`). Any other
   video of that length with more than one rendition
   is encoded one rendition at a time, highest first, a pass over the input each (a decode per
   rendition: a 1080/720/480 ladder of 1080p H.264 takes 1.24× the CPU of one pass,
   ``bench/transcode_parts.py``), and each rendition but the last is kept as a checkpoint
   (:mod:`hypermedia.engines.media.rendition_parts`); a later attempt takes the kept renditions
   and encodes only the rest. A video of at least
   :attr:`~hypermedia.engines.media.sources.MediaLimits.fan_out_seconds` is cut into shorter
   chunks and fans out (ADR 0081, :mod:`hypermedia.worker.fanout`): child jobs encode every chunk
   but the last, each kept as a part of the parent, and the parent's next run takes them,
   encodes the last and joins them. libx264 with frame threads does not write the same bytes twice, so
   a resumed job's renditions are not an uninterrupted run's bytes: they decode to the same frame
   count, sizes and duration. HLS is packaged from the finished files either way.

Progress is reported while decoding (:func:`hypermedia.sandbox.report_progress`). Runs FFmpeg on
untrusted input: call :func:`run` in the sandbox child only. Importing this module is fork-safe.
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path
from typing import Any, Final

import av
import av.error
import av.filter
from av.video.stream import VideoStream

from hypermedia.core.errors import InvalidArgument, PermanentJobError
from hypermedia.engines.contract import OutputFile, report_progress
from hypermedia.engines.media import chunk_parts, chunks, rendition_parts
from hypermedia.engines.media.encoding import (
    CODECS,
    Encoded,
    Rendition,
    even,
)
from hypermedia.engines.media.frames import display_size
from hypermedia.engines.media.hls import package_hls
from hypermedia.engines.media.orientation import Orientation
from hypermedia.engines.media.params import validate_params
from hypermedia.engines.media.passes import MAX_PIXELS, Plan, Transcode, video_stream
from hypermedia.engines.media.sources import (
    MediaLimits,
    check_duration,
    check_size,
    demux_span,
    first_frame_orientation,
    header_seconds,
    open_media,
)

__all__ = [
    "MAX_PIXELS",
    "MAX_SIDE",
    "Plan",
    "Transcode",
    "describe",
    "plan_ladder",
    "prepare",
    "run",
    "thread_need",
]

MAX_SIDE: Final = 8192
"""Longest side of a rendition, in pixels: a picture of an extreme aspect ratio is scaled down to
it (H.264 level 6.2 allows 8,192 × 4,320; x264 refuses far larger frames)."""


def plan_ladder(display_width: int, display_height: int, heights: list[int]) -> list[Rendition]:
    """The renditions of an upright picture of ``display_width`` × ``display_height`` pixels.

    A rung in ``heights`` is the short side of a rendition; the long side follows the aspect
    ratio, both rounded to even numbers (at least 2). Rungs above the source's short side are
    left out (never upscaled); when none is left, one rendition of the source's own size (an odd
    side one pixel shorter) is returned. A long side over :data:`MAX_SIDE` is scaled down to it
    (the short side with it). Highest first.

    >>> [r.name for r in plan_ladder(1280, 720, [1080, 720, 480])]
    ['720p', '480p']
    >>> plan_ladder(360, 640, [720, 360])[0]
    Rendition(name='360p', width=360, height=640)
    """
    short, long = sorted((display_width, display_height))
    portrait = display_height > display_width
    renditions = []
    for rung in sorted((h for h in heights if h <= short), reverse=True):
        rung_short, rung_long = even(rung), min(even(rung * long / short), long - long % 2)
        if rung_long > MAX_SIDE:
            rung_short, rung_long = even(rung_short * MAX_SIDE / rung_long), MAX_SIDE
        width, height = (rung_short, rung_long) if portrait else (rung_long, rung_short)
        renditions.append(Rendition(f"{rung}p", width, height))
    if not renditions:  # the source's own size, odd sides one pixel shorter
        rung_short, rung_long = max(2, short - short % 2), max(2, long - long % 2)
        if rung_long > MAX_SIDE:
            rung_short, rung_long = even(rung_short * MAX_SIDE / rung_long), MAX_SIDE
        width, height = (rung_short, rung_long) if portrait else (rung_long, rung_short)
        renditions.append(Rendition(f"{rung_short}p", width, height))
    return renditions


def thread_need(params: dict[str, Any], threads: int) -> int:
    """Threads a ``transcode_video`` job of these (normalised) params may start beyond the Python
    interpreter's own, for its ``RLIMIT_NPROC``: the frame-threaded decoder (``threads`` + 3)
    and, per requested rung, one encoder. Measured on a 3-rung ladder (1080p source, filter
    graphs at one thread each): x264 and libvpx-vp9 start at most ``threads`` + 3 threads each
    (17 in all at ``threads=2``, 25 at 4); SVT-AV1 starts far more whatever its ``lp`` (18 per
    encoder at ``lp=1``, 50 at 2, 77 at 4), bounded here by 24 + 24 × ``threads``."""
    renditions = len(params.get("heights") or ()) or 1
    per_encoder = 24 + 24 * threads if params.get("codec") == "av1" else threads + 3
    return threads + 3 + renditions * per_encoder


def run(
    operation: str,
    params: dict,
    input_path: Path,
    out_dir: Path,
    *,
    limits: MediaLimits,
) -> list[OutputFile]:
    """Transcodes one video into its renditions (see the module doc).

    Args:
        operation: ``transcode_video``.
        params: :func:`hypermedia.engines.media.params.validate_params`'s ``transcode_video`` params.
        input_path: the uploaded file. out_dir: existing directory for the outputs.
        limits: size and duration checked before decoding; ``threads`` per encoder and decoder.

    Returns:
        Per rendition, highest first, ``video_{rung}p`` (``video_720p.mp4``, ``video/mp4``; or
        ``.webm``, ``video/webm``) with metadata ``width``, ``height`` (pixels), ``codec``
        (``h264``/``vp9``/``av1``), ``audio_codec`` (``aac``/``opus`` or null without sound),
        ``duration_seconds`` (of the written file), ``frame_count``, ``bit_rate`` (bits/s over the
        file), ``rotation_applied`` (degrees, the source's display rotation as ``probe`` reports
        it when its display matrix was applied, else 0), ``mirror_applied`` (the matrix mirrored
        the picture and the flip was applied: a front camera's clip), ``decode_errors`` (packets
        skipped: :class:`hypermedia.engines.media.decoding.DecodeErrors`), ``size_bytes``,
        ``resumed`` (taken, or a chunk of it taken, from an earlier attempt's checkpoint, module
        doc step 6).
        A run that fans out (:attr:`MediaLimits.fan_out_seconds`, ADR 0081) returns one
        ``fan_out`` output instead (``fanout.json``, metadata ``chunks``: the plan's count), and a
        child job's run (:attr:`MediaLimits.chunk`) none: it keeps its chunk as a part.
        With ``hls``: then ``hls_{rung}p_media`` (the fragmented MP4, ``video/mp4``),
        ``hls_{rung}p`` (its media playlist, ``application/vnd.apple.mpegurl``, metadata
        ``segments``, ``bandwidth``, ``average_bandwidth``) per rendition, and ``hls_master``
        (metadata ``renditions``).

    Raises:
        InvalidArgument: ``UNKNOWN_OPERATION``, ``INVALID_PARAMS``.
        PermanentJobError: ``INPUT_TOO_LARGE``, ``UNSUPPORTED_FORMAT``, ``CORRUPT_INPUT`` (the
            video cannot be decoded), ``MEDIA_TOO_LONG`` (from the header, or passed while
            decoding), ``NO_VIDEO_STREAM``, ``INPUT_TOO_LARGE_PIXELS``, ``RESOURCE_LIMIT`` (an
            encoder could not start or run within the job's thread and memory limits).
        MemoryError: FFmpeg or an encoder hit the sandbox's memory limit.
    """
    plan = prepare(operation, params, input_path, out_dir, limits)
    seconds = plan.seconds or 0.0
    fanned = limits.fan_out_seconds is not None and seconds >= limits.fan_out_seconds
    long = fanned or (limits.part_seconds is not None and seconds >= limits.part_seconds)
    planned: list[chunks.Chunk] = []
    if long:
        length = limits.fan_out_chunk_seconds if fanned else limits.part_seconds
        assert length is not None
        planned = chunks.plan_chunks(plan, chunk_parts.chunk_seconds(seconds, length))
    if limits.chunk is not None:  # a child job: its chunk, kept for the parent
        chunk_parts.encode_for_parent(plan, planned, limits.chunk)
        return []
    if fanned and limits.fan_out and len(planned) >= chunk_parts.MIN_FAN_OUT:
        return [chunk_parts.ask_fan_out(plan, planned)]
    # Chunks when the video can be cut (None: it could not after all, chunk_parts says why).
    encoded = chunk_parts.encode_in_chunks(plan, planned) if len(planned) > 1 else None
    if encoded is None and long and len(plan.ladder) > 1:
        encoded = _encode_in_parts(plan, plan.ladder)
    elif encoded is None:
        encoded = _encode(plan, plan.ladder, (0.0, 1.0))
    outputs = [describe(e, plan.options, plan.orientation) for e in encoded]
    if plan.options["hls"]:
        outputs += package_hls(encoded, out_dir, plan.frame_rate, plan.options["hls_segment_seconds"])
    return outputs


def prepare(operation: str, params: dict, input_path: Path, out_dir: Path, limits: MediaLimits) -> Plan:
    """Steps 1 and 2 of the module doc: the checks made before anything is encoded, and the
    ladder. Every pass over the input (and every chunk of a fanned-out job,
    :mod:`hypermedia.engines.media.chunks`) starts from the same plan of the same file.

    Raises:
        InvalidArgument, PermanentJobError: as :func:`run`.
    """
    if operation != "transcode_video":
        raise InvalidArgument(f"unknown operation {operation!r}", "UNKNOWN_OPERATION")
    options = validate_params(operation, params)
    check_size(input_path, limits)
    with open_media(input_path) as container:
        seconds = header_seconds(container)
        check_duration(seconds, limits)
        video = video_stream(container)
        width, height = video.codec_context.width, video.codec_context.height
        if width * height > MAX_PIXELS:
            raise PermanentJobError(
                f"The video is {width}×{height} pixels; at most {MAX_PIXELS} pixels are accepted.",
                "INPUT_TOO_LARGE_PIXELS",
            )
        orientation = first_frame_orientation(video)
        ladder = plan_ladder(*_display_size(video, orientation), options["heights"])
        frame_rate: Fraction | None = video.average_rate or video.guessed_rate
    with open_media(input_path) as container:
        # Every packet's timestamp, nothing decoded (about a second per million packets): a
        # header that understates the length is MEDIA_TOO_LONG here, before hours are encoded.
        span = demux_span(container, limits)
    if seconds is None and span.start is not None and span.end is not None:
        seconds = span.end - span.start
    return Plan(input_path, options, out_dir, limits, orientation, ladder, frame_rate, seconds)


def _encode(plan: Plan, ladder: list[Rendition], progress: tuple[float, float]) -> list[Encoded]:
    """One pass over the input into every rendition of ``ladder`` (:class:`Transcode`),
    reporting progress from ``progress[0]`` over a share of ``progress[1]``."""
    with open_media(plan.input_path) as container:
        job = Transcode(
            container, plan.options, plan.out_dir, plan.limits, plan.orientation, ladder, progress
        )
        job.encode()
    return job.encoded()


def _encode_in_parts(plan: Plan, ladder: list[Rendition]) -> list[Encoded]:
    """The ladder one rendition at a time, highest first (module doc, step 6): a rendition an
    earlier attempt kept is taken (:func:`rendition_parts.restored`), any other is encoded by a
    pass of its own, and kept (:func:`rendition_parts.keep`) unless it is the last."""
    made = rendition_parts.made_by(plan.options)
    extension = CODECS[plan.options["codec"]].extension
    encoded = []
    for n, rendition in enumerate(ladder):
        dest = plan.out_dir / f"video_{rendition.name}.{extension}"
        kept = rendition_parts.restored(plan.out_dir, rendition, plan.options["codec"], made, dest)
        if kept is None:
            [kept] = _encode(plan, [rendition], (n / len(ladder), 1 / len(ladder)))
            if n < len(ladder) - 1:
                rendition_parts.keep(plan.out_dir, kept, made)
        encoded.append(kept)
        report_progress(plan.out_dir, (n + 1) / len(ladder))
    return encoded


def describe(encoded: Encoded, options: dict[str, Any], orientation: Orientation) -> OutputFile:
    size = encoded.path.stat().st_size
    with av.open(str(encoded.path), options=rendition_parts.OPEN_OPTIONS) as written:
        duration = written.duration / av.time_base if written.duration is not None else None
    metadata = {
        "width": encoded.rendition.width,
        "height": encoded.rendition.height,
        "codec": options["codec"],
        "audio_codec": ("opus" if options["codec"] == "vp9" else "aac") if encoded.has_audio else None,
        "duration_seconds": round(duration, 3) if duration is not None else None,
        "frame_count": encoded.frames,
        "bit_rate": round(size * 8 / duration) if duration else None,
        "rotation_applied": orientation.rotation if orientation.applied else 0,
        "mirror_applied": orientation.mirrored and orientation.applied,
        "decode_errors": encoded.decode_errors,
        "size_bytes": size,
        "resumed": encoded.resumed,
    }
    mime_type = CODECS[options["codec"]].mime_type
    return OutputFile(f"video_{encoded.rendition.name}", encoded.path.name, mime_type, metadata)


# --- the source ----------------------------------------------------------------------------------


def _display_size(stream: VideoStream, orientation: Orientation) -> tuple[int, int]:
    """The upright display size in whole pixels (:func:`hypermedia.engines.media.frames.display_size`)."""
    context = stream.codec_context
    width, height = display_size(context.width, context.height, context.sample_aspect_ratio, orientation)
    return max(1, round(width)), max(1, round(height))
