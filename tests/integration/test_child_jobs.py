"""A job's children (issue 23 item 2, ADR 0081) against a real Postgres: created once by the live
attempt, queued with outbox rows and unbilled; cancelled with their parent; neither held nor
counted by the account's cap; their progress summed; their parts recorded as the parent's."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Callable

import asyncpg

from hypermedia.jobs import charges, checkpoints, lifecycle, quotas
from hypermedia.jobs.lifecycle import children
from hypermedia.worker import fanout
from hypermedia.worker.admission import Admission
from tests.integration.conftest import Seeder

PREFIX = "TCHILD"


async def _fanned_out(
    pool: asyncpg.Pool, seed: Seeder, count: int = 3
) -> tuple[lifecycle.ClaimedJob, list[str]]:
    """A job claimed by ``w-a`` that fanned out into ``count`` children."""
    tenant = await seed.tenant()
    job_id = await seed.job(tenant)
    job = await lifecycle.claim(pool, str(job_id), "w-a")
    assert job is not None
    kids = await children.spawn(pool, job, "w-a", PREFIX, count)
    assert kids is not None
    return job, kids


async def _until(condition: Callable[[], bool]) -> None:
    """Returns once ``condition()`` holds (a worker-side state the test cannot await)."""
    while not condition():  # noqa: ASYNC110 - the state is a counter, not an event
        await asyncio.sleep(0.05)


async def _statuses(pool: asyncpg.Pool, job_ids: list[str]) -> list[str]:
    rows = await pool.fetch(
        "SELECT job_id::text, status FROM processing_jobs WHERE job_id = ANY($1::uuid[])", job_ids
    )
    by_id = {r["job_id"]: r["status"] for r in rows}
    return [by_id[j] for j in job_ids]


async def test_the_live_attempt_creates_queued_unbilled_children_once(
    fresh_pool: asyncpg.Pool, seed: Seeder
) -> None:
    job, kids = await _fanned_out(fresh_pool, seed, 3)

    rows = await fresh_pool.fetch(
        "SELECT * FROM processing_jobs WHERE parent_job_id = $1 ORDER BY chunk_index", uuid.UUID(job.job_id)
    )
    assert [str(r["job_id"]) for r in rows] == kids
    assert [r["chunk_index"] for r in rows] == [0, 1, 2]
    for row in rows:
        assert row["status"] == "queued"
        # Unbilled, one attempt, in the most urgent band of the parent's queue.
        assert (row["estimated_credits"], row["max_attempts"], row["priority"]) == (0, 1, 1)
        assert (row["operation"], row["profile_version"], row["queue"]) == (
            job.operation,
            job.profile_version,
            job.queue,
        )
        assert str(row["object_id"]) == job.object_id and str(row["account_id"]) == job.account_id
        assert row["params"] == job.params
    outbox = await fresh_pool.fetchval(
        "SELECT count(*) FROM outbox WHERE job_id = ANY($1::uuid[])", [uuid.UUID(k) for k in kids]
    )
    assert outbox == 3
    # Once: neither a second call, another worker nor a child fans out again.
    assert await children.spawn(fresh_pool, job, "w-a", PREFIX, 3) is None
    assert await children.spawn(fresh_pool, job, "w-b", PREFIX, 3) is None
    child = await lifecycle.claim(fresh_pool, kids[0], "w-b")
    assert child is not None
    assert (child.parent_job_id, child.chunk_index, child.fanned_out) == (job.job_id, 0, False)
    assert await children.spawn(fresh_pool, child, "w-b", PREFIX, 3) is None
    assert (
        await fresh_pool.fetchval(
            "SELECT count(*) FROM processing_jobs WHERE parent_job_id = $1", uuid.UUID(job.job_id)
        )
        == 3
    )
    # A later attempt of the parent knows it fanned out.
    await lifecycle.hand_back(fresh_pool, job, "w-a", PREFIX)
    again = await lifecycle.claim(fresh_pool, job.job_id, "w-c")
    assert again is not None and again.fanned_out and again.parent_job_id is None


async def test_a_fenced_attempt_creates_no_children(fresh_pool: asyncpg.Pool, seed: Seeder) -> None:
    tenant = await seed.tenant()
    job_id = await seed.job(tenant)
    job = await lifecycle.claim(fresh_pool, str(job_id), "w-a")
    assert job is not None
    await fresh_pool.execute(
        "UPDATE processing_jobs SET status = 'cancel_requested' WHERE job_id = $1", job_id
    )

    assert await children.spawn(fresh_pool, job, "w-a", PREFIX, 2) is None
    assert (
        await fresh_pool.fetchval("SELECT count(*) FROM processing_jobs WHERE parent_job_id = $1", job_id)
        == 0
    )


async def test_cancelling_the_parent_cancels_every_child(fresh_pool: asyncpg.Pool, seed: Seeder) -> None:
    job, kids = await _fanned_out(fresh_pool, seed, 3)
    running = await lifecycle.claim(fresh_pool, kids[0], "w-b")
    assert running is not None
    done = await lifecycle.claim(fresh_pool, kids[1], "w-b")
    assert done is not None
    assert await lifecycle.complete(fresh_pool, done, "w-b", [], 0, 10, 1)

    assert await lifecycle.request_cancel(fresh_pool, job.job_id, job.account_id) == "cancel_requested"

    # The running child is asked to stop, the queued one never runs, the completed one stays so.
    assert await _statuses(fresh_pool, kids) == ["cancel_requested", "completed", "cancelled"]
    assert await lifecycle.cancel_requested(fresh_pool, [kids[0]]) == [kids[0]]


async def test_cancelling_a_queued_parent_cancels_its_children(
    fresh_pool: asyncpg.Pool, seed: Seeder
) -> None:
    """A parent handed back (a drain) while its children run is queued: a cancel ends it at
    once, and its children with it."""
    job, kids = await _fanned_out(fresh_pool, seed, 2)
    assert await lifecycle.claim(fresh_pool, kids[0], "w-b") is not None
    assert await lifecycle.hand_back(fresh_pool, job, "w-a", PREFIX)

    assert await lifecycle.cancel_if_waiting(fresh_pool, job.job_id, job.account_id)

    assert await _statuses(fresh_pool, [job.job_id, *kids]) == ["cancelled", "cancel_requested", "cancelled"]


async def test_children_progress_is_summed(fresh_pool: asyncpg.Pool, seed: Seeder) -> None:
    job, kids = await _fanned_out(fresh_pool, seed, 3)
    assert await children.state(fresh_pool, job.job_id) == children.Children(3, 0, 0.0)
    first = await lifecycle.claim(fresh_pool, kids[0], "w-b")
    second = await lifecycle.claim(fresh_pool, kids[1], "w-b")
    assert first is not None and second is not None
    assert await lifecycle.complete(fresh_pool, first, "w-b", [], 0, 10, 1)
    assert await lifecycle.progress(fresh_pool, second, "w-b", 0.25, "processing")
    assert await lifecycle.progress(fresh_pool, second, "w-b", 0.5, "processing")

    state = await children.state(fresh_pool, job.job_id)

    assert state == children.Children(3, 1, 1.5)
    assert not state.all_ended


async def test_a_childs_part_is_recorded_as_its_parents_while_the_parent_runs(
    fresh_pool: asyncpg.Pool, seed: Seeder
) -> None:
    job, kids = await _fanned_out(fresh_pool, seed, 2)
    child = await lifecycle.claim(fresh_pool, kids[0], "w-b")
    assert child is not None
    prefix = "derived/p/o/1/"
    owner = checkpoints.owner_of(child)
    part = checkpoints.Checkpoint("c-0000", checkpoints.key_of(prefix, owner, "c-0000"), 10, "0" * 64, 0)

    assert owner == job.job_id
    assert await checkpoints.record(fresh_pool, child, "w-b", part)

    [kept] = await checkpoints.of_job(fresh_pool, job.job_id)
    assert (kept.part, kept.attempt, kept.key) == (
        "c-0000",
        job.attempt,
        f"{prefix}checkpoint-{job.job_id}-c-0000.zip",
    )
    assert (
        str(
            await fresh_pool.fetchval(
                "SELECT made_by_job FROM job_checkpoints WHERE job_id = $1", uuid.UUID(job.job_id)
            )
        )
        == kids[0]
    )
    assert await checkpoints.of_job(fresh_pool, kids[0]) == []
    # A parent handed back (a drain) and queued again takes its children's parts all the same.
    assert await lifecycle.hand_back(fresh_pool, job, "w-a", PREFIX)
    other = checkpoints.Checkpoint("c-0001", checkpoints.key_of(prefix, owner, "c-0001"), 10, "0" * 64, 0)
    assert await checkpoints.record(fresh_pool, child, "w-b", other)
    # Once a cancel was asked of the parent, its children's parts are refused (fenced).
    await fresh_pool.execute(
        "UPDATE processing_jobs SET status = 'cancel_requested' WHERE job_id = $1", uuid.UUID(job.job_id)
    )
    last = checkpoints.Checkpoint("c-0002", checkpoints.key_of(prefix, owner, "c-0002"), 10, "0" * 64, 0)
    assert not await checkpoints.record(fresh_pool, child, "w-b", last)


async def test_children_are_neither_held_nor_counted_by_the_accounts_cap(
    fresh_pool: asyncpg.Pool, seed: Seeder
) -> None:
    """With a cap of two running jobs, the running parent takes one place: its two children run
    all the same (held behind their own parent they never would), and take none: one more job
    of the account still runs."""
    job, kids = await _fanned_out(fresh_pool, seed, 2)
    async with fresh_pool.acquire() as conn:
        await quotas.set_quota(conn, uuid.UUID(job.account_id), max_running_jobs=2)
    other = await fresh_pool.fetchval(
        "INSERT INTO processing_jobs (job_id, account_id, object_id, request_id, operation, profile_version,"
        " queue, priority, status, max_attempts, estimated_credits, queued_at)"
        " SELECT gen_random_uuid(), account_id, object_id, gen_random_uuid(), operation, profile_version, queue,"
        " priority, 'queued', 3, 100, now() FROM processing_jobs WHERE job_id = $1 RETURNING job_id::text",
        uuid.UUID(job.job_id),
    )

    claimed, held = await lifecycle.claim_held(fresh_pool, kids, "w-b")
    assert sorted(c.job_id for c in claimed) == sorted(kids) and held == set()

    # The parent and its two running children leave room for one more job of the account.
    claimed, held = await lifecycle.claim_held(fresh_pool, [other], "w-c")
    assert [c.job_id for c in claimed] == [other] and held == set()


async def test_a_parent_failed_by_its_input_is_charged_its_childrens_run_too(
    fresh_pool: asyncpg.Pool, seed: Seeder
) -> None:
    """Children are unbilled; when their parent fails because of its input, their completed
    attempts and those failed by the input count in the parent's run time (a hostile file that
    fans out does not get the children's work for nothing). A child's lost attempt does not."""
    job, kids = await _fanned_out(fresh_pool, seed, 3)
    done = await lifecycle.claim(fresh_pool, kids[0], "w-b")
    assert done is not None
    assert await lifecycle.complete(fresh_pool, done, "w-b", [], 0, 2_000, 1)
    bad = await lifecycle.claim(fresh_pool, kids[1], "w-b")
    assert bad is not None
    assert (
        await lifecycle.fail(
            fresh_pool,
            bad,
            "w-b",
            "CORRUPT_INPUT",
            "x",
            retryable=False,
            prefix=PREFIX,
            duration_ms=1_000,
            input_fault=True,
        )
        == "failed"
    )
    lost = await lifecycle.claim(fresh_pool, kids[2], "w-b")
    assert lost is not None
    assert await lifecycle.hand_back(fresh_pool, lost, "w-b", PREFIX)
    await fresh_pool.execute(
        "UPDATE job_attempts SET duration_ms = 9000 WHERE job_id = $1", uuid.UUID(kids[2])
    )

    status = await lifecycle.fail(
        fresh_pool,
        job,
        "w-a",
        "CORRUPT_INPUT",
        "x",
        retryable=False,
        prefix=PREFIX,
        duration_ms=500,
        input_fault=True,
    )

    assert status == "failed"
    charged = await lifecycle.failure_charge(fresh_pool, job.job_id)
    expected = charges.for_failure(price=job.estimated_credits, base_cost=job.base_cost, run_ms=3_500)
    assert charged == expected
    assert charged != charges.for_failure(price=job.estimated_credits, base_cost=job.base_cost, run_ms=500)


async def test_a_parent_that_fails_takes_its_children_with_it(fresh_pool: asyncpg.Pool, seed: Seeder) -> None:
    """Whatever ends the parent (here a permanent failure; a cancel, lost attempts, the reaper
    alike), the children not yet held are cancelled and the running ones asked to stop."""
    job, kids = await _fanned_out(fresh_pool, seed, 2)
    assert await lifecycle.claim(fresh_pool, kids[0], "w-b") is not None

    assert (
        await lifecycle.fail(fresh_pool, job, "w-a", "INTERNAL", "x", retryable=False, prefix=PREFIX)
        == "failed"
    )

    assert await _statuses(fresh_pool, kids) == ["cancel_requested", "cancelled"]


async def test_children_are_published_past_their_accounts_fair_window(
    fresh_pool: asyncpg.Pool, seed: Seeder
) -> None:
    """An account's window of 32 queued jobs in a band is full (ADR 0059): its children are
    published all the same."""
    tenant = await seed.tenant()
    for _ in range(lifecycle.FAIR_WINDOW):
        await seed.job(tenant, priority=1)
    parent_id = await seed.job(tenant, priority=5)
    job = await lifecycle.claim(fresh_pool, str(parent_id), "w-a")
    assert job is not None

    kids = await children.spawn(fresh_pool, job, "w-a", PREFIX, 3)

    assert kids is not None
    deferred = await fresh_pool.fetch(
        "SELECT deferred FROM outbox WHERE job_id = ANY($1::uuid[])", [uuid.UUID(k) for k in kids]
    )
    assert [r["deferred"] for r in deferred] == [False] * 3


async def test_a_parked_job_frees_its_slot_and_takes_the_next_free_one_before_any_new_job(
    fresh_pool: asyncpg.Pool, seed: Seeder
) -> None:
    """The worker side (:class:`hypermedia.worker.fanout.Parked`) on a one-slot worker: parked,
    the job gives its slot back; once its children ended while another job holds the slot, it
    keeps the slot's place (admission closed to new jobs) and takes the slot when that job ends."""
    job, kids = await _fanned_out(fresh_pool, seed, 2)
    admission = Admission(slots=1, min_available_mb=0)
    admission.busy = 1
    slot_free = asyncio.Event()
    events: list[tuple[float, str]] = []

    async def report(_job: lifecycle.ClaimedJob, fraction: float, stage: str) -> None:
        events.append((fraction, stage))

    parked = fanout.Parked(fresh_pool, admission, slot_free, report)
    waiting = asyncio.create_task(parked.wait(job))
    await asyncio.sleep(0.2)
    assert (admission.busy, admission.room, parked.jobs) == (0, 1, {job.job_id})
    admission.busy += 1  # another job takes the free slot
    for kid in kids:
        child = await lifecycle.claim(fresh_pool, kid, "w-b")
        assert child is not None and await lifecycle.complete(fresh_pool, child, "w-b", [], 0, 10, 1)
    await asyncio.wait_for(_until(lambda: admission.unparking == 1), 10)
    admission.sample()
    assert not waiting.done() and not admission.open and admission.room == -1

    admission.busy -= 1  # the other job ends
    slot_free.set()
    await asyncio.wait_for(waiting, 5)

    assert (admission.busy, admission.unparking, parked.jobs) == (1, 0, set())
    assert [stage for _, stage in events] == ["children"] * len(events)
    assert events[0][0] == 0.25 and events[-1][0] == 0.25 + 0.5 * 2 / 3


async def test_a_parked_job_stopped_while_waiting_keeps_the_slots_balanced(
    fresh_pool: asyncpg.Pool, seed: Seeder
) -> None:
    job, _kids = await _fanned_out(fresh_pool, seed, 2)
    admission = Admission(slots=1, min_available_mb=0)
    admission.busy = 1

    async def report(_job: lifecycle.ClaimedJob, fraction: float, stage: str) -> None:
        return None

    parked = fanout.Parked(fresh_pool, admission, asyncio.Event(), report)
    waiting = asyncio.create_task(parked.wait(job))
    await asyncio.sleep(0.2)
    waiting.cancel()  # a cancel or a drain
    with contextlib.suppress(asyncio.CancelledError):
        await waiting

    assert (admission.busy, admission.unparking, parked.jobs) == (1, 0, set())


async def test_a_later_attempt_whose_children_ended_keeps_its_slot(
    fresh_pool: asyncpg.Pool, seed: Seeder
) -> None:
    """A retry of a fanned-out job after its children ended does not give its slot away (a new
    job would take it, and the job would wait for that one to end)."""
    job, kids = await _fanned_out(fresh_pool, seed, 2)
    for kid in kids:
        child = await lifecycle.claim(fresh_pool, kid, "w-b")
        assert child is not None and await lifecycle.complete(fresh_pool, child, "w-b", [], 0, 10, 1)
    admission = Admission(slots=1, min_available_mb=0)
    admission.busy = 1
    slot_free = asyncio.Event()

    async def report(_job: lifecycle.ClaimedJob, fraction: float, stage: str) -> None:
        return None

    await asyncio.wait_for(fanout.Parked(fresh_pool, admission, slot_free, report).wait(job), 5)

    assert (admission.busy, admission.unparking, slot_free.is_set()) == (1, 0, False)


async def _fail_child(pool: asyncpg.Pool, kid: str, code: str, *, input_fault: bool) -> None:
    child = await lifecycle.claim(pool, kid, "w-b")
    assert child is not None
    status = await lifecycle.fail(
        pool,
        child,
        "w-b",
        code,
        f"{code} in page 12",
        retryable=False,
        prefix=PREFIX,
        input_fault=input_fault,
    )
    assert status == "failed"


async def test_a_child_failed_by_its_input_fails_its_parked_parent_at_once(
    fresh_pool: asyncpg.Pool, seed: Seeder
) -> None:
    """A child failed for the platform (``INTERNAL``, even with a failure charge recorded) leaves
    its part to the parent; one failed
    because of its input ends the parent's wait with :class:`fanout.ChildFailed`, its code, while
    another child is still queued, and the slots stay balanced."""
    job, kids = await _fanned_out(fresh_pool, seed, 3)
    admission = Admission(slots=1, min_available_mb=0)
    admission.busy = 1

    async def report(_job: lifecycle.ClaimedJob, fraction: float, stage: str) -> None:
        return None

    waiting = asyncio.create_task(fanout.Parked(fresh_pool, admission, asyncio.Event(), report).wait(job))
    # Its sandbox child reported an input fault, then a later step failed the attempt INTERNAL:
    # the recorded code is the platform's.
    await _fail_child(fresh_pool, kids[0], "INTERNAL", input_fault=True)
    await asyncio.sleep(2 * fanout.POLL_SECONDS)
    assert not waiting.done()
    await _fail_child(fresh_pool, kids[2], "TIMEOUT", input_fault=True)

    try:
        await asyncio.wait_for(waiting, 10)
    except fanout.ChildFailed as exc:
        failed = exc
    else:
        raise AssertionError("the wait ended without ChildFailed")
    assert failed.error_code == "TIMEOUT" and not failed.retryable
    assert failed.public_message == "part 3, done by a child job, failed: TIMEOUT in page 12"
    assert admission.busy == 1
    assert await _statuses(fresh_pool, kids) == ["failed", "queued", "failed"]


async def test_a_later_attempt_whose_child_failed_by_its_input_fails_before_its_grant(
    fresh_pool: asyncpg.Pool, seed: Seeder
) -> None:
    job, kids = await _fanned_out(fresh_pool, seed, 2)
    await _fail_child(fresh_pool, kids[1], "CORRUPT_INPUT", input_fault=True)
    admission = Admission(slots=1, min_available_mb=0)
    admission.busy = 1

    async def report(_job: lifecycle.ClaimedJob, fraction: float, stage: str) -> None:
        return None

    parked = fanout.Parked(fresh_pool, admission, asyncio.Event(), report)
    try:
        await asyncio.wait_for(parked.wait(job), 5)
    except fanout.ChildFailed as exc:
        assert exc.error_code == "CORRUPT_INPUT"
    else:
        raise AssertionError("the wait ended without ChildFailed")
    assert (admission.busy, admission.unparking, parked.jobs) == (1, 0, set())
