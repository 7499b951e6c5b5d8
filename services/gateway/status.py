"""Job status (``GET /v1/jobs/{id}``, ``GET /v1/jobs/{id}/events``; gRPC ``GetJob``,
``WatchJob``): a job of the caller with its attempts and outputs, and its events as they happen."""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg

from hypermedia.api.storage.v1 import storage_pb2, storage_pb2_grpc
from hypermedia.core.errors import NotFound
from hypermedia.infra.rpc import call
from hypermedia.jobs.accounts import Caller
from hypermedia.jobs.events import JobEvent, JobEventHub
from services.gateway.ids import parse_uuid
from services.gateway.results import Attempt, Job, Output


def job_result(job: asyncpg.Record, attempts: list[asyncpg.Record], outputs: list[Output]) -> Job:
    """A :class:`Job` of its ``processing_jobs`` row, its ``job_attempts`` rows (by number) and
    its outputs: ids as strings, amounts and times as Postgres gave them."""
    return Job(
        job_id=str(job["job_id"]),
        object_id=str(job["object_id"]),
        operation=job["operation"],
        profile_version=job["profile_version"],
        queue=job["queue"],
        params=job["params"],
        preset=(job["preset_name"], job["preset_version"]) if job["preset_name"] else None,
        status=job["status"],
        priority=job["priority"],
        attempt_count=job["attempt_count"],
        max_attempts=job["max_attempts"],
        lost_attempts=job["lost_attempts"],
        error_code=job["error_code"],
        error_message=job["error_message"],
        estimated_millicredits=job["estimated_credits"],
        actual_millicredits=job["actual_credits"],
        charge_lines=dict(job["charge_lines"] or {}),
        created_at=job["created_at"],
        queued_at=job["queued_at"],
        started_at=job["started_at"],
        completed_at=job["completed_at"],
        next_attempt_at=job["next_attempt_at"],
        attempts=tuple(
            Attempt(
                attempt_number=a["attempt_number"],
                worker_id=a["worker_id"],
                status=a["status"],
                error_code=a["error_code"],
                error_message=a["error_message"],
                started_at=a["started_at"],
                finished_at=a["finished_at"],
                duration_ms=a["duration_ms"],
                peak_memory_mb=a["peak_memory_mb"],
            )
            for a in attempts
        ),
        outputs=tuple(outputs),
    )


class JobStatus:
    """The job status use cases. Dependencies come in through the constructor.

    Args:
        pool: the system of record (``processing_jobs``, ``job_attempts``, ``job_outputs``).
        storage: the storage service (presigned GET URLs of outputs).
        events: the job events hub (:class:`hypermedia.jobs.events.JobEventHub`).
    """

    def __init__(
        self, pool: asyncpg.Pool, storage: storage_pb2_grpc.StorageServiceStub, events: JobEventHub
    ) -> None:
        self._pool = pool
        self._storage = storage
        self._events = events

    async def get_job(self, caller: Caller, job_id: str) -> Job:
        """A job of the caller with attempts and outputs (with presigned download URLs).
        Raises NotFound: a malformed id, an unknown job or another account's (alike)."""
        job_id = parse_uuid(job_id, "job")
        job = await self._pool.fetchrow(
            "SELECT * FROM processing_jobs WHERE job_id = $1 AND account_id = $2", job_id, caller.account_id
        )
        if job is None:
            raise NotFound("job not found", "NOT_FOUND")
        attempts = await self._pool.fetch(
            "SELECT * FROM job_attempts WHERE job_id = $1 ORDER BY attempt_number", job_id
        )
        rows = await self._pool.fetch(
            "SELECT * FROM job_outputs WHERE job_id = $1 ORDER BY output_type", job_id
        )
        return job_result(job, attempts, [await self._output(out) for out in rows])

    async def _output(self, out: asyncpg.Record) -> Output:
        """A ``job_outputs`` row with a presigned GET URL of its key."""
        url = await call(self._storage.PresignGet, storage_pb2.PresignGetRequest(key=out["key"]))
        return Output(
            output_type=out["output_type"],
            object_id=str(out["object_id"]),
            key=out["key"],
            mime_type=out["mime_type"],
            size_bytes=out["size_bytes"],
            metadata=out["metadata"],
            url=url.url,
        )

    async def watch_job(
        self, caller: Caller, job_id: str, after_event_id: int = 0
    ) -> AsyncIterator[JobEvent | None]:
        """The job's events as they happen (see :class:`hypermedia.jobs.events.JobEventHub`), ending after
        its terminal status; ``None`` marks a keep-alive. Raises NotFound before the first event."""
        job_id = parse_uuid(job_id, "job")
        owned = await self._pool.fetchval(
            "SELECT 1 FROM processing_jobs WHERE job_id = $1 AND account_id = $2", job_id, caller.account_id
        )
        if owned is None:
            raise NotFound("job not found", "NOT_FOUND")
        return self._events.watch(job_id, max(0, after_event_id))
