"""The job child's own spans (``hypermedia.sandbox.spans``): what a report's ``spans`` become in
the worker's trace, and what a hostile child cannot make of them."""

from __future__ import annotations

import time

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from hypermedia.sandbox import spans


def _tracer() -> tuple[InMemorySpanExporter, TracerProvider]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter, provider


def test_the_childs_times_become_spans_under_the_current_one() -> None:
    exporter, provider = _tracer()
    tracer = provider.get_tracer("test")
    now = time.time_ns()
    report = [
        spans.timed("sandbox.setup", now - 9_000_000, now - 8_000_000),
        spans.timed("engine.thumbnail", now - 8_000_000, now - 1_000),
    ]
    with tracer.start_as_current_span("sandbox.run") as run:
        assert spans.emit(report, wall_seconds=30, tracer=tracer) == 2
    made = {s.name: s for s in exporter.get_finished_spans()}
    assert (made["engine.thumbnail"].start_time, made["engine.thumbnail"].end_time) == (
        now - 8_000_000,
        now - 1_000,
    )
    for name in ("sandbox.setup", "engine.thumbnail"):
        assert made[name].parent is not None and made[name].parent.span_id == run.get_span_context().span_id
        assert made[name].context.trace_id == run.get_span_context().trace_id


def test_a_hostile_report_makes_no_span_it_could_not_have_timed() -> None:
    exporter, provider = _tracer()
    tracer = provider.get_tracer("test")
    now = time.time_ns()
    hostile = [
        spans.timed("GET /v1/admin", now - 10, now - 5),  # another service's name
        spans.timed("engine.Thumbnail; drop", now - 10, now - 5),
        spans.timed("engine.thumbnail", now - 5, now - 10),  # ends before it starts
        spans.timed("engine.thumbnail", now + 10**12, now + 10**12 + 1),  # in the future
        spans.timed("engine.thumbnail", now - 3600 * 10**9, now - 3599 * 10**9),  # before the run
        {"name": "engine.thumbnail", "start_ns": float(now - 10), "end_ns": now - 5},
        {"name": "engine.thumbnail", "start_ns": True, "end_ns": now - 5},
        "engine.thumbnail",
        None,
    ]
    assert spans.emit(hostile, wall_seconds=30, tracer=tracer) == 0
    assert spans.emit({"spans": hostile}, wall_seconds=30, tracer=tracer) == 0
    flood = [spans.timed("engine.thumbnail", now - 10, now - 5)] * 1000
    assert spans.emit(flood, wall_seconds=30, tracer=tracer) == spans.MAX_SPANS
    assert len(exporter.get_finished_spans()) == spans.MAX_SPANS
