"""``python -m tests.e2e.media_harness``: the mediaworker as ``services.mediaworker`` wires it
(its :class:`~services.mediaworker.MediaHandler`: coordinator, threads, limits; its settings from
the environment), with one difference: the sandbox entry is :mod:`tests.e2e.media_entries`, whose
run time the test chooses, instead of the media engine."""

from __future__ import annotations

from contextlib import AsyncExitStack

from hypermedia.core import config
from hypermedia.infra.service import Lifetime, run_service
from hypermedia.worker.serve import queue_worker_settings, serve_worker
from services.mediaworker.__main__ import DEFAULT_SLOTS, QUEUE, MediaHandler
from services.mediaworker.settings import MediaSettings


class TimedMediaHandler(MediaHandler):
    entry = "tests.e2e.media_entries:run"


async def serve(stack: AsyncExitStack, stop: Lifetime) -> None:
    settings = queue_worker_settings("mediaworker", QUEUE, DEFAULT_SLOTS)
    media = config.load(MediaSettings)
    await serve_worker(
        stack,
        stop,
        role="mediaworker",
        settings=settings,
        handler=TimedMediaHandler(media),
        preload=("tests.e2e.media_entries",),
    )


if __name__ == "__main__":
    run_service("mediaworker", serve)
