"""REST routes of the caller's schedules (docs/api.md "Schedules", ADR 0072): ``POST`` and ``GET
/v1/schedules``, ``GET`` and ``DELETE /v1/schedules/{name}``, ``POST
/v1/schedules/{name}:pause``, ``:resume`` and ``:trigger``, and ``GET
/v1/schedules/{name}/runs``, over :class:`~services.gateway.schedules.Schedules`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Path, Query, Response
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, model_validator

from hypermedia.core import pgtext
from hypermedia.jobs import schedules
from hypermedia.jobs.accounts import Caller
from services.gateway.schedules import ScheduleRequest, Schedules

ScheduleName = Annotated[
    str, Path(description="The schedule's name", json_schema_extra={"pattern": f"^{schedules.NAME.pattern}$"})
]
"""A schedule's name in a path: its pattern documented; checked by the schedules (``INVALID_SCHEDULE``)."""


class ScheduleIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _storable_text(cls, data: Any) -> Any:
        """Every string and key under :mod:`hypermedia.core.pgtext`'s rule before any field is read
        (422 ``INVALID_REQUEST`` naming the field for a NUL or a lone surrogate)."""
        pgtext.check_json(data)
        return data

    name: str = Field(
        description="1-64 letters, digits, '.', '_', '-'; unique among the caller's",
        json_schema_extra={"pattern": f"^{schedules.NAME.pattern}$"},
    )
    cron: str = Field(description="Five fields (minute hour day month weekday) or @hourly/@daily/…")
    time_zone: str | None = Field(
        "UTC", description="IANA zone the cron is read in (Europe/Berlin); null: UTC"
    )
    missed: Literal["skip", "catch_up"] = Field(
        "skip", description="Ticks missed by more than a minute: skipped, or the latest caught up"
    )
    catch_up_limit: StrictInt = Field(1, description="catch_up: how many missed ticks run at most (1-100)")
    paused: StrictBool = Field(False, description="Create it paused")
    process: dict[str, Any] | None = Field(
        None, description="{object_ids: [...], operations: [...], priority}: a process request per object"
    )
    backfill: dict[str, Any] | None = Field(
        None,
        description="{selector: {...}, priority, max_rate_per_second}: a backfill run (POST /v1/backfills)",
    )
    maintenance: dict[str, Any] | None = Field(
        None,
        description="Admin accounts: {task: prune_job_events | prune_worker_metrics | "
        "prune_webhook_deliveries | reconcile_holds, older_than_days}",
    )


class RunOut(BaseModel):
    run_id: str
    due_at: str = Field(description="The tick (or, for a manual run, when it was triggered)")
    trigger: Literal["tick", "manual"]
    state: Literal["pending", "running", "succeeded", "failed", "skipped"]
    started_at: str | None
    finished_at: str | None
    outcome: dict[str, Any] | None = Field(
        description="{job_ids, errors}, {backfill_run_id, items}, {deleted: {table: n}} or {settled: n}"
    )
    error_code: str | None
    error: str | None


class ScheduleOut(BaseModel):
    name: str
    cron: str
    time_zone: str
    kind: Literal["process", "backfill", "maintenance"]
    process: dict[str, Any] | None = Field(None, description="The spec, under its kind's name")
    backfill: dict[str, Any] | None = None
    maintenance: dict[str, Any] | None = None
    missed: Literal["skip", "catch_up"]
    catch_up_limit: int
    paused: bool
    next_run_at: str = Field(description="The next tick, UTC")
    last_run: RunOut | None
    created_at: str
    updated_at: str


class ScheduleListOut(BaseModel):
    schedules: list[ScheduleOut]


class RunListOut(BaseModel):
    runs: list[RunOut]


def router(use_case: Schedules, caller: Callable[..., Awaitable[Caller]]) -> APIRouter:
    """The routes; ``caller`` is the app's authenticating dependency (401 without a valid key)."""
    routes = APIRouter(prefix="/v1/schedules", tags=["schedules"])

    @routes.post("", status_code=201, response_model=ScheduleOut)
    async def create_schedule(body: ScheduleIn, who: Caller = Depends(caller)) -> dict[str, Any]:
        """Create a schedule (201); its first tick is the first after now. 422 ``INVALID_SCHEDULE``,
        ``INVALID_CRON``, ``INVALID_TIME_ZONE`` or what its spec's check raises; 409
        ``SCHEDULE_EXISTS``; 403 for a maintenance schedule of an account that is not an admin."""
        fields = body.model_dump()
        fields["time_zone"] = fields["time_zone"] or "UTC"
        made = await use_case.create(who, ScheduleRequest(**fields))
        return schedules.as_json(made, None)

    @routes.get("", response_model=ScheduleListOut)
    async def list_schedules(who: Caller = Depends(caller)) -> dict[str, Any]:
        """The caller's schedules by name, each with its next tick and last run."""
        return {"schedules": [schedules.as_json(s, last) for s, last in await use_case.list_schedules(who)]}

    @routes.get("/{name}", response_model=ScheduleOut)
    async def get_schedule(name: ScheduleName, who: Caller = Depends(caller)) -> dict[str, Any]:
        """A schedule; 404 ``SCHEDULE_NOT_FOUND``."""
        return schedules.as_json(*await use_case.get(who, name))

    @routes.delete("/{name}", status_code=204)
    async def delete_schedule(name: ScheduleName, who: Caller = Depends(caller)) -> Response:
        """Delete it and its run history (what its runs made stays); 404 ``SCHEDULE_NOT_FOUND``."""
        await use_case.delete(who, name)
        return Response(status_code=204)

    @routes.post("/{name}:pause", response_model=ScheduleOut)
    async def pause_schedule(name: ScheduleName, who: Caller = Depends(caller)) -> dict[str, Any]:
        """No ticks until resumed (idempotent)."""
        return schedules.as_json(*await use_case.set_paused(who, name, True))

    @routes.post("/{name}:resume", response_model=ScheduleOut)
    async def resume_schedule(name: ScheduleName, who: Caller = Depends(caller)) -> dict[str, Any]:
        """Ticks again; those missed while paused follow its ``missed`` policy."""
        return schedules.as_json(*await use_case.set_paused(who, name, False))

    @routes.post("/{name}:trigger", status_code=202, response_model=RunOut)
    async def trigger_schedule(name: ScheduleName, who: Caller = Depends(caller)) -> dict[str, Any]:
        """A run now (``manual``), paused or not; it is ``pending`` until a runner takes it."""
        return schedules.run_as_json(await use_case.trigger(who, name))

    @routes.get("/{name}/runs", response_model=RunListOut)
    async def schedule_runs(
        name: ScheduleName, limit: int = Query(50, ge=1, le=1000), who: Caller = Depends(caller)
    ) -> dict[str, Any]:
        """Its runs, latest due first: due time, trigger, state, what each made or why it failed."""
        return {"runs": [schedules.run_as_json(r) for r in await use_case.runs(who, name, limit)]}

    return routes
