"""Spans of a job's own process, which has no network to export them (issue 22 item 2): the child
times its set-up (from the request to the entry: namespaces, mounts, Landlock, seccomp) and the
engine's call, on the wall clock, and puts them in its report; the worker makes them spans of its
own under ``sandbox.run`` with those times, so a trace shows where a job's time went inside the
sandbox.

The report is a hostile child's word: only the names :data:`NAME` allows, at most
:data:`MAX_SPANS`, each ending after it starts and within the run's window, become spans.
"""

from __future__ import annotations

import re
import time
from typing import Any, Final

from opentelemetry import trace

NAME: Final = re.compile(r"sandbox\.setup|engine\.[a-z][a-z0-9_]{0,39}")
"""``sandbox.setup``, and ``engine.{operation}`` for the entry's call."""
MAX_SPANS: Final = 8
SLACK_NS: Final = 5 * 10**9
"""How far before the run's wall-clock limit a span may start (the zygote's hand-off, clock steps)."""

_tracer = trace.get_tracer(__name__)


def timed(name: str, start_ns: int, end_ns: int) -> dict[str, Any]:
    """One span of the report (``time.time_ns()`` values), as :func:`emit` takes it."""
    return {"name": name, "start_ns": start_ns, "end_ns": end_ns}


def emit(raw: Any, wall_seconds: float, tracer: trace.Tracer | None = None) -> int:
    """Makes a span, child of the current one, for each valid entry of ``raw`` (a report's
    ``spans``): a name :data:`NAME` matches, integer times with the end after the start, both
    within the last ``wall_seconds`` (the run's limit) plus :data:`SLACK_NS` and not in the
    future. At most :data:`MAX_SPANS`; anything else is ignored. Returns how many were made."""
    if not isinstance(raw, list):
        return 0
    now = time.time_ns()
    earliest = now - int(wall_seconds * 1e9) - SLACK_NS
    made = 0
    for entry in raw[:MAX_SPANS]:
        if not isinstance(entry, dict) or not isinstance(name := entry.get("name"), str):
            continue
        start, end = entry.get("start_ns"), entry.get("end_ns")
        if not (NAME.fullmatch(name) and type(start) is int and type(end) is int):
            continue
        if not earliest <= start <= end <= now:
            continue
        (tracer or _tracer).start_span(name, start_time=start).end(end_time=end)
        made += 1
    return made
