"""Priorities, cancellation and duplicate delivery, end to end on real processes."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from hypermedia.infra import db
from hypermedia.jobs import lifecycle
from tests.e2e.conftest import REPO, RunningPlatform, start_platform, upload, wait_job

EXIF = Path(__file__).resolve().parents[1] / "data" / "exif-orientation"


@pytest.fixture(scope="module")
def idle_platform(tmp_root: Path, database_url: str, nats_url: str) -> Iterator[RunningPlatform]:
    """A platform with no imageworker: jobs stay queued until a test starts one."""
    running = start_platform(tmp_root, database_url, nats_url, services="credits,storage,gateway,reaper")
    try:
        yield running
    finally:
        assert running.stop() == 0


def _client(platform: RunningPlatform, account: dict[str, Any]) -> httpx.Client:
    return platform.client(account)


def _start_worker(platform: RunningPlatform, slots: int) -> subprocess.Popen[bytes]:
    """Start one more imageworker and wait until it has registered (so it is past start-up)."""
    env = platform.service_env() | {"HM_WORKER_SLOTS": str(slots)}
    log = (platform.state_dir / "logs" / "extra-imageworker.log").open("ab")
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.imageworker"], env=env, cwd=REPO, stdout=log, stderr=log
    )
    deadline = time.monotonic() + 60
    with psycopg.connect(platform.env["HM_DATABASE_URL"], autocommit=True) as conn:
        query = "SELECT 1 FROM workers WHERE pid = %s AND status = 'running'"
        while not conn.execute(query, (proc.pid,)).fetchone():
            assert proc.poll() is None, "the worker exited at start"
            assert time.monotonic() < deadline, "the worker did not register within 60 s"
            time.sleep(0.1)
    return proc


def _stop(proc: subprocess.Popen[bytes]) -> int:
    proc.terminate()
    return proc.wait(60)


def test_priority_1_job_behind_a_priority_8_backlog_starts_first(idle_platform: RunningPlatform) -> None:
    account = idle_platform.admin("create-account", "--credits", "1000", "--interactive")
    with _client(idle_platform, account) as client:
        obj = upload(client, EXIF / "Landscape_1.jpg")
        backlog = []
        for _ in range(12):
            response = client.post(
                "/v1/hypermedia/process",
                json={
                    "object_id": obj["object_id"],
                    "operations": [{"name": "thumbnail", "params": {"size": 64}}],
                    "priority": 8,
                },
            )
            backlog += response.json()["job_ids"]
        urgent = client.post(
            "/v1/hypermedia/process",
            json={
                "object_id": obj["object_id"],
                "operations": [{"name": "thumbnail", "params": {"size": 64}}],
                "priority": 1,
            },
        ).json()["job_ids"][0]
        time.sleep(1.5)  # let the relay publish everything before a worker exists
        worker = _start_worker(idle_platform, slots=1)
        try:
            jobs = {job_id: wait_job(client, job_id, timeout=120) for job_id in [*backlog, urgent]}
        finally:
            assert _stop(worker) == 0
    assert all(j["status"] == "completed" for j in jobs.values())
    order = sorted(jobs.values(), key=lambda j: j["started_at"])
    assert order[0]["job_id"] == urgent, [(j["priority"], j["started_at"]) for j in order[:3]]
    backlog_order = [j["job_id"] for j in order[1:]]
    assert backlog_order == backlog, "within one priority, creation order"


def test_cancel_of_a_queued_job_is_immediate_and_never_executed(idle_platform: RunningPlatform) -> None:
    account = idle_platform.admin("create-account", "--credits", "100")
    with _client(idle_platform, account) as client:
        obj = upload(client, EXIF / "Landscape_2.jpg")
        job_id = client.post(
            "/v1/hypermedia/process", json={"object_id": obj["object_id"], "operations": ["thumbnail"]}
        ).json()["job_ids"][0]
        assert client.get("/v1/credits").json()["held"] > 0
        cancelled = client.post(f"/v1/jobs/{job_id}:cancel")
        assert cancelled.status_code == 200
        assert cancelled.json()["status"] == "cancelled"
        assert client.get("/v1/credits").json() == {"balance": 100.0, "held": 0.0, "available": 100.0}
        again = client.post(f"/v1/jobs/{job_id}:cancel")
        assert again.status_code == 409 and again.json()["error_code"] == "JOB_NOT_CANCELLABLE"
        worker = _start_worker(idle_platform, slots=2)
        try:
            time.sleep(3)  # the worker sees the message and must drop it
            job = client.get(f"/v1/jobs/{job_id}").json()
        finally:
            assert _stop(worker) == 0
    assert job["status"] == "cancelled"
    assert job["attempt_count"] == 0 and job["attempts"] == [] and job["outputs"] == []


def test_the_same_job_delivered_twice_has_one_output_row_and_one_charge(
    platform: RunningPlatform, client: httpx.Client, account: dict[str, Any], database_url: str
) -> None:
    obj = upload(client, EXIF / "Landscape_5.jpg")
    job_id = client.post(
        "/v1/hypermedia/process", json={"object_id": obj["object_id"], "operations": ["thumbnail"]}
    ).json()["job_ids"][0]
    first = wait_job(client, job_id)
    assert first["status"] == "completed"
    balance_after_first = client.get("/v1/credits").json()
    prefix = platform.env["HM_STREAM_PREFIX"]

    async def redeliver(reset: bool) -> None:
        conn = await db.connect(database_url)
        try:
            async with conn.transaction():
                if reset:
                    # What a crash after the outputs were written but before the ack looks like to
                    # the next delivery: the job is claimable again and runs a second time.
                    await conn.execute(
                        "UPDATE processing_jobs SET status = 'queued', claimed_by = NULL WHERE job_id = $1",
                        job_id,
                    )
                await lifecycle.enqueue_outbox(conn, prefix, job_id, "images", 5)
        finally:
            await conn.close()

    asyncio.run(redeliver(reset=False))  # a plain duplicate message: claim fails, dropped
    time.sleep(2)
    assert client.get(f"/v1/jobs/{job_id}").json()["attempt_count"] == 1
    asyncio.run(redeliver(reset=True))  # a second full execution
    deadline = time.monotonic() + 60
    while client.get(f"/v1/jobs/{job_id}").json()["attempt_count"] < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    second = wait_job(client, job_id)
    assert second["status"] == "completed" and second["attempt_count"] == 2
    assert len(second["outputs"]) == 1
    assert second["outputs"][0]["key"] == first["outputs"][0]["key"]

    async def rows() -> tuple[int, int, int]:
        conn = await db.connect(database_url)
        try:
            outputs = await conn.fetchval("SELECT count(*) FROM job_outputs WHERE job_id = $1", job_id)
            commits = await conn.fetchval(
                # A charge is one commit a line (base, megapixels): count its base lines.
                "SELECT count(*) FROM credit_ledger WHERE job_id = $1 AND kind = 'commit' AND line = 'base'",
                job_id,
            )
            objects = await conn.fetchval(
                "SELECT count(*) FROM objects WHERE source_object_id = $1", obj["object_id"]
            )
            return outputs, commits, objects
        finally:
            await conn.close()

    assert asyncio.run(rows()) == (1, 1, 1)
    assert client.get("/v1/credits").json() == balance_after_first


def test_a_starting_worker_removes_job_directories_a_crashed_worker_left(
    idle_platform: RunningPlatform,
) -> None:
    jobs = Path(idle_platform.service_env()["HM_WORK_DIR"]) / "jobs"
    leftover = jobs / "0b5d7f0e-0000-4000-8000-000000000000"
    (leftover / "input").mkdir(parents=True, exist_ok=True)
    (leftover / "input" / "source").write_bytes(b"half a file")
    worker = _start_worker(idle_platform, slots=1)
    try:
        assert not leftover.exists()
    finally:
        assert _stop(worker) == 0
