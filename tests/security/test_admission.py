"""Admission closes under memory or PID pressure and reopens on fresh measurements: checked on a
real worker process (its status RPC and whether it takes a queued job) and on real samples."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from hypermedia.api.worker.v1 import worker_pb2, worker_pb2_grpc
from hypermedia.devtools.embedded import free_port
from hypermedia.worker.admission import Admission, available_memory_mb, pid_headroom
from tests.e2e.conftest import (
    REPO,
    RunningPlatform,
    isolated_platform,
    upload,
    wait_job,
)

PHOTO = Path(__file__).resolve().parents[1] / "data" / "exif-orientation" / "Landscape_1.jpg"


def test_samples_close_and_reopen_the_gates() -> None:
    headroom, memory = pid_headroom(), available_memory_mb()
    assert headroom > 0 and memory > 0
    admission = Admission(slots=2, min_available_mb=0, min_pid_headroom=headroom * 10)
    admission.sample()
    assert (admission.reason, admission.open) == ("pid_pressure", False)
    admission.min_pid_headroom = 1
    admission.sample()
    assert (admission.reason, admission.open) == ("ok", True)
    admission.min_available_mb = memory * 10
    admission.sample()
    assert (admission.reason, admission.open) == ("memory_pressure", False)
    admission.min_available_mb = 0
    admission.busy = 2
    admission.sample()
    assert admission.reason == "slots_full"


@pytest.fixture(scope="module")
def idle_platform(tmp_root: Path, database_url: str, nats_url: str) -> Iterator[RunningPlatform]:
    with isolated_platform(
        tmp_root, database_url, nats_url, "admission", services="credits,storage,gateway,reaper"
    ) as running:
        yield running


def _worker(platform: RunningPlatform, status_port: int, **env: str) -> subprocess.Popen[bytes]:
    log = (platform.state_dir / "logs" / "admission-worker.log").open("ab")
    return subprocess.Popen(
        [sys.executable, "-m", "services.imageworker"],
        env=platform.service_env() | {"HM_WORKER_STATUS_BIND": f"127.0.0.1:{status_port}", **env},
        cwd=REPO,
        stdout=log,
        stderr=log,
    )


def _status(platform: RunningPlatform, port: int, timeout: float = 60) -> worker_pb2.GetStatusResponse:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with platform.internal_channel(f"127.0.0.1:{port}") as chan:
                return worker_pb2_grpc.WorkerServiceStub(chan).GetStatus(
                    worker_pb2.GetStatusRequest(), timeout=2
                )
        except grpc.RpcError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_a_worker_without_pid_headroom_takes_no_job_and_says_why(idle_platform: RunningPlatform) -> None:
    account = idle_platform.admin("create-account", "--credits", "100")
    with idle_platform.client(account) as client:
        obj = upload(client, PHOTO)
        job_id = client.post(
            "/v1/hypermedia/process", json={"object_id": obj["object_id"], "operations": ["thumbnail"]}
        ).json()["job_ids"][0]
        port = free_port()
        starved = _worker(idle_platform, port, HM_MIN_PID_HEADROOM=str(10**9))
        try:
            status = _status(idle_platform, port)
            assert (status.reason, status.admission_open) == ("pid_pressure", False)
            assert 0 < status.pid_headroom < 10**9 and status.sample_age_seconds < 5
            time.sleep(3)  # a worker with an open gate takes the job within a second
            assert client.get(f"/v1/jobs/{job_id}").json()["status"] == "queued"
            assert _status(idle_platform, port).reason == "pid_pressure", "re-sampled, still closed"
        finally:
            starved.terminate()
            assert starved.wait(60) == 0
        port = free_port()
        healthy = _worker(idle_platform, port)
        try:
            job = wait_job(client, job_id, timeout=60)
            assert job["status"] == "completed" and job["attempt_count"] == 1
            assert _status(idle_platform, port).reason in ("ok", "slots_full")
        finally:
            healthy.terminate()
            assert healthy.wait(60) == 0
