"""REST routes of the caller's presets (docs/api.md "Presets"): ``PUT``, ``GET`` and ``DELETE
/v1/presets/{name}`` and ``GET /v1/presets``, over :class:`~services.gateway.presets.Presets`.
A process request names one with ``{"preset": name}``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Response
from pydantic import BaseModel, ConfigDict, Field

from hypermedia.jobs.accounts import Caller
from hypermedia.jobs.presets import NAME
from services.gateway.presets import Presets


class PresetIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    operation: str = Field(
        description="An operation name, as in a process request",
        json_schema_extra={"minLength": 1, "maxLength": 64},
    )
    params: dict[str, Any] = Field(default_factory=dict, description="Its params (no password)")


PresetName = Annotated[
    str, Path(description="The preset's name", json_schema_extra={"pattern": f"^{NAME.pattern}$"})
]
"""A preset's name in a path: its pattern documented; checked by the presets (``INVALID_PRESET_NAME``)."""


class PresetOut(BaseModel):
    name: str
    version: int = Field(description="1 for the first; each change makes the next")
    operation: str
    params: dict[str, Any]
    created_at: datetime = Field(description="When this version was made")


def router(presets: Presets, caller: Callable[..., Awaitable[Caller]]) -> APIRouter:
    """The routes; ``caller`` is the app's authenticating dependency (401 without a valid key)."""
    routes = APIRouter(prefix="/v1/presets", tags=["presets"])

    @routes.put(
        "/{name}",
        response_model=PresetOut,
        responses={201: {"model": PresetOut, "description": "a new version"}},
    )
    async def put_preset(
        name: PresetName, body: PresetIn, response: Response, who: Caller = Depends(caller)
    ) -> dict[str, Any]:
        """Make the operation and params the preset's active version: 201 with a new version, 200
        when they are what is active already. The params are checked as a process request's."""
        preset, created = await presets.put(who, name, body.operation, body.params)
        response.status_code = 201 if created else 200
        return preset

    @routes.get("", response_model=dict[str, list[PresetOut]])
    async def list_presets(who: Caller = Depends(caller)) -> dict[str, Any]:
        """The caller's presets (their active versions), by name."""
        return {"presets": await presets.list(who)}

    @routes.get("/{name}", response_model=PresetOut)
    async def get_preset(name: PresetName, who: Caller = Depends(caller)) -> dict[str, Any]:
        """The preset's active version; 404 ``PRESET_NOT_FOUND``."""
        return await presets.get(who, name)

    @routes.delete("/{name}", status_code=204)
    async def delete_preset(name: PresetName, who: Caller = Depends(caller)) -> Response:
        """Leave the preset without an active version (requests naming it get 422
        ``UNKNOWN_PRESET``; a later PUT makes the next version); 404 ``PRESET_NOT_FOUND``."""
        await presets.delete(who, name)
        return Response(status_code=204)

    return routes
