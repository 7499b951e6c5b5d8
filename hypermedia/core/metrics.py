"""The platform's Prometheus metrics (``prometheus-client``, ADR 0061): every one is defined here,
once, with its help text, and docs/operations.md lists them all (a unit test holds the two
together). A service serves them on ``HM_METRICS_BIND`` (:func:`serve`, started for every service
by :func:`hypermedia.infra.service.run_service`); the values are the process's own, so a query
sums over instances (``sum by (operation) (rate(hypermedia_attempts_total[5m]))``).

Conventions (https://prometheus.io/docs/practices/naming/): base units in the name (``_seconds``,
``_bytes``, ``_millicredits``), ``_total`` on counters, and label values from closed sets only:
operations, queues, bands, statuses and error codes of the platform, route templates (never a
path with an id in it), gRPC method names. What is read from Postgres at the scrape (queue depth,
jobs by status, outbox lag) is :mod:`hypermedia.jobs.gauges`, served by the reaper (the open
holds: ``services/credits/gauges.py``), both on :class:`ScrapeCollector`; what is read from a
worker's own state at the scrape is :class:`hypermedia.worker.gauges.WorkerCollector`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Final

from prometheus_client import Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

# Seconds: from a 64 px thumbnail (tens of ms) to a long transcode (the media queue's 30 min).
_DURATION_BUCKETS: Final = (0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)
# Bytes: 16 MiB .. 4 GiB, doubling (the profiles' memory limits are 256 MiB .. 2 GiB).
_MEMORY_BUCKETS: Final = tuple(float(16 * 2**20 * 2**i) for i in range(9))
# Seconds of an HTTP or gRPC request: milliseconds to an upload's tens of seconds.
_REQUEST_BUCKETS: Final = (0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)

# --- gateway (REST) ---------------------------------------------------------------------------
HTTP_REQUESTS: Final = Counter(
    "hypermedia_http_requests",
    "REST requests answered, by method, route template and status code.",
    ["method", "route", "code"],
)
HTTP_SECONDS: Final = Histogram(
    "hypermedia_http_request_duration_seconds",
    "Time from a REST request's start to the end of its response, by method and route template.",
    ["method", "route"],
    buckets=_REQUEST_BUCKETS,
)
HTTP_CONNECTIONS_CLOSED: Final = Counter(
    "hypermedia_http_connections_closed",
    "HTTP connections the server's own limits closed or refused, by reason "
    "(hypermedia.infra.httpguard.ConnectionGuard.closed): the answers no route saw.",
    ["reason"],
)
API_ERRORS: Final = Counter(
    "hypermedia_api_errors",
    "Error responses (application/problem+json) of the REST API, by error code.",
    ["error_code"],
)
JOBS_CREATED: Final = Counter(
    "hypermedia_jobs_created",
    "Jobs created (REST, gRPC and backfill runs), by operation and queue.",
    ["operation", "queue"],
)

# --- every gRPC server (the names of go-grpc-prometheus) ---------------------------------------
GRPC_HANDLED: Final = Counter(
    "grpc_server_handled",
    "Unary RPCs completed on the server, by service, method and status code.",
    ["grpc_service", "grpc_method", "grpc_code"],
)
GRPC_SECONDS: Final = Histogram(
    "grpc_server_handling_seconds",
    "Time a unary RPC took on the server, by service and method.",
    ["grpc_service", "grpc_method"],
    buckets=_REQUEST_BUCKETS,
)

# --- workers ----------------------------------------------------------------------------------
ATTEMPTS: Final = Counter(
    "hypermedia_attempts",
    "Job attempts that ended, by operation and outcome: completed, failed, retried, cancelled (by "
    "the worker that ran them), lost (found by the reaper, or handed back at a drain) and preempted.",
    ["operation", "outcome"],
)
ATTEMPT_SECONDS: Final = Histogram(
    "hypermedia_attempt_duration_seconds",
    "Wall time of a finished attempt, by operation (the sandbox child's fork to exit; the whole "
    "attempt where no child ran).",
    ["operation"],
    buckets=_DURATION_BUCKETS,
)
ATTEMPT_PEAK_MEMORY: Final = Histogram(
    "hypermedia_attempt_peak_memory_bytes",
    "Peak resident set of a finished attempt's sandbox child, by operation (job_attempts."
    "peak_memory_mb; attempts where no child ran are not observed).",
    ["operation"],
    buckets=_MEMORY_BUCKETS,
)
JOB_ERRORS: Final = Counter(
    "hypermedia_job_errors",
    "Failed attempts, by operation and error code (TIMEOUT, RESOURCE_LIMIT, CORRUPT_INPUT, ...).",
    ["operation", "error_code"],
)
SANDBOX_KILLS: Final = Counter(
    "hypermedia_sandbox_kills",
    "Sandbox children stopped by a limit or a fence, by reason: memory (cgroup OOM kill, or "
    "RLIMIT_AS), "
    "wall_time, cpu_time, file_size, seccomp (a refused system call), cancelled.",
    ["reason"],
)

# --- credits ----------------------------------------------------------------------------------
CREDITS: Final = Counter(
    "hypermedia_credits_millicredits",
    "Millicredits moved by the credits service, by action: held (a job's hold placed), committed "
    "(charged at completion), released (a hold given back).",
    ["action"],
)

# --- reaper -----------------------------------------------------------------------------------
WEBHOOK_DELIVERIES: Final = Counter(
    "hypermedia_webhook_deliveries",
    "Webhook delivery attempts, by outcome: delivered, retrying (a later attempt follows), failed "
    "(given up: attempts spent or an address that is not public).",
    ["outcome"],
)

# --- scheduler --------------------------------------------------------------------------------
SCHEDULER_DECISIONS: Final = Counter(
    "hypermedia_scheduler_decisions",
    "Decisions of the scheduler's leader, by pool and action (start, drain, hold).",
    ["pool", "action"],
)

# --- schedules (gateway and reaper) -------------------------------------------------------------
SCHEDULE_RUNS: Final = Counter(
    "hypermedia_schedule_runs",
    "Schedule runs this process finished (ADR 0072), by kind (process, backfill, maintenance) and "
    "state (succeeded, failed).",
    ["kind", "state"],
)

# --- outbox relay (gateway) -------------------------------------------------------------------
OUTBOX_PUBLISHED: Final = Counter(
    "hypermedia_outbox_published",
    "Outbox rows published to JetStream by this process's relay.",
)


SCRAPE_TIMEOUT_SECONDS: Final = 5.0
"""Longest a :class:`ScrapeCollector` waits for its reads; past it (or on any error) the scrape
answers its ``..._up 0`` and none of its other families."""


class ScrapeCollector(Collector):
    """A collector whose values are read at the scrape by a coroutine of the service's event loop
    (Postgres through its asyncpg pool, as postgres_exporter reads its queries), from the scrape's
    own thread. Subclasses give :attr:`prefix` (``hypermedia_platform_gauges``: its ``_up`` and
    ``_scrape_seconds`` families), :meth:`read` and :meth:`families`."""

    prefix = "hypermedia_collector"
    subject = "the collector's reads"
    timeout_seconds = SCRAPE_TIMEOUT_SECONDS

    def __init__(self, loop: asyncio.AbstractEventLoop | None) -> None:
        self._loop = loop
        self._reading: concurrent.futures.Future[Any] | None = None
        self._lock = threading.Lock()

    async def read(self) -> Any:
        """What :meth:`families` needs, read on the service's event loop."""
        raise NotImplementedError

    def families(self, values: Any) -> list[GaugeMetricFamily]:
        """The families, filled from ``values`` (None: empty, for :meth:`describe`)."""
        raise NotImplementedError

    def describe(self) -> Iterator[GaugeMetricFamily]:
        """The families without values (registering must not run the reads)."""
        return iter([*self.families(None), *self._status(None, 0.0)])

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """One read at a time: a scrape that comes while a read is still running answers ``_up 0``
        at once; a read past :attr:`timeout_seconds` is cancelled (it must not keep a
        connection of the service's pool: scrapers retry, and the pool is the service's own)."""
        started = time.perf_counter()
        values = None
        with self._lock:
            busy = self._reading is not None and not self._reading.done()
            if not busy and self._loop is not None:
                self._reading = asyncio.run_coroutine_threadsafe(self.read(), self._loop)
            reading = self._reading
        if busy or reading is None:
            log.warning("%s: a scrape came while the last read still runs", self.subject)
        else:
            try:
                values = reading.result(self.timeout_seconds)
            except Exception as exc:  # a scrape reports the failure, never raises it
                reading.cancel()
                log.warning("%s failed: %s", self.subject, type(exc).__name__)
        if values is not None:
            yield from self.families(values)
        yield from self._status(values, time.perf_counter() - started)

    def _status(self, values: Any, seconds: float) -> list[GaugeMetricFamily]:
        up = GaugeMetricFamily(
            f"{self.prefix}_up", f"1 when the last scrape's reads of {self.subject} answered, else 0."
        )
        took = GaugeMetricFamily(f"{self.prefix}_scrape_seconds", f"Time the reads of {self.subject} took.")
        up.add_metric([], 0.0 if values is None else 1.0)
        took.add_metric([], seconds)
        return [up, took]


JOB_ERROR_CODES: Final = frozenset(
    {
        "CANCELLED", "CORRUPT_INPUT", "INPUT_TOO_LARGE", "INPUT_TOO_LARGE_PIXELS", "INPUT_TOO_MANY_PAGES",
        "INTERNAL", "INVALID_PARAMS", "LINKED_CONTENT_NOT_ALLOWED", "MEDIA_TOO_LONG", "NO_AUDIO_STREAM",
        "NO_VIDEO_STREAM", "OCR_ENGINE_UNAVAILABLE", "OCR_PAGE_LIMIT", "OCR_PAGE_TIMEOUT", "OFFICE_CRASHED",
        "OFFICE_UNAVAILABLE", "OPERATION_NOT_ENABLED", "PARSE_ERROR", "PASSWORD_INCORRECT", "PASSWORD_REQUIRED",
        "PDF_PAGE_LIMIT", "PDF_PAGE_TOO_LARGE", "PDF_TEXT_LIMIT", "PDF_UNSUPPORTED_ENCRYPTION", "PREEMPTED",
        "RESOURCE_LIMIT", "SANDBOX_CRASHED", "SANDBOX_UNAVAILABLE", "SANDBOX_VIOLATION", "STORAGE_UNAVAILABLE",
        "SVG_EXTERNAL_REFERENCE", "SVG_FORBIDDEN", "TIMEOUT", "TRANSIENT", "UNSUPPORTED_FORMAT", "WORKER_LOST",
    }
)  # fmt: skip
"""The job error codes (docs/api.md, Job error codes): the values of ``error_code`` labels. A code
outside it (a sandbox child's report is not trusted to name one) is counted as ``OTHER``."""

HTTP_METHODS: Final = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
"""The ``method`` label's values; any other method a client sends is counted as ``other``."""


def job_error_label(code: str) -> str:
    """``code`` as an ``error_code`` label value: itself if it is one of :data:`JOB_ERROR_CODES`,
    else ``OTHER``."""
    return code if code in JOB_ERROR_CODES else "OTHER"


def method_label(method: str) -> str:
    """An HTTP method as a ``method`` label value: one of :data:`HTTP_METHODS`, else ``other``."""
    return method if method in HTTP_METHODS else "other"


def parse_bind(bind: str) -> tuple[str, int]:
    """``host:port`` (``[::1]:9464`` for IPv6) → (host, port). Raises ValueError naming what is
    wrong (no port, a port outside 0..65535)."""
    host, sep, port = bind.rpartition(":")
    if not sep or not port.isascii() or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError("must be host:port, with a port 0-65535 in ASCII digits")
    return host.strip("[]") or "0.0.0.0", int(port)


def serve(bind: str) -> tuple[int, Callable[[], None]]:
    """Serve every registered metric at ``http://{bind}/metrics`` (the text exposition format) from
    a thread of prometheus-client's WSGI server. Returns the port bound (``bind`` may say 0) and a
    function that stops the server. Raises ValueError for a malformed ``bind``, OSError when it
    cannot be bound."""
    host, port = parse_bind(bind)
    server, thread = start_http_server(port, host)
    log.info("metrics on http://%s:%d/metrics", host, server.server_port)

    def stop() -> None:
        server.shutdown()
        server.server_close()
        if thread is not threading.current_thread():
            thread.join(timeout=5)

    return int(server.server_port), stop
