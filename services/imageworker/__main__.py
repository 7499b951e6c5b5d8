"""``python -m services.imageworker``: the worker of queue ``images`` (thumbnail, resize, compress,
convert with libvips). Only configures :func:`hypermedia.worker.serve.serve_lanes`: the pipeline
:mod:`hypermedia.engines.imaging.ops`, run in :class:`hypermedia.sandbox.Sandbox` children, on
the ordinary slots and the scheduler consumer (:mod:`hypermedia.worker.scheduled`)."""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import Any

from hypermedia.engines.imaging.ops import ImageLimits
from hypermedia.infra.service import Lifetime, run_service
from hypermedia.jobs.lifecycle import ClaimedJob
from hypermedia.worker import scheduled
from hypermedia.worker.handler import SandboxHandler
from hypermedia.worker.serve import Lane, queue_worker_settings, serve_lanes
from hypermedia.worker.settings import WorkerSettings

QUEUE = "images"
DEFAULT_SLOTS = 4


class ImageHandler(SandboxHandler):
    """Runs :func:`hypermedia.engines.imaging.ops.run` with the profile's pixel and size limits."""

    entry = "hypermedia.engines.imaging.ops:run"

    def entry_kwargs(self, job: ClaimedJob) -> dict[str, Any]:
        return {"limits": ImageLimits(max_pixels=job.max_pixels, max_input_bytes=job.max_input_bytes)}


PRELOAD = ("pyvips", "hypermedia.engines.imaging.ops")


async def lane(stack: AsyncExitStack, settings: WorkerSettings) -> Lane:
    """The ``images`` lane (also of a worker of several queues, :mod:`services.multiworker`, and
    of the scheduler consumer, :mod:`hypermedia.worker.scheduled`)."""
    return Lane("imageworker", settings, ImageHandler(), PRELOAD)


async def serve(stack: AsyncExitStack, stop: Lifetime) -> None:
    settings = queue_worker_settings("imageworker", QUEUE, DEFAULT_SLOTS)
    await serve_lanes(stack, stop, await scheduled.with_consumers(stack, [(settings, "imageworker", lane)]))


if __name__ == "__main__":
    run_service("imageworker", serve)
