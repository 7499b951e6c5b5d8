"""Moving a job's bytes: its input fetched through a presigned GET, its outputs uploaded through
presigned PUTs and registered with storage (at most :data:`UPLOAD_CONCURRENCY` at once), and the
outputs of a job that will not complete deleted. Every call is retried a few times inside the
attempt (:func:`infra_retry`); what still fails is the attempt's to settle."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from pathlib import Path
from typing import Any

import httpx

from hypermedia.api.storage.v1 import storage_pb2, storage_pb2_grpc
from hypermedia.core.errors import DomainError, PermanentJobError, TransientError
from hypermedia.infra.rpc import call, infra_retry
from hypermedia.jobs import lifecycle
from hypermedia.sandbox import read_output

log = logging.getLogger(__name__)

UPLOAD_CONCURRENCY = 4
"""Outputs of one job uploaded at once (a ``pdf_preview`` of 20 pages has 20): each upload is
mostly waiting on storage (presign, PUT, register), so a few overlap well on 2 cores."""


class Transfers:
    """A worker's transfers of job bytes.

    Args:
        storage: gRPC stub of the storage service (presigning, registering, deleting).
        http: client for the presigned URLs (no credentials).
    """

    def __init__(self, storage: storage_pb2_grpc.StorageServiceStub, http: httpx.AsyncClient) -> None:
        self._storage = storage
        self._http = http

    async def delete_outputs(self, job: lifecycle.ClaimedJob, outputs: list[lifecycle.Output]) -> None:
        """Delete the uploaded outputs of a job that will not complete. An output another job
        refers to (the same rendition of the same object) stays: its bytes are identical."""
        for output in outputs:
            try:
                async for attempt in infra_retry():
                    with attempt:
                        await call(
                            self._storage.DeleteOutput, storage_pb2.DeleteOutputRequest(key=output.key)
                        )
            except DomainError as exc:
                log.info("output kept: %s", exc.error_code, extra={"job_id": job.job_id})

    async def download(self, key: str, dest: Path, max_bytes: int) -> None:
        """Fetch an object through a presigned GET into ``dest`` (at most ``max_bytes``)."""
        async for attempt in infra_retry():
            with attempt:
                presigned = await call(self._storage.PresignGet, storage_pb2.PresignGetRequest(key=key))
                size = 0
                with dest.open("wb") as fh:
                    async with self._http.stream("GET", presigned.url) as response:
                        if response.status_code != 200:
                            raise TransientError(
                                f"storage answered {response.status_code}", "STORAGE_UNAVAILABLE"
                            )
                        # Raw chunks unless the store encoded the body: ~30% less CPU on large originals.
                        chunks = (
                            response.aiter_bytes()
                            if "content-encoding" in response.headers
                            else response.aiter_raw()
                        )
                        async for chunk in chunks:
                            size += len(chunk)
                            if size > max_bytes:
                                raise PermanentJobError(
                                    "the input exceeds the profile's size limit", "INPUT_TOO_LARGE"
                                )
                            fh.write(chunk)

    async def upload_all(
        self, job: lifecycle.ClaimedJob, source: Any, job_dir: Path, files: list[Any]
    ) -> list[lifecycle.Output]:
        """Uploads a job's outputs, at most :data:`UPLOAD_CONCURRENCY` at once, and returns them in
        the entry's order. The first failure cancels the uploads still running and is raised
        (what was registered before it is left to storage, as with a failed single upload)."""
        limit = asyncio.Semaphore(UPLOAD_CONCURRENCY)

        async def one(out: Any) -> lifecycle.Output:
            async with limit:
                return await self.upload(job, source, job_dir / "output" / out.filename, out)

        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(one(out)) for out in files]
        return [task.result() for task in tasks]

    async def upload(self, job: lifecycle.ClaimedJob, source: Any, path: Path, out: Any) -> lifecycle.Output:
        """Upload one output through a presigned PUT and register it with storage."""
        # Never path.read_bytes(): the job could have swapped output/ or the file for a symlink.
        data, digest = await asyncio.to_thread(_read_and_hash, path)
        async for attempt in infra_retry():
            with attempt:
                put = await call(
                    self._storage.PresignOutputPut,
                    storage_pb2.PresignOutputPutRequest(
                        source_object_id=source.object_id,
                        profile_version=job.profile_version,
                        output_type=rendition_name(job, out.output_type),
                        mime_type=out.mime_type,
                    ),
                )
                response = await self._http.put(
                    put.url, content=data, headers={"Content-Type": out.mime_type}
                )
                if response.status_code >= 300:
                    raise TransientError(f"storage answered {response.status_code}", "STORAGE_UNAVAILABLE")
                registered = await call(
                    self._storage.RegisterOutput,
                    storage_pb2.RegisterOutputRequest(
                        source_object_id=source.object_id,
                        key=put.key,
                        mime_type=out.mime_type,
                        size_bytes=len(data),
                        sha256=digest,
                    ),
                )
        return lifecycle.Output(
            output_type=out.output_type,
            object_id=registered.object.object_id,
            key=put.key,
            mime_type=out.mime_type,
            size_bytes=len(data),
            metadata=dict(out.metadata),
        )


def _read_and_hash(path: Path) -> tuple[bytes, str]:
    """An output's bytes (read as :func:`read_output` does) and their SHA-256, hex: off the event loop."""
    data = read_output(path.parent.parent, path.name)
    return data, hashlib.sha256(data).hexdigest()


def rendition_name(job: lifecycle.ClaimedJob, output_type: str) -> str:
    """The last segment of an output's key: ``{output_type}-{digest}``, the digest being the first
    16 hex digits of SHA-256 over the operation and its normalised params. Deterministic (a re-run
    writes the same key), and two renditions of one object with different params (two resize
    widths) never share a key."""
    canonical = json.dumps([job.operation, job.params], sort_keys=True, separators=(",", ":"))
    return f"{output_type}-{hashlib.sha256(canonical.encode()).hexdigest()[:16]}"
