"""Small in-process fakes of the two things a :class:`~hypermedia.worker.runtime.WorkerRuntime`
test does not run for real: the storage service (its gRPC stub and the object store behind its
presigned URLs) and the per-job sandbox. Postgres, NATS and the credits service stay real.

Each fake records what it was asked to do, so a test asserts on what the runtime decided (what was
uploaded, registered, deleted; which jobs ran, were killed, were cleaned up), and offers a hook to
act at a chosen moment (during a PUT, while the sandbox child "runs").
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import shutil
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import httpx
from google.protobuf.timestamp_pb2 import Timestamp

from hypermedia.api.storage.v1 import storage_pb2
from hypermedia.core.errors import Conflict, NotFound
from hypermedia.engines.contract import OutputFile
from hypermedia.jobs import lifecycle
from hypermedia.sandbox import SandboxLimits, SandboxResult
from hypermedia.worker.handler import SandboxHandler
from services.storage.service import _object as _object_message

STORE_HOST = "store.invalid"
"""Host of the fake's presigned URLs: only its :class:`httpx.MockTransport` answers them."""


@dataclass(frozen=True)
class Upload:
    """One presigned PUT the fake object store received."""

    key: str
    content: bytes
    content_type: str


class FakeStorage:
    """Stands in for ``StorageServiceStub`` (the methods the worker calls: ``GrantJob``,
    ``RegisterOutputs``, ``DeleteOutput``) and for the object store its presigned URLs point at
    (:meth:`transport`).

    Object rows are the real ``objects`` table of ``pool`` (``job_outputs`` refers to them), as the
    storage service keeps them: ``RegisterOutputs`` inserts ``available`` derived objects after
    checking the bytes were PUT with that size and SHA-256, ``DeleteOutput`` deletes it
    (``OUTPUT_REFERENCED`` while a job output refers to it). Bytes live in :attr:`blobs` by key.

    Args:
        pool: the test's database.
        on_put: awaited inside every PUT, before the bytes are stored (e.g. to request a job's
            cancellation while its outputs upload).
    """

    def __init__(
        self, pool: asyncpg.Pool, on_put: Callable[[httpx.Request], Awaitable[None]] | None = None
    ) -> None:
        self._pool = pool
        self.on_put = on_put
        self.blobs: dict[str, bytes] = {}
        """Stored bytes by key (originals put with :meth:`put_original`, outputs by PUT)."""
        self.gets: list[str] = []
        """Keys fetched through presigned GETs, in order."""
        self.uploads: list[Upload] = []
        """Presigned PUTs received, in order."""
        self.registered: list[str] = []
        """Keys registered as outputs (``RegisterOutputs``), in order."""
        self.calls: list[str] = []
        """The storage RPCs asked for (``GrantJob``, ``RegisterOutputs``), in order."""
        self.deleted: list[str] = []
        """Keys whose deletion was asked (``DeleteOutput``), in order."""

    def put_original(self, key: str, data: bytes) -> None:
        """The bytes of an original object (the seeder's row names its ``key``)."""
        self.blobs[key] = data

    def transport(self) -> httpx.MockTransport:
        """The object store behind the presigned URLs: GET ``/o/{key}`` answers the bytes (404 when
        none), PUT ``/o/{key}`` runs :attr:`on_put` and stores the body (400, nothing stored, when
        its ``x-amz-checksum-sha256`` differs, as the local store answers)."""

        async def handle(request: httpx.Request) -> httpx.Response:
            assert request.url.host == STORE_HOST, request.url
            key = request.url.path.removeprefix("/o/")
            if request.method == "GET":
                self.gets.append(key)
                data = self.blobs.get(key)
                # A stream, as a real store answers: the worker reads it raw, chunk by chunk.
                return (
                    httpx.Response(404)
                    if data is None
                    else httpx.Response(200, stream=httpx.ByteStream(data))
                )
            if request.method == "PUT":
                content = await request.aread()
                checksum = base64.b64encode(hashlib.sha256(content).digest()).decode()
                if request.headers.get("x-amz-checksum-sha256") != checksum:
                    return httpx.Response(400)
                if self.on_put is not None:
                    await self.on_put(request)
                self.uploads.append(Upload(key, content, request.headers.get("content-type", "")))
                self.blobs[key] = content
                return httpx.Response(200)
            return httpx.Response(405)

        return httpx.MockTransport(handle)

    def http(self) -> httpx.AsyncClient:
        """A client whose requests reach :meth:`transport` (the runtime's ``http``)."""
        return httpx.AsyncClient(transport=self.transport())

    async def _object(self, object_id: str) -> asyncpg.Record:
        row = await self._pool.fetchrow("SELECT * FROM objects WHERE object_id = $1", uuid.UUID(object_id))
        if row is None:
            raise NotFound("object not found")
        return row

    async def GrantJob(self, request: storage_pb2.GrantJobRequest, **_: Any) -> storage_pb2.GrantJobResponse:
        """The live attempt's input, its GET URL and a PUT grant for the job's prefix (as the real
        service: ``ATTEMPT_FENCED`` for another attempt)."""
        self.calls.append("GrantJob")
        job, source = await self._live(request.job_id, request.attempt)
        prefix = f"derived/{source['pool_id']}/{source['object_id']}/{job['profile_version']}/"
        expires_at = Timestamp(seconds=int(time.time()) + 900)
        return storage_pb2.GrantJobResponse(
            source=_object_message(source),
            get_url=f"http://{STORE_HOST}/o/{source['key']}",
            outputs=storage_pb2.OutputGrant(
                method="PUT",
                url=f"http://{STORE_HOST}/o/",
                key_prefix=prefix,
                expires_at=expires_at,
                max_bytes=1 << 30,
            ),
            expires_at=expires_at,
        )

    async def _live(self, job_id: str, attempt: int) -> tuple[asyncpg.Record, asyncpg.Record]:
        job = await self._pool.fetchrow(
            "SELECT object_id, profile_version, attempt_count FROM processing_jobs WHERE job_id = $1",
            uuid.UUID(job_id),
        )
        if job is None:
            raise NotFound("job not found")
        if job["attempt_count"] != attempt:
            raise Conflict("not the live attempt", "ATTEMPT_FENCED")
        return job, await self._object(str(job["object_id"]))

    async def RegisterOutputs(
        self, request: storage_pb2.RegisterOutputsRequest, **_: Any
    ) -> storage_pb2.RegisterOutputsResponse:
        """Every output checked against the bytes PUT (size, SHA-256) before any is inserted."""
        self.calls.append("RegisterOutputs")
        _job, source = await self._live(request.job_id, request.attempt)
        for out in request.outputs:
            data = self.blobs.get(out.key)
            if data is None or len(data) != out.size_bytes or hashlib.sha256(data).hexdigest() != out.sha256:
                raise Conflict("the stored bytes differ from the registration", "UPLOAD_MISMATCH")
        objects = []
        for out in request.outputs:
            row = await self._pool.fetchrow(
                """
                INSERT INTO objects (object_id, pool_id, key, size_bytes, mime_type, sha256, state, source_object_id)
                VALUES ($1, $2, $3, $4, $5, $6, 'available', $7)
                ON CONFLICT (key) DO UPDATE SET size_bytes = EXCLUDED.size_bytes, sha256 = EXCLUDED.sha256
                RETURNING *
                """,
                uuid.uuid4(),
                source["pool_id"],
                out.key,
                out.size_bytes,
                out.mime_type,
                out.sha256,
                source["object_id"],
            )
            assert row is not None
            self.registered.append(out.key)
            objects.append(_object_message(row))
        return storage_pb2.RegisterOutputsResponse(objects=objects)

    async def DeleteOutput(
        self, request: storage_pb2.DeleteOutputRequest, **_: Any
    ) -> storage_pb2.DeleteOutputResponse:
        self.deleted.append(request.key)
        try:
            removed = await self._pool.fetchval(
                "DELETE FROM objects WHERE key = $1 RETURNING object_id", request.key
            )
        except asyncpg.ForeignKeyViolationError:
            raise Conflict("the output is still referenced", "OUTPUT_REFERENCED") from None
        had_bytes = self.blobs.pop(request.key, None) is not None
        return storage_pb2.DeleteOutputResponse(deleted=removed is not None or had_bytes)


@dataclass
class SandboxRun:
    """One :meth:`FakeSandbox.run` call: the job, what it was given, how it ended."""

    job_id: str
    operation: str
    input_bytes: bytes
    limits: SandboxLimits
    result: SandboxResult | None = None


def success(*outputs: tuple[OutputFile, bytes]) -> Callable[[str], tuple[SandboxResult, dict[str, bytes]]]:
    """A :attr:`FakeSandbox.outcome` whose every run writes ``outputs`` (file, bytes) and succeeds."""

    def outcome(_job_id: str) -> tuple[SandboxResult, dict[str, bytes]]:
        files = {out.filename: data for out, data in outputs}
        return SandboxResult([out for out, _ in outputs], None, None, False, 40, 12), files

    return outcome


def failure(
    code: str, *, retryable: bool, killed: str = ""
) -> Callable[[str], tuple[SandboxResult, dict[str, bytes]]]:
    """A :attr:`FakeSandbox.outcome` whose every run fails with ``code`` (as an entry's
    ``DomainError`` or the sandbox's own ``TIMEOUT`` would, ``killed`` its kill reason), writing nothing."""

    def outcome(_job_id: str) -> tuple[SandboxResult, dict[str, bytes]]:
        return SandboxResult([], code, f"failed: {code}", retryable, 30, 10, killed=killed), {}

    return outcome


def _cancelled_result() -> SandboxResult:
    """What :meth:`hypermedia.sandbox.Sandbox.run` returns for a child it killed on :meth:`cancel`."""
    return SandboxResult([], "CANCELLED", "The job was cancelled.", False, 5, 0)


@dataclass
class FakeSandbox:
    """Stands in for :class:`hypermedia.sandbox.Sandbox` (``prepare``, ``run``, ``cancel``,
    ``cleanup``, ``remove_leftovers``): real job directories under ``work_dir/jobs/``, but no child
    process. :meth:`run` waits while :attr:`hold` is clear (a child that is still running), runs
    :attr:`during` once it started, then writes the files of :attr:`outcome` into ``output/`` and
    returns its result; :meth:`cancel` ends a held run at once with ``CANCELLED``, as the real one
    kills the child's process group."""

    work_dir: Path
    outcome: Callable[[str], tuple[SandboxResult, dict[str, bytes]]] = field(
        default_factory=lambda: failure("INTERNAL", retryable=True)
    )
    """``job_id → (result, {filename: bytes})``: how a run ends and what it leaves in ``output/``."""
    during: Callable[[str], Awaitable[None]] | None = None
    """Awaited with the job id while the run is going (before :attr:`hold` is waited for)."""
    hold: asyncio.Event = field(default_factory=asyncio.Event)
    """Runs return only once this is set (or they are cancelled); set by default."""
    runs: list[SandboxRun] = field(default_factory=list)
    running: dict[str, asyncio.Event] = field(default_factory=dict)
    """Job ids whose run is under way, each with the event :meth:`cancel` sets."""
    started: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when a run starts (cleared by the test to wait for the next)."""
    cancelled: list[str] = field(default_factory=list)
    """Job ids whose running child :meth:`cancel` killed."""
    cleaned: list[str] = field(default_factory=list)
    """Job ids :meth:`cleanup` was called for."""

    def __post_init__(self) -> None:
        self.hold.set()

    def job_dir(self, job_id: str) -> Path:
        return self.work_dir / "jobs" / job_id

    def prepare(self, job_id: str) -> Path:
        job_dir = self.job_dir(job_id)
        shutil.rmtree(job_dir, ignore_errors=True)
        for path in (job_dir, job_dir / "input", job_dir / "output"):
            path.mkdir(mode=0o700, parents=True)
        return job_dir

    def cleanup(self, job_id: str) -> None:
        self.cleaned.append(job_id)
        shutil.rmtree(self.job_dir(job_id), ignore_errors=True)

    def remove_leftovers(self) -> list[str]:
        jobs = self.work_dir / "jobs"
        names = sorted(os.listdir(jobs)) if jobs.is_dir() else []
        for name in names:
            shutil.rmtree(jobs / name, ignore_errors=True)
        return names

    def cancel(self, job_id: str) -> bool:
        killed = self.running.get(job_id)
        if killed is None:
            return False
        self.cancelled.append(job_id)
        killed.set()
        return True

    async def run(
        self,
        job_id: str,
        entry: str,
        operation: str,
        params: dict[str, Any],
        input_path: Path,
        limits: SandboxLimits,
        *,
        entry_kwargs: Mapping[str, Any] | None = None,
    ) -> SandboxResult:
        record = SandboxRun(job_id, operation, await asyncio.to_thread(Path(input_path).read_bytes), limits)
        self.runs.append(record)
        killed = self.running[job_id] = asyncio.Event()
        self.started.set()
        try:
            if self.during is not None:
                await self.during(job_id)
            if not killed.is_set():
                waiters = {asyncio.ensure_future(self.hold.wait()), asyncio.ensure_future(killed.wait())}
                try:
                    await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for waiter in waiters:
                        waiter.cancel()
            if killed.is_set():
                record.result = _cancelled_result()
                return record.result
            result, files = self.outcome(job_id)
            for name, data in files.items():
                (self.job_dir(job_id) / "output" / name).write_bytes(data)
            record.result = result
            return result
        finally:
            del self.running[job_id]


class GatedHandler(SandboxHandler):
    """A worker service's handler whose admission admits ``admitted`` jobs at once (an
    ``asyncio.Semaphore``, as the mediaworker's coordinator bounds transcodes), so further jobs
    wait for admission; otherwise the plain :class:`SandboxHandler`."""

    entry = "tests.helpers.fakes:not_run"

    def __init__(self, admitted: int = 64) -> None:
        self.gate = asyncio.Semaphore(admitted)

    def entry_kwargs(self, job: lifecycle.ClaimedJob) -> dict[str, Any]:
        return {}

    def admit(self, job: lifecycle.ClaimedJob) -> asyncio.Semaphore:  # type: ignore[override]
        return self.gate
