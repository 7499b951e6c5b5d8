"""Delayed jobs (issue 25 item 1, ADR 0071) in hypermedia.jobs.lifecycle against a real Postgres:
created ``scheduled`` without an outbox row, queued with one when due, exactly once across
pollers, cancellable while they wait."""

from __future__ import annotations

import asyncio
import datetime
import uuid

import asyncpg

from hypermedia.jobs import lifecycle
from tests.integration.conftest import Seeder, Tenant

PREFIX = "TDELAY"


def _new_job(tenant: Tenant, not_before: datetime.datetime | None) -> lifecycle.NewJob:
    return lifecycle.NewJob(
        job_id=str(uuid.uuid4()),
        account_id=str(tenant.account_id),
        object_id=str(tenant.object_id),
        request_id=str(uuid.uuid4()),
        operation="thumbnail",
        profile_version=1,
        queue="images",
        params={},
        priority=5,
        max_attempts=3,
        estimated_credits=1200,
        webhook_url=None,
        idempotency_key=None,
        not_before=not_before,
    )


async def _create(pool: asyncpg.Pool, jobs: list[lifecycle.NewJob]) -> None:
    async with pool.acquire() as conn, conn.transaction():
        await lifecycle.create_queued(conn, PREFIX, jobs)


async def _row(pool: asyncpg.Pool, job_id: str) -> asyncpg.Record:
    row = await pool.fetchrow(
        "SELECT status, not_before, queued_at FROM processing_jobs WHERE job_id = $1", uuid.UUID(job_id)
    )
    assert row is not None
    return row


async def test_a_delayed_job_waits_scheduled_without_a_message_then_is_queued_with_one(
    fresh_pool: asyncpg.Pool, seed: Seeder
) -> None:
    tenant = await seed.tenant()
    now = await fresh_pool.fetchval("SELECT now()")
    later = _new_job(tenant, now + datetime.timedelta(hours=1))
    soon = _new_job(tenant, now + datetime.timedelta(seconds=0.5))
    at_once = _new_job(tenant, None)
    await _create(fresh_pool, [later, soon, at_once])

    assert (await _row(fresh_pool, at_once.job_id))["status"] == "queued"
    assert len(await seed.outbox_rows(uuid.UUID(at_once.job_id))) == 1
    for job in (later, soon):
        row = await _row(fresh_pool, job.job_id)
        assert (row["status"], row["queued_at"]) == ("scheduled", None)
        assert row["not_before"] == job.not_before
        assert await seed.outbox_rows(uuid.UUID(job.job_id)) == []
    wait = await lifecycle.next_scheduled(fresh_pool)
    assert wait is not None and datetime.timedelta(0) < wait <= datetime.timedelta(seconds=0.5)

    assert await lifecycle.promote_scheduled(fresh_pool, PREFIX, 100) == 0  # nothing due yet
    await asyncio.sleep(0.6)
    assert await lifecycle.promote_scheduled(fresh_pool, PREFIX, 100) == 1

    row = await _row(fresh_pool, soon.job_id)
    assert row["status"] == "queued" and row["queued_at"] >= soon.not_before
    [outbox] = await seed.outbox_rows(uuid.UUID(soon.job_id))
    assert outbox["subject"] == "tdelay.jobs.images.p5"
    assert (await _row(fresh_pool, later.job_id))["status"] == "scheduled"
    events = await fresh_pool.fetch(
        "SELECT status FROM job_events WHERE job_id = $1 AND kind = 'status' ORDER BY event_id",
        uuid.UUID(soon.job_id),
    )
    assert [e["status"] for e in events] == ["scheduled", "queued"]
    assert await lifecycle.promote_scheduled(fresh_pool, PREFIX, 100) == 0


async def test_pollers_racing_queue_each_due_job_exactly_once(fresh_pool: asyncpg.Pool, seed: Seeder) -> None:
    tenant = await seed.tenant()
    past = await fresh_pool.fetchval("SELECT now() - interval '1 second'")
    jobs = [_new_job(tenant, past) for _ in range(60)]
    await _create(fresh_pool, jobs)

    promoted = await asyncio.gather(*(lifecycle.promote_scheduled(fresh_pool, PREFIX, 7) for _ in range(12)))
    promoted_more = await lifecycle.promote_scheduled(fresh_pool, PREFIX, 100)

    assert sum(promoted) + promoted_more == 60
    rows = await fresh_pool.fetch(
        "SELECT job_id, count(*) AS n FROM outbox WHERE job_id = ANY($1::uuid[]) GROUP BY job_id",
        [j.job_id for j in jobs],
    )
    assert len(rows) == 60 and {r["n"] for r in rows} == {1}
    assert await lifecycle.next_scheduled(fresh_pool) is None


async def test_a_scheduled_job_is_cancelled_at_once_and_never_queued(
    fresh_pool: asyncpg.Pool, seed: Seeder
) -> None:
    tenant = await seed.tenant()
    now = await fresh_pool.fetchval("SELECT now()")
    cancelled, waiting = (
        _new_job(tenant, now + datetime.timedelta(seconds=0.3)),
        _new_job(tenant, now + datetime.timedelta(seconds=0.3)),
    )
    await _create(fresh_pool, [cancelled, waiting])

    assert await lifecycle.request_cancel(fresh_pool, cancelled.job_id, str(tenant.account_id)) == "cancelled"
    assert await lifecycle.cancel_if_waiting(fresh_pool, waiting.job_id, str(tenant.account_id))
    await asyncio.sleep(0.4)

    assert await lifecycle.promote_scheduled(fresh_pool, PREFIX, 100) == 0
    for job in (cancelled, waiting):
        assert (await _row(fresh_pool, job.job_id))["status"] == "cancelled"
        assert await seed.outbox_rows(uuid.UUID(job.job_id)) == []
