"""The caller's presets (REST ``/v1/presets``): put, read, list and delete, over
:mod:`hypermedia.jobs.presets`, with each preset checked as a process request of it would be
(:meth:`services.gateway.creation.JobCreation.check_preset`)."""

from __future__ import annotations

import uuid
from typing import Any

import asyncpg

from hypermedia.core.errors import InvalidArgument, NotFound
from hypermedia.jobs import presets
from hypermedia.jobs.accounts import Caller
from services.gateway.creation import JobCreation


class Presets:
    """Use case: an account's named presets."""

    def __init__(self, pool: asyncpg.Pool, creation: JobCreation) -> None:
        self._pool = pool
        self._creation = creation

    async def put(
        self, caller: Caller, name: str, operation: str, params: dict[str, Any]
    ) -> tuple[dict[str, Any], bool]:
        """Make ``operation`` with ``params`` the active version of preset ``name``; returns the
        active row and whether it is a new version. Raises InvalidArgument (``INVALID_PRESET_NAME``,
        ``TOO_MANY_PRESETS``, or what :meth:`JobCreation.check_preset` raises)."""
        self._name(name)
        await self._creation.check_preset(operation, params)
        async with self._pool.acquire() as conn:
            try:
                return await presets.put(conn, uuid.UUID(caller.account_id), name, operation, params)
            except ValueError as exc:
                raise InvalidArgument(str(exc), "TOO_MANY_PRESETS") from None

    async def get(self, caller: Caller, name: str) -> dict[str, Any]:
        """The active version of preset ``name``. Raises NotFound (``PRESET_NOT_FOUND``)."""
        self._name(name)
        async with self._pool.acquire() as conn:
            found = await presets.active(conn, uuid.UUID(caller.account_id), [name])
        if name not in found:
            raise NotFound(f"no preset {name!r}", "PRESET_NOT_FOUND")
        return found[name]

    async def list(self, caller: Caller) -> list[dict[str, Any]]:
        """The caller's active presets, by name."""
        async with self._pool.acquire() as conn:
            return await presets.list_active(conn, uuid.UUID(caller.account_id))

    async def delete(self, caller: Caller, name: str) -> None:
        """Leave preset ``name`` without an active version. Raises NotFound (``PRESET_NOT_FOUND``)."""
        self._name(name)
        async with self._pool.acquire() as conn:
            if not await presets.delete(conn, uuid.UUID(caller.account_id), name):
                raise NotFound(f"no preset {name!r}", "PRESET_NOT_FOUND")

    @staticmethod
    def _name(name: str) -> None:
        try:
            presets.check_name(name)
        except ValueError as exc:
            raise InvalidArgument(str(exc), "INVALID_PRESET_NAME") from None
