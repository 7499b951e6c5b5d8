"""The job event hub's LISTEN connection: lost (as in a Postgres restart) and re-established."""

from __future__ import annotations

import asyncio
import time

import asyncpg

from hypermedia.jobs.events import JobEvent, JobEventHub
from tests.integration.conftest import Seeder, _with_database


async def test_watchers_are_notified_again_after_the_listen_connection_is_killed(
    fresh_pool: asyncpg.Pool, seed: Seeder, database_url: str
) -> None:
    name = await fresh_pool.fetchval("SELECT current_database()")
    hub = JobEventHub(fresh_pool, _with_database(database_url, name), keepalive_seconds=60)
    await hub.start()
    try:
        tenant = await seed.tenant()
        job_id = str(await seed.job(tenant))
        killed = await fresh_pool.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE datname = current_database() AND query LIKE 'LISTEN%'"
        )
        assert killed == 1
        deadline = time.monotonic() + 10
        while hub.reconnects < 1:
            assert time.monotonic() < deadline, "the hub did not reconnect within 10 s"
            await asyncio.sleep(0.05)

        received: asyncio.Queue[JobEvent | None] = asyncio.Queue()

        async def consume() -> None:
            async for event in hub.watch(job_id):
                await received.put(event)

        consumer = asyncio.create_task(consume())
        await asyncio.sleep(0.5)  # the events already there are read
        before = [received.get_nowait() for _ in range(received.qsize())]
        started = time.monotonic()
        await fresh_pool.execute("UPDATE processing_jobs SET status = 'cancelled' WHERE job_id = $1", job_id)
        event = await asyncio.wait_for(received.get(), 5)
        # Woken by the notification on the new connection, not by the 60 s keep-alive re-read.
        assert event is not None and event.status == "cancelled" and event.terminal
        assert time.monotonic() - started < 5
        assert all(e is not None and e.status != "cancelled" for e in before)
        await asyncio.wait_for(consumer, 5)  # the stream ends after the terminal event
    finally:
        await hub.stop()
