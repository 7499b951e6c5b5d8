"""The operators' API on the gateway's two transports (admin accounts only; docs/api.md
"Operators"): REST ``GET /v1/admin/scheduler/pools``, ``.../burst-workers``, ``.../decisions``
and gRPC ``hypermedia.scheduler.v1.SchedulerAdminService``, both over
:class:`~services.gateway.operators.SchedulerAdmin`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

import grpc
from fastapi import APIRouter, Depends, Query
from google.protobuf import struct_pb2
from pydantic import BaseModel, Field

from hypermedia.api.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
from hypermedia.jobs import scaling
from hypermedia.jobs.accounts import Caller
from services.gateway.grpc_api import timestamp_of
from services.gateway.operators import SchedulerAdmin

SERVICE_NAME = "hypermedia.scheduler.v1.SchedulerAdminService"

# -- REST ------------------------------------------------------------------------------------


class DecisionOut(BaseModel):
    decision_id: int
    pool: str
    decided_at: datetime
    leader: str = Field(description='The scheduler that decided ("host/pid")')
    target: int = Field(description="The burst workers the formula wants")
    action: str = Field(description="start, drain or hold")
    count: int
    reason: str
    inputs: dict[str, Any] = Field(description="Everything the decision was computed from")


class PoolOut(BaseModel):
    name: str
    config: dict[str, Any] = Field(description="The pool's settings at its latest decision")
    live_workers: int = Field(description="Burst workers not yet terminated or failed")
    spend_per_hour: float = Field(description="The live burst workers' summed cost_per_hour")
    cost: float = Field(description="What its burst workers cost so far (per-second billing)")
    launched: int
    latest_decision: DecisionOut


class BurstWorkerOut(BaseModel):
    burst_worker_id: str
    pool: str
    provider: str = Field(description="local, ec2 or kubernetes")
    capacity_type: str = Field(description="on-demand or spot")
    provider_ref: str = Field(description='A pid, an instance id, "namespace/pod"')
    state: str = Field(description="requested, booting, registered, draining, terminated or failed")
    slots: int
    cost_per_hour: float
    leader: str
    reason: str = Field(description="Why it ended or failed; empty while it lives")
    requested_at: datetime
    registered_at: datetime | None
    draining_at: datetime | None
    terminated_at: datetime | None
    cost: float = Field(description="cost_per_hour x hours from requested_at to terminated_at (or now)")


def router(admin: SchedulerAdmin, caller: Callable[..., Awaitable[Caller]]) -> APIRouter:
    """The REST routes; ``caller`` is the app's authenticating dependency. 401 without a valid
    key, 403 ``PERMISSION_DENIED`` for an account that is not an admin."""
    routes = APIRouter(prefix="/v1/admin/scheduler", tags=["operators"])
    limit_query = Query(0, ge=0, le=scaling.MAX_LIMIT, description="At most this many; 0: 50")
    pool_query = Query("", max_length=40, description="Only this pool's; empty: every pool's")

    @routes.get("/pools", response_model=dict[str, list[PoolOut]])
    async def pools(who: Caller = Depends(caller)) -> dict[str, Any]:
        return {"pools": await admin.pools(who)}

    @routes.get("/burst-workers", response_model=dict[str, list[BurstWorkerOut]])
    async def burst_workers(
        pool: str = pool_query,
        live_only: bool = Query(False, description="Only those not yet terminated or failed"),
        limit: int = limit_query,
        who: Caller = Depends(caller),
    ) -> dict[str, Any]:
        return {"burst_workers": await admin.burst_workers(who, pool=pool, live_only=live_only, limit=limit)}

    @routes.get("/decisions", response_model=dict[str, list[DecisionOut]])
    async def decisions(
        pool: str = pool_query,
        limit: int = limit_query,
        before_decision_id: int = Query(0, ge=0, description="Older than this id (the next page)"),
        who: Caller = Depends(caller),
    ) -> dict[str, Any]:
        found = await admin.decisions(who, pool=pool, limit=limit, before_id=before_decision_id)
        return {"decisions": found}

    return routes


# -- gRPC ------------------------------------------------------------------------------------


def _struct(value: dict[str, Any] | None) -> struct_pb2.Struct:
    out = struct_pb2.Struct()
    out.update(scaling.jsonable(value or {}))
    return out


def decision_message(row: dict[str, Any]) -> scheduler_pb2.ScalingDecision:
    return scheduler_pb2.ScalingDecision(
        decision_id=row["decision_id"],
        pool=row["pool"],
        decided_at=timestamp_of(row["decided_at"]),
        leader=row["leader"],
        target=row["target"],
        action=row["action"],
        count=row["count"],
        reason=row["reason"],
        inputs=_struct(row["inputs"]),
    )


def burst_worker_message(row: dict[str, Any]) -> scheduler_pb2.BurstWorker:
    return scheduler_pb2.BurstWorker(
        burst_worker_id=row["burst_worker_id"],
        pool=row["pool"],
        provider=row["provider"],
        capacity_type=row["capacity_type"],
        provider_ref=row["provider_ref"],
        state=row["state"],
        slots=row["slots"],
        cost_per_hour=row["cost_per_hour"],
        leader=row["leader"],
        reason=row["reason"],
        requested_at=timestamp_of(row["requested_at"]),
        registered_at=timestamp_of(row["registered_at"]),
        draining_at=timestamp_of(row["draining_at"]),
        terminated_at=timestamp_of(row["terminated_at"]),
        cost=row["cost"],
    )


class SchedulerAdminService(scheduler_pb2_grpc.SchedulerAdminServiceServicer):
    """Authenticates each call from the ``authorization`` metadata entry (as JobService does),
    then delegates to ``admin``."""

    def __init__(
        self, admin: SchedulerAdmin, authenticate: Callable[[str | None], Awaitable[Caller]]
    ) -> None:
        self._admin = admin
        self._authenticate = authenticate

    async def _caller(self, context: grpc.aio.ServicerContext) -> Caller:
        header = next((str(v) for k, v in context.invocation_metadata() or () if k == "authorization"), None)
        return await self._authenticate(header)

    async def ListPools(
        self, request: scheduler_pb2.ListPoolsRequest, context: grpc.aio.ServicerContext
    ) -> scheduler_pb2.ListPoolsResponse:
        pools = await self._admin.pools(await self._caller(context))
        return scheduler_pb2.ListPoolsResponse(
            pools=[
                scheduler_pb2.Pool(
                    name=p["name"],
                    config=_struct(p["config"]),
                    live_workers=p["live_workers"],
                    spend_per_hour=p["spend_per_hour"],
                    cost=p["cost"],
                    launched=p["launched"],
                    latest_decision=decision_message(p["latest_decision"]),
                )
                for p in pools
            ]
        )

    async def ListBurstWorkers(
        self, request: scheduler_pb2.ListBurstWorkersRequest, context: grpc.aio.ServicerContext
    ) -> scheduler_pb2.ListBurstWorkersResponse:
        rows = await self._admin.burst_workers(
            await self._caller(context), pool=request.pool, live_only=request.live_only, limit=request.limit
        )
        return scheduler_pb2.ListBurstWorkersResponse(burst_workers=[burst_worker_message(r) for r in rows])

    async def ListScalingDecisions(
        self, request: scheduler_pb2.ListScalingDecisionsRequest, context: grpc.aio.ServicerContext
    ) -> scheduler_pb2.ListScalingDecisionsResponse:
        rows = await self._admin.decisions(
            await self._caller(context),
            pool=request.pool,
            limit=request.limit,
            before_id=request.before_decision_id,
        )
        return scheduler_pb2.ListScalingDecisionsResponse(decisions=[decision_message(r) for r in rows])
