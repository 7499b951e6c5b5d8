"""Webhooks: one delivery per terminal state (written by the trigger in the state change's own
transaction), signed in the Standard Webhooks format, retried after a receiver error, at least once."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import socket
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import httpx
import pytest
from standardwebhooks import Webhook
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from hypermedia.devtools.embedded import free_port
from hypermedia.infra.httpserver import HttpServer
from hypermedia.jobs import webhooks
from hypermedia.jobs.webhooks import new_webhook_secret
from services.reaper import webhooks as reaper_webhooks
from services.reaper.webhooks import WebhookDispatcher, webhook_client
from tests.integration.conftest import Seeder, Tenant


@dataclass
class Receiver:
    """A webhook receiver that answers with the next status of ``script`` (then 204)."""

    url: str
    port: int
    script: list[int] = field(default_factory=list)
    received: list[tuple[dict[str, str], bytes]] = field(default_factory=list)


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    port = free_port()
    rec = Receiver(f"http://127.0.0.1:{port}/hooks", port)

    async def hook(request: Request) -> Response:
        rec.received.append((dict(request.headers), await request.body()))
        return Response(status_code=rec.script.pop(0) if rec.script else 204)

    server = HttpServer("127.0.0.1", port)
    await server.start(Starlette(routes=[Route("/hooks", hook, methods=["POST"])]))
    try:
        yield rec
    finally:
        await server.stop()


async def _tenant_with_secret(seed: Seeder) -> tuple[Tenant, str]:
    tenant = await seed.tenant()
    secret = new_webhook_secret()
    await seed.pool.execute(
        "UPDATE accounts SET webhook_secret = $2 WHERE account_id = $1", tenant.account_id, secret
    )
    return tenant, secret


async def _job_with_hook(seed: Seeder, tenant: Tenant, url: str) -> uuid.UUID:
    job_id = await seed.job(tenant, status="processing", attempt_count=1, claimed_by="w", lease_in=60)
    await seed.pool.execute("UPDATE processing_jobs SET webhook_url = $2 WHERE job_id = $1", job_id, url)
    return job_id


async def _deliveries(pool: asyncpg.Pool, job_id: uuid.UUID) -> list[asyncpg.Record]:
    return await pool.fetch("SELECT * FROM webhook_deliveries WHERE job_id = $1 ORDER BY created_at", job_id)


async def test_each_terminal_state_is_recorded_once_in_the_same_transaction(
    fresh_pool: asyncpg.Pool, seed: Seeder
) -> None:
    tenant, _ = await _tenant_with_secret(seed)
    job_id = await _job_with_hook(seed, tenant, "http://127.0.0.1:9/hooks")
    silent = await seed.job(tenant, status="processing", attempt_count=1, claimed_by="w", lease_in=60)
    with pytest.raises(asyncpg.PostgresError):
        async with fresh_pool.acquire() as conn, conn.transaction():
            await conn.execute("UPDATE processing_jobs SET status = 'completed' WHERE job_id = $1", job_id)
            raise asyncpg.PostgresError("rolled back")
    assert await _deliveries(fresh_pool, job_id) == [], "a rolled-back transition announces nothing"

    await fresh_pool.execute(
        "UPDATE processing_jobs SET status = 'completed', actual_credits = 1200 WHERE job_id = ANY($1::uuid[])",
        [job_id, silent],
    )
    await fresh_pool.execute("UPDATE processing_jobs SET status = 'completed' WHERE job_id = $1", job_id)
    [delivery] = await _deliveries(fresh_pool, job_id)
    assert delivery["event_type"] == "job.completed" and delivery["status"] == "pending"
    payload = delivery["payload"]
    assert payload["type"] == "job.completed"
    assert payload["data"]["job_id"] == str(job_id)
    assert payload["data"]["status"] == "completed"
    assert payload["data"]["actual_credits"] == 1.2
    assert await _deliveries(fresh_pool, silent) == [], "no webhook_url, no delivery"


async def test_signed_delivery_retried_after_a_500_then_delivered(
    fresh_pool: asyncpg.Pool, seed: Seeder, receiver: Receiver
) -> None:
    tenant, secret = await _tenant_with_secret(seed)
    job_id = await _job_with_hook(seed, tenant, receiver.url)
    await fresh_pool.execute(
        "UPDATE processing_jobs SET status = 'failed', error_code = 'CORRUPT_INPUT' WHERE job_id = $1", job_id
    )
    receiver.script = [500]
    async with httpx.AsyncClient() as http:
        dispatcher = WebhookDispatcher(fresh_pool, http, base_delay_seconds=30)
        first = await dispatcher.run_once()
        assert (first.delivered, first.retried, first.failed) == (0, 1, 0)
        [delivery] = await _deliveries(fresh_pool, job_id)
        assert (delivery["status"], delivery["attempts"], delivery["last_status_code"]) == ("pending", 1, 500)
        wait = await fresh_pool.fetchval(
            "SELECT extract(epoch FROM next_attempt_at - now()) FROM webhook_deliveries WHERE job_id = $1",
            job_id,
        )
        assert 25 < float(wait) <= 30, "first retry after base_delay"
        assert (await dispatcher.run_once()).anything is False, "not due yet"

        await fresh_pool.execute(
            "UPDATE webhook_deliveries SET next_attempt_at = now() WHERE job_id = $1", job_id
        )
        second = await dispatcher.run_once()
    assert (second.delivered, second.retried) == (1, 0)
    [delivery] = await _deliveries(fresh_pool, job_id)
    assert (delivery["status"], delivery["attempts"], delivery["last_status_code"]) == ("delivered", 2, 204)

    assert len(receiver.received) == 2
    ids = {headers["webhook-id"] for headers, _ in receiver.received}
    assert ids == {str(delivery["delivery_id"])}, "the same webhook-id on every retry"
    for headers, body in receiver.received:
        verified: Any = Webhook(secret).verify(body, headers)
        assert verified["type"] == "job.failed"
        assert verified["data"]["error_code"] == "CORRUPT_INPUT"
    headers, body = receiver.received[-1]
    with pytest.raises(Exception):  # noqa: B017 - the library raises its own WebhookVerificationError
        Webhook(new_webhook_secret()).verify(body, headers)
    tampered = json.loads(body) | {"type": "job.completed"}
    with pytest.raises(Exception):  # noqa: B017
        Webhook(secret).verify(json.dumps(tampered), headers)


async def test_a_receiver_that_never_answers_well_ends_failed_after_max_attempts(
    fresh_pool: asyncpg.Pool, seed: Seeder, receiver: Receiver
) -> None:
    tenant, _ = await _tenant_with_secret(seed)
    job_id = await _job_with_hook(seed, tenant, receiver.url)
    await fresh_pool.execute("UPDATE processing_jobs SET status = 'cancelled' WHERE job_id = $1", job_id)
    receiver.script = [503, 502, 500]
    async with httpx.AsyncClient() as http:
        dispatcher = WebhookDispatcher(fresh_pool, http, max_attempts=3, base_delay_seconds=1)
        for _ in range(3):
            await fresh_pool.execute(
                "UPDATE webhook_deliveries SET next_attempt_at = now() WHERE job_id = $1", job_id
            )
            await dispatcher.run_once()
    [delivery] = await _deliveries(fresh_pool, job_id)
    assert (delivery["status"], delivery["attempts"], delivery["last_status_code"]) == ("failed", 3, 500)


async def test_two_dispatchers_send_each_delivery_once(
    fresh_pool: asyncpg.Pool, seed: Seeder, receiver: Receiver
) -> None:
    tenant, _ = await _tenant_with_secret(seed)
    jobs = [await _job_with_hook(seed, tenant, receiver.url) for _ in range(12)]
    await fresh_pool.execute(
        "UPDATE processing_jobs SET status = 'completed' WHERE job_id = ANY($1::uuid[])", jobs
    )
    async with httpx.AsyncClient() as http:
        a = WebhookDispatcher(fresh_pool, http, batch_size=5)
        b = WebhookDispatcher(fresh_pool, http, batch_size=5)
        for _ in range(3):
            await asyncio.gather(a.run_once(), b.run_once())
    assert len(receiver.received) == 12
    assert len({h["webhook-id"] for h, _ in receiver.received}) == 12


async def test_an_undeliverable_url_counts_as_a_failed_attempt_not_a_stuck_row(
    fresh_pool: asyncpg.Pool, seed: Seeder
) -> None:
    tenant, _ = await _tenant_with_secret(seed)
    job_id = await _job_with_hook(seed, tenant, "http://x:abc/")  # written before URLs were validated
    await fresh_pool.execute("UPDATE processing_jobs SET status = 'completed' WHERE job_id = $1", job_id)
    async with httpx.AsyncClient() as http:
        result = await WebhookDispatcher(fresh_pool, http).run_once()
    assert (result.delivered, result.retried) == (0, 1)
    [delivery] = await _deliveries(fresh_pool, job_id)
    assert (delivery["status"], delivery["attempts"]) == ("pending", 1)
    assert delivery["last_error"] == "InvalidURL"


async def test_webhooks_to_non_public_addresses_fail_at_once_and_connect_nowhere(
    fresh_pool: asyncpg.Pool, seed: Seeder, receiver: Receiver
) -> None:
    """The SSRF guard: a URL stored before the gateway checked it, or a name that resolves inside."""
    tenant, _ = await _tenant_with_secret(seed)
    port = receiver.port
    urls = [
        receiver.url,  # 127.0.0.1
        f"http://localhost:{port}/hooks",  # a name: resolved (/etc/hosts), then refused
        f"http://127.1:{port}/hooks",  # the short form getaddrinfo reads
        f"http://[::ffff:127.0.0.1]:{port}/hooks",
        "http://169.254.169.254/latest/meta-data/",  # cloud metadata
    ]
    jobs = [await _job_with_hook(seed, tenant, url) for url in urls]
    await fresh_pool.execute(
        "UPDATE processing_jobs SET status = 'completed' WHERE job_id = ANY($1::uuid[])", jobs
    )
    async with webhook_client(allow_private=False) as http:
        result = await WebhookDispatcher(fresh_pool, http, batch_size=10).run_once()
    assert (result.delivered, result.retried, result.failed) == (0, 0, len(urls))
    for job_id in jobs:
        [delivery] = await _deliveries(fresh_pool, job_id)
        assert (delivery["status"], delivery["attempts"]) == ("failed", 1)
        assert delivery["last_error"].startswith("BlockedAddress: "), delivery["last_error"]
        assert "not a public address" in delivery["last_error"]
    assert receiver.received == []

    # HM_WEBHOOK_ALLOW_PRIVATE (what `hypermedia up` sets) sends to the local receiver.
    job_id = await _job_with_hook(seed, tenant, receiver.url)
    await fresh_pool.execute("UPDATE processing_jobs SET status = 'completed' WHERE job_id = $1", job_id)
    async with webhook_client(allow_private=True) as http:
        assert (await WebhookDispatcher(fresh_pool, http).run_once()).delivered == 1
    assert len(receiver.received) == 1


async def test_a_checked_delivery_goes_to_the_address_it_checked_and_keeps_the_host_name(
    fresh_pool: asyncpg.Pool, seed: Seeder, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The transport connects to the resolved address itself (no second lookup to rebind) and the
    receiver still sees the URL's name in Host. Loopback stands in for a public address here: the
    policy is widened to 127.0.0.0/8 (and nothing else); the lookup of ``localhost`` is real."""
    loopback = ipaddress.ip_network("127.0.0.0/8")
    monkeypatch.setattr(
        webhooks, "is_public_address", lambda address: address.version == 4 and address in loopback
    )
    tenant, _ = await _tenant_with_secret(seed)
    port = receiver.port
    answers = {info[4][0] for info in socket.getaddrinfo("localhost", port, type=socket.SOCK_STREAM)}
    if not all(ipaddress.ip_address(a) in loopback for a in answers):
        pytest.skip(f"localhost resolves to {sorted(answers)} here, not only to IPv4 loopback")
    assert set(await webhooks.public_addresses("localhost", port)) == answers
    job_id = await _job_with_hook(seed, tenant, f"http://localhost:{port}/hooks")
    await fresh_pool.execute("UPDATE processing_jobs SET status = 'completed' WHERE job_id = $1", job_id)
    async with webhook_client(allow_private=False) as http:
        assert (await WebhookDispatcher(fresh_pool, http).run_once()).delivered == 1
    [(headers, _body)] = receiver.received
    assert headers["host"] == f"localhost:{port}"


async def test_a_receiver_that_drips_its_answer_is_cut_off_at_the_send_deadline(
    fresh_pool: asyncpg.Pool, seed: Seeder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """httpx's timeouts are per read: a receiver sending one header byte every 0.2 s never trips
    them. The dispatcher's own deadline ends the attempt (and the row stays leased, not sent twice)."""
    monkeypatch.setattr(reaper_webhooks, "SEND_TIMEOUT_SECONDS", 1.0)
    connections = 0

    async def drip(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        await reader.readuntil(b"\r\n\r\n")
        try:
            writer.write(b"HTTP/1.1 204 No Content\r\nX-Slow: ")
            for _ in range(100):
                await writer.drain()
                writer.write(b"a")
                await asyncio.sleep(0.2)
        except ConnectionError:
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(drip, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    tenant, _ = await _tenant_with_secret(seed)
    job_id = await _job_with_hook(seed, tenant, f"http://127.0.0.1:{port}/hooks")
    await fresh_pool.execute("UPDATE processing_jobs SET status = 'completed' WHERE job_id = $1", job_id)
    try:
        async with webhook_client(allow_private=True) as http:
            started = time.monotonic()
            result = await WebhookDispatcher(fresh_pool, http).run_once()
            elapsed = time.monotonic() - started
    finally:
        server.close()
    assert (result.delivered, result.retried) == (0, 1)
    assert 1.0 <= elapsed < 5.0, elapsed
    assert connections == 1
    [delivery] = await _deliveries(fresh_pool, job_id)
    assert (delivery["status"], delivery["attempts"], delivery["last_error"]) == (
        "pending",
        1,
        "TimeoutError",
    )
