"""gRPC ``hypermedia.jobs.v1.ScheduleService``: the schedule use case
(:class:`~services.gateway.schedules.Schedules`) as REST has it (docs/api.md "Schedules"), its
results rendered into ``jobs.v1`` messages (times as Timestamps, specs and outcomes as Structs)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import grpc
from google.protobuf import json_format

from hypermedia.api.jobs.v1 import schedules_pb2, schedules_pb2_grpc
from hypermedia.core.errors import InvalidArgument
from hypermedia.jobs.accounts import Caller
from hypermedia.jobs.schedules import Run, Schedule
from services.gateway.grpc_api import _plain, _struct, authenticated, timestamp_of
from services.gateway.schedules import ScheduleRequest, Schedules

SERVICE_NAME = "hypermedia.jobs.v1.ScheduleService"


def run_message(run: Run) -> schedules_pb2.ScheduleRun:
    """A run as a ``ScheduleRun``."""
    return schedules_pb2.ScheduleRun(
        run_id=run.run_id,
        due_at=timestamp_of(run.due_at),
        trigger=run.trigger,
        state=run.state,
        started_at=timestamp_of(run.started_at),
        finished_at=timestamp_of(run.finished_at),
        outcome=_struct(run.outcome) if run.outcome is not None else None,
        error_code=run.error_code or "",
        error=run.error or "",
    )


def schedule_message(schedule: Schedule, last: Run | None) -> schedules_pb2.Schedule:
    """A schedule as a ``Schedule``."""
    return schedules_pb2.Schedule(
        name=schedule.name,
        cron=schedule.cron,
        time_zone=schedule.time_zone,
        kind=schedule.kind,
        spec=_struct(schedule.spec),
        missed=schedule.missed,
        catch_up_limit=schedule.catch_up_limit,
        paused=schedule.paused,
        next_run_at=timestamp_of(schedule.next_run_at),
        last_run=run_message(last) if last is not None else None,
        created_at=timestamp_of(schedule.created_at),
        updated_at=timestamp_of(schedule.updated_at),
    )


def schedule_request(request: schedules_pb2.CreateScheduleRequest) -> ScheduleRequest:
    """The request as the use case takes it (zero values as the REST defaults)."""
    kind = request.WhichOneof("spec")
    spec = _plain(json_format.MessageToDict(getattr(request, kind))) if kind else None
    return ScheduleRequest(
        name=request.name,
        cron=request.cron,
        time_zone=request.time_zone or "UTC",
        missed=request.missed or "skip",
        catch_up_limit=request.catch_up_limit or 1,
        paused=request.paused,
        process=spec if kind == "process" else None,
        backfill=spec if kind == "backfill" else None,
        maintenance=spec if kind == "maintenance" else None,
    )


class ScheduleService(schedules_pb2_grpc.ScheduleServiceServicer):
    """Authenticates each call from the ``authorization`` metadata entry, then delegates."""

    def __init__(self, schedules: Schedules, authenticate: Callable[[str | None], Awaitable[Caller]]) -> None:
        self._schedules = schedules
        self._authenticate = authenticate

    async def _caller(self, context: grpc.aio.ServicerContext, *, write: bool = True) -> Caller:
        return await authenticated(context, self._authenticate, write=write)

    async def CreateSchedule(
        self, request: schedules_pb2.CreateScheduleRequest, context: grpc.aio.ServicerContext
    ) -> schedules_pb2.CreateScheduleResponse:
        caller = await self._caller(context)
        made = await self._schedules.create(caller, schedule_request(request))
        return schedules_pb2.CreateScheduleResponse(schedule=schedule_message(made, None))

    async def GetSchedule(
        self, request: schedules_pb2.GetScheduleRequest, context: grpc.aio.ServicerContext
    ) -> schedules_pb2.GetScheduleResponse:
        caller = await self._caller(context, write=False)
        return schedules_pb2.GetScheduleResponse(
            schedule=schedule_message(*await self._schedules.get(caller, request.name))
        )

    async def ListSchedules(
        self, request: schedules_pb2.ListSchedulesRequest, context: grpc.aio.ServicerContext
    ) -> schedules_pb2.ListSchedulesResponse:
        caller = await self._caller(context, write=False)
        found = await self._schedules.list_schedules(caller)
        return schedules_pb2.ListSchedulesResponse(schedules=[schedule_message(s, last) for s, last in found])

    async def PauseSchedule(
        self, request: schedules_pb2.PauseScheduleRequest, context: grpc.aio.ServicerContext
    ) -> schedules_pb2.PauseScheduleResponse:
        caller = await self._caller(context)
        return schedules_pb2.PauseScheduleResponse(
            schedule=schedule_message(*await self._schedules.set_paused(caller, request.name, True))
        )

    async def ResumeSchedule(
        self, request: schedules_pb2.ResumeScheduleRequest, context: grpc.aio.ServicerContext
    ) -> schedules_pb2.ResumeScheduleResponse:
        caller = await self._caller(context)
        return schedules_pb2.ResumeScheduleResponse(
            schedule=schedule_message(*await self._schedules.set_paused(caller, request.name, False))
        )

    async def TriggerSchedule(
        self, request: schedules_pb2.TriggerScheduleRequest, context: grpc.aio.ServicerContext
    ) -> schedules_pb2.TriggerScheduleResponse:
        caller = await self._caller(context)
        return schedules_pb2.TriggerScheduleResponse(
            run=run_message(await self._schedules.trigger(caller, request.name))
        )

    async def ListScheduleRuns(
        self, request: schedules_pb2.ListScheduleRunsRequest, context: grpc.aio.ServicerContext
    ) -> schedules_pb2.ListScheduleRunsResponse:
        caller = await self._caller(context, write=False)
        if not 0 <= request.page_size <= 1000:
            raise InvalidArgument("page_size must be 0 (50) to 1000", "INVALID_PAGE_SIZE")
        found = await self._schedules.runs(caller, request.name, request.page_size or 50)
        return schedules_pb2.ListScheduleRunsResponse(runs=[run_message(r) for r in found])

    async def DeleteSchedule(
        self, request: schedules_pb2.DeleteScheduleRequest, context: grpc.aio.ServicerContext
    ) -> schedules_pb2.DeleteScheduleResponse:
        caller = await self._caller(context)
        await self._schedules.delete(caller, request.name)
        return schedules_pb2.DeleteScheduleResponse()
