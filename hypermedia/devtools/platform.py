"""``hypermedia up``: every service as its own process on one machine, supervised.

On embedded defaults when ``HM_DATABASE_URL`` / ``HM_NATS_URL`` / S3 settings are absent: an embedded
Postgres cluster and a pinned nats-server under the state directory (``./.hypermedia/`` by default,
``HM_STATE_DIR``), and the local object store. Internal services get free ports, so two platforms
run side by side; the choices are written to ``{state}/platform.json`` so that ``hypermedia admin …``
run in the same directory talks to this platform.

Worker services (imageworker, docworker, ocrworker, mediaworker) run as worker units (ADR 0046):
each is its unit's control, ``python -m hypermedia.worker.unit ROLE`` with ``HM_UNIT_NAME`` its
process name, which launches the worker itself as its execution. They can run as several replicas
(``hypermedia up --scale imageworker=2``): replica ``i`` is named ``imageworker-i`` (the first keeps
the plain name). Every worker unit gets its own work directory (:func:`worker_work_dir`), status
port and range of sandbox uids. Internal gRPC is mutual TLS (``HM_INTERNAL_AUTH=mtls``, the default
here; ``none`` turns it off, for tests only): every start makes a new CA and one certificate per
service identity in ``{state}/tls/`` (:func:`hypermedia.infra.mtls.issue_all`, files 0600), and each
process gets its identity's files as ``HM_TLS_CA`` / ``HM_TLS_CERT`` / ``HM_TLS_KEY``; ``admin.pem``
is for ``hypermedia admin`` and grpcurl (ADR 0044). Each process's pid (a worker unit's: its
control's) is in ``{state}/run/{name}.pid`` while it runs (operators and the chaos test signal
processes by it).

The supervisor reconciles by exit code (:func:`reconcile`): a process that exited 78 (its
configuration) is not restarted; 75 (a unit's deployment lease held or lost) is restarted once the
lease has expired; any other exit is restarted with exponential backoff over its quick deaths (1 s
doubling to 30 s; a process that had run for ``STABLE_SECONDS`` counts as started, as supervisord's
``startsecs``, and is restarted after 1 s); a service that dies five times within a minute is
reported as crash-looping, once per loop. Once every worker unit is ready (or after a minute) one
plain summary line goes to stderr. Ctrl-C (SIGINT) or SIGTERM stops the workers, the reaper and
the scheduler at once, then the gateway, storage and credits one by one (each process gets 60 s
after SIGTERM; :meth:`Platform.stop`), then NATS and Postgres.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypermedia.core import config
from hypermedia.devtools.embedded import EmbeddedNats, EmbeddedPostgres, free_port, wait_for_port
from hypermedia.infra import db, mtls
from hypermedia.infra.service import EXIT_CONFIG, EXIT_LEASE
from hypermedia.sandbox import cgroups, layers

log = logging.getLogger(__name__)

SERVICES = (
    "credits",
    "storage",
    "gateway",
    "imageworker",
    "docworker",
    "ocrworker",
    "mediaworker",
    "bulkworker",
    "reaper",
)
"""Start order. :meth:`Platform.stop` stops everything after :data:`CORE_SERVICES` at once, then
those one at a time in reverse order."""
CORE_SERVICES = ("credits", "storage", "gateway")
"""The services the others call: stopped last, once every worker has drained."""
OPTIONAL_SERVICES = ("scheduler",)
"""Services run only when named (``--scheduler`` or ``--services``); after :data:`SERVICES` in
start order, so the scheduler stops (and drains its burst workers) first."""
DEFAULT_POOLS = [
    {
        "name": "images-local",
        "queues": ["images"],
        "provider": "local",
        "slots_per_worker": 4,
        "min_workers": 0,
        "max_workers": 3,
        "boot_seconds": 5,
        "drain_target_seconds": 60,
    }
]
"""The scheduler's pools under ``hypermedia up`` when ``HM_SCHEDULER_POOLS`` is not set: up to
three local image workers of four slots beside the standing ones (a local worker boots in about
5 s on this 2-core machine: Python, the sandbox zygote, the connections)."""
STOP_GRACE_SECONDS = 60.0
"""SIGTERM to SIGKILL per process: a worker unit's control gives its execution the drain (35 s)
and 10 s more before it kills what is left, then releases its lease."""
READY_SUMMARY_SECONDS = 60.0
"""The summary line comes once every worker unit is ready, or after this long with what is not."""
CRASH_LOOP_WINDOW_SECONDS = 60.0
CRASH_LOOP_RESTARTS = 5
STABLE_SECONDS = 5.0
"""A process that ran this long started fine: its next death restarts it after the shortest delay."""


UNIX_PATH_MAX = 108
"""``sizeof(sockaddr_un.sun_path)`` on Linux, the terminating NUL included (unix(7))."""


def state_dir() -> Path:
    return Path(os.environ.get("HM_STATE_DIR", ".hypermedia")).resolve()


def read_platform(path: Path | None = None) -> dict[str, Any]:
    """The ``platform.json`` of a running platform. Raises FileNotFoundError with a hint."""
    file = (path or state_dir()) / "platform.json"
    if not file.exists():
        hint = "run `hypermedia up` in this directory first, or set HM_STATE_DIR to the running one's"
        raise FileNotFoundError(f"no platform found at {file}: {hint}")
    return dict(json.loads(file.read_text()))


SCALABLE = frozenset({"imageworker", "docworker", "ocrworker", "mediaworker", "bulkworker"})
"""Services that may run as several replicas on one machine (no fixed port, own work directory)."""
UID_RANGE_PER_REPLICA = 64
"""Sandbox uids per worker process (``HM_WORKER_SLOTS`` is at most 64); every worker process of
every worker service gets a range of its own, so no two jobs of different workers share a uid."""
WORKER_ENV = {
    "docworker": {"HM_WORKER_QUEUE": "documents", "HM_WORKER_SLOTS": "2"},
    "ocrworker": {"HM_WORKER_QUEUE": "ocr", "HM_WORKER_SLOTS": "2"},
    "mediaworker": {"HM_WORKER_QUEUE": "media", "HM_WORKER_SLOTS": "1"},
}
"""Settings ``up`` gives every replica of a worker service, over the environment: its queue, and the
docworker's, ocrworker's and mediaworker's slots (the seed's documents profile runs 2–4 jobs at
once, its ocr profile 1–2, its media profile 1; ``HM_WORKER_SLOTS`` in the environment is meant for
the imageworker)."""

BULK_UNIT_QUEUES = "bulk.images=2"
"""The lanes of ``up``'s local bulk unit, ``bulkworker`` (``HM_UP_BULK_QUEUES`` overrides them,
e.g. ``bulk.images=2,bulk.documents=1``): it runs ``python -m hypermedia.worker.unit --queues=…``
so that bulk jobs (regeneration and backfill, ADR 0057) run on one machine. Only the image
engine's lane by default: each lane is a zygote of its own, and a documents lane starts
LibreOffice listeners."""
UNIT_ENV_REFUSED = ("HM_WORKER_QUEUE", "HM_WORKER_SLOTS")
"""Variables a unit of ``--queues`` refuses (it exits 78): not given to the bulk unit."""


def worker_work_dir(base: str, service: str, replica: int) -> str:
    """``HM_WORK_DIR`` of one worker process: ``base`` for the first imageworker, ``{base}-{i}`` for
    imageworker replica *i*, ``{base}-{service}`` and ``{base}-{service}-{i}`` for the other worker
    services. Never shared: a worker removes the job directories it does not run when it starts."""
    suffix = "" if service == "imageworker" else f"-{service}"
    return f"{base}{suffix}" if replica == 1 else f"{base}{suffix}-{replica}"


@dataclass
class ServiceProcess:
    """One supervised process: ``name`` (``imageworker-2``) runs ``python -m services.{module}``,
    or, for a worker service (``unit``), its unit's control ``python -m hypermedia.worker.unit
    {module}`` (ADR 0046)."""

    name: str
    module: str
    env: dict[str, str]
    log_path: Path
    pid_path: Path
    unit: bool = False
    unit_queues: str = ""
    """For a unit of several lanes (the bulk unit): its ``--queues`` spec; empty, a unit of ``module``'s role."""
    process: subprocess.Popen[bytes] | None = None
    restarts: list[float] = field(default_factory=list)
    quick_deaths: int = 0
    started_at: float = 0.0
    next_start: float = 0.0
    crash_loop_said: bool = False
    """Whether the current crash loop was reported (once per loop; a stable run ends the loop)."""
    given_up: bool = False
    """Not restarted any more: it exited for its configuration (78)."""

    def command(self) -> list[str]:
        if self.unit and self.unit_queues:
            return [sys.executable, "-m", "hypermedia.worker.unit", f"--queues={self.unit_queues}"]
        if self.unit:
            return [sys.executable, "-m", "hypermedia.worker.unit", self.module]
        return [sys.executable, "-m", f"services.{self.module}"]

    def start(self) -> None:
        with self.log_path.open("ab") as log_file:
            self.process = subprocess.Popen(
                self.command(),
                env=self.env,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                cwd=Path(__file__).resolve().parents[2],  # the checkout (hypermedia/devtools/platform.py)
                start_new_session=True,
            )
        self.started_at = time.monotonic()
        self.pid_path.write_text(f"{self.process.pid}\n")

    def backoff(self) -> float:
        """Seconds to wait before restarting the process that just died (and record the death)."""
        now = time.monotonic()
        self.restarts = [t for t in self.restarts if now - t < CRASH_LOOP_WINDOW_SECONDS] + [now]
        self.quick_deaths = 0 if now - self.started_at >= STABLE_SECONDS else self.quick_deaths + 1
        if self.quick_deaths == 0 and len(self.restarts) < CRASH_LOOP_RESTARTS:
            self.crash_loop_said = False
        return float(min(30, 2 ** max(0, self.quick_deaths - 1)))


def reconcile(proc: ServiceProcess, code: int, lease_seconds: float) -> tuple[float | None, int, str]:
    """What ``hypermedia up`` does about ``proc``, which exited with ``code``: ``(delay before the
    restart or None for never, log level, message)``. By the exit codes of
    :mod:`hypermedia.infra.service`: 78 (configuration) is never restarted, as restarting cannot
    fix it; 75 (a worker unit's deployment lease held or lost) waits out ``lease_seconds`` so the
    old lease has expired; the others back off (:meth:`ServiceProcess.backoff`). A crash loop is
    an ERROR once, when it begins; later deaths of the same loop are WARNINGs."""
    delay = proc.backoff()
    if code == EXIT_CONFIG:
        proc.given_up = True
        return (
            None,
            logging.ERROR,
            f"service {proc.name} exited with code 78 (configuration; see {proc.log_path}): not restarted. "
            "Fix the configuration and start hypermedia up again",
        )
    why = ""
    if code == EXIT_LEASE:
        delay = max(delay, lease_seconds + 1)
        why = " (its deployment lease is held or was lost: waiting until it expires)"
    if len(proc.restarts) >= CRASH_LOOP_RESTARTS and not proc.crash_loop_said:
        proc.crash_loop_said = True
        return (
            delay,
            logging.ERROR,
            f"service {proc.name} exited with code {code}; restarting in {delay:.0f}s{why} (crash-looping: "
            f"{len(proc.restarts)} exits within {CRASH_LOOP_WINDOW_SECONDS:.0f}s; restarts back off up to 30s)",
        )
    return (
        delay,
        logging.WARNING,
        f"service {proc.name} exited with code {code}; restarting in {delay:.0f}s{why}",
    )


def log_tail(path: Path, lines: int = 5, max_bytes: int = 4096) -> str:
    """The last ``lines`` lines of a service's log (read from its last ``max_bytes`` bytes),
    indented; ``(no log)`` when there is none. Quoted when a service exits at start, so that the
    cause reaches whoever ran ``hypermedia up`` (a CI log keeps no state directory)."""
    try:
        with path.open("rb") as log_file:
            log_file.seek(0, os.SEEK_END)
            log_file.seek(max(0, log_file.tell() - max_bytes))
            text = log_file.read().decode(errors="replace")
    except OSError:
        return "  (no log)"
    return "\n".join(f"  {line}" for line in text.splitlines()[-lines:]) or "  (empty log)"


class Platform:
    """Starts the infrastructure and the services; :meth:`supervise` keeps them running.

    Args:
        root: state directory. services: which services to run (default all).
        env: base environment (default ``os.environ``).
        scale: replicas per service, for services in :data:`SCALABLE` (default 1 each).

    Raises:
        ValueError: a service in ``scale`` cannot be scaled or a count is below 1.
    """

    def __init__(
        self,
        root: Path,
        services: tuple[str, ...] = SERVICES,
        env: dict[str, str] | None = None,
        scale: dict[str, int] | None = None,
    ) -> None:
        self.root = root
        order = SERVICES + OPTIONAL_SERVICES
        self.services = tuple(
            sorted(services, key=lambda name: order.index(name) if name in order else len(order))
        )
        self.scale = dict(scale or {})
        for name, count in self.scale.items():
            if name not in SCALABLE:
                raise ValueError(f"{name} cannot be scaled; only {', '.join(sorted(SCALABLE))}")
            if not 1 <= count <= 16:
                raise ValueError(f"replicas of {name} must be 1..16, not {count}")
        self.base_env = dict(os.environ if env is None else env)
        self.nats: EmbeddedNats | None = None
        self.postgres: EmbeddedPostgres | None = None
        self.procs: list[ServiceProcess] = []
        self.info: dict[str, Any] = {}
        self.stop_requested = False
        """Set by a signal handler; a plain flag because handlers must not take locks."""
        self.lease_seconds = 15.0
        """The worker units' ``HM_UNIT_LEASE_SECONDS``: how long a unit that exited 75 waits."""

    def _infrastructure(self) -> tuple[str, str]:
        database_url = config.lookup(self.base_env, "HM_DATABASE_URL", "")
        if not database_url:
            self.postgres = EmbeddedPostgres(self.root / "pg").start()
            self.postgres.ensure_database("hypermedia")
            database_url = self.postgres.dsn("hypermedia")
        nats_url = config.lookup(self.base_env, "HM_NATS_URL", "")
        if not nats_url:
            self.nats = EmbeddedNats(self.root / "nats").start()
            nats_url = self.nats.url
        return database_url, nats_url

    def _state_secret(self, variable: str, file_name: str) -> str:
        """``variable`` from the environment, or else the secret in ``{state}/{file_name}``,
        generated once (64 hex digits, mode 0600) so that it survives restarts."""
        if self.base_env.get(variable):
            return self.base_env[variable]
        key_file = self.root / file_name
        if not key_file.exists():
            key_file.write_text(secrets.token_hex(32))
            key_file.chmod(0o600)
        return key_file.read_text().strip()

    def _handoff_socket(self) -> str:
        """Where storage hands originals to the workers (ADR 0045): ``run/storage.sock`` in the
        state dir, or "" (HTTP only) when that path is longer than a Unix socket's
        ``sun_path`` holds (108 bytes, unix(7))."""
        path = str((self.root / "run" / "storage.sock").resolve())
        if len(path.encode()) >= UNIX_PATH_MAX:
            log.info("storage hand-off off: %s is too long for a Unix socket", path)
            return ""
        return path

    def start(self) -> dict[str, Any]:
        """Start infrastructure, migrate, start every service; returns the platform description."""
        for old, new in config.deprecated_in_use(self.base_env):
            log.warning("%s is deprecated and will stop being read in the next release: set %s", old, new)
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "logs").mkdir(exist_ok=True)
        database_url, nats_url = self._infrastructure()
        session_url = config.lookup(self.base_env, "HM_DATABASE_SESSION_URL", "") or database_url
        applied = db.migrate(session_url)
        log.info("migrations applied: %d", applied)
        env = dict(self.base_env)
        tls = self._internal_auth(env)
        # One machine, everything on 127.0.0.1: a developer's webhook receiver is local too.
        env.setdefault("HM_WEBHOOK_ALLOW_PRIVATE", "true")
        # One machine, a developer's: workers start with whatever isolation holds here, and say
        # so (docs/adr/0043); a value in the environment (full included) is kept.
        env.setdefault("HM_SANDBOX_REQUIRE", layers.REQUIRE_BEST_EFFORT)
        http_port = int(config.lookup(env, "HM_GATEWAY_HTTP_PORT", "8080"))
        grpc_port = int(config.lookup(env, "HM_GATEWAY_GRPC_PORT", "50051"))
        credits_port, storage_port, storage_http_port = free_port(), free_port(), free_port()
        work_dir = env.get("HM_WORK_DIR", str(self.root / "work"))
        uid_base = int(env.get("HM_SANDBOX_UID_BASE", "61000"))
        if "HM_SANDBOX_CGROUP" in env:
            log.info("per-job cgroups: HM_SANDBOX_CGROUP=%s as set", env["HM_SANDBOX_CGROUP"])
        else:
            env["HM_SANDBOX_CGROUP"], said = cgroups.platform_setting()
            log.info("%s", said)
        # A unit's control makes its execution's group where the jobs' groups would go (ADR 0046).
        env.setdefault("HM_UNIT_CGROUP", env["HM_SANDBOX_CGROUP"])
        self.lease_seconds = float(env.get("HM_UNIT_LEASE_SECONDS", "15"))
        replicas = [
            (name, i, name if i == 1 else f"{name}-{i}")
            for name in self.services
            for i in range(1, self.scale.get(name, 1) + 1)
        ]
        workers = [(name, i, proc_name) for name, i, proc_name in replicas if name in SCALABLE]
        if workers:
            print(layers.summary_line(env["HM_SANDBOX_REQUIRE"], uid_base), file=sys.stderr, flush=True)
        worker_env = {
            proc_name: {
                "HM_WORK_DIR": worker_work_dir(work_dir, name, i),
                "HM_WORKER_STATUS_BIND": f"127.0.0.1:{free_port()}",
                "HM_SANDBOX_UID_BASE": str(uid_base + UID_RANGE_PER_REPLICA * k),
                "HM_UNIT_NAME": proc_name,
                **WORKER_ENV.get(name, {}),
            }
            for k, (name, i, proc_name) in enumerate(workers)
        }
        env.update(
            {
                "HM_DATABASE_URL": database_url,
                "HM_NATS_URL": nats_url,
                "HM_GATEWAY_HTTP_PORT": str(http_port),
                "HM_GATEWAY_GRPC_PORT": str(grpc_port),
                "HM_CREDITS_BIND": f"127.0.0.1:{credits_port}",
                "HM_CREDITS_ADDR": f"127.0.0.1:{credits_port}",
                "HM_STORAGE_BIND": f"127.0.0.1:{storage_port}",
                "HM_STORAGE_ADDR": f"127.0.0.1:{storage_port}",
                "HM_STORAGE_HTTP_PORT": str(storage_http_port),
                "HM_STORAGE_SIGNING_KEY": self._state_secret("HM_STORAGE_SIGNING_KEY", "signing.key"),
                "HM_GATEWAY_SECRET_KEY": self._state_secret("HM_GATEWAY_SECRET_KEY", "gateway.key"),
                "HM_STORAGE_DIR": env.get("HM_STORAGE_DIR", str(self.root / "objects")),
                "HM_STORAGE_HANDOFF_SOCKET": env.get("HM_STORAGE_HANDOFF_SOCKET", self._handoff_socket()),
                "HM_REAPER_WORK_DIRS": os.pathsep.join(w["HM_WORK_DIR"] for w in worker_env.values()),
                "PYTHONUNBUFFERED": "1",
            }
        )
        # Each process its own metrics port (a value in the environment would be one for all).
        metrics_binds = {proc_name: f"127.0.0.1:{free_port()}" for _name, _i, proc_name in replicas}
        scheduler_env = (
            self._scheduler_env(env, tls, uid_base + UID_RANGE_PER_REPLICA * len(workers))
            if "scheduler" in self.services
            else {}
        )
        self.info = {
            "database_url": session_url,
            "nats_url": nats_url,
            "stream_prefix": env.get("HM_STREAM_PREFIX", "HM"),
            "rest_url": f"http://127.0.0.1:{http_port}",
            "grpc_addr": f"127.0.0.1:{grpc_port}",
            "credits_addr": env["HM_CREDITS_ADDR"],
            "storage_addr": env["HM_STORAGE_ADDR"],
            "storage_http": f"http://127.0.0.1:{storage_http_port}",
            "imageworker_status_addr": worker_env.get("imageworker", {}).get("HM_WORKER_STATUS_BIND", ""),
            "workers": {name: w["HM_WORKER_STATUS_BIND"] for name, w in worker_env.items()},
            "metrics": {name: f"http://{bind}/metrics" for name, bind in metrics_binds.items()},
            "run_dir": str(self.root / "run"),
            "objects_dir": env["HM_STORAGE_DIR"],
            "logs_dir": str(self.root / "logs"),
            "pid": os.getpid(),
            "internal_auth": "mtls" if tls else "none",
            "tls": tls.get("admin", {}),
        }
        platform_file = self.root / "platform.json"
        platform_file.write_text(json.dumps(self.info, indent=2))
        platform_file.chmod(0o600)
        (self.root / "run").mkdir(exist_ok=True)
        bulk_queues = config.lookup(env, "HM_UP_BULK_QUEUES") or BULK_UNIT_QUEUES
        for name, _i, proc_name in replicas:
            proc_env = (
                env
                | worker_env.get(proc_name, {})
                | tls.get(name, {})
                | (scheduler_env if name == "scheduler" else {})
                | {"HM_METRICS_BIND": metrics_binds[proc_name]}
            )
            if name == "bulkworker":
                proc_env = {k: v for k, v in proc_env.items() if k not in UNIT_ENV_REFUSED}
            proc = ServiceProcess(
                proc_name,
                name,
                proc_env,
                self.root / "logs" / f"{proc_name}.log",
                self.root / "run" / f"{proc_name}.pid",
                unit=proc_name in worker_env,
                unit_queues=bulk_queues if name == "bulkworker" else "",
            )
            proc.start()
            self.procs.append(proc)
        # All start at once: channels connect when first used; /readyz waits for credits and storage.
        for proc in self.procs:
            if proc.name in ("credits", "storage"):
                self._wait_port(proc, credits_port if proc.name == "credits" else storage_port)
        if "gateway" in self.services:
            gateway = next(p for p in self.procs if p.name == "gateway")
            self._wait_port(gateway, http_port, timeout=60)
        return self.info

    def _scheduler_env(
        self, env: dict[str, str], tls: dict[str, dict[str, str]], uid_base: int
    ) -> dict[str, str]:
        """The scheduler's settings under ``up``: its pools (:data:`DEFAULT_POOLS` unless
        ``HM_SCHEDULER_POOLS`` is set), the local provider's directory in the state directory,
        logs beside the others, sandbox uids after every worker replica's, the certificates of
        each role for mutual TLS, and its burst workers stopped with the platform."""
        return {
            "HM_SCHEDULER_POOLS": env.get("HM_SCHEDULER_POOLS", json.dumps(DEFAULT_POOLS)),
            "HM_SCHEDULER_LOCAL_DIR": str(self.root / "scheduler"),
            "HM_SCHEDULER_LOCAL_LOG_DIR": str(self.root / "logs"),
            "HM_SCHEDULER_LOCAL_UID_BASE": env.get("HM_SCHEDULER_LOCAL_UID_BASE", str(uid_base)),
            "HM_SCHEDULER_LOCAL_TLS_DIR": str(self.root / "tls") if tls else "",
            "HM_SCHEDULER_LOCAL_STOP_ON_EXIT": "true",
        }

    def _internal_auth(self, env: dict[str, str]) -> dict[str, dict[str, str]]:
        """The ``HM_TLS_*`` files of every identity (:func:`mtls.issue_all`, a new CA in
        ``{state}/tls``), and ``HM_INTERNAL_AUTH=mtls`` in ``env``; ``{}`` when the environment says
        ``HM_INTERNAL_AUTH=none``. Logs which, in one line."""
        mode = env.get("HM_INTERNAL_AUTH", "mtls").strip().lower()
        if mode == "none":
            log.warning("internal gRPC: no service authentication (HM_INTERNAL_AUTH=none; tests only)")
            return {}
        if mode != "mtls":
            raise ValueError(f"HM_INTERNAL_AUTH must be mtls or none, not {mode!r}")
        env["HM_INTERNAL_AUTH"] = "mtls"
        tls_dir = self.root / "tls"
        files = mtls.issue_all(tls_dir)
        log.info(
            "internal gRPC: mutual TLS, a new CA and one certificate per service in %s "
            "(valid %d days; HM_INTERNAL_AUTH=none turns it off)",
            tls_dir,
            mtls.CERT_VALIDITY.days,
        )
        return files

    def _wait_port(self, proc: ServiceProcess, port: int, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.process is not None and proc.process.poll() is not None:
                raise RuntimeError(
                    f"service {proc.name} exited with code {proc.process.returncode} at start; see "
                    f"{proc.log_path}, which ends:\n{log_tail(proc.log_path)}"
                )
            try:
                wait_for_port("127.0.0.1", port, timeout=0.5)
                return
            except TimeoutError:
                continue
        raise RuntimeError(
            f"service {proc.name} did not listen on port {port} within {timeout}s; see {proc.log_path}"
        )

    def supervise_once(self) -> list[str]:
        """Restart services that died (after their backoff). Returns the names restarted now."""
        restarted = []
        now = time.monotonic()
        for proc in self.procs:
            if proc.process is None or proc.process.poll() is None:
                continue
            if proc.given_up:
                continue
            if proc.next_start == 0.0:
                delay, level, message = reconcile(proc, proc.process.returncode, self.lease_seconds)
                log.log(level, "%s", message)
                if delay is None:
                    print(f"hypermedia up: {message}", file=sys.stderr, flush=True)
                    continue
                proc.next_start = now + delay
            elif now >= proc.next_start:
                proc.next_start = 0.0
                proc.start()
                restarted.append(proc.name)
        return restarted

    def supervise(self) -> None:
        """Supervise until :attr:`stop_requested` is set (by a signal handler or a caller); print
        :meth:`summary` once, when every worker unit is ready or a minute has passed."""
        summary_due = time.monotonic() + READY_SUMMARY_SECONDS
        while not self.stop_requested:
            time.sleep(0.2)
            self.supervise_once()
            if summary_due and (
                self.workers_ready() == self.worker_names() or time.monotonic() > summary_due
            ):
                print(self.summary(), file=sys.stderr, flush=True)
                summary_due = 0.0

    def worker_names(self) -> set[str]:
        return {p.name for p in self.procs if p.unit}

    def workers_ready(self) -> set[str]:
        """Worker units whose execution serves its status: it does so only once control's peer
        evidence matched (:mod:`hypermedia.worker.serve`)."""
        ready = set()
        for name, addr in self.info.get("workers", {}).items():
            host, _, port = addr.rpartition(":")
            with contextlib.suppress(OSError):
                socket.create_connection((host, int(port)), timeout=0.2).close()
                ready.add(name)
        return ready

    def summary(self) -> str:
        """The one plain line about the platform: where to call it, which worker units are ready
        and which not (the exit code of the last that exited), logs, metrics, how to make an account."""
        ready = self.workers_ready()
        late = []
        for proc in self.procs:
            if proc.unit and proc.name not in ready:
                code = proc.process.returncode if proc.process is not None else None
                late.append(f"{proc.name} ({'exited ' + str(code) if code is not None else 'starting'})")
        workers = f"{len(ready)} worker units ready" + (f"; not ready: {', '.join(late)}" if late else "")
        where = (
            f"REST {self.info.get('rest_url')}, gRPC {self.info.get('grpc_addr')}"
            if "gateway" in self.services
            else "no gateway"
        )
        account = "an account: hypermedia admin create-account --credits 100"
        return f"hypermedia up: ready: {where}; {workers}; logs in {self.root / 'logs'}; metrics URLs in {self.root / 'platform.json'}; {account}"

    def stop(self) -> None:
        """Stop the worker units, the reaper and the scheduler at once, then gateway, storage and
        credits one at a time (they answer while the workers drain): each process SIGTERM, then
        SIGKILL after :data:`STOP_GRACE_SECONDS`. Then NATS and Postgres."""
        self.stop_requested = True
        core = [[proc] for proc in reversed(self.procs) if proc.module in CORE_SERVICES]
        for stage in [[proc for proc in self.procs if proc.module not in CORE_SERVICES], *core]:
            running = [(p, q) for p in stage if (q := p.process) is not None and q.poll() is None]
            for _proc, process in running:
                process.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + STOP_GRACE_SECONDS
            for proc, process in running:
                try:
                    process.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    log.error("service %s did not stop in %.0fs; killing it", proc.name, STOP_GRACE_SECONDS)
                    process.kill()
                    process.wait()
                proc.pid_path.unlink(missing_ok=True)
        if self.nats is not None:
            self.nats.stop()
        if self.postgres is not None:
            self.postgres.stop()
        (self.root / "platform.json").unlink(missing_ok=True)
