"""Whether this worker takes another job now: slots, and gates on the memory its container may still
use and on the processes it may still start, sampled from cgroup v2 or the host (:class:`Admission`)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil


def available_memory_mb() -> int:
    """Memory this process's container may still use (MiB): the cgroup v2 limit minus usage when a
    limit is set (in a container ``/proc/meminfo`` shows the node), else the host's available memory."""
    cgroup = Path("/sys/fs/cgroup")
    try:
        limit = (cgroup / "memory.max").read_text().strip()
        if limit != "max":
            current = int((cgroup / "memory.current").read_text())
            return max(0, int(limit) - current) // (1024 * 1024)
    except (OSError, ValueError):
        pass
    return int(psutil.virtual_memory().available // (1024 * 1024))


def pid_headroom() -> int:
    """Processes and threads this worker may still start: ``pids.max − pids.current`` of its cgroup
    v2 when the pids controller limits it (a container's ``pids-limit``), else the host's
    ``min(kernel.pid_max, kernel.threads-max)`` minus the scheduling entities that exist now (the
    total of ``/proc/loadavg``'s fourth field, see proc(5))."""
    cgroup = Path("/sys/fs/cgroup")
    try:
        limit = (cgroup / "pids.max").read_text().strip()
        if limit != "max":
            return max(0, int(limit) - int((cgroup / "pids.current").read_text()))
    except (OSError, ValueError):
        pass
    kernel = Path("/proc/sys/kernel")
    ceiling = min(int((kernel / "pid_max").read_text()), int((kernel / "threads-max").read_text()))
    tasks = int(Path("/proc/loadavg").read_text().split()[3].split("/")[1])
    return max(0, ceiling - tasks)


READING_MAX_AGE_SECONDS = 0.1
"""How old the memory and PID readings may be when :meth:`Admission.sample` decides: the fetch loop
samples once per message, and reading ``/proc`` and the cgroup files for each one cost 5 % of an
imageworker's CPU on no-op jobs (issue 17, P6). Slots and draining are decided afresh every time."""


@dataclass
class Admission:
    """Slots plus memory and PID gates. ``reason`` says why admission is open or closed; the gates
    reopen on the next fresh sample (every loop turn and every second while idle; the readings at
    most :data:`READING_MAX_AGE_SECONDS` old). The first sample is taken at construction, so a
    status read before the loop's first turn is a measurement too."""

    slots: int
    min_available_mb: int
    min_pid_headroom: int = 0
    busy: int = 0
    reason: str = "ok"
    sampled_at: float = float("-inf")
    """When memory and PIDs were last read (``time.monotonic()``)."""
    draining: bool = False
    available_mb: int = 0
    """Memory available at the last sample (MiB)."""
    pids_free: int = 0
    """PID headroom at the last sample (:func:`pid_headroom`)."""
    unparking: int = 0
    """Parked jobs whose children ended, waiting for a slot (:mod:`hypermedia.worker.fanout`):
    each holds a slot's place, so that no new job takes the slot they wait for."""
    peer: str = "none"
    """A worker unit's peer evidence: ``none`` (no control: a worker on its own), ``awaiting``
    (nothing is admitted before control's matching evidence) or ``matched``."""
    target: int | None = None
    """Control's admission target (:mod:`hypermedia.worker.unit.autoscaler`); None without one.
    Slots stay resident above it: a target below ``busy`` parks the next receive until running
    jobs finish below it, it takes no slot from a running job."""
    control: dict[str, Any] = field(default_factory=dict)
    """Control's last ``admission`` message (reason, sample, backlog), for the status."""

    def __post_init__(self) -> None:
        self.sample()

    def sample(self) -> None:
        """Decides ``reason``, reading memory and PIDs again when the last reading is older than
        :data:`READING_MAX_AGE_SECONDS`."""
        now = time.monotonic()
        if now - self.sampled_at >= READING_MAX_AGE_SECONDS:
            self.available_mb = available_memory_mb()
            self.pids_free = pid_headroom()
            self.sampled_at = now
        if self.draining:
            self.reason = "draining"
        elif self.peer == "awaiting":
            self.reason = "awaiting_peer_evidence"
        elif self.available_mb < self.min_available_mb:
            self.reason = "memory_pressure"
        elif self.pids_free < self.min_pid_headroom:
            self.reason = "pid_pressure"
        elif self.busy + self.unparking >= self.slots:
            self.reason = "slots_full"
        elif self.busy + self.unparking >= self.limit:
            self.reason = "parked"
        else:
            self.reason = "ok"

    @property
    def open(self) -> bool:
        return self.reason == "ok"

    @property
    def room(self) -> int:
        """Jobs that may be admitted now beside the running ones and those coming back from a
        park (:attr:`unparking`); 0 or less when none."""
        return self.limit - self.busy - self.unparking

    @property
    def limit(self) -> int:
        """Jobs admitted at once now: the slots, or control's target when lower."""
        return self.slots if self.target is None else max(0, min(self.slots, self.target))

    def apply_control(self, message: dict[str, Any]) -> None:
        """Take control's ``admission`` message (:mod:`hypermedia.worker.unit.peer`)."""
        self.target = int(message["target"])
        self.control = message
        self.sample()
