"""The transactional outbox relay: publishes ``outbox`` rows to JetStream.

Rows are written in the same transaction as the job state they announce
(:func:`hypermedia.jobs.lifecycle.enqueue_outbox`). The relay locks a batch with ``FOR UPDATE SKIP
LOCKED`` (so several relays can run at once), publishes its rows at once with ``Nats-Msg-Id =
msg_id`` and waits for their JetStream acks together, then marks them published in the same
transaction. Published rows older than the retention are deleted once a minute. A crash between
publish and mark publishes the rows again on the next run, and JetStream drops the copies inside its
duplicate window. After a batch it rings the doorbell of every queue it touched. A row that could
not be published (no stream for its subject, broker timeout) is left pending and skipped by this
relay for ``FAILED_ROW_BACKOFF_SECONDS``, so a batch's worth of such rows cannot starve the rows
behind them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any

import asyncpg
from nats.aio.client import Client as NatsClient
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.errors import NoStreamResponseError

from hypermedia.core import metrics
from hypermedia.infra import db
from hypermedia.jobs import lifecycle, queues

log = logging.getLogger(__name__)

FAILED_ROW_BACKOFF_SECONDS = 30.0
"""How long a relay leaves a row alone after failing to publish it."""
SWEEP_EVERY_SECONDS = 1.0
"""How often a relay makes ready the deferred rows whose window has room without a claim having
released them (:func:`hypermedia.jobs.lifecycle.sweep_deferred`)."""
NOTIFY_CHANNEL = "hm_outbox"
"""The channel a claim that released deferred rows notifies (:func:`lifecycle.release_deferred`);
every relay listens on it, so a released row is published at once, not at the next poll."""


LISTEN_CONNECT_SECONDS = 5.0
"""Longest a relay waits to open its own listening connection (seconds)."""
LISTEN_RETRY_SECONDS = 5.0
"""After a failed attempt to listen, how long a relay publishes on its poll alone before it tries
again (seconds). The attempts run beside the publishing, never in its way."""


@dataclass(frozen=True)
class RelayResult:
    published: int
    purged: int


class OutboxRelay:
    """Publishes pending outbox rows.

    Args:
        pool: asyncpg pool of the system of record.
        nc, js: NATS client and its JetStream context.
        batch_size: rows per transaction.
        retain_seconds: published rows older than this are deleted.
        purge_every_seconds: how often this relay deletes them (the delete reads every published
            row: once a minute, not once a batch).
        listen_dsn: where the relay opens its own connection to listen on :data:`NOTIFY_CHANNEL`
            (``HM_DATABASE_SESSION_URL``: a ``LISTEN`` needs a session, which a transaction-pooling
            PgBouncer does not keep); None: a connection of ``pool`` listens.
    """

    def __init__(
        self,
        pool: asyncpg.Pool,
        nc: NatsClient,
        js: JetStreamContext,
        *,
        batch_size: int = 100,
        retain_seconds: int = 3600,
        purge_every_seconds: float = 60.0,
        listen_dsn: str | None = None,
    ) -> None:
        self._pool = pool
        self._listen_dsn = listen_dsn
        self._nc = nc
        self._js = js
        self._batch_size = batch_size
        self._retain_seconds = retain_seconds
        self._purge_every_seconds = purge_every_seconds
        self._next_purge = 0.0  # monotonic: the first run purges
        self._next_sweep = 0.0
        self.wake = asyncio.Event()
        # outbox_id → monotonic time before which this relay does not try the row again. Holds at
        # most the rows that failed within the last FAILED_ROW_BACKOFF_SECONDS.
        self._retry_after: dict[int, float] = {}

    async def run_once(self) -> RelayResult:
        """Publish up to one batch; returns how many rows were published and purged."""
        rung: set[str] = set()
        now = time.monotonic()
        self._retry_after = {k: t for k, t in self._retry_after.items() if t > now}
        if now >= self._next_sweep:  # windows freed without a claim (ADR 0059), in a statement of its own
            self._next_sweep = now + SWEEP_EVERY_SECONDS
            if await lifecycle.sweep_deferred(self._pool):
                self.wake.set()
        async with self._pool.acquire() as conn, conn.transaction():
            rows = await conn.fetch(
                """
                SELECT outbox_id, subject, msg_id, payload FROM outbox
                WHERE published_at IS NULL AND NOT deferred AND outbox_id <> ALL($2::bigint[])
                ORDER BY outbox_id LIMIT $1 FOR UPDATE SKIP LOCKED
                """,
                self._batch_size,
                list(self._retry_after),
            )
            outcomes = await asyncio.gather(*(self._publish(row) for row in rows), return_exceptions=True)
            published = []
            for row, outcome in zip(rows, outcomes, strict=True):
                if isinstance(outcome, NoStreamResponseError | NoRespondersError | NatsTimeoutError):
                    # Left unpublished; the next run tries again. The rest of the batch goes on.
                    log.warning("could not publish outbox row %s to %s", row["outbox_id"], row["subject"])
                    self._retry_after[row["outbox_id"]] = now + FAILED_ROW_BACKOFF_SECONDS
                    continue
                if isinstance(outcome, BaseException):
                    raise outcome  # nothing is marked: the whole batch is published again
                published.append(row["outbox_id"])
                rung.add(queues.doorbell_for(row["subject"]))
            if published:
                await conn.execute(
                    "UPDATE outbox SET published_at = now() WHERE outbox_id = ANY($1::bigint[])", published
                )
            purged = 0
            if now >= self._next_purge:
                self._next_purge = now + self._purge_every_seconds
                purged = await conn.fetchval(
                    """
                    WITH gone AS (DELETE FROM outbox WHERE published_at < now() - make_interval(secs => $1)
                                  RETURNING 1)
                    SELECT count(*) FROM gone
                    """,
                    float(self._retain_seconds),
                )
        metrics.OUTBOX_PUBLISHED.inc(len(published))
        for doorbell in rung:
            await self._nc.publish(doorbell, b"")
        return RelayResult(published=len(published), purged=int(purged or 0))

    async def _publish(self, row: asyncpg.Record) -> None:
        """One row to JetStream, ``Nats-Msg-Id = msg_id``; returns at its ack. A batch's rows are
        published at once, their acks awaited together: one round trip a batch, not one a row."""
        message = queues.JobMessage(
            row["payload"]["job_id"], row["payload"]["queue"], int(row["payload"]["priority"])
        )
        await self._js.publish(
            row["subject"],
            message.encode(),
            headers={**row["payload"].get("trace", {}), "Nats-Msg-Id": row["msg_id"]},
        )

    async def run(self, stop: asyncio.Event, poll_seconds: float = 1.0) -> None:
        """Loop until ``stop``: run, then wait for :attr:`wake` or ``poll_seconds``. Beside it, a
        task keeps a connection (its own, or one of the pool's) listening on
        :data:`NOTIFY_CHANNEL`, set up again after a loss; the publishing never waits for it
        (without it the poll alone publishes released rows)."""
        listening = asyncio.create_task(self._keep_listening(stop, poll_seconds))
        try:
            while not stop.is_set():
                await self._turn(stop, poll_seconds)
        finally:
            listening.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listening

    async def _keep_listening(self, stop: asyncio.Event, check_seconds: float) -> None:
        """Until ``stop`` (or cancelled): the listening connection, opened again every
        ``check_seconds`` when there is none or it was lost (a failed open waits
        :data:`LISTEN_RETRY_SECONDS`); closed or given back at the end."""
        listener: Any = None
        try:
            while not stop.is_set():
                try:
                    listener = await self._listening(listener)
                except Exception:  # never the relay's end: it polls without a listener
                    log.exception("outbox relay could not listen on %s; polling", NOTIFY_CHANNEL)
                    listener = None
                delay = check_seconds if listener is not None else LISTEN_RETRY_SECONDS
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
        finally:
            if listener is not None:
                await self._unlisten(listener)

    async def _listening(self, listener: Any) -> Any:
        """The listening connection, acquired (again) when there is none or it was lost. A lost
        connection's proxy is detached by the pool at once (``is_closed`` then raises
        InterfaceError: a Postgres restart)."""
        if listener is not None:
            try:
                if not listener.is_closed():
                    return listener
            except asyncpg.InterfaceError:
                pass
            await self._unlisten(listener)
        try:
            conn = await (
                db.connect(self._listen_dsn, timeout=LISTEN_CONNECT_SECONDS)
                if self._listen_dsn
                else self._pool.acquire()
            )
        except Exception:
            return None
        try:
            await conn.add_listener(NOTIFY_CHANNEL, self._notified)
        except Exception:
            await self._unlisten(conn)
            return None
        except asyncio.CancelledError:  # the relay stopping: never leave a listener on the pool's
            await self._unlisten(conn)
            raise
        return conn

    async def _let_go(self, conn: Any) -> None:
        """Close the relay's own listening connection, or give the pool's back."""
        with contextlib.suppress(Exception):
            await (conn.close() if self._listen_dsn else self._pool.release(conn))

    async def _unlisten(self, conn: Any) -> None:
        try:
            await conn.remove_listener(NOTIFY_CHANNEL, self._notified)
        except Exception:
            pass
        finally:
            await self._let_go(conn)

    def _notified(self, *_: object) -> None:
        self.wake.set()

    async def _turn(self, stop: asyncio.Event, poll_seconds: float) -> None:
        """One run of the loop: publish, then wait for :attr:`wake` or ``poll_seconds`` unless a
        full batch went out."""
        self.wake.clear()
        try:
            result = await self.run_once()
            if result.published == self._batch_size:
                return
        except Exception:
            log.exception("outbox relay run failed; retrying")
        waiters = [asyncio.ensure_future(self.wake.wait()), asyncio.ensure_future(stop.wait())]
        _done, pending = await asyncio.wait(
            waiters, timeout=poll_seconds, return_when=asyncio.FIRST_COMPLETED
        )
        for task in pending:
            task.cancel()
