"""Schedules end to end over REST (issue 25 items 2 and 3, ADR 0072) on the session's platform:
a process schedule's run makes its jobs, which complete; a backfill schedule's run makes a
backfill run; a maintenance schedule is an admin's and its run prunes in the reaper; every
refusal has its code; pause, resume, trigger, runs and delete as a user uses them. (Ticks and
missed ticks over time are tests/integration/test_schedules.py's, on a clock the test sets.)"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import RunningPlatform, upload, wait_for, wait_job

PHOTO = Path(__file__).resolve().parents[1] / "data" / "exif-orientation" / "Landscape_5.jpg"
NEVER = "0 0 1 1 *"
"""A cron whose next tick is next New Year: runs in these tests come from :trigger."""


def _finished_run(client: httpx.Client, name: str, run_id: str) -> dict[str, Any]:
    def finished() -> dict[str, Any] | None:
        for run in client.get(f"/v1/schedules/{name}/runs").json()["runs"]:
            if run["run_id"] == run_id and run["state"] in ("succeeded", "failed"):
                return dict(run)
        return None

    return wait_for(f"run {run_id} of {name} to finish", finished, timeout=30, interval=0.2)


def test_a_process_schedule_runs_its_request_when_triggered(client: httpx.Client) -> None:
    obj = upload(client, PHOTO)
    created = client.post(
        "/v1/schedules",
        json={
            "name": "nightly-thumbs",
            "cron": "30 2 * * *",
            "time_zone": "Europe/Berlin",
            "process": {
                "object_ids": [obj["object_id"]],
                "operations": [{"name": "thumbnail", "params": {"size": 96}}],
            },
        },
    )
    assert created.status_code == 201, created.text
    schedule = created.json()
    assert schedule["kind"] == "process" and schedule["paused"] is False and schedule["last_run"] is None
    assert schedule["next_run_at"].endswith(("T01:30:00+00:00", "T00:30:00+00:00"))  # 02:30 in Berlin

    triggered = client.post("/v1/schedules/nightly-thumbs:trigger")
    assert triggered.status_code == 202 and triggered.json()["state"] == "pending"
    run = _finished_run(client, "nightly-thumbs", triggered.json()["run_id"])

    assert run["state"] == "succeeded", run
    assert run["trigger"] == "manual" and run["outcome"]["errors"] == []
    [job_id] = run["outcome"]["job_ids"]
    job = wait_job(client, job_id)
    assert job["status"] == "completed" and job["outputs"][0]["metadata"]["width"] == 96
    listed = client.get("/v1/schedules").json()["schedules"]
    assert [(s["name"], s["last_run"]["run_id"]) for s in listed] == [("nightly-thumbs", run["run_id"])]


def test_a_run_whose_object_is_gone_fails_and_says_why(client: httpx.Client) -> None:
    obj = upload(client, PHOTO)
    client.post(
        "/v1/schedules",
        json={
            "name": "gone",
            "cron": NEVER,
            "process": {"object_ids": [obj["object_id"]], "operations": ["thumbnail"]},
        },
    ).raise_for_status()
    assert client.delete(f"/v1/objects/{obj['object_id']}").status_code == 200

    run = _finished_run(client, "gone", client.post("/v1/schedules/gone:trigger").json()["run_id"])

    assert (run["state"], run["error_code"]) == ("failed", "NOT_FOUND")
    assert run["outcome"]["errors"][0]["object_id"] == obj["object_id"]


def test_a_backfill_schedule_makes_a_backfill_run(client: httpx.Client) -> None:
    upload(client, PHOTO)
    made = client.post(
        "/v1/schedules",
        json={
            "name": "weekly-webp",
            "cron": "0 3 * * 0",
            "missed": "catch_up",
            "catch_up_limit": 2,
            "backfill": {"selector": {"operation": "thumbnail", "scope": "all"}, "max_rate_per_second": 50},
        },
    )
    assert made.status_code == 201, made.text

    run = _finished_run(
        client, "weekly-webp", client.post("/v1/schedules/weekly-webp:trigger").json()["run_id"]
    )

    assert run["state"] == "succeeded", run
    backfill = client.get(f"/v1/backfills/{run['outcome']['backfill_run_id']}").json()
    assert backfill["selector"]["operation"] == "thumbnail" and backfill["max_rate_per_second"] == 50
    assert backfill["progress"]["matched"] == run["outcome"]["items"] >= 1


def test_pause_resume_delete_and_refusals(client: httpx.Client) -> None:
    obj = upload(client, PHOTO)
    body = {
        "name": "p",
        "cron": NEVER,
        "process": {"object_ids": [obj["object_id"]], "operations": ["thumbnail"]},
    }
    assert client.post("/v1/schedules", json=body).status_code == 201
    again = client.post("/v1/schedules", json=body)
    assert again.status_code == 409 and again.json()["error_code"] == "SCHEDULE_EXISTS"

    assert client.post("/v1/schedules/p:pause").json()["paused"] is True
    assert client.get("/v1/schedules/p").json()["paused"] is True
    assert client.post("/v1/schedules/p:resume").json()["paused"] is False
    assert client.delete("/v1/schedules/p").status_code == 204
    for method, path in (
        ("GET", "/v1/schedules/p"),
        ("POST", "/v1/schedules/p:trigger"),
        ("GET", "/v1/schedules/p/runs"),
    ):
        gone = client.request(method, path)
        assert gone.status_code == 404 and gone.json()["error_code"] == "SCHEDULE_NOT_FOUND"

    refusals = [
        ({"cron": "every day"}, "INVALID_CRON"),
        ({"cron": "* * * * * *"}, "INVALID_CRON"),
        ({"time_zone": "Mars/Olympus"}, "INVALID_TIME_ZONE"),
        ({"name": "no spaces"}, "INVALID_SCHEDULE"),
        ({"catch_up_limit": 0}, "INVALID_SCHEDULE"),
        ({"process": {"object_ids": [], "operations": ["thumbnail"]}}, "INVALID_SCHEDULE"),
        ({"process": {"object_ids": [obj["object_id"]], "operations": ["sharpen"]}}, "UNKNOWN_OPERATION"),
        (
            {
                "process": {
                    "object_ids": [obj["object_id"]],
                    "operations": [{"name": "thumbnail", "params": {"size": -1}}],
                }
            },
            "INVALID_PARAMS",
        ),
        ({"backfill": {"selector": {"operation": "thumbnail"}}}, "INVALID_SCHEDULE"),  # process and backfill
        (
            {"process": None, "maintenance": {"task": "prune_job_events", "older_than_days": 30}},
            "PERMISSION_DENIED",
        ),
    ]
    for change, code in refusals:
        refused = client.post("/v1/schedules", json=body | {"name": "r"} | change)
        assert refused.json().get("error_code") == code, (change, refused.text)
        assert refused.status_code in (403, 422), refused.text
    assert client.get("/v1/schedules").json()["schedules"] == []


@pytest.fixture
def admin_client(platform: RunningPlatform) -> httpx.Client:
    account = platform.admin("create-account", "--credits", "10", "--admin")
    return platform.client(account)


def test_an_admins_maintenance_schedule_runs_in_the_reaper(admin_client: httpx.Client) -> None:
    with admin_client as client:
        made = client.post(
            "/v1/schedules",
            json={
                "name": "prune",
                "cron": "15 4 * * *",
                "maintenance": {"task": "prune_job_events", "older_than_days": 3650},
            },
        )
        assert made.status_code == 201, made.text
        started = time.monotonic()

        run = _finished_run(client, "prune", client.post("/v1/schedules/prune:trigger").json()["run_id"])

        assert run["state"] == "succeeded", run
        assert run["outcome"] == {"deleted": {}}  # nothing is ten years old
        assert time.monotonic() - started < 10
        refused = client.post(
            "/v1/schedules",
            json={"name": "bad", "cron": "@daily", "maintenance": {"task": "drop_tables"}},
        )
        assert refused.status_code == 422 and refused.json()["error_code"] == "INVALID_SCHEDULE"
