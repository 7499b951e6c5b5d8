"""Several claims in one transaction (:func:`hypermedia.jobs.lifecycle.claim_many`) against a real
Postgres: each job is claimed exactly as alone (lease, attempt row, fencing token), and a job that
is not queued is left out."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg

from hypermedia.jobs import lifecycle
from tests.integration.conftest import Seeder


async def _attempts(pool: asyncpg.Pool, job_id: uuid.UUID) -> list[tuple[int, str, str]]:
    rows = await pool.fetch(
        "SELECT attempt_number, worker_id, status FROM job_attempts WHERE job_id = $1 ORDER BY attempt_number",
        job_id,
    )
    return [(r["attempt_number"], r["worker_id"], r["status"]) for r in rows]


async def test_claim_many_claims_each_queued_job_and_leaves_out_the_others(
    fresh_pool: asyncpg.Pool, seed: Seeder
) -> None:
    tenant = await seed.tenant()
    queued = [await seed.job(tenant) for _ in range(3)]
    cancelled = await seed.job(tenant, status="cancelled")
    taken = await seed.job(tenant)
    assert await lifecycle.claim(fresh_pool, str(taken), "w-b") is not None
    asked = [str(queued[0]), str(cancelled), str(queued[1]), str(taken), "not-a-uuid", str(queued[2])]

    jobs = await lifecycle.claim_many(fresh_pool, [*asked, str(uuid.uuid4()), str(queued[0]).upper()], "w-a")

    assert [job.job_id for job in jobs] == [str(j) for j in queued], (
        "the queued ones, in the order asked, once each"
    )
    for job_id, job in zip(queued, jobs, strict=True):
        assert job.attempt == 1 and job.timeout_seconds == 30
        row = await seed.job_row(job_id)
        assert (row["status"], row["claimed_by"], row["attempt_count"]) == ("processing", "w-a", 1)
        assert await _attempts(fresh_pool, job_id) == [(1, "w-a", "processing")]
        lease = await fresh_pool.fetchval(
            "SELECT extract(epoch FROM visibility_timeout - now()) FROM processing_jobs WHERE job_id = $1",
            job_id,
        )
        assert abs(float(lease) - (30 * 1.5 + lifecycle.LEASE_MARGIN_SECONDS)) < 5
    row = await seed.job_row(cancelled)
    assert (row["status"], row["attempt_count"], row["claimed_by"]) == ("cancelled", 0, None)
    row = await seed.job_row(taken)
    assert (row["status"], row["attempt_count"], row["claimed_by"]) == ("processing", 1, "w-b")
    assert await _attempts(fresh_pool, taken) == [(1, "w-b", "processing")]
    assert await lifecycle.claim_many(fresh_pool, ["not-a-uuid"], "w-a") == []


async def test_racing_batch_claims_of_overlapping_jobs_claim_each_job_once(
    fresh_pool: asyncpg.Pool, seed: Seeder
) -> None:
    tenant = await seed.tenant()
    job_ids = [str(await seed.job(tenant)) for _ in range(8)]

    a, b, c = await asyncio.gather(
        lifecycle.claim_many(fresh_pool, job_ids, "w-a"),
        lifecycle.claim_many(fresh_pool, job_ids[::-1], "w-b"),
        lifecycle.claim_many(fresh_pool, job_ids[2:6], "w-c"),
    )

    winners = [job.job_id for job in (*a, *b, *c)]
    assert sorted(winners) == sorted(job_ids), "every job claimed by exactly one batch"
    for worker, jobs in (("w-a", a), ("w-b", b), ("w-c", c)):
        for job in jobs:
            row = await seed.job_row(uuid.UUID(job.job_id))
            assert (row["claimed_by"], row["attempt_count"]) == (worker, 1)


async def test_a_requeued_job_claimed_in_a_batch_gets_the_next_fencing_token(
    fresh_pool: asyncpg.Pool, seed: Seeder
) -> None:
    tenant = await seed.tenant()
    job_id = await seed.job(tenant)
    first = await lifecycle.claim(fresh_pool, str(job_id), "w-a")
    assert first is not None
    await fresh_pool.execute("UPDATE processing_jobs SET status = 'queued' WHERE job_id = $1", job_id)

    [second] = await lifecycle.claim_many(fresh_pool, [str(job_id)], "w-b")

    assert second.attempt == 2
    assert await _attempts(fresh_pool, job_id) == [(1, "w-a", "processing"), (2, "w-b", "processing")]
    assert not await lifecycle.complete(fresh_pool, first, "w-a", [], 0, 1, 1), "the old token is fenced"
