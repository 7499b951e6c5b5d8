"""Retention (issue 24 item 2): the tables that grow with every job or minute, pruned so they do
not grow without bound. The reaper runs :meth:`Retention.run_once` every
``HM_RETENTION_INTERVAL_SECONDS``; each run deletes the rows past their retention, oldest first,
:data:`BATCH` rows a transaction, at most :data:`MAX_BATCHES` batches of a table (a larger
backlog goes on at the next run), so no delete holds a long lock. What is kept:

* ``job_events``: ``HM_RETAIN_JOB_EVENTS_DAYS`` (30). A job's events replay (SSE, ``WatchJob``)
  from what is left; the job row, its attempts and outputs stay.
* ``worker_metrics``: ``HM_RETAIN_WORKER_METRICS_DAYS`` (7), and ``workers`` rows stopped or dead
  for as long (their metrics go with them).
* ``webhook_deliveries``: delivered or failed ones for ``HM_RETAIN_WEBHOOK_DELIVERIES_DAYS`` (30);
  pending ones always.

The outbox prunes itself (:mod:`hypermedia.jobs.outbox`: published rows after an hour).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import asyncpg

BATCH: Final = 5000
"""Rows one delete (one transaction) takes at most."""
MAX_BATCHES: Final = 100
"""Deletes of one table one run makes at most: 500,000 rows, more than a day of a million jobs'
events (about 7 a job) within an hourly run."""
DAY: Final = 86_400.0


@dataclass(frozen=True)
class Pruned:
    """Rows one run deleted, by table."""

    job_events: int = 0
    worker_metrics: int = 0
    workers: int = 0
    webhook_deliveries: int = 0

    @property
    def anything(self) -> bool:
        return any(vars(self).values())


_PRUNE: Final = {
    # The oldest events first: event_id grows with created_at, so the primary key finds them.
    "job_events": """
        DELETE FROM job_events WHERE event_id IN (
            SELECT event_id FROM job_events WHERE created_at < now() - make_interval(secs => $1)
            ORDER BY event_id LIMIT $2)""",
    "worker_metrics": """
        DELETE FROM worker_metrics WHERE (worker_id, recorded_at) IN (
            SELECT worker_id, recorded_at FROM worker_metrics
            WHERE recorded_at < now() - make_interval(secs => $1) ORDER BY recorded_at LIMIT $2)""",
    "workers": """
        DELETE FROM workers WHERE worker_id IN (
            SELECT worker_id FROM workers WHERE status IN ('stopped', 'dead')
              AND last_heartbeat < now() - make_interval(secs => $1) ORDER BY last_heartbeat LIMIT $2)""",
    "webhook_deliveries": """
        DELETE FROM webhook_deliveries WHERE delivery_id IN (
            SELECT delivery_id FROM webhook_deliveries WHERE status IN ('delivered', 'failed')
              AND created_at < now() - make_interval(secs => $1) ORDER BY created_at LIMIT $2)""",
}


class Retention:
    """Prunes the tables above. Args: pool; days to keep each (``0`` keeps for ever); the batch
    size and the most batches a table a run."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        *,
        job_events_days: float = 30,
        worker_metrics_days: float = 7,
        webhook_deliveries_days: float = 30,
        batch: int = BATCH,
        max_batches: int = MAX_BATCHES,
    ) -> None:
        self._pool = pool
        self._keep = {
            "job_events": job_events_days,
            "worker_metrics": worker_metrics_days,
            "workers": worker_metrics_days,
            "webhook_deliveries": webhook_deliveries_days,
        }
        self._batch = batch
        self._max_batches = max_batches

    async def run_once(self) -> Pruned:
        """One pass over the tables: each one's rows older than its retention, ``batch`` rows a
        transaction, until a delete takes fewer or ``max_batches`` were made. Returns the counts."""
        deleted: dict[str, int] = {}
        for table, sql in _PRUNE.items():
            days = self._keep[table]
            if days <= 0:
                continue
            deleted[table] = 0
            for _ in range(self._max_batches):
                status = await self._pool.execute(sql, days * DAY, self._batch)
                taken = int(status.split()[-1])
                deleted[table] += taken
                if taken < self._batch:
                    break
        return Pruned(**deleted)
