"""What operators read about the scheduler (issue 20, ADR 0047): its pools, its burst workers with
what each cost, and its decisions with their inputs, from the tables it writes (``burst_workers``,
``scaling_decisions``). Read by ``hypermedia admin scheduler``, the gateway's REST
``/v1/admin/scheduler/...`` and gRPC ``hypermedia.scheduler.v1.SchedulerAdminService``.

Rows are plain dicts (times as aware datetimes, money as floats in the pools' currency). A burst
worker's ``cost`` is ``cost_per_hour`` × the hours from its request to its termination (to now
while it lives): per-second billing.
"""

from __future__ import annotations

from typing import Any

from hypermedia.infra import db

WAKE_CHANNEL = "hm_scheduler"
"""The Postgres ``NOTIFY`` channel that wakes the scheduler's leader before its next cycle is due:
a spot worker announces its preemption there (hypermedia/worker/registry.py), so its capacity is
replaced at once rather than a cycle later."""
DEFAULT_LIMIT = 50
MAX_LIMIT = 1000
LIVE = "state NOT IN ('terminated', 'failed')"
_COST = "(cost_per_hour * extract(epoch FROM coalesce(terminated_at, now()) - requested_at) / 3600)::float8"


def clamp_limit(limit: int) -> int:
    """``limit`` within 1..:data:`MAX_LIMIT`; 0 (unset) is :data:`DEFAULT_LIMIT`."""
    return DEFAULT_LIMIT if limit <= 0 else min(limit, MAX_LIMIT)


async def pools(conn: db.Connection) -> list[dict[str, Any]]:
    """Every pool with a decision, by name: ``name``, ``config`` (the pool's settings at its latest
    decision), ``live_workers``, ``spend_per_hour`` (their summed ``cost_per_hour``), ``cost`` (of
    every burst worker so far), ``launched`` and ``latest_decision`` (as :func:`decisions`)."""
    rows = await conn.fetch(
        f"""
        SELECT d.pool AS name, d.inputs -> 'pool' AS config,
               coalesce(b.live, 0)::int AS live_workers, coalesce(b.spend_per_hour, 0)::float8 AS spend_per_hour,
               coalesce(b.cost, 0)::float8 AS cost, coalesce(b.launched, 0) AS launched,
               d.decision_id, d.decided_at, d.leader, d.target, d.action, d.count, d.reason, d.inputs
        FROM (SELECT DISTINCT ON (pool) * FROM scaling_decisions ORDER BY pool, decision_id DESC) d
        LEFT JOIN (
            SELECT pool, count(*) FILTER (WHERE {LIVE}) AS live,
                   sum(cost_per_hour) FILTER (WHERE {LIVE}) AS spend_per_hour,
                   sum({_COST}) AS cost, count(*) AS launched
            FROM burst_workers GROUP BY pool
        ) b ON b.pool = d.pool
        ORDER BY d.pool
        """
    )
    decision_keys = ("decision_id", "decided_at", "leader", "target", "action", "count", "reason", "inputs")
    out = []
    for row in rows:
        item = {k: row[k] for k in ("name", "config", "live_workers", "spend_per_hour", "cost", "launched")}
        item["latest_decision"] = {"pool": row["name"], **{k: row[k] for k in decision_keys}}
        out.append(item)
    return out


async def burst_workers(
    conn: db.Connection, *, pool: str = "", live_only: bool = False, limit: int = DEFAULT_LIMIT
) -> list[dict[str, Any]]:
    """Burst workers, newest first: of ``pool`` (every pool when empty), only the live ones when
    ``live_only``, at most ``limit`` (clamped by :func:`clamp_limit`)."""
    rows = await conn.fetch(
        f"""
        SELECT burst_worker_id::text AS burst_worker_id, pool, provider, capacity_type,
               coalesce(provider_ref, '') AS provider_ref, state, slots, cost_per_hour::float8 AS cost_per_hour,
               leader, coalesce(reason, '') AS reason, requested_at, registered_at, draining_at,
               terminated_at, {_COST} AS cost
        FROM burst_workers
        WHERE ($1 = '' OR pool = $1) AND (NOT $2 OR {LIVE})
        ORDER BY requested_at DESC, burst_worker_id LIMIT $3
        """,
        pool,
        live_only,
        clamp_limit(limit),
    )
    return [dict(r) for r in rows]


async def decisions(
    conn: db.Connection, *, pool: str = "", limit: int = DEFAULT_LIMIT, before_id: int = 0
) -> list[dict[str, Any]]:
    """Decisions, newest first, with their ``inputs`` (a JSON object): of ``pool`` (every pool
    when empty), older than ``before_id`` when it is above 0, at most ``limit``."""
    rows = await conn.fetch(
        """
        SELECT decision_id, pool, decided_at, leader, target, action, count, reason, inputs
        FROM scaling_decisions
        WHERE ($1 = '' OR pool = $1) AND ($2 <= 0 OR decision_id < $2)
        ORDER BY decision_id DESC LIMIT $3
        """,
        pool,
        before_id,
        clamp_limit(limit),
    )
    return [dict(r) for r in rows]


async def report(conn: db.Connection, *, limit: int = 20) -> dict[str, Any]:
    """``{"pools": [...], "burst_workers": [...], "decisions": [...]}`` as JSON-ready values
    (ISO 8601 times; the decisions without their inputs: read them with :func:`decisions`):
    ``hypermedia admin scheduler``."""
    listed = {
        "pools": await pools(conn),
        "burst_workers": await burst_workers(conn, limit=limit),
        "decisions": await decisions(conn, limit=limit),
    }
    for pool in listed["pools"]:
        pool["latest_decision"].pop("inputs")
    for decision in listed["decisions"]:
        decision.pop("inputs")
    return jsonable(listed)


def jsonable(value: Any) -> Any:
    """``value`` with every datetime as ISO 8601 text, recursively."""
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [jsonable(v) for v in value]
    return value.isoformat() if hasattr(value, "isoformat") else value
