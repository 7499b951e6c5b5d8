"""The unit's autoscaler (seed 001: "control's independent private autoscaler"): from fresh
measurements of execution's cgroup and the queues' backlog, the number of jobs execution may run
at once, with the reason. A pure decision (:meth:`Autoscaler.decide`); control samples and sends.

Rules, in order:

1. **Pressure closes.** Memory at :data:`SEVERE_MEMORY` of its limit or above, memory pressure
   stall (``some avg10``) at :data:`SEVERE_STALL_PERCENT` or above, or pids at
   :data:`SEVERE_PIDS` of theirs: target 0 (``memory_pressure`` / ``pid_pressure``). It stays 0
   until a sample taken *after* the closing one is back under :data:`RECOVERED_FRACTION`.
2. **Missing or stale measurements hold at one** (``no_measurements``, ``stale_measurements``:
   older than :data:`SAMPLE_MAX_AGE_SECONDS`).
3. **Fit.** How many jobs fit: the jobs running now plus those the free memory under
   :data:`SEVERE_MEMORY` holds at one job's measured peak
   (:func:`hypermedia.worker.unit.evidence.job_memory_mb`), and likewise for pids at
   :data:`PIDS_PER_JOB`; at least 1, at most the resident slots.
   In a unit of several queues each queue has its autoscaler and the free memory and pids are
   shared (:class:`SharedRoom`): a queue's fit leaves out what the other queues with a backlog
   admitted and have not started, and the "at least 1" is the unit's, not each queue's.
4. **Grow only on a new sample and demand**: above the current target only when the sample is
   newer than the last decision's and the backlog is not empty. **Shrink at once**: execution
   then admits nothing until its running jobs are below the new target (a slot is not taken
   back from a running job).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from hypermedia.worker.unit.evidence import Sample

SAMPLE_MAX_AGE_SECONDS = 5.0
"""A sample older than this is stale; control samples every second (``HM_UNIT_SAMPLE_SECONDS``)."""

SEVERE_MEMORY = 0.90
"""Memory use at or above this fraction of the limit closes admission. The per-job limits keep a
job under its own peak; this keeps the next job from being admitted into the last tenth."""

SEVERE_PIDS = 0.90
"""Pids at or above this fraction of ``pids.max`` close admission."""

RECOVERED_FRACTION = 0.80
"""A closed admission reopens on a fresh sample with memory and pids under this fraction."""

SEVERE_STALL_PERCENT = 40.0
"""``memory.pressure`` ``some avg10`` at or above this (percent of wall time some task waited for
memory over the last 10 s, cgroup-v2.rst "PSI") closes admission too (cgroup v2 only)."""

PIDS_PER_JOB = 16
"""Pids one job may take: its ``RLIMIT_NPROC`` (:mod:`hypermedia.sandbox`)."""


@dataclass(frozen=True)
class Decision:
    """A target and why; ``sample_taken_at`` is the sample's (``None`` without one)."""

    target: int
    reason: str
    decided_at: float
    sample_taken_at: float | None
    backlog: int


class Autoscaler:
    """Decides execution's admission target for ``slots`` resident slots, one job taking
    ``job_memory_mb`` MiB (``memory_source``: ``measured`` or ``profile``)."""

    def __init__(self, slots: int, job_memory_mb: int, memory_source: str = "profile") -> None:
        self.slots = slots
        self.job_memory_mb = job_memory_mb
        self.memory_source = memory_source
        self.closed: str | None = None
        """``memory_pressure`` or ``pid_pressure`` while admission is closed."""
        self._closed_by: float = float("-inf")
        self.last = Decision(min(1, slots), "no_measurements", time.monotonic(), None, 0)

    def decide(
        self,
        sample: Sample | None,
        backlog: int,
        busy: int,
        now: float | None = None,
        *,
        reserved_bytes: int = 0,
        reserved_pids: int = 0,
        floor: int = 1,
    ) -> Decision:
        """The next :class:`Decision` (also kept as ``last``) from ``sample`` (``None``: none
        could be read), the queue's ``backlog`` and the jobs ``busy`` in execution now;
        ``reserved_bytes`` and ``reserved_pids`` of the free room are promised to other queues;
        ``floor`` is the target without measurements or room (0 for a queue of several:
        :class:`SharedRoom` gives the unit's one job)."""
        now = time.monotonic() if now is None else now
        decision = self._decide(sample, backlog, busy, now, reserved_bytes, reserved_pids, floor)
        self.last = decision
        return decision

    def pending(self, busy: int) -> int:
        """Jobs the last decision admits that have not started: its target above ``busy``."""
        return max(0, self.last.target - busy)

    def _decide(
        self,
        sample: Sample | None,
        backlog: int,
        busy: int,
        now: float,
        reserved_bytes: int,
        reserved_pids: int,
        floor: int,
    ) -> Decision:
        taken = sample.taken_at if sample is not None else None
        fresh = sample is not None and sample.age(now) <= SAMPLE_MAX_AGE_SECONDS
        if sample is not None and fresh:
            severe = _severe(sample)
            if severe is not None:
                self.closed, self._closed_by = severe[0], sample.taken_at
                return Decision(0, f"{severe[0]}: {severe[1]}", now, taken, backlog)
            if self.closed is not None:
                if sample.taken_at <= self._closed_by or not _recovered(sample):
                    return Decision(
                        0,
                        f"{self.closed}: waiting for a fresh sample under {RECOVERED_FRACTION:.0%}",
                        now,
                        taken,
                        backlog,
                    )
                self.closed = None
        elif self.closed is not None:
            return Decision(0, f"{self.closed}: waiting for a fresh sample", now, taken, backlog)
        if sample is None:
            return Decision(min(floor, self.slots), "no_measurements", now, None, backlog)
        if not fresh:
            return Decision(
                min(floor, self.slots),
                f"stale_measurements: sample {sample.age(now):.1f} s old",
                now,
                taken,
                backlog,
            )
        job_bytes = self.job_memory_mb * 1024 * 1024
        memory_room = int(sample.memory_limit * SEVERE_MEMORY) - sample.memory_current - reserved_bytes
        pids_room = int(sample.pids_limit * SEVERE_PIDS) - sample.pids_current - reserved_pids
        by_memory = busy + max(0, memory_room) // job_bytes
        by_pids = busy + max(0, pids_room) // PIDS_PER_JOB
        fit = max(floor, min(self.slots, by_memory, by_pids))
        why = (
            f"memory for {by_memory} jobs of {self.job_memory_mb} MiB ({self.memory_source}), "
            f"pids for {by_pids}, {self.slots} slots, backlog {backlog}"
        )
        current = self.last.target
        if fit > current:
            newer = self.last.sample_taken_at is None or sample.taken_at > self.last.sample_taken_at
            if not newer:
                return Decision(current, f"steady (no new sample): {why}", now, taken, backlog)
            if backlog == 0 and current >= floor:
                return Decision(current, f"steady (no backlog): {why}", now, taken, backlog)
            return Decision(fit, f"grow: {why}", now, taken, backlog)
        if fit < current:
            return Decision(fit, f"shrink: {why}", now, taken, backlog)
        return Decision(current, f"steady: {why}", now, taken, backlog)


def _severe(sample: Sample) -> tuple[str, str] | None:
    if sample.memory_current >= sample.memory_limit * SEVERE_MEMORY:
        return "memory_pressure", f"{_mb(sample.memory_current)} of {_mb(sample.memory_limit)} MiB in use"
    if sample.memory_pressure is not None and sample.memory_pressure >= SEVERE_STALL_PERCENT:
        return "memory_pressure", f"memory stall {sample.memory_pressure:.0f} % (avg10)"
    if sample.pids_current >= sample.pids_limit * SEVERE_PIDS:
        return "pid_pressure", f"{sample.pids_current} of {sample.pids_limit} pids in use"
    return None


def _recovered(sample: Sample) -> bool:
    return (
        sample.memory_current < sample.memory_limit * RECOVERED_FRACTION
        and sample.pids_current < sample.pids_limit * RECOVERED_FRACTION
        and (sample.memory_pressure is None or sample.memory_pressure < SEVERE_STALL_PERCENT)
    )


def _mb(n: int) -> int:
    return n // (1024 * 1024)


TURN_HOLD_SECONDS = 3.0
"""A queue given the unit's one job keeps the turn this long at least: execution reports its
busy slots every second, so a job it started shows by then, and the turn does not pass to another
queue while the first job is being claimed."""


class SharedRoom:
    """The autoscalers of one execution's queues, deciding on one sample (seed 001's autoscaler
    for a unit of several queues, ``--queues``).

    * Each queue's fit leaves out the memory and pids that the other queues with a backlog
      admitted and have not started (their target above their busy slots, at their own memory
      per job and :data:`PIDS_PER_JOB`), so two queues never both grow into the same free memory,
      and an idle queue holds no room.
    * Missing or stale measurements, or a room that holds no further job while nothing runs,
      admit **one job in the unit**, not one per queue: the turn goes to the queue with a backlog
      that had it least recently (so no queue starves), and stays there while its job runs, and
      for :data:`TURN_HOLD_SECONDS` at least while that queue has a backlog.
    * Pressure closes every queue (the same sample is severe for all)."""

    def __init__(self) -> None:
        self.turn: Autoscaler | None = None
        self._turn_at = float("-inf")
        self._served: dict[Autoscaler, float] = {}
        """When each queue's autoscaler last got the turn."""

    def decide(
        self, lanes: list[tuple[Autoscaler, int, int]], sample: Sample | None, now: float | None = None
    ) -> list[Decision]:
        """Decisions for ``lanes`` of ``(autoscaler, backlog, busy)``, in the order given (a
        lane with a longer backlog should come first: it gets the room first). One lane decides
        exactly as :meth:`Autoscaler.decide`."""
        now = time.monotonic() if now is None else now
        if len(lanes) == 1:
            scaler, backlog, busy = lanes[0]
            return [scaler.decide(sample, backlog, busy, now)]
        decided: list[Decision] = []
        for i, (scaler, backlog, busy) in enumerate(lanes):
            pending = [
                (other, other.pending(other_busy))
                for j, (other, other_backlog, other_busy) in enumerate(lanes)
                if j != i and other_backlog > 0
            ]
            decided.append(
                scaler.decide(
                    sample,
                    backlog,
                    busy,
                    now,
                    reserved_bytes=sum(n * other.job_memory_mb * 1024 * 1024 for other, n in pending),
                    reserved_pids=sum(n * PIDS_PER_JOB for _, n in pending),
                    floor=0,
                )
            )
        holding = self._holding(lanes, now)
        if any(scaler.closed for scaler, _, _ in lanes) or (
            sum(d.target for d in decided) > 0 and not holding
        ):
            self.turn = None
            return decided
        holder = self.turn if holding else self._next_turn(lanes, now)
        if holder is None:
            return decided
        i = [scaler for scaler, _, _ in lanes].index(holder)
        d = decided[i]
        decided[i] = holder.last = replace(
            d, target=max(1, d.target), reason=f"{d.reason}; the unit's one job: this queue's turn"
        )
        return decided

    def _holding(self, lanes: list[tuple[Autoscaler, int, int]], now: float) -> bool:
        """The current turn still holds: given under :data:`TURN_HOLD_SECONDS` ago, and its
        queue has a backlog or a running job."""
        if self.turn is None or now - self._turn_at >= TURN_HOLD_SECONDS:
            return False
        return any(scaler is self.turn and (backlog > 0 or busy > 0) for scaler, backlog, busy in lanes)

    def _next_turn(self, lanes: list[tuple[Autoscaler, int, int]], now: float) -> Autoscaler | None:
        running = [scaler for scaler, _, busy in lanes if busy > 0]
        if running:  # the one job is running: its queue keeps the turn until it ends
            self.turn = running[0]
            return self.turn
        waiting = [scaler for scaler, backlog, _ in lanes if backlog > 0]
        if not waiting:
            self.turn = None
            return None
        self.turn = min(waiting, key=lambda scaler: self._served.get(scaler, float("-inf")))
        self._turn_at = now
        self._served[self.turn] = now
        return self.turn
