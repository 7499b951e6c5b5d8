"""The gateway's schedule runner (issue 25 item 3, ADR 0072): every ``HM_SCHEDULE_POLL_SECONDS``
it records the due ticks of every schedule (:func:`hypermedia.jobs.schedules.claim_due`: exactly
once however many gateways poll), fails the runs whose runner was lost, and runs the pending
``process`` and ``backfill`` runs — the oldest of each account, five accounts' at once — in this
process's event loop, never in a worker's slot. (``maintenance`` runs are the reaper's:
:mod:`services.reaper.maintenance`.)

* A **process** run makes one process request per object of its spec, each under the
  idempotency key ``schedule:{run_id}:{n}``, its jobs on the sched queue's lanes, which only the
  workers' scheduler consumers take (ADR 0073), and each taking a token of the account's request
  rate (a run is the account's requests, made for it; an object past the rate is listed
  ``RATE_LIMITED``); an object that is gone, or an operation it does not accept,
  is listed in the run's ``outcome.errors`` and the others go on. It fails when no job was made.
* A **backfill** run creates a backfill run of its spec (the gateway's
  :class:`~services.gateway.backfill_runner.BackfillRunner` enqueues its items at its rate); its
  id is the run's ``outcome.backfill_run_id``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import asyncpg

from hypermedia.core import metrics
from hypermedia.core.errors import DomainError
from hypermedia.jobs import schedules
from hypermedia.jobs.accounts import Caller
from hypermedia.jobs.backfill.runs import Run as BackfillRun
from hypermedia.jobs.schedules import Run, Schedule
from services.gateway.backfills import Backfills
from services.gateway.creation import JobCreation
from services.gateway.process_request import parse_operations
from services.gateway.schedules import backfill_request

log = logging.getLogger(__name__)

KINDS = ("process", "backfill")
RUNS_A_POLL = 5
"""Pending runs one poll takes and runs at once at most, each of another account (a process run
makes up to 100 requests)."""


class ScheduleRunner:
    """Args: pool; job creation and backfills (what a run calls); ``runner``, this process's name
    in ``schedule_runs.runner``."""

    def __init__(
        self, pool: asyncpg.Pool, creation: JobCreation, backfills: Backfills, *, runner: str
    ) -> None:
        self._pool = pool
        self._creation = creation
        self._backfills = backfills
        self._runner = runner

    async def run_once(self) -> int:
        """One poll: due ticks recorded, lost runs failed, pending runs run. Returns the runs run."""
        now = await self._pool.fetchval("SELECT clock_timestamp()")
        await schedules.claim_due(self._pool, now)
        lost = await schedules.fail_lost(self._pool)
        if lost:
            log.warning("%d schedule runs lost their runner", lost)
        taken = await schedules.take_pending(self._pool, self._runner, KINDS, RUNS_A_POLL)
        await asyncio.gather(*(self._run(run, schedule) for run, schedule in taken))
        return len(taken)

    async def _run(self, run: Run, schedule: Schedule) -> None:
        caller = Caller(account_id=schedule.account_id, pool_id="")
        outcome: dict[str, Any] | None = None
        error: tuple[str, str] | None = None
        try:
            if schedule.kind == "process":
                outcome, error = await self._process(run, schedule, caller)
            else:
                made = await self._backfills.create(caller, backfill_request(schedule.spec))
                assert isinstance(made, BackfillRun)  # not a dry run
                outcome = {"backfill_run_id": made.run_id, "items": made.progress.matched}
        except DomainError as exc:
            error = (exc.error_code, exc.public_message)
        except Exception:
            log.exception("schedule run %s of %s failed", run.run_id, schedule.name)
            error = ("INTERNAL", "the run failed inside the gateway; see its log")
        await schedules.finish(self._pool, run.run_id, outcome, error)
        metrics.SCHEDULE_RUNS.labels(schedule.kind, "failed" if error else "succeeded").inc()

    async def _process(
        self, run: Run, schedule: Schedule, caller: Caller
    ) -> tuple[dict[str, Any], tuple[str, str] | None]:
        """One request per object; ``({"job_ids", "errors"}, None)``, or the first error when no
        job was made."""
        spec = schedule.spec
        operations = parse_operations(spec["operations"])
        job_ids: list[str] = []
        errors: list[dict[str, str]] = []
        for n, object_id in enumerate(spec["object_ids"]):
            try:
                result = await self._creation.process(
                    caller,
                    object_id,
                    operations,
                    spec.get("priority"),
                    None,
                    f"schedule:{run.run_id}:{n}",
                    scheduled=True,
                )
            except DomainError as exc:
                errors.append(
                    {"object_id": object_id, "error_code": exc.error_code, "error": exc.public_message}
                )
                continue
            job_ids.extend(result.job_ids)
        outcome = {"job_ids": job_ids, "errors": errors}
        if not job_ids and errors:
            return outcome, (errors[0]["error_code"], errors[0]["error"])
        return outcome, None
