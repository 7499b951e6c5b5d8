"""How a worker settles the end of a job's attempt: a failed attempt recorded (the job's row and
the attempt's, :func:`hypermedia.jobs.lifecycle.fail`) and every end's credits queued for the
credits service (:class:`hypermedia.jobs.settlement.SettlementBatch`: the slot does not wait)."""

from __future__ import annotations

import logging

import asyncpg

from hypermedia.core.errors import DomainError
from hypermedia.infra import db
from hypermedia.jobs import charges, lifecycle
from hypermedia.jobs.settlement import SettlementBatch

log = logging.getLogger(__name__)


class Outcomes:
    """One worker's settling of its jobs' ends.

    Args:
        pool: the system of record. worker_id: the fence of every write with the attempt.
        prefix: the stream prefix (a retried job's outbox row). settlements: the worker's batch.
    """

    def __init__(self, pool: asyncpg.Pool, worker_id: str, prefix: str, settlements: SettlementBatch) -> None:
        self._pool = pool
        self._worker_id = worker_id
        self._prefix = prefix
        self._settlements = settlements

    async def failed(
        self,
        job: lifecycle.ClaimedJob,
        exc: DomainError,
        duration_ms: int,
        peak_memory_mb: int,
        input_fault: bool,
    ) -> None:
        """The one place a failed attempt is settled: job row, attempt row (retried across a
        Postgres restart; when Postgres stays away, the lease runs out and the reaper takes the
        job back, nothing lost), then credits: charged when it failed because of its input
        (:func:`charges.for_failure`), else released. Raises what is not a Postgres outage."""
        try:
            async for attempt in db.retrying():
                with attempt:
                    status = await lifecycle.fail(
                        self._pool,
                        job,
                        self._worker_id,
                        exc.error_code,
                        exc.public_message,
                        retryable=exc.retryable,
                        prefix=self._prefix,
                        duration_ms=duration_ms,
                        peak_memory_mb=peak_memory_mb,
                        input_fault=input_fault,
                    )
        except Exception as db_exc:
            if not db.is_transient(db_exc):
                raise
            log.error(
                "could not record the failed attempt (Postgres unreachable)", extra={"job_id": job.job_id}
            )
            return
        log.info("job attempt failed: %s → %s", exc.error_code, status, extra={"job_id": job.job_id})
        if status == "failed":
            async for attempt in db.retrying():
                with attempt:
                    charge = await lifecycle.failure_charge(self._pool, job.job_id)
            self.settle(job, "failed", charge)

    def settle(self, job: lifecycle.ClaimedJob, outcome: str, charge: charges.Charge | None) -> None:
        """Queues the settlement of ``job``, ended ``outcome``: ``charge`` committed, or released
        without one. A child job (:mod:`hypermedia.jobs.lifecycle.children`) holds no credits:
        its parent's charge covers its work, so nothing is queued for it."""
        if job.parent_job_id is not None:
            return
        charge = charge or charges.Charge(0)
        self._settlements.submit(job.job_id, outcome, actual_millicredits=charge.actual, lines=charge.lines)

    async def flush(self, seconds: float) -> bool:
        """Waits up to ``seconds`` for the queued settlements to be sent; False when some are
        still unsent (the reaper's sweep settles them)."""
        return await self._settlements.flush(seconds)
