"""The caller's transitions, made by the gateway: jobs created ``queued`` (or ``scheduled``, when
delayed) and cancellation asked for."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from hypermedia.infra import db
from hypermedia.jobs.lifecycle.rules import enqueue_outbox


@dataclass(frozen=True)
class NewJob:
    """A job to create (the gateway's, after its params, profile and price were decided)."""

    job_id: str
    account_id: str
    object_id: str
    request_id: str
    operation: str
    profile_version: int
    queue: str
    params: dict[str, Any]
    priority: int
    max_attempts: int
    estimated_credits: int
    """Millicredits held for it."""
    webhook_url: str | None
    idempotency_key: str | None
    preset: tuple[str, int] | None = None
    """The name and version of the account's preset it was made from, if any."""
    not_before: datetime | None = None
    """When a delayed job becomes due (ADR 0071): it is created ``scheduled``, without an outbox
    row, and :func:`~hypermedia.jobs.lifecycle.recovery.promote_scheduled` queues it then. None:
    queued at once."""


async def create_queued(conn: db.Connection, prefix: str, jobs: Iterable[NewJob]) -> None:
    """Creates ``jobs`` as ``queued`` and writes their outbox rows, in the caller's transaction
    (the one that also records the request and the jobs' secrets, after their credits were held).
    A job with a ``not_before`` is created ``scheduled`` instead, without an outbox row (the
    caller decided it is in the future)."""
    for job in jobs:
        delayed = job.not_before is not None
        await conn.execute(
            """
            INSERT INTO processing_jobs (job_id, account_id, object_id, request_id, operation,
                profile_version, queue, params, priority, status, max_attempts, estimated_credits,
                webhook_url, idempotency_key, preset_name, preset_version, not_before, queued_at)
            VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9,
                    CASE WHEN $16::timestamptz IS NULL THEN 'queued' ELSE 'scheduled' END,
                    $10, $11, $12, $13, $14, $15, $16,
                    CASE WHEN $16::timestamptz IS NULL THEN now() END)
            """,
            job.job_id,
            job.account_id,
            job.object_id,
            job.request_id,
            job.operation,
            job.profile_version,
            job.queue,
            job.params,
            job.priority,
            job.max_attempts,
            job.estimated_credits,
            job.webhook_url,
            job.idempotency_key,
            job.preset[0] if job.preset else None,
            job.preset[1] if job.preset else None,
            job.not_before,
        )
        if not delayed:
            await enqueue_outbox(conn, prefix, job.job_id, job.queue, job.priority)


async def request_cancel(pool: asyncpg.Pool, job_id: str, account_id: str) -> str | None:
    """A caller's cancellation: ``created``/``scheduled``/``queued``/``retry_wait`` → ``cancelled``
    at once (never executed; the caller settles its credits), ``claimed``/``processing`` →
    ``cancel_requested`` (its worker stops it and settles); its children, if it fanned out, with it
    (migration 0037's trigger). Returns the new status, or None when the account has no such job
    in a cancellable status (:func:`job_status` tells which)."""
    status = await pool.fetchval(
        """
        UPDATE processing_jobs SET
            status = CASE WHEN status IN ('created', 'scheduled', 'queued', 'retry_wait') THEN 'cancelled'
                          ELSE 'cancel_requested' END,
            completed_at = CASE WHEN status IN ('created', 'scheduled', 'queued', 'retry_wait') THEN now() END,
            updated_at = now()
        WHERE job_id = $1 AND account_id = $2
          AND status IN ('created', 'scheduled', 'queued', 'retry_wait', 'claimed', 'processing')
        RETURNING status
        """,
        job_id,
        account_id,
    )
    return None if status is None else str(status)


async def cancel_if_waiting(pool: asyncpg.Pool, job_id: str, account_id: str) -> bool:
    """Cancels the account's job only if it has not started (``created``/``scheduled``/``queued``/
    ``retry_wait`` → ``cancelled``; the caller settles its credits); a job a worker holds is left
    to finish. Returns whether it was cancelled (a backfill run's cancellation)."""
    status = await pool.fetchval(
        """
        UPDATE processing_jobs SET status = 'cancelled', completed_at = now(), updated_at = now()
        WHERE job_id = $1 AND account_id = $2 AND status IN ('created', 'scheduled', 'queued', 'retry_wait')
        RETURNING status
        """,
        job_id,
        account_id,
    )
    return status is not None


async def job_status(pool: asyncpg.Pool, job_id: str, account_id: str) -> str | None:
    """The status of the account's job, or None when it has no job ``job_id``."""
    status = await pool.fetchval(
        "SELECT status FROM processing_jobs WHERE job_id = $1 AND account_id = $2", job_id, account_id
    )
    return None if status is None else str(status)
