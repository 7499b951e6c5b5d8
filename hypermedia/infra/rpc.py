"""gRPC plumbing shared by every service: one server builder and one error interceptor.

Every server built here serves the standard health service (``grpc.health.v1``) and server
reflection, so ``grpcurl -plaintext HOST:PORT list`` and Kubernetes gRPC probes work against it.
Domain errors become a status with the public message and an ``hm-error-code`` trailer; anything
else becomes INTERNAL with a generic message while the cause is logged. Before a unary handler runs,
every string of its request is checked for NUL (:func:`hypermedia.core.pgtext.check_message`), which
Postgres text refuses: INVALID_ARGUMENT naming the field; a request that does not parse (a string
that is not UTF-8) is INVALID_ARGUMENT too, not grpc's UNKNOWN.
"""

from __future__ import annotations

import inspect
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import grpc
import httpx
from google.protobuf.message import DecodeError
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from opentelemetry import trace
from opentelemetry.trace import SpanKind
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from hypermedia.core import metrics, pgtext, telemetry
from hypermedia.core.errors import (
    ERROR_CODE_METADATA_KEY,
    ERROR_DETAILS_METADATA_KEY,
    DomainError,
    InvalidArgument,
    TransientError,
    from_rpc_error,
)
from hypermedia.infra import db
from hypermedia.infra.mtls import AuthInterceptor, Tls

log = logging.getLogger(__name__)
_tracer = trace.get_tracer(__name__)

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
"""Largest gRPC message accepted or sent (bytes); bounds UploadObject."""
SANITISED_STRING_FIELDS = frozenset({"hypermedia.jobs.v1.UploadObjectRequest.filename"})
"""Request strings a NUL may reach the handler in: the service cleans them rather than storing them
as sent (a file name becomes a display name without control characters, as over REST)."""


async def abort(context: grpc.aio.ServicerContext, exc: DomainError) -> None:
    """End the call with ``exc``'s status and public message, its ``error_code`` in the
    ``hm-error-code`` trailer and its ``details`` (if any) as JSON in ``hm-error-details``. Raises grpc's AbortError, as ``context.abort`` does. For handlers the
    interceptor does not wrap (streams)."""
    trailers = [(ERROR_CODE_METADATA_KEY, exc.error_code)]
    if exc.details:
        trailers.append((ERROR_DETAILS_METADATA_KEY, json.dumps(exc.details, separators=(",", ":"))))
    context.set_trailing_metadata(tuple(trailers))
    await context.abort(exc.grpc_code, exc.public_message)


@dataclass(frozen=True)
class _Unparsable:
    """What :class:`ErrorInterceptor` hands its handler for a request that does not parse, with
    the likely reason."""

    reason: str

    @classmethod
    def of(cls, exc: DecodeError) -> _Unparsable:
        """The reason of upb's ``DecodeError``: too deep (``upb_DecodeOptions_MaxDepth``, 100
        levels of messages: a ``Struct`` nested ~50 lists deep), else most likely a string that is
        not UTF-8 (upb says only "Error parsing message")."""
        if "MaxDepth" in str(exc):
            return cls("it nests messages deeper than protobuf's limit of 100 levels")
        return cls("a string field that is not UTF-8?")


def _check_request(request: Any) -> None:
    """Raises InvalidArgument (INVALID_REQUEST) for a request that did not parse, InvalidText for
    one with a NUL in a string: every string of every request, before any handler can store it
    (ADR 0030)."""
    if isinstance(request, _Unparsable):
        raise InvalidArgument(
            f"the request is not a valid message of this method ({request.reason})", "INVALID_REQUEST"
        )
    pgtext.check_message(request, SANITISED_STRING_FIELDS)


class ErrorInterceptor(grpc.aio.ServerInterceptor):
    """Maps exceptions raised by unary handlers onto gRPC statuses, and checks the request of
    every unary and server-streaming handler first (see module docstring)."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None or not (
            handler.unary_unary is not None or inspect.isasyncgenfunction(handler.unary_stream)
        ):
            return handler  # client streams, and streams that write (health's Watch): as they are
        method = handler_call_details.method
        parse = handler.request_deserializer

        def deserialize(data: bytes) -> Any:
            # grpc answers a parse error UNKNOWN with the exception's text: let the handler answer it.
            try:
                return parse(data) if parse is not None else data
            except DecodeError as exc:
                return _Unparsable.of(exc)

        if handler.unary_unary is None:
            stream = handler.unary_stream

            async def streamed(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
                # Streams map their own domain errors (rpc.abort); only the request is checked here.
                try:
                    _check_request(request)
                except DomainError as exc:
                    await abort(context, exc)
                async for item in stream(request, context):
                    yield item

            return grpc.unary_stream_rpc_method_handler(
                streamed, request_deserializer=deserialize, response_serializer=handler.response_serializer
            )
        inner = handler.unary_unary

        service, _, name = method.lstrip("/").partition("/")
        seconds = metrics.GRPC_SECONDS.labels(service, name)

        async def wrapped(request: Any, context: grpc.aio.ServicerContext) -> Any:
            parent = telemetry.extract({k: str(v) for k, v in context.invocation_metadata() or ()})
            started = time.perf_counter()
            code = grpc.StatusCode.OK
            try:
                with _tracer.start_as_current_span(method, context=parent, kind=SpanKind.SERVER):
                    return await self._handle(inner, request, context, method)
            except BaseException:
                code = context.code() or grpc.StatusCode.UNKNOWN
                raise
            finally:
                seconds.observe(time.perf_counter() - started)
                metrics.GRPC_HANDLED.labels(service, name, code.name).inc()

        return grpc.unary_unary_rpc_method_handler(
            wrapped,
            request_deserializer=deserialize,
            response_serializer=handler.response_serializer,
        )

    @staticmethod
    async def _handle(inner: Any, request: Any, context: grpc.aio.ServicerContext, method: str) -> Any:
        try:
            _check_request(request)
            return await inner(request, context)
        except DomainError as exc:
            if exc.grpc_code == grpc.StatusCode.INTERNAL:
                log.exception("internal error in %s", method)
            await abort(context, exc)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            if db.is_transient(exc):
                # Postgres restarting or unreachable: the caller may retry (UNAVAILABLE → TransientError).
                log.warning("database unavailable in %s: %s", method, type(exc).__name__)
                context.set_trailing_metadata(((ERROR_CODE_METADATA_KEY, "DATABASE_UNAVAILABLE"),))
                await context.abort(grpc.StatusCode.UNAVAILABLE, "database temporarily unavailable")
            log.exception("unhandled error in %s", method)
            if db.pooler_mismatch(exc):
                log.error("%s", db.POOLER_HINT)
            context.set_trailing_metadata(((ERROR_CODE_METADATA_KEY, "INTERNAL"),))
            await context.abort(grpc.StatusCode.INTERNAL, "internal error")


class GrpcServer:
    """An aio gRPC server with health, reflection and the error interceptor.

    Args:
        bind: ``host:port``; port 0 picks a free port (read it back from :attr:`port`).
        services: pairs of (``add_XServicer_to_server`` function, servicer instance).
        service_names: full names of the services (``pkg.Service``) for health and reflection.
        tls: this service's CA, certificate and key: the port then takes only TLS calls with a
            client certificate of that CA, and :class:`~hypermedia.infra.mtls.AuthInterceptor`
            allows each method only to the identities its rights table names (ADR 0044). None:
            plaintext, no authentication (``HM_INTERNAL_AUTH=none``, tests, embedded use).
    """

    def __init__(
        self,
        bind: str,
        services: Iterable[tuple[Callable[[Any, grpc.aio.Server], None], Any]],
        service_names: Iterable[str],
        tls: Tls | None = None,
    ) -> None:
        interceptors: list[grpc.aio.ServerInterceptor] = [ErrorInterceptor()]
        if tls is not None:
            interceptors.insert(0, AuthInterceptor())
        self.server = grpc.aio.server(
            interceptors=interceptors,
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.so_reuseport", 0),
            ],
        )
        for add, servicer in services:
            add(servicer, self.server)
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self.service_names = list(service_names)
        reflection.enable_server_reflection(
            [*self.service_names, health.SERVICE_NAME, reflection.SERVICE_NAME], self.server
        )
        if tls is None:
            self.port = self.server.add_insecure_port(bind)
        else:
            self.port = self.server.add_secure_port(bind, tls.server_credentials())
        if self.port == 0:
            raise OSError(f"cannot bind gRPC server to {bind}")

    async def start(self) -> None:
        """Start serving and report SERVING for the overall server and every service."""
        await self.server.start()
        for name in ["", *self.service_names]:
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)

    async def not_serving(self) -> None:
        """Report NOT_SERVING (the first step of a shutdown) while still answering."""
        for name in ["", *self.service_names]:
            await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)

    async def stop(self, grace_seconds: float = 5.0) -> None:
        """Report NOT_SERVING, then stop with ``grace_seconds`` for in-flight calls."""
        await self.not_serving()
        await self.server.stop(grace_seconds)


def channel(target: str, tls: Tls | None = None, server: str | None = None) -> grpc.aio.Channel:
    """An aio channel to an internal service with the platform's message size limits.

    Args:
        target: ``host:port``.
        tls: our CA, certificate and key: a mutual-TLS channel (ADR 0044); None: plaintext.
        server: the identity the peer's certificate must name as a DNS SAN (``storage``,
            ``credits``, ``imageworker``), checked instead of the host of ``target``; None: the host.
    """
    options: list[tuple[str, Any]] = [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ]
    if tls is None:
        return grpc.aio.insecure_channel(target, options=options)
    if server:
        options.append(("grpc.ssl_target_name_override", server))
    return grpc.aio.secure_channel(target, tls.channel_credentials(), options=options)


async def call(method: Callable[..., Any], request: Any, *, timeout: float = 10.0) -> Any:
    """Call a unary RPC of a peer service, turning its failure back into the DomainError it raised
    (``hm-error-code`` trailer) or a TransientError when the peer is unreachable."""
    name = getattr(method, "_method", b"rpc")
    name = name.decode() if isinstance(name, bytes) else str(name)
    with _tracer.start_as_current_span(name, kind=SpanKind.CLIENT):
        try:
            return await method(request, timeout=timeout, metadata=tuple(telemetry.inject().items()))
        except grpc.aio.AioRpcError as exc:
            raise from_rpc_error(exc) from exc


async def healthy(chan: grpc.aio.Channel, service: str = "", timeout: float = 2.0) -> bool:
    """True when the peer's standard health service answers SERVING."""
    try:
        response = await health_pb2_grpc.HealthStub(chan).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=timeout
        )
    except grpc.aio.AioRpcError:
        return False
    return bool(response.status == health_pb2.HealthCheckResponse.SERVING)


def infra_retry(attempts: int = 3) -> AsyncRetrying:
    """Bounded retries of infrastructure calls (gRPC to a platform service, HTTP to a presigned URL)
    inside one job attempt: ``attempts`` tries (1: no retry), 0.2–2 s exponential backoff, on
    :class:`TransientError` and httpx transport errors only; the last error is raised as it was.
    Use as ``async for attempt in infra_retry(): with attempt: ...``."""
    return AsyncRetrying(
        stop=stop_after_attempt(attempts),
        wait=wait_exponential(multiplier=0.2, max=2),
        retry=retry_if_exception_type((TransientError, httpx.TransportError)),
        reraise=True,
    )
