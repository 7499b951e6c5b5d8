"""Fixtures for the queueing integration tests: a fresh database per test, a private stream prefix,
a credits service on a real gRPC port, and a seeder for the rows a job needs.

The reaper and the outbox relay act on every row of their database, so each of these tests gets a
database of its own, cloned from a migrated template (``CREATE DATABASE … TEMPLATE``, a few tens of
milliseconds) on the session's Postgres server. Counts returned by ``run_once()`` are then exact.
"""

from __future__ import annotations

import contextlib
import secrets
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import grpc
import pytest
from nats.aio.client import Client as NatsClient
from nats.js import JetStreamContext

from hypermedia.api.credits.v1 import credits_pb2, credits_pb2_grpc
from hypermedia.core.config import QUEUES
from hypermedia.infra import db
from hypermedia.infra.rpc import GrpcServer, channel
from hypermedia.jobs import queues
from services.credits.service import CreditsService

CREDITS_SERVICE_NAME = "hypermedia.credits.v1.CreditsService"


def _with_database(dsn: str, name: str) -> str:
    parts = urlsplit(dsn)
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


async def _admin(database_url: str, sql: str) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


@pytest.fixture(scope="session")
def template_database(database_url: str) -> Iterator[str]:
    """Name of a migrated database that per-test databases are cloned from."""
    import psycopg

    name = f"hm_tpl_{secrets.token_hex(4)}"
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    db.migrate(_with_database(database_url, name))
    with psycopg.connect(database_url, autocommit=True) as conn:
        # yoyo may keep its connection open; a template must have no sessions when it is copied.
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,))
    yield name
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
async def fresh_pool(database_url: str, template_database: str) -> AsyncIterator[asyncpg.Pool]:
    """An asyncpg pool (JSON codecs) on a migrated database no other test touches."""
    name = f"hm_it_{secrets.token_hex(4)}"
    await _admin(database_url, f'CREATE DATABASE "{name}" TEMPLATE "{template_database}"')
    pool = await db.create_pool(_with_database(database_url, name), max_size=8)
    try:
        yield pool
    finally:
        await pool.close()
        await _admin(database_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@dataclass
class Broker:
    """A NATS connection and a stream prefix whose six queue streams exist and are empty."""

    nc: NatsClient
    js: JetStreamContext
    prefix: str

    def stream(self, queue: str) -> str:
        return queues.stream_name(self.prefix, queue)

    async def stream_messages(self, queue: str) -> int:
        info = await self.js.stream_info(self.stream(queue))
        return int(info.state.messages)


@pytest.fixture
async def broker(nats_url: str) -> AsyncIterator[Broker]:
    prefix = "T" + secrets.token_hex(6).upper()
    nc, js = await queues.connect(nats_url, name=f"test-{prefix}")
    try:
        await queues.ensure_streams(js, prefix)
        yield Broker(nc, js, prefix)
    finally:
        for queue in QUEUES:
            # Best effort: the streams only take space on the session's private server.
            with contextlib.suppress(Exception):
                await js.delete_stream(queues.stream_name(prefix, queue))
        await nc.close()


@dataclass
class Credits:
    """The credits servicer (call it directly) and a stub reaching it over a real gRPC port."""

    service: CreditsService
    stub: credits_pb2_grpc.CreditsServiceStub

    async def hold(self, account_id: uuid.UUID, millicredits: int, *job_ids: uuid.UUID | str) -> None:
        """Holds ``millicredits`` for each of ``job_ids`` on the account (``Hold``, called directly)."""
        request = credits_pb2.HoldRequest(account_id=str(account_id))
        for job_id in job_ids:
            request.holds.add(job_id=str(job_id), millicredits=millicredits)
        await self.service.Hold(request, None)


@pytest.fixture
async def credits(fresh_pool: asyncpg.Pool) -> AsyncIterator[Credits]:
    service = CreditsService(fresh_pool)
    server = GrpcServer(
        "127.0.0.1:0",
        [(credits_pb2_grpc.add_CreditsServiceServicer_to_server, service)],
        [CREDITS_SERVICE_NAME],
    )
    await server.start()
    chan: grpc.aio.Channel = channel(f"127.0.0.1:{server.port}")
    try:
        yield Credits(service, credits_pb2_grpc.CreditsServiceStub(chan))
    finally:
        await chan.close()
        await server.stop(0)


@dataclass(frozen=True)
class Tenant:
    account_id: uuid.UUID
    pool_id: uuid.UUID
    object_id: uuid.UUID


class Seeder:
    """Inserts the rows jobs need. Times are given as seconds relative to the database's ``now()``."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    async def tenant(self, balance: int = 0) -> Tenant:
        """An account with a pool, one available 1 MiB image object and a credit account."""
        account_id, pool_id, object_id = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
        async with self.pool.acquire() as conn, conn.transaction():
            await conn.execute("INSERT INTO accounts (account_id, name) VALUES ($1, 'test')", account_id)
            await conn.execute(
                "INSERT INTO pools (pool_id, account_id, name) VALUES ($1, $2, 'default')",
                pool_id,
                account_id,
            )
            await self._object(conn, pool_id, object_id)
            await conn.execute(
                "INSERT INTO credit_accounts (account_id, balance) VALUES ($1, $2)", account_id, balance
            )
        return Tenant(account_id, pool_id, object_id)

    async def output_object(self, tenant: Tenant) -> uuid.UUID:
        object_id = uuid.uuid4()
        async with self.pool.acquire() as conn:
            await self._object(conn, tenant.pool_id, object_id, source=tenant.object_id)
        return object_id

    @staticmethod
    async def _object(
        conn: Any, pool_id: uuid.UUID, object_id: uuid.UUID, source: uuid.UUID | None = None
    ) -> None:
        await conn.execute(
            """
            INSERT INTO objects (object_id, pool_id, key, size_bytes, mime_type, sha256, state,
                                 source_object_id)
            VALUES ($1, $2, $3, 1048576, 'image/png', $4, 'available', $5)
            """,
            object_id,
            pool_id,
            f"objects/{object_id}",
            "0" * 64,
            source,
        )

    async def job(
        self,
        tenant: Tenant,
        *,
        status: str = "queued",
        priority: int = 5,
        attempt_count: int = 0,
        max_attempts: int = 3,
        claimed_by: str | None = None,
        lease_in: float | None = None,
        queued_ago: float = 0.0,
        next_attempt_in: float | None = None,
        estimated_credits: int = 1200,
    ) -> uuid.UUID:
        """A ``thumbnail`` v1 job on the ``images`` queue of ``tenant``'s object. ``lease_in`` sets
        ``visibility_timeout = now() + lease_in`` (negative: expired)."""
        job_id = uuid.uuid4()
        await self.pool.execute(
            """
            INSERT INTO processing_jobs
                (job_id, account_id, object_id, request_id, operation, profile_version, queue, priority,
                 status, attempt_count, max_attempts, claimed_by, claimed_at, visibility_timeout,
                 next_attempt_at, estimated_credits, queued_at)
            VALUES ($1, $2, $3, $4, 'thumbnail', 1, 'images', $5, $6, $7, $8, $9,
                    CASE WHEN $9::text IS NOT NULL THEN now() END,
                    now() + make_interval(secs => $10::float8),
                    now() + make_interval(secs => $11::float8), $12,
                    now() - make_interval(secs => $13::float8))
            """,
            job_id,
            tenant.account_id,
            tenant.object_id,
            uuid.uuid4(),
            priority,
            status,
            attempt_count,
            max_attempts,
            claimed_by,
            lease_in,
            next_attempt_in,
            estimated_credits,
            queued_ago,
        )
        if claimed_by is not None and attempt_count > 0:
            await self.pool.execute(
                "INSERT INTO job_attempts (job_id, attempt_number, worker_id, status) "
                "VALUES ($1, $2, $3, 'processing')",
                job_id,
                attempt_count,
                claimed_by,
            )
        return job_id

    async def worker(self, worker_id: str, *, heartbeat_ago: float, status: str = "running") -> None:
        await self.pool.execute(
            """
            INSERT INTO workers (worker_id, deployment, boot_id, role, generation, queue, slots, hostname,
                                 pid, status, last_heartbeat)
            VALUES ($1, 'imageworker', 'boot', 'worker', 1, 'images', 2, 'host', 1, $2,
                    now() - make_interval(secs => $3::float8))
            """,
            worker_id,
            status,
            heartbeat_ago,
        )

    async def job_row(self, job_id: uuid.UUID) -> asyncpg.Record:
        row = await self.pool.fetchrow("SELECT * FROM processing_jobs WHERE job_id = $1", job_id)
        assert row is not None
        return row

    async def outbox_rows(self, job_id: uuid.UUID) -> list[asyncpg.Record]:
        return await self.pool.fetch(
            "SELECT * FROM outbox WHERE payload->>'job_id' = $1 ORDER BY outbox_id", str(job_id)
        )


@pytest.fixture
def seed(fresh_pool: asyncpg.Pool) -> Seeder:
    return Seeder(fresh_pool)
