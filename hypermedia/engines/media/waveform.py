"""The ``waveform`` operation: peaks of one audio stream as JSON, and drawn as a PNG (issue 7).

``run("waveform", params, input_path, out_dir, limits=…)`` decodes the first audio stream that is
not a cover picture (video files' sound too) and keeps, for every *bucket* of consecutive samples,
the smallest and the largest sample of each channel (or of their mean, ``channels: "mix"``).

1. **Checks** before FFmpeg reads the file: the params
   (:func:`hypermedia.engines.media.params.validate_params`); the file's size (``INPUT_TOO_LARGE``).
   Opening is :func:`hypermedia.engines.media.sources.open_media`'s: the local file only, the allowlisted
   demuxers only. No audio stream is ``NO_AUDIO_STREAM``. A header duration over
   :attr:`MediaLimits.max_duration_seconds` is ``MEDIA_TOO_LONG`` before anything is decoded;
   while decoding, the samples counted so far are checked against it too (a header without a
   duration, or one FFmpeg only estimates), with :func:`hypermedia.engines.media.sources.check_duration`.
2. **Buckets** by sample index, from the first decoded sample (timestamps are not consulted:
   a gap in them is not a gap in the peaks). ``buckets_per_second`` *b* at sample rate *r*:
   bucket *i* holds samples ``[i·r/b, (i+1)·r/b)`` (integer arithmetic, ``s·b // r``; a
   non-integer ``r/b`` such as 44 100 / 1000 gives buckets of 44 and 45 samples), and there are
   ``ceil(samples·b / r)`` buckets. ``buckets`` *n*: the total sample count *N* must be known before
   decoding, so a first pass *demuxes* the stream (packets only, nothing decoded, at most
   :attr:`MediaLimits.max_probe_packets`; cheap next to decoding) and takes *N* from the span of its
   packets' timestamps; bucket *i* holds samples ``[i·N/n, (i+1)·N/n)``. The packets' span can
   exceed the decoded samples by the codec's priming (AAC: 1024 samples, MP3: the LAME delay),
   so the last bucket may be a little short; samples past *N* fall in the last bucket, buckets past
   the decoded audio are 0. Past the packet cap, *N* is the header's duration when that is longer.
   A bucket no sample falls in (a sample rate below ``buckets_per_second``, fewer samples than
   ``buckets``) holds the value of the sample before it.
3. **Decoding** with one thread; every frame is converted by an :class:`av.AudioResampler` to
   packed float at the stream's own rate and layout (no resampling: values −1…1 whatever the
   codec's sample format; packed, as :func:`_channels` says why), in batches of :data:`BATCH_SAMPLES`; min/max per bucket are reduced
   with NumPy as the batches come (memory is the batch and the peaks, never the decoded audio).
   A packet that does not decode (a damaged MP3 frame) is skipped and counted
   (``decode_errors``), as FFmpeg's command line goes on past it; its samples are missing, not
   silent; more than :data:`~hypermedia.engines.media.decoding.MAX_ERROR_RATE` of them is
   ``CORRUPT_INPUT`` (:class:`hypermedia.engines.media.decoding.DecodeErrors`).
   ``mix`` is the arithmetic mean of the channels (not FFmpeg's downmix, which weights the centre
   and surround channels and drops the LFE). The peaks are bounded: more than
   :data:`MAX_PEAK_VALUES` values is ``MEDIA_TOO_LONG`` (a long file at a fine resolution).
4. **Outputs**: ``waveform.json`` and, unless ``image: false``, ``waveform.png`` (see :func:`run`).

Runs FFmpeg on untrusted input: call :func:`run` in the sandbox child only. Importing this module
is fork-safe (pyvips is imported when the PNG is drawn).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any, Final

import av
import av.error
import numpy as np
from av.audio.stream import AudioStream
from av.container import InputContainer

from hypermedia.core.errors import PermanentJobError
from hypermedia.engines.contract import OutputFile
from hypermedia.engines.media.decoding import DecodeErrors
from hypermedia.engines.media.params import validate_params
from hypermedia.engines.media.sources import (
    MediaLimits,
    audio_stream,
    check_duration,
    check_size,
    header_seconds,
    open_media,
)

__all__ = ["BATCH_SAMPLES", "JSON_VERSION", "MAX_PEAK_VALUES", "run"]

JSON_MIME: Final = "application/json"
PNG_MIME: Final = "image/png"
JSON_VERSION: Final = 1
BATCH_SAMPLES: Final = 1 << 16
"""Samples (per channel) gathered from decoded frames before their buckets are reduced: NumPy's
cost per call is then spread over ~1.4 s of 48 kHz audio instead of one 1024-sample frame."""
MAX_PEAK_VALUES: Final = 8_000_000
"""Most numbers in the peaks (2 per bucket per channel): about 64 MB of JSON. Four hours of stereo
at the default 100 buckets per second is 5.76 million."""
_ROW_BLOCK: Final = 256
"""Rows of one channel's lane drawn at a time (bounds the drawing's float intermediates)."""

_Chunk = tuple[np.ndarray, np.ndarray]


def run(
    operation: str,
    params: dict,
    input_path: Path,
    out_dir: Path,
    *,
    limits: MediaLimits,
) -> list[OutputFile]:
    """Computes the peaks of one file's audio and writes them into ``out_dir``.

    Args:
        operation: ``waveform``.
        params: see :func:`hypermedia.engines.media.params.validate_params`.
        input_path: the uploaded file (audio, or video with sound).
        out_dir: existing directory for the outputs.
        limits: size checked before FFmpeg reads the file; duration from the header before
            decoding and from the decoded samples while decoding.

    Returns:
        ``peaks`` (``waveform.json``, ``application/json``), then, unless ``image`` is ``false``,
        ``waveform`` (``waveform.png``, ``image/png``). The JSON follows the shape of the JSON
        output of BBC's audiowaveform
        (https://github.com/bbc/audiowaveform/blob/master/doc/DataFormat.md: ``version``,
        ``channels``, ``sample_rate``, ``samples_per_pixel``, ``length``, ``data``) with float
        samples and the data grouped by channel rather than interleaved::

            {"version": 1,
             "sample_rate": 48000,            # Hz, of the stream
             "channels": 2,                   # channels in data: the stream's, or 1 for "mix"
             "channel_mode": "all",           # all | mix
             "buckets_per_second": 100.0,     # the one asked for, or sample_rate / samples_per_bucket
             "samples_per_bucket": 480.0,     # sample_rate / buckets_per_second, or N / buckets
             "duration_seconds": 2.0,         # decoded samples / sample_rate
             "length": 200,                   # buckets per channel
             "data": [[min0, max0, min1, max1, …],   # channel 0: 2 × length floats
                      [min0, max0, …]]}              # channel 1 …

        Values are −1…1 (clipped; a lossy decoder may overshoot full scale), rounded to 4
        decimals. The PNG is ``width`` × ``height`` pixels, one lane per channel stacked top to
        bottom (equal heights, channel 0 on top), 0 at each lane's middle and +1 at its top.
        Column *x* covers buckets ``[x·length/width, (x+1)·length/width)`` (at least one) and is
        inked from its largest to its smallest peak; a pixel's ink is the fraction of its height
        the range covers (antialiased vertically), so silence (min = max = 0) leaves the
        background: ``color`` over ``background``, or ``color`` with that coverage as alpha
        over ``transparent`` (RGBA; RGB otherwise).

        Metadata of both: ``duration_seconds``, ``channels``, ``length``, ``decode_errors``
        (packets of the source skipped: they did not decode); the JSON adds
        ``sample_rate`` and ``size_bytes``, the PNG ``width`` and ``height``.

    Raises:
        InvalidArgument: ``UNKNOWN_OPERATION``, ``INVALID_PARAMS``.
        PermanentJobError: ``INPUT_TOO_LARGE``, ``UNSUPPORTED_FORMAT``, ``CORRUPT_INPUT`` (from
            :func:`~hypermedia.engines.media.sources.open_media`; more than
            :data:`~hypermedia.engines.media.decoding.MAX_ERROR_RATE` of the packets do not decode; an
            audio stream with no sample), ``NO_AUDIO_STREAM``, ``MEDIA_TOO_LONG`` (the duration, or
            more than :data:`MAX_PEAK_VALUES`).
        MemoryError: FFmpeg hit the sandbox's memory limit.
    """
    options = validate_params(operation, params)
    check_size(input_path, limits)
    with open_media(input_path) as container:
        stream = audio_stream(container, "to draw a waveform of")
        index = stream.index
        declared_seconds = header_seconds(container, stream)
        check_duration(declared_seconds, limits)
        total_samples: int | None = None
        if options["buckets"] is not None:
            total_samples = _count_samples(container, stream, declared_seconds, limits)
    with open_media(input_path) as container:
        audio = container.streams[index]
        assert isinstance(audio, AudioStream)
        errors = DecodeErrors()
        peaks = _decode(audio, options, total_samples, declared_seconds, limits, errors)
    mins, maxs = peaks.result()
    channels, length = mins.shape
    duration = round(peaks.samples / peaks.rate, 6)
    report = {
        "version": JSON_VERSION,
        "sample_rate": peaks.rate,
        "channels": channels,
        "channel_mode": options["channels"],
        "buckets_per_second": round(peaks.rate / peaks.samples_per_bucket, 6),
        "samples_per_bucket": round(peaks.samples_per_bucket, 6),
        "duration_seconds": duration,
        "length": length,
        "data": [_interleave(mins[c], maxs[c]) for c in range(channels)],
    }
    data = json.dumps(report, separators=(",", ":")).encode()
    (out_dir / "waveform.json").write_bytes(data)
    common = {
        "duration_seconds": duration,
        "channels": channels,
        "length": length,
        "decode_errors": errors.count,
    }
    outputs = [
        OutputFile(
            "peaks",
            "waveform.json",
            JSON_MIME,
            {**common, "sample_rate": peaks.rate, "size_bytes": len(data)},
        )
    ]
    image = options["image"]
    if image:  # False: no PNG (the normalised form)
        _write_png(out_dir / "waveform.png", mins, maxs, image)
        outputs.append(
            OutputFile(
                "waveform",
                "waveform.png",
                PNG_MIME,
                {**common, "width": image["width"], "height": image["height"]},
            )
        )
    return outputs


# --- the stream and its duration -----------------------------------------------------------------


def _count_samples(
    container: InputContainer, stream: AudioStream, declared_seconds: float | None, limits: MediaLimits
) -> int:
    """Samples per channel of the stream, from its packets' timestamps (module doc, step 2).

    Raises:
        PermanentJobError: ``MEDIA_TOO_LONG``; ``CORRUPT_INPUT`` when demuxing fails or finds no
            timed packet and the header has no duration.
    """
    rate = stream.codec_context.sample_rate
    time_base = stream.time_base or Fraction(1, rate or 1)
    start: int | None = None
    end: int | None = None
    packets = 0
    capped = False
    try:
        for packet in container.demux(stream):
            if packet.size == 0 or packet.pts is None:
                continue
            packets += 1
            if packets > limits.max_probe_packets:
                capped = True
                break
            last = packet.pts + (packet.duration or 0)
            start = packet.pts if start is None else min(start, packet.pts)
            end = last if end is None else max(end, last)
            check_duration(float((end - start) * time_base), limits)
    except MemoryError:  # av.error.MemoryError is one, and an FFmpegError: not CORRUPT_INPUT
        raise
    except av.error.FFmpegError as exc:
        raise _corrupt() from exc
    seconds = float((end - start) * time_base) if start is not None and end is not None else None
    if declared_seconds is not None and (seconds is None or (capped and declared_seconds > seconds)):
        seconds = declared_seconds
    if not seconds or not rate:
        raise PermanentJobError("The audio stream holds no samples.", "CORRUPT_INPUT")
    return max(1, round(seconds * rate))


def _channels(frame: av.AudioFrame) -> np.ndarray:
    """A packed float frame (``flt``: one plane, channels interleaved) as an array of shape
    (channels, samples). Packed on purpose: PyAV 18 counts the planes of a planar frame with 8 or
    more channels wrongly and reads pointers past them (a 7.1 file crashed the job, a 16-channel
    one returned memory that was not audio), so nothing here touches more than plane 0."""
    channels = len(frame.layout.channels)
    data = np.frombuffer(memoryview(frame.planes[0]), dtype=np.float32, count=frame.samples * channels)
    return data.reshape(frame.samples, channels).T


def _corrupt() -> PermanentJobError:
    return PermanentJobError("The audio stream is damaged: its packets cannot be decoded.", "CORRUPT_INPUT")


# --- decoding and buckets ------------------------------------------------------------------------


class _Peaks:
    """Min/max per bucket per channel, reduced batch by batch.

    Invariant: buckets ``[0, done)`` are in the chunks; the batches so far end inside bucket
    ``done`` (``pending_*``), the one the next sample may still fall in.
    """

    def __init__(
        self, channels: int, rate: int, numerator: int, denominator: int, total_buckets: int | None
    ) -> None:
        self.channels = channels
        self.rate = rate
        self.numerator = numerator
        self.denominator = denominator
        self.total_buckets = total_buckets
        self.samples_per_bucket = denominator / numerator
        self.samples = 0
        self.done = 0
        self.chunks: list[_Chunk] = []
        self.pending: _Chunk | None = None
        self.last = np.zeros(channels, np.float32)
        self.limit_buckets = MAX_PEAK_VALUES // (2 * channels)

    def bucket_of(self, first: int, count: int) -> np.ndarray:
        ids = np.arange(first, first + count, dtype=np.int64) * self.numerator // self.denominator
        if self.total_buckets is not None:
            np.minimum(ids, self.total_buckets - 1, out=ids)
        return ids

    def add(self, block: np.ndarray) -> None:
        """Adds ``block`` (channels × samples, float32), the samples after those added so far."""
        count = block.shape[1]
        if count == 0:
            return
        ids = self.bucket_of(self.samples, count)
        starts = np.concatenate(([0], np.flatnonzero(np.diff(ids)) + 1))
        seg_ids = ids[starts]
        seg_min = np.minimum.reduceat(block, starts, axis=1)
        seg_max = np.maximum.reduceat(block, starts, axis=1)
        seg_last = block[:, np.append(starts[1:], count) - 1]
        self.samples += count
        if self.pending is not None and seg_ids[0] == self.done:  # the pending bucket goes on
            low, high = self.pending
            seg_min[:, 0] = np.minimum(seg_min[:, 0], low)
            seg_max[:, 0] = np.maximum(seg_max[:, 0], high)
        elif self.pending is not None:  # the pending bucket is complete: it leads the segments
            low, high = self.pending
            seg_ids = np.concatenate(([self.done], seg_ids))
            seg_min = np.concatenate((low[:, None], seg_min), axis=1)
            seg_max = np.concatenate((high[:, None], seg_max), axis=1)
            seg_last = np.concatenate((self.last[:, None], seg_last), axis=1)
        self._emit(seg_ids[:-1], seg_min[:, :-1], seg_max[:, :-1], seg_last[:, :-1], int(seg_ids[-1]))
        self.pending = (seg_min[:, -1].copy(), seg_max[:, -1].copy())
        self.last = block[:, -1].copy()

    def _emit(self, ids: np.ndarray, low: np.ndarray, high: np.ndarray, last: np.ndarray, upto: int) -> None:
        """Completes buckets ``[done, upto)``: ``ids`` (from ``done``, increasing) with their
        min/max; the empty buckets after each hold its last sample."""
        if upto == self.done:
            return
        if upto > self.limit_buckets:
            raise PermanentJobError(
                f"The waveform would have more than {self.limit_buckets} buckets per channel; ask for "
                "fewer buckets per second or a total number of buckets.",
                "MEDIA_TOO_LONG",
            )
        repeats = np.diff(np.append(ids, upto))
        new_low = np.repeat(last, repeats, axis=1)
        new_high = new_low.copy()
        positions = ids - self.done
        new_low[:, positions] = low
        new_high[:, positions] = high
        self.chunks.append((new_low, new_high))
        self.done = upto

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        """The peaks, channels × length each (the pending bucket completed)."""
        if self.pending is not None:
            low, high = self.pending
            ids = np.array([self.done])
            self._emit(ids, low[:, None], high[:, None], self.last[:, None], self.done + 1)
            self.pending = None
        if self.total_buckets is not None and self.done < self.total_buckets:  # past the audio
            rest = np.zeros((self.channels, self.total_buckets - self.done), np.float32)
            self.chunks.append((rest, rest))
            self.done = self.total_buckets
        mins = np.concatenate([low for low, _ in self.chunks], axis=1)
        maxs = np.concatenate([high for _, high in self.chunks], axis=1)
        return mins, maxs


def _decode(
    stream: AudioStream,
    options: dict[str, Any],
    total_samples: int | None,
    declared_seconds: float | None,
    limits: MediaLimits,
    errors: DecodeErrors,
) -> _Peaks:
    """Decodes the stream (one thread) into :class:`_Peaks`; a packet that does not decode is
    skipped and counted in ``errors`` (:class:`hypermedia.engines.media.decoding.DecodeErrors`).

    Raises:
        PermanentJobError: ``CORRUPT_INPUT`` (more than
            :data:`~hypermedia.engines.media.decoding.MAX_ERROR_RATE` of the packets do not decode; a
            frame's layout changes; no sample), ``MEDIA_TOO_LONG``.
    """
    container = stream.container
    assert isinstance(container, InputContainer)
    ctx = stream.codec_context
    ctx.thread_type = "NONE"
    ctx.thread_count = 1
    mix = options["channels"] == "mix"
    peaks: _Peaks | None = None
    resampler: av.AudioResampler | None = None
    batch: list[np.ndarray] = []
    batched = 0

    def flush() -> None:
        nonlocal batched
        if peaks is not None and batch:
            block = batch[0] if len(batch) == 1 else np.concatenate(batch, axis=1)
            batch.clear()
            batched = 0
            peaks.add(block)
            check_duration(peaks.samples / peaks.rate, limits)

    def take(frame: av.AudioFrame) -> None:
        nonlocal peaks, resampler, batched
        if resampler is None:
            peaks = _new_peaks(frame, options, total_samples, declared_seconds, mix)
            resampler = av.AudioResampler(format="flt", layout=frame.layout, rate=frame.sample_rate)
        for converted in resampler.resample(frame):
            samples = _channels(converted)
            if mix:
                samples = samples.mean(axis=0, keepdims=True, dtype=np.float32)
            batch.append(samples)
            batched += samples.shape[1]
        if batched >= BATCH_SAMPLES:
            flush()

    try:
        for frame in errors.decode(container, [stream]):
            take(frame)
        if resampler is not None and peaks is not None:
            for converted in resampler.resample(None):
                samples = _channels(converted)
                batch.append(samples.mean(axis=0, keepdims=True, dtype=np.float32) if mix else samples)
    except MemoryError:  # av.error.MemoryError is one, and an FFmpegError: not CORRUPT_INPUT
        raise
    except (av.error.FFmpegError, ValueError) as exc:  # ValueError: a frame's layout changed
        raise _corrupt() from exc
    flush()
    errors.check()
    if peaks is None or peaks.samples == 0:
        raise PermanentJobError("The audio stream holds no decodable samples.", "CORRUPT_INPUT")
    return peaks


def _new_peaks(
    frame: av.AudioFrame,
    options: dict[str, Any],
    total_samples: int | None,
    declared_seconds: float | None,
    mix: bool,
) -> _Peaks:
    rate = frame.sample_rate
    channels = 1 if mix else frame.layout.nb_channels
    if total_samples is not None:
        return _Peaks(channels, rate, options["buckets"], total_samples, options["buckets"])
    per_second = options["buckets_per_second"]
    if declared_seconds is not None:  # refuse before decoding what the limit refuses after
        expected = math.ceil(declared_seconds * per_second)
        if expected * 2 * channels > MAX_PEAK_VALUES:
            raise PermanentJobError(
                f"At {per_second} buckets per second the waveform of {declared_seconds:.0f} s would "
                f"have more than {MAX_PEAK_VALUES} values; ask for fewer buckets per second.",
                "MEDIA_TOO_LONG",
            )
    return _Peaks(channels, rate, per_second, rate, None)


def _interleave(mins: np.ndarray, maxs: np.ndarray) -> list[float]:
    pairs = np.empty(mins.size * 2, np.float64)
    pairs[0::2] = mins
    pairs[1::2] = maxs
    result: list[float] = np.round(np.clip(pairs, -1.0, 1.0), 4).tolist()
    return result


# --- the image -----------------------------------------------------------------------------------


def _write_png(path: Path, mins: np.ndarray, maxs: np.ndarray, image: dict[str, Any]) -> None:
    import pyvips  # here, not at import time: the module stays fork-safe and light

    pixels = _draw(mins, maxs, image)
    height, width, bands = pixels.shape
    vips = pyvips.Image.new_from_memory(pixels.data, width, height, bands, "uchar")
    vips.copy(interpretation="srgb").pngsave(str(path), keep="none")


def _draw(mins: np.ndarray, maxs: np.ndarray, image: dict[str, Any]) -> np.ndarray:
    """The waveform as a height × width × bands (3, or 4 for a transparent background) uint8 array."""
    width, height = image["width"], image["height"]
    channels, length = mins.shape
    starts = np.arange(width, dtype=np.int64) * length // width
    column_min = np.clip(np.minimum.reduceat(mins, starts, axis=1), -1.0, 1.0)
    column_max = np.clip(np.maximum.reduceat(maxs, starts, axis=1), -1.0, 1.0)
    color = _rgb(image["color"])
    transparent = image["background"] == "transparent"
    if transparent:
        pixels = np.empty((height, width, 4), np.uint8)
        pixels[:, :, :3] = color
        pixels[:, :, 3] = 0
        paint: Callable[[np.ndarray, np.ndarray], None] = _alpha_painter(color)
    else:
        background = _rgb(image["background"])
        pixels = np.empty((height, width, 3), np.uint8)
        pixels[:, :] = background
        paint = _blend_painter(color, background)
    for channel in range(channels):
        y0 = round(channel * height / channels)
        y1 = round((channel + 1) * height / channels)
        lane = y1 - y0
        if lane <= 0:
            continue
        top = (1.0 - column_max[channel]) / 2 * lane  # rows from the lane's top, continuous
        bottom = (1.0 - column_min[channel]) / 2 * lane
        for r0 in range(0, lane, _ROW_BLOCK):
            rows = np.arange(r0, min(r0 + _ROW_BLOCK, lane), dtype=np.float32)[:, None]
            coverage = np.clip(np.minimum(bottom, rows + 1) - np.maximum(top, rows), 0.0, 1.0)
            paint(pixels[y0 + r0 : y0 + r0 + len(rows)], coverage)
    return pixels


def _alpha_painter(color: np.ndarray) -> Callable[[np.ndarray, np.ndarray], None]:
    def paint(region: np.ndarray, coverage: np.ndarray) -> None:
        region[:, :, 3] = np.rint(coverage * 255).astype(np.uint8)

    return paint


def _blend_painter(color: np.ndarray, background: np.ndarray) -> Callable[[np.ndarray, np.ndarray], None]:
    difference = color.astype(np.float32) - background.astype(np.float32)

    def paint(region: np.ndarray, coverage: np.ndarray) -> None:
        region[:] = np.rint(background + coverage[:, :, None] * difference).astype(np.uint8)

    return paint


def _rgb(value: str) -> np.ndarray:
    return np.array([int(value[i : i + 2], 16) for i in (1, 3, 5)], np.uint8)
