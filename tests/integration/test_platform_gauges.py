"""The reaper's platform gauges (issue 22 item 1, ADR 0061) read from a real Postgres at the
scrape: queue depth and oldest age per queue and band, jobs by active status, outbox backlog and
lag, pending webhooks, live workers; and the credits service's open holds. Each value is checked against rows seeded with
known ages; a scrape whose queries fail answers ``hypermedia_platform_gauges_up 0`` and nothing
else of the collector, without raising."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from hypermedia.core.metrics import ScrapeCollector
from hypermedia.jobs.gauges import PlatformCollector
from services.credits.gauges import HoldsCollector
from tests.integration.conftest import Seeder


async def _scrape(collector: ScrapeCollector) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of one scrape through a registry, as Prometheus reads it (the text format),
    taken from another thread as prometheus-client's HTTP server does."""
    registry = CollectorRegistry()
    registry.register(collector)
    text = await asyncio.to_thread(generate_latest, registry)
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text.decode())
        for sample in family.samples
    }


async def _outbox(pool: asyncpg.Pool, *, age: float, deferred: bool = False, published: bool = False) -> None:
    await pool.execute(
        """
        INSERT INTO outbox (subject, msg_id, payload, created_at, deferred, published_at)
        VALUES ('t.jobs.images.p5', $1, '{}', now() - make_interval(secs => $2::float8), $3,
                CASE WHEN $4 THEN now() END)
        """,
        str(uuid.uuid4()),
        age,
        deferred,
        published,
    )


async def test_each_gauge_is_what_the_seeded_rows_say(fresh_pool: asyncpg.Pool, seed: Seeder) -> None:
    tenant = await seed.tenant(balance=100_000)
    for age in (5.0, 90.0, 30.0):
        await seed.job(tenant, priority=3, queued_ago=age)
    await seed.job(tenant, priority=8, queued_ago=2.0)
    await seed.job(tenant, status="processing", claimed_by="w1", attempt_count=1, lease_in=60)
    await seed.job(tenant, status="retry_wait", attempt_count=1, next_attempt_in=60)
    await seed.job(tenant, status="completed")  # terminal: not counted
    await _outbox(fresh_pool, age=40.0)
    await _outbox(fresh_pool, age=10.0)
    await _outbox(fresh_pool, age=300.0, deferred=True)
    await _outbox(fresh_pool, age=900.0, published=True)
    held = await seed.job(tenant, status="processing", claimed_by="w1", attempt_count=1, lease_in=60)
    await fresh_pool.execute(
        "INSERT INTO credit_holds (job_id, account_id, amount, status) VALUES ($1, $2, 1234, 'held'), "
        "($3, $2, 999, 'committed')",
        held,
        tenant.account_id,
        uuid.uuid4(),
    )
    await seed.worker("w-live", heartbeat_ago=1)
    await seed.worker("w-draining", heartbeat_ago=1, status="draining")
    await seed.worker("w-silent", heartbeat_ago=600)

    got = await _scrape(PlatformCollector(fresh_pool, asyncio.get_running_loop(), dead_worker_seconds=60))

    assert got[("hypermedia_platform_gauges_up", ())] == 1
    assert got[("hypermedia_queue_depth", (("band", "3"), ("queue", "images")))] == 3
    assert got[("hypermedia_queue_depth", (("band", "8"), ("queue", "images")))] == 1
    assert 90 <= got[("hypermedia_queue_oldest_age_seconds", (("band", "3"), ("queue", "images")))] < 100
    assert 2 <= got[("hypermedia_queue_oldest_age_seconds", (("band", "8"), ("queue", "images")))] < 12
    jobs = {dict(labels)["status"]: v for (name, labels), v in got.items() if name == "hypermedia_jobs"}
    assert jobs == {"queued": 4, "processing": 2, "retry_wait": 1}
    assert got[("hypermedia_outbox_pending", (("state", "ready"),))] == 2
    assert got[("hypermedia_outbox_pending", (("state", "deferred"),))] == 1
    assert 40 <= got[("hypermedia_outbox_lag_seconds", ())] < 50  # the deferred row is not lag
    holds = await _scrape(HoldsCollector(fresh_pool, asyncio.get_running_loop()))
    assert holds[("hypermedia_credits_gauges_up", ())] == 1
    assert holds[("hypermedia_credit_holds_open", ())] == 1
    assert holds[("hypermedia_credits_held_millicredits", ())] == 1234
    assert got[("hypermedia_workers", (("queue", "images"), ("status", "running")))] == 1
    assert got[("hypermedia_workers", (("queue", "images"), ("status", "draining")))] == 1
    assert got[("hypermedia_webhook_deliveries_pending", ())] == 0


async def test_an_idle_platform_reads_zero_lag(fresh_pool: asyncpg.Pool) -> None:
    got = await _scrape(PlatformCollector(fresh_pool, asyncio.get_running_loop(), dead_worker_seconds=60))
    assert got[("hypermedia_outbox_lag_seconds", ())] == 0
    assert got[("hypermedia_outbox_pending", (("state", "ready"),))] == 0
    assert not [name for name, _ in got if name == "hypermedia_queue_depth"]


async def test_a_failed_scrape_says_down_and_raises_nothing(fresh_pool: asyncpg.Pool) -> None:
    collector = PlatformCollector(fresh_pool, asyncio.get_running_loop(), dead_worker_seconds=60)
    await fresh_pool.execute("ALTER TABLE outbox RENAME TO outbox_gone")  # the query fails
    got = await _scrape(collector)
    assert got[("hypermedia_platform_gauges_up", ())] == 0
    assert not [name for name, _ in got if name.startswith("hypermedia_queue")]


async def test_a_read_past_its_time_is_cancelled_and_gives_its_connection_back(
    fresh_pool: asyncpg.Pool,
) -> None:
    """Review finding: a read that timed out went on waiting, holding a connection of the service's
    own pool, and each scrape added one. Now it is cancelled, and a scrape while one still runs
    does not start another."""
    collector = PlatformCollector(fresh_pool, asyncio.get_running_loop(), dead_worker_seconds=60)
    collector.timeout_seconds = 0.5
    async with fresh_pool.acquire() as locker, locker.transaction():
        await locker.execute("LOCK TABLE burst_workers IN ACCESS EXCLUSIVE MODE")
        got = await _scrape(collector)
        assert got[("hypermedia_platform_gauges_up", ())] == 0

        async def waiting() -> int:
            return int(
                await locker.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
                )
            )

        for _ in range(50):  # the cancel reaches Postgres within a moment
            if await waiting() == 0:
                break
            await asyncio.sleep(0.05)
        assert await waiting() == 0
    got = await _scrape(collector)
    assert got[("hypermedia_platform_gauges_up", ())] == 1
    assert fresh_pool.get_size() - fresh_pool.get_idle_size() == 0  # every connection back
