"""Uploads, reading and deletion of objects (``POST /v1/objects``, ``GET`` and ``DELETE
/v1/objects/{id}``; gRPC ``UploadObject``, ``GetObject``, ``DeleteObject``): every check of the
bytes before storage hears of them, then the storage service's reserve → PUT → complete."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import unicodedata
from datetime import UTC

import httpx
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_fixed

from hypermedia.api.storage.v1 import storage_pb2, storage_pb2_grpc
from hypermedia.core.errors import DomainError, InvalidArgument, PayloadTooLarge, TransientError
from hypermedia.infra.rpc import call
from hypermedia.intake import contenttype
from hypermedia.intake.clamav import ClamdScanner
from hypermedia.jobs.accounts import Caller
from services.gateway.ids import parse_uuid
from services.gateway.results import ObjectInfo, ObjectPage, ObjectSummary, StorageUsage, StoredObject
from services.gateway.status import MAX_PAGE_SIZE, page_cursor, page_position

log = logging.getLogger(__name__)

MAX_DISPLAY_NAME_LENGTH = 255
"""Longest display name kept from a client's file name (characters; the usual file-name limit).
Longer names are cut, keeping an extension of up to 16 characters."""
_BIDI_CONTROLS = frozenset(
    "\u061c\u200e\u200f"  # ALM, LRM, RLM
    "\u202a\u202b\u202c\u202d\u202e"  # embeddings, PDF, overrides (LRO, RLO)
    "\u2066\u2067\u2068\u2069"  # isolates
)


def display_name(filename: str | None) -> str:
    """A client's file name made safe to store and show. It stays metadata: never a path, a key or
    part of a command (keys are ``originals/{pool_id}/{object_id}``).

    NFC-normalised; control characters (NUL, C0, DEL, C1), line and paragraph separators, lone
    surrogates and bidi controls (U+202A–U+202E, U+2066–U+2069, U+200E, U+200F, U+061C: the
    right-to-left override shows ``invoice<RLO>gpj.exe`` as ``invoiceexe.jpg``) removed; ``/`` and
    ``\\`` replaced by ``_``; surrounding whitespace stripped; a name of dots only dropped; cut to
    :data:`MAX_DISPLAY_NAME_LENGTH`. Returns ``""`` when nothing is left."""
    name = unicodedata.normalize("NFC", filename or "")
    name = "".join(
        "_" if ch in "/\\" else ch
        for ch in name
        if ch not in _BIDI_CONTROLS and unicodedata.category(ch) not in ("Cc", "Cs", "Zl", "Zp")
    ).strip()
    if not name.strip("."):
        return ""
    if len(name) > MAX_DISPLAY_NAME_LENGTH:
        stem, dot, extension = name.rpartition(".")
        if dot and stem and 0 < len(extension) <= 16:
            name = f"{stem[: MAX_DISPLAY_NAME_LENGTH - len(extension) - 1]}.{extension}"
        else:
            name = name[:MAX_DISPLAY_NAME_LENGTH]
    return name


class Uploads:
    """The upload and delete use cases. Dependencies come in through the constructor.

    Args:
        storage: the storage service (reserves, completes and deletes originals).
        http: PUTs the bytes to the reserved original's presigned URL.
        max_upload_bytes: largest upload (``HM_MAX_UPLOAD_BYTES``).
        scanner: the virus scanner; None: uploads are not scanned (``HM_CLAMD_URL`` unset).
    """

    def __init__(
        self,
        storage: storage_pb2_grpc.StorageServiceStub,
        http: httpx.AsyncClient,
        *,
        max_upload_bytes: int,
        scanner: ClamdScanner | None = None,
    ) -> None:
        self._storage = storage
        self._http = http
        self.max_upload_bytes = max_upload_bytes
        self._scanner = scanner

    async def upload_object(
        self, caller: Caller, content: bytes, filename: str, claimed_type: str | None = None
    ) -> StoredObject:
        """Store an original. Returns it as stored.

        The type is decided from the content (:func:`contenttype.identify`: magic bytes; zip
        containers inspected from their central directory and typed from inside); what the client
        claimed (``claimed_type``, the multipart part's Content-Type, and the extension of
        ``filename``) is recorded beside it and logged. ``filename`` is kept as a sanitised display
        name (:func:`display_name`). Every check runs before storage is asked for anything.

        Raises:
            InvalidArgument: empty content. PayloadTooLarge: above ``max_upload_bytes``.
            ArchiveRejected (``ARCHIVE_*``, 422) and MacrosNotAllowed (415) from
            :mod:`hypermedia.intake.archives`: a zip container that failed inspection or carries macros.
            VirusFound, TooLargeToScan, ScannerUnavailable (``hypermedia.intake.clamav``): the virus scan,
            when a scanner is configured; nothing is stored then. StorageQuotaExceeded (403): the
            account's storage quota has no room for the file (ADR 0029); nothing is stored.
        """
        if not content:
            raise InvalidArgument("the file is empty", "EMPTY_FILE")
        if len(content) > self.max_upload_bytes:
            raise PayloadTooLarge(f"files are limited to {self.max_upload_bytes} bytes", "INPUT_TOO_LARGE")
        if self._scanner is not None:
            await self._scanner.ensure_clean(content)
        try:
            mime = await asyncio.to_thread(contenttype.identify, content)
        except DomainError as exc:
            log.info("upload refused", extra={"error_code": exc.error_code, "size_bytes": len(content)})
            raise
        name = display_name(filename)
        claimed = contenttype.claimed_mime(claimed_type)
        implied = contenttype.name_mime(name)
        mismatch = contenttype.type_mismatch(mime, claimed, implied)
        digest = hashlib.sha256(content).hexdigest()
        created = await call(
            self._storage.CreateUpload,
            storage_pb2.CreateUploadRequest(
                account_id=caller.account_id,
                pool_id=caller.pool_id,
                size_bytes=len(content),
                mime_type=mime,
                sha256=digest,
                filename=name,
                claimed_mime_type=claimed or "",
                name_mime_type=implied or "",
                type_mismatch=mismatch,
            ),
        )
        try:
            obj = await self._store_bytes(created, content, mime)
        except BaseException:
            await self._give_back(caller, created.object.object_id)
            raise
        log.info(
            "upload typed from its content",
            extra={
                "object_id": obj.object_id,
                "mime_type": obj.mime_type,
                "claimed_mime_type": obj.claimed_mime_type or None,
                "name_mime_type": obj.name_mime_type or None,
                "type_mismatch": obj.type_mismatch,
                "display_name": obj.filename,
            },
        )
        return StoredObject(
            object_id=obj.object_id,
            pool_id=obj.pool_id,
            size_bytes=obj.size_bytes,
            mime_type=obj.mime_type,
            sha256=obj.sha256,
            filename=obj.filename,
            claimed_mime_type=obj.claimed_mime_type or None,
            name_mime_type=obj.name_mime_type or None,
            type_mismatch=obj.type_mismatch,
        )

    async def _store_bytes(
        self, created: storage_pb2.CreateUploadResponse, content: bytes, mime: str
    ) -> storage_pb2.Object:
        """PUT ``content`` to the reserved original's URL and complete it. Raises TransientError
        (STORAGE_UNAVAILABLE) when the store fails, or the storage service's errors."""
        try:
            response = await put_original(self._http, created.put_url, content, mime)
        except httpx.HTTPError as exc:
            raise TransientError("object storage is unavailable", "STORAGE_UNAVAILABLE") from exc
        if response.status_code >= 300:
            log.error("storage PUT answered %s", response.status_code)
            raise TransientError("object storage rejected the upload", "STORAGE_UNAVAILABLE")
        done = await call(
            self._storage.CompleteUpload,
            storage_pb2.CompleteUploadRequest(object_id=created.object.object_id),
        )
        return done.object

    async def _give_back(self, caller: Caller, object_id: str) -> None:
        """Delete the pending original of an upload that failed after its row was made, so its
        bytes do not stay counted against the quota; a failure here is logged (the row stays
        pending and counted until the account deletes it)."""
        try:
            await call(
                self._storage.DeleteObject,
                storage_pb2.DeleteObjectRequest(account_id=caller.account_id, object_id=object_id),
            )
        except DomainError:
            log.exception("could not delete the pending original of a failed upload")

    async def get_object(self, caller: Caller, object_id: str) -> ObjectInfo:
        """An object the caller owns, an original or an output of its jobs, with a presigned
        download URL.

        Raises:
            NotFound: ``NOT_FOUND`` for a malformed id, an unknown, pending, deleted or another
                account's object (alike).
        """
        object_id = parse_uuid(object_id, "object")
        found = await call(
            self._storage.GetObject,
            storage_pb2.GetObjectRequest(object_id=object_id, account_id=caller.account_id),
        )
        obj = found.object
        signed = await call(self._storage.PresignGet, storage_pb2.PresignGetRequest(key=obj.key))
        return ObjectInfo(
            object_id=obj.object_id,
            pool_id=obj.pool_id,
            size_bytes=obj.size_bytes,
            mime_type=obj.mime_type,
            sha256=obj.sha256,
            filename=obj.filename,
            source_object_id=obj.source_object_id or None,
            created_at=obj.created_at.ToDatetime(UTC),
            url=signed.url,
            url_expires_at=signed.expires_at.ToDatetime(UTC),
        )

    async def list_objects(
        self, caller: Caller, kind: str = "", limit: int = 50, cursor: str | None = None
    ) -> ObjectPage:
        """The caller's available objects, newest first (by ``created_at``, then id): ``kind``
        ``original``, ``output`` (the outputs of its jobs) or ``""`` (both), ``limit`` (1 to
        :data:`~services.gateway.status.MAX_PAGE_SIZE`) a page, after ``cursor`` (the previous
        page's ``next_cursor``). Without URLs (:meth:`get_object` gives one).

        Raises:
            InvalidArgument: ``INVALID_KIND``, ``INVALID_PAGE_SIZE``, ``INVALID_CURSOR``.
            TransientError: storage unreachable.
        """
        if kind not in ("", "original", "output"):
            raise InvalidArgument(
                f'kind {kind[:32]!r}: "original", "output" or left out (both)', "INVALID_KIND"
            )
        if not 1 <= limit <= MAX_PAGE_SIZE:
            raise InvalidArgument(f"page size must be 1 to {MAX_PAGE_SIZE}", "INVALID_PAGE_SIZE")
        request = storage_pb2.ListObjectsRequest(account_id=caller.account_id, kind=kind, limit=limit)
        if cursor:
            at, after = page_position(cursor)  # in UTC, within years 1-9999: a Timestamp holds it
            request.after_created_at.FromDatetime(at)
            request.after_object_id = after
        found = await call(self._storage.ListObjects, request)
        objects = tuple(
            ObjectSummary(
                object_id=o.object_id,
                size_bytes=o.size_bytes,
                mime_type=o.mime_type,
                sha256=o.sha256,
                filename=o.filename,
                source_object_id=o.source_object_id or None,
                created_at=o.created_at.ToDatetime(UTC),
            )
            for o in found.objects
        )
        last = objects[-1] if objects and found.more else None
        return ObjectPage(objects, page_cursor(last.created_at, last.object_id) if last else None)

    async def delete_object(self, caller: Caller, object_id: str) -> StorageUsage:
        """Delete an original of the caller: its bytes go and its size and one object go back to
        the account's storage quota; the outputs derived from it are deleted too (jobs keep their
        history but list no outputs).
        Returns the account's storage usage after it.

        Raises:
            NotFound: unknown, derived, already deleted or another account's (alike).
            Conflict (``OBJECT_IN_USE``): a job on it has not ended (cancel it or wait).
        """
        object_id = parse_uuid(object_id, "object")
        response = await call(
            self._storage.DeleteObject,
            storage_pb2.DeleteObjectRequest(account_id=caller.account_id, object_id=object_id),
        )
        usage = response.usage
        return StorageUsage(
            used_bytes=usage.used_bytes,
            limit_bytes=usage.limit_bytes,
            used_objects=usage.used_objects,
            limit_objects=usage.limit_objects,
        )


STALE_CONNECTION_ERRORS = (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)
"""What a kept-alive connection the store closed meanwhile gives (the store closes connections
idle past its head deadline, and evicts idle ones at its per-address cap: every service on one
host shares an address), and a store restarting: tried once more on a new connection. Not
timeouts: a store that is slow stays slow."""


async def put_original(http: httpx.AsyncClient, url: str, content: bytes, mime: str) -> httpx.Response:
    """PUTs an original's bytes to its presigned ``url``, a second time after a connection-level
    failure (:data:`STALE_CONNECTION_ERRORS`): the PUT of one key with the same bytes and
    checksum is idempotent. A CI run failed an upload with ``503 STORAGE_UNAVAILABLE`` right
    after a test whose worker uploads had filled the store's connections from 127.0.0.1.

    Raises:
        httpx.HTTPError: the second try's failure, or the first's when it was no connection failure.
    """
    async for attempt in AsyncRetrying(
        stop=stop_after_attempt(2),
        wait=wait_fixed(0.1),
        retry=retry_if_exception_type(STALE_CONNECTION_ERRORS),
        reraise=True,
    ):
        with attempt:
            return await http.put(url, content=content, headers={"Content-Type": mime})
    raise AssertionError("unreachable: tenacity re-raises the last failure")
