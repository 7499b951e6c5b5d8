"""The cap on an account's running jobs per queue (issue 21 item 4, ADR 0060).

``account_quotas.max_running_jobs`` (NULL: no cap) bounds the account's jobs ``claimed``,
``processing`` or ``cancel_requested`` in each queue at once; each lane of the bulk queue
(``bulk.images``, ``bulk.media``, …) is a queue of its own, as its slots are. The claim is the
one gate (:func:`hypermedia.jobs.lifecycle.claim_held`): every path to a running job goes through
it, a retry, a hand-back and a lost lease included. In the claim's transaction the capped
accounts' (account, queue) pairs of the batch's jobs, whatever their status, are locked first
(:func:`lock_capped`, a transaction-scoped advisory lock each, in order), so two workers claiming
one account's jobs count one after the other; then :func:`over_cap` decides, under the lock, which
of those pairs' jobs the claim may take: the queued ones within the room left, most urgent first.
A child job (:mod:`~hypermedia.jobs.lifecycle.children`) is neither counted nor held: its parent,
running, holds the account's place, and a child held behind its own parent would never run.
The others it must not take; the queued ones among them are **held**: they stay ``queued``, the
worker gives their messages back with a delay of :data:`HELD_REDELIVERY_SECONDS` and JetStream
redelivers them, until a running job of the account ends and a claim finds room.

The queued jobs beyond the room are not the platform's backlog: the bulk brake, the stale
republish and the scheduler's demand leave them out (:data:`HELD`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hypermedia.infra import db

HELD_REDELIVERY_SECONDS = 0.5
"""The delay of a held job's message before JetStream delivers it again (``nak`` with a delay).
A held account's next job starts within about a second after one of its running jobs ends: this
delay, then the fetcher's next sweep (an idle one sleeps up to 1 s, since a redelivery rings no
doorbell). Each redelivery costs one claim transaction, and at most the fairness window (32 jobs
a band, ADR 0059) of an account's messages cycle, so a held account costs at most ~64 claims a
second per band where it has jobs waiting."""

RUNNING = "status IN ('claimed', 'processing', 'cancel_requested')"
"""A job that holds a slot, as SQL over ``processing_jobs`` (what the cap counts)."""

_TAKEN_FIRST = "j.priority, j.created_at, j.job_id"
"""The order in which a capped pair's queued jobs get the room: most urgent, then oldest."""

HELD = f"""
    held AS (  -- queued jobs beyond the room their account's cap leaves in their queue
        SELECT w.job_id FROM (
            SELECT j.job_id, j.account_id, j.queue, q.max_running_jobs AS cap,
                   row_number() OVER (PARTITION BY j.account_id, j.queue ORDER BY {_TAKEN_FIRST}) AS n
            FROM processing_jobs j
            JOIN account_quotas q ON q.account_id = j.account_id AND q.max_running_jobs IS NOT NULL
            WHERE j.status = 'queued' AND j.parent_job_id IS NULL
        ) w
        LEFT JOIN (
            SELECT r.account_id, r.queue, count(*) AS running FROM processing_jobs r
            JOIN account_quotas q ON q.account_id = r.account_id AND q.max_running_jobs IS NOT NULL
            WHERE r.{RUNNING} AND r.parent_job_id IS NULL GROUP BY r.account_id, r.queue
        ) c ON c.account_id = w.account_id AND c.queue = w.queue
        WHERE w.n > w.cap - coalesce(c.running, 0)
    )"""
"""A CTE ``held(job_id)`` to put in a ``WITH``: the queued jobs a claim would hold now (beyond the
cap less the running jobs of their account and queue, in the order :func:`over_cap` takes them).
Not held: ``NOT EXISTS (SELECT 1 FROM held h WHERE h.job_id = j.job_id)``."""


@dataclass(frozen=True)
class Room:
    """What :func:`over_cap` decided for a claim's batch (job ids as canonical UUID text)."""

    barred: frozenset[str] = frozenset()
    """Jobs of capped pairs the claim must not take: the held ones, and those not ``queued``
    when counted (one that turns ``queued`` later in the transaction, by a retry or a hand-back,
    was neither locked for nor counted)."""
    held: frozenset[str] = frozenset()
    """The queued ones among them, beyond the room: their messages must come back later."""


async def lock_capped(conn: db.Connection, job_ids: Sequence[str]) -> list[tuple[str, str, int]]:
    """In a claim's transaction, before anything else: the ``(account_id, queue, cap)`` of the
    capped accounts among the jobs of ``job_ids`` (canonical UUID text), whatever their status,
    each pair locked until the transaction ends, in (account, queue) order so that claims never
    wait in a cycle. Empty (one index lookup a job, no lock) when none of their accounts has a cap."""
    rows = await conn.fetch(
        """
        SELECT k.account_id, k.queue, k.cap,
               pg_advisory_xact_lock(hashtextextended('running:' || k.account_id || ':' || k.queue, 0))::text
        FROM (SELECT DISTINCT j.account_id, j.queue, q.max_running_jobs AS cap
              FROM processing_jobs j
              JOIN account_quotas q ON q.account_id = j.account_id AND q.max_running_jobs IS NOT NULL
              WHERE j.job_id = ANY($1::uuid[]) AND j.parent_job_id IS NULL
              ORDER BY j.account_id, j.queue) k
        """,
        list(job_ids),
    )
    return [(str(r["account_id"]), r["queue"], r["cap"]) for r in rows]


async def over_cap(
    conn: db.Connection, job_ids: Sequence[str], capped: Sequence[tuple[str, str, int]]
) -> Room:
    """After :func:`lock_capped` returned ``capped``: for each capped (account, queue), its jobs
    in ``job_ids`` the claim may take are its queued ones within the room left (the cap less its
    running jobs, counted now, under the lock), the most urgent priority first, then the oldest;
    the rest are :attr:`Room.barred`. A job of an uncapped account is never barred."""
    if not capped:
        return Room()
    rows = await conn.fetch(
        f"""
        WITH room AS (
            SELECT c.account_id, c.queue, c.cap - (
                SELECT count(*) FROM processing_jobs r
                WHERE r.account_id = c.account_id AND r.queue = c.queue AND r.{RUNNING} AND r.parent_job_id IS NULL) AS room
            FROM unnest($2::uuid[], $3::text[], $4::int[]) AS c (account_id, queue, cap)
        )
        SELECT j.job_id, j.status = 'queued' AS queued, row_number() OVER (
                   PARTITION BY j.account_id, j.queue
                   ORDER BY j.status <> 'queued', {_TAKEN_FIRST}) <= r.room AS fits
        FROM processing_jobs j JOIN room r ON r.account_id = j.account_id AND r.queue = j.queue
        WHERE j.job_id = ANY($1::uuid[]) AND j.parent_job_id IS NULL
        """,
        list(job_ids),
        [account for account, _, _ in capped],
        [queue for _, queue, _ in capped],
        [cap for _, _, cap in capped],
    )
    barred = [r for r in rows if not (r["queued"] and r["fits"])]
    return Room(
        barred=frozenset(str(r["job_id"]) for r in barred),
        held=frozenset(str(r["job_id"]) for r in barred if r["queued"]),
    )
