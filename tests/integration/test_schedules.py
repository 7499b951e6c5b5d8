"""Schedules (issue 25 items 2 and 3, ADR 0072) against a real Postgres: a schedule every minute
polled by two pollers over three minutes records exactly three runs; a poller stopped over two
ticks skips them or catches them up as the schedule says; runners never take one run twice; a
maintenance schedule prunes what it names and nothing else; a run that lost its runner fails."""

from __future__ import annotations

import asyncio
import datetime
import uuid

import asyncpg
import pytest

from hypermedia.core.errors import Conflict, NotFound
from hypermedia.jobs import schedules
from hypermedia.jobs.retention import DAY
from hypermedia.jobs.settlement import Settlement
from services.reaper.maintenance import MaintenanceRunner
from tests.integration.conftest import Credits, Seeder

MINUTE = datetime.timedelta(minutes=1)


async def _every_minute(
    pool: asyncpg.Pool, account_id: str, name: str, **policy: object
) -> schedules.Schedule:
    return await schedules.create(
        pool,
        account_id,
        name,
        "* * * * *",
        "Europe/Berlin",
        "maintenance",
        {"task": "prune_job_events", "older_than_days": 30},
        **policy,  # type: ignore[arg-type]
    )


async def _runs(pool: asyncpg.Pool, schedule: schedules.Schedule) -> list[tuple[datetime.datetime, str]]:
    return [(r.due_at, r.state) for r in reversed(await schedules.runs(pool, schedule.schedule_id))]


async def test_two_pollers_over_three_minutes_record_exactly_three_runs(
    fresh_pool: asyncpg.Pool, seed: Seeder
) -> None:
    tenant = await seed.tenant()
    schedule = await _every_minute(fresh_pool, str(tenant.account_id), "every-minute")
    first = schedule.next_run_at
    assert first.second == 0 and first.microsecond == 0

    # Both pollers every 5 s from just before the first tick to just before the fourth.
    now = first - datetime.timedelta(seconds=4)
    while now < first + 3 * MINUTE - datetime.timedelta(seconds=1):
        await asyncio.gather(
            schedules.claim_due(fresh_pool, now),
            schedules.claim_due(fresh_pool, now + datetime.timedelta(0, 0, 1)),
        )
        now += datetime.timedelta(seconds=5)

    assert await _runs(fresh_pool, schedule) == [(first + n * MINUTE, "pending") for n in range(3)]
    after = await schedules.get(fresh_pool, str(tenant.account_id), "every-minute")
    assert after.next_run_at == first + 3 * MINUTE


async def test_a_poller_stopped_over_two_ticks_skips_them_or_catches_them_up(
    fresh_pool: asyncpg.Pool, seed: Seeder
) -> None:
    tenant = await seed.tenant()
    account = str(tenant.account_id)
    skipping = await _every_minute(fresh_pool, account, "skips")
    catching = await _every_minute(fresh_pool, account, "catches-up", missed="catch_up", catch_up_limit=5)
    limited = await _every_minute(fresh_pool, account, "catches-one", missed="catch_up", catch_up_limit=1)
    first = skipping.next_run_at
    assert catching.next_run_at == limited.next_run_at == first

    # No poll at the first two ticks; the third is 10 s old when a poller comes back.
    assert (
        await schedules.claim_due(fresh_pool, first + 2 * MINUTE + datetime.timedelta(seconds=10))
        == 1 + 3 + 2
    )

    ticks = [first, first + MINUTE, first + 2 * MINUTE]
    assert await _runs(fresh_pool, skipping) == [
        (ticks[0], "skipped"),
        (ticks[1], "skipped"),
        (ticks[2], "pending"),
    ]
    assert await _runs(fresh_pool, catching) == [(t, "pending") for t in ticks]
    assert await _runs(fresh_pool, limited) == [
        (ticks[0], "skipped"),
        (ticks[1], "pending"),
        (ticks[2], "pending"),
    ]


async def test_a_paused_schedule_records_nothing_until_resumed(
    fresh_pool: asyncpg.Pool, seed: Seeder
) -> None:
    tenant = await seed.tenant()
    account = str(tenant.account_id)
    schedule = await _every_minute(fresh_pool, account, "paused")
    await schedules.set_paused(fresh_pool, account, "paused", True)

    assert await schedules.claim_due(fresh_pool, schedule.next_run_at + 5 * MINUTE) == 0
    assert await _runs(fresh_pool, schedule) == []

    await schedules.set_paused(fresh_pool, account, "paused", False)
    back = schedule.next_run_at + 5 * MINUTE + datetime.timedelta(seconds=1)
    assert await schedules.claim_due(fresh_pool, back) == 1  # the tick due now; the five before skipped
    states = [state for _, state in await _runs(fresh_pool, schedule)]
    assert states == ["skipped"] * 5 + ["pending"]


async def test_runners_never_take_one_run_twice_and_a_lost_run_fails(
    fresh_pool: asyncpg.Pool, seed: Seeder
) -> None:
    tenant = await seed.tenant()
    account = str(tenant.account_id)
    schedule = await _every_minute(fresh_pool, account, "taken", missed="catch_up", catch_up_limit=20)
    await schedules.claim_due(fresh_pool, schedule.next_run_at + 19 * MINUTE)

    ids: list[str] = []
    while True:  # ten runners at once, until a round takes nothing
        taken = await asyncio.gather(
            *(schedules.take_pending(fresh_pool, f"runner-{n}", ["maintenance"], 3) for n in range(10))
        )
        if not any(taken):
            break
        ids += [run.run_id for batch in taken for run, _ in batch]
    assert len(ids) == len(set(ids)) == 20
    assert await schedules.take_pending(fresh_pool, "other", ["process", "backfill"], 10) == []

    await schedules.finish(fresh_pool, ids[0], {"deleted": {}})
    await schedules.finish(fresh_pool, ids[1], None, ("BOOM", "it broke"))
    await fresh_pool.execute(
        "UPDATE schedule_runs SET started_at = now() - interval '11 minutes' WHERE run_id = $1",
        uuid.UUID(ids[2]),
    )
    assert await schedules.fail_lost(fresh_pool) == 1
    by_id = {r.run_id: r for r in await schedules.runs(fresh_pool, schedule.schedule_id)}
    assert (by_id[ids[0]].state, by_id[ids[0]].outcome) == ("succeeded", {"deleted": {}})
    assert (by_id[ids[1]].state, by_id[ids[1]].error_code) == ("failed", "BOOM")
    assert (by_id[ids[2]].state, by_id[ids[2]].error_code) == ("failed", "RUNNER_LOST")

    manual = await schedules.trigger(fresh_pool, account, "taken")
    assert (manual.trigger, manual.state) == ("manual", "pending")


async def test_a_maintenance_schedule_prunes_what_it_names_and_nothing_else(
    fresh_pool: asyncpg.Pool, seed: Seeder, credits: Credits
) -> None:
    tenant = await seed.tenant()
    job_id = await seed.job(tenant, status="completed", attempt_count=1)
    await fresh_pool.execute("DELETE FROM job_events")
    for days_ago in (40, 35, 2):
        await fresh_pool.execute(
            "INSERT INTO job_events (job_id, kind, status, created_at) "
            "VALUES ($1, 'status', 'queued', now() - make_interval(secs => $2))",
            job_id,
            days_ago * DAY,
        )
    await seed.worker("old-worker", heartbeat_ago=0)
    await fresh_pool.execute(
        "INSERT INTO worker_metrics (worker_id, recorded_at, cpu_percent, memory_mb, memory_available_mb, "
        "disk_free_mb, slots_busy, jobs_completed, jobs_failed) "
        "VALUES ('old-worker', now() - interval '90 days', 1, 100, 1000, 1000, 0, 0, 0)"
    )
    schedule = await _every_minute(fresh_pool, str(tenant.account_id), "prune-events")
    runner = MaintenanceRunner(fresh_pool, Settlement(credits.stub), runner="test")
    await schedules.trigger(fresh_pool, str(tenant.account_id), "prune-events")

    assert await runner.run_once() == 1

    [run] = await schedules.runs(fresh_pool, schedule.schedule_id)
    assert (run.state, run.outcome) == ("succeeded", {"deleted": {"job_events": 2}})
    ages = await fresh_pool.fetch("SELECT extract(day FROM now() - created_at)::int AS d FROM job_events")
    assert [r["d"] for r in ages] == [2]
    assert await fresh_pool.fetchval("SELECT count(*) FROM worker_metrics") == 1  # not its table


async def test_a_trigger_racing_a_delete_is_not_found_and_triggers_do_not_pile_up(
    fresh_pool: asyncpg.Pool, seed: Seeder
) -> None:
    tenant = await seed.tenant()
    account = str(tenant.account_id)
    await _every_minute(fresh_pool, account, "busy")
    await schedules.trigger(fresh_pool, account, "busy")
    with pytest.raises(Conflict) as busy:
        await schedules.trigger(fresh_pool, account, "busy")
    assert busy.value.error_code == "SCHEDULE_BUSY"

    for round_no in range(10):
        name = f"race-{round_no}"
        await _every_minute(fresh_pool, account, name)
        outcomes = await asyncio.gather(
            *(schedules.trigger(fresh_pool, account, name) for _ in range(3)),
            schedules.delete(fresh_pool, account, name),
            return_exceptions=True,
        )
        for outcome in outcomes:
            assert outcome is None or isinstance(outcome, schedules.Run | NotFound | Conflict), repr(outcome)


async def test_a_runner_takes_one_run_an_account_so_a_pile_never_holds_another_account_back(
    fresh_pool: asyncpg.Pool, seed: Seeder
) -> None:
    flooder, other = await seed.tenant(), await seed.tenant()
    for n in range(10):
        await _every_minute(fresh_pool, str(flooder.account_id), f"flood-{n}")
        await schedules.trigger(fresh_pool, str(flooder.account_id), f"flood-{n}")
    await _every_minute(fresh_pool, str(other.account_id), "mine")
    await schedules.trigger(fresh_pool, str(other.account_id), "mine")

    taken = await schedules.take_pending(fresh_pool, "runner", ["maintenance"], 5)

    assert sorted(s.account_id for _, s in taken) == sorted([str(flooder.account_id), str(other.account_id)])
    assert [s.name for _, s in taken if s.account_id == str(flooder.account_id)] == ["flood-0"]  # its oldest
