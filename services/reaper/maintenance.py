"""The reaper's runner of maintenance schedules (issue 25 items 2 and 3, ADR 0072): every
``HM_SCHEDULE_POLL_SECONDS`` it records the due ticks of every schedule (as the gateways do:
:func:`hypermedia.jobs.schedules.claim_due` records each tick once however many poll) and runs
the pending ``maintenance`` runs — the platform's own tasks, run here because the reaper alone
may list the credits' holds:

* ``prune_job_events``, ``prune_worker_metrics``, ``prune_webhook_deliveries``: that table's
  rows older than the schedule's ``older_than_days`` (:class:`~hypermedia.jobs.retention.Retention`
  with only that table's retention; the other tables untouched), ``{"deleted": {table: n}}``;
* ``reconcile_holds``: the sweep of holds whose job ended but which nobody settled
  (:meth:`~hypermedia.jobs.settlement.Settlement.sweep`), ``{"settled": n}``.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import asyncpg

from hypermedia.core import metrics
from hypermedia.core.errors import DomainError
from hypermedia.jobs import schedules
from hypermedia.jobs.retention import Retention
from hypermedia.jobs.schedules import Run, Schedule
from hypermedia.jobs.settlement import Settlement
from services.reaper.reaper import SETTLE_GRACE_SECONDS

log = logging.getLogger(__name__)


class MaintenanceRunner:
    """Args: pool; the settlement (``reconcile_holds``); ``runner``, this process's name."""

    def __init__(self, pool: asyncpg.Pool, settlement: Settlement, *, runner: str) -> None:
        self._pool = pool
        self._settlement = settlement
        self._runner = runner

    async def run_once(self) -> int:
        """One poll: due ticks recorded, pending maintenance runs run. Returns the runs run."""
        now = await self._pool.fetchval("SELECT clock_timestamp()")
        await schedules.claim_due(self._pool, now)
        taken = await schedules.take_pending(self._pool, self._runner, ("maintenance",), 5)
        for run, schedule in taken:
            await self._run(run, schedule)
        return len(taken)

    async def _run(self, run: Run, schedule: Schedule) -> None:
        outcome: dict[str, Any] | None = None
        error: tuple[str, str] | None = None
        try:
            outcome = await self.task(schedule.spec)
            log.info("maintenance run of %s: %s", schedule.name, outcome)
        except DomainError as exc:
            error = (exc.error_code, exc.public_message)
        except Exception:
            log.exception("maintenance run %s of %s failed", run.run_id, schedule.name)
            error = ("INTERNAL", "the task failed; see the reaper's log")
        await schedules.finish(self._pool, run.run_id, outcome, error)
        metrics.SCHEDULE_RUNS.labels(schedule.kind, "failed" if error else "succeeded").inc()

    async def task(self, spec: dict[str, Any]) -> dict[str, Any]:
        """Runs one task of :data:`hypermedia.jobs.schedules.TASKS`; returns what it did."""
        if spec["task"] == "reconcile_holds":
            settled = await self._settlement.sweep(self._pool, SETTLE_GRACE_SECONDS, 500)
            return {"settled": settled}
        days = float(spec["older_than_days"])
        task = spec["task"]
        pruned = await Retention(
            self._pool,
            job_events_days=days if task == "prune_job_events" else 0.0,
            worker_metrics_days=days if task == "prune_worker_metrics" else 0.0,
            webhook_deliveries_days=days if task == "prune_webhook_deliveries" else 0.0,
        ).run_once()
        return {"deleted": {k: v for k, v in dataclasses.asdict(pruned).items() if v}}
