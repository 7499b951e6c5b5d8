"""Stable output links and deleting an original with its outputs (issue 22 item 3) against the real
platform: ``GET /v1/jobs/{id}/outputs/{type}`` redirects to a fresh presigned URL that serves the
output's bytes (gRPC ``GetOutputUrl`` alike), names what is wrong otherwise, and once the original
is deleted its outputs' bytes, listing and links are gone while the job keeps its history."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from hypermedia.api.jobs.v1 import jobs_pb2, jobs_pb2_grpc
from tests.e2e.conftest import PLATFORM_MODE, RunningPlatform, upload, wait_job

EXIF = Path(__file__).resolve().parents[1] / "data" / "exif-orientation"


def _problem(response: httpx.Response) -> tuple[int, str]:
    return response.status_code, response.json()["error_code"]


GONE = {404} if PLATFORM_MODE == "local" else {403, 404}
"""What a presigned URL of a deleted object answers: 404 from the local store; on S3 404, or 403
where the signer may not list the bucket (AWS answers AccessDenied then; moto answers
SignatureDoesNotMatch for a missing key when the URL carries ``response-content-type``)."""


def test_a_kept_link_redirects_to_a_fresh_url_and_goes_with_the_original(
    platform: RunningPlatform, client: httpx.Client, account: dict[str, Any]
) -> None:
    original = upload(client, EXIF / "Landscape_3.jpg")
    created = client.post(
        "/v1/hypermedia/process",
        json={
            "object_id": original["object_id"],
            "operations": ["thumbnail", {"name": "convert", "params": {"format": "png"}}],
        },
    )
    jobs = [wait_job(client, job_id) for job_id in created.json()["job_ids"]]
    thumb_job = jobs[0]
    [output] = thumb_job["outputs"]
    link = f"/v1/jobs/{thumb_job['job_id']}/outputs/thumbnail"
    assert output["link"] == link

    redirected = client.get(link)
    assert redirected.status_code == 307, redirected.text
    assert redirected.headers["cache-control"] == "private, no-store"
    fetched = httpx.get(redirected.headers["location"], timeout=30)
    assert fetched.status_code == 200
    assert fetched.headers["content-type"].startswith("image/webp")
    derived = client.get(f"/v1/objects/{output['object_id']}").json()
    assert hashlib.sha256(fetched.content).hexdigest() == derived["sha256"]

    headed = client.head(link)
    assert (headed.status_code, headed.headers["cache-control"]) == (307, "private, no-store")
    described = client.get(link, params={"redirect": "false"})
    assert described.status_code == 200
    assert described.headers["cache-control"] == "private, no-store"
    body = described.json()
    assert (body["object_id"], body["mime_type"], body["size_bytes"]) == (
        output["object_id"],
        "image/webp",
        output["size_bytes"],
    )
    assert datetime.fromisoformat(body["url_expires_at"]) > datetime.now(UTC)
    assert httpx.get(body["url"], timeout=30).content == fetched.content

    missing = client.get(f"/v1/jobs/{thumb_job['job_id']}/outputs/poster")
    assert _problem(missing) == (404, "OUTPUT_NOT_FOUND")
    assert "its outputs: thumbnail" in missing.json()["detail"]
    other = platform.admin("create-account", "--credits", "1")
    with platform.client(other) as stranger:
        assert _problem(stranger.get(link)) == (404, "NOT_FOUND")
    assert _problem(client.get("/v1/jobs/not-a-uuid/outputs/thumbnail")) == (404, "NOT_FOUND")

    metadata = (("authorization", f"Bearer {account['api_key']}"),)
    with grpc.insecure_channel(platform.grpc_addr) as channel:
        stub = jobs_pb2_grpc.JobServiceStub(channel)
        answer = stub.GetOutputUrl(
            jobs_pb2.GetOutputUrlRequest(job_id=thumb_job["job_id"], output_type="thumbnail"),
            metadata=metadata,
        )
        assert (answer.object_id, answer.mime_type) == (output["object_id"], "image/webp")
        assert httpx.get(answer.url, timeout=30).content == fetched.content
        with pytest.raises(grpc.RpcError) as unknown:
            stub.GetOutputUrl(
                jobs_pb2.GetOutputUrlRequest(job_id=thumb_job["job_id"], output_type="nope"),
                metadata=metadata,
            )
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND

    # Deleting the original takes every output derived from it along: bytes, listing, links.
    outputs = [o for job in jobs for o in job["outputs"]]
    urls = [o["url"] for o in outputs]
    assert client.delete(f"/v1/objects/{original['object_id']}").status_code == 200
    for url in urls:
        assert httpx.get(url, timeout=30).status_code in GONE
    for o in outputs:
        assert _problem(client.get(f"/v1/objects/{o['object_id']}")) == (404, "NOT_FOUND")
    after = client.get(f"/v1/jobs/{thumb_job['job_id']}").json()
    assert (after["status"], after["outputs"], len(after["attempts"])) == ("completed", [], 1)
    assert _problem(client.get(link)) == (404, "OUTPUT_DELETED")


def test_a_job_without_outputs_says_its_status(client: httpx.Client) -> None:
    cut = client.post(
        "/v1/objects", files={"file": ("cut.jpg", (EXIF / "Landscape_1.jpg").read_bytes()[:20000])}
    ).json()
    created = client.post(
        "/v1/hypermedia/process", json={"object_id": cut["object_id"], "operations": ["thumbnail"]}
    )
    job = wait_job(client, created.json()["job_ids"][0])
    assert job["status"] == "failed"
    answer = client.get(f"/v1/jobs/{job['job_id']}/outputs/thumbnail")
    assert _problem(answer) == (409, "JOB_NOT_COMPLETED")
    assert answer.json()["detail"] == "the job has no outputs: it is failed"
