"""The reaper's transitions: lost leases (with the rule of :mod:`~hypermedia.jobs.lifecycle.rules`), due
retries, due delayed jobs, stale ``queued`` jobs published again, and which ended jobs' holds are
due for settlement."""

from __future__ import annotations

import datetime
from typing import Final

import asyncpg

from hypermedia.core import metrics
from hypermedia.infra import db
from hypermedia.jobs.lifecycle import caps
from hypermedia.jobs.lifecycle.rules import MAX_LOST_ATTEMPTS, enqueue_outbox_many, lost_attempt_sql

UNCREATED: Final = "uncreated"
"""The outcome of a hold whose job was never created (the gateway's transaction failed after the
Hold): released (:mod:`hypermedia.jobs.settlement`)."""


async def expire_leases(pool: asyncpg.Pool, prefix: str, batch: int) -> list[tuple[str, str]]:
    """The reaper's lost attempts: up to ``batch`` jobs in ``claimed``/``processing``/
    ``cancel_requested`` whose ``visibility_timeout`` passed or whose worker is dead get the rule of
    :data:`LOST_ATTEMPT`; their attempts are recorded ``lost`` and the requeued ones published
    again, in one transaction (``FOR UPDATE SKIP LOCKED``: replicas never take the same job).

    Returns ``[(job_id, new status)]``; the caller settles the credits of those that ended.
    """
    async with pool.acquire() as conn, conn.transaction():
        rows = await _lose(
            conn,
            prefix,
            """(visibility_timeout < now()
                OR claimed_by IN (SELECT worker_id FROM workers WHERE status = 'dead'))
            ORDER BY visibility_timeout LIMIT $1""",
            "worker lost: lease expired or worker dead",
            batch,
        )
    return _observed(rows)


async def release_contained(pool: asyncpg.Pool, prefix: str, worker_id: str) -> list[tuple[str, str]]:
    """The jobs of a worker process its unit's control has contained (killed it and every job
    child, and reaped them: nothing of it can still write) get the rule of :data:`LOST_ATTEMPT` at
    once, rather than after their leases expire: the worker's row is marked ``dead`` and each of
    its ``claimed``/``processing``/``cancel_requested`` jobs is requeued (or ends), in one
    transaction.

    Returns ``[(job_id, new status)]``; the caller (or the reaper, for those that ended) settles.
    """
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("UPDATE workers SET status = 'dead' WHERE worker_id = $1", worker_id)
        rows = await _lose(
            conn, prefix, "claimed_by = $1", "worker contained by its unit's control", worker_id
        )
    return _observed(rows)


def _observed(rows: list[asyncpg.Record]) -> list[tuple[str, str]]:
    """The lost attempts, once committed, in the metrics (``outcome="lost"``, error
    ``WORKER_LOST``), as ``[(job_id, new status)]``."""
    for r in rows:
        metrics.ATTEMPTS.labels(r["operation"], "lost").inc()
        metrics.JOB_ERRORS.labels(r["operation"], "WORKER_LOST").inc()
    return [(str(r["job_id"]), str(r["status"])) for r in rows]


async def _lose(
    conn: db.Connection, prefix: str, which: str, message: str, arg: object
) -> list[asyncpg.Record]:
    """:data:`LOST_ATTEMPT` for the unfinished jobs ``which`` selects (an SQL condition and order on
    ``processing_jobs`` with ``$1`` = ``arg``), their attempts ``lost`` with ``message``, the
    requeued ones published again; in the caller's transaction."""
    rows = await conn.fetch(
        f"""
        WITH expired AS (
            SELECT job_id FROM processing_jobs
            WHERE status IN ('claimed', 'processing', 'cancel_requested') AND {which}
            FOR UPDATE SKIP LOCKED
        )
        UPDATE processing_jobs j SET {lost_attempt_sql(2)}
        FROM expired WHERE j.job_id = expired.job_id
        RETURNING j.job_id, j.status, j.queue, j.priority, j.attempt_count, j.operation
        """,
        arg,
        MAX_LOST_ATTEMPTS,
    )
    await conn.executemany(
        """
        UPDATE job_attempts SET status = 'lost', error_code = 'WORKER_LOST',
               error_message = $3, finished_at = now()
        WHERE job_id = $1 AND attempt_number = $2 AND status = 'processing'
        """,
        [(r["job_id"], r["attempt_count"], message) for r in rows],
    )
    await enqueue_outbox_many(
        conn, prefix, [(r["job_id"], r["queue"], r["priority"]) for r in rows if r["status"] == "queued"]
    )
    return list(rows)


async def promote_retries(pool: asyncpg.Pool, prefix: str, batch: int) -> int:
    """``retry_wait → queued`` for up to ``batch`` jobs whose ``next_attempt_at`` passed, published
    again in the same transaction. Returns how many."""
    return await _promote_due(pool, prefix, batch, "retry_wait", "next_attempt_at")


async def promote_scheduled(pool: asyncpg.Pool, prefix: str, batch: int) -> int:
    """``scheduled → queued`` for up to ``batch`` delayed jobs whose ``not_before`` passed, oldest
    due first, with their outbox rows in the same transaction (ADR 0071). ``FOR UPDATE SKIP
    LOCKED``: pollers in several reapers never queue one job twice. Returns how many."""
    return await _promote_due(pool, prefix, batch, "scheduled", "not_before")


async def _promote_due(pool: asyncpg.Pool, prefix: str, batch: int, status: str, due: str) -> int:
    """``status → queued`` for up to ``batch`` jobs whose ``due`` column passed, oldest first,
    published in the same transaction (``FOR UPDATE SKIP LOCKED``). Returns how many."""
    async with pool.acquire() as conn, conn.transaction():
        rows = await conn.fetch(
            f"""
            WITH due AS (
                SELECT job_id FROM processing_jobs
                WHERE status = '{status}' AND {due} <= now()
                ORDER BY {due} LIMIT $1 FOR UPDATE SKIP LOCKED
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


async def next_scheduled(pool: asyncpg.Pool) -> datetime.timedelta | None:
    """How long until the earliest ``scheduled`` job is due (zero or negative: due now); None when
    there is none. One read of ``processing_jobs_scheduled_due_idx``."""
    wait: datetime.timedelta | None = await pool.fetchval(
        "SELECT min(not_before) - now() FROM processing_jobs WHERE status = 'scheduled'"
    )
    return wait


async def republish_stale(pool: asyncpg.Pool, prefix: str, batch: int, stale_seconds: float) -> int:
    """Publishes again up to ``batch`` jobs ``queued`` for more than ``stale_seconds`` (a message
    the broker lost never strands a job: claims are idempotent, duplicates dropped). Returns how
    many. A job its account's cap of running jobs holds is left alone: its message comes and
    goes while the cap holds it (ADR 0060), and it is republished, if its message was lost,
    once the cap leaves room for it."""
    async with pool.acquire() as conn, conn.transaction():
        rows = await conn.fetch(
            f"""
            WITH {caps.HELD}, stale AS (
                SELECT job_id FROM processing_jobs j
                WHERE status = 'queued' AND queued_at < now() - make_interval(secs => $2)
                  -- a job whose row waits in the outbox (deferred by its window) has no message to lose
                  AND NOT EXISTS (SELECT 1 FROM outbox o
                                  WHERE o.job_id = j.job_id AND o.published_at IS NULL)
                  AND NOT EXISTS (SELECT 1 FROM held h WHERE h.job_id = j.job_id)
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


async def settleable(
    pool: asyncpg.Pool, holds: list[tuple[str, datetime.datetime]], grace_seconds: float
) -> dict[str, tuple[str, int, dict[str, int]]]:
    """Of the jobs whose holds are still held (``[(job_id, hold created_at)]``), the ones to settle
    now: ``{job_id: (outcome, actual millicredits, charge lines)}`` for each job that ended more
    than ``grace_seconds`` ago (its status), and for each job never created whose hold is older
    than the grace (:data:`UNCREATED`, 0, ``{}``). Jobs still running,
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
            str(r["status"]) if r["status"] is not None else UNCREATED,
            int(r["actual_credits"] or 0),
            dict(r["charge_lines"] or {}),
        )
        for r in rows
        if r["due"]
    }
