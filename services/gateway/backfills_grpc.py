"""gRPC ``hypermedia.jobs.v1.BackfillService``: the backfill-run use case
(:class:`~services.gateway.backfills.Backfills`) as REST has it, its results rendered into
``jobs.v1`` messages (credits as decimal strings, times as Timestamps)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import grpc
from google.protobuf import json_format

from hypermedia.api.jobs.v1 import backfill_pb2, backfill_pb2_grpc
from hypermedia.jobs.accounts import Caller
from hypermedia.jobs.backfill.runs import Run
from hypermedia.jobs.backfill.selection import Estimate
from services.gateway.backfills import Backfills, RunRequest
from services.gateway.grpc_api import _plain, _struct, authenticated, credits_text, time_of, timestamp_of

SERVICE_NAME = "hypermedia.jobs.v1.BackfillService"
_SCOPES = {
    backfill_pb2.BACKFILL_SCOPE_UNSPECIFIED: "outdated",
    backfill_pb2.BACKFILL_SCOPE_OUTDATED: "outdated",
    backfill_pb2.BACKFILL_SCOPE_ALL: "all",
}


def run_message(run: Run) -> backfill_pb2.BackfillRun:
    """A run as a ``BackfillRun``."""
    s, p = run.selector, run.progress
    return backfill_pb2.BackfillRun(
        run_id=run.run_id,
        state=run.state,
        reason_code=run.reason_code or "",
        reason=run.reason or "",
        waiting_reason=run.waiting_reason or "",
        selector=backfill_pb2.BackfillSelector(
            operation=s.operation,
            params=_struct(s.params) if s.params is not None else None,
            preset=s.preset[0] if s.preset else "",
            preset_version=s.preset[1] if s.preset else 0,
            scope=backfill_pb2.BACKFILL_SCOPE_OUTDATED
            if s.outdated_only
            else backfill_pb2.BACKFILL_SCOPE_ALL,
            object_ids=list(s.object_ids or ()),
            created_after=timestamp_of(s.created_after),
            created_before=timestamp_of(s.created_before),
        ),
        target_version=run.target_version,
        priority=run.priority,
        max_rate_per_second=run.rate_per_second,
        deadline=timestamp_of(run.deadline),
        progress=backfill_pb2.BackfillProgress(
            matched=p.matched,
            pending=p.pending,
            enqueued=p.enqueued,
            existing=p.existing,
            skipped=p.skipped,
            in_flight=p.in_flight,
            completed=p.completed,
            failed=p.failed,
            cancelled=p.cancelled,
        ),
        estimated_credits=credits_text(p.estimated_millicredits),
        charged_credits=credits_text(p.charged_millicredits),
        braked_seconds=run.braked_seconds,
        planned_credits=credits_text(run.planned_millicredits),
        created_at=timestamp_of(run.created_at),
        updated_at=timestamp_of(run.updated_at),
        ended_at=timestamp_of(run.ended_at),
    )


def estimate_message(estimate: Estimate) -> backfill_pb2.BackfillEstimate:
    """A dry run's answer as a ``BackfillEstimate``."""
    return backfill_pb2.BackfillEstimate(
        matched=estimate.matched,
        existing=estimate.existing,
        to_enqueue=estimate.to_enqueue,
        estimated_credits=credits_text(estimate.estimated_millicredits),
        available_credits=credits_text(estimate.available_millicredits),
        estimated_seconds=estimate.estimated_seconds,
        fits_deadline=bool(estimate.fits_deadline),
        target_version=estimate.target_version,
    )


def run_request(request: backfill_pb2.CreateBackfillRunRequest) -> RunRequest:
    """The request as the use case takes it (zero values as "not given")."""
    s = request.selector
    return RunRequest(
        operation=s.operation or None,
        params=_plain(json_format.MessageToDict(s.params)) if s.HasField("params") else None,
        preset=s.preset or None,
        scope=_SCOPES.get(s.scope, "unknown"),
        object_ids=list(s.object_ids) or None,
        created_after=time_of(s, "created_after"),
        created_before=time_of(s, "created_before"),
        priority=request.priority or None,
        rate_per_second=request.max_rate_per_second or None,
        deadline=time_of(request, "deadline"),
        dry_run=request.dry_run,
    )


class BackfillService(backfill_pb2_grpc.BackfillServiceServicer):
    """Authenticates each call from the ``authorization`` metadata entry, then delegates."""

    def __init__(self, backfills: Backfills, authenticate: Callable[[str | None], Awaitable[Caller]]) -> None:
        self._backfills = backfills
        self._authenticate = authenticate

    async def _caller(self, context: grpc.aio.ServicerContext, *, write: bool = True) -> Caller:
        return await authenticated(context, self._authenticate, write=write)

    async def CreateBackfillRun(
        self, request: backfill_pb2.CreateBackfillRunRequest, context: grpc.aio.ServicerContext
    ) -> backfill_pb2.CreateBackfillRunResponse:
        caller = await self._caller(context)
        made = await self._backfills.create(caller, run_request(request))
        if isinstance(made, Estimate):
            return backfill_pb2.CreateBackfillRunResponse(estimate=estimate_message(made))
        return backfill_pb2.CreateBackfillRunResponse(run=run_message(made))

    async def GetBackfillRun(
        self, request: backfill_pb2.GetBackfillRunRequest, context: grpc.aio.ServicerContext
    ) -> backfill_pb2.GetBackfillRunResponse:
        caller = await self._caller(context, write=False)
        return backfill_pb2.GetBackfillRunResponse(
            run=run_message(await self._backfills.get(caller, request.run_id))
        )

    async def ListBackfillRuns(
        self, request: backfill_pb2.ListBackfillRunsRequest, context: grpc.aio.ServicerContext
    ) -> backfill_pb2.ListBackfillRunsResponse:
        caller = await self._caller(context, write=False)
        found = await self._backfills.list(caller, request.page_size or 50)
        return backfill_pb2.ListBackfillRunsResponse(runs=[run_message(r) for r in found])

    async def ListBackfillItems(
        self, request: backfill_pb2.ListBackfillItemsRequest, context: grpc.aio.ServicerContext
    ) -> backfill_pb2.ListBackfillItemsResponse:
        caller = await self._caller(context, write=False)
        limit = request.page_size or 100
        found = await self._backfills.items(
            caller, request.run_id, state=request.state or None, after=request.after, limit=limit
        )
        return backfill_pb2.ListBackfillItemsResponse(
            items=[
                backfill_pb2.BackfillItem(
                    item_no=i.item_no,
                    object_id=i.object_id,
                    params=_struct(i.params),
                    state=i.state,
                    job_id=i.job_id or "",
                    job_status=i.job_status or "",
                    error_code=i.error_code or "",
                    error_message=i.error_message or "",
                    replays=i.replays,
                )
                for i in found
            ],
            next_after=found[-1].item_no if len(found) == limit else 0,
        )

    async def PauseBackfillRun(
        self, request: backfill_pb2.PauseBackfillRunRequest, context: grpc.aio.ServicerContext
    ) -> backfill_pb2.PauseBackfillRunResponse:
        caller = await self._caller(context)
        return backfill_pb2.PauseBackfillRunResponse(
            run=run_message(await self._backfills.pause(caller, request.run_id))
        )

    async def ResumeBackfillRun(
        self, request: backfill_pb2.ResumeBackfillRunRequest, context: grpc.aio.ServicerContext
    ) -> backfill_pb2.ResumeBackfillRunResponse:
        caller = await self._caller(context)
        return backfill_pb2.ResumeBackfillRunResponse(
            run=run_message(await self._backfills.resume(caller, request.run_id))
        )

    async def CancelBackfillRun(
        self, request: backfill_pb2.CancelBackfillRunRequest, context: grpc.aio.ServicerContext
    ) -> backfill_pb2.CancelBackfillRunResponse:
        caller = await self._caller(context)
        return backfill_pb2.CancelBackfillRunResponse(
            run=run_message(await self._backfills.cancel(caller, request.run_id))
        )

    async def ReplayBackfillFailures(
        self, request: backfill_pb2.ReplayBackfillFailuresRequest, context: grpc.aio.ServicerContext
    ) -> backfill_pb2.ReplayBackfillFailuresResponse:
        caller = await self._caller(context)
        run, replayed = await self._backfills.replay(caller, request.run_id)
        return backfill_pb2.ReplayBackfillFailuresResponse(run=run_message(run), replayed=replayed)
