"""Cancellation (``POST /v1/jobs/{id}:cancel``, gRPC ``CancelJob``): the request through
:func:`lifecycle.request_cancel`, the hold of a job that never ran released at once."""

from __future__ import annotations

import asyncpg

from hypermedia.core.errors import Conflict, NotFound
from hypermedia.jobs import lifecycle
from hypermedia.jobs.accounts import Caller
from hypermedia.jobs.settlement import Settlement
from services.gateway.ids import parse_uuid
from services.gateway.results import Job
from services.gateway.status import JobStatus


class JobCancellation:
    """The cancel use case. Dependencies come in through the constructor.

    Args:
        pool: the system of record (read and written through :mod:`lifecycle`).
        settlement: releases the hold of a job cancelled before it ran.
        status: reads the job back for the answer.
    """

    def __init__(self, pool: asyncpg.Pool, settlement: Settlement, status: JobStatus) -> None:
        self._pool = pool
        self._settlement = settlement
        self._status = status

    async def cancel_job(self, caller: Caller, job_id: str) -> Job:
        """Cancel: ``scheduled``/``queued``/``retry_wait`` → ``cancelled`` at once (hold released, never executed);
        ``claimed``/``processing`` → ``cancel_requested`` (the worker stops it). Returns the job
        after it. Raises NotFound, or Conflict (JOB_NOT_CANCELLABLE) for a job that already ended."""
        job_id = parse_uuid(job_id, "job")
        status = await lifecycle.request_cancel(self._pool, job_id, caller.account_id)
        if status is None:
            current = await lifecycle.job_status(self._pool, job_id, caller.account_id)
            if current is None:
                raise NotFound("job not found", "NOT_FOUND")
            if current != "cancel_requested":
                raise Conflict(f"the job is already {current}", "JOB_NOT_CANCELLABLE")
        if status == "cancelled":
            await self._settlement.settle(job_id, "cancelled")
        return await self._status.get_job(caller, job_id)
