"""A worker's row in ``workers`` and ``worker_metrics``: its identity, registration, heartbeat and the
minute samples of its resources (what the reaper's dead-worker check and the dashboards read)."""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path

import asyncpg
import psutil

from hypermedia.jobs import queues, scaling
from hypermedia.worker.settings import WorkerSettings


def boot_id() -> str:
    """This boot's id (``/proc/sys/kernel/random/boot_id``), ``unknown`` where it cannot be read."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown"


def worker_identity(settings: WorkerSettings, role: str) -> str:
    """``{deployment}/{role}/{host}/{boot[:8]}/g{generation}/{pid}``: unique per process launch;
    a scheduler consumer's (a sched lane, ADR 0073) ends in ``/sched``."""
    return worker_identity_of(
        settings.deployment, role, settings.generation, os.getpid(), scheduler=queues.is_sched(settings.queue)
    )


def worker_identity_of(
    deployment: str, role: str, generation: int, pid: int, *, scheduler: bool = False
) -> str:
    """The :func:`worker_identity` of process ``pid`` on this host (a unit's control names its
    execution's so); ``scheduler``: of its scheduler consumer."""
    own = f"{deployment}/{role}/{socket.gethostname()}/{boot_id()[:8]}/g{generation}/{pid}"
    return own + "/sched" if scheduler else own


async def register(pool: asyncpg.Pool, worker_id: str, settings: WorkerSettings, role: str) -> None:
    """Inserts (or revives) the worker's ``workers`` row as ``running``."""
    await pool.execute(
        """
        INSERT INTO workers (worker_id, deployment, boot_id, role, generation, queue, slots, hostname, pid,
                             status, burst_worker_id)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 'running', $10::uuid)
        ON CONFLICT (worker_id) DO UPDATE SET status = 'running', last_heartbeat = now()
        """,
        worker_id,
        settings.deployment,
        boot_id(),
        role,
        settings.generation,
        settings.queue,
        settings.slots,
        socket.gethostname(),
        os.getpid(),
        settings.burst_worker_id or None,
    )


async def beat(pool: asyncpg.Pool, worker_id: str, *, draining: bool) -> bool:
    """The heartbeat: ``last_heartbeat`` now, status ``running`` or ``draining``. Returns whether
    the row says ``draining`` although this worker is not: the scheduler asked it to drain (the
    drain handshake, ADR 0047), which a heartbeat never undoes."""
    status = await pool.fetchval(
        """
        UPDATE workers SET last_heartbeat = now(),
                           status = CASE WHEN status = 'draining' THEN 'draining' ELSE $2 END
        WHERE worker_id = $1 RETURNING status
        """,
        worker_id,
        "draining" if draining else "running",
    )
    return status == "draining" and not draining


async def announce_preemption(pool: asyncpg.Pool, worker_ids: list[str]) -> None:
    """The instance is being reclaimed: the workers' rows say ``draining`` at once (the scheduler
    counts them out of its live capacity) and the scheduler is woken (``NOTIFY`` on
    :data:`~hypermedia.jobs.scaling.WAKE_CHANNEL`, payload ``preempted``) to start replacements
    within a moment."""
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(
            "UPDATE workers SET status = 'draining' WHERE worker_id = ANY($1::text[]) AND status = 'running'",
            worker_ids,
        )
        await conn.execute("SELECT pg_notify($1, 'preempted')", scaling.WAKE_CHANNEL)


async def record_metrics(
    pool: asyncpg.Pool,
    worker_id: str,
    work_dir: str,
    *,
    busy: int,
    completed: int,
    failed: int,
    admission_target: int | None = None,
    admission_reason: str = "",
) -> None:
    """One ``worker_metrics`` row: CPU percent, the process's resident MiB, available and free-disk
    MiB (of ``work_dir``'s file system), busy slots, jobs completed and failed since start, and
    the admission state: control's target (``None`` for a worker on its own) and the reason."""
    vm = psutil.virtual_memory()
    disk = await asyncio.to_thread(psutil.disk_usage, work_dir)
    await pool.execute(
        """
        INSERT INTO worker_metrics (worker_id, cpu_percent, memory_mb, memory_available_mb, disk_free_mb,
                                    slots_busy, jobs_completed, jobs_failed, admission_target, admission_reason)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) ON CONFLICT DO NOTHING
        """,
        worker_id,
        psutil.cpu_percent(interval=None),
        int(psutil.Process().memory_info().rss // (1024 * 1024)),
        int(vm.available // (1024 * 1024)),
        int(disk.free // (1024 * 1024)),
        busy,
        completed,
        failed,
        admission_target,
        admission_reason or None,
    )
