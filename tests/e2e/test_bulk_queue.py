"""The bulk queue's lanes end to end (issue 21 item 3, ADR 0057): a process request with
``"queue": "bulk"`` puts each job on the bulk lane of its operation's engine (``bulk.images`` for
a thumbnail), and only a unit configured for that lane runs it, with the engine's pipeline:
``hypermedia up``'s ``bulkworker`` unit (``--queues=bulk.images=2``) here, never the imageworker."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import psycopg
import pytest
import pyvips

from hypermedia.api.jobs.v1 import jobs_pb2, jobs_pb2_grpc
from tests.e2e.conftest import RunningPlatform, isolated_platform, upload, wait_job

EXIF = Path(__file__).resolve().parents[1] / "data" / "exif-orientation"


def _process(client: httpx.Client, object_id: str, **body: Any) -> httpx.Response:
    return client.post(
        "/v1/hypermedia/process", json={"object_id": object_id, "operations": ["thumbnail"], **body}
    )


def _lane_of(pg: psycopg.Connection[Any], job: dict[str, Any]) -> list[tuple[str, str]]:
    """(role, queue) of the workers (lanes) that ran the job's attempts."""
    return [
        tuple(
            pg.execute("SELECT role, queue FROM workers WHERE worker_id = %s", (a["worker_id"],)).fetchone()
            or ()
        )
        for a in job["attempts"]
    ]


@pytest.fixture
def pg(platform: RunningPlatform) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(platform.env["HM_DATABASE_URL"], autocommit=True) as conn:
        yield conn


def test_a_bulk_thumbnail_runs_the_image_pipeline_in_the_bulk_unit_and_an_interactive_one_does_not(
    platform: RunningPlatform, account: dict[str, Any], client: httpx.Client, pg: psycopg.Connection[Any]
) -> None:
    obj = upload(client, EXIF / "Landscape_5.jpg")["object_id"]
    bulk = _process(client, obj, queue="bulk", priority=9)
    interactive = _process(client, obj)
    assert bulk.status_code == interactive.status_code == 202, (bulk.text, interactive.text)
    bulk_job = wait_job(client, bulk.json()["job_ids"][0])
    interactive_job = wait_job(client, interactive.json()["job_ids"][0])
    assert (bulk_job["status"], bulk_job["queue"], bulk_job["priority"]) == ("completed", "bulk.images", 9)
    assert (interactive_job["status"], interactive_job["queue"]) == ("completed", "images")
    assert _lane_of(pg, bulk_job) == [("imageworker", "bulk.images")]
    assert _lane_of(pg, interactive_job) == [("imageworker", "images")]
    # The same pipeline: the same rendition, one output each, charged as any thumbnail.
    [bulk_out], [interactive_out] = bulk_job["outputs"], interactive_job["outputs"]
    made = [
        pyvips.Image.new_from_buffer(httpx.get(o["url"]).content, "") for o in (bulk_out, interactive_out)
    ]
    assert [(m.width, m.height) for m in made] == [(made[1].width, made[1].height)] * 2
    assert bulk_job["actual_credits"] == interactive_job["actual_credits"] > 0

    # A bulk request without a priority gets 8; over gRPC as over REST.
    metadata = (("authorization", f"Bearer {account['api_key']}"),)
    with grpc.insecure_channel(platform.grpc_addr) as chan:
        stub = jobs_pb2_grpc.JobServiceStub(chan)
        created = stub.Process(
            jobs_pb2.ProcessRequest(
                object_id=obj, operations=[jobs_pb2.Operation(name="thumbnail")], queue="bulk"
            ),
            metadata=metadata,
        )
        done = wait_job(client, created.job_ids[0])
        got = stub.GetJob(jobs_pb2.GetJobRequest(job_id=created.job_ids[0]), metadata=metadata).job
        assert (got.queue, got.priority) == ("bulk.images", 8)
        with pytest.raises(grpc.RpcError) as refused:
            stub.Process(
                jobs_pb2.ProcessRequest(
                    object_id=obj, operations=[jobs_pb2.Operation(name="thumbnail")], queue="bulk", priority=2
                ),
                metadata=metadata,
            )
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "7 to 10" in (refused.value.details() or "")
    assert done["status"] == "completed" and _lane_of(pg, done)[0][1] == "bulk.images"


@pytest.mark.parametrize(
    ("body", "code", "said"),
    [
        ({"queue": "images"}, "INVALID_QUEUE", 'queue must be "bulk" or left out'),
        ({"queue": "BULK"}, "INVALID_QUEUE", 'queue must be "bulk" or left out'),
        ({"queue": "bulk", "priority": 6}, "INVALID_PRIORITY", "a bulk request's priority must be 7 to 10"),
        ({"queue": "bulk", "priority": 11}, "INVALID_PRIORITY", "from 1 (highest) to 10"),
    ],
)
def test_a_wrong_queue_or_bulk_priority_is_refused_before_anything_is_held(
    client: httpx.Client, body: dict[str, Any], code: str, said: str
) -> None:
    obj = upload(client, EXIF / "Landscape_6.jpg")["object_id"]
    before = client.get("/v1/credits").json()
    refused = _process(client, obj, **body)
    assert (refused.status_code, refused.json()["error_code"]) == (422, code), refused.text
    assert said in refused.json()["detail"]
    assert client.get("/v1/credits").json() == before


def test_only_a_unit_configured_for_the_lane_takes_bulk_jobs(
    tmp_root: Path, database_url: str, nats_url: str
) -> None:
    """A platform whose bulk unit serves ``bulk.ocr`` only (``HM_UP_BULK_QUEUES``): a bulk
    thumbnail waits queued while the imageworker completes an interactive one, and again after
    more time than the imageworker's idle sweep (1 s); cancelling it releases its hold."""
    with isolated_platform(
        tmp_root,
        database_url,
        nats_url,
        "bulk_lanes",
        services="credits,storage,gateway,imageworker,bulkworker,reaper",
        HM_UP_BULK_QUEUES="bulk.ocr=1",
    ) as running:
        account = running.admin("create-account", "--credits", "100")
        with running.client(account) as client:
            obj = upload(client, EXIF / "Landscape_7.jpg")["object_id"]
            bulk = _process(client, obj, queue="bulk")
            assert bulk.status_code == 202, bulk.text
            interactive = wait_job(client, _process(client, obj).json()["job_ids"][0])
            assert interactive["status"] == "completed", interactive
            time.sleep(3)
            job_id = bulk.json()["job_ids"][0]
            waiting = client.get(f"/v1/jobs/{job_id}").json()
            assert (waiting["status"], waiting["queue"], waiting["attempts"]) == ("queued", "bulk.images", [])
            assert client.post(f"/v1/jobs/{job_id}:cancel").status_code == 200
            assert wait_job(client, job_id)["status"] == "cancelled"
        log = (running.state_dir / "logs" / "bulkworker.log").read_text()
        assert "bulk.ocr" in log
