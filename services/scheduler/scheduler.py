"""The scheduler's cycle (:meth:`Scheduler.run_once`): for each pool, bring the burst workers'
states up to date, read the demand, decide (:func:`services.scheduler.formula.plan`), record the
decision with its inputs, and act on it.

A burst worker goes ``requested`` (the row is written before the provider is asked, so a leader
that dies mid-launch leaves a trace its successor adopts from the provider's list) → ``booting``
(launched) → ``registered`` (its worker process registered in ``workers``) → ``draining`` (the
scheduler marked its ``workers`` row; the worker sees it at its next heartbeat, stops fetching,
finishes or hands back, and stops) → ``terminated`` (the provider ended it once the worker
stopped). One that has not registered within its boot grace is terminated as ``failed``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import asyncpg

from hypermedia.core import metrics
from hypermedia.infra import db
from services.scheduler import formula
from services.scheduler.demand import LiveWorker, WorkEstimates, live_workers, queue_demand
from services.scheduler.pools import Pool
from services.scheduler.providers import Instance, Provider

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Timing:
    """The scheduler's thresholds, seconds (:class:`~services.scheduler.settings.SchedulerSettings`)."""

    arrival_window: float = 120.0
    stale: float = 90.0
    drain_timeout: float = 120.0


class Scheduler:
    """Decides and acts for ``pools``, writing over ``conn`` (the leader lock's connection:
    :class:`~services.scheduler.leader.Leadership`), launching through ``providers`` by name."""

    def __init__(
        self, pools: Sequence[Pool], providers: Mapping[str, Provider], holder: str, timing: Timing = Timing()
    ) -> None:
        self.pools = tuple(pools)
        self._providers = providers
        self.holder = holder
        self._timing = timing
        self.estimates = WorkEstimates()

    async def run_once(self, conn: db.Connection) -> list[formula.Plan]:
        """One cycle over every pool; returns the plans decided (in pool order)."""
        await self.estimates.refresh(conn)
        plans = []
        for pool in self.pools:
            provider = self._providers[pool.provider]
            workers = await live_workers(conn, pool.queues)
            await self._reconcile(conn, pool, provider)
            inputs = await self._inputs(conn, pool, workers)
            plan = formula.plan(pool, inputs)
            await self._record(conn, pool, inputs, plan)
            if plan.action == "start":
                for _ in range(plan.count):
                    await self._launch(conn, pool, provider)
            elif plan.action == "drain":
                await self._drain(conn, plan.drain_ids)
            plans.append(plan)
        return plans

    # -- the burst workers' states -----------------------------------------------------------

    async def _reconcile(self, conn: db.Connection, pool: Pool, provider: Provider) -> None:
        """Moves each live burst worker of ``pool`` on by what its worker row and the provider say."""
        rows = await conn.fetch(
            """
            SELECT b.burst_worker_id::text AS id, b.state, b.provider_ref,
                   extract(epoch FROM now() - b.requested_at)::float8 AS age,
                   extract(epoch FROM now() - b.draining_at)::float8 AS draining_for,
                   w.worker_id, w.status AS worker_status, coalesce(h.n, 0) AS running_jobs
            FROM burst_workers b
            LEFT JOIN LATERAL (  -- its ordinary lanes' row, not its scheduler consumer's (ADR 0073)
                SELECT worker_id, status FROM workers
                WHERE burst_worker_id = b.burst_worker_id AND queue NOT LIKE 'sched.%'
                ORDER BY started_at DESC LIMIT 1
            ) w ON true
            LEFT JOIN LATERAL (  -- the jobs of both: a worker running scheduled work is not idle
                SELECT count(*) AS n FROM processing_jobs
                WHERE claimed_by IN (w.worker_id, w.worker_id || '/sched')
                  AND status IN ('claimed', 'processing', 'cancel_requested')
            ) h ON true
            WHERE b.pool = $1 AND b.state NOT IN ('terminated', 'failed')
            """,
            pool.name,
        )
        if not rows:
            return
        instances: dict[str, Instance] = {i.burst_worker_id: i for i in await provider.list(pool)}
        for row in rows:
            await self._advance(conn, pool, provider, row, instances.get(row["id"]))

    async def _advance(
        self,
        conn: db.Connection,
        pool: Pool,
        provider: Provider,
        row: asyncpg.Record,
        inst: Instance | None,
    ) -> None:
        bid, state, worker = row["id"], row["state"], row["worker_status"]
        ref = row["provider_ref"] or (inst.provider_ref if inst is not None else None)
        gone = inst is None or inst.state == "stopped"
        if state in formula.BOOTING_STATES:
            if worker in ("running", "draining"):
                await self._set(
                    conn, bid, "registered", registered_at=True, provider_ref=ref, last_busy_at=True
                )
            elif row["age"] > pool.boot_grace or (gone and state == "booting"):
                why = (
                    "exited before it registered" if gone else f"not registered within {pool.boot_grace:g} s"
                )
                await self._end(conn, provider, bid, ref, "failed", why)
            elif ref and not row["provider_ref"]:
                await self._set(conn, bid, "booting", provider_ref=ref, launched_at=True)
            return
        if worker in ("stopped", "dead", None) or gone:
            if state == "draining":
                why = "its worker stopped"
            elif gone and inst is not None:
                why = f"lost: {inst.detail or 'stopped'} (worker {worker or 'missing'})"
            else:
                why = f"lost: worker {worker or 'missing'}"
            await self._end(conn, provider, bid, ref, "terminated", why)
        elif state == "draining" and (row["draining_for"] or 0) > self._timing.drain_timeout:
            await self._end(conn, provider, bid, ref, "terminated", "drain timed out")
        elif state == "registered" and worker == "draining":
            await self._set(conn, bid, "draining", draining_at=True)  # it drains on its own (SIGTERM)
        else:
            await self._note_busy(conn, bid, row["worker_id"], row["running_jobs"])

    async def _note_busy(self, conn: db.Connection, bid: str, worker_id: str, running_jobs: int) -> None:
        """``last_busy_at``: now while the worker holds a job, else the end of its latest attempt
        (a worker that ran a hundred short jobs between two cycles was busy, not idle)."""
        await conn.execute(
            """
            UPDATE burst_workers b SET last_busy_at = CASE WHEN $3 THEN now() ELSE greatest(
                b.last_busy_at,
                (SELECT max(a.finished_at) FROM job_attempts a
                 WHERE a.status = 'completed' AND a.finished_at > coalesce(b.last_busy_at, b.requested_at)
                   AND a.worker_id = $2)) END
            WHERE burst_worker_id = $1
            """,
            bid,
            worker_id,
            running_jobs > 0,
        )

    async def _set(self, conn: db.Connection, bid: str, state: str, **columns: Any) -> None:
        sets = ["state = $2"]
        args: list[Any] = [bid, state]
        for name, value in columns.items():
            if value is True:
                sets.append(f"{name} = coalesce({name}, now())")
            else:
                args.append(value)
                sets.append(f"{name} = ${len(args)}")
        await conn.execute(f"UPDATE burst_workers SET {', '.join(sets)} WHERE burst_worker_id = $1", *args)

    async def _end(
        self, conn: db.Connection, provider: Provider, bid: str, ref: str | None, state: str, why: str
    ) -> None:
        if ref:
            await provider.terminate(ref)
        await conn.execute(
            "UPDATE burst_workers SET state = $2, terminated_at = now(), reason = $3 WHERE burst_worker_id = $1",
            bid,
            state,
            why,
        )
        log.info("burst worker %s %s: %s", bid, state, why)

    # -- the decision ----------------------------------------------------------------------

    async def _inputs(self, conn: db.Connection, pool: Pool, workers: list[LiveWorker]) -> formula.Inputs:
        demand = await queue_demand(
            conn,
            pool.queues,
            self.estimates,
            default_job_seconds=pool.default_job_seconds,
            arrival_window_seconds=self._timing.arrival_window,
        )
        rows = await conn.fetch(
            """
            SELECT burst_worker_id::text AS id, state, cost_per_hour::float8 AS cost,
                   extract(epoch FROM now() - requested_at)::float8 AS age,
                   extract(epoch FROM now() - coalesce(last_busy_at, registered_at, requested_at))::float8 AS idle
            FROM burst_workers WHERE pool = $1 AND state NOT IN ('terminated', 'failed')
            """,
            pool.name,
        )
        by_burst = {w.burst_worker_id: w for w in workers if w.burst_worker_id}
        burst = tuple(
            formula.BurstWorker(
                r["id"],
                r["state"],
                r["age"],
                by_burst[r["id"]].running_jobs if r["id"] in by_burst else 0,
                r["idle"],
            )
            for r in rows
        )
        stale = [
            f"{w.worker_id} heartbeat {w.heartbeat_age_seconds:.0f} s old"
            for w in workers
            if w.status == "running" and w.heartbeat_age_seconds > self._timing.stale
        ]
        stale += [
            f"burst worker {b.burst_worker_id} has no live worker row"
            for b in burst
            if b.state == "registered" and b.burst_worker_id not in by_burst
        ]
        return formula.Inputs(
            demand=demand,
            burst=burst,
            standing_slots=sum(
                w.slots for w in workers if w.burst_worker_id is None and w.status == "running"
            ),
            stale="; ".join(stale[:3]),
            spend_per_hour=sum(r["cost"] for r in rows),
        )

    async def _record(
        self, conn: db.Connection, pool: Pool, inputs: formula.Inputs, plan: formula.Plan
    ) -> None:
        recorded = {
            **dataclasses.asdict(inputs),
            "slots_needed": round(plan.slots_needed, 4),
            "expected_seconds": {op: round(s, 4) for op, s in self.estimates.seconds.items()},
            "expected_seconds_per_mb": {
                op: round(s, 4) for op, s in self.estimates.per_mb.items() if op in self.estimates.by_size
            },
            "pool": pool.model_dump(mode="json"),
            "drain": list(plan.drain_ids),
        }
        await conn.execute(
            """
            INSERT INTO scaling_decisions (pool, leader, inputs, target, action, count, reason)
            VALUES ($1, $2, $3, $4, $5, $6, $7)
            """,
            pool.name,
            self.holder,
            recorded,
            plan.target,
            plan.action,
            plan.count,
            plan.reason,
        )
        metrics.SCHEDULER_DECISIONS.labels(pool.name, plan.action).inc()
        if plan.action != "hold":
            log.info("pool %s: %s", pool.name, plan.reason)

    # -- acting ----------------------------------------------------------------------------

    async def _launch(self, conn: db.Connection, pool: Pool, provider: Provider) -> None:
        bid = str(uuid.uuid4())
        await conn.execute(
            """
            INSERT INTO burst_workers (burst_worker_id, pool, provider, capacity_type, state, slots, cost_per_hour, leader)
            VALUES ($1, $2, $3, $4, 'requested', $5, $6, $7)
            """,
            bid,
            pool.name,
            provider.name,
            pool.capacity_type,
            pool.slots_per_worker,
            pool.cost_per_hour,
            self.holder,
        )
        try:
            ref = await provider.launch(pool, bid)
        except Exception as exc:
            log.exception("launching a burst worker of pool %s failed", pool.name)
            await conn.execute(
                "UPDATE burst_workers SET state = 'failed', terminated_at = now(), reason = $2 WHERE burst_worker_id = $1",
                bid,
                f"launch failed: {type(exc).__name__}: {exc}"[:500],
            )
            return
        await self._set(conn, bid, "booting", provider_ref=ref, launched_at=True)

    async def _drain(self, conn: db.Connection, burst_ids: Sequence[str]) -> None:
        """The scheduler's side of the drain handshake: the worker rows marked ``draining``
        (a heartbeat never undoes it), the burst workers too."""
        async with conn.transaction():
            await conn.execute(
                "UPDATE workers SET status = 'draining' WHERE burst_worker_id = ANY($1::uuid[]) AND status = 'running'",
                list(burst_ids),
            )
            await conn.execute(
                "UPDATE burst_workers SET state = 'draining', draining_at = now() WHERE burst_worker_id = ANY($1::uuid[])",
                list(burst_ids),
            )


def burst_cost(requested_at: dt.datetime, terminated_at: dt.datetime | None, cost_per_hour: float) -> float:
    """What a burst worker cost (per-second billing): its ``cost_per_hour`` × the hours from its
    request to its termination (to now while it lives)."""
    end = terminated_at or dt.datetime.now(dt.UTC)
    return cost_per_hour * max(0.0, (end - requested_at).total_seconds()) / 3600.0
