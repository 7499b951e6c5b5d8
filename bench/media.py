"""Media transcodes (issue 7): the encode speed of ``transcode_video`` (1080p → 720p H.264) against
the ``ffmpeg`` command line with the same codec, preset, resolution and threads on the same input
(goal: at least 0.95× its speed), the speed of ``transcode_audio``, and the peak memory per job.

    .venv/bin/python bench/media.py [--runs 3] [--seconds 20] [--audio-seconds 60] [--threads 2]

1. **Inputs**, made here with PyAV (nothing is downloaded): ``--seconds`` (default 20) of 1080p25
   H.264 (libx264 CRF 18, preset superfast, about 12 Mbit/s: a panning multi-scale texture with
   a moving bar and ±2 of temporal grain, so x264 has real work) with AAC stereo 48 kHz sound,
   and ``--audio-seconds`` (default 60) of stereo 44.1 kHz 16-bit WAV (chords, an envelope, noise).
   A 1 s clip of the same kind warms every variant up first (page cache, shared libraries).
2. **Video, 1080p → 720p** (``veryfast``, CRF 23, AAC 128 kbit/s stereo 48 kHz, ``T`` =
   ``--threads`` threads), four variants, ``--runs`` times each, the order turned every round:

   * **ffmpeg CLI** (Debian's): ``ffmpeg -threads T -i in.mp4 -vf
     scale=1280:720:flags=bicubic,setsar=1,format=yuv420p -c:v libx264 -preset veryfast -crf 23
     -threads T -c:a aac -b:a 128k -ar 48000 -ac 2 -movflags +faststart``, with ``-filter_threads
     1`` and ``-fps_mode passthrough`` as the engine does it (decoder frame threads, one filter
     thread, timestamps passed through). Its wall time includes the process start (printed).
   * **bare PyAV**: the simplest loop over the same libraries as the engine (PyAV's bundled
     FFmpeg and x264): demux → decode (``T`` frame threads) → ``VideoFrame.reformat`` (bicubic,
     one thread) → libx264 (``T`` threads) → mux; audio through ``AudioStream.encode``. Engine /
     bare is the engine's own overhead; bare / ffmpeg is the version difference.
   * **engine**: :func:`hypermedia.engines.media.transcode.run` with ``{"heights": [720], "preset":
     "veryfast", "quality": 23}`` and ``MediaLimits(threads=T)``, in a fresh process.
   * **engine in the sandbox**: the same through :class:`hypermedia.sandbox.Sandbox` as the
     mediaworker runs it (warm zygote with ``av`` and the engine preloaded, a forked child per job
     with ``RLIMIT_AS`` 8 GiB as the profile, ``RLIMIT_NPROC`` =
     :func:`~hypermedia.engines.media.transcode.thread_need` + 16, its own uid and namespaces as root).

   Each run is timed (wall and CPU of the job's process and its threads; for the PyAV variants
   the call alone, without the interpreter's start) and its output checked (every frame, 1280 ×
   720); the x264 options each output records are compared. Beside each run, the cores the rest
   of the machine used meanwhile (its busy time, short-lived processes included, less the job's
   CPU). Speed factor = media seconds / wall seconds. Each ratio is given three ways: the median
   of the per-round ratios of wall times, the ratio of the fastest runs (the least disturbed),
   and the inverse ratio of CPU seconds (hardly moved by other load).
3. **Peak memory per job** (``ru_maxrss``: the sandbox's ``peak_memory_mb``, and ``wait4`` of the
   job's own process): 1080p → 720p (every run), 1080p → [1080, 720, 480, 360] (one run, in the
   sandbox) and the AAC transcode with and without loudness.
4. **Audio**: ``transcode_audio`` to AAC, MP3 and Opus at 128 kbit/s (48 kHz stereo), with and
   without ``loudness: true``, each in a fresh process, against ``ffmpeg -i in.wav -c:a aac -b:a
   128k -ar 48000 -ac 2 out.m4a`` (``libmp3lame``, ``libopus``), and against a bare PyAV loop
   (decode → ``AudioStream.encode`` → mux) that tells the engine from PyAV's builds of the
   encoders. With loudness the ffmpeg baseline is two runs: ``ebur128=peak=true`` to measure,
   then the same encode with ``volume``.

Ratios and tables, never timed assertions (see docs/performance.md). Without ``ffmpeg`` the bench
installs Debian's package as the Makefile installs Debian packages
(``scripts/ensure_debian_packages.sh``: only as root); still without it, only the PyAV variants
run. The job processes run this file with ``--job`` (only the standard library is imported at the
top, so that they start fast), each started through a small launcher (:data:`_LAUNCHER`) so that
its ``ru_maxrss`` is its own.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

GOAL = 0.95
"""Engine speed over the ffmpeg command line's (issue 7)."""
THREADS = 2
"""``MediaLimits.threads`` (the machine's cores here)."""
SOURCE_SIZE = (1920, 1080)
FPS = 25
RUNG = 720
PRESET = "veryfast"
CRF = 23
AUDIO_KBITS = 128
LADDER = [1080, 720, 480, 360]
"""``transcode_video``'s default heights."""
AUDIO_RATE = 44_100
"""Of the audio input; every output is 48 kHz."""
AUDIO_FORMATS = {"aac": ("aac", "m4a"), "mp3": ("libmp3lame", "mp3"), "opus": ("libopus", "opus")}
"""``format`` param → ffmpeg's encoder and the file extension (as the engine writes them)."""
VIDEO_MEMORY_MB = 8192
AUDIO_MEMORY_MB = 2048
"""``memory_limit_mb`` of the profiles (migration 0013): the sandbox's ``RLIMIT_AS``."""
DEBIAN_PACKAGES = ("ffmpeg",)
"""What the baseline needs; installed by ``scripts/ensure_debian_packages.sh``."""
ENTRY = "hypermedia.engines.media.engine:run"
PRELOAD = ("av", "hypermedia.engines.media.engine")
"""As the mediaworker's sandbox."""
UID_BASE = 62500
"""Sandbox uid when running as root (the platform's pool starts at 61000, bench/sandboxed.py's at
62000)."""
MAX_INPUT_BYTES = 4 << 30
VIDEO_VARIANTS = ("ffmpeg", "bare", "engine", "sandbox")
VARIANT_NAMES = {
    "ffmpeg": "ffmpeg CLI",
    "bare": "bare PyAV loop",
    "engine": "engine (process)",
    "sandbox": "engine in the sandbox",
}


def video_params(heights: list[int]) -> dict[str, Any]:
    return {"heights": heights, "preset": PRESET, "quality": CRF, "audio_bitrate": AUDIO_KBITS}


def audio_params(audio_format: str, loudness: bool) -> dict[str, Any]:
    return {"format": audio_format, "bitrate": AUDIO_KBITS, "channels": 2, "loudness": loudness}


# --- inputs --------------------------------------------------------------------------------------


def _smooth_noise(rng: Any, height: int, width: int, scale: int) -> Any:
    """Gaussian noise of feature size ``scale`` pixels (blocks box-blurred), zero mean, float32."""
    import numpy as np

    blocks = rng.standard_normal((height // scale + 2, width // scale + 2)).astype(np.float32)
    big = np.kron(blocks, np.ones((scale, scale), np.float32))[: height + scale, : width + scale]
    summed = np.cumsum(np.cumsum(np.pad(big, ((1, 0), (1, 0))), 0), 1)  # box blur by summed areas
    k = scale
    box = summed[k:, k:] - summed[:-k, k:] - summed[k:, :-k] + summed[:-k, :-k]
    return box[:height, :width] / (k * k)


def make_video(path: Path, seconds: float, fps: int = FPS, seed: int = 7) -> int:
    """A 1080p H.264 + AAC MP4 of ``seconds`` (module doc, step 1). Returns the frame count."""
    import av
    import numpy as np

    width, height = SOURCE_SIZE
    rng = np.random.default_rng(seed)
    pad_x, pad_y = 800, 400
    luma = sum(
        a * _smooth_noise(rng, height + pad_y, width + pad_x, s) for s, a in ((64, 40), (16, 25), (4, 14))
    )
    luma = (luma - luma.mean()) / luma.std() * 40 + 128
    chroma = [
        np.clip(
            _smooth_noise(rng, (height + pad_y) // 2, (width + pad_x) // 2, s) * 60 + 128, 16, 240
        ).astype(np.uint8)
        for s in (32, 48)
    ]
    grain = [rng.integers(-2, 3, (height, width), dtype=np.int16) for _ in range(7)]
    frames = round(seconds * fps)
    with av.open(str(path), "w", options={"movflags": "+faststart"}) as out:
        video = out.add_stream("libx264", rate=fps, options={"crf": "18", "preset": "superfast"})
        video.width, video.height, video.pix_fmt = width, height, "yuv420p"
        video.codec_context.thread_count = os.cpu_count() or 1
        sound = out.add_stream("aac", rate=48_000, layout="stereo")
        sound.bit_rate = 192_000
        for i in range(frames):
            ox = int(pad_x / 2 + (pad_x / 2 - 2) * np.sin(i / 60))
            oy = int(pad_y / 2 + (pad_y / 2 - 2) * np.cos(i / 45))
            y = luma[oy : oy + height, ox : ox + width].astype(np.int16) + grain[i % len(grain)]
            bar = (i * 9) % width
            y[200:500, max(0, bar - 150) : bar + 150] += 60
            cx, cy = ox // 2, oy // 2
            u = chroma[0][cy : cy + height // 2, cx : cx + width // 2]
            v = chroma[1][
                pad_y // 2 - cy : pad_y // 2 - cy + height // 2,
                pad_x // 2 - cx : pad_x // 2 - cx + width // 2,
            ]
            planes = np.concatenate(
                [np.clip(y, 16, 235).astype(np.uint8), u.reshape(-1, width), v.reshape(-1, width)]
            )
            frame = av.VideoFrame.from_ndarray(planes, format="yuv420p")
            frame.pts = i
            out.mux(video.encode(frame))
        out.mux(video.encode(None))
        t = np.arange(round(seconds * 48_000)) / 48_000
        samples = np.stack(
            [0.2 * np.sin(2 * np.pi * 440 * t) * (1 + 0.5 * np.sin(t)), 0.2 * np.sin(2 * np.pi * 660 * t)]
        ) + 0.02 * rng.standard_normal((2, t.size))
        for start in range(0, t.size, 1024):
            chunk = np.ascontiguousarray(samples[:, start : start + 1024], dtype=np.float32)
            piece = av.AudioFrame.from_ndarray(chunk, format="fltp", layout="stereo")
            piece.sample_rate, piece.pts = 48_000, start
            out.mux(sound.encode(piece))
        out.mux(sound.encode(None))
    return frames


def make_audio(path: Path, seconds: float, seed: int = 11) -> None:
    """Stereo 44.1 kHz 16-bit WAV: a chord that changes every 2 s under a slow envelope, and noise."""
    import av
    import numpy as np

    rng = np.random.default_rng(seed)
    t = np.arange(round(seconds * AUDIO_RATE)) / AUDIO_RATE
    roots = 110 * 2 ** (rng.integers(0, 12, int(seconds / 2) + 1) / 12)
    root = roots[(t // 2).astype(int)]
    envelope = 0.6 + 0.4 * np.sin(2 * np.pi * t / 7)
    left = sum(np.sin(2 * np.pi * root * r * t) / (n + 1) for n, r in enumerate((1, 1.26, 1.5, 2)))
    right = sum(np.sin(2 * np.pi * root * r * t + n) / (n + 1) for n, r in enumerate((1, 1.5, 2, 3)))
    stereo = 0.15 * envelope * np.stack([left, right]) + 0.01 * rng.standard_normal((2, t.size))
    pcm = (np.clip(stereo, -1, 1) * 32767).astype(np.int16)
    with av.open(str(path), "w", format="wav") as out:
        stream = out.add_stream("pcm_s16le", rate=AUDIO_RATE, layout="stereo")
        for start in range(0, t.size, 4096):
            chunk = np.ascontiguousarray(pcm[:, start : start + 4096].T).reshape(1, -1)
            frame = av.AudioFrame.from_ndarray(chunk, format="s16", layout="stereo")
            frame.sample_rate, frame.pts = AUDIO_RATE, start
            out.mux(stream.encode(frame))
        out.mux(stream.encode(None))


# --- the jobs, each in a fresh process -------------------------------------------------------------


def bare_transcode(source: Path, target: Path, height: int, threads: int) -> None:
    """The simplest PyAV loop with the engine's settings (module doc, step 2)."""
    import av
    from av.audio.frame import AudioFrame
    from av.audio.stream import AudioStream
    from av.video.frame import PictureType, VideoFrame
    from av.video.stream import VideoStream

    with av.open(str(source)) as inp, av.open(str(target), "w", options={"movflags": "+faststart"}) as out:
        video_in = inp.streams.video[0]
        audio_in = inp.streams.audio[0]
        video_in.codec_context.thread_count = threads
        video_in.codec_context.thread_type = "FRAME"
        width = 2 * round(video_in.codec_context.width * height / video_in.codec_context.height / 2)
        video = out.add_stream(
            "libx264", rate=video_in.average_rate or FPS, options={"preset": PRESET, "crf": str(CRF)}
        )
        assert isinstance(video, VideoStream)
        video.width, video.height, video.pix_fmt = width, height, "yuv420p"
        video.codec_context.time_base = video.time_base = video_in.time_base or Fraction(1, 90_000)
        video.codec_context.thread_count = threads
        video.codec_context.thread_type = "AUTO"  # type: ignore[assignment]  # PyAV takes the flag's name
        sound = out.add_stream("aac", rate=48_000, layout="stereo")
        assert isinstance(sound, AudioStream)
        sound.bit_rate = AUDIO_KBITS * 1000
        for packet in inp.demux(video_in, audio_in):
            for frame in packet.decode():
                if isinstance(frame, VideoFrame):
                    small = frame.reformat(width, height, "yuv420p", interpolation="BICUBIC", threads=1)
                    small.pict_type = PictureType.NONE
                    out.mux(video.encode(small))
                elif isinstance(frame, AudioFrame):
                    out.mux(sound.encode(frame))
        out.mux(video.encode(None))
        out.mux(sound.encode(None))


def bare_audio(source: Path, target: Path, audio_format: str) -> None:
    """The simplest PyAV loop: decode → ``AudioStream.encode`` (PyAV's resampler to 48 kHz stereo) → mux."""
    import av
    from av.audio.stream import AudioStream

    encoder, _ = AUDIO_FORMATS[audio_format]
    with av.open(str(source)) as inp, av.open(str(target), "w") as out:
        sound = out.add_stream(encoder, rate=48_000, layout="stereo")
        assert isinstance(sound, AudioStream)
        sound.bit_rate = AUDIO_KBITS * 1000
        for frame in inp.decode(audio=0):
            out.mux(sound.encode(frame))
        out.mux(sound.encode(None))


def _job(spec: dict[str, Any]) -> dict[str, Any]:
    """Runs one job in this (fresh) process: wall and CPU seconds of the call alone."""
    from hypermedia.engines.media.sources import MediaLimits

    limits = MediaLimits(max_input_bytes=MAX_INPUT_BYTES, threads=spec["threads"])
    source, out_dir = Path(spec["input"]), Path(spec["out_dir"])
    out_dir.mkdir(parents=True, exist_ok=True)
    if spec["kind"] == "engine":
        from hypermedia.engines.media.transcode import run as entry
    elif spec["kind"] == "audio":
        from hypermedia.engines.media.audio import run as entry
    else:
        import av  # noqa: F401  (imported before the clock starts, as the engine's)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu = usage.ru_utime + usage.ru_stime
    started = time.perf_counter()
    outputs: list[dict[str, Any]] = []
    if spec["kind"] == "bare":
        bare_transcode(source, out_dir / "video_720p.mp4", spec["height"], spec["threads"])
    elif spec["kind"] == "bare_audio":
        audio_format = spec["params"]["format"]
        bare_audio(source, out_dir / f"audio.{AUDIO_FORMATS[audio_format][1]}", audio_format)
    else:
        operation = "transcode_video" if spec["kind"] == "engine" else "transcode_audio"
        files = entry(operation, spec["params"], source, out_dir, limits=limits)
        outputs = [{"filename": f.filename, "metadata": f.metadata} for f in files]
    wall = time.perf_counter() - started
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {"wall": wall, "cpu": usage.ru_utime + usage.ru_stime - cpu, "outputs": outputs}


@dataclass
class Measured:
    """One run of one variant."""

    wall: float
    """Seconds: of the call (PyAV jobs), of the process (ffmpeg), of ``Sandbox.run`` (sandbox)."""
    cpu: float
    """CPU seconds (user + system) of the job's process and its threads."""
    rss_mb: float
    """Peak resident set of the job's process (``ru_maxrss``), MiB."""
    others: float = 0.0
    """Cores the rest of the machine kept busy meanwhile: its busy time (every process, short-lived
    ones too) less the job's CPU, over the wall time. What made this run slow, if anything."""
    outputs: list[dict[str, Any]] = field(default_factory=list)


def machine_busy() -> float:
    """CPU seconds the whole machine has spent busy so far (as bench/ocr.py)."""
    import psutil

    t = psutil.cpu_times()
    return t.user + t.nice + t.system + t.irq + t.softirq + t.steal  # guest time is in user


_LAUNCHER = """
import json, os, sys, time
report, argv = sys.argv[1], json.loads(sys.argv[2])
started = time.perf_counter()
pid = os.posix_spawnp(argv[0], argv, os.environ)
_, status, usage = os.wait4(pid, 0)
wall = time.perf_counter() - started
with open(report, "w") as f:
    json.dump([os.waitstatus_to_exitcode(status), wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss], f)
"""
"""Runs a command and reports its exit code, wall and CPU seconds and ``ru_maxrss`` (KiB). Linux
starts a child's ``ru_maxrss`` at the resident set of the process that forked it (the copied
address space counts until ``exec``), so the bench, large after making the inputs, does not start
the jobs itself: this small interpreter does."""


def _process(argv: Sequence[str]) -> tuple[Measured, str, str]:
    """Runs ``argv`` through :data:`_LAUNCHER`: the process measured, its stdout and stderr; raises
    when it fails."""
    busy = machine_busy()
    with tempfile.NamedTemporaryFile(prefix="hm-bench-usage-") as report:
        done = subprocess.run(
            [sys.executable, "-I", "-S", "-c", _LAUNCHER, report.name, json.dumps(list(argv))],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            cwd=REPO,
            check=False,
        )
        code, wall, cpu, maxrss_kib = json.loads(Path(report.name).read_text() or "[-1, 0, 0, 0]")
    if done.returncode != 0 or code != 0:
        raise RuntimeError(f"{' '.join(argv[:4])}… exited {code}: {done.stderr.decode()[-2000:]}")
    others = (machine_busy() - busy - cpu) / wall
    return Measured(wall, cpu, maxrss_kib / 1024, others), done.stdout.decode(), done.stderr.decode()


def python_job(spec: dict[str, Any]) -> Measured:
    """One job in a fresh Python process running this file with ``--job``."""
    process, out, _ = _process([sys.executable, str(Path(__file__).resolve()), "--job", json.dumps(spec)])
    result = json.loads(out.strip().splitlines()[-1])
    return Measured(result["wall"], result["cpu"], process.rss_mb, process.others, result["outputs"])


def ffmpeg_video(ffmpeg: str, source: Path, target: Path, width: int, height: int, threads: int) -> Measured:
    argv = [
        ffmpeg, "-nostdin", "-hide_banner", "-loglevel", "error", "-y",
        "-filter_threads", "1",
        "-threads", str(threads), "-i", str(source),
        "-map", "0:v:0", "-map", "0:a:0",
        "-vf", f"scale={width}:{height}:flags=bicubic,setsar=1,format=yuv420p",
        "-fps_mode", "passthrough",
        "-c:v", "libx264", "-preset", PRESET, "-crf", str(CRF), "-threads", str(threads),
        "-c:a", "aac", "-b:a", f"{AUDIO_KBITS}k", "-ar", "48000", "-ac", "2",
        "-map_metadata", "-1", "-map_chapters", "-1", "-movflags", "+faststart",
        str(target),
    ]  # fmt: skip
    return _process(argv)[0]


def _ffmpeg_audio_argv(
    ffmpeg: str, source: Path, target: Path, audio_format: str, gain_db: float | None
) -> list[str]:
    encoder, _ = AUDIO_FORMATS[audio_format]
    argv = [ffmpeg, "-nostdin", "-hide_banner", "-loglevel", "error", "-y", "-filter_threads", "1"]
    argv += ["-i", str(source), "-vn", "-map", "0:a:0"]
    if gain_db is not None:
        argv += ["-af", f"volume={gain_db:.6f}dB:precision=float"]
    argv += ["-c:a", encoder, "-b:a", f"{AUDIO_KBITS}k", "-ar", "48000", "-ac", "2", "-map_metadata", "-1"]
    if audio_format == "aac":
        argv += ["-movflags", "+faststart"]
    return [*argv, str(target)]


def ffmpeg_audio(ffmpeg: str, source: Path, target: Path, audio_format: str, loudness: bool) -> Measured:
    """The plain encode; with ``loudness`` first a measuring pass (``ebur128=peak=true``) and the
    encode with the gain to −23 LUFS, true peak at most −1 dBTP (as the engine's defaults)."""
    gain: float | None = None
    passes = []
    if loudness:
        measure = [ffmpeg, "-nostdin", "-hide_banner", "-nostats", "-filter_threads", "1", "-i", str(source)]
        measure += ["-vn", "-af", "aresample=48000,aformat=channel_layouts=stereo,ebur128=peak=true"]
        first, _, err = _process([*measure, "-f", "null", "-"])
        passes.append(first)
        summary = err[err.rfind("Summary:") :]
        lufs = float(re.search(r"I:\s+(-?[\d.]+) LUFS", summary).group(1))  # type: ignore[union-attr]
        peak = float(re.search(r"True peak:\s+Peak:\s+(-?[\d.]+) dBFS", summary).group(1))  # type: ignore[union-attr]
        gain = min(-23.0 - lufs, -1.0 - peak)
    passes.append(_process(_ffmpeg_audio_argv(ffmpeg, source, target, audio_format, gain))[0])
    wall = sum(m.wall for m in passes)
    others = sum(m.others * m.wall for m in passes) / wall
    return Measured(wall, sum(m.cpu for m in passes), max(m.rss_mb for m in passes), others)


# --- the sandbox ---------------------------------------------------------------------------------


class SandboxJobs:
    """A started :class:`~hypermedia.sandbox.Sandbox` as the mediaworker's, driven synchronously
    (its own event loop, run only while a job runs)."""

    def __init__(self, work_dir: Path, threads: int) -> None:
        from hypermedia.sandbox import Sandbox

        self.threads = threads
        uids = range(UID_BASE, UID_BASE + 1) if os.geteuid() == 0 else None
        self.sandbox = Sandbox(work_dir, preload=PRELOAD, uid=uids)
        self.loop = asyncio.new_event_loop()
        self.zygote_pid = 0

    def __enter__(self) -> SandboxJobs:
        import psutil

        self.loop.run_until_complete(self.sandbox.start())
        for child in psutil.Process().children():
            if "_zygote_main" in " ".join(child.cmdline()):
                self.zygote_pid = child.pid
        return self

    def __exit__(self, *exc: object) -> None:
        self.loop.run_until_complete(self.sandbox.close())
        self.loop.close()

    def _children_cpu(self) -> float:
        import psutil

        times = psutil.Process(self.zygote_pid).cpu_times()
        return times.children_user + times.children_system

    def run(self, operation: str, params: dict[str, Any], source: Path) -> Measured:
        """One job: the input copied into the job dir (not timed), then ``Sandbox.run`` timed."""
        from hypermedia.engines.media.params import validate_params
        from hypermedia.engines.media.sources import MediaLimits
        from hypermedia.engines.media.transcode import thread_need
        from hypermedia.sandbox import SandboxLimits

        # As the mediaworker's MediaHandler: T threads and thread_need + 16 tasks for a video
        # transcode, one thread and 16 tasks for everything else.
        threads, memory_mb, nproc = 1, AUDIO_MEMORY_MB, 16
        if operation == "transcode_video":
            threads, memory_mb = self.threads, VIDEO_MEMORY_MB
            nproc += thread_need(validate_params(operation, params), threads)
        limits = SandboxLimits(
            cpu_seconds=1800,
            wall_seconds=2700,
            memory_bytes=memory_mb << 20,
            fsize_bytes=10 << 30,
            nproc=nproc,
        )
        job_id = uuid.uuid4().hex
        job_dir = self.sandbox.prepare(job_id)
        try:
            job_input = job_dir / "input" / "source"
            shutil.copyfile(source, job_input)  # the worker downloads to the same place
            cpu, busy = self._children_cpu(), machine_busy()
            started = time.perf_counter()
            result = self.loop.run_until_complete(
                self.sandbox.run(
                    job_id,
                    ENTRY,
                    operation,
                    params,
                    job_input,
                    limits,
                    entry_kwargs={"limits": MediaLimits(max_input_bytes=MAX_INPUT_BYTES, threads=threads)},
                )
            )
            wall = time.perf_counter() - started
            if result.error_code:
                raise RuntimeError(
                    f"sandboxed {operation} failed: {result.error_code} {result.error_message}"
                )
            cpu = self._children_cpu() - cpu
            others = (machine_busy() - busy - cpu) / wall
            outputs = [{"filename": o.filename, "metadata": o.metadata} for o in result.outputs]
            return Measured(wall, cpu, float(result.peak_memory_mb), others, outputs)
        finally:
            self.sandbox.cleanup(job_id)


# --- checks --------------------------------------------------------------------------------------

_X264_SEI = re.compile(rb"x264 - core (\d+)[^\x00]*? - options: ([^\x00]+)")


def x264_settings(path: Path) -> tuple[str, dict[str, str]]:
    """x264's core version and options, from the SEI it writes into the first frame."""
    with path.open("rb") as f:
        head = f.read(8 << 20)
    match = _X264_SEI.search(head)
    if match is None:
        return "?", {}
    options = dict(o.split("=", 1) for o in match.group(2).decode("ascii", "replace").split() if "=" in o)
    return match.group(1).decode(), options


def check_video(path: Path, frames: int, width: int, height: int) -> dict[str, Any]:
    """The output's video: every frame, the size; returns its bit rate (kbit/s) and size."""
    import av

    with av.open(str(path)) as written:
        stream = written.streams.video[0]
        if (stream.codec_context.width, stream.codec_context.height) != (width, height):
            raise RuntimeError(f"{path.name}: {stream.codec_context.width}×{stream.codec_context.height}")
        if stream.frames != frames:
            raise RuntimeError(f"{path}: {stream.frames} frames, expected {frames}")
        if not written.streams.audio:
            raise RuntimeError(f"{path}: no sound")
        seconds = (written.duration or 0) / av.time_base
    size = path.stat().st_size
    return {
        "kbits": stream.bit_rate / 1000 if stream.bit_rate else size * 8 / seconds / 1000,
        "mb": size / 2**20,
    }


def versions(ffmpeg: str | None) -> dict[str, str]:
    import av

    found = {
        "pyav": f"PyAV {av.__version__}, libavcodec {'.'.join(map(str, av.library_versions['libavcodec']))}"
    }
    if ffmpeg:
        banner = subprocess.run([ffmpeg, "-version"], capture_output=True, text=True, check=True).stdout
        found["ffmpeg"] = banner.splitlines()[0].split(" Copyright")[0]
    return found


def ensure_ffmpeg() -> str | None:
    """The ``ffmpeg`` command line; installed when missing (module doc). None if still missing."""
    if shutil.which("ffmpeg") is None:
        script = REPO / "scripts" / "ensure_debian_packages.sh"
        subprocess.run([str(script), *DEBIAN_PACKAGES], check=False)
    return shutil.which("ffmpeg")


def process_start_seconds(ffmpeg: str, times: int = 5) -> float:
    """Median wall seconds of ``ffmpeg -version``: the process start its wall time includes."""
    return statistics.median(_process([ffmpeg, "-hide_banner", "-version"])[0].wall for _ in range(times))


# --- the bench -----------------------------------------------------------------------------------


def _order(variants: Sequence[Any], round_index: int) -> list[Any]:
    """Round r: rotated by r, reversed every second round (each variant goes first and last)."""
    shift = round_index % len(variants)
    turned = list(variants[shift:]) + list(variants[:shift])
    return turned[::-1] if round_index % 2 else turned


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _ratio(faster: Sequence[Measured], slower: Sequence[Measured], attr: str = "wall") -> float:
    """Median over the rounds of ``slower``'s seconds over ``faster``'s: ``faster``'s speed relative
    to ``slower``'s (above 1: faster)."""
    return _median([getattr(s, attr) / getattr(f, attr) for f, s in zip(faster, slower, strict=True)])


@dataclass
class Inputs:
    video: Path
    warm: Path
    song: Path
    seconds: float
    frames: int
    audio_seconds: float


@dataclass
class VideoSeries:
    """The 1080p → 720p runs (module doc, step 2)."""

    runs: dict[str, list[Measured]]
    """Per variant, one per round."""
    background: list[float]
    """Cores the rest of the machine used, per round (:attr:`Measured.others` over the round)."""
    x264: dict[str, tuple[str, dict[str, str]]]
    """Per variant: x264's core version and options, from its output."""
    kbits: dict[str, float]
    """Per variant: the output's video bit rate."""


def make_inputs(root: Path, seconds: float, audio_seconds: float) -> Inputs:
    inputs = Inputs(root / "in1080.mp4", root / "warm1080.mp4", root / "song.wav", seconds, 0, audio_seconds)
    inputs.frames = make_video(inputs.video, seconds)
    make_video(inputs.warm, 1.0)
    make_audio(inputs.song, audio_seconds)
    for path in (inputs.video, inputs.warm, inputs.song):
        path.chmod(0o644)  # the sandbox uid reads them
    return inputs


def video_series(
    inputs: Inputs, ffmpeg: str | None, sandbox: SandboxJobs, out: Path, runs: int, threads: int
) -> VideoSeries:
    """Every variant once on the 1 s clip (warm-up), then ``runs`` rounds on the input."""
    width = 2 * round(SOURCE_SIZE[0] * RUNG / SOURCE_SIZE[1] / 2)
    variants = [v for v in VIDEO_VARIANTS if ffmpeg or v != "ffmpeg"]

    def one(variant: str, path: Path, tag: str) -> tuple[Measured, Path | None]:
        target_dir = out / f"{variant}-{tag}"
        target = target_dir / "output" / "video_720p.mp4"
        if variant == "sandbox":
            return sandbox.run("transcode_video", video_params([RUNG]), path), None
        if variant == "ffmpeg":
            assert ffmpeg is not None
            target.parent.mkdir(parents=True, exist_ok=True)
            return ffmpeg_video(ffmpeg, path, target, width, RUNG, threads), target
        spec = {
            "kind": variant,
            "input": str(path),
            "out_dir": str(target.parent),
            "threads": threads,
            "height": RUNG,
            "params": video_params([RUNG]),
        }
        return python_job(spec), target

    for variant in variants:  # page cache, shared libraries, the zygote's first fork
        one(variant, inputs.warm, "warm")
    series = VideoSeries({v: [] for v in variants}, [], {}, {})
    for r in range(runs):
        for variant in _order(variants, r):
            measured, target = one(variant, inputs.video, f"r{r}")
            series.runs[variant].append(measured)
            if target is None:
                meta = measured.outputs[0]["metadata"]
                if meta["frame_count"] != inputs.frames or (meta["width"], meta["height"]) != (width, RUNG):
                    raise RuntimeError(f"sandboxed output: {meta}")
            else:
                series.kbits[variant] = check_video(target, inputs.frames, width, RUNG)["kbits"]
                series.x264.setdefault(variant, x264_settings(target))
                shutil.rmtree(target.parent.parent, ignore_errors=True)
        last = [series.runs[v][-1] for v in variants]
        series.background.append(sum(m.others * m.wall for m in last) / sum(m.wall for m in last))
        speeds = ", ".join(
            f"{v} {inputs.seconds / m.wall:.2f}x ({m.others:.2f})"
            for v, m in zip(variants, last, strict=True)
        )
        print(f"  r{r + 1} speed (media s / wall s; cores used by the rest of the machine): {speeds}")
    return series


def audio_series(
    inputs: Inputs, ffmpeg: str | None, out: Path, runs: int
) -> dict[tuple[str, bool, str], list[Measured]]:
    """Per (format, loudness, who): ``runs`` runs; who is ``engine``, ``bare`` (no loudness) or
    ``ffmpeg``; the order turned every round."""
    variants = [
        (audio_format, loud, who)
        for audio_format in AUDIO_FORMATS
        for loud in (False, True)
        for who in ("engine", "bare", "ffmpeg")
        if not (loud and who == "bare") and (ffmpeg or who != "ffmpeg")
    ]
    results: dict[tuple[str, bool, str], list[Measured]] = {v: [] for v in variants}
    for r in range(runs):
        for audio_format, loud, who in _order(variants, r):
            target_dir = out / f"audio-{audio_format}-{loud}-{who}-r{r}"
            target_dir.mkdir(parents=True, exist_ok=True)
            if who == "ffmpeg":
                assert ffmpeg is not None
                target = target_dir / f"audio.{AUDIO_FORMATS[audio_format][1]}"
                measured = ffmpeg_audio(ffmpeg, inputs.song, target, audio_format, loud)
            else:
                spec = {
                    "kind": "audio" if who == "engine" else "bare_audio",
                    "input": str(inputs.song),
                    "out_dir": str(target_dir),
                    "threads": 1,
                    "params": audio_params(audio_format, loud),
                }
                measured = python_job(spec)
                if who == "engine":
                    duration = measured.outputs[0]["metadata"]["duration_seconds"]
                    if abs(duration - inputs.audio_seconds) > 0.1:
                        raise RuntimeError(f"transcode_audio {audio_format}: {duration} s")
            results[(audio_format, loud, who)].append(measured)
            shutil.rmtree(target_dir, ignore_errors=True)
    return results


def run(
    runs: int = 3,
    seconds: float = 20.0,
    audio_seconds: float = 60.0,
    threads: int = THREADS,
) -> dict[str, Any]:
    """The whole bench (module doc); prints its tables and returns the figures for the summary of
    ``bench/run.py``."""
    from bench import common

    started = time.perf_counter()
    ffmpeg = ensure_ffmpeg()
    found = versions(ffmpeg)
    print(
        f"media transcodes: 1080p{FPS} {seconds:g} s -> {RUNG}p H.264 {PRESET} CRF {CRF}, {threads} threads, "
        f"{runs} run(s); audio: {audio_seconds:g} s stereo {AUDIO_RATE} Hz WAV -> {AUDIO_KBITS} kbit/s"
    )
    print(
        "  "
        + "; ".join(found.values())
        + ("" if ffmpeg else "; no ffmpeg command line: its baselines are skipped")
    )
    root = common.temp_root("hm-bench-media-")
    try:
        inputs = make_inputs(root, seconds, audio_seconds)
        print(
            f"  inputs made in {time.perf_counter() - started:.0f} s: 1080p {inputs.frames} frames, "
            f"{inputs.video.stat().st_size * 8 / seconds / 1e6:.1f} Mbit/s"
        )
        start_s = process_start_seconds(ffmpeg) if ffmpeg else 0.0
        with SandboxJobs(root / "sandbox", threads) as sandbox:
            video = video_series(inputs, ffmpeg, sandbox, root / "out", runs, threads)
            # Peak memory of the other jobs, one run each in the sandbox (the ladder is the longest job).
            memory = {
                "ladder": sandbox.run("transcode_video", video_params(LADDER), inputs.video),
                "aac": sandbox.run("transcode_audio", audio_params("aac", False), inputs.song),
                "aac_loudness": sandbox.run("transcode_audio", audio_params("aac", True), inputs.song),
            }
        audio = audio_series(inputs, ffmpeg, root / "out", runs)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    summary = report_video(inputs, video, ffmpeg, start_s, runs)
    summary["peak_mb"] = report_memory(inputs, video, memory, audio, threads)
    summary.update(report_audio(inputs, audio, ffmpeg, start_s, runs))
    summary["versions"] = found
    print(f"media bench: {time.perf_counter() - started:.0f} s ({common.machine()})")
    return summary


# --- tables --------------------------------------------------------------------------------------


def report_video(
    inputs: Inputs, video: VideoSeries, ffmpeg: str | None, start_s: float, runs: int
) -> dict[str, Any]:
    from bench import common

    seconds = inputs.seconds
    rows = []
    for variant, measured in video.runs.items():
        walls, cpus = [m.wall for m in measured], [m.cpu for m in measured]
        core, options = video.x264.get(variant, ("", {}))
        rows.append(
            (
                VARIANT_NAMES[variant],
                f"{seconds / _median(walls):.2f}",
                _median(walls),
                f"{min(walls):.2f}-{max(walls):.2f}",
                _median(cpus),
                f"{_median(cpus) / _median(walls):.2f}",
                f"{_median([m.others for m in measured]):.2f}",
                f"{max(m.rss_mb for m in measured):.0f}",
                f"{video.kbits[variant]:.0f}" if variant in video.kbits else "",
                f"core {core}, threads={options.get('threads', '?')}" if core else "",
            )
        )
    print()
    print(
        f"transcode_video 1080p -> {RUNG}p, {seconds:g} s of media ({inputs.frames} frames), median of {runs}:"
    )
    header = (
        "variant",
        "speed x",
        "wall s",
        "range s",
        "CPU s",
        "cores",
        "others",
        "peak MiB",
        "kbit/s",
        "x264",
    )
    print(common.table(rows, header))
    print(
        "  speed x = media seconds / wall seconds; cores = CPU s / wall s; others = cores the rest of the"
        " machine used meanwhile; kbit/s of the video stream"
    )
    if ffmpeg:
        print(f"  ffmpeg's wall time includes its process start: {start_s * 1000:.0f} ms (ffmpeg -version)")
    reference = video.x264.get("engine", ("", {}))[1]
    for variant, (_, options) in video.x264.items():
        differ = sorted((k, v, reference.get(k)) for k, v in options.items() if reference.get(k) != v)
        if variant != "engine" and differ:
            shown = ", ".join(f"{k}={v} (engine {e})" for k, v, e in differ)
            print(f"  x264 options of the {VARIANT_NAMES[variant]} that differ from the engine's: {shown}")
    runs_of = video.runs
    pairs = {
        "engine_vs_ffmpeg": ("engine", "ffmpeg", "engine / ffmpeg CLI (the issue's number)"),
        "sandbox_vs_ffmpeg": ("sandbox", "ffmpeg", "engine in the sandbox / ffmpeg CLI"),
        "bare_vs_ffmpeg": ("bare", "ffmpeg", "bare PyAV / ffmpeg CLI (the FFmpeg and x264 builds)"),
        "engine_vs_bare": ("engine", "bare", "engine / bare PyAV (the engine's own overhead)"),
        "sandbox_vs_engine": ("sandbox", "engine", "engine in the sandbox / in a process"),
    }
    ratios: dict[str, float] = {}
    ratio_rows = []
    for key, (faster, slower, name) in pairs.items():
        if faster not in runs_of or slower not in runs_of:
            continue
        ratios[key] = _ratio(runs_of[faster], runs_of[slower])
        best = min(m.wall for m in runs_of[slower]) / min(m.wall for m in runs_of[faster])
        ratios[f"{key}_best"] = best
        ratios[f"{key}_cpu"] = _ratio(runs_of[faster], runs_of[slower], "cpu")
        verdict = ""
        if slower == "ffmpeg" and faster != "bare":
            verdict = f"goal >= {GOAL}x: {'met' if ratios[key] >= GOAL else 'MISSED'}"
            verdict += f" (best runs: {'met' if best >= GOAL else 'MISSED'})"
        ratio_rows.append(
            (name, f"{ratios[key]:.3f}x", f"{best:.3f}x", f"{ratios[f'{key}_cpu']:.3f}x", verdict)
        )
    print(common.table(ratio_rows, ("speed ratio", "median", "best runs", "by CPU s", "")))
    print(
        "  median: of the per-round ratios of wall times; best runs: of the fastest run of each (the least"
        " disturbed); by CPU s: the inverse ratio of CPU seconds (hardly moved by other load)"
    )
    rounds = ", ".join(f"{b:.2f}" for b in video.background)
    print(f"  the rest of the machine used {rounds} cores in the rounds")
    return {
        "seconds": seconds,
        "speed": {v: seconds / _median([m.wall for m in ms]) for v, ms in runs_of.items()},
        "ratios": ratios,
        "background_cores": _median(video.background),
    }


def report_memory(
    inputs: Inputs,
    video: VideoSeries,
    memory: dict[str, Measured],
    audio: dict[tuple[str, bool, str], list[Measured]],
    threads: int,
) -> dict[str, float]:
    from bench import common

    peak = {
        "720p": max(m.rss_mb for m in video.runs["sandbox"]),
        "ladder": memory["ladder"].rss_mb,
        "aac": memory["aac"].rss_mb,
        "aac_loudness": memory["aac_loudness"].rss_mb,
    }
    in_process = {
        "720p": max(m.rss_mb for m in video.runs["engine"]),
        "aac": max(m.rss_mb for m in audio[("aac", False, "engine")]),
        "aac_loudness": max(m.rss_mb for m in audio[("aac", True, "engine")]),
    }
    baseline = {
        "720p": max(m.rss_mb for m in video.runs.get("ffmpeg", [])) if "ffmpeg" in video.runs else None,
        "aac": max(m.rss_mb for m in audio[("aac", False, "ffmpeg")])
        if ("aac", False, "ffmpeg") in audio
        else None,
    }
    seconds = {"720p": inputs.seconds, "ladder": inputs.seconds, "aac": inputs.audio_seconds}
    seconds["aac_loudness"] = inputs.audio_seconds
    wall = {"720p": _median([m.wall for m in video.runs["sandbox"]])} | {k: m.wall for k, m in memory.items()}
    names = {
        "720p": f"transcode_video 1080p -> {RUNG}p",
        "ladder": f"transcode_video 1080p -> {LADDER}",
        "aac": "transcode_audio aac",
        "aac_loudness": "transcode_audio aac, loudness",
    }
    rows = [
        (
            names[key],
            f"{peak[key]:.0f}",
            f"{in_process[key]:.0f}" if key in in_process else "",
            f"{baseline[key]:.0f}" if baseline.get(key) is not None else "",
            f"{seconds[key] / wall[key]:.2f}",
        )
        for key in names
    ]
    print()
    print(f"peak memory per job (ru_maxrss, MiB; MediaLimits.threads = {threads}):")
    print(common.table(rows, ("job", "sandbox child", "own process", "ffmpeg CLI", "speed x (sandbox)")))
    print(
        "  the sandbox child shares the zygote's pages (PyAV and the engine imported); own process: a fresh interpreter"
    )
    return peak


def report_audio(
    inputs: Inputs,
    audio: dict[tuple[str, bool, str], list[Measured]],
    ffmpeg: str | None,
    start_s: float,
    runs: int,
) -> dict[str, Any]:
    from bench import common

    seconds = inputs.audio_seconds
    speeds: dict[str, float] = {}
    ratios: dict[str, float] = {}
    bare_ratios: dict[str, float] = {}
    rows = []
    for audio_format in AUDIO_FORMATS:
        for loud in (False, True):
            key = f"{audio_format}{'_loudness' if loud else ''}"
            engine = audio[(audio_format, loud, "engine")]
            speeds[key] = seconds / _median([m.wall for m in engine])
            bare = audio.get((audio_format, loud, "bare"))
            base = audio.get((audio_format, loud, "ffmpeg"))
            row = [f"{audio_format}{', loudness' if loud else ''}", f"{speeds[key]:.1f}"]
            row.append(f"{seconds / _median([m.wall for m in bare]):.1f}" if bare else "")
            if bare:
                bare_ratios[key] = _ratio(engine, bare)
            row.append(f"{bare_ratios[key]:.2f}x" if bare else "")
            if base:
                ratios[key] = _ratio(engine, base)
                # Less the process start of each ffmpeg run (two with loudness).
                started = start_s * (2 if loud else 1)
                unstarted = _median([(b.wall - started) / e.wall for e, b in zip(engine, base, strict=True)])
                row += [
                    f"{seconds / _median([m.wall for m in base]):.1f}",
                    f"{ratios[key]:.2f}x",
                    f"{unstarted:.2f}x",
                    f"{_ratio(engine, base, 'cpu'):.2f}x",
                ]
            row.append(f"{max(m.rss_mb for m in engine):.0f}")
            rows.append(tuple(row))
    print()
    print(
        f"transcode_audio, {seconds:g} s stereo {AUDIO_RATE} Hz WAV -> {AUDIO_KBITS} kbit/s 48 kHz stereo, "
        f"speed x = media s / wall s, median of {runs}:"
    )
    header = ["format", "engine", "bare PyAV", "engine/bare"]
    if ffmpeg:
        header += ["ffmpeg CLI", "engine/ffmpeg", "less its start", "by CPU s"]
    print(common.table(rows, [*header, "peak MiB"]))
    if ffmpeg:
        print(
            "  ffmpeg's times include its process start (less its start: without it); with loudness ffmpeg"
            " runs twice: ebur128=peak=true to measure, then the encode with volume"
        )
    ffmpeg_speeds = {
        f"{f}{'_loudness' if loud else ''}": seconds / _median([m.wall for m in ms])
        for (f, loud, who), ms in audio.items()
        if who == "ffmpeg"
    }
    return {
        "audio_speed": speeds,
        "audio_ffmpeg_speed": ffmpeg_speeds,
        "audio_ratio": ratios,
        "audio_bare_ratio": bare_ratios,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3, help="runs of every variant (median)")
    parser.add_argument("--seconds", type=float, default=20.0, help="length of the 1080p input")
    parser.add_argument("--audio-seconds", type=float, default=60.0, help="length of the audio input")
    parser.add_argument(
        "--threads", type=int, default=THREADS, help="MediaLimits.threads and ffmpeg's -threads"
    )
    parser.add_argument("--job", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.job:  # one job, in a process this bench started (python_job)
        print(json.dumps(_job(json.loads(args.job))))
        return 0
    run(args.runs, args.seconds, args.audio_seconds, args.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
