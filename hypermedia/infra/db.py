"""Postgres access: the asyncpg pool every service uses, and schema migrations (yoyo).

Migrations are plain SQL files in ``hypermedia/infra/migrations/`` applied in order by yoyo-migrations
under its lock, so several processes starting at once apply each migration exactly once.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import yoyo
from asyncpg.pool import PoolConnectionProxy
from tenacity import AsyncRetrying, retry_if_exception, stop_after_delay, wait_exponential

MIGRATIONS_DIR = Path(__file__).with_name("migrations")

Connection = asyncpg.Connection | PoolConnectionProxy
"""A plain connection or one borrowed from a pool: what transaction-scoped helpers accept."""


TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    asyncpg.PostgresConnectionError,  # connection lost or refused (class 08)
    asyncpg.CannotConnectNowError,  # 57P03: the server is starting up or shutting down
    asyncpg.AdminShutdownError,  # 57P01: terminated by a fast shutdown or restart
    asyncpg.CrashShutdownError,  # 57P02: another backend crashed
    asyncpg.TooManyConnectionsError,
    asyncpg.InterfaceError,  # "connection is closed" and friends, raised client-side
    ConnectionError,
    TimeoutError,
    OSError,
)
"""Errors that mean "Postgres is unreachable right now", not "this statement is wrong": a restart,
a failover, a network blip. Retrying the same statement later can succeed."""


def is_transient(exc: BaseException) -> bool:
    """True for :data:`TRANSIENT_ERRORS` (a lost server, not a bad statement)."""
    return isinstance(exc, TRANSIENT_ERRORS)


def retrying(max_seconds: float = 30.0, on_retry: Callable[[], None] | None = None) -> AsyncRetrying:
    """Tenacity loop for one Postgres statement or transaction across a server restart: retried on
    :data:`TRANSIENT_ERRORS` with exponential backoff (0.2 s doubling to 2 s) for at most
    ``max_seconds``, then the last error is raised. Only for work that is safe to repeat
    (conditional updates, idempotent inserts). ``on_retry`` runs before each retry."""
    return AsyncRetrying(
        stop=stop_after_delay(max_seconds),
        wait=wait_exponential(multiplier=0.2, max=2),
        retry=retry_if_exception(is_transient),
        before_sleep=(lambda _state: on_retry()) if on_retry else None,
        reraise=True,
    )


POOLER_HINT = (
    "Postgres refused a prepared statement this connection made: HM_DATABASE_URL is probably a "
    "connection pooler in transaction mode (PgBouncer pool_mode = transaction). Set "
    "HM_DATABASE_POOLER=transaction and HM_DATABASE_SESSION_URL to the primary itself "
    "(docs/operations.md, 'Postgres behind PgBouncer')."
)
"""What a service says when :func:`pooler_mismatch` holds: the cause, and the settings that fix it."""


def pooler_mismatch(exc: BaseException | None) -> bool:
    """Whether ``exc``, or an exception it was raised from, is Postgres refusing a prepared
    statement (``does not exist``, ``already exists``, a bind that does not fit it): what a
    pool that keeps statements gets from a transaction-pooling PgBouncer, whose server
    connections change between transactions (ADR 0076)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, asyncpg.PostgresError) and "prepared statement" in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


async def _init_connection(conn: asyncpg.Connection) -> None:
    for typ in ("json", "jsonb"):
        await conn.set_type_codec(typ, encoder=json.dumps, decoder=json.loads, schema="pg_catalog")


async def _keep_session(conn: asyncpg.Connection) -> None:
    """The pool's reset on release: nothing beyond what asyncpg always does (its listeners
    cleared, a transaction left open rolled back). The platform keeps no session state on pooled
    connections — advisory locks are transaction-scoped (``pg_advisory_xact_lock``), ``LISTEN``
    has its own connection (:mod:`hypermedia.jobs.events`), nothing runs ``SET`` or holds a
    cursor — so asyncpg's default reset (``pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *;
    RESET ALL``) was a round trip per release for nothing: 13.5 a thumbnail job across the
    services (measured with ``log_statement = all``, docs/performance.md)."""


async def create_pool(
    dsn: str, *, min_size: int = 1, max_size: int = 10, pooler: str = "none"
) -> asyncpg.Pool:
    """An asyncpg pool with JSON/JSONB decoded to Python values and no reset query on release
    (:func:`_keep_session`: code using the pool must keep no session state).

    Args:
        pooler: ``transaction`` when ``dsn`` is a PgBouncer in transaction pooling
            (``HM_DATABASE_POOLER``): no prepared statement is kept from one query to the next
            (``statement_cache_size=0``; since asyncpg 0.29 that also re-parses each query in the
            same sync as its bind, so no statement outlives a transaction: ADR 0076).

    Raises:
        OSError, asyncpg.PostgresError: when the server cannot be reached.
    """
    pool = await asyncpg.create_pool(
        dsn,
        min_size=min_size,
        max_size=max_size,
        init=_init_connection,
        reset=_keep_session,
        command_timeout=30,
        statement_cache_size=0 if pooler == "transaction" else 100,
    )
    assert pool is not None
    return pool


async def connect(
    dsn: str, server_settings: dict[str, str] | None = None, *, timeout: float = 60.0
) -> asyncpg.Connection:
    """One connection with the same JSON/JSONB codecs as :func:`create_pool` (scripts, tests, the
    scheduler's leader lock, listeners), with ``server_settings`` (run-time parameters) for its
    session; ``timeout``: seconds to connect (asyncpg's default, 60)."""
    conn = await asyncpg.connect(dsn, server_settings=server_settings, timeout=timeout)
    await _init_connection(conn)
    return conn


def check_url(name: str, dsn: str) -> None:
    """Checks that the setting ``name`` holds a PostgreSQL URL the platform can connect with
    (``postgresql://user:password@host:port/database``; several ``host:port`` separated by
    commas, as libpq and asyncpg take them), before anything starts.

    Raises:
        ValueError: ``NAME: what is wrong``, never the value (it holds a password).
    """
    parts = urlsplit(dsn)
    if parts.scheme not in ("postgres", "postgresql"):
        raise ValueError(f"{name}: not a PostgreSQL URL (postgresql://user:password@host:port/database)")
    for host in parts.netloc.rpartition("@")[2].split(","):
        port = host.rpartition("]")[2].partition(":")[2] if host.startswith("[") else host.partition(":")[2]
        if port and not (port.isdigit() and 0 < int(port) < 65536):
            raise ValueError(f"{name}: a host's port is not a number from 1 to 65535")


def _yoyo_url(dsn: str) -> str:
    parts = urlsplit(dsn)
    if "," in parts.netloc.rpartition("@")[2]:
        raise ValueError(
            "migrations connect to one host: give HM_DATABASE_URL the primary's host alone "
            "(the services take several hosts, the migration tool does not)"
        )
    scheme = "postgresql+psycopg"
    return urlunsplit((scheme, parts.netloc, parts.path, parts.query, parts.fragment))


def migrate(dsn: str) -> int:
    """Apply pending migrations to the database at ``dsn``; returns how many were applied.

    Raises:
        ValueError: ``dsn`` names several hosts (yoyo connects to one).
    """
    backend = yoyo.get_backend(_yoyo_url(dsn))
    migrations = yoyo.read_migrations(str(MIGRATIONS_DIR))
    with backend.lock():
        pending = backend.to_apply(migrations)
        backend.apply_migrations(pending)
    return len(pending)
