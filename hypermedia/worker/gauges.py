"""A worker process's own state as Prometheus gauges, read at the scrape (ADR 0061): nothing is
done per job or per loop turn for them. Registered by :func:`hypermedia.worker.serve.serve_lanes`
once its runtimes exist; the per-job counters and histograms are in
:mod:`hypermedia.core.metrics`."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Final

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from hypermedia.sandbox.layers import Layer
from hypermedia.worker.runtime import WorkerRuntime

ADMISSION_REASONS: Final = (
    "ok",
    "slots_full",
    "parked",
    "memory_pressure",
    "pid_pressure",
    "awaiting_peer_evidence",
    "draining",
)
"""Every value of :attr:`hypermedia.worker.admission.Admission.reason` (a closed set: the label's
values)."""


class WorkerCollector(Collector):
    """``hypermedia_worker_slots``, ``hypermedia_worker_slots_busy``,
    ``hypermedia_worker_admission_limit`` and ``hypermedia_worker_admission`` (1 for the lane's
    current reason, 0 for the others, as an enum in Prometheus is written), each by ``queue``
    (the lane's route), and ``hypermedia_worker_memory_available_bytes`` as admission last read
    it; ``hypermedia_sandbox_layer`` by ``layer`` from the start-time probe's ``sandbox_layers``.
    Read from ``runtimes`` in the scrape's thread: each value is one attribute read, so a
    scrape sees each as it was at some instant of the scrape."""

    def __init__(self, runtimes: Sequence[WorkerRuntime], sandbox_layers: Sequence[Layer] = ()) -> None:
        self._runtimes = runtimes
        self._layers = sandbox_layers

    def collect(self) -> Iterator[GaugeMetricFamily]:
        slots = GaugeMetricFamily("hypermedia_worker_slots", "Job slots of the lane.", labels=["queue"])
        busy = GaugeMetricFamily(
            "hypermedia_worker_slots_busy", "Slots of the lane running a job now.", labels=["queue"]
        )
        limit = GaugeMetricFamily(
            "hypermedia_worker_admission_limit",
            "Jobs the lane admits at once now: its slots, or a worker unit control's lower target.",
            labels=["queue"],
        )
        state = GaugeMetricFamily(
            "hypermedia_worker_admission",
            "Why the lane's admission is open (reason ok) or closed: 1 for the current reason.",
            labels=["queue", "reason"],
        )
        memory = GaugeMetricFamily(
            "hypermedia_worker_memory_available_bytes",
            "Memory available to new jobs at admission's last reading (the host's, or the cgroup's).",
        )
        for rt in self._runtimes:
            admission, queue = rt.admission, rt.settings.queue
            slots.add_metric([queue], admission.slots)
            busy.add_metric([queue], admission.busy)
            limit.add_metric([queue], admission.limit)
            current = admission.reason
            for reason in ADMISSION_REASONS:
                state.add_metric([queue, reason], 1.0 if reason == current else 0.0)
        if self._runtimes:
            memory.add_metric([], self._runtimes[0].admission.available_mb * 2**20)
        fences = GaugeMetricFamily(
            "hypermedia_sandbox_layer",
            "1 for each isolation layer the start-time probe found applied to a job child, 0 for "
            "one it did not (docs/security.md: the layers).",
            labels=["layer"],
        )
        for layer in self._layers:
            fences.add_metric([layer.name], 1.0 if layer.available else 0.0)
        yield from (slots, busy, limit, state, memory, fences)
