"""``WorkerRuntime``'s decisions, proven without a whole platform: the real runtime loop
(:meth:`WorkerRuntime.run`) against real Postgres (job rows, attempts, fenced transitions), real
NATS JetStream (the queue messages) and the real credits service over gRPC, with only storage and
the sandbox faked (:mod:`tests.helpers.fakes`). Each test drives the job to a chosen moment through
a fake's hook and asserts what the runtime decided: the job row and its attempts, what storage saw
uploaded, registered and deleted, and whether the job's credits were committed, released or left
held.

Credits are the real ``CreditsService`` behind a real gRPC port (the ``credits`` fixture), not a
recorder: it runs here, and what is asserted is what it wrote (``credit_holds`` status, ledger
rows), so a wrong Commit/Release, or a second one, shows as it would in production.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import asyncpg
import httpx
import pytest
from nats.aio.msg import Msg

from hypermedia.api.credits.v1 import credits_pb2
from hypermedia.engines.contract import OutputFile
from hypermedia.jobs import lifecycle, queues, scaling
from hypermedia.worker import preemption, registry
from hypermedia.worker.runtime import WorkerRuntime
from hypermedia.worker.settings import WorkerSettings
from tests.helpers.fakes import FakeSandbox, FakeStorage, GatedHandler, failure, success
from tests.helpers.metadata import Metadata
from tests.integration.conftest import Broker, Credits, Seeder, Tenant

BALANCE = 10_000
HOLD = 1_200
"""The seeder's ``estimated_credits``: what every job holds, and a completed thumbnail is charged."""
COMMITTED = [("hold", HOLD), ("commit", -1000), ("commit", -(HOLD - 1000))]
"""The ledger of a completed thumbnail: its hold, then base and its megapixels cut to the hold."""
ORIGINAL = b"original bytes of the source object"
THUMB = (
    # The source's size, as the imaging engine reports it: 12 megapixels, charged past the hold.
    OutputFile(
        "thumbnail", "thumb.webp", "image/webp", {"width": 4, "source_width": 4000, "source_height": 3000}
    ),
    b"RIFF\x10\x00\x00\x00WEBPthumb",
)
PREVIEW = (OutputFile("preview", "preview.png", "image/png", {"width": 8}), b"\x89PNG\r\n\x1a\npreview")
OTHER_WORKER = "local/imageworker/elsewhere/boot/g0/1"


@dataclass
class Rig:
    """One worker runtime on a database of its own, with its fakes and the tenant its jobs bill."""

    runtime: WorkerRuntime
    storage: FakeStorage
    sandbox: FakeSandbox
    handler: GatedHandler
    pool: asyncpg.Pool
    seed: Seeder
    broker: Broker
    credits: Credits
    tenant: Tenant

    async def job(self, **kwargs: Any) -> str:
        """A seeded ``thumbnail`` job (``Seeder.job``) whose credits are held as the gateway holds them."""
        job_id = await self.seed.job(self.tenant, **kwargs)
        request = credits_pb2.HoldRequest(account_id=str(self.tenant.account_id))
        request.holds.add(job_id=str(job_id), millicredits=HOLD)
        await self.credits.service.Hold(request, cast(Any, None))
        return str(job_id)

    async def publish(self, job_id: str) -> int:
        """The job's queue message, as the outbox relay publishes it; returns its stream sequence."""
        ack = await self.broker.js.publish(
            queues.subject(self.broker.prefix, "images", 5),
            queues.JobMessage(job_id, "images", 5).encode(),
        )
        return int(ack.seq)

    async def status(self, job_id: str) -> str:
        return str(await self.pool.fetchval("SELECT status FROM processing_jobs WHERE job_id = $1", job_id))

    async def row(self, job_id: str) -> asyncpg.Record:
        return await self.seed.job_row(uuid.UUID(job_id))

    async def attempts(self, job_id: str) -> list[tuple[int, str, str, str | None]]:
        """``(attempt_number, worker_id, status, error_code)`` of the job's attempts, in order."""
        rows = await self.pool.fetch(
            "SELECT attempt_number, worker_id, status, error_code FROM job_attempts "
            "WHERE job_id = $1 ORDER BY attempt_number",
            job_id,
        )
        return [(r["attempt_number"], r["worker_id"], r["status"], r["error_code"]) for r in rows]

    async def credit(self, job_id: str) -> tuple[str, list[tuple[str, int]]]:
        """The job's hold status and its ledger rows ``(kind, amount)`` (a commit is a negative amount: a charge)."""
        hold = await self.pool.fetchval("SELECT status FROM credit_holds WHERE job_id = $1", job_id)
        ledger = await self.pool.fetch(
            "SELECT kind, amount FROM credit_ledger WHERE job_id = $1 ORDER BY entry_id", job_id
        )
        return str(hold), [(r["kind"], r["amount"]) for r in ledger]

    async def job_outputs(self, job_id: str) -> list[tuple[str, str]]:
        rows = await self.pool.fetch(
            "SELECT output_type, key FROM job_outputs WHERE job_id = $1 ORDER BY output_type", job_id
        )
        return [(r["output_type"], r["key"]) for r in rows]

    async def object_keys(self) -> set[str]:
        """Keys of the derived objects storage holds rows for."""
        rows = await self.pool.fetch("SELECT key FROM objects WHERE source_object_id IS NOT NULL")
        return {r["key"] for r in rows}

    async def outbox(self, job_id: str) -> int:
        return len(await self.seed.outbox_rows(uuid.UUID(job_id)))

    @contextlib.asynccontextmanager
    async def loop(self) -> AsyncIterator[tuple[asyncio.Event, asyncio.Task[None]]]:
        """The worker loop (:meth:`WorkerRuntime.run`) running; yields its stop event (setting it
        is SIGTERM's path: the drain) and its task. On exit it is stopped and awaited."""
        stop = asyncio.Event()
        task = asyncio.create_task(self.runtime.run(stop))
        try:
            yield stop, task
        finally:
            stop.set()
            await asyncio.wait_for(task, 30)

    async def run_until(self, done: Callable[[], Awaitable[bool]], timeout: float = 15.0) -> None:
        """Runs the worker loop until ``done()`` holds, then stops it and waits for it to end."""
        async with self.loop() as (_stop, task):
            await _eventually(done, timeout, task)


def _settings(tmp_path: Path, **env: Any) -> WorkerSettings:
    values: dict[str, Any] = {
        "HM_WORKER_QUEUE": "images",
        "HM_WORKER_SLOTS": 4,
        "HM_WORK_DIR": str(tmp_path / "work"),
        "HM_DRAIN_SECONDS": 10,
        "HM_MIN_AVAILABLE_MEMORY_MB": 0,
        "HM_MIN_PID_HEADROOM": 0,
        **env,
    }
    return WorkerSettings(**values)


@pytest.fixture
async def make_rig(
    tmp_path: Path, fresh_pool: asyncpg.Pool, seed: Seeder, broker: Broker, credits: Credits
) -> AsyncIterator[Callable[..., Awaitable[Rig]]]:
    """``await make_rig(admitted=…, **HM_settings)``: a :class:`Rig` whose handler admits
    ``admitted`` jobs at once."""
    clients: list[httpx.AsyncClient] = []

    async def make(admitted: int = 64, **env: Any) -> Rig:
        tenant = await seed.tenant(balance=BALANCE)
        storage = FakeStorage(fresh_pool)
        storage.put_original(f"objects/{tenant.object_id}", ORIGINAL)
        sandbox = FakeSandbox(tmp_path / "work", outcome=success(THUMB, PREVIEW))
        handler = GatedHandler(admitted)
        http = storage.http()
        clients.append(http)
        runtime = WorkerRuntime(
            _settings(tmp_path, **env),
            "imageworker",
            fresh_pool,
            broker.nc,
            broker.prefix,
            cast(Any, storage),
            credits.stub,
            cast(Any, sandbox),
            handler,
            http,
        )
        return Rig(runtime, storage, sandbox, handler, fresh_pool, seed, broker, credits, tenant)

    yield make
    for client in clients:
        await client.aclose()


async def test_completed_job_registers_its_outputs_and_commits(
    make_rig: Callable[..., Awaitable[Rig]],
) -> None:
    """The baseline the other tests depart from: downloaded, run, uploaded, registered, completed,
    committed, cleaned up."""
    rig = await make_rig()
    job_id = await rig.job()
    await rig.publish(job_id)

    await rig.run_until(lambda: _status_is(rig, job_id, "completed"))

    assert [run.input_bytes for run in rig.sandbox.runs] == [ORIGINAL]
    uploaded = {u.key: u.content for u in rig.storage.uploads}
    assert sorted(uploaded.values()) == sorted([THUMB[1], PREVIEW[1]])
    outputs = await rig.job_outputs(job_id)
    assert [t for t, _ in outputs] == ["preview", "thumbnail"]
    assert {k for _, k in outputs} == set(uploaded) == set(rig.storage.registered)
    # Two storage calls for the job, however many outputs: one grant, one registration.
    assert rig.storage.calls == ["GrantJob", "RegisterOutputs"]
    assert rig.storage.deleted == []
    assert await rig.attempts(job_id) == [(1, rig.runtime.worker_id, "completed", None)]
    assert await rig.credit(job_id) == ("committed", COMMITTED)
    assert rig.sandbox.cleaned == [job_id]


async def test_claim_lost_terminates_the_message_and_runs_nothing(
    make_rig: Callable[..., Awaitable[Rig]],
) -> None:
    """A delivery of a job another worker already claimed, and of one cancelled before any claim:
    both messages are terminated (JetStream's MSG_TERMINATED advisory names their sequences),
    nothing is downloaded, run or uploaded, and neither job row nor attempt changes."""
    rig = await make_rig()
    taken = await rig.job(status="processing", attempt_count=1, claimed_by=OTHER_WORKER, lease_in=300)
    cancelled = await rig.job(status="cancelled")
    terminated: list[int] = []

    async def advisory(msg: Msg) -> None:
        terminated.append(int(json.loads(msg.data)["stream_seq"]))

    sub = await rig.broker.nc.subscribe(
        f"$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.{rig.broker.stream('images')}.>", cb=advisory
    )
    await rig.broker.nc.flush()
    sequences = [await rig.publish(taken), await rig.publish(cancelled)]

    async def both_terminated() -> bool:
        return sorted(terminated) == sequences

    try:
        await rig.run_until(both_terminated)
    finally:
        await sub.unsubscribe()

    assert rig.sandbox.runs == [] and rig.storage.gets == [] and rig.storage.uploads == []
    row = await rig.row(taken)
    assert (row["status"], row["claimed_by"], row["attempt_count"]) == ("processing", OTHER_WORKER, 1)
    assert await rig.attempts(taken) == [(1, OTHER_WORKER, "processing", None)]
    row = await rig.row(cancelled)
    assert (row["status"], row["claimed_by"], row["attempt_count"]) == ("cancelled", None, 0)
    assert await rig.attempts(cancelled) == []
    assert rig.runtime.running == {}


async def test_free_slots_are_claimed_in_one_pull_and_one_transaction(
    make_rig: Callable[..., Awaitable[Rig]],
) -> None:
    """With 4 free slots the loop pulls 4 messages of the band in one request and claims their jobs
    in one transaction (one ``claimed_at``: Postgres' ``now()`` is the transaction's start); the
    cancelled job and the one another worker holds are left out, their messages terminated, and
    the two claimed jobs run once each."""
    rig = await make_rig()
    first, second = await rig.job(), await rig.job()
    taken = await rig.job(status="processing", attempt_count=1, claimed_by=OTHER_WORKER, lease_in=300)
    cancelled = await rig.job(status="cancelled")
    terminated: list[int] = []

    async def advisory(msg: Msg) -> None:
        terminated.append(int(json.loads(msg.data)["stream_seq"]))

    stream = rig.broker.stream("images")
    advisories = await rig.broker.nc.subscribe(
        f"$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.{stream}.>", cb=advisory
    )
    pulls = await rig.broker.nc.subscribe(f"$JS.API.CONSUMER.MSG.NEXT.{stream}.images-p5")
    await rig.broker.nc.flush()
    sequences = [await rig.publish(job_id) for job_id in (first, cancelled, second, taken)]

    async def done() -> bool:
        return sorted(terminated) == [sequences[1], sequences[3]] and await _statuses_are(
            rig, [first, second], "completed"
        )

    try:
        await rig.run_until(done)
        first_pull = await pulls.next_msg(timeout=1)
    finally:
        await advisories.unsubscribe()
        await pulls.unsubscribe()

    assert json.loads(first_pull.data)["batch"] == 4
    claimed_at = {(await rig.row(job_id))["claimed_at"] for job_id in (first, second)}
    assert len(claimed_at) == 1, "both claimed by one transaction"
    for job_id in (first, second):
        assert await rig.attempts(job_id) == [(1, rig.runtime.worker_id, "completed", None)]
    assert len(rig.sandbox.runs) == 2
    row = await rig.row(taken)
    assert (row["status"], row["claimed_by"], row["attempt_count"]) == ("processing", OTHER_WORKER, 1)
    row = await rig.row(cancelled)
    assert (row["status"], row["claimed_by"], row["attempt_count"]) == ("cancelled", None, 0)
    assert await rig.attempts(cancelled) == []


async def test_cancel_during_upload_deletes_the_outputs_and_releases(
    make_rig: Callable[..., Awaitable[Rig]],
) -> None:
    """Cancellation requested while the outputs upload: the completion is refused (the job is
    ``cancel_requested``), every uploaded output is deleted from storage, the job ends
    ``cancelled`` and its hold is released, never committed."""
    rig = await make_rig()
    job_id = await rig.job()

    puts: list[str] = []

    async def cancel_now(request: httpx.Request) -> None:
        puts.append(request.url.path)
        if len(puts) == 1:  # the first PUT, before its bytes are stored (both upload at once)
            assert await lifecycle.request_cancel(rig.pool, job_id, str(rig.tenant.account_id)) == (
                "cancel_requested"
            )

    rig.storage.on_put = cancel_now
    await rig.publish(job_id)

    await rig.run_until(lambda: _status_is(rig, job_id, "cancelled"))

    uploaded = {u.key for u in rig.storage.uploads}
    assert len(uploaded) == 2
    assert set(rig.storage.registered) == uploaded
    assert set(rig.storage.deleted) == uploaded
    assert await rig.object_keys() == set()
    assert not uploaded & set(rig.storage.blobs)
    assert await rig.job_outputs(job_id) == []
    assert await rig.attempts(job_id) == [(1, rig.runtime.worker_id, "cancelled", "CANCELLED")]
    assert await rig.credit(job_id) == ("released", [("hold", HOLD), ("release", HOLD)])


async def test_lease_lost_while_running_writes_nothing_and_settles_nothing(
    make_rig: Callable[..., Awaitable[Rig]], caplog: pytest.LogCaptureFixture
) -> None:
    """While the sandbox runs, the reaper expires the job's lease and another worker claims it
    (attempt 2). This worker's registration is fenced off (storage's ``RegisterOutputs`` answers
    ``ATTEMPT_FENCED`` for attempt 1): the job stays the other worker's, none of this attempt's
    outputs is registered or becomes the job's, the credits are not settled."""
    rig = await make_rig()
    job_id = await rig.job()

    async def reaped_and_reclaimed(_job_id: str) -> None:
        await rig.pool.execute(
            "UPDATE processing_jobs SET visibility_timeout = now() - interval '1 second' WHERE job_id = $1",
            job_id,
        )
        assert await lifecycle.expire_leases(rig.pool, rig.broker.prefix, 10) == [(job_id, "queued")]
        assert await lifecycle.claim(rig.pool, job_id, OTHER_WORKER) is not None

    rig.sandbox.during = reaped_and_reclaimed
    await rig.publish(job_id)

    with caplog.at_level(logging.INFO, logger="hypermedia.worker"):  # runtime and outcomes
        await rig.run_until(lambda: _true(bool(rig.sandbox.cleaned)))

    fenced = [r for r in caplog.records if r.getMessage().startswith("job attempt failed: ATTEMPT_FENCED")]
    assert [getattr(r, "job_id", None) for r in fenced] == [job_id]
    row = await rig.row(job_id)
    assert (row["status"], row["claimed_by"], row["attempt_count"]) == ("processing", OTHER_WORKER, 2)
    assert row["completed_at"] is None and row["actual_credits"] is None
    assert await rig.job_outputs(job_id) == []
    # It uploaded (nothing stops a run whose lease was lost) but registers and deletes nothing:
    # the keys are deterministic, the same the job's current attempt registers.
    assert len(rig.storage.uploads) == 2
    assert rig.storage.registered == [] and rig.storage.deleted == []
    assert await rig.attempts(job_id) == [
        (1, rig.runtime.worker_id, "lost", "WORKER_LOST"),
        (2, OTHER_WORKER, "processing", None),
    ]
    assert await rig.credit(job_id) == ("held", [("hold", HOLD)])


async def test_drain_hands_back_waiting_jobs_and_lets_the_running_one_finish(
    make_rig: Callable[..., Awaitable[Rig]],
) -> None:
    """Three jobs, an admission of one: one runs (held mid-run), two wait for admission. When the
    drain starts, the two waiting are handed back at once (``queued`` again with an outbox row,
    their attempt ``lost``, holds still held) while the running one is still running; released,
    it completes and commits."""
    rig = await make_rig(admitted=1)
    rig.sandbox.hold.clear()
    jobs = [await rig.job() for _ in range(3)]
    for job_id in jobs:
        await rig.publish(job_id)

    async with rig.loop() as (stop, task):
        await _eventually(lambda: _running_and_waiting(rig, 1, 2), 15, task)
        [running] = list(rig.sandbox.running)
        waiting = [j for j in jobs if j != running]
        stop.set()
        await _eventually(lambda: _statuses_are(rig, waiting, "queued"), 5, task)
        assert await rig.status(running) == "processing"
        assert list(rig.sandbox.running) == [running]
        rig.sandbox.hold.set()

    assert [run.job_id for run in rig.sandbox.runs] == [running]
    assert await rig.status(running) == "completed"
    assert await rig.credit(running) == ("committed", COMMITTED)
    for job_id in waiting:
        row = await rig.row(job_id)
        assert (row["status"], row["claimed_by"], row["lost_attempts"]) == ("queued", None, 1)
        assert await rig.attempts(job_id) == [(1, rig.runtime.worker_id, "lost", "WORKER_LOST")]
        assert await rig.outbox(job_id) == 1
        assert await rig.credit(job_id) == ("held", [("hold", HOLD)])
    assert rig.sandbox.cancelled == []
    assert sorted(rig.sandbox.cleaned) == sorted(jobs)


async def test_drain_deadline_hands_back_the_running_job(make_rig: Callable[..., Awaitable[Rig]]) -> None:
    """A job still running when ``HM_DRAIN_SECONDS`` runs out is killed and handed back: ``queued``
    with an outbox row, its attempt ``lost``, nothing uploaded, its hold still held (not released:
    it will run again)."""
    rig = await make_rig(HM_DRAIN_SECONDS=0.3)
    rig.sandbox.hold.clear()
    job_id = await rig.job()
    await rig.publish(job_id)

    await rig.run_until(lambda: _true(rig.sandbox.started.is_set()))

    assert rig.sandbox.cancelled == [job_id]
    assert rig.storage.uploads == []
    row = await rig.row(job_id)
    assert (row["status"], row["claimed_by"], row["lost_attempts"]) == ("queued", None, 1)
    assert await rig.attempts(job_id) == [(1, rig.runtime.worker_id, "lost", "WORKER_LOST")]
    assert await rig.outbox(job_id) == 1
    assert await rig.credit(job_id) == ("held", [("hold", HOLD)])


@pytest.mark.parametrize(
    ("code", "retryable", "status", "hold", "ledger"),
    [
        ("TIMEOUT", True, "retry_wait", "held", [("hold", HOLD)]),
        # The input's fault, found by the child: thumbnail's base 1000 and 10 for the run's second.
        ("CORRUPT_INPUT", False, "failed", "committed", [("hold", HOLD), ("commit", -1000), ("commit", -10)]),
        ("PASSWORD_REQUIRED", False, "failed", "released", [("hold", HOLD), ("release", HOLD)]),
    ],
)
async def test_failure_is_retried_or_failed_and_charged_or_released(
    make_rig: Callable[..., Awaitable[Rig]],
    code: str,
    retryable: bool,
    status: str,
    hold: str,
    ledger: list[tuple[str, int]],
) -> None:
    """A retryable failure with attempts left waits for its retry (hold kept for it); a permanent
    one fails the job, charged its minimum when it is the input's fault (ADR 0068), else released.
    Either way nothing is uploaded."""
    rig = await make_rig()
    rig.sandbox.outcome = failure(code, retryable=retryable)
    job_id = await rig.job()
    await rig.publish(job_id)

    await rig.run_until(lambda: _status_is(rig, job_id, status))

    row = await rig.row(job_id)
    assert (row["status"], row["error_code"]) == (status, code)
    assert (row["next_attempt_at"] is not None) == retryable
    assert row["actual_credits"] == (1010 if hold == "committed" else None)
    assert await rig.attempts(job_id) == [(1, rig.runtime.worker_id, "failed", code)]
    assert rig.storage.uploads == []
    assert await rig.credit(job_id) == (hold, ledger)


async def test_a_job_out_of_attempts_by_timeouts_is_charged_every_attempts_run_within_its_price(
    make_rig: Callable[..., Awaitable[Rig]],
) -> None:
    """A hostile file that uses up its CPU time at every attempt: the last one fails the job,
    charged base and the seconds all its timed-out attempts ran (30 s before, 0.03 s now: 31 s,
    310), cut to the 1200 it held. The reaper's sweep would charge the same from the job row."""
    rig = await make_rig()
    rig.sandbox.outcome = failure("TIMEOUT", retryable=True, killed="cpu_time")
    job_id = await rig.job(attempt_count=1, max_attempts=2)
    await rig.pool.execute(
        "INSERT INTO job_attempts (job_id, attempt_number, worker_id, status, error_code, duration_ms) "
        "VALUES ($1, 1, $2, 'failed', 'TIMEOUT', 30000)",
        uuid.UUID(job_id),
        OTHER_WORKER,
    )
    await rig.publish(job_id)

    await rig.run_until(lambda: _status_is(rig, job_id, "failed"))

    row = await rig.row(job_id)
    assert (row["actual_credits"], dict(row["charge_lines"])) == (HOLD, {"run_seconds": HOLD - 1000})
    assert await rig.credit(job_id) == (
        "committed",
        [("hold", HOLD), ("commit", -1000), ("commit", -(HOLD - 1000))],
    )


async def test_a_job_out_of_attempts_by_wall_clock_timeouts_is_released(
    make_rig: Callable[..., Awaitable[Rig]],
) -> None:
    """A wall-clock kill may be a starved host's as much as the input's: not charged."""
    rig = await make_rig()
    rig.sandbox.outcome = failure("TIMEOUT", retryable=True, killed="wall_time")
    job_id = await rig.job(max_attempts=1)
    await rig.publish(job_id)
    await rig.run_until(lambda: _status_is(rig, job_id, "failed"))
    assert (await rig.row(job_id))["actual_credits"] is None
    assert await rig.credit(job_id) == ("released", [("hold", HOLD), ("release", HOLD)])


async def test_cancel_while_running_kills_the_sandbox_and_releases(
    make_rig: Callable[..., Awaitable[Rig]],
) -> None:
    """Cancellation requested while the sandbox runs: the poll (every second) kills the child, the
    job ends ``cancelled`` without uploading, and its hold is released."""
    rig = await make_rig()
    rig.sandbox.hold.clear()
    job_id = await rig.job()

    async def cancel(_job_id: str) -> None:
        await lifecycle.request_cancel(rig.pool, job_id, str(rig.tenant.account_id))

    rig.sandbox.during = cancel
    await rig.publish(job_id)

    await rig.run_until(lambda: _status_is(rig, job_id, "cancelled"))

    assert rig.sandbox.cancelled == [job_id]
    assert rig.storage.uploads == []
    assert await rig.attempts(job_id) == [(1, rig.runtime.worker_id, "cancelled", "CANCELLED")]
    assert await rig.credit(job_id) == ("released", [("hold", HOLD), ("release", HOLD)])


async def test_cancel_while_waiting_for_admission_never_runs(
    make_rig: Callable[..., Awaitable[Rig]],
) -> None:
    """A job waiting for its handler's admission when its cancellation is requested stops waiting:
    ``cancelled`` and released without its sandbox ever running; the admitted job goes on."""
    rig = await make_rig(admitted=1)
    rig.sandbox.hold.clear()
    first, second = await rig.job(), await rig.job()
    await rig.publish(first)
    await rig.publish(second)

    async with rig.loop() as (_stop, task):
        await _eventually(lambda: _running_and_waiting(rig, 1, 1), 15, task)
        [running] = list(rig.sandbox.running)
        waiting = second if running == first else first
        await lifecycle.request_cancel(rig.pool, waiting, str(rig.tenant.account_id))
        await _eventually(lambda: _status_is(rig, waiting, "cancelled"), 5, task)
        rig.sandbox.hold.set()
        await _eventually(lambda: _status_is(rig, running, "completed"), 5, task)

    assert [run.job_id for run in rig.sandbox.runs] == [running]
    assert await rig.attempts(waiting) == [(1, rig.runtime.worker_id, "cancelled", "CANCELLED")]
    assert await rig.credit(waiting) == ("released", [("hold", HOLD), ("release", HOLD)])
    assert await rig.credit(running) == ("committed", COMMITTED)


async def _noop_job(rig: Rig) -> str:
    """A queued ``noop`` job of the rig's tenant with its zero hold, as the gateway creates one."""
    job_id = await rig.seed.job(rig.tenant, estimated_credits=0)
    await rig.pool.execute("UPDATE processing_jobs SET operation = 'noop' WHERE job_id = $1", job_id)
    request = credits_pb2.HoldRequest(account_id=str(rig.tenant.account_id))
    request.holds.add(job_id=str(job_id), millicredits=0)
    await rig.credits.service.Hold(request, cast(Any, None))
    return str(job_id)


async def test_noop_job_completes_without_object_sandbox_or_output_and_is_settled_at_zero(
    make_rig: Callable[..., Awaitable[Rig]],
) -> None:
    """ADR 0038: with ``HM_NOOP_OPERATION`` a ``noop`` job goes claim → complete → commit of
    nothing; storage and the sandbox are never called."""
    rig = await make_rig(HM_NOOP_OPERATION=True)
    job_id = await _noop_job(rig)
    await rig.publish(job_id)

    await rig.run_until(lambda: _status_is(rig, job_id, "completed"))

    assert rig.sandbox.runs == [] and rig.storage.uploads == [] and rig.storage.registered == []
    assert await rig.job_outputs(job_id) == []
    assert await rig.attempts(job_id) == [(1, rig.runtime.worker_id, "completed", None)]
    hold, ledger = await rig.credit(job_id)
    assert hold == "committed" and all(amount == 0 for _, amount in ledger)
    assert (
        await rig.pool.fetchval("SELECT actual_credits FROM processing_jobs WHERE job_id = $1", job_id) == 0
    )
    events = await rig.pool.fetch(
        "SELECT status FROM job_events WHERE job_id = $1 AND kind = 'status' ORDER BY event_id", job_id
    )
    assert [e["status"] for e in events][-1] == "completed"


async def test_noop_job_fails_at_once_on_a_worker_that_does_not_enable_it(
    make_rig: Callable[..., Awaitable[Rig]],
) -> None:
    """Without ``HM_NOOP_OPERATION`` (the default) a ``noop`` job that got past a gateway fails
    permanently with OPERATION_NOT_ENABLED, never retried, and its hold is released."""
    rig = await make_rig()
    job_id = await _noop_job(rig)
    await rig.publish(job_id)

    await rig.run_until(lambda: _status_is(rig, job_id, "failed"))

    row = await rig.row(job_id)
    assert (row["error_code"], row["attempt_count"]) == ("OPERATION_NOT_ENABLED", 1)
    assert "HM_NOOP_OPERATION" in row["error_message"]
    assert rig.sandbox.runs == []
    assert (await rig.credit(job_id))[0] == "released"


async def test_the_noop_profile_can_never_be_priced(fresh_pool: asyncpg.Pool) -> None:
    """Migration 0018's CHECK: neither a base cost nor a per-MB price can be set on ``noop``."""
    for column in ("base_cost", "per_mb"):
        with pytest.raises(asyncpg.CheckViolationError):
            await fresh_pool.execute(f"UPDATE processing_profiles SET {column} = 1 WHERE operation = 'noop'")
    with pytest.raises(asyncpg.CheckViolationError):
        await fresh_pool.execute(
            "INSERT INTO processing_profiles (operation, version, queue, base_cost, per_mb, timeout_seconds,"
            " max_attempts, max_input_bytes, input_kinds) VALUES ('noop', 2, 'images', 5, 0, 30, 3, 1, '{image}')"
        )


async def _eventually(check: Callable[[], Awaitable[bool]], timeout: float, loop: asyncio.Task[None]) -> None:
    """Returns once ``check()`` holds (polled every 20 ms). Raises TimeoutError after ``timeout``
    seconds, AssertionError when the worker ``loop`` ended meanwhile."""
    async with asyncio.timeout(timeout):
        while True:
            if await check():
                return
            assert not loop.done(), f"the worker loop ended: {loop}"
            await asyncio.sleep(0.02)


async def _status_is(rig: Rig, job_id: str, status: str) -> bool:
    return await rig.status(job_id) == status


async def _statuses_are(rig: Rig, job_ids: list[str], status: str) -> bool:
    return all([await rig.status(job_id) == status for job_id in job_ids])


async def _running_and_waiting(rig: Rig, running: int, waiting: int) -> bool:
    """``running`` jobs in the sandbox and ``waiting`` that recorded a ``waiting`` progress event."""
    return len(rig.sandbox.running) == running and await _waiting_events(rig) == waiting


async def _true(value: bool) -> bool:
    return value


async def _waiting_events(rig: Rig) -> int:
    """Jobs that recorded a ``waiting`` progress event (waiting for admission)."""
    return int(
        await rig.pool.fetchval(
            "SELECT count(DISTINCT job_id) FROM job_events WHERE detail->>'stage' = 'waiting'"
        )
    )


# -- spot interruption notices (hypermedia/worker/preemption.py), from a fake metadata service -----
# Mid-job, the notice cuts the drain to the time left, the running job is handed back
# ``preempted`` (its attempts against ``max_attempts`` unchanged) and another worker completes it.


@pytest.fixture
def metadata() -> Iterator[Metadata]:
    server = Metadata()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


async def test_a_notice_mid_job_hands_it_back_preempted_and_another_worker_completes_it(
    make_rig: Callable[..., Awaitable[Rig]],
    metadata: Metadata,
) -> None:
    spot = await make_rig(
        HM_SPOT_NOTICE="ec2",
        HM_SPOT_METADATA_URL=metadata.url,
        HM_SPOT_POLL_SECONDS=0.1,
        HM_DRAIN_SECONDS=300,
    )
    spot.sandbox.hold.clear()  # the job runs until the drain ends it
    job_id = await spot.job()
    await spot.publish(job_id)
    await registry.register(spot.pool, spot.runtime.worker_id, spot.runtime.settings, "imageworker")
    listener = await spot.pool.acquire()
    woken: list[object] = []
    notified = asyncio.Event()

    def wake(*args: object) -> None:
        woken.append(args[-1])
        notified.set()

    await listener.add_listener(scaling.WAKE_CHANNEL, wake)
    async with spot.loop() as (stop, task):
        watching = asyncio.create_task(
            preemption.watch(spot.runtime.settings, [spot.runtime], stop, spot.pool)
        )
        spot.runtime.drain_requested = stop.set
        await asyncio.wait_for(spot.sandbox.started.wait(), 15)
        await asyncio.sleep(0.3)
        assert not stop.is_set() and not watching.done(), "no notice yet: the worker goes on"
        metadata.notice_in = 12.0  # reclaimed in 12 s: the drain gets 12 - 10 = 2 s of it
        loop = asyncio.get_running_loop()
        noticed = loop.time()
        await asyncio.wait_for(notified.wait(), 5)
        announced_status = await spot.pool.fetchval(
            "SELECT status FROM workers WHERE worker_id = $1", spot.runtime.worker_id
        )
        await asyncio.wait_for(task, 15)
        took = loop.time() - noticed
        await watching
    assert took < 6, f"the drain was cut to the notice, not HM_DRAIN_SECONDS (took {took:.1f}s)"
    assert set(metadata.seen_tokens) == {metadata.token}, "IMDSv2: every read with the session token"
    assert woken == ["preempted"], "the scheduler is woken to replace the capacity at once"
    assert announced_status == "draining", "the scheduler counts it out of the live capacity at once"
    await listener.remove_listener(scaling.WAKE_CHANNEL, wake)
    await spot.pool.release(listener)
    assert spot.sandbox.cancelled == [job_id]
    row = await spot.row(job_id)
    assert (row["status"], row["attempt_count"] - row["lost_attempts"]) == ("queued", 0)
    assert await spot.attempts(job_id) == [(1, spot.runtime.worker_id, "preempted", "PREEMPTED")]

    elsewhere = await make_rig()
    elsewhere.storage.put_original(f"objects/{spot.tenant.object_id}", ORIGINAL)
    await elsewhere.publish(job_id)
    await elsewhere.run_until(lambda: _status_is(elsewhere, job_id, "completed"))
    attempts = await elsewhere.attempts(job_id)
    assert [(a[2], a[3]) for a in attempts] == [("preempted", "PREEMPTED"), ("completed", None)]
    assert attempts[1][1] == elsewhere.runtime.worker_id


async def test_gce_preemption_is_read_from_its_metadata_flag(
    make_rig: Callable[..., Awaitable[Rig]],
    metadata: Metadata,
) -> None:
    rig = await make_rig(HM_SPOT_NOTICE="gce", HM_SPOT_METADATA_URL=metadata.url)
    settings = rig.runtime.settings
    async with httpx.AsyncClient() as http:
        assert await preemption.notice_seconds(settings, http, []) is None
        metadata.notice_in = 0.0
        assert await preemption.notice_seconds(settings, http, []) == preemption.GCE_NOTICE_SECONDS
    # An unreachable metadata service is asked again, never a stop.
    unreachable = rig.runtime.settings.model_copy(
        update={"spot_metadata_url": "http://127.0.0.1:9", "spot_poll_seconds": 0.05}
    )
    stop = asyncio.Event()
    watching = asyncio.create_task(preemption.watch(unreachable, [rig.runtime], stop))
    await asyncio.sleep(0.5)
    assert not watching.done() and rig.runtime.preempted_within is None
    stop.set()
    await asyncio.wait_for(watching, 5)
