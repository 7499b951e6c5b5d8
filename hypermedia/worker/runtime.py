"""The worker runtime shared by every worker service. One :class:`WorkerRuntime` per worker process:

- **identity**: ``{deployment}/{role}/{host}/{boot}/g{generation}/{pid}`` (as in the app:worker
  reference), registered in ``workers``;
- **admission**: a fixed number of slots, closed while available memory is below
  ``HM_MIN_AVAILABLE_MEMORY_MB`` or the PID headroom below ``HM_MIN_PID_HEADROOM`` (reopened on a
  fresh sample);
- **fetch → claim → ack**: messages come in priority order (:class:`queues.PriorityFetcher`); the
  job is claimed in Postgres and the message acknowledged once the claim is decided (``term`` when
  the job is no longer claimable, ``nak`` with a delay when its account's cap of running jobs
  holds it: ADR 0060). From then on the Postgres lease (``visibility_timeout``) guards the job,
  not the message (docs/adr/0003);
- **execute**: presigned GET (and an earlier attempt's checkpoints) → fresh sandbox directory →
  the handler's admission (a ``waiting`` progress event while the job waits) → its stage →
  pipeline in the sandboxed child, whose progress reports become progress events and whose
  finished parts are kept (:mod:`hypermedia.worker.checkpointing`) → presigned PUT → register
  outputs → complete (atomically) → charge the work done → clean up; a job whose entry asks to
  fan out parks between two runs of its entry while its children run (:mod:`hypermedia.worker.fanout`);
- **outcomes**: success, retry later (transient), failed at once (permanent), each settled in one
  place (:meth:`_settle_failure` / :meth:`_execute`);
- **heartbeat** every 30 s (leases, cancellations), cancellation polled every second,
  **metrics** every 60 s into ``worker_metrics``; **drain** on SIGTERM: stop fetching, hand back
  the jobs waiting for admission, wait up to 35 s for running jobs, then hand them back.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import asyncpg
import httpx
from nats.aio.client import Client as NatsClient
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind

from hypermedia.api.credits.v1 import credits_pb2_grpc
from hypermedia.api.storage.v1 import storage_pb2, storage_pb2_grpc
from hypermedia.core import telemetry
from hypermedia.core.errors import DomainError, PermanentJobError, TransientError
from hypermedia.infra import db
from hypermedia.infra.service import every, wait_any
from hypermedia.jobs import charges, lifecycle, noop, queues
from hypermedia.jobs.lifecycle import children
from hypermedia.jobs.settlement import Settlement, SettlementBatch
from hypermedia.sandbox import Sandbox, SandboxResult
from hypermedia.worker import fanout, registry
from hypermedia.worker.admission import Admission
from hypermedia.worker.checkpointing import Checkpointing
from hypermedia.worker.handler import JobHandler, JobInput, completion_charge, profile_limits
from hypermedia.worker.outcomes import Outcomes
from hypermedia.worker.progress import PROCESSING_PROGRESS, JobProgress, relay_sandbox_progress
from hypermedia.worker.settings import WorkerSettings
from hypermedia.worker.transfer import Transfers

log = logging.getLogger(__name__)

_tracer = trace.get_tracer(__name__)

T = TypeVar("T")

CANCEL_POLL_SECONDS = 1.0
ADMISSION_NOTICE_SECONDS = 0.05
"""A job its handler has not admitted (:meth:`JobHandler.admit`) within this long records one
``waiting`` progress event; a free admission is entered within a loop turn or two."""

SETTLE_FLUSH_SECONDS = 12.0
"""How long a stopping worker waits for its queued settlements. A call answers in milliseconds;
one to a credits service that does not answer times out after 10 s (``rpc.call``), so this is
one such try and no more. What is still unsent is settled by the reaper's sweep."""


class _Stopped(Exception):
    """The job was stopped (:meth:`WorkerRuntime._stop_job`) before its sandbox ran, and what
    that means is settled already: ``cancelled`` recorded, or the lost lease logged."""


class WorkerRuntime:
    """Runs jobs of one queue. See the module docstring for the loop.

    Args:
        settings: worker configuration.
        role: service name, e.g. ``imageworker``.
        pool: asyncpg pool. nc: NATS client. prefix: stream prefix.
        storage, credits: gRPC stubs of the storage and credits services.
        sandbox: started :class:`Sandbox`. handler: the service's :class:`JobHandler`.
        http: client for presigned URL transfers (no credentials).
    """

    def __init__(
        self,
        settings: WorkerSettings,
        role: str,
        pool: asyncpg.Pool,
        nc: NatsClient,
        prefix: str,
        storage: storage_pb2_grpc.StorageServiceStub,
        credits: credits_pb2_grpc.CreditsServiceStub,
        sandbox: Sandbox,
        handler: JobHandler,
        http: httpx.AsyncClient,
    ) -> None:
        self.settings = settings
        self.role = role
        self.worker_id = registry.worker_identity(settings, role)
        self._pool = pool
        self._nc = nc
        self._prefix = prefix
        self._storage = storage
        self._outcomes = Outcomes(pool, self.worker_id, prefix, SettlementBatch(Settlement(credits)))
        self._sandbox = sandbox
        self._interruptible: dict[str, asyncio.Task[Any]] = {}
        """A job's work before its sandbox (admission, stage), by job id: :meth:`_stop_job` cancels it."""
        self._waiting: set[str] = set()
        """Jobs waiting for admission (:meth:`_admit`); a drain hands them back at once."""
        self._progress_of: dict[str, JobProgress] = {}
        """The progress events of each running job (held back in its first second)."""
        self._handler = handler
        self._transfers = Transfers(storage, http, settings.storage_handoff_socket)
        self._checkpointing = Checkpointing.of(handler, self._transfers, http, pool, self.worker_id)
        self.admission = Admission(
            settings.slots, settings.min_available_memory_mb, settings.min_pid_headroom
        )
        self.running: dict[str, lifecycle.ClaimedJob] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._slot_free = asyncio.Event()
        self._parked = fanout.Parked(pool, self.admission, self._slot_free, self._progress)
        self.jobs_completed = 0
        self.jobs_failed = 0
        self.started_at = time.time()
        self.preempted_within: float | None = None
        """Seconds the drain may take once the instance is being reclaimed (:meth:`preempt`)."""
        self.drain_requested: Callable[[], None] = lambda: None
        """Called when a heartbeat finds this worker's row ``draining`` (the scheduler's drain
        handshake, ADR 0047): the worker process stops, draining as on SIGTERM."""

    def preempt(self, seconds: float) -> None:
        """The instance is reclaimed in ``seconds``: the drain is cut to them, what is still
        running then is handed back ``preempted``, and the worker stops."""
        self.preempted_within = min(seconds, self.preempted_within or seconds)
        self.drain_requested()

    def control_admission(self, message: dict[str, Any]) -> None:
        """A worker unit's control set the admission target (:meth:`Admission.apply_control`); a
        fetch loop parked for it looks again at once."""
        self.admission.apply_control(message)
        self._slot_free.set()

    @property
    def pool(self) -> asyncpg.Pool:
        """The worker's Postgres pool (for a worker service's own periodic work)."""
        return self._pool

    # -- registration and background loops ------------------------------------------------

    async def register(self) -> None:
        """Registers this worker in ``workers`` as running (:func:`registry.register`)."""
        await registry.register(self._pool, self.worker_id, self.settings, self.role)

    async def heartbeat_once(self) -> None:
        """Record liveness, extend the leases of running jobs, stop cancelled ones."""
        if await registry.beat(self._pool, self.worker_id, draining=self.admission.draining):
            log.info("the scheduler asked this worker to drain: stopping (drain handshake)")
            self.drain_requested()
        for job_id in await lifecycle.extend_leases(self._pool, self.worker_id, list(self.running)):
            self._stop_job(job_id)

    async def metrics_once(self) -> None:
        """One ``worker_metrics`` row: CPU, memory, disk, slots, throughput counters, admission."""
        self.admission.sample()
        await registry.record_metrics(
            self._pool,
            self.worker_id,
            self.settings.work_dir,
            busy=self.admission.busy,
            completed=self.jobs_completed,
            failed=self.jobs_failed,
            admission_target=self.admission.target,
            admission_reason=self.admission.reason,
        )

    async def _poll_cancellations(self) -> None:
        self.admission.sample()  # keeps the status fresh while the fetch loop waits for work
        for job_id in await lifecycle.cancel_requested(self._pool, list(self.running)):
            self._stop_job(job_id)

    def _stop_job(self, job_id: str) -> None:
        """Stops a running job wherever it is: its wait for admission or its stage (the handler's
        work before the sandbox, e.g. a LibreOffice conversion) is cancelled, its sandbox child
        killed."""
        work = self._interruptible.get(job_id)
        if work is not None:
            work.cancel()
        self._sandbox.cancel(job_id)

    # -- main loop -------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Fetch and execute until ``stop``; then drain (see :meth:`drain`)."""
        leftovers = self._sandbox.remove_leftovers()
        if leftovers:
            log.warning("removed %d job directories a previous worker left behind", len(leftovers))
        await self.register()
        fetcher = queues.PriorityFetcher(self._nc, self._prefix, self.settings.queue)
        await fetcher.start()
        loops_stop = asyncio.Event()
        loops = [
            asyncio.create_task(
                every(self.settings.heartbeat_seconds, self.heartbeat_once, loops_stop, first_after=True)
            ),
            asyncio.create_task(
                every(self.settings.metrics_seconds, self.metrics_once, loops_stop, first_after=True)
            ),
            asyncio.create_task(
                every(CANCEL_POLL_SECONDS, self._poll_cancellations, loops_stop, first_after=True)
            ),
        ]
        try:
            while not stop.is_set():
                self.admission.sample()
                if not self.admission.open:
                    self._slot_free.clear()
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(wait_any(self._slot_free, stop), 1.0)
                    continue
                free = max(1, self.admission.room)
                msgs = await fetcher.next_batch(stop, free)
                if not msgs:
                    break
                await self._dispatch(msgs)
        finally:
            await fetcher.stop()
            await self.drain()
            if not await self._outcomes.flush(SETTLE_FLUSH_SECONDS):
                log.warning("settlements still unsent at exit; left to the reaper")
            loops_stop.set()
            await asyncio.gather(*loops, return_exceptions=True)
            await self._pool.execute(
                "UPDATE workers SET status = 'stopped' WHERE worker_id = $1", self.worker_id
            )

    async def _dispatch(self, msgs: list[Any]) -> None:
        """Claims the jobs of ``msgs`` (one band's, at most the free slots) in one transaction,
        acks and starts each claimed one, gives back one its account's running-jobs cap holds,
        and terms a malformed message or one whose job is not queued (a duplicate delivery)."""
        batch: list[tuple[Any, queues.JobMessage, Context]] = []
        for msg in msgs:
            try:
                batch.append((msg, queues.JobMessage.decode(msg.data), telemetry.extract(msg.headers)))
            except ValueError:
                log.warning("dropping a malformed queue message")
                await msg.term()
        room = max(0, self.admission.room)  # less than the pull asked for when a parked job came back
        for msg, _message, _parent in batch[room:]:
            await msg.nak()
        if not (batch := batch[:room]):
            return
        # Their slots are taken while they are claimed: a parked job coming back waits for them.
        self.admission.busy += len(batch)
        unstarted = len(batch)
        try:
            unstarted -= await self._claim_and_start(batch)
        finally:
            self.admission.busy -= unstarted

    async def _claim_and_start(self, batch: list[tuple[Any, queues.JobMessage, Context]]) -> int:
        """:meth:`_dispatch`'s claim of ``batch``, whose slots it took; returns how many jobs started."""
        started = 0
        spans = [
            _tracer.start_span("job.claim", context=parent, attributes={"job.id": message.job_id})
            for _msg, message, parent in batch
        ]
        try:
            claimed, held = await lifecycle.claim_retrying(
                self._pool, [m.job_id for _msg, m, _parent in batch], self.worker_id, self.running
            )
        except Exception as exc:
            if not db.is_transient(exc):
                raise
            # Postgres stayed unreachable through the retries: the jobs are still queued there;
            # let the messages come back later rather than crash the worker.
            log.warning("could not claim (Postgres unreachable); messages returned", exc_info=True)
            for msg, _message, _parent in batch:
                await msg.nak(delay=5)
            return 0
        finally:
            for span in spans:
                span.end()
        for msg, message, parent in batch:
            key = lifecycle.job_key(message.job_id) or ""
            job = claimed.pop(key, None)
            if job is None:  # held by its account's running-jobs cap: again later (ADR 0060); or gone
                await (msg.nak(delay=lifecycle.HELD_REDELIVERY_SECONDS) if key in held else msg.term())
                continue
            await msg.ack()
            self.running[job.job_id] = job
            started += 1  # its slot, taken above, is the job's: its task gives it back
            task = asyncio.create_task(self._execute(job, parent))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return started

    async def _db(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """``fn(pool, *args)`` retried across a Postgres restart (:func:`db.retrying`): for the
        lifecycle writes, which are conditional and find their own committed outcome on a retry.
        Raises the last error when Postgres stays away longer than the retry budget."""
        async for attempt in db.retrying():
            with attempt:
                return await fn(self._pool, *args)
        raise AssertionError("unreachable: retrying() re-raises")

    async def _progress(self, job: lifecycle.ClaimedJob, fraction: float, stage: str) -> None:
        """A progress event of a running job, through its :class:`JobProgress`."""
        if (progress := self._progress_of.get(job.job_id)) is not None:
            await progress.report(fraction, stage)

    async def _write_progress(self, job: lifecycle.ClaimedJob, fraction: float, stage: str) -> None:
        """Best effort: a progress event lost to a Postgres outage does not fail the job."""
        try:
            await lifecycle.progress(self._pool, job, self.worker_id, fraction, stage)
        except Exception as exc:
            if not db.is_transient(exc):
                raise
            log.warning("progress event not recorded (Postgres unreachable)", extra={"job_id": job.job_id})

    async def drain(self) -> None:
        """Stop taking work; hand back at once the jobs still waiting for admission (they have
        not started: nothing is lost, and another worker may start them now rather than after
        the drain); wait up to ``drain_seconds`` for running jobs; hand back the rest."""
        self.admission.draining = True
        self.admission.sample()
        if self._tasks:
            log.info("draining %d running jobs", len(self._tasks))
            for job_id in [*self._waiting, *self._parked.jobs]:  # not started, or parked: nothing lost
                await self._hand_back(job_id)
            drain = min(self.settings.drain_seconds, self.preempted_within or self.settings.drain_seconds)
            _done, pending = await asyncio.wait(set(self._tasks), timeout=drain)
            for job_id in list(self.running):
                await self._hand_back(job_id)
            if pending:
                await asyncio.wait(pending, timeout=5)

    async def _hand_back(self, job_id: str) -> None:
        """Stops a running job and returns it to the queue (:func:`lifecycle.hand_back`)."""
        job = self.running.get(job_id)
        if job is not None:
            self._stop_job(job_id)
            preempted = self.preempted_within is not None
            await self._db(
                functools.partial(lifecycle.hand_back, preempted=preempted), job, self.worker_id, self._prefix
            )

    # -- one job ---------------------------------------------------------------------------

    async def _execute(self, job: lifecycle.ClaimedJob, parent: Context) -> None:
        """One job in one span (``job.execute``) that continues the trace of the request that
        created the job; see :meth:`_run_job` for the steps."""
        attributes: dict[str, str | int] = {
            "job.id": job.job_id,
            "job.operation": job.operation,
            "job.attempt": job.attempt,
            "job.queue": job.queue,
        }
        with _tracer.start_as_current_span(
            "job.execute", context=parent, kind=SpanKind.CONSUMER, attributes=attributes
        ):
            await (self._run_noop(job) if job.operation == noop.OPERATION else self._run_job(job))

    async def _run_job(self, job: lifecycle.ClaimedJob) -> None:
        started = time.monotonic()
        job_dir = self._sandbox.prepare(job.job_id)
        self._progress_of[job.job_id] = JobProgress(
            lambda fraction, stage: self._write_progress(job, fraction, stage), started=started
        )
        result: SandboxResult | None = None
        try:
            if job.fanned_out:  # a later attempt: the children still running finish first
                await self._interruptibly(job, started, "children", self._parked.wait(job))
            granted = await self._transfers.grant(job)
            job_input = JobInput(job_dir / "input" / "source", granted.source.mime_type, job_dir)
            with _tracer.start_as_current_span("storage.download"):
                await self._transfers.download(granted.get_url, job_input.path, job.max_input_bytes)
            await self._checkpointing.restore(job, granted, job_dir)
            await self._progress(job, PROCESSING_PROGRESS[0], "downloaded")
            result = await self._process(job, granted, job_input, started)
            if (chunks := fanout.requested(result, job)) is not None:
                spawned = await self._db(children.spawn, job, self.worker_id, self._prefix, chunks - 1)
                # None while this attempt still holds the job: an earlier try of the call committed.
                status = (
                    "processing" if spawned else await self._db(lifecycle.fenced_status, job, self.worker_id)
                )
                if status == "cancel_requested":
                    await self._cancelled(job, started)
                if status != "processing":
                    return  # cancelled, or the lease is lost
                job = self.running[job.job_id] = dataclasses.replace(job, fanned_out=True)
                await self._interruptibly(job, started, "children", self._parked.wait(job))
                granted = await self._transfers.grant(job)  # with the parts the children kept
                fanout.clear_outputs(job_dir)
                await self._checkpointing.restore(job, granted, job_dir)
                result = await self._process(job, granted, job_input, started)
                fanout.requested(result, job)  # a second request is refused
            if result.error_code == "CANCELLED" or job.job_id in await self._db(
                lifecycle.cancel_requested, [job.job_id]
            ):
                await self._cancelled(job, started)
                return
            if result.error_code:
                cls = TransientError if result.retryable else PermanentJobError
                raise cls(result.error_message or "processing failed", result.error_code)
            await self._progress(job, PROCESSING_PROGRESS[1], "processed")
            with _tracer.start_as_current_span("storage.upload", attributes={"outputs": len(result.outputs)}):
                outputs = await self._transfers.upload_all(
                    job, granted, job_dir, result.outputs, reproducible=self._handler.reproducible(job)
                )
            await self._progress(job, 0.95, "uploaded")
            charge = completion_charge(self._handler, job, result.outputs)
            completed = await self._db(
                lifecycle.complete,
                job,
                self.worker_id,
                outputs,
                charge.actual,
                result.duration_ms,
                result.peak_memory_mb,
                charge.lines,
            )
            if not completed:
                if await self._db(lifecycle.fenced_status, job, self.worker_id) == "cancel_requested":
                    # Cancelled while uploading: what was uploaded must not outlive the job.
                    await self._transfers.delete_outputs(job, outputs)
                    await self._cancelled(job, started)
                else:
                    log.warning("lease lost before completion", extra={"job_id": job.job_id})
                return
            self.jobs_completed += 1
            self._outcomes.settle(job, "completed", charge)
        except _Stopped:
            pass  # settled where it was stopped (_interruptibly)
        except DomainError as exc:
            await self._settle_failure(job, exc, started, result)
        except (httpx.HTTPError, OSError) as exc:
            log.warning("transient failure: %s", type(exc).__name__, extra={"job_id": job.job_id})
            await self._settle_failure(
                job, TransientError("object storage transfer failed", "STORAGE_UNAVAILABLE"), started, result
            )
        except Exception:
            log.exception("unexpected failure", extra={"job_id": job.job_id})
            await self._settle_failure(job, TransientError("internal error", "INTERNAL"), started, result)
        finally:
            self._progress_of.pop(job.job_id).close()
            self._sandbox.cleanup(job.job_id)
            self.running.pop(job.job_id, None)
            self.admission.busy -= 1
            self._slot_free.set()

    async def _process(
        self,
        job: lifecycle.ClaimedJob,
        granted: storage_pb2.GrantJobResponse,
        job_input: JobInput,
        started: float,
    ) -> SandboxResult:
        """One run of the job's entry: its admission, its handler's stage, then its sandbox run
        with the progress its entry reports relayed meanwhile (:func:`relay_sandbox_progress`)
        and the parts it finishes kept (:class:`Checkpointing`)."""
        async with contextlib.AsyncExitStack() as admitted:
            await self._interruptibly(job, started, "waiting", self._admit(job, admitted))
            job_input = dataclasses.replace(job_input, entry_kwargs=self._handler.entry_kwargs(job))
            job_input = await self._interruptibly(
                job, started, "staging", self._handler.stage(job, job_input, self._pool)
            )
            finished, job_dir = asyncio.Event(), job_input.job_dir
            relay = asyncio.create_task(
                relay_sandbox_progress(job_dir, finished, lambda f, stage: self._progress(job, f, stage))
            )
            kept = asyncio.create_task(self._checkpointing.keep(job, granted, job_dir, finished))
            try:
                return await self._sandbox.run(
                    job.job_id,
                    self._handler.entry,
                    job.operation,
                    job.params,
                    job_input.path,
                    self._handler.sandbox_limits(job, profile_limits(job)),
                    entry_kwargs=job_input.entry_kwargs,
                )
            finally:
                finished.set()
                await relay  # ends at once: no event of the run is recorded after it
                await kept  # after one last look: a part finished at the end is kept too

    async def _run_noop(self, job: lifecycle.ClaimedJob) -> None:
        """A ``noop`` job (:mod:`hypermedia.jobs.noop`, ADR 0038): no object, sandbox or output;
        completed and settled (nothing to charge) as any job, or failed ``OPERATION_NOT_ENABLED``
        on a worker without ``HM_NOOP_OPERATION``. A cancel request wins as in :meth:`_run_job`."""
        started = time.monotonic()
        try:
            if not self.settings.noop_operation:
                raise PermanentJobError(noop.NOT_ENABLED_MESSAGE, noop.NOT_ENABLED)
            completed = await self._db(
                lifecycle.complete, job, self.worker_id, [], job.estimated_credits, _ms(started), 0
            )
            if completed:
                self.jobs_completed += 1
                self._outcomes.settle(job, "completed", charges.Charge(job.estimated_credits))
            elif await self._db(lifecycle.fenced_status, job, self.worker_id) == "cancel_requested":
                await self._cancelled(job, started)
        except DomainError as exc:
            await self._settle_failure(job, exc, started, None)
        finally:
            self.running.pop(job.job_id, None)
            self.admission.busy -= 1
            self._slot_free.set()

    async def _interruptibly(
        self, job: lifecycle.ClaimedJob, started: float, what: str, work: Coroutine[Any, Any, T]
    ) -> T:
        """Runs ``work``, a step of the job before its sandbox (``what``: ``waiting`` for
        admission, ``staging``), as a task that :meth:`_stop_job` may cancel, and returns its
        result.

        Raises:
            _Stopped: the step was stopped, by a cancel request (the job is then ``cancelled``
                and its hold released here) or because the lease is gone (logged).
            asyncio.CancelledError: the job's own task is being cancelled (shutdown).
        """
        task = asyncio.create_task(work)
        self._interruptible[job.job_id] = task
        try:
            return await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # this job's own task is being cancelled (shutdown)
            if job.job_id in await self._db(lifecycle.cancel_requested, [job.job_id]):
                await self._cancelled(job, started)
            elif self.admission.draining:
                log.info("handed back at the drain while %s", what, extra={"job_id": job.job_id})
            else:
                log.warning("lease lost while %s", what, extra={"job_id": job.job_id})
            raise _Stopped from None
        finally:
            self._interruptible.pop(job.job_id, None)

    async def _admit(self, job: lifecycle.ClaimedJob, admitted: contextlib.AsyncExitStack) -> None:
        """Enters the handler's admission of ``job`` (:meth:`JobHandler.admit`) on ``admitted``,
        which the job's task leaves. Records one ``waiting`` progress event when admission takes
        longer than :data:`ADMISSION_NOTICE_SECONDS`."""
        entering = asyncio.ensure_future(admitted.enter_async_context(self._handler.admit(job)))
        try:
            done, _ = await asyncio.wait({entering}, timeout=ADMISSION_NOTICE_SECONDS)
            if not done:
                self._waiting.add(job.job_id)
                log.info("waiting for admission", extra={"job_id": job.job_id})
                await self._progress(job, PROCESSING_PROGRESS[0], "waiting")
            await entering
        except BaseException:
            # Stopped while waiting: the admission is never entered (or, entered just now, it is
            # already on ``admitted``, which the job's task leaves).
            entering.cancel()
            raise
        finally:
            self._waiting.discard(job.job_id)

    async def _cancelled(self, job: lifecycle.ClaimedJob, started: float) -> None:
        """Finish a cancellation this worker carried out: ``cancelled`` and the hold released. Only
        this path (not a drain's hand-back, which queues the job again) releases the hold."""
        if await self._db(lifecycle.mark_cancelled, job, self.worker_id, _ms(started)):
            self._outcomes.settle(job, "cancelled", None)

    async def _settle_failure(
        self, job: lifecycle.ClaimedJob, exc: DomainError, started: float, result: SandboxResult | None
    ) -> None:
        """The one place a failed attempt is settled (:meth:`Outcomes.failed`)."""
        self.jobs_failed += 1
        duration_ms, peak = (result.duration_ms, result.peak_memory_mb) if result else (_ms(started), 0)
        child_failed = isinstance(exc, fanout.ChildFailed)
        if child_failed and result is None:
            duration_ms = 0  # a later attempt that only waited, parked: its run is its children's
        input_fault = child_failed or (
            result is not None and charges.input_fault(result.error_code, result.killed)
        )
        await self._outcomes.failed(job, exc, duration_ms, peak, input_fault)


def _ms(started: float) -> int:
    return int((time.monotonic() - started) * 1000)
