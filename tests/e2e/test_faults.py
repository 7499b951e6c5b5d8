"""Job lifecycle guarantees under faults, end to end on real processes: a running job cancelled, a
worker stopped with SIGTERM while it works, a storage service the worker cannot reach.

The platform here runs without an imageworker (each test starts the workers it needs, with the
environment the fault needs) on a database of its own: these tests change a processing profile
and depend on exactly which worker runs which job, and the reaper of another platform on a shared
database would republish their jobs to its own workers.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import grpc
import httpx
import psycopg
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from hypermedia.api.worker.v1 import worker_pb2, worker_pb2_grpc
from hypermedia.devtools.embedded import free_port
from tests.e2e.conftest import REPO, RunningPlatform, own_database, start_platform, upload, wait_for, wait_job
from tests.e2e.slowjob import make_slow_png

EXIF = Path(__file__).resolve().parents[1] / "data" / "exif-orientation"
QUICK = EXIF / "Landscape_1.jpg"
TERMINAL = ("completed", "failed", "cancelled")


# -- fixtures ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def faults_database_url(database_url: str) -> Iterator[str]:
    """A database of this module's own on the session's server (`hypermedia up` migrates it)."""
    with own_database(database_url, "faults") as dsn:
        yield dsn


@pytest.fixture(scope="module")
def idle_platform(tmp_root: Path, faults_database_url: str, nats_url: str) -> Iterator[RunningPlatform]:
    """Everything but the imageworker; the reaper runs every second."""
    running = start_platform(
        tmp_root, faults_database_url, nats_url, services="credits,storage,gateway,reaper"
    )
    try:
        yield running
    finally:
        assert running.stop() == 0


@pytest.fixture(scope="module")
def slow_png(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_slow_png(tmp_path_factory.mktemp("slowjob") / "perlin.png")


@pytest.fixture
def pg(idle_platform: RunningPlatform) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(idle_platform.env["HM_DATABASE_URL"], autocommit=True) as conn:
        yield conn
        # A test that failed half-way must not leave work for the next test's worker.
        conn.execute(
            "UPDATE processing_jobs SET status = 'cancelled', completed_at = now() "
            "WHERE status NOT IN ('completed', 'failed', 'cancelled')"
        )


@pytest.fixture
def client(idle_platform: RunningPlatform) -> Iterator[httpx.Client]:
    """A client of a fresh account with 100 credits."""
    account = idle_platform.admin("create-account", "--credits", "100")
    with idle_platform.client(account) as c:
        yield c


# -- helpers ----------------------------------------------------------------------------------------


@dataclass
class Worker:
    """An imageworker process started by a test, with its own work dir and status port."""

    proc: subprocess.Popen[bytes]
    work_dir: Path
    status_addr: str
    worker_id: str
    credentials: grpc.ChannelCredentials
    """The admin identity's internal-gRPC credentials, to read its status (ADR 0044)."""

    def job_dirs(self) -> list[str]:
        jobs = self.work_dir / "jobs"
        return sorted(p.name for p in jobs.iterdir()) if jobs.is_dir() else []

    def stop(self, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def _start_worker(platform: RunningPlatform, name: str, **env: str) -> Worker:
    """Start an imageworker with one slot (``env`` on top) and wait until it has registered."""
    work_dir = platform.state_dir / f"work-{name}"
    status_addr = f"127.0.0.1:{free_port()}"
    full_env = platform.service_env() | {
        "HM_WORKER_SLOTS": "1",
        "HM_WORK_DIR": str(work_dir),
        "HM_WORKER_STATUS_BIND": status_addr,
        **env,
    }
    with (platform.state_dir / "logs" / f"worker-{name}.log").open("ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "services.imageworker"], env=full_env, cwd=REPO, stdout=log, stderr=log
        )
    deadline = time.monotonic() + 60
    with psycopg.connect(platform.env["HM_DATABASE_URL"], autocommit=True) as conn:
        while True:
            row = conn.execute(
                "SELECT worker_id FROM workers WHERE pid = %s AND status = 'running' AND queue NOT LIKE 'sched.%%'",
                (proc.pid,),
            ).fetchone()
            if row:
                return Worker(proc, work_dir, status_addr, row[0], platform.tls().channel_credentials())
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise AssertionError(f"worker {name} did not register (exit {proc.poll()})")
            time.sleep(0.05)


@pytest.fixture
def workers(idle_platform: RunningPlatform) -> Iterator[Callable[..., Worker]]:
    """``workers(name, **env)`` starts a worker; every worker started is stopped at the end."""
    started: list[Worker] = []

    def start(name: str, **env: str) -> Worker:
        worker = _start_worker(idle_platform, name, **env)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()


def _process(client: httpx.Client, object_id: str, operation: str) -> str:
    response = client.post("/v1/hypermedia/process", json={"object_id": object_id, "operations": [operation]})
    assert response.status_code == 202, response.text
    return str(response.json()["job_ids"][0])


def _wait_until_running(pg: psycopg.Connection[Any], client: httpx.Client, job_id: str) -> None:
    """Until GET shows the job ``processing`` and the worker has downloaded the input, i.e. the
    sandbox is starting or running the pipeline."""
    wait_for("job processing", lambda: client.get(f"/v1/jobs/{job_id}").json()["status"] == "processing", 60)
    wait_for(
        "input downloaded",
        lambda: pg.execute(
            "SELECT 1 FROM job_events WHERE job_id = %s AND kind = 'progress' AND detail->>'stage' = 'downloaded'",
            (job_id,),
        ).fetchone(),
        60,
    )


def _ledger(pg: psycopg.Connection[Any], job_id: str) -> list[str]:
    """The kinds of the job's ``base`` ledger entries, oldest first: one a hold, commit or
    release (a commit's other lines, such as ``megapixels``, left out)."""
    rows = pg.execute(
        "SELECT kind FROM credit_ledger WHERE job_id = %s AND line = 'base' ORDER BY entry_id", (job_id,)
    ).fetchall()
    return [r[0] for r in rows]


def _status_events(pg: psycopg.Connection[Any], job_id: str) -> list[str]:
    rows = pg.execute(
        "SELECT status FROM job_events WHERE job_id = %s AND kind = 'status' ORDER BY event_id", (job_id,)
    ).fetchall()
    return [r[0] for r in rows]


def _attempts(pg: psycopg.Connection[Any], job_id: str) -> list[dict[str, Any]]:
    cur = pg.execute(
        "SELECT attempt_number, worker_id, status, error_code, started_at, finished_at FROM job_attempts "
        "WHERE job_id = %s ORDER BY attempt_number",
        (job_id,),
    )
    names = [d.name for d in cur.description or ()]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def _health(worker: Worker) -> int:
    with grpc.secure_channel(worker.status_addr, worker.credentials) as chan:
        return int(
            health_pb2_grpc.HealthStub(chan)
            .Check(health_pb2.HealthCheckRequest(service=""), timeout=2)
            .status
        )


def _worker_status(worker: Worker) -> worker_pb2.GetStatusResponse:
    with grpc.secure_channel(worker.status_addr, worker.credentials) as chan:
        return worker_pb2_grpc.WorkerServiceStub(chan).GetStatus(worker_pb2.GetStatusRequest(), timeout=2)


def _proc_state(pid: int) -> str:
    # /proc/<pid>/stat: "pid (comm) state …"; comm may contain spaces, so split after the last ')'.
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


# -- cancellation -----------------------------------------------------------------------------------


def test_cancel_of_a_processing_job_kills_it_and_costs_nothing(
    client: httpx.Client,
    pg: psycopg.Connection[Any],
    workers: Callable[..., Worker],
    slow_png: Path,
) -> None:
    before = client.get("/v1/credits").json()
    obj = upload(client, slow_png)
    worker = workers("cancel")
    job_id = _process(client, obj["object_id"], "compress")
    _wait_until_running(pg, client, job_id)
    assert client.get("/v1/credits").json()["held"] > 0

    started = time.monotonic()
    response = client.post(f"/v1/jobs/{job_id}:cancel")
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "cancel_requested"
    job = wait_job(client, job_id, timeout=30)
    elapsed = time.monotonic() - started

    assert job["status"] == "cancelled"
    assert elapsed < 5, f"cancelled {elapsed:.1f}s after the request"
    assert job["attempt_count"] == 1 and job["outputs"] == [] and job["actual_credits"] is None
    [attempt] = job["attempts"]
    assert (attempt["status"], attempt["error_code"], attempt["worker_id"]) == (
        "cancelled",
        "CANCELLED",
        worker.worker_id,
    )
    # Released right after the job is marked cancelled, and the job dir removed after that.
    wait_for("hold released", lambda: client.get("/v1/credits").json()["held"] == 0, 5)
    assert client.get("/v1/credits").json() == before
    assert _ledger(pg, job_id) == ["hold", "release"]
    wait_for("job dir removed", lambda: worker.job_dirs() == [], 5)
    assert _status_events(pg, job_id) == ["queued", "claimed", "processing", "cancel_requested", "cancelled"]
    assert pg.execute(
        "SELECT count(*) FROM objects WHERE source_object_id = %s", (obj["object_id"],)
    ).fetchone() == (0,), "no output object registered"
    assert worker.stop() == 0


# -- SIGTERM: drain, hand back ----------------------------------------------------------------------


def test_sigterm_hands_a_long_job_back_after_the_drain_and_another_worker_finishes_it(
    client: httpx.Client,
    pg: psycopg.Connection[Any],
    workers: Callable[..., Worker],
    slow_png: Path,
) -> None:
    drain = 3.0
    obj = upload(client, slow_png)
    worker = workers("drain", HM_DRAIN_SECONDS=str(drain))
    assert _health(worker) == health_pb2.HealthCheckResponse.SERVING
    job_id = _process(client, obj["object_id"], "compress")
    held = wait_for("hold", lambda: client.get("/v1/credits").json()["held"], 5)
    _wait_until_running(pg, client, job_id)

    signalled = time.monotonic()
    worker.proc.send_signal(signal.SIGTERM)
    wait_for(
        "health NOT_SERVING",
        lambda: _health(worker) == health_pb2.HealthCheckResponse.NOT_SERVING,
        2,
    )
    status = wait_for("status draining", lambda: (s := _worker_status(worker)).reason == "draining" and s, 2)
    assert not status.admission_open and status.slots_busy == 1
    assert client.get(f"/v1/jobs/{job_id}").json()["status"] == "processing", "still running while draining"
    code = worker.proc.wait(drain + 10)
    exited = time.monotonic() - signalled

    assert code == 0
    assert drain <= exited < drain + 10, f"exited {exited:.1f}s after SIGTERM"
    job = client.get(f"/v1/jobs/{job_id}").json()
    assert (job["status"], job["attempt_count"], job["error_code"], job["outputs"]) == ("queued", 1, None, [])
    [attempt] = job["attempts"]
    assert (attempt["status"], attempt["error_code"], attempt["worker_id"]) == (
        "lost",
        "WORKER_LOST",
        worker.worker_id,
    )
    assert worker.job_dirs() == []
    assert pg.execute("SELECT status FROM workers WHERE worker_id = %s", (worker.worker_id,)).fetchone() == (
        "stopped",
    )
    assert client.get("/v1/credits").json()["held"] == held, "a handed-back job keeps its hold"

    other = workers("drain-after")
    job = wait_job(client, job_id, timeout=180)

    assert (job["status"], job["attempt_count"]) == ("completed", 2)
    [output] = job["outputs"]
    assert output["mime_type"] == "image/png"
    assert output["metadata"]["width"] == output["metadata"]["height"] == 5000
    assert [(a["status"], a["worker_id"]) for a in job["attempts"]] == [
        ("lost", worker.worker_id),
        ("completed", other.worker_id),
    ]
    wait_for("charged", lambda: client.get("/v1/credits").json()["held"] == 0, 5)
    assert client.get("/v1/credits").json()["balance"] == pytest.approx(100 - job["actual_credits"])
    assert _ledger(pg, job_id) == ["hold", "commit"]
    assert _status_events(pg, job_id) == [
        "queued",
        "claimed",
        "processing",
        "queued",
        "claimed",
        "processing",
        "completed",
    ]


def test_sigterm_lets_a_quick_running_job_finish(
    client: httpx.Client,
    pg: psycopg.Connection[Any],
    workers: Callable[..., Worker],
) -> None:
    obj = upload(client, QUICK)
    worker = workers("quick", HM_DRAIN_SECONDS="10")
    job_id = _process(client, obj["object_id"], "thumbnail")

    # SIGTERM while the job runs: stop the worker (SIGSTOP) once Postgres shows the job processing,
    # so it cannot finish the job before the SIGTERM is pending; SIGCONT then delivers it.
    wait_for(
        "job processing",
        lambda: pg.execute(
            "SELECT status = 'processing' FROM processing_jobs WHERE job_id = %s", (job_id,)
        ).fetchone()[0],
        30,
        interval=0.002,
    )
    worker.proc.send_signal(signal.SIGSTOP)
    try:
        wait_for("worker stopped", lambda: _proc_state(worker.proc.pid) == "T", 5, interval=0.001)
        [(status, signalled_at)] = pg.execute(
            "SELECT status, now() FROM processing_jobs WHERE job_id = %s", (job_id,)
        ).fetchall()
        worker.proc.send_signal(signal.SIGTERM)
    finally:
        worker.proc.send_signal(signal.SIGCONT)
    assert status == "processing", "the job was running at SIGTERM"
    assert worker.proc.wait(30) == 0
    job = client.get(f"/v1/jobs/{job_id}").json()

    assert (job["status"], job["attempt_count"], len(job["outputs"])) == ("completed", 1, 1)
    assert [(a["status"], a["worker_id"]) for a in job["attempts"]] == [("completed", worker.worker_id)]
    assert datetime.fromisoformat(job["completed_at"]) > signalled_at
    assert _ledger(pg, job_id) == ["hold", "commit"]
    assert worker.job_dirs() == []


# -- transient errors: backoff, then failed -------------------------------------------------------


def test_storage_unreachable_is_retried_with_backoff_then_failed_and_released(
    client: httpx.Client,
    pg: psycopg.Connection[Any],
    workers: Callable[..., Worker],
) -> None:
    base = 2
    pg.execute(
        "UPDATE processing_profiles SET backoff_base_seconds = %s WHERE operation = 'thumbnail'", (base,)
    )
    # Every storage call of this worker fails UNAVAILABLE: the port is bound (so nothing else can
    # take it) but nobody listens on it, so each connection is refused.
    closed = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    closed.bind(("127.0.0.1", 0))
    try:
        before = client.get("/v1/credits").json()
        obj = upload(client, QUICK)
        broken = workers("no-storage", HM_STORAGE_ADDR=f"127.0.0.1:{closed.getsockname()[1]}")
        job_id = _process(client, obj["object_id"], "thumbnail")
        retry_at: dict[int, datetime] = {}
        deadline = time.monotonic() + 60
        while True:
            status, attempt_count, next_attempt_at = pg.execute(
                "SELECT status, attempt_count, next_attempt_at FROM processing_jobs WHERE job_id = %s",
                (job_id,),
            ).fetchone()
            if status == "retry_wait":
                retry_at[attempt_count] = next_attempt_at
            if status in TERMINAL:
                break
            assert time.monotonic() < deadline, f"still {status} after 60 s"
            time.sleep(0.05)
        job = client.get(f"/v1/jobs/{job_id}").json()
    finally:
        closed.close()
        pg.execute("UPDATE processing_profiles SET backoff_base_seconds = 60 WHERE operation = 'thumbnail'")

    assert (job["status"], job["error_code"], job["attempt_count"]) == ("failed", "TRANSIENT", 3)
    assert job["outputs"] == [] and job["actual_credits"] is None
    attempts = _attempts(pg, job_id)
    assert [(a["status"], a["error_code"], a["worker_id"]) for a in attempts] == [
        ("failed", "TRANSIENT", broken.worker_id)
    ] * 3
    assert sorted(retry_at) == [1, 2], "retry_wait seen after attempts 1 and 2"
    for n in (1, 2):
        delay = base * 2 ** (n - 1)
        # next_attempt_at and the attempt's finished_at come from one transaction's now().
        assert (retry_at[n] - attempts[n - 1]["finished_at"]).total_seconds() == delay
        # The next attempt starts once the backoff passed: the reaper (every 1 s) promotes it.
        waited = (attempts[n]["started_at"] - attempts[n - 1]["finished_at"]).total_seconds()
        assert delay <= waited < delay + 5, f"attempt {n + 1} started {waited:.2f}s after attempt {n}"
    assert _status_events(pg, job_id) == [
        "queued",
        *["claimed", "processing", "retry_wait", "queued"] * 2,
        "claimed",
        "processing",
        "failed",
    ]
    wait_for("hold released", lambda: client.get("/v1/credits").json()["held"] == 0, 5)
    assert client.get("/v1/credits").json() == before
    assert _ledger(pg, job_id) == ["hold", "release"]
    assert broken.job_dirs() == []
    assert broken.stop() == 0

    # A new job of the same object, on a worker that reaches storage, completes.
    workers("with-storage")
    again = wait_job(client, _process(client, obj["object_id"], "thumbnail"), timeout=60)
    assert (again["status"], again["attempt_count"], len(again["outputs"])) == ("completed", 1, 1)
    assert again["outputs"][0]["mime_type"] == "image/webp"
    assert client.get(f"/v1/jobs/{job_id}").json()["attempt_count"] == 3, "the failed job stays failed"


def test_create_account_with_credits_unreachable_prints_the_account_and_how_to_grant(
    platform: RunningPlatform,
) -> None:
    """The account row and its key are made before the credits are granted (another service):
    when the grant fails, the account is printed all the same (0 credits, its key), stderr says
    the command that grants them, and the exit is 1; the printed key works."""
    env = {k: v for k, v in platform.env.items() if k != "HM_DATABASE_URL"}
    env["HM_CREDITS_ADDR"] = f"127.0.0.1:{free_port()}"  # nothing listens there
    done = subprocess.run(
        [sys.executable, "-m", "hypermedia.devtools.cli", "admin", "create-account", "--credits", "5"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr
    created = json.loads(done.stdout)
    assert created["credits"] == 0 and created["api_key"]
    assert f"hypermedia admin grant {created['account_id']} --credits 5" in done.stderr
    assert "Traceback" not in done.stderr
    granted = platform.admin("grant", created["account_id"], "--credits", "5")
    assert granted["balance"] == 5
    with platform.client(created) as client:
        assert client.get("/v1/credits").json()["balance"] == 5
