"""``python -m services.mediaworker``: the worker of queue ``media`` (issue 7; so far ``probe`` and
``waveform`` with PyAV, :mod:`hypermedia.media.engine`). Configures
:func:`hypermedia.workerservice.serve_worker`: the engine runs in :class:`hypermedia.sandbox.Sandbox`
children whose zygote has imported PyAV and the engine (importing ``av`` starts no thread), so a
crash in FFmpeg's libraries fails the attempt, not the worker.

Its defaults differ from the imageworker's: ``HM_WORKER_QUEUE`` is ``media`` and
``HM_WORKER_SLOTS`` is 1 (the seed's media profile: one job at a time, 30 s – 30 min) when the
environment does not set them. Any queue other than ``media`` is a configuration error (exit 78).
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import Any, Final

from hypermedia.lifecycle import ClaimedJob
from hypermedia.media.probe import MediaLimits
from hypermedia.runtime import SandboxHandler
from hypermedia.service import Lifetime, run_service
from hypermedia.workerservice import queue_worker_settings, serve_worker

QUEUE: Final = "media"
DEFAULT_SLOTS: Final = 1


class MediaHandler(SandboxHandler):
    """Runs :func:`hypermedia.media.engine.run` with the profile's limits: input size and the
    longest media (``max_duration_seconds``: ``MEDIA_TOO_LONG`` from the header or a demux pass,
    before anything is decoded at length)."""

    entry = "hypermedia.media.engine:run"

    def entry_kwargs(self, job: ClaimedJob) -> dict[str, Any]:
        return {
            "limits": MediaLimits(
                max_input_bytes=job.max_input_bytes, max_duration_seconds=float(job.max_duration_seconds)
            )
        }


async def serve(stack: AsyncExitStack, stop: Lifetime) -> None:
    queue_worker_settings("mediaworker", QUEUE, DEFAULT_SLOTS)  # the defaults, and a check of the queue
    await serve_worker(
        stack,
        stop,
        role="mediaworker",
        handler=MediaHandler(),
        preload=("av", "hypermedia.media.engine"),
    )


if __name__ == "__main__":
    run_service("mediaworker", serve)
