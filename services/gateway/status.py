"""Job status (``GET /v1/jobs/{id}``, ``GET /v1/jobs``, ``GET /v1/jobs/{id}/events``; gRPC
``GetJob``, ``ListJobs``, ``WatchJob``): a job of the caller with its attempts and outputs, the
caller's jobs a page at a time, and a job's events as they happen."""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass

import asyncpg

from hypermedia.api.storage.v1 import storage_pb2, storage_pb2_grpc
from hypermedia.core.errors import Conflict, InvalidArgument, NotFound
from hypermedia.infra.rpc import call
from hypermedia.jobs.accounts import Caller
from hypermedia.jobs.events import JobEvent, JobEventHub
from services.gateway.ids import canonical_uuid, parse_uuid
from services.gateway.results import Attempt, Job, Output, OutputLink


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
        not_before=job["not_before"],
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


JOB_STATUSES = (
    "created",
    "scheduled",
    "queued",
    "claimed",
    "processing",
    "completed",
    "retry_wait",
    "failed",
    "cancelled",
    "cancel_requested",
)
"""Every status of a job (the seed's lifecycle; ``processing_jobs.status``)."""
MAX_PAGE_SIZE = 1000
INVALID_CURSOR_MESSAGE = (
    "cursor is not one this API gave: pass next_cursor (gRPC: next_page_token) of the previous page unchanged"
)
"""The refusal of a cursor a listing did not give (jobs, the ledger)."""


@dataclass(frozen=True)
class JobFilter:
    """Which of the caller's jobs :meth:`JobStatus.list_jobs` lists: any of ``statuses`` (empty:
    all), of ``operation``, on ``object_id`` (an original or an output), created at or after
    ``created_after`` and before ``created_before`` (timezone-aware; naive ones are UTC)."""

    statuses: tuple[str, ...] = ()
    operation: str | None = None
    object_id: str | None = None
    created_after: dt.datetime | None = None
    created_before: dt.datetime | None = None


@dataclass(frozen=True)
class JobPage:
    """A page of jobs, newest first, and the cursor of the next page (None on the last)."""

    jobs: tuple[Job, ...]
    next_cursor: str | None


def page_cursor(created_at: dt.datetime, item_id: str) -> str:
    """The opaque cursor after an item of a newest-first page (a job, an object): its creation
    time and id, base64url JSON."""
    position = {"t": created_at.isoformat(), "j": item_id}
    return base64.urlsafe_b64encode(json.dumps(position).encode()).decode().rstrip("=")


def page_position(cursor: str) -> tuple[dt.datetime, str]:
    """The (created_at, id) a :func:`page_cursor` names. Raises InvalidArgument
    (``INVALID_CURSOR``) for anything else."""
    try:
        raw = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        when = dt.datetime.fromisoformat(raw["t"])
        job_id = canonical_uuid(raw["j"])
        if when.tzinfo is None or job_id is None:
            raise ValueError
        return when.astimezone(dt.UTC), job_id  # OverflowError: outside years 1-9999 in UTC
    except (
        ValueError,
        TypeError,
        KeyError,
        binascii.Error,
        UnicodeDecodeError,
        RecursionError,
        OverflowError,
    ):
        raise InvalidArgument(INVALID_CURSOR_MESSAGE, "INVALID_CURSOR") from None


def _utc(when: dt.datetime | None, name: str) -> dt.datetime | None:
    """``when`` in UTC (a naive one taken as UTC). Raises InvalidArgument (``INVALID_RANGE``)
    for a time whose offset takes it outside the years 1-9999 (``0001-01-01T00:00:00+14:00``)."""
    if when is None:
        return None
    try:
        return (when if when.tzinfo is not None else when.replace(tzinfo=dt.UTC)).astimezone(dt.UTC)
    except OverflowError:
        raise InvalidArgument(f"{name} is outside the years 1 to 9999 in UTC", "INVALID_RANGE") from None


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
        """A job of the caller with attempts and outputs (with presigned download URLs; outputs
        deleted with their original are left out). Raises NotFound: a malformed id, an unknown job or another account's (alike)."""
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
            "SELECT j.* FROM job_outputs j JOIN objects o USING (object_id)"
            " WHERE j.job_id = $1 AND o.state = 'available' ORDER BY j.output_type",
            job_id,
        )
        return job_result(job, attempts, [await self._output(out) for out in rows])

    async def list_jobs(
        self, caller: Caller, filters: JobFilter, limit: int = 50, cursor: str | None = None
    ) -> JobPage:
        """The caller's jobs matching ``filters``, newest first (by ``created_at``, then job id),
        ``limit`` (1 to :data:`MAX_PAGE_SIZE`) a page, after ``cursor`` (``next_cursor`` of the
        previous page). Each job without its attempts and outputs (``get_job`` has them).

        Raises:
            InvalidArgument: ``INVALID_STATUS`` (a status not in :data:`JOB_STATUSES`; the message
                lists them), ``UNKNOWN_OPERATION`` (the message lists the operations),
                ``INVALID_ID`` (an object id that is not a UUID), ``INVALID_RANGE``
                (``created_after`` not before ``created_before``), ``INVALID_CURSOR``,
                ``INVALID_PAGE_SIZE``.
        """
        if not 1 <= limit <= MAX_PAGE_SIZE:
            raise InvalidArgument(f"page size must be 1 to {MAX_PAGE_SIZE}", "INVALID_PAGE_SIZE")
        wrong = [s for s in filters.statuses if s not in JOB_STATUSES]
        if wrong:
            raise InvalidArgument(
                f"unknown status {wrong[0]!r}: one of {', '.join(JOB_STATUSES)}", "INVALID_STATUS"
            )
        object_id = None
        if filters.object_id is not None:
            object_id = canonical_uuid(filters.object_id)
            if object_id is None:
                raise InvalidArgument(f"object_id {filters.object_id!r} is not a UUID", "INVALID_ID")
        after = _utc(filters.created_after, "created_after")
        before = _utc(filters.created_before, "created_before")
        if after is not None and before is not None and after >= before:
            raise InvalidArgument("created_after must be before created_before", "INVALID_RANGE")
        if filters.operation is not None:
            operations = await self._pool.fetchval(
                "SELECT array_agg(DISTINCT operation ORDER BY operation) FROM processing_profiles"
            )
            if filters.operation not in operations:
                raise InvalidArgument(
                    f"unknown operation {filters.operation!r}: one of {', '.join(operations)}",
                    "UNKNOWN_OPERATION",
                )
        at, last = page_position(cursor) if cursor else (None, None)
        rows = await self._pool.fetch(
            """
            SELECT * FROM processing_jobs
            WHERE account_id = $1 AND parent_job_id IS NULL  -- a job's children are its own
              AND (cardinality($2::text[]) = 0 OR status = ANY($2::text[]))
              AND ($3::text IS NULL OR operation = $3)
              AND ($4::uuid IS NULL OR object_id = $4)
              AND ($5::timestamptz IS NULL OR created_at >= $5)
              AND ($6::timestamptz IS NULL OR created_at < $6)
              AND ($7::timestamptz IS NULL OR (created_at, job_id) < ($7, $8::uuid))
            ORDER BY created_at DESC, job_id DESC
            LIMIT $9
            """,
            caller.account_id,
            list(filters.statuses),
            filters.operation,
            object_id,
            after,
            before,
            at,
            last,
            limit + 1,
        )
        jobs = tuple(job_result(row, [], []) for row in rows[:limit])
        return JobPage(jobs, page_cursor(jobs[-1].created_at, jobs[-1].job_id) if len(rows) > limit else None)

    async def output_link(self, caller: Caller, job_id: str, output_type: str) -> OutputLink:
        """A fresh presigned URL of the output ``output_type`` of the caller's job: what the stable
        link ``/v1/jobs/{id}/outputs/{type}`` redirects to, so a link kept for days keeps working
        while each URL it gives lives 15 minutes.

        Raises:
            NotFound: ``NOT_FOUND`` (a malformed id, an unknown job or another account's, alike);
                ``OUTPUT_NOT_FOUND`` (the job has no such output: the message lists those it has);
                ``OUTPUT_DELETED`` (its original was deleted, and the outputs with it).
            Conflict: ``JOB_NOT_COMPLETED`` (the job has no outputs yet; the message says its status).
            TransientError: storage unreachable.
        """
        job_id = parse_uuid(job_id, "job")
        status = await self._pool.fetchval(
            "SELECT status FROM processing_jobs WHERE job_id = $1 AND account_id = $2",
            job_id,
            caller.account_id,
        )
        if status is None:
            raise NotFound("job not found", "NOT_FOUND")
        rows = await self._pool.fetch(
            "SELECT j.*, o.state FROM job_outputs j JOIN objects o USING (object_id) WHERE j.job_id = $1"
            " ORDER BY j.output_type",
            job_id,
        )
        out = next((r for r in rows if r["output_type"] == output_type), None)
        if out is None and status != "completed":
            raise Conflict(f"the job has no outputs: it is {status}", "JOB_NOT_COMPLETED")
        if out is None:
            names = ", ".join(r["output_type"] for r in rows) or "none"
            raise NotFound(
                f"the job has no output {output_type[:64]!r}; its outputs: {names}", "OUTPUT_NOT_FOUND"
            )
        if out["state"] != "available":
            raise NotFound("the output was deleted with its original", "OUTPUT_DELETED")
        signed = await call(self._storage.PresignGet, storage_pb2.PresignGetRequest(key=out["key"]))
        return OutputLink(
            output_type=out["output_type"],
            object_id=str(out["object_id"]),
            mime_type=out["mime_type"],
            size_bytes=out["size_bytes"],
            url=signed.url,
            url_expires_at=signed.expires_at.ToDatetime(dt.UTC),
        )

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
