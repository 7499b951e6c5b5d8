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
from pathlib import Path

import grpc
import httpx
from google.protobuf import timestamp_pb2

from hypermedia.api.worker.v1 import worker_pb2, worker_pb2_grpc
from hypermedia.core import config
from hypermedia.infra import mtls, rpc
from hypermedia.infra.service import Lifetime, every, open_peers, open_postgres
from hypermedia.jobs import queues
from hypermedia.sandbox import DEFAULT_CHILD_ENV, Sandbox, layers, make_undumpable
from hypermedia.worker.handler import JobHandler
from hypermedia.worker.runtime import WorkerRuntime
from hypermedia.worker.settings import WorkerSettings

log = logging.getLogger(__name__)


class WorkerStatusService(worker_pb2_grpc.WorkerServiceServicer):
    def __init__(self, runtime: WorkerRuntime, sandbox_layers: Sequence[layers.Layer] = ()) -> None:
        self._runtime = runtime
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
        return worker_pb2.GetStatusResponse(
            worker_id=rt.worker_id,
            queue=rt.settings.queue,
            slots_total=rt.admission.slots,
            slots_busy=rt.admission.busy,
            admission_open=rt.admission.open,
            reason=rt.admission.reason,
            sample_age_seconds=time.monotonic() - rt.admission.sampled_at,
            jobs_completed=rt.jobs_completed,
            jobs_failed=rt.jobs_failed,
            started_at=started,
            available_memory_mb=rt.admission.available_mb,
            pid_headroom=rt.admission.pids_free,
            sandbox_layers=self._layers,
            sandbox_require=rt.settings.sandbox_require,
        )


def queue_worker_settings(role: str, queue: str, default_slots: int) -> WorkerSettings:
    """The settings of a worker service that consumes one queue only (the docworker, the
    ocrworker, the mediaworker): ``HM_WORKER_QUEUE`` and ``HM_WORKER_SLOTS`` default to ``queue``
    and ``default_slots`` (the environment still overrides them). Pass the result to
    :func:`serve_worker`.

    Raises:
        config.ConfigError: ``HM_WORKER_QUEUE`` names another queue (exit 78), or a setting is
            invalid.
    """
    settings = config.load(WorkerSettings, HM_WORKER_QUEUE=queue, HM_WORKER_SLOTS=default_slots)
    if settings.queue != queue:
        raise config.ConfigError(
            f"invalid configuration:\n  HM_WORKER_QUEUE: the {role} consumes {queue} only"
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
    """Wire and run one worker service: the sandbox zygote (started first, before anything else
    runs: it must never have run a native library such as libvips), Postgres, NATS, the peer
    services, the :class:`WorkerRuntime` and its ``WorkerService`` status server. Shutdown order on
    SIGTERM: status NOT_SERVING, stop fetching and drain (35 s), then everything unwinds in reverse.

    Args:
        role: service name, e.g. ``imageworker``. handler: the service's sandbox entry point.
        preload: modules the zygote imports once so children start warm.
        periodic: ``(interval_seconds, fn)``: ``fn(runtime)`` runs once the runtime exists and
            then every interval until the drain begins (a failing run is logged and retried at
            the next interval), e.g. the ocrworker's report of its installed languages.
        child_env: the whole environment of the zygote and the job children (the worker's own is
            never inherited), e.g. the ocrworker's with ``TESSDATA_PREFIX``.
        settings: the worker's settings (:func:`queue_worker_settings`); read from the
            environment when not given.
    """
    infra = config.load(config.InfraSettings)
    settings = settings or config.load(WorkerSettings)
    # Jobs may run under this process's uid (a worker without root): keep its /proc/<pid>
    # (environment with HM_DATABASE_URL, memory) out of their reach.
    # Before make_undumpable: an undumpable process's /proc/self/uid_map is root's, so a probe
    # child of it could not map its user namespace (the zygote, a fresh exec, is dumpable).
    sandbox_layers = probe_sandbox_layers(settings)
    make_undumpable()
    sandbox = Sandbox(
        Path(settings.work_dir),
        preload=preload,
        env=child_env,
        uid=range(settings.sandbox_uid_base, settings.sandbox_uid_base + settings.slots)
        if os.geteuid() == 0
        else None,
        cgroups=settings.sandbox_cgroup,
    )
    await sandbox.start()
    stack.push_async_callback(sandbox.close)
    pool = await open_postgres(stack, infra, max_size=settings.slots + 4)
    nc, _js = await queues.open_jetstream(stack, infra, f"{role}-{settings.deployment}")
    tls = mtls.from_environment()
    peers = open_peers(stack, infra, tls)
    http = httpx.AsyncClient(timeout=httpx.Timeout(120.0, connect=5.0))
    stack.push_async_callback(http.aclose)

    runtime = WorkerRuntime(
        settings,
        role,
        pool,
        nc,
        infra.stream_prefix,
        peers.storage,
        peers.credits,
        sandbox,
        handler,
        http,
    )
    status_server = rpc.GrpcServer(
        settings.status_bind,
        [
            (
                worker_pb2_grpc.add_WorkerServiceServicer_to_server,
                WorkerStatusService(runtime, sandbox_layers),
            )
        ],
        ["hypermedia.worker.v1.WorkerService"],
        tls=tls,
    )
    await status_server.start()
    stack.push_async_callback(status_server.stop)
    draining = asyncio.Event()
    task = asyncio.create_task(runtime.run(draining))

    def crashed(done: asyncio.Task[None]) -> None:
        if not done.cancelled() and done.exception() is not None:
            log.error("worker loop crashed", exc_info=done.exception())
            stop.fail("worker loop crashed")

    task.add_done_callback(crashed)

    async def shutdown_order() -> None:
        # On SIGTERM: health NOT_SERVING first, then stop fetching and drain (35 s); the servers
        # and connections unwind after that, in reverse order of opening.
        await stop.wait()
        await status_server.not_serving()
        draining.set()

    ordering = asyncio.create_task(shutdown_order())
    reporting = (
        asyncio.create_task(every(periodic[0], functools.partial(periodic[1], runtime), draining))
        if periodic is not None
        else None
    )

    async def finish() -> None:
        stop.set()
        await ordering
        await task
        if reporting is not None:
            await reporting

    stack.push_async_callback(finish)
