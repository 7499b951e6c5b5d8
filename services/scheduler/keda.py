"""KEDA's External Scaler API served from the scheduler's demand (issue 20 item 6): a cluster can
let KEDA scale the worker Deployments on what Postgres says, running jobs included, instead of on
JetStream's lag (about zero while jobs run: workers ack a message when they claim its job).

The trigger's metadata (``ScaledObject.spec.triggers[].metadata`` of ``type: external``):

==================== ========================================================================
``queue``            required: the queue (``images``, ``documents``, ``ocr``, ``media``) or bulk lane
                     (``bulk.images``, ...: ADR 0057), or several, comma-separated, for a worker
                     of several queues
``slotsPerReplica``  slots of one replica (default: the roles', e.g. images 4)
``utilisation``      share of a replica's slots to keep busy, 0 < u ≤ 1 (default 0.8)
``drainTargetSeconds`` how soon the backlog should be worked off (default 300)
``defaultJobSeconds`` expected seconds of a job of an operation without attempts yet (default 1)
==================== ========================================================================

The metric ``hypermedia-slots-{queues}`` (a bulk lane's dot as ``-``) is the slots the queues need: per queue
``max(arrival_work_rate, running) + backlog_work / drainTargetSeconds`` (Little's law, as the
scheduler's own formula, but never below the jobs running now, so a replica holding a long job is
not counted away); its target per replica is ``slotsPerReplica × utilisation``, so the HPA asks
for ``ceil(slots / (slotsPerReplica × utilisation))`` replicas. ``IsActive`` is true while a job
is ready or running. Every call reads Postgres afresh; a bad metadata value is
``INVALID_ARGUMENT`` naming the key.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

import asyncpg
import grpc

from hypermedia.api.keda import externalscaler_pb2 as pb
from hypermedia.api.keda import externalscaler_pb2_grpc as pb_grpc
from hypermedia.core.config import ROUTES
from hypermedia.worker.unit.settings import ROLE_OF_ROUTE
from services.scheduler.demand import WorkEstimates, queue_demand
from services.scheduler.formula import QueueDemand

log = logging.getLogger(__name__)

SERVICE_NAME = "externalscaler.ExternalScaler"


@dataclass(frozen=True)
class Trigger:
    """A trigger's metadata, validated (see the module docstring)."""

    queues: tuple[str, ...]
    slots_per_replica: int
    utilisation: float
    drain_target_seconds: float
    default_job_seconds: float

    @property
    def metric_name(self) -> str:
        return "hypermedia-slots-" + "-".join(q.replace(".", "-") for q in self.queues)

    @classmethod
    def parse(cls, metadata: dict[str, str]) -> Trigger:
        """Raises ValueError naming the bad key."""
        queues = tuple(q.strip().lower() for q in metadata.get("queue", "").split(",") if q.strip())
        if not queues or any(q not in ROUTES for q in queues) or len(set(queues)) != len(queues):
            raise ValueError(f"queue: one or more of {', '.join(ROUTES)}, comma-separated")
        if metadata.get("slotsPerReplica", ""):
            slots = _number(metadata, "slotsPerReplica", int, 1, 64)
        else:
            slots = sum(ROLE_OF_ROUTE[q].default_slots for q in queues)
        return cls(
            queues,
            int(slots),
            _number(metadata, "utilisation", float, 0.01, 1.0, 0.8),
            _number(metadata, "drainTargetSeconds", float, 1.0, 86400.0, 300.0),
            _number(metadata, "defaultJobSeconds", float, 0.001, 86400.0, 1.0),
        )

    def slots_needed(self, demand: tuple[QueueDemand, ...]) -> float:
        return sum(
            max(d.arrival_work_rate, float(d.running)) + d.backlog_work_seconds / self.drain_target_seconds
            for d in demand
        )


def _number(
    metadata: dict[str, str], key: str, kind: type, low: float, high: float, default: float = 0.0
) -> float:
    text = metadata.get(key, "")
    if not text:
        return default
    try:
        value = kind(text)
    except ValueError:
        raise ValueError(f"{key}: not a number") from None
    if not low <= value <= high:
        raise ValueError(f"{key}: must be between {low:g} and {high:g}")
    return float(value)


class ExternalScaler(pb_grpc.ExternalScalerServicer):
    """The four RPCs over ``pool``; ``stream_seconds`` is how often ``StreamIsActive`` looks."""

    def __init__(
        self, pool: asyncpg.Pool, *, arrival_window_seconds: float = 120.0, stream_seconds: float = 15.0
    ) -> None:
        self._pool = pool
        self._window = arrival_window_seconds
        self._stream_seconds = stream_seconds
        self._estimates = WorkEstimates()
        self._lock = asyncio.Lock()

    async def _trigger(self, ref: pb.ScaledObjectRef, context: grpc.aio.ServicerContext) -> Trigger:
        try:
            return Trigger.parse(dict(ref.scalerMetadata))
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"scalerMetadata {exc}")
            raise  # abort raises; this keeps the type checker's flow

    async def _demand(self, trigger: Trigger) -> tuple[QueueDemand, ...]:
        async with self._lock, self._pool.acquire() as conn:
            await self._estimates.refresh(conn)
            return await queue_demand(
                conn,
                trigger.queues,
                self._estimates,
                default_job_seconds=trigger.default_job_seconds,
                arrival_window_seconds=self._window,
            )

    async def IsActive(
        self, request: pb.ScaledObjectRef, context: grpc.aio.ServicerContext
    ) -> pb.IsActiveResponse:
        trigger = await self._trigger(request, context)
        demand = await self._demand(trigger)
        return pb.IsActiveResponse(result=any(d.ready or d.running for d in demand))

    async def StreamIsActive(
        self, request: pb.ScaledObjectRef, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.IsActiveResponse]:
        trigger = await self._trigger(request, context)
        last: bool | None = None
        while True:
            active = any(d.ready or d.running for d in await self._demand(trigger))
            if active != last:
                yield pb.IsActiveResponse(result=active)
                last = active
            await asyncio.sleep(self._stream_seconds)

    async def GetMetricSpec(
        self, request: pb.ScaledObjectRef, context: grpc.aio.ServicerContext
    ) -> pb.GetMetricSpecResponse:
        trigger = await self._trigger(request, context)
        target = trigger.slots_per_replica * trigger.utilisation
        return pb.GetMetricSpecResponse(
            metricSpecs=[
                pb.MetricSpec(
                    metricName=trigger.metric_name, targetSize=max(1, round(target)), targetSizeFloat=target
                )
            ]
        )

    async def GetMetrics(
        self, request: pb.GetMetricsRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetMetricsResponse:
        trigger = await self._trigger(request.scaledObjectRef, context)
        slots = trigger.slots_needed(await self._demand(trigger))
        return pb.GetMetricsResponse(
            metricValues=[
                pb.MetricValue(
                    metricName=trigger.metric_name, metricValue=round(slots), metricValueFloat=slots
                )
            ]
        )
