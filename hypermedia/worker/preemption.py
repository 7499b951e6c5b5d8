"""A spot (preemptible) worker's watch on its instance's interruption notice (issue 20 item 5).

Every ``HM_SPOT_POLL_SECONDS`` (5 s) the instance metadata service is asked:

- ``ec2``: ``GET /latest/meta-data/spot/instance-action`` with an IMDSv2 token (``PUT
  /latest/api/token``): 404 while none; ``{"action": "terminate", "time": "…Z"}`` about two
  minutes before the instance is reclaimed (AWS, "Spot Instance interruption notices");
- ``gce``: ``GET /computeMetadata/v1/instance/preempted`` with ``Metadata-Flavor: Google``:
  ``TRUE`` once preemption began, 30 s before the instance stops (Google, "Preemptible VM
  instances").

On a notice every lane's drain is cut to the time left minus :data:`MARGIN_SECONDS` (the hand-back
and the process's exit must fit), what cannot finish is handed back ``preempted``, and the worker
stops (:meth:`WorkerRuntime.preempt`). A metadata service that does not answer is logged and asked
again; it never stops the worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
from collections.abc import Sequence

import asyncpg
import httpx

from hypermedia.worker import registry
from hypermedia.worker.runtime import WorkerRuntime
from hypermedia.worker.settings import WorkerSettings

log = logging.getLogger(__name__)

EC2_NOTICE_SECONDS = 120.0
GCE_NOTICE_SECONDS = 30.0
MARGIN_SECONDS = 10.0
"""Left of the notice for handing back and exiting."""
TOKEN_TTL_SECONDS = 21600


async def notice_seconds(settings: WorkerSettings, http: httpx.AsyncClient, token: list[str]) -> float | None:
    """Seconds until the instance is reclaimed, or None while no notice is posted. ``token``
    caches the IMDSv2 token (one element, refreshed on a 401). Raises httpx errors."""
    base = settings.spot_metadata_url.rstrip("/")
    if settings.spot_notice == "gce":
        reply = await http.get(
            f"{base}/computeMetadata/v1/instance/preempted", headers={"Metadata-Flavor": "Google"}
        )
        reply.raise_for_status()
        return GCE_NOTICE_SECONDS if reply.text.strip().upper() == "TRUE" else None
    if not token or not token[0]:
        put = await http.put(
            f"{base}/latest/api/token",
            headers={"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL_SECONDS)},
        )
        put.raise_for_status()
        token[:] = [put.text.strip()]
    reply = await http.get(
        f"{base}/latest/meta-data/spot/instance-action", headers={"X-aws-ec2-metadata-token": token[0]}
    )
    if reply.status_code == 401:
        token[:] = []
        return None
    if reply.status_code == 404:
        return None
    reply.raise_for_status()
    try:
        when = dt.datetime.fromisoformat(str(reply.json()["time"]).replace("Z", "+00:00"))
        return max(0.0, (when - dt.datetime.now(dt.UTC)).total_seconds())
    except (ValueError, KeyError, TypeError):
        return EC2_NOTICE_SECONDS


async def watch(
    settings: WorkerSettings,
    runtimes: Sequence[WorkerRuntime],
    stop: asyncio.Event,
    pool: asyncpg.Pool | None = None,
) -> None:
    """Polls for a notice until ``stop``; on one, preempts every runtime (and so stops the worker)
    and, with ``pool``, announces it (:func:`~hypermedia.worker.registry.announce_preemption`: the
    scheduler replaces the capacity at once). A failed announcement is logged; the drain goes on."""
    token: list[str] = []
    async with httpx.AsyncClient(timeout=httpx.Timeout(2.0)) as http:
        while not stop.is_set():
            try:
                left = await notice_seconds(settings, http, token)
            except httpx.HTTPError as exc:
                log.warning("instance metadata not readable (%s): asked again", type(exc).__name__)
                left = None
            if left is not None:
                drain = max(1.0, left - MARGIN_SECONDS)
                log.warning("spot interruption notice: reclaimed in %.0fs; draining for %.0fs", left, drain)
                for runtime in runtimes:
                    runtime.preempt(drain)
                if pool is not None:
                    try:
                        await registry.announce_preemption(pool, [rt.worker_id for rt in runtimes])
                    except (OSError, asyncpg.PostgresError) as exc:
                        log.warning(
                            "the preemption could not be announced (%s): the scheduler sees it later", exc
                        )
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), settings.spot_poll_seconds)
