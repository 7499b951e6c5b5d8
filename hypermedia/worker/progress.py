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
from typing import Final

log = logging.getLogger(__name__)

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

    async def report(self, fraction: float, stage: str) -> None:
        """Write ``(fraction, stage)`` now if the job is old enough; otherwise hold it until it
        is (replacing an event held before). Nothing after :meth:`close`."""
        if self._closed:
            return
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
