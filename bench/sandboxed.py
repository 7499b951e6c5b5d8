"""The platform's sandbox alone: ``hypermedia.sandbox.Sandbox`` (warm zygote → one forked, rlimited
child per job, ``VIPS_CONCURRENCY=1``) running the imageworker's entry point on local files, with
no queue, database, gRPC or HTTP. Set between the bare-pyvips baseline and the whole platform, it
tells how much of the gap is the per-job process model and how much the plumbing around it.

Started from the benchmark's main process, which never runs libvips itself: the zygote is a
separate ``python -c`` process (fork + exec) that forks the job children.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

from bench.common import REPO  # noqa: F401  (puts the repository on sys.path)
from hypermedia.engines.imaging.ops import ImageLimits
from hypermedia.sandbox import Sandbox, SandboxLimits

ENTRY = "hypermedia.engines.imaging.ops:run"
LIMITS = SandboxLimits(
    cpu_seconds=30, wall_seconds=45, memory_bytes=2048 * 1024 * 1024, fsize_bytes=10 * 1024**3
)
IMAGE_LIMITS = ImageLimits(max_pixels=100_000_000, max_input_bytes=50 * 1024 * 1024)
UID_BASE = 62000
"""Sandbox uids when running as root (the platform's default pool starts at 61000)."""


def _sandbox(work_dir: Path, slots: int) -> Sandbox:
    uids = range(UID_BASE, UID_BASE + slots) if os.geteuid() == 0 else None
    return Sandbox(work_dir, preload=("pyvips", "hypermedia.engines.imaging.ops"), uid=uids)


async def _one(sandbox: Sandbox, path: Path, size: int) -> tuple[float, int]:
    job_id = str(uuid.uuid4())
    job_dir = sandbox.prepare(job_id)
    try:
        started = time.perf_counter()
        source = job_dir / "input" / "source"
        shutil.copyfile(path, source)  # the worker downloads into the same place
        result = await sandbox.run(
            job_id,
            ENTRY,
            "thumbnail",
            {"size": size},
            source,
            LIMITS,
            entry_kwargs={"limits": IMAGE_LIMITS},
        )
        elapsed = time.perf_counter() - started
        if result.error_code:
            raise RuntimeError(f"sandboxed thumbnail failed: {result.error_code} {result.error_message}")
        return elapsed, result.duration_ms
    finally:
        sandbox.cleanup(job_id)


async def _run_all(work_dir: Path, paths: list[Path], size: int, slots: int) -> dict[str, Any]:
    sandbox = _sandbox(work_dir, slots)
    await sandbox.start()
    try:
        await _one(sandbox, paths[0], size)  # warm-up: first fork of a fresh zygote
        gate = asyncio.Semaphore(slots)

        async def gated(path: Path) -> tuple[float, int]:
            async with gate:
                return await _one(sandbox, path, size)

        started = time.perf_counter()
        results = await asyncio.gather(*(gated(p) for p in paths))
        wall = time.perf_counter() - started
    finally:
        await sandbox.close()
    return {
        "wall_s": wall,
        "per_job_ms": [r[0] * 1000 for r in results],
        "child_ms": [r[1] for r in results],
    }


def run_all(work_dir: Path, paths: list[Path], size: int, slots: int) -> dict[str, Any]:
    """Thumbnails of ``paths`` through a fresh sandbox, ``slots`` at a time (after one warm-up job).
    Returns ``wall_s``, and per job ``per_job_ms`` (copy in + run) and ``child_ms`` (fork → exit)."""
    return asyncio.run(_run_all(work_dir, paths, size, slots))


def run_sequential(work_dir: Path, path: Path, size: int, count: int) -> dict[str, Any]:
    """``count`` thumbnails of the same file, one at a time (the per-job overhead view)."""
    return asyncio.run(_run_all(work_dir, [path] * count, size, 1))
