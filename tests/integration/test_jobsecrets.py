"""``job_secrets`` (migration 0009, :mod:`hypermedia.jobs.secrets`) against a real Postgres: a job's
password is readable while the job can still run, and the transition that ends the job deletes it
in its own transaction, whichever path ends it (worker, reaper, gateway cancel)."""

from __future__ import annotations

import uuid

import asyncpg
import pytest

from hypermedia.jobs import lifecycle
from hypermedia.jobs import secrets as jobsecrets
from services.reaper.reaper import Reaper
from tests.integration.conftest import Credits, Seeder

PREFIX = "TSECR"
PASSWORD = "openpassword"


async def _job_with_secret(pool: asyncpg.Pool, seed: Seeder) -> uuid.UUID:
    tenant = await seed.tenant()
    job_id = await seed.job(tenant)
    async with pool.acquire() as conn, conn.transaction():
        await jobsecrets.store(conn, [(str(job_id), PASSWORD)])
    return job_id


async def test_store_fetch_and_delete(fresh_pool: asyncpg.Pool, seed: Seeder) -> None:
    job_id = await _job_with_secret(fresh_pool, seed)
    other = await seed.job(await seed.tenant())
    assert await jobsecrets.fetch_password(fresh_pool, str(job_id)) == PASSWORD
    async with fresh_pool.acquire() as conn:
        assert await jobsecrets.fetch_password(conn, str(job_id)) == PASSWORD
    assert await jobsecrets.fetch_password(fresh_pool, str(other)) is None
    assert await jobsecrets.fetch_password(fresh_pool, str(uuid.uuid4())) is None
    with pytest.raises(asyncpg.UniqueViolationError):
        await jobsecrets.store(fresh_pool, [(str(job_id), "again")])
    with pytest.raises(asyncpg.ForeignKeyViolationError):
        await jobsecrets.store(fresh_pool, [(str(uuid.uuid4()), PASSWORD)])

    assert await jobsecrets.delete(fresh_pool, []) == 0
    assert await jobsecrets.delete(fresh_pool, [str(job_id), str(other)]) == 1
    assert await jobsecrets.fetch_password(fresh_pool, str(job_id)) is None


async def test_the_secret_lives_while_the_job_can_run(fresh_pool: asyncpg.Pool, seed: Seeder) -> None:
    """Claim, a retryable failure, a hand-back and a cancel request leave it; the job still runs."""
    job_id = await _job_with_secret(fresh_pool, seed)
    job = await lifecycle.claim(fresh_pool, str(job_id), "w-a")
    assert job is not None
    status = await lifecycle.fail(fresh_pool, job, "w-a", "TIMEOUT", "slow", retryable=True, prefix=PREFIX)
    assert status == "retry_wait"
    await fresh_pool.execute("UPDATE processing_jobs SET status = 'queued' WHERE job_id = $1", job_id)
    job = await lifecycle.claim(fresh_pool, str(job_id), "w-a")
    assert job is not None and await lifecycle.hand_back(fresh_pool, job, "w-a", PREFIX)
    job = await lifecycle.claim(fresh_pool, str(job_id), "w-a")
    assert job is not None
    await fresh_pool.execute(
        "UPDATE processing_jobs SET status = 'cancel_requested' WHERE job_id = $1", job_id
    )
    assert (await seed.job_row(job_id))["status"] == "cancel_requested"
    assert await jobsecrets.fetch_password(fresh_pool, str(job_id)) == PASSWORD


async def test_each_way_a_job_ends_deletes_its_secret(
    fresh_pool: asyncpg.Pool, seed: Seeder, credits: Credits
) -> None:
    ended: dict[str, uuid.UUID] = {}

    ended["completed"] = await _job_with_secret(fresh_pool, seed)
    job = await lifecycle.claim(fresh_pool, str(ended["completed"]), "w-a")
    assert job is not None and await lifecycle.complete(fresh_pool, job, "w-a", [], 1200, 1, 1)

    ended["failed"] = await _job_with_secret(fresh_pool, seed)
    job = await lifecycle.claim(fresh_pool, str(ended["failed"]), "w-a")
    assert job is not None
    status = await lifecycle.fail(
        fresh_pool, job, "w-a", "PASSWORD_INCORRECT", "wrong", retryable=False, prefix=PREFIX
    )
    assert status == "failed"

    ended["cancelled by the worker"] = await _job_with_secret(fresh_pool, seed)
    job = await lifecycle.claim(fresh_pool, str(ended["cancelled by the worker"]), "w-a")
    assert job is not None
    await fresh_pool.execute(
        "UPDATE processing_jobs SET status = 'cancel_requested' WHERE job_id = $1", job.job_id
    )
    assert await lifecycle.mark_cancelled(fresh_pool, job, "w-a", 1)

    ended["handed back too often"] = await _job_with_secret(fresh_pool, seed)
    await fresh_pool.execute(
        "UPDATE processing_jobs SET lost_attempts = $2 WHERE job_id = $1",
        ended["handed back too often"],
        lifecycle.MAX_LOST_ATTEMPTS - 1,
    )
    job = await lifecycle.claim(fresh_pool, str(ended["handed back too often"]), "w-a")
    assert job is not None and await lifecycle.hand_back(fresh_pool, job, "w-a", PREFIX)

    ended["lost too often (reaper)"] = await _job_with_secret(fresh_pool, seed)
    await fresh_pool.execute(
        "UPDATE processing_jobs SET lost_attempts = $2 WHERE job_id = $1",
        ended["lost too often (reaper)"],
        lifecycle.MAX_LOST_ATTEMPTS - 1,
    )
    job = await lifecycle.claim(fresh_pool, str(ended["lost too often (reaper)"]), "w-gone")
    assert job is not None
    await fresh_pool.execute(
        "UPDATE processing_jobs SET visibility_timeout = now() - interval '1 second' WHERE job_id = $1",
        job.job_id,
    )
    await Reaper(fresh_pool, credits.stub, PREFIX).run_once()

    ended["cancelled while queued (gateway)"] = await _job_with_secret(fresh_pool, seed)
    await fresh_pool.execute(
        "UPDATE processing_jobs SET status = 'cancelled', completed_at = now() WHERE job_id = $1",
        ended["cancelled while queued (gateway)"],
    )

    for how, job_id in ended.items():
        row = await seed.job_row(job_id)
        assert row["status"] in ("completed", "failed", "cancelled"), how
        assert await jobsecrets.fetch_password(fresh_pool, str(job_id)) is None, how
    assert await fresh_pool.fetchval("SELECT count(*) FROM job_secrets") == 0


async def test_a_rolled_back_transition_keeps_the_secret(fresh_pool: asyncpg.Pool, seed: Seeder) -> None:
    """The delete is part of the transition's transaction, not a separate step."""
    job_id = await _job_with_secret(fresh_pool, seed)

    class Abort(Exception):
        pass

    with pytest.raises(Abort):
        async with fresh_pool.acquire() as conn, conn.transaction():
            await conn.execute("UPDATE processing_jobs SET status = 'failed' WHERE job_id = $1", job_id)
            assert await jobsecrets.fetch_password(conn, str(job_id)) is None
            raise Abort
    assert await jobsecrets.fetch_password(fresh_pool, str(job_id)) == PASSWORD
