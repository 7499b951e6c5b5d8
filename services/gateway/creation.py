"""Job creation (the seed's "Job Creation": ``POST /v1/hypermedia/process``, gRPC ``Process``) as
named steps over one request, in the seed's order:

1. **check** — what needs nothing but the request (:mod:`services.gateway.process_request`), the
   passwords taken out and the request hash made; a repeated Idempotency-Key replays here;
2. **resolve profiles** — the object (the caller's, available), the active processing profile of
   each operation, and each operation's params validated against both;
3. **plan** — a job id per operation, and what to hold beside its price (an OCR escalation
   allowance);
4. **price, hold and persist** — in one transaction: the credits service's ``EstimateAndHold``
   (each job priced and held in one call; 402 before anything is stored), the request's
   idempotency row, the jobs and their outbox rows (:func:`lifecycle.create_queued`) and their
   secrets; a hold whose jobs were not created is released (:class:`Settlement`).
"""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import json
import logging
import uuid
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import asyncpg

from hypermedia.api.credits.v1 import credits_pb2, credits_pb2_grpc
from hypermedia.api.storage.v1 import storage_pb2, storage_pb2_grpc
from hypermedia.core import metrics
from hypermedia.core.errors import (
    Conflict,
    DomainError,
    InvalidArgument,
    NotFound,
    PayloadTooLarge,
    UnsupportedInput,
)
from hypermedia.engines.documents import params as document_params
from hypermedia.engines.imaging import ops as image_ops
from hypermedia.engines.media import params as media_params
from hypermedia.engines.ocr import params as ocr_params
from hypermedia.infra import db
from hypermedia.infra.rpc import call
from hypermedia.intake import contenttype
from hypermedia.jobs import lifecycle, noop, presets, queues, quotas
from hypermedia.jobs import secrets as jobsecrets
from hypermedia.jobs.accounts import Caller
from hypermedia.jobs.outbox import OutboxRelay
from hypermedia.jobs.settlement import UNCREATED, Settlement
from services.gateway import estimates
from services.gateway.ids import parse_uuid
from services.gateway.process_request import (
    OperationRequest,
    check_priority,
    check_queue,
    check_schedule,
    check_text,
    check_webhook_url,
)
from services.gateway.results import EstimateResult, OperationEstimate, ProcessResult

log = logging.getLogger(__name__)

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


@dataclass(frozen=True)
class _Request:
    """A process request after the check step."""

    object_id: str
    """Canonical UUID of the original."""
    operations: list[OperationRequest]
    """The operations without their ``password`` params."""
    passwords: list[str | None]
    """Per operation, its password or None."""
    priority: int
    webhook_url: str | None
    idempotency_key: str | None
    request_hash: str
    """SHA-256 (hex) of what makes two requests with one Idempotency-Key the same."""
    bulk: bool = False
    """Whether the jobs go to the bulk queue's lanes (``bulk.{engine}``, ADR 0057)."""
    not_before: datetime.datetime | None = None
    """When a delayed request's jobs become due (ADR 0071); None: queued at once."""
    scheduled: bool = False
    """Whether the jobs are a schedule's run's, for the sched queue's lanes (``sched.{engine}``,
    the scheduler consumers; ADR 0073)."""


@dataclass(frozen=True)
class _Operation:
    """One operation after the resolve step: its profile found and its params normalised."""

    name: str
    params: dict[str, Any]
    profile: asyncpg.Record
    """Its active ``processing_profiles`` row."""
    password: str | None
    preset: tuple[str, int] | None = None
    """The name and version of the caller's preset it came from, if any."""


@dataclass(frozen=True)
class _PlannedJob:
    """One job to create, after the plan step."""

    job_id: str
    operation: _Operation
    allowance_millicredits: int
    """Held beside its price: the escalation allowance (:func:`_escalation_allowance`)."""


@dataclass(frozen=True)
class _PricedJob:
    """One job to create, after its hold."""

    job_id: str
    operation: _Operation
    price_millicredits: int
    """The estimate of the credits service: the job's ``estimated_credits`` (the hold is this
    and the allowance)."""


def _escalation_allowance(params: dict[str, Any], profile: asyncpg.Record, mime_type: str) -> int:
    """Millicredits held beside an operation's price for its escalation line (0 but for ``ocr``)."""
    if profile["queue"] != "ocr" or not profile["escalation_per_page"]:
        return 0
    return int(profile["escalation_per_page"]) * ocr_params.escalation_pages(params, mime_type)


class JobCreation:
    """The job creation use case. Dependencies come in through the constructor.

    Args:
        pool: the system of record (profiles, idempotency rows; jobs through :mod:`lifecycle`).
        storage: the storage service (the object's owner, type and size).
        credits: the credits service (``EstimateAndHold``: prices and holds in one call).
        settlement: releases the holds of jobs whose creation failed.
        relay: the outbox relay, woken after a commit.
        stream_prefix: the JetStream subject prefix of the outbox rows (``HM_STREAM_PREFIX``).
        max_operations: most operations per request (``HM_MAX_OPERATIONS``).
        password_key: HMAC key of passwords in request hashes
            (:func:`jobsecrets.derive_key` of ``HM_GATEWAY_SECRET_KEY``); None: requests with a
            password are refused.
        webhook_allow_private: accept webhook URLs of private addresses (``HM_WEBHOOK_ALLOW_PRIVATE``).
        noop_enabled: accept the ``noop`` operation (``HM_NOOP_OPERATION``; :mod:`hypermedia.jobs.noop`).
    """

    def __init__(
        self,
        pool: asyncpg.Pool,
        storage: storage_pb2_grpc.StorageServiceStub,
        credits: credits_pb2_grpc.CreditsServiceStub,
        settlement: Settlement,
        relay: OutboxRelay,
        *,
        stream_prefix: str,
        max_operations: int,
        password_key: bytes | None = None,
        webhook_allow_private: bool = False,
        noop_enabled: bool = False,
    ) -> None:
        self._pool = pool
        self._storage = storage
        self._credits = credits
        self._settlement = settlement
        self._relay = relay
        self._prefix = stream_prefix
        self._max_operations = max_operations
        self._password_key = password_key
        self._webhook_allow_private = webhook_allow_private
        self._noop_enabled = noop_enabled
        self._creating: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        """Per account, the lock its job-creating requests take in this process (dropped once unused)."""

    async def process(
        self,
        caller: Caller,
        object_id: str,
        operations: list[OperationRequest],
        priority: int | None,
        webhook_url: str | None,
        idempotency_key: str | None = None,
        queue: str | None = None,
        *,
        paced: bool = False,
        scheduled: bool = False,
        not_before: str | datetime.datetime | None = None,
        delay_seconds: float | None = None,
    ) -> ProcessResult:
        """Create one job per operation; returns their ids and price. With ``queue="bulk"`` each job
        goes to the bulk queue's lane of its operation's engine (``bulk.images`` for a thumbnail;
        priority 7-10, default 8), taken only by units configured for it (ADR 0057).

        Order (the seed's): object exists and is the caller's → profile per operation → estimate
        and hold credits in one call (402 before anything is stored) → job rows + outbox rows in
        one transaction.
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
            ``INVALID_QUEUE`` for a queue other than ``bulk``, ``INVALID_PRIORITY`` for a bulk
            request's priority outside 7-10;
            ``PASSWORDS_NOT_ENABLED`` for a password when the gateway has no
            ``password_key``; ``OPERATION_NOT_ENABLED`` for ``noop`` unless ``noop_enabled``. UnsupportedInput: the object's type is not accepted by an
            operation. PayloadTooLarge: the object exceeds a profile's max_input_bytes.
            InsufficientCredits: the hold failed. Conflict: Idempotency-Key reused with another body.
            InvalidText (``INVALID_REQUEST``, naming the field): a string Postgres would refuse or
            above its bound (:func:`check_text`), before anything else is looked at.

        ``paced`` is a backfill run's (:mod:`services.gateway.backfill_runner`): the run paces its
        jobs at its own rate, so they take no token of the account's request rate.

        ``scheduled`` is a schedule's process run's (:mod:`services.gateway.schedule_runner`): its
        jobs go to the sched queue's lane of their engine (``sched.images``), which only the
        scheduler consumers take, never an ordinary slot (ADR 0073).

        ``not_before`` or ``delay_seconds`` delay the jobs (ADR 0071, :func:`check_schedule`;
        ``INVALID_SCHEDULE``): they are created ``scheduled``, their credits held now, and queued
        when due; a time not in the future queues them at once.
        """
        request = self._check(
            object_id, operations, priority, webhook_url, idempotency_key, queue, (not_before, delay_seconds)
        )
        if scheduled:
            # Another request than the same body on the ordinary lanes: a caller who sends the
            # run's idempotency key first cannot make the run's jobs ordinary ones (409 instead).
            sched_hash = hashlib.sha256(f"{request.request_hash}:{queues.SCHED}".encode()).hexdigest()
            request = replace(request, scheduled=True, request_hash=sched_hash)
        if request.idempotency_key:
            earlier = await self._replay(caller, request.idempotency_key, request.request_hash)
            if earlier is not None:
                return earlier
        obj = await self._object(caller, request.object_id)
        resolved = await self._resolve_profiles(caller, request, obj)
        planned = self._plan(resolved, obj)
        return await self._hold_and_persist(caller, request, planned, obj.size_bytes, paced)

    async def estimate(
        self, caller: Caller, object_id: str, operations: list[OperationRequest], priority: int | None = None
    ) -> EstimateResult:
        """What a process request of ``operations`` on the object would hold, and how long each
        job would run (:func:`estimates.predict`), checked as :meth:`process` checks it but with
        nothing held or created. Raises what :meth:`process` raises before its hold."""
        request = self._check(object_id, operations, priority, None, None)
        obj = await self._object(caller, request.object_id)
        planned = self._plan(await self._resolve_profiles(caller, request, obj), obj)
        priced = await call(
            self._credits.Estimate,
            credits_pb2.EstimateRequest(
                operations=[p.operation.name for p in planned], size_bytes=obj.size_bytes
            ),
        )
        lines = []
        known = await estimates.object_facts(self._pool, obj.object_id)
        for plan, price in zip(planned, priced.estimates, strict=True):
            prediction = await estimates.predict(
                self._pool, plan.operation.name, obj.size_bytes, known, obj.mime_type
            )
            lines.append(
                OperationEstimate(
                    plan.operation.name,
                    price.millicredits,
                    plan.allowance_millicredits,
                    prediction.seconds,
                    prediction.samples,
                    prediction.basis,
                )
            )
        return EstimateResult(tuple(lines), sum(e.millicredits + e.allowance_millicredits for e in lines))

    async def check_preset(self, operation: str, params: dict[str, Any]) -> dict[str, Any]:
        """Whether ``operation`` with ``params`` may be a preset (or a backfill run's selector):
        what a process request of it would be checked for without an object (the strings' bounds,
        an active profile, ``noop`` enabled, the params; an ``ocr`` job's languages against the
        reported ones). Returns the params normalised as a job of them would store them. Raises
        InvalidArgument (``INVALID_REQUEST``, ``UNKNOWN_OPERATION``, ``OPERATION_NOT_ENABLED``,
        ``INVALID_PARAMS``, also for a ``password``: a preset never holds one) or InvalidText."""
        op = OperationRequest(operation, params)
        check_text([op], None)
        if jobsecrets.PASSWORD_PARAM in params:
            raise InvalidArgument(
                "a preset cannot hold a password; send it with the request", "INVALID_PARAMS"
            )
        profile = await self._pool.fetchrow(
            "SELECT * FROM processing_profiles WHERE active AND operation = $1", operation
        )
        if profile is None:
            raise await self._unknown_operation(operation)
        if operation == noop.OPERATION and not self._noop_enabled:
            raise InvalidArgument(noop.NOT_ENABLED_MESSAGE, noop.NOT_ENABLED)
        if profile["queue"] == "ocr":
            languages = await self.ocr_languages()
            return ocr_params.validate_params(operation, params, installed_languages=languages or None)
        return self._params(op, profile, storage_pb2.Object(), [])

    @property
    def max_operations(self) -> int:
        """Most operations per request (``HM_MAX_OPERATIONS``)."""
        return self._max_operations

    async def owned_object(self, caller: Caller, object_id: str) -> None:
        """Raises NotFound unless ``object_id`` is an available object of the caller (as a process
        request's object step would)."""
        await self._object(caller, parse_uuid(object_id, "object"))

    async def ocr_languages(self) -> list[str]:
        """The recognition languages ``ocr`` jobs may ask for: every language an ocrworker
        reported within :data:`OCR_LANGUAGES_MAX_AGE`, sorted; empty when none has."""
        rows = await self._pool.fetch(
            "SELECT DISTINCT language FROM ocr_languages WHERE reported_at > now() - $1::interval ORDER BY language",
            OCR_LANGUAGES_MAX_AGE,
        )
        return [r["language"] for r in rows]

    # -- step 1: check ---------------------------------------------------------------------

    def _check(
        self,
        object_id: str,
        operations: list[OperationRequest],
        priority: int | None,
        webhook_url: str | None,
        idempotency_key: str | None,
        queue: str | None = None,
        schedule: tuple[str | datetime.datetime | None, float | None] = (None, None),
    ) -> _Request:
        """Everything that needs nothing but the request, in the order the errors are reported:
        the object id's form, the number of operations, the strings' bounds, the queue, the
        priority, the webhook URL, the schedule (``(not_before, delay_seconds)``), the passwords;
        then the request hash (a bulk request's includes the queue, a delayed one's its delay or
        its instant; any other's is as before bulk existed)."""
        object_id = parse_uuid(object_id, "object")
        if len(operations) > self._max_operations:
            raise InvalidArgument(f"at most {self._max_operations} operations per request", "INVALID_REQUEST")
        check_text(operations, idempotency_key)
        bulk = check_queue(queue)
        priority = check_priority(priority, bulk=bulk)
        if webhook_url:
            check_webhook_url(webhook_url, allow_private=self._webhook_allow_private)
        not_before = check_schedule(*schedule, datetime.datetime.now(datetime.UTC))
        operations, passwords = self._take_passwords(operations)
        hashed: list[Any] = [object_id, self._hashed_operations(operations, passwords), priority, webhook_url]
        if bulk:
            hashed.append(queues.BULK)
        if not_before is not None and schedule[1] is not None:
            # The delay as given (a retry a minute later is the same request), as a number.
            hashed.append({"delay_seconds": float(schedule[1])})
        elif not_before is not None:
            hashed.append({"not_before": not_before.isoformat()})  # the instant, in UTC
        # A time not in the future runs now: the same request as one without it.
        request_hash = hashlib.sha256(json.dumps(hashed, sort_keys=True).encode()).hexdigest()
        return _Request(
            object_id,
            operations,
            passwords,
            priority,
            webhook_url,
            idempotency_key,
            request_hash,
            bulk,
            not_before,
        )

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
            if op.preset:  # a preset is named, never given a password
                hashed.append([op.name, op.params, {"preset": op.preset}])
            elif password is None:
                hashed.append([op.name, op.params])
            else:
                assert self._password_key is not None  # _take_passwords refused it otherwise
                digest = jobsecrets.password_digest(self._password_key, password)
                hashed.append([op.name, op.params, {"password_hmac": digest}])
        return hashed

    async def _replay(
        self, caller: Caller, key: str, request_hash: str, conn: db.Connection | None = None
    ) -> ProcessResult | None:
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
            "SELECT job_id, estimated_credits, not_before FROM processing_jobs"
            " WHERE request_id = $1 AND parent_job_id IS NULL"
            " ORDER BY created_at, job_id",
            row["request_id"],
        )
        order = [str(j) for j in row["job_ids"]] if row["job_ids"] else [str(j["job_id"]) for j in jobs]
        return ProcessResult(
            job_ids=tuple(order),
            estimated_millicredits=int(sum(j["estimated_credits"] for j in jobs)),
            not_before=jobs[0]["not_before"] if jobs else None,
        )

    # -- step 2: resolve profiles ----------------------------------------------------------

    async def _object(self, caller: Caller, object_id: str) -> storage_pb2.Object:
        """The original, if it is the caller's (the storage service's NotFound otherwise)."""
        response = await call(
            self._storage.GetObject,
            storage_pb2.GetObjectRequest(object_id=object_id, account_id=caller.account_id),
        )
        return response.object

    async def expand_presets(
        self, caller: Caller, operations: list[OperationRequest]
    ) -> list[tuple[OperationRequest, tuple[str, int] | None]]:
        """Each operation, a ``{preset}`` one as the operation and params of the caller's active
        version of it, with that preset's name and version. Raises InvalidArgument
        (``UNKNOWN_PRESET``) for a preset the caller has no active version of."""
        named = sorted({op.preset for op in operations if op.preset})
        found = await presets.active(self._pool, uuid.UUID(caller.account_id), named) if named else {}
        expanded: list[tuple[OperationRequest, tuple[str, int] | None]] = []
        for op in operations:
            if not op.preset:
                expanded.append((op, None))
                continue
            preset = found.get(op.preset)
            if preset is None:
                raise InvalidArgument(f"unknown preset {op.preset!r}", "UNKNOWN_PRESET")
            expanded.append(
                (OperationRequest(preset["operation"], preset["params"]), (preset["name"], preset["version"]))
            )
        return expanded

    async def _unknown_operation(self, name: str) -> InvalidArgument:
        """The ``UNKNOWN_OPERATION`` error for ``name``, listing the operations a request may
        name (the active profiles'; ``noop`` only where it is enabled)."""
        known = await self._pool.fetchval(
            "SELECT array_agg(DISTINCT operation ORDER BY operation) FROM processing_profiles WHERE active"
        )
        valid = [o for o in known or () if o != noop.OPERATION or self._noop_enabled]
        return InvalidArgument(f"unknown operation {name!r}: one of {', '.join(valid)}", "UNKNOWN_OPERATION")

    async def _unaccepted_input(self, name: str, mime_type: str, input_kind: str) -> UnsupportedInput:
        """The ``UNSUPPORTED_FORMAT`` error for operation ``name`` on an object of ``mime_type``,
        naming the operations that do take its kind (a video's ``poster`` for a ``thumbnail``)."""
        explained = contenttype.KIND_OTHER_EXPLAINED.get(mime_type)
        accepting = await self._pool.fetchval(
            "SELECT array_agg(DISTINCT operation ORDER BY operation) FROM processing_profiles"
            " WHERE active AND $1 = ANY(input_kinds) AND operation <> $2",
            input_kind,
            noop.OPERATION,
        )
        hint = f"; for {input_kind} input: {', '.join(accepting)}" if accepting else ""
        return UnsupportedInput(
            f"operation {name!r} does not accept {mime_type} input"
            + (f" ({explained})" if explained else "")
            + hint,
            "UNSUPPORTED_FORMAT",
        )

    async def _resolve_profiles(
        self, caller: Caller, request: _Request, obj: storage_pb2.Object
    ) -> list[_Operation]:
        """Each operation (a preset's as its active version says: :meth:`_presets`) with its
        active profile and its params normalised, checked in the request's order: unknown preset
        (422) → unknown operation (422) → ``noop`` where it is not enabled (422) → a password where
        none is taken (422) → the object's kind (415) → its size (413) → the params (422; an
        ``ocr`` job's languages against those the ocrworkers reported; ``noop`` takes none)."""
        expanded = await self.expand_presets(caller, request.operations)
        names = [o.name for o, _ in expanded]
        profiles = {
            r["operation"]: r
            for r in await self._pool.fetch(
                "SELECT * FROM processing_profiles WHERE active AND operation = ANY($1::text[])", names
            )
        }
        input_kind = contenttype.kind(obj.mime_type)
        languages = await self.ocr_languages() if any(p["queue"] == "ocr" for p in profiles.values()) else []
        resolved = []
        for (op, preset), password in zip(expanded, request.passwords, strict=True):
            profile = profiles.get(op.name)
            if profile is None:
                raise await self._unknown_operation(op.name)
            if op.name == noop.OPERATION and not self._noop_enabled:
                raise InvalidArgument(noop.NOT_ENABLED_MESSAGE, noop.NOT_ENABLED)
            if password is not None and profile["queue"] not in PASSWORD_QUEUES:
                raise InvalidArgument(f"operation {op.name!r} does not take a password", "INVALID_PARAMS")
            if password is not None and input_kind != "pdf":
                raise InvalidArgument(
                    "a password opens encrypted PDFs only; password-protected office documents are not supported",
                    "INVALID_PARAMS",
                )
            if input_kind not in profile["input_kinds"]:
                raise await self._unaccepted_input(op.name, obj.mime_type, input_kind)
            if obj.size_bytes > profile["max_input_bytes"]:
                raise PayloadTooLarge(
                    f"operation {op.name!r} accepts at most {profile['max_input_bytes']} bytes",
                    "INPUT_TOO_LARGE",
                )
            params = self._params(op, profile, obj, languages)
            resolved.append(_Operation(op.name, params, profile, password, preset))
        return resolved

    @staticmethod
    def _params(
        op: OperationRequest, profile: asyncpg.Record, obj: storage_pb2.Object, languages: list[str]
    ) -> dict[str, Any]:
        """``op``'s params normalised by its queue's validator (:data:`PARAM_VALIDATORS`; as sent
        for a queue without one). Raises InvalidArgument or UnsupportedInput."""
        if profile["queue"] == "ocr":
            if obj.mime_type not in ocr_params.INPUT_MIME_TYPES:
                raise UnsupportedInput(
                    f"operation {op.name!r} reads PDFs and raster images, not {obj.mime_type}",
                    "UNSUPPORTED_FORMAT",
                )
            # No ocrworker has reported its languages yet: the form only (the worker checks again).
            return ocr_params.validate_params(op.name, op.params, installed_languages=languages or None)
        if op.name == noop.OPERATION:  # on the images queue, but no image operation
            if op.params:
                raise InvalidArgument("operation 'noop' takes no params", "INVALID_PARAMS")
            return {}
        validator = PARAM_VALIDATORS.get(profile["queue"])
        return validator(op.name, op.params) if validator else op.params

    # -- step 3: plan ----------------------------------------------------------------------

    @staticmethod
    def _plan(operations: list[_Operation], obj: storage_pb2.Object) -> list[_PlannedJob]:
        """A job per operation: its id, and the allowance held beside its price for what
        escalation may add (charged as its own line, only for the pages escalated); the job's
        ``estimated_credits`` stays the profile's price."""
        return [
            _PlannedJob(
                job_id=str(uuid.uuid4()),
                operation=op,
                allowance_millicredits=_escalation_allowance(op.params, op.profile, obj.mime_type),
            )
            for op in operations
        ]

    # -- step 4: hold and persist ----------------------------------------------------------

    async def _hold_and_persist(
        self, caller: Caller, request: _Request, planned: list[_PlannedJob], size_bytes: int, paced: bool
    ) -> ProcessResult:
        """Price and hold the jobs' credits (:meth:`_hold`) and create them in one transaction,
        one request of the account at a time (an asyncio lock per account, then
        :func:`quotas.creation_lock`) so its job quota counts exactly.
        With an Idempotency-Key, duplicates of one key wait on an advisory lock for the first to
        commit, then replay it: they must not hold credits of their own (a retrying client could
        get a 402). A hold taken before the transaction failed is released (:meth:`_release`);
        after a commit the outbox relay is woken."""
        # The account's job-creating requests one at a time, from the quota check in
        # EstimateAndHold to the commit of their jobs, so each check counts the jobs before it:
        # first in this process, holding no connection (an account's burst of requests must not
        # tie up the pool other accounts need), then across gateway replicas in Postgres.
        lock = self._creating.get(caller.account_id)
        if lock is None:
            lock = self._creating[caller.account_id] = asyncio.Lock()
        async with lock:
            return await self._hold_and_persist_locked(caller, request, planned, size_bytes, paced)

    async def _hold_and_persist_locked(
        self, caller: Caller, request: _Request, planned: list[_PlannedJob], size_bytes: int, paced: bool
    ) -> ProcessResult:
        held = False
        try:
            async with self._pool.acquire() as conn, conn.transaction():
                await quotas.creation_lock(conn, caller.account_id)
                if request.idempotency_key:
                    await conn.execute(
                        "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))",
                        f"process-request:{caller.account_id}:{request.idempotency_key}",
                    )
                    replay = await self._replay(caller, request.idempotency_key, request.request_hash, conn)
                    if replay is not None:
                        return replay
                jobs, total_millicredits = await self._hold(
                    caller, planned, size_bytes, request.priority, paced
                )
                held = True
                await self._persist(conn, caller, request, jobs)
        except BaseException:
            if held:
                await self._release(planned)
            raise
        self._relay.wake.set()
        for j in jobs:
            queue = _route(request, j.operation.profile["queue"]).split(".")[0]
            metrics.JOBS_CREATED.labels(j.operation.name, queue).inc()
        return ProcessResult(
            job_ids=tuple(j.job_id for j in jobs),
            estimated_millicredits=total_millicredits,
            not_before=request.not_before,
        )

    async def _hold(
        self, caller: Caller, planned: Sequence[_PlannedJob], size_bytes: int, priority: int, paced: bool
    ) -> tuple[list[_PricedJob], int]:
        """One ``EstimateAndHold`` for all the jobs: the account's job quota checked at
        ``priority`` (hypermedia/jobs/quotas.py), then each job priced by the credits service
        (``base_cost + per_mb × size_mb`` of its profile) and held with its allowance. Returns
        the jobs with their prices and the prices' total (millicredits). Raises PermissionDenied
        (403 ``PRIORITY_NOT_ALLOWED``), RateLimited (429 ``RATE_LIMITED`` or
        ``TOO_MANY_QUEUED_JOBS``), InsufficientCredits (402) when the account's available credits
        do not cover them (nothing is held then), NotFound (``UNKNOWN_OPERATION``) when a profile
        went inactive since it was resolved."""
        response = await call(
            self._credits.EstimateAndHold,
            credits_pb2.EstimateAndHoldRequest(
                account_id=caller.account_id,
                size_bytes=size_bytes,
                priority=priority,
                paced=paced,
                jobs=[
                    credits_pb2.JobToHold(
                        job_id=j.job_id,
                        operation=j.operation.name,
                        extra_millicredits=j.allowance_millicredits,
                    )
                    for j in planned
                ],
            ),
        )
        jobs = [
            _PricedJob(job_id=j.job_id, operation=j.operation, price_millicredits=e.millicredits)
            for j, e in zip(planned, response.estimates, strict=True)
        ]
        return jobs, response.total_millicredits

    async def _persist(
        self, conn: db.Connection, caller: Caller, request: _Request, jobs: Sequence[_PricedJob]
    ) -> None:
        """In the caller's transaction: the idempotency row, the jobs as ``queued`` with their
        outbox rows (``scheduled`` without, when delayed), their passwords; then the object's state read again. Raises NotFound when
        the object was deleted since it was looked up."""
        request_id = str(uuid.uuid4())
        job_ids = [j.job_id for j in jobs]
        if request.idempotency_key:
            await conn.execute(
                "INSERT INTO process_requests (account_id, idempotency_key, request_hash, request_id, job_ids) "
                "VALUES ($1, $2, $3, $4, $5::uuid[])",
                caller.account_id,
                request.idempotency_key,
                request.request_hash,
                request_id,
                job_ids,
            )
        await lifecycle.create_queued(
            conn,
            self._prefix,
            [
                lifecycle.NewJob(
                    job_id=j.job_id,
                    account_id=caller.account_id,
                    object_id=request.object_id,
                    request_id=request_id,
                    operation=j.operation.name,
                    profile_version=j.operation.profile["version"],
                    queue=_route(request, j.operation.profile["queue"]),
                    params=j.operation.params,
                    priority=request.priority,
                    max_attempts=j.operation.profile["max_attempts"],
                    estimated_credits=j.price_millicredits,
                    webhook_url=request.webhook_url or None,
                    idempotency_key=request.idempotency_key,
                    preset=j.operation.preset,
                    not_before=request.not_before,
                )
                for j in jobs
            ],
        )
        await jobsecrets.store(
            conn, [(j.job_id, j.operation.password) for j in jobs if j.operation.password is not None]
        )
        # The job rows' foreign keys hold the object's row against a DeleteObject from here on (it
        # waits, then sees the jobs: OBJECT_IN_USE); one that committed since GetObject shows here
        # as 'deleted' (ADR 0029).
        state = await conn.fetchval("SELECT state FROM objects WHERE object_id = $1", request.object_id)
        if state != "available":
            raise NotFound("object not found", "NOT_FOUND")

    async def _release(self, jobs: Sequence[_PlannedJob]) -> None:
        """Release the holds of jobs that were not created; a failure is logged (the reaper
        releases holds whose job was never created)."""
        for job in jobs:
            try:
                await self._settlement.settle(job.job_id, UNCREATED)
            except DomainError:
                log.exception("could not release the hold of an uncreated job")


def _route(request: _Request, engine_queue: str) -> str:
    """The route of a job of ``request`` whose profile's queue is ``engine_queue``: that queue,
    or its lane of the bulk queue (ADR 0057) or of the sched queue (ADR 0073)."""
    if request.bulk:
        return queues.bulk_route(engine_queue)
    if request.scheduled:
        return queues.sched_route(engine_queue)
    return engine_queue
