"""The worker unit of seed 001 end to end (issue 19, ADR 0046): control (``python -m
hypermedia.worker.unit imageworker``) and its execution as real processes on real Postgres and NATS,
each exit code made to happen, a kill -9 of execution in the middle of a job, a stale message on the
private socket, a second unit with the same name, measured admission with and without a cgroup, a
memory pressure that closes admission and the samples that reopen it, the 30 s startup deadline
and the 35 s drain.

The platform here runs without an imageworker, on a database of its own (the tests depend on which
worker runs which job). Execution's cgroup is made under the test's own (v1 here, as root: CI runs
as root; the unprivileged run delegates a subtree, scripts/test_unprivileged.sh).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import psutil
import psycopg
import pytest

from hypermedia.api.worker.v1 import worker_pb2, worker_pb2_grpc
from hypermedia.devtools.embedded import free_port
from hypermedia.worker.unit.settings import ROLES
from tests.e2e.conftest import REPO, RunningPlatform, own_database, start_platform, upload, wait_for, wait_job
from tests.e2e.slowjob import make_slow_png
from tests.helpers.media import write_video

MINIMAL_PDF = Path(__file__).resolve().parents[1] / "data" / "pdf" / "minimal-document.pdf"

QUICK = Path(__file__).resolve().parents[1] / "data" / "exif-orientation" / "Landscape_1.jpg"


@pytest.fixture(scope="module")
def unit_platform(tmp_root: Path, database_url: str, nats_url: str) -> Iterator[RunningPlatform]:
    """Everything but the imageworker, the reaper every second, the noop operation on."""
    with own_database(database_url, "unit") as dsn:
        running = start_platform(
            tmp_root, dsn, nats_url, services="credits,storage,gateway,reaper", HM_NOOP_OPERATION="1"
        )
        try:
            yield running
        finally:
            assert running.stop() == 0


@pytest.fixture
def pg(unit_platform: RunningPlatform) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(unit_platform.env["HM_DATABASE_URL"], autocommit=True) as conn:
        yield conn
        conn.execute(
            "UPDATE processing_jobs SET status = 'cancelled', completed_at = now() "
            "WHERE status NOT IN ('completed', 'failed', 'cancelled')"
        )


@pytest.fixture
def client(unit_platform: RunningPlatform) -> Iterator[httpx.Client]:
    account = unit_platform.admin("create-account", "--credits", "100")
    with unit_platform.client(account) as c:
        yield c


@pytest.fixture(scope="module")
def slow_png(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_slow_png(tmp_path_factory.mktemp("slow") / "slow.png")


@dataclass
class Unit:
    """A control process a test started, with its status port and log."""

    proc: subprocess.Popen[bytes]
    status_addr: str
    log: Path
    credentials: grpc.ChannelCredentials

    def status(self) -> worker_pb2.GetStatusResponse:
        with grpc.secure_channel(self.status_addr, self.credentials) as chan:
            return worker_pb2_grpc.WorkerServiceStub(chan).GetStatus(worker_pb2.GetStatusRequest(), timeout=2)

    def status_or_none(self) -> worker_pb2.GetStatusResponse | None:
        try:
            return self.status()
        except grpc.RpcError:
            return None

    def execution(self) -> psutil.Process | None:
        """Control's child: execution (``python -m services.imageworker``)."""
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(self.proc.pid).children():
                if child.status() != psutil.STATUS_ZOMBIE:
                    return child
        return None

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_exit(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"control still running after {timeout}s:\n{self.text()[-3000:]}") from None

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def _start_unit(platform: RunningPlatform, name: str, *args: str, **env: str) -> Unit:
    status_addr = f"127.0.0.1:{free_port()}"
    full_env = platform.service_env() | {
        "HM_WORK_DIR": str(platform.state_dir / f"work-{name}"),
        "HM_WORKER_STATUS_BIND": status_addr,
        "HM_UNIT_NAME": name,
        "HM_UNIT_LEASE_SECONDS": "3",
        **env,
    }
    log = platform.state_dir / "logs" / f"unit-{name}-{time.monotonic_ns()}.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "hypermedia.worker.unit", *_role(args), *args],
            env=full_env,
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return Unit(proc, status_addr, log, platform.tls().channel_credentials())


def _role(args: tuple[str, ...]) -> list[str]:
    """``imageworker`` unless the test gives a role first or ``--queues``."""
    given = (args and args[0] in ROLES) or any(arg.startswith("--queues") for arg in args)
    return [] if given else ["imageworker"]


@pytest.fixture
def units(unit_platform: RunningPlatform) -> Iterator[Any]:
    """``units(name, *args, **env)`` starts a control; each is stopped at the end."""
    started: list[Unit] = []

    def start(name: str, *args: str, **env: str) -> Unit:
        unit = _start_unit(unit_platform, name, *args, **env)
        started.append(unit)
        return unit

    yield start
    for unit in started:
        unit.stop()


def _ready(unit: Unit, timeout: float = 60) -> worker_pb2.GetStatusResponse:
    """Until execution serves its status with matched evidence and control's first decision."""

    def check() -> worker_pb2.GetStatusResponse | None:
        if unit.proc.poll() is not None:
            raise AssertionError(f"control exited {unit.proc.returncode}:\n{unit.text()[-3000:]}")
        status = unit.status_or_none()
        if status is not None and status.unit.evidence_matched and status.unit.admission_target >= 0:
            return status
        return None

    return wait_for("unit ready", check, timeout, interval=0.1)


def _process(client: httpx.Client, object_id: str, operation: str) -> str:
    response = client.post("/v1/hypermedia/process", json={"object_id": object_id, "operations": [operation]})
    assert response.status_code == 202, response.text
    return str(response.json()["job_ids"][0])


def _slow_job_running(unit: Unit, client: httpx.Client, pg: psycopg.Connection[Any], png: Path) -> str:
    """Once ``unit`` is ready: a ``compress`` of the slow PNG, returned once the worker has
    downloaded its input (the sandbox is starting or running the pipeline)."""
    _ready(unit)
    job_id = _process(client, upload(client, png)["object_id"], "compress")
    wait_for(
        "job running in its sandbox",
        lambda: pg.execute(
            "SELECT 1 FROM job_events WHERE job_id = %s AND kind = 'progress' AND detail->>'stage' = 'downloaded'",
            (job_id,),
        ).fetchone(),
        60,
    )
    return job_id


def _descendants(pid: int) -> list[psutil.Process]:
    with contextlib.suppress(psutil.Error):
        return psutil.Process(pid).children(recursive=True)
    return []


def _signal_and_wait_for_generation_1(unit: Unit, execution: psutil.Process, sig: signal.Signals) -> None:
    """Send ``sig`` to execution; then generation 1 is ready and no process of generation 0 lives."""
    doomed = [execution, *_descendants(execution.pid)]
    os.kill(execution.pid, sig)
    wait_for(
        "generation 1 ready",
        lambda: (
            (s := unit.status_or_none()) is not None and s.unit.generation == 1 and s.unit.evidence_matched
        ),
        90,
    )
    alive = [p.pid for p in doomed if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert alive == [], f"processes of generation 0 survived: {alive}"


# -- configuration and identity ----------------------------------------------------------------------


def test_an_invalid_configuration_exits_78_naming_each_variable_before_anything_is_launched(
    units: Any, pg: psycopg.Connection[Any]
) -> None:
    unit = units(
        "bad-config",
        HM_DATABASE_URL="mysql://hm:topsecret-pw@db.internal/hm",
        HM_NATS_URL="http://nats:4222",
        HM_STORAGE_ADDR="storage",
        HM_UNIT_EPOCH="7",
        HM_CONSUMER_NAME="mine",
        HM_WORKER_SLOTS="0",
        HM_UNIT_RUN_DIR="/nonexistent/run",
        HM_UNIT_CGROUP="/elsewhere/../other",
        HM_UNIT_STATUS_SILENCE_SECONDS="1",
    )
    assert unit.wait_exit(30) == 78
    text = unit.text()
    for said in (
        "HM_DATABASE_URL",
        "HM_NATS_URL",
        "HM_STORAGE_ADDR",
        "HM_UNIT_EPOCH",
        "HM_CONSUMER_NAME",
        "HM_WORKER_SLOTS",
        "HM_UNIT_RUN_DIR: Value error, must be an absolute path of an existing directory control can write",
        "HM_UNIT_CGROUP: Value error, a cgroup path must not have . or .. components",
        "HM_UNIT_STATUS_SILENCE_SECONDS",
    ):
        assert said in text, text
    assert "topsecret" not in text
    assert "execution launched" not in text
    assert pg.execute("SELECT count(*) FROM worker_unit_leases WHERE unit = 'bad-config'").fetchone() == (0,)


def test_unit_option_and_environment_must_agree(units: Any) -> None:
    unit = units("agree", "--unit", "other-name")
    assert unit.wait_exit(30) == 78
    assert "HM_UNIT_NAME: differs from --unit" in unit.text()


def test_a_unit_runs_jobs_after_its_peer_evidence_matched_and_a_second_unit_of_the_name_is_refused(
    units: Any, client: httpx.Client, pg: psycopg.Connection[Any]
) -> None:
    first = units("solo")
    status = _ready(first)
    assert status.unit.unit == "solo" and status.unit.generation == 0 and status.unit.epoch >= 1
    assert len(status.unit.boot) == 32
    epoch = status.unit.epoch
    assert pg.execute(
        "SELECT epoch, released_at IS NULL FROM worker_unit_leases WHERE unit = 'solo'"
    ).fetchone() == (epoch, True)
    object_id = upload(client, QUICK)["object_id"]
    job = wait_job(client, _process(client, object_id, "thumbnail"))
    assert job["status"] == "completed", job

    second = units("solo")
    assert second.wait_exit(30) == 75
    assert "held by" in second.text() and f"epoch {epoch}" in second.text()
    assert first.proc.poll() is None

    assert first.stop() == 0
    released = pg.execute(
        "SELECT released_at IS NOT NULL FROM worker_unit_leases WHERE unit = 'solo'"
    ).fetchone()
    assert released == (True,)
    third = units("solo")
    assert _ready(third).unit.epoch == epoch + 1


def test_a_stale_message_on_the_unit_socket_is_refused(units: Any) -> None:
    unit = units("stale")
    status = _ready(unit)
    execution = unit.execution()
    assert execution is not None
    path = execution.environ()["HM_UNIT_SOCKET"]
    identity = {
        "deployment": status.unit.deployment,
        "unit": status.unit.unit,
        "boot": status.unit.boot,
        "epoch": status.unit.epoch - 1 if status.unit.epoch > 1 else status.unit.epoch + 5,
        "generation": status.unit.generation,
    }
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(5)
        sock.connect(path)
        sock.sendall(
            json.dumps({"kind": "hello", "unit": identity, "worker_id": "x", "pid": 1}).encode() + b"\n"
        )
        assert sock.recv(4096) == b"", "a stale hello must get no evidence and a closed connection"
    wait_for("refusal logged", lambda: "stale hello message refused: epoch" in unit.text(), 10)
    # The right identity from another process: the kernel's peer credentials say it is not execution.
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(5)
        sock.connect(path)
        current = {**identity, "epoch": status.unit.epoch}
        sock.sendall(
            json.dumps({"kind": "hello", "unit": current, "worker_id": "x", "pid": execution.pid}).encode()
            + b"\n"
        )
        assert sock.recv(4096) == b"", "a hello from another process must get no evidence"
    wait_for("impostor logged", lambda: f"a hello from pid {os.getpid()} refused" in unit.text(), 10)
    wait_for("refusals counted", lambda: unit.status().unit.refused_messages >= 2, 10)
    assert unit.proc.poll() is None and unit.status().unit.evidence_matched


# -- containment ---------------------------------------------------------------------------------------


def test_kill_9_of_execution_mid_job_contains_it_and_the_job_completes_once_on_the_next_generation(
    units: Any, client: httpx.Client, pg: psycopg.Connection[Any], slow_png: Path
) -> None:
    unit = units("contain", HM_WORKER_SLOTS="1")
    job_id = _slow_job_running(unit, client, pg, slow_png)
    execution = unit.execution()
    assert execution is not None
    time.sleep(1.0)  # the job child is in the pipeline now
    assert len(_descendants(execution.pid)) >= 2, "its zygote and the job's child"
    _signal_and_wait_for_generation_1(unit, execution, signal.SIGKILL)
    job = wait_job(client, job_id, timeout=120)
    assert job["status"] == "completed", job
    attempts = pg.execute(
        "SELECT status, error_code, error_message FROM job_attempts WHERE job_id = %s ORDER BY attempt_number",
        (job_id,),
    ).fetchall()
    assert attempts == [
        ("lost", "WORKER_LOST", "worker contained by its unit's control"),
        ("completed", None, None),
    ]
    outputs = pg.execute("SELECT count(*) FROM job_outputs WHERE job_id = %s", (job_id,)).fetchone()
    assert outputs == (1,)
    assert "contained, 1 jobs handed back; launching generation 1" in unit.text()
    assert unit.stop() == 0


def test_containment_that_cannot_finish_exits_71_and_hands_nothing_back(
    units: Any, pg: psycopg.Connection[Any]
) -> None:
    """A process of execution that outlives SIGKILL: the zygote frozen by the v1 freezer (a frozen
    task takes its SIGKILL only when thawed)."""
    freezer = Path("/sys/fs/cgroup/freezer")
    if not (freezer / "freezer.state").exists() and not (freezer / "cgroup.procs").exists():
        pytest.fail("this test needs the v1 freezer hierarchy at /sys/fs/cgroup/freezer")
    unit = units("frozen")
    _ready(unit)
    execution = unit.execution()
    assert execution is not None
    zygote = next(
        p
        for p in _descendants(execution.pid)
        if "zygote" in " ".join(p.cmdline()) or p.ppid() == execution.pid
    )
    group = freezer / f"hm-test-frozen-{os.getpid()}"
    group.mkdir()
    try:
        (group / "cgroup.procs").write_text(str(zygote.pid))
        (group / "freezer.state").write_text("FROZEN")
        wait_for("frozen", lambda: (group / "freezer.state").read_text().strip() == "FROZEN", 10)
        os.kill(execution.pid, signal.SIGKILL)
        assert unit.wait_exit(40) == 71
        assert "containment failed" in unit.text() and str(zygote.pid) in unit.text()
    finally:
        (group / "freezer.state").write_text("THAWED")
        with contextlib.suppress(psutil.Error):
            zygote.kill()
        wait_for(
            "zygote gone", lambda: not zygote.is_running() or zygote.status() == psutil.STATUS_ZOMBIE, 10
        )
        for _ in range(50):
            with contextlib.suppress(OSError):
                group.rmdir()
                break
            time.sleep(0.1)


# -- the lease -------------------------------------------------------------------------------------------


def test_a_lost_lease_contains_execution_and_exits_75(units: Any, pg: psycopg.Connection[Any]) -> None:
    unit = units("usurped")
    status = _ready(unit)
    execution = unit.execution()
    assert execution is not None
    # Another unit took the lease (its epoch went up): this one is fenced.
    pg.execute(
        "UPDATE worker_unit_leases SET epoch = epoch + 1, holder = 'elsewhere/1' WHERE unit = 'usurped'"
    )
    assert unit.wait_exit(30) == 75
    assert "deployment lease lost" in unit.text()
    assert not execution.is_running() or execution.status() == psutil.STATUS_ZOMBIE
    assert status.unit.epoch >= 1


def test_a_stopped_execution_is_contained_after_its_silence_and_relaunched(
    units: Any, tmp_path: Path
) -> None:
    """SIGSTOP: execution neither exits nor reports. After ``HM_UNIT_STATUS_SILENCE_SECONDS`` (5 s
    here; 30 by default, ``test_unit_lanes.py``) control treats it as dead (SIGKILL reaches a
    stopped process too) and launches generation 1. The run directory given here also held a
    socket directory of a control killed before it cleaned up: removed at start."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    stale = tmp_path / f"hm-unit-{gone.pid}-leftover"
    stale.mkdir()
    (stale / "control.sock").write_text("")
    unit = units("frozen", HM_UNIT_RUN_DIR=str(tmp_path), HM_UNIT_STATUS_SILENCE_SECONDS="5")
    _ready(unit)
    assert not stale.exists()
    left = [p.name for p in tmp_path.iterdir()]
    assert len(left) == 1 and left[0].startswith(f"hm-unit-{unit.proc.pid}-"), left
    execution = unit.execution()
    assert execution is not None
    _signal_and_wait_for_generation_1(unit, execution, signal.SIGSTOP)
    text = unit.text()
    assert "execution generation 0 sent no status for 5 s (stopped or stuck); containing it" in text
    assert "execution generation 0 fell silent; contained, 0 jobs handed back; launching generation 1" in text
    assert unit.stop() == 0


# -- measured admission ----------------------------------------------------------------------------------


def test_without_a_cgroup_admission_holds_at_one(units: Any) -> None:
    unit = units("blind", HM_UNIT_CGROUP="off", HM_WORKER_SLOTS="4")
    status = _ready(unit)
    assert status.unit.admission_target == 1
    assert status.unit.decision_reason == "no_measurements"
    assert status.unit.sample_age_seconds == -1
    assert status.slots_total == 4


def test_without_a_group_of_its_own_admission_is_measured_on_the_containers_group(units: Any) -> None:
    """A cgroup control may not write (here: a path outside its own tree, as a read-only
    /sys/fs/cgroup in a pod): the evidence is control's own group, read only."""
    unit = units("readonly", HM_UNIT_CGROUP="/elsewhere", HM_WORKER_SLOTS="4")
    status = wait_for(
        "a measured decision",
        lambda: (s := _ready(unit)).unit.sample_age_seconds >= 0 and s,
        15,
        interval=0.2,
    )
    assert status.unit.memory_limit_mb > 0 and status.unit.pids_limit > 0
    assert status.unit.decision_reason != "no_measurements"
    assert "measured on the container's own cgroup, read only" in unit.text()


def test_memory_pressure_closes_admission_and_fresh_samples_reopen_it(units: Any) -> None:
    """A process in execution's cgroup allocates toward the unit's limit (as a job child would):
    the autoscaler closes admission; when the memory is back, the next samples reopen it."""
    unit = units("pressure", HM_UNIT_MEMORY_MB="1024", HM_WORKER_SLOTS="4")
    status = _ready(unit)
    assert status.unit.memory_limit_mb == 1024 and status.unit.sample_age_seconds < 5
    assert status.unit.admission_target >= 1, status.unit.decision_reason
    execution = unit.execution()
    assert execution is not None
    memory_group = next(
        line.split(":", 2)[2]
        for line in Path(f"/proc/{execution.pid}/cgroup").read_text().splitlines()
        if line.split(":")[1] == "memory"
    )
    procs = Path("/sys/fs/cgroup/memory") / memory_group.lstrip("/") / "cgroup.procs"
    allocate = int((0.93 * 1024 - status.unit.memory_current_mb) * 1024 * 1024)
    hog = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; sys.stdin.readline(); b = b'x' * int(sys.argv[1]); print('held', flush=True); time.sleep(600)",
            str(allocate),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        procs.write_text(str(hog.pid))
        assert hog.stdin is not None and hog.stdout is not None
        hog.stdin.write(b"go\n")
        hog.stdin.flush()
        assert hog.stdout.readline() == b"held\n"
        closed = wait_for(
            "admission closed",
            lambda: (s := unit.status()).unit.admission_target == 0 and s,
            15,
            interval=0.2,
        )
        assert closed.unit.decision_reason.startswith("memory_pressure"), closed.unit.decision_reason
        assert closed.reason == "parked" and not closed.admission_open
        # Control parks the ordinary slots only: the scheduler consumer (ADR 0073) stays open.
        [consumer] = [q for q in closed.queues if q.queue == "sched.images"]
        assert consumer.admission_target == -1 and consumer.admission_open, consumer
    finally:
        hog.kill()
        hog.wait()
    reopened = wait_for(
        "admission reopened", lambda: (s := unit.status()).unit.admission_target >= 1 and s, 15, interval=0.2
    )
    assert not reopened.unit.decision_reason.startswith("memory_pressure")
    assert reopened.admission_open


# -- deadlines ---------------------------------------------------------------------------------------------


def test_an_execution_not_ready_by_the_30_s_startup_deadline_ends_the_unit_with_69(units: Any) -> None:
    """NATS that accepts connections and never speaks: execution cannot open its dependencies."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    try:
        started = time.monotonic()
        unit = units("deadline", HM_NATS_URL=f"nats://127.0.0.1:{silent.getsockname()[1]}")
        assert unit.wait_exit(60) == 69
        took = time.monotonic() - started
        assert 29 <= took <= 50, took
        assert "startup" in unit.text() and "30" in unit.text()
        assert unit.execution() is None
    finally:
        silent.close()


def test_sigterm_drains_within_the_default_35_s_and_the_running_job_completes(
    units: Any, client: httpx.Client, pg: psycopg.Connection[Any], slow_png: Path
) -> None:
    unit = units("drain", HM_WORKER_SLOTS="1")
    job_id = _slow_job_running(unit, client, pg, slow_png)
    started = time.monotonic()
    unit.proc.send_signal(signal.SIGTERM)
    assert unit.wait_exit(60) == 0
    assert time.monotonic() - started < 35 + 10
    job = wait_job(client, job_id, timeout=5)
    assert job["status"] == "completed", job


def test_a_profile_routed_to_the_unit_without_a_handler_or_a_bounded_retry_exits_78(
    units: Any, pg: psycopg.Connection[Any]
) -> None:
    """Item 4's start check: every active profile on the unit's queue must have a handler in the
    role and 1-10 attempts; the unit names each problem and launches nothing."""
    pg.execute(
        "INSERT INTO processing_profiles (operation, version, queue, base_cost, per_mb, timeout_seconds, "
        "max_attempts, max_input_bytes, input_kinds) VALUES ('sharpen', 1, 'images', 1, 1, 30, 3, 1000, ARRAY['image'])"
    )
    pg.execute("UPDATE processing_profiles SET max_attempts = 50 WHERE operation = 'resize' AND active")
    try:
        unit = units("routing")
        assert unit.wait_exit(30) == 78
    finally:
        pg.execute("DELETE FROM processing_profiles WHERE operation = 'sharpen'")
        pg.execute("UPDATE processing_profiles SET max_attempts = 3 WHERE operation = 'resize' AND active")
    text = unit.text()
    assert "profile sharpen v1 on queue images: the imageworker has no handler for sharpen" in text
    assert "profile resize v1 on queue images: max_attempts 50 is not a bounded retry policy (1-10)" in text
    assert "execution launched" not in text
    assert pg.execute(
        "SELECT count(*) FROM worker_unit_leases WHERE unit = 'routing' AND released_at IS NULL"
    ).fetchone() == (0,)


# -- one unit, several queues (item 4) -----------------------------------------------------------


def test_a_unit_of_several_queues_runs_each_queues_jobs_in_its_own_lane(
    units: Any, client: httpx.Client, pg: psycopg.Connection[Any]
) -> None:
    """``--queues=images=2,documents=1``: one execution (``services.multiworker``) with a lane
    per queue, each with its slots, its worker id and control's admission decision for it; an
    image job and a document job complete, each on its lane."""
    unit = units("multi", "--queues=images=2,documents=1", HM_METRICS_SECONDS="1")

    def both_decided() -> worker_pb2.GetStatusResponse | None:
        status = _ready(unit, timeout=90)
        ordinary = [q for q in status.queues if not q.queue.startswith("sched.")]
        return status if all(q.admission_target >= 0 for q in ordinary) else None

    status = wait_for("both lanes decided", both_decided, 60, interval=0.2)
    assert status.queue == "images,documents"
    # Each queue's scheduler consumer (ADR 0073) is listed after the lanes, outside the totals.
    assert [(q.queue, q.slots_total) for q in status.queues] == [
        ("images", 2),
        ("documents", 1),
        ("sched.images", 1),
        ("sched.documents", 1),
    ]
    assert status.slots_total == 3
    image_lane, document_lane, image_consumer, document_consumer = status.queues
    assert image_consumer.worker_id == image_lane.worker_id + "/sched"
    assert document_consumer.worker_id == document_lane.worker_id + "/sched"
    assert image_consumer.admission_target == document_consumer.admission_target == -1
    pid = unit.execution().pid  # type: ignore[union-attr]
    assert image_lane.worker_id.startswith("local/imageworker/") and image_lane.worker_id.endswith(
        f"/g0/{pid}"
    )
    assert document_lane.worker_id.startswith("local/docworker/") and document_lane.worker_id.endswith(
        f"/g0/{pid}"
    )
    assert document_lane.job_memory_source in ("measured", "profile") and document_lane.job_memory_mb > 0

    image = _process(client, upload(client, QUICK)["object_id"], "thumbnail")
    document = _process(client, upload(client, MINIMAL_PDF)["object_id"], "pdf_info")
    for job_id, worker_id in ((image, image_lane.worker_id), (document, document_lane.worker_id)):
        job = wait_job(client, job_id)
        assert job["status"] == "completed", job
        assert [a["worker_id"] for a in job["attempts"]] == [worker_id]
    rows = pg.execute(
        "SELECT role, queue, slots FROM workers WHERE worker_id = ANY(%s) ORDER BY queue",
        ([image_lane.worker_id, document_lane.worker_id],),
    ).fetchall()
    assert rows == [("docworker", "documents", 1), ("imageworker", "images", 2)]
    # The admission state is a metric too: every lane's worker_metrics rows carry control's target.
    wait_for(
        "metrics of both lanes",
        lambda: (
            pg.execute(
                "SELECT count(DISTINCT worker_id) FROM worker_metrics WHERE worker_id = ANY(%s) "
                "AND admission_target >= 1 AND admission_reason IS NOT NULL",
                ([image_lane.worker_id, document_lane.worker_id],),
            ).fetchone()
            == (2,)
        ),
        30,
    )
    assert "admission target" in unit.text() and " on documents: " in unit.text()
    assert unit.stop() == 0


def test_queues_and_their_slots_come_from_the_queues_option_only(units: Any) -> None:
    unit = units("multi-bad", "--queues=images=2,videos,images", HM_WORKER_SLOTS="3")
    assert unit.wait_exit(30) == 78
    text = unit.text()
    assert "--queues: 'videos' is not one of images, documents, ocr, media" in text
    assert "HM_WORKER_SLOTS: must not be set with --queues" in text
    assert "execution launched" not in text


def test_media_grants_of_a_killed_execution_are_freed_after_containment_for_the_next_generation(
    units: Any, client: httpx.Client, pg: psycopg.Connection[Any], tmp_path: Path
) -> None:
    """The media coordinator lives in control (item 3): with one video job at a time and two
    slots, kill -9 of execution while its transcode holds the grant frees that grant only after
    containment; generation 1 gets it again, both jobs complete once, and the bound held: never
    two grants at once."""
    clip = write_video(tmp_path / "clip.mp4", seconds=20, width=1280, height=720)
    unit = units("media-unit", "mediaworker", HM_WORKER_SLOTS="2", HM_MEDIA_MAX_VIDEO_JOBS="1")
    _ready(unit)
    object_id = upload(client, clip)["object_id"]
    operation = {"name": "transcode_video", "params": {"heights": [240]}}
    job_ids = []
    for _ in range(2):
        response = client.post(
            "/v1/hypermedia/process", json={"object_id": object_id, "operations": [operation]}
        )
        assert response.status_code == 202, response.text
        job_ids += response.json()["job_ids"]
    wait_for("a transcode granted", lambda: "transcode_video granted (1 of 1)" in unit.text(), 60)
    execution = unit.execution()
    assert execution is not None
    _signal_and_wait_for_generation_1(unit, execution, signal.SIGKILL)
    assert "grants of generation 0 freed after containment" in unit.text()
    for job_id in job_ids:
        job = wait_job(client, job_id, timeout=180)
        assert job["status"] == "completed" and job["outputs"], job
        assert job["attempts"][-1]["worker_id"].endswith(f"/g1/{unit.execution().pid}")  # type: ignore[union-attr]
    text = unit.text()
    assert text.count("transcode_video granted (1 of 1)") >= 3  # g0's first, then g1's two in turn
    assert "granted (2 of 1)" not in text
