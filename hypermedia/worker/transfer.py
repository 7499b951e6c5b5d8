"""Moving a job's bytes with one grant per job (``GrantJob``: the input's metadata, its presigned
GET, and one output grant for the job's key prefix), the outputs uploaded under that grant with
their SHA-256 (at most :data:`UPLOAD_CONCURRENCY` at once) and registered in one
``RegisterOutputs`` call, and the outputs of a job that will not complete deleted. Every call is retried a few times inside the
attempt (:func:`infra_retry`); what still fails is the attempt's to settle."""

from __future__ import annotations

import asyncio
import base64
import errno
import hashlib
import json
import logging
import os
import re
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import httpx

from hypermedia.api.storage.v1 import storage_pb2, storage_pb2_grpc
from hypermedia.core.errors import DomainError, PermanentJobError, TransientError
from hypermedia.infra.rpc import call, infra_retry
from hypermedia.jobs import facts, lifecycle
from hypermedia.sandbox import open_output
from hypermedia.worker import handoff

log = logging.getLogger(__name__)

UPLOAD_CONCURRENCY = 4
"""Outputs of one job uploaded at once (a ``pdf_preview`` of 20 pages has 20): each upload is
mostly waiting on storage, so a few overlap well on 2 cores."""
GRANT_MARGIN_SECONDS = 60
"""An output grant with less than this left (seconds) is renewed before the uploads start."""
INLINE_BYTES = 8 * 1024 * 1024
"""Outputs of at most this many bytes are read whole and sent from memory; larger ones are
streamed from their file (:class:`FileBody`), so a worker's memory does not grow with its
renditions' sizes."""
CHECKSUM_FIELD = "x-amz-checksum-sha256"
"""Header (PUT) or form field (POST) carrying an upload's base64 SHA-256, which the store verifies."""
_EXTENSION = re.compile(r"\.[a-z0-9]{1,5}")
MAX_NAME = 64
"""Longest last segment of an output key storage takes (``services.storage.backends.OUTPUT_TYPE``)."""


class Transfers:
    """A worker's transfers of job bytes.

    Args:
        storage: gRPC stub of the storage service (presigning, registering, deleting).
        http: client for the presigned URLs (no credentials).
        handoff_socket: the local store's hand-off socket (:mod:`hypermedia.worker.handoff`),
            tried before HTTP for each download; "" for HTTP only.
    """

    def __init__(
        self,
        storage: storage_pb2_grpc.StorageServiceStub,
        http: httpx.AsyncClient,
        handoff_socket: str = "",
    ) -> None:
        self._storage = storage
        self._http = http
        self._handoff = handoff.Handoff(handoff_socket) if handoff_socket else None

    async def delete_outputs(self, job: lifecycle.ClaimedJob, outputs: list[lifecycle.Output]) -> None:
        """Delete the uploaded outputs of a job that will not complete. An output another job
        refers to (the same rendition of the same object) stays: its bytes are identical."""
        for output in outputs:
            try:
                async for attempt in infra_retry():
                    with attempt:
                        await call(
                            self._storage.DeleteOutput,
                            storage_pb2.DeleteOutputRequest(
                                key=output.key, job_id=job.job_id, attempt=job.attempt
                            ),
                        )
            except DomainError as exc:
                log.info("output kept: %s", exc.error_code, extra={"job_id": job.job_id})

    async def grant(self, job: lifecycle.ClaimedJob) -> storage_pb2.GrantJobResponse:
        """The job's grant (``GrantJob``): its input object, a GET URL of it and one grant for
        every output under the job's prefix, for the attempt the worker holds.

        Raises:
            DomainError: NOT_FOUND (input gone), FAILED_PRECONDITION ``ATTEMPT_FENCED``, or
                TransientError once the retries are spent.
        """
        async for attempt in infra_retry():
            with attempt:
                granted: storage_pb2.GrantJobResponse = await call(
                    self._storage.GrantJob,
                    storage_pb2.GrantJobRequest(job_id=job.job_id, attempt=job.attempt),
                )
        return granted

    async def download(self, url: str, dest: Path, max_bytes: int) -> None:
        """Fetch an object through its presigned GET ``url`` into ``dest`` (at most ``max_bytes``):
        through the hand-off socket when there is one and it answers (a kernel copy), else over HTTP.

        Raises:
            PermanentJobError: ``INPUT_TOO_LARGE``.
            TransientError: ``STORAGE_UNAVAILABLE`` when storage answers anything but 200.
        """
        if self._handoff is not None and await self._handoff.fetch(url, dest, max_bytes):
            return
        async for attempt in infra_retry():
            with attempt:
                size = 0
                with dest.open("wb") as fh:
                    async with self._http.stream("GET", url) as response:
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
        self,
        job: lifecycle.ClaimedJob,
        granted: storage_pb2.GrantJobResponse,
        job_dir: Path,
        files: list[Any],
        *,
        reproducible: bool = True,
    ) -> list[lifecycle.Output]:
        """Uploads a job's outputs through its output grant, at most :data:`UPLOAD_CONCURRENCY` at
        once, each with the SHA-256 computed while it was read, then registers them all in one
        ``RegisterOutputs`` call, with what their metadata tell of the input
        (:func:`hypermedia.jobs.facts.of`, kept on the input object for estimates); returns them
        in the entry's order. Keys from
        :func:`rendition_name` (per job and attempt when the bytes are not ``reproducible``). The first failure cancels
        the uploads still running and is raised; nothing is registered then. A grant about to
        expire (a long job) is renewed first."""
        if not files:
            return []
        grant = granted.outputs
        if grant.expires_at.ToSeconds() - time.time() < GRANT_MARGIN_SECONDS:
            grant = (await self.grant(job)).outputs
        limit = asyncio.Semaphore(UPLOAD_CONCURRENCY)

        async def one(out: Any) -> storage_pb2.OutputUpload:
            async with limit:
                return await self._upload(job, grant, job_dir / "output" / out.filename, out, reproducible)

        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(one(out)) for out in files]
        uploads = [task.result() for task in tasks]
        async for attempt in infra_retry():
            with attempt:
                registered = await call(
                    self._storage.RegisterOutputs,
                    storage_pb2.RegisterOutputsRequest(
                        job_id=job.job_id,
                        attempt=job.attempt,
                        outputs=uploads,
                        input_facts=_input_facts(files),
                    ),
                )
        return [
            lifecycle.Output(
                output_type=out.output_type,
                object_id=obj.object_id,
                key=upload.key,
                mime_type=out.mime_type,
                size_bytes=upload.size_bytes,
                metadata=dict(out.metadata),
            )
            for out, upload, obj in zip(files, uploads, registered.objects, strict=True)
        ]

    async def _upload(
        self,
        job: lifecycle.ClaimedJob,
        grant: storage_pb2.OutputGrant,
        path: Path,
        out: Any,
        reproducible: bool,
    ) -> storage_pb2.OutputUpload:
        """Upload one output under the grant's prefix with its SHA-256; returns what to register.
        The file is opened once as :func:`hypermedia.sandbox.read_output` opens it (never
        ``path.read_bytes()``: the job could have swapped ``output/`` or the file for a symlink);
        one of at most :data:`INLINE_BYTES` is read whole, a larger one (a transcode's rendition)
        is hashed and then streamed from that descriptor, never held in memory."""
        fd, size = await asyncio.to_thread(open_output, path.parent.parent, path.name)
        try:
            body: bytes | FileBody
            if size <= INLINE_BYTES:
                body = await asyncio.to_thread(_read_fd, fd, size)
                digest = hashlib.sha256(body).hexdigest()
            else:
                body, digest = FileBody(fd, size), await asyncio.to_thread(sha256_fd, fd, size)
            key = grant.key_prefix + rendition_name(
                job, out.output_type, reproducible=reproducible, filename=out.filename
            )
            async for attempt in infra_retry():
                with attempt:
                    response = await send_output(self._http, grant, key, body, out.mime_type, digest)
                    if response.status_code >= 300:
                        raise TransientError(
                            f"storage answered {response.status_code}", "STORAGE_UNAVAILABLE"
                        )
        finally:
            os.close(fd)
        return storage_pb2.OutputUpload(key=key, mime_type=out.mime_type, size_bytes=size, sha256=digest)


def _input_facts(files: list[Any]) -> storage_pb2.InputFacts:
    """What the outputs' metadata tell of the job's input (:func:`hypermedia.jobs.facts.of`)."""
    message = storage_pb2.InputFacts()
    for name, value in facts.of(out.metadata for out in files).items():
        setattr(message, name, value)
    return message


@dataclass(frozen=True)
class FileBody:
    """An upload's bytes streamed from the open file ``fd`` (``size`` bytes from offset 0, read
    with ``pread``, 1 MiB at a time off the event loop), for files too large to hold in memory
    (a transcode's rendition, as an output or kept as a checkpoint). The caller keeps ``fd``
    open until the upload ended, and closes it; a retry sends it again from the start."""

    fd: int
    size: int

    async def chunks(self) -> AsyncIterator[bytes]:
        """The file's bytes. Raises OSError when it ends before ``size`` (shrunk meanwhile)."""
        offset = 0
        while offset < self.size:
            chunk = await asyncio.to_thread(os.pread, self.fd, min(1 << 20, self.size - offset), offset)
            if not chunk:
                raise OSError(errno.EIO, f"the file ended at {offset} of {self.size} bytes")
            offset += len(chunk)
            yield chunk


async def send_output(
    http: httpx.AsyncClient,
    grant: storage_pb2.OutputGrant,
    key: str,
    data: bytes | FileBody,
    mime_type: str,
    sha256: str,
) -> httpx.Response:
    """Upload ``data`` (bytes, or a :class:`FileBody` streamed) to ``key`` (under
    ``grant.key_prefix``) through an output grant with its SHA-256 (``sha256``, lowercase hex),
    the way ``grant.method`` says: ``PUT`` to the local store, or the form ``POST`` of an S3
    presigned POST policy (its fields, then the file). The store verifies the SHA-256 while it
    writes, so bytes that changed since they were hashed are refused, not stored. Returns the
    store's answer unchecked (2xx: stored)."""
    checksum = base64.b64encode(bytes.fromhex(sha256)).decode()
    if grant.method == "POST":
        fields = {**grant.fields, "key": key, "Content-Type": mime_type, CHECKSUM_FIELD: checksum}
        name = key.rsplit("/", 1)[-1]
        if isinstance(data, bytes):
            return await http.post(grant.url, data=fields, files={"file": (name, data, mime_type)})
        headers, body = _streamed_form(fields, name, mime_type, data)
        return await http.post(grant.url, content=body, headers=headers)
    headers = {"Content-Type": mime_type, CHECKSUM_FIELD: checksum}
    content: bytes | AsyncIterator[bytes]
    if isinstance(data, FileBody):
        headers["Content-Length"] = str(data.size)
        content = data.chunks()
    else:
        content = data
    return await http.put(
        f"{grant.url}{quote(key, safe='/')}?{urlencode(dict(grant.fields))}", content=content, headers=headers
    )


def _streamed_form(
    fields: dict[str, str], filename: str, mime_type: str, body: FileBody
) -> tuple[dict[str, str], AsyncIterator[bytes]]:
    """A ``multipart/form-data`` POST of ``fields`` then the file ``body`` (exactly its ``size``
    bytes, read off the event loop), as headers with its length and the body's blocks: httpx's
    own form would read a file object on the event loop, and take its length from the file as it
    is when sent (a job's child may have grown it since it was hashed)."""
    boundary = secrets.token_hex(16)
    head = b"".join(
        f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode()
        for name, value in fields.items()
    )
    head += (
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{filename}"\r\n'
        f"Content-Type: {mime_type}\r\n\r\n"
    ).encode()
    tail = f"\r\n--{boundary}--\r\n".encode()

    async def blocks() -> AsyncIterator[bytes]:
        yield head
        async for chunk in body.chunks():
            yield chunk
        yield tail

    headers = {
        "Content-Type": f"multipart/form-data; boundary={boundary}",
        "Content-Length": str(len(head) + body.size + len(tail)),
    }
    return headers, blocks()


def _read_fd(fd: int, size: int) -> bytes:
    """The first ``size`` bytes of the open file ``fd``. Raises OSError when it is shorter."""
    data = os.pread(fd, size, 0)
    while len(data) < size:
        more = os.pread(fd, size - len(data), len(data))
        if not more:
            raise OSError(errno.EIO, f"the file ended at {len(data)} of {size} bytes")
        data += more
    return data


def sha256_fd(fd: int, size: int) -> str:
    """The SHA-256 (hex) of the first ``size`` bytes of the open file ``fd``, read with
    ``pread`` in 1 MiB blocks through a descriptor of its own (the caller may close ``fd`` while
    this runs in a thread: a task cancelled at a drain). Raises OSError when the file is shorter
    (shrunk meanwhile)."""
    digest = hashlib.sha256()
    offset = 0
    own = os.dup(fd)
    try:
        while offset < size:
            block = os.pread(own, min(1 << 20, size - offset), offset)
            if not block:
                raise OSError(errno.EIO, f"the file ended at {offset} of {size} bytes")
            digest.update(block)
            offset += len(block)
    finally:
        os.close(own)
    return digest.hexdigest()


def rendition_name(
    job: lifecycle.ClaimedJob, output_type: str, *, reproducible: bool = True, filename: str = ""
) -> str:
    """The last segment of an output's key: ``{output_type}-{digest}{extension}``, the digest being
    the first 16 hex digits of SHA-256 over the operation and its normalised params. Deterministic
    (a re-run writes the same key), and two renditions of one object with different params (two
    resize widths) never share a key.

    The extension is ``filename``'s (``.mp4``, ``.webp``: lowercase letters and digits, at most 5
    after the dot; none otherwise, or when the segment would pass storage's 64 characters). Players
    look at the URL's path: FFmpeg's HLS demuxer (since 5.1.4 and 6.1) refuses a segment whose URL
    has no media extension (``allowed_segment_extensions``), so an HLS rendition presigned without
    one did not play in ``ffplay``.

    When the engine's bytes are not ``reproducible`` (LibreOffice's PDFs carry a creation time and
    a random document id: :meth:`JobHandler.reproducible`), the digest covers the job id and the
    attempt too: two jobs, or two attempts of one job, never write one key with different bytes,
    which made the first one's ``RegisterOutputs`` fail ``UPLOAD_MISMATCH`` (ADR 0050)."""
    identity: list[Any] = [job.operation, job.params]
    if not reproducible:
        identity += [job.job_id, job.attempt]
    canonical = json.dumps(identity, sort_keys=True, separators=(",", ":"))
    name = f"{output_type}-{hashlib.sha256(canonical.encode()).hexdigest()[:16]}"
    extension = os.path.splitext(filename)[1].lower()
    if _EXTENSION.fullmatch(extension) and len(name) + len(extension) <= MAX_NAME:
        name += extension
    return name
