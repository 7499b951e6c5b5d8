"""The StorageService servicer (``hypermedia.storage.v1``): object rows, ownership, presigned URLs.

It owns the ``objects`` and ``object_ownership`` tables; the bytes live behind an
:class:`~services.storage.backends.ObjectBackend`. Invalid UUIDs answer NOT_FOUND like unknown ones,
and "does not exist" and "may not see it" answer the same, so ids cannot be probed.
"""

from __future__ import annotations

import asyncio
import logging
import re
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

import asyncpg
import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from hypermedia.api.storage.v1 import storage_pb2, storage_pb2_grpc
from hypermedia.core.errors import Conflict, InvalidArgument, NotFound, PayloadTooLarge, StorageQuotaExceeded
from hypermedia.infra import db
from hypermedia.jobs import checkpoints, facts
from services.storage.backends import (
    OUTPUT_TYPE,
    ObjectBackend,
    is_output_key_of,
    is_valid_key,
    original_key,
    output_key,
    output_prefix,
)

log = logging.getLogger(__name__)

SERVICE_NAME = "hypermedia.storage.v1.StorageService"
MAX_URL_TTL_SECONDS = 7 * 24 * 3600
"""Longest lifetime of a presigned URL (seconds); SigV4 allows no more."""
MAX_MIME_LENGTH = 255
MAX_FILENAME_LENGTH = 1024
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_MIME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]*/[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]*(;[ -~]*)?$")
_OBJECT_COLUMNS = (
    "object_id, pool_id, key, size_bytes, mime_type, sha256, state, source_object_id, created_at,"
    " filename, claimed_mime_type, name_mime_type, type_mismatch"
)
CHECKPOINT_SWEEP_BATCH = 100
"""Ended jobs whose checkpoints one :meth:`StorageServicer.sweep_checkpoints` deletes at most."""
CHECKPOINT_SWEEP_SECONDS = 5.0
"""How often storage deletes the checkpoints of jobs that ended (seconds)."""
MAX_LIST_LIMIT = 1000
"""Objects one ListObjects page holds at most."""
MAX_OUTPUTS_PER_CALL = 256
"""Outputs one RegisterOutputs call takes (a pdf_preview has at most 20, an HLS ladder a few dozen)."""
_OBJECT_COLUMNS_OF_O = ", ".join("o." + column.strip() for column in _OBJECT_COLUMNS.split(","))
""":data:`_OBJECT_COLUMNS` of ``objects o`` in a join."""
_LIVE_ATTEMPT = f"""
    SELECT {_OBJECT_COLUMNS_OF_O},
           j.profile_version AS job_profile_version
    FROM processing_jobs j JOIN objects o ON o.object_id = j.object_id
    WHERE j.job_id = $1 AND j.attempt_count = $2 AND j.status = ANY($3::text[])
"""
"""The input object of a job whose live attempt is $2 (its fencing token) in one of the states $3."""
_RUNNING = ["claimed", "processing", "cancel_requested"]
"""States in which a job's live attempt may move its bytes."""


def _job_prefix(source: asyncpg.Record) -> str:
    """The key prefix of a job's outputs, ``derived/{pool_id}/{object_id}/{profile_version}/``,
    from a :data:`_LIVE_ATTEMPT` row."""
    return f"{output_prefix(source['pool_id'], source['object_id'])}{source['job_profile_version']}/"


@dataclass(frozen=True)
class StorageQuota:
    """The default storage quota of an account (ADR 0029); ``storage_usage.max_bytes`` and
    ``max_objects`` override it per account."""

    max_bytes: int = 10 * 1024**3
    """Bytes of originals (pending or available) an account may store (HM_STORAGE_QUOTA_BYTES)."""
    max_objects: int = 100_000
    """Originals an account may store at once (HM_STORAGE_QUOTA_OBJECTS)."""


_RESERVE = """
    UPDATE storage_usage SET used_bytes = used_bytes + $2, used_objects = used_objects + 1, updated_at = now()
    WHERE account_id = $1
      AND used_bytes + $2 <= coalesce(max_bytes, $3) AND used_objects + 1 <= coalesce(max_objects, $4)
    RETURNING used_bytes
"""
"""Takes one original of $2 bytes into the account's usage unless that passes a limit. Concurrent
uploads of one account queue on the row, and each re-checks the limits against the row as the
previous one left it (READ COMMITTED re-evaluates the WHERE of an UPDATE after a wait): the
limits hold whatever the concurrency."""


def _usage(row: asyncpg.Record | None, quota: StorageQuota) -> storage_pb2.StorageUsage:
    if row is None:
        return storage_pb2.StorageUsage(limit_bytes=quota.max_bytes, limit_objects=quota.max_objects)
    return storage_pb2.StorageUsage(
        used_bytes=row["used_bytes"],
        limit_bytes=quota.max_bytes if row["max_bytes"] is None else row["max_bytes"],
        used_objects=row["used_objects"],
        limit_objects=quota.max_objects if row["max_objects"] is None else row["max_objects"],
    )


def _uuid(value: str, what: str = "object") -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        raise NotFound(f"{what} not found") from None


def _timestamp(value: datetime) -> Timestamp:
    ts = Timestamp()
    ts.FromDatetime(value)
    return ts


def _facts_dict(message: storage_pb2.InputFacts) -> dict[str, int | float]:
    """The set fields of ``message`` (unchecked: :func:`hypermedia.jobs.facts.checked` next)."""
    return {name: getattr(message, name) for name in facts.FACTS if message.HasField(name)}


def _object(row: asyncpg.Record) -> storage_pb2.Object:
    return storage_pb2.Object(
        object_id=str(row["object_id"]),
        pool_id=str(row["pool_id"]),
        key=row["key"],
        size_bytes=row["size_bytes"],
        mime_type=row["mime_type"],
        sha256=row["sha256"],
        state=row["state"],
        source_object_id=str(row["source_object_id"] or ""),
        created_at=_timestamp(row["created_at"]),
        filename=row["filename"] or "",
        claimed_mime_type=row["claimed_mime_type"] or "",
        name_mime_type=row["name_mime_type"] or "",
        type_mismatch=row["type_mismatch"],
    )


def _mime(value: str) -> str:
    if len(value) > MAX_MIME_LENGTH or not _MIME.match(value):
        raise InvalidArgument("mime_type must be a media type such as image/png")
    return value


def _sha256(value: str, *, required: bool) -> str:
    value = value.lower()
    if (value or required) and not _SHA256.match(value):
        raise InvalidArgument("sha256 must be 64 hexadecimal digits")
    return value


def _mismatch(detail: str) -> Conflict:
    return Conflict(f"the stored bytes do not match: {detail}", "UPLOAD_MISMATCH")


class StorageServicer(storage_pb2_grpc.StorageServiceServicer):
    """Async implementation of ``StorageService``.

    Args:
        pool: asyncpg pool of the system of record.
        backend: where the bytes live.
        url_ttl_seconds: lifetime of URLs when a request asks for 0 (seconds).
        max_put_bytes: largest object accepted (bytes); larger declared uploads are RESOURCE_EXHAUSTED.
        quota: the default storage quota of an account (``storage_usage`` may override it).
    """

    def __init__(
        self,
        pool: asyncpg.Pool,
        backend: ObjectBackend,
        *,
        url_ttl_seconds: int,
        max_put_bytes: int,
        quota: StorageQuota | None = None,
    ) -> None:
        self._pool = pool
        self._backend = backend
        self._ttl = url_ttl_seconds
        self._max_put_bytes = max_put_bytes
        self._removals: set[asyncio.Task[None]] = set()
        """Byte removals after a delete committed, kept until done (a cancelled call does not stop them)."""
        self._quota = quota or StorageQuota()

    def _ttl_of(self, requested: int) -> int:
        if requested == 0:
            return self._ttl
        if not 0 < requested <= MAX_URL_TTL_SECONDS:
            raise InvalidArgument(f"expires_in_seconds must be between 1 and {MAX_URL_TTL_SECONDS}")
        return requested

    async def _available(self, object_id: uuid.UUID) -> asyncpg.Record:
        row = await self._pool.fetchrow(
            f"SELECT {_OBJECT_COLUMNS} FROM objects WHERE object_id = $1 AND state = 'available'", object_id
        )
        if row is None:
            raise NotFound("object not found")
        return row

    async def _verify(self, key: str, size_bytes: int, sha256: str) -> str:
        """Check the bytes at ``key`` against the expected size (and SHA-256 when non-empty); return
        their SHA-256: the one the store verified while writing them, or, when it kept none, one
        computed by reading them. Raises Conflict(UPLOAD_MISMATCH)."""
        stored = await self._backend.stat(key)
        if stored is None:
            raise _mismatch("nothing was uploaded")
        if stored != size_bytes:
            raise _mismatch(f"expected {size_bytes} bytes, found {stored}")
        try:
            actual = await self._backend.verified_sha256(key) or await self._backend.sha256(key)
        except FileNotFoundError:
            raise _mismatch("nothing was uploaded") from None
        if sha256 and actual != sha256:
            raise _mismatch("SHA-256 differs")
        return actual

    async def CreateUpload(
        self, request: storage_pb2.CreateUploadRequest, context: grpc.aio.ServicerContext
    ) -> storage_pb2.CreateUploadResponse:
        """Reserve a `pending` original in a pool of the account and presign its PUT.

        The key is ``originals/{pool_id}/{object_id}``: the file name and the claimed types are
        stored as metadata only.

        The original counts against the account's storage quota from here on (ADR 0029): its size
        and one object are added to ``storage_usage`` in the transaction that inserts the row,
        unless that would pass the account's limits.

        Errors: NOT_FOUND pool unknown or not the account's; INVALID_ARGUMENT bad size, mime type,
        claimed type, SHA-256 or file name; RESOURCE_EXHAUSTED size above ``max_put_bytes``, or
        ``STORAGE_QUOTA_EXCEEDED`` (:class:`~hypermedia.core.errors.StorageQuotaExceeded`, with the
        numbers) when the quota has no room: nothing is inserted then.
        """
        account_id = _uuid(request.account_id, "pool")
        pool_id = _uuid(request.pool_id, "pool")
        if request.size_bytes < 0:
            raise InvalidArgument("size_bytes must not be negative")
        if request.size_bytes > self._max_put_bytes:
            raise PayloadTooLarge(f"objects are limited to {self._max_put_bytes} bytes")
        mime = _mime(request.mime_type)
        sha256 = _sha256(request.sha256, required=True)
        if len(request.filename) > MAX_FILENAME_LENGTH or "\x00" in request.filename:
            raise InvalidArgument(f"filename must be at most {MAX_FILENAME_LENGTH} characters without NUL")
        claimed = _mime(request.claimed_mime_type) if request.claimed_mime_type else None
        implied = _mime(request.name_mime_type) if request.name_mime_type else None
        object_id = uuid.uuid4()
        key = original_key(pool_id, object_id)
        async with self._pool.acquire() as conn, conn.transaction():
            if not await conn.fetchval(
                "SELECT 1 FROM pools WHERE pool_id = $1 AND account_id = $2", pool_id, account_id
            ):
                raise NotFound("pool not found")
            await self._reserve(conn, account_id, request.size_bytes)
            row = await conn.fetchrow(
                f"""INSERT INTO objects
                        (object_id, pool_id, key, size_bytes, mime_type, sha256, state, filename,
                         claimed_mime_type, name_mime_type, type_mismatch)
                    VALUES ($1, $2, $3, $4, $5, $6, 'pending', $7, $8, $9, $10)
                    RETURNING {_OBJECT_COLUMNS}""",
                object_id,
                pool_id,
                key,
                request.size_bytes,
                mime,
                sha256,
                request.filename or None,
                claimed,
                implied,
                request.type_mismatch,
            )
            assert row is not None  # INSERT … RETURNING yields the row
            await conn.execute(
                "INSERT INTO object_ownership (object_id, account_id, role) VALUES ($1, $2, 'owner')",
                object_id,
                account_id,
            )
        url, expires_at = await self._backend.presign_put(key, self._ttl, mime)
        return storage_pb2.CreateUploadResponse(
            object=_object(row), put_url=url, expires_at=_timestamp(expires_at)
        )

    async def _reserve(self, conn: db.Connection, account_id: uuid.UUID, size_bytes: int) -> None:
        """Count one original of ``size_bytes`` against the account's quota, in ``conn``'s
        transaction. Raises StorageQuotaExceeded with the numbers."""
        await conn.execute(
            "INSERT INTO storage_usage (account_id) VALUES ($1) ON CONFLICT DO NOTHING", account_id
        )
        quota = self._quota
        if (
            await conn.fetchval(_RESERVE, account_id, size_bytes, quota.max_bytes, quota.max_objects)
            is not None
        ):
            return
        usage = _usage(
            await conn.fetchrow("SELECT * FROM storage_usage WHERE account_id = $1", account_id), quota
        )
        what = "objects" if usage.used_objects + 1 > usage.limit_objects else "bytes"
        if what == "bytes":
            message = (
                f"the storage quota has no room for this file: {usage.used_bytes} of {usage.limit_bytes}"
                f" bytes are used and the file has {size_bytes}"
            )
        else:
            message = (
                f"the storage quota allows {usage.limit_objects} objects, and {usage.used_objects} are stored"
            )
        raise StorageQuotaExceeded(
            message + "; delete originals (DELETE /v1/objects/{object_id}) or ask for a larger quota",
            details={
                "used_bytes": usage.used_bytes,
                "limit_bytes": usage.limit_bytes,
                "used_objects": usage.used_objects,
                "limit_objects": usage.limit_objects,
                "file_bytes": size_bytes,
            },
        )

    async def DeleteObject(
        self, request: storage_pb2.DeleteObjectRequest, context: grpc.aio.ServicerContext
    ) -> storage_pb2.DeleteObjectResponse:
        """Delete an original the account owns, and the outputs derived from it (and from those):
        their bytes go,
        their rows stay as ``deleted`` (jobs refer to them; a job's deleted outputs are no longer
        listed or linked), and the original's size and one object leave the account's
        ``storage_usage`` in the same transaction (outputs are not counted there, ADR 0029). A
        pending original (an upload that never completed) is deleted the same way. Returns the
        usage after it.

        Errors: NOT_FOUND unknown, derived, already deleted or not the account's (alike);
        FAILED_PRECONDITION ``OBJECT_IN_USE`` while a job on it, or on an object derived from it
        (at any depth: an output may be processed too), has not ended.
        """
        account_id = _uuid(request.account_id)
        object_id = _uuid(request.object_id)
        async with self._pool.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(
                """SELECT o.key, o.size_bytes FROM objects o
                   JOIN object_ownership w ON w.object_id = o.object_id AND w.account_id = $2 AND w.role = 'owner'
                   WHERE o.object_id = $1 AND o.source_object_id IS NULL AND o.state IN ('pending', 'available')
                   FOR UPDATE OF o""",
                object_id,
                account_id,
            )
            if row is None:
                raise NotFound("object not found")
            # The outputs derived from it, and theirs (an output may be processed too), locked
            # like the original: a job being created on one of them holds its row (the job's
            # foreign key), so this waits for it, then sees it below.
            tree = await conn.fetch(
                """WITH RECURSIVE tree(object_id) AS (
                       SELECT object_id FROM objects WHERE source_object_id = $1
                       UNION SELECT o.object_id FROM objects o JOIN tree t ON o.source_object_id = t.object_id)
                   SELECT o.object_id, o.key, o.state FROM objects o JOIN tree USING (object_id)
                   ORDER BY o.object_id FOR UPDATE OF o""",
                object_id,
            )
            if await conn.fetchval(
                "SELECT 1 FROM processing_jobs WHERE object_id = ANY($1::uuid[])"
                " AND status NOT IN ('completed', 'failed', 'cancelled') LIMIT 1",
                [object_id, *(o["object_id"] for o in tree)],
            ):
                raise Conflict(
                    "a job on this object, or on an output derived from it, has not ended yet",
                    "OBJECT_IN_USE",
                )
            outputs = [o for o in tree if o["state"] != "deleted"]
            await conn.execute(
                "UPDATE objects SET state = 'deleted', deleted_at = now() WHERE object_id = ANY($1::uuid[])",
                [object_id, *(o["object_id"] for o in outputs)],
            )
            usage = await conn.fetchrow(
                """UPDATE storage_usage SET used_bytes = greatest(used_bytes - $2, 0),
                       used_objects = greatest(used_objects - 1, 0), updated_at = now()
                   WHERE account_id = $1 RETURNING *""",
                account_id,
                row["size_bytes"],
            )
        # After the commit: a failure here leaves unreferenced bytes, never a row without them. A
        # task of its own, so a caller's deadline that cancels this call does not cut it short.
        removal = asyncio.create_task(
            self._delete_bytes(object_id, [row["key"], *(o["key"] for o in outputs)])
        )
        self._removals.add(removal)
        removal.add_done_callback(self._removals.discard)
        await asyncio.shield(removal)
        return storage_pb2.DeleteObjectResponse(usage=_usage(usage, self._quota))

    async def _delete_bytes(self, object_id: uuid.UUID, keys: list[str]) -> None:
        """Remove the bytes of a deleted original's objects, each failure logged and the rest
        still removed."""
        for key in keys:
            try:
                await self._backend.delete(key)
            except Exception:
                log.exception("the bytes of %s, deleted with object %s, are left behind", key, object_id)

    async def CompleteUpload(
        self, request: storage_pb2.CompleteUploadRequest, context: grpc.aio.ServicerContext
    ) -> storage_pb2.CompleteUploadResponse:
        """Verify the uploaded bytes and mark the object `available` (idempotent).

        Errors: NOT_FOUND unknown object; FAILED_PRECONDITION ``UPLOAD_MISMATCH`` when nothing, or
        bytes of another size or SHA-256 than declared, were uploaded (the object stays pending and
        the PUT URL may be used again until it expires).
        """
        object_id = _uuid(request.object_id)
        row = await self._pool.fetchrow(
            f"SELECT {_OBJECT_COLUMNS} FROM objects WHERE object_id = $1", object_id
        )
        if row is None:
            raise NotFound("object not found")
        if row["state"] == "pending":
            await self._verify(row["key"], row["size_bytes"], row["sha256"])
            updated = await self._pool.fetchrow(
                f"UPDATE objects SET state = 'available' WHERE object_id = $1 RETURNING {_OBJECT_COLUMNS}",
                object_id,
            )
            row = updated or row
        return storage_pb2.CompleteUploadResponse(object=_object(row))

    async def GetObject(
        self, request: storage_pb2.GetObjectRequest, context: grpc.aio.ServicerContext
    ) -> storage_pb2.GetObjectResponse:
        """An `available` object's metadata; with ``account_id``, only when that account owns it.

        Errors: NOT_FOUND for unknown, pending, and not-owned objects alike.
        """
        object_id = _uuid(request.object_id)
        account_id = _uuid(request.account_id) if request.account_id else None
        row = await self._pool.fetchrow(
            f"""SELECT {_OBJECT_COLUMNS} FROM objects o
                WHERE o.object_id = $1 AND o.state = 'available'
                  AND ($2::uuid IS NULL OR EXISTS (
                      SELECT 1 FROM object_ownership w
                      WHERE w.object_id = o.object_id AND w.account_id = $2))""",
            object_id,
            account_id,
        )
        if row is None:
            raise NotFound("object not found")
        return storage_pb2.GetObjectResponse(object=_object(row))

    async def ListObjects(
        self, request: storage_pb2.ListObjectsRequest, context: grpc.aio.ServicerContext
    ) -> storage_pb2.ListObjectsResponse:
        """The ``available`` objects ``account_id`` owns, newest first (``created_at``, then
        ``object_id``), after the position ``(after_created_at, after_object_id)`` when it is
        given: ``kind`` ``original`` (no source), ``output`` (derived) or ``""`` (both).

        Errors: NOT_FOUND a malformed account or object id; INVALID_ARGUMENT a kind or ``limit``
        (1 to :data:`MAX_LIST_LIMIT`) out of range, a position with one half only.
        """
        account_id = _uuid(request.account_id, "account")
        if request.kind not in ("", "original", "output"):
            raise InvalidArgument('kind must be "original", "output" or empty')
        if not 1 <= request.limit <= MAX_LIST_LIMIT:
            raise InvalidArgument(f"limit must be 1 to {MAX_LIST_LIMIT}")
        if request.HasField("after_created_at") != bool(request.after_object_id):
            raise InvalidArgument("after_created_at and after_object_id go together")
        after = request.after_created_at.ToDatetime(UTC) if request.HasField("after_created_at") else None
        after_id = _uuid(request.after_object_id) if request.after_object_id else None
        rows = await self._pool.fetch(
            f"""SELECT {_OBJECT_COLUMNS_OF_O}
                FROM object_ownership w JOIN objects o ON o.object_id = w.object_id
                WHERE w.account_id = $1 AND o.state = 'available'
                  AND ($2 = '' OR ($2 = 'original') = (o.source_object_id IS NULL))
                  AND ($3::timestamptz IS NULL OR (o.created_at, o.object_id) < ($3, $4::uuid))
                ORDER BY o.created_at DESC, o.object_id DESC LIMIT $5""",
            account_id,
            request.kind,
            after,
            after_id,
            request.limit + 1,
        )
        return storage_pb2.ListObjectsResponse(
            objects=[_object(row) for row in rows[: request.limit]], more=len(rows) > request.limit
        )

    async def PresignGet(
        self, request: storage_pb2.PresignGetRequest, context: grpc.aio.ServicerContext
    ) -> storage_pb2.PresignGetResponse:
        """A GET URL for the `available` object at ``key``, served with its stored mime type.

        Errors: NOT_FOUND unknown or pending key; INVALID_ARGUMENT bad ``expires_in_seconds``.
        """
        ttl = self._ttl_of(request.expires_in_seconds)
        if not is_valid_key(request.key):
            raise NotFound("object not found")
        mime = await self._pool.fetchval(
            "SELECT mime_type FROM objects WHERE key = $1 AND state = 'available'", request.key
        )
        if mime is None:
            raise NotFound("object not found")
        url, expires_at = await self._backend.presign_get(request.key, ttl, mime)
        return storage_pb2.PresignGetResponse(url=url, expires_at=_timestamp(expires_at))

    async def PresignOutputPut(
        self, request: storage_pb2.PresignOutputPutRequest, context: grpc.aio.ServicerContext
    ) -> storage_pb2.PresignOutputPutResponse:
        """A PUT URL for ``derived/{pool_id}/{source_object_id}/{profile_version}/{output_type}``.

        Errors: NOT_FOUND source unknown or pending; INVALID_ARGUMENT profile_version < 1, an
        output_type that is not one lowercase key segment, a bad mime type or lifetime.
        """
        source = await self._available(_uuid(request.source_object_id))
        if request.profile_version < 1:
            raise InvalidArgument("profile_version must be at least 1")
        if not OUTPUT_TYPE.match(request.output_type):
            raise InvalidArgument("output_type must match [a-z0-9][a-z0-9_.-]{0,63}")
        mime = _mime(request.mime_type)
        ttl = self._ttl_of(request.expires_in_seconds)
        key = output_key(source["pool_id"], source["object_id"], request.profile_version, request.output_type)
        url, expires_at = await self._backend.presign_put(key, ttl, mime)
        return storage_pb2.PresignOutputPutResponse(key=key, url=url, expires_at=_timestamp(expires_at))

    async def RegisterOutput(
        self, request: storage_pb2.RegisterOutputRequest, context: grpc.aio.ServicerContext
    ) -> storage_pb2.RegisterOutputResponse:
        """Record the uploaded output at ``key`` as an `available` object owned by the source's owners.

        Idempotent per key: a repeat returns the same ``object_id`` with size, SHA-256 and mime type
        refreshed from this call. The SHA-256 is computed from the stored bytes (and compared when
        the request carries one).

        Errors: NOT_FOUND source unknown; INVALID_ARGUMENT key not an output key of the source, bad
        mime type or SHA-256; FAILED_PRECONDITION ``UPLOAD_MISMATCH`` when the stored bytes are
        missing or differ.
        """
        source = await self._available(_uuid(request.source_object_id))
        if not is_output_key_of(request.key, source["pool_id"], source["object_id"]):
            raise InvalidArgument("key is not an output key of the source object")
        mime = _mime(request.mime_type)
        if request.size_bytes < 0:
            raise InvalidArgument("size_bytes must not be negative")
        sha256 = await self._verify(request.key, request.size_bytes, _sha256(request.sha256, required=False))
        async with self._pool.acquire() as conn, conn.transaction():
            row = await self._insert_output(conn, source, request.key, mime, request.size_bytes, sha256)
        return storage_pb2.RegisterOutputResponse(object=_object(row))

    async def _live_attempt(self, job_id: str, attempt: int, states: list[str]) -> asyncpg.Record:
        """The input object of ``job_id`` (with ``job_profile_version``) while ``attempt`` is its
        live attempt in one of ``states``. Raises NotFound (unknown job, input not available) or
        Conflict(ATTEMPT_FENCED)."""
        job = _uuid(job_id, "job")
        row = await self._pool.fetchrow(_LIVE_ATTEMPT, job, attempt, states)
        if row is None:
            if not await self._pool.fetchval("SELECT 1 FROM processing_jobs WHERE job_id = $1", job):
                raise NotFound("job not found")
            raise Conflict(
                f"attempt {attempt} of the job is not its live attempt, or the job is not running",
                "ATTEMPT_FENCED",
            )
        if row["state"] != "available":
            raise NotFound("object not found")
        return row

    async def GrantJob(
        self, request: storage_pb2.GrantJobRequest, context: grpc.aio.ServicerContext
    ) -> storage_pb2.GrantJobResponse:
        """Everything a worker needs to move a claimed job's bytes, in one call: the input object,
        a GET URL of it (served with its mime type), and an output grant for the job's prefix
        ``derived/{pool_id}/{object_id}/{profile_version}/`` (any key there of one more segment,
        each upload at most ``max_put_bytes`` and carrying its SHA-256), all valid for
        ``expires_in_seconds`` (0: the default). Replaces GetObject + PresignGet + a
        PresignOutputPut per output on the worker's path.

        A job whose cancellation was requested still gets its grant: the worker notices the
        cancel and settles it as cancelled (a refusal here would settle it as failed).

        Errors: NOT_FOUND unknown job or input not available; FAILED_PRECONDITION
        ``ATTEMPT_FENCED`` when ``attempt`` is not the live attempt of a running job (claimed,
        processing or cancel requested); INVALID_ARGUMENT bad lifetime.
        """
        ttl = self._ttl_of(request.expires_in_seconds)
        source = await self._live_attempt(request.job_id, request.attempt, _RUNNING)
        prefix = _job_prefix(source)
        kept = [
            c
            for c in await checkpoints.of_job(self._pool, request.job_id)
            if checkpoints.is_key_of(c.key, prefix, request.job_id, c.part)  # never another key
        ]
        (url, expires_at), (method, post_url, fields, _) = await asyncio.gather(
            self._backend.presign_get(source["key"], ttl, source["mime_type"]),
            self._backend.grant_outputs(prefix, ttl, self._max_put_bytes),
        )
        kept_urls = await asyncio.gather(
            *(self._backend.presign_get(c.key, ttl, "application/zip") for c in kept)
        )
        return storage_pb2.GrantJobResponse(
            checkpoints={c.part: part_url for c, (part_url, _) in zip(kept, kept_urls, strict=True)},
            source=_object(source),
            get_url=url,
            expires_at=_timestamp(expires_at),
            outputs=storage_pb2.OutputGrant(
                method=method,
                url=post_url,
                fields=fields,
                key_prefix=prefix,
                expires_at=_timestamp(expires_at),
                max_bytes=self._max_put_bytes,
            ),
        )

    async def sweep_checkpoints(self, batch: int = CHECKPOINT_SWEEP_BATCH) -> int:
        """Deletes the checkpoints (bytes, then rows) of up to ``batch`` jobs that ended
        (completed, failed, cancelled: ADR 0069), each key checked to be a checkpoint of its job
        under the job's prefix first (a row whose key is not is dropped without touching that
        key's bytes). Returns how many rows it removed. A part whose bytes could not be deleted
        keeps its row, moved behind the others (its ``created_at`` set to now), so parts the
        store will not delete never take every place of a later sweep's batch."""
        rows = await self._pool.fetch(
            """
            SELECT c.job_id::text AS job_id, c.part, c.key, o.pool_id, o.object_id, j.profile_version AS job_profile_version
            FROM job_checkpoints c JOIN processing_jobs j USING (job_id) JOIN objects o ON o.object_id = j.object_id
            WHERE c.job_id IN (
                SELECT k.job_id FROM job_checkpoints k JOIN processing_jobs e USING (job_id)
                WHERE e.status IN ('completed', 'failed', 'cancelled')
                GROUP BY k.job_id ORDER BY min(k.created_at) LIMIT $1)
            """,
            batch,
        )
        deleted: dict[str, list[str]] = {}
        failed: list[tuple[str, str]] = []
        for row in rows:
            if checkpoints.is_key_of(row["key"], _job_prefix(row), row["job_id"], row["part"]):
                try:
                    await self._backend.delete(row["key"])
                except Exception:
                    log.warning("checkpoint not deleted; a later sweep tries again", exc_info=True)
                    failed.append((row["job_id"], row["part"]))
                    continue
            deleted.setdefault(row["job_id"], []).append(row["part"])
        for job_id, parts in deleted.items():
            await checkpoints.forget(self._pool, job_id, parts)
        await checkpoints.postpone(self._pool, failed)
        return sum(len(parts) for parts in deleted.values())

    async def RegisterOutputs(
        self, request: storage_pb2.RegisterOutputsRequest, context: grpc.aio.ServicerContext
    ) -> storage_pb2.RegisterOutputsResponse:
        """Record all of a job attempt's uploaded outputs as `available` objects owned by the
        source's owners, in one transaction, and return them in the request's order. Idempotent
        per key, as RegisterOutput. Each output's size and SHA-256 are checked against what the
        store verified while writing (storage reads the bytes only when the store kept no
        checksum). Nothing is registered unless every output passes. A cancel requested while
        the outputs were uploaded does not refuse them (the worker deletes them).

        The request's ``input_facts`` (what the job learned about its input) are kept on the
        input object, merged over what earlier jobs learned, values out of bounds dropped
        (:func:`hypermedia.jobs.facts.checked`): estimates read them.

        Errors: NOT_FOUND unknown job or input; FAILED_PRECONDITION ``ATTEMPT_FENCED`` (a stale
        attempt, or the job ended) or ``UPLOAD_MISMATCH`` (bytes missing, or size or SHA-256
        differ); INVALID_ARGUMENT no outputs, more than :data:`MAX_OUTPUTS_PER_CALL`, a key twice,
        a key outside the job's prefix, a bad mime type, size or SHA-256.
        """
        source = await self._live_attempt(request.job_id, request.attempt, _RUNNING)
        outputs = list(request.outputs)
        if not 0 < len(outputs) <= MAX_OUTPUTS_PER_CALL:
            raise InvalidArgument(f"outputs must hold 1 to {MAX_OUTPUTS_PER_CALL} uploads")
        if len({out.key for out in outputs}) != len(outputs):
            raise InvalidArgument("each output key may appear once")
        prefix = _job_prefix(source)
        for out in outputs:
            if not out.key.startswith(prefix) or not is_output_key_of(
                out.key, source["pool_id"], source["object_id"]
            ):
                raise InvalidArgument(f"key {out.key[:200]!r} is outside the job's prefix {prefix}")
            _mime(out.mime_type)
            if out.size_bytes < 0:
                raise InvalidArgument("size_bytes must not be negative")
            _sha256(out.sha256, required=True)
        digests = await asyncio.gather(
            *(self._verify(out.key, out.size_bytes, out.sha256.lower()) for out in outputs)
        )
        learned = facts.checked(_facts_dict(request.input_facts)) if request.HasField("input_facts") else {}
        async with self._pool.acquire() as conn, conn.transaction():
            rows = [
                await self._insert_output(conn, source, out.key, out.mime_type, out.size_bytes, digest)
                for out, digest in zip(outputs, digests, strict=True)
            ]
            if learned:
                # Written only when it adds or changes a fact: the object's later jobs write nothing.
                await conn.execute(
                    """UPDATE objects SET facts = coalesce(facts, '{}'::jsonb) || $2
                       WHERE object_id = $1 AND (facts IS NULL OR NOT facts @> $2)""",
                    source["object_id"],
                    learned,
                )
        return storage_pb2.RegisterOutputsResponse(objects=[_object(row) for row in rows])

    async def _insert_output(
        self, conn: db.Connection, source: asyncpg.Record, key: str, mime: str, size_bytes: int, sha256: str
    ) -> asyncpg.Record:
        """Upsert the derived object at ``key`` and give it the source's owners, in ``conn``'s
        transaction; returns its row."""
        row = await conn.fetchrow(
            f"""INSERT INTO objects
                    (object_id, pool_id, key, size_bytes, mime_type, sha256, state, source_object_id)
                VALUES ($1, $2, $3, $4, $5, $6, 'available', $7)
                ON CONFLICT (key) DO UPDATE SET size_bytes = EXCLUDED.size_bytes,
                    sha256 = EXCLUDED.sha256, mime_type = EXCLUDED.mime_type
                RETURNING {_OBJECT_COLUMNS}""",
            uuid.uuid4(),
            source["pool_id"],
            key,
            size_bytes,
            mime,
            sha256,
            source["object_id"],
        )
        assert row is not None  # INSERT … ON CONFLICT DO UPDATE … RETURNING yields the row
        await conn.execute(
            """INSERT INTO object_ownership (object_id, account_id, role)
               SELECT $1, account_id, role FROM object_ownership WHERE object_id = $2
               ON CONFLICT DO NOTHING""",
            row["object_id"],
            source["object_id"],
        )
        return row

    async def DeleteOutput(
        self, request: storage_pb2.DeleteOutputRequest, context: grpc.aio.ServicerContext
    ) -> storage_pb2.DeleteOutputResponse:
        """Delete a derived object's row, then its bytes (so a failure leaves at worst unreferenced
        bytes, removed by a retry). ``deleted`` is true when a row or bytes were there.

        Only a key under the output prefix of ``job_id`` while ``attempt`` is its live attempt
        (claimed, processing or cancel requested), as GrantJob: a worker deletes only what its own
        attempt uploaded (ADR 0044).

        Errors: INVALID_ARGUMENT key outside ``derived/`` or outside the job's prefix, no job id;
        NOT_FOUND unknown job; FAILED_PRECONDITION ``ATTEMPT_FENCED`` (a stale attempt, or the job
        ended) or ``OUTPUT_REFERENCED`` when a job output or another derived object still refers to it.
        """
        key = request.key
        if not key.startswith("derived/") or not is_valid_key(key):
            raise InvalidArgument("only derived/ keys can be deleted")
        if not request.job_id:
            raise InvalidArgument("job_id and attempt are required: only a job's own outputs can be deleted")
        prefix = _job_prefix(await self._live_attempt(request.job_id, request.attempt, _RUNNING))
        if not key.startswith(prefix):
            raise InvalidArgument(f"key is outside the job's prefix {prefix}")
        try:
            removed = await self._pool.fetchval("DELETE FROM objects WHERE key = $1 RETURNING object_id", key)
        except asyncpg.ForeignKeyViolationError:
            raise Conflict("the output is still referenced", "OUTPUT_REFERENCED") from None
        had_bytes = await self._backend.stat(key) is not None
        await self._backend.delete(key)
        return storage_pb2.DeleteOutputResponse(deleted=removed is not None or had_bytes)
