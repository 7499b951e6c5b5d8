"""Tracing costs nothing when nothing exports: without an exporter ``telemetry.setup``'s provider
samples nothing (spans get ids in the caller's trace and record nothing); with one it records. The
exporters are chosen by the standard ``OTEL_*`` variables (issue 22 item 2); a value this
platform does not ship stops a service at start with 78."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcOTLPSpanExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpOTLPSpanExporter
from opentelemetry.sdk.trace.export import ConsoleSpanExporter

from hypermedia.core import telemetry

REPO = Path(__file__).resolve().parents[2]

# In a fresh interpreter: setup() decides the process's provider once, as a service's start does.
_PROBE = """
import json
from opentelemetry import trace
from hypermedia.core import telemetry
telemetry.setup("probe")
parent = telemetry.extract({"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"})
with trace.get_tracer("probe").start_as_current_span("work", context=parent) as span:
    carried = telemetry.inject()
    recording = span.is_recording()
with trace.get_tracer("probe").start_as_current_span("root") as root:
    root_trace_id = format(root.get_span_context().trace_id, "032x")
print(json.dumps({"provider": type(trace.get_tracer_provider()).__name__, "recording": recording,
                  "carried": carried.get("traceparent", ""), "root_trace_id": root_trace_id}))
"""


def _probe(**env: str) -> dict[str, object]:
    base = {k: v for k, v in os.environ.items() if k != "HM_TRACE_CONSOLE"}
    out = subprocess.run(
        [sys.executable, "-c", _PROBE],
        cwd=REPO,
        env={**base, **env},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


def test_span_exporters_are_the_console_only_when_asked_for() -> None:
    assert telemetry.span_exporters({}) == []
    assert telemetry.span_exporters({"HM_TRACE_CONSOLE": "0"}) == []
    [exporter] = telemetry.span_exporters({"HM_TRACE_CONSOLE": "1"})
    assert isinstance(exporter, ConsoleSpanExporter)
    [exporter] = telemetry.span_exporters({"OTEL_TRACES_EXPORTER": "console"})
    assert isinstance(exporter, ConsoleSpanExporter)


def test_otlp_is_chosen_by_the_standard_variables() -> None:
    [grpc_exporter] = telemetry.span_exporters({"OTEL_TRACES_EXPORTER": "otlp"})
    assert isinstance(grpc_exporter, GrpcOTLPSpanExporter)
    [by_endpoint] = telemetry.span_exporters({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"})
    assert isinstance(by_endpoint, GrpcOTLPSpanExporter)
    [http_exporter] = telemetry.span_exporters(
        {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"}
    )
    assert isinstance(http_exporter, HttpOTLPSpanExporter)
    both = telemetry.span_exporters({"OTEL_TRACES_EXPORTER": "otlp,console"})
    assert sorted(type(e).__name__ for e in both) == ["ConsoleSpanExporter", "OTLPSpanExporter"]
    none = {
        "OTEL_TRACES_EXPORTER": "none",
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317",
        "HM_TRACE_CONSOLE": "1",
    }
    assert telemetry.span_exporters(none) == []


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        ({"OTEL_TRACES_EXPORTER": "jaeger"}, "OTEL_TRACES_EXPORTER"),
        (
            {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"},
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ),
    ],
)
def test_an_exporter_this_platform_does_not_ship_is_refused_by_name(
    env: dict[str, str], variable: str
) -> None:
    with pytest.raises(ValueError, match=variable):
        telemetry.span_exporters(env)
    started = subprocess.run(
        [sys.executable, "-m", "services.credits"],
        env={"PATH": os.environ.get("PATH", ""), "HM_DATABASE_URL": "postgresql://hm@127.0.0.1:9/hm", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert started.returncode == 78, started.stderr
    assert started.stderr.startswith(f"credits: {variable}:") and "Traceback" not in started.stderr


def test_without_an_exporter_spans_record_nothing_and_keep_the_callers_trace() -> None:
    seen = _probe()
    assert seen["recording"] is False
    _, trace_id, span_id, flags = str(seen["carried"]).split("-")
    assert trace_id == "0af7651916cd43dd8448eb211c80319c"  # the caller's trace goes on
    assert span_id != "b7ad6b7169203331" and flags == "00"  # a span of its own, not sampled
    # A span without a parent still has a trace id: log lines carry it.
    assert str(seen["root_trace_id"]) not in ("", "0" * 32)


def test_with_the_console_exporter_spans_are_recorded_in_the_callers_trace() -> None:
    seen = _probe(HM_TRACE_CONSOLE="1")
    assert seen["provider"] == "TracerProvider"
    assert seen["recording"] is True
    trace_id, span_id = str(seen["carried"]).split("-")[1:3]
    assert trace_id == "0af7651916cd43dd8448eb211c80319c"
    assert span_id != "b7ad6b7169203331"  # a span of its own, child of the caller's
