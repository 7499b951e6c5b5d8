"""The cap on an account's running jobs per queue (issue 21 item 4, ADR 0060).

``account_quotas.max_running_jobs`` (NULL: no cap) bounds the account's jobs ``claimed``,
``processing`` or ``cancel_requested`` in each queue at once. The claim is the one gate
(:func:`hypermedia.jobs.lifecycle.claim_many`): every path to a running job goes through it, a
retry, a hand-back and a lost lease included. In the claim's transaction the capped accounts'
(account, queue) pairs are locked first (:func:`lock_capped`, a transaction-scoped advisory lock
each, in order), so two workers claiming one account's jobs count one after the other, and the jobs
over the room left (:func:`over_cap`, most urgent first) stay ``queued``: the worker gives their
messages back with a delay of :data:`HELD_REDELIVERY_SECONDS` and JetStream redelivers them,
until a running job of the account ends and a claim finds room.

While an account is at its cap in a queue, its queued jobs there are not the platform's backlog:
the bulk brake and the stale republish leave them out (:data:`AT_CAP`).
"""

from __future__ import annotations

from collections.abc import Sequence

from hypermedia.infra import db

HELD_REDELIVERY_SECONDS = 0.5
"""The delay of a held job's message before JetStream delivers it again (``nak`` with a delay).
A held account's next job starts at most about this long after one of its running jobs ends;
each redelivery costs one claim transaction, and at most the fairness window (32 jobs a band,
ADR 0059) of an account's messages cycle, so a capped account costs at most ~64 claims a second
per band where it has jobs waiting."""

RUNNING = "status IN ('claimed', 'processing', 'cancel_requested')"
"""A job that holds a slot, as SQL over ``processing_jobs`` (what the cap counts)."""

AT_CAP = f"""
    at_cap AS (  -- the (account, queue) pairs whose running jobs have reached the account's cap
        SELECT r.account_id, r.queue FROM processing_jobs r
        JOIN account_quotas q ON q.account_id = r.account_id AND q.max_running_jobs IS NOT NULL
        WHERE r.{RUNNING}
        GROUP BY r.account_id, r.queue, q.max_running_jobs HAVING count(*) >= q.max_running_jobs
    )"""
"""A CTE ``at_cap(account_id, queue)`` to put in a ``WITH``; a queued job ``j`` held by its cap is
``EXISTS (SELECT 1 FROM at_cap c WHERE c.account_id = j.account_id AND c.queue = j.queue)``."""


async def lock_capped(conn: db.Connection, job_ids: Sequence[str]) -> list[tuple[str, str, int]]:
    """In a claim's transaction, before anything else: the ``(account_id, queue, cap)`` of the
    capped accounts among the queued jobs of ``job_ids`` (canonical UUID text), each pair locked
    until the transaction ends, in (account, queue) order so that claims never wait in a cycle.
    Empty (one index lookup a job, no lock) when none of their accounts has a cap."""
    rows = await conn.fetch(
        """
        SELECT k.account_id, k.queue, k.cap,
               pg_advisory_xact_lock(hashtextextended('running:' || k.account_id || ':' || k.queue, 0))::text
        FROM (SELECT DISTINCT j.account_id, j.queue, q.max_running_jobs AS cap
              FROM processing_jobs j
              JOIN account_quotas q ON q.account_id = j.account_id AND q.max_running_jobs IS NOT NULL
              WHERE j.job_id = ANY($1::uuid[]) AND j.status = 'queued'
              ORDER BY j.account_id, j.queue) k
        """,
        list(job_ids),
    )
    return [(str(r["account_id"]), r["queue"], r["cap"]) for r in rows]


async def over_cap(
    conn: db.Connection, job_ids: Sequence[str], capped: Sequence[tuple[str, str, int]]
) -> set[str]:
    """After :func:`lock_capped` returned ``capped``: the ids of ``job_ids`` that the claim must
    leave queued, for each capped (account, queue) its queued jobs beyond the room left (the cap
    less its running jobs, counted now, under the lock), the most urgent priority first, then the
    oldest. A job of an uncapped account is never among them."""
    if not capped:
        return set()
    rows = await conn.fetch(
        f"""
        WITH room AS (
            SELECT c.account_id, c.queue, c.cap - (
                SELECT count(*) FROM processing_jobs r
                WHERE r.account_id = c.account_id AND r.queue = c.queue AND r.{RUNNING}) AS room
            FROM unnest($2::uuid[], $3::text[], $4::int[]) AS c (account_id, queue, cap)
        ), ranked AS (
            SELECT j.job_id, r.room, row_number() OVER (
                PARTITION BY j.account_id, j.queue ORDER BY j.priority, j.created_at, j.job_id) AS n
            FROM processing_jobs j JOIN room r ON r.account_id = j.account_id AND r.queue = j.queue
            WHERE j.job_id = ANY($1::uuid[]) AND j.status = 'queued'
        )
        SELECT job_id FROM ranked WHERE n > room
        """,
        list(job_ids),
        [account for account, _, _ in capped],
        [queue for _, queue, _ in capped],
        [cap for _, _, cap in capped],
    )
    return {str(r["job_id"]) for r in rows}
