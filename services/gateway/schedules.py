"""Schedules (REST ``/v1/schedules``; issue 25 item 2, ADR 0072): an account's recurring work —
create one (its ``spec`` checked now, as the request each tick makes would be), list, read,
pause, resume, trigger, delete, and read its runs. The rows and the tick rules are
:mod:`hypermedia.jobs.schedules`'; :class:`~services.gateway.schedule_runner.ScheduleRunner`
polls and runs them."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import asyncpg

from hypermedia.core import pgtext
from hypermedia.core.errors import InvalidArgument, NotFound, PermissionDenied
from hypermedia.jobs import schedules
from hypermedia.jobs import secrets as jobsecrets
from hypermedia.jobs.accounts import Caller
from hypermedia.jobs.schedules import Run, Schedule
from services.gateway.backfills import Backfills, RunRequest
from services.gateway.creation import JobCreation
from services.gateway.ids import canonical_uuid
from services.gateway.process_request import check_priority, check_text, parse_operations

MAX_OBJECTS = 100
"""Most objects a process schedule names (each tick makes a request per object)."""
MAX_RETENTION_DAYS = 3650


@dataclass(frozen=True)
class ScheduleRequest:
    """A create request as the transports hand it over: exactly one of ``process``, ``backfill``
    and ``maintenance``."""

    name: str
    cron: str
    time_zone: str = "UTC"
    missed: str = "skip"
    catch_up_limit: int = 1
    paused: bool = False
    process: dict[str, Any] | None = None
    """``{object_ids: [...], operations: [...], priority?}``: a process request per object."""
    backfill: dict[str, Any] | None = None
    """``{selector: {...}, priority?, max_rate_per_second?}``: a backfill run (docs/api.md)."""
    maintenance: dict[str, Any] | None = None
    """``{task, older_than_days?}``: one of :data:`hypermedia.jobs.schedules.TASKS` (admins only)."""


def _invalid(message: str, code: str = "INVALID_SCHEDULE") -> InvalidArgument:
    return InvalidArgument(message, code)


class Schedules:
    """The schedule use case. Args: pool; job creation (a process schedule's operations checked
    as a preset's); backfills (a backfill schedule's selector checked by a dry run)."""

    def __init__(self, pool: asyncpg.Pool, creation: JobCreation, backfills: Backfills) -> None:
        self._pool = pool
        self._creation = creation
        self._backfills = backfills

    async def create(self, caller: Caller, request: ScheduleRequest) -> Schedule:
        """Stores the schedule; its first tick is the first after now.

        Raises:
            InvalidArgument: ``INVALID_SCHEDULE`` (a bad name, none or several of process,
                backfill and maintenance, a bad spec, policy or limit), ``INVALID_CRON``,
                ``INVALID_TIME_ZONE``, and what the spec's check raises (``UNKNOWN_OPERATION``,
                ``INVALID_PARAMS``, ``INVALID_SELECTOR``, ``INVALID_PRIORITY``, …).
            PermissionDenied: a maintenance schedule of an account that is not an admin.
            Conflict: ``SCHEDULE_EXISTS``, ``TOO_MANY_SCHEDULES`` (the account has
                :data:`~hypermedia.jobs.schedules.MAX_SCHEDULES`).
            NotFound: a process schedule's object that is not the caller's.
        """
        self._check_name(request.name)
        pgtext.check(request.cron, "cron", 100)
        pgtext.check(request.time_zone, "time_zone", 64)
        given = [k for k in ("process", "backfill", "maintenance") if getattr(request, k) is not None]
        if len(given) != 1:
            raise _invalid("a schedule runs exactly one of process, backfill or maintenance")
        kind = given[0]
        schedules.check_cron(request.cron, request.time_zone)
        if kind == "process":
            spec = await self._process_spec(caller, request.process or {})
        elif kind == "backfill":
            spec = await self._backfill_spec(caller, request.backfill or {})
        else:
            if not caller.is_admin:
                raise PermissionDenied("maintenance schedules are for admin accounts", "PERMISSION_DENIED")
            spec = self._maintenance_spec(request.maintenance or {})
        return await schedules.create(
            self._pool,
            caller.account_id,
            request.name,
            request.cron,
            request.time_zone,
            kind,
            spec,
            missed=request.missed,
            catch_up_limit=request.catch_up_limit,
            paused=request.paused,
        )

    async def list_schedules(self, caller: Caller) -> list[tuple[Schedule, Run | None]]:
        """The caller's schedules by name, each with its latest run."""
        found = await schedules.list_schedules(self._pool, caller.account_id)
        last = await schedules.last_runs(self._pool, [s.schedule_id for s in found])
        return [(s, last.get(s.schedule_id)) for s in found]

    async def get(self, caller: Caller, name: str) -> tuple[Schedule, Run | None]:
        """The caller's schedule with its latest run. Raises NotFound (``SCHEDULE_NOT_FOUND``)."""
        schedule = await schedules.get(self._pool, caller.account_id, self._name(name))
        last = await schedules.last_runs(self._pool, [schedule.schedule_id])
        return schedule, last.get(schedule.schedule_id)

    async def set_paused(self, caller: Caller, name: str, paused: bool) -> tuple[Schedule, Run | None]:
        """Pauses or resumes it; returns it. Raises NotFound."""
        await schedules.set_paused(self._pool, caller.account_id, self._name(name), paused)
        return await self.get(caller, name)

    async def delete(self, caller: Caller, name: str) -> None:
        """Deletes it and its run history. Raises NotFound."""
        await schedules.delete(self._pool, caller.account_id, self._name(name))

    async def trigger(self, caller: Caller, name: str) -> Run:
        """A run now (``manual``), whatever its cron and even paused. Raises NotFound, Conflict
        (``SCHEDULE_BUSY``) while its last manual run is pending or running."""
        return await schedules.trigger(self._pool, caller.account_id, self._name(name))

    async def runs(self, caller: Caller, name: str, limit: int = 50) -> list[Run]:
        """Its runs, latest due first, at most ``limit`` (1-1000). Raises NotFound."""
        schedule = await schedules.get(self._pool, caller.account_id, self._name(name))
        return await schedules.runs(self._pool, schedule.schedule_id, max(1, min(limit, 1000)))

    # -- checks -----------------------------------------------------------------------------

    @staticmethod
    def _check_name(name: str) -> None:
        pgtext.check(name, "name", schedules.MAX_NAME_LENGTH)
        schedules.check_name(name)

    @staticmethod
    def _name(name: str) -> str:
        """A name from a path; one that cannot be a schedule's is one that does not exist."""
        if not schedules.NAME.fullmatch(name):
            raise NotFound("no such schedule", "SCHEDULE_NOT_FOUND")
        return name

    async def _process_spec(self, caller: Caller, raw: dict[str, Any]) -> dict[str, Any]:
        """``{object_ids, operations, priority}`` normalised: 1 to :data:`MAX_OBJECTS` of the
        caller's object ids, the operations as a process request's (at most
        ``HM_MAX_OPERATIONS``, no password), each checked as a preset is, and each named preset
        one the caller has (``UNKNOWN_PRESET``; the run takes its version active then). The
        priority band of the account's quota is checked when a run makes its requests."""
        if set(raw) - {"object_ids", "operations", "priority"}:
            raise _invalid("process takes object_ids, operations and priority")
        ids = raw.get("object_ids")
        if not isinstance(ids, list) or not 1 <= len(ids) <= MAX_OBJECTS:
            raise _invalid(f"process.object_ids must list 1 to {MAX_OBJECTS} objects")
        object_ids: dict[str, None] = {}  # in order, once each
        for value in ids:
            canonical = canonical_uuid(value) if isinstance(value, str) else None
            if canonical is None:
                raise _invalid(f"process.object_ids: {str(value)[:64]!r} is not an object id")
            object_ids[canonical] = None
        operations = parse_operations(raw.get("operations"))
        check_text(operations, None)
        if len(operations) > self._creation.max_operations:
            raise _invalid(f"process.operations: at most {self._creation.max_operations} operations")
        await self._creation.expand_presets(caller, operations)  # UNKNOWN_PRESET
        for op in operations:
            if jobsecrets.PASSWORD_PARAM in op.params:
                raise _invalid(
                    "a schedule cannot hold a password: process the document with a request of its own"
                )
            if op.name:
                await self._creation.check_preset(op.name, op.params)
        priority = check_priority(raw.get("priority"))
        for object_id in object_ids:  # each the caller's, now (NOT_FOUND otherwise)
            await self._creation.owned_object(caller, object_id)
        return {
            "object_ids": list(object_ids),
            "operations": raw["operations"],
            "priority": priority,
        }

    async def _backfill_spec(self, caller: Caller, raw: dict[str, Any]) -> dict[str, Any]:
        """A backfill run's request, checked by a dry run now (the selector may match nothing yet)."""
        if set(raw) - {"selector", "priority", "max_rate_per_second"}:
            raise _invalid("backfill takes selector, priority and max_rate_per_second")
        selector = raw.get("selector")
        if not isinstance(selector, dict):
            raise _invalid("backfill.selector must be an object (as POST /v1/backfills takes)")
        if set(selector) - {"operation", "params", "preset", "scope", "object_ids"}:
            raise _invalid("backfill.selector takes operation, params, preset, scope and object_ids")
        await self._backfills.create(caller, backfill_request(raw, dry_run=True))
        return {k: v for k, v in raw.items() if v is not None}

    @staticmethod
    def _maintenance_spec(raw: dict[str, Any]) -> dict[str, Any]:
        task = raw.get("task")
        if task not in schedules.TASKS:
            raise _invalid(f"maintenance.task must be one of {', '.join(schedules.TASKS)}")
        if task == "reconcile_holds":
            if set(raw) - {"task"}:
                raise _invalid("reconcile_holds takes no other field")
            return {"task": task}
        if set(raw) - {"task", "older_than_days"}:
            raise _invalid(f"{task} takes older_than_days")
        days = raw.get("older_than_days")
        try:
            number = float(days) if isinstance(days, int | float) and not isinstance(days, bool) else math.nan
        except OverflowError:  # an integer beyond any float
            number = math.inf
        if not (math.isfinite(number) and 0 < number <= MAX_RETENTION_DAYS):
            raise _invalid(
                f"maintenance.older_than_days must be a number above 0, at most {MAX_RETENTION_DAYS}"
            )
        return {"task": task, "older_than_days": number}


def backfill_request(spec: dict[str, Any], *, dry_run: bool = False) -> RunRequest:
    """A backfill schedule's spec as the run request each tick makes. Raises InvalidArgument
    (``INVALID_SELECTOR``) for a selector whose fields have the wrong types."""
    selector = spec.get("selector") or {}
    object_ids = selector.get("object_ids")
    priority = spec.get("priority")
    if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int)):
        raise _invalid("backfill.priority must be an integer from 7 to 10", "INVALID_PRIORITY")
    rate = spec.get("max_rate_per_second")
    if rate is not None:
        if isinstance(rate, bool) or not isinstance(rate, int | float):
            raise _invalid("backfill.max_rate_per_second must be a number", "INVALID_RATE")
        try:
            rate = float(rate)
        except OverflowError:
            raise _invalid("backfill.max_rate_per_second is out of range", "INVALID_RATE") from None
    try:
        return RunRequest(
            operation=_optional(selector.get("operation"), str),
            params=_optional(selector.get("params"), dict),
            preset=_optional(selector.get("preset"), str),
            scope=_optional(selector.get("scope"), str) or "outdated",
            object_ids=list(object_ids) if isinstance(object_ids, list) else _optional(object_ids, list),
            priority=priority,
            rate_per_second=rate,
            dry_run=dry_run,
        )
    except TypeError as exc:
        raise _invalid(f"backfill: {exc}", "INVALID_SELECTOR") from None


def _optional(value: Any, kind: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, kind):
        raise TypeError(f"{value!r} has the wrong type")
    return value
