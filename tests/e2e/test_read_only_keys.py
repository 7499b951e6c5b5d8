"""Read-only API keys (issue 22 item 6, migration 0034): ``hypermedia admin create-key
--read-only`` gives a key that reads the account over REST, gRPC and the dashboard and changes
nothing (403 / PERMISSION_DENIED ``READ_ONLY_KEY``, before an upload's body is read); an
estimate, which creates nothing, is allowed; ``revoke-key`` ends a key."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from selenium.webdriver.common.by import By

from hypermedia.api.jobs.v1 import jobs_pb2, jobs_pb2_grpc
from tests.e2e.browser import open_browser, sign_in
from tests.e2e.conftest import REPO, RunningPlatform, upload, wait_job

PHOTO = Path(__file__).resolve().parents[1] / "data" / "exif-orientation" / "Landscape_2.jpg"


def test_a_read_only_key_reads_everything_and_changes_nothing(platform: RunningPlatform) -> None:
    owner: dict[str, Any] = platform.admin("create-account", "--credits", "10")
    with platform.client(owner) as client:
        photo = upload(client, PHOTO)
        done = client.post(
            "/v1/hypermedia/process", json={"object_id": photo["object_id"], "operations": ["thumbnail"]}
        )
        job = wait_job(client, done.json()["job_ids"][0])
    viewer = platform.admin("create-key", owner["account_id"], "--read-only")
    assert viewer["read_only"] is True and viewer["account_id"] == owner["account_id"]

    with platform.client(viewer) as reader:
        assert reader.get(f"/v1/jobs/{job['job_id']}").json()["status"] == "completed"
        assert [
            o["object_id"] for o in reader.get("/v1/objects", params={"kind": "original"}).json()["objects"]
        ] == [photo["object_id"]]
        # Its holder must not be able to sign webhooks as the platform: no secret for it.
        assert reader.get("/v1/account").json()["webhook_secret"] is None
        estimate = reader.post(
            "/v1/hypermedia/estimate", json={"object_id": photo["object_id"], "operations": ["thumbnail"]}
        )
        assert estimate.status_code == 200, estimate.text
        refused = [
            reader.post(
                "/v1/hypermedia/process", json={"object_id": photo["object_id"], "operations": ["thumbnail"]}
            ),
            reader.post("/v1/objects", files={"file": ("x.jpg", PHOTO.read_bytes())}),
            reader.delete(f"/v1/objects/{photo['object_id']}"),
            reader.post(f"/v1/jobs/{job['job_id']}:cancel"),
            reader.put("/v1/presets/mine", json={"operation": "thumbnail", "params": {"size": 64}}),
            reader.post(
                "/v1/schedules",
                json={
                    "name": "x",
                    "cron": "@daily",
                    "process": {"object_ids": [photo["object_id"]], "operations": ["thumbnail"]},
                },
            ),
        ]
        assert [(r.status_code, r.json()["error_code"]) for r in refused] == [(403, "READ_ONLY_KEY")] * 6
    with platform.client(owner) as client:
        assert client.get("/v1/account").json()["webhook_secret"].startswith("whsec_")
        assert client.get(f"/v1/objects/{photo['object_id']}").status_code == 200  # nothing was deleted
        assert (
            client.get("/v1/presets").json()["presets"] == []
            and client.get("/v1/schedules").json()["schedules"] == []
        )

    metadata = (("authorization", f"Bearer {viewer['api_key']}"),)
    with grpc.insecure_channel(platform.grpc_addr) as channel:
        stub = jobs_pb2_grpc.JobServiceStub(channel)
        assert (
            stub.GetJob(jobs_pb2.GetJobRequest(job_id=job["job_id"]), metadata=metadata).job.job_id
            == job["job_id"]
        )
        with pytest.raises(grpc.RpcError) as denied:
            stub.CancelJob(jobs_pb2.CancelJobRequest(job_id=job["job_id"]), metadata=metadata)
        assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "read-only" in (denied.value.details() or "")

    # The dashboard: the key signs in, marked read-only, and a job page offers neither Cancel nor Run again.
    with open_browser() as browser:
        sign_in(browser, platform.rest_url, viewer["api_key"])
        assert browser.find_element(By.ID, "read-only").text == "read-only key"
        browser.get(f"{platform.rest_url}/dashboard/jobs/{job['job_id']}")
        assert browser.find_elements(By.ID, "retry") == [] and browser.find_elements(By.ID, "cancel") == []
        # A form posted anyway (the page has none) says why, before its token is even looked at.
        posted = browser.execute_script(
            "return fetch(arguments[0], {method: 'POST', body: new URLSearchParams({csrf: 'x'})})"
            ".then(r => r.status + ' ' + r.statusText).then(s => s)",
            f"/dashboard/jobs/{job['job_id']}/retry",
        )
        assert posted.startswith("403"), posted
        assert "read-only" in browser.execute_script(
            "return fetch(arguments[0], {method: 'POST', body: new URLSearchParams({csrf: 'x'})}).then(r => r.text())",
            f"/dashboard/jobs/{job['job_id']}/retry",
        )

    revoked = platform.admin("revoke-key", viewer["key_id"])
    assert revoked == {"key_id": viewer["key_id"], "revoked": True}
    with platform.client(viewer) as reader:
        assert reader.get("/v1/account").status_code == 401
    again = subprocess.run(
        [sys.executable, "-m", "hypermedia.devtools.cli", "admin", "revoke-key", viewer["key_id"]],
        env={k: v for k, v in platform.env.items() if k not in ("HM_DATABASE_URL", "HM_CREDITS_ADDR")},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert again.returncode == 1 and "NOT_FOUND" in again.stderr


def test_a_revoked_keys_event_stream_ends_at_its_next_keep_alive(platform: RunningPlatform) -> None:
    """A stream opened before the revocation (SSE here; gRPC ``WatchJob`` checks the same way)
    ends at its next keep-alive (15 s), not at its job's end up to 30 days later."""
    owner: dict[str, Any] = platform.admin("create-account", "--credits", "10")
    with platform.client(owner) as client:
        photo = upload(client, PHOTO)
        delayed = client.post(
            "/v1/hypermedia/process",
            json={"object_id": photo["object_id"], "operations": ["thumbnail"], "delay_seconds": 3600},
        ).json()["job_ids"][0]
    watcher = platform.admin("create-key", owner["account_id"], "--read-only")
    headers = {"Authorization": f"Bearer {watcher['api_key']}"}
    with httpx.stream(
        "GET", f"{platform.rest_url}/v1/jobs/{delayed}/events", headers=headers, timeout=30
    ) as stream:
        lines = stream.iter_lines()
        assert next(lines).startswith("id: ")  # the job's history comes first
        platform.admin("revoke-key", watcher["key_id"])
        revoked = time.monotonic()
        for _line in lines:
            assert time.monotonic() - revoked < 25, "the stream outlived the revocation"
        assert time.monotonic() - revoked < 25
    with platform.client(owner) as client:
        assert client.post(f"/v1/jobs/{delayed}:cancel").json()["status"] == "cancelled"
