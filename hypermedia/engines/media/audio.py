"""The ``transcode_audio`` operation: one file's sound as AAC, MP3 or Opus, loudness-normalised on
request (issue 7).

``run("transcode_audio", params, input_path, out_dir, limits=…)`` decodes the first audio stream
that is not a cover picture (video files' sound too) and encodes it at 48 kHz, mono or stereo, at
the requested bit rate, with nothing of the source's metadata (no tags, no cover art).

1. **Checks** before FFmpeg reads the file: the params
   (:func:`hypermedia.engines.media.params.validate_params`); the file's size (``INPUT_TOO_LARGE``).
   Opening is :func:`hypermedia.engines.media.sources.open_media`'s: the local file only, the allowlisted
   demuxers only. No audio stream is ``NO_AUDIO_STREAM``; one in a codec this FFmpeg has no decoder
   for is ``UNSUPPORTED_FORMAT``. A header duration over :attr:`MediaLimits.max_duration_seconds`
   is ``MEDIA_TOO_LONG`` before anything is decoded, and so is a file whose packets span longer
   (one demux pass reading every timestamp, nothing decoded:
   :func:`hypermedia.engines.media.sources.demux_span` — a header that understates the length); while
   decoding, the converted samples so far are checked against it too (a header without a duration, or one FFmpeg only estimates), with
   :func:`hypermedia.engines.media.sources.check_duration`.
2. **Conversion**: every decoded frame goes through an FFmpeg filter graph of one thread,
   ``abuffer → aformat → abuffersink``: libswresample (which ``aformat`` inserts) resamples to
   48 kHz, mixes down (or up) to ``mono`` or ``stereo`` with FFmpeg's default matrix, and converts
   to the encoder's sample format. This is what :class:`av.AudioResampler` builds, but PyAV's
   resampler leaves its graph at FFmpeg's default thread count (0: a slice-thread pool of one
   thread per CPU, started whether a filter uses it or not), which the job's ``RLIMIT_NPROC``
   would have to hold. PyAV's encoder still builds one such graph of its own (to cut frames to the
   codec's frame size) that cannot be given a thread count. A frame whose format,
   layout or rate differs from the one before (a broadcast recording switching from 5.1 to
   stereo) gets a new graph after the old one is flushed. Samples are placed one after the other
   from 0 (timestamps are not consulted: a gap in them is not a gap in the output), so the output
   lasts as many samples as were decoded. A packet that does not decode (a damaged MP3 frame) is
   skipped and counted (``decode_errors``), as FFmpeg's command line and players go on past it;
   more than :data:`~hypermedia.engines.media.decoding.MAX_ERROR_RATE` of them (FFmpeg's
   ``-max_error_rate``) is ``CORRUPT_INPUT`` (:class:`hypermedia.engines.media.decoding.DecodeErrors`).
3. **Loudness** (``loudness`` given), linear and in two passes over the decoded audio, following
   EBU R 128 (2020) with the measurement of ITU-R BS.1770-4:

   * pass 1 converts the audio as in step 2 and measures the *integrated loudness* with FFmpeg's
     ``ebur128`` filter (K-weighting, 400 ms blocks, −70 LUFS absolute and −10 LU relative gates;
     read from the ``lavfi.r128.I`` frame metadata of ``metadata=1``, final after the last frame)
     and the *true peak*: the largest magnitude of the signal oversampled to 192 kHz by
     libswresample (:data:`TRUE_PEAK_RATE`; BS.1770-4 Annex 2 asks for at least 4× at 48 kHz).
     That is the measurement ``ebur128``'s ``peak=true`` makes, done here because the filter
     prints it into its metadata linear with three decimals (``lavfi.r128.true_peaks_ch0`` =
     ``0.012`` for −38.2 dBTP: 0.2 dB off).
   * the gain is ``target_lufs − I``, lowered when ``true peak + gain`` would pass
     ``true_peak_db`` to exactly that ceiling (``limited_by_true_peak``: the output is then
     quieter than the target; nothing is compressed or limited sample by sample). Audio with no
     block above the absolute gate (silence; ``ebur128`` reports −70 LUFS) gets no gain.
   * pass 2 decodes again, applies the gain in the conversion graph (``volume``, in float, after
     ``aformat``) and measures the integrated loudness of what goes to the encoder
     (``output_lufs``). The ceiling holds for that signal, not for the decoded output: a lossy
     codec moves peaks (FFmpeg's AAC encoder put an abrupt full-scale tone onset 4 dB higher) and
     levels (LAME at 128 kbit/s or less plays a pure tone 0.45 dB quieter; at 320, as sent).
4. **Encoding** with one thread: AAC-LC (FFmpeg's ``aac``) in MP4 with the index first
   (``movflags=+faststart``), MP3 (``libmp3lame``, CBR at the nearest MPEG-1 Layer III rate:
   100 kbit/s is written at 96; with its Xing/LAME frame, so players get the exact duration) or
   Opus (``libopus``) in Ogg. libopus takes at most 256 kbit/s per channel; a higher request
   (mono above 256) is encoded at that maximum and ``bitrate`` says so. The muxer writes its own
   ``encoder`` tag; nothing else is tagged.

Progress (:func:`hypermedia.sandbox.report_progress`) is the decoded time over the header's
duration (none before the end without one); when loudness is normalised, pass 1 is the first half
and pass 2, over the length pass 1 found, the second.

Runs FFmpeg on untrusted input: call :func:`run` in the sandbox child only. Importing this module
is fork-safe.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, Final

import av
import av.error
import numpy as np
from av.audio.frame import AudioFrame
from av.audio.stream import AudioStream
from av.container import InputContainer

from hypermedia.core.errors import InvalidArgument, PermanentJobError
from hypermedia.engines.contract import OutputFile, report_progress
from hypermedia.engines.media.decoding import DecodeErrors
from hypermedia.engines.media.params import validate_params
from hypermedia.engines.media.sources import (
    MediaLimits,
    audio_stream,
    check_duration,
    check_size,
    demux_span,
    header_seconds,
    open_media,
)

__all__ = [
    "FORMATS",
    "MAX_SAMPLE_MAGNITUDE",
    "OPUS_MAX_BITRATE_PER_CHANNEL",
    "SAMPLE_RATE",
    "SILENCE_LUFS",
    "TRUE_PEAK_RATE",
    "AudioConverter",
    "OutputFormat",
    "finite_samples",
    "run",
]

OPERATION: Final = "transcode_audio"
SAMPLE_RATE: Final = 48000
"""Sample rate of every output, in Hz."""
TRUE_PEAK_RATE: Final = 4 * SAMPLE_RATE
"""Rate the true peak is measured at: 4× oversampling, as ``ebur128`` does."""
SILENCE_LUFS: Final = -70.0
"""BS.1770-4's absolute gate: audio whose integrated loudness is not above it is silence (no gain)."""
OPUS_MAX_BITRATE_PER_CHANNEL: Final = 256_000
"""libopus refuses more (bit/s per channel)."""


@dataclass(frozen=True)
class OutputFormat:
    """One output format: its encoder, muxer and file."""

    codec: str
    """FFmpeg encoder."""
    sample_format: str
    """Sample format the encoder is fed (its float one)."""
    muxer: str
    """FFmpeg muxer."""
    muxer_options: dict[str, str]
    """Options of the muxer."""
    filename: str
    """The output's file name."""
    mime_type: str
    """The output's content type."""


FORMATS: Final[dict[str, OutputFormat]] = {
    "aac": OutputFormat("aac", "fltp", "mp4", {"movflags": "+faststart"}, "audio.m4a", "audio/mp4"),
    "mp3": OutputFormat("libmp3lame", "fltp", "mp3", {}, "audio.mp3", "audio/mpeg"),
    "opus": OutputFormat("libopus", "flt", "ogg", {}, "audio.opus", "audio/ogg"),
}
"""The ``format`` param → how it is written."""


def run(
    operation: str,
    params: dict,
    input_path: Path,
    out_dir: Path,
    *,
    limits: MediaLimits,
) -> list[OutputFile]:
    """Transcodes one file's audio into ``out_dir``.

    Args:
        operation: ``transcode_audio``.
        params: see :func:`hypermedia.engines.media.params.validate_params`: ``format``, ``bitrate``
            (kbit/s), ``channels`` (1 or 2), ``loudness`` (``target_lufs``, ``true_peak_db``, or
            none).
        input_path: the uploaded file (audio, or video with sound).
        out_dir: existing directory for the output.
        limits: size checked before FFmpeg reads the file; duration from the header before
            decoding and from the decoded samples while decoding.

    Returns:
        One :class:`OutputFile`, ``audio``: ``audio.m4a`` (``audio/mp4``), ``audio.mp3``
        (``audio/mpeg``) or ``audio.opus`` (``audio/ogg``). Metadata::

            {"format": "aac",              # aac | mp3 | opus
             "codec": "aac",               # FFmpeg's encoder: aac | libmp3lame | libopus
             "bitrate": 128000,            # bit/s asked of the encoder: the request (Opus: at most
                                           # 256 000 per channel)
             "sample_rate": 48000,         # Hz
             "channels": 2,
             "duration_seconds": 2.0,      # samples encoded / 48000
             "decode_errors": 0,           # packets of the source skipped: they did not decode
             "size_bytes": 41188,
             "loudness": {                 # only when normalised
                 "input_lufs": -20.1,      # integrated loudness (LUFS) of the converted input;
                                           # null when silent (not above −70 LUFS)
                 "input_true_peak_db": -4.2,   # dBTP; null when every sample is 0
                 "gain_db": -2.9,          # applied; 0 when silent
                 "output_lufs": -23.0,     # measured after the gain, before encoding; null when silent
                 "target_lufs": -23.0,
                 "true_peak_db": -1.0,     # the ceiling asked for
                 "limited_by_true_peak": false}}

        Loudness values are rounded to 2 decimals.

    Raises:
        InvalidArgument: ``UNKNOWN_OPERATION``, ``INVALID_PARAMS``.
        PermanentJobError: ``INPUT_TOO_LARGE``, ``UNSUPPORTED_FORMAT`` (from
            :func:`~hypermedia.engines.media.sources.open_media`; audio without a decoder),
            ``CORRUPT_INPUT`` (from :func:`~hypermedia.engines.media.sources.open_media`; more than
            :data:`~hypermedia.engines.media.decoding.MAX_ERROR_RATE` of the packets do not decode; no
            sample decoded), ``NO_AUDIO_STREAM``, ``MEDIA_TOO_LONG``.
        MemoryError: FFmpeg hit the sandbox's memory limit.
    """
    if operation != OPERATION:
        raise InvalidArgument(f"unknown operation {operation!r}", "UNKNOWN_OPERATION")
    options = validate_params(operation, params)
    audio_format = FORMATS[options["format"]]
    layout = "mono" if options["channels"] == 1 else "stereo"
    bitrate = options["bitrate"] * 1000
    if audio_format.codec == "libopus":
        bitrate = min(bitrate, OPUS_MAX_BITRATE_PER_CHANNEL * options["channels"])
    loudness = options["loudness"]
    check_size(input_path, limits)
    with open_media(input_path) as container:
        stream = audio_stream(container, "to transcode")
        index = stream.index
        declared_seconds = header_seconds(container, stream)
        check_duration(declared_seconds, limits)
        # Every packet's timestamp, nothing decoded: a header that understates the length is
        # MEDIA_TOO_LONG here, not after hours of decoding against the CPU limit.
        demux_span(container, limits)
    with open_media(input_path) as container:
        sound = container.streams[index]
        assert isinstance(sound, AudioStream)
        measured: _Loudness | None = None
        if loudness is not None:
            progress = _progress(out_dir, declared_seconds, 0.0, 0.5)
            measured = _measure(sound, audio_format.sample_format, layout, limits, progress)
    gain_db, limited = 0.0, False
    if loudness is not None and measured is not None:
        gain_db, limited = _gain(measured, loudness["target_lufs"], loudness["true_peak_db"])
    path = out_dir / audio_format.filename
    with open_media(input_path) as container:
        source = container.streams[index]
        assert isinstance(source, AudioStream)
        if measured is not None:  # pass 2: the length is known now
            progress = _progress(out_dir, measured.samples / SAMPLE_RATE, 0.5, 0.5)
        else:
            progress = _progress(out_dir, declared_seconds, 0.0, 1.0)
        errors = DecodeErrors()
        written = _encode(
            source,
            audio_format,
            layout,
            bitrate,
            gain_db,
            loudness is not None,
            path,
            limits,
            progress,
            errors,
        )
    report_progress(out_dir, 1.0)
    metadata: dict[str, Any] = {
        "format": options["format"],
        "codec": audio_format.codec,
        "bitrate": bitrate,
        "sample_rate": SAMPLE_RATE,
        "channels": options["channels"],
        "duration_seconds": round(written.samples / SAMPLE_RATE, 6),
        "decode_errors": errors.count,
        "size_bytes": path.stat().st_size,
    }
    if loudness is not None and measured is not None:
        metadata["loudness"] = {
            "input_lufs": _round(measured.lufs),
            "input_true_peak_db": _round(measured.true_peak_db),
            "gain_db": round(gain_db, 2),
            "output_lufs": _round(written.lufs),
            "target_lufs": loudness["target_lufs"],
            "true_peak_db": loudness["true_peak_db"],
            "limited_by_true_peak": limited,
        }
    return [OutputFile("audio", audio_format.filename, audio_format.mime_type, metadata)]


# --- the stream ----------------------------------------------------------------------------------


# --- filter graphs -------------------------------------------------------------------------------


def _graph(source: AudioFrame | tuple[str, str, int], filters: list[tuple[str, str]]) -> av.filter.Graph:
    """``abuffer → filters → abuffersink``, configured, in one thread. ``source`` is a frame of
    the input, or its (sample format, layout, rate)."""
    if isinstance(source, AudioFrame):
        source = (source.format.name, source.layout.name, source.sample_rate)
    sample_format, layout, rate = source
    graph = av.filter.Graph()
    graph.threads = 1  # before any filter is added; 0 (FFmpeg's default) starts a thread per CPU
    nodes = [
        graph.add_abuffer(format=sample_format, layout=layout, sample_rate=rate, time_base=Fraction(1, rate))
    ]
    nodes += [graph.add(name, args) for name, args in filters]
    nodes.append(graph.add("abuffersink"))
    graph.link_nodes(*nodes)
    graph.configure()
    return graph


def _pull(graph: av.filter.Graph) -> Iterator[AudioFrame]:
    """The frames the graph has ready (all that are left once ``None`` was pushed)."""
    while True:
        try:
            frame = graph.pull()
        except (av.error.BlockingIOError, av.error.EOFError):  # EAGAIN: needs input; EOF: flushed
            return
        assert isinstance(frame, AudioFrame)
        yield frame


MAX_SAMPLE_MAGNITUDE: Final = 4.0
"""Largest float sample passed on (+12 dBFS): louder samples are clipped to it, NaN and infinities
become 0. Float PCM may hold any value; FFmpeg's AAC encoder refuses non-finite samples (EINVAL)
and LAME aborts on them or on huge ones (an assertion in its psychoacoustic model)."""
_FLOAT_FORMATS: Final = frozenset({"flt", "fltp", "dbl", "dblp"})


def finite_samples(frame: AudioFrame) -> AudioFrame:
    """``frame`` itself when its samples are integers or finite floats within
    :data:`MAX_SAMPLE_MAGNITUDE`; else a copy with NaN and infinities as 0 and the rest clipped."""
    if frame.format.name not in _FLOAT_FORMATS:
        return frame
    samples = frame.to_ndarray()
    if np.isfinite(samples).all() and float(np.abs(samples).max(initial=0.0)) <= MAX_SAMPLE_MAGNITUDE:
        return frame
    cleaned = np.clip(
        np.nan_to_num(samples, nan=0.0, posinf=0.0, neginf=0.0), -MAX_SAMPLE_MAGNITUDE, MAX_SAMPLE_MAGNITUDE
    )
    copy = AudioFrame.from_ndarray(
        cleaned.astype(samples.dtype), format=frame.format.name, layout=frame.layout
    )
    copy.sample_rate, copy.pts, copy.time_base = frame.sample_rate, frame.pts, frame.time_base
    return copy


class AudioConverter:
    """Decoded frames → 48 kHz frames of ``layout`` in ``sample_format``, the gain applied
    (module doc, steps 2 and 3)."""

    def __init__(self, sample_format: str, layout: str, gain_db: float) -> None:
        self.layout = layout
        self.filters = [
            ("aformat", f"sample_fmts={sample_format}:channel_layouts={layout}:sample_rates={SAMPLE_RATE}")
        ]
        if gain_db:
            self.filters.append(("volume", f"volume={gain_db:.6f}dB:precision=float"))
        self.graph: av.filter.Graph | None = None
        self.source: tuple[str, str, int] | None = None
        self.pts = 0

    def convert(self, frame: AudioFrame | None) -> list[AudioFrame]:
        """The converted frames ready after ``frame`` (``None``: the end; every frame left).

        Raises:
            PermanentJobError: ``UNSUPPORTED_FORMAT`` for a channel layout FFmpeg's filters cannot
                take (32 channels without a named layout).
        """
        converted: list[AudioFrame] = []
        if frame is None:
            if self.graph is not None:
                self.graph.push(None)
                converted.extend(_pull(self.graph))
                self.graph = None
            return converted
        source = (frame.format.name, frame.layout.name, frame.sample_rate)
        if source != self.source:
            converted.extend(self.convert(None))
            try:
                self.graph = _graph(source, self.filters)
            except MemoryError:
                raise
            except av.error.FFmpegError as exc:
                raise PermanentJobError(
                    f"The audio ({frame.layout.nb_channels} channels, layout {frame.layout.name!r}, "
                    f"{frame.sample_rate} Hz) cannot be converted to {self.layout}.",
                    "UNSUPPORTED_FORMAT",
                ) from exc
            self.source = source
            self.pts = 0
        frame = finite_samples(frame)
        assert self.graph is not None
        frame.pts = self.pts  # contiguous: the input's timestamps are not consulted
        frame.time_base = Fraction(1, frame.sample_rate)
        self.pts += frame.samples
        self.graph.push(frame)
        converted.extend(_pull(self.graph))
        return converted


def _converted(
    stream: AudioStream,
    converter: AudioConverter,
    limits: MediaLimits,
    progress: Callable[[int], None],
    errors: DecodeErrors,
) -> Iterator[AudioFrame]:
    """The stream decoded (one thread) and converted, with timestamps in samples at 48 kHz from 0.
    A packet that does not decode is skipped and counted in ``errors``
    (:class:`hypermedia.engines.media.decoding.DecodeErrors`), as FFmpeg's command line goes on past it.

    Raises:
        PermanentJobError: ``CORRUPT_INPUT`` (more than
            :data:`~hypermedia.engines.media.decoding.MAX_ERROR_RATE` of the packets do not decode; the
            demuxer fails before any; no sample at all), ``MEDIA_TOO_LONG``.
    """
    container = stream.container
    assert isinstance(container, InputContainer)
    ctx = stream.codec_context
    ctx.thread_type = "NONE"
    ctx.thread_count = 1
    samples = 0
    for decoded in errors.decode(container, [stream]):
        for frame in converter.convert(decoded):
            frame.pts, frame.time_base = samples, Fraction(1, SAMPLE_RATE)
            samples += frame.samples
            check_duration(samples / SAMPLE_RATE, limits)
            progress(samples)
            yield frame
    for frame in converter.convert(None):
        frame.pts, frame.time_base = samples, Fraction(1, SAMPLE_RATE)
        samples += frame.samples
        yield frame
    errors.check()
    if samples == 0:
        raise PermanentJobError("The audio stream holds no decodable samples.", "CORRUPT_INPUT")


def _progress(out_dir: Path, seconds: float | None, start: float, span: float) -> Callable[[int], None]:
    """A callback that reports ``start + span × decoded / seconds`` (nothing when the length is unknown)."""
    total = seconds * SAMPLE_RATE if seconds else None

    def report(samples: int) -> None:
        if total is not None:
            report_progress(out_dir, start + span * min(1.0, samples / total))

    return report


# --- loudness ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Loudness:
    """What a pass measured."""

    samples: int
    """Converted samples (per channel) at 48 kHz."""
    lufs: float | None
    """Integrated loudness (BS.1770-4), or None when not above :data:`SILENCE_LUFS`."""
    true_peak_db: float | None
    """dBTP, or None when not measured or every sample is 0."""


class _Meter:
    """Integrated loudness with FFmpeg's ``ebur128``, and the true peak (module doc, step 3), of
    48 kHz frames of one layout and sample format."""

    def __init__(self, sample_format: str, layout: str, true_peak: bool) -> None:
        filters = [("ebur128", "metadata=1")]
        if true_peak:
            filters.append(("aresample", str(TRUE_PEAK_RATE)))
        self.graph = _graph((sample_format, layout, SAMPLE_RATE), filters)
        self.true_peak = true_peak
        self.peak = 0.0
        self.integrated: str | None = None

    def add(self, frame: AudioFrame | None) -> None:
        """Measures ``frame`` (``None``: the end)."""
        self.graph.push(frame)
        for measured in _pull(self.graph):
            value = measured.metadata.get("lavfi.r128.I")
            if value is not None:
                self.integrated = value
            if self.true_peak:
                self.peak = max(self.peak, float(np.abs(measured.to_ndarray()).max(initial=0.0)))

    def result(self, samples: int) -> _Loudness:
        self.add(None)
        lufs = float(self.integrated) if self.integrated is not None else None
        if lufs is not None and not (math.isfinite(lufs) and lufs > SILENCE_LUFS):
            lufs = None
        peak_db = 20 * math.log10(self.peak) if self.true_peak and self.peak > 0 else None
        return _Loudness(samples, lufs, peak_db)


def _measure(
    stream: AudioStream, sample_format: str, layout: str, limits: MediaLimits, progress: Callable[[int], None]
) -> _Loudness:
    """Pass 1: integrated loudness and true peak of the converted stream.

    Raises:
        PermanentJobError: ``CORRUPT_INPUT``, ``MEDIA_TOO_LONG``.
    """
    meter = _Meter(sample_format, layout, true_peak=True)
    samples = 0
    converter = AudioConverter(sample_format, layout, 0.0)
    for frame in _converted(stream, converter, limits, progress, DecodeErrors()):
        meter.add(frame)
        samples += frame.samples
    return meter.result(samples)


def _gain(measured: _Loudness, target_lufs: float, true_peak_db: float) -> tuple[float, bool]:
    """The gain in dB that brings ``measured`` to ``target_lufs`` with its true peak at most
    ``true_peak_db``, and whether the peak lowered it. Silence: 0."""
    if measured.lufs is None:
        return 0.0, False
    gain = target_lufs - measured.lufs
    if measured.true_peak_db is not None and measured.true_peak_db + gain > true_peak_db:
        return true_peak_db - measured.true_peak_db, True
    return gain, False


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


# --- encoding ------------------------------------------------------------------------------------


def _encode(
    stream: AudioStream,
    audio_format: OutputFormat,
    layout: str,
    bitrate: int,
    gain_db: float,
    meter_output: bool,
    path: Path,
    limits: MediaLimits,
    progress: Callable[[int], None],
    errors: DecodeErrors,
) -> _Loudness:
    """Decodes, converts (with the gain) and encodes the stream into ``path``; the packets
    skipped are counted in ``errors``.

    Returns:
        The samples encoded, and their integrated loudness when ``meter_output``.

    Raises:
        PermanentJobError: ``CORRUPT_INPUT``, ``MEDIA_TOO_LONG``.
    """
    meter = _Meter(audio_format.sample_format, layout, true_peak=False) if meter_output else None
    samples = 0
    with av.open(
        str(path), "w", format=audio_format.muxer, options=dict(audio_format.muxer_options)
    ) as output:
        encoded = output.add_stream(audio_format.codec, rate=SAMPLE_RATE, layout=layout)
        assert isinstance(encoded, AudioStream)
        encoded.format = audio_format.sample_format
        encoded.bit_rate = bitrate
        encoded.codec_context.thread_type = "NONE"
        encoded.codec_context.thread_count = 1
        converter = AudioConverter(audio_format.sample_format, layout, gain_db)
        for frame in _converted(stream, converter, limits, progress, errors):
            if meter is not None:
                meter.add(frame)
            samples += frame.samples
            output.mux(encoded.encode(frame))
        output.mux(encoded.encode(None))
    if meter is None:
        return _Loudness(samples, None, None)
    return meter.result(samples)
