"""A job's children (issue 23 item 2, ADR 0081): a long transcode fans out into one child job per
chunk of its plan but the last, which the parent's attempt encodes itself after them.

A child is a job of the same operation, profile version, object, account, queue and priority as
its parent, with ``parent_job_id`` and ``chunk_index`` set and its params the parent's: any
worker of the queue claims it, as any job, and it is retried, handed back and recovered as any
job. It is unbilled (``estimated_credits`` 0, no hold: the parent's charge covers the work), not
counted by its account's cap of running jobs (:mod:`~hypermedia.jobs.lifecycle.caps`: the parent
is), and not listed among the account's jobs. Its result is a checkpoint part of the parent
(:func:`hypermedia.jobs.checkpoints.record`), not an output. A cancel of the parent cancels its
children (:func:`~hypermedia.jobs.lifecycle.requests.request_cancel`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import asyncpg

from hypermedia.jobs.lifecycle.attempts import ClaimedJob
from hypermedia.jobs.lifecycle.rules import enqueue_outbox_many

ENDED: Final = ("completed", "failed", "cancelled")
"""A child's statuses after which it does nothing more."""


@dataclass(frozen=True)
class Children:
    """Where a parent's children are (:func:`state`)."""

    total: int
    ended: int
    done: float
    """Their work done, in children: each ended child counts 1, each other its last progress
    event's fraction (0–1)."""

    @property
    def all_ended(self) -> bool:
        return self.ended == self.total


async def spawn(
    pool: asyncpg.Pool, job: ClaimedJob, worker_id: str, prefix: str, count: int
) -> list[str] | None:
    """Creates ``count`` children of ``job`` (chunks ``0 … count − 1``), ``queued`` with their
    outbox rows, and marks ``job`` as fanned out, in one transaction, if this attempt is the
    live one of a ``processing`` job that has not fanned out before. Returns the children's ids
    in chunk order; None when fenced (the lease lost, a cancel requested, fanned out already).

    Raises:
        ValueError: ``count`` below 1.
    """
    if count < 1:
        raise ValueError(f"a job fans out into at least one child, not {count}")
    async with pool.acquire() as conn, conn.transaction():
        rows = await conn.fetch(
            """
            WITH parent AS (
                UPDATE processing_jobs SET fanned_out_at = now(), updated_at = now()
                WHERE job_id = $1 AND claimed_by = $2 AND attempt_count = $3 AND status = 'processing'
                  AND fanned_out_at IS NULL AND parent_job_id IS NULL
                RETURNING *
            )
            INSERT INTO processing_jobs (job_id, account_id, object_id, request_id, operation,
                profile_version, queue, params, priority, status, max_attempts, estimated_credits,
                parent_job_id, chunk_index, queued_at)
            SELECT gen_random_uuid(), p.account_id, p.object_id, p.request_id, p.operation,
                   p.profile_version, p.queue, p.params, p.priority, 'queued', p.max_attempts, 0,
                   p.job_id, i, now()
            FROM parent p, generate_series(0, $4 - 1) AS i
            RETURNING job_id, queue, priority, chunk_index
            """,
            job.job_id,
            worker_id,
            job.attempt,
            count,
        )
        if not rows:
            return None
        rows = sorted(rows, key=lambda r: r["chunk_index"])
        await enqueue_outbox_many(conn, prefix, [(r["job_id"], r["queue"], r["priority"]) for r in rows])
    return [str(r["job_id"]) for r in rows]


async def state(pool: asyncpg.Pool, parent_job_id: str) -> Children:
    """How far the children of ``parent_job_id`` are (:class:`Children`; all zero without any)."""
    row = await pool.fetchrow(
        """
        SELECT count(*) AS total, count(*) FILTER (WHERE c.status = ANY($2::text[])) AS ended,
               coalesce(sum(CASE WHEN c.status = ANY($2::text[]) THEN 1 ELSE coalesce(
                   (SELECT e.progress FROM job_events e WHERE e.job_id = c.job_id AND e.kind = 'progress'
                    ORDER BY e.event_id DESC LIMIT 1), 0) END), 0) AS done
        FROM processing_jobs c WHERE c.parent_job_id = $1
        """,
        parent_job_id,
        list(ENDED),
    )
    assert row is not None
    return Children(int(row["total"]), int(row["ended"]), float(row["done"]))
