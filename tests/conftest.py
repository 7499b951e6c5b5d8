"""Shared fixtures: real Postgres and real NATS JetStream, isolated per test session.

Postgres: when ``TEST_DATABASE_URL`` (or ``HM_DATABASE_URL``) names a server, a fresh database
``hm_test_<random>`` is created there and dropped afterwards; otherwise an embedded cluster is
started in a temporary directory. NATS: always a private nats-server on a free port with its own
JetStream store, so tests never see another run's streams.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from hypermedia.devtools.embedded import EmbeddedNats, EmbeddedPostgres
from hypermedia.infra import db

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"


@pytest.fixture(scope="session", autouse=True)
def no_libreoffice_sockets_left() -> Iterator[None]:
    """LibreOffice creates its named pipes as Unix sockets in ``/tmp`` (``OSL_PIPE_*``) whatever
    ``TMPDIR`` says, and leaves them when it is killed (a listener restart) or after a cold
    ``soffice --convert-to`` run. Listeners with a uid of their own have a private ``/tmp``; the
    cold runs and the listeners the tests start without one use the shared one: what this session
    added there is removed at its end."""
    tmp = Path("/tmp")
    before = set(tmp.glob("OSL_PIPE_*"))
    yield
    for path in set(tmp.glob("OSL_PIPE_*")) - before:
        if path.is_socket() and path.lstat().st_uid == os.geteuid():
            path.unlink(missing_ok=True)


@pytest.fixture(scope="session")
def tmp_root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="hm-test-"))
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def database_url(tmp_root: Path) -> Iterator[str]:
    """DSN of a fresh, migrated database that lives for the test session."""
    server = os.environ.get("TEST_DATABASE_URL") or os.environ.get("HM_DATABASE_URL")
    name = f"hm_test_{secrets.token_hex(4)}"
    if server:
        import psycopg

        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        parts = urlsplit(server)
        dsn = urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))
        db.migrate(dsn)
        yield dsn
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        return
    pg = EmbeddedPostgres(tmp_root / "pg").start()
    try:
        dsn = pg.create_database(name)
        db.migrate(dsn)
        yield dsn
    finally:
        pg.stop()


@pytest.fixture(scope="session")
def nats_url(tmp_root: Path) -> Iterator[str]:
    """URL of a private nats-server with JetStream (sync_interval: always)."""
    server = EmbeddedNats(tmp_root / "nats").start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
async def pool(database_url: str) -> AsyncIterator[asyncpg.Pool]:
    p = await db.create_pool(database_url, max_size=4)
    try:
        yield p
    finally:
        await p.close()
