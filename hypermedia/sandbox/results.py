"""What a sandboxed job is given and what it ends with: :class:`SandboxLimits` (its rlimits and
cgroup bounds), :class:`SandboxResult` (outputs or a bounded error code, peak memory, the layers
that held) and :class:`ChildExit` (the zygote's word on a finished child). Shared by
:mod:`hypermedia.sandbox.host` and the workers."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hypermedia.engines.contract import OutputFile


@dataclass(frozen=True)
class SandboxLimits:
    """Resource bounds of one job's child process."""

    cpu_seconds: int
    """``RLIMIT_CPU`` soft limit (SIGXCPU → ``TIMEOUT``); the profile's timeout."""
    wall_seconds: float
    """Wall clock, enforced by the worker: the job's process group is killed (``TIMEOUT``). Usually
    timeout × 1.5."""
    memory_bytes: int
    """``RLIMIT_AS``: address space, in bytes (2 GiB for images)."""
    fsize_bytes: int
    """``RLIMIT_FSIZE``: largest file the child may write, in bytes."""
    nproc: int = 16
    """``RLIMIT_NPROC``: processes *and threads* of the sandbox uid, counted across all slots."""
    cgroup_memory_bytes: int | None = None
    """Memory limit of the job's cgroup, bytes (resident and page cache of the job and all its
    descendants; swap 0); None: ``memory_bytes``. Only where the sandbox has cgroups."""
    pids: int = 64
    """``pids.max`` of the job's cgroup: processes and threads of this job alone (fork past it
    fails with EAGAIN). Only where the sandbox has cgroups."""


@dataclass
class SandboxResult:
    """Outcome of one sandboxed job."""

    outputs: list[OutputFile]
    """What the entry returned; empty on failure."""
    error_code: str | None
    """``None`` on success; else a bounded code: the entry's ``DomainError.error_code``,
    ``RESOURCE_LIMIT``, ``TIMEOUT``, ``SANDBOX_VIOLATION`` (the seccomp filter killed the job),
    ``SANDBOX_CRASHED``, ``SANDBOX_UNAVAILABLE``, ``CANCELLED`` or ``INTERNAL``."""
    error_message: str | None
    """Public message; never a path or a traceback."""
    retryable: bool
    """Whether another attempt may succeed (``TIMEOUT``, a lost zygote and one that would not
    start are)."""
    duration_ms: int
    """Wall time of the child, fork to exit."""
    peak_memory_mb: int
    """Peak resident set of the child (``ru_maxrss``), MiB rounded up."""
    layers: Mapping[str, bool | None] = dataclasses.field(default_factory=dict)
    """The confinement layers the child reported (``userns``, ``netns``, ``mountns``, ``ipcns``,
    ``pidns``, ``procns``, ``caps_dropped``, ``landlock``, ``seccomp``: True applied, False
    refused, None not asked for); empty when the child sent no report (it was killed)."""
    cgroup_peak_bytes: int | None = None
    """Peak memory charged to the job's cgroup (the child and its descendants, with page
    cache), bytes; None without cgroups."""
    killed: str = ""
    """Which limit or fence stopped the child (``memory``, ``wall_time``, ``cpu_time``,
    ``file_size``, …: the reasons of ``hypermedia_sandbox_kills_total``); empty otherwise."""


@dataclass
class ChildExit:
    """What the zygote reports about a finished child: its ``exited`` JSON line."""

    status: int | None
    """``wait4``'s status; None when the child was lost with the zygote (see ``failure``)."""
    maxrss_kib: int = 0
    cpu_seconds: float = 0.0
    """User + system CPU seconds of the child and the descendants it waited for (``wait4``); for a
    child the zygote killed, at least what its process group had used at the kill, waited for or
    not (:func:`hypermedia.sandbox.zygote._group_cpu_seconds`)."""
    duration_ms: int = 0
    report: str | None = None
    """The child's JSON report, if it wrote one."""
    failure: str | None = None
    cgroup_peak_bytes: int | None = None
    oom_killed: bool = False

    @classmethod
    def from_event(cls, event: Mapping[str, Any]) -> ChildExit:
        """The exit an ``exited`` event (or a ``{"status": None, "failure": …}`` of a lost zygote) describes."""
        return cls(
            status=event.get("status"),
            maxrss_kib=int(event.get("maxrss_kib") or 0),
            cpu_seconds=float(event.get("cpu_seconds") or 0.0),
            duration_ms=int(event.get("duration_ms") or 0),
            report=event.get("report"),
            failure=event.get("failure"),
            cgroup_peak_bytes=event.get("cgroup_peak_bytes"),
            oom_killed=bool(event.get("oom_killed")),
        )
