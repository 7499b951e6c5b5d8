"""Media clips the tests write with PyAV (and FFmpeg's command line, :func:`write_testsrc`)."""

from __future__ import annotations

import asyncio
import math
import secrets
import subprocess
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import av.error
import numpy as np
from av.stream import Disposition

from hypermedia.engines.contract import report_progress
from hypermedia.engines.media.params import validate_params
from hypermedia.jobs.lifecycle import ClaimedJob
from tests.helpers.jobs import claimed_job

RATE = 48000


def write_testsrc(path: Path, *extra: str, seconds: int = 24, fps: int = 25, gop: int = 25) -> Path:
    """``seconds`` of FFmpeg's moving ``testsrc2`` at ``fps``, 320×240, H.264 (``veryfast``: with
    B-frames) with a keyframe every ``gop`` frames, and a 440 Hz sine in AAC at 44.1 kHz; ``extra``
    are more output options of ``ffmpeg`` (``-f matroska``). For transcodes cut into chunks."""
    picture = ["-f", "lavfi", "-i", f"testsrc2=size=320x240:rate={fps}"]
    sound = ["-f", "lavfi", "-i", "sine=frequency=440:sample_rate=44100"]
    video = ["-c:v", "libx264", "-preset", "veryfast", "-g", str(gop), "-pix_fmt", "yuv420p"]
    subprocess.run(
        [
            "ffmpeg",
            "-v",
            "error",
            "-y",
            *picture,
            *sound,
            "-t",
            str(seconds),
            *video,
            "-c:a",
            "aac",
            *extra,
            str(path),
        ],
        check=True,
    )
    return path


def _pattern(i: int, width: int, height: int) -> np.ndarray:
    image = np.zeros((height, width, 3), np.uint8)
    image[:, : (i * 8) % width] = (200, 120, 40)
    image[: height // 2, :, 2] = 255
    return image


def _mux_audio(container: Any, stream: Any, seconds: float, noise_seconds: float = 0.0) -> None:
    """A 440 Hz sine (noise for the first ``noise_seconds``) on both channels."""
    total = round(seconds * RATE)
    rng = np.random.default_rng(7)
    pts = 0
    while pts < total:
        n = min(1024, total - pts)
        if pts < noise_seconds * RATE:
            samples = rng.uniform(-0.8, 0.8, n).astype(np.float32)
        elif noise_seconds:
            samples = np.zeros(n, np.float32)
        else:
            t = np.arange(pts, pts + n) / RATE
            samples = (0.3 * np.sin(2 * math.pi * 440 * t)).astype(np.float32)
        frame = av.AudioFrame.from_ndarray(np.stack([samples, samples]), format="fltp", layout="stereo")
        frame.sample_rate = RATE
        frame.pts = pts
        pts += n
        container.mux(stream.encode(frame))
    container.mux(stream.encode(None))


def write_video(
    path: Path,
    *,
    seconds: float = 2.0,
    width: int = 320,
    height: int = 240,
    fps: int = 25,
    pix_fmt: str = "yuv420p",
    rotation: float | None = None,
    audio: bool = True,
    container_format: str | None = None,
    options: dict[str, str] | None = None,
    fill: int | None = None,
    first_pts: int = 0,
    sar: Fraction | None = None,
    gop: int | None = None,
) -> Path:
    """H.264 (libx264) test pattern, or a flat grey ``fill`` picture, with an AAC sine at 48 kHz
    stereo when ``audio``; frames stamped from ``first_pts`` (in frames), the sample aspect ratio
    ``sar`` in the SPS; a keyframe every ``gop`` frames (x264's default: 250)."""
    with av.open(str(path), "w", format=container_format, options=options or {}) as container:
        video = container.add_stream("libx264", rate=fps)
        video.width, video.height, video.pix_fmt = width, height, pix_fmt
        video.options = {"preset": "ultrafast"}
        if gop is not None:
            video.codec_context.gop_size = gop
        if rotation is not None:
            video.set_display_rotation(rotation)
        if sar is not None:
            video.codec_context.sample_aspect_ratio = sar
        sound = container.add_stream("aac", rate=RATE, layout="stereo") if audio else None
        for i in range(round(seconds * fps)):
            image = (
                _pattern(i, width, height) if fill is None else np.full((height, width, 3), fill, np.uint8)
            )
            frame = av.VideoFrame.from_ndarray(image, format="rgb24")
            frame = frame.reformat(format=pix_fmt)
            frame.pts = first_pts + i
            container.mux(video.encode(frame))
        container.mux(video.encode(None))
        if sound is not None:
            _mux_audio(container, sound, seconds)
    return path


def write_mp3_with_cover(path: Path, seconds: float = 3.0) -> Path:
    """An MP3 (LAME) whose ID3v2 tag holds a PNG cover: a stream with the ``attached_pic``
    disposition whose one packet the mp3 muxer writes as an APIC frame."""
    encoder = av.CodecContext.create("png", "w")
    encoder.width, encoder.height, encoder.pix_fmt = 64, 64, "rgb24"
    encoder.time_base = Fraction(1, 25)
    frame = av.VideoFrame.from_ndarray(np.full((64, 64, 3), (200, 30, 30), np.uint8), format="rgb24")
    frame.pts = 0
    cover = encoder.encode(frame) + encoder.encode(None)
    with av.open(str(path), "w", format="mp3") as container:
        sound = container.add_stream("libmp3lame", rate=RATE, layout="stereo")
        picture = container.add_mux_stream("png", width=64, height=64)
        picture.disposition = Disposition.attached_pic
        picture.time_base = Fraction(1, 90000)
        for packet in cover:
            packet.stream = picture
            packet.pts = packet.dts = 0
            container.mux(packet)
        _mux_audio(container, sound, seconds)
    return path


def write_adts(path: Path, seconds: float, noise_seconds: float) -> Path:
    """Raw ADTS AAC: no duration in any header; loud noise first, then silence, so that FFmpeg's
    estimate from the bit rate of the first frames is far off."""
    with av.open(str(path), "w", format="adts") as container:
        sound = container.add_stream("aac", rate=RATE, layout="stereo")
        _mux_audio(container, sound, seconds, noise_seconds=noise_seconds)
    return path


LEFT, RIGHT = 0.5, 0.25


# (codec, container format, sample format, tolerance of the silent half)
LOSSLESS = {"wav": ("pcm_s16le", "wav", "s16"), "flac": ("flac", "flac", "s16")}


def write_tone(path: Path, codec: str, container_format: str, sample_format: str, rate: int = RATE) -> Path:
    """1 s of a 1 kHz sine (amplitude 0.5 left, 0.25 right), then 1 s of silence: stereo."""
    total = 2 * rate
    with av.open(str(path), "w", format=container_format) as container:
        stream = container.add_stream(codec, rate=rate, layout="stereo")
        stream.format = sample_format
        pts = 0
        while pts < total:
            n = min(1024, total - pts)
            t = np.arange(pts, pts + n) / rate
            sine = np.where(t < 1.0, np.sin(2 * math.pi * 1000 * t), 0.0)
            planes = np.stack([LEFT * sine, RIGHT * sine]).astype(np.float32)
            frame = av.AudioFrame.from_ndarray(planes, format="fltp", layout="stereo")
            frame.sample_rate = rate
            frame.pts = pts
            pts += n
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    return path


def _remux(source: Path, target: Path, change: Any, tail: Any = None) -> Path:
    """``source``'s packets into Matroska ``target``, each passed through ``change(packet)``
    (a replacement packet, or ``None`` to keep it); then the packets ``tail(last_audio_packet)``
    returns."""
    with av.open(str(source)) as inp, av.open(str(target), "w", format="matroska") as out:
        streams = {s.index: out.add_stream_from_template(s) for s in inp.streams}
        last_audio = None
        for packet in inp.demux():
            if packet.dts is None:
                continue
            item = change(packet) or packet
            item.stream = streams[packet.stream.index]
            out.mux(item)
            if packet.stream.type == "audio":
                last_audio = item
        for extra in tail(last_audio) if tail is not None else []:
            out.mux(extra)
    return target


def with_a_late_audio_packet(source: Path, target: Path, seconds: float = 5 * 3600) -> Path:
    """``source`` remuxed to Matroska with a copy of its last audio packet stamped at ``seconds``:
    a header that says the clip's length over packets that span hours."""

    def late(last: Any) -> list[Any]:
        echo = av.Packet(bytes(last))
        echo.pts = echo.dts = round(seconds / last.time_base)
        echo.time_base, echo.stream = last.time_base, last.stream
        return [echo]

    return _remux(source, target, lambda packet: None, late)


@dataclass
class Decoded:
    """What :func:`decode` measured: the first audio stream's codec, rate (Hz), channels, duration
    (s), integrated loudness (LUFS) and true peak (dBTP), every stream's type and the tags."""

    codec: str
    sample_rate: int
    channels: int
    seconds: float
    lufs: float
    true_peak_db: float
    streams: list[str]
    tags: dict[str, str]


def decode(path: Path) -> Decoded:
    """The file's audio decoded again, measured with ``ebur128`` (true peak: its 192 kHz peak)."""
    with av.open(str(path)) as container:
        streams = [str(stream.type) for stream in container.streams]
        tags = {**container.metadata, **container.streams.audio[0].metadata}
        audio = container.streams.audio[0]
        ctx = audio.codec_context
        graph = av.filter.Graph()
        graph.threads = 1
        nodes = [
            graph.add_abuffer(format="fltp", layout=ctx.layout.name, sample_rate=ctx.sample_rate),
            graph.add("ebur128", "metadata=1:peak=true"),
            graph.add("abuffersink"),
        ]
        graph.link_nodes(*nodes)
        graph.configure()
        samples = 0
        metadata: dict[str, str] = {}

        def pull() -> None:
            while True:
                try:
                    metadata.update(graph.pull().metadata)
                except (av.error.BlockingIOError, av.error.EOFError):
                    return

        for frame in container.decode(audio):
            samples += frame.samples
            frame.pts = None
            graph.push(frame)
            pull()
        graph.push(None)
        pull()
        peak = float(metadata["lavfi.r128.true_peak"])
        return Decoded(
            codec=ctx.name,
            sample_rate=ctx.sample_rate,
            channels=ctx.channels,
            seconds=samples / ctx.sample_rate,
            lufs=float(metadata["lavfi.r128.I"]),
            true_peak_db=20 * math.log10(peak) if peak > 0 else -math.inf,
            streams=streams,
            tags=tags,
        )


def media_job(operation: str, params: dict | None = None) -> ClaimedJob:
    """A claimed job of the media queue with the shipped profile's limits."""
    return claimed_job(
        operation,
        "media",
        job_id=secrets.token_hex(8),
        params=validate_params(operation, params or {}),
        timeout_seconds=1800,
        max_input_bytes=1 << 32,
        memory_limit_mb=8192,
    )


async def admitted_by(handler: Any, operation: str, within: float = 0.2) -> bool:
    """Whether ``handler`` admits a job of ``operation`` within ``within`` seconds (then left at once)."""
    try:
        async with asyncio.timeout(within):
            async with handler.admit(media_job(operation)):
                return True
    except TimeoutError:
        return False


def progress_seen(monkeypatch: Any, *modules: Any) -> list[float]:
    """The fractions the ``modules`` report (each module's ``report_progress``, watched: the
    real one still writes them), in order."""
    seen: list[float] = []

    def record(out_dir: Path, fraction: float) -> None:
        seen.append(fraction)
        report_progress(out_dir, fraction)

    for module in modules:
        monkeypatch.setattr(module, "report_progress", record)
    return seen
