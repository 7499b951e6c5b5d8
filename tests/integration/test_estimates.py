"""The run-time prediction of ``POST /v1/hypermedia/estimate`` against real Postgres: a line on the
pixels (pages, media seconds) earlier jobs learned of the objects (``objects.facts``, migration
0035) where they explain the history's runs, else the size, as :func:`services.gateway.estimates.predict`
reads them from ``job_attempts`` and ``objects``."""

from __future__ import annotations

import uuid

import asyncpg

from services.gateway.estimates import object_facts, predict
from tests.integration.conftest import Seeder, Tenant


async def _ran(
    pool: asyncpg.Pool, tenant: Tenant, facts: dict | None, size_bytes: int, seconds: float
) -> str:
    """An object of ``size_bytes`` with ``facts``, and a completed ``thumbnail`` job on it whose
    attempt ran ``seconds``; returns the object id."""
    object_id, job_id = uuid.uuid4(), uuid.uuid4()
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(
            """INSERT INTO objects (object_id, pool_id, key, size_bytes, mime_type, sha256, state, facts)
               VALUES ($1, $2, $3, $4, 'image/jpeg', $5, 'available', $6)""",
            object_id,
            tenant.pool_id,
            f"objects/{object_id}",
            size_bytes,
            "0" * 64,
            facts,
        )
        await conn.execute(
            """INSERT INTO processing_jobs (job_id, account_id, object_id, request_id, operation,
                   profile_version, queue, priority, status, attempt_count, max_attempts, estimated_credits,
                   completed_at)
               VALUES ($1, $2, $3, $4, 'thumbnail', 1, 'images', 5, 'completed', 1, 3, 1000, now())""",
            job_id,
            tenant.account_id,
            object_id,
            uuid.uuid4(),
        )
        await conn.execute(
            """INSERT INTO job_attempts (job_id, attempt_number, worker_id, status, finished_at, duration_ms)
               VALUES ($1, 1, 'w', 'completed', now(), $2)""",
            job_id,
            round(seconds * 1000),
        )
    return str(object_id)


async def test_pixels_predict_where_they_explain_the_runs_and_the_size_where_not(
    fresh_pool: asyncpg.Pool, seed: Seeder
) -> None:
    tenant = await seed.tenant()
    # Run times that follow the pixels (20 ms + 10 ms a megapixel) on files whose sizes say
    # nothing of them (a small PNG of many pixels, a large JPEG of few).
    sizes = [900_000, 100_000, 700_000, 200_000, 500_000, 300_000]
    megapixels = [0.5, 2.0, 4.0, 8.0, 12.0, 24.0]
    for size, mp in zip(sizes, megapixels, strict=True):
        await _ran(fresh_pool, tenant, {"width": int(mp * 1000), "height": 1000}, size, 0.02 + 0.01 * mp)
    known = {"pixels": 16e6}
    prediction = await predict(fresh_pool, "thumbnail", 400_000, known)
    assert prediction.basis == "pixels" and prediction.samples == 6
    assert abs((prediction.seconds or 0) - 0.18) < 0.002
    # The object's own facts, as the estimate reads them.
    learned = await _ran(fresh_pool, tenant, {"width": 4000, "height": 3000, "pages": 2}, 1000, 0.14)
    assert await object_facts(fresh_pool, learned) == {"pixels": 12e6, "pages": 2.0}
    assert await object_facts(fresh_pool, str(uuid.uuid4())) == {}
    # A file no job has read: its size only, where size explains nothing here (the median).
    unknown = await predict(fresh_pool, "thumbnail", 400_000, {})
    assert unknown.basis == "median" and unknown.samples == 7
    # Pages are tried too, but fewer than 5 of the history's inputs know theirs: not that line.
    assert (await predict(fresh_pool, "thumbnail", 400_000, {"pages": 40.0})).basis == "median"


async def test_pixels_that_explain_nothing_leave_the_size_line(
    fresh_pool: asyncpg.Pool, seed: Seeder
) -> None:
    tenant = await seed.tenant()
    # Same pixels everywhere, run times that follow the bytes (a TIFF's decode, say).
    for size_mb in (1, 2, 4, 8, 16):
        await _ran(
            fresh_pool, tenant, {"width": 2000, "height": 1000}, size_mb * 1024 * 1024, 0.1 + 0.05 * size_mb
        )
    prediction = await predict(fresh_pool, "thumbnail", 32 * 1024 * 1024, {"pixels": 2e6})
    assert prediction.basis == "size" and abs((prediction.seconds or 0) - 1.7) < 1e-6
