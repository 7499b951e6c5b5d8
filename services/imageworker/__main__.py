"""``python -m services.imageworker``: the worker of queue ``images`` (thumbnail, resize, compress,
convert with libvips). Only configures :func:`hypermedia.worker.serve.serve_worker`: the pipeline
:mod:`hypermedia.engines.imaging.ops`, run in :class:`hypermedia.sandbox.Sandbox` children."""

from __future__ import annotations

from contextlib import AsyncExitStack
from functools import partial
from typing import Any

from hypermedia.engines.imaging.ops import ImageLimits
from hypermedia.infra.service import run_service
from hypermedia.jobs.lifecycle import ClaimedJob
from hypermedia.worker.handler import SandboxHandler
from hypermedia.worker.serve import Lane, serve_worker
from hypermedia.worker.settings import WorkerSettings


class ImageHandler(SandboxHandler):
    """Runs :func:`hypermedia.engines.imaging.ops.run` with the profile's pixel and size limits."""

    entry = "hypermedia.engines.imaging.ops:run"

    def entry_kwargs(self, job: ClaimedJob) -> dict[str, Any]:
        return {"limits": ImageLimits(max_pixels=job.max_pixels, max_input_bytes=job.max_input_bytes)}


PRELOAD = ("pyvips", "hypermedia.engines.imaging.ops")

serve = partial(serve_worker, role="imageworker", handler=ImageHandler(), preload=PRELOAD)


async def lane(stack: AsyncExitStack, settings: WorkerSettings) -> Lane:
    """The ``images`` lane of a worker of several queues (:mod:`services.multiworker`)."""
    return Lane("imageworker", settings, ImageHandler(), PRELOAD)


if __name__ == "__main__":
    run_service("imageworker", serve)
