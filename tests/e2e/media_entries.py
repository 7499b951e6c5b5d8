"""A sandbox entry standing in for the media engine in tests/e2e/test_media_runtime.py: it takes
as long as the test asks, reports progress the way the transcodes do, and writes what it saw.

``run(operation, params, input_path, out_dir, *, limits)`` runs in the sandbox child like
:func:`hypermedia.engines.media.engine.run`. The job's params are the gateway's normalised params of the
real operation, so the run time travels in params the gateway accepts (:func:`run_seconds`).
Its one output, ``run`` (``run.json``), has the metadata ``operation``, ``started`` and ``ended``
(Unix seconds, wall clock: comparable across the jobs of a worker), ``threads``
(``limits.threads``) and ``nproc`` (the child's ``RLIMIT_NPROC``).
"""

from __future__ import annotations

import json
import resource
import time
from pathlib import Path
from typing import Any, Final

from hypermedia.engines.contract import OutputFile, report_progress
from hypermedia.engines.media.sources import MediaLimits

PROGRESS_STEPS: Final = 12
"""Progress reports of a ``transcode_video`` run, evenly spaced over its run time."""
OTHER_SECONDS: Final = 1.5
"""Run time of ``probe``, ``waveform`` and ``poster``."""


def run_seconds(operation: str, params: dict[str, Any]) -> float:
    """How long the entry runs: ``transcode_video`` ``quality`` / 4 (quality 24: 6 s),
    ``transcode_audio`` ``bitrate`` / 32 (bitrate 96: 3 s), anything else 1.5 s."""
    if operation == "transcode_video":
        return float(params["quality"]) / 4
    if operation == "transcode_audio":
        return float(params["bitrate"]) / 32
    return OTHER_SECONDS


def run(
    operation: str, params: dict[str, Any], input_path: Path, out_dir: Path, *, limits: MediaLimits
) -> list[OutputFile]:
    started = time.time()
    seconds = run_seconds(operation, params)
    if operation == "transcode_video":
        for step in range(1, PROGRESS_STEPS + 1):
            time.sleep(seconds / PROGRESS_STEPS)
            report_progress(out_dir, step / PROGRESS_STEPS)
    else:
        time.sleep(seconds)
    metadata = {
        "operation": operation,
        "started": started,
        "ended": time.time(),
        "threads": limits.threads,
        "nproc": resource.getrlimit(resource.RLIMIT_NPROC)[0],
    }
    (out_dir / "run.json").write_text(json.dumps(metadata))
    return [OutputFile("run", "run.json", "application/json", metadata)]
