"""What the gateway's use cases return: frozen dataclasses with ``datetime`` values and integer
millicredits, rendered by each transport in its own way — :mod:`services.gateway.rest` into the
JSON of the REST API (ISO 8601 strings, credits as numbers), :mod:`services.gateway.grpc_api` into
``hypermedia.jobs.v1`` messages (``Timestamp``, credits as decimal strings). No layer parses back
what another formatted.

Amounts are millicredits (1 credit = 1000 millicredits), as the credits service and the
``processing_jobs`` columns keep them. Times are as Postgres returns ``timestamptz`` (aware, UTC);
a naive one is taken as UTC by the gRPC renderer and written without an offset by the REST one.

The ``dict`` fields (``params``, ``metadata``) hold decoded JSON; they are not copied, so treat
them as read-only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any


@dataclass(frozen=True)
class StoredObject:
    """An original just stored (``POST /v1/objects``, ``UploadObject``)."""

    object_id: str
    """The object's id (a UUID)."""
    pool_id: str
    """The storage pool it was stored in (the caller's)."""
    size_bytes: int
    """Its size (bytes)."""
    mime_type: str
    """The type decided from the content (:func:`hypermedia.intake.contenttype.identify`)."""
    sha256: str
    """SHA-256 of the bytes, 64 lowercase hex digits."""
    filename: str
    """The client's file name as a sanitised display name (:func:`services.gateway.uploads.display_name`)."""
    claimed_mime_type: str | None
    """The type the client claimed (the multipart part's ``Content-Type``, normalised); None if none."""
    name_mime_type: str | None
    """The type the file name's extension implies; None if none."""
    type_mismatch: bool
    """A claimed or name-implied type differs from :attr:`mime_type`."""


@dataclass(frozen=True)
class ObjectInfo:
    """An object of the caller, original or output (``GET /v1/objects/{id}``, ``GetObject``),
    with a presigned URL to download it."""

    object_id: str
    pool_id: str
    size_bytes: int
    """Its size (bytes)."""
    mime_type: str
    sha256: str
    """SHA-256 of the bytes, 64 lowercase hex digits."""
    filename: str
    """An original's display name (``""`` when none was given, and for outputs)."""
    source_object_id: str | None
    """For an output, the object it was derived from; None for an original."""
    created_at: datetime
    url: str
    """A presigned GET URL of the bytes, served with :attr:`mime_type`."""
    url_expires_at: datetime
    """When :attr:`url` stops working (the storage service's default lifetime, 15 minutes)."""


@dataclass(frozen=True)
class ObjectSummary:
    """An object of a ``GET /v1/objects`` page: :class:`ObjectInfo` without its URL."""

    object_id: str
    size_bytes: int
    mime_type: str
    sha256: str
    filename: str
    source_object_id: str | None
    """For an output, the object it was derived from; None for an original."""
    created_at: datetime


@dataclass(frozen=True)
class ObjectPage:
    """A page of the caller's objects, newest first, and the next page's cursor (None on the last)."""

    objects: tuple[ObjectSummary, ...]
    next_cursor: str | None


@dataclass(frozen=True)
class OutputLink:
    """A fresh presigned URL of one output of a job (``GET /v1/jobs/{id}/outputs/{type}``, gRPC
    ``GetOutputUrl``)."""

    output_type: str
    object_id: str
    mime_type: str
    size_bytes: int
    url: str
    """A presigned GET URL of the output's bytes, made for this request."""
    url_expires_at: datetime
    """When :attr:`url` stops working (the storage service's default lifetime, 15 minutes)."""


@dataclass(frozen=True)
class OperationEstimate:
    """One operation of ``POST /v1/hypermedia/estimate``."""

    operation: str
    millicredits: int
    """What its job would be held: the profile's price on this input."""
    allowance_millicredits: int
    """Held beside it for what an ``ocr`` job's escalation may add (0 for others)."""
    predicted_seconds: float | None
    """Its run predicted from the operation's history (None without enough of it)."""
    samples: int
    """Completed attempts the prediction is made from."""
    basis: str
    """``pixels``, ``pages``, ``media_seconds``, ``size``, ``median`` or ``none``
    (:class:`services.gateway.estimates.Prediction`)."""


@dataclass(frozen=True)
class EstimateResult:
    """``POST /v1/hypermedia/estimate``: each operation, and the total held for all of them."""

    operations: tuple[OperationEstimate, ...]
    total_millicredits: int
    """The sum of every price and allowance: what a process request would hold."""


@dataclass(frozen=True)
class StorageUsage:
    """An account's storage against its quota (ADR 0029), as the storage service reports it."""

    used_bytes: int
    """Bytes of the account's originals, pending uploads included."""
    limit_bytes: int
    """The quota's bytes."""
    used_objects: int
    """Originals stored, pending uploads included."""
    limit_objects: int
    """The quota's objects."""


@dataclass(frozen=True)
class ProcessResult:
    """The jobs one process request created (or, for a repeated Idempotency-Key, created before)."""

    job_ids: tuple[str, ...]
    """One job id per operation, in the order of the request's operations."""
    estimated_millicredits: int
    """The price of all the jobs together (millicredits): the credits service's estimate, or on a
    replay the sum of the jobs' ``estimated_credits``."""
    not_before: datetime | None = None
    """When the delayed jobs become due (ADR 0071); None: queued at once."""


@dataclass(frozen=True)
class Attempt:
    """One attempt of a job (a ``job_attempts`` row)."""

    attempt_number: int
    """1 for the first attempt, counting every attempt started."""
    worker_id: str
    """The worker that ran it."""
    status: str
    """``processing``, ``completed``, ``failed``, ``lost`` or ``cancelled``."""
    error_code: str | None
    """The bounded error code of a failed attempt; None otherwise."""
    error_message: str | None
    """Its public message; None otherwise."""
    started_at: datetime
    """When it started."""
    finished_at: datetime | None
    """When it ended; None while it runs."""
    duration_ms: int | None
    """Its wall time (milliseconds); None while it runs."""
    peak_memory_mb: int | None
    """Peak resident memory of its sandbox child (MiB); None when not measured."""


@dataclass(frozen=True)
class Output:
    """One output of a job, with a presigned download URL."""

    output_type: str
    """The output's name among the job's outputs (``thumbnail``, ``hls_720p``, …)."""
    object_id: str
    """The derived object's id."""
    key: str
    """Its storage key."""
    mime_type: str
    """Its media type."""
    size_bytes: int
    """Its size (bytes)."""
    metadata: dict[str, Any]
    """Decoded properties the worker recorded (width, height, pages, …)."""
    url: str
    """A presigned GET URL (lifetime: the storage service's ``HM_STORAGE_URL_TTL_SECONDS``)."""


@dataclass(frozen=True)
class Job:
    """A job as its owner sees it: a ``processing_jobs`` row with its attempts and outputs."""

    job_id: str
    """The job's id (a UUID)."""
    object_id: str
    """The original it processes."""
    operation: str
    """The operation's name."""
    profile_version: int
    """The version of the operation's processing profile it was priced and limited by."""
    queue: str
    """The queue it runs on (``images``, ``documents``, ``ocr``, ``media``)."""
    params: dict[str, Any]
    """The normalised params (never a password)."""
    preset: tuple[str, int] | None
    """The name and version of the caller's preset it was made from, if any."""
    status: str
    """The job's status (``queued``, ``processing``, ``completed``, …; the ``processing_jobs`` check)."""
    priority: int
    """1 (highest) to 10."""
    attempt_count: int
    """Attempts started, including those lost to the infrastructure."""
    max_attempts: int
    """Most attempts that may fail on the job's own account."""
    lost_attempts: int
    """Attempts lost to the infrastructure (not counted against :attr:`max_attempts`)."""
    error_code: str | None
    """The bounded error code of a failed job; None otherwise."""
    error_message: str | None
    """Its public message; None otherwise."""
    estimated_millicredits: int
    """The price held at creation, without the escalation allowance (millicredits)."""
    actual_millicredits: int | None
    """What the job was charged (millicredits): the work it did once completed, a minimum once
    failed because of its input (:mod:`hypermedia.jobs.charges`); None otherwise."""
    charge_lines: Mapping[str, int]
    """Parts of :attr:`actual_millicredits` charged as lines of their own, by name (millicredits)."""
    created_at: datetime
    """When the job was created."""
    queued_at: datetime | None
    """When it was (last) queued."""
    started_at: datetime | None
    """When its first attempt started."""
    completed_at: datetime | None
    """When it ended."""
    next_attempt_at: datetime | None
    """When a job in ``retry_wait`` is queued again."""
    not_before: datetime | None
    """A delayed job's due time (ADR 0071): ``scheduled`` until then; None for a job queued at once."""
    attempts: tuple[Attempt, ...]
    """Its attempts by number."""
    outputs: tuple[Output, ...]
    """Its outputs by ``output_type``."""


@dataclass(frozen=True)
class Account:
    """What an app needs to verify the caller's webhooks."""

    account_id: str
    """The caller's account."""
    pool_id: str
    """The caller's storage pool."""
    webhook_secret: str | None
    """The secret signing its webhooks (Standard Webhooks ``whsec_…``); None for a read-only key."""


@dataclass(frozen=True)
class LedgerEntry:
    """One movement of an account's credits (the credits service's ledger), with its job's state."""

    entry_id: int
    kind: str
    """``grant``, ``hold``, ``commit`` or ``release``."""
    line: str
    """A commit's charge line (``base``, ``pages``, ``media_seconds``, ``megapixels``, ``run_seconds``, ``ocr_escalation``); ``base`` otherwise."""
    millicredits: int
    """A grant (+) and a commit (−): the change of the balance; a hold and a release: the
    amount held or given back (+), the balance unchanged."""
    job_id: str | None
    operation: str | None
    job_status: str | None
    error_code: str | None
    created_at: datetime


@dataclass(frozen=True)
class LedgerPage:
    """A page of :class:`LedgerEntry`, newest first; ``next_cursor`` None on the last."""

    entries: tuple[LedgerEntry, ...]
    next_cursor: str | None


@dataclass(frozen=True)
class Balance:
    """An account's credits (the credits service's ``GetBalance``)."""

    balance_millicredits: int
    """The balance (millicredits)."""
    held_millicredits: int
    """Held by jobs that have not ended (millicredits)."""

    @property
    def available_millicredits(self) -> int:
        """The balance less what is held (millicredits)."""
        return self.balance_millicredits - self.held_millicredits
