"""``python -m services.mediaworker``: the worker of queue ``media`` (issue 7: ``probe``,
``waveform``, ``poster``, ``transcode_video`` and ``transcode_audio`` with PyAV,
:mod:`hypermedia.engines.media.engine`). Configures :func:`hypermedia.worker.serve.serve_lanes`: the
engine runs in :class:`hypermedia.sandbox.Sandbox` children whose zygote has imported PyAV and the
engine (importing ``av`` starts no thread), so a crash in FFmpeg's libraries fails the attempt,
not the worker.

Its defaults differ from the imageworker's: ``HM_WORKER_QUEUE`` is ``media`` and
``HM_WORKER_SLOTS`` is 1 (the seed's media profile: one job at a time, 30 s – 30 min) when the
environment does not set them. Any queue other than ``media`` is a configuration error (exit 78).

**The media coordinator** (:class:`MediaHandler`, settings :class:`services.mediaworker.settings.MediaSettings`;
in a worker unit it is control's, asked over the unit socket: :mod:`hypermedia.worker.unit.coordinator`):
within the slots, at most ``HM_MEDIA_MAX_VIDEO_JOBS`` (3) ``transcode_video`` and
``HM_MEDIA_MAX_AUDIO_JOBS`` (1) ``transcode_audio`` jobs run at once; ``probe``, ``waveform`` and
``poster`` are bounded by the slots alone. With the default single slot it never holds a job back:
it matters where an operator raises ``HM_WORKER_SLOTS``. A job it holds back waits after its
download, in its slot (so a burst of audio renditions can fill every slot while one of them
runs), with a ``waiting`` progress event; its lease is extended and a cancel request ends it
``cancelled`` without running it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import weakref
from contextlib import AsyncExitStack
from typing import Any, Final

from hypermedia.core import config
from hypermedia.engines.media import rendition_parts, transcode
from hypermedia.engines.media.sources import MediaLimits
from hypermedia.infra.service import Lifetime, run_service
from hypermedia.jobs.lifecycle import ClaimedJob
from hypermedia.sandbox import SandboxLimits
from hypermedia.worker import scheduled
from hypermedia.worker.handler import SandboxHandler
from hypermedia.worker.serve import Lane, queue_worker_settings, serve_lanes
from hypermedia.worker.settings import WorkerSettings
from hypermedia.worker.unit import peer
from hypermedia.worker.unit.coordinator import CoordinatorClient
from services.mediaworker.settings import MediaSettings

QUEUE: Final = "media"
DEFAULT_SLOTS: Final = 1
PRELOAD: Final = ("av", "hypermedia.engines.media.engine")
VIDEO_OPERATION: Final = "transcode_video"
AUDIO_OPERATION: Final = "transcode_audio"


class MediaHandler(SandboxHandler):
    """Runs :func:`hypermedia.engines.media.engine.run` with the profile's limits (input size and the
    longest media, ``max_duration_seconds``: ``MEDIA_TOO_LONG`` from the header or a demux pass,
    before anything is decoded at length), through the media coordinator (:meth:`admit`), with
    the encoder threads of a video transcode counted in its ``RLIMIT_NPROC``
    (:meth:`sandbox_limits`)."""

    entry = "hypermedia.engines.media.engine:run"
    checkpoints = True  # a long transcode's renditions (ADR 0079)
    checkpoint_part_bytes = rendition_parts.MAX_PART_BYTES
    checkpoint_job_bytes = 4 * rendition_parts.MAX_PART_BYTES
    checkpoint_operations: frozenset[str] | None = frozenset({VIDEO_OPERATION})

    def __init__(self, settings: MediaSettings) -> None:
        self.settings = settings
        self._coordinator = local_bounds(settings.max_video_jobs, settings.max_audio_jobs)
        """The operations the coordinator bounds, each with the jobs it admits at once: the
        process's, shared by its media lanes (the ordinary one and its scheduler consumer)."""
        self._remote: CoordinatorClient | None = None

    def threads(self, job: ClaimedJob) -> int:
        """Threads of the job's decoder and of each encoder: ``HM_MEDIA_ENCODER_THREADS`` for
        ``transcode_video``, 1 for everything else (an audio encoder has no threads to use)."""
        return self.settings.encoder_threads if job.operation == VIDEO_OPERATION else 1

    def entry_kwargs(self, job: ClaimedJob) -> dict[str, Any]:
        return {
            "limits": MediaLimits(
                max_input_bytes=job.max_input_bytes,
                max_duration_seconds=float(job.max_duration_seconds),
                threads=self.threads(job),
                part_seconds=self.settings.checkpoint_seconds,
                fan_out_seconds=self.settings.fan_out_seconds or None,
                fan_out_chunk_seconds=self.settings.fan_out_chunk_seconds,
                fan_out=not job.fanned_out and job.parent_job_id is None,
                chunk=job.chunk_index,
            )
        }

    def reproducible(self, job: ClaimedJob) -> bool:
        """A ``transcode_video`` with more than one encoder thread is not: libx264 with frame
        threads writes other bytes at each run (three 480p encodes of one 20 s clip at 2 threads,
        three different files; at one thread, one), as the ``ffmpeg`` command line does with
        ``-threads 2``. Its renditions then get keys of their own job and attempt (ADR 0050), or
        a second transcode of one video overwrote the first one's registered bytes. Every other
        media operation encodes with one thread and writes the same bytes each time."""
        return not (job.operation == VIDEO_OPERATION and self.threads(job) > 1)

    def attach_control(self, link: peer.ControlLink) -> None:
        """Run as a unit's execution: the coordinator is control's, for the whole unit (asked
        over ``link`` with the attempt's identity), when control's evidence says it keeps one."""
        if link.evidence.get("coordinator"):
            self._remote = coordinator_client(link)

    def admit(self, job: ClaimedJob) -> contextlib.AbstractAsyncContextManager[None]:
        """The coordinator's admission of the job's operation (see the module doc): control's
        (:meth:`attach_control`), else this process's semaphore; none for the operations it does
        not bound. Either may be entered in one task and left in another, as
        :meth:`hypermedia.worker.handler.JobHandler.admit` requires."""
        if job.operation not in self._coordinator:
            return contextlib.nullcontext()
        if self._remote is not None:
            return self._remote.admit(job)
        semaphore = self._coordinator.get(job.operation)
        return semaphore if semaphore is not None else contextlib.nullcontext()

    def sandbox_limits(self, job: ClaimedJob, limits: SandboxLimits) -> SandboxLimits:
        """``transcode_video``: ``RLIMIT_NPROC`` raised by the threads its decoder and encoders
        start (:func:`hypermedia.engines.media.transcode.thread_need` for its codec, its requested rungs
        — at most as many renditions are encoded at once — and :meth:`threads`), on top of the
        16 every job has. The memory limit stays the profile's (8 GiB, migration 0013).

        Measured (PyAV 18.1, FFmpeg 8 libraries of the wheel; threads counted in
        ``/proc/self/task`` beyond the interpreter's own, T = ``thread_count``; a thread count of
        1 starts no thread anywhere):

        - frame-threaded decoder (h264, hevc, vp9, libdav1d): T (2 at T=2, 4 at 4, 8 at 8);
        - libx264 with frame threads (``thread_type`` AUTO or FRAME): T + 1 (3 at T=2, 5 at 4),
          T + 3 at 8 (x264's lookahead threads); with slice threads (PyAV's default) 2T;
        - libvpx-vp9 (``row-mt``): T − 1; SVT-AV1 ignores T and follows its ``lp``: 16 threads at
          ``lp=1``, 47 at 2, 61 at 3, 74 at 4, 78 at 5, 82 at 6 (its cap);
        - the filter graph PyAV builds inside each rendition's audio encoder: a pool as large as
          FFmpeg's CPU count, the node's unless bounded — the engine forces it to 1
          (``engine.bound_ffmpeg_cpus``), so none;
        - the whole ``transcode_video`` entry, 1080p source, h264, six rungs, measured with
          FFmpeg's CPU count at T (before it was forced to 1): 20 at T=2, 34 at 4, 70 at 8 without
          sound; 32, 58 and 118 with sound (+T per rung). Three rungs with sound: vp9 11 at T=2,
          25 at 4; av1 149 and 226.

        The filter graphs' threads are not needed, though: FFmpeg runs a graph without its pool
        when it cannot start one, while a decoder or encoder that cannot start a thread fails
        the job. In the sandbox, the six-rung h264 ladder with sound succeeds from
        ``RLIMIT_NPROC`` 24 at T=2, 36 at 4, 60 at 6, 72 at 8, 104 at 12, 136 at 16, and fails
        below (``tests/unit/test_coordinator_and_limits.py``).

        So per encoder T + 3 covers x264 and libvpx up to T = 8, and ``thread_need`` gives
        T + 3 + rungs × (T + 3): 20 for three rungs at the default T = 2 (``RLIMIT_NPROC`` 36),
        35 for six (51; 65 at T=4, 93 at 8, 149 at 16); AV1 gets 24 + 24 T per rung (221 for
        three rungs at 2). Everything else keeps 16."""
        if job.operation != VIDEO_OPERATION:
            return limits
        need = transcode.thread_need(job.params, self.threads(job))
        return dataclasses.replace(limits, nproc=limits.nproc + need)


@functools.cache
def local_bounds(video_jobs: int, audio_jobs: int) -> dict[str, asyncio.Semaphore]:
    """This process's media coordinator without a unit's control: one semaphore per bounded
    operation, the same for every lane that asks with the same bounds."""
    return {VIDEO_OPERATION: asyncio.Semaphore(video_jobs), AUDIO_OPERATION: asyncio.Semaphore(audio_jobs)}


_CLIENTS: weakref.WeakKeyDictionary[peer.ControlLink, CoordinatorClient] = weakref.WeakKeyDictionary()


def coordinator_client(link: peer.ControlLink) -> CoordinatorClient:
    """The one :class:`CoordinatorClient` of ``link``: its request ids are its own and control's
    grants come back by id on the link, so every media lane of an execution (the ordinary one,
    its scheduler consumer, a bulk lane) asks through the same client."""
    client = _CLIENTS.get(link)
    if client is None:
        client = _CLIENTS[link] = CoordinatorClient(link.send)
        link.handlers["media_grant"] = client.granted
        link.on_lost.append(client.lost)
    return client


async def lane(stack: AsyncExitStack, settings: WorkerSettings) -> Lane:
    """The ``media`` lane: its handler with the media settings (``HM_MEDIA_*``; exit 78 when invalid)."""
    return Lane("mediaworker", settings, MediaHandler(config.load(MediaSettings)), PRELOAD)


async def serve(stack: AsyncExitStack, stop: Lifetime) -> None:
    settings = queue_worker_settings("mediaworker", QUEUE, DEFAULT_SLOTS)
    await serve_lanes(stack, stop, await scheduled.with_consumers(stack, [(settings, "mediaworker", lane)]))


if __name__ == "__main__":
    run_service("mediaworker", serve)
