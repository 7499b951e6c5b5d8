"""Job events: one source for REST Server-Sent Events and gRPC ``WatchJob``.

Rows of ``job_events`` are written by a trigger in the transaction of every status change
(migration 0003) and by workers for progress (:func:`hypermedia.jobs.lifecycle.progress`); each insert
notifies the Postgres channel ``job_events`` with the job id. A :class:`JobEventHub` holds one
``LISTEN`` connection per process and wakes the watchers of that job, which then read the new rows
— so a watcher never misses an event (it always reads from its last ``event_id``) and never polls
faster than needed (it re-reads on notification, or every ``keepalive_seconds``).

When the ``LISTEN`` connection drops (Postgres restarted), the hub reconnects with backoff and then
wakes every watcher, since notifications sent while it was away are lost; meanwhile watchers still
re-read every ``keepalive_seconds``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from hypermedia.infra import db

log = logging.getLogger(__name__)

CHANNEL = "job_events"
TERMINAL_STATUSES = frozenset({"completed", "failed", "cancelled"})


@dataclass(frozen=True)
class JobEvent:
    """One event. ``kind`` is ``status`` or ``progress``; ``progress`` is 0..1 for progress events."""

    event_id: int
    job_id: str
    kind: str
    status: str
    progress: float | None
    detail: dict[str, Any]
    created_at: datetime

    @property
    def terminal(self) -> bool:
        return self.kind == "status" and self.status in TERMINAL_STATUSES

    def as_json(self) -> dict[str, Any]:
        return {
            "event_id": self.event_id,
            "job_id": self.job_id,
            "kind": self.kind,
            "status": self.status,
            "progress": self.progress,
            "detail": self.detail,
            "created_at": self.created_at.isoformat(),
        }


class JobEventHub:
    """Fan-out of ``job_events`` notifications to watchers in this process.

    Args:
        pool: reads the events. dsn: for the dedicated LISTEN connection.
        keepalive_seconds: longest wait between two reads; :meth:`watch` yields ``None`` then, so
            streams can send a keep-alive.
    """

    def __init__(self, pool: asyncpg.Pool, dsn: str, *, keepalive_seconds: float = 15.0) -> None:
        self._pool = pool
        self._dsn = dsn
        self._keepalive = keepalive_seconds
        self._listener: asyncpg.Connection | None = None
        self._waiters: dict[str, set[asyncio.Event]] = defaultdict(set)
        self._stopping = False
        self._reconnecting: asyncio.Task[None] | None = None
        self.reconnects = 0
        """How many times the LISTEN connection was re-established (for tests and metrics)."""

    async def start(self) -> None:
        """Open the LISTEN connection. Raises asyncpg/OS errors when Postgres is unreachable."""
        await self._listen()

    async def _listen(self) -> None:
        conn = await db.connect(self._dsn)
        await conn.add_listener(CHANNEL, self._notified)
        conn.add_termination_listener(self._lost)
        self._listener = conn

    def _lost(self, _conn: Any) -> None:
        if self._stopping or self._reconnecting is not None:
            return
        log.warning("LISTEN connection lost; reconnecting")
        self._listener = None
        self._reconnecting = asyncio.get_running_loop().create_task(self._reconnect())

    async def _reconnect(self) -> None:
        delay = 0.2
        try:
            while not self._stopping:
                try:
                    await self._listen()
                except Exception as exc:
                    if not db.is_transient(exc):
                        log.exception("could not reopen the LISTEN connection")
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 5.0)
                    continue
                self.reconnects += 1
                log.info("LISTEN connection re-established")
                for waiters in list(self._waiters.values()):
                    for waiter in waiters:
                        waiter.set()
                return
        finally:
            self._reconnecting = None

    async def stop(self) -> None:
        self._stopping = True
        if self._reconnecting is not None:
            self._reconnecting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reconnecting
        if self._listener is not None:
            with contextlib.suppress(Exception):
                await self._listener.close()
            self._listener = None

    def _notified(self, _conn: Any, _pid: int, _channel: str, job_id: object) -> None:
        for waiter in self._waiters.get(str(job_id), ()):
            waiter.set()

    async def events(self, job_id: str, after_event_id: int = 0) -> list[JobEvent]:
        """The job's events after ``after_event_id``, oldest first."""
        rows = await self._pool.fetch(
            "SELECT * FROM job_events WHERE job_id = $1 AND event_id > $2 ORDER BY event_id",
            job_id,
            after_event_id,
        )
        return [
            JobEvent(
                event_id=r["event_id"],
                job_id=str(r["job_id"]),
                kind=r["kind"],
                status=r["status"],
                progress=r["progress"],
                detail=r["detail"] or {},
                created_at=r["created_at"],
            )
            for r in rows
        ]

    async def _ended(self, job_id: str) -> bool:
        status = await self._pool.fetchval("SELECT status FROM processing_jobs WHERE job_id = $1", job_id)
        return status in TERMINAL_STATUSES

    async def watch(self, job_id: str, after_event_id: int = 0) -> AsyncIterator[JobEvent | None]:
        """Every event of the job after ``after_event_id`` as it happens, ending after the terminal
        status; ``None`` after ``keepalive_seconds`` without an event."""
        waiter = asyncio.Event()
        self._waiters[job_id].add(waiter)
        last = after_event_id
        try:
            while True:
                waiter.clear()  # before reading: a notification during the read is not lost
                batch = await self.events(job_id, last)
                for event in batch:
                    last = event.event_id
                    yield event
                    if event.terminal:
                        return
                if not batch and await self._ended(job_id):
                    return  # resumed after the terminal event: nothing more will come
                try:
                    await asyncio.wait_for(waiter.wait(), self._keepalive)
                except TimeoutError:
                    yield None
        finally:
            self._waiters[job_id].discard(waiter)
            if not self._waiters[job_id]:
                del self._waiters[job_id]
