"""What operators read about the scheduler (``hypermedia admin scheduler``): each pool's live
burst workers, latest decision and spend, the recent burst workers with their cost, and the
recent decisions. Plain JSON-ready dicts; times in ISO 8601, money in the pools' currency."""

from __future__ import annotations

from typing import Any

import asyncpg

from hypermedia.infra import db


async def report(conn: db.Connection, *, limit: int = 20) -> dict[str, Any]:
    """``{"pools": [...], "burst_workers": [...], "decisions": [...]}``: per pool its live burst
    workers, their summed ``cost_per_hour``, what its burst workers cost so far and its latest
    decision; the last ``limit`` burst workers (``cost``: ``cost_per_hour`` × hours from request to
    termination, or to now) and the last ``limit`` decisions (``inputs`` left out: read them in
    ``scaling_decisions``)."""
    workers = await conn.fetch(
        """
        SELECT burst_worker_id::text AS burst_worker_id, pool, provider, capacity_type, provider_ref, state,
               slots, cost_per_hour::float8 AS cost_per_hour, leader, reason, requested_at, registered_at,
               draining_at, terminated_at,
               (cost_per_hour * extract(epoch FROM coalesce(terminated_at, now()) - requested_at) / 3600)::float8
                   AS cost
        FROM burst_workers ORDER BY requested_at DESC LIMIT $1
        """,
        limit,
    )
    pools = await conn.fetch(
        """
        SELECT d.pool, d.decided_at, d.leader, d.target, d.action, d.count, d.reason,
               coalesce(b.live, 0) AS live, coalesce(b.spend_per_hour, 0)::float8 AS spend_per_hour,
               coalesce(b.cost, 0)::float8 AS cost, coalesce(b.launched, 0) AS launched
        FROM (SELECT DISTINCT ON (pool) * FROM scaling_decisions ORDER BY pool, decision_id DESC) d
        LEFT JOIN (
            SELECT pool,
                   count(*) FILTER (WHERE state NOT IN ('terminated', 'failed')) AS live,
                   sum(cost_per_hour) FILTER (WHERE state NOT IN ('terminated', 'failed')) AS spend_per_hour,
                   sum(cost_per_hour * extract(epoch FROM coalesce(terminated_at, now()) - requested_at) / 3600)
                       AS cost,
                   count(*) AS launched
            FROM burst_workers GROUP BY pool
        ) b USING (pool)
        ORDER BY d.pool
        """
    )
    decisions = await conn.fetch(
        "SELECT decision_id, pool, decided_at, leader, target, action, count, reason "
        "FROM scaling_decisions ORDER BY decision_id DESC LIMIT $1",
        limit,
    )
    return {
        "pools": [_plain(r) for r in pools],
        "burst_workers": [_plain(r) for r in workers],
        "decisions": [_plain(r) for r in decisions],
    }


def _plain(row: asyncpg.Record) -> dict[str, Any]:
    return {k: v.isoformat() if hasattr(v, "isoformat") else v for k, v in dict(row).items()}
