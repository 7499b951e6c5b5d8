"""What control measures of its execution: the cgroup control made for it (memory current, peak
and limit; pids current and limit; memory pressure stall where the kernel has it), and the backlog
of the unit's queues in Postgres. The files are the kernel's (Documentation/admin-guide/
cgroup-v2.rst: ``memory.current``, ``memory.peak``, ``memory.max``, ``pids.current``, ``pids.max``,
``memory.pressure``; cgroup-v1/memory.rst and pids.rst: ``memory.usage_in_bytes``,
``memory.max_usage_in_bytes``, ``memory.limit_in_bytes``, ``pids.current``, ``pids.max``)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import asyncpg

from hypermedia.sandbox.cgroupfind import CgroupError, Unavailable, discover
from hypermedia.sandbox.cgroups import JobCgroup, V1JobCgroup, V2JobCgroup
from hypermedia.worker import admission

UNLIMITED = 2**62
"""A v1 limit at or above this is "no limit" (the kernel writes PAGE_COUNTER_MAX pages, ~2^63)."""


@dataclass(frozen=True)
class Sample:
    """One reading of execution's cgroup, taken at ``taken_at`` (``time.monotonic()``). Memory in
    bytes; a limit the group does not set is what the machine (or the container) still allows
    (:func:`hypermedia.worker.admission.available_memory_mb` plus the current use;
    :func:`~hypermedia.worker.admission.pid_headroom` plus the current count).
    ``memory_pressure``: the ``some avg10`` percentage of ``memory.pressure`` (v2 only), else None."""

    taken_at: float
    memory_current: int
    memory_peak: int | None
    memory_limit: int
    pids_current: int
    pids_limit: int
    memory_pressure: float | None = None

    def age(self, now: float | None = None) -> float:
        """Seconds since the reading."""
        return (time.monotonic() if now is None else now) - self.taken_at


def _int(path: str) -> int | None:
    try:
        with open(path) as f:
            value = f.read().strip()
    except OSError:
        return None
    if value == "max":
        return UNLIMITED
    return int(value) if value.isdigit() else None


def _pressure(path: str) -> float | None:
    """``some avg10`` of a PSI file (``some avg10=0.00 avg60=0.00 avg300=0.00 total=0``)."""
    try:
        with open(path) as f:
            first = f.readline().split()
    except OSError:
        return None
    for field in first[1:]:
        key, _, value = field.partition("=")
        if key == "avg10":
            return float(value)
    return None


def read(group: JobCgroup | None) -> Sample | None:
    """A :class:`Sample` of ``group``; None when there is no group or its files cannot be read
    (the execution exited and the group went, or no cgroup was delegated): missing evidence."""
    if isinstance(group, V1JobCgroup):
        current = _int(f"{group.memory_dir}/memory.usage_in_bytes")
        peak = _int(f"{group.memory_dir}/memory.max_usage_in_bytes")
        limit = _int(f"{group.memory_dir}/memory.limit_in_bytes")
        pids = _int(f"{group.pids_dir}/pids.current")
        pids_max = _int(f"{group.pids_dir}/pids.max")
        pressure = None
    elif isinstance(group, V2JobCgroup):
        current = _int(f"{group.path}/memory.current")
        peak = _int(f"{group.path}/memory.peak")
        limit = _int(f"{group.path}/memory.max")
        pids = _int(f"{group.path}/pids.current")
        pids_max = _int(f"{group.path}/pids.max")
        pressure = _pressure(f"{group.path}/memory.pressure")
    else:
        return None
    if current is None or limit is None:
        return None
    if pids is None:  # a root group (the v1 pids hierarchy's of a host) has no pids.current
        pids, pids_max = _host_tasks(), UNLIMITED
    elif pids_max is None:
        pids_max = UNLIMITED
    if limit >= UNLIMITED:
        limit = current + admission.available_memory_mb() * 1024 * 1024
    if pids_max >= UNLIMITED:
        pids_max = pids + admission.pid_headroom()
    return Sample(time.monotonic(), current, peak, limit, pids, pids_max, pressure)


def own_group() -> JobCgroup | None:
    """This process's own cgroup, to be read only: where control cannot make a group for its
    execution (a container whose cgroup file system is mounted read-only, as Kubernetes mounts it
    for an unprivileged pod), the container's own group is the unit's evidence (control's few
    MiB included). None when it cannot be found. Never a target of containment: its members
    include control."""
    try:
        found = discover(Path("/proc/self/cgroup").read_text(), Path("/proc/self/mountinfo").read_text())
    except (OSError, CgroupError):
        return None
    if isinstance(found, Unavailable):
        return None
    if found.version == 2:
        return V2JobCgroup(found.dirs[""], ())
    return V1JobCgroup(found.dirs["memory"], found.dirs["pids"], ())


def _host_tasks() -> int:
    """Scheduling entities on the host now (``/proc/loadavg``'s fourth field, proc(5))."""
    with open("/proc/loadavg") as f:
        return int(f.read().split()[3].split("/")[1])


async def backlogs(pool: asyncpg.Pool, queues: Sequence[str]) -> dict[str, int]:
    """Jobs ``queued`` now on each of ``queues`` (0 for one with none), in one query (Postgres is
    the truth: JetStream does not count the ones that wait for a retry or were not yet published)."""
    rows = await pool.fetch(
        "SELECT queue, count(*) AS n FROM processing_jobs WHERE status = 'queued' AND queue = ANY($1::text[]) "
        "GROUP BY queue",
        list(queues),
    )
    counted = {row["queue"]: int(row["n"]) for row in rows}
    return {queue: counted.get(queue, 0) for queue in queues}


async def job_memory_mb(pool: asyncpg.Pool, queues: Sequence[str]) -> tuple[int, str]:
    """What one job of ``queues`` may take, in MiB, and where the number comes from: the 95th
    percentile of ``job_attempts.peak_memory_mb`` of the last 7 days' completed attempts of the
    queue's worst operation (``measured``, once an operation has 20 attempts), else the largest
    ``memory_limit_mb`` of the queues' profiles (``profile``)."""
    row = await pool.fetchrow(
        """
        SELECT max(p95) AS p95 FROM (
            SELECT percentile_disc(0.95) WITHIN GROUP (ORDER BY a.peak_memory_mb) AS p95
            FROM job_attempts a JOIN processing_jobs j USING (job_id)
            WHERE j.queue = ANY($1::text[]) AND a.status = 'completed' AND a.peak_memory_mb > 0
              AND a.finished_at > now() - interval '7 days'
            GROUP BY j.operation HAVING count(*) >= 20
        ) per_operation
        """,
        list(queues),
    )
    if row is not None and row["p95"] is not None:
        return max(1, int(row["p95"])), "measured"
    limit = await pool.fetchval(
        "SELECT max(memory_limit_mb) FROM processing_profiles WHERE queue = ANY($1::text[]) AND operation <> 'noop'",
        list(queues),
    )
    return max(1, int(limit or 512)), "profile"
