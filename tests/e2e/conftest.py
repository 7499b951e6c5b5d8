"""End-to-end fixtures: the real platform (`hypermedia up` as a subprocess, every service its own
process) on the session's Postgres database and NATS server, reached over REST and gRPC like a
client would."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import grpc
import httpx
import psycopg
import pytest

from hypermedia.devtools.embedded import free_port
from hypermedia.infra import mtls

REPO = Path(__file__).resolve().parents[2]
E2E = Path(__file__).resolve().parent
T = TypeVar("T")


@dataclass
class RunningPlatform:
    """A `hypermedia up` subprocess and what it wrote to platform.json."""

    state_dir: Path
    env: dict[str, str]
    process: subprocess.Popen[bytes]
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def rest_url(self) -> str:
        return str(self.info["rest_url"])

    @property
    def grpc_addr(self) -> str:
        return str(self.info["grpc_addr"])

    def service_env(self, identity: str = "imageworker") -> dict[str, str]:
        """Environment for starting one more service process against this platform, with the
        internal-gRPC certificate of ``identity`` (ADR 0044)."""
        env = dict(self.env)
        env.update(
            {
                "HM_CREDITS_ADDR": self.info["credits_addr"],
                "HM_STORAGE_ADDR": self.info["storage_addr"],
                "HM_WORK_DIR": str(self.state_dir / "work-extra"),
                **self.tls_env(identity),
            }
        )
        return env

    def worker_status_addr(self, unit: str = "imageworker", timeout: float = 60) -> str:
        """The status address of worker ``unit`` once it accepts connections: `up` is ready when
        the gateway is, and a unit's execution serves its status only after control's peer check,
        which can come later on a busy machine."""
        address = str(self.info[f"{unit}_status_addr"])
        host, _, port = address.rpartition(":")

        def serving() -> bool:
            with contextlib.suppress(OSError):
                socket.create_connection((host, int(port)), timeout=0.5).close()
                return True
            return False

        wait_for(f"{unit} status on {address}", serving, timeout)
        return address

    def tls_env(self, identity: str = "admin") -> dict[str, str]:
        """``HM_INTERNAL_AUTH`` and the ``HM_TLS_*`` files of ``identity`` that `up` issued."""
        tls_dir = self.state_dir / "tls"
        return {
            "HM_INTERNAL_AUTH": "mtls",
            "HM_TLS_CA": str(tls_dir / "ca.pem"),
            "HM_TLS_CERT": str(tls_dir / f"{identity}.pem"),
            "HM_TLS_KEY": str(tls_dir / f"{identity}-key.pem"),
        }

    def tls(self, identity: str = "admin") -> mtls.Tls:
        """The CA, certificate and key of ``identity`` for internal gRPC."""
        return mtls.Tls.from_dir(self.state_dir / "tls", identity)

    def internal_channel(self, address: str, identity: str = "admin") -> grpc.Channel:
        """A blocking mutual-TLS channel to an internal service of this platform as ``identity``."""
        return grpc.secure_channel(address, self.tls(identity).channel_credentials())

    def internal_aio_channel(self, address: str, identity: str = "admin") -> grpc.aio.Channel:
        """An aio mutual-TLS channel to an internal service of this platform as ``identity``."""
        return grpc.aio.secure_channel(address, self.tls(identity).channel_credentials())

    def client(self, account: dict[str, Any], timeout: float = 30) -> httpx.Client:
        """An HTTP client of this platform's REST API authenticated as ``account`` (the JSON of
        ``admin create-account``); use it as a context manager."""
        return httpx.Client(
            base_url=self.rest_url, headers={"Authorization": f"Bearer {account['api_key']}"}, timeout=timeout
        )

    def admin(self, *args: str) -> dict[str, Any]:
        """``hypermedia admin *args`` against this platform (through its ``platform.json``), and
        the JSON it prints. The command runs in this process (``typer.testing.CliRunner``: the
        same code, without the 3–4 s a Python start with the CLI's imports costs on this machine,
        once for each of the suite's hundreds of calls), in a thread of its own (it runs an event
        loop; the calling test may have one running). ``tests/e2e/test_client_cli.py`` runs the
        command line itself.

        Raises:
            AssertionError: the command failed; its output says why.
        """
        from typer.testing import CliRunner

        from hypermedia.devtools.cli import app

        env: dict[str, str | None] = {**self.env, "HM_DATABASE_URL": None, "HM_CREDITS_ADDR": None}
        with ThreadPoolExecutor(1) as thread:
            result = thread.submit(CliRunner().invoke, app, ["admin", *args], env=env).result(timeout=60)
        assert result.exit_code == 0, (
            f"hypermedia admin {' '.join(args)}: {result.output}{result.exception!r}"
        )
        return dict(json.loads(result.stdout))

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


def start_platform(
    tmp: Path, database_url: str, nats_url: str, services: str | None = None, **extra_env: str
) -> RunningPlatform:
    """Start `hypermedia up` in ``tmp`` with a private stream prefix and free ports; wait until ready."""
    state = tmp / f"platform-{secrets.token_hex(3)}"
    state.mkdir(parents=True)
    env = {
        **os.environ,
        "HM_DATABASE_URL": database_url,
        "HM_NATS_URL": nats_url,
        "HM_STATE_DIR": str(state),
        "HM_STREAM_PREFIX": f"T{secrets.token_hex(3).upper()}",
        "HM_GATEWAY_HTTP_PORT": str(free_port()),
        "HM_GATEWAY_GRPC_PORT": str(free_port()),
        "HM_REAPER_INTERVAL_SECONDS": "1",
        "HM_HEARTBEAT_SECONDS": "5",
        # Sandbox and LibreOffice-listener uids of their own: platforms alive at once (two module
        # fixtures, a benchmark) must not share uids (a listener's start kills its uid's processes).
        "HM_SANDBOX_UID_BASE": str(100_000 + 1_000 * secrets.randbelow(100_000)),
        # As hypermedia up gives its workers; also to workers the tests start themselves.
        "HM_SANDBOX_REQUIRE": "best-effort",
        **extra_env,
    }
    cmd = [sys.executable, "-m", "hypermedia.devtools.cli", "up"]
    if services:
        cmd += ["--services", services]
    log = (state / "up.log").open("ab")
    process = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    running = RunningPlatform(state, env, process)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"hypermedia up exited: {(state / 'up.log').read_text()[-3000:]}")
        platform_file = state / "platform.json"
        if platform_file.exists():
            running.info = json.loads(platform_file.read_text())
            if "gateway" not in (services or "gateway"):
                return running
            try:
                if httpx.get(running.rest_url + "/readyz", timeout=2).status_code == 200:
                    return running
            except httpx.HTTPError:
                pass
        time.sleep(0.2)
    running.stop()
    raise RuntimeError("platform not ready within 120 s")


PLATFORM_MODE = os.environ.get("HM_TEST_PLATFORM", "local")
"""The shared platform's infrastructure: ``local`` (Postgres directly, the local object store) or
``deployed`` (through PgBouncer in transaction pooling and on S3 against a moto endpoint:
:mod:`tests.e2e.deployed`, ``make test-deployed``)."""


local_store_only = pytest.mark.skipif(
    PLATFORM_MODE == "deployed", reason="the local object store's behaviour; the deployed platform is on S3"
)
"""For a shared-platform test of what only the local object store does (``make test-deployed``
skips it; ``make test`` runs it)."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """With ``HM_TEST_PLATFORM=deployed`` only the e2e tests on the shared platform run: the others
    start platforms of their own, or none, which the setting does not change."""
    if PLATFORM_MODE != "deployed":
        return
    others = [
        item
        for item in items
        if "platform" not in getattr(item, "fixturenames", ()) or not item.path.is_relative_to(E2E)
    ]
    if others:
        config.hook.pytest_deselected(items=others)
        items[:] = [item for item in items if item not in others]


@pytest.fixture(scope="session")
def platform(tmp_root: Path, database_url: str, nats_url: str) -> Iterator[RunningPlatform]:
    """The platform most e2e modules share, every service of ``hypermedia up``; on the
    infrastructure :data:`PLATFORM_MODE` names."""
    if PLATFORM_MODE not in ("local", "deployed"):
        raise ValueError(f"HM_TEST_PLATFORM must be local or deployed, not {PLATFORM_MODE!r}")
    with contextlib.ExitStack() as stack:
        extra = {}
        if PLATFORM_MODE == "deployed":
            from tests.e2e.deployed import deployed_settings  # boto3 and moto only when asked

            extra = stack.enter_context(deployed_settings(tmp_root / "deployed", database_url))
        running = start_platform(tmp_root, database_url, nats_url, **extra)
        # The tests' own queries go to the server itself, as an operator's psql would: psycopg
        # prepares a statement it runs often, which a transaction pooler cannot keep.
        running.env["HM_DATABASE_URL"] = database_url
        try:
            yield running
        finally:
            code = running.stop()
            assert code == 0, f"hypermedia up exited with {code}"


@pytest.fixture
def account(platform: RunningPlatform) -> dict[str, Any]:
    """A fresh account with 1000 credits, created by `hypermedia admin create-account`."""
    return platform.admin("create-account", "--credits", "1000")


@pytest.fixture
def client(platform: RunningPlatform, account: dict[str, Any]) -> Iterator[httpx.Client]:
    with platform.client(account) as c:
        yield c


def wait_job(client: httpx.Client, job_id: str, timeout: float = 60.0) -> dict[str, Any]:
    """Poll GET /v1/jobs/{id} until the job ends; returns its JSON."""
    deadline = time.monotonic() + timeout
    while True:
        job = client.get(f"/v1/jobs/{job_id}").json()
        if job["status"] in ("completed", "failed", "cancelled"):
            return dict(job)
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id} still {job['status']} after {timeout}s")
        time.sleep(0.1)


def wait_for(what: str, fn: Callable[[], T | None], timeout: float, interval: float = 0.05) -> T:
    """Poll ``fn`` until it returns something truthy and return that; AssertionError naming
    ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        time.sleep(interval)


def upload(client: httpx.Client, path: Path, name: str | None = None) -> dict[str, Any]:
    response = client.post("/v1/objects", files={"file": (name or path.name, path.read_bytes())})
    assert response.status_code == 201, response.text
    return dict(response.json())


@contextlib.contextmanager
def own_database(database_url: str, tag: str) -> Iterator[str]:
    """A fresh database on the session's server (``hypermedia up`` migrates it), dropped afterwards:
    for a module whose platform must not share jobs with another platform's reaper."""
    name = f"hm_{tag}_{secrets.token_hex(4)}"
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    parts = urlsplit(database_url)
    try:
        yield urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))
    finally:
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.contextmanager
def isolated_platform(
    tmp: Path, database_url: str, nats_url: str, tag: str, services: str | None = None, **extra_env: str
) -> Iterator[RunningPlatform]:
    """``start_platform`` on a database of its own (:func:`own_database`); stopped at the end, which
    must exit 0."""
    with own_database(database_url, tag) as dsn:
        running = start_platform(tmp, dsn, nats_url, services, **extra_env)
        try:
            yield running
        finally:
            assert running.stop() == 0
