"""Backfill runs end to end (issue 21 item 2, ADR 0058), through REST and gRPC with real
imageworkers: ``hypermedia up``'s imageworker runs the interactive thumbnails and its bulkworker
(``bulk.images``) the run's. One platform on a database of its own serves the module: the runs'
profile versions and the brake's queued document job must not reach other modules' platforms."""

from __future__ import annotations

import datetime
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import psycopg
import pytest
import pyvips
from google.protobuf import struct_pb2

from hypermedia.api.jobs.v1 import backfill_pb2, backfill_pb2_grpc
from tests.e2e.conftest import RunningPlatform, isolated_platform, wait_for, wait_job

PDF = Path(__file__).resolve().parents[1] / "data" / "pdf" / "minimal-document.pdf"
RATE = 40.0
"""The big run's rate (jobs a second)."""


@pytest.fixture(scope="module")
def running(tmp_root: Any, database_url: str, nats_url: str) -> Iterator[RunningPlatform]:
    with isolated_platform(
        tmp_root,
        database_url,
        nats_url,
        "backfill",
        services="credits,storage,gateway,imageworker,bulkworker,reaper",
        HM_BACKFILL_BRAKE="images=5,documents=1",
    ) as platform:
        yield platform


@pytest.fixture
def pg(running: RunningPlatform) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(running.env["HM_DATABASE_URL"], autocommit=True) as conn:
        yield conn


def _account(running: RunningPlatform, credits: str = "2000", *quota: str) -> dict[str, Any]:
    account = running.admin("create-account", "--credits", credits)
    running.admin("set-quota", account["account_id"], *(quota or ("--rate", "1000", "--burst", "1000")))
    return account


def _jpegs(client: httpx.Client, count: int) -> list[str]:
    """Uploads ``count`` distinct small JPEGs; their object ids in upload order."""
    ids = []
    for i in range(count):
        image = (pyvips.Image.black(64, 48) + (i % 250)).cast("uchar")
        response = client.post("/v1/objects", files={"file": (f"p{i}.jpg", image.jpegsave_buffer())})
        assert response.status_code == 201, response.text
        ids.append(response.json()["object_id"])
    return ids


def _thumbnails(client: httpx.Client, pg: psycopg.Connection[Any], ids: list[str]) -> list[str]:
    """An interactive thumbnail of each object, waited for; the job ids."""
    jobs = []
    for object_id in ids:
        made = client.post(
            "/v1/hypermedia/process", json={"object_id": object_id, "operations": ["thumbnail"]}
        )
        assert made.status_code == 202, made.text
        jobs.extend(made.json()["job_ids"])
    wait_for(
        "the thumbnails completed",
        lambda: (
            pg.execute(
                "SELECT count(*) FROM processing_jobs WHERE job_id = ANY(%s::uuid[]) AND status = 'completed'",
                (jobs,),
            ).fetchone()[0]  # type: ignore[index]
            == len(jobs)
        ),
        timeout=180,
        interval=0.5,
    )
    return jobs


def _create(client: httpx.Client, selector: dict[str, Any], **body: Any) -> httpx.Response:
    return client.post("/v1/backfills", json={"selector": selector, **body})


def _wait_state(client: httpx.Client, run_id: str, *states: str, timeout: float = 120) -> dict[str, Any]:
    return wait_for(
        f"run {run_id} {'/'.join(states)}",
        lambda: (run := client.get(f"/v1/backfills/{run_id}").json())["state"] in states and run,
        timeout=timeout,
        interval=0.2,
    )


def _run_jobs(pg: psycopg.Connection[Any], run_id: str) -> list[tuple[Any, ...]]:
    """(job id, object id, status, queue, priority, profile version, created_at) of the run's jobs."""
    return pg.execute(
        """SELECT j.job_id::text, j.object_id::text, j.status, j.queue, j.priority, j.profile_version, j.created_at
           FROM backfill_items i JOIN processing_jobs j ON j.job_id = i.job_id
           WHERE i.run_id = %s AND i.state = 'enqueued' ORDER BY j.created_at""",
        (run_id,),
    ).fetchall()


def test_a_run_regenerates_exactly_the_outdated_thumbnails_at_its_rate_once_each(
    running: RunningPlatform, pg: psycopg.Connection[Any]
) -> None:
    """300 objects with v1 thumbnails, a new profile version, 10 of them made again under it: the
    dry run and the run match the other 290; the run regenerates those on the bulk lane at its
    rate, one output and one charge per job, while an interactive thumbnail starts within its
    target; then nothing is outdated, and a repeated run enqueues nothing."""
    account = _account(running)
    with running.client(account) as client:
        ids = _jpegs(client, 300)
        _thumbnails(client, pg, ids)
        version = running.admin("profile-version", "thumbnail")["version"]
        _thumbnails(client, pg, ids[:10])
        outdated = set(ids[10:])
        selector = {"operation": "thumbnail"}

        dry = _create(client, selector, max_rate_per_second=RATE, dry_run=True)
        assert dry.status_code == 200, dry.text
        estimate = dry.json()
        assert (estimate["matched"], estimate["existing"], estimate["to_enqueue"]) == (290, 0, 290)
        assert estimate["target_version"] == version
        assert estimate["estimated_seconds"] == pytest.approx(290 / RATE, abs=0.01)
        assert estimate["available_credits"] == pytest.approx(
            float(client.get("/v1/credits").json()["available"])
        )
        assert client.get("/v1/backfills").json()["runs"] == []  # a dry run keeps nothing

        created = _create(client, selector, max_rate_per_second=RATE)
        assert created.status_code == 201, created.text
        run = created.json()
        assert (run["state"], run["priority"], run["progress"]["matched"]) == ("running", 8, 290)
        assert (run["planned_credits"], run["estimated_credits"]) == (estimate["estimated_credits"], 0)

        # An interactive thumbnail made while the run enqueues starts within the images target (5 s).
        time.sleep(1.0)
        interactive = client.post(
            "/v1/hypermedia/process", json={"object_id": ids[0], "operations": ["thumbnail"], "priority": 4}
        ).json()["job_ids"][0]
        done = wait_job(client, interactive)
        started = datetime.datetime.fromisoformat(done["started_at"])
        assert started - datetime.datetime.fromisoformat(done["created_at"]) < datetime.timedelta(seconds=5)
        assert (
            client.get(f"/v1/backfills/{run['run_id']}").json()["progress"]["pending"] > 0
        )  # bulk still waits

        finished = _wait_state(client, run["run_id"], "completed", timeout=240)
    progress = finished["progress"]
    assert progress == {
        "matched": 290, "pending": 0, "enqueued": 290, "existing": 0, "skipped": 0,
        "in_flight": 0, "completed": 290, "failed": 0, "cancelled": 0,
    }  # fmt: skip
    assert finished["estimated_credits"] == estimate["estimated_credits"]
    assert finished["charged_credits"] == pytest.approx(estimate["estimated_credits"])

    jobs = _run_jobs(pg, run["run_id"])
    assert {j[1] for j in jobs} == outdated and len(jobs) == 290  # exactly the outdated ones, once
    assert {(j[2], j[3], j[4], j[5]) for j in jobs} == {("completed", "bulk.images", 8, version)}
    job_ids = [j[0] for j in jobs]
    outputs = pg.execute(
        "SELECT job_id, count(*) FROM job_outputs WHERE job_id = ANY(%s::uuid[]) GROUP BY job_id", (job_ids,)
    ).fetchall()
    assert len(outputs) == 290 and {n for _, n in outputs} == {1}
    charges = pg.execute(
        "SELECT job_id, count(*) FROM credit_ledger WHERE kind = 'commit' AND line = 'base'"
        " AND job_id = ANY(%s::uuid[])"
        " GROUP BY job_id",
        (job_ids,),
    ).fetchall()
    assert len(charges) == 290 and {n for _, n in charges} == {1}
    # Paced: the bucket lets one second of rate through at once, then RATE jobs a second.
    span = (jobs[-1][6] - jobs[0][6]).total_seconds()
    assert span >= (290 - RATE) / RATE * 0.9, span
    lanes = pg.execute(
        "SELECT DISTINCT w.queue FROM job_attempts a JOIN workers w ON w.worker_id = a.worker_id"
        " WHERE a.job_id = ANY(%s::uuid[])",
        (job_ids,),
    ).fetchall()
    assert lanes == [("bulk.images",)]
    assert running.admin("outdated", "--operation", "thumbnail", "--account", account["account_id"]) == {
        "outputs": []
    }

    with running.client(account) as client:
        # The run's items, paged, name exactly its jobs.
        listed, after = [], 0
        while after is not None:
            page = client.get(  # an empty state is every state (the docs' example sends one)
                f"/v1/backfills/{run['run_id']}/items", params={"state": "", "after": after, "limit": 100}
            ).json()
            listed += page["items"]
            after = page["next_after"]
        assert [i["item_no"] for i in listed] == list(range(1, 291))
        assert {(i["job_id"], i["object_id"]) for i in listed} == {(j[0], j[1]) for j in jobs}
        assert {(i["state"], i["job_status"]) for i in listed} == {("enqueued", "completed")}
        skipped = client.get(f"/v1/backfills/{run['run_id']}/items", params={"state": "skipped"}).json()
        assert skipped == {"items": [], "next_after": None}
        # Scope all counts the originals the account uploaded, not the thumbnails made of them.
        every = _create(client, {"operation": "thumbnail", "scope": "all"}, dry_run=True).json()
        assert every["matched"] == 300
        again = _create(client, selector).json()
        assert again["progress"]["matched"] == 0
        assert _wait_state(client, again["run_id"], "completed")["progress"]["enqueued"] == 0
        # Every object again, with the params the run used: each key has its job already.
        params = pg.execute("SELECT params FROM processing_jobs WHERE job_id = %s", (job_ids[0],)).fetchone()[
            0
        ]  # type: ignore[index]
        every = {
            "operation": "thumbnail",
            "params": params,
            "scope": "all",
            "object_ids": sorted(outdated)[:5],
        }
        dry_again = _create(client, every, dry_run=True).json()
        assert (dry_again["matched"], dry_again["existing"], dry_again["to_enqueue"]) == (5, 5, 0)
        assert dry_again["estimated_credits"] == 0
        repeated = _wait_state(client, _create(client, every, priority=9).json()["run_id"], "completed")
        assert (repeated["progress"]["existing"], repeated["progress"]["enqueued"]) == (5, 0)
    assert len(_run_jobs(pg, repeated["run_id"])) == 0


def test_the_brake_holds_bulk_dispatch_while_an_interactive_queue_is_behind(
    running: RunningPlatform, pg: psycopg.Connection[Any]
) -> None:
    """A document job waits on ``documents`` (no docworker here) longer than its 1 s target: a run
    enqueues nothing and says why; once that job is cancelled, the run goes on."""
    account = _account(running)
    with running.client(account) as client:
        ids = _jpegs(client, 3)
        pdf = client.post("/v1/objects", files={"file": ("a.pdf", PDF.read_bytes())})
        assert pdf.status_code == 201, pdf.text
        waiting = client.post(
            "/v1/hypermedia/process", json={"object_id": pdf.json()["object_id"], "operations": ["pdf_info"]}
        ).json()["job_ids"][0]
        time.sleep(1.5)
        run = _create(client, {"operation": "thumbnail", "scope": "all", "object_ids": ids}).json()
        held = wait_for(
            "the brake named",
            lambda: (r := client.get(f"/v1/backfills/{run['run_id']}").json())["waiting_reason"] and r,
            timeout=10,
        )
        assert "BRAKE" in held["waiting_reason"] and "documents" in held["waiting_reason"], held
        time.sleep(1.5)
        still = client.get(f"/v1/backfills/{run['run_id']}").json()
        assert (still["state"], still["progress"]["enqueued"], still["progress"]["pending"]) == (
            "running",
            0,
            3,
        )
        assert still["braked_seconds"] > 1.0
        assert client.post(f"/v1/jobs/{waiting}:cancel").status_code == 200
        done = _wait_state(client, run["run_id"], "completed", timeout=60)
    assert (done["progress"]["completed"], done["waiting_reason"]) == (3, None)


def test_pause_resume_and_cancel_and_a_run_takes_no_token_of_the_account_rate(
    running: RunningPlatform, pg: psycopg.Connection[Any]
) -> None:
    """A run of 12 at 2 jobs a second for an account whose requests are limited to one every two
    seconds: paused, it enqueues nothing; resumed, it goes on without a RATE_LIMITED wait;
    cancelled, its jobs that had not started are cancelled and the rest never enqueued."""
    account = _account(running, "100", "--rate", "0.5", "--burst", "1")
    with running.client(account) as client:
        ids = _jpegs(client, 12)
        run = _create(
            client, {"operation": "thumbnail", "scope": "all", "object_ids": ids}, max_rate_per_second=2
        )
        run_id = run.json()["run_id"]
        wait_for(
            "one enqueued", lambda: client.get(f"/v1/backfills/{run_id}").json()["progress"]["enqueued"], 20
        )
        paused = client.post(f"/v1/backfills/{run_id}:pause")
        assert (paused.status_code, paused.json()["state"], paused.json()["reason_code"]) == (
            200,
            "paused",
            "PAUSED",
        )
        time.sleep(1)  # a tick under way finishes the item it is enqueuing, then stops
        at_pause = client.get(f"/v1/backfills/{run_id}").json()["progress"]["enqueued"]
        time.sleep(2)
        assert client.get(f"/v1/backfills/{run_id}").json()["progress"]["enqueued"] == at_pause
        assert client.post(f"/v1/backfills/{run_id}:pause").json()["state"] == "paused"  # no change, no error
        # The account's own requests: one token in its bucket, then 429.
        statuses = [
            client.post(
                "/v1/hypermedia/process", json={"object_id": ids[0], "operations": ["thumbnail"]}
            ).status_code
            for _ in range(2)
        ]
        assert statuses == [202, 429]

        assert client.post(f"/v1/backfills/{run_id}:resume").json()["state"] == "running"
        assert client.post(f"/v1/backfills/{run_id}:resume").json()["state"] == "running"  # no change
        seen: list[str] = []

        def moved() -> bool:
            run = client.get(f"/v1/backfills/{run_id}").json()
            seen.append(run["waiting_reason"] or "")
            return bool(run["progress"]["enqueued"] >= at_pause + 3)

        wait_for("three more enqueued", moved, timeout=30)
        assert not any("RATE_LIMITED" in s for s in seen), seen
        cancelled = client.post(f"/v1/backfills/{run_id}:cancel")
        assert (cancelled.status_code, cancelled.json()["state"]) == (200, "cancelled")
        time.sleep(1)  # as for the pause: a job made by a tick under way is cancelled by it
        left = client.get(f"/v1/backfills/{run_id}").json()["progress"]["pending"]
        assert left > 0
        time.sleep(1.5)
        after = client.get(f"/v1/backfills/{run_id}").json()
        assert (after["state"], after["progress"]["pending"]) == ("cancelled", left)
        assert wait_for(
            "the run's jobs ended",
            lambda: all(j[2] in ("completed", "cancelled") for j in _run_jobs(pg, run_id)),
            timeout=30,
        )
        resumed = client.post(f"/v1/backfills/{run_id}:resume")
        assert (resumed.status_code, resumed.json()["error_code"]) == (409, "RUN_NOT_RESUMABLE")
        assert client.post(f"/v1/backfills/{run_id}:cancel").json()["state"] == "cancelled"
        assert wait_for(
            "the holds released",
            lambda: float(client.get("/v1/credits").json()["held"]) == 0.0,
            timeout=30,
        )


def test_a_run_short_of_credits_pauses_and_one_that_cannot_start_is_402(running: RunningPlatform) -> None:
    account = _account(running, "3")
    with running.client(account) as client:
        ids = _jpegs(client, 5)
        run_id = _create(client, {"operation": "thumbnail", "scope": "all", "object_ids": ids}).json()[
            "run_id"
        ]
        paused = _wait_state(client, run_id, "paused", timeout=30)
        assert paused["reason_code"] == "INSUFFICIENT_CREDITS" and "credits" in paused["reason"], paused
        assert paused["progress"]["enqueued"] == 2  # a thumbnail of these costs 1.0x credits
        running.admin("grant", account["account_id"], "--credits", "10")
        assert client.post(f"/v1/backfills/{run_id}:resume").json()["state"] == "running"
        done = _wait_state(client, run_id, "completed", timeout=60)
        assert (done["progress"]["enqueued"], done["progress"]["completed"]) == (5, 5)

    poor = _account(running, "0.5")
    with running.client(poor) as client:
        ids = _jpegs(client, 1)
        refused = _create(client, {"operation": "thumbnail", "scope": "all"})
        assert (refused.status_code, refused.json()["error_code"]) == (402, "INSUFFICIENT_CREDITS"), (
            refused.text
        )
        assert client.get("/v1/backfills").json()["runs"] == []


def test_replay_enqueues_the_failed_items_again_under_new_keys(
    running: RunningPlatform, pg: psycopg.Connection[Any]
) -> None:
    """A profile version that allows 16 pixels fails every thumbnail (INPUT_TOO_LARGE_PIXELS, no
    retry); after a version that allows them again, replaying the run's failures completes them."""
    account = _account(running)
    with running.client(account) as client:
        ids = _jpegs(client, 3)
        running.admin("profile-version", "thumbnail", "--set", "max_pixels=16")
        try:
            run_id = _create(client, {"operation": "thumbnail", "scope": "all", "object_ids": ids}).json()[
                "run_id"
            ]
            failed = _wait_state(client, run_id, "completed", timeout=60)
        finally:
            running.admin("profile-version", "thumbnail", "--set", "max_pixels=100000000")
        assert (failed["progress"]["failed"], failed["progress"]["completed"]) == (3, 0), failed
        first = {j[0] for j in _run_jobs(pg, run_id)}
        replay = client.post(f"/v1/backfills/{run_id}:replay")
        assert (replay.status_code, replay.json()["replayed"]) == (200, 3), replay.text
        assert replay.json()["run"]["state"] == "running"
        done = _wait_state(client, run_id, "completed", timeout=60)
        assert (done["progress"]["completed"], done["progress"]["failed"], done["progress"]["enqueued"]) == (
            3,
            0,
            3,
        )
        assert not first & {j[0] for j in _run_jobs(pg, run_id)}  # new jobs
        assert client.post(f"/v1/backfills/{run_id}:replay").json()["replayed"] == 0
    keys = pg.execute(
        "SELECT idempotency_key FROM processing_jobs WHERE job_id = ANY(%s::uuid[])",
        ([j[0] for j in _run_jobs(pg, run_id)],),
    ).fetchall()
    assert all(k.startswith("backfill:") and k.endswith(":replay1") for (k,) in keys), keys


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"selector": {}}, 422, "INVALID_SELECTOR"),
        ({"selector": {"operation": "thumbnail", "preset": "avatar"}}, 422, "INVALID_SELECTOR"),
        ({"selector": {"operation": "nope"}}, 422, "UNKNOWN_OPERATION"),
        ({"selector": {"preset": "nope"}}, 422, "UNKNOWN_PRESET"),
        ({"selector": {"operation": "thumbnail", "params": {"size": -3}}}, 422, "INVALID_PARAMS"),
        ({"selector": {"operation": "thumbnail", "object_ids": ["x"]}}, 422, "INVALID_SELECTOR"),
        ({"selector": {"operation": "thumbnail", "created_after": "2026-01-01T00:00:00"}}, 422, "INVALID_REQUEST"),
        (
            {"selector": {"operation": "thumbnail", "created_after": "2026-02-01T00:00:00Z",
                          "created_before": "2026-01-01T00:00:00Z"}},
            422,
            "INVALID_SELECTOR",
        ),
        ({"selector": {"operation": "thumbnail"}, "priority": 3}, 422, "INVALID_PRIORITY"),
        ({"selector": {"operation": "thumbnail"}, "max_rate_per_second": 0}, 422, "INVALID_RATE"),
        ({"selector": {"operation": "thumbnail"}, "max_rate_per_second": 1e308}, 422, "INVALID_RATE"),
        ({"selector": {"operation": "thumbnail"}, "deadline": "2020-01-01T00:00:00Z"}, 422, "INVALID_DEADLINE"),
        ({"selector": {"operation": "thumbnail", "scope": "some"}}, 422, "INVALID_REQUEST"),
        # From a hostile review: each of these was a 500 or a misleading code.
        ({"selector": {"preset": "a\u0000b"}}, 422, "INVALID_REQUEST"),
        ({"selector": {"preset": "\ud800"}}, 422, "INVALID_REQUEST"),
        ({"selector": {"preset": "Not A Name"}}, 422, "UNKNOWN_PRESET"),
        ({"selector": {"operation": "thumbnail", "params": {"\ud800": 1}}}, 422, "INVALID_REQUEST"),
        ({"selector": {"operation": "thumbnail", "created_after": "0001-01-01T00:00:00+01:00"}}, 422, "INVALID_REQUEST"),
        ({"selector": {"operation": "thumbnail"}, "deadline": "9999-12-31T23:59:59-12:00"}, 422, "INVALID_REQUEST"),
        ({"selector": {"operation": "thumbnail", "object_ids": []}}, 422, "INVALID_SELECTOR"),
        ({"selector": {"operation": "thumbnail", "params": {"password": "x"}}}, 422, "INVALID_PARAMS"),
    ],
)  # fmt: skip
def test_a_bad_run_request_is_refused_with_its_code_and_creates_nothing(
    running: RunningPlatform, body: dict[str, Any], status: int, code: str
) -> None:
    account = _account(running, "10")
    with running.client(account) as client:
        # Escaped JSON (httpx would encode a lone surrogate as UTF-8, which cannot be done).
        refused = client.post(
            "/v1/backfills", content=json.dumps(body), headers={"Content-Type": "application/json"}
        )
        assert (refused.status_code, refused.json()["error_code"]) == (status, code), refused.text
        assert client.get("/v1/backfills").json()["runs"] == []
        for path in ("/v1/backfills/00000000-0000-4000-8000-000000000000", "/v1/backfills/not-an-id"):
            missing = client.get(path)
            assert (missing.status_code, missing.json()["error_code"]) == (404, "RUN_NOT_FOUND")
        malformed = client.post("/v1/backfills/..:pause")
        assert (malformed.status_code, malformed.json()["error_code"]) == (404, "RUN_NOT_FOUND")


def test_runs_over_grpc_and_another_accounts_run_is_not_found(running: RunningPlatform) -> None:
    account, stranger = _account(running), _account(running)
    with running.client(account) as client:
        ids = _jpegs(client, 2)
    metadata = (("authorization", f"Bearer {account['api_key']}"),)
    selector = backfill_pb2.BackfillSelector(
        operation="thumbnail",
        params=struct_pb2.Struct(fields={"size": struct_pb2.Value(number_value=64)}),
        scope=backfill_pb2.BACKFILL_SCOPE_ALL,
        object_ids=ids,
    )
    with grpc.insecure_channel(running.grpc_addr) as chan:
        stub = backfill_pb2_grpc.BackfillServiceStub(chan)
        dry = stub.CreateBackfillRun(
            backfill_pb2.CreateBackfillRunRequest(selector=selector, dry_run=True), metadata=metadata
        )
        assert not dry.HasField("run") and (dry.estimate.matched, dry.estimate.to_enqueue) == (2, 2)
        made = stub.CreateBackfillRun(
            backfill_pb2.CreateBackfillRunRequest(selector=selector, priority=10, max_rate_per_second=5),
            metadata=metadata,
        ).run
        assert (made.state, made.priority, made.selector.params["size"]) == ("running", 10, 64)
        assert made.selector.scope == backfill_pb2.BACKFILL_SCOPE_ALL
        done = wait_for(
            "the run completed",
            lambda: (
                (
                    r := stub.GetBackfillRun(
                        backfill_pb2.GetBackfillRunRequest(run_id=made.run_id), metadata=metadata
                    ).run
                ).state
                == "completed"
                and r
            ),
            timeout=60,
            interval=0.2,
        )
        assert (done.progress.completed, done.estimated_credits) == (2, dry.estimate.estimated_credits)
        listed = stub.ListBackfillRuns(backfill_pb2.ListBackfillRunsRequest(), metadata=metadata).runs
        assert [r.run_id for r in listed] == [made.run_id]
        assert done.planned_credits == dry.estimate.estimated_credits
        items = stub.ListBackfillItems(
            backfill_pb2.ListBackfillItemsRequest(run_id=made.run_id, page_size=1), metadata=metadata
        )
        assert [(i.item_no, i.object_id, i.state, i.job_status) for i in items.items] == [
            (1, ids[0], "enqueued", "completed")
        ]
        assert items.next_after == 1 and items.items[0].params["size"] == 64
        rest = stub.ListBackfillItems(
            backfill_pb2.ListBackfillItemsRequest(run_id=made.run_id, after=1), metadata=metadata
        )
        assert [i.object_id for i in rest.items] == [ids[1]] and rest.next_after == 0
        with pytest.raises(grpc.RpcError) as ended:
            stub.PauseBackfillRun(backfill_pb2.PauseBackfillRunRequest(run_id=made.run_id), metadata=metadata)
        assert ended.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        with pytest.raises(grpc.RpcError) as hidden:
            stub.GetBackfillRun(
                backfill_pb2.GetBackfillRunRequest(run_id=made.run_id),
                metadata=(("authorization", f"Bearer {stranger['api_key']}"),),
            )
        assert hidden.value.code() == grpc.StatusCode.NOT_FOUND
        with pytest.raises(grpc.RpcError) as bad:
            stub.CreateBackfillRun(
                backfill_pb2.CreateBackfillRunRequest(selector=backfill_pb2.BackfillSelector()),
                metadata=metadata,
            )
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    shown = running.admin("backfill", "show", made.run_id)
    assert (shown["state"], shown["progress"]["completed"]) == ("completed", 2)
    assert (shown["max_rate_per_second"], shown["selector"]["scope"]) == (5.0, "all")  # REST's fields
    assert [r["run_id"] for r in running.admin("backfills", "--account", account["account_id"])["runs"]] == [
        made.run_id
    ]
