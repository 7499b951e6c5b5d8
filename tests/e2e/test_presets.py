"""Named presets end to end (issue 21 item 1): an app puts ``avatar`` (an operation and params)
over REST, asks for ``{"preset": "avatar"}`` over REST and gRPC, real imageworkers make the
thumbnails, and a new version of the preset makes the older outputs outdated
(``hypermedia admin outdated --preset``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import pyvips

from hypermedia.api.jobs.v1 import jobs_pb2, jobs_pb2_grpc
from tests.e2e.conftest import RunningPlatform, upload, wait_job

EXIF = Path(__file__).resolve().parents[1] / "data" / "exif-orientation"


def _made(client: httpx.Client, object_id: str, preset: str) -> dict[str, Any]:
    created = client.post(
        "/v1/hypermedia/process", json={"object_id": object_id, "operations": [{"preset": preset}]}
    )
    assert created.status_code == 202, created.text
    job = wait_job(client, created.json()["job_ids"][0])
    assert job["status"] == "completed", job
    return job


def _width(client: httpx.Client, job: dict[str, Any]) -> int:
    [output] = job["outputs"]
    return int(pyvips.Image.new_from_buffer(httpx.get(output["url"]).content, "").width)


def test_a_preset_stands_for_its_operation_and_a_new_version_makes_its_outputs_outdated(
    platform: RunningPlatform, account: dict[str, Any], client: httpx.Client
) -> None:
    put = client.put("/v1/presets/avatar", json={"operation": "thumbnail", "params": {"size": 64}})
    assert put.status_code == 201, put.text
    assert {k: put.json()[k] for k in ("name", "version", "operation", "params")} == {
        "name": "avatar",
        "version": 1,
        "operation": "thumbnail",
        "params": {"size": 64},
    }
    again = client.put("/v1/presets/avatar", json={"operation": "thumbnail", "params": {"size": 64}})
    assert again.status_code == 200 and again.json() == put.json()  # nothing changed: no new version

    first, second = (upload(client, EXIF / f"Landscape_{n}.jpg")["object_id"] for n in (1, 2))
    jobs = [_made(client, first, "avatar"), _made(client, second, "avatar")]
    for job in jobs:
        assert (job["operation"], job["params"]["size"], job["preset"]) == (
            "thumbnail",
            64,
            {"name": "avatar", "version": 1},
        )
        assert _width(client, job) == 64

    changed = client.put("/v1/presets/avatar", json={"operation": "thumbnail", "params": {"size": 96}})
    assert (changed.status_code, changed.json()["version"]) == (201, 2)
    assert client.get("/v1/presets").json()["presets"] == [changed.json()]
    outdated = platform.admin("outdated", "--preset", "avatar", "--account", account["account_id"])["outputs"]
    assert sorted(o["object_id"] for o in outdated) == sorted([first, second])
    assert {(o["preset_version"], o["active_version"]) for o in outdated} == {(1, 2)}

    regenerated = _made(client, first, "avatar")
    assert regenerated["preset"] == {"name": "avatar", "version": 2} and _width(client, regenerated) == 96
    outdated = platform.admin("outdated", "--preset", "avatar", "--account", account["account_id"])["outputs"]
    assert [o["object_id"] for o in outdated] == [second]

    # Over gRPC: the same preset by name, and the job says which version made it.
    metadata = (("authorization", f"Bearer {account['api_key']}"),)
    with grpc.insecure_channel(platform.grpc_addr) as chan:
        stub = jobs_pb2_grpc.JobServiceStub(chan)
        created = stub.Process(
            jobs_pb2.ProcessRequest(object_id=second, operations=[jobs_pb2.Operation(preset="avatar")]),
            metadata=metadata,
        )
        job = wait_job(client, created.job_ids[0])
        got = stub.GetJob(jobs_pb2.GetJobRequest(job_id=created.job_ids[0]), metadata=metadata).job
        assert (got.preset_name, got.preset_version, got.operation) == ("avatar", 2, "thumbnail")
        with pytest.raises(grpc.RpcError) as both:
            stub.Process(
                jobs_pb2.ProcessRequest(
                    object_id=second, operations=[jobs_pb2.Operation(name="thumbnail", preset="avatar")]
                ),
                metadata=metadata,
            )
        assert both.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert _width(client, job) == 96
    assert (
        platform.admin("outdated", "--preset", "avatar", "--account", account["account_id"])["outputs"] == []
    )

    assert client.delete("/v1/presets/avatar").status_code == 204
    gone = client.post(
        "/v1/hypermedia/process", json={"object_id": first, "operations": [{"preset": "avatar"}]}
    )
    assert (gone.status_code, gone.json()["error_code"]) == (422, "UNKNOWN_PRESET")
    assert client.get("/v1/presets/avatar").status_code == 404
    assert client.delete("/v1/presets/avatar").json()["error_code"] == "PRESET_NOT_FOUND"
    back = client.put("/v1/presets/avatar", json={"operation": "thumbnail", "params": {"size": 64}})
    assert back.json()["version"] == 3  # after the highest ever


def test_presets_are_checked_as_requests_and_are_the_accounts_own(
    platform: RunningPlatform, client: httpx.Client
) -> None:
    for name, body, status, code in (
        ("Avatar", {"operation": "thumbnail"}, 422, "INVALID_PRESET_NAME"),
        ("a" * 65, {"operation": "thumbnail"}, 422, "INVALID_PRESET_NAME"),
        ("x", {"operation": "teleport"}, 422, "UNKNOWN_OPERATION"),
        ("x", {"operation": "thumbnail", "params": {"size": -3}}, 422, "INVALID_PARAMS"),
        ("x", {"operation": "thumbnail", "params": {"colour": "red"}}, 422, "INVALID_PARAMS"),
        ("x", {"operation": "pdf_preview", "params": {"password": "secret"}}, 422, "INVALID_PARAMS"),
        ("x", {"operation": "thumbnail", "extra": 1}, 422, "INVALID_REQUEST"),
    ):
        response = client.put(f"/v1/presets/{name}", json=body)
        assert (response.status_code, response.json()["error_code"]) == (status, code), (
            name,
            body,
            response.text,
        )
    assert client.get("/v1/presets").json() == {"presets": []}
    assert client.put("/v1/presets/mine", json={"operation": "thumbnail"}).status_code == 201

    stranger = platform.admin("create-account", "--credits", "10")
    with platform.client(stranger) as other:
        assert other.get("/v1/presets/mine").status_code == 404
        obj = upload(other, EXIF / "Landscape_3.jpg")
        refused = other.post(
            "/v1/hypermedia/process", json={"object_id": obj["object_id"], "operations": [{"preset": "mine"}]}
        )
        assert (refused.status_code, refused.json()["error_code"]) == (422, "UNKNOWN_PRESET")
        mixed = other.post(
            "/v1/hypermedia/process",
            json={"object_id": obj["object_id"], "operations": [{"preset": "mine", "params": {}}]},
        )
        assert mixed.status_code == 422 and mixed.json()["error_code"] == "INVALID_REQUEST"
