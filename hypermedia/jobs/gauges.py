"""The platform's state in Postgres as Prometheus gauges, read at each scrape (ADR 0061), as
postgres_exporter reads its queries: queue depth and oldest age per queue and band, jobs by
status, the outbox's backlog and lag, pending webhook deliveries, live workers and burst workers
(credits held are the credits service's: ``services/credits/gauges.py``). The reaper registers
:class:`PlatformCollector`; with several reapers each serves the same values (query them with
``max``).

Each query reads an index, not the job history: the active statuses through
``processing_jobs_status_idx``, the outbox's unpublished rows through its partial indexes, the
pending deliveries likewise. Jobs in a terminal status are not counted here (a
count of the whole history at every scrape would grow with it); their rate is
``hypermedia_attempts_total`` of the workers.
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

import asyncpg
from prometheus_client.core import GaugeMetricFamily

from hypermedia.core.metrics import ScrapeCollector

ACTIVE_STATUSES: Final = (
    "created",
    "scheduled",
    "queued",
    "retry_wait",
    "claimed",
    "processing",
    "cancel_requested",
)

_QUERIES: Final = {
    "jobs": """
        SELECT status, queue, priority, count(*) AS n,
               extract(epoch FROM now() - min(coalesce(queued_at, created_at))) AS oldest
        FROM processing_jobs WHERE status = ANY($1::text[])
        GROUP BY status, queue, priority
    """,
    "outbox": """
        SELECT deferred, count(*) AS n, extract(epoch FROM now() - min(created_at)) AS oldest
        FROM outbox WHERE published_at IS NULL GROUP BY deferred
    """,
    "webhooks": """
        SELECT count(*) AS n, coalesce(extract(epoch FROM now() - min(created_at)), 0) AS oldest
        FROM webhook_deliveries WHERE status = 'pending'
    """,
    "workers": """
        SELECT queue, status, count(*) AS n FROM workers
        WHERE status IN ('running', 'draining') AND last_heartbeat > now() - make_interval(secs => $1)
        GROUP BY queue, status
    """,
    "burst": """
        SELECT pool, state, count(*) AS n FROM burst_workers
        WHERE state NOT IN ('terminated', 'failed') GROUP BY pool, state
    """,
}


class PlatformCollector(ScrapeCollector):
    """Reads :data:`_QUERIES` through ``pool`` on the event loop ``loop`` (the reaper's) at each
    scrape (:class:`~hypermedia.core.metrics.ScrapeCollector`), and answers their families.
    ``dead_worker_seconds``: a worker whose last heartbeat is older is not counted (the reaper's
    own threshold)."""

    prefix = "hypermedia_platform_gauges"
    subject = "the platform's state in Postgres"

    def __init__(
        self, pool: asyncpg.Pool | None, loop: asyncio.AbstractEventLoop | None, dead_worker_seconds: float
    ) -> None:
        super().__init__(loop)
        self._pool = pool
        self._dead_worker_seconds = dead_worker_seconds

    async def read(self) -> dict[str, list[asyncpg.Record]]:
        assert self._pool is not None
        async with self._pool.acquire(timeout=self.timeout_seconds) as conn:
            return {
                "jobs": await conn.fetch(_QUERIES["jobs"], list(ACTIVE_STATUSES)),
                "outbox": await conn.fetch(_QUERIES["outbox"]),
                "webhooks": await conn.fetch(_QUERIES["webhooks"]),
                "workers": await conn.fetch(_QUERIES["workers"], float(self._dead_worker_seconds)),
                "burst": await conn.fetch(_QUERIES["burst"]),
            }

    def families(self, rows: dict[str, list[Any]] | None) -> list[GaugeMetricFamily]:
        depth = GaugeMetricFamily(
            "hypermedia_queue_depth",
            "Jobs queued (waiting for a worker), by queue (route) and priority band.",
            labels=["queue", "band"],
        )
        oldest = GaugeMetricFamily(
            "hypermedia_queue_oldest_age_seconds",
            "Age of the longest-waiting queued job since it was queued, by queue and band.",
            labels=["queue", "band"],
        )
        jobs = GaugeMetricFamily(
            "hypermedia_jobs",
            "Jobs in each active status (created, scheduled, queued, retry_wait, claimed, processing, "
            "cancel_requested), by queue.",
            labels=["status", "queue"],
        )
        outbox = GaugeMetricFamily(
            "hypermedia_outbox_pending",
            "Outbox rows not yet published, by state: ready (the relay publishes them next) or "
            "deferred (held back by the fairness window, ADR 0059).",
            labels=["state"],
        )
        lag = GaugeMetricFamily(
            "hypermedia_outbox_lag_seconds",
            "Age of the oldest ready outbox row (0 when none waits): how far the relay is behind.",
        )
        webhooks = GaugeMetricFamily(
            "hypermedia_webhook_deliveries_pending", "Webhook deliveries not yet delivered or given up."
        )
        webhook_age = GaugeMetricFamily(
            "hypermedia_webhook_oldest_pending_age_seconds", "Age of the oldest pending webhook delivery."
        )
        workers = GaugeMetricFamily(
            "hypermedia_workers",
            "Worker processes with a fresh heartbeat, by queue (route) and status (running, draining).",
            labels=["queue", "status"],
        )
        burst = GaugeMetricFamily(
            "hypermedia_burst_workers",
            "The scheduler's burst workers not yet terminated, by pool and state.",
            labels=["pool", "state"],
        )
        families = [depth, oldest, jobs, outbox, lag, webhooks, webhook_age, workers, burst]
        if rows is None:
            return families
        by_status: dict[tuple[str, str], int] = {}
        for r in rows["jobs"]:
            key = (r["status"], r["queue"])
            by_status[key] = by_status.get(key, 0) + int(r["n"])
            if r["status"] == "queued":
                depth.add_metric([r["queue"], str(r["priority"])], int(r["n"]))
                oldest.add_metric([r["queue"], str(r["priority"])], float(r["oldest"] or 0))
        for (status, queue), n in sorted(by_status.items()):
            jobs.add_metric([status, queue], n)
        pending = {bool(r["deferred"]): r for r in rows["outbox"]}
        for state, deferred in (("ready", False), ("deferred", True)):
            outbox.add_metric([state], int(pending[deferred]["n"]) if deferred in pending else 0)
        lag.add_metric([], float(pending[False]["oldest"] or 0) if False in pending else 0.0)
        webhooks.add_metric([], int(rows["webhooks"][0]["n"]))
        webhook_age.add_metric([], float(rows["webhooks"][0]["oldest"]))
        for r in rows["workers"]:
            workers.add_metric([r["queue"], r["status"]], int(r["n"]))
        for r in rows["burst"]:
            burst.add_metric([r["pool"], r["state"]], int(r["n"]))
        return families
