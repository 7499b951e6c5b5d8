"""The scheduler consumer end to end (issue 25 item 3, ADR 0073) on the session's platform, whose
imageworker has 4 ordinary slots and, beside them, its one-slot scheduler consumer: a schedule's
jobs run on that slot only (queue ``sched.images``, the consumer's worker id), one at a time
however many ordinary slots are free; they run while every ordinary slot is busy; and ordinary
jobs keep running in the ordinary slots while scheduled work runs.

The slow jobs are real work: ``compress`` of a 1500 px Perlin-noise PNG (about 2.5 s of libvips
and libimagequant, :mod:`tests.e2e.slowjob`)."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import upload, wait_for, wait_job
from tests.e2e.slowjob import make_slow_png

PHOTO = Path(__file__).resolve().parents[1] / "data" / "exif-orientation" / "Landscape_5.jpg"
NEVER = "0 0 1 1 *"
"""A cron whose next tick is next New Year: runs in these tests come from :trigger."""
ORDINARY_SLOTS = 4
"""The session platform's imageworker slots (``HM_WORKER_SLOTS``' default)."""


def _time(value: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(value)


def _process(client: httpx.Client, object_id: str, operation: str) -> str:
    response = client.post("/v1/hypermedia/process", json={"object_id": object_id, "operations": [operation]})
    assert response.status_code == 202, response.text
    return str(response.json()["job_ids"][0])


def _scheduled_jobs(client: httpx.Client, name: str, object_ids: list[str], operation: str) -> list[str]:
    """Create a process schedule of ``operation`` on the objects, trigger it, and return its run's
    job ids once the run has made them."""
    client.post(
        "/v1/schedules",
        json={
            "name": name,
            "cron": NEVER,
            "process": {"object_ids": object_ids, "operations": [operation]},
        },
    ).raise_for_status()
    run_id = client.post(f"/v1/schedules/{name}:trigger").json()["run_id"]

    def made() -> list[str] | None:
        for run in client.get(f"/v1/schedules/{name}/runs").json()["runs"]:
            if run["run_id"] == run_id and run["state"] == "succeeded":
                return list(run["outcome"]["job_ids"])
            assert run["state"] != "failed", run
        return None

    return wait_for(f"run of {name}", made, timeout=30, interval=0.1)


@pytest.fixture(scope="module")
def slow_png(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_slow_png(tmp_path_factory.mktemp("slow") / "perlin-1500.png", 1500)


def test_scheduled_work_runs_on_its_own_slot_while_every_ordinary_slot_is_busy(
    client: httpx.Client, slow_png: Path
) -> None:
    """Four slow ordinary jobs take the four ordinary slots; a schedule's thumbnail still runs,
    on the scheduler consumer, and is done before any of them."""
    ordinary = [
        _process(client, upload(client, slow_png)["object_id"], "compress") for _ in range(ORDINARY_SLOTS)
    ]
    wait_for(
        "every ordinary slot busy",
        lambda: all(client.get(f"/v1/jobs/{j}").json()["status"] == "processing" for j in ordinary),
        timeout=30,
    )
    [scheduled] = _scheduled_jobs(client, "while-busy", [upload(client, PHOTO)["object_id"]], "thumbnail")

    done = wait_job(client, scheduled)
    assert done["status"] == "completed" and done["queue"] == "sched.images", done
    [attempt] = done["attempts"]
    assert attempt["worker_id"].endswith("/sched"), attempt
    slow = [wait_job(client, j) for j in ordinary]
    assert all(j["status"] == "completed" and j["queue"] == "images" for j in slow)
    assert all(not j["attempts"][0]["worker_id"].endswith("/sched") for j in slow)
    assert _time(done["completed_at"]) < min(_time(j["completed_at"]) for j in slow)


def test_scheduled_jobs_take_one_slot_and_ordinary_jobs_keep_theirs(
    client: httpx.Client, slow_png: Path
) -> None:
    """A schedule of two slow jobs: they run one after the other on the consumer's slot, never on
    the four free ordinary slots; ordinary thumbnails submitted meanwhile run at once in those."""
    objects = [upload(client, slow_png)["object_id"] for _ in range(2)]
    photo = upload(client, PHOTO)["object_id"]
    first, second = _scheduled_jobs(client, "two-slow", objects, "compress")
    wait_for(
        "the first scheduled job running",
        lambda: client.get(f"/v1/jobs/{first}").json()["status"] == "processing",
        30,
    )
    thumbnails = [_process(client, photo, "thumbnail") for _ in range(3)]

    quick = [wait_job(client, j) for j in thumbnails]
    one, two = (wait_job(client, j) for j in (first, second))
    assert [j["status"] for j in (*quick, one, two)] == ["completed"] * 5
    assert {j["queue"] for j in (one, two)} == {"sched.images"}
    assert {j["attempts"][0]["worker_id"] for j in (one, two)} == {one["attempts"][0]["worker_id"]}
    assert one["attempts"][0]["worker_id"].endswith("/sched")
    # One slot: the second started after the first ended, though ordinary slots were free.
    assert _time(two["attempts"][0]["started_at"]) >= _time(one["attempts"][0]["finished_at"])
    # The ordinary jobs did not wait behind scheduled work.
    assert max(_time(j["completed_at"]) for j in quick) < _time(two["completed_at"])
    assert all(not j["attempts"][0]["worker_id"].endswith("/sched") for j in quick)


def test_a_runs_idempotency_key_taken_first_by_the_caller_never_makes_its_jobs_ordinary(
    client: httpx.Client,
) -> None:
    """A run's requests carry the key ``schedule:{run_id}:{n}``, which the caller can read: the
    same body sent first under that key is another request (the run's go to the sched lane), so
    whichever comes second is refused 409 and no job of the run is on an ordinary lane."""
    photo = upload(client, PHOTO)["object_id"]
    client.post(
        "/v1/schedules",
        json={
            "name": "raced",
            "cron": NEVER,
            "process": {"object_ids": [photo], "operations": ["thumbnail"]},
        },
    ).raise_for_status()
    run_id = client.post("/v1/schedules/raced:trigger").json()["run_id"]
    mine = client.post(
        "/v1/hypermedia/process",
        json={"object_id": photo, "operations": ["thumbnail"]},
        headers={"Idempotency-Key": f"schedule:{run_id}:0"},
    )

    def finished() -> dict[str, Any] | None:
        runs = client.get("/v1/schedules/raced/runs").json()["runs"]
        return next(
            (r for r in runs if r["run_id"] == run_id and r["state"] in ("succeeded", "failed")), None
        )

    run = wait_for("the run", finished, timeout=30, interval=0.1)
    if mine.status_code == 202:  # the caller was first: the run's request is refused
        assert run["state"] == "failed" and run["error_code"] == "IDEMPOTENCY_KEY_REUSED", run
        assert wait_job(client, mine.json()["job_ids"][0])["queue"] == "images"
    else:  # the run was first
        assert (mine.status_code, mine.json()["error_code"]) == (409, "IDEMPOTENCY_KEY_REUSED"), mine.text
    assert all(wait_job(client, j)["queue"] == "sched.images" for j in run["outcome"].get("job_ids", []))
