"""The runner's steps over Postgres (``services/gateway/backfill_runner.py`` drives them):
housekeeping, leasing running runs, their pending items, recording each item's outcome, ending
a tick with the run's bucket, and the brake."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import asyncpg

from hypermedia.infra import db
from hypermedia.jobs.lifecycle import caps

LEASE_SECONDS = 30
"""How long a runner holds a run between two ticks; another takes it over after a crash."""


@dataclass(frozen=True)
class Leased:
    """A running run a runner holds for one tick."""

    run_id: str
    account_id: str
    operation: str
    preset: tuple[str, int] | None
    target_version: int
    priority: int
    rate_per_second: float
    tokens: float
    """Tokens in its bucket now (refilled)."""
    since_last_tick: float
    """Seconds since its bucket was last refilled (the previous tick)."""


@dataclass(frozen=True)
class Item:
    """A pending item as the runner enqueues it."""

    item_no: int
    object_id: str
    params: dict[str, Any]
    replays: int


def refill(tokens: float, elapsed_seconds: float, rate_per_second: float) -> float:
    """The bucket after ``elapsed_seconds``: ``tokens + elapsed × rate``, at most one second of
    rate (and at least one job's worth of room)."""
    return min(max(1.0, rate_per_second), tokens + max(0.0, elapsed_seconds) * rate_per_second)


async def housekeeping(conn: db.Connection | asyncpg.Pool) -> tuple[int, int]:
    """Ends what has ended: running or paused runs past their deadline → ``expired``
    (``DEADLINE_EXCEEDED``, naming how many items were not enqueued); dispatched runs whose jobs
    all ended → ``completed``. Returns (expired, completed)."""
    expired = await conn.fetch(
        """
        UPDATE backfill_runs r SET state = 'expired', reason_code = 'DEADLINE_EXCEEDED',
               reason = (SELECT count(*) FROM backfill_items i WHERE i.run_id = r.run_id AND i.state = 'pending')
                        || ' items were not enqueued by the deadline',
               waiting_reason = NULL, updated_at = now(), ended_at = now()
        WHERE state IN ('running', 'paused') AND deadline <= now()
        RETURNING run_id
        """
    )
    completed = await conn.fetch(
        """
        UPDATE backfill_runs r SET state = 'completed', updated_at = now(), ended_at = now()
        WHERE state = 'dispatched' AND NOT EXISTS (
            SELECT 1 FROM backfill_items i JOIN processing_jobs j ON j.job_id = i.job_id
            WHERE i.run_id = r.run_id AND j.status NOT IN ('completed', 'failed', 'cancelled')
        )
        RETURNING run_id
        """
    )
    return len(expired), len(completed)


async def lease(conn: db.Connection | asyncpg.Pool, owner: str, limit: int = 16) -> list[Leased]:
    """Takes up to ``limit`` running runs no other runner holds (or whose holder's lease ran out)
    for :data:`LEASE_SECONDS`, their buckets refilled to now."""
    rows = await conn.fetch(
        f"""
        UPDATE backfill_runs r SET lease_until = now() + interval '{LEASE_SECONDS} seconds', leased_by = $1
        WHERE run_id IN (
            SELECT run_id FROM backfill_runs
            WHERE state = 'running' AND (lease_until IS NULL OR lease_until < now() OR leased_by = $1)
            ORDER BY updated_at LIMIT $2 FOR UPDATE SKIP LOCKED
        )
        RETURNING run_id::text AS run_id, account_id::text AS account_id, operation, preset_name,
                  preset_version, target_version, priority, rate_per_second, tokens,
                  extract(epoch FROM now() - refilled_at)::float8 AS elapsed
        """,
        owner,
        limit,
    )
    return [
        Leased(
            run_id=r["run_id"],
            account_id=r["account_id"],
            operation=r["operation"],
            preset=(r["preset_name"], r["preset_version"]) if r["preset_name"] else None,
            target_version=r["target_version"],
            priority=r["priority"],
            rate_per_second=r["rate_per_second"],
            tokens=refill(r["tokens"], r["elapsed"], r["rate_per_second"]),
            since_last_tick=r["elapsed"],
        )
        for r in rows
    ]


async def pending(conn: db.Connection | asyncpg.Pool, run_id: str, limit: int) -> list[Item]:
    """The run's next ``limit`` pending items, in their order."""
    rows = await conn.fetch(
        "SELECT item_no, object_id::text AS object_id, params, replays FROM backfill_items"
        " WHERE run_id = $1 AND state = 'pending' ORDER BY item_no LIMIT $2",
        uuid.UUID(run_id),
        limit,
    )
    return [Item(r["item_no"], r["object_id"], dict(r["params"]), r["replays"]) for r in rows]


async def record(
    conn: db.Connection | asyncpg.Pool,
    run_id: str,
    item_no: int,
    state: str,
    job_id: str | None = None,
    error: tuple[str, str] | None = None,
) -> str:
    """Records an item's outcome (``enqueued`` or ``existing`` with its job, ``skipped`` with an
    error code and message) and returns the run's state now: a runner stops its tick when the run
    is no longer ``running`` (paused or cancelled meanwhile)."""
    state_now = await conn.fetchval(
        """
        WITH item AS (
            UPDATE backfill_items SET state = $3, job_id = $4, error_code = $5, error_message = $6
            WHERE run_id = $1 AND item_no = $2
        )
        SELECT state FROM backfill_runs WHERE run_id = $1
        """,
        uuid.UUID(run_id),
        item_no,
        state,
        uuid.UUID(job_id) if job_id else None,
        error[0] if error else None,
        error[1] if error else None,
    )
    return str(state_now)


async def end_tick(
    conn: db.Connection | asyncpg.Pool,
    run: Leased,
    owner: str,
    *,
    tokens: float,
    waiting_reason: str | None,
    braked_seconds: float = 0.0,
    pause: tuple[str, str] | None = None,
) -> None:
    """Releases the run after a tick: its bucket (``tokens`` at now), why it waits (None when it
    enqueued), the time the brake held it added; ``pause`` (code, reason) pauses a run still
    running; a running run without pending items becomes ``dispatched``."""
    await conn.execute(
        """
        UPDATE backfill_runs r SET
            tokens = $3, refilled_at = now(), waiting_reason = $4, braked_seconds = braked_seconds + $5,
            lease_until = NULL, leased_by = NULL, updated_at = now(),
            state = CASE
                WHEN state <> 'running' THEN state
                WHEN $6::text IS NOT NULL THEN 'paused'
                WHEN NOT EXISTS (SELECT 1 FROM backfill_items i WHERE i.run_id = r.run_id AND i.state = 'pending')
                    THEN 'dispatched'
                ELSE state END,
            reason_code = CASE WHEN state = 'running' AND $6::text IS NOT NULL THEN $6 ELSE reason_code END,
            reason = CASE WHEN state = 'running' AND $6::text IS NOT NULL THEN $7 ELSE reason END
        WHERE run_id = $1 AND leased_by = $2
        """,
        uuid.UUID(run.run_id),
        owner,
        tokens,
        waiting_reason,
        braked_seconds,
        pause[0] if pause else None,
        pause[1] if pause else None,
    )


async def brake(conn: db.Connection | asyncpg.Pool, targets: Mapping[str, float]) -> str | None:
    """Why bulk dispatch must wait, or None: the first interactive queue (of ``targets``, queue →
    seconds) whose oldest queued job has waited longer than its target. A job its account's cap
    of running jobs holds (ADR 0060) waits for its own account, not for the platform: not counted."""
    if not targets:
        return None
    rows = await conn.fetch(
        f"""
        WITH {caps.HELD}
        SELECT queue, extract(epoch FROM now() - min(coalesce(queued_at, created_at)))::float8 AS waited
        FROM processing_jobs j WHERE status = 'queued' AND queue = ANY($1::text[])
          AND NOT EXISTS (SELECT 1 FROM held h WHERE h.job_id = j.job_id)
        GROUP BY queue ORDER BY queue
        """,
        list(targets),
    )
    for r in rows:
        if r["waited"] > targets[r["queue"]]:
            return (
                f"BRAKE: the {r['queue']} queue's oldest job has waited {r['waited']:.1f} s, "
                f"over its {targets[r['queue']]:g} s target"
            )
    return None
