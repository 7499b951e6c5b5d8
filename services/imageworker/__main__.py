"""``python -m services.imageworker``: the worker of queue ``images`` (thumbnail, resize, compress,
convert with libvips). Only configures :func:`hypermedia.workerservice.serve_worker`: the pipeline
:mod:`hypermedia.imaging.ops`, run in :class:`hypermedia.sandbox.Sandbox` children."""

from __future__ import annotations

from functools import partial
from typing import Any

from hypermedia.imaging.ops import ImageLimits
from hypermedia.lifecycle import ClaimedJob
from hypermedia.runtime import SandboxHandler
from hypermedia.service import run_service
from hypermedia.workerservice import serve_worker


class ImageHandler(SandboxHandler):
    """Runs :func:`hypermedia.imaging.ops.run` with the profile's pixel and size limits."""

    entry = "hypermedia.imaging.ops:run"

    def entry_kwargs(self, job: ClaimedJob) -> dict[str, Any]:
        return {"limits": ImageLimits(max_pixels=job.max_pixels, max_input_bytes=job.max_input_bytes)}


serve = partial(
    serve_worker, role="imageworker", handler=ImageHandler(), preload=("pyvips", "hypermedia.imaging.ops")
)


if __name__ == "__main__":
    run_service("imageworker", serve)
