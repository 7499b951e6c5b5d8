"""Backfill runs (REST ``/v1/backfills``, gRPC ``hypermedia.jobs.v1.BackfillService``; issue 21
item 2, ADR 0058): create one (or answer a dry run), read and list them, pause, resume, cancel,
replay failures. The runs live in :mod:`hypermedia.jobs.backfill`; the gateway's
:class:`~services.gateway.backfill_runner.BackfillRunner` enqueues their items."""

from __future__ import annotations

import dataclasses
import datetime
import logging
import math
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg

from hypermedia.core.errors import DomainError, InsufficientCredits, InvalidArgument, NotFound
from hypermedia.engines.ocr import params as ocr_params
from hypermedia.intake import contenttype
from hypermedia.jobs import lifecycle, presets
from hypermedia.jobs import secrets as jobsecrets
from hypermedia.jobs.accounts import Caller
from hypermedia.jobs.backfill import runs, selection
from hypermedia.jobs.backfill.runs import Run
from hypermedia.jobs.backfill.selection import Candidate, Estimate, Selector
from hypermedia.jobs.settlement import Settlement
from services.gateway.accounts import Accounts
from services.gateway.creation import JobCreation
from services.gateway.ids import canonical_uuid
from services.gateway.process_request import check_priority

log = logging.getLogger(__name__)

SCOPES = ("outdated", "all")
"""A selector's scope: only outdated outputs' (object, params), or every object of the account."""


@dataclass(frozen=True)
class RunRequest:
    """A create request as the transports hand it over, before any check."""

    operation: str | None = None
    """An operation; or ``preset``, not both."""
    params: dict[str, Any] | None = None
    """The operation's params; None: each outdated output's own (scope ``outdated``), or the
    operation's defaults (scope ``all``). Not with a preset."""
    preset: str | None = None
    """One of the caller's presets (its active version)."""
    scope: str = "outdated"
    object_ids: list[str] | None = None
    created_after: datetime.datetime | None = None
    created_before: datetime.datetime | None = None
    priority: int | None = None
    """7-10 (the bulk queue's bands), 8 when None."""
    rate_per_second: float | None = None
    """Jobs a second, :data:`~hypermedia.jobs.backfill.selection.DEFAULT_RATE` when None."""
    deadline: datetime.datetime | None = None
    dry_run: bool = False


def _invalid(message: str, code: str = "INVALID_SELECTOR") -> InvalidArgument:
    return InvalidArgument(message, code)


def _run_id(value: str) -> str:
    """``value`` as a canonical run id; anything else is a run that does not exist."""
    canonical = canonical_uuid(value)
    if canonical is None:
        raise NotFound("no such backfill run", "RUN_NOT_FOUND")
    return canonical


def _object_id(value: str) -> str:
    canonical = canonical_uuid(value)
    if canonical is None:
        raise _invalid(f"object_ids: {str(value)[:64]!r} is not an object id")
    return canonical


def _aware(value: datetime.datetime | None, name: str) -> datetime.datetime | None:
    """``value`` in UTC. Raises InvalidArgument (``INVALID_REQUEST``) for a time without a zone or
    outside the years 1900-9999 in UTC (Postgres and Python must both hold it)."""
    if value is None:
        return None
    if value.tzinfo is None:
        raise _invalid(f"{name} must carry a time zone (e.g. 2026-01-31T00:00:00Z)", "INVALID_REQUEST")
    try:
        utc = value.astimezone(datetime.UTC)
    except OverflowError:
        utc = None
    if utc is None or not 1900 <= utc.year <= 9999:
        raise _invalid(f"{name} must be a time from 1900 to 9999", "INVALID_REQUEST")
    return utc


class Backfills:
    """The backfill-run use case. Dependencies come in through the constructor.

    Args:
        pool: the system of record (runs, items; jobs are read, and cancelled through lifecycle).
        creation: checks an operation's params as a process request's (``check_preset``).
        accounts: the account's available credits (:meth:`Accounts.balance`), for the dry run and
            the 402 of a run that could not hold its first job.
        settlement: releases the holds of the jobs a cancellation cancels.
    """

    def __init__(
        self,
        pool: asyncpg.Pool,
        creation: JobCreation,
        accounts: Accounts,
        settlement: Settlement,
    ) -> None:
        self._pool = pool
        self._creation = creation
        self._accounts = accounts
        self._settlement = settlement

    async def create(self, caller: Caller, request: RunRequest) -> Run | Estimate:
        """A dry run's :class:`Estimate`, or the created run (``running``; the runner starts at its
        next tick). The selector's items are matched now, in the order of their objects' upload.

        Raises:
            InvalidArgument: ``INVALID_SELECTOR`` (neither or both of operation and preset, params
                with a preset, an unknown scope, more than
                :data:`~hypermedia.jobs.backfill.selection.MAX_OBJECT_IDS` ids, none, or a bad one,
                ``created_after`` not before ``created_before``), ``INVALID_REQUEST`` (a time
                without a zone), ``INVALID_PRIORITY`` (outside 7-10), ``INVALID_RATE`` (outside
                0.01-1000 jobs a second), ``INVALID_DEADLINE`` (not in the future),
                ``UNKNOWN_PRESET``, what a preset's check raises for the operation and params
                (``UNKNOWN_OPERATION``, ``INVALID_PARAMS``, ``OPERATION_NOT_ENABLED``),
                ``RUN_TOO_LARGE`` (more than
                :data:`~hypermedia.jobs.backfill.selection.MAX_ITEMS` items).
            InsufficientCredits: (not for a dry run) the account's available credits do not
                cover the run's first job; nothing is created.
        """
        selector, rate, priority, deadline = await self._checked(caller, request)
        profile = await self._pool.fetchrow(
            "SELECT version, queue, input_kinds, max_input_bytes, base_cost, per_mb FROM processing_profiles"
            " WHERE active AND operation = $1",
            selector.operation,
        )
        if profile is None:
            raise InvalidArgument(f"unknown operation {selector.operation!r}", "UNKNOWN_OPERATION")
        found = await selection.candidates(self._pool, caller.account_id, selector, profile["version"])
        items = [c for c in found if _accepted(c, profile)]
        if len(found) > selection.MAX_ITEMS:
            raise InvalidArgument(
                f"the selector matches more than {selection.MAX_ITEMS} objects: narrow it by"
                " created_after/created_before and make several runs",
                "RUN_TOO_LARGE",
            )
        estimate = await selection.estimate(
            self._pool, caller.account_id, selector, items, profile, rate, deadline
        )
        available = (await self._accounts.balance(caller)).available_millicredits
        estimate = dataclasses.replace(estimate, available_millicredits=available)
        if request.dry_run:
            return estimate
        first = estimate.first_job_millicredits
        if first is not None and first > available:
            raise InsufficientCredits(
                f"the run's first job needs {first / 1000:.3f} credits and {available / 1000:.3f} are"
                " available: nothing was created",
                "INSUFFICIENT_CREDITS",
            )
        async with self._pool.acquire() as conn, conn.transaction():
            run_id = await runs.create(
                conn,
                caller.account_id,
                selector,
                items,
                target_version=profile["version"],
                priority=priority,
                rate_per_second=rate,
                deadline=deadline,
                planned_millicredits=estimate.estimated_millicredits,
            )
        return await runs.get(self._pool, run_id, caller.account_id)

    async def get(self, caller: Caller, run_id: str) -> Run:
        """The caller's run with its progress. Raises NotFound (``RUN_NOT_FOUND``)."""
        return await runs.get(self._pool, _run_id(run_id), caller.account_id)

    async def list(self, caller: Caller, limit: int = 50) -> list[Run]:
        """The caller's runs, newest first, at most ``limit`` (1-1000)."""
        return await runs.list_runs(self._pool, caller.account_id, limit)

    async def items(
        self, caller: Caller, run_id: str, *, state: str | None = None, after: int = 0, limit: int = 100
    ) -> Sequence[runs.ItemRow]:
        """The run's items after item ``after`` (the last ``item_no`` of the previous page), at most
        ``limit`` (1-1000), of ``state`` when given (empty: every state), each with its job id and status. Raises
        NotFound (``RUN_NOT_FOUND``), InvalidArgument (``INVALID_REQUEST``) for an unknown state."""
        state = state or None  # empty: every state, as an empty kind or pool elsewhere
        if state is not None and state not in runs.ITEM_STATES:
            raise InvalidArgument(f"state must be one of {', '.join(runs.ITEM_STATES)}", "INVALID_REQUEST")
        return await runs.items(
            self._pool, _run_id(run_id), caller.account_id, state=state, after=max(0, after), limit=limit
        )

    async def pause(self, caller: Caller, run_id: str) -> Run:
        """Stop enqueuing (its jobs enqueued already go on). Raises NotFound, Conflict
        (``RUN_NOT_PAUSABLE``: only a running run pauses; pausing a paused one changes nothing)."""
        run_id = _run_id(run_id)
        async with self._pool.acquire() as conn:
            await runs.transition(conn, run_id, "pause", caller.account_id)
        return await runs.get(self._pool, run_id, caller.account_id)

    async def resume(self, caller: Caller, run_id: str) -> Run:
        """Enqueue again from where it stopped. Raises NotFound, Conflict (``RUN_NOT_RESUMABLE``,
        ``RUN_DEADLINE_PASSED``)."""
        run_id = _run_id(run_id)
        async with self._pool.acquire() as conn:
            await runs.transition(conn, run_id, "resume", caller.account_id)
        return await runs.get(self._pool, run_id, caller.account_id)

    async def cancel(self, caller: Caller, run_id: str) -> Run:
        """Stop the run for good and cancel its jobs that have not started (their holds released);
        running jobs finish. Raises NotFound, Conflict (``RUN_NOT_CANCELLABLE`` for a completed
        run)."""
        run_id = _run_id(run_id)
        async with self._pool.acquire() as conn:
            await runs.transition(conn, run_id, "cancel", caller.account_id)
        await cancel_waiting(
            self._pool, self._settlement, caller.account_id, await runs.waiting_jobs(self._pool, run_id)
        )
        return await runs.get(self._pool, run_id, caller.account_id)

    async def replay(self, caller: Caller, run_id: str) -> tuple[Run, int]:
        """Enqueue again the items whose job failed (each under a new key); returns the run and
        how many. Raises NotFound, Conflict (``RUN_NOT_REPLAYABLE``)."""
        run_id = _run_id(run_id)
        async with self._pool.acquire() as conn:
            replayed = await runs.replay_failures(conn, run_id, caller.account_id)
        return await runs.get(self._pool, run_id, caller.account_id), replayed

    # -- checks ----------------------------------------------------------------------------

    async def _checked(
        self, caller: Caller, request: RunRequest
    ) -> tuple[Selector, float, int, datetime.datetime | None]:
        """The request's selector resolved (a preset's operation and params, an operation's params
        normalised), its rate, priority and deadline; raises what :meth:`create` says."""
        if bool(request.operation) == bool(request.preset):
            raise _invalid("a selector names an operation or a preset, one of them")
        if request.preset and not presets.NAME.fullmatch(request.preset):
            raise InvalidArgument("unknown preset: not a preset's name", "UNKNOWN_PRESET")
        if request.params is not None and jobsecrets.PASSWORD_PARAM in request.params:
            raise InvalidArgument(
                "a backfill run takes no password: password-protected documents cannot be backfilled",
                "INVALID_PARAMS",
            )
        if request.preset and request.params is not None:
            raise _invalid("a preset has its params: send none with it")
        if request.scope not in SCOPES:
            raise _invalid('scope must be "outdated" or "all"')
        ids = request.object_ids
        if ids is not None and not 1 <= len(ids) <= selection.MAX_OBJECT_IDS:
            raise _invalid(
                f"object_ids takes 1 to {selection.MAX_OBJECT_IDS} ids (leave it out for every object)"
            )
        object_ids = tuple(_object_id(i) for i in ids) if ids is not None else None
        after = _aware(request.created_after, "created_after")
        before = _aware(request.created_before, "created_before")
        if after is not None and before is not None and after >= before:
            raise _invalid("created_after must be before created_before")
        priority = check_priority(request.priority, bulk=True)
        rate = selection.DEFAULT_RATE if request.rate_per_second is None else request.rate_per_second
        if not (math.isfinite(rate) and selection.MIN_RATE <= rate <= selection.MAX_RATE):
            raise _invalid(
                f"max_rate_per_second must be {selection.MIN_RATE:g} to {selection.MAX_RATE:g} jobs a second",
                "INVALID_RATE",
            )
        deadline = _aware(request.deadline, "deadline")
        if deadline is not None and deadline <= datetime.datetime.now(datetime.UTC):
            raise _invalid("deadline must be in the future", "INVALID_DEADLINE")
        outdated = request.scope == "outdated"
        if request.preset:
            found = await presets.active(self._pool, uuid.UUID(caller.account_id), [request.preset])
            if request.preset not in found:
                raise InvalidArgument(f"unknown preset {request.preset!r}", "UNKNOWN_PRESET")
            preset = found[request.preset]
            selector = Selector(
                operation=preset["operation"],
                params=dict(preset["params"]),
                preset=(preset["name"], preset["version"]),
                outdated_only=outdated,
            )
        else:
            assert request.operation is not None
            checked = await self._creation.check_preset(request.operation, request.params or {})
            # Without params, an outdated run takes each outdated output's own params.
            params = checked if request.params is not None or not outdated else None
            selector = Selector(operation=request.operation, params=params, outdated_only=outdated)
        return (
            dataclasses.replace(selector, object_ids=object_ids, created_after=after, created_before=before),
            float(rate),
            priority,
            deadline,
        )


def _accepted(item: Candidate, profile: asyncpg.Record) -> bool:
    """Whether a job of the profile would accept the item's object (its type and size), so that a
    run matches only what it can enqueue."""
    if contenttype.kind(item.mime_type) not in profile["input_kinds"]:
        return False
    if profile["queue"] == "ocr" and item.mime_type not in ocr_params.INPUT_MIME_TYPES:
        return False
    return bool(item.size_bytes <= profile["max_input_bytes"])


async def cancel_waiting(
    pool: asyncpg.Pool, settlement: Settlement, account_id: str, job_ids: list[str]
) -> int:
    """Cancels the account's jobs among ``job_ids`` that have not started and releases their
    holds (:func:`lifecycle.cancel_if_waiting`); a job that started meanwhile is left to finish.
    Returns how many were cancelled. A failed release is left to the reaper, which settles the
    holds of ended jobs."""
    cancelled = 0
    for job_id in job_ids:
        if not await lifecycle.cancel_if_waiting(pool, job_id, account_id):
            continue
        cancelled += 1
        try:
            await settlement.settle(job_id, "cancelled")
        except DomainError:
            log.warning("could not release the hold of cancelled job %s; the reaper will", job_id)
    return cancelled
