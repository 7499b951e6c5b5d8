"""Job quotas per account, checked by the credits service in ``EstimateAndHold`` (issue 21 item 4;
ADR 0055): the credits service is the platform's "credit and quota" service of seed 000.

Three rules, checked in this order in the transaction that holds the request's credits, with the
account's ``account_quotas`` row locked first (so one account's requests are checked one at a
time, and each sees what the ones before it held):

1. **Priority band.** Priorities 1-3 are the interactive band; only an account with
   ``account_quotas.interactive`` may use them. Others are refused, never clamped: a caller that
   asked for priority 1 learns at once that it will not get it (403 ``PRIORITY_NOT_ALLOWED``).
2. **Request rate.** A token bucket of ``burst`` tokens refilled at ``rate_per_second``; every
   request that creates jobs takes one token (a request of 20 operations is one request). Short of
   a token: 429 ``RATE_LIMITED`` with ``retry_after_seconds``, the time until the next token. A
   request the credits service refuses (402 included) rolls back and keeps no token; one that
   fails after its hold, in the gateway (the object deleted meanwhile), has used it.
3. **Waiting jobs.** At most ``max_queued_jobs`` of the account's jobs ``queued`` or in
   ``retry_wait`` at once, the new ones included. Over it: 429 ``TOO_MANY_QUEUED_JOBS`` with
   ``retry_after_seconds`` :data:`QUEUED_RETRY_AFTER_SECONDS`; a request of more jobs than the
   limit itself could never pass: 403 ``QUEUE_QUOTA_TOO_SMALL``. The count is exact because the
   caller that creates the jobs holds :func:`creation_lock` from before this check until its
   jobs are committed (the gateway's transaction commits after this one: without the lock, each
   of a burst of concurrent requests would count the jobs before the others').

A limit left NULL in ``account_quotas`` is the service's default (:class:`QuotaDefaults`,
``HM_QUOTA_*``). ``hypermedia admin set-quota`` sets them (:func:`set_quota`).

A fourth limit, ``max_running_jobs`` (the account's running jobs in each queue, NULL: no cap), is
set here too but applies at claim, not at creation: :mod:`hypermedia.jobs.lifecycle.caps`.
"""

from __future__ import annotations

import datetime
import math
import uuid
from dataclasses import dataclass
from typing import Any

import asyncpg

from hypermedia.core.errors import NotFound, PermissionDenied, RateLimited
from hypermedia.infra import db

INTERACTIVE_PRIORITIES = range(1, 4)
"""The interactive band of seed 000's priorities (1-3: "user is waiting"); 4-6 is standard and
7-10 background."""
QUEUED_RETRY_AFTER_SECONDS = 5
"""``retry_after_seconds`` of a ``TOO_MANY_QUEUED_JOBS``: a hint, since when enough of the account's
jobs start depends on the queue (an image job runs in well under a second)."""
MAX_QUEUED_JOBS = 10_000_000
MIN_RATE, MAX_RATE = 0.001, 1_000_000.0
"""The bounds of a rate, requests a second (a NaN or an infinity is outside them)."""
MAX_BURST = 1_000_000
MAX_RUNNING_JOBS = 100_000


@dataclass(frozen=True)
class QuotaDefaults:
    """The limits of an account whose ``account_quotas`` row leaves them NULL."""

    max_queued_jobs: int
    rate_per_second: float
    """0: no rate limit."""
    burst: int


DEFAULTS = QuotaDefaults(max_queued_jobs=10_000, rate_per_second=50.0, burst=200)
"""The service's defaults when ``HM_QUOTA_*`` are not set: 10,000 waiting jobs (seed 000's
"10,000 queued" scale, and issue 17's flat claim curve to it), 50 requests a second in bursts
of 200 (a request carries up to ``HM_MAX_OPERATIONS`` jobs, 16 by default: 800 jobs a second)."""


@dataclass(frozen=True)
class Quota:
    """An account's limits as they apply (its own, else the defaults)."""

    interactive: bool
    max_queued_jobs: int
    rate_per_second: float
    burst: int


async def creation_lock(conn: db.Connection, account_id: str) -> None:
    """In the transaction that creates an account's jobs, before their credits are held: wait
    for the account's other job-creating transactions to end (a transaction-scoped advisory
    lock), so :func:`check` counts their jobs. Every caller of ``EstimateAndHold`` that then
    creates jobs takes it (the gateway: ``services/gateway/creation.py``)."""
    await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", f"job-creation:{account_id}")


async def check(
    conn: db.Connection,
    account_id: uuid.UUID,
    priority: int,
    new_jobs: int,
    defaults: QuotaDefaults,
    *,
    take_token: bool = True,
) -> None:
    """In the caller's transaction: lock the account's quota row (made at its first request),
    apply the three rules of the module docstring to a request of ``new_jobs`` jobs at
    ``priority`` (0: not given, no band check) and take its token. Without ``take_token`` (a
    backfill run's jobs, which the run paces at its own rate) rule 2 is skipped.

    Raises:
        NotFound: ``ACCOUNT_NOT_FOUND``, no such account.
        PermissionDenied: ``PRIORITY_NOT_ALLOWED``, details ``priority`` and ``allowed``
            (the lowest priority number the account may use); ``QUEUE_QUOTA_TOO_SMALL``, details
            ``limit``, for more jobs than the account may have waiting at all.
        RateLimited: ``RATE_LIMITED`` or ``TOO_MANY_QUEUED_JOBS``, details ``retry_after_seconds``
            (an integer ≥ 1) and ``limit``.
    """
    row = await _locked(conn, account_id)
    quota = _applying(row, defaults)
    if priority in INTERACTIVE_PRIORITIES and not quota.interactive:
        raise PermissionDenied(
            f"priority {priority} is in the interactive band (1-3), which this account may not use: "
            "send 4-10, or ask the operator for the interactive band",
            "PRIORITY_NOT_ALLOWED",
            {"priority": priority, "allowed": INTERACTIVE_PRIORITIES.stop},
        )
    if new_jobs > quota.max_queued_jobs:
        raise PermissionDenied(
            f"this request has {new_jobs} jobs and this account may have at most "
            f"{quota.max_queued_jobs} waiting: send fewer, or ask the operator for a larger quota",
            "QUEUE_QUOTA_TOO_SMALL",
            {"limit": quota.max_queued_jobs},
        )
    if take_token and quota.rate_per_second > 0:
        tokens = _refilled(row["tokens"], row["refilled_at"], row["now"], quota)
        if tokens < 1:
            wait = max(1, math.ceil((1 - tokens) / quota.rate_per_second))
            raise RateLimited(
                f"this account may create jobs in {quota.rate_per_second:g} requests a second "
                f"(bursts of {quota.burst}); retry after {wait} s",
                "RATE_LIMITED",
                {"retry_after_seconds": wait, "limit": quota.rate_per_second},
            )
        await conn.execute(
            "UPDATE account_quotas SET tokens = $2, refilled_at = $3 WHERE account_id = $1",
            account_id,
            tokens - 1,
            max(row["now"], row["refilled_at"] or row["now"]),
        )
    waiting = await conn.fetchval(
        "SELECT count(*) FROM processing_jobs WHERE account_id = $1 AND status IN ('queued', 'retry_wait') "
        "AND parent_job_id IS NULL",  # a fanned-out job's children are the platform's, not the caller's
        account_id,
    )
    if waiting + new_jobs > quota.max_queued_jobs:
        raise RateLimited(
            f"this account has {waiting} jobs waiting and may have at most {quota.max_queued_jobs}; "
            f"this request would add {new_jobs}",
            "TOO_MANY_QUEUED_JOBS",
            {"retry_after_seconds": QUEUED_RETRY_AFTER_SECONDS, "limit": quota.max_queued_jobs},
        )


async def _locked(conn: db.Connection, account_id: uuid.UUID) -> Any:
    """The account's ``account_quotas`` row, locked, with ``now``: the clock after the lock was
    granted (``clock_timestamp()``, not the transaction's start, so a request that waited for the
    lock does not refill the bucket from the past). Made with the defaults when missing.
    Raises NotFound (``ACCOUNT_NOT_FOUND``) when there is no such account."""
    query = "SELECT *, clock_timestamp() AS now FROM account_quotas WHERE account_id = $1 FOR UPDATE"
    row = await conn.fetchrow(query, account_id)
    if row is None:
        try:
            await conn.execute(
                "INSERT INTO account_quotas (account_id) VALUES ($1) ON CONFLICT DO NOTHING", account_id
            )
        except asyncpg.ForeignKeyViolationError:
            raise NotFound("no credit account", "ACCOUNT_NOT_FOUND") from None
        row = await conn.fetchrow(query, account_id)
    assert row is not None
    return row


def _applying(row: Any, defaults: QuotaDefaults) -> Quota:
    return Quota(
        interactive=row["interactive"],
        max_queued_jobs=defaults.max_queued_jobs
        if row["max_queued_jobs"] is None
        else row["max_queued_jobs"],
        rate_per_second=defaults.rate_per_second
        if row["rate_per_second"] is None
        else row["rate_per_second"],
        burst=defaults.burst if row["burst"] is None else row["burst"],
    )


def _refilled(
    tokens: float | None, refilled_at: datetime.datetime | None, now: datetime.datetime, quota: Quota
) -> float:
    """The bucket's tokens at ``now``: full for a bucket never used, else what it had plus the
    refill since, at most ``burst``."""
    if tokens is None or refilled_at is None:
        return float(quota.burst)
    elapsed = max(0.0, (now - refilled_at).total_seconds())
    return min(float(quota.burst), tokens + elapsed * quota.rate_per_second)


async def set_quota(
    conn: db.Connection,
    account_id: uuid.UUID,
    *,
    interactive: bool | None = None,
    max_queued_jobs: int | None = None,
    rate_per_second: float | None = None,
    burst: int | None = None,
    max_running_jobs: int | None = None,
    default: bool = False,
) -> dict[str, Any]:
    """Set an account's quota: each given field, the others kept (``default``: every limit back to
    NULL, the service's defaults, and no cap of running jobs; ``interactive`` is set only when
    given; ``max_running_jobs`` 0 removes the cap). Returns the row as ``{account_id,
    interactive, max_queued_jobs, rate_per_second, burst, max_running_jobs}``, a null limit
    meaning the default (for ``max_running_jobs``: no cap). Raises LookupError for an unknown
    account, ValueError for a limit outside :data:`MAX_QUEUED_JOBS`,
    :data:`MIN_RATE`-:data:`MAX_RATE`, :data:`MAX_BURST`, 0-:data:`MAX_RUNNING_JOBS`, or a limit
    given with ``default``."""
    limits = (max_queued_jobs, rate_per_second, burst, max_running_jobs)
    if max_queued_jobs is not None and not 0 <= max_queued_jobs <= MAX_QUEUED_JOBS:
        raise ValueError(f"max_queued_jobs must be 0 to {MAX_QUEUED_JOBS:,}")
    if max_running_jobs is not None and not 0 <= max_running_jobs <= MAX_RUNNING_JOBS:
        raise ValueError(f"max_running_jobs must be 0 (no cap) to {MAX_RUNNING_JOBS:,}")
    if rate_per_second is not None and not MIN_RATE <= rate_per_second <= MAX_RATE:
        raise ValueError(f"rate_per_second must be {MIN_RATE:g} to {MAX_RATE:g}")
    if burst is not None and not 1 <= burst <= MAX_BURST:
        raise ValueError(f"burst must be 1 to {MAX_BURST:,}")
    if default and any(limit is not None for limit in limits):
        raise ValueError("default puts every limit back to the defaults: give no limit with it")
    async with conn.transaction():
        if not await conn.fetchval("SELECT true FROM accounts WHERE account_id = $1", account_id):
            raise LookupError(f"no account {account_id}")
        row = await conn.fetchrow(
            """INSERT INTO account_quotas AS q
                   (account_id, interactive, max_queued_jobs, rate_per_second, burst, max_running_jobs)
               VALUES ($1, coalesce($2, false), $3, $4, $5, nullif($7, 0))
               ON CONFLICT (account_id) DO UPDATE SET
                   interactive = coalesce($2, q.interactive),
                   max_queued_jobs = CASE WHEN $6 THEN NULL ELSE coalesce($3, q.max_queued_jobs) END,
                   rate_per_second = CASE WHEN $6 THEN NULL ELSE coalesce($4, q.rate_per_second) END,
                   burst = CASE WHEN $6 THEN NULL ELSE coalesce($5, q.burst) END,
                   max_running_jobs = CASE WHEN $6 THEN NULL ELSE nullif(coalesce($7, q.max_running_jobs), 0) END,
                   updated_at = now()
               RETURNING interactive, max_queued_jobs, rate_per_second, burst, max_running_jobs""",
            account_id,
            interactive,
            max_queued_jobs,
            rate_per_second,
            burst,
            default,
            max_running_jobs,
        )
    assert row is not None
    return {"account_id": str(account_id), **dict(row)}
