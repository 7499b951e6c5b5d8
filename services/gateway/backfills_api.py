"""REST routes of the caller's backfill runs (docs/api.md "Backfill runs"): ``POST /v1/backfills``
(``dry_run`` answers the count and the estimate), ``GET /v1/backfills`` and
``/v1/backfills/{id}``, ``GET /v1/backfills/{id}/items``, and ``POST
/v1/backfills/{id}:pause``, ``:resume``, ``:cancel`` and ``:replay``, over
:class:`~services.gateway.backfills.Backfills`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, Literal

from fastapi import APIRouter, Depends, Query, Response
from pydantic import BaseModel, ConfigDict, Field, model_validator

from hypermedia.core import pgtext
from hypermedia.jobs.accounts import Caller
from hypermedia.jobs.backfill import runs
from hypermedia.jobs.backfill.runs import Run
from hypermedia.jobs.backfill.selection import Estimate
from hypermedia.jobs.pricing import as_credits
from services.gateway.backfills import Backfills, RunRequest


class SelectorIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    operation: str | None = Field(None, description="An operation; or preset, not both")
    params: dict[str, Any] | None = Field(
        None, description="Its params; left out: each outdated output's own (scope outdated) or the defaults"
    )
    preset: str | None = Field(None, description="One of the caller's presets (its active version)")
    scope: Literal["outdated", "all"] = Field(
        "outdated", description="Outdated outputs only, or every original the caller uploaded"
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
    """A run as REST shows it (docs/api.md "Backfill runs"): :func:`runs.as_json`."""
    return runs.as_json(run)


def item_json(item: runs.ItemRow) -> dict[str, Any]:
    """One item of ``GET /v1/backfills/{id}/items``."""
    return {
        "item_no": item.item_no,
        "object_id": item.object_id,
        "params": item.params,
        "state": item.state,
        "job_id": item.job_id,
        "job_status": item.job_status,
        "error_code": item.error_code,
        "error_message": item.error_message,
        "replays": item.replays,
    }


def estimate_json(estimate: Estimate) -> dict[str, Any]:
    """A dry run's answer."""
    return {
        "dry_run": True,
        "matched": estimate.matched,
        "existing": estimate.existing,
        "to_enqueue": estimate.to_enqueue,
        "estimated_credits": as_credits(estimate.estimated_millicredits),
        "available_credits": as_credits(estimate.available_millicredits),
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

    @routes.get("/{run_id}/items")
    async def backfill_items(
        run_id: str,
        state: str | None = Query(
            None,
            description="pending, enqueued, existing or skipped; empty: every state",
            json_schema_extra={"enum": ["", "pending", "enqueued", "existing", "skipped"]},
        ),
        after: int = Query(0, ge=0, le=2**31 - 1, description="the last item_no of the previous page"),
        limit: int = Query(100, ge=1, le=1000),
        who: Caller = Depends(caller),
    ) -> dict[str, Any]:
        """The run's items in order, each with the job it created or was linked to; page with
        ``after`` (``next_after`` of the answer, null on the last page)."""
        found = await backfills.items(who, run_id, state=state, after=after, limit=limit)
        return {
            "items": [item_json(i) for i in found],
            "next_after": found[-1].item_no if len(found) == limit else None,
        }

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
