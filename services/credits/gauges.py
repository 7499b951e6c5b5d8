"""The credits held by unfinished jobs as Prometheus gauges, read from Postgres at each scrape
(ADR 0061) by the credits service, which owns the ``credit_*`` tables. Several replicas serve the
same values (query them with ``max``)."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
from prometheus_client.core import GaugeMetricFamily

from hypermedia.core.metrics import ScrapeCollector


class HoldsCollector(ScrapeCollector):
    """``hypermedia_credit_holds_open`` and ``hypermedia_credits_held_millicredits``: the open
    holds (partial index ``credit_holds_held``) and what they keep, all accounts."""

    prefix = "hypermedia_credits_gauges"
    subject = "the open credit holds"

    def __init__(self, pool: asyncpg.Pool | None, loop: asyncio.AbstractEventLoop | None) -> None:
        super().__init__(loop)
        self._pool = pool

    async def read(self) -> asyncpg.Record | None:
        assert self._pool is not None
        return await self._pool.fetchrow(
            "SELECT count(*) AS n, coalesce(sum(amount), 0) AS amount FROM credit_holds WHERE status = 'held'"
        )

    def families(self, row: Any) -> list[GaugeMetricFamily]:
        holds = GaugeMetricFamily("hypermedia_credit_holds_open", "Credit holds of unfinished jobs.")
        held = GaugeMetricFamily(
            "hypermedia_credits_held_millicredits", "Millicredits held by unfinished jobs, all accounts."
        )
        if row is not None:
            holds.add_metric([], int(row["n"]))
            held.add_metric([], int(row["amount"]))
        return [holds, held]
