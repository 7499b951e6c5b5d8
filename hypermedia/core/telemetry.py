"""Telemetry set up once per process: JSON logs that carry the trace id, and an OpenTelemetry
tracer provider. The trace context travels in W3C ``traceparent`` form: in gRPC metadata
(:func:`hypermedia.infra.rpc.call` and the server interceptor), in outbox rows and from there in the NATS
message headers, so one trace follows a job from the REST request through the worker. Spans are exported to the console only when ``HM_TRACE_CONSOLE=1`` (an OTLP
exporter can be added by deployment; the SDK reads the standard ``OTEL_*`` variables)."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor
from pythonjsonlogger.json import JsonFormatter


class _TraceContextFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        ctx = trace.get_current_span().get_span_context()
        record.trace_id = format(ctx.trace_id, "032x") if ctx.is_valid else ""
        return True


def setup(service: str, level: str = "INFO") -> trace.Tracer:
    """Install JSON logging on stderr and a tracer provider named ``hypermedia.<service>``."""
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
    provider = TracerProvider(resource=Resource.create({"service.name": f"hypermedia.{service}"}))
    if os.environ.get("HM_TRACE_CONSOLE") == "1":
        provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
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
