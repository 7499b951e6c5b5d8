"""``python -m services.imageworker``: the worker of queue ``images`` (thumbnail, resize, compress,
convert with libvips). Only configures :func:`hypermedia.worker.serve.serve_worker`: the pipeline
:mod:`hypermedia.engines.imaging.ops`, run in :class:`hypermedia.sandbox.Sandbox` children."""

from __future__ import annotations

from functools import partial
from typing import Any

from hypermedia.engines.imaging.ops import ImageLimits
from hypermedia.infra.service import run_service
from hypermedia.jobs.lifecycle import ClaimedJob
from hypermedia.worker.handler import SandboxHandler
from hypermedia.worker.serve import serve_worker


class ImageHandler(SandboxHandler):
    """Runs :func:`hypermedia.engines.imaging.ops.run` with the profile's pixel and size limits."""

    entry = "hypermedia.engines.imaging.ops:run"

    def entry_kwargs(self, job: ClaimedJob) -> dict[str, Any]:
        return {"limits": ImageLimits(max_pixels=job.max_pixels, max_input_bytes=job.max_input_bytes)}


serve = partial(
    serve_worker,
    role="imageworker",
    handler=ImageHandler(),
    preload=("pyvips", "hypermedia.engines.imaging.ops"),
)


if __name__ == "__main__":
    run_service("imageworker", serve)
