"""``POST /v1/hypermedia/estimate`` and gRPC ``Estimate`` (issue 22 item 3) on the real platform:
the credits a process request would hold, to the millicredit, with nothing held or created, and a
run time predicted from the operation's completed attempts; the errors of a process request."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import httpx
import psycopg
import pyvips

from hypermedia.api.jobs.v1 import jobs_pb2, jobs_pb2_grpc
from tests.e2e.conftest import RunningPlatform, upload, wait_job

EXIF = Path(__file__).resolve().parents[1] / "data" / "exif-orientation"
SCAN = Path(__file__).resolve().parents[1] / "data" / "ocr" / "eurotext.tif"


def test_an_estimate_is_what_the_request_then_holds_and_predicts_the_run(
    platform: RunningPlatform, client: httpx.Client, account: dict[str, Any], database_url: str
) -> None:
    paths = sorted(EXIF.glob("Landscape_*.jpg"))[:6]
    photos = [upload(client, path) for path in paths]
    for photo in photos[:5]:  # a history of the operation on this platform
        created = client.post(
            "/v1/hypermedia/process", json={"object_id": photo["object_id"], "operations": ["thumbnail"]}
        )
        assert wait_job(client, created.json()["job_ids"][0])["status"] == "completed"
    # What each job learned of its input is kept on the object for later estimates.
    with psycopg.connect(database_url) as conn:
        for path, photo in zip(paths[:5], photos[:5], strict=True):
            header = pyvips.Image.new_from_file(str(path))
            (learned,) = conn.execute(
                "SELECT facts FROM objects WHERE object_id = %s", (photo["object_id"],)
            ).fetchone() or (None,)
            assert learned == {"width": header.width, "height": header.height}, path.name
        (unread,) = conn.execute(
            "SELECT facts FROM objects WHERE object_id = %s", (photos[5]["object_id"],)
        ).fetchone() or ("missing",)
        assert unread is None  # no job read it yet
    scan = upload(client, SCAN)
    before = client.get("/v1/credits").json()

    estimated = client.post(
        "/v1/hypermedia/estimate", json={"object_id": photos[5]["object_id"], "operations": ["thumbnail"]}
    )
    assert estimated.status_code == 200, estimated.text
    [thumbnail] = estimated.json()["operations"]
    # The photo no job read has its size only (the shared platform's history decides size or median).
    assert thumbnail["history"]["samples"] >= 5 and thumbnail["history"]["basis"] in ("size", "median")
    assert 0 < thumbnail["predicted_seconds"] < 10
    ocr = client.post(
        "/v1/hypermedia/estimate",
        json={
            "object_id": scan["object_id"],
            "operations": [{"name": "ocr", "params": {"languages": ["eng"]}}],
        },
    ).json()
    assert ocr["operations"][0]["allowance_credits"] > 0  # an escalation allowance for its page
    assert ocr["estimated_credits"] == ocr["operations"][0]["credits"]  # the price, as process answers it
    assert ocr["held_credits"] == round(
        ocr["operations"][0]["credits"] + ocr["operations"][0]["allowance_credits"], 3
    )

    assert client.get("/v1/credits").json() == before  # nothing held
    assert (
        client.get("/v1/jobs", params={"object_id": photos[5]["object_id"]}).json()["jobs"] == []
    )  # nothing made

    created = client.post(
        "/v1/hypermedia/process", json={"object_id": photos[5]["object_id"], "operations": ["thumbnail"]}
    )
    assert (
        created.json()["estimated_credits"] == estimated.json()["estimated_credits"] == thumbnail["credits"]
    )

    metadata = (("authorization", f"Bearer {account['api_key']}"),)
    with grpc.insecure_channel(platform.grpc_addr) as channel:
        answer = jobs_pb2_grpc.JobServiceStub(channel).Estimate(
            jobs_pb2.EstimateRequest(
                object_id=photos[5]["object_id"], operations=[jobs_pb2.Operation(name="thumbnail")]
            ),
            metadata=metadata,
        )
    assert float(answer.estimated_credits) == thumbnail["credits"]
    assert answer.operations[0].HasField("predicted_seconds") and answer.operations[0].samples >= 5


def test_an_estimate_refuses_what_a_process_request_would(
    platform: RunningPlatform, client: httpx.Client
) -> None:
    photo = upload(client, EXIF / "Landscape_1.jpg")
    unknown = client.post(
        "/v1/hypermedia/estimate", json={"object_id": photo["object_id"], "operations": ["sharpen"]}
    )
    assert (unknown.status_code, unknown.json()["error_code"]) == (422, "UNKNOWN_OPERATION")
    wrong_kind = client.post(
        "/v1/hypermedia/estimate", json={"object_id": photo["object_id"], "operations": ["pdf_info"]}
    )
    assert wrong_kind.status_code == 415, wrong_kind.text
    other = platform.admin("create-account", "--credits", "1")
    with platform.client(other) as stranger:
        refused = stranger.post(
            "/v1/hypermedia/estimate", json={"object_id": photo["object_id"], "operations": ["thumbnail"]}
        )
    assert (refused.status_code, refused.json()["error_code"]) == (404, "NOT_FOUND")
