"""The ``hypermedia`` command: ``up`` (the whole platform), ``migrate``, ``admin …``, and the
client commands of :mod:`hypermedia.client.commands` (``submit``, ``jobs``, ``objects``,
``operations``).

``hypermedia admin …`` reads ``platform.json`` from the state directory (``./.hypermedia`` or
``HM_STATE_DIR``) to reach the platform that ``hypermedia up`` started there; with
``HM_DATABASE_URL`` and ``HM_CREDITS_ADDR`` set it talks to those instead.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any

import asyncpg
import typer

from hypermedia.client import commands
from hypermedia.core import config, telemetry
from hypermedia.devtools import key_admin, platform, schedule_admin
from hypermedia.infra import db
from hypermedia.jobs import scaling
from hypermedia.jobs.scaling import report as scheduler_report

app = typer.Typer(no_args_is_help=True, add_completion=False, help="hypermedia platform commands")
admin = typer.Typer(no_args_is_help=True, help="administration of a running platform")
app.add_typer(admin, name="admin")
commands.register(app)  # submit, jobs, objects, operations: a client of the REST API


@app.command()
def up(
    services: Annotated[
        str, typer.Option(help="comma-separated services to run", show_default=True)
    ] = ",".join(platform.SERVICES),
    scale: Annotated[
        list[str] | None,
        typer.Option(
            help="replicas of a worker service, e.g. imageworker=2 (repeatable)", metavar="SERVICE=N"
        ),
    ] = None,
    scheduler: Annotated[
        bool,
        typer.Option(
            "--scheduler",
            help="also run the scheduler: burst image workers by demand, on this machine (HM_SCHEDULER_POOLS)",
        ),
    ] = False,
) -> None:
    """Start every service as its own process (embedded Postgres/NATS/object store when HM_DATABASE_URL,
    HM_NATS_URL and S3 settings are absent) and supervise them until Ctrl-C."""
    telemetry.setup("up", os.environ.get("HM_LOG_LEVEL", "INFO"))
    chosen = tuple(s.strip() for s in services.split(",") if s.strip())
    if scheduler and "scheduler" not in chosen:
        chosen += ("scheduler",)
    unknown = set(chosen) - set(platform.SERVICES) - set(platform.OPTIONAL_SERVICES)
    if unknown:
        raise typer.BadParameter(f"unknown services: {', '.join(sorted(unknown))}")
    replicas: dict[str, int] = {}
    for item in scale or []:
        name, _, count = item.partition("=")
        if not count.isdigit():
            raise typer.BadParameter(f"--scale takes SERVICE=N, not {item!r}")
        replicas[name.strip()] = int(count)
    try:
        for name in ("HM_DATABASE_URL", "HM_DATABASE_SESSION_URL"):
            if os.environ.get(name):
                db.check_url(name, os.environ[name])
    except ValueError as exc:
        print(f"hypermedia up: {exc}", file=sys.stderr)
        raise typer.Exit(config.ConfigError.exit_code) from None
    try:
        plat = platform.Platform(platform.state_dir(), chosen, scale=replicas)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None

    def request_stop(*_: object) -> None:
        plat.stop_requested = True

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    try:
        info = plat.start()
        public = {k: v for k, v in info.items() if k != "database_url"}
        print(json.dumps({"event": "platform_ready", **public}), flush=True)
        plat.supervise()
    except Exception as exc:
        print(f"hypermedia up: {exc}", file=sys.stderr)
        plat.stop()
        raise typer.Exit(1) from None
    plat.stop()
    print(json.dumps({"event": "platform_stopped"}), flush=True)


def _database_url() -> str:
    """Where ``migrate`` and the admin commands connect: ``HM_DATABASE_SESSION_URL`` (the primary
    itself behind a transaction pooler, ADR 0076), else ``HM_DATABASE_URL``, else ``platform.json``."""
    for name in ("HM_DATABASE_SESSION_URL", "HM_DATABASE_URL"):
        if os.environ.get(name):
            return os.environ[name]
    return str(platform.read_platform()["database_url"])


def _credits_addr() -> str:
    if os.environ.get("HM_CREDITS_ADDR"):
        return os.environ["HM_CREDITS_ADDR"]
    return str(platform.read_platform()["credits_addr"])


def _admin_tls() -> Any:
    """The admin identity's internal-gRPC credentials (ADR 0044): from ``HM_TLS_*`` when
    ``HM_TLS_CERT`` is set (a cluster: the admin certificate from its Secret); None (plaintext)
    with ``HM_INTERNAL_AUTH=none``; else the ``admin`` files of the platform in this directory
    (None when it runs without authentication); else ``HM_TLS_*`` (a ConfigError naming them).
    Raises ConfigError, FileNotFoundError."""
    from hypermedia.infra import mtls

    if os.environ.get("HM_TLS_CERT") or os.environ.get("HM_INTERNAL_AUTH", "").strip().lower() == "none":
        return mtls.from_environment()
    try:
        info = platform.read_platform()
    except FileNotFoundError:
        return mtls.from_environment()
    if info.get("internal_auth", "none") == "none":
        return None
    files = info["tls"]
    return mtls.Tls(
        Path(files["HM_TLS_CA"]).read_bytes(),
        Path(files["HM_TLS_CERT"]).read_bytes(),
        Path(files["HM_TLS_KEY"]).read_bytes(),
    )


@app.command()
def certs(
    out: Annotated[Path, typer.Argument(help="directory for ca.pem and <identity>.pem / -key.pem")],
) -> None:
    """Make a new internal CA and one mutual-TLS certificate per service identity in OUT (files
    0600, valid 7 days; ADR 0044), as `hypermedia up` does for its run; prints JSON {identity:
    {HM_TLS_CA, HM_TLS_CERT, HM_TLS_KEY}}. For compose and other hosts without cert-manager."""
    from hypermedia.infra import mtls

    try:
        print(json.dumps(mtls.issue_all(out)))
    except OSError as exc:
        print(f"hypermedia certs: {out}: {exc.strerror}", file=sys.stderr)
        raise typer.Exit(1) from None


@app.command()
def migrate() -> None:
    """Apply pending database migrations (HM_DATABASE_URL, or the platform in this directory)."""
    try:
        url = _database_url()
        db.check_url(
            "HM_DATABASE_SESSION_URL" if os.environ.get("HM_DATABASE_SESSION_URL") else "HM_DATABASE_URL", url
        )
        applied = db.migrate(url)
    except (FileNotFoundError, ValueError) as exc:
        print(f"hypermedia migrate: {exc}", file=sys.stderr)
        raise typer.Exit(config.ConfigError.exit_code) from None
    print(json.dumps({"applied": applied}))


async def _create_account(
    name: str, credits: float, admin: bool = False, interactive: bool = False
) -> dict[str, Any]:
    from hypermedia.api.credits.v1 import credits_pb2, credits_pb2_grpc
    from hypermedia.core.errors import DomainError
    from hypermedia.infra import rpc
    from hypermedia.jobs.accounts import create_account

    pool = await db.create_pool(_database_url(), max_size=2)
    try:
        account_id, api_key, pool_id, webhook_secret = await create_account(
            pool, name, admin=admin, interactive=interactive
        )
    finally:
        await pool.close()
    millicredits = round(credits * 1000)
    balance = 0
    if millicredits > 0:
        try:
            async with rpc.channel(_credits_addr(), _admin_tls(), "credits") as chan:
                response = await rpc.call(
                    credits_pb2_grpc.CreditsServiceStub(chan).Grant,
                    credits_pb2.GrantRequest(
                        account_id=account_id, millicredits=millicredits, grant_id=str(uuid.uuid4())
                    ),
                )
                balance = response.balance_millicredits
        except DomainError as exc:  # the account exists: say so, with its key, rather than lose it
            print(
                f"hypermedia admin: account {account_id} was created, but granting its credits failed"
                f" ({exc.error_code}): hypermedia admin grant {account_id} --credits {credits:g}",
                file=sys.stderr,
            )
    return {
        "account_id": account_id,
        "api_key": api_key,
        "pool_id": pool_id,
        "credits": balance / 1000,
        "webhook_secret": webhook_secret,
        "admin": admin,
        "interactive": interactive,
    }


@admin.command("create-account")
def create_account_cmd(
    credits: Annotated[float, typer.Option(min=0, help="credits granted at creation")] = 0.0,
    name: Annotated[str, typer.Option(help="display name")] = "account",
    admin_account: Annotated[
        bool, typer.Option("--admin", help="its keys may also read the operators' API (/v1/admin/...)")
    ] = False,
    interactive: Annotated[
        bool, typer.Option("--interactive", help="it may use priorities 1-3 (the interactive band)")
    ] = False,
) -> None:
    """Create an account with a pool and an API key; prints JSON {account_id, api_key, pool_id, credits,
    webhook_secret, admin, interactive} (the secret verifies webhook signatures). Its job quota is
    the credits service's defaults (``set-quota`` changes it). When the credits cannot be granted
    the account is still printed (with 0 credits), stderr says how to grant them, and it exits 1."""
    logging.basicConfig(level=logging.WARNING)
    try:
        created = asyncio.run(_create_account(name, credits, admin_account, interactive))
    except (FileNotFoundError, config.ConfigError) as exc:
        print(f"hypermedia admin: {exc}", file=sys.stderr)
        raise typer.Exit(config.ConfigError.exit_code) from None
    print(json.dumps(created))
    if round(credits * 1000) > 0 and created["credits"] == 0:  # created, the grant failed (stderr says)
        raise typer.Exit(1)


async def _grant(account_id: str, credits: float) -> dict[str, Any]:
    from hypermedia.api.credits.v1 import credits_pb2, credits_pb2_grpc
    from hypermedia.infra import rpc

    async with rpc.channel(_credits_addr(), _admin_tls(), "credits") as chan:
        response = await rpc.call(
            credits_pb2_grpc.CreditsServiceStub(chan).Grant,
            credits_pb2.GrantRequest(
                account_id=account_id, millicredits=round(credits * 1000), grant_id=str(uuid.uuid4())
            ),
        )
    return {"account_id": account_id, "balance": response.balance_millicredits / 1000}


@admin.command("grant")
def grant_cmd(
    account_id: Annotated[str, typer.Argument(help="account to credit")],
    credits: Annotated[float, typer.Option(min=0.001, help="credits to add")],
) -> None:
    """Add credits to an account; prints JSON {account_id, balance}."""
    from hypermedia.core.errors import DomainError

    try:
        print(json.dumps(asyncio.run(_grant(account_id, credits))))
    except (FileNotFoundError, DomainError, config.ConfigError) as exc:
        print(f"hypermedia admin: {getattr(exc, 'public_message', exc)}", file=sys.stderr)
        raise typer.Exit(1) from None


async def _set_storage_quota(
    account_id: str, max_bytes: int | None, max_objects: int | None, default: bool
) -> dict[str, Any]:
    pool = await db.create_pool(_database_url(), max_size=1)
    try:
        async with pool.acquire() as conn, conn.transaction():
            if not await conn.fetchval("SELECT 1 FROM accounts WHERE account_id = $1", uuid.UUID(account_id)):
                raise LookupError(f"no account {account_id}")
            # The limits only: the usage counters are the storage service's (ADR 0029).
            row = await conn.fetchrow(
                """INSERT INTO storage_usage (account_id, max_bytes, max_objects) VALUES ($1, $2, $3)
                   ON CONFLICT (account_id) DO UPDATE SET
                       max_bytes = CASE WHEN $4 THEN NULL ELSE coalesce($2, storage_usage.max_bytes) END,
                       max_objects = CASE WHEN $4 THEN NULL ELSE coalesce($3, storage_usage.max_objects) END,
                       updated_at = now()
                   RETURNING used_bytes, used_objects, max_bytes, max_objects""",
                uuid.UUID(account_id),
                None if default else max_bytes,
                None if default else max_objects,
                default,
            )
    finally:
        await pool.close()
    assert row is not None  # INSERT … ON CONFLICT DO UPDATE … RETURNING yields the row
    return {"account_id": account_id, **dict(row)}


@admin.command("set-storage-quota")
def set_storage_quota_cmd(
    account_id: Annotated[str, typer.Argument(help="account whose quota to set")],
    max_bytes: Annotated[int | None, typer.Option(min=0, help="bytes of originals it may store")] = None,
    max_objects: Annotated[int | None, typer.Option(min=0, help="originals it may store at once")] = None,
    default: Annotated[bool, typer.Option("--default", help="back to the service's defaults")] = False,
) -> None:
    """Set an account's storage quota (either limit, or both; the other stays); prints JSON
    {account_id, used_bytes, used_objects, max_bytes, max_objects}, a null limit meaning the
    storage service's default (HM_STORAGE_QUOTA_BYTES, HM_STORAGE_QUOTA_OBJECTS). Lowering a
    limit below the usage deletes nothing: uploads are refused until the account is under it."""
    logging.basicConfig(level=logging.WARNING)
    if max_bytes is None and max_objects is None and not default:
        raise typer.BadParameter("give --max-bytes, --max-objects or --default")
    try:
        uuid.UUID(account_id)
    except ValueError:
        raise typer.BadParameter(f"{account_id!r} is not an account id") from None
    try:
        print(json.dumps(asyncio.run(_set_storage_quota(account_id, max_bytes, max_objects, default))))
    except (FileNotFoundError, LookupError) as exc:
        print(f"hypermedia admin: {exc}", file=sys.stderr)
        raise typer.Exit(1) from None


async def _set_quota(account_id: str, changes: dict[str, Any], default: bool) -> dict[str, Any]:
    from hypermedia.jobs.quotas import set_quota

    conn = await db.connect(_database_url())
    try:
        return await set_quota(conn, uuid.UUID(account_id), default=default, **changes)
    finally:
        await conn.close()


@admin.command("set-quota")
def set_quota_cmd(
    account_id: Annotated[str, typer.Argument(help="account whose job quota to set")],
    interactive: Annotated[
        bool | None,
        typer.Option("--interactive/--no-interactive", help="whether it may use priorities 1-3"),
    ] = None,
    max_queued_jobs: Annotated[
        int | None,
        typer.Option(min=0, max=10_000_000, help="jobs it may have queued or waiting for a retry at once"),
    ] = None,
    rate: Annotated[
        float | None,
        typer.Option(min=0.001, max=1_000_000, help="job-creating requests a second, on average"),
    ] = None,
    burst: Annotated[
        int | None, typer.Option(min=1, max=1_000_000, help="requests at once after a pause")
    ] = None,
    max_running_jobs: Annotated[
        int | None,
        typer.Option(min=0, max=100_000, help="jobs it may have running at once in each queue (0: no cap)"),
    ] = None,
    default: Annotated[
        bool,
        typer.Option("--default", help="every limit back to the service's defaults, no running-jobs cap"),
    ] = False,
) -> None:
    """Set an account's job quota (what is given; the rest stays); prints JSON {account_id,
    interactive, max_queued_jobs, rate_per_second, burst, max_running_jobs}, a null limit meaning
    the credits service's default (HM_QUOTA_MAX_QUEUED_JOBS, HM_QUOTA_RATE_PER_SECOND,
    HM_QUOTA_BURST) and a null max_running_jobs no cap (docs/operations.md "Job quotas")."""
    logging.basicConfig(level=logging.WARNING)
    changes = {
        "interactive": interactive,
        "max_queued_jobs": max_queued_jobs,
        "rate_per_second": rate,
        "burst": burst,
        "max_running_jobs": max_running_jobs,
    }
    if all(v is None for v in changes.values()) and not default:
        raise typer.BadParameter(
            "give --interactive/--no-interactive, --max-queued-jobs, --rate, --burst, "
            "--max-running-jobs or --default"
        )
    if default and any(v is not None for k, v in changes.items() if k != "interactive"):
        raise typer.BadParameter("--default puts every limit back to the defaults: give no limit with it")
    try:
        uuid.UUID(account_id)
    except ValueError:
        raise typer.BadParameter(f"{account_id!r} is not an account id") from None
    try:
        print(json.dumps(asyncio.run(_set_quota(account_id, changes, default))))
    except (FileNotFoundError, LookupError, ValueError) as exc:
        print(f"hypermedia admin: {exc}", file=sys.stderr)
        raise typer.Exit(1) from None


async def _scheduler_report(limit: int) -> dict[str, Any]:
    conn = await db.connect(_database_url())
    try:
        return await scheduler_report(conn, limit=limit)
    finally:
        await conn.close()


@admin.command("scheduler")
def scheduler_cmd(
    limit: Annotated[int, typer.Option(min=1, max=1000, help="burst workers and decisions to list")] = 20,
) -> None:
    """The scheduler's pools (live burst workers, spend per hour, cost so far, latest decision),
    its last burst workers with what each cost, and its last decisions, as JSON
    (hypermedia/jobs/scaling.py; docs/operations.md "Scheduler")."""
    logging.basicConfig(level=logging.WARNING)
    try:
        print(json.dumps(asyncio.run(_scheduler_report(limit))))
    except (OSError, asyncpg.PostgresError) as exc:
        print(f"hypermedia admin scheduler: {type(exc).__name__}: {exc}", file=sys.stderr)
        raise typer.Exit(1) from None


async def _with_conn(work: Callable[[Any], Awaitable[Any]]) -> Any:
    conn = await db.connect(_database_url())
    try:
        return await work(conn)
    finally:
        await conn.close()


def _changes(pairs: list[str]) -> dict[str, int]:
    changes = {}
    for pair in pairs:
        field, sep, value = pair.partition("=")
        if not sep or not value.strip().lstrip("-").isdigit():
            raise typer.BadParameter(f"{pair!r}: give FIELD=INTEGER, e.g. timeout_seconds=60")
        changes[field.strip()] = int(value)
    return changes


@admin.command("profile-version")
def profile_version_cmd(
    operation: Annotated[str, typer.Argument(help="operation whose profile gets a new version")],
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", help="FIELD=INTEGER to change in the new version (repeatable)"),
    ] = None,
) -> None:
    """Make the next version of OPERATION's profile the active one (a copy of the active version
    with the --set changes); jobs created from now on run under it and the older versions'
    outputs become outdated (admin outdated). Prints the new profile as JSON."""
    from hypermedia.jobs import profiles

    logging.basicConfig(level=logging.WARNING)
    changes = _changes(set_ or [])
    try:
        row = asyncio.run(_with_conn(lambda conn: profiles.new_version(conn, operation, changes)))
    except (LookupError, ValueError) as exc:
        print(f"hypermedia admin profile-version: {exc}", file=sys.stderr)
        raise typer.Exit(1) from None
    except (OSError, asyncpg.PostgresError) as exc:
        print(f"hypermedia admin profile-version: {type(exc).__name__}: {exc}", file=sys.stderr)
        raise typer.Exit(1) from None
    print(json.dumps(scaling.jsonable(row)))


@admin.command("outdated")
def outdated_cmd(
    operation: Annotated[str, typer.Option(help="only this operation's outputs")] = "",
    account: Annotated[str | None, typer.Option(help="only this account's outputs")] = None,
    preset: Annotated[
        str,
        typer.Option(help="instead: the outputs a newer version of this preset of --account made outdated"),
    ] = "",
    limit: Annotated[int, typer.Option(min=1, max=10_000, help="outputs to list")] = 100,
) -> None:
    """The outputs a newer active profile version has made outdated (made under an older version,
    with no output of the active one yet for the same object, operation and params), oldest
    first, as JSON {"outputs": [...]}. With --preset (and --account): the outputs of jobs made
    from an older version of that preset, for objects without one of the active version."""
    from hypermedia.jobs import presets, profiles

    logging.basicConfig(level=logging.WARNING)
    if account is not None:
        _account_id(account)
    if preset and (account is None or operation):
        raise typer.BadParameter("--preset takes --account (a preset is an account's) and no --operation")
    try:
        if preset:
            assert account is not None
            rows = asyncio.run(
                _with_conn(
                    lambda conn: presets.outdated_outputs(conn, uuid.UUID(account), preset, limit=limit)
                )
            )
        else:
            rows = asyncio.run(
                _with_conn(
                    lambda conn: profiles.outdated_outputs(
                        conn, operation=operation, account_id=account, limit=limit
                    )
                )
            )
    except (OSError, asyncpg.PostgresError) as exc:
        print(f"hypermedia admin outdated: {type(exc).__name__}: {exc}", file=sys.stderr)
        raise typer.Exit(1) from None
    print(json.dumps(scaling.jsonable({"outputs": rows})))


@admin.command("backfills")
def backfills_cmd(
    account: Annotated[str | None, typer.Option(help="only this account's runs")] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="runs to list")] = 50,
) -> None:
    """Backfill runs, newest first, with their progress, as JSON {"runs": [...]} (every account's
    unless --account)."""
    from hypermedia.jobs.backfill import runs

    logging.basicConfig(level=logging.WARNING)
    if account is not None:
        _account_id(account)
    try:
        found = asyncio.run(_with_conn(lambda conn: runs.list_runs(conn, account, limit)))
    except (OSError, asyncpg.PostgresError) as exc:
        print(f"hypermedia admin backfills: {type(exc).__name__}: {exc}", file=sys.stderr)
        raise typer.Exit(1) from None
    print(json.dumps({"runs": [runs.as_json(r) for r in found]}))


BACKFILL_ACTIONS = ("show", "pause", "resume", "cancel", "replay")


@admin.command("backfill")
def backfill_cmd(
    action: Annotated[str, typer.Argument(help="show, pause, resume, cancel or replay")],
    run_id: Annotated[str, typer.Argument(help="the run's id (admin backfills lists them)")],
) -> None:
    """Show a backfill run of any account, or pause, resume or cancel it, or replay its failures,
    as the account's own API would (a cancel also cancels its jobs that have not started; the
    reaper then releases their holds). Prints the run as JSON; exit 1 with the reason when the
    run is not found or not in a state the action applies to."""
    from hypermedia.core.errors import DomainError
    from hypermedia.jobs import lifecycle
    from hypermedia.jobs.backfill import runs

    logging.basicConfig(level=logging.WARNING)
    if action not in BACKFILL_ACTIONS:
        raise typer.BadParameter(f"{action!r}: give one of {', '.join(BACKFILL_ACTIONS)}")
    try:
        uuid.UUID(run_id)
    except ValueError:
        raise typer.BadParameter(f"{run_id!r} is not a run id") from None

    async def act(conn: Any) -> dict[str, Any]:
        extra: dict[str, Any] = {}
        if action == "replay":
            extra["replayed"] = await runs.replay_failures(conn, run_id)
        elif action != "show":
            await runs.transition(conn, run_id, action)
        run = await runs.get(conn, run_id)
        if action == "cancel":
            cancelled = 0
            for job_id in await runs.waiting_jobs(conn, run_id):
                cancelled += await lifecycle.cancel_if_waiting(conn, job_id, run.account_id)
            extra["jobs_cancelled"] = cancelled
            run = await runs.get(conn, run_id)
        return runs.as_json(run) | extra

    try:
        shown = asyncio.run(_with_conn(act))
    except DomainError as exc:
        print(f"hypermedia admin backfill: {exc.error_code}: {exc.public_message}", file=sys.stderr)
        raise typer.Exit(1) from None
    except (OSError, asyncpg.PostgresError) as exc:
        print(f"hypermedia admin backfill: {type(exc).__name__}: {exc}", file=sys.stderr)
        raise typer.Exit(1) from None
    print(json.dumps(shown))


schedule_admin.register(admin, _with_conn)
key_admin.register(admin, _with_conn)


def _account_id(account: str) -> None:
    try:
        uuid.UUID(account)
    except ValueError:
        raise typer.BadParameter(f"{account!r} is not an account id") from None


if __name__ == "__main__":
    app()
