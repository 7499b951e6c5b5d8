"""``python -m services.imageworker``: the worker of queue ``images`` (thumbnail, resize, compress,
convert with libvips). Only wires; the loop is :class:`hypermedia.runtime.WorkerRuntime`, the
pipeline :mod:`hypermedia.imaging.ops`, run in :class:`hypermedia.sandbox.Sandbox` children."""

from __future__ import annotations

import asyncio
import logging
import os
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import httpx

from hypermedia import config, rpc
from hypermedia.imaging.ops import ImageLimits
from hypermedia.lifecycle import ClaimedJob
from hypermedia.runtime import WorkerRuntime
from hypermedia.sandbox import Sandbox
from hypermedia.service import Lifetime, open_jetstream, open_peers, open_postgres, run_service
from hypermedia.worker.v1 import worker_pb2_grpc
from services.imageworker.status import WorkerStatusService

log = logging.getLogger(__name__)


class ImageHandler:
    """Runs :func:`hypermedia.imaging.ops.run` with the profile's pixel and size limits."""

    entry = "hypermedia.imaging.ops:run"

    def entry_kwargs(self, job: ClaimedJob) -> dict[str, Any]:
        return {"limits": ImageLimits(max_pixels=job.max_pixels, max_input_bytes=job.max_input_bytes)}


async def serve(stack: AsyncExitStack, stop: Lifetime) -> None:
    infra = config.load(config.InfraSettings)
    settings = config.load(config.WorkerSettings)
    # The warm parent is forked before anything else runs: it must never have run libvips.
    sandbox = Sandbox(
        Path(settings.work_dir),
        preload=("pyvips", "hypermedia.imaging.ops"),
        uid=range(settings.sandbox_uid_base, settings.sandbox_uid_base + settings.slots)
        if os.geteuid() == 0
        else None,
    )
    await sandbox.start()
    stack.push_async_callback(sandbox.close)
    pool = await open_postgres(stack, infra, max_size=settings.slots + 4)
    nc, _js = await open_jetstream(stack, infra, f"imageworker-{settings.deployment}")
    peers = open_peers(stack, infra)
    http = httpx.AsyncClient(timeout=httpx.Timeout(120.0, connect=5.0))
    stack.push_async_callback(http.aclose)

    runtime = WorkerRuntime(
        settings,
        "imageworker",
        pool,
        nc,
        infra.stream_prefix,
        peers.storage,
        peers.credits,
        sandbox,
        ImageHandler(),
        http,
    )
    status_server = rpc.GrpcServer(
        settings.status_bind,
        [(worker_pb2_grpc.add_WorkerServiceServicer_to_server, WorkerStatusService(runtime))],
        ["hypermedia.worker.v1.WorkerService"],
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

    async def finish() -> None:
        stop.set()
        await ordering
        await task

    stack.push_async_callback(finish)


if __name__ == "__main__":
    run_service("imageworker", serve)
