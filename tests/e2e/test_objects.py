"""Reading an object (issue 22 item 3): ``GET /v1/objects/{id}`` and gRPC ``GetObject`` against
the real platform: an original and an output of its job, each with a presigned URL that serves
its bytes; another account's, a deleted and a malformed id are 404 / NOT_FOUND alike."""

from __future__ import annotations

import base64
import hashlib
import json
import uuid
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from hypermedia.api.jobs.v1 import jobs_pb2, jobs_pb2_grpc
from tests.e2e.conftest import RunningPlatform, upload, wait_job

PHOTO = Path(__file__).resolve().parents[1] / "data" / "exif-orientation" / "Landscape_3.jpg"


def test_an_original_and_an_output_are_read_with_a_url_that_serves_their_bytes(
    platform: RunningPlatform, client: httpx.Client, account: dict[str, Any]
) -> None:
    original = upload(client, PHOTO, name="landscape.jpg")
    got = client.get(f"/v1/objects/{original['object_id']}")
    assert got.status_code == 200, got.text
    body = got.json()
    for field in ("object_id", "pool_id", "size_bytes", "mime_type", "sha256", "filename"):
        assert body[field] == original[field], field
    assert body["source_object_id"] is None
    expires = datetime.fromisoformat(body["url_expires_at"])
    assert timedelta(minutes=1) < expires - datetime.fromisoformat(body["created_at"]) < timedelta(hours=1)
    downloaded = httpx.get(body["url"], timeout=30)
    assert downloaded.status_code == 200
    assert hashlib.sha256(downloaded.content).hexdigest() == original["sha256"] == body["sha256"]
    assert downloaded.headers["content-type"].startswith("image/jpeg")

    created = client.post(
        "/v1/hypermedia/process", json={"object_id": original["object_id"], "operations": ["thumbnail"]}
    )
    job = wait_job(client, created.json()["job_ids"][0])
    [output] = job["outputs"]
    derived = client.get(f"/v1/objects/{output['object_id']}").json()
    assert derived["source_object_id"] == original["object_id"]
    assert (derived["mime_type"], derived["size_bytes"]) == (output["mime_type"], output["size_bytes"])
    assert derived["filename"] == ""
    assert hashlib.sha256(httpx.get(derived["url"], timeout=30).content).hexdigest() == derived["sha256"]

    metadata = (("authorization", f"Bearer {account['api_key']}"),)
    with grpc.insecure_channel(platform.grpc_addr) as channel:
        stub = jobs_pb2_grpc.JobServiceStub(channel)
        answer = stub.GetObject(jobs_pb2.GetObjectRequest(object_id=output["object_id"]), metadata=metadata)
        assert (answer.source_object_id, answer.sha256) == (original["object_id"], derived["sha256"])
        assert answer.url and answer.url_expires_at.seconds > answer.created_at.seconds
        plain = stub.GetObject(jobs_pb2.GetObjectRequest(object_id=original["object_id"]), metadata=metadata)
        assert (plain.source_object_id, plain.filename) == ("", "landscape.jpg")
        with pytest.raises(grpc.RpcError) as missing:
            stub.GetObject(jobs_pb2.GetObjectRequest(object_id="nope"), metadata=metadata)
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND


def test_others_deleted_and_malformed_objects_are_not_found_alike(
    platform: RunningPlatform, client: httpx.Client
) -> None:
    mine = upload(client, PHOTO)
    other = platform.admin("create-account", "--credits", "1")
    with platform.client(other) as stranger:
        refused = stranger.get(f"/v1/objects/{mine['object_id']}")
        assert refused.status_code == 404, refused.text
        assert refused.json()["error_code"] == "NOT_FOUND"
    for object_id in ("not-a-uuid", "00000000-0000-4000-8000-000000000000"):
        response = client.get(f"/v1/objects/{object_id}")
        assert (response.status_code, response.json()["error_code"]) == (404, "NOT_FOUND")
    assert client.delete(f"/v1/objects/{mine['object_id']}").status_code == 200
    gone = client.get(f"/v1/objects/{mine['object_id']}")
    assert (gone.status_code, gone.json()["error_code"]) == (404, "NOT_FOUND")


def test_an_account_lists_its_objects_newest_first_by_kind_a_page_at_a_time(
    platform: RunningPlatform, client: httpx.Client, account: dict[str, Any]
) -> None:
    """``GET /v1/objects`` (and gRPC ``ListObjects``): originals and the outputs of the caller's
    jobs, newest first, paged by cursor; nobody else's, nothing deleted; bad kinds and cursors
    refused with their codes."""
    first = upload(client, PHOTO, name="first.jpg")
    second = upload(client, PHOTO, name="second.jpg")
    # A field an upload does not take is refused, and nothing is stored.
    extra = client.post("/v1/objects", files={"file": ("x.jpg", PHOTO.read_bytes())}, data={"pool": "other"})
    assert (extra.status_code, extra.json()["error_code"]) == (422, "UNKNOWN_PARAMETER")
    assert "'pool'" in extra.json()["detail"]
    created = client.post(
        "/v1/hypermedia/process", json={"object_id": first["object_id"], "operations": ["thumbnail"]}
    )
    [thumbnail] = wait_job(client, created.json()["job_ids"][0])["outputs"]

    def ids(**params: Any) -> list[str]:
        answer = client.get("/v1/objects", params=params)
        assert answer.status_code == 200, answer.text
        return [o["object_id"] for o in answer.json()["objects"]]

    assert ids(kind="original") == [second["object_id"], first["object_id"]]
    assert ids(kind="output") == [thumbnail["object_id"]]
    assert ids() == [thumbnail["object_id"], second["object_id"], first["object_id"]]
    listed = client.get("/v1/objects", params={"kind": "original", "limit": 1}).json()
    [newest] = listed["objects"]
    assert (newest["filename"], newest["sha256"], newest["size_bytes"]) == (
        "second.jpg",
        second["sha256"],
        second["size_bytes"],
    )
    assert newest["source_object_id"] is None and "url" not in newest
    rest = client.get(
        "/v1/objects", params={"kind": "original", "limit": 1, "cursor": listed["next_cursor"]}
    ).json()
    assert [o["object_id"] for o in rest["objects"]] == [first["object_id"]] and rest["next_cursor"] is None

    edge = {"t": "0001-01-01T00:00:00+14:00", "j": first["object_id"]}  # before year 1 in UTC
    edge_cursor = base64.urlsafe_b64encode(json.dumps(edge).encode()).decode()
    for params, code in (
        ({"kind": "video"}, "INVALID_KIND"),
        ({"cursor": "abc"}, "INVALID_CURSOR"),
        ({"cursor": edge_cursor}, "INVALID_CURSOR"),
    ):
        refused = client.get("/v1/objects", params=params)
        assert (refused.status_code, refused.json()["error_code"]) == (422, code), refused.text
    other = platform.admin("create-account", "--credits", "1")
    with platform.client(other) as stranger:
        assert stranger.get("/v1/objects").json() == {"objects": [], "next_cursor": None}

    metadata = (("authorization", f"Bearer {account['api_key']}"),)
    with grpc.insecure_channel(platform.grpc_addr) as channel:
        stub = jobs_pb2_grpc.JobServiceStub(channel)
        page = stub.ListObjects(jobs_pb2.ListObjectsRequest(kind="output"), metadata=metadata)
        [summary] = page.objects
        assert (summary.object_id, summary.source_object_id) == (thumbnail["object_id"], first["object_id"])
        assert page.next_page_token == ""
        with pytest.raises(grpc.RpcError) as bad:
            stub.ListObjects(jobs_pb2.ListObjectsRequest(page_token="abc"), metadata=metadata)
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT

    # A method the path does not take: 405 naming those it does (RFC 9110's Allow).
    wrong = client.patch("/v1/objects")
    assert (wrong.status_code, wrong.json()["error_code"]) == (405, "METHOD_NOT_ALLOWED")
    assert sorted(m.strip() for m in wrong.headers["allow"].split(",")) == ["GET", "POST"]
    # An action's path is not also the job's own path with an id ending ":cancel".
    action = client.options(f"/v1/jobs/{uuid.uuid4()}:cancel")
    assert (action.status_code, action.headers["allow"]) == (405, "POST")

    # Deleting an original takes its outputs off the list too.
    assert client.delete(f"/v1/objects/{first['object_id']}").status_code == 200
    assert ids() == [second["object_id"]]
