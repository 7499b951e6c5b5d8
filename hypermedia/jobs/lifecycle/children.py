"""A job's children (issue 23 item 2, ADR 0081): a long transcode fans out into one child job per
chunk of its plan but the last, which the parent's attempt encodes itself after them.

A child is a job of the same operation, profile version, object, account and queue as its
parent, with ``parent_job_id`` and ``chunk_index`` set and its params the parent's: any worker
of the queue claims it, as any job, and it is handed back and recovered as any job. It differs
in four ways. It runs in the most urgent band of its queue, never deferred by its account's
fair window (ADR 0059): work a running job waits for goes before any job not yet started, so
that a worker whose parked parent freed a slot takes a child, not another long video that would
park too. It has one attempt (``max_attempts`` 1): a chunk a child did not keep is encoded by
the parent, so a retry would only double the work a hostile file gets. It is unbilled
(``estimated_credits`` 0, no hold: the parent's charge covers the work, and its run counts in the
parent's charge when the parent fails because of its input). And it is not counted by its
account's cap of running jobs (:mod:`~hypermedia.jobs.lifecycle.caps`: the parent is) nor
listed among the account's jobs. Its result is a checkpoint part of the parent
(:func:`hypermedia.jobs.checkpoints.record`), not an output. A parent that ends, or whose
cancellation is requested, ends its children with it (migration 0037's trigger).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import asyncpg

from hypermedia.jobs import charges, queues
from hypermedia.jobs.lifecycle.attempts import ClaimedJob
from hypermedia.jobs.lifecycle.rules import enqueue_outbox_many

ENDED: Final = ("completed", "failed", "cancelled")
"""A child's statuses after which it does nothing more."""


@dataclass(frozen=True)
class Failure:
    """A child that failed because of its input (:func:`state`)."""

    chunk_index: int
    error_code: str
    error_message: str


@dataclass(frozen=True)
class Children:
    """Where a parent's children are (:func:`state`)."""

    total: int
    ended: int
    done: float
    """Their work done, in children: each ended child counts 1, each other its last progress
    event's fraction (0–1)."""
    failure: Failure | None = None
    """The child of the lowest chunk that failed because of its input, if any: one whose failure
    charge :func:`~hypermedia.jobs.lifecycle.attempts.fail` recorded (``actual_credits`` set on
    a ``failed`` job, which it does only for :data:`~hypermedia.jobs.charges.INPUT_FAULTS` the
    sandbox child reported, a ``TIMEOUT`` only by CPU time) and whose recorded code is one of
    them (a later step of its attempt may have failed it otherwise: ``INTERNAL`` is the
    platform's). The parent would meet the same input doing that chunk itself."""

    @property
    def all_ended(self) -> bool:
        return self.ended == self.total


async def spawn(
    pool: asyncpg.Pool, job: ClaimedJob, worker_id: str, prefix: str, count: int
) -> list[str] | None:
    """Creates ``count`` children of ``job`` (chunks ``0 … count − 1``; see the module doc for how
    they differ from their parent), ``queued`` with their outbox rows, and marks ``job`` as
    fanned out, in one transaction, if this attempt is the
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
                   p.profile_version, p.queue, p.params, $5, 'queued', 1, 0, p.job_id, i, now()
            FROM parent p, generate_series(0, $4 - 1) AS i
            RETURNING job_id, queue, priority, chunk_index
            """,
            job.job_id,
            worker_id,
            job.attempt,
            count,
            queues.bands(job.queue)[0],
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
                    ORDER BY e.event_id DESC LIMIT 1), 0) END), 0) AS done,
               (SELECT ROW(f.chunk_index, f.error_code, f.error_message) FROM processing_jobs f
                WHERE f.parent_job_id = $1 AND f.status = 'failed' AND f.actual_credits IS NOT NULL
                  AND f.error_code = ANY($3::text[])
                ORDER BY f.chunk_index LIMIT 1) AS failure
        FROM processing_jobs c WHERE c.parent_job_id = $1
        """,
        parent_job_id,
        list(ENDED),
        sorted(charges.INPUT_FAULTS),
    )
    assert row is not None
    failed = row["failure"]
    failure = Failure(int(failed[0]), str(failed[1]), str(failed[2] or "")) if failed else None
    return Children(int(row["total"]), int(row["ended"]), float(row["done"]), failure)
