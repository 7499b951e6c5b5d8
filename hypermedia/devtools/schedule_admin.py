"""``hypermedia admin schedules``, ``admin schedule`` and ``admin create-schedule``: operators see
every account's schedules (ADR 0072), act on one as its account's API would, and create the
platform's maintenance schedules (a process or backfill schedule is made by its account, over
REST or gRPC, where its spec is checked against the objects and profiles). Each prints JSON;
exit 1 with the reason on a refusal or an unreachable database."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from typing import Annotated, Any

import asyncpg
import typer

from hypermedia.core.errors import DomainError, InvalidArgument
from hypermedia.jobs import schedules

SCHEDULE_ACTIONS = ("show", "runs", "pause", "resume", "trigger", "delete")

WithConn = Callable[[Callable[[Any], Awaitable[Any]]], Coroutine[Any, Any, Any]]


def schedule_json(schedule: schedules.Schedule, last: schedules.Run | None) -> dict[str, Any]:
    """A schedule as the CLI prints it: the REST shape with its account."""
    return {"account_id": schedule.account_id} | schedules.as_json(schedule, last)


def _account(account: str) -> str:
    try:
        return str(uuid.UUID(account))
    except ValueError:
        raise typer.BadParameter(f"{account!r} is not an account id") from None


def run_json(command: str, with_conn: WithConn, work: Callable[[Any], Awaitable[Any]]) -> None:
    """Run ``work`` on a connection and print its result as JSON; a refusal or an unreachable
    database is exit 1 with the reason on stderr."""
    logging.basicConfig(level=logging.WARNING)
    try:
        shown: Any = asyncio.run(with_conn(work))
    except DomainError as exc:
        print(f"hypermedia admin {command}: {exc.error_code}: {exc.public_message}", file=sys.stderr)
        raise typer.Exit(1) from None
    except (OSError, asyncpg.PostgresError) as exc:
        print(f"hypermedia admin {command}: {type(exc).__name__}: {exc}", file=sys.stderr)
        raise typer.Exit(1) from None
    print(json.dumps(shown))


def register(admin: typer.Typer, with_conn: WithConn) -> None:
    """Adds the three commands to ``admin``; ``with_conn`` runs a function on a connection to the
    platform's database."""

    @admin.command("schedules")
    def schedules_cmd(
        account: Annotated[str | None, typer.Option(help="only this account's schedules")] = None,
    ) -> None:
        """Schedules with their next tick and last run, as JSON {"schedules": [...]} (every
        account's unless --account)."""
        account_id = _account(account) if account is not None else None

        async def work(conn: Any) -> dict[str, Any]:
            found = await schedules.list_schedules(conn, account_id)
            last = await schedules.last_runs(conn, [s.schedule_id for s in found])
            return {"schedules": [schedule_json(s, last.get(s.schedule_id)) for s in found]}

        run_json("schedules", with_conn, work)

    @admin.command("schedule")
    def schedule_cmd(
        action: Annotated[str, typer.Argument(help="show, runs, pause, resume, trigger or delete")],
        account: Annotated[str, typer.Argument(help="the schedule's account id")],
        name: Annotated[str, typer.Argument(help="the schedule's name")],
    ) -> None:
        """Show an account's schedule or its runs, pause, resume or trigger it (a run now), or
        delete it with its history, as its account's API would."""
        if action not in SCHEDULE_ACTIONS:
            raise typer.BadParameter(f"{action!r}: give one of {', '.join(SCHEDULE_ACTIONS)}")
        account_id = _account(account)

        async def work(conn: Any) -> dict[str, Any]:
            if action == "trigger":
                return schedules.run_as_json(await schedules.trigger(conn, account_id, name))
            if action == "delete":
                await schedules.delete(conn, account_id, name)
                return {"deleted": name}
            if action in ("pause", "resume"):
                await schedules.set_paused(conn, account_id, name, action == "pause")
            schedule = await schedules.get(conn, account_id, name)
            if action == "runs":
                return {
                    "runs": [
                        schedules.run_as_json(r) for r in await schedules.runs(conn, schedule.schedule_id)
                    ]
                }
            last = await schedules.last_runs(conn, [schedule.schedule_id])
            return schedule_json(schedule, last.get(schedule.schedule_id))

        run_json("schedule", with_conn, work)

    @admin.command("create-schedule")
    def create_schedule_cmd(
        account: Annotated[str, typer.Argument(help="the account that owns it (an admin account)")],
        name: Annotated[str, typer.Argument(help="its name, unique among the account's")],
        cron: Annotated[str, typer.Option(help="five fields or @daily etc.")],
        task: Annotated[str, typer.Option(help=", ".join(schedules.TASKS))],
        older_than_days: Annotated[
            float | None, typer.Option(help="a prune task's retention (days, above 0, at most 3650)")
        ] = None,
        time_zone: Annotated[str, typer.Option(help="IANA time zone the cron is read in")] = "UTC",
        missed: Annotated[str, typer.Option(help="skip or catch_up")] = "skip",
        catch_up_limit: Annotated[int, typer.Option(min=1, max=100)] = 1,
    ) -> None:
        """Create a maintenance schedule (the reaper runs it): a prune of job events, worker
        metrics or webhook deliveries older than --older-than-days, or reconcile_holds."""
        account_id = _account(account)
        if task not in schedules.TASKS:
            raise typer.BadParameter(f"{task!r}: give one of {', '.join(schedules.TASKS)}")
        prune = task != "reconcile_holds"
        if prune != (older_than_days is not None) or (
            older_than_days is not None and not 0 < older_than_days <= 3650
        ):
            raise typer.BadParameter("a prune task takes --older-than-days (0-3650]; reconcile_holds none")
        spec: dict[str, Any] = {"task": task}
        if older_than_days is not None:
            spec["older_than_days"] = older_than_days

        async def work(conn: Any) -> dict[str, Any]:
            if not await conn.fetchval(
                "SELECT is_admin FROM accounts WHERE account_id = $1", uuid.UUID(account_id)
            ):
                raise InvalidArgument("maintenance schedules belong to an admin account", "NOT_AN_ADMIN")
            made = await schedules.create(
                conn,
                account_id,
                name,
                cron,
                time_zone,
                "maintenance",
                spec,
                missed=missed,
                catch_up_limit=catch_up_limit,
            )
            return schedule_json(made, None)

        run_json("create-schedule", with_conn, work)
