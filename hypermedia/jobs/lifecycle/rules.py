"""What every path into and out of ``queued`` shares: the one rule for a lost attempt and the outbox
row written whenever a job (re-)enters ``queued`` (see :mod:`hypermedia.jobs.lifecycle`)."""

from __future__ import annotations

import uuid
from collections.abc import Iterable

import asyncpg

from hypermedia.core import telemetry
from hypermedia.infra import db
from hypermedia.jobs import queues

FAIR_WINDOW = 32
"""Most jobs of one account published and not yet claimed per (queue, priority) subject (ADR 0059):
another account's job queued behind its flood waits behind at most this many of them. Large
enough that a worker pulling a batch of its free slots never finds an account's window empty
while the relay refills it (one notify round trip), small enough to be "the time of a few jobs"
across a queue's slots."""
LEASE_MARGIN_SECONDS = 60
"""Added to ``timeout_seconds × 1.5`` (the sandbox wall clock) to get the lease length."""

MAX_LOST_ATTEMPTS = 10
"""Attempts a job may lose to the infrastructure (its worker killed or stuck, handed back at a
drain) before it fails with ``WORKER_LOST``. Counted apart from ``max_attempts``, which bounds the
attempts that failed on the job's own account, so that a rollout or a crashing node does not use
up a job's retries (as Kubernetes' ``podFailurePolicy`` ignores disruptions); bounded all the same,
so a job that somehow takes its worker down with it is not retried forever. ADR 0014."""


async def enqueue_outbox(conn: db.Connection, prefix: str, job_id: str, queue: str, priority: int) -> None:
    """Write the outbox row announcing that ``job_id`` is queued (call inside the job's transaction).
    The current trace context goes with it, so the worker's span continues the caller's trace."""
    await enqueue_outbox_many(conn, prefix, [(job_id, queue, priority)])


async def enqueue_outbox_many(
    conn: db.Connection, prefix: str, jobs: Iterable[tuple[object, str, int]]
) -> None:
    """:func:`enqueue_outbox` for several ``(job_id, queue, priority)`` in one round trip. Each row
    is **deferred** (kept in Postgres, not published) when its account already has
    :data:`FAIR_WINDOW` jobs of that queue and priority queued and not deferred, or has deferred
    rows there already (so its jobs keep their order): ADR 0059. A child job
    (:mod:`~hypermedia.jobs.lifecycle.children`) is never deferred, nor counted in a window. :func:`release_deferred` and the
    relay's sweep publish them as the account's jobs are claimed."""
    trace = telemetry.inject()
    jobs = list(jobs)
    batch = [str(job_id) for job_id, _, _ in jobs]
    await conn.executemany(
        """
        INSERT INTO outbox (subject, msg_id, payload, job_id, account_id, job_queue, priority, deferred)
        SELECT $1, $2, $3, x.job_id, j.account_id, $4, $5,
               j.account_id IS NOT NULL AND j.parent_job_id IS NULL AND (
                   EXISTS (SELECT 1 FROM outbox d
                           WHERE d.published_at IS NULL AND d.deferred AND d.account_id = j.account_id
                             AND d.job_queue = $4 AND d.priority = $5)
                   OR (SELECT count(*) FROM (
                           -- the window: its queued jobs, less those of this batch still without
                           -- a row (a batch of retries becomes queued before its rows are written)
                           SELECT 1 FROM processing_jobs q
                           WHERE q.account_id = j.account_id AND q.queue = $4 AND q.priority = $5
                             AND q.status = 'queued' AND q.job_id <> x.job_id AND q.parent_job_id IS NULL
                             AND (q.job_id <> ALL($8::uuid[]) OR EXISTS (
                                 SELECT 1 FROM outbox r WHERE r.job_id = q.job_id AND r.published_at IS NULL))
                           LIMIT $7) w) >= $7)
        FROM (SELECT $6::uuid AS job_id) x LEFT JOIN processing_jobs j ON j.job_id = x.job_id
        """,
        [
            (
                queues.subject(prefix, queue, priority),
                f"{job_id}:{uuid.uuid4().hex[:16]}",
                {"job_id": str(job_id), "queue": queue, "priority": priority, "trace": trace},
                queue,
                priority,
                str(job_id),
                FAIR_WINDOW,
                batch,
            )
            for job_id, queue, priority in jobs
        ],
    )


_MAKE_READY = """
    ready AS (
        UPDATE outbox o SET deferred = false
        FROM (
            SELECT d.outbox_id FROM wanted w CROSS JOIN LATERAL (
                SELECT outbox_id FROM outbox
                WHERE published_at IS NULL AND deferred AND account_id = w.account_id
                  AND job_queue = w.job_queue AND priority = w.priority
                ORDER BY outbox_id LIMIT greatest(w.n, 0)
                FOR UPDATE SKIP LOCKED  -- a concurrent claim or sweep releases those: no waits, no deadlock
            ) d
        ) x
        WHERE o.outbox_id = x.outbox_id
        RETURNING 1
    )
    SELECT count(*) FROM ready
"""
"""The end of :func:`release_deferred` and :func:`sweep_deferred`: for each row of the CTE
``wanted(account_id, job_queue, priority, n)``, its ``n`` oldest deferred rows become ready."""


async def release_deferred(conn: db.Connection, claimed: Iterable[object]) -> int:
    """In a claim's transaction: for each (account, queue, priority) of the ``claimed`` job ids,
    as many of its deferred outbox rows as jobs of it were claimed, oldest first, become ready,
    and the relays are woken (``NOTIFY hm_outbox``, sent at commit). Returns how many rows."""
    released = await conn.fetchval(
        """
        WITH wanted AS (
            SELECT account_id, queue AS job_queue, priority, count(*) AS n FROM processing_jobs
            WHERE job_id = ANY($1::uuid[]) AND parent_job_id IS NULL  -- a child moves no window
            GROUP BY account_id, queue, priority
        ),"""
        + _MAKE_READY,
        [str(j) for j in claimed],
    )
    if released:
        await conn.execute("SELECT pg_notify('hm_outbox', '')")
    return int(released)


async def sweep_deferred(conn: db.Connection | asyncpg.Pool) -> int:
    """Makes ready the deferred rows a window has room for though no claim released them (a
    queued job of the window cancelled, failed or deleted): per (account, queue, priority) with
    deferred rows, :data:`FAIR_WINDOW` less its queued jobs that are not deferred. The relays run
    it once a second. Returns how many rows."""
    released = await conn.fetchval(
        """
        WITH keys AS (
            SELECT DISTINCT account_id, job_queue, priority FROM outbox
            WHERE published_at IS NULL AND deferred
        ), wanted AS (
            SELECT k.*, $1 - (
                (SELECT count(*) FROM processing_jobs q
                 WHERE q.account_id = k.account_id AND q.queue = k.job_queue AND q.priority = k.priority
                   AND q.status = 'queued' AND q.parent_job_id IS NULL)
                - (SELECT count(*) FROM outbox d
                   WHERE d.published_at IS NULL AND d.deferred AND d.account_id = k.account_id
                     AND d.job_queue = k.job_queue AND d.priority = k.priority)
            ) AS n
            FROM keys k
        ),"""
        + _MAKE_READY,
        FAIR_WINDOW,
    )
    return int(released)


LOST_ATTEMPT = """
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


def lost_attempt_sql(max_param: int) -> str:
    """:data:`LOST_ATTEMPT` with ``$max_param`` as the placeholder of :data:`MAX_LOST_ATTEMPTS`."""
    return LOST_ATTEMPT % {"max": max_param}
