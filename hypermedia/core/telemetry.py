"""Telemetry set up once per process: JSON logs that carry the trace id, and an OpenTelemetry
tracer provider. The trace context travels in W3C ``traceparent`` form: in gRPC metadata
(:func:`hypermedia.infra.rpc.call` and the server interceptor), in outbox rows and from there in the NATS
message headers, so one trace follows a job from the REST request through the worker.

Spans cost something only where something exports them (:func:`span_exporters`: OTLP through the
standard ``OTEL_*`` variables, the console when ``HM_TRACE_CONSOLE=1``). With
no exporter the SDK's provider samples nothing (``ALWAYS_OFF``): a span is then a non-recording
context with ids of its own in the caller's trace (or a new trace), flagged not sampled, so log
lines keep their trace id and a caller's trace id still reaches the worker, while nothing is
recorded, timed or processed per span (issue 17: the SDK recording spans without a span processor
cost 6.5–8.2 % of every service's CPU; dropped at the start, a span costs what the API's no-op one
does, measured with ``timeit``)."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
)
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from pythonjsonlogger.json import JsonFormatter


class _TraceContextFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        ctx = trace.get_current_span().get_span_context()
        record.trace_id = format(ctx.trace_id, "032x") if ctx.is_valid else ""
        return True


OTLP_ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")


def span_exporters(env: Mapping[str, str] | None = None) -> list[SpanExporter]:
    """The span exporters ``env`` (default: the process's environment) configures, empty when
    none is; the one place an exporter is chosen.

    - OTLP, by the standard variables (https://opentelemetry.io/docs/specs/otel/configuration/
      sdk-environment-variables/): ``OTEL_TRACES_EXPORTER`` naming ``otlp`` (a comma list), or,
      with it unset, an ``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``..._TRACES_ENDPOINT`` set. The
      protocol is ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` / ``OTEL_EXPORTER_OTLP_PROTOCOL``:
      ``grpc`` (the default) or ``http/protobuf``; endpoint, headers, TLS and timeout are read by
      the exporter itself from the other ``OTEL_EXPORTER_OTLP_*`` variables. ``none`` in
      ``OTEL_TRACES_EXPORTER`` turns it off whatever else is set. Unlike the SDK's own default
      (``otlp`` to localhost), nothing is exported unless asked for: an unreachable collector
      would cost every span.
    - :class:`ConsoleSpanExporter` for ``HM_TRACE_CONSOLE=1`` (or ``console`` in
      ``OTEL_TRACES_EXPORTER``).

    Raises ValueError naming the variable for an exporter or protocol this platform does not
    ship (so a typo is a start-up error, not silence)."""
    env = os.environ if env is None else env
    named = [n.strip() for n in env.get("OTEL_TRACES_EXPORTER", "").split(",") if n.strip()]
    unknown = [n for n in named if n not in ("otlp", "console", "none")]
    if unknown:
        raise ValueError(f"OTEL_TRACES_EXPORTER: {unknown[0]!r} is not one of otlp, console, none")
    exporters: list[SpanExporter] = []
    if "none" in named:
        return exporters
    if "console" in named or env.get("HM_TRACE_CONSOLE") == "1":
        exporters.append(ConsoleSpanExporter())
    if "otlp" in named or (not named and any(env.get(v) for v in OTLP_ENDPOINT_VARIABLES)):
        protocol = (
            env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "grpc"
        )
        if protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        elif protocol == "http/protobuf":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # type: ignore[assignment]
                OTLPSpanExporter,
            )
        else:
            raise ValueError(f"OTEL_EXPORTER_OTLP_PROTOCOL: {protocol!r} is not grpc or http/protobuf")
        exporters.append(OTLPSpanExporter())
    return exporters


def setup(service: str, level: str = "INFO") -> trace.Tracer:
    """Install JSON logging on stderr and the SDK's tracer provider (``service.name``
    ``hypermedia.<service>``): exporting to each exporter :func:`span_exporters` names, or, when it
    names none, sampling nothing (spans get ids, record nothing). Returns the tracer
    ``hypermedia.<service>``. An ``OTEL_*`` value :func:`span_exporters` refuses exits the process
    with 78 and the variable named."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter(
            "%(asctime)s %(levelname)s %(name)s %(message)s %(trace_id)s",
            rename_fields={"levelname": "level", "asctime": "time"},
            static_fields={"service": service},
        )
    )
    handler.addFilter(_TraceContextFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # pgserver logs all of initdb and yoyo every step of every migration at INFO: `hypermedia up`
    # says "migrations applied: N" once instead, and both still log their warnings and errors.
    for noisy in ("nats", "uvicorn.access", "httpx", "botocore", "asyncio", "pgserver", "yoyo"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        exporters = span_exporters()
    except ValueError as exc:  # a misspelt exporter or protocol: refuse to start, as config does
        print(f"{service}: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(78) from None
    provider = TracerProvider(
        resource=Resource.create({"service.name": f"hypermedia.{service}"}),
        # Nothing to export: every span is dropped at its start, but keeps ids of its own in the
        # caller's trace (or a new one), so log lines still carry a trace id.
        sampler=None if exporters else ALWAYS_OFF,
    )
    for exporter in exporters:
        # The console prints as spans end; OTLP sends batches from a thread of its own
        # (OTEL_BSP_* tune it), so a slow collector never holds a request.
        console = isinstance(exporter, ConsoleSpanExporter)
        provider.add_span_processor(
            SimpleSpanProcessor(exporter) if console else BatchSpanProcessor(exporter)
        )
    trace.set_tracer_provider(provider)
    return trace.get_tracer(f"hypermedia.{service}")


def shutdown() -> None:
    """Flush and stop the span processors (the batches not yet sent), at a process's end; waits
    at most ``OTEL_BSP_EXPORT_TIMEOUT`` (30 s) for a collector that does not answer."""
    provider = trace.get_tracer_provider()
    if isinstance(provider, TracerProvider):
        provider.shutdown()


def inject() -> dict[str, str]:
    """The current trace context as W3C ``traceparent``/``tracestate`` entries, for gRPC metadata,
    NATS headers and outbox rows. Empty when there is no active span."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier


def extract(carrier: Mapping[str, str] | None) -> Context:
    """The trace context carried by ``carrier`` (headers or metadata); an empty context if none."""
    return propagate.extract(dict(carrier or {}))
