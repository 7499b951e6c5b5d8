"""A worker's settlements sent in batches (:class:`hypermedia.jobs.settlement.SettlementBatch`)
through a real credits service over gRPC: a busy worker's jobs share ``Settle`` calls, every job
is settled once, a refused batch holds up no other job, and an unreachable service leaves the
holds to the reaper."""

from __future__ import annotations

import asyncio
import logging
import uuid

import asyncpg
import pytest
from prometheus_client import REGISTRY

from hypermedia.api.credits.v1 import credits_pb2_grpc
from hypermedia.devtools.embedded import free_port
from hypermedia.infra.rpc import channel
from hypermedia.jobs.settlement import Settlement, SettlementBatch
from tests.integration.conftest import Credits, Seeder, Tenant

HOLD = 1_000
SETTLE_CALLS = {
    "grpc_service": "hypermedia.credits.v1.CreditsService",
    "grpc_method": "Settle",
    "grpc_code": "OK",
}


async def _held(credits: Credits, tenant: Tenant, count: int) -> list[str]:
    jobs = [str(uuid.uuid4()) for _ in range(count)]
    await credits.hold(tenant.account_id, HOLD, *jobs)
    return jobs


async def _holds(pool: asyncpg.Pool, jobs: list[str]) -> dict[str, tuple[str, int | None]]:
    rows = await pool.fetch(
        "SELECT job_id::text, status, charged FROM credit_holds WHERE job_id = ANY($1::uuid[])", jobs
    )
    return {r["job_id"]: (r["status"], r["charged"]) for r in rows}


def _settle_calls() -> float:
    return REGISTRY.get_sample_value("grpc_server_handled_total", SETTLE_CALLS) or 0.0


async def test_jobs_ending_while_a_call_is_in_flight_share_the_next_call_and_each_is_settled_once(
    fresh_pool: asyncpg.Pool, seed: Seeder, credits: Credits
) -> None:
    """One job ends and its call goes out at once; 39 more end while it is in flight (a busy
    worker) and go out together in one more call: two calls, forty settlements, the ledger exact."""
    tenant = await seed.tenant(balance=100_000)
    jobs = await _held(credits, tenant, 40)
    batch = SettlementBatch(Settlement(credits.stub))
    before = _settle_calls()

    batch.submit(jobs[0], "completed", actual_millicredits=600)
    await asyncio.sleep(0)  # the sender takes the first job and awaits its call
    for k, job_id in enumerate(jobs[1:]):
        if k % 3 == 0:
            batch.submit(job_id, "cancelled")
        else:
            batch.submit(job_id, "completed", actual_millicredits=700, lines={"megapixels": 200})
    assert await batch.flush(10)

    assert _settle_calls() - before == 2
    holds = await _holds(fresh_pool, jobs)
    released = [j for k, j in enumerate(jobs[1:]) if k % 3 == 0]
    assert {j: holds[j] for j in released} == {j: ("released", 0) for j in released}
    assert holds[jobs[0]] == ("committed", 600)
    committed = [j for j in jobs[1:] if j not in released]
    assert {holds[j] for j in committed} == {("committed", 700)}
    lines = await fresh_pool.fetch(
        "SELECT line, count(*) AS n, sum(amount) AS total FROM credit_ledger "
        "WHERE kind = 'commit' AND account_id = $1 GROUP BY line",
        tenant.account_id,
    )
    assert {r["line"]: (r["n"], r["total"]) for r in lines} == {
        "base": (1 + len(committed), -600 - 500 * len(committed)),
        "megapixels": (len(committed), -200 * len(committed)),
    }
    balance, held = await fresh_pool.fetchrow(
        "SELECT balance, held FROM credit_accounts WHERE account_id = $1", tenant.account_id
    )
    assert (balance, held) == (100_000 - 600 - 700 * len(committed), 0)


async def test_an_entry_the_service_refuses_holds_up_no_other_job(
    fresh_pool: asyncpg.Pool, seed: Seeder, credits: Credits, caplog: pytest.LogCaptureFixture
) -> None:
    """A commit the service refuses (a line named ``base``: a worker's bug) in a call of three: the
    other two are settled, the refused one stays held for the reaper, logged with its job."""
    tenant = await seed.tenant(balance=100_000)
    good, bad, released = await _held(credits, tenant, 3)
    batch = SettlementBatch(Settlement(credits.stub))
    before = _settle_calls()

    with caplog.at_level(logging.WARNING, "hypermedia.jobs.settlement"):
        batch.submit(good, "completed", actual_millicredits=800)
        batch.submit(bad, "completed", actual_millicredits=800, lines={"base": 100})
        batch.submit(released, "failed")
        assert await batch.flush(10)

    assert _settle_calls() - before == 1
    assert await _holds(fresh_pool, [good, bad, released]) == {
        good: ("committed", 800),
        bad: ("held", None),
        released: ("released", 0),
    }
    assert [(r.job_id, r.getMessage()) for r in caplog.records] == [
        (bad, "settlement refused: charge lines need distinct lowercase names other than base")
    ]


async def test_settlements_past_the_queues_bound_are_left_to_the_reaper(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """While its calls fail, a worker that goes on ending jobs keeps at most ``MAX_QUEUED``
    settlements; the rest are logged, each with its job, for the reaper. A call that fails with
    something other than a DomainError (gRPC's "Channel is closed") does not end the sender:
    every batch behind it is still tried and logged."""
    closed = channel(f"127.0.0.1:{free_port()}")
    await closed.close()
    batch = SettlementBatch(Settlement(credits_pb2_grpc.CreditsServiceStub(closed)))
    jobs = [str(uuid.uuid4()) for _ in range(SettlementBatch.MAX_QUEUED + 1_002)]
    with caplog.at_level(logging.WARNING, "hypermedia.jobs.settlement"):
        for job_id in jobs:
            batch.submit(job_id, "cancelled")
        assert await batch.flush(30)

    full = "settlement queue full; left to the reaper"
    assert [r.job_id for r in caplog.records if r.getMessage() == full] == jobs[SettlementBatch.MAX_QUEUED :]
    failed = [r.getMessage() for r in caplog.records if r.getMessage() != full]
    assert len(failed) == 10 and len(set(failed)) == 1, failed
    assert (
        failed[0].startswith("credits settlement of 1000 jobs failed (") and "left to the reaper" in failed[0]
    )


async def test_an_unreachable_credits_service_leaves_the_holds_held_for_the_reaper(
    fresh_pool: asyncpg.Pool, seed: Seeder, credits: Credits, caplog: pytest.LogCaptureFixture
) -> None:
    tenant = await seed.tenant(balance=100_000)
    jobs = await _held(credits, tenant, 2)
    unreachable = channel(f"127.0.0.1:{free_port()}")
    try:
        batch = SettlementBatch(Settlement(credits_pb2_grpc.CreditsServiceStub(unreachable)))
        with caplog.at_level(logging.WARNING, "hypermedia.jobs.settlement"):
            for job_id in jobs:
                batch.submit(job_id, "completed", actual_millicredits=500)
            assert await batch.flush(20), "three tries, then given up"
    finally:
        await unreachable.close()

    assert await _holds(fresh_pool, jobs) == {j: ("held", None) for j in jobs}
    assert [r.getMessage() for r in caplog.records] == [
        "credits settlement of 2 jobs failed (TRANSIENT); left to the reaper"
    ]


async def test_an_outcome_that_does_not_end_a_job_is_refused_at_once(credits: Credits) -> None:
    batch = SettlementBatch(Settlement(credits.stub))
    with pytest.raises(ValueError, match="'processing' does not end a job"):
        batch.submit(str(uuid.uuid4()), "processing")
    assert await batch.flush(1)
