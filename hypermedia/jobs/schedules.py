"""Schedules (issue 25 items 2 and 3, ADR 0072): recurring work as rows of ``schedules``, each
tick recorded as a ``schedule_runs`` row.

A schedule is a name, a cron expression of five fields (minute resolution; or a macro such as
``@daily``) read in an IANA time zone by croniter, and what each tick runs (its ``kind`` and
``spec``): a process request on given objects, a backfill run, or a maintenance task of the
platform (:data:`TASKS`). This module owns the rows and the rules. Every gateway and every
reaper polls them (:func:`claim_due`); the gateway's
:class:`~services.gateway.schedule_runner.ScheduleRunner` runs the process and backfill runs, the
reaper's :class:`~services.reaper.maintenance.MaintenanceRunner` the maintenance runs (it alone
may list the credits' holds).

**Exactly once across pollers.** :func:`claim_due` locks the due schedules ``FOR UPDATE SKIP
LOCKED``, inserts one run per tick with ``(schedule_id, due_at)`` unique, and moves
``next_run_at`` past ``now`` in the same transaction: two pollers never record one tick twice,
and a poller that dies mid-way records nothing.

**Missed ticks** (a tick more than :data:`MISSED_GRACE` late when a poller first sees it: every
poller was down, or the schedule was paused): ``skip`` records them ``skipped`` and runs none;
``catch_up`` runs the latest ``catch_up_limit`` of them, oldest first, and records the older
ones ``skipped``. A tick seen within the grace always runs. At most :data:`MAX_RECORDED_SKIPS`
skipped ticks are recorded per poll (a schedule every minute paused for a month records the
latest 100 of them, not 43,200).

**Runs that lose their runner.** A run a runner took (``running``) and did not finish within
:data:`RUN_LEASE` is recorded ``failed`` (``RUNNER_LOST``); it is not run again (a backfill run
must not be made twice; a process run's jobs carry idempotency keys, so running it again would
be safe, but one rule for all kinds is simpler to reason about).
"""

from __future__ import annotations

import datetime
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any, Final
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

import asyncpg
from croniter import CroniterBadCronError, CroniterBadDateError, croniter

from hypermedia.core.errors import Conflict, InvalidArgument, NotFound
from hypermedia.infra import db

KINDS: Final = ("process", "backfill", "maintenance")
MISSED_POLICIES: Final = ("skip", "catch_up")
TASKS: Final = ("prune_job_events", "prune_worker_metrics", "prune_webhook_deliveries", "reconcile_holds")
"""The maintenance tasks a schedule may run (admin accounts only): the three tables' retention
(:mod:`hypermedia.jobs.retention`, with the schedule's own ``older_than_days``) and the sweep of
holds whose job ended but which nobody settled (:meth:`hypermedia.jobs.settlement.Settlement.sweep`)."""
RUN_STATES: Final = ("pending", "running", "succeeded", "failed", "skipped")
MISSED_GRACE: Final = datetime.timedelta(seconds=60)
"""How late a tick may be first seen and still count as on time (runs under either policy)."""
MAX_RECORDED_SKIPS: Final = 100
MAX_CATCH_UP: Final = 100
"""The largest ``catch_up_limit``."""
RUN_LEASE: Final = datetime.timedelta(minutes=10)
"""How long a runner may take over one run before it counts as lost."""
MAX_SCHEDULES: Final = 100
"""Schedules an account may have."""
MAX_NAME_LENGTH: Final = 64
NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
"""A schedule's name: a letter or digit, then letters, digits, ``.``, ``_``, ``-``; 64 at most."""
TICKS_A_POLL: Final = MAX_CATCH_UP + MAX_RECORDED_SKIPS + 10
"""The latest due ticks one poll looks at per schedule: all :func:`plan` can run or record."""


@dataclass(frozen=True)
class Schedule:
    """One ``schedules`` row."""

    schedule_id: str
    account_id: str
    name: str
    cron: str
    time_zone: str
    kind: str
    spec: dict[str, Any]
    missed: str
    catch_up_limit: int
    paused: bool
    next_run_at: datetime.datetime
    """The next tick not yet recorded (UTC). While paused it stays where the pause found it; on
    resume the ticks since then follow :attr:`missed`."""
    created_at: datetime.datetime
    updated_at: datetime.datetime


@dataclass(frozen=True)
class Run:
    """One ``schedule_runs`` row: a tick (or a manual trigger) and what came of it."""

    run_id: str
    schedule_id: str
    due_at: datetime.datetime
    trigger: str
    """``tick`` or ``manual``."""
    state: str
    """One of :data:`RUN_STATES`."""
    created_at: datetime.datetime
    started_at: datetime.datetime | None
    finished_at: datetime.datetime | None
    outcome: dict[str, Any] | None
    """What it made: ``{"job_ids": [...]}``, ``{"backfill_run_id": ...}``, ``{"deleted": n}``."""
    error_code: str | None
    error: str | None


def check_name(name: str) -> None:
    """Raises InvalidArgument (``INVALID_SCHEDULE``) unless ``name`` matches :data:`NAME`."""
    if not NAME.fullmatch(name):
        raise InvalidArgument(
            "name must be 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit",
            "INVALID_SCHEDULE",
        )


# -- cron -------------------------------------------------------------------------------------


def check_cron(expression: str, time_zone: str) -> None:
    """Raises InvalidArgument: ``INVALID_CRON`` unless ``expression`` is five cron fields (minute
    hour day-of-month month day-of-week) or a macro (``@hourly``, ``@daily``, ``@weekly``,
    ``@monthly``, ``@yearly``) croniter reads; ``INVALID_TIME_ZONE`` unless ``time_zone`` is an
    IANA name (``Europe/Berlin``, ``UTC``) of the system's tz database."""
    fields = expression.split()
    macro = len(fields) == 1 and expression.strip().startswith("@")
    if not (macro or len(fields) == 5) or not croniter.is_valid(expression.strip()):
        raise InvalidArgument(
            "cron must be five fields (minute hour day month weekday, e.g. '*/15 * * * *') or a macro"
            " such as @daily",
            "INVALID_CRON",
        )
    _zone(time_zone)
    now = datetime.datetime.now(datetime.UTC)
    try:
        ticks = {next_tick(expression.strip(), time_zone, now) for _ in range(3)}
    except (CroniterBadDateError, CroniterBadCronError, ValueError):
        raise InvalidArgument("cron matches no time (such as 30 February)", "INVALID_CRON") from None
    if len(ticks) > 1:  # croniter's R picks a random value at each reading: no tick could be kept
        raise InvalidArgument("cron may not use R (a random value): give the minute", "INVALID_CRON")


@cache
def _zone_names() -> frozenset[str]:
    """The IANA zone names of the tz database, without the host-dependent ``localtime`` and
    ``posixrules``, ``Factory``, and the ``posix/`` and ``right/`` copies."""
    return frozenset(
        name
        for name in available_timezones()
        if name not in ("localtime", "posixrules", "Factory") and not name.startswith(("posix/", "right/"))
    )


def _zone(time_zone: str) -> ZoneInfo:
    try:
        if time_zone not in _zone_names():
            raise ValueError(time_zone)
        return ZoneInfo(time_zone)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise InvalidArgument(
            f"time_zone must be an IANA time zone name such as Europe/Berlin or UTC, not {time_zone[:64]!r}",
            "INVALID_TIME_ZONE",
        ) from None


def next_tick(expression: str, time_zone: str, after: datetime.datetime) -> datetime.datetime:
    """The first tick of ``expression`` in ``time_zone`` strictly after ``after`` (aware), in UTC.
    A wall time a DST change skips runs at the first time after the gap; one it repeats runs
    at both instants (croniter's reading)."""
    it = croniter(expression, after.astimezone(_zone(time_zone)))
    tick: datetime.datetime = it.get_next(datetime.datetime)
    return tick.astimezone(datetime.UTC)


def due_ticks(
    expression: str, time_zone: str, since: datetime.datetime, now: datetime.datetime, limit: int
) -> list[datetime.datetime]:
    """The ticks ``t`` with ``since <= t <= now``, in UTC, ascending: the latest ``limit`` of them
    (walked back from ``now``, so a schedule left for a year costs ``limit`` steps, not a year's)."""
    it = croniter(expression, (now + datetime.timedelta(seconds=1)).astimezone(_zone(time_zone)))
    ticks: list[datetime.datetime] = []
    while len(ticks) < limit:
        tick = it.get_prev(datetime.datetime).astimezone(datetime.UTC)
        if tick > now:
            continue
        if tick < since:
            break
        ticks.append(tick)
    return ticks[::-1]


def plan(
    ticks: Sequence[datetime.datetime], now: datetime.datetime, missed: str, catch_up_limit: int
) -> tuple[list[datetime.datetime], list[datetime.datetime]]:
    """Which due ``ticks`` (ascending) run and which are skipped under the policy (see the
    module's doc): ``(to_run, skipped)``, each ascending; ``skipped`` at most
    :data:`MAX_RECORDED_SKIPS` (the latest)."""
    on_time = [t for t in ticks if now - t <= MISSED_GRACE]
    late = [t for t in ticks if now - t > MISSED_GRACE]
    caught = late[max(0, len(late) - catch_up_limit) :] if missed == "catch_up" else []
    skipped = late[: len(late) - len(caught)]
    return caught + on_time, skipped[-MAX_RECORDED_SKIPS:]


# -- rows -------------------------------------------------------------------------------------


def _schedule(row: asyncpg.Record) -> Schedule:
    return Schedule(
        schedule_id=str(row["schedule_id"]),
        account_id=str(row["account_id"]),
        name=row["name"],
        cron=row["cron"],
        time_zone=row["time_zone"],
        kind=row["kind"],
        spec=dict(row["spec"]),
        missed=row["missed"],
        catch_up_limit=row["catch_up_limit"],
        paused=row["paused"],
        next_run_at=row["next_run_at"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
    )


def _run(row: asyncpg.Record) -> Run:
    return Run(
        run_id=str(row["run_id"]),
        schedule_id=str(row["schedule_id"]),
        due_at=row["due_at"],
        trigger=row["trigger"],
        state=row["state"],
        created_at=row["created_at"],
        started_at=row["started_at"],
        finished_at=row["finished_at"],
        outcome=dict(row["outcome"]) if row["outcome"] is not None else None,
        error_code=row["error_code"],
        error=row["error"],
    )


async def create(
    pool: asyncpg.Pool,
    account_id: str,
    name: str,
    cron: str,
    time_zone: str,
    kind: str,
    spec: dict[str, Any],
    *,
    missed: str = "skip",
    catch_up_limit: int = 1,
    paused: bool = False,
) -> Schedule:
    """Stores a schedule (its ``spec`` already checked by the caller for ``kind``); its first tick
    is the first after now. Raises Conflict (``SCHEDULE_EXISTS``) when the account has one of
    that name, InvalidArgument for a bad name, cron, zone, policy or limit."""
    check_name(name)
    cron = cron.strip()
    check_cron(cron, time_zone)
    if missed not in MISSED_POLICIES:
        raise InvalidArgument("missed must be skip or catch_up", "INVALID_SCHEDULE")
    if not 1 <= catch_up_limit <= MAX_CATCH_UP:
        raise InvalidArgument(f"catch_up_limit must be 1 to {MAX_CATCH_UP}", "INVALID_SCHEDULE")
    now = await pool.fetchval("SELECT now()")
    count = await pool.fetchval("SELECT count(*) FROM schedules WHERE account_id = $1", uuid.UUID(account_id))
    if count >= MAX_SCHEDULES:
        raise Conflict(
            f"an account may have {MAX_SCHEDULES} schedules; delete one first", "TOO_MANY_SCHEDULES"
        )
    try:
        row = await pool.fetchrow(
            """
            INSERT INTO schedules (schedule_id, account_id, name, cron, time_zone, kind, spec, missed,
                catch_up_limit, paused, next_run_at)
            VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
            RETURNING *
            """,
            uuid.uuid4(),
            uuid.UUID(account_id),
            name,
            cron,
            time_zone,
            kind,
            spec,
            missed,
            catch_up_limit,
            paused,
            next_tick(cron, time_zone, now),
        )
    except asyncpg.UniqueViolationError:
        raise Conflict(f"you have a schedule named {name!r}", "SCHEDULE_EXISTS") from None
    assert row is not None  # INSERT … RETURNING
    return _schedule(row)


async def get(pool: db.Connection | asyncpg.Pool, account_id: str, name: str) -> Schedule:
    """The account's schedule ``name``. Raises NotFound (``SCHEDULE_NOT_FOUND``)."""
    row = await pool.fetchrow(
        "SELECT * FROM schedules WHERE account_id = $1 AND name = $2", uuid.UUID(account_id), name
    )
    if row is None:
        raise NotFound("no such schedule", "SCHEDULE_NOT_FOUND")
    return _schedule(row)


async def list_schedules(pool: db.Connection | asyncpg.Pool, account_id: str | None) -> list[Schedule]:
    """The account's schedules by name (every account's, by account then name, for None)."""
    rows = await pool.fetch(
        "SELECT * FROM schedules WHERE $1::uuid IS NULL OR account_id = $1 ORDER BY account_id, name",
        uuid.UUID(account_id) if account_id else None,
    )
    return [_schedule(r) for r in rows]


async def set_paused(pool: asyncpg.Pool, account_id: str, name: str, paused: bool) -> Schedule:
    """Pauses or resumes the account's schedule (idempotent). A resumed schedule's ticks missed
    while paused follow its ``missed`` policy. Raises NotFound."""
    row = await pool.fetchrow(
        "UPDATE schedules SET paused = $3, updated_at = now() WHERE account_id = $1 AND name = $2 RETURNING *",
        uuid.UUID(account_id),
        name,
        paused,
    )
    if row is None:
        raise NotFound("no such schedule", "SCHEDULE_NOT_FOUND")
    return _schedule(row)


async def delete(pool: asyncpg.Pool, account_id: str, name: str) -> None:
    """Deletes the account's schedule and its run history (what its runs made stays). A run in
    progress finishes. Raises NotFound."""
    status = await pool.execute(
        "DELETE FROM schedules WHERE account_id = $1 AND name = $2", uuid.UUID(account_id), name
    )
    if status.split()[-1] == "0":
        raise NotFound("no such schedule", "SCHEDULE_NOT_FOUND")


async def trigger(pool: db.Connection | asyncpg.Pool, account_id: str, name: str) -> Run:
    """A run of the schedule now (``manual``), beside its ticks, paused or not. Raises NotFound
    (also when it is deleted meanwhile), Conflict (``SCHEDULE_BUSY``) while a manual run of it is
    pending or running: one at a time (a partial unique index), so triggers cannot pile up work."""
    schedule = await get(pool, account_id, name)
    try:
        row = await pool.fetchrow(
            """
            INSERT INTO schedule_runs (run_id, schedule_id, due_at, trigger, state)
            VALUES ($1, $2, clock_timestamp(), 'manual', 'pending') RETURNING *
            """,
            uuid.uuid4(),
            uuid.UUID(schedule.schedule_id),
        )
    except asyncpg.ForeignKeyViolationError:
        raise NotFound("no such schedule", "SCHEDULE_NOT_FOUND") from None
    except asyncpg.UniqueViolationError:
        raise Conflict(
            "a manual run of this schedule is pending or running; trigger it again when it ends",
            "SCHEDULE_BUSY",
        ) from None
    assert row is not None  # INSERT … RETURNING
    return _run(row)


async def runs(pool: asyncpg.Pool, schedule_id: str, limit: int = 50) -> list[Run]:
    """The schedule's runs, latest due first, at most ``limit``."""
    rows = await pool.fetch(
        "SELECT * FROM schedule_runs WHERE schedule_id = $1 ORDER BY due_at DESC LIMIT $2",
        uuid.UUID(schedule_id),
        limit,
    )
    return [_run(r) for r in rows]


async def last_runs(pool: asyncpg.Pool, schedule_ids: Sequence[str]) -> dict[str, Run]:
    """The latest run (by due time) of each schedule that has one."""
    rows = await pool.fetch(
        """
        SELECT DISTINCT ON (schedule_id) * FROM schedule_runs
        WHERE schedule_id = ANY($1::uuid[]) ORDER BY schedule_id, due_at DESC
        """,
        list(schedule_ids),
    )
    return {str(r["schedule_id"]): _run(r) for r in rows}


def _iso(value: datetime.datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def run_as_json(run: Run) -> dict[str, Any]:
    """A run as REST and ``hypermedia admin`` show it (docs/api.md "Schedules")."""
    return {
        "run_id": run.run_id,
        "due_at": _iso(run.due_at),
        "trigger": run.trigger,
        "state": run.state,
        "started_at": _iso(run.started_at),
        "finished_at": _iso(run.finished_at),
        "outcome": run.outcome,
        "error_code": run.error_code,
        "error": run.error,
    }


def as_json(schedule: Schedule, last: Run | None) -> dict[str, Any]:
    """A schedule as REST shows it: its spec under its kind's name, its next tick and last run."""
    return {
        "name": schedule.name,
        "cron": schedule.cron,
        "time_zone": schedule.time_zone,
        "kind": schedule.kind,
        schedule.kind: schedule.spec,
        "missed": schedule.missed,
        "catch_up_limit": schedule.catch_up_limit,
        "paused": schedule.paused,
        "next_run_at": _iso(schedule.next_run_at),
        "last_run": run_as_json(last) if last is not None else None,
        "created_at": _iso(schedule.created_at),
        "updated_at": _iso(schedule.updated_at),
    }


# -- the poller and the runners ---------------------------------------------------------------


async def claim_due(pool: asyncpg.Pool, now: datetime.datetime, batch: int = 100) -> int:
    """The poller's step: for up to ``batch`` active schedules whose ``next_run_at`` is at or
    before ``now``, records their due ticks as runs (``pending``, or ``skipped`` by :func:`plan`),
    and moves ``next_run_at`` to the first tick after ``now``, in one transaction. Returns the
    runs made ``pending``."""
    pending = 0
    async with pool.acquire() as conn, conn.transaction():
        rows = await conn.fetch(
            """
            SELECT * FROM schedules WHERE NOT paused AND next_run_at <= $1
            ORDER BY next_run_at LIMIT $2 FOR UPDATE SKIP LOCKED
            """,
            now,
            batch,
        )
        for row in rows:
            schedule = _schedule(row)
            ticks = due_ticks(schedule.cron, schedule.time_zone, schedule.next_run_at, now, TICKS_A_POLL)
            to_run, skipped = plan(ticks, now, schedule.missed, schedule.catch_up_limit)
            records = [(t, "pending") for t in to_run] + [(t, "skipped") for t in skipped]
            await conn.executemany(
                """
                INSERT INTO schedule_runs (run_id, schedule_id, due_at, trigger, state, finished_at)
                VALUES ($1, $2, $3, 'tick', $4, CASE WHEN $4 = 'skipped' THEN now() END)
                ON CONFLICT (schedule_id, due_at) DO NOTHING
                """,
                [(uuid.uuid4(), uuid.UUID(schedule.schedule_id), t, state) for t, state in records],
            )
            pending += len(to_run)
            await conn.execute(
                "UPDATE schedules SET next_run_at = $2 WHERE schedule_id = $1",
                uuid.UUID(schedule.schedule_id),
                next_tick(schedule.cron, schedule.time_zone, now),
            )
    return pending


async def next_due(pool: asyncpg.Pool) -> datetime.timedelta | None:
    """How long until the earliest active schedule is due (≤ 0: now); None without one."""
    wait: datetime.timedelta | None = await pool.fetchval(
        "SELECT min(next_run_at) - now() FROM schedules WHERE NOT paused"
    )
    return wait


async def take_pending(
    pool: asyncpg.Pool, runner: str, kinds: Sequence[str], limit: int
) -> list[tuple[Run, Schedule]]:
    """A runner's step: the oldest pending run of each account with pending runs of schedules of
    ``kinds``, up to ``limit`` accounts, oldest due first, made ``running`` by ``runner``, with
    their schedules. One run an account a poll, so an account's pile of runs never holds back
    another account's tick. The update re-checks ``pending`` under the row lock: two runners
    never take one run. (The gateway runs ``process`` and ``backfill`` runs, the reaper
    ``maintenance`` ones: each kind where what it calls is allowed.)"""
    rows = await pool.fetch(
        """
        WITH oldest AS (
            SELECT DISTINCT ON (s.account_id) r.run_id, r.due_at
            FROM schedule_runs r JOIN schedules s USING (schedule_id)
            WHERE r.state = 'pending' AND s.kind = ANY($3::text[])
            ORDER BY s.account_id, r.due_at
        ), chosen AS (SELECT run_id FROM oldest ORDER BY due_at LIMIT $2)
        UPDATE schedule_runs r SET state = 'running', runner = $1, started_at = clock_timestamp()
        FROM chosen WHERE r.run_id = chosen.run_id AND r.state = 'pending'
        RETURNING r.*
        """,
        runner,
        limit,
        list(kinds),
    )
    if not rows:
        return []
    by_id = {
        str(s["schedule_id"]): _schedule(s)
        for s in await pool.fetch(
            "SELECT * FROM schedules WHERE schedule_id = ANY($1::uuid[])", [r["schedule_id"] for r in rows]
        )
    }
    return [(_run(r), by_id[str(r["schedule_id"])]) for r in rows if str(r["schedule_id"]) in by_id]


async def finish(
    pool: asyncpg.Pool,
    run_id: str,
    outcome: dict[str, Any] | None,
    error: tuple[str, str] | None = None,
) -> None:
    """Records a running run's end: ``succeeded`` with ``outcome``, or ``failed`` with ``error``
    (``(code, message)``) and what it made before failing."""
    await pool.execute(
        """
        UPDATE schedule_runs SET state = $2, outcome = $3, error_code = $4, error = $5,
               finished_at = clock_timestamp()
        WHERE run_id = $1 AND state = 'running'
        """,
        uuid.UUID(run_id),
        "failed" if error else "succeeded",
        outcome,
        error[0] if error else None,
        error[1][:500] if error else None,
    )


async def fail_lost(pool: asyncpg.Pool) -> int:
    """Records ``failed`` (``RUNNER_LOST``) every run ``running`` for longer than
    :data:`RUN_LEASE`. Returns how many."""
    status = await pool.execute(
        """
        UPDATE schedule_runs SET state = 'failed', error_code = 'RUNNER_LOST',
               error = 'its runner stopped before it finished', finished_at = clock_timestamp()
        WHERE state = 'running' AND started_at < clock_timestamp() - $1::interval
        """,
        RUN_LEASE,
    )
    return int(status.split()[-1])
