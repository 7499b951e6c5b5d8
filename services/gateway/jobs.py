"""The gateway's application layer, shared by REST and gRPC: uploads, job creation (the seed's
"Job Creation"), job status, cancellation and balances. Transport code only translates."""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import json
import logging
import unicodedata
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import httpx

from hypermedia.api.credits.v1 import credits_pb2, credits_pb2_grpc
from hypermedia.api.storage.v1 import storage_pb2, storage_pb2_grpc
from hypermedia.core import pgtext
from hypermedia.core.errors import (
    Conflict,
    DomainError,
    InvalidArgument,
    NotFound,
    PayloadTooLarge,
    TransientError,
    UnsupportedInput,
)
from hypermedia.engines.documents import params as document_params
from hypermedia.engines.imaging import ops as image_ops
from hypermedia.engines.media import params as media_params
from hypermedia.engines.ocr import params as ocr_params
from hypermedia.infra import db
from hypermedia.infra.rpc import call
from hypermedia.intake import contenttype
from hypermedia.intake.clamav import ClamdScanner
from hypermedia.jobs import lifecycle
from hypermedia.jobs import secrets as jobsecrets
from hypermedia.jobs.accounts import Caller
from hypermedia.jobs.events import JobEvent, JobEventHub
from hypermedia.jobs.outbox import OutboxRelay
from hypermedia.jobs.settlement import UNCREATED, Settlement
from hypermedia.jobs.webhooks import account_secret, literal_private_host

log = logging.getLogger(__name__)

DEFAULT_PRIORITY = 5
PARAM_VALIDATORS = {
    "images": image_ops.validate_params,
    "documents": document_params.validate_params,
    "media": media_params.validate_params,
}
"""Per queue: the function that normalises an operation's params or raises InvalidArgument. The
``ocr`` queue's (:func:`hypermedia.engines.ocr.params.validate_params`) also takes the installed languages."""
OCR_LANGUAGES_MAX_AGE = datetime.timedelta(days=1)
"""How long an ocrworker's report of its languages counts (workers report hourly)."""
PASSWORD_QUEUES = frozenset({"documents"})
"""Queues whose operations accept a ``password`` param (kept in ``job_secrets``, never in
``params``: :mod:`hypermedia.jobs.secrets`)."""


def credits_value(millicredits: int | None) -> float | None:
    """Millicredits as credits for the API (1 credit = 1000 millicredits)."""
    return None if millicredits is None else round(millicredits / 1000, 3)


def _escalation_allowance(params: dict[str, Any], profile: asyncpg.Record, mime_type: str) -> int:
    """Millicredits held beside an operation's price for its escalation line (0 but for ``ocr``)."""
    if profile["queue"] != "ocr" or not profile["escalation_per_page"]:
        return 0
    return int(profile["escalation_per_page"]) * ocr_params.escalation_pages(params, mime_type)


@dataclass(frozen=True)
class OperationRequest:
    name: str
    params: dict[str, Any]


def _parse_uuid(value: str, what: str) -> str:
    try:
        return str(uuid.UUID(str(value)))
    except (ValueError, TypeError, AttributeError):
        raise NotFound(f"{what} not found", "NOT_FOUND") from None


MAX_WEBHOOK_URL_LENGTH = 2048
"""Longest ``webhook_url`` (characters)."""


def _check_webhook_url(url: str, *, allow_private: bool = False) -> None:
    """Raises InvalidArgument (INVALID_WEBHOOK_URL) unless ``url`` is an absolute http(s) URL of at
    most 2048 characters with a host, a valid port and no whitespace or control characters, and,
    unless ``allow_private``, a host that is not a non-public IP literal or ``localhost``
    (:func:`hypermedia.jobs.webhooks.literal_private_host`; names are resolved and checked when the
    reaper sends)."""
    if len(url) > MAX_WEBHOOK_URL_LENGTH:
        raise InvalidArgument(
            f"webhook_url may be at most {MAX_WEBHOOK_URL_LENGTH} characters", "INVALID_WEBHOOK_URL"
        )
    if any(ch <= " " or ch == "\x7f" for ch in url):
        raise InvalidArgument(
            "webhook_url must not contain spaces or control characters", "INVALID_WEBHOOK_URL"
        )
    try:
        parts = urlsplit(url)
        _ = parts.port  # raises ValueError for a port that is not a number in 0..65535
    except ValueError:
        raise InvalidArgument("webhook_url is not a valid URL", "INVALID_WEBHOOK_URL") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidArgument("webhook_url must be an http(s) URL", "INVALID_WEBHOOK_URL")
    try:
        host = httpx.URL(url).host  # as the reaper's client reads it (IDNA, full-width dots)
    except (httpx.InvalidURL, UnicodeError):  # UnicodeEncodeError: a lone surrogate
        raise InvalidArgument("webhook_url is not a valid URL", "INVALID_WEBHOOK_URL") from None
    if not allow_private and literal_private_host(host):
        raise InvalidArgument(
            "webhook_url must point to a public address, not a loopback, private or link-local one",
            "INVALID_WEBHOOK_URL",
        )


def _check_text(operations: list[OperationRequest], idempotency_key: str | None) -> None:
    """The bounds of a process request's strings under :mod:`hypermedia.core.pgtext`'s rule, for REST
    and gRPC alike: an operation name of at most :data:`~hypermedia.core.pgtext.MAX_OPERATION_NAME_LENGTH`
    characters, params of at most :data:`~hypermedia.core.pgtext.MAX_PARAMS_BYTES` bytes of JSON, a
    key of at most :data:`~hypermedia.core.pgtext.MAX_IDEMPOTENCY_KEY_LENGTH` characters and without
    NUL (a header: no body check sees it; the webhook URL's 2048 is :func:`_check_webhook_url`'s).
    NUL and lone surrogates in the body were refused where it entered, once: the REST body
    validator, the gRPC interceptor. Raises InvalidText naming the field."""
    pgtext.check(idempotency_key, "idempotency_key", pgtext.MAX_IDEMPOTENCY_KEY_LENGTH)
    for i, op in enumerate(operations):
        pgtext.check(op.name, f"operations[{i}].name", pgtext.MAX_OPERATION_NAME_LENGTH)
        if pgtext.json_size(op.params) > pgtext.MAX_PARAMS_BYTES:
            raise pgtext.InvalidText(
                f"operations[{i}].params", f"may be at most {pgtext.MAX_PARAMS_BYTES} bytes of JSON"
            )


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


def _iso(ts: Any) -> str | None:
    return ts.isoformat() if ts is not None else None


class JobsAPI:
    """Use cases of the public API. Dependencies come in through the constructor."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        storage: storage_pb2_grpc.StorageServiceStub,
        credits: credits_pb2_grpc.CreditsServiceStub,
        relay: OutboxRelay,
        events: JobEventHub,
        http: httpx.AsyncClient,
        *,
        stream_prefix: str,
        max_upload_bytes: int,
        max_operations: int,
        scanner: ClamdScanner | None = None,
        password_key: bytes | None = None,
        webhook_allow_private: bool = False,
    ) -> None:
        self._pool = pool
        self._storage = storage
        self._credits = credits
        self._settlement = Settlement(credits)
        self._relay = relay
        self._events = events
        self._http = http
        self._prefix = stream_prefix
        self.max_upload_bytes = max_upload_bytes
        self._max_operations = max_operations
        self._scanner = scanner  # None: uploads are not scanned (HM_CLAMD_URL unset)
        # HMAC key of passwords in request hashes (jobsecrets.derive_key of HM_GATEWAY_SECRET_KEY);
        # None: requests with a password are refused.
        self._password_key = password_key
        self._webhook_allow_private = webhook_allow_private  # HM_WEBHOOK_ALLOW_PRIVATE

    # -- objects ---------------------------------------------------------------------------

    async def upload_object(
        self, caller: Caller, content: bytes, filename: str, claimed_type: str | None = None
    ) -> dict[str, Any]:
        """Store an original. Returns ``{object_id, pool_id, size_bytes, mime_type, sha256,
        filename, claimed_mime_type, name_mime_type, type_mismatch}``.

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
        return {
            "object_id": obj.object_id,
            "pool_id": obj.pool_id,
            "size_bytes": obj.size_bytes,
            "mime_type": obj.mime_type,
            "sha256": obj.sha256,
            "filename": obj.filename,
            "claimed_mime_type": obj.claimed_mime_type or None,
            "name_mime_type": obj.name_mime_type or None,
            "type_mismatch": obj.type_mismatch,
        }

    async def _store_bytes(
        self, created: storage_pb2.CreateUploadResponse, content: bytes, mime: str
    ) -> storage_pb2.Object:
        """PUT ``content`` to the reserved original's URL and complete it. Raises TransientError
        (STORAGE_UNAVAILABLE) when the store fails, or the storage service's errors."""
        try:
            response = await self._http.put(created.put_url, content=content, headers={"Content-Type": mime})
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

    async def delete_object(self, caller: Caller, object_id: str) -> dict[str, int]:
        """Delete an original of the caller: its bytes go and its size and one object go back to
        the account's storage quota; jobs keep referring to it, outputs derived from it stay.
        Returns the storage usage after it, ``{used_bytes, limit_bytes, used_objects,
        limit_objects}``.

        Raises:
            NotFound: unknown, derived, already deleted or another account's (alike).
            Conflict (``OBJECT_IN_USE``): a job on it has not ended (cancel it or wait).
        """
        object_id = _parse_uuid(object_id, "object")
        response = await call(
            self._storage.DeleteObject,
            storage_pb2.DeleteObjectRequest(account_id=caller.account_id, object_id=object_id),
        )
        usage = response.usage
        return {
            "used_bytes": usage.used_bytes,
            "limit_bytes": usage.limit_bytes,
            "used_objects": usage.used_objects,
            "limit_objects": usage.limit_objects,
        }

    # -- job creation ----------------------------------------------------------------------

    @staticmethod
    def parse_operations(raw: Any) -> list[OperationRequest]:
        """``operations`` of a request: names or ``{name, params}`` objects. Raises InvalidArgument."""
        if not isinstance(raw, list) or not raw:
            raise InvalidArgument("operations must be a non-empty list", "INVALID_REQUEST")
        parsed = []
        for item in raw:
            if isinstance(item, str):
                parsed.append(OperationRequest(item, {}))
            elif isinstance(item, dict) and isinstance(item.get("name"), str):
                params = item.get("params") or {}
                if not isinstance(params, dict) or set(item) - {"name", "params"}:
                    raise InvalidArgument("an operation is a name or {name, params}", "INVALID_REQUEST")
                parsed.append(OperationRequest(item["name"], params))
            else:
                raise InvalidArgument("an operation is a name or {name, params}", "INVALID_REQUEST")
        return parsed

    async def process(
        self,
        caller: Caller,
        object_id: str,
        operations: list[OperationRequest],
        priority: int | None,
        webhook_url: str | None,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        """Create one job per operation. Returns ``{job_ids, estimated_credits}``.

        Order (the seed's): object exists and is the caller's → profile per operation → estimate →
        hold credits (402 before anything is stored) → job rows + outbox rows in one transaction.
        With an ``idempotency_key`` the transaction first takes an advisory lock on (account, key)
        and replays an earlier request with the key, so concurrent duplicates hold credits once.

        A ``password`` in an operation's params is taken out first (:func:`jobsecrets.take_password`),
        before the request hash, the validation and anything stored: the job's params never hold
        it; it goes to ``job_secrets`` in the job's transaction. The request hash includes its
        HMAC (:func:`jobsecrets.password_digest`), so the same key with another password is a
        different request (409); a request without passwords hashes as it always did.

        Raises:
            NotFound: unknown object or not the caller's. InvalidArgument: unknown operation, bad
            params (``INVALID_PARAMS`` also for a password that is not a non-empty string of at
            most 1024 characters, or given to an operation outside :data:`PASSWORD_QUEUES`),
            priority or webhook (also a password for input that is not a PDF);
            ``PASSWORDS_NOT_ENABLED`` for a password when the gateway has no
            ``password_key``. UnsupportedInput: the object's type is not accepted by an
            operation. PayloadTooLarge: the object exceeds a profile's max_input_bytes.
            InsufficientCredits: the hold failed. Conflict: Idempotency-Key reused with another body.
            InvalidText (``INVALID_REQUEST``, naming the field): a string Postgres would refuse or
            above its bound (:func:`_check_text`), before anything else is looked at.
        """
        object_id = _parse_uuid(object_id, "object")
        if len(operations) > self._max_operations:
            raise InvalidArgument(f"at most {self._max_operations} operations per request", "INVALID_REQUEST")
        _check_text(operations, idempotency_key)
        priority = DEFAULT_PRIORITY if priority is None else priority
        if not isinstance(priority, int) or isinstance(priority, bool) or not 1 <= priority <= 10:
            raise InvalidArgument("priority must be an integer from 1 (highest) to 10", "INVALID_PRIORITY")
        if webhook_url:
            _check_webhook_url(webhook_url, allow_private=self._webhook_allow_private)
        operations, passwords = self._take_passwords(operations)
        request_hash = hashlib.sha256(
            json.dumps(
                [object_id, self._hashed_operations(operations, passwords), priority, webhook_url],
                sort_keys=True,
            ).encode()
        ).hexdigest()
        if idempotency_key:
            existing = await self._replay(caller, idempotency_key, request_hash)
            if existing is not None:
                return existing

        obj = (
            await call(
                self._storage.GetObject,
                storage_pb2.GetObjectRequest(object_id=object_id, account_id=caller.account_id),
            )
        ).object
        names = [o.name for o in operations]
        profiles = {
            r["operation"]: r
            for r in await self._pool.fetch(
                "SELECT * FROM processing_profiles WHERE active AND operation = ANY($1::text[])", names
            )
        }
        input_kind = contenttype.kind(obj.mime_type)
        languages = await self.ocr_languages() if any(p["queue"] == "ocr" for p in profiles.values()) else []
        normalised = []
        for op, password in zip(operations, passwords, strict=True):
            profile = profiles.get(op.name)
            if profile is None:
                raise InvalidArgument(f"unknown operation {op.name!r}", "UNKNOWN_OPERATION")
            if password is not None and profile["queue"] not in PASSWORD_QUEUES:
                raise InvalidArgument(f"operation {op.name!r} does not take a password", "INVALID_PARAMS")
            if password is not None and input_kind != "pdf":
                raise InvalidArgument(
                    "a password opens encrypted PDFs only; password-protected office documents are not supported",
                    "INVALID_PARAMS",
                )
            if input_kind not in profile["input_kinds"]:
                explained = contenttype.KIND_OTHER_EXPLAINED.get(obj.mime_type)
                raise UnsupportedInput(
                    f"operation {op.name!r} does not accept {obj.mime_type} input"
                    + (f" ({explained})" if explained else ""),
                    "UNSUPPORTED_FORMAT",
                )
            if obj.size_bytes > profile["max_input_bytes"]:
                raise PayloadTooLarge(
                    f"operation {op.name!r} accepts at most {profile['max_input_bytes']} bytes",
                    "INPUT_TOO_LARGE",
                )
            if profile["queue"] == "ocr":
                if obj.mime_type not in ocr_params.INPUT_MIME_TYPES:
                    raise UnsupportedInput(
                        f"operation {op.name!r} reads PDFs and raster images, not {obj.mime_type}",
                        "UNSUPPORTED_FORMAT",
                    )
                # No ocrworker has reported its languages yet: the form only (the worker checks again).
                params = ocr_params.validate_params(op.name, op.params, installed_languages=languages or None)
            else:
                validator = PARAM_VALIDATORS.get(profile["queue"])
                params = validator(op.name, op.params) if validator else op.params
            normalised.append((op.name, params, profile))

        estimate = await call(
            self._credits.Estimate, credits_pb2.EstimateRequest(operations=names, size_bytes=obj.size_bytes)
        )
        job_ids = [str(uuid.uuid4()) for _ in normalised]
        amounts = [e.millicredits for e in estimate.estimates]
        # The hold also covers what escalation may add (charged as its own line, only for the
        # pages escalated); the job's estimated_credits stays the profile's price.
        holds = [
            amount + _escalation_allowance(params, profile, obj.mime_type)
            for amount, (_name, params, profile) in zip(amounts, normalised, strict=True)
        ]
        request_id = uuid.uuid4()
        held = False
        try:
            async with self._pool.acquire() as conn, conn.transaction():
                if idempotency_key:
                    # Duplicates of one key wait here for the first to commit, then replay it:
                    # they must not hold credits of their own (a retrying client could get a 402).
                    await conn.execute(
                        "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))",
                        f"process-request:{caller.account_id}:{idempotency_key}",
                    )
                    replay = await self._replay(caller, idempotency_key, request_hash, conn)
                    if replay is not None:
                        return replay
                await call(
                    self._credits.Hold,
                    credits_pb2.HoldRequest(
                        account_id=caller.account_id,
                        holds=[
                            credits_pb2.JobHold(job_id=j, millicredits=a)
                            for j, a in zip(job_ids, holds, strict=True)
                        ],
                    ),
                )
                held = True
                if idempotency_key:
                    await conn.execute(
                        "INSERT INTO process_requests (account_id, idempotency_key, request_hash, request_id, job_ids) "
                        "VALUES ($1, $2, $3, $4, $5::uuid[])",
                        caller.account_id,
                        idempotency_key,
                        request_hash,
                        request_id,
                        job_ids,
                    )
                await lifecycle.create_queued(
                    conn,
                    self._prefix,
                    [
                        lifecycle.NewJob(
                            job_id=job_id,
                            account_id=caller.account_id,
                            object_id=object_id,
                            request_id=request_id,
                            operation=name,
                            profile_version=profile["version"],
                            queue=profile["queue"],
                            params=params,
                            priority=priority,
                            max_attempts=profile["max_attempts"],
                            estimated_credits=amount,
                            webhook_url=webhook_url or None,
                            idempotency_key=idempotency_key,
                        )
                        for job_id, (name, params, profile), amount in zip(
                            job_ids, normalised, amounts, strict=True
                        )
                    ],
                )
                await jobsecrets.store(
                    conn,
                    [(j, p) for j, p in zip(job_ids, passwords, strict=True) if p is not None],
                )
                # The job rows' foreign keys hold the object's row against a DeleteObject from
                # here on (it waits, then sees the jobs: OBJECT_IN_USE); one that committed since
                # GetObject shows here as 'deleted' (ADR 0029).
                state = await conn.fetchval("SELECT state FROM objects WHERE object_id = $1", object_id)
                if state != "available":
                    raise NotFound("object not found", "NOT_FOUND")
        except BaseException:
            if held:
                for job_id in job_ids:
                    try:
                        await self._settlement.settle(job_id, UNCREATED)
                    except DomainError:
                        # The reaper releases holds whose job was never created.
                        log.exception("could not release the hold of an uncreated job")
            raise
        self._relay.wake.set()
        return {"job_ids": job_ids, "estimated_credits": credits_value(estimate.total_millicredits)}

    async def ocr_languages(self) -> list[str]:
        """The recognition languages ``ocr`` jobs may ask for: every language an ocrworker
        reported within :data:`OCR_LANGUAGES_MAX_AGE`, sorted; empty when none has."""
        rows = await self._pool.fetch(
            "SELECT DISTINCT language FROM ocr_languages WHERE reported_at > now() - $1::interval ORDER BY language",
            OCR_LANGUAGES_MAX_AGE,
        )
        return [r["language"] for r in rows]

    def _take_passwords(
        self, operations: list[OperationRequest]
    ) -> tuple[list[OperationRequest], list[str | None]]:
        """The operations without their ``password`` param, and the passwords (None where none was
        given), in the same order. Raises InvalidArgument (see :meth:`process`); the password is in
        no message."""
        stripped, passwords = [], []
        for op in operations:
            params, password = jobsecrets.take_password(op.params)
            if password is not None and self._password_key is None:
                raise InvalidArgument("this server does not accept passwords", "PASSWORDS_NOT_ENABLED")
            stripped.append(OperationRequest(op.name, params) if password is not None else op)
            passwords.append(password)
        return stripped, passwords

    def _hashed_operations(
        self, operations: list[OperationRequest], passwords: list[str | None]
    ) -> list[list[Any]]:
        """The operations as the request hash sees them: ``[name, params]``, as before passwords
        existed (stored hashes stay valid), plus ``{"password_hmac": …}`` for one with a password."""
        hashed: list[list[Any]] = []
        for op, password in zip(operations, passwords, strict=True):
            if password is None:
                hashed.append([op.name, op.params])
            else:
                assert self._password_key is not None  # _take_passwords refused it otherwise
                digest = jobsecrets.password_digest(self._password_key, password)
                hashed.append([op.name, op.params, {"password_hmac": digest}])
        return hashed

    async def _replay(
        self, caller: Caller, key: str, request_hash: str, conn: db.Connection | None = None
    ) -> dict[str, Any] | None:
        """The answer of the earlier request with this key (job ids in the order of its operations),
        None when the key is new. Raises Conflict when the key came with another request."""
        reader = conn if conn is not None else self._pool
        row = await reader.fetchrow(
            "SELECT request_hash, request_id, job_ids FROM process_requests"
            " WHERE account_id = $1 AND idempotency_key = $2",
            caller.account_id,
            key,
        )
        if row is None:
            return None
        if row["request_hash"] != request_hash:
            raise Conflict("this Idempotency-Key was used with a different request", "IDEMPOTENCY_KEY_REUSED")
        jobs = await reader.fetch(
            "SELECT job_id, estimated_credits FROM processing_jobs WHERE request_id = $1 ORDER BY created_at, job_id",
            row["request_id"],
        )
        order = [str(j) for j in row["job_ids"]] if row["job_ids"] else [str(j["job_id"]) for j in jobs]
        return {
            "job_ids": order,
            "estimated_credits": credits_value(sum(j["estimated_credits"] for j in jobs)),
        }

    # -- job status ------------------------------------------------------------------------

    async def get_job(self, caller: Caller, job_id: str) -> dict[str, Any]:
        """A job with attempts and outputs (with presigned download URLs). Raises NotFound."""
        job_id = _parse_uuid(job_id, "job")
        job = await self._pool.fetchrow(
            "SELECT * FROM processing_jobs WHERE job_id = $1 AND account_id = $2", job_id, caller.account_id
        )
        if job is None:
            raise NotFound("job not found", "NOT_FOUND")
        attempts = await self._pool.fetch(
            "SELECT * FROM job_attempts WHERE job_id = $1 ORDER BY attempt_number", job_id
        )
        outputs = await self._pool.fetch(
            "SELECT * FROM job_outputs WHERE job_id = $1 ORDER BY output_type", job_id
        )
        rendered_outputs = []
        for out in outputs:
            url = await call(self._storage.PresignGet, storage_pb2.PresignGetRequest(key=out["key"]))
            rendered_outputs.append(
                {
                    "output_type": out["output_type"],
                    "object_id": str(out["object_id"]),
                    "key": out["key"],
                    "mime_type": out["mime_type"],
                    "size_bytes": out["size_bytes"],
                    "metadata": out["metadata"],
                    "url": url.url,
                }
            )
        return {
            "job_id": str(job["job_id"]),
            "object_id": str(job["object_id"]),
            "operation": job["operation"],
            "profile_version": job["profile_version"],
            "queue": job["queue"],
            "params": job["params"],
            "status": job["status"],
            "priority": job["priority"],
            "attempt_count": job["attempt_count"],
            "max_attempts": job["max_attempts"],
            "lost_attempts": job["lost_attempts"],
            "error_code": job["error_code"],
            "error_message": job["error_message"],
            "estimated_credits": credits_value(job["estimated_credits"]),
            "actual_credits": credits_value(job["actual_credits"]),
            "charge_lines": {
                name: credits_value(amount) for name, amount in (job["charge_lines"] or {}).items()
            },
            "created_at": _iso(job["created_at"]),
            "queued_at": _iso(job["queued_at"]),
            "started_at": _iso(job["started_at"]),
            "completed_at": _iso(job["completed_at"]),
            "next_attempt_at": _iso(job["next_attempt_at"]),
            "attempts": [
                {
                    "attempt_number": a["attempt_number"],
                    "worker_id": a["worker_id"],
                    "status": a["status"],
                    "error_code": a["error_code"],
                    "error_message": a["error_message"],
                    "started_at": _iso(a["started_at"]),
                    "finished_at": _iso(a["finished_at"]),
                    "duration_ms": a["duration_ms"],
                    "peak_memory_mb": a["peak_memory_mb"],
                }
                for a in attempts
            ],
            "outputs": rendered_outputs,
        }

    async def watch_job(
        self, caller: Caller, job_id: str, after_event_id: int = 0
    ) -> AsyncIterator[JobEvent | None]:
        """The job's events as they happen (see :class:`hypermedia.jobs.events.JobEventHub`), ending after
        its terminal status; ``None`` marks a keep-alive. Raises NotFound before the first event."""
        job_id = _parse_uuid(job_id, "job")
        owned = await self._pool.fetchval(
            "SELECT 1 FROM processing_jobs WHERE job_id = $1 AND account_id = $2", job_id, caller.account_id
        )
        if owned is None:
            raise NotFound("job not found", "NOT_FOUND")
        return self._events.watch(job_id, max(0, after_event_id))

    async def cancel_job(self, caller: Caller, job_id: str) -> dict[str, Any]:
        """Cancel: ``queued``/``retry_wait`` → ``cancelled`` at once (hold released, never executed);
        ``claimed``/``processing`` → ``cancel_requested`` (the worker stops it). Raises NotFound, or
        Conflict (JOB_NOT_CANCELLABLE) for a job that already ended."""
        job_id = _parse_uuid(job_id, "job")
        status = await lifecycle.request_cancel(self._pool, job_id, caller.account_id)
        if status is None:
            current = await lifecycle.job_status(self._pool, job_id, caller.account_id)
            if current is None:
                raise NotFound("job not found", "NOT_FOUND")
            if current != "cancel_requested":
                raise Conflict(f"the job is already {current}", "JOB_NOT_CANCELLABLE")
        if status == "cancelled":
            await self._settlement.settle(job_id, "cancelled")
        return await self.get_job(caller, job_id)

    async def account(self, caller: Caller) -> dict[str, Any]:
        """``{account_id, pool_id, webhook_secret}``: what an app needs to verify webhooks."""
        secret = await account_secret(self._pool, caller.account_id)
        return {"account_id": caller.account_id, "pool_id": caller.pool_id, "webhook_secret": secret}

    async def balance(self, caller: Caller) -> dict[str, Any]:
        """``{balance, held, available}`` in credits."""
        response = await call(
            self._credits.GetBalance, credits_pb2.GetBalanceRequest(account_id=caller.account_id)
        )
        return {
            "balance": credits_value(response.balance_millicredits),
            "held": credits_value(response.held_millicredits),
            "available": credits_value(response.balance_millicredits - response.held_millicredits),
        }
