"""The scheduler consumer (seed 001's "one separate scheduler consumer"; issue 25 item 3, ADR 0073).

A worker process that serves an engine's queue (``images``) runs, beside that lane's ordinary
slots, one more lane: the engine's lane of the sched queue (``sched.images``), with
:data:`SLOTS` slot, built by the same role's lane factory, so its jobs run with the same handler in
a sandbox of the same rules (a zygote of its own; with root, sandbox uids of its own right after
the ordinary lane's). It takes only the jobs of schedules' process runs (the gateway puts them
there: :mod:`services.gateway.schedule_runner`), and nothing else takes them.

Ordinary admission never counts it nor parks it: a unit's control decides a target for its
ordinary lanes only (the sched lane is outside the autoscaler's room and a message naming it is
refused), and the status's totals leave it out. Its own memory and PID gates, the peer evidence
of a unit and the drain hold as for any lane. A bulk lane gets none (bulk work is background
already); ``HM_WORKER_SCHEDULER=off`` turns it off.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from pathlib import Path

from hypermedia.core import config
from hypermedia.jobs import queues
from hypermedia.worker.serve import Lane
from hypermedia.worker.settings import WorkerSettings
from hypermedia.worker.unit.settings import ROLES, SCHEDULER_SLOTS, consumer_uids_problem

SLOTS = SCHEDULER_SLOTS
"""The scheduler consumer's slots: one, as in seed 001."""

WORK_SUBDIR = "sched"
"""The consumer's work directory under the lane's ``HM_WORK_DIR``."""

LaneFactory = Callable[[AsyncExitStack, WorkerSettings], Awaitable[Lane]]
"""A role's lane builder, ``services.{role}.__main__.lane``."""


def consumer_settings(settings: WorkerSettings, role: str, *, as_root: bool) -> WorkerSettings | None:
    """The settings of the scheduler consumer beside the lane of ``settings`` (of ``role``, a key
    of :data:`~hypermedia.worker.unit.settings.ROLES`): route ``sched.{queue}``, :data:`SLOTS`
    slot, sandbox uids from ``HM_SANDBOX_UID_BASE`` plus the lane's own (``slots`` times the
    role's uids per slot), work directory ``{HM_WORK_DIR}/sched``. None for a bulk lane, or with
    ``HM_WORKER_SCHEDULER=off``.

    Raises:
        config.ConfigError: (``as_root``) the lane's uids and the consumer's do not fit in the
            :data:`~hypermedia.worker.unit.settings.UID_RANGE` uids of one worker process (exit 78).
    """
    if settings.scheduler == "off" or settings.queue not in queues.ENGINE_QUEUES:
        return None
    taken = settings.slots * ROLES[role].uids_per_slot
    if as_root and (problem := consumer_uids_problem(ROLES[role], settings.slots)) is not None:
        raise config.ConfigError(f"invalid configuration:\n  {problem}")
    return settings.model_copy(
        update={
            "queue": queues.sched_route(settings.queue),
            "slots": SLOTS,
            "sandbox_uid_base": settings.sandbox_uid_base + taken,
            # A directory of its own: its job directories (which each lane's start clears of
            # leftovers) and a docworker's office listeners (named by slot) must not meet the lane's.
            "work_dir": str(Path(settings.work_dir) / WORK_SUBDIR),
        }
    )


async def with_consumers(
    stack: AsyncExitStack, plans: Sequence[tuple[WorkerSettings, str, LaneFactory]]
) -> list[Lane]:
    """The lanes of ``plans`` (each a lane's settings, its role and the role's factory), in
    order, then the scheduler consumer of each that has one (:func:`consumer_settings`), built
    by the same factory. Raises what :func:`consumer_settings` raises before anything is built,
    then what the factories raise."""
    # Every consumer's settings first: a refusal must come before any lane has started anything
    # (a docworker lane starts its office listeners).
    consumers = [
        (consumer_settings(settings, role, as_root=os.geteuid() == 0), build)
        for settings, role, build in plans
    ]
    lanes = [await build(stack, settings) for settings, _role, build in plans]
    lanes += [await build(stack, own) for own, build in consumers if own is not None]
    return lanes
