"""The scheduler on real Postgres (services/scheduler): one leader by advisory lock, taken over by
a standby within one try when the leader's session dies, and a dead leader's connection unable to
write; the demand it reads (ready jobs by band, due retries, running jobs, arrivals, the EWMA of
completed attempts); and the worker's side of the drain handshake (a heartbeat sees ``draining``
and never undoes it)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable

import asyncpg
import pytest

from hypermedia.infra.service import every
from hypermedia.worker import registry
from hypermedia.worker.settings import WorkerSettings
from services.scheduler.demand import EWMA_ALPHA, WorkEstimates, live_workers, queue_demand
from services.scheduler.leader import Leadership
from tests.integration.conftest import Seeder, _with_database


@pytest.fixture
async def dsn(fresh_pool: asyncpg.Pool, database_url: str) -> str:
    return _with_database(database_url, await fresh_pool.fetchval("SELECT current_database()"))


async def test_one_leader_a_standby_takes_over_and_the_dead_leader_cannot_write(
    dsn: str, fresh_pool: asyncpg.Pool
) -> None:
    first, second = Leadership(dsn, "host/1"), Leadership(dsn, "host/2")
    try:
        assert await first.hold()
        assert not await second.hold(), "a standby while the leader lives"
        assert await first.hold(), "the leader keeps it"
        dead = first.conn
        # The leader's process dies: Postgres ends its session (here: terminated from outside).
        await fresh_pool.execute("SELECT pg_terminate_backend($1)", dead.get_server_pid())
        assert await second.hold(), "the standby takes over at its next try"
        with pytest.raises((asyncpg.PostgresError, asyncpg.InterfaceError, OSError)):
            await dead.execute(
                "INSERT INTO scaling_decisions (pool, leader, inputs, target, action, reason) "
                "VALUES ('p', 'host/1', '{}', 0, 'hold', 'late')"
            )
        assert not await first.hold(), "the old leader comes back as a standby"
        assert await fresh_pool.fetchval("SELECT count(*) FROM scaling_decisions") == 0
    finally:
        await first.release()
        await second.release()
    standby = Leadership(dsn, "host/3")
    try:
        assert await standby.hold(), "released on a clean stop"
    finally:
        await standby.release()


async def test_a_preemption_announced_by_a_worker_wakes_the_leaders_cycle_at_once(
    dsn: str, fresh_pool: asyncpg.Pool
) -> None:
    """A spot worker's notice (registry.announce_preemption) marks its row draining and NOTIFYs;
    the leader's loop (``every`` with the lock's wake event) runs its next cycle at once, not an
    interval later; a standby is not woken (it does not LISTEN)."""
    settings = WorkerSettings(HM_WORKER_QUEUE="images", HM_WORKER_SLOTS=2)
    await registry.register(fresh_pool, "prod/imageworker/spot/b/g0/1", settings, "imageworker")
    leader, standby = Leadership(dsn, "host/1"), Leadership(dsn, "host/2")
    stop = asyncio.Event()
    cycles: list[float] = []
    loop = asyncio.get_running_loop()

    async def cycle() -> None:
        if await leader.hold():
            cycles.append(loop.time())

    try:
        assert await leader.hold() and not await standby.hold()
        running = asyncio.create_task(every(600, cycle, stop, wake=leader.wake))
        await wait_until(lambda: len(cycles) == 1)
        announced = loop.time()
        await registry.announce_preemption(fresh_pool, ["prod/imageworker/spot/b/g0/1"])
        await wait_until(lambda: len(cycles) == 2)
        assert cycles[1] - announced < 2, "the next cycle ran at once, not 600 s later"
        assert not standby.wake.is_set()
        status = await fresh_pool.fetchval(
            "SELECT status FROM workers WHERE worker_id = 'prod/imageworker/spot/b/g0/1'"
        )
        assert status == "draining", "counted out of the live capacity at once"
        stop.set()
        await asyncio.wait_for(running, 5)
    finally:
        stop.set()
        await leader.release()
        await standby.release()


async def wait_until(done: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not done():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def test_the_demand_of_a_queue_and_the_ewma_of_its_operations(
    fresh_pool: asyncpg.Pool, seed: Seeder
) -> None:
    tenant = await seed.tenant()
    for priority in (1, 2, 5, 5, 9):
        await seed.job(tenant, priority=priority, queued_ago=30)
    await seed.job(tenant, status="retry_wait", next_attempt_in=-1)  # due: ready
    await seed.job(tenant, status="retry_wait", next_attempt_in=600)  # not yet
    await seed.worker("w-burst", heartbeat_ago=2)
    burst_id = uuid.uuid4()
    await fresh_pool.execute("UPDATE workers SET burst_worker_id = $1 WHERE worker_id = 'w-burst'", burst_id)
    await seed.worker("w-standing", heartbeat_ago=200)
    running = [
        await seed.job(tenant, status="processing", attempt_count=1, claimed_by="w-burst", lease_in=60)
        for _ in range(2)
    ]
    durations = [1000, 2000, 4000]
    for job_id, ms in zip([*running, await seed.job(tenant, status="completed")], durations, strict=True):
        await fresh_pool.execute(
            "INSERT INTO job_attempts (job_id, attempt_number, worker_id, status, finished_at, duration_ms) "
            "VALUES ($1, 9, 'w-old', 'completed', now() - interval '1 minute' + $2 * interval '1 ms', $2)",
            job_id,
            ms,
        )
    estimates = WorkEstimates()
    async with fresh_pool.acquire() as conn:
        assert await estimates.refresh(conn) == 3
        assert await estimates.refresh(conn) == 0, "each attempt is folded in once"
        expected = 1.0 + EWMA_ALPHA * (2.0 - 1.0)
        expected += EWMA_ALPHA * (4.0 - expected)
        assert estimates.seconds == {"thumbnail": pytest.approx(expected)}
        [images, ocr] = await queue_demand(
            conn, ["images", "ocr"], estimates, default_job_seconds=9.0, arrival_window_seconds=60
        )
        workers = {w.worker_id: w for w in await live_workers(conn, ["images"])}
    assert images.ready == 6 and images.ready_by_band == {"high": 2, "normal": 3, "low": 1}
    assert images.running == 2
    assert images.backlog_work_seconds == pytest.approx(6 * expected)
    assert images.arrival_per_second == pytest.approx(10 / 60)  # every job seeded was created now
    assert images.arrival_work_rate == pytest.approx(10 * expected / 60)
    assert 29 < images.oldest_ready_seconds < 60
    assert (ocr.ready, ocr.running, ocr.backlog_work_seconds) == (0, 0, 0.0)
    assert workers["w-burst"].running_jobs == 2 and workers["w-burst"].burst_worker_id == str(burst_id)
    assert workers["w-standing"].burst_worker_id is None and workers["w-standing"].heartbeat_age_seconds > 199


async def test_work_scales_with_the_input_where_the_profile_prices_by_size(
    fresh_pool: asyncpg.Pool, seed: Seeder
) -> None:
    """Seconds per MiB (each job at least 1 MiB) for an operation whose profile has ``per_mb``:
    a backlog of large files weighs by their size, one of small files as the per-job EWMA."""
    tenant = await seed.tenant()
    big = await seed.output_object(tenant)
    await fresh_pool.execute("UPDATE objects SET size_bytes = 8 * 1048576 WHERE object_id = $1", big)
    done_small, done_big = (
        await seed.job(tenant, status="completed"),
        await seed.job(tenant, status="completed"),
    )
    await fresh_pool.execute("UPDATE processing_jobs SET object_id = $1 WHERE job_id = $2", big, done_big)
    for job_id, ms, ago in ((done_small, 2000, 60), (done_big, 8000, 30)):  # 2 s/MiB, then 1 s/MiB
        await fresh_pool.execute(
            "INSERT INTO job_attempts (job_id, attempt_number, worker_id, status, finished_at, duration_ms) "
            "VALUES ($1, 1, 'w', 'completed', now() - make_interval(secs => $3::float8), $2)",
            job_id,
            ms,
            ago,
        )
    ready_big = [await seed.job(tenant) for _ in range(3)]
    await fresh_pool.execute(
        "UPDATE processing_jobs SET object_id = $1 WHERE job_id = ANY($2::uuid[])", big, ready_big
    )
    await seed.job(tenant)  # one of 1 MiB
    estimates = WorkEstimates()
    async with fresh_pool.acquire() as conn:
        assert await estimates.refresh(conn) == 2
        assert "thumbnail" in estimates.by_size and "noop" not in estimates.by_size
        per_mb = 2.0 + EWMA_ALPHA * (1.0 - 2.0)
        assert estimates.per_mb == {"thumbnail": pytest.approx(per_mb)}
        [images] = await queue_demand(
            conn, ["images"], estimates, default_job_seconds=9.0, arrival_window_seconds=60
        )
        # 3 jobs of 8 MiB and 1 of 1 MiB: 25 MiB of work at the per-MiB rate, not 4 × the per-job EWMA.
        assert images.backlog_work_seconds == pytest.approx(25 * per_mb)
        await conn.execute("UPDATE processing_profiles SET per_mb = 0 WHERE operation = 'thumbnail'")
        assert await estimates.refresh(conn) == 0
        [per_job] = await queue_demand(
            conn, ["images"], estimates, default_job_seconds=9.0, arrival_window_seconds=60
        )
    assert per_job.backlog_work_seconds == pytest.approx(4 * estimates.seconds["thumbnail"])


async def test_the_drain_handshake_is_seen_at_the_next_heartbeat_and_kept(fresh_pool: asyncpg.Pool) -> None:
    burst_id = str(uuid.uuid4())
    settings = WorkerSettings(HM_BURST_WORKER_ID=burst_id)  # type: ignore[call-arg]
    await registry.register(fresh_pool, "w1", settings, "imageworker")
    assert (
        str(await fresh_pool.fetchval("SELECT burst_worker_id FROM workers WHERE worker_id = 'w1'"))
        == burst_id
    )
    assert not await registry.beat(fresh_pool, "w1", draining=False)
    await fresh_pool.execute(
        "UPDATE workers SET status = 'draining' WHERE burst_worker_id = $1", uuid.UUID(burst_id)
    )
    assert await registry.beat(fresh_pool, "w1", draining=False), "the worker is asked to drain"
    assert await fresh_pool.fetchval("SELECT status FROM workers WHERE worker_id = 'w1'") == "draining"
    assert not await registry.beat(fresh_pool, "w1", draining=True), "draining now: nothing more to see"
    with pytest.raises(ValueError, match="must be a UUID"):
        WorkerSettings(HM_BURST_WORKER_ID="not-a-uuid")  # type: ignore[call-arg]
