"""Fairness within a band (ADR 0059) against real Postgres and JetStream: an account's jobs beyond
its window per (queue, priority) wait in the outbox, so another account's job published after a
flood is fetched behind at most the window; claims release the deferred rows one for one, and the
relay's sweep releases what a cancelled job left room for."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg

from hypermedia.jobs import lifecycle, queues
from hypermedia.jobs.outbox import OutboxRelay
from tests.integration.conftest import Broker, Seeder, Tenant

W = lifecycle.FAIR_WINDOW


async def _queued(pool: asyncpg.Pool, seed: Seeder, broker: Broker, tenant: Tenant, count: int) -> list[str]:
    """``count`` queued jobs of ``tenant`` at priority 5, each with its outbox row, one after the
    other as job creation writes them."""
    jobs = []
    for _ in range(count):
        jobs.append(str(await seed.job(tenant)))
        async with pool.acquire() as conn:
            await lifecycle.enqueue_outbox(conn, broker.prefix, jobs[-1], "images", 5)
    return jobs


async def _deferred(pool: asyncpg.Pool, jobs: list[str]) -> int:
    return int(
        await pool.fetchval(
            "SELECT count(*) FROM outbox WHERE job_id = ANY($1::uuid[]) AND deferred AND published_at IS NULL",
            jobs,
        )
    )


async def _fetch_all(broker: Broker) -> list[str]:
    """Every job id waiting on the images stream, in the order a worker gets them."""
    fetcher = queues.PriorityFetcher(broker.nc, broker.prefix, "images")
    await fetcher.start()
    order = []
    try:
        while (msg := await fetcher.sweep()) is not None:
            order.append(queues.JobMessage.decode(msg.data).job_id)
            await msg.ack_sync()
    finally:
        await fetcher.stop()
    return order


async def test_a_flood_waits_in_the_outbox_beyond_its_window_and_another_account_is_not_behind_it(
    fresh_pool: asyncpg.Pool, seed: Seeder, broker: Broker
) -> None:
    flood, other = await seed.tenant(), await seed.tenant()
    flooded = await _queued(fresh_pool, seed, broker, flood, W + 40)
    [single] = await _queued(fresh_pool, seed, broker, other, 1)
    assert await _deferred(fresh_pool, flooded) == 40
    assert await _deferred(fresh_pool, [single]) == 0

    relay = OutboxRelay(fresh_pool, broker.nc, broker.js)
    while (await relay.run_once()).published:
        pass
    order = await _fetch_all(broker)
    assert order == [*flooded[:W], single], "the window, in order, then the other account's job"

    # Claims release one deferred row each, oldest first; the relay publishes them.
    assert len(await lifecycle.claim_many(fresh_pool, flooded[:5], "w-a")) == 5
    assert await _deferred(fresh_pool, flooded) == 35
    assert (await relay.run_once()).published == 5
    assert await _fetch_all(broker) == flooded[W : W + 5]


async def test_the_sweep_releases_what_a_cancelled_job_of_the_window_left(
    fresh_pool: asyncpg.Pool, seed: Seeder, broker: Broker
) -> None:
    tenant = await seed.tenant()
    jobs = await _queued(fresh_pool, seed, broker, tenant, W + 3)
    await fresh_pool.execute(
        "UPDATE processing_jobs SET status = 'cancelled' WHERE job_id = ANY($1::uuid[])", jobs[:2]
    )
    assert await lifecycle.sweep_deferred(fresh_pool) == 2
    assert await _deferred(fresh_pool, jobs) == 1
    assert await lifecycle.sweep_deferred(fresh_pool) == 0  # the window is full again


async def test_a_claim_that_releases_rows_wakes_a_listening_relay(
    fresh_pool: asyncpg.Pool, seed: Seeder, broker: Broker
) -> None:
    tenant = await seed.tenant()
    jobs = await _queued(fresh_pool, seed, broker, tenant, W + 1)
    relay = OutboxRelay(fresh_pool, broker.nc, broker.js)
    stop = asyncio.Event()
    running = asyncio.create_task(relay.run(stop, poll_seconds=30))
    try:
        await asyncio.sleep(0.5)  # the first run published the window and now waits 30 s
        assert await broker.stream_messages("images") == W
        await lifecycle.claim_many(fresh_pool, [jobs[0]], "w-a")
        for _ in range(50):
            if await broker.stream_messages("images") == W + 1:
                break
            await asyncio.sleep(0.05)
        assert await broker.stream_messages("images") == W + 1, "published on the notify, not the poll"
    finally:
        stop.set()
        await running


async def test_a_batch_of_retries_fills_the_window_in_order_and_defers_the_rest(
    fresh_pool: asyncpg.Pool, seed: Seeder, broker: Broker
) -> None:
    """Jobs that become queued together (promote_retries) before their rows are written: the
    first ones of the batch take the window, the rest wait, in the batch's order."""
    tenant = await seed.tenant()
    jobs = [str(await seed.job(tenant, status="retry_wait", next_attempt_in=-1)) for _ in range(W + 4)]
    assert await lifecycle.promote_retries(fresh_pool, broker.prefix, 1000) == W + 4
    rows = await fresh_pool.fetch("SELECT job_id::text, deferred FROM outbox ORDER BY outbox_id")
    assert [r["deferred"] for r in rows] == [False] * W + [True] * 4
    assert {r["job_id"] for r in rows} == set(jobs)


async def test_a_deferred_job_is_not_republished_as_stale(
    fresh_pool: asyncpg.Pool, seed: Seeder, broker: Broker
) -> None:
    tenant = await seed.tenant()
    jobs = await _queued(fresh_pool, seed, broker, tenant, W + 2)
    await fresh_pool.execute("UPDATE processing_jobs SET queued_at = now() - interval '1 hour'")
    await fresh_pool.execute("UPDATE outbox SET published_at = now() WHERE NOT deferred")
    republished = await lifecycle.republish_stale(fresh_pool, broker.prefix, 100, 60)
    assert republished == W  # the published ones; the 2 deferred have their row waiting
    rows = await fresh_pool.fetch("SELECT job_id FROM outbox WHERE job_id = ANY($1::uuid[])", jobs[W:])
    assert len(rows) == 2
    assert uuid.UUID(jobs[0])  # ids are job ids


async def test_a_relay_whose_listening_connection_dies_goes_on_publishing_and_listens_again(
    fresh_pool: asyncpg.Pool, seed: Seeder, broker: Broker
) -> None:
    """The chaos run's finding: after a Postgres restart the pool detaches the listening
    connection (its ``is_closed`` raises), which had ended the relay's loop for good."""
    tenant = await seed.tenant()
    relay = OutboxRelay(fresh_pool, broker.nc, broker.js)
    stop = asyncio.Event()
    running = asyncio.create_task(relay.run(stop, poll_seconds=0.2))

    async def listeners() -> list[int]:
        rows = await fresh_pool.fetch(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'LISTEN %hm_outbox%'"
        )
        return [r["pid"] for r in rows]

    try:
        for _ in range(50):
            if await listeners():
                break
            await asyncio.sleep(0.1)
        [pid] = await listeners()
        await fresh_pool.execute("SELECT pg_terminate_backend($1)", pid)
        await asyncio.sleep(0.5)
        await _queued(fresh_pool, seed, broker, tenant, 3)
        for _ in range(50):
            if await broker.stream_messages("images") == 3:
                break
            await asyncio.sleep(0.1)
        assert await broker.stream_messages("images") == 3, "the relay still publishes"
        assert not running.done()
        for _ in range(50):
            if (now := await listeners()) and now != [pid]:
                break
            await asyncio.sleep(0.1)
        assert now and now != [pid], "and listens again on a new connection"
    finally:
        stop.set()
        await running
