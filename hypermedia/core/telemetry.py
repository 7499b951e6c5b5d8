"""Telemetry set up once per process: JSON logs that carry the trace id, and an OpenTelemetry
tracer provider. The trace context travels in W3C ``traceparent`` form: in gRPC metadata
(:func:`hypermedia.infra.rpc.call` and the server interceptor), in outbox rows and from there in the NATS
message headers, so one trace follows a job from the REST request through the worker.

Spans cost something only where something exports them (:func:`span_exporters`: the console when
``HM_TRACE_CONSOLE=1``; OTLP through the standard ``OTEL_*`` variables is to plug in there). With
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
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from pythonjsonlogger.json import JsonFormatter


class _TraceContextFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        ctx = trace.get_current_span().get_span_context()
        record.trace_id = format(ctx.trace_id, "032x") if ctx.is_valid else ""
        return True


def span_exporters(env: Mapping[str, str] | None = None) -> list[SpanExporter]:
    """The span exporters ``env`` (default: the process's environment) configures, empty when
    none is: a :class:`ConsoleSpanExporter` for ``HM_TRACE_CONSOLE=1``. The one place an exporter
    is chosen; OTLP (``OTEL_TRACES_EXPORTER=otlp``, ``OTEL_EXPORTER_OTLP_*``) is added here."""
    env = os.environ if env is None else env
    exporters: list[SpanExporter] = []
    if env.get("HM_TRACE_CONSOLE") == "1":
        exporters.append(ConsoleSpanExporter())
    return exporters


def setup(service: str, level: str = "INFO") -> trace.Tracer:
    """Install JSON logging on stderr and the SDK's tracer provider (``service.name``
    ``hypermedia.<service>``): exporting to each exporter :func:`span_exporters` names, or, when it
    names none, sampling nothing (spans get ids, record nothing). Returns the tracer
    ``hypermedia.<service>``."""
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
    for noisy in ("nats", "uvicorn.access", "httpx", "botocore", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    exporters = span_exporters()
    provider = TracerProvider(
        resource=Resource.create({"service.name": f"hypermedia.{service}"}),
        # Nothing to export: every span is dropped at its start, but keeps ids of its own in the
        # caller's trace (or a new one), so log lines still carry a trace id.
        sampler=None if exporters else ALWAYS_OFF,
    )
    for exporter in exporters:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return trace.get_tracer(f"hypermedia.{service}")


def inject() -> dict[str, str]:
    """The current trace context as W3C ``traceparent``/``tracestate`` entries, for gRPC metadata,
    NATS headers and outbox rows. Empty when there is no active span."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier


def extract(carrier: Mapping[str, str] | None) -> Context:
    """The trace context carried by ``carrier`` (headers or metadata); an empty context if none."""
    return propagate.extract(dict(carrier or {}))
