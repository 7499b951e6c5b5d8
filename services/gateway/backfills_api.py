"""REST routes of the caller's backfill runs (docs/api.md "Backfill runs"): ``POST /v1/backfills``
(``dry_run`` answers the count and the estimate), ``GET /v1/backfills`` and
``/v1/backfills/{id}``, and ``POST /v1/backfills/{id}:pause``, ``:resume``, ``:cancel`` and
``:replay``, over :class:`~services.gateway.backfills.Backfills`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, Literal

from fastapi import APIRouter, Depends, Query, Response
from pydantic import BaseModel, ConfigDict, Field, model_validator

from hypermedia.core import pgtext
from hypermedia.jobs.accounts import Caller
from hypermedia.jobs.backfill.runs import Run
from hypermedia.jobs.backfill.selection import Estimate
from services.gateway.backfills import Backfills, RunRequest


def credits(millicredits: int | None) -> float | None:
    """Millicredits as credits (three decimals), as every REST amount."""
    return None if millicredits is None else round(millicredits / 1000, 3)


class SelectorIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    operation: str | None = Field(None, description="An operation; or preset, not both")
    params: dict[str, Any] | None = Field(
        None, description="Its params; left out: each outdated output's own (scope outdated) or the defaults"
    )
    preset: str | None = Field(None, description="One of the caller's presets (its active version)")
    scope: Literal["outdated", "all"] = Field(
        "outdated", description="Outdated outputs only, or every object"
    )
    object_ids: list[str] | None = Field(None, description="Only these objects (at most 1,000)")
    created_after: datetime | None = Field(
        None, description="Only objects uploaded at or after (with a zone)"
    )
    created_before: datetime | None = Field(None, description="Only objects uploaded before (with a zone)")


class BackfillIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _storable_text(cls, data: Any) -> Any:
        """Every string and key under :mod:`hypermedia.core.pgtext`'s rule before any field is
        read, as a process request's body (``services/gateway/rest.py``): 422 ``INVALID_REQUEST``
        naming the field for a NUL or a lone surrogate."""
        pgtext.check_json(data)
        return data

    selector: SelectorIn
    priority: int | None = Field(None, description="7-10 (the bulk queue's bands), default 8")
    max_rate_per_second: float | None = Field(None, description="Jobs a second, 0.01-1000, default 10")
    deadline: datetime | None = Field(None, description="Stop enqueuing then (state expired)")
    dry_run: bool = Field(False, description="Answer the count and the estimate; create nothing")


def run_json(run: Run) -> dict[str, Any]:
    """A run as REST shows it (docs/api.md "Backfill runs")."""
    s, p = run.selector, run.progress
    return {
        "run_id": run.run_id,
        "state": run.state,
        "reason_code": run.reason_code,
        "reason": run.reason,
        "waiting_reason": run.waiting_reason,
        "selector": {
            "operation": s.operation,
            "params": s.params,
            "preset": {"name": s.preset[0], "version": s.preset[1]} if s.preset else None,
            "scope": "outdated" if s.outdated_only else "all",
            "object_ids": list(s.object_ids) if s.object_ids is not None else None,
            "created_after": s.created_after.isoformat() if s.created_after else None,
            "created_before": s.created_before.isoformat() if s.created_before else None,
        },
        "target_version": run.target_version,
        "priority": run.priority,
        "max_rate_per_second": run.rate_per_second,
        "deadline": run.deadline.isoformat() if run.deadline else None,
        "progress": {
            "matched": p.matched,
            "pending": p.pending,
            "enqueued": p.enqueued,
            "existing": p.existing,
            "skipped": p.skipped,
            "in_flight": p.in_flight,
            "completed": p.completed,
            "failed": p.failed,
            "cancelled": p.cancelled,
        },
        "estimated_credits": credits(p.estimated_millicredits),
        "charged_credits": credits(p.charged_millicredits),
        "braked_seconds": run.braked_seconds,
        "created_at": run.created_at.isoformat(),
        "updated_at": run.updated_at.isoformat(),
        "ended_at": run.ended_at.isoformat() if run.ended_at else None,
    }


def estimate_json(estimate: Estimate) -> dict[str, Any]:
    """A dry run's answer."""
    return {
        "dry_run": True,
        "matched": estimate.matched,
        "existing": estimate.existing,
        "to_enqueue": estimate.to_enqueue,
        "estimated_credits": credits(estimate.estimated_millicredits),
        "available_credits": credits(estimate.available_millicredits),
        "estimated_seconds": estimate.estimated_seconds,
        "fits_deadline": estimate.fits_deadline,
        "target_version": estimate.target_version,
    }


def run_request(body: BackfillIn) -> RunRequest:
    """The body as the use case takes it."""
    s = body.selector
    return RunRequest(
        operation=s.operation,
        params=s.params,
        preset=s.preset,
        scope=s.scope,
        object_ids=s.object_ids,
        created_after=s.created_after,
        created_before=s.created_before,
        priority=body.priority,
        rate_per_second=body.max_rate_per_second,
        deadline=body.deadline,
        dry_run=body.dry_run,
    )


def router(backfills: Backfills, caller: Callable[..., Awaitable[Caller]]) -> APIRouter:
    """The routes; ``caller`` is the app's authenticating dependency (401 without a valid key)."""
    routes = APIRouter(prefix="/v1/backfills", tags=["backfills"])

    @routes.post("")
    async def create_backfill(
        body: BackfillIn, response: Response, who: Caller = Depends(caller)
    ) -> dict[str, Any]:
        """Create a run (201) or, with ``dry_run``, answer its count and estimate (200). 402 when
        the account's credits do not cover its first job; 422 for a bad selector."""
        made = await backfills.create(who, run_request(body))
        if isinstance(made, Estimate):
            return estimate_json(made)
        response.status_code = 201
        return run_json(made)

    @routes.get("")
    async def list_backfills(
        limit: int = Query(50, ge=1, le=1000), who: Caller = Depends(caller)
    ) -> dict[str, Any]:
        """The caller's runs, newest first."""
        return {"runs": [run_json(r) for r in await backfills.list(who, limit)]}

    @routes.get("/{run_id}")
    async def get_backfill(run_id: str, who: Caller = Depends(caller)) -> dict[str, Any]:
        """A run with its progress; 404 ``RUN_NOT_FOUND``."""
        return run_json(await backfills.get(who, run_id))

    @routes.post("/{run_id}:pause")
    async def pause_backfill(run_id: str, who: Caller = Depends(caller)) -> dict[str, Any]:
        """Stop enqueuing; 409 ``RUN_NOT_PAUSABLE`` unless running (or paused already)."""
        return run_json(await backfills.pause(who, run_id))

    @routes.post("/{run_id}:resume")
    async def resume_backfill(run_id: str, who: Caller = Depends(caller)) -> dict[str, Any]:
        """Enqueue again; 409 ``RUN_NOT_RESUMABLE`` or ``RUN_DEADLINE_PASSED``."""
        return run_json(await backfills.resume(who, run_id))

    @routes.post("/{run_id}:cancel")
    async def cancel_backfill(run_id: str, who: Caller = Depends(caller)) -> dict[str, Any]:
        """End the run and cancel its jobs that have not started; 409 ``RUN_NOT_CANCELLABLE``."""
        return run_json(await backfills.cancel(who, run_id))

    @routes.post("/{run_id}:replay")
    async def replay_backfill(run_id: str, who: Caller = Depends(caller)) -> dict[str, Any]:
        """Enqueue again the items whose job failed; 409 ``RUN_NOT_REPLAYABLE``."""
        run, replayed = await backfills.replay(who, run_id)
        return {"replayed": replayed, "run": run_json(run)}

    return routes
