"""Job quotas (hypermedia/jobs/quotas.py) as the credits service applies them in EstimateAndHold,
against a real Postgres and over real gRPC where the wire matters: the interactive band, the
token bucket of requests, the most waiting jobs, and an operator's limits over the defaults."""

from __future__ import annotations

import uuid

import asyncpg
import pytest

from hypermedia.api.credits.v1 import credits_pb2
from hypermedia.core.errors import InvalidArgument, NotFound, PermissionDenied, RateLimited
from hypermedia.infra.rpc import call
from hypermedia.jobs import quotas
from services.credits.service import CreditsService
from tests.integration.conftest import Credits, Seeder, Tenant


def _request(tenant: Tenant, priority: int = 5, jobs: int = 1) -> credits_pb2.EstimateAndHoldRequest:
    return credits_pb2.EstimateAndHoldRequest(
        account_id=str(tenant.account_id),
        size_bytes=0,
        priority=priority,
        jobs=[credits_pb2.JobToHold(job_id=str(uuid.uuid4()), operation="thumbnail") for _ in range(jobs)],
    )


async def _tenant(seed: Seeder, pool: asyncpg.Pool, **quota: object) -> Tenant:
    """A tenant with 100 credits and ``quota`` set (:func:`quotas.set_quota`'s keywords)."""
    tenant = await seed.tenant(balance=100_000)
    if quota:
        async with pool.acquire() as conn:
            await quotas.set_quota(conn, tenant.account_id, **quota)  # type: ignore[arg-type]
    return tenant


async def _held(pool: asyncpg.Pool, tenant: Tenant) -> int:
    return int(
        await pool.fetchval("SELECT held FROM credit_accounts WHERE account_id = $1", tenant.account_id)
    )


async def test_the_interactive_band_needs_the_right_and_is_refused_over_the_wire_holding_nothing(
    fresh_pool: asyncpg.Pool, seed: Seeder, credits: Credits
) -> None:
    tenant = await seed.tenant(balance=100_000)
    for priority in (1, 2, 3):
        with pytest.raises(PermissionDenied) as refused:
            await call(credits.stub.EstimateAndHold, _request(tenant, priority))
        assert refused.value.error_code == "PRIORITY_NOT_ALLOWED"
        assert refused.value.details == {"priority": priority, "allowed": 4}
        assert f"priority {priority} is in the interactive band (1-3)" in refused.value.public_message
    assert await _held(fresh_pool, tenant) == 0
    for priority in (0, 4, 7, 10):  # 0: not given
        await credits.service.EstimateAndHold(_request(tenant, priority), None)
    assert await _held(fresh_pool, tenant) == 4 * 1000

    async with fresh_pool.acquire() as conn:
        row = await quotas.set_quota(conn, tenant.account_id, interactive=True)
    assert row == {
        "account_id": str(tenant.account_id),
        "interactive": True,
        "max_queued_jobs": None,
        "rate_per_second": None,
        "burst": None,
        "max_running_jobs": None,
    }
    await call(credits.stub.EstimateAndHold, _request(tenant, 1))
    assert await _held(fresh_pool, tenant) == 5 * 1000


async def test_the_token_bucket_refuses_past_the_burst_with_retry_after_and_refills_at_the_rate(
    fresh_pool: asyncpg.Pool, seed: Seeder, credits: Credits
) -> None:
    tenant = await _tenant(seed, fresh_pool, rate_per_second=0.5, burst=3)
    for _ in range(3):
        await credits.service.EstimateAndHold(_request(tenant, jobs=2), None)  # a request, not a job
    with pytest.raises(RateLimited) as limited:
        await call(credits.stub.EstimateAndHold, _request(tenant))
    assert limited.value.error_code == "RATE_LIMITED"
    assert limited.value.http_status == 429
    # The bucket is empty (or holds what refilled in the milliseconds since): the next token
    # comes after up to 2 s at 0.5 a second.
    assert limited.value.details == {"retry_after_seconds": 2, "limit": 0.5}
    assert "0.5 requests a second (bursts of 3)" in limited.value.public_message
    assert await _held(fresh_pool, tenant) == 6 * 1000  # the refused one held nothing

    # Two seconds later, as the database's clock counts: one token, one request.
    await fresh_pool.execute(
        "UPDATE account_quotas SET refilled_at = refilled_at - interval '2 seconds' WHERE account_id = $1",
        tenant.account_id,
    )
    await credits.service.EstimateAndHold(_request(tenant), None)
    with pytest.raises(RateLimited):
        await credits.service.EstimateAndHold(_request(tenant), None)


async def test_a_retried_call_for_the_same_jobs_takes_no_token(
    fresh_pool: asyncpg.Pool, seed: Seeder, credits: Credits
) -> None:
    tenant = await _tenant(seed, fresh_pool, rate_per_second=0.01, burst=1)
    request = _request(tenant)
    for _ in range(3):
        await credits.service.EstimateAndHold(request, None)
    assert await _held(fresh_pool, tenant) == 1000
    with pytest.raises(RateLimited):
        await credits.service.EstimateAndHold(_request(tenant), None)


async def test_the_most_waiting_jobs_counts_queued_and_retry_wait_and_the_new_ones(
    fresh_pool: asyncpg.Pool, seed: Seeder, credits: Credits
) -> None:
    tenant = await _tenant(seed, fresh_pool, max_queued_jobs=4)
    await seed.job(tenant, status="queued")
    await seed.job(tenant, status="retry_wait", next_attempt_in=60)
    for status in ("processing", "completed", "failed"):  # not waiting
        await seed.job(tenant, status=status, claimed_by="w" if status == "processing" else None)
    other = await seed.tenant(balance=100_000)
    for _ in range(5):
        await seed.job(other, status="queued")  # another account's jobs do not count

    with pytest.raises(RateLimited) as full:
        await call(credits.stub.EstimateAndHold, _request(tenant, jobs=3))
    assert full.value.error_code == "TOO_MANY_QUEUED_JOBS"
    assert full.value.details == {"retry_after_seconds": quotas.QUEUED_RETRY_AFTER_SECONDS, "limit": 4}
    assert full.value.public_message == (
        "this account has 2 jobs waiting and may have at most 4; this request would add 3"
    )
    await credits.service.EstimateAndHold(_request(tenant, jobs=2), None)
    assert await _held(fresh_pool, tenant) == 2000


async def test_a_request_larger_than_the_limit_itself_is_refused_for_good(
    fresh_pool: asyncpg.Pool, seed: Seeder, credits: Credits
) -> None:
    tenant = await _tenant(seed, fresh_pool, max_queued_jobs=3, rate_per_second=0.01, burst=1)
    with pytest.raises(PermissionDenied) as never:
        await call(credits.stub.EstimateAndHold, _request(tenant, jobs=4))
    assert never.value.error_code == "QUEUE_QUOTA_TOO_SMALL"
    assert never.value.details == {"limit": 3}
    assert never.value.public_message.startswith(
        "this request has 4 jobs and this account may have at most 3"
    )
    # It took no token: the one request of the bucket still goes through.
    await credits.service.EstimateAndHold(_request(tenant, jobs=3), None)


async def test_a_retried_call_with_a_new_job_is_checked_again(
    fresh_pool: asyncpg.Pool, seed: Seeder, credits: Credits
) -> None:
    tenant = await _tenant(seed, fresh_pool, rate_per_second=0.01, burst=1)
    first = _request(tenant)
    await credits.service.EstimateAndHold(first, None)
    grown = _request(tenant)
    grown.jobs.insert(0, first.jobs[0])  # the first job holds already, the second is new
    with pytest.raises(RateLimited):
        await credits.service.EstimateAndHold(grown, None)


async def test_the_service_defaults_apply_where_the_account_sets_no_limit(
    fresh_pool: asyncpg.Pool, seed: Seeder
) -> None:
    service = CreditsService(fresh_pool, quotas.QuotaDefaults(max_queued_jobs=1, rate_per_second=0, burst=1))
    tenant = await seed.tenant(balance=100_000)
    with pytest.raises(PermissionDenied) as full:
        await service.EstimateAndHold(_request(tenant, jobs=2), None)
    assert full.value.details["limit"] == 1
    for _ in range(5):  # rate 0: no rate limit
        await service.EstimateAndHold(_request(tenant, jobs=1), None)
    async with fresh_pool.acquire() as conn:
        await quotas.set_quota(conn, tenant.account_id, max_queued_jobs=10)
    await service.EstimateAndHold(_request(tenant, jobs=2), None)
    async with fresh_pool.acquire() as conn:
        row = await quotas.set_quota(conn, tenant.account_id, default=True)
    assert row["max_queued_jobs"] is None
    with pytest.raises(PermissionDenied):
        await service.EstimateAndHold(_request(tenant, jobs=2), None)


async def test_bad_quotas_priorities_and_accounts_are_refused(
    fresh_pool: asyncpg.Pool, seed: Seeder, credits: Credits
) -> None:
    tenant = await seed.tenant(balance=100_000)
    async with fresh_pool.acquire() as conn:
        for bad, message in (
            ({"max_queued_jobs": -1}, "max_queued_jobs must be 0 to 10,000,000"),
            ({"max_queued_jobs": 2**31}, "max_queued_jobs must be 0 to 10,000,000"),
            ({"rate_per_second": 0.0}, "rate_per_second must be 0.001 to 1e"),
            ({"rate_per_second": 1e-300}, "rate_per_second must be 0.001 to 1e"),
            ({"rate_per_second": float("inf")}, "rate_per_second must be 0.001 to 1e"),
            ({"rate_per_second": float("nan")}, "rate_per_second must be 0.001 to 1e"),
            ({"burst": 0}, "burst must be 1 to 1,000,000"),
            ({"burst": 10**7}, "burst must be 1 to 1,000,000"),
            ({"burst": 5, "default": True}, "give no limit with it"),
            ({"max_running_jobs": -1}, "max_running_jobs must be 0 \\(no cap\\) to 100,000"),
            ({"max_running_jobs": 10**6}, "max_running_jobs must be 0 \\(no cap\\) to 100,000"),
            ({"max_running_jobs": 2, "default": True}, "give no limit with it"),
        ):
            with pytest.raises(ValueError, match=message):
                await quotas.set_quota(conn, tenant.account_id, **bad)
        with pytest.raises(LookupError):
            await quotas.set_quota(conn, uuid.uuid4(), interactive=True)
    with pytest.raises(InvalidArgument):
        await credits.service.EstimateAndHold(_request(tenant, priority=11), None)
    stranger = Tenant(uuid.uuid4(), uuid.uuid4(), uuid.uuid4())
    with pytest.raises(NotFound) as missing:
        await credits.service.EstimateAndHold(_request(stranger), None)
    assert missing.value.error_code == "ACCOUNT_NOT_FOUND"
