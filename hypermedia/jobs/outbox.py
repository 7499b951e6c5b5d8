"""The transactional outbox relay: publishes ``outbox`` rows to JetStream.

Rows are written in the same transaction as the job state they announce
(:func:`hypermedia.jobs.lifecycle.enqueue_outbox`). The relay locks a batch with ``FOR UPDATE SKIP
LOCKED`` (so several relays can run at once), publishes each row with ``Nats-Msg-Id = msg_id`` and
waits for the JetStream ack, then marks the batch published in the same transaction. A crash between
publish and mark publishes the rows again on the next run, and JetStream drops the copies inside its
duplicate window. After a batch it rings the doorbell of every queue it touched. A row that could
not be published (no stream for its subject, broker timeout) is left pending and skipped by this
relay for ``FAILED_ROW_BACKOFF_SECONDS``, so a batch's worth of such rows cannot starve the rows
behind them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

import asyncpg
from nats.aio.client import Client as NatsClient
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.errors import NoStreamResponseError

from hypermedia.jobs import queues

log = logging.getLogger(__name__)

FAILED_ROW_BACKOFF_SECONDS = 30.0
"""How long a relay leaves a row alone after failing to publish it."""


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
    """

    def __init__(
        self,
        pool: asyncpg.Pool,
        nc: NatsClient,
        js: JetStreamContext,
        *,
        batch_size: int = 100,
        retain_seconds: int = 3600,
    ) -> None:
        self._pool = pool
        self._nc = nc
        self._js = js
        self._batch_size = batch_size
        self._retain_seconds = retain_seconds
        self.wake = asyncio.Event()
        # outbox_id → monotonic time before which this relay does not try the row again. Holds at
        # most the rows that failed within the last FAILED_ROW_BACKOFF_SECONDS.
        self._retry_after: dict[int, float] = {}

    async def run_once(self) -> RelayResult:
        """Publish up to one batch; returns how many rows were published and purged."""
        rung: set[str] = set()
        now = time.monotonic()
        self._retry_after = {k: t for k, t in self._retry_after.items() if t > now}
        async with self._pool.acquire() as conn, conn.transaction():
            rows = await conn.fetch(
                """
                SELECT outbox_id, subject, msg_id, payload FROM outbox
                WHERE published_at IS NULL AND outbox_id <> ALL($2::bigint[])
                ORDER BY outbox_id LIMIT $1 FOR UPDATE SKIP LOCKED
                """,
                self._batch_size,
                list(self._retry_after),
            )
            published = []
            for row in rows:
                message = queues.JobMessage(
                    row["payload"]["job_id"], row["payload"]["queue"], int(row["payload"]["priority"])
                )
                try:
                    await self._js.publish(
                        row["subject"],
                        message.encode(),
                        headers={**row["payload"].get("trace", {}), "Nats-Msg-Id": row["msg_id"]},
                    )
                except (NoStreamResponseError, NoRespondersError, NatsTimeoutError):
                    # Left unpublished; the next run tries again. The rest of the batch goes on.
                    log.warning("could not publish outbox row %s to %s", row["outbox_id"], row["subject"])
                    self._retry_after[row["outbox_id"]] = now + FAILED_ROW_BACKOFF_SECONDS
                    continue
                published.append(row["outbox_id"])
                rung.add(queues.doorbell_for(row["subject"]))
            if published:
                await conn.execute(
                    "UPDATE outbox SET published_at = now() WHERE outbox_id = ANY($1::bigint[])", published
                )
            purged = await conn.fetchval(
                """
                WITH gone AS (DELETE FROM outbox WHERE published_at < now() - make_interval(secs => $1)
                              RETURNING 1)
                SELECT count(*) FROM gone
                """,
                float(self._retain_seconds),
            )
        for doorbell in rung:
            await self._nc.publish(doorbell, b"")
        return RelayResult(published=len(published), purged=int(purged or 0))

    async def run(self, stop: asyncio.Event, poll_seconds: float = 1.0) -> None:
        """Loop until ``stop``: run, then wait for :attr:`wake` or ``poll_seconds``."""
        while not stop.is_set():
            self.wake.clear()
            try:
                result = await self.run_once()
                if result.published == self._batch_size:
                    continue
            except Exception:
                log.exception("outbox relay run failed; retrying")
            waiters = [asyncio.ensure_future(self.wake.wait()), asyncio.ensure_future(stop.wait())]
            _done, pending = await asyncio.wait(
                waiters, timeout=poll_seconds, return_when=asyncio.FIRST_COMPLETED
            )
            for task in pending:
                task.cancel()
