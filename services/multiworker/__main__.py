"""``python -m services.multiworker``: one worker process of several queues (seed 000's always-on
``worker --queues=images,documents``; issue 19 item 4).

``HM_WORKER_QUEUES`` names the queues with their slots (``images=4,documents=2``; a queue without
``=n`` gets its role's default); an engine's lane of the bulk queue is one too
(``bulk.images=2``: its jobs run by the image pipeline, ADR 0057). Each queue is a lane of
:func:`hypermedia.worker.serve.serve_lanes`, built by its role's service (``services.{role}.lane``:
the docworker's starts its office listeners): its own sandbox zygote, slots, admission and worker
id, so a document job never waits for an image slot; each lane of an engine's queue has its
scheduler consumer beside it (:mod:`hypermedia.worker.scheduled`). Postgres, NATS, the storage and
credits channels and the status server are shared. With root, a lane's sandbox uids start at
``HM_SANDBOX_UID_BASE`` plus the uids of the lanes before it (and of their scheduler consumers),
64 in all at most (:func:`hypermedia.worker.unit.settings.plan_lanes`).

A worker unit of ``--queues`` (``python -m hypermedia.worker.unit --queues=images,documents``)
launches this as its execution and sets ``HM_WORKER_QUEUES``; it also runs on its own.
"""

from __future__ import annotations

import importlib
import os
from contextlib import AsyncExitStack

from hypermedia.core import config
from hypermedia.infra.service import Lifetime, run_service
from hypermedia.worker import scheduled
from hypermedia.worker.serve import serve_lanes
from hypermedia.worker.settings import WorkerSettings
from hypermedia.worker.unit.settings import QUEUES_VARIABLE, is_set, plan_lanes


async def serve(stack: AsyncExitStack, stop: Lifetime) -> None:
    """Serve the lanes of ``HM_WORKER_QUEUES``.

    Raises:
        config.ConfigError: ``HM_WORKER_QUEUES`` missing or invalid, ``HM_WORKER_QUEUE`` or
            ``HM_WORKER_SLOTS`` set (the lanes take theirs from ``HM_WORKER_QUEUES``), or a lane's
            own settings invalid (exit 78).
    """
    env = dict(os.environ)
    problems = [
        f"{name}: must not be set: a worker of several queues takes them and their slots from {QUEUES_VARIABLE}"
        for name in ("HM_WORKER_QUEUE", "HM_WORKER_SLOTS")
        if is_set(env, name)
    ]
    try:
        plans = plan_lanes(
            config.lookup(env, QUEUES_VARIABLE), variable=QUEUES_VARIABLE, as_root=os.geteuid() == 0
        )
    except ValueError as exc:
        problems.append(str(exc))
    if problems:
        raise config.ConfigError("invalid configuration:\n  " + "\n  ".join(problems))
    built: list[tuple[WorkerSettings, str, scheduled.LaneFactory]] = []
    for plan in plans:
        settings = config.load(WorkerSettings, HM_WORKER_QUEUE=plan.queue, HM_WORKER_SLOTS=plan.slots)
        settings = settings.model_copy(
            update={"sandbox_uid_base": settings.sandbox_uid_base + plan.uid_offset}
        )
        built.append(
            (settings, plan.role.name, importlib.import_module(f"services.{plan.role.name}.__main__").lane)
        )
    await serve_lanes(stack, stop, await scheduled.with_consumers(stack, built))


if __name__ == "__main__":
    run_service("multiworker", serve)
