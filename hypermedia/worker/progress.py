"""Progress events of one job, held back while the job is young.

A watcher of a job that ends within a second learns nothing from ``downloaded``, ``processed``
and ``uploaded``: its status events come as fast. Each progress event is a Postgres transaction
(issue 17: three a job, more than the job's own work for a 300 ms thumbnail), so a job writes
none until it has run :data:`PROGRESS_AFTER_SECONDS`. An event reported before then is held (the
latest replaces an earlier one) and written when the job reaches that age still running; events
after that are written as they come. A short job writes none; a long one shows where it is from
its first second on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Final

from hypermedia.sandbox import read_progress

log = logging.getLogger(__name__)

PROGRESS_POLL_SECONDS = 2.0
"""How often the progress a sandboxed entry reports (:func:`hypermedia.sandbox.report_progress`) is
read while its child runs; the entry writes it at most every 0.5 s."""

PROGRESS_MIN_STEP = 0.01
"""Least advance of the entry's fraction (0–1) worth a progress event: at most 100 events a job."""

PROCESSING_PROGRESS = (0.25, 0.75)
"""The span of the job's progress the sandbox run covers: ``downloaded`` is 0.25, ``processed``
0.75, and the entry's fraction ``f`` is recorded as ``0.25 + 0.5 × f`` (stage ``processing``)."""

PROGRESS_AFTER_SECONDS: Final = 1.0
"""Age of a job (seconds since its worker claimed it) before its progress events are written."""

Write = Callable[[float, str], Awaitable[None]]
"""Records one event: ``(fraction 0–1, stage)``; best effort (the runtime's writer logs a
Postgres outage and goes on)."""


class JobProgress:
    """One job's progress events (see the module docstring).

    Args:
        write: records an event (:data:`Write`).
        after_seconds: the job's age before events are written.
        started: the job's start on ``time.monotonic()`` (default: now).
    """

    def __init__(
        self, write: Write, *, after_seconds: float = PROGRESS_AFTER_SECONDS, started: float | None = None
    ) -> None:
        self._write = write
        self._due = (time.monotonic() if started is None else started) + after_seconds
        self._held: tuple[float, str] | None = None
        self._flush: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        """Keeps the held event's write and a later one in their order."""
        self._closed = False
        self._reached = 0.0
        """The highest fraction reported: an attempt's progress never goes back."""

    async def report(self, fraction: float, stage: str) -> None:
        """Write ``(fraction, stage)`` now if the job is old enough; otherwise hold it until it
        is (replacing an event held before). Nothing after :meth:`close`. A fraction below one
        reported before is raised to it (a fanned-out job's second run starts its own count
        after its children's, :mod:`hypermedia.worker.fanout`)."""
        if self._closed:
            return
        fraction = self._reached = max(fraction, self._reached)
        if time.monotonic() < self._due:
            self._held = (fraction, stage)
            if self._flush is None:
                self._flush = asyncio.create_task(self._write_held_when_due())
            return
        async with self._lock:
            self._held = None  # superseded by this one
            await self._write(fraction, stage)

    async def _write_held_when_due(self) -> None:
        await asyncio.sleep(max(0.0, self._due - time.monotonic()))
        async with self._lock:
            held, self._held = self._held, None
            if held is None or self._closed:
                return
            try:
                await self._write(*held)
            except Exception:
                log.warning("progress event not recorded", exc_info=True)

    def close(self) -> None:
        """The job ended: an event still held is dropped, none is written after this."""
        self._closed = True
        waiting = self._held is not None  # else the flush is writing (or done): let it end
        self._held = None
        if waiting and self._flush is not None and not self._flush.done():
            self._flush.cancel()


async def relay_sandbox_progress(job_dir: Path, finished: asyncio.Event, report: Write) -> None:
    """Until ``finished``: every :data:`PROGRESS_POLL_SECONDS` the fraction the sandboxed entry
    last reported (:func:`hypermedia.sandbox.read_progress` on ``job_dir``), once it advanced by
    :data:`PROGRESS_MIN_STEP` since the last event, is reported as stage ``processing`` in
    :data:`PROCESSING_PROGRESS`. Best effort: never raises, so it never fails the job."""
    low, high = PROCESSING_PROGRESS
    recorded = 0.0
    while True:
        try:
            await asyncio.wait_for(finished.wait(), PROGRESS_POLL_SECONDS)
            return
        except TimeoutError:
            pass
        try:
            fraction = read_progress(job_dir)
            if fraction is not None and fraction >= recorded + PROGRESS_MIN_STEP:
                recorded = fraction
                await report(low + (high - low) * fraction, "processing")
        except Exception:
            log.warning("progress not relayed", exc_info=True, extra={"job_id": job_dir.name})
