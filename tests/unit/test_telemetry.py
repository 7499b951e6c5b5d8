"""Tracing costs nothing when nothing exports: without an exporter ``telemetry.setup`` leaves the
API's no-op provider, whose spans pass the parent's context on; with one it installs the SDK."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

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
print(json.dumps({"provider": type(trace.get_tracer_provider()).__name__,
                  "recording": recording, "carried": carried.get("traceparent", "")}))
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


def test_without_an_exporter_spans_record_nothing_and_pass_the_callers_trace_on() -> None:
    seen = _probe()
    assert seen["provider"] == "ProxyTracerProvider"  # the API's default: no SDK installed
    assert seen["recording"] is False
    # The span is the parent's context: the caller's trace id and span id go on unchanged.
    assert seen["carried"] == "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_with_the_console_exporter_spans_are_recorded_in_the_callers_trace() -> None:
    seen = _probe(HM_TRACE_CONSOLE="1")
    assert seen["provider"] == "TracerProvider"
    assert seen["recording"] is True
    trace_id, span_id = str(seen["carried"]).split("-")[1:3]
    assert trace_id == "0af7651916cd43dd8448eb211c80319c"
    assert span_id != "b7ad6b7169203331"  # a span of its own, child of the caller's
