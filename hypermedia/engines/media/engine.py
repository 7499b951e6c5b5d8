"""The mediaworker's sandbox entry: ``run(operation, params, input_path, out_dir, *, limits)``
dispatches to the module of each media operation (:data:`OPERATION_ENTRIES`). Importing it imports
PyAV (fork-safe: importing ``av`` starts no thread) and every operation module.

Before an operation runs, FFmpeg's idea of the machine's CPU count is set to 1
(:func:`bound_ffmpeg_cpus`): every thread pool FFmpeg sizes by itself — each filter graph,
including the ones PyAV builds inside ``AudioStream.encode`` to cut frames to the codec's size
(``graph.threads`` cannot be set on those), and codecs left at automatic threads — would start one
thread per CPU of the *node*, on a 64-core host 64 idle threads per graph against the job's
``RLIMIT_NPROC``. Threads the operations ask for explicitly (``thread_count`` of a transcode's
decoder and encoders, :attr:`MediaLimits.threads`) are not affected."""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from pathlib import Path
from typing import Final

from hypermedia.core.errors import InvalidArgument
from hypermedia.engines.contract import OutputFile
from hypermedia.engines.media import audio, poster, probe, transcode, waveform
from hypermedia.engines.media.sources import MediaLimits

__all__ = ["OPERATION_ENTRIES", "MediaLimits", "bound_ffmpeg_cpus", "run"]

OPERATION_ENTRIES: Final[dict[str, Callable[..., list[OutputFile]]]] = {
    "probe": probe.run,
    "waveform": waveform.run,
    "poster": poster.run,
    "transcode_video": transcode.run,
    "transcode_audio": audio.run,
}
"""Operation → its entry, each ``fn(operation, params, input_path, out_dir, *, limits)``."""


def run(
    operation: str, params: dict, input_path: Path, out_dir: Path, *, limits: MediaLimits
) -> list[OutputFile]:
    """Runs one media operation (see the module of each in :data:`OPERATION_ENTRIES`).

    Raises:
        InvalidArgument: ``UNKNOWN_OPERATION``; and whatever the operation's entry raises.
    """
    entry = OPERATION_ENTRIES.get(operation)
    if entry is None:
        raise InvalidArgument(f"unknown operation {operation!r}", "UNKNOWN_OPERATION")
    bound_ffmpeg_cpus(1)
    return entry(operation, params, input_path, out_dir, limits=limits)


def bound_ffmpeg_cpus(count: int) -> bool:
    """Makes FFmpeg's ``av_cpu_count()`` answer ``count`` (at least 1) in this process, through
    ``av_cpu_force_count`` of the libavutil PyAV loaded (found in ``/proc/self/maps``). Call it in
    the sandbox child only: it is process-wide. Returns False when libavutil is not found (the
    pools then follow the node's CPUs; ``RLIMIT_NPROC`` still bounds them)."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return False
    paths = sorted({line.split()[-1] for line in maps.splitlines() if "/libavutil" in line})
    if not paths:
        return False
    ctypes.CDLL(paths[0]).av_cpu_force_count(max(1, int(count)))
    return True
