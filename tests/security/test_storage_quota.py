"""The per-account storage quota (issue 14, item 5; ADR 0029): uploads past an account's bytes or
objects answer 403 ``STORAGE_QUOTA_EXCEEDED`` with the numbers and store nothing (no row, no
bytes), concurrent uploads never take an account past its limit, deleting an original gives its
room back, and credits play no part (an account without credits uploads up to its quota only).
Every request goes through REST or gRPC to a real platform."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import httpx
import psycopg
import pytest

from hypermedia.api.jobs.v1 import jobs_pb2, jobs_pb2_grpc
from hypermedia.core.errors import ERROR_CODE_METADATA_KEY, ERROR_DETAILS_METADATA_KEY
from tests.e2e.conftest import RunningPlatform, isolated_platform

DEFAULT_BYTES = 400_000
DEFAULT_OBJECTS = 50
JPEG = (Path(__file__).resolve().parents[1] / "data" / "exif-orientation" / "Landscape_1.jpg").read_bytes()


@pytest.fixture(scope="module")
def quota_platform(tmp_root: Path, database_url: str, nats_url: str) -> Iterator[RunningPlatform]:
    """Gateway, credits and storage (no worker: a job stays queued) with small default quotas."""
    with isolated_platform(
        tmp_root,
        database_url,
        nats_url,
        "quota",
        services="credits,storage,gateway",
        HM_STORAGE_QUOTA_BYTES=str(DEFAULT_BYTES),
        HM_STORAGE_QUOTA_OBJECTS=str(DEFAULT_OBJECTS),
    ) as running:
        yield running


def _account(platform: RunningPlatform, credits: str = "100", **limits: int) -> dict[str, Any]:
    account = platform.admin("create-account", "--credits", credits)
    if limits:
        args = [f"--{name.replace('_', '-')}={value}" for name, value in limits.items()]
        quota = platform.admin("set-storage-quota", account["account_id"], *args)
        assert {k: quota[k] for k in limits} == limits
    return account


def _file(size: int) -> bytes:
    """``size`` bytes of an unknown type (stored as application/octet-stream), unique each call."""
    return secrets.token_bytes(size)


def _post(client: httpx.Client, content: bytes) -> httpx.Response:
    return client.post("/v1/objects", files={"file": ("f.bin", content)})


def _stored(platform: RunningPlatform, account: dict[str, Any]) -> tuple[int, int, list[int]]:
    """(rows of the account's originals not deleted, their bytes, sizes of the files on disk)."""
    with psycopg.connect(platform.info["database_url"]) as conn:
        [(rows, total)] = conn.execute(
            "SELECT count(*), coalesce(sum(size_bytes), 0) FROM objects"
            " WHERE pool_id = %s AND source_object_id IS NULL AND state <> 'deleted'",
            (account["pool_id"],),
        ).fetchall()
    folder = Path(platform.info["objects_dir"]) / "originals" / account["pool_id"]
    files = sorted(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.exists() else []
    return rows, int(total), files


def test_an_upload_past_the_byte_limit_is_403_with_the_numbers_and_stores_nothing(
    quota_platform: RunningPlatform,
) -> None:
    account = _account(quota_platform, max_bytes=100_000)
    with quota_platform.client(account) as client:
        assert _post(client, _file(60_000)).status_code == 201
        assert _post(client, _file(40_000)).status_code == 201  # exactly at the limit
        before = _stored(quota_platform, account)
        refused = _post(client, _file(1))
    assert refused.status_code == 403, refused.text
    problem = refused.json()
    assert problem["error_code"] == "STORAGE_QUOTA_EXCEEDED"
    numbers = {
        k: problem[k] for k in ("used_bytes", "limit_bytes", "file_bytes", "used_objects", "limit_objects")
    }
    assert numbers == {
        "used_bytes": 100_000,
        "limit_bytes": 100_000,
        "file_bytes": 1,
        "used_objects": 2,
        "limit_objects": DEFAULT_OBJECTS,
    }
    assert "100000 of 100000 bytes" in problem["detail"]
    assert _stored(quota_platform, account) == before == (2, 100_000, [40_000, 60_000])


def test_the_quota_holds_over_grpc_too(quota_platform: RunningPlatform) -> None:
    account = _account(quota_platform, max_bytes=len(JPEG) + 10)
    metadata = (("authorization", f"Bearer {account['api_key']}"),)

    async def uploads() -> tuple[jobs_pb2.UploadObjectResponse, grpc.aio.AioRpcError]:
        async with grpc.aio.insecure_channel(quota_platform.grpc_addr) as chan:
            stub = jobs_pb2_grpc.JobServiceStub(chan)
            first = await stub.UploadObject(
                jobs_pb2.UploadObjectRequest(content=JPEG, filename="a.jpg"), metadata=metadata
            )
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.UploadObject(
                    jobs_pb2.UploadObjectRequest(content=JPEG, filename="b.jpg"), metadata=metadata
                )
            return first, refused.value

    first, refused = asyncio.run(uploads())
    assert first.size_bytes == len(JPEG)
    trailers = dict(refused.trailing_metadata() or ())
    assert (refused.code(), trailers[ERROR_CODE_METADATA_KEY]) == (
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "STORAGE_QUOTA_EXCEEDED",
    )
    assert f'"file_bytes":{len(JPEG)}' in str(trailers[ERROR_DETAILS_METADATA_KEY])
    assert _stored(quota_platform, account)[:2] == (1, len(JPEG))


def test_the_object_count_limit(quota_platform: RunningPlatform) -> None:
    account = _account(quota_platform, max_objects=2)
    with quota_platform.client(account) as client:
        assert [_post(client, _file(10)).status_code for _ in range(2)] == [201, 201]
        refused = _post(client, _file(10))
    assert (refused.status_code, refused.json()["error_code"]) == (403, "STORAGE_QUOTA_EXCEEDED")
    assert (refused.json()["used_objects"], refused.json()["limit_objects"]) == (2, 2)
    assert _stored(quota_platform, account)[0] == 2


def test_concurrent_uploads_do_not_overshoot(quota_platform: RunningPlatform) -> None:
    """Twelve uploads of 10,000 bytes at once against room for five: five are stored."""
    account = _account(quota_platform, max_bytes=50_000)
    with quota_platform.client(account) as client, ThreadPoolExecutor(12) as pool:
        statuses = sorted(pool.map(lambda _: _post(client, _file(10_000)).status_code, range(12)))
    assert statuses == [201] * 5 + [403] * 7
    assert _stored(quota_platform, account) == (5, 50_000, [10_000] * 5)
    with psycopg.connect(quota_platform.info["database_url"]) as conn:
        [(used_bytes, used_objects)] = conn.execute(
            "SELECT used_bytes, used_objects FROM storage_usage WHERE account_id = %s",
            (account["account_id"],),
        ).fetchall()
    assert (used_bytes, used_objects) == (50_000, 5)


def test_deleting_an_original_makes_room_again(quota_platform: RunningPlatform) -> None:
    account = _account(quota_platform, max_bytes=30_000, max_objects=2)
    other = _account(quota_platform)
    with quota_platform.client(account) as client:
        first = _post(client, _file(20_000)).json()
        assert _post(client, _file(10_000)).status_code == 201
        assert _post(client, _file(5_000)).status_code == 403
        with quota_platform.client(other) as theirs:
            assert theirs.delete(f"/v1/objects/{first['object_id']}").status_code == 404
        deleted = client.delete(f"/v1/objects/{first['object_id']}")
        assert deleted.status_code == 200, deleted.text
        assert deleted.json() == {
            "used_bytes": 10_000,
            "limit_bytes": 30_000,
            "used_objects": 1,
            "limit_objects": 2,
        }
        assert _stored(quota_platform, account) == (1, 10_000, [10_000])  # the bytes are gone
        assert client.delete(f"/v1/objects/{first['object_id']}").status_code == 404
        gone = client.post(
            "/v1/hypermedia/process", json={"object_id": first["object_id"], "operations": ["thumbnail"]}
        )
        assert gone.status_code == 404
        assert _post(client, _file(20_000)).status_code == 201
        assert client.delete("/v1/objects/not-a-uuid").status_code == 404


def test_an_original_with_an_unfinished_job_is_not_deleted(quota_platform: RunningPlatform) -> None:
    """No worker runs here, so the job stays queued: 409 until it is cancelled, then deleted; the
    job keeps its history."""
    account = _account(quota_platform)
    with quota_platform.client(account) as client:
        obj = client.post("/v1/objects", files={"file": ("a.jpg", JPEG)}).json()
        job_id = client.post(
            "/v1/hypermedia/process", json={"object_id": obj["object_id"], "operations": ["thumbnail"]}
        ).json()["job_ids"][0]
        busy = client.delete(f"/v1/objects/{obj['object_id']}")
        assert (busy.status_code, busy.json()["error_code"]) == (409, "OBJECT_IN_USE")
        assert client.post(f"/v1/jobs/{job_id}:cancel").json()["status"] == "cancelled"
        assert client.delete(f"/v1/objects/{obj['object_id']}").status_code == 200
        assert client.get(f"/v1/jobs/{job_id}").json()["status"] == "cancelled"


def test_an_account_without_credits_uploads_up_to_its_quota_only(quota_platform: RunningPlatform) -> None:
    account = _account(quota_platform, credits="0")
    with quota_platform.client(account) as client:
        assert client.get("/v1/credits").json()["balance"] == 0
        assert _post(client, _file(DEFAULT_BYTES)).status_code == 201  # the service's default limit
        refused = _post(client, _file(1))
    assert (refused.status_code, refused.json()["limit_bytes"]) == (403, DEFAULT_BYTES)


def test_admin_sets_and_resets_the_quota_over_grpc(quota_platform: RunningPlatform) -> None:
    account = _account(quota_platform, max_objects=1)
    metadata = (("authorization", f"Bearer {account['api_key']}"),)
    reset = quota_platform.admin("set-storage-quota", account["account_id"], "--default")
    assert (reset["max_bytes"], reset["max_objects"]) == (None, None)

    async def upload_and_delete() -> jobs_pb2.DeleteObjectResponse:
        async with grpc.aio.insecure_channel(quota_platform.grpc_addr) as chan:
            stub = jobs_pb2_grpc.JobServiceStub(chan)
            for _ in range(2):
                obj = await stub.UploadObject(
                    jobs_pb2.UploadObjectRequest(content=_file(100)), metadata=metadata
                )
            return await stub.DeleteObject(
                jobs_pb2.DeleteObjectRequest(object_id=obj.object_id), metadata=metadata
            )

    usage = asyncio.run(upload_and_delete())
    assert (usage.used_objects, usage.limit_objects, usage.used_bytes, usage.limit_bytes) == (
        1,
        DEFAULT_OBJECTS,
        100,
        DEFAULT_BYTES,
    )
