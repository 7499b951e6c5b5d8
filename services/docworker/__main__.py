"""``python -m services.docworker``: the worker of queue ``documents`` (``pdf_info``,
``pdf_preview``, ``text_extract`` with PDFium). Only configures
:func:`hypermedia.workerservice.serve_worker`: the pipeline :func:`hypermedia.documents.pdf.run`,
run in :class:`hypermedia.sandbox.Sandbox` children whose zygote has imported pyvips and pypdfium2
(PDFium initialised, no thread started: see :mod:`hypermedia.documents.pdf`).

Its defaults differ from the imageworker's: ``HM_WORKER_QUEUE`` is ``documents`` and
``HM_WORKER_SLOTS`` is 2 (the seed's documents profile: 2–4 jobs at once) when the environment
does not set them. Any queue other than ``documents`` is a configuration error (exit 78): this
worker knows no other operations.
"""

from __future__ import annotations

import os
from contextlib import AsyncExitStack
from typing import Any, Final

from hypermedia import config
from hypermedia.documents.pdf import DocumentLimits
from hypermedia.lifecycle import ClaimedJob
from hypermedia.service import Lifetime, run_service
from hypermedia.workerservice import serve_worker

QUEUE: Final = "documents"
DEFAULT_SLOTS: Final = 2


class DocumentHandler:
    """Runs :func:`hypermedia.documents.pdf.run` with the profile's size and per-page pixel limits."""

    entry = "hypermedia.documents.pdf:run"

    def entry_kwargs(self, job: ClaimedJob) -> dict[str, Any]:
        return {"limits": DocumentLimits(max_input_bytes=job.max_input_bytes, max_page_pixels=job.max_pixels)}


async def serve(stack: AsyncExitStack, stop: Lifetime) -> None:
    # serve_worker reads WorkerSettings from the environment; this worker's defaults go there first.
    os.environ.setdefault("HM_WORKER_QUEUE", QUEUE)
    os.environ.setdefault("HM_WORKER_SLOTS", str(DEFAULT_SLOTS))
    if config.load(config.WorkerSettings).queue != QUEUE:
        raise config.ConfigError(
            f"invalid configuration:\n  HM_WORKER_QUEUE: the docworker consumes {QUEUE} only"
        )
    await serve_worker(
        stack,
        stop,
        role="docworker",
        handler=DocumentHandler(),
        preload=("pyvips", "pypdfium2", "hypermedia.documents.pdf"),
    )


if __name__ == "__main__":
    run_service("docworker", serve)
