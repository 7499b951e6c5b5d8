"""The scheduler's decision for one pool, from its inputs alone (no I/O: every number a decision
used is in its :class:`Inputs`, and ``scaling_decisions.inputs`` records them).

Little's law (L = λ·W) gives the slots the queues need::

    slots_needed   = arrival_work_rate + backlog_work / drain_target
    burst_needed   = ceil(max(0, slots_needed - standing_slots × utilisation)
                          / (slots_per_worker × utilisation))
    target         = clamp(burst_needed, min_workers, max_workers)

``arrival_work_rate`` is the work arriving per second (jobs per second × the expected seconds of
each, the EWMA of its operation's completed attempts): slot-seconds per second, i.e. slots kept
busy in the steady state. ``backlog_work`` is the expected seconds of the jobs ready now. Standing
workers (not the scheduler's) are subtracted first; burst workers booting count as capacity.

Then, against the live burst workers (requested, booting or registered):

- more are needed: start ``target - live``, at most ``step_max``, and only as many as would each
  find one boot time of work when booted (``slots_per_worker × utilisation × boot_seconds`` of the
  backlog left after the live capacity has worked through the boot); ``min_workers`` are started
  regardless, and so is one when ready jobs have no worker at all (else a small backlog would
  wait forever); never past the spend cap; at most one while the inputs are stale;
- fewer are needed: drain ``live - target``, at most ``step_max``, chosen only among registered
  burst workers that hold no job, have been idle ``idle_after`` and are older than their boot
  grace (never by count); none while the inputs are stale.

docs/operations.md ("Scheduler") works one decision through by hand.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from services.scheduler.pools import Pool

LIVE_STATES = ("requested", "booting", "registered")
BOOTING_STATES = ("requested", "booting")


@dataclass(frozen=True)
class QueueDemand:
    """One queue's demand, read from Postgres (:mod:`services.scheduler.demand`).

    ``ready``: jobs ``queued`` or due for retry; ``ready_by_band``: those per priority band
    (``high`` 1–3, ``normal`` 4–7, ``low`` 8–10); ``running``: claimed or processing;
    ``backlog_work_seconds``: the expected seconds of the ready jobs; ``arrival_per_second``: jobs
    created per second over the arrival window; ``arrival_work_rate``: those jobs' expected seconds
    per second; ``oldest_ready_seconds``: the age of the oldest ready job (0 when none)."""

    queue: str
    ready: int = 0
    ready_by_band: dict[str, int] = field(default_factory=dict)
    running: int = 0
    backlog_work_seconds: float = 0.0
    arrival_per_second: float = 0.0
    arrival_work_rate: float = 0.0
    oldest_ready_seconds: float = 0.0


@dataclass(frozen=True)
class BurstWorker:
    """A live burst worker of the pool as the plan sees it: ``age_seconds`` since it was
    requested, ``running_jobs`` it holds now, ``idle_seconds`` since it last held one (since it
    registered when it never has)."""

    burst_worker_id: str
    state: str
    age_seconds: float
    running_jobs: int = 0
    idle_seconds: float = 0.0


@dataclass(frozen=True)
class Inputs:
    """Everything one decision reads. ``standing_slots``: slots of live workers of the pool's
    queues that are not burst workers; ``stale``: why the inputs cannot be trusted for a
    scale-down ("" when they can), e.g. a worker's heartbeat older than three intervals;
    ``spend_per_hour``: the summed ``cost_per_hour`` of the live burst workers."""

    demand: tuple[QueueDemand, ...]
    burst: tuple[BurstWorker, ...] = ()
    standing_slots: int = 0
    stale: str = ""
    spend_per_hour: float = 0.0


@dataclass(frozen=True)
class Plan:
    """The decision: ``target`` burst workers; ``action`` with ``count`` workers (``drain``
    names them in ``drain_ids``); ``reason`` in words; ``slots_needed`` from the formula."""

    target: int
    action: Literal["start", "drain", "hold"]
    count: int
    reason: str
    slots_needed: float
    drain_ids: tuple[str, ...] = ()


def slots_needed(pool: Pool, inputs: Inputs) -> float:
    """Little's law: the arrival work rate plus the backlog's work over the drain target (slots)."""
    arrival = sum(d.arrival_work_rate for d in inputs.demand)
    backlog = sum(d.backlog_work_seconds for d in inputs.demand)
    return arrival + backlog / pool.drain_target_seconds


def target_workers(pool: Pool, inputs: Inputs) -> int:
    """Burst workers the pool should have: slots beyond the standing workers', per worker's
    planned slots, rounded up, clamped to ``[min_workers, max_workers]``."""
    beyond = max(0.0, slots_needed(pool, inputs) - inputs.standing_slots * pool.utilisation)
    wanted = math.ceil(beyond / (pool.slots_per_worker * pool.utilisation) - 1e-9)
    return max(pool.min_workers, min(pool.max_workers, wanted))


def plan(pool: Pool, inputs: Inputs) -> Plan:
    """The decision for ``pool`` (see the module docstring); pure."""
    needed = slots_needed(pool, inputs)
    target = target_workers(pool, inputs)
    live = [b for b in inputs.burst if b.state in LIVE_STATES]
    if target > len(live):
        return _grow(pool, inputs, target, live, needed)
    if target < len(live):
        return _shrink(pool, inputs, target, live, needed)
    return Plan(target, "hold", 0, f"at target: {target} burst workers live", needed)


def _grow(pool: Pool, inputs: Inputs, target: int, live: list[BurstWorker], needed: float) -> Plan:
    want = min(target - len(live), pool.step_max)
    below_min = max(0, pool.min_workers - len(live))
    per_worker = pool.slots_per_worker * pool.utilisation
    capacity = inputs.standing_slots * pool.utilisation + len(live) * per_worker
    arrival = sum(d.arrival_work_rate for d in inputs.demand)
    backlog = sum(d.backlog_work_seconds for d in inputs.demand)
    left_at_boot = backlog + (arrival - capacity) * pool.boot_seconds
    worth = max(0, math.floor(left_at_boot / (per_worker * pool.boot_seconds) + 1e-9))
    starts = max(min(want, worth), min(want, below_min))
    why = [f"target {target} > {len(live)} live"]
    ready = sum(d.ready for d in inputs.demand)
    if capacity == 0 and ready and starts == 0:
        starts = 1
        why.append(f"no worker for {ready} ready jobs: one started whatever the work")
    elif starts < want:
        why.append(
            f"{left_at_boot:.1f} slot-seconds of work would be left after one boot ({pool.boot_seconds:g} s): "
            f"enough for {worth} more worker(s)"
        )
    if pool.max_spend_per_hour is not None and pool.cost_per_hour > 0:
        room = math.floor((pool.max_spend_per_hour - inputs.spend_per_hour) / pool.cost_per_hour + 1e-9)
        if starts > max(0, room):
            starts = max(0, room)
            why.append(f"spend cap {pool.max_spend_per_hour:g}/h (now {inputs.spend_per_hour:g}/h)")
    if inputs.stale and starts > 1:
        starts = 1
        why.append(f"inputs stale ({inputs.stale}): at most one start")
    if starts == 0:
        return Plan(target, "hold", 0, "; ".join(why) + ": none started", needed)
    return Plan(target, "start", starts, "; ".join(why) + f": starting {starts}", needed)


def _shrink(pool: Pool, inputs: Inputs, target: int, live: list[BurstWorker], needed: float) -> Plan:
    surplus = len(live) - target
    if inputs.stale:
        return Plan(
            target,
            "hold",
            0,
            f"target {target} < {len(live)} live; inputs stale ({inputs.stale}): no scale-down",
            needed,
        )
    idle = sorted(
        (
            b
            for b in live
            if b.state == "registered"
            and b.running_jobs == 0
            and b.idle_seconds >= pool.idle_after
            and b.age_seconds >= pool.boot_grace
        ),
        key=lambda b: -b.idle_seconds,
    )
    chosen = tuple(b.burst_worker_id for b in idle[: min(surplus, pool.step_max)])
    if not chosen:
        return Plan(
            target,
            "hold",
            0,
            f"target {target} < {len(live)} live; none idle {pool.idle_after:g} s past its boot grace "
            f"({pool.boot_grace:g} s)",
            needed,
        )
    return Plan(
        target,
        "drain",
        len(chosen),
        f"target {target} < {len(live)} live: draining {len(chosen)} idle {pool.idle_after:g} s or more",
        needed,
        chosen,
    )
