"""``python -m services.reaper``: runs :meth:`Reaper.run_once` every ``HM_REAPER_INTERVAL_SECONDS``,
the poller of delayed jobs (every ``HM_SCHEDULED_POLL_SECONDS``: :func:`lifecycle.promote_scheduled`),
the runner of maintenance schedules (:mod:`services.reaper.maintenance`, every
``HM_SCHEDULE_POLL_SECONDS``), an outbox relay for the messages it writes, the webhook dispatcher
and the tables' retention (:mod:`hypermedia.jobs.retention`, every
``HM_RETENTION_INTERVAL_SECONDS``), and serves the platform's gauges from Postgres
(:mod:`hypermedia.jobs.gauges`) with its metrics. Only wires."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from contextlib import AsyncExitStack
from pathlib import Path

from prometheus_client import REGISTRY

from hypermedia.core import config
from hypermedia.infra import mtls
from hypermedia.infra.service import Lifetime, every, open_peers, open_postgres, run_service
from hypermedia.jobs import lifecycle, queues
from hypermedia.jobs.gauges import PlatformCollector
from hypermedia.jobs.outbox import OutboxRelay
from hypermedia.jobs.retention import Retention
from hypermedia.jobs.settlement import Settlement
from services.reaper.maintenance import MaintenanceRunner
from services.reaper.reaper import Reaper
from services.reaper.settings import ReaperSettings
from services.reaper.webhooks import WebhookDispatcher, webhook_client

log = logging.getLogger(__name__)

SCHEDULED_BATCH = 500
"""Delayed jobs queued per poll at most (the rest at the next poll, a quarter second later)."""


async def serve(stack: AsyncExitStack, stop: Lifetime) -> None:
    infra = config.load(config.InfraSettings)
    settings = config.load(ReaperSettings)
    pool = await open_postgres(stack, infra, max_size=4)
    nc, js = await queues.open_jetstream(stack, infra, "reaper")
    peers = open_peers(stack, infra, mtls.from_environment())
    reaper = Reaper(
        pool,
        peers.credits,
        infra.stream_prefix,
        requeue_stale_seconds=settings.requeue_stale_seconds,
        dead_worker_seconds=settings.dead_worker_seconds,
        settle_grace_seconds=settings.settle_grace_seconds,
        work_dirs=tuple(Path(d) for d in settings.work_dirs.split(os.pathsep) if d),
        orphan_dir_seconds=settings.orphan_dir_seconds,
    )
    relay = OutboxRelay(pool, nc, js, listen_dsn=infra.separate_session_url)
    maintenance = MaintenanceRunner(
        pool, Settlement(peers.credits), runner=f"reaper/{socket.gethostname()}/{os.getpid()}"
    )
    http = webhook_client(allow_private=settings.webhook_allow_private)
    stack.push_async_callback(http.aclose)
    webhooks = WebhookDispatcher(
        pool,
        http,
        max_attempts=settings.webhook_max_attempts,
        base_delay_seconds=settings.webhook_base_delay_seconds,
    )

    retention = Retention(
        pool,
        job_events_days=settings.retain_job_events_days,
        worker_metrics_days=settings.retain_worker_metrics_days,
        webhook_deliveries_days=settings.retain_webhook_deliveries_days,
    )

    async def prune() -> None:
        pruned = await retention.run_once()
        if pruned.anything:
            log.info("retention: %s", pruned)

    collector = PlatformCollector(pool, asyncio.get_running_loop(), settings.dead_worker_seconds)
    REGISTRY.register(collector)
    stack.callback(REGISTRY.unregister, collector)

    async def reap() -> None:
        if (await reaper.run_once()).anything:
            relay.wake.set()  # publish the requeued jobs now, not at the relay's next poll

    async def promote_due() -> None:
        if await lifecycle.promote_scheduled(pool, infra.stream_prefix, SCHEDULED_BATCH):
            relay.wake.set()

    inner_stop = asyncio.Event()
    tasks = [
        asyncio.create_task(every(settings.interval_seconds, reap, inner_stop)),
        asyncio.create_task(every(settings.scheduled_poll_seconds, promote_due, inner_stop)),
        asyncio.create_task(every(settings.schedule_poll_seconds, maintenance.run_once, inner_stop)),
        asyncio.create_task(relay.run(inner_stop)),
        asyncio.create_task(every(settings.webhook_poll_seconds, webhooks.run_once, inner_stop)),
        asyncio.create_task(every(settings.retention_interval_seconds, prune, inner_stop)),
    ]

    async def finish() -> None:
        inner_stop.set()
        await asyncio.gather(*tasks)

    stack.push_async_callback(finish)


if __name__ == "__main__":
    run_service("reaper", serve)
