"""The storage service against a real Postgres, real HTTP, and a real (moto) S3 endpoint.

Each test gets its own service: gRPC on 127.0.0.1:0, the local HTTP app on a free port, objects in
a fresh directory; S3 tests get a private moto server and bucket.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urlsplit

import asyncpg
import boto3
import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from hypermedia.api.storage.v1 import storage_pb2, storage_pb2_grpc
from hypermedia.core.errors import ERROR_CODE_METADATA_KEY
from hypermedia.devtools.embedded import free_port
from hypermedia.engines.contract import CHECKPOINT_DIR, MAX_PART_BYTES, RESUME_DIR, OutputFile
from hypermedia.infra import mtls
from hypermedia.infra.httpserver import HttpServer
from hypermedia.infra.rpc import GrpcServer, channel
from hypermedia.jobs import checkpoints
from hypermedia.worker import transfer
from hypermedia.worker.checkpointing import Checkpointing
from hypermedia.worker.transfer import FileBody, Transfers, send_output
from services.storage.backends import ObjectBackend
from services.storage.localstore import LocalStore, build_app
from services.storage.s3store import S3Store
from services.storage.service import SERVICE_NAME, StorageServicer
from tests.helpers.jobs import claimed_job

REPO = Path(__file__).resolve().parents[2]
SIGNING_KEY = b"test-signing-key-0123456789"
MAX_PUT_BYTES = 1024 * 1024


@dataclass
class Running:
    stub: storage_pb2_grpc.StorageServiceStub
    grpc_target: str
    backend: ObjectBackend
    servicer: StorageServicer


@dataclass
class Tenant:
    account_id: str
    pool_id: str


async def _serve(pool: asyncpg.Pool, backend: ObjectBackend) -> AsyncIterator[Running]:
    servicer = StorageServicer(pool, backend, url_ttl_seconds=300, max_put_bytes=MAX_PUT_BYTES)
    server = GrpcServer(
        "127.0.0.1:0", [(storage_pb2_grpc.add_StorageServiceServicer_to_server, servicer)], [SERVICE_NAME]
    )
    await server.start()
    target = f"127.0.0.1:{server.port}"
    chan = channel(target)
    try:
        yield Running(storage_pb2_grpc.StorageServiceStub(chan), target, backend, servicer)
    finally:
        await chan.close()
        await server.stop(0)


@pytest.fixture
async def local(pool: asyncpg.Pool, tmp_path: Path) -> AsyncIterator[Running]:
    http = HttpServer("127.0.0.1", free_port())
    store = LocalStore(tmp_path / "objects", SIGNING_KEY, f"http://127.0.0.1:{http.port}")
    await http.start(build_app(store, MAX_PUT_BYTES))
    try:
        async for running in _serve(pool, store):
            yield running
    finally:
        await http.stop()


@pytest.fixture
def s3_bucket(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, str]]:
    """A private moto S3 server with one bucket: (endpoint_url, bucket)."""
    from moto.server import ThreadedMotoServer

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        endpoint = f"http://127.0.0.1:{port}"
        boto3.client("s3", region_name="us-east-1", endpoint_url=endpoint).create_bucket(Bucket="hm-test")
        yield endpoint, "hm-test"
    finally:
        server.stop()


@pytest.fixture
async def s3(pool: asyncpg.Pool, s3_bucket: tuple[str, str]) -> AsyncIterator[Running]:
    endpoint, bucket = s3_bucket
    async for running in _serve(pool, S3Store(bucket, "us-east-1", endpoint)):
        yield running


async def _tenant(pool: asyncpg.Pool) -> Tenant:
    account_id, pool_id = uuid.uuid4(), uuid.uuid4()
    await pool.execute("INSERT INTO accounts (account_id, name) VALUES ($1, 'test')", account_id)
    await pool.execute(
        "INSERT INTO pools (pool_id, account_id, name) VALUES ($1, $2, 'p')", pool_id, account_id
    )
    return Tenant(str(account_id), str(pool_id))


@pytest.fixture
async def tenant(pool: asyncpg.Pool) -> Tenant:
    return await _tenant(pool)


def _error_code(err: grpc.aio.AioRpcError) -> str:
    return dict(err.trailing_metadata() or ()).get(ERROR_CODE_METADATA_KEY, "")


async def _create(
    svc: Running, tenant: Tenant, data: bytes, mime: str = "image/png"
) -> storage_pb2.CreateUploadResponse:
    return await svc.stub.CreateUpload(
        storage_pb2.CreateUploadRequest(
            account_id=tenant.account_id,
            pool_id=tenant.pool_id,
            size_bytes=len(data),
            mime_type=mime,
            sha256=hashlib.sha256(data).hexdigest(),
            filename="../../holiday photo.png",
        )
    )


async def _upload(svc: Running, tenant: Tenant, data: bytes, mime: str = "image/png") -> storage_pb2.Object:
    created = await _create(svc, tenant, data, mime)
    async with httpx.AsyncClient() as http:
        put = await http.put(created.put_url, content=data, headers={"Content-Type": mime})
    assert put.status_code == 200, put.text
    done = await svc.stub.CompleteUpload(
        storage_pb2.CompleteUploadRequest(object_id=created.object.object_id)
    )
    return done.object


async def _check_upload_flow(svc: Running, tenant: Tenant, pool: asyncpg.Pool) -> storage_pb2.Object:
    data = os.urandom(200_000)
    created = await _create(svc, tenant, data)
    obj = created.object
    assert obj.state == "pending"
    assert obj.key == f"originals/{tenant.pool_id}/{obj.object_id}"
    assert created.expires_at.seconds > 0

    async with httpx.AsyncClient() as http:
        put = await http.put(created.put_url, content=data, headers={"Content-Type": "image/png"})
        assert put.status_code == 200, put.text
        done = await svc.stub.CompleteUpload(storage_pb2.CompleteUploadRequest(object_id=obj.object_id))
        assert done.object.state == "available"

        got = await svc.stub.GetObject(
            storage_pb2.GetObjectRequest(object_id=obj.object_id, account_id=tenant.account_id)
        )
        assert got.object.state == "available"
        assert got.object.size_bytes == len(data)
        assert got.object.sha256 == hashlib.sha256(data).hexdigest()
        assert got.object.mime_type == "image/png"
        assert got.object.source_object_id == ""

        presigned = await svc.stub.PresignGet(storage_pb2.PresignGetRequest(key=obj.key))
        download = await http.get(presigned.url)
        assert download.status_code == 200
        assert download.content == data
        assert download.headers["content-type"] == "image/png"

    owners = await pool.fetch(
        "SELECT account_id, role FROM object_ownership WHERE object_id = $1", uuid.UUID(obj.object_id)
    )
    assert [(str(r["account_id"]), r["role"]) for r in owners] == [(tenant.account_id, "owner")]
    filename = await pool.fetchval(
        "SELECT filename FROM objects WHERE object_id = $1", uuid.UUID(obj.object_id)
    )
    assert filename == "../../holiday photo.png"  # metadata only: the key ignores it
    return got.object


async def _check_output_flow(svc: Running, tenant: Tenant, pool: asyncpg.Pool) -> None:
    source = await _upload(svc, tenant, b"source bytes")
    output = b"\x89PNG derived" * 1000
    presigned = await svc.stub.PresignOutputPut(
        storage_pb2.PresignOutputPutRequest(
            source_object_id=source.object_id,
            profile_version=1,
            output_type="thumbnail",
            mime_type="image/webp",
        )
    )
    assert presigned.key == f"derived/{tenant.pool_id}/{source.object_id}/1/thumbnail"
    async with httpx.AsyncClient() as http:
        put = await http.put(presigned.url, content=output, headers={"Content-Type": "image/webp"})
        assert put.status_code == 200, put.text

    register = storage_pb2.RegisterOutputRequest(
        source_object_id=source.object_id,
        key=presigned.key,
        mime_type="image/webp",
        size_bytes=len(output),
        sha256=hashlib.sha256(output).hexdigest(),
    )
    first = (await svc.stub.RegisterOutput(register)).object
    second = (await svc.stub.RegisterOutput(register)).object
    assert first.object_id == second.object_id
    assert first.state == "available"
    assert first.source_object_id == source.object_id
    assert first.pool_id == tenant.pool_id
    assert await pool.fetchval("SELECT count(*) FROM objects WHERE key = $1", presigned.key) == 1
    # Ownership is copied from the source, so the owner sees the output.
    got = await svc.stub.GetObject(
        storage_pb2.GetObjectRequest(object_id=first.object_id, account_id=tenant.account_id)
    )
    assert got.object.size_bytes == len(output)

    with pytest.raises(grpc.aio.AioRpcError) as wrong:
        await svc.stub.RegisterOutput(
            storage_pb2.RegisterOutputRequest(
                source_object_id=source.object_id, key=presigned.key, mime_type="image/webp", size_bytes=5
            )
        )
    assert wrong.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert _error_code(wrong.value) == "UPLOAD_MISMATCH"

    with pytest.raises(grpc.aio.AioRpcError) as foreign:
        await svc.stub.RegisterOutput(
            storage_pb2.RegisterOutputRequest(
                source_object_id=source.object_id,
                key=f"derived/{tenant.pool_id}/{uuid.uuid4()}/1/thumbnail",
                mime_type="image/webp",
                size_bytes=len(output),
            )
        )
    assert foreign.value.code() == grpc.StatusCode.INVALID_ARGUMENT

    # DeleteOutput deletes only under the prefix of a job whose live attempt the request names.
    job_id = await _job(pool, tenant, source, attempt=2)

    def delete(key: str, attempt: int = 2, job: str = job_id) -> storage_pb2.DeleteOutputRequest:
        return storage_pb2.DeleteOutputRequest(key=key, job_id=job, attempt=attempt)

    for request, code in (
        (storage_pb2.DeleteOutputRequest(key=presigned.key), grpc.StatusCode.INVALID_ARGUMENT),
        (delete(presigned.key, attempt=1), grpc.StatusCode.FAILED_PRECONDITION),
        (delete(f"derived/{tenant.pool_id}/{uuid.uuid4()}/1/thumbnail"), grpc.StatusCode.INVALID_ARGUMENT),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await svc.stub.DeleteOutput(request)
        assert refused.value.code() == code
    assert await svc.backend.stat(presigned.key) is not None
    deleted = await svc.stub.DeleteOutput(delete(presigned.key))
    assert deleted.deleted
    assert await svc.backend.stat(presigned.key) is None
    assert await pool.fetchval("SELECT count(*) FROM objects WHERE key = $1", presigned.key) == 0
    again = await svc.stub.DeleteOutput(delete(presigned.key))
    assert not again.deleted

    with pytest.raises(grpc.aio.AioRpcError) as original:
        await svc.stub.DeleteOutput(delete(source.key))
    assert original.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert await svc.backend.stat(source.key) == len(b"source bytes")


async def _check_mismatch(svc: Running, tenant: Tenant) -> None:
    data = b"the declared bytes"
    created = await _create(svc, tenant, data)
    request = storage_pb2.CompleteUploadRequest(object_id=created.object.object_id)

    with pytest.raises(grpc.aio.AioRpcError) as nothing:
        await svc.stub.CompleteUpload(request)
    assert nothing.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert _error_code(nothing.value) == "UPLOAD_MISMATCH"

    async with httpx.AsyncClient() as http:
        put = await http.put(
            created.put_url, content=b"other bytes, same len", headers={"Content-Type": "image/png"}
        )
        assert put.status_code == 200
        with pytest.raises(grpc.aio.AioRpcError) as size:
            await svc.stub.CompleteUpload(request)
        assert _error_code(size.value) == "UPLOAD_MISMATCH"

        put = await http.put(
            created.put_url, content=b"THE DECLARED BYTES", headers={"Content-Type": "image/png"}
        )
        assert put.status_code == 200
        with pytest.raises(grpc.aio.AioRpcError) as digest:
            await svc.stub.CompleteUpload(request)
        assert digest.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert _error_code(digest.value) == "UPLOAD_MISMATCH"

        # Still pending, so invisible; the same URL can be used again.
        with pytest.raises(grpc.aio.AioRpcError) as pending:
            await svc.stub.GetObject(storage_pb2.GetObjectRequest(object_id=created.object.object_id))
        assert pending.value.code() == grpc.StatusCode.NOT_FOUND
        put = await http.put(created.put_url, content=data, headers={"Content-Type": "image/png"})
        assert put.status_code == 200
    done = await svc.stub.CompleteUpload(request)
    assert done.object.state == "available"
    assert (await svc.stub.CompleteUpload(request)).object.state == "available"  # idempotent


# --- local backend ---------------------------------------------------------------------------------


async def test_local_upload_flow(local: Running, tenant: Tenant, pool: asyncpg.Pool) -> None:
    obj = await _check_upload_flow(local, tenant, pool)
    assert isinstance(local.backend, LocalStore)
    assert (local.backend.root / obj.key).read_bytes().__len__() == obj.size_bytes


async def test_local_output_flow(local: Running, tenant: Tenant, pool: asyncpg.Pool) -> None:
    await _check_output_flow(local, tenant, pool)


async def test_local_complete_upload_mismatch(local: Running, tenant: Tenant) -> None:
    await _check_mismatch(local, tenant)


async def test_tampered_signature_and_wrong_content_type_are_403(local: Running, tenant: Tenant) -> None:
    created = await _create(local, tenant, b"abc")
    url = created.put_url
    sig = parse_qs(urlsplit(url).query)["sig"][0]
    tampered = url.replace(sig, ("0" if sig[0] != "0" else "1") + sig[1:])
    async with httpx.AsyncClient() as http:
        resp = await http.put(tampered, content=b"abc", headers={"Content-Type": "image/png"})
        assert resp.status_code == 403
        assert resp.headers["content-type"] == "application/problem+json"
        assert resp.json()["status"] == 403
        assert resp.json()["error_code"] == "URL_REJECTED"
        wrong_method = await http.delete(url)
        assert wrong_method.status_code == 405
        assert wrong_method.json()["error_code"] == "METHOD_NOT_ALLOWED"
        other_type = await http.put(url, content=b"abc", headers={"Content-Type": "text/html"})
        assert other_type.status_code == 403
        other_key = url.replace(created.object.object_id, str(uuid.uuid4()))
        assert (
            await http.put(other_key, content=b"abc", headers={"Content-Type": "image/png"})
        ).status_code == 403
        no_sig = url.split("?")[0]
        assert (await http.get(no_sig)).status_code == 403


async def test_signed_urls_answer_cross_origin_players_and_uploads(local: Running, tenant: Tenant) -> None:
    """hls.js on the app's origin reads fMP4 byte ranges from the store; a browser uploads with PUT."""
    origin = {"Origin": "https://app.example"}
    data = bytes(range(256)) * 40
    created = await _create(local, tenant, data, "video/mp4")
    async with httpx.AsyncClient() as http:
        preflight = await http.options(
            created.put_url,
            headers={
                **origin,
                "Access-Control-Request-Method": "PUT",
                "Access-Control-Request-Headers": "content-type",
            },
        )
        assert preflight.status_code == 200, preflight.text
        assert preflight.headers["access-control-allow-origin"] == "*"
        assert "PUT" in preflight.headers["access-control-allow-methods"]
        put = await http.put(created.put_url, content=data, headers={**origin, "Content-Type": "video/mp4"})
        assert put.status_code == 200, put.text
        assert put.headers["access-control-allow-origin"] == "*"
        await local.stub.CompleteUpload(storage_pb2.CompleteUploadRequest(object_id=created.object.object_id))

        url = (await local.stub.PresignGet(storage_pb2.PresignGetRequest(key=created.object.key))).url
        preflight = await http.options(
            url,
            headers={
                **origin,
                "Access-Control-Request-Method": "GET",
                "Access-Control-Request-Headers": "range",
            },
        )
        assert preflight.status_code == 200, preflight.text
        assert "range" in preflight.headers["access-control-allow-headers"].lower()
        part = await http.get(url, headers={**origin, "Range": "bytes=1000-1099"})
        assert part.status_code == 206
        assert part.content == data[1000:1100]
        assert part.headers["access-control-allow-origin"] == "*"
        exposed = part.headers["access-control-expose-headers"].lower()
        assert "content-range" in exposed and "content-length" in exposed
        assert part.headers["content-range"] == f"bytes 1000-1099/{len(data)}"

        # The signature still decides: a cross-origin request with a bad one is refused.
        refused = await http.get(url.replace("sig=", "sig=0"), headers=origin)
        assert refused.status_code == 403
        assert refused.headers["access-control-allow-origin"] == "*"  # the player can read the reason


async def test_expired_url_is_403(local: Running, tenant: Tenant) -> None:
    obj = await _upload(local, tenant, b"abc")
    expired, _ = await local.backend.presign_get(obj.key, -5)
    fresh, _ = await local.backend.presign_get(obj.key, 60)
    async with httpx.AsyncClient() as http:
        resp = await http.get(expired)
        assert resp.status_code == 403
        assert resp.headers["content-type"] == "application/problem+json"
        assert (await http.get(fresh)).content == b"abc"


def _raw_get(port: int, target: str) -> int:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(f"GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        head = sock.recv(4096).decode("latin-1")
    return int(head.split(" ", 2)[1])


async def test_traversal_keys_are_rejected(local: Running, tenant: Tenant) -> None:
    obj = await _upload(local, tenant, b"abc")
    url, _ = await local.backend.presign_get(obj.key, 60)
    parts = urlsplit(url)
    query = parts.query
    port = parts.port
    assert port is not None
    for path in (
        "/o/originals/../../../etc/passwd",
        "/o/originals/%2e%2e/%2E%2E/etc/passwd",
        "/o//etc/passwd",
        "/o/originals\\..\\x",
        f"/o/{obj.key}/.",
    ):
        status = await asyncio.to_thread(_raw_get, port, f"{path}?{query}")
        assert status == 400, path
    async with httpx.AsyncClient() as http:
        resp = await http.get(f"{parts.scheme}://{parts.netloc}/o/originals/%2E%2E/secret?{query}")
        assert resp.status_code == 400
        assert resp.headers["content-type"] == "application/problem+json"


async def test_put_over_limit_is_413_and_leaves_nothing(local: Running, tenant: Tenant) -> None:
    assert isinstance(local.backend, LocalStore)
    key = f"originals/{tenant.pool_id}/{uuid.uuid4()}"
    url, _ = await local.backend.presign_put(key, 60, "application/octet-stream")

    async def body():  # chunked: no Content-Length to reject early
        for _ in range(17):
            yield b"x" * 65536

    headers = {"Content-Type": "application/octet-stream"}
    async with httpx.AsyncClient() as http:
        declared = await http.put(url, content=b"x" * (MAX_PUT_BYTES + 1), headers=headers)
        assert declared.status_code == 413
        streamed = await http.put(url, content=body(), headers=headers)
        assert streamed.status_code == 413
    assert await local.backend.stat(key) is None
    leftovers = (
        list((local.backend.root / "originals").rglob("*"))
        if (local.backend.root / "originals").exists()
        else []
    )
    assert [p for p in leftovers if p.is_file()] == []


async def test_get_object_hides_other_accounts_and_bad_ids(
    local: Running, tenant: Tenant, pool: asyncpg.Pool
) -> None:
    obj = await _upload(local, tenant, b"mine")
    stranger = await _tenant(pool)
    answers = []
    for request in (
        storage_pb2.GetObjectRequest(object_id=obj.object_id, account_id=stranger.account_id),
        storage_pb2.GetObjectRequest(object_id=str(uuid.uuid4()), account_id=stranger.account_id),
        storage_pb2.GetObjectRequest(object_id="not-a-uuid", account_id=stranger.account_id),
        storage_pb2.GetObjectRequest(object_id=obj.object_id, account_id="also-not-a-uuid"),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await local.stub.GetObject(request)
        answers.append((err.value.code(), err.value.details(), _error_code(err.value)))
    assert answers == [(grpc.StatusCode.NOT_FOUND, "object not found", "NOT_FOUND")] * 4
    # Without account_id (internal callers) the object is visible.
    assert (
        await local.stub.GetObject(storage_pb2.GetObjectRequest(object_id=obj.object_id))
    ).object.key == obj.key


async def test_create_upload_checks_pool_owner_and_input(
    local: Running, tenant: Tenant, pool: asyncpg.Pool
) -> None:
    stranger = await _tenant(pool)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await _create(local, Tenant(stranger.account_id, tenant.pool_id), b"x")
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await _create(local, Tenant(tenant.account_id, "nope"), b"x")
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await local.stub.CreateUpload(
            storage_pb2.CreateUploadRequest(
                account_id=tenant.account_id,
                pool_id=tenant.pool_id,
                size_bytes=MAX_PUT_BYTES + 1,
                mime_type="image/png",
                sha256="0" * 64,
            )
        )
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await local.stub.CreateUpload(
            storage_pb2.CreateUploadRequest(
                account_id=tenant.account_id,
                pool_id=tenant.pool_id,
                size_bytes=1,
                mime_type="image/png",
                sha256="xyz",
            )
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await local.stub.PresignOutputPut(
            storage_pb2.PresignOutputPutRequest(
                source_object_id=str(uuid.uuid4()),
                profile_version=1,
                output_type="thumbnail",
                mime_type="image/png",
            )
        )
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


async def test_health_and_reflection(local: Running) -> None:
    async with channel(local.grpc_target) as chan:
        health = health_pb2_grpc.HealthStub(chan)
        for service in ("", SERVICE_NAME):
            resp = await health.Check(health_pb2.HealthCheckRequest(service=service))
            assert resp.status == health_pb2.HealthCheckResponse.SERVING

    def reflected() -> tuple[list[str], list[str]]:
        with grpc.insecure_channel(local.grpc_target) as sync_chan:
            db = ProtoReflectionDescriptorDatabase(sync_chan)
            services = list(db.get_services())
            methods = [m.name for m in db.FindFileContainingSymbol(SERVICE_NAME).service[0].method]
            return services, methods

    services, methods = await asyncio.to_thread(reflected)
    assert SERVICE_NAME in services
    assert "RegisterOutput" in methods


# --- S3 backend ------------------------------------------------------------------------------------


async def test_s3_upload_flow(s3: Running, tenant: Tenant, pool: asyncpg.Pool) -> None:
    await _check_upload_flow(s3, tenant, pool)


async def test_s3_output_flow(s3: Running, tenant: Tenant, pool: asyncpg.Pool) -> None:
    await _check_output_flow(s3, tenant, pool)


async def test_s3_complete_upload_mismatch(s3: Running, tenant: Tenant) -> None:
    await _check_mismatch(s3, tenant)


async def _job(pool: asyncpg.Pool, tenant: Tenant, source: storage_pb2.Object, *, attempt: int = 1) -> str:
    """A ``thumbnail`` v1 job on ``source`` whose live attempt is ``attempt`` (``processing``)."""
    job_id = uuid.uuid4()
    await pool.execute(
        """INSERT INTO processing_jobs (job_id, account_id, object_id, request_id, operation,
               profile_version, queue, priority, status, attempt_count, max_attempts, estimated_credits)
           VALUES ($1, $2, $3, $4, 'thumbnail', 1, 'images', 5, 'processing', $5, 3, 1000)""",
        job_id,
        uuid.UUID(tenant.account_id),
        uuid.UUID(source.object_id),
        uuid.uuid4(),
        attempt,
    )
    return str(job_id)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def _rpc_error(call: object) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call  # type: ignore[misc]
    return err.value


async def _check_grant_flow(svc: Running, tenant: Tenant, pool: asyncpg.Pool) -> None:
    """GrantJob gives the input and one grant for every output under the job's prefix;
    RegisterOutputs takes them in one call; hostile registrations register nothing."""
    source = await _upload(svc, tenant, b"grant source bytes")
    job_id = await _job(pool, tenant, source)
    granted = await svc.stub.GrantJob(storage_pb2.GrantJobRequest(job_id=job_id, attempt=1))
    assert granted.source.object_id == source.object_id and granted.source.mime_type == "image/png"
    prefix = f"derived/{tenant.pool_id}/{source.object_id}/1/"
    assert granted.outputs.key_prefix == prefix and granted.outputs.max_bytes == MAX_PUT_BYTES
    outputs = {f"{prefix}page-{n}.webp": os.urandom(5000 + n) for n in range(3)}
    async with httpx.AsyncClient() as http:
        got = await http.get(granted.get_url)
        assert got.status_code == 200 and got.content == b"grant source bytes"
        for key, data in outputs.items():
            sent = await send_output(http, granted.outputs, key, data, "image/webp", _sha(data))
            assert sent.is_success, sent.text
    uploads = [
        storage_pb2.OutputUpload(key=k, mime_type="image/webp", size_bytes=len(d), sha256=_sha(d))
        for k, d in outputs.items()
    ]
    register = storage_pb2.RegisterOutputsRequest(
        job_id=job_id, attempt=1, outputs=uploads, input_facts=storage_pb2.InputFacts(width=4000, height=3000)
    )
    first = (await svc.stub.RegisterOutputs(register)).objects
    facts_of_source = "SELECT facts FROM objects WHERE object_id = $1::uuid"
    assert await pool.fetchval(facts_of_source, source.object_id) == {"width": 4000, "height": 3000}
    assert [o.key for o in first] == list(outputs)
    assert [o.sha256 for o in first] == [_sha(d) for d in outputs.values()]
    assert {o.state for o in first} == {"available"} and {o.source_object_id for o in first} == {
        source.object_id
    }
    register.input_facts.CopyFrom(storage_pb2.InputFacts(pages=12, media_seconds=-1.0, width=2_000_000))
    again = (await svc.stub.RegisterOutputs(register)).objects
    assert [o.object_id for o in again] == [o.object_id for o in first]  # idempotent per key
    # Facts merge over earlier ones; a bad value (a hostile child's word) and half a size are dropped.
    assert await pool.fetchval(facts_of_source, source.object_id) == {
        "width": 4000,
        "height": 3000,
        "pages": 12,
    }
    owned = await svc.stub.GetObject(
        storage_pb2.GetObjectRequest(object_id=first[0].object_id, account_id=tenant.account_id)
    )
    assert owned.object.size_bytes == len(outputs[f"{prefix}page-0.webp"])

    async def registered(key: str) -> int:
        return int(await pool.fetchval("SELECT count(*) FROM objects WHERE key = $1", key))

    # A new output uploaded for real, sent along with each hostile one: it must not be registered.
    fresh_key, fresh = f"{prefix}fresh.webp", b"fresh output"
    async with httpx.AsyncClient() as http:
        assert (
            await send_output(http, granted.outputs, fresh_key, fresh, "image/webp", _sha(fresh))
        ).is_success
    good = storage_pb2.OutputUpload(
        key=fresh_key, mime_type="image/webp", size_bytes=len(fresh), sha256=_sha(fresh)
    )
    for hostile, code, error_code in [
        (f"derived/{tenant.pool_id}/{source.object_id}/2/page-0.webp", grpc.StatusCode.INVALID_ARGUMENT, ""),
        (f"derived/{tenant.pool_id}/{uuid.uuid4()}/1/page-0.webp", grpc.StatusCode.INVALID_ARGUMENT, ""),
        (f"{prefix}a/b", grpc.StatusCode.INVALID_ARGUMENT, ""),
        (source.key, grpc.StatusCode.INVALID_ARGUMENT, ""),
    ]:
        bad = storage_pb2.OutputUpload(
            key=hostile, mime_type="image/webp", size_bytes=len(fresh), sha256=_sha(fresh)
        )
        err = await _rpc_error(
            svc.stub.RegisterOutputs(
                storage_pb2.RegisterOutputsRequest(job_id=job_id, attempt=1, outputs=[good, bad])
            )
        )
        assert (err.code(), _error_code(err) if error_code else "") == (code, error_code), hostile
        assert "outside the job's prefix" in (err.details() or "")
    # A SHA-256 that is not the stored bytes': a clear error, nothing registered.
    wrong = storage_pb2.OutputUpload(
        key=fresh_key, mime_type="image/webp", size_bytes=len(fresh), sha256="0" * 64
    )
    err = await _rpc_error(
        svc.stub.RegisterOutputs(
            storage_pb2.RegisterOutputsRequest(job_id=job_id, attempt=1, outputs=[wrong])
        )
    )
    assert (err.code(), _error_code(err)) == (grpc.StatusCode.FAILED_PRECONDITION, "UPLOAD_MISMATCH")
    assert "SHA-256 differs" in (err.details() or "")
    missing = storage_pb2.OutputUpload(
        key=f"{prefix}never", mime_type="image/webp", size_bytes=1, sha256="0" * 64
    )
    err = await _rpc_error(
        svc.stub.RegisterOutputs(
            storage_pb2.RegisterOutputsRequest(job_id=job_id, attempt=1, outputs=[good, missing])
        )
    )
    assert _error_code(err) == "UPLOAD_MISMATCH" and await registered(fresh_key) == 0
    # A stale attempt gets no grant and registers nothing; neither does a job that ended.
    for attempt in (0, 2):
        err = await _rpc_error(svc.stub.GrantJob(storage_pb2.GrantJobRequest(job_id=job_id, attempt=attempt)))
        assert (err.code(), _error_code(err)) == (grpc.StatusCode.FAILED_PRECONDITION, "ATTEMPT_FENCED")
        err = await _rpc_error(
            svc.stub.RegisterOutputs(
                storage_pb2.RegisterOutputsRequest(job_id=job_id, attempt=attempt, outputs=[good])
            )
        )
        assert _error_code(err) == "ATTEMPT_FENCED"
    # A cancel requested meanwhile is the worker's to settle (as cancelled): still granted.
    await pool.execute(
        "UPDATE processing_jobs SET status = 'cancel_requested' WHERE job_id = $1", uuid.UUID(job_id)
    )
    regranted = await svc.stub.GrantJob(storage_pb2.GrantJobRequest(job_id=job_id, attempt=1))
    assert regranted.outputs.key_prefix == prefix
    await pool.execute("UPDATE processing_jobs SET status = 'completed' WHERE job_id = $1", uuid.UUID(job_id))
    err = await _rpc_error(
        svc.stub.RegisterOutputs(storage_pb2.RegisterOutputsRequest(job_id=job_id, attempt=1, outputs=[good]))
    )
    assert _error_code(err) == "ATTEMPT_FENCED" and await registered(fresh_key) == 0
    err = await _rpc_error(
        svc.stub.GrantJob(storage_pb2.GrantJobRequest(job_id=str(uuid.uuid4()), attempt=1))
    )
    assert err.code() == grpc.StatusCode.NOT_FOUND


async def test_local_grant_flow(local: Running, tenant: Tenant, pool: asyncpg.Pool) -> None:
    await _check_grant_flow(local, tenant, pool)


async def test_s3_grant_flow(s3: Running, tenant: Tenant, pool: asyncpg.Pool) -> None:
    await _check_grant_flow(s3, tenant, pool)


async def _check_checkpoint_flow(svc: Running, tenant: Tenant, pool: asyncpg.Pool) -> None:
    """ADR 0069: a part uploaded through the job's grant and recorded is given back as a GET URL
    with the next grant; a recorded key that is not the job's own checkpoint key, or a part
    whose name is longer than parts now are, is never presigned, and the sweep deletes the bytes
    of an ended job's parts (never a foreign key's) and forgets every row."""
    source = await _upload(svc, tenant, b"checkpointed source")
    job_id = await _job(pool, tenant, source)
    granted = await svc.stub.GrantJob(storage_pb2.GrantJobRequest(job_id=job_id, attempt=1))
    assert dict(granted.checkpoints) == {}
    part, foreign = b"page one, kept", b"an output of another job"
    key = checkpoints.key_of(granted.outputs.key_prefix, job_id, "page-00001")
    foreign_key = f"{granted.outputs.key_prefix}thumbnail-0123456789abcdef"
    async with httpx.AsyncClient() as http:
        # The part streamed from a file, as the worker sends it (a transcode's rendition is too
        # large to hold in memory). Bytes changed after they were hashed are refused by the
        # local store; moto keeps no checksum of POST uploads (ADR 0036), S3 refuses them, and
        # a restore checks the recorded SHA-256 either way.
        with tempfile.TemporaryFile() as file:
            file.write(b"page 0ne, kept")
            file.flush()
            body = FileBody(file.fileno(), len(part))
            if granted.outputs.method == "PUT":
                refused = await send_output(http, granted.outputs, key, body, "application/zip", _sha(part))
                assert refused.status_code == 400, refused.text
                assert await svc.backend.stat(key) is None
            os.pwrite(file.fileno(), part, 0)
            os.pwrite(file.fileno(), b" and bytes the child added after the hash", len(part))
            sent = await send_output(http, granted.outputs, key, body, "application/zip", _sha(part))
            assert sent.is_success, sent.text
            assert await svc.backend.stat(key) == len(part), "only the bytes that were hashed"
        sent = await send_output(
            http, granted.outputs, foreign_key, foreign, "application/zip", _sha(foreign)
        )
        assert sent.is_success, sent.text
    # A row from before part names were bounded to 12 characters (the table's check takes 64):
    # neither presigned nor a stop to the sweep.
    long_name = "page-00003-of-an-older-worker"
    long_key = f"{granted.outputs.key_prefix}checkpoint-{job_id}-{long_name}.zip"
    for name, k, data in (
        ("page-00001", key, part),
        ("page-00002", foreign_key, foreign),
        (long_name, long_key, b"never stored"),
    ):
        await pool.execute(
            "INSERT INTO job_checkpoints (job_id, part, key, size_bytes, sha256, attempt) VALUES ($1, $2, $3, $4, $5, 1)",
            uuid.UUID(job_id),
            name,
            k,
            len(data),
            _sha(data),
        )

    regranted = await svc.stub.GrantJob(storage_pb2.GrantJobRequest(job_id=job_id, attempt=1))
    assert set(regranted.checkpoints) == {"page-00001"}
    async with httpx.AsyncClient() as http:
        got = await http.get(regranted.checkpoints["page-00001"])
        assert (got.status_code, got.content) == (200, part)

    assert await svc.servicer.sweep_checkpoints() == 0, "the job still runs"
    await pool.execute("UPDATE processing_jobs SET status = 'completed' WHERE job_id = $1", uuid.UUID(job_id))
    assert await svc.servicer.sweep_checkpoints() == 3
    assert (
        await pool.fetchval("SELECT count(*) FROM job_checkpoints WHERE job_id = $1", uuid.UUID(job_id)) == 0
    )
    assert await svc.backend.stat(key) is None
    assert await svc.backend.stat(foreign_key) is not None


async def test_local_checkpoint_flow(local: Running, tenant: Tenant, pool: asyncpg.Pool) -> None:
    await _check_checkpoint_flow(local, tenant, pool)


async def test_a_part_the_store_will_not_delete_goes_behind_the_others(
    local: Running, tenant: Tenant, pool: asyncpg.Pool
) -> None:
    source = await _upload(local, tenant, b"two checkpointed jobs")
    stuck_job, other_job = await _job(pool, tenant, source), await _job(pool, tenant, source)
    granted = await local.stub.GrantJob(storage_pb2.GrantJobRequest(job_id=stuck_job, attempt=1))
    prefix = granted.outputs.key_prefix
    stuck_key = checkpoints.key_of(prefix, stuck_job, "page-00001")
    local.backend.path(stuck_key).mkdir(parents=True)  # type: ignore[attr-defined]
    (local.backend.path(stuck_key) / "x").write_bytes(b"a directory unlink cannot remove")  # type: ignore[attr-defined]
    for job_id, age in ((stuck_job, "2 minutes"), (other_job, "1 minute")):
        await pool.execute(
            "INSERT INTO job_checkpoints (job_id, part, key, size_bytes, sha256, attempt, created_at)"
            f" VALUES ($1, 'page-00001', $2, 1, $3, 1, now() - interval '{age}')",
            uuid.UUID(job_id),
            checkpoints.key_of(prefix, job_id, "page-00001"),
            "0" * 64,
        )
        await pool.execute(
            "UPDATE processing_jobs SET status = 'failed' WHERE job_id = $1", uuid.UUID(job_id)
        )

    # A batch of one takes the oldest, which cannot be deleted; the next sweep takes the other.
    assert await local.servicer.sweep_checkpoints(batch=1) == 0
    assert await local.servicer.sweep_checkpoints(batch=1) == 1
    left = await pool.fetch(
        "SELECT job_id::text FROM job_checkpoints WHERE job_id = ANY($1::uuid[])", [stuck_job, other_job]
    )
    assert [r["job_id"] for r in left] == [stuck_job]
    await pool.execute(
        "DELETE FROM job_checkpoints WHERE job_id = $1", uuid.UUID(stuck_job)
    )  # the module's pool


async def test_s3_checkpoint_flow(s3: Running, tenant: Tenant, pool: asyncpg.Pool) -> None:
    await _check_checkpoint_flow(s3, tenant, pool)


async def test_s3_grant_is_a_post_policy_on_the_jobs_prefix(
    s3: Running, tenant: Tenant, pool: asyncpg.Pool
) -> None:
    """The S3 grant is a presigned POST whose policy binds the prefix, asks S3 to verify each
    upload's SHA-256, and caps the size; moto stores what it is sent."""
    source = await _upload(s3, tenant, b"s3 source")
    job_id = await _job(pool, tenant, source)
    grant = (await s3.stub.GrantJob(storage_pb2.GrantJobRequest(job_id=job_id, attempt=1))).outputs
    assert grant.method == "POST" and "key" not in grant.fields
    policy = json.loads(base64.b64decode(grant.fields["policy"]))
    conditions = policy["conditions"]
    assert ["starts-with", "$key", grant.key_prefix] in conditions
    assert {"x-amz-checksum-algorithm": "SHA256"} in conditions
    assert ["starts-with", "$x-amz-checksum-sha256", ""] in conditions
    assert ["content-length-range", 0, MAX_PUT_BYTES] in conditions


async def test_local_grant_refuses_hostile_uploads(
    local: Running, tenant: Tenant, pool: asyncpg.Pool
) -> None:
    """Through the local store's prefix grant: a wrong checksum stores nothing (400
    CHECKSUM_MISMATCH), a key outside the prefix, a tampered or expired grant are 403, and an
    upload without a checksum is 400. What was written keeps its SHA-256 (no second read)."""
    store = local.backend
    assert isinstance(store, LocalStore)
    source = await _upload(local, tenant, b"local source")
    job_id = await _job(pool, tenant, source)
    grant = (await local.stub.GrantJob(storage_pb2.GrantJobRequest(job_id=job_id, attempt=1))).outputs
    assert grant.method == "PUT"
    key, data = f"{grant.key_prefix}thumbnail", b"thumbnail bytes"
    async with httpx.AsyncClient() as http:
        mismatch = await send_output(http, grant, key, data, "image/webp", _sha(b"other bytes"))
        assert mismatch.status_code == 400 and mismatch.json()["error_code"] == "CHECKSUM_MISMATCH"
        assert await store.stat(key) is None
        assert not list(store.root.rglob(".*.part"))  # the temporary file went too
        for hostile in (
            f"derived/{tenant.pool_id}/{uuid.uuid4()}/1/thumbnail",
            f"{grant.key_prefix}a/b",
            source.key,
        ):
            refused = await send_output(http, grant, hostile, data, "image/webp", _sha(data))
            assert refused.status_code in (400, 403) and refused.json()["error_code"] in (
                "URL_REJECTED",
                "INVALID_KEY",
            )
        outside = storage_pb2.OutputGrant()
        outside.CopyFrom(grant)
        outside.fields["prefix"] = f"derived/{tenant.pool_id}/"  # widened, signature unchanged
        widened = await send_output(
            http, outside, f"derived/{tenant.pool_id}/x", data, "image/webp", _sha(data)
        )
        assert widened.status_code == 403
        tampered = storage_pb2.OutputGrant()
        tampered.CopyFrom(grant)
        tampered.fields["sig"] = "0" * 64
        assert (await send_output(http, tampered, key, data, "image/webp", _sha(data))).status_code == 403
        tampered.CopyFrom(grant)
        tampered.fields["expires"] = str(int(tampered.fields["expires"]) + 3600)
        assert (await send_output(http, tampered, key, data, "image/webp", _sha(data))).status_code == 403
        _method, url, fields, _ = await store.grant_outputs(grant.key_prefix, -1, MAX_PUT_BYTES)
        expired = await http.put(
            f"{url}{key}?{urlencode(fields)}",
            content=data,
            headers={"x-amz-checksum-sha256": base64.b64encode(hashlib.sha256(data).digest()).decode()},
        )
        assert expired.status_code == 403 and expired.json()["error_code"] == "URL_REJECTED"
        bare = await http.put(f"{grant.url}{key}?{urlencode(dict(grant.fields))}", content=data)
        assert bare.status_code == 400 and bare.json()["error_code"] == "INVALID_CHECKSUM"
        assert await store.stat(key) is None
        assert (await send_output(http, grant, key, data, "image/webp", _sha(data))).status_code == 200
    assert await store.stat(key) == len(data)
    assert await store.verified_sha256(key) == _sha(data)


async def test_s3_unreachable_is_unavailable(
    pool: asyncpg.Pool, tenant: Tenant, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    store = S3Store("hm-test", "us-east-1", f"http://127.0.0.1:{free_port()}")
    async for svc in _serve(pool, store):
        created = await _create(svc, tenant, b"abc")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await svc.stub.CompleteUpload(
                storage_pb2.CompleteUploadRequest(object_id=created.object.object_id)
            )
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert _error_code(err.value) == "STORAGE_UNAVAILABLE"


# --- entry point -----------------------------------------------------------------------------------


def test_main_exits_78_on_bad_config_without_printing_secrets() -> None:
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HM_DATABASE_URL": "postgresql://hm:supersecretpw@db/hm",
        "HM_STORAGE_SIGNING_KEY": "shortkey",
        "HM_STORAGE_HTTP_PORT": "99999",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "services.storage"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 78
    assert "HM_STORAGE_HTTP_PORT" in proc.stderr
    assert "supersecretpw" not in proc.stderr and "shortkey" not in proc.stderr


async def test_main_serves_and_stops_on_sigterm(database_url: str, tmp_path: Path) -> None:
    grpc_port, http_port = free_port(), free_port()
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HM_DATABASE_URL": database_url,
        "HM_STORAGE_BIND": f"127.0.0.1:{grpc_port}",
        "HM_STORAGE_HTTP_PORT": str(http_port),
        "HM_STORAGE_DIR": str(tmp_path / "objects"),
        "HM_STORAGE_SIGNING_KEY": "x" * 32,
        # Service authentication is on unless the environment turns it off (ADR 0044).
        **mtls.issue_all(tmp_path / "tls")["storage"],
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "services.storage",
        cwd=REPO,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        gateway = mtls.Tls.from_dir(tmp_path / "tls", "gateway")
        async with channel(f"127.0.0.1:{grpc_port}", gateway, "storage") as chan:
            health = health_pb2_grpc.HealthStub(chan)
            for _ in range(100):
                try:
                    resp = await health.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=1)
                    break
                except grpc.aio.AioRpcError:
                    await asyncio.sleep(0.1)
            else:
                pytest.fail("storage service did not become healthy")
            assert resp.status == health_pb2.HealthCheckResponse.SERVING
        async with httpx.AsyncClient() as http:
            assert (await http.get(f"http://127.0.0.1:{http_port}/o/a/b")).status_code == 403
        proc.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.wait_for(proc.communicate(), 30)
        assert proc.returncode == 0, stderr.decode()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


@pytest.mark.parametrize("bind", ["9464", "127.0.0.1:{taken}"])
def test_main_exits_78_when_its_metrics_bind_is_malformed_or_taken(bind: str) -> None:
    """``HM_METRICS_BIND`` (ADR 0061) is checked before anything starts: a malformed value or a
    port another socket holds is exit 78 with the variable named, not a traceback."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        env = {
            "PATH": os.environ.get("PATH", ""),
            "HM_DATABASE_URL": "postgresql://hm@127.0.0.1:9/hm",
            "HM_METRICS_BIND": bind.format(taken=holder.getsockname()[1]),
        }
        proc = subprocess.run(
            [sys.executable, "-m", "services.storage"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert proc.returncode == 78, proc.stderr
    assert "storage: HM_METRICS_BIND: cannot serve metrics" in proc.stderr
    assert "Traceback" not in proc.stderr


async def _derive(
    svc: Running, pool: asyncpg.Pool, tenant: Tenant, source: storage_pb2.Object
) -> tuple[storage_pb2.Object, str]:
    """An output of a (``processing``) job on ``source``, uploaded and registered as a worker does."""
    job_id = await _job(pool, tenant, source)
    granted = await svc.stub.GrantJob(storage_pb2.GrantJobRequest(job_id=job_id, attempt=1))
    key, data = f"{granted.outputs.key_prefix}out.webp", os.urandom(3000)
    async with httpx.AsyncClient() as http:
        sent = await send_output(http, granted.outputs, key, data, "image/webp", _sha(data))
        assert sent.is_success, sent.text
    upload = storage_pb2.OutputUpload(
        key=key, mime_type="image/webp", size_bytes=len(data), sha256=_sha(data)
    )
    registered = await svc.stub.RegisterOutputs(
        storage_pb2.RegisterOutputsRequest(job_id=job_id, attempt=1, outputs=[upload])
    )
    return registered.objects[0], job_id


async def test_deleting_an_original_takes_every_object_derived_from_it_at_any_depth(
    local: Running, tenant: Tenant, pool: asyncpg.Pool
) -> None:
    """Issue 22 item 3 (review findings): an output may be processed too. While a job on an
    output of an output runs, the original is OBJECT_IN_USE and nothing is deleted; once it ended,
    the original, its output and the output's output all go, rows and bytes."""
    original = await _upload(local, tenant, b"the original")
    output, first_job = await _derive(local, pool, tenant, original)
    await pool.execute(
        "UPDATE processing_jobs SET status = 'completed' WHERE job_id = $1", uuid.UUID(first_job)
    )
    grandchild, running_job = await _derive(local, pool, tenant, output)
    objects = [original, output, grandchild]
    delete = storage_pb2.DeleteObjectRequest(account_id=tenant.account_id, object_id=original.object_id)

    refused = await _rpc_error(local.stub.DeleteObject(delete))
    assert (refused.code(), _error_code(refused)) == (grpc.StatusCode.FAILED_PRECONDITION, "OBJECT_IN_USE")
    states = await pool.fetch(
        "SELECT state FROM objects WHERE object_id = ANY($1::uuid[])",
        [uuid.UUID(o.object_id) for o in objects],
    )
    assert {r["state"] for r in states} == {"available"}
    assert all([await local.backend.stat(o.key) is not None for o in objects])

    await pool.execute(
        "UPDATE processing_jobs SET status = 'completed' WHERE job_id = $1", uuid.UUID(running_job)
    )
    await local.stub.DeleteObject(delete)
    states = await pool.fetch(
        "SELECT state FROM objects WHERE object_id = ANY($1::uuid[])",
        [uuid.UUID(o.object_id) for o in objects],
    )
    assert [r["state"] for r in states] == ["deleted"] * 3
    assert [await local.backend.stat(o.key) for o in objects] == [None, None, None]


# --- the worker's side of checkpoints (ADR 0069) against this store ------------------------------
# A whole part is recorded and stored once; what the job's child may have planted in its
# checkpoint directory (a symlink, an oversized file, a bad name) is never read or stored; a
# fenced attempt stores nothing; the next attempt gets the parts back from its grant.

CHECKPOINT_WORKER = "local/ocrworker/host/boot/g0/1"


async def _keep_once(
    keeper: Checkpointing, job: object, granted: storage_pb2.GrantJobResponse, job_dir: Path
) -> None:
    finished = asyncio.Event()
    finished.set()  # one pass, as after the child ended
    await keeper.keep(job, granted, job_dir, finished)  # type: ignore[arg-type]


async def test_whole_parts_are_kept_once_and_nothing_the_child_planted_is_read(
    local: Running, tenant: Tenant, pool: asyncpg.Pool, tmp_path: Path
) -> None:
    source = await _upload(local, tenant, b"a scanned document")
    job_id = await _job(pool, tenant, source)
    await pool.execute(
        "UPDATE processing_jobs SET claimed_by = $2 WHERE job_id = $1", uuid.UUID(job_id), CHECKPOINT_WORKER
    )
    job = claimed_job("ocr", "ocr", job_id=job_id, attempt=1)
    granted = await local.stub.GrantJob(storage_pb2.GrantJobRequest(job_id=job_id, attempt=1))
    job_dir = tmp_path / "job"
    parts = job_dir / CHECKPOINT_DIR
    parts.mkdir(parents=True)
    (parts / "page-00001.zip").write_bytes(b"page one")
    (parts / "page-00002.zip").symlink_to("/etc/passwd")
    with (parts / "page-00003.zip").open("wb") as big:
        big.truncate(MAX_PART_BYTES + 1)
    (parts / "Bad Name.zip").write_bytes(b"x")
    (parts / ".page-00004.tmp").write_bytes(b"half written")

    async with httpx.AsyncClient() as http:
        keeper = Checkpointing(Transfers(local.stub, http), http, pool, CHECKPOINT_WORKER, enabled=True)
        await _keep_once(keeper, job, granted, job_dir)
        kept = await checkpoints.of_job(pool, job_id)
        assert [(c.part, c.attempt, c.size_bytes) for c in kept] == [("page-00001", 1, 8)]
        prefix = granted.outputs.key_prefix
        assert await local.backend.stat(kept[0].key) == 8
        for part in ("page-00002", "page-00003"):
            assert await local.backend.stat(checkpoints.key_of(prefix, job_id, part)) is None

        # The attempt is fenced (its lease went to another worker): nothing recorded, nothing stored.
        await pool.execute(
            "UPDATE processing_jobs SET claimed_by = 'someone else' WHERE job_id = $1", uuid.UUID(job_id)
        )
        (parts / "page-00005.zip").write_bytes(b"page five")
        await _keep_once(keeper, job, granted, job_dir)
        assert [c.part for c in await checkpoints.of_job(pool, job_id)] == ["page-00001"]
        assert await local.backend.stat(checkpoints.key_of(prefix, job_id, "page-00005")) is None

        # The next attempt gets its part back, readable by its child.
        await pool.execute(
            "UPDATE processing_jobs SET claimed_by = $2, attempt_count = 2 WHERE job_id = $1",
            uuid.UUID(job_id),
            CHECKPOINT_WORKER,
        )
        regranted = await local.stub.GrantJob(storage_pb2.GrantJobRequest(job_id=job_id, attempt=2))
        next_dir = tmp_path / "next"
        next_dir.mkdir()
        second = claimed_job("ocr", "ocr", job_id=job_id, attempt=2)
        assert await keeper.restore(second, regranted, next_dir) == 1
        restored = next_dir / RESUME_DIR / "page-00001.zip"
        assert restored.read_bytes() == b"page one" and os.stat(restored).st_mode & 0o777 == 0o644

        # Bytes changed in the store since they were recorded: not restored, the page done again.
        local.backend.path(kept[0].key).write_bytes(b"page 0ne")  # type: ignore[attr-defined]
        third_dir = tmp_path / "third"
        third_dir.mkdir()
        assert await keeper.restore(second, regranted, third_dir) == 0
        assert not (third_dir / RESUME_DIR / "page-00001.zip").exists()

        # A handler that keeps no parts does neither.
        off = Checkpointing(Transfers(local.stub, http), http, pool, CHECKPOINT_WORKER, enabled=False)
        assert await off.restore(second, regranted, tmp_path / "off") == 0
        # Nor does one whose parts are another operation's (the mediaworker's: transcode_video
        # only): a part the child of this ocr job planted is neither stored nor restored.
        others = Checkpointing(
            Transfers(local.stub, http),
            http,
            pool,
            CHECKPOINT_WORKER,
            enabled=True,
            operations=frozenset({"transcode_video"}),
        )
        (parts / "page-00006.zip").write_bytes(b"page six")
        await _keep_once(others, second, regranted, job_dir)
        assert "page-00006" not in [c.part for c in await checkpoints.of_job(pool, job_id)]
        assert await others.restore(second, regranted, tmp_path / "others") == 0


async def _check_outputs_streamed(
    svc: Running, tenant: Tenant, pool: asyncpg.Pool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job's outputs through ``Transfers.upload_all``: one small enough to read whole and one
    over ``INLINE_BYTES``, streamed from its file (a transcode's rendition is far larger than a
    worker should hold in memory); both stored and registered with the bytes' SHA-256 and size.
    An output the job swapped for a symlink is refused. The threshold
    is lowered to 64 KiB here: these stores take at most ``MAX_PUT_BYTES`` (1 MiB)."""
    monkeypatch.setattr(transfer, "INLINE_BYTES", 64 * 1024)
    source = await _upload(svc, tenant, b"a video")
    job_id = await _job(pool, tenant, source)
    job = claimed_job("thumbnail", "images", job_id=job_id, object_id=source.object_id)
    granted = await svc.stub.GrantJob(storage_pb2.GrantJobRequest(job_id=job_id, attempt=1))
    output = tmp_path / "job" / "output"
    output.mkdir(parents=True)
    small, large = b"a small output", os.urandom(transfer.INLINE_BYTES + 12_345)
    (output / "small.bin").write_bytes(small)
    (output / "large.bin").write_bytes(large)
    files = [
        OutputFile("small", "small.bin", "application/octet-stream", {}),
        OutputFile("large", "large.bin", "application/octet-stream", {}),
    ]
    async with httpx.AsyncClient() as http:
        transfers = Transfers(svc.stub, http)
        registered = await transfers.upload_all(job, granted, tmp_path / "job", files)
        assert [(o.output_type, o.size_bytes) for o in registered] == [
            ("small", len(small)),
            ("large", len(large)),
        ]
        for out, data in zip(registered, (small, large), strict=True):
            described = await svc.stub.GetObject(
                storage_pb2.GetObjectRequest(object_id=out.object_id, account_id=tenant.account_id)
            )
            assert described.object.sha256 == _sha(data)
            url = (await svc.stub.PresignGet(storage_pb2.PresignGetRequest(key=out.key))).url
            assert (await http.get(url)).content == data

        (output / "large.bin").unlink()
        (output / "large.bin").symlink_to(output / "small.bin")
        with pytest.raises(ExceptionGroup) as refused:  # the uploads' task group
            await transfers.upload_all(job, granted, tmp_path / "job", files)
        assert refused.group_contains(OSError, match="symbolic link")


async def test_local_outputs_streamed(
    local: Running, tenant: Tenant, pool: asyncpg.Pool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _check_outputs_streamed(local, tenant, pool, tmp_path, monkeypatch)


async def test_s3_outputs_streamed(
    s3: Running, tenant: Tenant, pool: asyncpg.Pool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _check_outputs_streamed(s3, tenant, pool, tmp_path, monkeypatch)
