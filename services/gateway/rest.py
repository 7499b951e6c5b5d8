"""The public REST API (JSON; OpenAPI at ``/openapi.json``). Errors are ``application/problem+json``
(RFC 9457) with a stable ``error_code``; causes are logged, never sent."""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime
from http import HTTPStatus
from typing import Annotated, Any, Literal
from urllib.parse import quote

from fastapi import APIRouter, Depends, FastAPI, File, Header, Query, Request, Response, UploadFile
from fastapi.dependencies.models import Dependant
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from fastapi.routing import APIRoute
from fastapi_offline import FastAPIOffline
from opentelemetry import trace
from opentelemetry.trace import SpanKind
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictFloat, StrictInt, model_validator
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from hypermedia.core import metrics, pgtext, telemetry
from hypermedia.core.errors import DomainError, InvalidArgument, PayloadTooLarge, Unauthenticated
from hypermedia.infra import db
from hypermedia.jobs.accounts import Caller, check_write
from hypermedia.jobs.pricing import as_credits
from services.gateway import backfills_api, openapi, operators_api, presets_api, schedules_api
from services.gateway.catalogue import PRICE_FORMULA, OperationInfo
from services.gateway.process_request import parse_operations
from services.gateway.resolved import OutputResolver
from services.gateway.results import (
    Attempt,
    Balance,
    Job,
    LedgerPage,
    ObjectInfo,
    ObjectPage,
    Output,
    ProcessResult,
)
from services.gateway.status import MAX_PAGE_SIZE, JobFilter, JobPage
from services.gateway.usecases import UseCases

READ_METHODS = frozenset({"GET", "HEAD"})
READ_POSTS = frozenset({"/v1/hypermedia/estimate"})
"""POSTs that change nothing, which a read-only key may make."""

log = logging.getLogger(__name__)
_tracer = trace.get_tracer(__name__)

PROBLEM = "application/problem+json"
MAX_JSON_BYTES = 64 * 1024
"""Largest JSON request body (bytes); uploads have their own limit."""


def _event_id(header: str | None) -> int:
    """A ``Last-Event-ID`` as an event id; anything but a plain ASCII number that fits a bigint
    counts as "from the start" (0), like a missing header."""
    if not header or not header.isascii() or not header.isdigit() or len(header) > 19:
        return 0
    value = int(header)
    return value if value < 2**63 else 0


def problem(status: int, title: str, detail: str, error_code: str, **extra: Any) -> JSONResponse:
    body = {
        "type": "about:blank",
        "title": title,
        "status": status,
        "detail": detail,
        "error_code": error_code,
    }
    body.update(extra)
    metrics.API_ERRORS.labels(error_code).inc()
    return JSONResponse(body, status_code=status, media_type=PROBLEM)


def domain_problem(exc: DomainError) -> JSONResponse:
    """The problem response of a domain error: its status, public message, ``error_code`` and
    :attr:`~hypermedia.core.errors.DomainError.details`; a 401 also names the scheme in
    ``WWW-Authenticate``, and an error with ``retry_after_seconds`` (a 429 of the job quota) says
    it in ``Retry-After``."""
    response = problem(
        exc.http_status, HTTPStatus(exc.http_status).phrase, exc.public_message, exc.error_code, **exc.details
    )
    if exc.http_status == 401:
        response.headers["WWW-Authenticate"] = 'Bearer realm="hypermedia"'
    if isinstance(retry_after := exc.details.get("retry_after_seconds"), int):
        response.headers["Retry-After"] = str(retry_after)
    return response


def _not_json(request: Request, exc: RequestValidationError) -> bool:
    """Whether a JSON body was refused only because it came with another Content-Type or none
    (``curl -d`` sends ``application/x-www-form-urlencoded``): FastAPI parses only
    ``application/json`` and ``*+json`` as JSON (``strict_content_type``) and hands anything else
    to the model as raw bytes, which fails as a whole (``loc == ["body"]``). A multipart upload's
    missing part is ``["body", "file"]``."""
    media_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media_type == "application/json" or media_type.endswith("+json"):
        return False
    return any(tuple(error.get("loc", ())) == ("body",) for error in exc.errors())


class Operation(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="Operation name: thumbnail, resize, compress, convert")
    params: dict[str, Any] = Field(default_factory=dict)


class PresetOperation(BaseModel):
    model_config = ConfigDict(extra="forbid")

    preset: str = Field(description="Name of one of the caller's presets (PUT /v1/presets/{name})")


class _StorableText(BaseModel):
    """A JSON body whose strings are checked before its fields (:meth:`_storable_text`)."""

    @model_validator(mode="before")
    @classmethod
    def _storable_text(cls, data: Any) -> Any:
        """Every string and key of the body under :mod:`hypermedia.core.pgtext`'s rule, before any
        field is validated: JSON's ``\\ud800`` escapes decode to lone surrogates, which no UTF-8
        encoder (Postgres, httpx, the JSON of pydantic's own error answer) accepts, and ``\\u0000``
        to NUL, which Postgres refuses. Raises InvalidText, a DomainError pydantic lets through:
        the answer is 422 ``INVALID_REQUEST`` with the field's path in ``field``."""
        pgtext.check_json(data)
        return data


class ProcessBody(_StorableText):
    model_config = ConfigDict(extra="forbid")

    object_id: str
    operations: list[str | Operation | PresetOperation] = Field(
        description='Names, {name, params} or {preset}: "thumbnail", {"name": "resize", "params": {"width": 800}}, {"preset": "avatar"}',
        json_schema_extra={"minItems": 1},
    )
    priority: StrictInt | None = Field(
        None,
        description="1 (highest) to 10; default 5 (bulk: 7-10, default 8)",
        json_schema_extra={"minimum": 1, "maximum": 10},
    )
    webhook_url: str | None = None
    queue: str | None = Field(
        None,
        description='"bulk": the jobs go to the bulk queue (regeneration, backfill; run by bulk units '
        "only, priority 7-10); left out, each operation goes to its own queue",
    )
    not_before: str | None = Field(
        None,
        description="Delay the jobs until this RFC 3339 time with an offset (2026-12-24T18:00:00Z): "
        "they are `scheduled`, credits held, until then; a past time runs now; at most 30 days ahead "
        "(422 INVALID_SCHEDULE). At most one of not_before and delay_seconds",
    )
    delay_seconds: StrictInt | StrictFloat | None = Field(
        None, description="Delay the jobs by this many seconds (0 to 2,592,000)"
    )


class EstimateBody(_StorableText):
    model_config = ConfigDict(extra="forbid")

    object_id: str
    operations: list[str | Operation | PresetOperation] = Field(
        description="As in POST /v1/hypermedia/process", json_schema_extra={"minItems": 1}
    )
    priority: StrictInt | None = Field(
        None, description="As in POST /v1/hypermedia/process", json_schema_extra={"minimum": 1, "maximum": 10}
    )


class HistoryOut(BaseModel):
    samples: int = Field(description="Completed attempts of the operation the prediction is made from")
    basis: Literal["pixels", "pages", "media_seconds", "size", "median", "none"] = Field(
        description="A line on that measure of the input (pixels, pages or media seconds once a job"
        " read the object; else its size in bytes), median (no measure explained the runs), or none"
        " (too few samples)"
    )


class OperationEstimateOut(BaseModel):
    operation: str
    credits: float = Field(description="Its price on this input")
    allowance_credits: float = Field(description="Held beside it for an ocr job's escalation; 0 otherwise")
    predicted_seconds: float | None = Field(description="Its run, predicted; null without enough history")
    history: HistoryOut


class EstimateOut(BaseModel):
    estimated_credits: float = Field(
        description="The operations' prices: what a process request answers as its estimated_credits"
    )
    held_credits: float = Field(
        description="What a process request would hold: the prices and the allowances"
    )
    operations: list[OperationEstimateOut]


class ObjectOut(BaseModel):
    object_id: str
    pool_id: str
    size_bytes: int
    mime_type: str = Field(description="The type decided from the content (magic bytes); always wins")
    sha256: str
    filename: str = Field(description="The file name as a sanitised display name; metadata only")
    claimed_mime_type: str | None = Field(description="The part's Content-Type, normalised; null if none")
    name_mime_type: str | None = Field(description="The type the file name's extension implies")
    type_mismatch: bool = Field(description="A claimed type differs from mime_type")


class StorageUsageOut(BaseModel):
    used_bytes: int = Field(description="Bytes of the account's originals, pending uploads included")
    limit_bytes: int
    used_objects: int = Field(description="Originals stored, pending uploads included")
    limit_objects: int


class ProcessOut(BaseModel):
    job_ids: list[str]
    estimated_credits: float
    not_before: str | None = Field(None, description="When the delayed jobs become due; null: queued at once")


class AccountOut(BaseModel):
    account_id: str
    pool_id: str
    webhook_secret: str | None = Field(description="null for a read-only key")


class BalanceOut(BaseModel):
    balance: float
    held: float
    available: float


# -- rendering of results: the JSON the API has always answered ------------------------------


credits_number = as_credits
"""Millicredits as the API's credits: :func:`hypermedia.jobs.pricing.as_credits`."""


def _iso(value: datetime | None) -> str | None:
    """ISO 8601 (``datetime.isoformat``: ``2026-01-02T03:04:05.123456+00:00`` for the aware
    times Postgres gives; a naive time is written without an offset); None stays None."""
    return None if value is None else value.isoformat()


def _not_a_number(value: Any) -> Any:
    """Refuses a number where a time is expected: pydantic's ``datetime`` takes ``"0.5"`` or
    ``"1700000000"`` as Unix seconds, so ``created_before=0.5`` listed the jobs of 1970
    (found by schemathesis). Raises ValueError (422 ``INVALID_REQUEST``)."""
    if isinstance(value, str):
        try:
            float(value)
        except ValueError:
            return value
        raise ValueError("must be an ISO 8601 time such as 2026-12-01T00:00:00Z, not a number")
    return value


QueryTime = Annotated[datetime, BeforeValidator(_not_a_number)]
"""A query parameter's time: ISO 8601, with or without an offset (then UTC), never a number."""


def _query_names(route: APIRoute) -> frozenset[str]:
    """The query parameters ``route`` takes, its dependencies' included; kept on the route
    (routes are not hashable, so no cache can key on them)."""

    def names(dependant: Dependant) -> set[str]:
        own = {p.alias for p in dependant.query_params}
        return own.union(*(names(d) for d in dependant.dependencies))

    found: frozenset[str] | None = getattr(route, "hm_query_names", None)
    if found is None:
        found = frozenset(names(route.dependant))
        route.hm_query_names = found  # type: ignore[attr-defined]
    return found


def check_query(request: Request) -> None:
    """Refuses a query parameter the request's route does not take, as Stripe's API does: a typo
    (``?statuss=failed``) would otherwise list every job as if no filter had been asked for.
    Raises InvalidArgument (422 ``UNKNOWN_PARAMETER``, naming it and the ones the path takes)."""
    route = request.scope.get("route")
    if not isinstance(route, APIRoute):
        return
    known = _query_names(route)
    unknown = sorted(set(request.query_params) - known)
    if unknown:
        takes = ", ".join(sorted(known)) or "none"
        raise InvalidArgument(
            f"unknown query parameter {unknown[0][:100]!r}; this path takes: {takes}", "UNKNOWN_PARAMETER"
        )


def attempt_json(attempt: Attempt) -> dict[str, Any]:
    """An attempt as ``GET /v1/jobs/{id}`` lists it."""
    return {
        "attempt_number": attempt.attempt_number,
        "worker_id": attempt.worker_id,
        "status": attempt.status,
        "error_code": attempt.error_code,
        "error_message": attempt.error_message,
        "started_at": _iso(attempt.started_at),
        "finished_at": _iso(attempt.finished_at),
        "duration_ms": attempt.duration_ms,
        "peak_memory_mb": attempt.peak_memory_mb,
    }


def output_json(output: Output) -> dict[str, Any]:
    """An output as ``GET /v1/jobs/{id}`` lists it (its fields, by their names)."""
    return dataclasses.asdict(output)


def job_json(job: Job) -> dict[str, Any]:
    """A job as ``GET /v1/jobs/{id}`` and ``POST /v1/jobs/{id}:cancel`` answer it: credits as
    numbers (:func:`credits_number`), times as ISO 8601 strings (:func:`_iso`)."""
    return {
        "job_id": job.job_id,
        "object_id": job.object_id,
        "operation": job.operation,
        "profile_version": job.profile_version,
        "queue": job.queue,
        "params": job.params,
        "preset": {"name": job.preset[0], "version": job.preset[1]} if job.preset else None,
        "status": job.status,
        "priority": job.priority,
        "attempt_count": job.attempt_count,
        "max_attempts": job.max_attempts,
        "lost_attempts": job.lost_attempts,
        "error_code": job.error_code,
        "error_message": job.error_message,
        "estimated_credits": credits_number(job.estimated_millicredits),
        "actual_credits": credits_number(job.actual_millicredits),
        "charge_lines": {name: credits_number(amount) for name, amount in job.charge_lines.items()},
        "created_at": _iso(job.created_at),
        "queued_at": _iso(job.queued_at),
        "started_at": _iso(job.started_at),
        "completed_at": _iso(job.completed_at),
        "next_attempt_at": _iso(job.next_attempt_at),
        "not_before": _iso(job.not_before),
        "attempts": [attempt_json(a) for a in job.attempts],
        "outputs": [
            output_json(o) | {"link": f"/v1/jobs/{job.job_id}/outputs/{quote(o.output_type, safe='')}"}
            for o in job.outputs
        ],
    }


def operation_json(op: OperationInfo) -> dict[str, Any]:
    """An operation as ``GET /v1/operations`` lists it: prices in credits, limits together."""
    return {
        "name": op.name,
        "queue": op.queue,
        "profile_version": op.profile_version,
        "input_kinds": list(op.input_kinds),
        "params_schema": op.params_schema,
        "price": {
            "base_credits": credits_number(op.base_millicredits),
            "per_mb_credits": credits_number(op.per_mb_millicredits),
            "escalation_per_page_credits": credits_number(op.escalation_per_page_millicredits),
            "work_unit": op.work_unit,
            "per_unit_credits": credits_number(op.per_unit_millicredits),
        },
        "limits": {
            "timeout_seconds": op.timeout_seconds,
            "max_attempts": op.max_attempts,
            "max_input_bytes": op.max_input_bytes,
            "max_pixels": op.max_pixels,
            "memory_limit_mb": op.memory_limit_mb,
            "max_duration_seconds": op.max_duration_seconds,
        },
    }


def object_json(obj: ObjectInfo) -> dict[str, Any]:
    """The answer of ``GET /v1/objects/{id}``: times as ISO 8601 strings."""
    return {
        **dataclasses.asdict(obj),
        "created_at": _iso(obj.created_at),
        "url_expires_at": _iso(obj.url_expires_at),
    }


def object_page_json(page: ObjectPage) -> dict[str, Any]:
    """The answer of ``GET /v1/objects``: each object's fields, times as ISO 8601 strings."""
    return {
        "objects": [{**dataclasses.asdict(o), "created_at": _iso(o.created_at)} for o in page.objects],
        "next_cursor": page.next_cursor,
    }


def job_page_json(page: JobPage) -> dict[str, Any]:
    """The answer of ``GET /v1/jobs``: each job as :func:`job_json` without ``attempts`` and
    ``outputs`` (``GET /v1/jobs/{id}`` has them), and ``next_cursor``."""
    return {
        "jobs": [
            {k: v for k, v in job_json(job).items() if k not in ("attempts", "outputs")} for job in page.jobs
        ],
        "next_cursor": page.next_cursor,
    }


def process_json(result: ProcessResult) -> dict[str, Any]:
    """The answer of ``POST /v1/hypermedia/process`` (:class:`ProcessOut`)."""
    return {
        "job_ids": list(result.job_ids),
        "estimated_credits": credits_number(result.estimated_millicredits),
        "not_before": _iso(result.not_before),
    }


def ledger_json(page: LedgerPage) -> dict[str, Any]:
    """The answer of ``GET /v1/account/ledger`` (:class:`openapi.LedgerOut`): credits signed."""
    return {
        "entries": [
            {
                "entry_id": e.entry_id,
                "at": e.created_at.isoformat(),
                "kind": e.kind,
                "line": e.line,
                "credits": credits_number(e.millicredits),
                "job_id": e.job_id,
                "operation": e.operation,
                "job_status": e.job_status,
                "error_code": e.error_code,
            }
            for e in page.entries
        ],
        "next_cursor": page.next_cursor,
    }


def balance_json(balance: Balance) -> dict[str, Any]:
    """The answer of ``GET /v1/credits`` (:class:`BalanceOut`)."""
    return {
        "balance": credits_number(balance.balance_millicredits),
        "held": credits_number(balance.held_millicredits),
        "available": credits_number(balance.available_millicredits),
    }


Readiness = Callable[[], Awaitable[dict[str, bool]]]

_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
UPLOAD_RETRY_AFTER_SECONDS = 1
"""``Retry-After`` of a ``429 TOO_MANY_UPLOADS``."""
HEALTH_PATHS = frozenset({"/healthz", "/readyz"})
"""Paths the HTTP server answers over its connection cap (``HttpServer(reserve_paths=…)``)."""


class _BodyGuard:
    """ASGI middleware in front of the API: any request whose Content-Length is above
    ``limit_for(path)`` bytes gets a 413 at once, before authentication; a request with a body to
    ``/v1/…`` is authenticated before any of its body is read, and every body is cut off at
    ``limit_for(path)`` bytes by counting what arrives — a chunked body has no Content-Length to
    check up front. Without it an anonymous client could make the multipart parser spool gigabytes
    to the temp directory, or keep up to a thousand 1 MiB parts in memory, before the 401 (found by
    a hostile test).

    One account may have at most ``max_per_account`` such requests in progress at once (0: no
    cap); one more gets ``429 TOO_MANY_UPLOADS`` with ``Retry-After`` before its body is read, so
    one key cannot hold every connection of the server with slow uploads (issue 14, F3). A slot
    is held until the request's response ends (or its connection is lost).

    The authenticated caller is left in ``request.state.caller`` for the route's dependency.
    """

    def __init__(
        self,
        app: Any,
        limit_for: Callable[[str], int],
        authenticate: Callable[[str | None], Awaitable[Caller]],
        max_per_account: int = 0,
    ) -> None:
        self.app = app
        self.limit_for = limit_for
        self.authenticate = authenticate
        self.max_per_account = max_per_account
        self.in_progress: Counter[str] = Counter()
        """Requests with a body in progress, by account id."""

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        limit = self.limit_for(scope["path"])
        length = headers.get("content-length")
        if length and length.isdigit() and int(length) > limit:
            what = "files" if limit > MAX_JSON_BYTES else "request bodies"
            too_large = PayloadTooLarge(f"{what} are limited to {limit} bytes", "INPUT_TOO_LARGE")
            await domain_problem(too_large)(scope, receive, send)
            return
        if scope["method"] not in _BODY_METHODS:
            await self.app(scope, receive, send)
            return
        if scope["path"].startswith("/v1/"):
            try:
                caller = await self.authenticate(headers.get("authorization"))
                if scope["path"] not in READ_POSTS:
                    check_write(caller)  # a read-only key's upload is refused before its body is read
            except DomainError as exc:
                await domain_problem(exc)(scope, receive, send)
                return
            scope.setdefault("state", {})["caller"] = caller
            account = caller.account_id
            if self.max_per_account and self.in_progress[account] >= self.max_per_account:
                busy = problem(
                    429,
                    "Too Many Requests",
                    f"an account may send at most {self.max_per_account} request bodies at once",
                    "TOO_MANY_UPLOADS",
                )
                busy.headers["Retry-After"] = str(UPLOAD_RETRY_AFTER_SECONDS)
                await busy(scope, receive, send)
                return
            self.in_progress[account] += 1
            try:
                await self._counted(scope, receive, send, limit)
            finally:
                self.in_progress[account] -= 1
                if not self.in_progress[account]:
                    del self.in_progress[account]
            return
        await self._counted(scope, receive, send, limit)

    async def _counted(self, scope: dict[str, Any], receive: Any, send: Any, limit: int) -> None:
        """Run the app with a ``receive`` that cuts the body off past ``limit`` bytes (413)."""
        received = 0

        async def counted() -> dict[str, Any]:
            nonlocal received
            message: dict[str, Any] = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise StarletteHTTPException(413, f"request bodies here are limited to {limit} bytes")
            return message

        await self.app(scope, counted, send)


class TraceRequests:
    """ASGI middleware: one SERVER span per HTTP request (``"{method} {path}"``), continuing a
    caller's ``traceparent`` when it sends one, with the response's ``http.status_code``, and the
    request counted and timed in :data:`~hypermedia.core.metrics.HTTP_REQUESTS` and
    :data:`~hypermedia.core.metrics.HTTP_SECONDS` under its route template (``unmatched`` when no
    route took it: a 404, or an answer of the body guard before routing). Pure ASGI, not
    starlette's ``BaseHTTPMiddleware``, which costs a task, a stream and a second request object
    per request (issue 17: the gateway's middlewares cost as much as the endpoint); an exception
    of the app ends the span with it (recorded, status ERROR) and goes on up to starlette's error
    middleware, as before (counted there as a 500)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500
        try:
            with _tracer.start_as_current_span(
                f"{scope['method']} {scope['path']}",
                context=telemetry.extract(Headers(scope=scope)),
                kind=SpanKind.SERVER,
            ) as span:

                async def traced_send(message: dict[str, Any]) -> None:
                    nonlocal status
                    if message["type"] == "http.response.start":
                        status = message["status"]
                        span.set_attribute("http.status_code", status)
                    await send(message)

                await self.app(scope, receive, traced_send)
        finally:
            route = getattr(scope.get("route"), "path", "unmatched")
            method = metrics.method_label(scope["method"])
            metrics.HTTP_SECONDS.labels(method, route).observe(time.perf_counter() - started)
            metrics.HTTP_REQUESTS.labels(method, route, str(status)).inc()


def build_app(
    api: UseCases,
    authenticate: Callable[[str | None], Awaitable[Caller]],
    readiness: Readiness,
    resolver: OutputResolver,
    max_bodies_per_account: int = 0,
    pages: APIRouter | None = None,
) -> FastAPI:
    """The FastAPI application over the use cases ``api``, their results rendered by the
    functions above; ``authenticate`` maps an Authorization header to a
    caller; ``readiness`` reports each dependency for ``/readyz``; ``resolver`` serves resolved
    playlists and WebVTT outputs; ``max_bodies_per_account`` caps one account's requests with a
    body in progress (``HM_MAX_CONCURRENT_UPLOADS_PER_ACCOUNT``; 0: no cap); ``pages``, the web
    dashboard's routes (:mod:`services.gateway.dashboard`), when given."""
    # The docs pages with their assets bundled (fastapi-offline), not from a CDN: /docs, /redoc.
    app = FastAPIOffline(
        redoc_url=None,  # ReDoc's page loads its logo from cdn.redoc.ly: only Swagger UI, bundled
        title="hypermedia",
        version="1.0",
        description="Queued, sandboxed, billed file processing. Errors are application/problem+json "
        "with a stable error_code; authenticate with an API key: Authorization: Bearer hm_….",
    )

    def body_limit(path: str) -> int:
        # Uploads may be large (plus room for the multipart framing); every other body is a small
        # JSON document.
        return api.uploads.max_upload_bytes + 1024 * 1024 if path == "/v1/objects" else MAX_JSON_BYTES

    # Added first, so it is the innermost middleware: an error raised from its receive() reaches
    # the route directly (BaseHTTPMiddleware would wrap it in an exception group). It also refuses
    # an oversized Content-Length, so no request pays for a second middleware doing only that.
    app.add_middleware(
        _BodyGuard, limit_for=body_limit, authenticate=authenticate, max_per_account=max_bodies_per_account
    )

    @app.exception_handler(DomainError)
    async def _domain(_request: Request, exc: DomainError) -> JSONResponse:
        if exc.http_status >= 500:
            log.error("request failed: %s (%s)", exc.error_code, exc.public_message)
        return domain_problem(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        if _not_json(request, exc):
            return problem(
                415,
                "Unsupported Media Type",
                "the request body must be JSON sent with Content-Type: application/json",
                "UNSUPPORTED_MEDIA_TYPE",
            )
        errors = [{"loc": list(e.get("loc", ())), "msg": e.get("msg", "")} for e in exc.errors()]
        return problem(
            422,
            "Invalid request",
            "the request body or parameters are invalid",
            "INVALID_REQUEST",
            errors=errors,
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400 and isinstance(exc.__cause__, RecursionError):
            # FastAPI's answer when json.loads gave up on a body nested ~1,000 levels deep.
            return domain_problem(pgtext.InvalidText("the body", pgtext.DEPTH_PROBLEM))
        code = {404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED", 413: "INPUT_TOO_LARGE"}.get(
            exc.status_code, "HTTP_ERROR"
        )
        answer = problem(exc.status_code, "HTTP error", str(exc.detail), code)
        answer.headers.update(exc.headers or {})
        if exc.status_code == 405:
            # RFC 9110 section 15.5.6: every method the path takes. Starlette names only those
            # of the first route that matched the path; FastAPI makes a route per method. No id
            # or name holds a ':', so /v1/jobs/{id}:cancel is not also /v1/jobs/{job_id} with
            # the id "{id}:cancel" (schemathesis: the Allow of :cancel named GET).
            methods = {
                m
                for r in request.app.routes
                for match, child in [r.matches(request.scope)]
                if match != Match.NONE
                and not any(":" in str(v) for v in child.get("path_params", {}).values())
                for m in getattr(r, "methods", ())
            }
            answer.headers["Allow"] = ", ".join(sorted(methods))
        return answer

    @app.exception_handler(Exception)
    async def _unexpected(_request: Request, exc: Exception) -> JSONResponse:
        if db.is_transient(exc):
            log.warning("database unavailable: %s", type(exc).__name__)
            response = problem(
                503, "Service Unavailable", "database temporarily unavailable", "DATABASE_UNAVAILABLE"
            )
            response.headers["Retry-After"] = "1"
            return response
        log.exception("unhandled error")
        if db.pooler_mismatch(exc):
            log.error("%s", db.POOLER_HINT)
        return problem(500, "Internal error", "internal error", "INTERNAL")

    # Added after _BodyGuard, so it wraps it: its span covers the guard's answers too.
    app.add_middleware(TraceRequests)

    async def caller(request: Request, authorization: str | None = Header(None)) -> Caller:
        """The request's caller; a read-only key may only read (403 ``READ_ONLY_KEY`` for any
        other method but ``POST /v1/hypermedia/estimate``, which creates nothing)."""
        known = getattr(request.state, "caller", None)  # authenticated by _BodyGuard already
        found = known if isinstance(known, Caller) else await authenticate(authorization)
        check_query(request)
        if request.method not in READ_METHODS and request.url.path not in READ_POSTS:
            check_write(found)
        return found

    app.include_router(operators_api.router(api.operators, caller))
    app.include_router(presets_api.router(api.presets, caller))
    app.include_router(backfills_api.router(api.backfills, caller))
    app.include_router(schedules_api.router(api.schedules, caller))
    if pages is not None:
        app.include_router(pages)

    @app.post("/v1/objects", status_code=201, response_model=ObjectOut)
    async def upload(
        request: Request, file: UploadFile = File(...), who: Caller = Depends(caller)
    ) -> dict[str, Any]:
        """Upload an original (multipart field ``file``). The type is decided from the content; the
        part's Content-Type and the file name's extension are recorded as claims. Another field
        is 422 ``UNKNOWN_PARAMETER``, as a query parameter the path does not take."""
        fields = set((await request.form()).keys())  # parsed already, for ``file``
        if fields != {"file"}:
            raise InvalidArgument(
                f"unknown form field {sorted(fields - {'file'})[0][:100]!r}; an upload takes: file",
                "UNKNOWN_PARAMETER",
            )
        content = await file.read(api.uploads.max_upload_bytes + 1)
        stored = await api.uploads.upload_object(who, content, file.filename or "", file.content_type)
        return dataclasses.asdict(stored)

    @app.get("/v1/objects", responses={200: {"model": openapi.ObjectPageOut}})
    async def list_objects(
        who: Caller = Depends(caller),
        kind: str = Query(
            "",
            max_length=32,
            description='"original", "output" (of your jobs), or both',
            json_schema_extra={"enum": ["", "original", "output"]},
        ),
        limit: int = Query(50, ge=1, le=MAX_PAGE_SIZE, description="objects a page"),
        cursor: str | None = Query(
            None, description="next_cursor of the previous page; empty: the first page"
        ),
    ) -> dict[str, Any]:
        """The caller's objects, newest first, a page at a time: ``{"objects": [...],
        "next_cursor"}`` (null on the last page), without download URLs (``GET
        /v1/objects/{id}`` gives one). 422 ``INVALID_KIND``, ``INVALID_CURSOR``."""
        return object_page_json(await api.uploads.list_objects(who, kind, limit, cursor))

    @app.get("/v1/objects/{object_id}", responses={200: {"model": openapi.ObjectInfoOut}})
    async def get_object(object_id: str, who: Caller = Depends(caller)) -> dict[str, Any]:
        """An object of the caller (an original, or an output of its jobs) with a presigned
        ``url`` to download it until ``url_expires_at``; 404 ``NOT_FOUND`` for others' objects."""
        return object_json(await api.uploads.get_object(who, object_id))

    @app.delete("/v1/objects/{object_id}", response_model=StorageUsageOut)
    async def delete_object(object_id: str, who: Caller = Depends(caller)) -> dict[str, int]:
        """Delete an original: its bytes go and its size goes back to the storage quota (ADR 0029);
        the outputs derived from it go too (its jobs keep their history, without outputs). 409
        OBJECT_IN_USE while a job on it runs."""
        return dataclasses.asdict(await api.uploads.delete_object(who, object_id))

    @app.post("/v1/hypermedia/process", status_code=202, response_model=ProcessOut)
    async def process(
        body: ProcessBody,
        who: Caller = Depends(caller),
        idempotency_key: str | None = Header(None),  # its bound: JobCreation.process (pgtext)
    ) -> dict[str, Any]:
        """Create one job per operation; 402 when credits are short (nothing is queued then)."""
        ops = parse_operations([o if isinstance(o, str) else o.model_dump() for o in body.operations])
        result = await api.creation.process(
            who,
            body.object_id,
            ops,
            body.priority,
            body.webhook_url,
            idempotency_key,
            body.queue,
            not_before=body.not_before,
            delay_seconds=body.delay_seconds,
        )
        return process_json(result)

    @app.post("/v1/hypermedia/estimate", response_model=EstimateOut)
    async def estimate(body: EstimateBody, who: Caller = Depends(caller)) -> dict[str, Any]:
        """What ``POST /v1/hypermedia/process`` with these operations would hold, and how long each
        job would run, predicted from the operation's history; nothing is held or created. The
        same checks and errors as a process request before its hold (404, 415, 413, 422)."""
        ops = parse_operations([o if isinstance(o, str) else o.model_dump() for o in body.operations])
        result = await api.creation.estimate(who, body.object_id, ops, body.priority)
        return {
            "estimated_credits": credits_number(sum(e.millicredits for e in result.operations)),
            "held_credits": credits_number(result.total_millicredits),
            "operations": [
                {
                    "operation": e.operation,
                    "credits": credits_number(e.millicredits),
                    "allowance_credits": credits_number(e.allowance_millicredits),
                    "predicted_seconds": e.predicted_seconds,
                    "history": {"samples": e.samples, "basis": e.basis},
                }
                for e in result.operations
            ],
        }

    @app.get("/v1/jobs", responses={200: {"model": openapi.JobPageOut}})
    async def list_jobs(
        who: Caller = Depends(caller),
        status: list[str] = Query([], description="any of these statuses (repeat the parameter)"),
        operation: str | None = Query(None, description="jobs of this operation"),
        object_id: str | None = Query(None, description="jobs on this object"),
        created_after: QueryTime | None = Query(
            None, description="created at or after (ISO 8601; UTC if no offset)"
        ),
        created_before: QueryTime | None = Query(
            None, description="created before (ISO 8601; UTC if no offset)"
        ),
        limit: int = Query(50, ge=1, le=MAX_PAGE_SIZE, description="jobs a page"),
        cursor: str | None = Query(
            None, description="next_cursor of the previous page; empty: the first page"
        ),
    ) -> dict[str, Any]:
        """The caller's jobs, newest first, a page at a time: ``{"jobs": [...], "next_cursor"}``
        (null on the last page). 422 ``INVALID_STATUS``, ``UNKNOWN_OPERATION`` (both list the
        valid values), ``INVALID_ID``, ``INVALID_RANGE``, ``INVALID_CURSOR``."""
        filters = JobFilter(tuple(status), operation, object_id, created_after, created_before)
        return job_page_json(await api.status.list_jobs(who, filters, limit, cursor))

    @app.get("/v1/jobs/{job_id}", responses={200: {"model": openapi.JobOut}})
    async def get_job(job_id: str, who: Caller = Depends(caller)) -> dict[str, Any]:
        """A job: status, attempts, errors, credits, timestamps, outputs with presigned URLs."""
        return job_json(await api.status.get_job(who, job_id))

    link_responses: dict[int | str, dict[str, Any]] = {
        307: {"description": "Location: a fresh presigned URL of the output"},
        200: {"description": "with redirect=false: the URL as JSON", "model": openapi.OutputLinkOut},
    }

    @app.head(
        "/v1/jobs/{job_id}/outputs/{output_type}",
        response_model=None,
        responses=link_responses,
        operation_id="head_output_link",
    )
    @app.get(
        "/v1/jobs/{job_id}/outputs/{output_type}",
        response_model=None,
        responses=link_responses,
        operation_id="output_link",
    )
    async def output_link(
        job_id: str,
        output_type: str,
        who: Caller = Depends(caller),
        redirect: bool = Query(True, description="false: answer the URL as JSON instead"),
    ) -> Response:
        """A stable link to an output: ``307`` to a presigned URL made for this request (15
        minutes), so a link kept for days keeps working as long as the API key does. With
        ``redirect=false``, ``200`` with ``{"url", "url_expires_at", "mime_type", ...}``.
        404 ``NOT_FOUND``, ``OUTPUT_NOT_FOUND`` (lists the job's outputs), ``OUTPUT_DELETED``;
        409 ``JOB_NOT_COMPLETED``."""
        link = await api.status.output_link(who, job_id, output_type)
        if not redirect:
            return JSONResponse(
                {**dataclasses.asdict(link), "url_expires_at": _iso(link.url_expires_at)},
                headers={"Cache-Control": "private, no-store"},  # it holds a presigned URL
            )
        return Response(status_code=307, headers={"Location": link.url, "Cache-Control": "private, no-store"})

    @app.get(
        "/v1/jobs/{job_id}/outputs/{output_type}/resolved",
        name="resolved_output",
        response_class=Response,
        responses={
            200: {
                "content": {
                    "application/vnd.apple.mpegurl": {"schema": {"type": "string"}},
                    "text/vtt": {"schema": {"type": "string"}},
                }
            }
        },
    )
    async def resolved_output(
        request: Request,
        job_id: str,
        output_type: str,
        authorization: str | None = Header(None),
        expires: str | None = Query(None, description="Unix seconds; with sig, instead of an API key"),
        sig: str | None = Query(None, description="The URL's signature; with expires"),
    ) -> Response:
        """An HLS playlist or WebVTT output with its references to sibling outputs of the job
        replaced by URLs: presigned storage URLs for media and images, signed URLs of this endpoint
        for playlists (usable without an API key). Authenticated by the API key, or, without an
        Authorization header, by ``expires`` and ``sig`` (403 when they do not match or expired).
        A query parameter it does not take is 422 ``UNKNOWN_PARAMETER``, as on every ``/v1`` path."""
        check_query(request)
        signed = authorization is None and (expires is not None or sig is not None)
        account_id = None
        if signed:
            resolver.check_signature(job_id, output_type, expires or "", sig or "")
        else:
            account_id = (await authenticate(authorization)).account_id

        def endpoint_url(job: str, output: str, until: int, signature: str) -> str:
            url = request.url_for("resolved_output", job_id=job, output_type=output)
            return str(url.include_query_params(expires=until, sig=signature))

        resolved = await resolver.resolve(job_id, output_type, endpoint_url, account_id=account_id)
        headers = {"Cache-Control": f"private, max-age={resolved.max_age_seconds}"}
        if signed:
            # The URL is the credential and no cookie is involved: any page may play it.
            headers["Access-Control-Allow-Origin"] = "*"
        return Response(resolved.content, media_type=resolved.mime_type, headers=headers)

    @app.get(
        "/v1/jobs/{job_id}/events",
        response_class=StreamingResponse,
        responses={200: {"content": {"text/event-stream": {"schema": {"type": "string"}}}}},
    )
    async def job_events(
        job_id: str,
        who: Caller = Depends(caller),
        last_event_id: str | None = Header(None),
        authorization: str | None = Header(None),
    ) -> StreamingResponse:
        """Server-Sent Events: every status change and progress update of the job, from the start
        (or after ``Last-Event-ID``), ending after its terminal status. Comment lines keep the
        connection alive every 15 s; at each the key is checked again, and the stream ends once
        it was revoked."""
        after = _event_id(last_event_id)
        events = await api.status.watch_job(who, job_id, after)

        async def stream() -> AsyncIterator[bytes]:
            async for event in events:
                if event is None:
                    try:
                        await authenticate(authorization)
                    except Unauthenticated:
                        return  # revoked: a client reconnecting gets its 401
                    yield b": keep-alive\n\n"
                    continue
                data = json.dumps(event.as_json(), separators=(",", ":"))
                yield f"id: {event.event_id}\nevent: {event.kind}\ndata: {data}\n\n".encode()

        return StreamingResponse(
            stream(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    @app.post("/v1/jobs/{job_id}:cancel", responses={200: {"model": openapi.JobOut}})
    async def cancel_job(job_id: str, who: Caller = Depends(caller)) -> dict[str, Any]:
        """Cancel a queued job at once, or ask a running one to stop."""
        return job_json(await api.cancellation.cancel_job(who, job_id))

    @app.get("/v1/account", response_model=AccountOut)
    async def account(who: Caller = Depends(caller)) -> dict[str, Any]:
        """The caller's account and pool, and the secret that signs its webhooks (Standard Webhooks)."""
        return dataclasses.asdict(await api.accounts.account(who))

    @app.get("/v1/account/ledger", responses={200: {"model": openapi.LedgerOut}})
    async def ledger(
        who: Caller = Depends(caller),
        limit: int = Query(50, ge=1, le=MAX_PAGE_SIZE, description="entries a page"),
        cursor: str | None = Query(
            None, description="next_cursor of the previous page; empty: the first page"
        ),
    ) -> dict[str, Any]:
        """The caller's ledger, newest first, a page at a time: ``{"entries": [...],
        "next_cursor"}``. Every grant, hold, release and commit, a commit one entry per charge
        line (``base``, ``pages``, ``media_seconds``, ``megapixels``, ``run_seconds``, ``ocr_escalation``), each with its job's
        operation, status and error code: what explains every charge. 422 ``INVALID_CURSOR``."""
        return ledger_json(await api.accounts.ledger(who, limit, cursor))

    @app.get("/v1/credits", response_model=BalanceOut)
    async def credits(who: Caller = Depends(caller)) -> dict[str, Any]:
        """The caller's balance and the credits held by unfinished jobs."""
        return balance_json(await api.accounts.balance(who))

    @app.get("/v1/operations", responses={200: {"model": openapi.OperationsOut}})
    async def operations(who: Caller = Depends(caller)) -> dict[str, Any]:
        """Every operation a request may name: ``{"operations": [...], "price_formula"}``, each
        with its queue, the kinds of original it takes, its params as a JSON Schema (draft
        2020-12), its price terms in credits and its limits."""
        return {
            "operations": [operation_json(o) for o in await api.catalogue.operations()],
            "price_formula": PRICE_FORMULA,
        }

    @app.get("/v1/ocr/languages", responses={200: {"model": openapi.LanguagesOut}})
    async def ocr_languages(who: Caller = Depends(caller)) -> dict[str, list[str]]:
        """The tesseract language codes an ``ocr`` job may ask for (``params.languages``), as
        the running ocrworkers reported them; empty before any has started."""
        return {"languages": await api.creation.ocr_languages()}

    @app.head("/healthz", operation_id="healthz_head")
    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        """Liveness: the process answers (GET or HEAD, the health paths' two methods)."""
        return {"status": "ok"}

    readiness_responses: dict[int | str, dict[str, Any]] = {
        200: {"model": openapi.ReadinessOut},
        503: {"model": openapi.ReadinessOut},
    }

    @app.head("/readyz", responses=readiness_responses, operation_id="readyz_head")
    @app.get("/readyz", responses=readiness_responses)
    async def readyz() -> JSONResponse:
        """Readiness: Postgres, NATS, credits and storage answer (GET or HEAD; HEAD's answer has
        the status and no body)."""
        checks = await readiness()
        ok = all(checks.values())
        return JSONResponse(
            {"status": "ok" if ok else "unavailable", "checks": checks}, status_code=200 if ok else 503
        )

    openapi.install(app)
    return app
