"""A worker's transitions of the jobs it holds: claim, complete, fail, cancel, hand back, progress,
leases. Every write is fenced by ``(claimed_by, attempt_count)`` (see :mod:`hypermedia.jobs.lifecycle`)."""

from __future__ import annotations

import uuid
from collections.abc import Container
from dataclasses import dataclass
from typing import Any

import asyncpg

from hypermedia.core import metrics
from hypermedia.infra import db
from hypermedia.jobs import charges
from hypermedia.jobs.lifecycle import caps
from hypermedia.jobs.lifecycle.rules import (
    LEASE_MARGIN_SECONDS,
    MAX_LOST_ATTEMPTS,
    enqueue_outbox,
    lost_attempt_sql,
    release_deferred,
)


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
    base_cost: int = 0
    """The profile's price of any job of it, millicredits (:mod:`hypermedia.jobs.charges`)."""
    work_unit: str | None = None
    """What the profile charges by when the job completes (``page``, ``media_second``), or None: by size."""
    per_unit: int = 0
    """Millicredits per :attr:`work_unit`."""
    parent_job_id: str | None = None
    """The job this one is a chunk of (:mod:`~hypermedia.jobs.lifecycle.children`), or None."""
    chunk_index: int | None = None
    """A child's chunk of its parent's plan (0-based); None for any other job."""
    fanned_out: bool = False
    """Whether the job has created its children (it fans out once, whatever its attempts)."""


def job_key(job_id: str) -> str | None:
    """``job_id`` as Postgres spells a job id (the canonical UUID text :attr:`ClaimedJob.job_id`
    has), or None when it is not a UUID."""
    try:
        return str(uuid.UUID(str(job_id)))
    except ValueError:
        return None


async def claim(pool: asyncpg.Pool, job_id: str, worker_id: str) -> ClaimedJob | None:
    """The seed's atomic claim of one job (:func:`claim_many` of ``[job_id]``). None when someone
    else has it (or it was cancelled, or the id is unknown)."""
    claimed = await claim_many(pool, [job_id], worker_id)
    return claimed[0] if claimed else None


async def claim_many(pool: asyncpg.Pool, job_ids: list[str], worker_id: str) -> list[ClaimedJob]:
    """The seed's atomic claim for several jobs in one transaction: ``UPDATE … WHERE job_id =
    ANY($1) AND status = 'queued'``, then a ``job_attempts`` row each and ``processing``. Each job
    is claimed exactly as alone: its own lease (``timeout_seconds × 1.5`` + margin) and attempt
    count (the fencing token); a job that is not ``queued`` (someone else has it, cancelled,
    finished, unknown id, not a UUID) is left out, and so is one its account's running-jobs cap
    holds back (:func:`claim_held` says which). Returns the claimed jobs in the order of
    ``job_ids`` (a repeated id is claimed once). The rows are locked in job id order, so batches
    claiming overlapping jobs wait for each other, never deadlock."""
    claimed, _held = await claim_held(pool, job_ids, worker_id)
    return claimed


async def claim_held(
    pool: asyncpg.Pool, job_ids: list[str], worker_id: str
) -> tuple[list[ClaimedJob], set[str]]:
    """:func:`claim_many`, with the ids (canonical UUID text) of the queued jobs it held: left
    queued, beyond the room their account's cap of running jobs leaves in their queue
    (:mod:`~hypermedia.jobs.lifecycle.caps`); their messages must come back later, not be dropped."""
    valid = [key for key in map(job_key, job_ids) if key is not None]
    if not valid:
        return [], set()
    async with pool.acquire() as conn, conn.transaction():
        room = await caps.over_cap(conn, valid, await caps.lock_capped(conn, valid))
        rows = await conn.fetch(
            f"""
            WITH locked AS (  -- in job id order: two batches never wait on each other in a cycle
                SELECT job_id FROM processing_jobs
                WHERE job_id = ANY($1::uuid[]) AND status = 'queued'
                ORDER BY job_id FOR UPDATE
            )
            UPDATE processing_jobs j SET
                status = 'claimed', claimed_by = $2, claimed_at = now(),
                visibility_timeout = now() + make_interval(secs => p.timeout_seconds * 1.5 + $3),
                attempt_count = j.attempt_count + 1, updated_at = now()
            FROM locked, processing_profiles p
            WHERE j.job_id = locked.job_id AND j.status = 'queued'
              AND p.operation = j.operation AND p.version = j.profile_version
            RETURNING {_CLAIMED_COLUMNS}
            """,
            [key for key in valid if key not in room.barred],
            worker_id,
            LEASE_MARGIN_SECONDS,
        )
        if not rows:
            return [], set(room.held)
        claimed_ids = [row["job_id"] for row in rows]
        await conn.execute(
            "INSERT INTO job_attempts (job_id, attempt_number, worker_id, status) "
            "SELECT job_id, attempt_number, $3, 'processing' FROM unnest($1::uuid[], $2::int[]) "
            "AS a(job_id, attempt_number)",
            claimed_ids,
            [row["attempt_count"] for row in rows],
            worker_id,
        )
        await conn.execute(
            "UPDATE processing_jobs SET status = 'processing', started_at = coalesce(started_at, now()), "
            "updated_at = now() WHERE job_id = ANY($1::uuid[])",
            claimed_ids,
        )
        await release_deferred(conn, claimed_ids)  # their accounts' windows move on (ADR 0059)
    by_id = {str(row["job_id"]): _claimed_job(row) for row in rows}
    return [by_id.pop(job_id) for job_id in valid if job_id in by_id], set(room.held)


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


async def claim_retrying(
    pool: asyncpg.Pool, job_ids: list[str], worker_id: str, running: Container[str]
) -> tuple[dict[str, ClaimedJob], set[str]]:
    """:func:`claim_held`, retried across a Postgres restart (:func:`db.retrying`): the claimed
    jobs by job id, and the ids held back by their account's cap. When a retry finds a job already
    processing under this worker (and not in ``running``, the jobs it runs), the first try
    committed and only its reply was lost: the job is taken (:func:`reclaim`) instead of waiting
    out its lease. Raises the last error when Postgres stays away longer than the retry budget."""
    retried = False

    def note_retry() -> None:
        nonlocal retried
        retried = True

    claimed: list[ClaimedJob] = []
    held: set[str] = set()
    async for attempt in db.retrying(on_retry=note_retry):
        with attempt:
            claimed, held = await claim_held(pool, job_ids, worker_id)
    jobs = {job.job_id: job for job in claimed}
    for key in {job_key(job_id) for job_id in job_ids} if retried else ():
        if key is not None and key not in jobs and key not in held and key not in running:
            async for attempt in db.retrying():
                with attempt:
                    job = await reclaim(pool, key, worker_id)
            if job is not None:
                jobs[key] = job
    return jobs, held


_CLAIMED_COLUMNS = """j.job_id, j.account_id, j.object_id, j.operation, j.profile_version, j.queue,
    j.params, j.priority, j.attempt_count, j.max_attempts, j.estimated_credits, p.timeout_seconds,
    p.max_input_bytes, p.max_pixels, p.memory_limit_mb, p.backoff_base_seconds, p.escalation_per_page,
    p.max_duration_seconds, p.base_cost, p.work_unit, p.per_unit, j.parent_job_id, j.chunk_index,
    j.fanned_out_at IS NOT NULL AS fanned_out"""
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
        base_cost=row["base_cost"],
        work_unit=row["work_unit"],
        per_unit=row["per_unit"],
        parent_job_id=None if row["parent_job_id"] is None else str(row["parent_job_id"]),
        chunk_index=row["chunk_index"],
        fanned_out=row["fanned_out"],
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
    # One statement (one round trip, its own transaction): the fenced update, the outputs and the
    # attempt's end all happen, or none does. The UPDATE waits for a concurrent cancel's row lock
    # and re-checks its WHERE on the row that cancel committed, as it would on its own.
    completed = await pool.fetchval(
        """
        WITH done AS (
            UPDATE processing_jobs SET status = 'completed', completed_at = now(), actual_credits = $4,
                   charge_lines = $5, visibility_timeout = NULL, error_code = NULL, error_message = NULL,
                   updated_at = now()
            WHERE job_id = $1 AND claimed_by = $2 AND attempt_count = $3 AND status = 'processing'
            RETURNING job_id
        ), outputs AS (
            INSERT INTO job_outputs (job_id, output_type, profile_version, object_id, key, mime_type,
                                     size_bytes, metadata)
            SELECT done.job_id, o.output_type, $6, o.object_id, o.key, o.mime_type, o.size_bytes, o.metadata
            FROM done, unnest($7::text[], $8::uuid[], $9::text[], $10::text[], $11::bigint[], $12::jsonb[])
                 AS o (output_type, object_id, key, mime_type, size_bytes, metadata)
            ON CONFLICT ON CONSTRAINT uk_job_type_profile DO NOTHING
        ), attempt AS (
            UPDATE job_attempts SET status = 'completed', error_code = NULL, error_message = NULL,
                   finished_at = now(), duration_ms = $13, peak_memory_mb = $14
            WHERE job_id IN (SELECT job_id FROM done) AND attempt_number = $3
        )
        SELECT count(*) FROM done
        """,
        job.job_id,
        worker_id,
        job.attempt,
        actual_credits,
        charge_lines or {},
        job.profile_version,
        [o.output_type for o in outputs],
        [o.object_id for o in outputs],
        [o.key for o in outputs],
        [o.mime_type for o in outputs],
        [o.size_bytes for o in outputs],
        [o.metadata for o in outputs],
        duration_ms,
        peak_memory_mb,
    )
    if not completed:
        return await fenced_status(pool, job, worker_id) == "completed"
    _observe(job, "completed", duration_ms, peak_memory_mb)
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
    input_fault: bool = False,
) -> str | None:
    """Record a failed attempt. A retryable failure with attempts left goes to ``retry_wait`` with
    backoff ``backoff_base_seconds × 2^(n−1)`` (the seed's 1, 2, 4, 8 … minutes), ``n`` being the
    number of attempts that failed on the job's account (``attempt_count − lost_attempts``, this one
    included), and so does the ``max_attempts`` check; otherwise the job is ``failed``. A job whose
    cancellation was requested is never retried: it is ``failed`` (and the caller releases its hold).
    ``input_fault``: the sandbox child ran and failed with one of
    :data:`~hypermedia.jobs.charges.INPUT_FAULTS`; a job that then ends ``failed`` (its
    cancellation not requested) records :func:`~hypermedia.jobs.charges.for_failure` as its
    ``actual_credits`` and ``charge_lines``, which :func:`failure_charge` reads back for the
    settlement. Returns the new status (also when an earlier call of this attempt
    committed and its reply was lost), or None when the lease was lost."""
    async with pool.acquire() as conn, conn.transaction():
        before = None
        if input_fault:
            before = await conn.fetchval(
                "SELECT status FROM processing_jobs WHERE job_id = $1 FOR UPDATE", job.job_id
            )
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
        if status == "failed" and before == "processing":
            await _record_failure_charge(conn, job)
    _observe(job, "retried" if status == "retry_wait" else "failed", duration_ms, peak_memory_mb)
    metrics.JOB_ERRORS.labels(job.operation, metrics.job_error_label(error_code)).inc()
    return str(status)


async def _record_failure_charge(conn: db.Connection, job: ClaimedJob) -> None:
    """The charge of ``job``, failed because of its input: its attempts that failed so, this one
    included (just recorded), ran for the sum of their ``duration_ms``, and so did its children's
    (:mod:`~hypermedia.jobs.lifecycle.children`: unbilled themselves) that completed or failed
    so — a hostile file that fans out does not get its children's work for nothing."""
    run_ms = await conn.fetchval(
        """
        SELECT coalesce(sum(a.duration_ms), 0) FROM job_attempts a
        WHERE (a.job_id = $1 OR a.job_id IN (SELECT c.job_id FROM processing_jobs c WHERE c.parent_job_id = $1))
          AND (a.status = 'failed' AND a.error_code = ANY($2::text[]) OR a.status = 'completed' AND a.job_id <> $1)
        """,
        job.job_id,
        sorted(charges.INPUT_FAULTS),
    )
    charge = charges.for_failure(price=job.estimated_credits, base_cost=job.base_cost, run_ms=int(run_ms))
    await conn.execute(
        "UPDATE processing_jobs SET actual_credits = $2, charge_lines = $3 WHERE job_id = $1",
        job.job_id,
        charge.actual,
        charge.lines,
    )


async def failure_charge(pool: asyncpg.Pool, job_id: str) -> charges.Charge | None:
    """What the failed job ``job_id`` is charged (:func:`fail` recorded it), or None when it is
    not charged (its hold is released)."""
    row = await pool.fetchrow(
        "SELECT actual_credits, charge_lines FROM processing_jobs WHERE job_id = $1 AND status = 'failed'",
        job_id,
    )
    if row is None or row["actual_credits"] is None:
        return None
    return charges.Charge(int(row["actual_credits"]), dict(row["charge_lines"] or {}))


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
    _observe(job, "cancelled", duration_ms, 0)
    return True


def _observe(job: ClaimedJob, outcome: str, duration_ms: int, peak_memory_mb: int) -> None:
    """An attempt this process finished, in the worker's metrics (:mod:`hypermedia.core.metrics`),
    once its transaction committed (a retried call that finds its own earlier outcome is not
    counted again)."""
    metrics.ATTEMPTS.labels(job.operation, outcome).inc()
    metrics.ATTEMPT_SECONDS.labels(job.operation).observe(duration_ms / 1000)
    if peak_memory_mb > 0:
        metrics.ATTEMPT_PEAK_MEMORY.labels(job.operation).observe(peak_memory_mb * 2**20)


async def hand_back(
    pool: asyncpg.Pool, job: ClaimedJob, worker_id: str, prefix: str, *, preempted: bool = False
) -> bool:
    """Return a job this worker will not finish (drain deadline passed) to ``queued`` and publish it
    again. The attempt is recorded as ``lost`` (``preempted``, error ``PREEMPTED``, when the
    worker's spot instance is being reclaimed): it counts against :data:`MAX_LOST_ATTEMPTS`, not
    against ``max_attempts`` (the rule of :data:`LOST_ATTEMPT`). False when the lease was lost or
    the job is no longer ``processing``."""
    async with pool.acquire() as conn, conn.transaction():
        row = await conn.fetchrow(
            f"""
            UPDATE processing_jobs j SET {lost_attempt_sql(4)}
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
        if preempted:
            await _finish_attempt(
                conn, job, "preempted", "PREEMPTED", "handed back: its instance is reclaimed", 0, 0
            )
        else:
            await _finish_attempt(conn, job, "lost", "WORKER_LOST", "handed back at shutdown", 0, 0)
        if row["status"] == "queued":
            await enqueue_outbox(conn, prefix, job.job_id, row["queue"], row["priority"])
    metrics.ATTEMPTS.labels(job.operation, "preempted" if preempted else "lost").inc()
    return True


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
