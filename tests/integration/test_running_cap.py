"""An account's cap of running jobs per queue (issue 21 item 4, ADR 0060) against real Postgres:
the claim takes at most the room the cap leaves, the most urgent first, even when several workers
claim the account's jobs at once; the jobs it holds stay queued, and neither the stale republish,
the bulk brake nor the scheduler's demand counts them as the platform's backlog."""

from __future__ import annotations

import asyncio
import random
import uuid
from typing import Any

import asyncpg
import pytest

from hypermedia.jobs import lifecycle, quotas
from hypermedia.jobs.backfill import dispatch
from hypermedia.jobs.lifecycle import caps
from services.scheduler.demand import WorkEstimates, queue_demand
from tests.integration.conftest import Broker, Seeder, Tenant


async def _capped(pool: asyncpg.Pool, seed: Seeder, cap: int | None) -> Tenant:
    tenant = await seed.tenant()
    async with pool.acquire() as conn:
        await quotas.set_quota(conn, tenant.account_id, max_running_jobs=cap)
    return tenant


async def _running(pool: asyncpg.Pool, tenant: Tenant, queue: str = "images") -> int:
    return int(
        await pool.fetchval(
            "SELECT count(*) FROM processing_jobs WHERE account_id = $1 AND queue = $2 "
            "AND status IN ('claimed', 'processing', 'cancel_requested')",
            tenant.account_id,
            queue,
        )
    )


async def test_a_claim_takes_the_room_the_cap_leaves_most_urgent_first_and_holds_the_rest(
    fresh_pool: asyncpg.Pool, seed: Seeder, broker: Broker
) -> None:
    capped = await _capped(fresh_pool, seed, 2)
    free = await seed.tenant()
    by_priority = {p: str(await seed.job(capped, priority=p)) for p in (9, 5, 8, 3, 6)}
    others = [str(await seed.job(free)) for _ in range(3)]

    batch = [*by_priority.values(), *others]
    claimed, held = await lifecycle.claim_held(fresh_pool, batch, "w-1")
    assert {job.job_id for job in claimed} == {by_priority[3], by_priority[5], *others}
    assert held == {by_priority[p] for p in (6, 8, 9)}
    for job_id in held:
        assert (await seed.job_row(uuid.UUID(job_id)))["status"] == "queued"

    # At the cap, nothing more of the account starts; claim_many leaves the held ones out.
    assert await lifecycle.claim_many(fresh_pool, sorted(held), "w-2") == []
    assert await _running(fresh_pool, capped) == 2

    # One running job ends: room for one, the most urgent of those waiting.
    first = next(job for job in claimed if job.job_id == by_priority[3])
    status = await lifecycle.fail(
        fresh_pool, first, "w-1", "ENGINE_FAILED", "bad file", retryable=False, prefix=broker.prefix
    )
    assert status == "failed"
    claimed, held = await lifecycle.claim_held(fresh_pool, sorted(held), "w-2")
    assert [job.job_id for job in claimed] == [by_priority[6]]
    assert held == {by_priority[8], by_priority[9]}

    # Without the cap (0 removes it; the other limits stay) every waiting job starts.
    async with fresh_pool.acquire() as conn:
        await quotas.set_quota(conn, capped.account_id, max_queued_jobs=50)
        row = await quotas.set_quota(conn, capped.account_id, max_running_jobs=0)
    assert (row["max_running_jobs"], row["max_queued_jobs"]) == (None, 50)
    claimed, held = await lifecycle.claim_held(fresh_pool, sorted(held), "w-2")
    assert len(claimed) == 2 and held == set()


async def test_workers_claiming_at_once_never_run_more_than_the_cap(
    fresh_pool: asyncpg.Pool, seed: Seeder, broker: Broker
) -> None:
    capped = await _capped(fresh_pool, seed, 3)
    queued = [str(await seed.job(capped)) for _ in range(60)]

    async def worker(n: int) -> list[tuple[str, lifecycle.ClaimedJob]]:
        claimed, _held = await lifecycle.claim_held(fresh_pool, random.sample(queued, 12), f"w-{n}")
        return [(f"w-{n}", job) for job in claimed]

    for _round in range(6):  # each: 8 claims at once (fresh_pool's connections), then the 3 end
        claimed = [job for jobs in await asyncio.gather(*(worker(n) for n in range(8))) for job in jobs]
        assert len(claimed) == 3, "exactly the cap's room, however the claims interleave"
        assert await _running(fresh_pool, capped) == 3
        for worker_id, job in claimed:
            queued.remove(job.job_id)
            await lifecycle.fail(
                fresh_pool, job, worker_id, "ENGINE_FAILED", "x", retryable=False, prefix=broker.prefix
            )


async def test_the_cap_counts_each_queue_apart(fresh_pool: asyncpg.Pool, seed: Seeder) -> None:
    capped = await _capped(fresh_pool, seed, 1)
    running = await seed.job(capped, status="processing", claimed_by="w-1", attempt_count=1, lease_in=60)
    image = str(await seed.job(capped))
    document = await seed.job(capped)
    await fresh_pool.execute("UPDATE processing_jobs SET queue = 'documents' WHERE job_id = $1", document)

    claimed, held = await lifecycle.claim_held(fresh_pool, [image, str(document)], "w-2")
    assert [job.job_id for job in claimed] == [str(document)]
    assert held == {image}
    await fresh_pool.execute(
        "UPDATE processing_jobs SET status = 'cancel_requested' WHERE job_id = $1", running
    )
    _claimed, held = await lifecycle.claim_held(fresh_pool, [image], "w-2")
    assert held == {image}, "a job whose cancellation is requested still holds its slot"


async def test_jobs_held_by_the_cap_are_not_republished_braked_on_or_counted_as_demand(
    fresh_pool: asyncpg.Pool, seed: Seeder, broker: Broker
) -> None:
    capped = await _capped(fresh_pool, seed, 2)  # one running: room for one more
    await seed.job(capped, status="processing", claimed_by="w-1", attempt_count=1, lease_in=60)
    waiting = [await seed.job(capped, priority=p, queued_ago=120) for p in (4, 2, 6)]

    async def ready() -> int:
        async with fresh_pool.acquire() as conn:
            [images] = await queue_demand(
                conn, ["images"], WorkEstimates(), default_job_seconds=1.0, arrival_window_seconds=60
            )
        return images.ready

    # The most urgent waiting job fits the room: it is backlog (a claim would take it); the
    # other two are held.
    assert await ready() == 1
    assert await lifecycle.republish_stale(fresh_pool, broker.prefix, 100, 60) == 1
    assert [len(await seed.outbox_rows(job)) for job in waiting] == [0, 1, 0]
    await fresh_pool.execute("UPDATE processing_jobs SET queued_at = now() - interval '120 s'")
    assert await dispatch.brake(fresh_pool, {"documents": 5.0}) is None

    # At the cap, none of them is.
    await seed.job(capped, status="processing", claimed_by="w-2", attempt_count=1, lease_in=60)
    assert await ready() == 0
    assert await dispatch.brake(fresh_pool, {"images": 5.0}) is None
    assert await lifecycle.republish_stale(fresh_pool, broker.prefix, 100, 60) == 0

    # The same account without its cap: every one is the platform's backlog again.
    async with fresh_pool.acquire() as conn:
        await quotas.set_quota(conn, capped.account_id, default=True)
    reason = await dispatch.brake(fresh_pool, {"images": 5.0})
    assert reason is not None and reason.startswith("BRAKE: the images queue's oldest job has waited")
    assert await ready() == 3
    # the two held before (the third's row from the first republish is still unpublished)
    assert await lifecycle.republish_stale(fresh_pool, broker.prefix, 100, 60) == 2
    assert [len(await seed.outbox_rows(job)) for job in waiting] == [1, 1, 1]


async def test_a_job_turning_queued_during_a_claim_is_not_taken_past_the_cap(
    fresh_pool: asyncpg.Pool, seed: Seeder, broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job in ``retry_wait`` (or handed back) in the batch when the cap is counted, ``queued``
    by the time the claim's UPDATE runs: the claim must not take it (it was not counted)."""
    capped = await _capped(fresh_pool, seed, 1)
    await seed.job(capped, status="processing", claimed_by="w-1", attempt_count=1, lease_in=60)
    retrying = await seed.job(capped, status="retry_wait", attempt_count=1, next_attempt_in=-1)
    counted = caps.over_cap

    async def promote_meanwhile(conn: Any, job_ids: Any, capped_pairs: Any) -> caps.Room:
        room = await counted(conn, job_ids, capped_pairs)
        assert await lifecycle.promote_retries(fresh_pool, broker.prefix, 10) == 1  # commits now
        return room

    monkeypatch.setattr(caps, "over_cap", promote_meanwhile)
    claimed, held = await lifecycle.claim_held(fresh_pool, [str(retrying)], "w-2")
    assert claimed == [] and held == set()  # its old message is a duplicate: promote wrote a new one
    assert (await seed.job_row(retrying))["status"] == "queued"
    assert await _running(fresh_pool, capped) == 1

    monkeypatch.setattr(caps, "over_cap", counted)
    claimed, held = await lifecycle.claim_held(fresh_pool, [str(retrying)], "w-2")
    assert claimed == [] and held == {str(retrying)}, "its new message is held, as it should be"


async def test_each_lane_of_the_bulk_queue_is_capped_apart(fresh_pool: asyncpg.Pool, seed: Seeder) -> None:
    capped = await _capped(fresh_pool, seed, 1)
    lanes = {}
    for lane in ("bulk.images", "bulk.images", "bulk.media"):
        job = await seed.job(capped, priority=8)
        await fresh_pool.execute("UPDATE processing_jobs SET queue = $2 WHERE job_id = $1", job, lane)
        lanes.setdefault(lane, []).append(str(job))
    claimed, held = await lifecycle.claim_held(fresh_pool, [*lanes["bulk.images"], *lanes["bulk.media"]], "w")
    assert {job.queue for job in claimed} == {"bulk.images", "bulk.media"}
    assert held == {lanes["bulk.images"][1]}
