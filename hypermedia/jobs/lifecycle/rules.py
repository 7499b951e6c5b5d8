"""What every path into and out of ``queued`` shares: the one rule for a lost attempt and the outbox
row written whenever a job (re-)enters ``queued`` (see :mod:`hypermedia.jobs.lifecycle`)."""

from __future__ import annotations

import uuid
from collections.abc import Iterable

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


async def enqueue_outbox(conn: db.Connection, prefix: str, job_id: str, queue: str, priority: int) -> None:
    """Write the outbox row announcing that ``job_id`` is queued (call inside the job's transaction).
    The current trace context goes with it, so the worker's span continues the caller's trace."""
    await enqueue_outbox_many(conn, prefix, [(job_id, queue, priority)])


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
