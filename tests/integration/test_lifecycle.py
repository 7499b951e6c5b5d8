"""Job state transitions (hypermedia.jobs.lifecycle) against a real Postgres: claims race, fencing tokens
hold after a reaper requeue, failures back off, completion writes each output once."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg

from hypermedia.jobs import lifecycle
from services.reaper.reaper import Reaper
from tests.integration.conftest import Credits, Seeder, Tenant

PREFIX = "TLIFE"
BACKOFF_BASE_SECONDS = 60
"""``backoff_base_seconds`` of the seeded ``thumbnail`` v1 profile."""


async def _output(seed: Seeder, tenant: Tenant, output_type: str = "thumbnail") -> lifecycle.Output:
    object_id = await seed.output_object(tenant)
    return lifecycle.Output(
        output_type=output_type,
        object_id=str(object_id),
        key=f"objects/{object_id}",
        mime_type="image/webp",
        size_bytes=1234,
        metadata={"width": 64, "height": 48},
    )


async def _attempts(pool: asyncpg.Pool, job_id: uuid.UUID) -> list[tuple[int, str, str]]:
    rows = await pool.fetch(
        "SELECT attempt_number, worker_id, status FROM job_attempts WHERE job_id = $1 ORDER BY attempt_number",
        job_id,
    )
    return [(r["attempt_number"], r["worker_id"], r["status"]) for r in rows]


async def _expire_lease(pool: asyncpg.Pool, job_id: uuid.UUID) -> None:
    await pool.execute(
        "UPDATE processing_jobs SET visibility_timeout = now() - interval '1 second' WHERE job_id = $1",
        job_id,
    )


async def _seconds_until_retry(pool: asyncpg.Pool, job_id: uuid.UUID) -> float:
    return float(
        await pool.fetchval(
            "SELECT extract(epoch FROM next_attempt_at - now()) FROM processing_jobs WHERE job_id = $1",
            job_id,
        )
    )


# -- claim ----------------------------------------------------------------------------------------


async def _claimed_then_cancel_requested(
    pool: asyncpg.Pool, seed: Seeder
) -> tuple[uuid.UUID, lifecycle.ClaimedJob]:
    """A job claimed by ``w-a`` whose cancellation was then requested."""
    tenant = await seed.tenant()
    job_id = await seed.job(tenant)
    job = await lifecycle.claim(pool, str(job_id), "w-a")
    assert job is not None
    await pool.execute("UPDATE processing_jobs SET status = 'cancel_requested' WHERE job_id = $1", job_id)
    return job_id, job


async def test_concurrent_claims_of_one_job_have_exactly_one_winner(
    fresh_pool: asyncpg.Pool, seed: Seeder
) -> None:
    tenant = await seed.tenant()
    job_ids = [await seed.job(tenant) for _ in range(10)]

    results = await asyncio.gather(
        *(lifecycle.claim(fresh_pool, str(j), worker) for j in job_ids for worker in ("w-a", "w-b"))
    )

    for index, job_id in enumerate(job_ids):
        a, b = results[2 * index], results[2 * index + 1]
        assert (a is None) != (b is None), "exactly one of two racing claims wins"
        winner = a or b
        assert winner is not None and winner.attempt == 1
        row = await seed.job_row(job_id)
        assert (row["status"], row["attempt_count"]) == ("processing", 1)
        assert row["claimed_by"] == ("w-a" if a else "w-b")
        assert await _attempts(fresh_pool, job_id) == [(1, row["claimed_by"], "processing")]


async def test_claim_returns_lease_and_profile_limits(fresh_pool: asyncpg.Pool, seed: Seeder) -> None:
    tenant = await seed.tenant()
    job_id = await seed.job(tenant, priority=2)

    job = await lifecycle.claim(fresh_pool, str(job_id), "w-a")

    assert job is not None
    assert (job.operation, job.profile_version, job.queue, job.priority) == ("thumbnail", 1, "images", 2)
    assert (job.timeout_seconds, job.max_attempts, job.backoff_base_seconds) == (30, 3, BACKOFF_BASE_SECONDS)
    lease = await fresh_pool.fetchval(
        "SELECT extract(epoch FROM visibility_timeout - now()) FROM processing_jobs WHERE job_id = $1", job_id
    )
    assert abs(float(lease) - (30 * 1.5 + lifecycle.LEASE_MARGIN_SECONDS)) < 5


async def test_claim_of_a_cancelled_or_unknown_job_returns_none(
    fresh_pool: asyncpg.Pool, seed: Seeder
) -> None:
    tenant = await seed.tenant()
    cancelled = await seed.job(tenant, status="cancelled")

    assert await lifecycle.claim(fresh_pool, str(cancelled), "w-a") is None
    assert await lifecycle.claim(fresh_pool, str(uuid.uuid4()), "w-a") is None
    assert await lifecycle.claim(fresh_pool, "not-a-uuid", "w-a") is None

    row = await seed.job_row(cancelled)
    assert (row["status"], row["attempt_count"], row["claimed_by"]) == ("cancelled", 0, None)
    assert await _attempts(fresh_pool, cancelled) == []


# -- fencing --------------------------------------------------------------------------------------


async def test_stale_fencing_token_cannot_complete_after_reaper_requeue(
    fresh_pool: asyncpg.Pool, seed: Seeder, credits: Credits
) -> None:
    tenant = await seed.tenant()
    job_id = await seed.job(tenant)
    stale = await lifecycle.claim(fresh_pool, str(job_id), "w-old")
    assert stale is not None
    await _expire_lease(fresh_pool, job_id)
    assert (await Reaper(fresh_pool, credits.stub, PREFIX).run_once()).requeued_expired == 1
    current = await lifecycle.claim(fresh_pool, str(job_id), "w-new")
    assert current is not None and current.attempt == 2
    output = await _output(seed, tenant)

    assert not await lifecycle.complete(fresh_pool, stale, "w-old", [output], 1200, 10, 10)
    assert (
        await lifecycle.fail(fresh_pool, stale, "w-old", "TIMEOUT", "late", retryable=True, prefix=PREFIX)
        is None
    )
    assert not await lifecycle.hand_back(fresh_pool, stale, "w-old", PREFIX)
    assert await lifecycle.extend_leases(fresh_pool, "w-old", [str(job_id)]) == []

    assert await fresh_pool.fetchval("SELECT count(*) FROM job_outputs WHERE job_id = $1", job_id) == 0
    row = await seed.job_row(job_id)
    assert (row["status"], row["claimed_by"], row["attempt_count"]) == ("processing", "w-new", 2)
    assert row["actual_credits"] is None and row["error_code"] is None
    assert await _attempts(fresh_pool, job_id) == [(1, "w-old", "lost"), (2, "w-new", "processing")]


async def test_stale_fencing_token_of_the_same_worker_cannot_complete(
    fresh_pool: asyncpg.Pool, seed: Seeder, credits: Credits
) -> None:
    """The worker id alone is no fence: the same worker re-claiming the job gets a new attempt."""
    tenant = await seed.tenant()
    job_id = await seed.job(tenant)
    stale = await lifecycle.claim(fresh_pool, str(job_id), "w-a")
    assert stale is not None
    await _expire_lease(fresh_pool, job_id)
    await Reaper(fresh_pool, credits.stub, PREFIX).run_once()
    current = await lifecycle.claim(fresh_pool, str(job_id), "w-a")
    assert current is not None

    assert not await lifecycle.complete(fresh_pool, stale, "w-a", [await _output(seed, tenant)], 1200, 1, 1)
    assert await lifecycle.complete(fresh_pool, current, "w-a", [await _output(seed, tenant)], 1200, 1, 1)

    assert await fresh_pool.fetchval("SELECT count(*) FROM job_outputs WHERE job_id = $1", job_id) == 1
    assert await _attempts(fresh_pool, job_id) == [(1, "w-a", "lost"), (2, "w-a", "completed")]


# -- complete -------------------------------------------------------------------------------------


async def test_complete_twice_writes_one_output(fresh_pool: asyncpg.Pool, seed: Seeder) -> None:
    """A retried complete (its first reply lost to a Postgres restart) reports the job completed by
    this attempt and writes nothing more."""
    tenant = await seed.tenant()
    job_id = await seed.job(tenant)
    job = await lifecycle.claim(fresh_pool, str(job_id), "w-a")
    assert job is not None
    outputs = [await _output(seed, tenant)]

    assert await lifecycle.complete(fresh_pool, job, "w-a", outputs, 1100, 250, 40)
    assert await lifecycle.complete(fresh_pool, job, "w-a", [await _output(seed, tenant)], 1100, 250, 40)
    assert not await lifecycle.complete(fresh_pool, job, "w-b", [await _output(seed, tenant)], 1100, 250, 40)

    rows = await fresh_pool.fetch("SELECT * FROM job_outputs WHERE job_id = $1", job_id)
    assert len(rows) == 1
    assert (rows[0]["output_type"], rows[0]["profile_version"]) == ("thumbnail", 1)
    assert str(rows[0]["object_id"]) == outputs[0].object_id
    assert rows[0]["metadata"] == {"width": 64, "height": 48}
    row = await seed.job_row(job_id)
    assert (row["status"], row["actual_credits"], row["visibility_timeout"]) == ("completed", 1100, None)
    assert row["completed_at"] is not None
    attempt = await fresh_pool.fetchrow("SELECT * FROM job_attempts WHERE job_id = $1", job_id)
    assert (attempt["status"], attempt["duration_ms"], attempt["peak_memory_mb"]) == ("completed", 250, 40)


async def test_one_output_row_per_output_type(fresh_pool: asyncpg.Pool, seed: Seeder) -> None:
    tenant = await seed.tenant()
    job_id = await seed.job(tenant)
    job = await lifecycle.claim(fresh_pool, str(job_id), "w-a")
    assert job is not None
    first, duplicate, other = (
        await _output(seed, tenant),
        await _output(seed, tenant),
        await _output(seed, tenant, "metadata"),
    )

    assert await lifecycle.complete(fresh_pool, job, "w-a", [first, duplicate, other], 1000, 1, 1)

    rows = await fresh_pool.fetch(
        "SELECT output_type, object_id FROM job_outputs WHERE job_id = $1 ORDER BY output_type", job_id
    )
    assert [(r["output_type"], str(r["object_id"])) for r in rows] == [
        ("metadata", other.object_id),
        ("thumbnail", first.object_id),
    ]


# -- fail -----------------------------------------------------------------------------------------


async def test_retryable_failure_backs_off_exponentially(
    fresh_pool: asyncpg.Pool, seed: Seeder, credits: Credits
) -> None:
    tenant = await seed.tenant()
    job_id = await seed.job(tenant)
    reaper = Reaper(fresh_pool, credits.stub, PREFIX)

    for attempt in (1, 2):
        job = await lifecycle.claim(fresh_pool, str(job_id), "w-a")
        assert job is not None and job.attempt == attempt
        status = await lifecycle.fail(
            fresh_pool, job, "w-a", "STORAGE_UNAVAILABLE", "storage hiccup", retryable=True, prefix=PREFIX
        )
        assert status == "retry_wait"
        expected = BACKOFF_BASE_SECONDS * 2 ** (attempt - 1)
        assert expected - 5 < await _seconds_until_retry(fresh_pool, job_id) <= expected
        row = await seed.job_row(job_id)
        assert (row["error_code"], row["visibility_timeout"], row["completed_at"]) == (
            "STORAGE_UNAVAILABLE",
            None,
            None,
        )
        # Not due yet: the reaper leaves it alone; once due it is queued again.
        assert (await reaper.run_once()).promoted == 0
        await fresh_pool.execute(
            "UPDATE processing_jobs SET next_attempt_at = now() - interval '1 second' WHERE job_id = $1",
            job_id,
        )
        assert (await reaper.run_once()).promoted == 1

    assert await _attempts(fresh_pool, job_id) == [(1, "w-a", "failed"), (2, "w-a", "failed")]
    assert (await seed.job_row(job_id))["status"] == "queued"


async def test_failure_on_the_last_attempt_is_final(fresh_pool: asyncpg.Pool, seed: Seeder) -> None:
    tenant = await seed.tenant()
    job_id = await seed.job(tenant, attempt_count=2, max_attempts=3)
    job = await lifecycle.claim(fresh_pool, str(job_id), "w-a")
    assert job is not None and job.attempt == 3

    status = await lifecycle.fail(
        fresh_pool, job, "w-a", "TIMEOUT", "took too long", retryable=True, prefix=PREFIX
    )

    assert status == "failed"
    row = await seed.job_row(job_id)
    assert (row["status"], row["error_code"], row["next_attempt_at"]) == ("failed", "TIMEOUT", None)
    assert row["completed_at"] is not None
    assert await _attempts(fresh_pool, job_id) == [(3, "w-a", "failed")]


async def test_non_retryable_failure_is_final_at_once(fresh_pool: asyncpg.Pool, seed: Seeder) -> None:
    tenant = await seed.tenant()
    job_id = await seed.job(tenant)
    job = await lifecycle.claim(fresh_pool, str(job_id), "w-a")
    assert job is not None

    status = await lifecycle.fail(
        fresh_pool, job, "w-a", "CORRUPT_INPUT", "not an image", retryable=False, prefix=PREFIX
    )

    assert status == "failed"
    row = await seed.job_row(job_id)
    assert (row["status"], row["attempt_count"], row["next_attempt_at"]) == ("failed", 1, None)


async def test_failure_after_cancellation_was_requested_is_not_retried(
    fresh_pool: asyncpg.Pool, seed: Seeder
) -> None:
    """The caller asked to stop the job: a retryable failure must not put it back in line."""
    job_id, job = await _claimed_then_cancel_requested(fresh_pool, seed)

    status = await lifecycle.fail(
        fresh_pool, job, "w-a", "STORAGE_UNAVAILABLE", "storage hiccup", retryable=True, prefix=PREFIX
    )

    # 'failed' is what the worker settles by releasing the hold.
    assert status == "failed"
    row = await seed.job_row(job_id)
    assert (row["status"], row["next_attempt_at"]) == ("failed", None)
    assert row["completed_at"] is not None


# -- hand back, heartbeat, cancellation ----------------------------------------------------------


async def test_hand_back_requeues_with_an_outbox_row_or_fails_when_lost_too_often(
    fresh_pool: asyncpg.Pool, seed: Seeder
) -> None:
    """A handed-back attempt counts as lost, not against max_attempts: a job on its last attempt is
    queued again; only the MAX_LOST_ATTEMPTS-th lost attempt fails it."""
    tenant = await seed.tenant()
    first = await seed.job(tenant, priority=4, attempt_count=2, max_attempts=3)
    last = await seed.job(tenant)
    await fresh_pool.execute(
        "UPDATE processing_jobs SET lost_attempts = $2 WHERE job_id = $1",
        last,
        lifecycle.MAX_LOST_ATTEMPTS - 1,
    )
    jobs = [await lifecycle.claim(fresh_pool, str(j), "w-a") for j in (first, last)]
    assert all(jobs)

    assert all([await lifecycle.hand_back(fresh_pool, j, "w-a", PREFIX) for j in jobs if j])

    row = await seed.job_row(first)
    assert (row["status"], row["claimed_by"], row["attempt_count"], row["lost_attempts"]) == (
        "queued",
        None,
        3,
        1,
    )
    [outbox] = await seed.outbox_rows(first)
    assert outbox["subject"] == "tlife.jobs.images.p4"
    assert outbox["payload"] == {"job_id": str(first), "queue": "images", "priority": 4, "trace": {}}
    assert await _attempts(fresh_pool, first) == [(3, "w-a", "lost")]
    row = await seed.job_row(last)
    assert (row["status"], row["error_code"], row["lost_attempts"]) == (
        "failed",
        "WORKER_LOST",
        lifecycle.MAX_LOST_ATTEMPTS,
    )
    assert row["completed_at"] is not None
    assert await seed.outbox_rows(last) == []


async def test_extend_leases_pushes_the_lease_and_reports_cancellations(
    fresh_pool: asyncpg.Pool, seed: Seeder
) -> None:
    tenant = await seed.tenant()
    running, cancelling = await seed.job(tenant), await seed.job(tenant)
    for job_id in (running, cancelling):
        assert await lifecycle.claim(fresh_pool, str(job_id), "w-a") is not None
    await fresh_pool.execute(
        "UPDATE processing_jobs SET visibility_timeout = now() + interval '5 seconds'",
    )
    await fresh_pool.execute(
        "UPDATE processing_jobs SET status = 'cancel_requested' WHERE job_id = $1", cancelling
    )

    cancelled = await lifecycle.extend_leases(fresh_pool, "w-a", [str(running), str(cancelling)])

    assert cancelled == [str(cancelling)]
    assert await lifecycle.cancel_requested(fresh_pool, [str(running), str(cancelling)]) == [str(cancelling)]
    leases = await fresh_pool.fetch(
        "SELECT extract(epoch FROM visibility_timeout - now()) AS s FROM processing_jobs"
    )
    assert all(float(r["s"]) > 60 for r in leases)


async def test_mark_cancelled_finishes_a_cancel_requested_job(fresh_pool: asyncpg.Pool, seed: Seeder) -> None:
    tenant = await seed.tenant()
    job_id = await seed.job(tenant)
    job = await lifecycle.claim(fresh_pool, str(job_id), "w-a")
    assert job is not None
    assert not await lifecycle.mark_cancelled(fresh_pool, job, "w-a", 5), "only a requested cancellation"
    await fresh_pool.execute(
        "UPDATE processing_jobs SET status = 'cancel_requested' WHERE job_id = $1", job_id
    )

    assert await lifecycle.mark_cancelled(fresh_pool, job, "w-a", 5)

    row = await seed.job_row(job_id)
    assert (row["status"], row["visibility_timeout"]) == ("cancelled", None)
    assert await _attempts(fresh_pool, job_id) == [(1, "w-a", "cancelled")]


# -- answers after a lost reply, cancellation during completion, reclaim -------------------------


async def _status_events(pool: asyncpg.Pool, job_id: uuid.UUID) -> list[str]:
    rows = await pool.fetch(
        "SELECT status FROM job_events WHERE job_id = $1 AND kind = 'status' ORDER BY event_id", job_id
    )
    return [r["status"] for r in rows]


async def test_complete_of_a_cancel_requested_job_writes_nothing(
    fresh_pool: asyncpg.Pool, seed: Seeder
) -> None:
    """The caller cancelled while the outputs were uploading: complete must not win, and
    fenced_status tells the worker why (so it deletes the outputs and cancels)."""
    job_id, job = await _claimed_then_cancel_requested(fresh_pool, seed)
    before = await seed.job_row(job_id)
    output = await _output(seed, await seed.tenant())

    assert not await lifecycle.complete(fresh_pool, job, "w-a", [output], 1200, 9, 9)

    assert await lifecycle.fenced_status(fresh_pool, job, "w-a") == "cancel_requested"
    assert await fresh_pool.fetchval("SELECT count(*) FROM job_outputs WHERE job_id = $1", job_id) == 0
    after = await seed.job_row(job_id)
    assert dict(after) == dict(before), "not a single column of the job changed"
    attempt = await fresh_pool.fetchrow("SELECT * FROM job_attempts WHERE job_id = $1", job_id)
    assert (attempt["status"], attempt["finished_at"], attempt["duration_ms"]) == ("processing", None, None)
    # The worker then finishes the cancellation it found.
    assert await lifecycle.mark_cancelled(fresh_pool, job, "w-a", 9)
    assert (await seed.job_row(job_id))["status"] == "cancelled"


async def test_fenced_status_is_none_for_another_worker_or_an_old_attempt(
    fresh_pool: asyncpg.Pool, seed: Seeder, credits: Credits
) -> None:
    tenant = await seed.tenant()
    job_id = await seed.job(tenant)
    old = await lifecycle.claim(fresh_pool, str(job_id), "w-a")
    assert old is not None
    assert await lifecycle.fenced_status(fresh_pool, old, "w-a") == "processing"
    assert await lifecycle.fenced_status(fresh_pool, old, "w-b") is None

    await _expire_lease(fresh_pool, job_id)
    assert (await Reaper(fresh_pool, credits.stub, PREFIX).run_once()).requeued_expired == 1
    assert await lifecycle.fenced_status(fresh_pool, old, "w-a") is None, "requeued: nobody holds it"
    current = await lifecycle.claim(fresh_pool, str(job_id), "w-a")
    assert current is not None and current.attempt == 2

    assert await lifecycle.fenced_status(fresh_pool, old, "w-a") is None, "same worker, old attempt"
    assert await lifecycle.fenced_status(fresh_pool, current, "w-a") == "processing"
    assert await lifecycle.fenced_status(fresh_pool, current, "w-b") is None


async def test_fail_retried_after_a_lost_reply_returns_the_same_status_and_writes_once(
    fresh_pool: asyncpg.Pool, seed: Seeder
) -> None:
    tenant = await seed.tenant()
    job_id = await seed.job(tenant)
    job = await lifecycle.claim(fresh_pool, str(job_id), "w-a")
    assert job is not None

    first = await lifecycle.fail(
        fresh_pool,
        job,
        "w-a",
        "STORAGE_UNAVAILABLE",
        "first try",
        retryable=True,
        prefix=PREFIX,
        duration_ms=7,
    )
    row = await seed.job_row(job_id)
    attempt = await fresh_pool.fetchrow("SELECT * FROM job_attempts WHERE job_id = $1", job_id)
    second = await lifecycle.fail(
        fresh_pool, job, "w-a", "TIMEOUT", "the retry", retryable=True, prefix=PREFIX, duration_ms=99
    )

    assert first == second == "retry_wait"
    assert dict(await seed.job_row(job_id)) == dict(row), "the retry changed nothing"
    assert (row["error_code"], row["error_message"]) == ("STORAGE_UNAVAILABLE", "first try")
    assert (row["next_attempt_at"] - attempt["finished_at"]).total_seconds() == BACKOFF_BASE_SECONDS
    attempts = await fresh_pool.fetch("SELECT * FROM job_attempts WHERE job_id = $1", job_id)
    assert [dict(a) for a in attempts] == [dict(attempt)]
    assert (attempt["status"], attempt["error_code"], attempt["duration_ms"]) == (
        "failed",
        "STORAGE_UNAVAILABLE",
        7,
    )
    assert await _status_events(fresh_pool, job_id) == ["queued", "claimed", "processing", "retry_wait"]


async def test_fail_on_the_last_attempt_retried_after_a_lost_reply_stays_failed(
    fresh_pool: asyncpg.Pool, seed: Seeder
) -> None:
    tenant = await seed.tenant()
    job_id = await seed.job(tenant, attempt_count=2, max_attempts=3)
    job = await lifecycle.claim(fresh_pool, str(job_id), "w-a")
    assert job is not None and job.attempt == 3

    first = await lifecycle.fail(fresh_pool, job, "w-a", "TIMEOUT", "too slow", retryable=True, prefix=PREFIX)
    row = await seed.job_row(job_id)
    second = await lifecycle.fail(
        fresh_pool, job, "w-a", "CORRUPT_INPUT", "the retry", retryable=False, prefix=PREFIX
    )

    assert first == second == "failed"
    assert dict(await seed.job_row(job_id)) == dict(row)
    assert (row["status"], row["error_code"], row["next_attempt_at"]) == ("failed", "TIMEOUT", None)
    assert await _attempts(fresh_pool, job_id) == [(3, "w-a", "failed")]
    assert await fresh_pool.fetchval("SELECT error_code FROM job_attempts WHERE job_id = $1", job_id) == (
        "TIMEOUT"
    )
    assert await _status_events(fresh_pool, job_id) == ["queued", "claimed", "processing", "failed"]
    # Another worker's retry is told the lease is not its own.
    assert await lifecycle.fail(fresh_pool, job, "w-b", "TIMEOUT", "x", retryable=True, prefix=PREFIX) is None


async def test_mark_cancelled_retried_after_a_lost_reply_is_true_twice(
    fresh_pool: asyncpg.Pool, seed: Seeder
) -> None:
    job_id, job = await _claimed_then_cancel_requested(fresh_pool, seed)

    assert await lifecycle.mark_cancelled(fresh_pool, job, "w-a", 5)
    row = await seed.job_row(job_id)
    assert await lifecycle.mark_cancelled(fresh_pool, job, "w-a", 50)

    assert dict(await seed.job_row(job_id)) == dict(row)
    assert row["status"] == "cancelled" and row["completed_at"] is not None
    attempt = await fresh_pool.fetchrow("SELECT * FROM job_attempts WHERE job_id = $1", job_id)
    assert (attempt["status"], attempt["error_code"], attempt["duration_ms"]) == ("cancelled", "CANCELLED", 5)
    assert await _status_events(fresh_pool, job_id) == [
        "queued",
        "claimed",
        "processing",
        "cancel_requested",
        "cancelled",
    ]
    assert not await lifecycle.mark_cancelled(fresh_pool, job, "w-b", 5), "not w-b's attempt"


async def test_reclaim_returns_the_claim_to_its_worker_only(
    fresh_pool: asyncpg.Pool, seed: Seeder, credits: Credits
) -> None:
    tenant = await seed.tenant()
    job_id = await seed.job(tenant, priority=3)
    await fresh_pool.execute(
        "UPDATE processing_jobs SET params = $2 WHERE job_id = $1", job_id, {"size": 128}
    )
    assert await lifecycle.reclaim(fresh_pool, str(job_id), "w-a") is None, "queued, nobody claimed it"
    claimed = await lifecycle.claim(fresh_pool, str(job_id), "w-a")
    assert claimed is not None

    reclaimed = await lifecycle.reclaim(fresh_pool, str(job_id), "w-a")

    assert reclaimed == claimed
    assert (reclaimed.attempt, reclaimed.params, reclaimed.priority) == (1, {"size": 128}, 3)
    assert await lifecycle.reclaim(fresh_pool, str(job_id), "w-b") is None
    assert await lifecycle.reclaim(fresh_pool, str(uuid.uuid4()), "w-a") is None
    # Reclaim only reads: the attempt and the lease are those of the claim.
    assert await _attempts(fresh_pool, job_id) == [(1, "w-a", "processing")]

    await fresh_pool.execute(
        "UPDATE processing_jobs SET status = 'cancel_requested' WHERE job_id = $1", job_id
    )
    assert await lifecycle.reclaim(fresh_pool, str(job_id), "w-a") is None, "cancel requested"
    await fresh_pool.execute("UPDATE processing_jobs SET status = 'processing' WHERE job_id = $1", job_id)
    await _expire_lease(fresh_pool, job_id)
    assert (await Reaper(fresh_pool, credits.stub, PREFIX).run_once()).requeued_expired == 1
    assert await lifecycle.reclaim(fresh_pool, str(job_id), "w-a") is None, "requeued by the reaper"

    again = await lifecycle.claim(fresh_pool, str(job_id), "w-a")
    assert again is not None and again.attempt == 2
    assert await lifecycle.reclaim(fresh_pool, str(job_id), "w-a") == again
    assert await lifecycle.complete(fresh_pool, again, "w-a", [await _output(seed, tenant)], 1200, 1, 1)
    assert await lifecycle.reclaim(fresh_pool, str(job_id), "w-a") is None, "completed"


async def test_a_failure_racing_a_cancel_request_is_not_retried(
    fresh_pool: asyncpg.Pool, seed: Seeder
) -> None:
    """The caller's cancel commits while the worker's ``fail`` waits for the row lock: ``fail``
    must see ``cancel_requested`` (not the status of its snapshot) and end the job ``failed``."""
    tenant = await seed.tenant()
    job_id = await seed.job(tenant)
    job = await lifecycle.claim(fresh_pool, str(job_id), "w-a")
    assert job is not None
    async with fresh_pool.acquire() as gateway:
        cancel = gateway.transaction()
        await cancel.start()
        await gateway.execute(
            "UPDATE processing_jobs SET status = 'cancel_requested' WHERE job_id = $1", job_id
        )
        failing = asyncio.create_task(
            lifecycle.fail(
                fresh_pool, job, "w-a", "STORAGE_UNAVAILABLE", "hiccup", retryable=True, prefix=PREFIX
            )
        )
        for _ in range(500):  # until fail's UPDATE waits for the cancel's row lock
            if await fresh_pool.fetchval(  # not on `gateway`: a transaction sees one stats snapshot
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock'"
            ):
                break
            await asyncio.sleep(0.01)
        else:
            raise AssertionError("fail did not wait for the row lock")
        await cancel.commit()
    status = await failing

    assert status == "failed"
    row = await seed.job_row(job_id)
    assert (row["status"], row["next_attempt_at"]) == ("failed", None)
    assert await _status_events(fresh_pool, job_id) == [
        "queued",
        "claimed",
        "processing",
        "cancel_requested",
        "failed",
    ]
