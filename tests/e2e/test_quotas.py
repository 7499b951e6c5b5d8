"""Job quotas end to end (issue 21 item 4): an account's priority band, request rate and waiting
jobs, set with ``hypermedia admin set-quota`` and answered over REST (403 / 429 with
``Retry-After``) and gRPC (PERMISSION_DENIED / RESOURCE_EXHAUSTED with the error trailers).

The platform has no worker, so created jobs stay ``queued`` and count as waiting; it has a
database of its own, so no other platform's reaper republishes them.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from hypermedia.api.jobs.v1 import jobs_pb2, jobs_pb2_grpc
from tests.e2e.conftest import REPO, RunningPlatform, own_database, start_platform, upload

PHOTO = Path(__file__).resolve().parents[1] / "data" / "exif-orientation" / "Landscape_3.jpg"


@pytest.fixture(scope="module")
def quota_platform(tmp_root: Path, database_url: str, nats_url: str) -> Iterator[RunningPlatform]:
    with own_database(database_url, "quota") as dsn:
        running = start_platform(tmp_root, dsn, nats_url, services="credits,storage,gateway")
        try:
            yield running
        finally:
            assert running.stop() == 0


def _process(
    client: httpx.Client, object_id: str, *, priority: int | None = None, ops: int = 1
) -> httpx.Response:
    body: dict[str, Any] = {"object_id": object_id, "operations": ["thumbnail"] * ops}
    if priority is not None:
        body["priority"] = priority
    return client.post("/v1/hypermedia/process", json=body)


def _held(client: httpx.Client) -> float:
    return float(client.get("/v1/credits").json()["held"])


def test_the_interactive_band_is_refused_to_an_account_without_it_over_rest_and_grpc(
    quota_platform: RunningPlatform,
) -> None:
    account = quota_platform.admin("create-account", "--credits", "100")
    assert account["interactive"] is False
    with quota_platform.client(account) as client:
        obj = upload(client, PHOTO)
        refused = _process(client, obj["object_id"], priority=1)
        assert refused.status_code == 403, refused.text
        problem = refused.json()
        assert problem["error_code"] == "PRIORITY_NOT_ALLOWED"
        assert (problem["priority"], problem["allowed"]) == (1, 4)
        assert "interactive band (1-3)" in problem["detail"]
        assert _held(client) == 0

        metadata = (("authorization", f"Bearer {account['api_key']}"),)
        with grpc.insecure_channel(quota_platform.grpc_addr) as chan:
            with pytest.raises(grpc.RpcError) as denied:
                jobs_pb2_grpc.JobServiceStub(chan).Process(
                    jobs_pb2.ProcessRequest(
                        object_id=obj["object_id"],
                        operations=[jobs_pb2.Operation(name="thumbnail")],
                        priority=3,
                    ),
                    metadata=metadata,
                )
        assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert ("hm-error-code", "PRIORITY_NOT_ALLOWED") in tuple(denied.value.trailing_metadata())

        assert _process(client, obj["object_id"], priority=4).status_code == 202
        assert _process(client, obj["object_id"]).status_code == 202  # the default, 5
        quota = quota_platform.admin("set-quota", account["account_id"], "--interactive")
        assert quota["interactive"] is True
        allowed = _process(client, obj["object_id"], priority=1)
        assert allowed.status_code == 202, allowed.text


def test_past_its_rate_an_account_gets_429_with_retry_after_then_gets_through(
    quota_platform: RunningPlatform,
) -> None:
    account = quota_platform.admin("create-account", "--credits", "100")
    quota = quota_platform.admin("set-quota", account["account_id"], "--rate", "0.5", "--burst", "2")
    assert (quota["rate_per_second"], quota["burst"]) == (0.5, 2)
    with quota_platform.client(account) as client:
        obj = upload(client, PHOTO)
        assert [_process(client, obj["object_id"]).status_code for _ in range(2)] == [202, 202]
        limited = _process(client, obj["object_id"])
        assert limited.status_code == 429, limited.text
        assert limited.json()["error_code"] == "RATE_LIMITED"
        wait = int(limited.headers["Retry-After"])
        assert wait == limited.json()["retry_after_seconds"] and 1 <= wait <= 2
        held = _held(client)
        time.sleep(wait)
        assert _process(client, obj["object_id"]).status_code == 202
        assert _held(client) > held
        # Another account is not held back by this one's bucket.
        other = quota_platform.admin("create-account", "--credits", "100")
        with quota_platform.client(other) as other_client:
            other_obj = upload(other_client, PHOTO)
            assert _process(other_client, other_obj["object_id"]).status_code == 202


def test_past_its_waiting_jobs_an_account_gets_429_until_jobs_leave_the_queue(
    quota_platform: RunningPlatform,
) -> None:
    account = quota_platform.admin("create-account", "--credits", "100")
    quota_platform.admin("set-quota", account["account_id"], "--max-queued-jobs", "3")
    with quota_platform.client(account) as client:
        obj = upload(client, PHOTO)
        created = _process(client, obj["object_id"], ops=2)
        assert created.status_code == 202
        full = _process(client, obj["object_id"], ops=2)
        assert full.status_code == 429
        assert full.json()["error_code"] == "TOO_MANY_QUEUED_JOBS"
        assert full.headers["Retry-After"] == "5"
        assert "has 2 jobs waiting and may have at most 3" in full.json()["detail"]
        never = _process(client, obj["object_id"], ops=4)
        assert (never.status_code, never.json()["error_code"]) == (403, "QUEUE_QUOTA_TOO_SMALL")
        assert "Retry-After" not in never.headers
        job_id = created.json()["job_ids"][0]
        assert client.post(f"/v1/jobs/{job_id}:cancel").json()["status"] == "cancelled"
        assert _process(client, obj["object_id"], ops=2).status_code == 202


def test_concurrent_requests_cannot_pass_the_waiting_limit_together(quota_platform: RunningPlatform) -> None:
    account = quota_platform.admin("create-account", "--credits", "100")
    quota_platform.admin("set-quota", account["account_id"], "--max-queued-jobs", "6")
    with quota_platform.client(account) as client:
        obj = upload(client, PHOTO)
    start = threading.Barrier(16)

    def one(_: int) -> httpx.Response:
        with quota_platform.client(account) as c:
            start.wait()
            return _process(c, obj["object_id"], ops=2)

    with ThreadPoolExecutor(16) as pool:
        responses = list(pool.map(one, range(16)))
    codes = sorted(r.status_code for r in responses)
    assert codes == [202] * 3 + [429] * 13, codes
    assert {r.json()["error_code"] for r in responses if r.status_code == 429} == {"TOO_MANY_QUEUED_JOBS"}
    accepted = sum(r.json()["estimated_credits"] for r in responses if r.status_code == 202)
    with quota_platform.client(account) as client:
        assert _held(client) == pytest.approx(accepted)  # the refused ones hold nothing


def test_set_quota_refuses_what_it_cannot_set(quota_platform: RunningPlatform) -> None:
    env = {k: v for k, v in quota_platform.env.items() if k not in ("HM_DATABASE_URL", "HM_CREDITS_ADDR")}
    env["COLUMNS"] = "300"  # typer's error box keeps each message on one line

    def admin(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "hypermedia.devtools.cli", "admin", "set-quota", *args],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )

    unknown = admin("00000000-0000-4000-8000-000000000000", "--interactive")
    assert unknown.returncode == 1 and "no account 00000000-0000-4000-8000-000000000000" in unknown.stderr
    nothing = admin("00000000-0000-4000-8000-000000000000")
    assert nothing.returncode == 2 and "give --interactive/--no-interactive" in nothing.stderr
    for bad in (
        ["--rate", "inf"],
        ["--rate", "1e-300"],
        ["--max-queued-jobs", "2147483648"],
        ["--burst", "0"],
        ["--max-running-jobs", "-1"],
        ["--max-running-jobs", "100001"],
    ):
        refused = admin("00000000-0000-4000-8000-000000000000", *bad)
        assert refused.returncode == 2 and "Traceback" not in refused.stderr, (bad, refused.stderr)
    for limit in (["--rate", "5"], ["--max-running-jobs", "2"]):
        both = admin("00000000-0000-4000-8000-000000000000", "--default", *limit)
        assert both.returncode == 2 and "give no limit with it" in both.stderr
    assert admin("not-an-id", "--burst", "2").returncode == 2
    assert admin("00000000-0000-4000-8000-000000000000", "--burst", "0").returncode == 2
    account = quota_platform.admin("create-account")
    done = admin(account["account_id"], "--max-queued-jobs", "7")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "account_id": account["account_id"],
        "interactive": False,
        "max_queued_jobs": 7,
        "rate_per_second": None,
        "burst": None,
        "max_running_jobs": None,
    }
