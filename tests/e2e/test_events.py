"""Job events from one source: REST Server-Sent Events and gRPC WatchJob."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from hypermedia.api.jobs.v1 import jobs_pb2, jobs_pb2_grpc
from tests.e2e.conftest import RunningPlatform, upload, wait_job
from tests.e2e.slowjob import make_slow_png

EXIF = Path(__file__).resolve().parents[1] / "data" / "exif-orientation"
LONG_JOB_PNG_SIZE = 2500
"""A ``compress`` of this Perlin PNG (6 Mpx) spends 2–4 s in libvips: a job long enough for
progress events, which a job writes only once it has run a second."""


@pytest.fixture(scope="module")
def long_job_png(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_slow_png(tmp_path_factory.mktemp("events") / "perlin.png", LONG_JOB_PNG_SIZE)


def _long_job(client: httpx.Client, png: Path) -> str:
    obj = upload(client, png)
    response = client.post(
        "/v1/hypermedia/process", json={"object_id": obj["object_id"], "operations": ["compress"]}
    )
    assert response.status_code == 202, response.text
    return str(response.json()["job_ids"][0])


def _sse(client: httpx.Client, job_id: str, last_event_id: int | None = None) -> list[dict[str, Any]]:
    """Read the whole event stream of a job (it ends after the terminal status)."""
    headers = {"Last-Event-ID": str(last_event_id)} if last_event_id else {}
    events: list[dict[str, Any]] = []
    with client.stream("GET", f"/v1/jobs/{job_id}/events", headers=headers, timeout=60) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        fields: dict[str, str] = {}
        for line in response.iter_lines():
            if line == "":
                if "data" in fields:
                    event = json.loads(fields["data"])
                    assert str(event["event_id"]) == fields["id"] and event["kind"] == fields["event"]
                    events.append(event)
                fields = {}
            elif not line.startswith(":"):
                name, _, value = line.partition(": ")
                fields[name] = value
    return events


def test_sse_streams_every_status_and_progress_then_ends(client: httpx.Client, long_job_png: Path) -> None:
    job_id = _long_job(client, long_job_png)
    events = _sse(client, job_id)
    statuses = [e["status"] for e in events if e["kind"] == "status"]
    assert statuses == ["queued", "claimed", "processing", "completed"]
    progress = [(e["progress"], e["detail"]["stage"]) for e in events if e["kind"] == "progress"]
    assert progress == [(0.25, "downloaded"), (0.75, "processed"), (0.95, "uploaded")]
    kinds = [e["kind"] for e in events]
    assert kinds.index("progress") > statuses.index("processing") and kinds[-1] == "status"
    ids = [e["event_id"] for e in events]
    assert ids == sorted(ids)

    resumed = _sse(client, job_id, last_event_id=ids[2])
    assert [e["event_id"] for e in resumed] == ids[3:]


def test_a_job_that_ends_within_a_second_writes_no_progress_events(client: httpx.Client) -> None:
    """Progress events start after a job's first second: a thumbnail's stream is its statuses."""
    obj = upload(client, EXIF / "Landscape_7.jpg")
    job_id = client.post(
        "/v1/hypermedia/process", json={"object_id": obj["object_id"], "operations": ["thumbnail"]}
    ).json()["job_ids"][0]
    events = _sse(client, job_id)
    assert [e["status"] for e in events if e["kind"] == "status"] == [
        "queued",
        "claimed",
        "processing",
        "completed",
    ]
    [attempt] = wait_job(client, job_id)["attempts"]
    ran = datetime.fromisoformat(attempt["finished_at"]) - datetime.fromisoformat(attempt["started_at"])
    if ran < timedelta(seconds=1):  # from its claim to its end; a loaded machine may take longer
        assert [e for e in events if e["kind"] == "progress"] == []
    else:
        assert all(
            e["detail"]["stage"] in {"downloaded", "processed", "uploaded"}
            for e in events
            if e["kind"] == "progress"
        )


def test_sse_of_a_failed_job_carries_its_error(client: httpx.Client) -> None:
    response = client.post(
        "/v1/objects", files={"file": ("x.jpg", (EXIF / "Landscape_1.jpg").read_bytes()[:3000])}
    )
    job_id = client.post(
        "/v1/hypermedia/process",
        json={"object_id": response.json()["object_id"], "operations": ["thumbnail"]},
    ).json()["job_ids"][0]
    last = _sse(client, job_id)[-1]
    assert (last["status"], last["detail"]["error_code"]) == ("failed", "CORRUPT_INPUT")


def test_watch_job_over_grpc_and_not_found_for_others(
    platform: RunningPlatform, client: httpx.Client, account: dict[str, Any], long_job_png: Path
) -> None:
    job_id = _long_job(client, long_job_png)
    other = platform.admin("create-account", "--credits", "1")

    async def watch(key: str) -> list[jobs_pb2.WatchJobResponse]:
        async with grpc.aio.insecure_channel(platform.grpc_addr) as chan:
            stream = jobs_pb2_grpc.JobServiceStub(chan).WatchJob(
                jobs_pb2.WatchJobRequest(job_id=job_id), metadata=(("authorization", f"Bearer {key}"),)
            )
            return [event async for event in stream]

    events = asyncio.run(watch(account["api_key"]))
    assert events[-1].status == jobs_pb2.JOB_STATUS_COMPLETED and events[-1].kind == "status"
    assert [e.progress for e in events if e.kind == "progress"] == pytest.approx([0.25, 0.75, 0.95])
    assert wait_job(client, job_id)["status"] == "completed"
    with pytest.raises(grpc.aio.AioRpcError) as info:
        asyncio.run(watch(other["api_key"]))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    missing = client.get("/v1/jobs/00000000-0000-0000-0000-000000000000/events")
    assert missing.status_code == 404 and missing.json()["error_code"] == "NOT_FOUND"


def test_resuming_after_the_terminal_event_ends_and_odd_last_event_ids_start_over(
    client: httpx.Client,
) -> None:
    obj = upload(client, EXIF / "Landscape_2.jpg")
    job_id = client.post(
        "/v1/hypermedia/process", json={"object_id": obj["object_id"], "operations": ["thumbnail"]}
    ).json()["job_ids"][0]
    everything = _sse(client, job_id)
    assert _sse(client, job_id, last_event_id=everything[-1]["event_id"]) == []
    odd_ids: list[str | bytes] = ["99999999999999999999", "9" * 60000, b"\xb2", b"1\xb9", "-5", "abc"]
    for odd in odd_ids:
        with client.stream("GET", f"/v1/jobs/{job_id}/events", headers={"Last-Event-ID": odd}) as response:
            assert response.status_code == 200
            body = response.read().decode()
        assert body.count("event: status") == 4, odd
