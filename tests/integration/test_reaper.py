"""The reaper's ``run_once()`` against a real Postgres and a real credits service over gRPC.

Each test has a database of its own, so the counts ``run_once()`` returns are exact.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from pathlib import Path

import asyncpg
from prometheus_client import REGISTRY

from hypermedia.api.credits.v1 import credits_pb2_grpc
from hypermedia.devtools.embedded import free_port
from hypermedia.infra.rpc import channel
from hypermedia.jobs import lifecycle
from hypermedia.jobs.outbox import OutboxRelay
from hypermedia.jobs.settlement import SWEEP_PAGES
from services.reaper.reaper import SETTLE_GRACE_SECONDS, Reaper, ReapResult
from tests.integration.conftest import Broker, Credits, Seeder, Tenant

PREFIX = "TREAP"
BALANCE = 10_000
HOLD = 1_200


async def _hold(credits: Credits, tenant: Tenant, *job_ids: uuid.UUID) -> None:
    await credits.hold(tenant.account_id, HOLD, *job_ids)


async def _hold_status(pool: asyncpg.Pool, job_id: uuid.UUID) -> str:
    return str(await pool.fetchval("SELECT status FROM credit_holds WHERE job_id = $1", job_id))


async def _balance(pool: asyncpg.Pool, tenant: Tenant) -> tuple[int, int]:
    row = await pool.fetchrow(
        "SELECT balance, held FROM credit_accounts WHERE account_id = $1", tenant.account_id
    )
    return row["balance"], row["held"]


async def _attempt(pool: asyncpg.Pool, job_id: uuid.UUID, number: int) -> asyncpg.Record:
    row = await pool.fetchrow(
        "SELECT * FROM job_attempts WHERE job_id = $1 AND attempt_number = $2", job_id, number
    )
    assert row is not None
    return row


async def test_expired_lease_is_requeued_with_an_outbox_row(
    fresh_pool: asyncpg.Pool, seed: Seeder, credits: Credits
) -> None:
    tenant = await seed.tenant(balance=BALANCE)
    expired = await seed.job(
        tenant, status="processing", attempt_count=1, claimed_by="w-a", lease_in=-5, priority=2
    )
    alive = await seed.job(tenant, status="processing", attempt_count=1, claimed_by="w-a", lease_in=300)
    await _hold(credits, tenant, expired, alive)
    lost = {"operation": "thumbnail", "outcome": "lost"}
    before = REGISTRY.get_sample_value("hypermedia_attempts_total", lost) or 0.0

    result = await Reaper(fresh_pool, credits.stub, PREFIX).run_once()

    assert result == ReapResult(requeued_expired=1)
    # Counted once, as the reaper's (issue 22 review: lost attempts were invisible in the metrics).
    assert REGISTRY.get_sample_value("hypermedia_attempts_total", lost) == before + 1
    row = await seed.job_row(expired)
    assert (row["status"], row["claimed_by"], row["visibility_timeout"], row["attempt_count"]) == (
        "queued",
        None,
        None,
        1,
    )
    assert row["completed_at"] is None
    [outbox] = await seed.outbox_rows(expired)
    assert outbox["subject"] == "treap.jobs.images.p2"
    assert outbox["published_at"] is None
    attempt = await _attempt(fresh_pool, expired, 1)
    assert (attempt["status"], attempt["error_code"]) == ("lost", "WORKER_LOST")
    assert attempt["finished_at"] is not None
    # A requeued job still runs: its hold stays.
    assert await _hold_status(fresh_pool, expired) == "held"
    assert await _balance(fresh_pool, tenant) == (BALANCE, 2 * HOLD)
    # The live lease is untouched.
    assert (await seed.job_row(alive))["status"] == "processing"
    assert await seed.outbox_rows(alive) == []
    assert (await _attempt(fresh_pool, alive, 1))["status"] == "processing"


async def _lost_before(
    pool: asyncpg.Pool, job_id: object, lost: int = lifecycle.MAX_LOST_ATTEMPTS - 1
) -> None:
    """Record that the job already lost ``lost`` attempts (by default: the next loss is its last)."""
    await pool.execute("UPDATE processing_jobs SET lost_attempts = $2 WHERE job_id = $1", job_id, lost)


async def test_expired_lease_on_the_last_allowed_loss_fails_and_releases_the_hold(
    fresh_pool: asyncpg.Pool, seed: Seeder, credits: Credits
) -> None:
    tenant = await seed.tenant(balance=BALANCE)
    job_id = await seed.job(
        tenant, status="processing", attempt_count=3, max_attempts=3, claimed_by="w-a", lease_in=-5
    )
    await _lost_before(fresh_pool, job_id)
    await _hold(credits, tenant, job_id)
    assert await _balance(fresh_pool, tenant) == (BALANCE, HOLD)

    result = await Reaper(fresh_pool, credits.stub, PREFIX).run_once()

    assert result == ReapResult(failed_expired=1)
    row = await seed.job_row(job_id)
    assert (row["status"], row["error_code"], row["claimed_by"]) == ("failed", "WORKER_LOST", None)
    assert row["completed_at"] is not None
    assert await seed.outbox_rows(job_id) == []
    assert (await _attempt(fresh_pool, job_id, 3))["status"] == "lost"
    assert await _hold_status(fresh_pool, job_id) == "released"
    assert await _balance(fresh_pool, tenant) == (BALANCE, 0)
    ledger = await fresh_pool.fetch(
        "SELECT kind, amount FROM credit_ledger WHERE job_id = $1 ORDER BY entry_id", job_id
    )
    assert [(r["kind"], r["amount"]) for r in ledger] == [("hold", HOLD), ("release", HOLD)]


async def test_expired_lease_of_a_cancel_requested_job_cancels_it(
    fresh_pool: asyncpg.Pool, seed: Seeder, credits: Credits
) -> None:
    tenant = await seed.tenant(balance=BALANCE)
    job_id = await seed.job(tenant, status="cancel_requested", attempt_count=1, claimed_by="w-a", lease_in=-5)
    await _hold(credits, tenant, job_id)

    result = await Reaper(fresh_pool, credits.stub, PREFIX).run_once()

    assert result == ReapResult(failed_expired=1)
    row = await seed.job_row(job_id)
    assert (row["status"], row["error_code"]) == ("cancelled", None)
    assert row["completed_at"] is not None
    assert await seed.outbox_rows(job_id) == []
    assert await _hold_status(fresh_pool, job_id) == "released"
    assert await _balance(fresh_pool, tenant) == (BALANCE, 0)


async def test_due_retries_are_promoted_and_others_wait(
    fresh_pool: asyncpg.Pool, seed: Seeder, credits: Credits
) -> None:
    tenant = await seed.tenant()
    due = await seed.job(
        tenant, status="retry_wait", attempt_count=1, claimed_by="w-a", next_attempt_in=-1, priority=7
    )
    waiting = await seed.job(
        tenant, status="retry_wait", attempt_count=1, claimed_by="w-a", next_attempt_in=60
    )

    result = await Reaper(fresh_pool, credits.stub, PREFIX).run_once()

    assert result == ReapResult(promoted=1)
    row = await seed.job_row(due)
    assert (row["status"], row["claimed_by"], row["attempt_count"]) == ("queued", None, 1)
    [outbox] = await seed.outbox_rows(due)
    assert outbox["subject"] == "treap.jobs.images.p7"
    assert (await seed.job_row(waiting))["status"] == "retry_wait"
    assert await seed.outbox_rows(waiting) == []


async def test_stale_queued_job_is_published_again(
    fresh_pool: asyncpg.Pool, seed: Seeder, credits: Credits, broker: Broker
) -> None:
    tenant = await seed.tenant()
    stale = await seed.job(tenant, queued_ago=600)
    fresh = await seed.job(tenant, queued_ago=1)
    async with fresh_pool.acquire() as conn:
        for job_id in (stale, fresh):
            await lifecycle.enqueue_outbox(conn, broker.prefix, str(job_id), "images", 5)
    relay = OutboxRelay(fresh_pool, broker.nc, broker.js)
    assert (await relay.run_once()).published == 2

    result = await Reaper(fresh_pool, credits.stub, broker.prefix, requeue_stale_seconds=60).run_once()

    assert result == ReapResult(republished=1)
    assert len(await seed.outbox_rows(stale)) == 2
    assert len(await seed.outbox_rows(fresh)) == 1
    row = await seed.job_row(stale)
    assert row["status"] == "queued"
    assert await fresh_pool.fetchval(
        "SELECT queued_at > now() - interval '10 seconds' FROM processing_jobs WHERE job_id = $1", stale
    )
    # The new row has its own Nats-Msg-Id, so JetStream does not drop it as a duplicate.
    assert (await relay.run_once()).published == 1
    assert await broker.stream_messages("images") == 3
    # Republished just now: the next run leaves it alone.
    assert (
        await Reaper(fresh_pool, credits.stub, broker.prefix, requeue_stale_seconds=60).run_once()
    ) == ReapResult()


async def test_workers_without_a_recent_heartbeat_are_marked_dead(
    fresh_pool: asyncpg.Pool, seed: Seeder, credits: Credits
) -> None:
    await seed.worker("w-silent", heartbeat_ago=600)
    await seed.worker("w-silent-draining", heartbeat_ago=600, status="draining")
    await seed.worker("w-alive", heartbeat_ago=1)
    await seed.worker("w-stopped", heartbeat_ago=600, status="stopped")

    result = await Reaper(fresh_pool, credits.stub, PREFIX, dead_worker_seconds=120).run_once()

    assert result == ReapResult(dead_workers=2)
    rows = await fresh_pool.fetch("SELECT worker_id, status FROM workers ORDER BY worker_id")
    assert {r["worker_id"]: r["status"] for r in rows} == {
        "w-alive": "running",
        "w-silent": "dead",
        "w-silent-draining": "dead",
        "w-stopped": "stopped",
    }
    assert (await Reaper(fresh_pool, credits.stub, PREFIX).run_once()).dead_workers == 0


async def test_two_reapers_at_once_handle_each_expired_job_once(
    fresh_pool: asyncpg.Pool, seed: Seeder, credits: Credits
) -> None:
    tenant = await seed.tenant(balance=100 * HOLD)
    requeue = [
        await seed.job(tenant, status="processing", attempt_count=1, claimed_by="w-a", lease_in=-5)
        for _ in range(30)
    ]
    finish = [
        await seed.job(
            tenant, status="processing", attempt_count=3, max_attempts=3, claimed_by="w-a", lease_in=-5
        )
        for _ in range(10)
    ]
    for job_id in finish:
        await _lost_before(fresh_pool, job_id)
    await _hold(credits, tenant, *requeue, *finish)
    # Small batches make the two reapers interleave over several rounds.
    reapers = [Reaper(fresh_pool, credits.stub, PREFIX, batch_size=4) for _ in range(2)]

    results: list[ReapResult] = []
    while True:
        round_results = await asyncio.gather(*(r.run_once() for r in reapers))
        if not any(r.anything for r in round_results):
            break
        results.extend(round_results)

    assert sum(r.requeued_expired for r in results) == len(requeue)
    assert sum(r.failed_expired for r in results) == len(finish)
    per_job = await fresh_pool.fetch(
        "SELECT payload->>'job_id' AS job_id, count(*) AS n FROM outbox GROUP BY 1"
    )
    assert {r["job_id"]: r["n"] for r in per_job} == {str(j): 1 for j in requeue}
    statuses = await fresh_pool.fetch("SELECT status, count(*) AS n FROM processing_jobs GROUP BY status")
    assert {r["status"]: r["n"] for r in statuses} == {"queued": len(requeue), "failed": len(finish)}
    releases = await fresh_pool.fetchval("SELECT count(*) FROM credit_ledger WHERE kind = 'release'")
    assert releases == len(finish)
    assert await _balance(fresh_pool, tenant) == (100 * HOLD, len(requeue) * HOLD)


async def test_a_release_that_failed_is_made_by_a_later_run(
    fresh_pool: asyncpg.Pool, seed: Seeder, credits: Credits
) -> None:
    """The job's transition commits before its Release; when the credits service cannot be reached
    the hold stays held, and once the grace period has passed a later run releases it."""
    tenant = await seed.tenant(balance=BALANCE)
    job_id = await seed.job(tenant, status="processing", attempt_count=3, claimed_by="w-a", lease_in=-5)
    await _lost_before(fresh_pool, job_id)
    await _hold(credits, tenant, job_id)
    unreachable = channel(f"127.0.0.1:{free_port()}")
    try:
        reaper = Reaper(fresh_pool, credits_pb2_grpc.CreditsServiceStub(unreachable), PREFIX)
        assert (await reaper.run_once()) == ReapResult(failed_expired=1)
    finally:
        await unreachable.close()
    assert (await seed.job_row(job_id))["status"] == "failed"
    assert await _hold_status(fresh_pool, job_id) == "held"
    reaper = Reaper(fresh_pool, credits.stub, PREFIX)
    assert await reaper.run_once() == ReapResult(), "within the grace period the hold is left alone"

    await _age(fresh_pool, job_id, SETTLE_GRACE_SECONDS + 1)
    assert await reaper.run_once() == ReapResult(settled_holds=1)

    assert await _hold_status(fresh_pool, job_id) == "released"
    assert await _balance(fresh_pool, tenant) == (BALANCE, 0)
    assert await reaper.run_once() == ReapResult()


async def test_holds_nobody_settled_are_released_or_committed(
    fresh_pool: asyncpg.Pool, seed: Seeder, credits: Credits
) -> None:
    """E.g. a job handed back on its last attempt (failed by the worker, which does not release), or
    a worker that died between completing a job and charging it."""
    tenant = await seed.tenant(balance=BALANCE)
    failed = await seed.job(tenant, status="failed", attempt_count=3)
    cancelled = await seed.job(tenant, status="cancelled", attempt_count=1)
    completed = await seed.job(tenant, status="completed", attempt_count=1)
    running = await seed.job(tenant, status="processing", attempt_count=1, claimed_by="w-a", lease_in=300)
    jobs = (failed, cancelled, completed, running)
    await _hold(credits, tenant, *jobs)
    await fresh_pool.execute(
        "UPDATE processing_jobs SET actual_credits = $2 WHERE job_id = $1", completed, HOLD // 2
    )
    for job_id in jobs:
        await _age(fresh_pool, job_id, SETTLE_GRACE_SECONDS + 1)

    result = await Reaper(fresh_pool, credits.stub, PREFIX).run_once()

    assert result == ReapResult(settled_holds=3)
    assert [await _hold_status(fresh_pool, j) for j in jobs] == ["released", "released", "committed", "held"]
    assert await _balance(fresh_pool, tenant) == (BALANCE - HOLD // 2, HOLD)


async def test_a_completed_jobs_charge_lines_are_committed_by_the_reaper(
    fresh_pool: asyncpg.Pool, seed: Seeder, credits: Credits
) -> None:
    """An OCR job whose worker died after completing it with an escalation line: the reaper's
    commit writes the same two ledger rows the worker's would have."""
    tenant = await seed.tenant(balance=BALANCE)
    completed = await seed.job(tenant, status="completed", attempt_count=1)
    await _hold(credits, tenant, completed)
    await fresh_pool.execute(
        "UPDATE processing_jobs SET actual_credits = $2, charge_lines = $3 WHERE job_id = $1",
        completed,
        HOLD // 2,
        {"ocr_escalation": HOLD // 8},
    )
    await _age(fresh_pool, completed, SETTLE_GRACE_SECONDS + 1)

    assert await Reaper(fresh_pool, credits.stub, PREFIX).run_once() == ReapResult(settled_holds=1)

    rows = await fresh_pool.fetch(
        "SELECT line, amount FROM credit_ledger WHERE job_id = $1 AND kind = 'commit' ORDER BY line",
        completed,
    )
    assert [(r["line"], r["amount"]) for r in rows] == [
        ("base", -(HOLD // 2 - HOLD // 8)),
        ("ocr_escalation", -(HOLD // 8)),
    ]
    assert await _balance(fresh_pool, tenant) == (BALANCE - HOLD // 2, 0)


async def test_a_hold_credits_refuses_holds_up_no_other_of_its_sweeps_page(
    fresh_pool: asyncpg.Pool, seed: Seeder, credits: Credits
) -> None:
    """Five completed jobs nobody charged, one of them with charge lines larger than its amount
    (a row no worker of this release writes): the sweep's one ``Settle`` call for the page
    charges the four, and the fifth stays held, refused again by each later sweep, alone. (A
    hostile review found the whole page refused on every sweep when a refusal failed the call.)"""
    tenant = await seed.tenant(balance=BALANCE)
    jobs = [await seed.job(tenant, status="completed", attempt_count=1) for _ in range(5)]
    await _hold(credits, tenant, *jobs)
    for job_id in jobs:
        await fresh_pool.execute(
            "UPDATE processing_jobs SET actual_credits = $2, charge_lines = $3 WHERE job_id = $1",
            job_id,
            HOLD // 2,
            {"pages": HOLD} if job_id == jobs[2] else {},
        )
        await _age(fresh_pool, job_id, SETTLE_GRACE_SECONDS + 1)
    reaper = Reaper(fresh_pool, credits.stub, PREFIX)

    assert await reaper.run_once() == ReapResult(settled_holds=4)
    assert await reaper.run_once() == ReapResult()

    assert [await _hold_status(fresh_pool, j) for j in jobs] == ["committed"] * 2 + ["held"] + [
        "committed"
    ] * 2
    assert await _balance(fresh_pool, tenant) == (BALANCE - 4 * (HOLD // 2), HOLD)


async def test_a_job_failed_by_its_input_is_charged_by_the_reaper_and_others_released(
    fresh_pool: asyncpg.Pool, seed: Seeder, credits: Credits
) -> None:
    """A worker that died after failing a job because of its input (ADR 0068) and before its
    commit: the reaper charges the charge the job row records; a failed job without one (the
    platform's fault) is released."""
    tenant = await seed.tenant(balance=BALANCE)
    charged = await seed.job(tenant, status="failed", attempt_count=1)
    free = await seed.job(tenant, status="failed", attempt_count=1)
    await _hold(credits, tenant, charged, free)
    await fresh_pool.execute(
        "UPDATE processing_jobs SET error_code = 'TIMEOUT', actual_credits = 1150, charge_lines = $2 "
        "WHERE job_id = $1",
        charged,
        {"run_seconds": 150},
    )
    for job_id in (charged, free):
        await _age(fresh_pool, job_id, SETTLE_GRACE_SECONDS + 1)

    assert await Reaper(fresh_pool, credits.stub, PREFIX).run_once() == ReapResult(settled_holds=2)

    assert [await _hold_status(fresh_pool, j) for j in (charged, free)] == ["committed", "released"]
    rows = await fresh_pool.fetch(
        "SELECT line, amount FROM credit_ledger WHERE job_id = $1 AND kind = 'commit' ORDER BY line",
        charged,
    )
    assert [(r["line"], r["amount"]) for r in rows] == [("base", -1000), ("run_seconds", -150)]
    assert await _balance(fresh_pool, tenant) == (BALANCE - 1150, 0)


async def _age(pool: asyncpg.Pool, job_id: uuid.UUID, seconds: float) -> None:
    await pool.execute(
        "UPDATE processing_jobs SET updated_at = now() - make_interval(secs => $2) WHERE job_id = $1",
        job_id,
        seconds,
    )


async def test_a_dead_workers_job_is_requeued_at_once_not_when_its_lease_runs_out(
    fresh_pool: asyncpg.Pool, seed: Seeder, credits: Credits
) -> None:
    tenant = await seed.tenant(balance=BALANCE)
    await seed.worker("w-dead", heartbeat_ago=121)
    await seed.worker("w-alive", heartbeat_ago=1)
    orphaned = await seed.job(
        tenant, status="processing", attempt_count=1, claimed_by="w-dead", lease_in=3600, priority=3
    )
    alive = await seed.job(tenant, status="processing", attempt_count=1, claimed_by="w-alive", lease_in=3600)
    await _hold(credits, tenant, orphaned, alive)

    result = await Reaper(fresh_pool, credits.stub, PREFIX, dead_worker_seconds=120).run_once()

    assert result == ReapResult(requeued_expired=1, dead_workers=1)
    row = await seed.job_row(orphaned)
    assert (row["status"], row["claimed_by"], row["visibility_timeout"], row["attempt_count"]) == (
        "queued",
        None,
        None,
        1,
    )
    assert (row["error_code"], row["completed_at"]) == (None, None)
    [outbox] = await seed.outbox_rows(orphaned)
    assert outbox["subject"] == "treap.jobs.images.p3"
    assert outbox["payload"]["job_id"] == str(orphaned)
    attempt = await _attempt(fresh_pool, orphaned, 1)
    assert (attempt["status"], attempt["error_code"], attempt["worker_id"]) == (
        "lost",
        "WORKER_LOST",
        "w-dead",
    )
    assert attempt["finished_at"] is not None
    assert await _hold_status(fresh_pool, orphaned) == "held", "a requeued job keeps its hold"
    # The live worker's job is left alone.
    row = await seed.job_row(alive)
    assert (row["status"], row["claimed_by"]) == ("processing", "w-alive")
    assert await seed.outbox_rows(alive) == []
    assert (await _attempt(fresh_pool, alive, 1))["status"] == "processing"
    workers = await fresh_pool.fetch("SELECT worker_id, status FROM workers ORDER BY worker_id")
    assert {r["worker_id"]: r["status"] for r in workers} == {"w-alive": "running", "w-dead": "dead"}
    assert await _balance(fresh_pool, tenant) == (BALANCE, 2 * HOLD)
    assert await Reaper(fresh_pool, credits.stub, PREFIX, dead_worker_seconds=120).run_once() == ReapResult()


async def test_old_job_directories_of_finished_jobs_are_removed(
    fresh_pool: asyncpg.Pool, seed: Seeder, credits: Credits, tmp_path: Path
) -> None:
    tenant = await seed.tenant()
    completed = await seed.job(tenant, status="completed", attempt_count=1)
    processing = await seed.job(tenant, status="processing", attempt_count=1, claimed_by="w-a", lease_in=300)
    failed_recently = await seed.job(tenant, status="failed", attempt_count=3)
    jobs = tmp_path / "w1" / "jobs"
    old = time.time() - 3600
    dirs = {}
    for name in (str(completed), str(processing), str(failed_recently), "not-a-job"):
        (jobs / name / "input").mkdir(parents=True)
        (jobs / name / "input" / "source").write_bytes(b"half a file")
        dirs[name] = jobs / name
    for name in (str(completed), str(processing), "not-a-job"):
        os.utime(dirs[name], (old, old))
    reaper = Reaper(
        fresh_pool,
        credits.stub,
        PREFIX,
        work_dirs=(tmp_path / "w1", tmp_path / "missing"),
        orphan_dir_seconds=600,
    )

    result = await reaper.run_once()

    assert result == ReapResult(removed_dirs=1)
    assert sorted(p.name for p in jobs.iterdir()) == sorted(
        [str(processing), str(failed_recently), "not-a-job"]
    )
    assert (dirs[str(processing)] / "input" / "source").read_bytes() == b"half a file"
    assert await reaper.run_once() == ReapResult()
    # Once old, the finished job's directory goes too; the running one's stays.
    os.utime(dirs[str(failed_recently)], (old, old))
    assert await reaper.run_once() == ReapResult(removed_dirs=1)
    assert sorted(p.name for p in jobs.iterdir()) == sorted([str(processing), "not-a-job"])


async def test_a_lost_attempt_does_not_use_up_max_attempts(
    fresh_pool: asyncpg.Pool, seed: Seeder, credits: Credits
) -> None:
    """A job whose worker was lost on attempt max_attempts is queued again: the loss was not the
    job's doing (a kill, a node going away), and it has its own budget, MAX_LOST_ATTEMPTS."""
    tenant = await seed.tenant(balance=BALANCE)
    job_id = await seed.job(
        tenant, status="processing", attempt_count=3, max_attempts=3, claimed_by="w-a", lease_in=-5
    )
    await _hold(credits, tenant, job_id)

    assert await Reaper(fresh_pool, credits.stub, PREFIX).run_once() == ReapResult(requeued_expired=1)

    row = await seed.job_row(job_id)
    assert (row["status"], row["attempt_count"], row["lost_attempts"], row["error_code"]) == (
        "queued",
        3,
        1,
        None,
    )
    assert len(await seed.outbox_rows(job_id)) == 1
    assert await _hold_status(fresh_pool, job_id) == "held"


async def test_a_hold_whose_job_was_never_created_is_released_after_the_grace(
    fresh_pool: asyncpg.Pool, seed: Seeder, credits: Credits
) -> None:
    """The gateway holds credits, then creates the jobs in its own transaction; when it dies in
    between (or that transaction and its Release both fail), the hold has no job."""
    tenant = await seed.tenant(balance=BALANCE)
    orphan = uuid.uuid4()
    await _hold(credits, tenant, orphan)
    reaper = Reaper(fresh_pool, credits.stub, PREFIX, settle_grace_seconds=1)
    assert await reaper.run_once() == ReapResult(), "a job may still be on its way"
    await fresh_pool.execute(
        "UPDATE credit_holds SET created_at = now() - interval '2 seconds' WHERE job_id = $1", orphan
    )

    assert await reaper.run_once() == ReapResult(settled_holds=1)

    assert await _hold_status(fresh_pool, orphan) == "released"
    assert await _balance(fresh_pool, tenant) == (BALANCE, 0)


async def test_a_hold_behind_more_held_ones_than_a_sweep_reads_is_settled_by_a_later_run(
    fresh_pool: asyncpg.Pool, seed: Seeder, credits: Credits
) -> None:
    """Step 5 pages through the credits service's held holds (ListHolds) a bounded number of pages
    per run and goes on where the last run stopped, so an unsettled hold behind a backlog of queued
    jobs' holds is still reached."""
    tenant = await seed.tenant(balance=BALANCE * 100)
    backlog = [await seed.job(tenant, status="queued", attempt_count=0) for _ in range(2 * SWEEP_PAGES + 3)]
    await _hold(credits, tenant, *backlog)
    ended = await seed.job(tenant, status="failed", attempt_count=3)
    await _hold(credits, tenant, ended)  # the newest hold: last in ListHolds' order
    await _age(fresh_pool, ended, SETTLE_GRACE_SECONDS + 1)
    reaper = Reaper(fresh_pool, credits.stub, PREFIX, batch_size=2, requeue_stale_seconds=3600)
    first = await reaper.run_once()
    assert first.settled_holds == 0 and await _hold_status(fresh_pool, ended) == "held"
    assert (await reaper.run_once()).settled_holds == 1
    assert await _hold_status(fresh_pool, ended) == "released"
    assert {await _hold_status(fresh_pool, job_id) for job_id in backlog} == {"held"}
