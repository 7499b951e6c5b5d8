"""The web dashboard at ``/dashboard`` (issue 22 item 6, ADR 0067): server-rendered pages, no
script and nothing from another origin. Sign in with an API key; the session is a signed cookie
(HttpOnly, SameSite=Strict, 8 hours) naming the account, never holding the key. Pages: the
account's balance and its waiting jobs by queue and band (every account's for an admin), its jobs
filtered by status and operation, a page per job (attempts with worker, duration, peak memory and
error; outputs with image previews; cancel and retry). Forms that change something carry a token
derived from the session (CSRF).

Every value shown goes through Jinja's autoescape: file names, params and error messages come
from users."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Final

import asyncpg
from fastapi import APIRouter, Form, Query, Request
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, FileSystemLoader, select_autoescape

from hypermedia.core.errors import DomainError, PermissionDenied, Unauthenticated
from hypermedia.jobs.accounts import Caller
from hypermedia.jobs.pricing import as_credits
from services.gateway.process_request import OperationRequest
from services.gateway.resolved import OutputResolver
from services.gateway.status import JOB_STATUSES, JobFilter
from services.gateway.usecases import UseCases

COOKIE: Final = "hm_session"
SESSION_SECONDS: Final = 8 * 3600
"""How long a sign-in lasts (a revoked key's session ends at the latest then)."""
EVENTS_SHOWN: Final = 200
"""A job page lists at most this many of its events (the SSE stream has them all)."""

STATIC_DIR: Final = Path(__file__).with_name("dashboard_static")
STATIC: Final = frozenset({"hls.light.min.js", "player.js"})
"""The bundled scripts the pages may load (``/dashboard/static/{name}``; their sources: the
directory's README)."""

_templates = Environment(
    loader=FileSystemLoader(Path(__file__).with_name("dashboard_templates")),
    autoescape=select_autoescape(default=True, default_for_string=True),
)


class Sessions:
    """Signed session tokens: ``base64(json{account_id, pool_id, is_admin, read_only, expires}).hmac``
    (a token without ``read_only``, issued before read-only keys existed, is a full key's)."""

    def __init__(self, key: bytes) -> None:
        self._key = key

    @classmethod
    def from_secret(cls, secret: str) -> Sessions:
        """Keyed from ``HM_GATEWAY_SECRET_KEY`` (sessions survive restarts and hold across
        replicas); without one, a key of this process."""
        key = (
            hmac.new(secret.encode(), b"hypermedia dashboard session", hashlib.sha256).digest()
            if secret
            else b""
        )
        return cls(key or secrets.token_bytes(32))

    def issue(self, caller: Caller, now: float | None = None) -> str:
        body = {"a": caller.account_id, "p": caller.pool_id, "x": caller.is_admin, "r": caller.read_only}
        body["e"] = int((now or time.time()) + SESSION_SECONDS)
        data = base64.urlsafe_b64encode(json.dumps(body, separators=(",", ":")).encode()).decode()
        return f"{data}.{self._sign(data)}"

    def read(self, token: str | None, now: float | None = None) -> Caller | None:
        """The session's caller, or None for no token, a bad signature or an expired one."""
        if not token or "." not in token:
            return None
        data, _, signature = token.rpartition(".")
        if not hmac.compare_digest(self._sign(data), signature):
            return None
        try:
            body = json.loads(base64.urlsafe_b64decode(data.encode()))
        except ValueError:
            return None
        if int(body["e"]) < (now or time.time()):
            return None
        return Caller(
            account_id=str(body["a"]),
            pool_id=str(body["p"]),
            is_admin=bool(body["x"]),
            read_only=bool(body.get("r", False)),
        )

    def csrf(self, token: str) -> str:
        """The forms' token of a session (a page of another origin cannot read it)."""
        return self._sign("csrf:" + token)

    def _sign(self, data: str) -> str:
        return hmac.new(self._key, data.encode(), hashlib.sha256).hexdigest()


async def queue_summary(pool: asyncpg.Pool, caller: Caller) -> list[dict[str, Any]]:
    """Queued jobs per queue and priority band with the oldest one's age (seconds): the caller's,
    or every account's for an admin."""
    rows = await pool.fetch(
        """
        SELECT queue, priority, count(*) AS jobs,
               extract(epoch FROM now() - min(coalesce(queued_at, created_at)))::float8 AS oldest
        FROM processing_jobs
        WHERE status = 'queued' AND ($1::boolean OR account_id = $2::uuid)
        GROUP BY queue, priority ORDER BY queue, priority
        """,
        caller.is_admin,
        caller.account_id,
    )
    return [dict(r) for r in rows]


async def delayed_summary(pool: asyncpg.Pool, caller: Caller) -> dict[str, Any]:
    """The delayed jobs still ``scheduled`` (ADR 0071), the caller's or every account's for an
    admin: ``{"jobs": n, "next_due": datetime | None}`` (their credits are held already)."""
    row = await pool.fetchrow(
        "SELECT count(*) AS jobs, min(not_before) AS next_due FROM processing_jobs "
        "WHERE status = 'scheduled' AND ($1::boolean OR account_id = $2::uuid)",
        caller.is_admin,
        caller.account_id,
    )
    return dict(row) if row is not None else {"jobs": 0, "next_due": None}


CHART_MINUTES = 60
"""The Overview's charts: the jobs that ended in each of the last 60 minutes."""


async def minute_series(pool: asyncpg.Pool, caller: Caller) -> list[dict[str, Any]]:
    """The jobs that ended (``completed`` or ``failed``) in each of the last
    :data:`CHART_MINUTES` minutes, oldest first, the caller's or every account's for an admin:
    ``{"minute": datetime, "completed": n, "failed": n, "ended": n, "p50_ms": float | None,
    "p95_ms": …}``,
    the latencies those completed took from queued (or created) to completed. Only jobs created within the last day
    are read (the ``created_at`` index); a job that waited longer is left out of its minute."""
    rows = await pool.fetch(
        """
        WITH minutes AS (
            SELECT generate_series(date_trunc('minute', now()) - make_interval(mins => $3 - 1),
                                   date_trunc('minute', now()), interval '1 minute') AS minute
        ), ended AS (
            SELECT date_trunc('minute', completed_at) AS minute, status,
                   completed_at - coalesce(queued_at, created_at) AS took
            FROM processing_jobs
            WHERE created_at > now() - interval '1 day' AND status IN ('completed', 'failed')
              AND parent_job_id IS NULL  -- a fanned-out job's children are parts of it
              AND completed_at >= date_trunc('minute', now()) - make_interval(mins => $3 - 1)
              AND ($1::boolean OR account_id = $2::uuid)
        )
        SELECT m.minute,
               count(e.status) FILTER (WHERE e.status = 'completed') AS completed,
               count(e.status) FILTER (WHERE e.status = 'failed') AS failed,
               percentile_cont(0.5) WITHIN GROUP (ORDER BY e.took) FILTER (WHERE e.status = 'completed') AS p50,
               percentile_cont(0.95) WITHIN GROUP (ORDER BY e.took) FILTER (WHERE e.status = 'completed') AS p95
        FROM minutes m LEFT JOIN ended e ON e.minute = m.minute
        GROUP BY m.minute ORDER BY m.minute
        """,
        caller.is_admin,
        caller.account_id,
        CHART_MINUTES,
    )
    return [
        {
            "minute": row["minute"],
            "completed": row["completed"],
            "failed": row["failed"],
            "ended": row["completed"] + row["failed"],
            "p50_ms": row["p50"].total_seconds() * 1000 if row["p50"] is not None else None,
            "p95_ms": row["p95"].total_seconds() * 1000 if row["p95"] is not None else None,
        }
        for row in rows
    ]


async def job_events(pool: asyncpg.Pool, job_id: str, limit: int = EVENTS_SHOWN) -> list[dict[str, Any]]:
    """The first ``limit`` events of ``job_id`` (status changes and progress, oldest first); the
    caller has read the job already (its account's)."""
    rows = await pool.fetch(
        "SELECT created_at, kind, status, progress, detail FROM job_events WHERE job_id = $1 "
        "ORDER BY event_id LIMIT $2",
        job_id,
        limit,
    )
    return [dict(r) for r in rows]


async def workers(pool: asyncpg.Pool) -> list[dict[str, Any]]:
    """Every worker not stopped, by queue: its status, slots, heartbeat age (seconds) and latest
    metrics sample (``worker_metrics``: busy slots, CPU, available memory, jobs done, and its
    admission then: the reason, and a unit's control's target)."""
    rows = await pool.fetch(
        """
        SELECT w.worker_id, w.queue, w.status, w.slots, w.hostname, w.started_at,
               extract(epoch FROM now() - w.last_heartbeat)::float8 AS heartbeat_age,
               m.slots_busy, m.cpu_percent, m.memory_available_mb, m.jobs_completed, m.jobs_failed,
               m.admission_reason, m.admission_target
        FROM workers w
        LEFT JOIN LATERAL (SELECT * FROM worker_metrics x WHERE x.worker_id = w.worker_id
                           ORDER BY recorded_at DESC LIMIT 1) m ON true
        WHERE w.status IN ('running', 'draining')
        ORDER BY w.queue, w.started_at
        """
    )
    return [dict(r) for r in rows]


def router(
    api: UseCases,
    pool: asyncpg.Pool,
    authenticate: Callable[[str | None], Awaitable[Caller]],
    sessions: Sessions,
    resolver: OutputResolver,
) -> APIRouter:
    """The dashboard's routes, outside the OpenAPI document (pages, not the API); ``resolver``
    serves a job's HLS playlists to its page's player."""
    pages = APIRouter(prefix="/dashboard", include_in_schema=False)

    def render(name: str, status_code: int = 200, **values: Any) -> HTMLResponse:
        return HTMLResponse(_templates.get_template(name).render(**values), status_code=status_code)

    def admins_only(caller: Caller, csrf: str, what: str) -> HTMLResponse:
        return render(
            "missing.html",
            status_code=403,
            caller=caller,
            csrf=csrf,
            error=f"{what}: shown to admin accounts only.",
        )

    def signed_in(request: Request) -> tuple[Caller, str] | None:
        token = request.cookies.get(COOKIE)
        caller = sessions.read(token)
        return (caller, sessions.csrf(token or "")) if caller else None

    def to_login() -> RedirectResponse:
        return RedirectResponse("/dashboard/login", status_code=303)

    @pages.get("/login")
    async def login_page() -> HTMLResponse:
        return render("login.html", error=None)

    @pages.post("/login")
    async def login(api_key: str = Form(..., max_length=200)) -> Response:
        try:
            caller = await authenticate(f"Bearer {api_key.strip()}")
        except Unauthenticated:
            return render("login.html", status_code=401, error="That API key is not known (or was revoked).")
        response = RedirectResponse("/dashboard", status_code=303)
        response.set_cookie(
            COOKIE,
            sessions.issue(caller),
            max_age=SESSION_SECONDS,
            httponly=True,
            samesite="strict",
            path="/dashboard",
        )
        return response

    @pages.post("/logout")
    async def logout() -> Response:
        response = RedirectResponse("/dashboard/login", status_code=303)
        response.delete_cookie(COOKIE, path="/dashboard")
        return response

    @pages.get("")
    async def overview(request: Request) -> Response:
        session = signed_in(request)
        if session is None:
            return to_login()
        caller, csrf = session
        balance = await api.accounts.balance(caller)
        series = await minute_series(pool, caller)
        return render(
            "overview.html",
            caller=caller,
            csrf=csrf,
            balance={
                "balance": as_credits(balance.balance_millicredits),
                "held": as_credits(balance.held_millicredits),
                "available": as_credits(balance.available_millicredits),
            },
            queues=await queue_summary(pool, caller),
            delayed=await delayed_summary(pool, caller),
            series=series,
            peak=max([m["ended"] for m in series] + [1]),
            slowest_ms=max([m["p95_ms"] for m in series if m["p95_ms"] is not None] + [1.0]),
        )

    @pages.get("/jobs")
    async def jobs(
        request: Request,
        status: str = Query("", max_length=40),
        operation: str = Query("", max_length=64),
        cursor: str = Query("", max_length=400),
    ) -> Response:
        session = signed_in(request)
        if session is None:
            return to_login()
        caller, csrf = session
        filters = JobFilter((status,) if status else (), operation or None, None, None, None)
        try:
            page = await api.status.list_jobs(caller, filters, 50, cursor or None)
            error = None
        except DomainError as exc:
            page, error = None, exc.public_message
        return render(
            "jobs.html",
            caller=caller,
            csrf=csrf,
            page=page,
            error=error,
            statuses=JOB_STATUSES,
            status=status,
            operation=operation,
        )

    @pages.get("/jobs/{job_id}")
    async def job(request: Request, job_id: str) -> Response:
        session = signed_in(request)
        if session is None:
            return to_login()
        caller, csrf = session
        try:
            found = await api.status.get_job(caller, job_id)
        except DomainError as exc:
            return render(
                "missing.html",
                status_code=exc.http_status,
                caller=caller,
                csrf=csrf,
                error=exc.public_message,
            )
        return render(
            "job.html",
            caller=caller,
            csrf=csrf,
            job=found,
            credits=as_credits,
            events=await job_events(pool, found.job_id),
            events_shown=EVENTS_SHOWN,
        )

    @pages.get("/credits")
    async def credits(request: Request, cursor: str = Query("", max_length=40)) -> Response:
        session = signed_in(request)
        if session is None:
            return to_login()
        caller, csrf = session
        balance = await api.accounts.balance(caller)
        try:
            ledger, error = await api.accounts.ledger(caller, 50, cursor or None), None
        except DomainError as exc:
            ledger, error = None, exc.public_message
        return render(
            "credits.html",
            caller=caller,
            csrf=csrf,
            balance=balance,
            ledger=ledger,
            error=error,
            credits=as_credits,
        )

    @pages.get("/schedules")
    async def schedules_page(request: Request) -> Response:
        session = signed_in(request)
        if session is None:
            return to_login()
        caller, csrf = session
        found = await api.schedules.list_schedules(caller)
        return render("schedules.html", caller=caller, csrf=csrf, schedules=found)

    @pages.get("/backfills")
    async def backfills_page(request: Request) -> Response:
        session = signed_in(request)
        if session is None:
            return to_login()
        caller, csrf = session
        runs = await api.backfills.list(caller, limit=50)
        return render("backfills.html", caller=caller, csrf=csrf, runs=runs, credits=as_credits)

    @pages.get("/scheduler")
    async def scheduler_page(request: Request) -> Response:
        """The scheduler's pools with their burst workers alive, and its latest decisions (admin)."""
        session = signed_in(request)
        if session is None:
            return to_login()
        caller, csrf = session
        try:
            pools = await api.operators.pools(caller)
            live = await api.operators.burst_workers(caller, live_only=True, limit=100)
            decisions = await api.operators.decisions(caller, limit=50)
        except PermissionDenied:
            return admins_only(caller, csrf, "The scheduler")
        return render(
            "scheduler.html", caller=caller, csrf=csrf, pools=pools, burst_workers=live, decisions=decisions
        )

    @pages.get("/workers")
    async def workers_page(request: Request) -> Response:
        session = signed_in(request)
        if session is None:
            return to_login()
        caller, csrf = session
        if not caller.is_admin:
            return admins_only(caller, csrf, "Workers")
        return render("workers.html", caller=caller, csrf=csrf, workers=await workers(pool))

    @pages.get("/static/{name}")
    async def static(name: str) -> Response:
        """The bundled scripts (:data:`STATIC`), cached a day; 404 for any other name."""
        if name not in STATIC:
            return Response(status_code=404)
        return FileResponse(
            STATIC_DIR / name,
            media_type="text/javascript",
            headers={"Cache-Control": "public, max-age=86400"},
        )

    @pages.get("/jobs/{job_id}/outputs/{output_type}/resolved")
    async def resolved(request: Request, job_id: str, output_type: str) -> Response:
        """An HLS playlist of the caller's job with its siblings' names turned into URLs
        (:class:`~services.gateway.resolved.OutputResolver`), for the page's player: same origin,
        the session's account; its variant playlists are the API's signed URLs."""
        session = signed_in(request)
        if session is None:
            return Response(status_code=401)

        def endpoint_url(job: str, output: str, until: int, signature: str) -> str:
            url = request.url_for("resolved_output", job_id=job, output_type=output)
            return str(url.include_query_params(expires=until, sig=signature))

        try:
            found = await resolver.resolve(
                job_id, output_type, endpoint_url, account_id=session[0].account_id
            )
        except DomainError as exc:
            return Response(status_code=exc.http_status)
        return Response(
            found.content, media_type=found.mime_type, headers={"Cache-Control": "private, no-store"}
        )

    @pages.get("/jobs/{job_id}/outputs/{output_type}")
    async def output(request: Request, job_id: str, output_type: str) -> Response:
        session = signed_in(request)
        if session is None:
            return Response(status_code=401)
        try:
            link = await api.status.output_link(session[0], job_id, output_type)
        except DomainError as exc:
            return Response(status_code=exc.http_status)
        return Response(status_code=307, headers={"Location": link.url, "Cache-Control": "private, no-store"})

    @pages.post("/jobs/{job_id}/cancel")
    async def cancel(request: Request, job_id: str, csrf: str = Form(..., max_length=100)) -> Response:
        session = signed_in(request)
        if session is not None and session[0].read_only:
            return Response(
                "this API key is read-only: it may read the account, not change it", status_code=403
            )
        if session is None or not hmac.compare_digest(csrf, session[1]):
            return Response("the form is stale: sign in again", status_code=403)
        try:
            await api.cancellation.cancel_job(session[0], job_id)
        except DomainError as exc:
            return render(
                "missing.html",
                status_code=exc.http_status,
                caller=session[0],
                csrf=session[1],
                error=exc.public_message,
            )
        return RedirectResponse(f"/dashboard/jobs/{job_id}", status_code=303)

    @pages.post("/jobs/{job_id}/retry")
    async def retry(request: Request, job_id: str, csrf: str = Form(..., max_length=100)) -> Response:
        """A new job of the same operation, params, priority and queue on the same object (the old
        one stays as it is)."""
        session = signed_in(request)
        if session is not None and session[0].read_only:
            return Response(
                "this API key is read-only: it may read the account, not change it", status_code=403
            )
        if session is None or not hmac.compare_digest(csrf, session[1]):
            return Response("the form is stale: sign in again", status_code=403)
        caller = session[0]
        try:
            old = await api.status.get_job(caller, job_id)
            created = await api.creation.process(
                caller,
                old.object_id,
                [OperationRequest(old.operation, dict(old.params))],
                old.priority,
                None,
                queue="bulk" if old.queue.startswith("bulk.") else None,  # its lane of the bulk queue again
            )
        except DomainError as exc:
            return render(
                "missing.html",
                status_code=exc.http_status,
                caller=caller,
                csrf=session[1],
                error=exc.public_message,
            )
        return RedirectResponse(f"/dashboard/jobs/{created.job_ids[0]}", status_code=303)

    return pages
