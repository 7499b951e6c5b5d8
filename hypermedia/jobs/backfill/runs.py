"""Backfill runs as stored and shown: creating one, its progress, reading and listing runs,
pause, resume and cancel, and replaying its failures."""

from __future__ import annotations

import datetime
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from hypermedia.core.errors import Conflict, NotFound
from hypermedia.infra import db
from hypermedia.jobs.backfill.selection import WAITING, Candidate, Selector
from hypermedia.jobs.pricing import as_credits


@dataclass(frozen=True)
class Progress:
    """A run's items by state, and their jobs by status."""

    matched: int = 0
    pending: int = 0
    """Items not enqueued yet."""
    enqueued: int = 0
    """Items for which the run created a job."""
    existing: int = 0
    """Items linked to a job their key had already."""
    skipped: int = 0
    """Items that could not be enqueued (the object deleted, its type not accepted…)."""
    in_flight: int = 0
    """Linked jobs not ended yet."""
    completed: int = 0
    failed: int = 0
    cancelled: int = 0
    estimated_millicredits: int = 0
    """The estimates of the jobs the run created."""
    charged_millicredits: int = 0
    """What those of them that ended were charged."""


@dataclass(frozen=True)
class Run:
    """A backfill run as the API shows it."""

    run_id: str
    account_id: str
    state: str
    selector: Selector
    target_version: int
    priority: int
    rate_per_second: float
    deadline: datetime.datetime | None
    reason_code: str | None
    """Why it is paused, expired or cancelled (``PAUSED``, ``INSUFFICIENT_CREDITS``,
    ``PRESET_CHANGED``, ``DEADLINE_EXCEEDED``, ``CANCELLED``, …)."""
    reason: str | None
    waiting_reason: str | None
    """Why a running run enqueued nothing at its last tick (the brake, the waiting-jobs quota, an
    unavailable service), None once it enqueues again."""
    braked_seconds: float
    """How long the brake has held it in all."""
    planned_millicredits: int
    """The dry-run estimate it was created with: the prices of the jobs it was to create."""
    created_at: datetime.datetime
    updated_at: datetime.datetime
    ended_at: datetime.datetime | None
    progress: Progress = field(default_factory=Progress)


async def create(
    conn: db.Connection,
    account_id: str,
    selector: Selector,
    items: Sequence[Candidate],
    *,
    target_version: int,
    priority: int,
    rate_per_second: float,
    deadline: datetime.datetime | None,
    planned_millicredits: int = 0,
) -> str:
    """Stores a ``running`` run of ``items`` (in the caller's transaction) and returns its id,
    with ``planned_millicredits``, its dry run's estimate. The runner takes it at its next tick;
    its bucket starts with one token."""
    run_id = str(uuid.uuid4())
    await conn.execute(
        """
        INSERT INTO backfill_runs (run_id, account_id, operation, params, preset_name, preset_version,
            target_version, outdated_only, object_ids, created_after, created_before, priority,
            rate_per_second, deadline, state, tokens, planned_millicredits)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9::uuid[], $10, $11, $12, $13, $14, 'running', 1, $15)
        """,
        run_id,
        uuid.UUID(account_id),
        selector.operation,
        selector.params,
        selector.preset[0] if selector.preset else None,
        selector.preset[1] if selector.preset else None,
        target_version,
        selector.outdated_only,
        list(selector.object_ids) if selector.object_ids is not None else None,
        selector.created_after,
        selector.created_before,
        priority,
        rate_per_second,
        deadline,
        planned_millicredits,
    )
    await conn.execute(
        """
        INSERT INTO backfill_items (run_id, item_no, object_id, params, size_bytes)
        SELECT $1, t.n, t.o, t.p::jsonb, t.s
        FROM unnest($2::int[], $3::uuid[], $4::text[], $5::bigint[]) AS t(n, o, p, s)
        """,
        run_id,
        list(range(1, len(items) + 1)),
        [i.object_id for i in items],
        [json.dumps(i.params) for i in items],
        [i.size_bytes for i in items],
    )
    return run_id


_RUN_COLUMNS = """
    run_id::text AS run_id, account_id::text AS account_id, operation, params, preset_name,
    preset_version, target_version, outdated_only, object_ids::text[] AS object_ids, created_after,
    created_before, priority, rate_per_second, deadline, state, reason_code, reason, waiting_reason,
    braked_seconds, planned_millicredits, created_at, updated_at, ended_at
"""


async def progress(conn: db.Connection | asyncpg.Pool, run_ids: Sequence[str]) -> dict[str, Progress]:
    """Each run's :class:`Progress`, by run id (a run without items has none: all zeros)."""
    rows = await conn.fetch(
        """
        SELECT i.run_id::text AS run_id, count(*) AS matched,
               count(*) FILTER (WHERE i.state = 'pending') AS pending,
               count(*) FILTER (WHERE i.state = 'enqueued') AS enqueued,
               count(*) FILTER (WHERE i.state = 'existing') AS existing,
               count(*) FILTER (WHERE i.state = 'skipped') AS skipped,
               count(*) FILTER (WHERE j.status NOT IN ('completed', 'failed', 'cancelled')) AS in_flight,
               count(*) FILTER (WHERE j.status = 'completed') AS completed,
               count(*) FILTER (WHERE j.status = 'failed') AS failed,
               count(*) FILTER (WHERE j.status = 'cancelled') AS cancelled,
               coalesce(sum(j.estimated_credits) FILTER (WHERE i.state = 'enqueued'), 0) AS estimated,
               coalesce(sum(j.actual_credits) FILTER (WHERE i.state = 'enqueued'), 0) AS charged
        FROM backfill_items i LEFT JOIN processing_jobs j ON j.job_id = i.job_id
        WHERE i.run_id = ANY($1::uuid[])
        GROUP BY i.run_id
        """,
        list(run_ids),
    )
    return {
        r["run_id"]: Progress(
            matched=r["matched"],
            pending=r["pending"],
            enqueued=r["enqueued"],
            existing=r["existing"],
            skipped=r["skipped"],
            in_flight=r["in_flight"],
            completed=r["completed"],
            failed=r["failed"],
            cancelled=r["cancelled"],
            estimated_millicredits=int(r["estimated"]),
            charged_millicredits=int(r["charged"]),
        )
        for r in rows
    }


def _run(row: Any, made: Progress | None) -> Run:
    preset = (row["preset_name"], row["preset_version"]) if row["preset_name"] else None
    return Run(
        run_id=row["run_id"],
        account_id=row["account_id"],
        state=row["state"],
        selector=Selector(
            operation=row["operation"],
            params=dict(row["params"]) if row["params"] is not None else None,
            preset=preset,
            outdated_only=row["outdated_only"],
            object_ids=tuple(row["object_ids"]) if row["object_ids"] is not None else None,
            created_after=row["created_after"],
            created_before=row["created_before"],
        ),
        target_version=row["target_version"],
        priority=row["priority"],
        rate_per_second=row["rate_per_second"],
        deadline=row["deadline"],
        reason_code=row["reason_code"],
        reason=row["reason"],
        waiting_reason=row["waiting_reason"],
        braked_seconds=round(row["braked_seconds"], 3),
        planned_millicredits=row["planned_millicredits"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        ended_at=row["ended_at"],
        progress=made or Progress(),
    )


_OWNED = "run_id = $1 AND ($2::uuid IS NULL OR account_id = $2)"
"""The run ``$1`` if it is account ``$2``'s (NULL: any account's, the operators'): :func:`_owned`."""


def _owned(run_id: str, account_id: str | None) -> tuple[uuid.UUID, uuid.UUID | None]:
    """The parameters of :data:`_OWNED`."""
    return uuid.UUID(run_id), uuid.UUID(account_id) if account_id else None


async def get(conn: db.Connection | asyncpg.Pool, run_id: str, account_id: str | None = None) -> Run:
    """The run with its progress; ``account_id`` (None: any account, the operators') must own it.
    Raises NotFound (``RUN_NOT_FOUND``)."""
    row = await conn.fetchrow(
        f"SELECT {_RUN_COLUMNS} FROM backfill_runs WHERE {_OWNED}", *_owned(run_id, account_id)
    )
    if row is None:
        raise NotFound("no such backfill run", "RUN_NOT_FOUND")
    return _run(row, (await progress(conn, [run_id])).get(run_id))


async def list_runs(
    conn: db.Connection | asyncpg.Pool, account_id: str | None = None, limit: int = 50
) -> list[Run]:
    """The account's runs (None: every account's), newest first, at most ``limit`` (1-1000)."""
    rows = await conn.fetch(
        f"SELECT {_RUN_COLUMNS} FROM backfill_runs WHERE $1::uuid IS NULL OR account_id = $1"
        " ORDER BY created_at DESC, run_id LIMIT $2",
        uuid.UUID(account_id) if account_id else None,
        max(1, min(limit, 1000)),
    )
    made = await progress(conn, [r["run_id"] for r in rows])
    return [_run(r, made.get(r["run_id"])) for r in rows]


_TRANSITIONS = {
    "pause": ({"running"}, "paused", "PAUSED", "paused by request"),
    "resume": ({"paused"}, "running", None, None),
    "cancel": (
        {"running", "paused", "dispatched", "expired"},
        "cancelled",
        "CANCELLED",
        "cancelled by request",
    ),
}
"""Action → (states it applies to, the state after, reason code, reason)."""


async def transition(
    conn: db.Connection, run_id: str, action: str, account_id: str | None = None
) -> tuple[str, bool]:
    """``pause``, ``resume`` or ``cancel`` the run (``account_id``'s, None: any), in a transaction
    that locks its row. Returns the state after and whether it changed: an action on a run
    already in its target state changes nothing. A resumed run's bucket goes on from where it
    was at the pause (no refill for the paused time). Raises NotFound (``RUN_NOT_FOUND``),
    Conflict (``RUN_NOT_PAUSABLE``, ``RUN_NOT_RESUMABLE``, ``RUN_NOT_CANCELLABLE``) for a run in
    another state; ``RUN_DEADLINE_PASSED`` to resume a run whose deadline has passed."""
    sources, target, code, reason = _TRANSITIONS[action]
    async with conn.transaction():
        current = await conn.fetchrow(
            f"SELECT state, deadline <= now() AS passed FROM backfill_runs WHERE {_OWNED} FOR UPDATE",
            *_owned(run_id, account_id),
        )
        if current is None:
            raise NotFound("no such backfill run", "RUN_NOT_FOUND")
        state = current["state"]
        if state == target:
            return target, False
        if action == "resume" and (state == "expired" or current["passed"]):
            raise Conflict("the run's deadline has passed: create a new run", "RUN_DEADLINE_PASSED")
        if state not in sources:
            verb = {"pause": "PAUSABLE", "resume": "RESUMABLE", "cancel": "CANCELLABLE"}[action]
            done = {"pause": "paused", "resume": "resumed", "cancel": "cancelled"}[action]
            allowed = ", ".join(sorted(sources))
            raise Conflict(
                f"the run is {state}: only a run that is {allowed} can be {done}", f"RUN_NOT_{verb}"
            )
        await conn.execute(
            """
            UPDATE backfill_runs SET state = $2, reason_code = $3, reason = $4, waiting_reason = NULL,
                   refilled_at = now(), updated_at = now(),
                   ended_at = CASE WHEN $2 = 'cancelled' THEN now() END
            WHERE run_id = $1
            """,
            uuid.UUID(run_id),
            target,
            code,
            reason,
        )
    return target, True


async def waiting_jobs(conn: db.Connection | asyncpg.Pool, run_id: str) -> list[str]:
    """The run's jobs that have not started (created, queued or waiting for a retry)."""
    rows = await conn.fetch(
        """
        SELECT j.job_id::text AS job_id FROM backfill_items i JOIN processing_jobs j ON j.job_id = i.job_id
        WHERE i.run_id = $1 AND i.state = 'enqueued' AND j.status = ANY($2::text[])
        """,
        uuid.UUID(run_id),
        list(WAITING),
    )
    return [r["job_id"] for r in rows]


async def replay_failures(conn: db.Connection, run_id: str, account_id: str | None = None) -> int:
    """Puts the run's items whose job failed back to ``pending`` (each under its next replay key)
    and a dispatched, completed or expired run with any back to ``running``, in one transaction.
    Returns how many items. Raises NotFound (``RUN_NOT_FOUND``), Conflict (``RUN_NOT_REPLAYABLE``)
    for a cancelled run, or an expired one whose deadline has passed."""
    async with conn.transaction():
        run = await conn.fetchrow(
            f"SELECT state, deadline <= now() AS passed FROM backfill_runs WHERE {_OWNED} FOR UPDATE",
            *_owned(run_id, account_id),
        )
        if run is None:
            raise NotFound("no such backfill run", "RUN_NOT_FOUND")
        if run["state"] == "cancelled" or run["passed"]:
            why = "is cancelled" if run["state"] == "cancelled" else "is past its deadline"
            raise Conflict(f"the run {why}: create a new run to replay", "RUN_NOT_REPLAYABLE")
        status = await conn.execute(
            """
            UPDATE backfill_items i SET state = 'pending', job_id = NULL, replays = i.replays + 1,
                   error_code = NULL, error_message = NULL
            FROM processing_jobs j
            WHERE i.run_id = $1 AND j.job_id = i.job_id AND j.status = 'failed'
            """,
            uuid.UUID(run_id),
        )
        replayed = int(status.split()[-1])
        if replayed and run["state"] in ("dispatched", "completed", "expired"):
            await conn.execute(
                "UPDATE backfill_runs SET state = 'running', reason_code = NULL, reason = NULL, tokens = 1,"
                " refilled_at = now(), updated_at = now(), ended_at = NULL WHERE run_id = $1",
                uuid.UUID(run_id),
            )
    return replayed


def _iso(value: datetime.datetime | None) -> str | None:
    return value.isoformat() if value else None


def as_json(run: Run) -> dict[str, Any]:
    """The run as REST and ``hypermedia admin backfill`` show it (docs/api.md "Backfill runs"):
    credits as numbers with three decimals, times as ISO 8601."""
    s, p = run.selector, run.progress
    return {
        "run_id": run.run_id,
        "account_id": run.account_id,
        "state": run.state,
        "reason_code": run.reason_code,
        "reason": run.reason,
        "waiting_reason": run.waiting_reason,
        "selector": {
            "operation": s.operation,
            "params": s.params,
            "preset": {"name": s.preset[0], "version": s.preset[1]} if s.preset else None,
            "scope": "outdated" if s.outdated_only else "all",
            "object_ids": list(s.object_ids) if s.object_ids is not None else None,
            "created_after": _iso(s.created_after),
            "created_before": _iso(s.created_before),
        },
        "target_version": run.target_version,
        "priority": run.priority,
        "max_rate_per_second": run.rate_per_second,
        "deadline": _iso(run.deadline),
        "progress": {
            "matched": p.matched,
            "pending": p.pending,
            "enqueued": p.enqueued,
            "existing": p.existing,
            "skipped": p.skipped,
            "in_flight": p.in_flight,
            "completed": p.completed,
            "failed": p.failed,
            "cancelled": p.cancelled,
        },
        "planned_credits": as_credits(run.planned_millicredits),
        "estimated_credits": as_credits(p.estimated_millicredits),
        "charged_credits": as_credits(p.charged_millicredits),
        "braked_seconds": run.braked_seconds,
        "created_at": _iso(run.created_at),
        "updated_at": _iso(run.updated_at),
        "ended_at": _iso(run.ended_at),
    }


ITEM_STATES = ("pending", "enqueued", "existing", "skipped")
MAX_ITEMS_PAGE = 1000


@dataclass(frozen=True)
class ItemRow:
    """One item of a run as listed: what it regenerates and what became of it."""

    item_no: int
    """Its place in the run (1, 2, …): the page token."""
    object_id: str
    params: dict[str, Any]
    state: str
    job_id: str | None
    """The job it created (``enqueued``) or was linked to (``existing``)."""
    job_status: str | None
    error_code: str | None
    """Why it was skipped."""
    error_message: str | None
    replays: int


async def items(
    conn: db.Connection | asyncpg.Pool,
    run_id: str,
    account_id: str | None,
    *,
    state: str | None = None,
    after: int = 0,
    limit: int = 100,
) -> list[ItemRow]:
    """The run's items after item ``after``, in order, at most ``limit`` (1 to
    :data:`MAX_ITEMS_PAGE`), of ``state`` when given, each with its job's status. Raises NotFound
    (``RUN_NOT_FOUND``) for a run that is not ``account_id``'s (None: any)."""
    exists = await conn.fetchval(f"SELECT 1 FROM backfill_runs WHERE {_OWNED}", *_owned(run_id, account_id))
    if not exists:
        raise NotFound("no such backfill run", "RUN_NOT_FOUND")
    rows = await conn.fetch(
        """
        SELECT i.item_no, i.object_id::text AS object_id, i.params, i.state, i.job_id::text AS job_id,
               j.status AS job_status, i.error_code, i.error_message, i.replays
        FROM backfill_items i LEFT JOIN processing_jobs j ON j.job_id = i.job_id
        WHERE i.run_id = $1 AND i.item_no > $2 AND ($3::text IS NULL OR i.state = $3)
        ORDER BY i.item_no LIMIT $4
        """,
        uuid.UUID(run_id),
        after,
        state,
        max(1, min(limit, MAX_ITEMS_PAGE)),
    )
    return [
        ItemRow(
            item_no=r["item_no"],
            object_id=r["object_id"],
            params=dict(r["params"]),
            state=r["state"],
            job_id=r["job_id"],
            job_status=r["job_status"],
            error_code=r["error_code"],
            error_message=r["error_message"],
            replays=r["replays"],
        )
        for r in rows
    ]
