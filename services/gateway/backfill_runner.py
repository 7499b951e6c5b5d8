"""The backfill runner (ADR 0058): a loop in every gateway process around :meth:`run_once`, which
enqueues the pending items of the running backfill runs through job creation, paced and braked.

Each tick: end what has ended (runs past their deadline, dispatched runs whose jobs all ended);
lease up to 16 running runs no other gateway holds (``LEASE_SECONDS``, so a crashed gateway's runs
go on elsewhere); unless the brake is on (an interactive queue's oldest job has waited longer than
its target), enqueue as many items of each as its token bucket holds (of its next ``chunk``), one
process request and one token each: ``"queue": "bulk"`` at the run's priority, ``paced`` (no token of the
account's request rate), under the item's idempotency key. An item whose key has a job already is
linked to it (``existing``). The run's outcome decides what follows:

- the object deleted, its type or size no longer accepted, params refused → the item is
  ``skipped`` with the error's code and message; the run goes on;
- credits short (402), the preset or operation gone, a permission refused → the run is
  ``paused`` with the error's code and message (``resume`` once it is fixed);
- the account's waiting-jobs quota full, a service unavailable → the tick ends; the run waits
  (``waiting_reason``) and tries again at the next tick;
- the run paused or cancelled during the tick → the tick ends (a job made after a cancellation is
  cancelled at once).
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

import asyncpg

from hypermedia.core.errors import (
    Conflict,
    DomainError,
    InsufficientCredits,
    InvalidArgument,
    NotFound,
    PayloadTooLarge,
    PermissionDenied,
    RateLimited,
    UnsupportedInput,
)
from hypermedia.jobs import presets
from hypermedia.jobs.accounts import Caller
from hypermedia.jobs.backfill import dispatch, selection
from hypermedia.jobs.backfill.dispatch import Item, Leased
from hypermedia.jobs.settlement import Settlement
from services.gateway.backfills import cancel_waiting
from services.gateway.creation import JobCreation
from services.gateway.process_request import OperationRequest

log = logging.getLogger(__name__)

RUN_STOPPING = frozenset({"UNKNOWN_PRESET", "UNKNOWN_OPERATION", "OPERATION_NOT_ENABLED"})
"""Codes of an InvalidArgument that no item of the run can pass: the run is paused."""


@dataclass(frozen=True)
class Tick:
    """What one :meth:`BackfillRunner.run_once` did."""

    expired: int = 0
    completed: int = 0
    leased: int = 0
    enqueued: int = 0
    existing: int = 0
    skipped: int = 0
    paused: int = 0
    braked: str | None = None


@dataclass
class _Counts:
    enqueued: int = 0
    existing: int = 0
    skipped: int = 0
    used: int = 0
    """Tokens used: one a process request (an item enqueued or skipped); a linked item takes none."""
    waiting: str | None = None
    pause: tuple[str, str] | None = None


class _Stop(Exception):
    """Ends a run's tick early (the run paused, cancelled or waiting)."""


class BackfillRunner:
    """Enqueues the running backfill runs' items. Dependencies come in through the constructor.

    Args:
        pool: the system of record (runs and items; jobs through ``creation``).
        creation: the job creation use case each item goes through.
        settlement: releases the hold of a job cancelled because its run was cancelled meanwhile.
        owner: this runner's name in the runs' leases (unique per gateway process).
        brake_targets: interactive queue → seconds its oldest queued job may wait before bulk
            dispatch stops (``HM_BACKFILL_BRAKE``); empty: no brake.
        chunk: most items one run enqueues in one tick.
    """

    def __init__(
        self,
        pool: asyncpg.Pool,
        creation: JobCreation,
        settlement: Settlement,
        *,
        owner: str,
        brake_targets: Mapping[str, float],
        chunk: int = 50,
    ) -> None:
        self._pool = pool
        self._creation = creation
        self._settlement = settlement
        self._owner = owner
        self._brake_targets = dict(brake_targets)
        self._chunk = chunk

    async def run_once(self) -> Tick:
        """One tick over every running run this runner can lease (see the module docstring); the
        gateway calls it every ``HM_BACKFILL_POLL_SECONDS`` (:func:`hypermedia.infra.service.every`).
        Logs a line when it did something."""
        expired, completed = await dispatch.housekeeping(self._pool)
        leased = await dispatch.lease(self._pool, self._owner)
        if not leased:
            return Tick(expired=expired, completed=completed)
        braked = await dispatch.brake(self._pool, self._brake_targets)
        totals = _Counts()
        paused = 0
        for run in leased:
            counts = await self._advance(run, braked)
            totals.enqueued += counts.enqueued
            totals.existing += counts.existing
            totals.skipped += counts.skipped
            paused += counts.pause is not None
        tick = Tick(
            expired=expired,
            completed=completed,
            leased=len(leased),
            enqueued=totals.enqueued,
            existing=totals.existing,
            skipped=totals.skipped,
            paused=paused,
            braked=braked,
        )
        if tick.enqueued or tick.skipped or tick.expired or tick.completed or tick.paused:
            log.info("backfill tick", extra={"tick": dataclasses.asdict(tick)})
        return tick

    async def _advance(self, run: Leased, braked: str | None) -> _Counts:
        """One run's tick; always releases its lease with its bucket and why it waits."""
        counts = _Counts()
        try:
            if braked:
                counts.waiting = braked
            elif (changed := await self._preset_changed(run)) is not None:
                counts.pause = ("PRESET_CHANGED", changed)
            else:
                items = await dispatch.pending(self._pool, run.run_id, self._chunk)
                keys = {
                    item.item_no: selection.idempotency_key(
                        item.object_id, run.operation, item.params, run.target_version, item.replays
                    )
                    for item in items
                }
                earlier = await selection.existing_jobs(self._pool, run.account_id, list(keys.values()))
                for item in items:
                    await self._enqueue(
                        run, item, keys[item.item_no], earlier.get(keys[item.item_no]), counts
                    )
        except _Stop:
            pass
        finally:
            await dispatch.end_tick(
                self._pool,
                run,
                self._owner,
                tokens=max(0.0, run.tokens - counts.used),
                waiting_reason=counts.waiting,
                braked_seconds=run.since_last_tick if braked else 0.0,
                pause=counts.pause,
            )
        return counts

    async def _preset_changed(self, run: Leased) -> str | None:
        """Why a preset run must stop: its preset has another active version, or none."""
        if run.preset is None:
            return None
        name, version = run.preset
        found = await presets.active(self._pool, uuid.UUID(run.account_id), [name])
        now = found.get(name)
        if now is not None and now["version"] == version:
            return None
        became = f"version {now['version']}" if now else "deleted"
        return f"preset {name!r} was version {version} when the run was created and is now {became}: create a new run"

    async def _enqueue(self, run: Leased, item: Item, key: str, earlier: str | None, counts: _Counts) -> None:
        """Enqueues one item under ``key`` (or links ``earlier``, the job the key has already, or
        skips it), records it, and raises _Stop when the run must end its tick."""
        if earlier is not None:
            await self._link(run, item, earlier, counts)
            return
        if counts.used + 1 > run.tokens:
            raise _Stop  # the bucket is empty until the next tick
        operation = (
            OperationRequest("", {}, run.preset[0])
            if run.preset
            else OperationRequest(run.operation, item.params)
        )
        caller = Caller(account_id=run.account_id, pool_id="")
        try:
            result = await self._creation.process(
                caller, item.object_id, [operation], run.priority, None, key, "bulk", paced=True
            )
        except Conflict:  # the key's request was made meanwhile with other fields (another run's)
            made = await selection.existing_jobs(self._pool, run.account_id, [key])
            if key not in made:
                raise
            await self._link(run, item, made[key], counts)
            return
        except InsufficientCredits as exc:
            counts.pause = ("INSUFFICIENT_CREDITS", exc.public_message)
            raise _Stop from None
        except PermissionDenied as exc:
            counts.pause = (exc.error_code, exc.public_message)
            raise _Stop from None
        except InvalidArgument as exc:
            if exc.error_code in RUN_STOPPING:
                counts.pause = (exc.error_code, exc.public_message)
                raise _Stop from None
            await self._skip(run, item, exc, counts)
            return
        except (NotFound, UnsupportedInput, PayloadTooLarge) as exc:
            await self._skip(run, item, exc, counts)
            return
        except RateLimited as exc:
            counts.waiting = f"{exc.error_code}: {exc.public_message}"
            raise _Stop from None
        except DomainError as exc:  # a service unavailable, a transient failure
            counts.waiting = f"{exc.error_code}: {exc.public_message}"
            log.warning("backfill run %s waits: %s", run.run_id, counts.waiting)
            raise _Stop from None
        counts.enqueued += 1
        counts.used += 1
        await self._record(run, item, "enqueued", result.job_ids[0])

    async def _link(self, run: Leased, item: Item, job_id: str, counts: _Counts) -> None:
        """Links the item to the job its key has already: no job made, no token taken."""
        counts.existing += 1
        await self._record(run, item, "existing", job_id)

    async def _skip(self, run: Leased, item: Item, exc: DomainError, counts: _Counts) -> None:
        counts.skipped += 1
        counts.used += 1
        await self._record(run, item, "skipped", None, (exc.error_code, exc.public_message))

    async def _record(
        self, run: Leased, item: Item, state: str, job_id: str | None, error: tuple[str, str] | None = None
    ) -> None:
        """Records the item; ends the tick when the run is no longer running, cancelling the job
        just made if the run was cancelled meanwhile."""
        now = await dispatch.record(self._pool, run.run_id, item.item_no, state, job_id, error)
        if now == "running":
            return
        if now == "cancelled" and state == "enqueued" and job_id:
            await cancel_waiting(self._pool, self._settlement, run.account_id, [job_id])
        raise _Stop
