"""Retention (issue 24 item 2, hypermedia/jobs/retention.py) on a real Postgres: rows past their
retention are deleted, oldest first and a batch at a time; recent rows, pending webhook
deliveries and running workers stay; a retention of 0 keeps everything."""

from __future__ import annotations

import json
import uuid

import asyncpg

from hypermedia.jobs.retention import DAY, Pruned, Retention
from tests.integration.conftest import Seeder


async def _event(pool: asyncpg.Pool, job_id: uuid.UUID, days_ago: float) -> None:
    await pool.execute(
        "INSERT INTO job_events (job_id, kind, status, created_at) "
        "VALUES ($1, 'status', 'queued', now() - make_interval(secs => $2))",
        job_id,
        days_ago * DAY,
    )


async def _metrics(pool: asyncpg.Pool, worker_id: str, days_ago: float) -> None:
    await pool.execute(
        "INSERT INTO worker_metrics (worker_id, recorded_at, cpu_percent, memory_mb, memory_available_mb, "
        "disk_free_mb, slots_busy, jobs_completed, jobs_failed) "
        "VALUES ($1, now() - make_interval(secs => $2), 1, 100, 1000, 1000, 0, 0, 0)",
        worker_id,
        days_ago * DAY,
    )


async def _delivery(
    pool: asyncpg.Pool, job_id: uuid.UUID, account_id: uuid.UUID, status: str, days_ago: float
) -> None:
    await pool.execute(
        "INSERT INTO webhook_deliveries (delivery_id, job_id, account_id, url, event_type, payload, status, created_at) "
        "VALUES ($1, $2, $3, 'https://example.com/hook', $4, $5, $6, now() - make_interval(secs => $7))",
        uuid.uuid4(),
        job_id,
        account_id,
        f"job.{uuid.uuid4().hex[:8]}",
        json.dumps({}),
        status,
        days_ago * DAY,
    )


async def _count(pool: asyncpg.Pool, table: str) -> int:
    return int(await pool.fetchval(f"SELECT count(*) FROM {table}"))


async def test_rows_past_their_retention_are_pruned_oldest_first_in_batches(
    fresh_pool: asyncpg.Pool, seed: Seeder
) -> None:
    tenant = await seed.tenant()
    job_id = await seed.job(tenant, status="completed", attempt_count=1)
    await fresh_pool.execute("DELETE FROM job_events WHERE job_id = $1", job_id)  # the seeder's own
    for days_ago in (45.0, 40.0, 35.0, 1.0):
        await _event(fresh_pool, job_id, days_ago)
    await seed.worker("w-running", heartbeat_ago=1)
    await seed.worker("w-gone", heartbeat_ago=10 * DAY, status="stopped")
    await seed.worker("w-dead-lately", heartbeat_ago=DAY, status="dead")
    for days_ago in (9.0, 8.0, 0.1):
        await _metrics(fresh_pool, "w-running", days_ago)
    await _metrics(fresh_pool, "w-gone", 10)
    for status, days_ago in (("delivered", 40), ("failed", 31), ("pending", 60), ("delivered", 2)):
        await _delivery(fresh_pool, job_id, tenant.account_id, status, days_ago)

    first = await Retention(fresh_pool, batch=2, max_batches=1).run_once()
    assert first == Pruned(job_events=2, worker_metrics=2, workers=1, webhook_deliveries=2)
    # The oldest events went first: 45 and 40 days; 35 is left for the next run.
    ages = await fresh_pool.fetch(
        "SELECT round(extract(epoch FROM now() - created_at) / 86400) AS days FROM job_events ORDER BY event_id"
    )
    assert [int(r["days"]) for r in ages] == [35, 1]
    second = await Retention(fresh_pool, batch=2, max_batches=1).run_once()
    # w-gone's metrics went with its row (ON DELETE CASCADE): one sample of w-running left to prune.
    assert second == Pruned(job_events=1, worker_metrics=1)
    assert await Retention(fresh_pool).run_once() == Pruned()
    # Without a bound on batches, one run takes a whole backlog, two rows at a time.
    for days_ago in (50.0, 49.0, 48.0, 47.0, 46.0):
        await _event(fresh_pool, job_id, days_ago)
    assert await Retention(fresh_pool, batch=2).run_once() == Pruned(job_events=5)
    assert await _count(fresh_pool, "job_events") == 1
    assert {r["worker_id"] for r in await fresh_pool.fetch("SELECT worker_id FROM workers")} == {
        "w-running",
        "w-dead-lately",
    }
    assert await _count(fresh_pool, "worker_metrics") == 1
    statuses = await fresh_pool.fetch("SELECT status FROM webhook_deliveries ORDER BY created_at")
    assert [r["status"] for r in statuses] == ["pending", "delivered"]


async def test_a_retention_of_zero_keeps_everything(fresh_pool: asyncpg.Pool, seed: Seeder) -> None:
    tenant = await seed.tenant()
    job_id = await seed.job(tenant, status="completed", attempt_count=1)
    await fresh_pool.execute("DELETE FROM job_events WHERE job_id = $1", job_id)
    await _event(fresh_pool, job_id, 400)
    kept = Retention(fresh_pool, job_events_days=0, worker_metrics_days=0, webhook_deliveries_days=0)
    assert await kept.run_once() == Pruned()
    assert await _count(fresh_pool, "job_events") == 1
