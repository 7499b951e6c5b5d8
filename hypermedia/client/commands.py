"""The client commands of ``hypermedia``, over the REST API with an API key (``HM_API_KEY`` or
the config file: :class:`~hypermedia.client.session.ClientSettings`):

- ``hypermedia submit FILE --op thumbnail --op convert:format=avif [--watch] [--download DIR]``
- ``hypermedia jobs ls|get|watch|cancel``, ``hypermedia objects ls|get|rm``, ``hypermedia operations``,
  ``hypermedia credits [--ledger N]``
- ``hypermedia schedules ls|add|runs|trigger|pause|resume|rm``

Tables on stdout (rich), progress on stderr when it is a terminal, ``--json`` for scripts.

Exit codes: 0 done (every watched job completed); 1 a watched job failed or was cancelled;
2 a usage or configuration error (no API key, a malformed ``--op``, ``--at`` or ``--delay``);
3 the API refused the request (its ``error_code`` and detail on stderr); 4 the gateway could not
be reached.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar
from urllib.parse import quote

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn
from rich.table import Table

from hypermedia.client.session import TERMINAL, ApiError, ClientSettings, ConfigMissing, Session
from hypermedia.client.views import jobs_table, outputs_table, saved_name
from hypermedia.core import manifests
from hypermedia.core.errors import InvalidArgument
from hypermedia.core.rfc3339 import parse_rfc3339

T = TypeVar("T")

EXIT_JOB_FAILED = 1
EXIT_USAGE = 2
EXIT_API = 3
EXIT_UNREACHABLE = 4

# No markup (ids, params and the API's messages are shown as they are), and no wrapping at 80
# columns when the output is a pipe: ids and cursors must stay whole to be copied.
out = Console(markup=False, highlight=False, width=None if sys.stdout.isatty() else 1000)
err = Console(stderr=True, markup=False, highlight=False, width=None if sys.stderr.isatty() else 1000)

jobs_app = typer.Typer(no_args_is_help=True, help="your jobs: ls, get, watch, cancel")
objects_app = typer.Typer(no_args_is_help=True, help="your objects: ls, get, rm")
schedules_app = typer.Typer(
    no_args_is_help=True, help="your schedules: ls, add, runs, trigger, pause, resume, rm"
)

JsonFlag = Annotated[bool, typer.Option("--json", help="print JSON (for scripts) instead of tables")]


def _fail(code: int, message: str) -> NoReturn:
    err.print(f"error: {message}")
    raise typer.Exit(code)


def _session() -> Session:
    try:
        return Session(ClientSettings.load())
    except ConfigMissing as exc:
        _fail(EXIT_USAGE, str(exc))
    except ValueError as exc:
        _fail(EXIT_USAGE, str(exc))


def _api(exc: ApiError) -> NoReturn:
    _fail(EXIT_UNREACHABLE if exc.status == 0 else EXIT_API, str(exc))


def _ask(call: Callable[[Session], T]) -> T:
    """``call`` on a session of the configured gateway; an API error is the command's exit."""
    with _session() as session:
        try:
            return call(session)
        except ApiError as exc:
            _api(exc)


def parse_op(spec: str) -> dict[str, Any] | str:
    """``--op`` as a request's operation: ``NAME``, ``NAME:key=value,key=value`` (each value read
    as JSON when it parses: ``size=128``, ``hls=true``, ``languages=["eng","deu"]``; else a
    string), ``preset:NAME``, or a JSON object. Raises ValueError naming what is wrong."""
    spec = spec.strip()
    if spec.startswith("{"):
        try:
            value = json.loads(spec)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--op {spec!r}: not JSON: {exc}") from None
        if not isinstance(value, dict):
            raise ValueError(f"--op {spec!r}: a JSON operation must be an object")
        return value
    name, _, rest = spec.partition(":")
    if not name:
        raise ValueError(f"--op {spec!r}: no operation name")
    if name == "preset":
        return {"preset": rest}
    if not rest:
        return name
    params: dict[str, Any] = {}
    for pair in _split(rest):
        key, eq, raw = pair.partition("=")
        if not eq or not key:
            raise ValueError(f"--op {spec!r}: params are key=value, separated by commas")
        try:
            params[key.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            params[key.strip()] = raw
    return {"name": name, "params": params}


def _split(text: str) -> list[str]:
    """Commas outside brackets and quotes separate params (``languages=["eng","deu"],dpi=300``)."""
    parts, depth, quoted, start = [], 0, False, 0
    for i, ch in enumerate(text):
        if ch == '"':
            quoted = not quoted
        elif not quoted and ch in "[{":
            depth += 1
        elif not quoted and ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0 and not quoted:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p for p in parts if p.strip()]


def _progress(disable: bool) -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        console=err,
        disable=disable or not err.is_terminal,
        transient=True,
    )


def _watch(session: Session, job_ids: list[str], quiet: bool) -> list[dict[str, Any]]:
    """Follow each job's events until it ends (a progress bar each); returns the jobs as they
    ended."""
    ended = []
    with _progress(quiet) as bars:
        for job_id in job_ids:
            task = bars.add_task(f"{job_id[:8]} queued", total=1.0)
            for event in session.events(job_id):
                status, progress = event.get("status") or "", event.get("progress")
                bars.update(task, description=f"{job_id[:8]} {status}", completed=progress or 0.0)
                if status in TERMINAL:
                    break
            bars.update(task, completed=1.0)
            ended.append(session.job(job_id))
    return ended


def _folder(download: Path | None) -> None:
    """Make the download folder before anything is uploaded or charged: exit 2 if it cannot be."""
    if download is not None:
        try:
            download.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            _fail(EXIT_USAGE, f"--download {download}: {exc.strerror or exc}")


def _download(session: Session, jobs: list[dict[str, Any]], folder: Path, stem: str) -> list[str]:
    """Each completed job's outputs into ``folder`` as ``{stem}.{output_type}{ext}``; a second
    output of one type (two thumbnails) gets its job's id too, never overwrites the first. An
    output that names its siblings (an HLS playlist, a WebVTT thumbnail track) is rewritten to
    name the files saved beside it, so that the folder plays as it is
    (:func:`hypermedia.core.manifests.rewrite`)."""
    written: list[str] = []
    for job in jobs:
        saved: dict[str, Path] = {}
        for output in job.get("outputs", []):
            path = folder / saved_name(stem, output["output_type"], output["mime_type"])
            if str(path) in written:
                path = folder / saved_name(
                    stem, f"{output['output_type']}.{job['job_id'][:8]}", output["mime_type"]
                )
            session.download(job["job_id"], output["output_type"], path)
            written.append(str(path))
            saved[output["output_type"]] = path
        _name_saved_siblings(job, saved)
    return written


def _name_saved_siblings(job: dict[str, Any], saved: dict[str, Path]) -> None:
    """Rewrites each saved HLS playlist or WebVTT track of ``job`` so that its references to
    sibling outputs (``hls_720p_media``) name the files saved for them (``saved``: output type
    → path), relative to the folder, URL-encoded."""

    def link(name: str) -> str | None:
        return quote(saved[name].name) if name in saved else None

    for output in job.get("outputs", []):
        kind = manifests.kind_of(output["mime_type"])
        if kind is not None:
            path = saved[output["output_type"]]
            text = path.read_text(encoding="utf-8", errors="replace")
            path.write_text(manifests.rewrite(kind, text, link), encoding="utf-8")


def submit(
    file: Annotated[
        Path, typer.Argument(exists=True, dir_okay=False, readable=True, help="the original to upload")
    ],
    op: Annotated[
        list[str],
        typer.Option(
            "--op",
            help="an operation: NAME, NAME:key=value,... (values as JSON), preset:NAME, or a JSON "
            "object; repeat for several",
        ),
    ],
    watch: Annotated[bool, typer.Option("--watch", help="follow the jobs until they end")] = False,
    download: Annotated[
        Path | None, typer.Option("--download", help="save the outputs in this folder (implies --watch)")
    ] = None,
    priority: Annotated[int | None, typer.Option(min=1, max=10, help="1 (first) .. 10")] = None,
    at: Annotated[
        str | None,
        typer.Option(
            "--at", help="run the jobs at this RFC 3339 time (2026-12-24T18:00:00Z), at most 30 days ahead"
        ),
    ] = None,
    delay: Annotated[
        float | None, typer.Option("--delay", help="run the jobs this many seconds from now")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Upload FILE and run the operations on it; with --watch, wait for the jobs (exit 1 if one
    failed), with --download, save their outputs. --at or --delay make them delayed jobs
    (``scheduled`` until then, credits held now)."""
    try:
        operations = [parse_op(o) for o in op]
    except (ValueError, json.JSONDecodeError) as exc:
        _fail(EXIT_USAGE, str(exc))
    _check_delay(at, delay)
    _folder(download)
    with _session() as session:
        try:
            with _progress(as_json) as bars:
                task = bars.add_task(f"upload {file.name}", total=file.stat().st_size)
                obj = session.upload(file, lambda n: bars.advance(task, n))
            try:
                created = session.process(
                    obj["object_id"], operations, priority, not_before=at, delay_seconds=delay
                )
            except ApiError:
                # Refused (unknown operation, bad params, credits): the upload must not stay behind
                # counted against the storage quota with an id the user never saw.
                with contextlib.suppress(ApiError):
                    session.delete_object(obj["object_id"])
                raise
            result: dict[str, Any] = {"object": obj, **created}
            if watch or download is not None:
                jobs = _watch(session, created["job_ids"], as_json)
                result["jobs"] = jobs
                if download is not None:
                    result["downloaded"] = _download(
                        session, [j for j in jobs if j["status"] == "completed"], download, file.stem
                    )
        except ApiError as exc:
            _api(exc)
    if as_json:
        out.print_json(data=result)
    elif "jobs" in result:
        out.print(jobs_table(result["jobs"]))
        out.print(outputs_table(result["jobs"]))
        for path in result.get("downloaded", []):
            out.print(f"saved {path}", highlight=False)
    else:
        due = f"; scheduled for {created['not_before']}" if created.get("not_before") else ""
        out.print(f"object {obj['object_id']}; jobs {' '.join(created['job_ids'])}{due}", highlight=False)
    if any(j["status"] != "completed" for j in result.get("jobs", [])):
        raise typer.Exit(EXIT_JOB_FAILED)


def _check_delay(at: str | None, delay: float | None) -> None:
    """Exit 2 (before anything is uploaded) for ``--at`` and ``--delay`` together, an ``--at``
    that is not an RFC 3339 time with an offset, or a ``--delay`` that is negative or not finite.
    The 30-day horizon is the gateway's to check (exit 3)."""
    if at is not None and delay is not None:
        _fail(EXIT_USAGE, "give --at or --delay, not both")
    if at is not None:
        try:
            parse_rfc3339(at)
        except InvalidArgument as exc:
            _fail(EXIT_USAGE, f"--at {at[:64]!r}: {exc.public_message.removeprefix('not_before ')}")
    if delay is not None and not (math.isfinite(delay) and delay >= 0):
        _fail(EXIT_USAGE, f"--delay {delay}: must be a finite number of seconds ≥ 0")


@jobs_app.command("ls")
def jobs_ls(
    status: Annotated[list[str] | None, typer.Option("--status", help="only these statuses (repeat)")] = None,
    operation: Annotated[str | None, typer.Option(help="only this operation")] = None,
    object_id: Annotated[str | None, typer.Option("--object", help="only jobs on this object")] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="jobs a page")] = 20,
    cursor: Annotated[str | None, typer.Option(help="next_cursor of the previous page")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Your jobs, newest first, a page at a time."""
    with _session() as session:
        try:
            page = session.jobs(
                status=status or None, operation=operation, object_id=object_id, limit=limit, cursor=cursor
            )
        except ApiError as exc:
            _api(exc)
    if as_json:
        out.print_json(data=page)
        return
    out.print(jobs_table(page["jobs"]) if page["jobs"] else "no jobs")
    if page.get("next_cursor"):
        out.print(f"more: --cursor {page['next_cursor']}", highlight=False)


@jobs_app.command("get")
def jobs_get(job_id: str, as_json: JsonFlag = False) -> None:
    """A job with its attempts and outputs (exit 1 if it failed or was cancelled)."""
    job = _ask(lambda session: session.job(job_id))
    if as_json:
        out.print_json(data=job)
    else:
        out.print(jobs_table([job]))
        if job["outputs"]:
            out.print(outputs_table([job]))
    if job["status"] in ("failed", "cancelled"):
        raise typer.Exit(EXIT_JOB_FAILED)


@jobs_app.command("watch")
def jobs_watch(
    job_ids: Annotated[list[str], typer.Argument(help="one or more job ids")], as_json: JsonFlag = False
) -> None:
    """Follow jobs until they end; exit 1 if one failed or was cancelled."""
    jobs = _ask(lambda session: _watch(session, job_ids, as_json))
    if as_json:
        out.print_json(data=jobs)
    else:
        out.print(jobs_table(jobs))
    if any(j["status"] != "completed" for j in jobs):
        raise typer.Exit(EXIT_JOB_FAILED)


@jobs_app.command("cancel")
def jobs_cancel(job_id: str, as_json: JsonFlag = False) -> None:
    """Cancel a queued job at once, or ask a running one to stop."""
    job = _ask(lambda session: session.cancel(job_id))
    if as_json:
        out.print_json(data=job)
    else:
        out.print(jobs_table([job]))


@objects_app.command("ls")
def objects_ls(
    kind: Annotated[
        str | None, typer.Option(help="original or output (of your jobs); both when left out")
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="objects a page")] = 20,
    cursor: Annotated[str | None, typer.Option(help="next_cursor of the previous page")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Your objects, newest first, a page at a time (``objects get ID`` for a download URL)."""
    page = _ask(lambda session: session.objects(kind=kind, limit=limit, cursor=cursor))
    if as_json:
        out.print_json(data=page)
        return
    table = Table("object", "type", "bytes", "name", "from", "created (UTC)")
    for o in page["objects"]:
        table.add_row(
            o["object_id"],
            o["mime_type"],
            str(o["size_bytes"]),
            o["filename"],
            o["source_object_id"] or "",
            o["created_at"],
        )
    out.print(table if page["objects"] else "no objects")
    if page.get("next_cursor"):
        out.print(f"more: --cursor {page['next_cursor']}", highlight=False)


@objects_app.command("get")
def objects_get(object_id: str, as_json: JsonFlag = False) -> None:
    """An object (original or output) with a download URL valid 15 minutes."""
    obj = _ask(lambda session: session.object(object_id))
    if as_json:
        out.print_json(data=obj)
        return
    table = Table("field", "value")
    for key, value in obj.items():
        table.add_row(key, str(value))
    out.print(table)


@objects_app.command("rm")
def objects_rm(object_id: str, as_json: JsonFlag = False) -> None:
    """Delete an original and every output derived from it (refused while a job on them runs)."""
    usage = _ask(lambda session: session.delete_object(object_id))
    if as_json:
        out.print_json(data=usage)
    else:
        out.print(
            f"deleted {object_id}; storage used: {usage['used_bytes']} of {usage['limit_bytes']} bytes",
            highlight=False,
        )


def _schedules_table(schedules: list[dict[str, Any]]) -> Table:
    table = Table("name", "kind", "cron", "time zone", "next run (UTC)", "last run", "last run's state")
    for s in schedules:
        last = s.get("last_run") or {}
        table.add_row(
            s["name"],
            s["kind"],
            s["cron"],
            s["time_zone"],
            "paused" if s["paused"] else s["next_run_at"],
            last.get("due_at", ""),
            last.get("state", ""),
        )
    return table


@schedules_app.command("ls")
def schedules_ls(as_json: JsonFlag = False) -> None:
    """Your schedules with their next tick and last run."""
    listed = _ask(lambda session: session.schedules())
    if as_json:
        out.print_json(data=listed)
    else:
        out.print(_schedules_table(listed["schedules"]) if listed["schedules"] else "no schedules")


@schedules_app.command("add")
def schedules_add(
    name: str,
    cron: Annotated[str, typer.Option(help="five fields (minute hour day month weekday) or @daily etc.")],
    object_id: Annotated[
        list[str], typer.Option("--object", help="an object to process at each tick; repeat")
    ],
    op: Annotated[list[str], typer.Option("--op", help="an operation, as submit's --op; repeat")],
    time_zone: Annotated[str, typer.Option(help="IANA time zone the cron is read in")] = "UTC",
    missed: Annotated[str, typer.Option(help="skip or catch_up")] = "skip",
    as_json: JsonFlag = False,
) -> None:
    """A schedule that runs the operations on the objects at each tick of CRON."""
    try:
        operations = [parse_op(o) for o in op]
    except (ValueError, json.JSONDecodeError) as exc:
        _fail(EXIT_USAGE, str(exc))
    body = {
        "name": name,
        "cron": cron,
        "time_zone": time_zone,
        "missed": missed,
        "process": {"object_ids": object_id, "operations": operations},
    }
    made = _ask(lambda session: session.add_schedule(body))
    if as_json:
        out.print_json(data=made)
    else:
        out.print(_schedules_table([made]))


@schedules_app.command("runs")
def schedules_runs(name: str, as_json: JsonFlag = False) -> None:
    """A schedule's runs, latest first: due time, trigger, state, what each made or why it failed."""
    listed = _ask(lambda session: session.schedule_runs(name))
    if as_json:
        out.print_json(data=listed)
        return
    table = Table("due", "trigger", "state", "outcome", "error")
    for r in listed["runs"]:
        outcome = json.dumps(r["outcome"]) if r["outcome"] is not None else ""
        error = f"{r['error_code']}: {r['error']}" if r["error_code"] else ""
        table.add_row(r["due_at"], r["trigger"], r["state"], outcome, error)
    out.print(table)


def _schedule_action(action: str) -> Callable[[str, bool], None]:
    def command(name: str, as_json: JsonFlag = False) -> None:
        answer = _ask(lambda session: session.schedule_action(name, action))
        if as_json:
            out.print_json(data=answer)
        elif action == "trigger":
            out.print(f"run {answer['run_id']} of {name}: {answer['state']}", highlight=False)
        else:
            out.print(_schedules_table([answer]))

    command.__doc__ = {
        "trigger": "Run a schedule now, beside its ticks (one manual run at a time).",
        "pause": "Stop a schedule's ticks until resumed.",
        "resume": "Start a schedule's ticks again (missed ones follow its policy).",
    }[action]
    return command


for _action in ("trigger", "pause", "resume"):
    schedules_app.command(_action)(_schedule_action(_action))


@schedules_app.command("rm")
def schedules_rm(name: str) -> None:
    """Delete a schedule and its run history (what its runs made stays)."""
    _ask(lambda session: session.delete_schedule(name))
    out.print(f"deleted schedule {name}", highlight=False)


def credits(
    ledger: Annotated[int, typer.Option(min=0, max=1000, help="also the newest N ledger entries")] = 0,
    as_json: JsonFlag = False,
) -> None:
    """Your balance, what unfinished jobs hold, and what new requests may still hold; with
    ``--ledger N`` the newest N ledger entries, which explain every charge."""
    shown = _ask(
        lambda session: (
            {"credits": session.credits()} | ({"ledger": session.ledger(ledger)} if ledger else {})
        )
    )
    if as_json:
        out.print_json(data=shown)
        return
    table = Table("balance", "held", "available")
    table.add_row(*(str(shown["credits"][k]) for k in ("balance", "held", "available")))
    out.print(table)
    if ledger:
        entries = Table("at", "kind", "line", "credits", "job_id", "operation", "job_status")
        for e in shown["ledger"]["entries"]:
            entries.add_row(
                e["at"], e["kind"], e["line"], str(e["credits"]), e["job_id"] or "", e["operation"] or "",
                e["job_status"] or "",
            )  # fmt: skip
        out.print(entries)


def operations(as_json: JsonFlag = False) -> None:
    """The operations you may run, with their queue, price and params."""
    listed = _ask(lambda session: session.operations())
    if as_json:
        out.print_json(data=listed)
        return
    table = Table("operation", "queue", "inputs", "credits", "params")
    for o in listed["operations"]:
        terms = o["price"]
        price = f"{terms['base_credits']} + {terms['per_mb_credits']}/MiB"
        if terms.get("work_unit"):
            price += f" (charged {terms['base_credits']} + {terms['per_unit_credits']}/{terms['work_unit']}, at most)"
        params = ", ".join(o["params_schema"].get("properties", {}))
        table.add_row(o["name"], o["queue"], ", ".join(o["input_kinds"]), price, params)
    out.print(table)


def register(app: typer.Typer) -> None:
    """Adds the client commands to the ``hypermedia`` command."""
    app.command("submit")(submit)
    app.command("operations")(operations)
    app.command("credits")(credits)
    app.add_typer(jobs_app, name="jobs")
    app.add_typer(objects_app, name="objects")
    app.add_typer(schedules_app, name="schedules")
