"""The operators' use cases (issue 20 item 7): what the scheduler did and what it cost, for admin
accounts only (``accounts.is_admin``). Reads :mod:`hypermedia.jobs.scaling`; REST and gRPC render
it (services/gateway/operators_api.py)."""

from __future__ import annotations

from typing import Any

import asyncpg

from hypermedia.core.errors import InvalidArgument, PermissionDenied
from hypermedia.jobs import scaling
from hypermedia.jobs.accounts import Caller

MAX_POOL_NAME = 40
"""A pool's name is at most 40 characters (services/scheduler/pools.py)."""


class SchedulerAdmin:
    """Pools, burst workers and decisions of the scheduler, over ``pool`` (Postgres)."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    @staticmethod
    def _check(caller: Caller, pool: str = "", limit: int = 0) -> None:
        """Raises PermissionDenied for a caller that is not an admin, InvalidArgument for a pool
        name or limit out of range."""
        if not caller.is_admin:
            raise PermissionDenied("the operators' API is for admin accounts only")
        if len(pool) > MAX_POOL_NAME:
            raise InvalidArgument(f"pool: at most {MAX_POOL_NAME} characters", "INVALID_ARGUMENT")
        if not 0 <= limit <= scaling.MAX_LIMIT:
            raise InvalidArgument(f"limit: 0 (the default, 50) to {scaling.MAX_LIMIT}", "INVALID_ARGUMENT")

    async def pools(self, caller: Caller) -> list[dict[str, Any]]:
        """:func:`hypermedia.jobs.scaling.pools`."""
        self._check(caller)
        async with self._pool.acquire() as conn:
            return await scaling.pools(conn)

    async def burst_workers(
        self, caller: Caller, *, pool: str = "", live_only: bool = False, limit: int = 0
    ) -> list[dict[str, Any]]:
        """:func:`hypermedia.jobs.scaling.burst_workers`."""
        self._check(caller, pool, limit)
        async with self._pool.acquire() as conn:
            return await scaling.burst_workers(conn, pool=pool, live_only=live_only, limit=limit)

    async def decisions(
        self, caller: Caller, *, pool: str = "", limit: int = 0, before_id: int = 0
    ) -> list[dict[str, Any]]:
        """:func:`hypermedia.jobs.scaling.decisions`; ``before_id`` pages (0: the newest)."""
        self._check(caller, pool, limit)
        if before_id < 0:
            raise InvalidArgument("before_decision_id: 0 or a decision id", "INVALID_ARGUMENT")
        async with self._pool.acquire() as conn:
            return await scaling.decisions(conn, pool=pool, limit=limit, before_id=before_id)
