"""The ``poster`` operation: one representative, upright picture of a video, or an audio file's
cover (issue 7); when asked, also a sprite sheet of thumbnails with a WebVTT index
(:mod:`hypermedia.engines.media.sprite`).

``run("poster", params, input_path, out_dir, limits=…)``:

1. **Checks** before FFmpeg reads the file: the params
   (:func:`hypermedia.engines.media.params.validate_params`); the file's size (``INPUT_TOO_LARGE``).
   Opening is :func:`hypermedia.engines.media.sources.open_media`'s. A header duration over
   :attr:`MediaLimits.max_duration_seconds` is ``MEDIA_TOO_LONG`` before anything is decoded.
2. **Source**: the first video stream that is not an attached picture; else the first attached
   picture (cover art: its one packet is a PNG or JPEG image, decoded by the stream's decoder
   like a video frame); else ``NO_VIDEO_STREAM``. A sprite sheet of a file without video (a cover
   picture only) is ``NO_VIDEO_STREAM`` too, before anything is decoded: a sheet of one still
   picture would index nothing.
3. **Frame** (video): decoded with one thread from the start, at most :data:`POSTER_MAX_FRAMES`
   frames or :data:`POSTER_MAX_SECONDS` of stream time; the first frame that is not blank
   (:func:`_blank`) is the poster; when every sampled frame is blank, the one with the largest
   luma standard deviation. A frame over :data:`MAX_PIXELS` is ``INPUT_TOO_LARGE_PIXELS`` before
   it is converted.
4. **Picture**: put upright from the frame's display matrix as FFmpeg's ``autorotate`` does
   (:mod:`hypermedia.engines.media.orientation`: quarter turns, and the flip of a mirrored matrix: a
   front camera's clip), scaled with pyvips to ``width`` (never
   wider than the display width) and the height of the display aspect ratio (the sample aspect
   ratio applied), encoded as JPEG, WebP or PNG without metadata.
5. **Sprite** (``sprite`` params): the same video stream, opened again, sampled at ``count`` even
   intervals by :func:`hypermedia.engines.media.sprite.write_sprite`, which shares this module's frame
   checks and geometry (:func:`check_pixels`, :func:`one_thread`, :func:`display_size`,
   :meth:`~hypermedia.engines.media.orientation.Orientation.upright`).

Runs FFmpeg on untrusted input: call :func:`run` in the sandbox child only. Importing this module
is fork-safe (pyvips is imported when the picture is encoded).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, Final

import av
import av.error
import numpy as np
from av.container import InputContainer
from av.stream import Disposition
from av.video.frame import VideoFrame
from av.video.stream import VideoStream

from hypermedia.core.errors import PermanentJobError
from hypermedia.engines.contract import OutputFile
from hypermedia.engines.media.frames import check_pixels, display_size, one_thread
from hypermedia.engines.media.orientation import UPRIGHT, Orientation, frame_orientation
from hypermedia.engines.media.params import validate_params
from hypermedia.engines.media.sources import MediaLimits, check_duration, check_size, first_frame, open_media
from hypermedia.engines.media.sprite import write_sprite

__all__ = [
    "BLANK_MAX_LUMA",
    "BLANK_MIN_LUMA",
    "BLANK_MIN_STDDEV",
    "POSTER_MAX_FRAMES",
    "POSTER_MAX_SECONDS",
    "run",
]

POSTER_MAX_SECONDS: Final = 30.0
"""Most stream time (from the first decoded frame) searched for a frame that is not blank."""

POSTER_MAX_FRAMES: Final = 900
"""Most frames decoded looking for one that is not blank (30 s at 30 fps)."""

BLANK_MIN_LUMA: Final = 16.0

BLANK_MAX_LUMA: Final = 239.0

BLANK_MIN_STDDEV: Final = 8.0

_SAMPLE_SIZE: Final = 64
"""The blank test's copy of a frame: 64 × 64 pixels, averaged (swscale's area filter)."""

_MIMES: Final = {"jpeg": "image/jpeg", "webp": "image/webp", "png": "image/png"}

_EXTENSIONS: Final = {"jpeg": "jpg", "webp": "webp", "png": "png"}


@dataclass
class _Choice:
    frame: VideoFrame
    time_seconds: float
    skipped: int


def run(
    operation: str,
    params: dict,
    input_path: Path,
    out_dir: Path,
    *,
    limits: MediaLimits,
) -> list[OutputFile]:
    """Writes one poster picture of a video (or an audio file's cover) into ``out_dir``, and
    a sprite sheet with its WebVTT index when ``params`` ask for ``sprite``.

    Args:
        operation: ``poster``.
        params: see :func:`hypermedia.engines.media.params.validate_params`.
        input_path: the uploaded file.
        out_dir: existing directory for the output.
        limits: size checked before FFmpeg reads the file, duration before anything is decoded.

    Returns:
        One :class:`OutputFile`, ``poster`` (``poster.jpg``, ``poster.webp`` or ``poster.png``,
        with the format's MIME type). Metadata: ``width``, ``height`` (of the picture),
        ``time_seconds`` (of the chosen frame from the stream's start; 0.0 for a cover),
        ``source`` (``video_frame`` or ``cover_art``), ``skipped_blank_frames`` (blank frames
        before the chosen one; 0 for a cover; all sampled frames when every one was blank) and
        ``size_bytes``. With ``sprite``, two more follow: ``sprite`` (``sprite.jpg``) and
        ``sprite_vtt`` (``sprite.vtt``), described by
        :func:`hypermedia.engines.media.sprite.write_sprite`.

    Raises:
        InvalidArgument: ``UNKNOWN_OPERATION``, ``INVALID_PARAMS``.
        PermanentJobError: ``INPUT_TOO_LARGE``, ``UNSUPPORTED_FORMAT``, ``CORRUPT_INPUT`` (from
            :func:`~hypermedia.engines.media.sources.open_media`; no frame decodes), ``MEDIA_TOO_LONG``,
            ``NO_VIDEO_STREAM`` (neither video nor a cover picture; or a sprite asked of a file
            without video), ``INPUT_TOO_LARGE_PIXELS``.
        MemoryError: FFmpeg hit the sandbox's memory limit.
    """
    options = validate_params(operation, params)
    check_size(input_path, limits)
    with open_media(input_path) as container:
        if container.duration is not None:
            check_duration(container.duration / av.time_base, limits)
        stream, source = _source_stream(container)
        stream_index = stream.index  # read while the container is open: it owns the stream
        if options["sprite"] is not None and source != "video_frame":
            raise PermanentJobError(
                "A sprite sheet needs a video stream; the input has only a cover picture.",
                "NO_VIDEO_STREAM",
            )
        check_pixels(stream.codec_context.width, stream.codec_context.height)
        choice = _choose_frame(stream) if source == "video_frame" else _cover_frame(stream)
        orientation = frame_orientation(choice.frame) if source == "video_frame" else UPRIGHT
        sar = stream.codec_context.sample_aspect_ratio or stream.sample_aspect_ratio
        check_pixels(choice.frame.width, choice.frame.height)
        pixels = choice.frame.to_ndarray(format="rgb24")
    data, width, height = _encode(pixels, orientation, sar, options)
    filename = f"poster.{_EXTENSIONS[options['format']]}"
    (out_dir / filename).write_bytes(data)
    metadata = {
        "width": width,
        "height": height,
        "time_seconds": choice.time_seconds,
        "source": source,
        "skipped_blank_frames": choice.skipped,
        "size_bytes": len(data),
    }
    outputs = [OutputFile("poster", filename, _MIMES[options["format"]], metadata)]
    if options["sprite"] is not None:
        outputs += write_sprite(input_path, stream_index, options["sprite"], out_dir, limits=limits)
    return outputs


def _source_stream(container: InputContainer) -> tuple[VideoStream, str]:
    """The first decodable video stream that is not a cover picture, else the first cover."""
    covers: list[VideoStream] = []
    for stream in container.streams.video:
        if stream.codec_context is None:
            continue
        if stream.disposition & Disposition.attached_pic:
            covers.append(stream)
            continue
        return stream, "video_frame"
    if covers:
        return covers[0], "cover_art"
    raise PermanentJobError(
        "The input has no video stream and no cover picture to make a poster of.", "NO_VIDEO_STREAM"
    )


def _frames(stream: VideoStream) -> Any:
    """The stream's decoded frames from the start (flushed at its end); decoding errors propagate."""
    container = stream.container
    assert isinstance(container, InputContainer)
    context = stream.codec_context
    for packet in container.demux(stream):
        if packet.size == 0:
            yield from context.decode(None)
        elif not packet.is_corrupt:
            yield from context.decode(packet)


def _choose_frame(stream: VideoStream) -> _Choice:
    """The first frame that is not blank (module doc, step 3).

    Raises:
        PermanentJobError: ``CORRUPT_INPUT`` when no frame decodes; ``INPUT_TOO_LARGE_PIXELS``.
    """
    one_thread(stream)
    start = (
        float(stream.start_time * stream.time_base)
        if stream.start_time is not None and stream.time_base
        else None
    )
    best: _Choice | None = None
    best_stddev = -1.0
    count = 0
    first_time: float | None = None
    try:
        for frame in _frames(stream):
            check_pixels(frame.width, frame.height)
            time = frame.time
            if time is not None:
                first_time = time if first_time is None else first_time
                if time - first_time > POSTER_MAX_SECONDS:
                    break
            if start is None:
                start = time if time is not None else 0.0
            seconds = round(max(0.0, (time if time is not None else start) - start), 6)
            blank, stddev = _blank(frame)
            if not blank:
                return _Choice(frame, seconds, count)
            if stddev > best_stddev:
                best, best_stddev = _Choice(frame, seconds, 0), stddev
            count += 1
            if count >= POSTER_MAX_FRAMES:
                break
    except MemoryError:  # av.error.MemoryError is one, and an FFmpegError: not CORRUPT_INPUT
        raise
    except av.error.FFmpegError as exc:
        if best is None:
            raise _no_frame(stream.index) from exc
    if best is None:
        raise _no_frame(stream.index)
    best.skipped = count
    return best


def _cover_frame(stream: VideoStream) -> _Choice:
    """The cover picture: the attached picture's packet decoded like a video frame
    (:func:`hypermedia.engines.media.sources.first_frame`).

    Raises:
        PermanentJobError: ``CORRUPT_INPUT`` when the picture does not decode.
    """
    one_thread(stream)
    return _Choice(first_frame(stream), 0.0, 0)


def _no_frame(index: int) -> PermanentJobError:
    return PermanentJobError(
        f"No frame of video stream {index} can be decoded: the file is truncated or damaged.",
        "CORRUPT_INPUT",
    )


def _blank(frame: VideoFrame) -> tuple[bool, float]:
    """Whether a frame is blank, and its luma standard deviation.

    Blank is a mean luma below 16 (black: fades in, a black leader; 16 is video black on the
    limited-range scale) or above 239 (white flashes, blown-out leaders), or a standard deviation
    below 8 (a flat card of any one colour: nothing to recognise). Luma is BT.601 over a
    :data:`_SAMPLE_SIZE`-square, area-averaged RGB copy of the frame, full range 0–255: cheap
    (a few thousand pixels whatever the frame size or bit depth) and insensitive to noise, which
    averaging removes but a real picture's structure survives.
    """
    small = frame.reformat(width=_SAMPLE_SIZE, height=_SAMPLE_SIZE, format="rgb24", interpolation="AREA")
    rgb = small.to_ndarray(format="rgb24").astype(np.float32)
    luma = rgb[..., 0] * 0.299 + rgb[..., 1] * 0.587 + rgb[..., 2] * 0.114
    mean = float(luma.mean())
    stddev = float(luma.std())
    return (mean < BLANK_MIN_LUMA or mean > BLANK_MAX_LUMA or stddev < BLANK_MIN_STDDEV), stddev


def _encode(
    pixels: np.ndarray, orientation: Orientation, sar: Fraction | None, options: dict[str, Any]
) -> tuple[bytes, int, int]:
    """The RGB frame (as coded) put upright, scaled to the display aspect and encoded.

    Returns:
        The encoded picture, its width and its height.
    """
    import pyvips  # here, not at import time: the module stays fork-safe and light

    height, width, _ = pixels.shape
    display_width, display_height = display_size(width, height, sar, orientation)
    upright = np.ascontiguousarray(orientation.upright(pixels))
    rows, columns, bands = upright.shape
    image = pyvips.Image.new_from_memory(upright.data, columns, rows, bands, "uchar")
    image = image.copy(interpretation="srgb")
    out_width = max(1, min(options["width"], round(display_width)))
    out_height = max(1, round(out_width * display_height / display_width))
    if (out_width, out_height) != (image.width, image.height):
        image = image.resize(out_width / image.width, vscale=out_height / image.height)
        if (image.width, image.height) != (out_width, out_height):  # rounding in libvips
            image = image.gravity("centre", out_width, out_height, extend="copy")
    fmt = options["format"]
    if fmt == "jpeg":
        data = image.jpegsave_buffer(Q=options["quality"], optimize_coding=True, keep="none")
    elif fmt == "webp":
        data = image.webpsave_buffer(Q=options["quality"], keep="none")
    else:
        data = image.pngsave_buffer(keep="none")
    return bytes(data), out_width, out_height
