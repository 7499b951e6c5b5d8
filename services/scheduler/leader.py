"""One leader at a time: a session-level Postgres advisory lock held on a connection of its own.

Every write of the leader's cycle goes over that same connection, so a leader whose connection
died (and with it the lock) cannot write another row: the lock and the writes fail together. A
standby tries the lock every cycle and so takes over within one cycle of the leader's death
(Postgres frees the lock when the dead process's connection closes; server-side TCP keepalives of
10 s × 3 bound how long a vanished host holds it)."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import asyncpg

from hypermedia.infra import db
from hypermedia.jobs.scaling import WAKE_CHANNEL

log = logging.getLogger(__name__)

LOCK_KEY = 0x686D_7363_6865_64  # "hmsched"
"""The advisory lock's key (one scheduler leader per database)."""
KEEPALIVE = {"tcp_keepalives_idle": "10", "tcp_keepalives_interval": "5", "tcp_keepalives_count": "3"}


class Leadership:
    """The leader lock of this scheduler process (``holder`` names it in the rows it writes)."""

    def __init__(self, dsn: str, holder: str) -> None:
        self._dsn = dsn
        self.holder = holder
        self._conn: asyncpg.Connection | None = None
        self.wake = asyncio.Event()
        """Set by a ``NOTIFY`` on :data:`~hypermedia.jobs.scaling.WAKE_CHANNEL` (a preemption)
        while this process leads: its lock connection ``LISTEN``s there, so the next cycle runs
        at once instead of an interval later."""

    def _woken(self, _conn: object, _pid: int, _channel: str, payload: object) -> None:
        log.info("scheduler woken early: %s", payload or "notified")
        self.wake.set()

    @property
    def conn(self) -> asyncpg.Connection:
        """The lock's connection; only valid while :meth:`hold` returned True."""
        assert self._conn is not None, "not the leader"
        return self._conn

    async def hold(self) -> bool:
        """True when this process holds the lock now: it held it already on a live connection,
        or has just taken it. False (a standby) when another process holds it. A lost
        connection drops leadership; the next call tries again. Raises the connect error when
        Postgres cannot be reached."""
        if self._conn is not None and not self._conn.is_closed():
            try:
                await self._conn.fetchval("SELECT 1")  # a session-level lock lives as long as its session
                return True
            except (asyncpg.PostgresError, OSError):
                log.warning("the leader's connection failed: leadership dropped", exc_info=True)
            await self.release()
        self._conn = await db.connect(self._dsn, server_settings=KEEPALIVE)
        if await self._conn.fetchval("SELECT pg_try_advisory_lock($1)", LOCK_KEY):
            await self._conn.add_listener(WAKE_CHANNEL, self._woken)
            log.info("scheduler %s is the leader", self.holder)
            return True
        await self.release()
        return False

    async def release(self) -> None:
        """Lets the lock go (closing its connection)."""
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await self._conn.close(timeout=5)
            self._conn = None
