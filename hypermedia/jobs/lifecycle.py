"""The job lifecycle in Postgres: every state transition of ``processing_jobs`` lives here.

States (the seed's): ``created → queued → claimed → processing → completed``, with ``retry_wait``,
``failed``, ``cancelled`` and ``cancel_requested``. Each function is one transition, written as a
conditional ``UPDATE … WHERE status = …`` so that racing processes cannot both win; every write a
worker makes about a job is fenced by ``(claimed_by, attempt_count)``, so a worker whose lease
expired cannot complete, fail or charge a job someone else now holds.

Whenever a job (re-)enters ``queued`` an outbox row is written in the same transaction; the relay
(:mod:`hypermedia.jobs.outbox`) publishes it. Postgres is the truth, JetStream the delivery.
"""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import asyncpg

from hypermedia.core import telemetry
from hypermedia.infra import db
from hypermedia.jobs import queues

LEASE_MARGIN_SECONDS = 60
"""Added to ``timeout_seconds × 1.5`` (the sandbox wall clock) to get the lease length."""
MAX_LOST_ATTEMPTS = 10
"""Attempts a job may lose to the infrastructure (its worker killed or stuck, handed back at a
drain) before it fails with ``WORKER_LOST``. Counted apart from ``max_attempts``, which bounds the
attempts that failed on the job's own account, so that a rollout or a crashing node does not use
up a job's retries (as Kubernetes' ``podFailurePolicy`` ignores disruptions); bounded all the same,
so a job that somehow takes its worker down with it is not retried forever. ADR 0014."""


@dataclass(frozen=True)
class ClaimedJob:
    """A job this worker holds. ``attempt`` is the fencing token (``attempt_count`` after claim)."""

    job_id: str
    account_id: str
    object_id: str
    operation: str
    profile_version: int
    queue: str
    params: dict[str, Any]
    priority: int
    attempt: int
    max_attempts: int
    estimated_credits: int
    timeout_seconds: int
    max_input_bytes: int
    max_pixels: int
    memory_limit_mb: int
    backoff_base_seconds: int
    escalation_per_page: int = 0
    """Millicredits per page an OCR job escalated (the profile's; 0 elsewhere)."""
    max_duration_seconds: int = 14_400
    """Longest audio or video a media job takes, in seconds (the profile's)."""


async def enqueue_outbox(conn: db.Connection, prefix: str, job_id: str, queue: str, priority: int) -> None:
    """Write the outbox row announcing that ``job_id`` is queued (call inside the job's transaction).
    The current trace context goes with it, so the worker's span continues the caller's trace."""
    await enqueue_outbox_many(conn, prefix, [(job_id, queue, priority)])


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


async def create_queued(conn: db.Connection, prefix: str, jobs: Iterable[NewJob]) -> None:
    """Creates ``jobs`` as ``queued`` and writes their outbox rows, in the caller's transaction
    (the one that also records the request and the jobs' secrets, after their credits were held)."""
    for job in jobs:
        await conn.execute(
            """
            INSERT INTO processing_jobs (job_id, account_id, object_id, request_id, operation,
                profile_version, queue, params, priority, status, max_attempts, estimated_credits,
                webhook_url, idempotency_key, queued_at)
            VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 'queued', $10, $11, $12, $13, now())
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
        )
        await enqueue_outbox(conn, prefix, job.job_id, job.queue, job.priority)


async def enqueue_outbox_many(
    conn: db.Connection, prefix: str, jobs: Iterable[tuple[object, str, int]]
) -> None:
    """:func:`enqueue_outbox` for several ``(job_id, queue, priority)`` in one round trip."""
    trace = telemetry.inject()
    await conn.executemany(
        "INSERT INTO outbox (subject, msg_id, payload) VALUES ($1, $2, $3)",
        [
            (
                queues.subject(prefix, queue, priority),
                f"{job_id}:{uuid.uuid4().hex[:16]}",
                {"job_id": str(job_id), "queue": queue, "priority": priority, "trace": trace},
            )
            for job_id, queue, priority in jobs
        ],
    )


async def claim(pool: asyncpg.Pool, job_id: str, worker_id: str) -> ClaimedJob | None:
    """The seed's atomic claim: ``UPDATE … WHERE job_id = $1 AND status = 'queued'``, then the
    ``job_attempts`` row and ``processing``, in one transaction. None when someone else has it (or
    it was cancelled, or the id is unknown)."""
    try:
        uuid.UUID(str(job_id))
    except ValueError:
        return None
    async with pool.acquire() as conn, conn.transaction():
        row = await conn.fetchrow(
            f"""
            UPDATE processing_jobs j SET
                status = 'claimed', claimed_by = $2, claimed_at = now(),
                visibility_timeout = now() + make_interval(secs => p.timeout_seconds * 1.5 + $3),
                attempt_count = j.attempt_count + 1, updated_at = now()
            FROM processing_profiles p
            WHERE j.job_id = $1 AND j.status = 'queued'
              AND p.operation = j.operation AND p.version = j.profile_version
            RETURNING {_CLAIMED_COLUMNS}
            """,
            job_id,
            worker_id,
            LEASE_MARGIN_SECONDS,
        )
        if row is None:
            return None
        await conn.execute(
            "INSERT INTO job_attempts (job_id, attempt_number, worker_id, status) VALUES ($1, $2, $3, 'processing')",
            job_id,
            row["attempt_count"],
            worker_id,
        )
        await conn.execute(
            "UPDATE processing_jobs SET status = 'processing', started_at = coalesce(started_at, now()), "
            "updated_at = now() WHERE job_id = $1",
            job_id,
        )
    return _claimed_job(row)


async def reclaim(pool: asyncpg.Pool, job_id: str, worker_id: str) -> ClaimedJob | None:
    """The job ``worker_id`` claimed in a call whose reply was lost (a retried :func:`claim` finds
    it no longer queued): the row :func:`claim` would have returned, or None when the job is not
    ``processing`` under this worker. Only for that retry: a worker must not adopt a job it is
    already running."""
    row = await pool.fetchrow(
        f"""
        SELECT {_CLAIMED_COLUMNS}
        FROM processing_jobs j
        JOIN processing_profiles p ON p.operation = j.operation AND p.version = j.profile_version
        WHERE j.job_id = $1 AND j.claimed_by = $2 AND j.status = 'processing'
        """,
        job_id,
        worker_id,
    )
    return None if row is None else _claimed_job(row)


_CLAIMED_COLUMNS = """j.job_id, j.account_id, j.object_id, j.operation, j.profile_version, j.queue,
    j.params, j.priority, j.attempt_count, j.max_attempts, j.estimated_credits, p.timeout_seconds,
    p.max_input_bytes, p.max_pixels, p.memory_limit_mb, p.backoff_base_seconds, p.escalation_per_page,
    p.max_duration_seconds"""
"""What :func:`claim` and :func:`reclaim` read (``j``: the job, ``p``: its profile) for :func:`_claimed_job`."""


def _claimed_job(row: asyncpg.Record) -> ClaimedJob:
    return ClaimedJob(
        job_id=str(row["job_id"]),
        account_id=str(row["account_id"]),
        object_id=str(row["object_id"]),
        operation=row["operation"],
        profile_version=row["profile_version"],
        queue=row["queue"],
        params=row["params"] or {},
        priority=row["priority"],
        attempt=row["attempt_count"],
        max_attempts=row["max_attempts"],
        estimated_credits=row["estimated_credits"],
        timeout_seconds=row["timeout_seconds"],
        max_input_bytes=row["max_input_bytes"],
        max_pixels=row["max_pixels"],
        memory_limit_mb=row["memory_limit_mb"],
        backoff_base_seconds=row["backoff_base_seconds"],
        escalation_per_page=row["escalation_per_page"],
        max_duration_seconds=row["max_duration_seconds"],
    )


@dataclass(frozen=True)
class Output:
    """A derived object registered for a job."""

    output_type: str
    object_id: str
    key: str
    mime_type: str
    size_bytes: int
    metadata: dict[str, Any]


async def complete(
    pool: asyncpg.Pool,
    job: ClaimedJob,
    worker_id: str,
    outputs: list[Output],
    actual_credits: int,
    duration_ms: int,
    peak_memory_mb: int,
    charge_lines: dict[str, int] | None = None,
) -> bool:
    """Record outputs (one row per (job, output type, profile version): ``uk_job_type_profile``) and
    mark the job completed, atomically, with its ``actual_credits`` (millicredits, the
    ``charge_lines`` included: ``{"ocr_escalation": 600}``, kept in the job row for the reaper's
    commit when the worker's fails). Only a job still ``processing`` completes: once its
    cancellation was requested it does not (the caller then deletes the outputs and cancels it).

    Returns True when the job is completed by this attempt — also when an earlier call of this same
    attempt committed and its reply was lost (so the call can be retried). False when nothing was
    written: the lease was lost, or cancellation was requested (:func:`fenced_status` tells which).
    """
    async with pool.acquire() as conn, conn.transaction():
        status = await conn.fetchval(
            """
            UPDATE processing_jobs SET status = 'completed', completed_at = now(), actual_credits = $4,
                   charge_lines = $5, visibility_timeout = NULL, error_code = NULL, error_message = NULL, updated_at = now()
            WHERE job_id = $1 AND claimed_by = $2 AND attempt_count = $3 AND status = 'processing'
            RETURNING status
            """,
            job.job_id,
            worker_id,
            job.attempt,
            actual_credits,
            charge_lines or {},
        )
        if status is None:
            return await _fenced_status(conn, job, worker_id) == "completed"
        await conn.executemany(
            """
            INSERT INTO job_outputs (job_id, output_type, profile_version, object_id, key, mime_type,
                                     size_bytes, metadata)
            VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
            ON CONFLICT ON CONSTRAINT uk_job_type_profile DO NOTHING
            """,
            [
                (
                    job.job_id,
                    o.output_type,
                    job.profile_version,
                    o.object_id,
                    o.key,
                    o.mime_type,
                    o.size_bytes,
                    o.metadata,
                )
                for o in outputs
            ],
        )
        await _finish_attempt(conn, job, "completed", None, None, duration_ms, peak_memory_mb)
    return True


async def fail(
    pool: asyncpg.Pool,
    job: ClaimedJob,
    worker_id: str,
    error_code: str,
    error_message: str,
    *,
    retryable: bool,
    prefix: str,
    duration_ms: int = 0,
    peak_memory_mb: int = 0,
) -> str | None:
    """Record a failed attempt. A retryable failure with attempts left goes to ``retry_wait`` with
    backoff ``backoff_base_seconds × 2^(n−1)`` (the seed's 1, 2, 4, 8 … minutes), ``n`` being the
    number of attempts that failed on the job's account (``attempt_count − lost_attempts``, this one
    included), and so does the ``max_attempts`` check; otherwise the job is ``failed``. A job whose
    cancellation was requested is never retried: it is ``failed`` (and the caller releases its hold). Returns the new status (also when an earlier call of this attempt
    committed and its reply was lost), or None when the lease was lost."""
    async with pool.acquire() as conn, conn.transaction():
        # SET expressions see the old row — the latest committed version, re-read after waiting for
        # a concurrent cancel's lock (so no CTE snapshot here) — so every CASE tests the status
        # before this update.
        status = await conn.fetchval(
            """
            UPDATE processing_jobs SET
                   status = CASE WHEN $4 AND status = 'processing' AND attempt_count - lost_attempts < max_attempts
                                 THEN 'retry_wait' ELSE 'failed' END,
                   error_code = $5, error_message = $6,
                   next_attempt_at = CASE WHEN $4 AND status = 'processing'
                                               AND attempt_count - lost_attempts < max_attempts
                                          THEN now() + make_interval(
                                                   secs => $7 * power(2, attempt_count - lost_attempts - 1))
                                     END,
                   completed_at = CASE WHEN $4 AND status = 'processing'
                                            AND attempt_count - lost_attempts < max_attempts
                                       THEN NULL ELSE now() END,
                   visibility_timeout = NULL, updated_at = now()
            WHERE job_id = $1 AND claimed_by = $2 AND attempt_count = $3
              AND status IN ('processing', 'cancel_requested')
            RETURNING status
            """,
            job.job_id,
            worker_id,
            job.attempt,
            retryable,
            error_code,
            error_message,
            float(job.backoff_base_seconds),
        )
        if status is None:
            # A retried call whose first try committed finds its own outcome; anything else means
            # the lease was lost.
            status = await _fenced_status(conn, job, worker_id)
            return str(status) if status in ("retry_wait", "failed") else None
        await _finish_attempt(conn, job, "failed", error_code, error_message, duration_ms, peak_memory_mb)
    return str(status)


async def mark_cancelled(pool: asyncpg.Pool, job: ClaimedJob, worker_id: str, duration_ms: int) -> bool:
    """A running job whose cancellation the worker carried out: ``cancel_requested → cancelled``.
    True when cancelled by this attempt (also on a retry after a lost reply)."""
    async with pool.acquire() as conn, conn.transaction():
        status = await conn.fetchval(
            """
            UPDATE processing_jobs SET status = 'cancelled', completed_at = now(), visibility_timeout = NULL,
                   updated_at = now()
            WHERE job_id = $1 AND claimed_by = $2 AND attempt_count = $3 AND status = 'cancel_requested'
            RETURNING status
            """,
            job.job_id,
            worker_id,
            job.attempt,
        )
        if status is None:
            return await _fenced_status(conn, job, worker_id) == "cancelled"
        await _finish_attempt(conn, job, "cancelled", "CANCELLED", "cancelled by the caller", duration_ms, 0)
    return True


_LOST_ATTEMPT = """
    status = CASE WHEN j.status = 'cancel_requested' THEN 'cancelled'
                  WHEN j.lost_attempts + 1 >= $%(max)d THEN 'failed' ELSE 'queued' END,
    error_code = CASE WHEN j.status <> 'cancel_requested' AND j.lost_attempts + 1 >= $%(max)d
                      THEN 'WORKER_LOST' ELSE j.error_code END,
    error_message = CASE WHEN j.status <> 'cancel_requested' AND j.lost_attempts + 1 >= $%(max)d
                         THEN 'the job lost its worker too many times' ELSE j.error_message END,
    completed_at = CASE WHEN j.status = 'cancel_requested' OR j.lost_attempts + 1 >= $%(max)d
                        THEN now() END,
    lost_attempts = j.lost_attempts + 1,
    claimed_by = NULL, visibility_timeout = NULL, queued_at = now(), updated_at = now()
"""
"""The one rule for a lost attempt (a drain's hand-back, an expired lease, a dead worker), as the
SET list of an ``UPDATE processing_jobs j``; ``$%(max)d`` is :data:`MAX_LOST_ATTEMPTS`. The job
goes back to ``queued``, or is ``failed`` with ``WORKER_LOST`` once it lost that many attempts, or
``cancelled`` when its cancellation was requested. ADR 0014."""


def _lost_attempt(max_param: int) -> str:
    return _LOST_ATTEMPT % {"max": max_param}


async def hand_back(pool: asyncpg.Pool, job: ClaimedJob, worker_id: str, prefix: str) -> bool:
    """Return a job this worker will not finish (drain deadline passed) to ``queued`` and publish it
    again. The attempt is recorded as ``lost``: it counts against :data:`MAX_LOST_ATTEMPTS`, not
    against ``max_attempts`` (the rule of :data:`_LOST_ATTEMPT`). False when the lease was lost or
    the job is no longer ``processing``."""
    async with pool.acquire() as conn, conn.transaction():
        row = await conn.fetchrow(
            f"""
            UPDATE processing_jobs j SET {_lost_attempt(4)}
            WHERE job_id = $1 AND claimed_by = $2 AND attempt_count = $3 AND status = 'processing'
            RETURNING status, queue, priority
            """,
            job.job_id,
            worker_id,
            job.attempt,
            MAX_LOST_ATTEMPTS,
        )
        if row is None:
            return False
        await _finish_attempt(conn, job, "lost", "WORKER_LOST", "handed back at shutdown", 0, 0)
        if row["status"] == "queued":
            await enqueue_outbox(conn, prefix, job.job_id, row["queue"], row["priority"])
    return True


async def expire_leases(pool: asyncpg.Pool, prefix: str, batch: int) -> list[tuple[str, str]]:
    """The reaper's lost attempts: up to ``batch`` jobs in ``claimed``/``processing``/
    ``cancel_requested`` whose ``visibility_timeout`` passed or whose worker is dead get the rule of
    :data:`_LOST_ATTEMPT`; their attempts are recorded ``lost`` and the requeued ones published
    again, in one transaction (``FOR UPDATE SKIP LOCKED``: replicas never take the same job).

    Returns ``[(job_id, new status)]``; the caller settles the credits of those that ended.
    """
    async with pool.acquire() as conn, conn.transaction():
        rows = await conn.fetch(
            f"""
            WITH expired AS (
                SELECT job_id FROM processing_jobs
                WHERE status IN ('claimed', 'processing', 'cancel_requested')
                  AND (visibility_timeout < now()
                       OR claimed_by IN (SELECT worker_id FROM workers WHERE status = 'dead'))
                ORDER BY visibility_timeout LIMIT $1 FOR UPDATE SKIP LOCKED
            )
            UPDATE processing_jobs j SET {_lost_attempt(2)}
            FROM expired WHERE j.job_id = expired.job_id
            RETURNING j.job_id, j.status, j.queue, j.priority, j.attempt_count
            """,
            batch,
            MAX_LOST_ATTEMPTS,
        )
        await conn.executemany(
            """
            UPDATE job_attempts SET status = 'lost', error_code = 'WORKER_LOST',
                   error_message = 'worker lost: lease expired or worker dead', finished_at = now()
            WHERE job_id = $1 AND attempt_number = $2 AND status = 'processing'
            """,
            [(r["job_id"], r["attempt_count"]) for r in rows],
        )
        await enqueue_outbox_many(
            conn, prefix, [(r["job_id"], r["queue"], r["priority"]) for r in rows if r["status"] == "queued"]
        )
    return [(str(r["job_id"]), str(r["status"])) for r in rows]


async def promote_retries(pool: asyncpg.Pool, prefix: str, batch: int) -> int:
    """``retry_wait → queued`` for up to ``batch`` jobs whose ``next_attempt_at`` passed, published
    again in the same transaction. Returns how many."""
    async with pool.acquire() as conn, conn.transaction():
        rows = await conn.fetch(
            """
            WITH due AS (
                SELECT job_id FROM processing_jobs
                WHERE status = 'retry_wait' AND next_attempt_at <= now()
                ORDER BY next_attempt_at LIMIT $1 FOR UPDATE SKIP LOCKED
            )
            UPDATE processing_jobs j SET status = 'queued', claimed_by = NULL, queued_at = now(),
                   updated_at = now()
            FROM due WHERE j.job_id = due.job_id
            RETURNING j.job_id, j.queue, j.priority
            """,
            batch,
        )
        await enqueue_outbox_many(conn, prefix, [(r["job_id"], r["queue"], r["priority"]) for r in rows])
    return len(rows)


async def republish_stale(pool: asyncpg.Pool, prefix: str, batch: int, stale_seconds: float) -> int:
    """Publishes again up to ``batch`` jobs ``queued`` for more than ``stale_seconds`` (a message
    the broker lost never strands a job: claims are idempotent, duplicates dropped). Returns how many."""
    async with pool.acquire() as conn, conn.transaction():
        rows = await conn.fetch(
            """
            WITH stale AS (
                SELECT job_id FROM processing_jobs
                WHERE status = 'queued' AND queued_at < now() - make_interval(secs => $2)
                ORDER BY queued_at LIMIT $1 FOR UPDATE SKIP LOCKED
            )
            UPDATE processing_jobs j SET queued_at = now(), updated_at = now()
            FROM stale WHERE j.job_id = stale.job_id
            RETURNING j.job_id, j.queue, j.priority
            """,
            batch,
            stale_seconds,
        )
        await enqueue_outbox_many(conn, prefix, [(r["job_id"], r["queue"], r["priority"]) for r in rows])
    return len(rows)


async def request_cancel(pool: asyncpg.Pool, job_id: str, account_id: str) -> str | None:
    """A caller's cancellation: ``created``/``queued``/``retry_wait`` → ``cancelled`` at once (never
    executed; the caller settles its credits), ``claimed``/``processing`` → ``cancel_requested`` (its
    worker stops it and settles). Returns the new status, or None when the account has no such job
    in a cancellable status (:func:`job_status` tells which)."""
    status = await pool.fetchval(
        """
        UPDATE processing_jobs SET
            status = CASE WHEN status IN ('created', 'queued', 'retry_wait') THEN 'cancelled'
                          ELSE 'cancel_requested' END,
            completed_at = CASE WHEN status IN ('created', 'queued', 'retry_wait') THEN now() END,
            updated_at = now()
        WHERE job_id = $1 AND account_id = $2
          AND status IN ('created', 'queued', 'retry_wait', 'claimed', 'processing')
        RETURNING status
        """,
        job_id,
        account_id,
    )
    return None if status is None else str(status)


async def job_status(pool: asyncpg.Pool, job_id: str, account_id: str) -> str | None:
    """The status of the account's job, or None when it has no job ``job_id``."""
    status = await pool.fetchval(
        "SELECT status FROM processing_jobs WHERE job_id = $1 AND account_id = $2", job_id, account_id
    )
    return None if status is None else str(status)


async def settleable(
    pool: asyncpg.Pool, holds: list[tuple[str, datetime.datetime]], grace_seconds: float
) -> dict[str, tuple[str, int, dict[str, int]]]:
    """Of the jobs whose holds are still held (``[(job_id, hold created_at)]``), the ones to settle
    now: ``{job_id: (outcome, actual millicredits, charge lines)}`` for each job that ended more
    than ``grace_seconds`` ago (its status), and for each job never created whose hold is older
    than the grace (:data:`hypermedia.jobs.settlement.UNCREATED`, 0, ``{}``). Jobs still running,
    or ended within the grace (their own path is settling them), are left out."""
    if not holds:
        return {}
    rows = await pool.fetch(
        """
        SELECT h.job_id, j.status, j.actual_credits, j.charge_lines,
               CASE WHEN j.job_id IS NULL THEN h.created_at < now() - make_interval(secs => $3)
                    ELSE j.status IN ('completed', 'failed', 'cancelled')
                         AND j.updated_at < now() - make_interval(secs => $3) END AS due
        FROM unnest($1::uuid[], $2::timestamptz[]) AS h (job_id, created_at)
        LEFT JOIN processing_jobs j ON j.job_id = h.job_id
        """,
        [job_id for job_id, _ in holds],
        [created for _, created in holds],
        grace_seconds,
    )
    return {
        str(r["job_id"]): (
            str(r["status"]) if r["status"] is not None else "uncreated",
            int(r["actual_credits"] or 0),
            dict(r["charge_lines"] or {}),
        )
        for r in rows
        if r["due"]
    }


async def progress(pool: asyncpg.Pool, job: ClaimedJob, worker_id: str, fraction: float, stage: str) -> bool:
    """Record a progress event (``fraction`` 0..1, kept to 4 decimals; a short ``stage`` name) for watchers of the job;
    fenced like every worker write. False when the lease was lost."""
    result = await pool.execute(
        """
        INSERT INTO job_events (job_id, kind, status, progress, detail)
        SELECT job_id, 'progress', status, $4, jsonb_build_object('stage', $5::text) FROM processing_jobs
        WHERE job_id = $1 AND claimed_by = $2 AND attempt_count = $3 AND status = 'processing'
        """,
        job.job_id,
        worker_id,
        job.attempt,
        round(min(1.0, max(0.0, fraction)), 4),
        stage,
    )
    return result.endswith(" 1")


async def extend_leases(pool: asyncpg.Pool, worker_id: str, job_ids: list[str]) -> list[str]:
    """Heartbeat: push the visibility timeout of this worker's running jobs forward. Returns the ids
    whose cancellation was requested."""
    if not job_ids:
        return []
    rows = await pool.fetch(
        """
        UPDATE processing_jobs j SET
            visibility_timeout = now() + make_interval(secs => p.timeout_seconds * 1.5 + $3)
        FROM processing_profiles p
        WHERE j.job_id = ANY($1::uuid[]) AND j.claimed_by = $2
          AND j.status IN ('processing', 'cancel_requested')
          AND p.operation = j.operation AND p.version = j.profile_version
        RETURNING j.job_id, j.status
        """,
        job_ids,
        worker_id,
        LEASE_MARGIN_SECONDS,
    )
    return [str(r["job_id"]) for r in rows if r["status"] == "cancel_requested"]


async def cancel_requested(pool: asyncpg.Pool, job_ids: list[str]) -> list[str]:
    """The ids among ``job_ids`` whose cancellation was requested (the worker polls this)."""
    if not job_ids:
        return []
    rows = await pool.fetch(
        "SELECT job_id FROM processing_jobs WHERE job_id = ANY($1::uuid[]) AND status = 'cancel_requested'",
        job_ids,
    )
    return [str(r["job_id"]) for r in rows]


async def fenced_status(pool: asyncpg.Pool, job: ClaimedJob, worker_id: str) -> str | None:
    """The job's status while this worker's attempt still holds it (``claimed_by`` and
    ``attempt_count`` match), else None (the lease was lost)."""
    async with pool.acquire() as conn:
        return await _fenced_status(conn, job, worker_id)


async def _fenced_status(conn: db.Connection, job: ClaimedJob, worker_id: str) -> str | None:
    status = await conn.fetchval(
        "SELECT status FROM processing_jobs WHERE job_id = $1 AND claimed_by = $2 AND attempt_count = $3",
        job.job_id,
        worker_id,
        job.attempt,
    )
    return None if status is None else str(status)


async def _finish_attempt(
    conn: db.Connection,
    job: ClaimedJob,
    status: str,
    error_code: str | None,
    error_message: str | None,
    duration_ms: int,
    peak_memory_mb: int,
) -> None:
    await conn.execute(
        """
        UPDATE job_attempts SET status = $3, error_code = $4, error_message = $5, finished_at = now(),
               duration_ms = $6, peak_memory_mb = $7
        WHERE job_id = $1 AND attempt_number = $2
        """,
        job.job_id,
        job.attempt,
        status,
        error_code,
        error_message,
        duration_ms,
        peak_memory_mb,
    )
