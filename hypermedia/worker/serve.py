"""What every worker service runs: the ``WorkerService`` status API and :func:`serve_worker`, the
wiring of :class:`hypermedia.worker.runtime.WorkerRuntime` that a worker's ``__main__`` only configures."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import grpc
import httpx
from google.protobuf import timestamp_pb2
from prometheus_client import REGISTRY

from hypermedia.api.worker.v1 import worker_pb2, worker_pb2_grpc
from hypermedia.core import config
from hypermedia.infra import db, mtls, rpc
from hypermedia.infra.service import (
    EXIT_CONFIG,
    EXIT_LEASE,
    ExitWith,
    Lifetime,
    every,
    open_peers,
    open_postgres,
)
from hypermedia.jobs import queues
from hypermedia.sandbox import DEFAULT_CHILD_ENV, Sandbox, layers, make_undumpable
from hypermedia.worker import preemption
from hypermedia.worker.gauges import WorkerCollector
from hypermedia.worker.handler import JobHandler
from hypermedia.worker.runtime import WorkerRuntime
from hypermedia.worker.settings import WorkerSettings
from hypermedia.worker.unit import lease, peer

log = logging.getLogger(__name__)


class WorkerStatusService(worker_pb2_grpc.WorkerServiceServicer):
    """``GetStatus`` of a worker process and each of its lanes (``runtimes``, one per queue): the
    totals (``queue``, ``slots_total``, ``slots_busy``) are of the ordinary lanes; ``queues`` lists
    the scheduler consumers too (``sched.images``, ADR 0073)."""

    def __init__(
        self,
        runtimes: Sequence[WorkerRuntime],
        sandbox_layers: Sequence[layers.Layer] = (),
        link: peer.ControlLink | None = None,
    ) -> None:
        self._runtimes = list(runtimes)
        self._runtime = self._runtimes[0]
        self._link = link
        self._layers = [
            worker_pb2.SandboxLayer(name=layer.name, available=layer.available, detail=layer.detail)
            for layer in sandbox_layers
        ]

    async def GetStatus(
        self, request: worker_pb2.GetStatusRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.GetStatusResponse:
        rt = self._runtime
        started = timestamp_pb2.Timestamp()
        started.FromSeconds(int(rt.started_at))
        lanes = [self._queue_status(each) for each in self._runtimes]
        ordinary = [lane for lane in lanes if not queues.is_sched(lane.queue)]
        return worker_pb2.GetStatusResponse(
            unit=self._unit_status(),
            worker_id=rt.worker_id,
            queue=",".join(lane.queue for lane in ordinary),
            slots_total=sum(lane.slots_total for lane in ordinary),
            slots_busy=sum(lane.slots_busy for lane in ordinary),
            admission_open=rt.admission.open,
            reason=rt.admission.reason,
            sample_age_seconds=time.monotonic() - rt.admission.sampled_at,
            jobs_completed=sum(lane.jobs_completed for lane in lanes),
            jobs_failed=sum(lane.jobs_failed for lane in lanes),
            started_at=started,
            available_memory_mb=rt.admission.available_mb,
            pid_headroom=rt.admission.pids_free,
            sandbox_layers=self._layers,
            sandbox_require=rt.settings.sandbox_require,
            queues=lanes,
        )

    @staticmethod
    def _queue_status(rt: WorkerRuntime) -> worker_pb2.QueueStatus:
        rt.admission.sample()
        message = rt.admission.control
        return worker_pb2.QueueStatus(
            queue=rt.settings.queue,
            worker_id=rt.worker_id,
            slots_total=rt.admission.slots,
            slots_busy=rt.admission.busy,
            admission_open=rt.admission.open,
            reason=rt.admission.reason,
            jobs_completed=rt.jobs_completed,
            jobs_failed=rt.jobs_failed,
            admission_target=int(message.get("target", -1)),
            decision_reason=str(message.get("reason", "")),
            backlog=int(message.get("backlog", 0)),
            job_memory_mb=int(message.get("job_memory_mb", 0)),
            job_memory_source=str(message.get("job_memory_source", "")),
        )

    def _unit_status(self) -> worker_pb2.UnitStatus | None:
        link = self._link
        if link is None:
            return None
        identity = link.identity
        message = self._runtime.admission.control
        sample = message.get("sample") or {}
        now = time.monotonic()
        mb = 1024 * 1024
        return worker_pb2.UnitStatus(
            deployment=identity.deployment,
            unit=identity.unit,
            boot=identity.boot,
            epoch=identity.epoch,
            generation=identity.generation,
            evidence_matched=link.evidence_matched,
            admission_target=int(message.get("target", -1)),
            decision_reason=str(message.get("reason", "")),
            decision_age_seconds=now - float(message["decided_at"]) if "decided_at" in message else -1.0,
            sample_age_seconds=now - float(sample["taken_at"]) if sample else -1.0,
            memory_current_mb=int(sample.get("memory_current") or 0) // mb,
            memory_peak_mb=int(sample.get("memory_peak") or 0) // mb,
            memory_limit_mb=int(sample.get("memory_limit") or 0) // mb,
            pids_current=int(sample.get("pids_current") or 0),
            pids_limit=int(sample.get("pids_limit") or 0),
            memory_pressure=float(sample["memory_pressure"])
            if sample.get("memory_pressure") is not None
            else -1.0,
            backlog=int(message.get("backlog", 0)),
            job_memory_mb=int(message.get("job_memory_mb", 0)),
            job_memory_source=str(message.get("job_memory_source", "")),
            refused_messages=int(message.get("refused", 0)) + link.refused,
        )


def queue_worker_settings(role: str, queue: str, default_slots: int) -> WorkerSettings:
    """The settings of a worker service that consumes one queue only (the docworker, the
    ocrworker, the mediaworker): ``HM_WORKER_QUEUE`` (``queue`` or its bulk lane, ``bulk.{queue}``)
    and ``HM_WORKER_SLOTS`` default to ``queue``
    and ``default_slots`` (the environment still overrides them). Pass the result to
    :func:`serve_worker`.

    Raises:
        config.ConfigError: ``HM_WORKER_QUEUE`` names another queue (exit 78), or a setting is
            invalid.
    """
    settings = config.load(WorkerSettings, HM_WORKER_QUEUE=queue, HM_WORKER_SLOTS=default_slots)
    if settings.queue not in (queue, queues.bulk_route(queue)):
        raise config.ConfigError(
            f"invalid configuration:\n  HM_WORKER_QUEUE: the {role} consumes {queue} or {queues.bulk_route(queue)} only"
        )
    return settings


def probe_sandbox_layers(settings: WorkerSettings) -> tuple[layers.Layer, ...]:
    """Probe the isolation layers (:func:`hypermedia.sandbox.layers.probe_layers`), log them in one
    line, and refuse to start when one that ``HM_SANDBOX_REQUIRE`` names is missing.

    Raises:
        config.ConfigError: a required layer is missing (exit 78); the message is one line naming
            each missing layer and how to grant it.
    """
    found = layers.probe_layers_fresh(settings.sandbox_uid_base)
    log.info(
        "sandbox layers: %s (HM_SANDBOX_REQUIRE=%s)",
        layers.summary(found),
        settings.sandbox_require,
        extra={"sandbox_layers": {layer.name: layer.detail for layer in found}},
    )
    try:
        layers.check_required(found, layers.parse_require(settings.sandbox_require))
    except layers.LayersMissing as exc:
        log.error("%s", exc)
        raise config.ConfigError(str(exc)) from None
    return found


async def _control_link(
    stack: AsyncExitStack,
    identity: peer.UnitIdentity,
    runtimes: Sequence[WorkerRuntime],
    pool: asyncpg.Pool,
    handlers: Sequence[JobHandler],
) -> peer.ControlLink:
    """Execution's link to its unit's control: admission stays closed (``awaiting_peer_evidence``)
    on every lane until control answered ``hello`` with matching evidence and the deployment lease
    in Postgres is at this identity's epoch. Control's ``admission`` messages name their queue and
    go to that lane's runtime; the ``status`` every second reports each lane (``queues``) and
    the ordinary lanes' totals. A scheduler consumer (a sched lane, ADR 0073) waits for the
    evidence too, but has no target: control's autoscaler never parks it, and a message naming
    it is refused.

    Raises:
        ExitWith: (75) the lease is at another epoch, or none is live: this execution is fenced.
        ConnectionError, OSError: control's socket closed or cannot be reached (exit 69).
    """
    by_queue = {rt.settings.queue: rt for rt in runtimes if not queues.is_sched(rt.settings.queue)}
    for rt in runtimes:
        rt.admission.peer = "awaiting"
        if not queues.is_sched(rt.settings.queue):
            rt.admission.target = 0

    def report() -> dict[str, Any]:
        lanes = {}
        for rt in runtimes:
            rt.admission.sample()
            lanes[rt.settings.queue] = {
                "busy": rt.admission.busy,
                "slots": rt.admission.slots,
                "reason": rt.admission.reason,
                "worker_id": rt.worker_id,
            }
        ordinary = [lane for queue, lane in lanes.items() if queue in by_queue]
        return {
            "busy": sum(lane["busy"] for lane in ordinary),
            "slots": sum(lane["slots"] for lane in ordinary),
            "reason": runtimes[0].admission.reason,
            "worker_id": runtimes[0].worker_id,
            "queues": lanes,
        }

    def on_admission(message: dict[str, Any]) -> None:
        rt = by_queue.get(message.get("queue"))  # type: ignore[arg-type]
        if rt is None:
            link.refused += 1
            log.warning(
                "unit socket: an admission for queue %r refused: no lane serves it", message.get("queue")
            )
            return
        rt.control_admission(message)

    link = peer.ControlLink(identity, os.environ[peer.ENV_SOCKET], on_admission, report)
    stack.push_async_callback(link.close)
    await link.connect(runtimes[0].worker_id)
    epoch = await lease.current_epoch(pool, identity.deployment, identity.unit)
    if epoch != identity.epoch:
        raise ExitWith(
            EXIT_LEASE,
            f"fenced: the deployment lease of unit {identity.unit} is at epoch {epoch}, this execution's is {identity.epoch}",
        )
    for handler in handlers:
        handler.attach_control(link)
    for rt in runtimes:
        rt.admission.peer = "matched"
        rt.admission.sample()
    return link


async def _observe_lease(pool: asyncpg.Pool, identity: peer.UnitIdentity, stop: Lifetime) -> None:
    """Execution observes the deployment lease: at another epoch (or none live), it stops (75)."""
    epoch = await lease.current_epoch(pool, identity.deployment, identity.unit)
    if epoch != identity.epoch:
        log.error(
            "fenced: the deployment lease is at epoch %s, this execution's is %d", epoch, identity.epoch
        )
        stop.fail(f"fenced by epoch {epoch}", EXIT_LEASE)


async def _cancelled(*tasks: asyncio.Task[None]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


@dataclass(frozen=True)
class Lane:
    """One queue a worker process serves, in a sandbox of its own: the settings (queue, slots,
    sandbox uid base), the handler of its jobs, the modules its zygote imports once so children
    start warm, the whole environment of its children (the worker's own is never inherited, e.g.
    the ocrworker's with ``TESSDATA_PREFIX``) and ``periodic``: ``(interval_seconds, fn)``, where
    ``fn(runtime)`` runs once the lane's runtime exists and then every interval until the drain
    begins (a failing run is logged and retried at the next interval)."""

    role: str
    """Service name, e.g. ``imageworker``: part of the lane's worker id."""
    settings: WorkerSettings
    handler: JobHandler
    preload: Sequence[str]
    periodic: tuple[float, Callable[[WorkerRuntime], Awaitable[object]]] | None = None
    child_env: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_CHILD_ENV))


async def serve_worker(
    stack: AsyncExitStack,
    stop: Lifetime,
    *,
    role: str,
    handler: JobHandler,
    preload: Sequence[str],
    periodic: tuple[float, Callable[[WorkerRuntime], Awaitable[object]]] | None = None,
    child_env: Mapping[str, str] = DEFAULT_CHILD_ENV,
    settings: WorkerSettings | None = None,
) -> None:
    """:func:`serve_lanes` of one :class:`Lane` (a worker of one queue); ``settings`` are read
    from the environment when not given (:func:`queue_worker_settings`)."""
    lane = Lane(role, settings or config.load(WorkerSettings), handler, preload, periodic, child_env)
    await serve_lanes(stack, stop, [lane])


async def serve_lanes(stack: AsyncExitStack, stop: Lifetime, lanes: Sequence[Lane]) -> None:
    """Wire and run one worker process of one or several queues (``lanes``, each with a distinct
    queue): each lane's sandbox zygote (started first, before anything else runs: it must never
    have run a native library such as libvips), then Postgres, NATS and the peer services shared
    by the lanes, a :class:`WorkerRuntime` per lane (its own slots, admission and worker id) and
    one ``WorkerService`` status server. Shutdown order on SIGTERM: status NOT_SERVING, every lane
    stops fetching and drains (35 s), then everything unwinds in reverse.

    The shared settings (deployment, status address, timings, sandbox requirements) are the first
    lane's. Raises config.ConfigError (exit 78) for the unit's socket variables or a required
    sandbox layer that is missing."""
    assert lanes and len({lane.settings.queue for lane in lanes}) == len(lanes), "one lane per queue"
    infra = config.load(config.InfraSettings)
    settings = lanes[0].settings
    try:
        identity = peer.UnitIdentity.from_env(os.environ)
    except ValueError as exc:
        raise config.ConfigError(f"invalid configuration:\n  {peer.ENV_SOCKET}: {exc}") from None
    if identity is not None:
        peer.die_with_control(os.environ)
    # Jobs may run under this process's uid (a worker without root): keep its /proc/<pid>
    # (environment with HM_DATABASE_URL, memory) out of their reach.
    # Before make_undumpable: an undumpable process's /proc/self/uid_map is root's, so a probe
    # child of it could not map its user namespace (the zygote, a fresh exec, is dumpable).
    sandbox_layers = probe_sandbox_layers(settings)
    make_undumpable()
    sandboxes = []
    for lane in lanes:
        own = lane.settings
        sandbox = Sandbox(
            Path(own.work_dir),
            preload=lane.preload,
            env=lane.child_env,
            uid=range(own.sandbox_uid_base, own.sandbox_uid_base + own.slots) if os.geteuid() == 0 else None,
            cgroups=own.sandbox_cgroup,
        )
        await sandbox.start()
        stack.push_async_callback(sandbox.close)
        sandboxes.append(sandbox)
    pool = await open_postgres(stack, infra, max_size=sum(lane.settings.slots for lane in lanes) + 4)
    name = "+".join(lane.role for lane in lanes)
    nc, _js = await queues.open_jetstream(stack, infra, f"{name}-{settings.deployment}")
    tls = mtls.from_environment()
    peers = open_peers(stack, infra, tls)
    http = httpx.AsyncClient(timeout=httpx.Timeout(120.0, connect=5.0))
    stack.push_async_callback(http.aclose)

    runtimes = [
        WorkerRuntime(
            lane.settings,
            lane.role,
            pool,
            nc,
            infra.stream_prefix,
            peers.storage,
            peers.credits,
            sandbox,
            lane.handler,
            http,
        )
        for lane, sandbox in zip(lanes, sandboxes, strict=True)
    ]
    collector = WorkerCollector(runtimes, sandbox_layers)
    REGISTRY.register(collector)
    stack.callback(REGISTRY.unregister, collector)
    link = (
        await _control_link(stack, identity, runtimes, pool, [lane.handler for lane in lanes])
        if identity is not None
        else None
    )
    status_server = rpc.GrpcServer(
        settings.status_bind,
        [
            (
                worker_pb2_grpc.add_WorkerServiceServicer_to_server,
                WorkerStatusService(runtimes, sandbox_layers, link),
            )
        ],
        ["hypermedia.worker.v1.WorkerService"],
        tls=tls,
    )
    await status_server.start()
    stack.push_async_callback(status_server.stop)
    draining = asyncio.Event()
    if link is not None and identity is not None:
        await link.ready()
        linked = asyncio.create_task(link.run())
        observing = asyncio.create_task(
            every(
                settings.heartbeat_seconds,
                functools.partial(_observe_lease, pool, identity, stop),
                draining,
                first_after=True,
            )  # type: ignore[arg-type]
        )

        def control_gone(_: asyncio.Event | asyncio.Task[None]) -> None:
            if not draining.is_set():
                stop.fail("the unit's control closed the socket: stopping", EXIT_LEASE)

        linked.add_done_callback(control_gone)
        stack.push_async_callback(_cancelled, linked, observing)
    for rt in runtimes:
        rt.drain_requested = stop.set  # the scheduler's drain handshake: stop as on SIGTERM
    tasks = [asyncio.create_task(rt.run(draining)) for rt in runtimes]
    if settings.spot_notice != "off":
        watching = asyncio.create_task(preemption.watch(settings, runtimes, draining, pool))
        stack.push_async_callback(_cancelled, watching)

    def crashed(done: asyncio.Task[None]) -> None:
        if not done.cancelled() and done.exception() is not None:
            log.error("worker loop crashed", exc_info=done.exception())
            if db.pooler_mismatch(done.exception()):  # a setting, not a bug: exit 78 and say which
                stop.fail(db.POOLER_HINT, EXIT_CONFIG)
            else:
                stop.fail("worker loop crashed")

    for task in tasks:
        task.add_done_callback(crashed)

    async def shutdown_order() -> None:
        # On SIGTERM: health NOT_SERVING first, then stop fetching and drain (35 s); the servers
        # and connections unwind after that, in reverse order of opening.
        await stop.wait()
        await status_server.not_serving()
        draining.set()

    ordering = asyncio.create_task(shutdown_order())
    reporting = [
        asyncio.create_task(every(lane.periodic[0], functools.partial(lane.periodic[1], rt), draining))
        for lane, rt in zip(lanes, runtimes, strict=True)
        if lane.periodic is not None
    ]

    async def finish() -> None:
        stop.set()
        await ordering
        ended = await asyncio.gather(*tasks, return_exceptions=True)
        for report in reporting:
            await report
        for outcome in ended:
            if isinstance(outcome, BaseException):
                raise outcome

    stack.push_async_callback(finish)
