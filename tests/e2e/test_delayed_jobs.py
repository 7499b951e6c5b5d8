"""Delayed jobs end to end (issue 25 item 1, ADR 0071) on the session's platform: a request with
``delay_seconds`` or ``not_before`` is ``scheduled``, credits held, until its time, then queued by
the reaper's poller and run; it starts within a second of its time and never before; cancelled
while it waits it never runs and its hold is released; gRPC takes a Timestamp."""

from __future__ import annotations

import asyncio
import datetime
import time
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from google.protobuf import timestamp_pb2

from hypermedia.api.jobs.v1 import jobs_pb2, jobs_pb2_grpc
from tests.e2e.conftest import RunningPlatform, upload, wait_job

PHOTO = Path(__file__).resolve().parents[1] / "data" / "exif-orientation" / "Landscape_2.jpg"


def _time(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text)


def test_a_delayed_job_starts_within_a_second_of_its_time_and_not_before(client: httpx.Client) -> None:
    obj = upload(client, PHOTO)
    held_before = client.get("/v1/credits").json()["held"]

    response = client.post(
        "/v1/hypermedia/process",
        json={"object_id": obj["object_id"], "operations": ["thumbnail"], "delay_seconds": 2.5},
    )

    assert response.status_code == 202, response.text
    created = response.json()
    due = _time(created["not_before"])
    [job_id] = created["job_ids"]
    waiting = client.get(f"/v1/jobs/{job_id}").json()
    assert waiting["status"] == "scheduled" and _time(waiting["not_before"]) == due
    assert waiting["queued_at"] is None and waiting["attempts"] == []
    assert client.get("/v1/credits").json()["held"] > held_before  # held at creation

    job = wait_job(client, job_id, timeout=30)

    assert job["status"] == "completed", job
    started = _time(job["attempts"][0]["started_at"])
    assert due <= _time(job["queued_at"]) <= started
    assert (started - due).total_seconds() < 1.0, (due, job["queued_at"], started)


def test_a_cancelled_scheduled_job_never_runs_and_its_hold_is_released(client: httpx.Client) -> None:
    obj = upload(client, PHOTO)
    before = client.get("/v1/credits").json()
    soon = (datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=1.5)).isoformat()
    [job_id] = client.post(
        "/v1/hypermedia/process",
        json={"object_id": obj["object_id"], "operations": ["thumbnail"], "not_before": soon},
    ).json()["job_ids"]
    assert client.get("/v1/credits").json()["held"] > before["held"]

    cancelled = client.post(f"/v1/jobs/{job_id}:cancel")

    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json()["status"] == "cancelled"
    time.sleep(2.5)  # past its time: the poller must not queue it
    job = client.get(f"/v1/jobs/{job_id}").json()
    assert (job["status"], job["attempt_count"], job["queued_at"]) == ("cancelled", 0, None)
    after = client.get("/v1/credits").json()
    assert (after["held"], after["balance"]) == (before["held"], before["balance"])


def test_a_past_time_runs_now_and_a_repeated_key_replays_the_schedule(client: httpx.Client) -> None:
    obj = upload(client, PHOTO)
    past = client.post(
        "/v1/hypermedia/process",
        json={
            "object_id": obj["object_id"],
            "operations": ["thumbnail"],
            "not_before": "2020-01-01T00:00:00Z",
        },
    ).json()
    assert past["not_before"] is None
    assert wait_job(client, past["job_ids"][0])["status"] == "completed"

    body = {"object_id": obj["object_id"], "operations": ["compress"], "delay_seconds": 600}
    first = client.post("/v1/hypermedia/process", json=body, headers={"Idempotency-Key": "later-1"})
    again = client.post("/v1/hypermedia/process", json=body, headers={"Idempotency-Key": "later-1"})
    other = client.post(
        "/v1/hypermedia/process", json=body | {"delay_seconds": 60}, headers={"Idempotency-Key": "later-1"}
    )
    assert first.status_code == again.status_code == 202
    assert again.json() == first.json()
    assert other.status_code == 409 and other.json()["error_code"] == "IDEMPOTENCY_KEY_REUSED"
    assert client.post(f"/v1/jobs/{first.json()['job_ids'][0]}:cancel").json()["status"] == "cancelled"


@pytest.mark.parametrize(
    ("schedule", "detail"),
    [
        ({"not_before": "2026-12-24T18:00:00"}, "RFC 3339 time with an offset"),
        ({"not_before": "next tuesday"}, "RFC 3339"),
        ({"delay_seconds": 31 * 86400}, "30 days"),
        ({"delay_seconds": -1}, "≥ 0"),
        ({"delay_seconds": 5, "not_before": "2030-01-01T00:00:00Z"}, "not both"),
    ],
)
def test_a_bad_schedule_is_refused_and_nothing_is_held(
    client: httpx.Client, schedule: dict[str, Any], detail: str
) -> None:
    obj = upload(client, PHOTO)
    before = client.get("/v1/credits").json()

    response = client.post(
        "/v1/hypermedia/process", json={"object_id": obj["object_id"], "operations": ["thumbnail"]} | schedule
    )

    assert response.status_code == 422, response.text
    assert response.json()["error_code"] == "INVALID_SCHEDULE"
    assert detail in response.json()["detail"]
    assert client.get("/v1/credits").json() == before


def test_grpc_process_takes_a_timestamp_and_shows_the_job_scheduled(
    platform: RunningPlatform, account: dict[str, Any]
) -> None:
    metadata = (("authorization", f"Bearer {account['api_key']}"),)
    due = timestamp_pb2.Timestamp()
    due.FromDatetime(datetime.datetime.now(datetime.UTC) + datetime.timedelta(minutes=5))

    async def flow() -> tuple[jobs_pb2.ProcessResponse, jobs_pb2.Job, grpc.aio.AioRpcError]:
        async with grpc.aio.insecure_channel(platform.grpc_addr) as chan:
            stub = jobs_pb2_grpc.JobServiceStub(chan)
            obj = await stub.UploadObject(
                jobs_pb2.UploadObjectRequest(content=PHOTO.read_bytes(), filename=PHOTO.name),
                metadata=metadata,
            )
            created = await stub.Process(
                jobs_pb2.ProcessRequest(
                    object_id=obj.object_id, operations=[jobs_pb2.Operation(name="thumbnail")], not_before=due
                ),
                metadata=metadata,
            )
            job = (
                await stub.GetJob(jobs_pb2.GetJobRequest(job_id=created.job_ids[0]), metadata=metadata)
            ).job
            await stub.CancelJob(jobs_pb2.CancelJobRequest(job_id=created.job_ids[0]), metadata=metadata)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.Process(
                    jobs_pb2.ProcessRequest(
                        object_id=obj.object_id,
                        operations=[jobs_pb2.Operation(name="thumbnail")],
                        not_before=due,
                        delay_seconds=5,
                    ),
                    metadata=metadata,
                )
            return created, job, refused.value

    created, job, refused = asyncio.run(flow())

    assert created.not_before == due
    assert job.status == jobs_pb2.JOB_STATUS_SCHEDULED and job.not_before == due
    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert dict(refused.trailing_metadata())["hm-error-code"] == "INVALID_SCHEDULE"
