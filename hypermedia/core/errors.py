"""One error model for every service.

A :class:`DomainError` carries everything a caller and an operator need: a bounded ``error_code``
(stable, documented, used on metrics and spans), a public message (safe to send), the gRPC status
and HTTP status it maps to, and whether the failure may be retried. The cause stays in the logs:
interceptors and REST handlers send ``public_message`` only.

Shape after temporalio's ``ApplicationError(non_retryable=...)`` and gotenberg's ``errortype``.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

import grpc


class DomainError(Exception):
    """Base class. Subclasses fix ``grpc_code``, ``http_status`` and ``retryable``.

    Args:
        error_code: bounded identifier such as ``INPUT_TOO_LARGE_PIXELS``.
        message: public message, safe to show to the caller. Never include paths, credentials
            or stack traces.
    """

    grpc_code: ClassVar[grpc.StatusCode] = grpc.StatusCode.INTERNAL
    http_status: ClassVar[int] = 500
    retryable: ClassVar[bool] = False
    default_code: ClassVar[str] = "INTERNAL"

    def __init__(
        self, message: str, error_code: str | None = None, details: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.public_message = message
        self.error_code = error_code or self.default_code
        self._details = dict(details or {})

    @property
    def details(self) -> dict[str, Any]:
        """Extra public fields of the error (a REST problem's members), e.g. ``{"signature": …}``;
        JSON values. They cross gRPC in the ``hm-error-details`` trailer (:func:`from_rpc_error`)."""
        return dict(self._details)


class InvalidArgument(DomainError):
    """The request itself is malformed: unknown operation, bad params (HTTP 422)."""

    grpc_code = grpc.StatusCode.INVALID_ARGUMENT
    http_status = 422
    default_code = "INVALID_ARGUMENT"


class Unauthenticated(DomainError):
    """No or an unknown API key (HTTP 401)."""

    grpc_code = grpc.StatusCode.UNAUTHENTICATED
    http_status = 401
    default_code = "UNAUTHENTICATED"


class PermissionDenied(DomainError):
    """The caller is known but may not do this: an account that is not an admin calling the
    operators' API (HTTP 403)."""

    grpc_code = grpc.StatusCode.PERMISSION_DENIED
    http_status = 403
    default_code = "PERMISSION_DENIED"


class NotFound(DomainError):
    """The thing does not exist or the caller may not see it; both answer the same (HTTP 404)."""

    grpc_code = grpc.StatusCode.NOT_FOUND
    http_status = 404
    default_code = "NOT_FOUND"


class InsufficientCredits(DomainError):
    """The account's available credits do not cover the estimate (HTTP 402)."""

    grpc_code = grpc.StatusCode.FAILED_PRECONDITION
    http_status = 402
    default_code = "INSUFFICIENT_CREDITS"


class Conflict(DomainError):
    """The request conflicts with current state, e.g. reused Idempotency-Key (HTTP 409)."""

    grpc_code = grpc.StatusCode.FAILED_PRECONDITION
    http_status = 409
    default_code = "CONFLICT"


class PayloadTooLarge(DomainError):
    """The input exceeds a size limit (HTTP 413)."""

    grpc_code = grpc.StatusCode.RESOURCE_EXHAUSTED
    http_status = 413
    default_code = "INPUT_TOO_LARGE"


class StorageQuotaExceeded(DomainError):
    """An upload would take the account past its storage quota, in bytes or in objects (HTTP 403,
    gRPC RESOURCE_EXHAUSTED). Permanent until the account deletes originals or gets a larger
    quota. ``details``: ``used_bytes``, ``limit_bytes``, ``used_objects``, ``limit_objects`` (the
    account's usage before this upload) and ``file_bytes`` (this upload's size); ADR 0029."""

    grpc_code = grpc.StatusCode.RESOURCE_EXHAUSTED
    http_status = 403
    default_code = "STORAGE_QUOTA_EXCEEDED"


class RateLimited(DomainError):
    """The account is over a job quota for now: its request rate (``RATE_LIMITED``) or its
    waiting jobs (``TOO_MANY_QUEUED_JOBS``); HTTP 429 with ``Retry-After``, gRPC
    RESOURCE_EXHAUSTED. ``details``: ``retry_after_seconds`` (an integer ≥ 1) and ``limit``
    (hypermedia/jobs/quotas.py, ADR 0055)."""

    grpc_code = grpc.StatusCode.RESOURCE_EXHAUSTED
    http_status = 429
    retryable = True
    default_code = "RATE_LIMITED"


class UnsupportedInput(DomainError):
    """The content is not something the operation can process (HTTP 415). Permanent."""

    grpc_code = grpc.StatusCode.INVALID_ARGUMENT
    http_status = 415
    default_code = "UNSUPPORTED_FORMAT"


class PermanentJobError(DomainError):
    """A job failed because of its input; retrying cannot help (e.g. ``CORRUPT_INPUT``)."""

    grpc_code = grpc.StatusCode.FAILED_PRECONDITION
    http_status = 422
    default_code = "PERMANENT_FAILURE"


class TransientError(DomainError):
    """Infrastructure hiccup (storage, network, lost worker, timeout): retry with backoff."""

    grpc_code = grpc.StatusCode.UNAVAILABLE
    http_status = 503
    retryable = True
    default_code = "TRANSIENT"


class CpuTimeExceeded(TransientError):
    """A process the job's engine started and waited for (a page's tesseract, PDFium's engine
    process) was stopped by the ``RLIMIT_CPU`` it inherits from the job, or by what was left of
    the job's CPU time: ``TIMEOUT``, and, as when the job's own process is stopped by it, the
    input's fault (the sandbox reports it with ``killed="cpu_time"``, which
    :func:`hypermedia.jobs.charges.input_fault` charges; ADR 0084)."""

    default_code = "TIMEOUT"

    def __init__(self) -> None:
        super().__init__("The job exceeded its CPU time limit.")


_BY_GRPC_CODE: dict[grpc.StatusCode, type[DomainError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.RESOURCE_EXHAUSTED: PayloadTooLarge,
    grpc.StatusCode.FAILED_PRECONDITION: Conflict,
    grpc.StatusCode.UNAVAILABLE: TransientError,
    grpc.StatusCode.DEADLINE_EXCEEDED: TransientError,
}

ERROR_CODE_METADATA_KEY = "hm-error-code"
ERROR_DETAILS_METADATA_KEY = "hm-error-details"
"""Trailer with a DomainError's ``details`` as ASCII JSON, when it has any."""
_BY_ERROR_CODE: dict[str, type[DomainError]] = {
    "INSUFFICIENT_CREDITS": InsufficientCredits,
    "CONFLICT": Conflict,
    "STORAGE_QUOTA_EXCEEDED": StorageQuotaExceeded,
    "RATE_LIMITED": RateLimited,
    "TOO_MANY_QUEUED_JOBS": RateLimited,
}


def from_rpc_error(err: grpc.aio.AioRpcError) -> DomainError:
    """Rebuild the DomainError a peer service raised from its status and its ``hm-error-code`` and
    ``hm-error-details`` trailers."""
    code = ""
    extra: dict[str, Any] = {}
    for key, value in err.trailing_metadata() or ():
        if key == ERROR_CODE_METADATA_KEY:
            code = str(value)
        elif key == ERROR_DETAILS_METADATA_KEY:
            try:
                parsed = json.loads(str(value))
            except ValueError:
                parsed = None
            extra = parsed if isinstance(parsed, dict) else {}
    message = err.details() or err.code().name
    cls = _BY_ERROR_CODE.get(code) or _BY_GRPC_CODE.get(err.code(), DomainError)
    return cls(message, code or None, extra)
