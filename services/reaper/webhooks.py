"""Webhook delivery: a loop around :meth:`WebhookDispatcher.run_once`, run by the reaper service.

Delivery rows are written by a trigger in the same transaction that moves a job to a terminal state
(migration 0002), so every path that ends a job produces exactly one per event. The dispatcher
takes due rows with ``FOR UPDATE SKIP LOCKED`` (several replicas never send the same row at once),
leases them by pushing ``next_attempt_at`` past the send timeout, POSTs them, and records the
outcome: 2xx → ``delivered``; a host that is or resolves to a non-public address → ``failed`` at
once (SSRF guard, :class:`PublicAddressTransport`); anything else → retried after
``base_delay × 2^attempts`` (capped at an hour) until ``max_attempts``, then ``failed``. Delivery
is at least once; receivers de-duplicate by the ``webhook-id`` header, which is the same on every
retry.

Format: Standard Webhooks (https://www.standardwebhooks.com/): headers ``webhook-id``,
``webhook-timestamp`` (unix seconds) and ``webhook-signature`` = ``v1,`` + base64 HMAC-SHA256 over
``{id}.{timestamp}.{body}`` with the account's ``whsec_`` secret, signed by the ``standardwebhooks``
library.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from datetime import UTC, datetime

import asyncpg
import httpx
from standardwebhooks import Webhook

from hypermedia.core import metrics
from hypermedia.jobs.webhooks import BlockedAddress, account_secret, public_addresses

log = logging.getLogger(__name__)

SEND_TIMEOUT_SECONDS = 10.0
MAX_DELAY_SECONDS = 3600.0


class PublicAddressTransport(httpx.AsyncBaseTransport):
    """An httpx transport that sends each request only to a public address (SSRF guard).

    The host is resolved here in its ASCII (IDNA) form, the one sent in ``Host`` and TLS
    (:func:`hypermedia.jobs.webhooks.public_addresses`; any non-public answer raises
    :class:`BlockedAddress`), and the request goes to those very addresses, tried in order until one
    connects: the URL's host is replaced by the address, the ``Host`` header keeps the name, and TLS
    sends and verifies the name (httpcore's ``sni_hostname``), so a DNS answer that changes between
    the check and the connect (rebinding) cannot redirect it. Connections are not kept alive: a
    pooled connection is keyed by address and would carry a request for another name that
    resolves to the same address.
    """

    def __init__(self) -> None:
        self._inner = httpx.AsyncHTTPTransport(limits=httpx.Limits(max_keepalive_connections=0))

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        host = url.raw_host.decode("ascii")
        addresses = await public_addresses(host, url.port or (443 if url.scheme == "https" else 80))
        if url.scheme == "https":
            request.extensions = {**request.extensions, "sni_hostname": host}
        for address in addresses[:-1]:
            request.url = url.copy_with(host=address)
            try:
                return await self._inner.handle_async_request(request)
            except httpx.ConnectError:
                continue
        request.url = url.copy_with(host=addresses[-1])
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()


def webhook_client(*, allow_private: bool) -> httpx.AsyncClient:
    """The client webhooks are sent with: no proxies from the environment (a proxy would connect
    where this process never checked) and, unless ``allow_private`` (HM_WEBHOOK_ALLOW_PRIVATE),
    :class:`PublicAddressTransport`."""
    if allow_private:
        return httpx.AsyncClient(trust_env=False)
    return httpx.AsyncClient(transport=PublicAddressTransport(), trust_env=False)


@dataclass(frozen=True)
class DispatchResult:
    delivered: int = 0
    retried: int = 0
    failed: int = 0

    @property
    def anything(self) -> bool:
        return any(vars(self).values())


class WebhookDispatcher:
    """Sends due webhook deliveries.

    Args:
        pool: asyncpg pool. http: client used for the POSTs (no redirects are followed;
            :func:`webhook_client` builds the one that refuses private addresses).
        batch_size: deliveries per run. max_attempts: sends before a delivery is ``failed``.
        base_delay_seconds: first retry delay; doubles per attempt, capped at an hour.
    """

    def __init__(
        self,
        pool: asyncpg.Pool,
        http: httpx.AsyncClient,
        *,
        batch_size: int = 20,
        max_attempts: int = 8,
        base_delay_seconds: float = 5.0,
    ) -> None:
        self._pool = pool
        self._http = http
        self._batch = batch_size
        self._max_attempts = max_attempts
        self._base_delay = base_delay_seconds

    async def run_once(self) -> DispatchResult:
        """Send every due delivery (up to one batch) once; returns the outcomes."""
        async with self._pool.acquire() as conn, conn.transaction():
            rows = await conn.fetch(
                """
                SELECT d.delivery_id, d.account_id, d.url, d.payload, d.attempts, a.webhook_secret
                FROM webhook_deliveries d JOIN accounts a ON a.account_id = d.account_id
                WHERE d.status = 'pending' AND d.next_attempt_at <= now()
                ORDER BY d.next_attempt_at LIMIT $1 FOR UPDATE OF d SKIP LOCKED
                """,
                self._batch,
            )
            if rows:
                # Lease: another dispatcher will not pick these up while this one is sending.
                await conn.execute(
                    "UPDATE webhook_deliveries SET next_attempt_at = now() + make_interval(secs => $2) "
                    "WHERE delivery_id = ANY($1::uuid[])",
                    [r["delivery_id"] for r in rows],
                    SEND_TIMEOUT_SECONDS + 30,
                )
        outcomes = await asyncio.gather(*(self._deliver(row) for row in rows))
        result = DispatchResult(
            delivered=outcomes.count("delivered"),
            retried=outcomes.count("pending"),
            failed=outcomes.count("failed"),
        )
        for outcome, n in (
            ("delivered", result.delivered),
            ("retrying", result.retried),
            ("failed", result.failed),
        ):
            if n:
                metrics.WEBHOOK_DELIVERIES.labels(outcome).inc(n)
        if result.anything:
            log.info("webhooks: %s", result)
        return result

    async def _deliver(self, row: asyncpg.Record) -> str:
        delivery_id = str(row["delivery_id"])
        body = json.dumps(row["payload"], separators=(",", ":"))
        now = datetime.now(UTC)
        signature = Webhook(
            row["webhook_secret"] or await account_secret(self._pool, row["account_id"])
        ).sign(delivery_id, now, body)
        headers = {
            "content-type": "application/json",
            "user-agent": "hypermedia-webhooks/1",
            "webhook-id": delivery_id,
            "webhook-timestamp": str(int(now.timestamp())),
            "webhook-signature": signature,
        }
        status_code: int | None = None
        error: str | None = None
        blocked = False
        try:
            # One deadline for everything: the receiver's DNS lookup (outside httpx's timeouts)
            # and a receiver that drips its answer byte by byte. Its body is never read.
            async with (
                asyncio.timeout(SEND_TIMEOUT_SECONDS),
                self._http.stream(
                    "POST",
                    row["url"],
                    content=body,
                    headers=headers,
                    timeout=SEND_TIMEOUT_SECONDS,
                    follow_redirects=False,
                ) as response,
            ):
                status_code = response.status_code
            if 200 <= status_code < 300:
                await self._pool.execute(
                    "UPDATE webhook_deliveries SET status = 'delivered', attempts = attempts + 1, "
                    "last_status_code = $2, last_error = NULL, delivered_at = now() WHERE delivery_id = $1",
                    row["delivery_id"],
                    status_code,
                )
                return "delivered"
            error = f"receiver answered {status_code}"
        except BlockedAddress as exc:  # never retried: the URL points inside the network
            error, blocked = f"BlockedAddress: {exc}", True
            log.warning("webhook %s not sent: %s", delivery_id, exc)
        except Exception as exc:  # httpx.HTTPError, but also InvalidURL and the like: never stuck
            error = f"{type(exc).__name__}"
        attempts = row["attempts"] + 1
        final = blocked or attempts >= self._max_attempts
        delay = min(MAX_DELAY_SECONDS, self._base_delay * 2 ** (attempts - 1))
        await self._pool.execute(
            """
            UPDATE webhook_deliveries SET attempts = $2, last_status_code = $3, last_error = $4,
                   status = CASE WHEN $5 THEN 'failed' ELSE 'pending' END,
                   next_attempt_at = now() + make_interval(secs => $6)
            WHERE delivery_id = $1
            """,
            row["delivery_id"],
            attempts,
            status_code,
            error,
            final,
            delay,
        )
        return "failed" if final else "pending"
