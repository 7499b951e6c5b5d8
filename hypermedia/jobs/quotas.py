"""Job quotas per account, checked by the credits service in ``EstimateAndHold`` (issue 21 item 4;
ADR 0055): the credits service is the platform's "credit and quota" service of seed 000.

Three rules, checked in this order in the transaction that holds the request's credits, after the
account's ``credit_accounts`` row is locked (so one account's requests are checked one at a time):

1. **Priority band.** Priorities 1-3 are the interactive band; only an account with
   ``account_quotas.interactive`` may use them. Others are refused, never clamped: a caller that
   asked for priority 1 learns at once that it will not get it (403 ``PRIORITY_NOT_ALLOWED``).
2. **Request rate.** A token bucket of ``burst`` tokens refilled at ``rate_per_second``; every
   request that creates jobs takes one token (a request of 20 operations is one request). Short of
   a token: 429 ``RATE_LIMITED`` with ``retry_after_seconds``, the time until the next token.
   Only a request that creates its jobs keeps its token (the transaction of a refused one,
   402 included, rolls back).
3. **Waiting jobs.** At most ``max_queued_jobs`` of the account's jobs ``queued`` or in
   ``retry_wait`` at once, the new ones included: 429 ``TOO_MANY_QUEUED_JOBS`` with
   ``retry_after_seconds`` :data:`QUEUED_RETRY_AFTER_SECONDS`.

A limit left NULL in ``account_quotas`` is the service's default (:class:`QuotaDefaults`,
``HM_QUOTA_*``). ``hypermedia admin set-quota`` sets them (:func:`set_quota`).
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
of 200 (Transloadit's default is of the same order; a request carries up to
``HM_MAX_OPERATIONS`` jobs)."""


@dataclass(frozen=True)
class Quota:
    """An account's limits as they apply (its own, else the defaults)."""

    interactive: bool
    max_queued_jobs: int
    rate_per_second: float
    burst: int


async def check(
    conn: db.Connection, account_id: uuid.UUID, priority: int, new_jobs: int, defaults: QuotaDefaults
) -> None:
    """In the caller's transaction (with the account's credit row locked): apply the three rules
    of the module docstring to a request of ``new_jobs`` jobs at ``priority`` (0: not given, no
    band check) and take its token.

    Raises:
        NotFound: ``ACCOUNT_NOT_FOUND``, no such account.
        PermissionDenied: ``PRIORITY_NOT_ALLOWED``, details ``priority`` and ``allowed``
            (the lowest priority number the account may use).
        RateLimited: ``RATE_LIMITED`` or ``TOO_MANY_QUEUED_JOBS``, details ``retry_after_seconds``
            (an integer ≥ 1) and ``limit``.
    """
    try:
        row = await conn.fetchrow(
            """INSERT INTO account_quotas (account_id) VALUES ($1)
               ON CONFLICT (account_id) DO UPDATE SET account_id = excluded.account_id
               RETURNING *, now() AS now""",
            account_id,
        )
    except asyncpg.ForeignKeyViolationError:
        raise NotFound("no credit account", "ACCOUNT_NOT_FOUND") from None
    assert row is not None  # INSERT … ON CONFLICT DO UPDATE … RETURNING yields the row
    quota = _applying(row, defaults)
    if priority in INTERACTIVE_PRIORITIES and not quota.interactive:
        raise PermissionDenied(
            f"priority {priority} is in the interactive band (1-3), which this account may not use: "
            "send 4-10, or ask the operator for the interactive band",
            "PRIORITY_NOT_ALLOWED",
            {"priority": priority, "allowed": INTERACTIVE_PRIORITIES.stop},
        )
    if quota.rate_per_second > 0:
        tokens = _refilled(row["tokens"], row["refilled_at"], row["now"], quota)
        if tokens < 1:
            wait = math.ceil((1 - tokens) / quota.rate_per_second)
            raise RateLimited(
                f"this account may create jobs in {quota.rate_per_second:g} requests a second "
                f"(bursts of {quota.burst}); retry after {wait} s",
                "RATE_LIMITED",
                {"retry_after_seconds": max(1, wait), "limit": quota.rate_per_second},
            )
        await conn.execute(
            "UPDATE account_quotas SET tokens = $2, refilled_at = $3 WHERE account_id = $1",
            account_id,
            tokens - 1,
            row["now"],
        )
    waiting = await conn.fetchval(
        "SELECT count(*) FROM processing_jobs WHERE account_id = $1 AND status IN ('queued', 'retry_wait')",
        account_id,
    )
    if waiting + new_jobs > quota.max_queued_jobs:
        raise RateLimited(
            f"this account has {waiting} jobs waiting and may have at most {quota.max_queued_jobs}; "
            f"this request would add {new_jobs}",
            "TOO_MANY_QUEUED_JOBS",
            {"retry_after_seconds": QUEUED_RETRY_AFTER_SECONDS, "limit": quota.max_queued_jobs},
        )


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
    default: bool = False,
) -> dict[str, Any]:
    """Set an account's quota: each given field, the others kept (``default``: every limit back to
    NULL, the service's defaults; ``interactive`` is set only when given). Returns the row as
    ``{account_id, interactive, max_queued_jobs, rate_per_second, burst}``, a null limit meaning
    the default. Raises LookupError for an unknown account, ValueError for a negative
    ``max_queued_jobs``, a ``rate_per_second`` that is not above 0, a ``burst`` below 1."""
    if max_queued_jobs is not None and max_queued_jobs < 0:
        raise ValueError("max_queued_jobs must not be negative")
    if rate_per_second is not None and not rate_per_second > 0:
        raise ValueError("rate_per_second must be above 0")
    if burst is not None and burst < 1:
        raise ValueError("burst must be at least 1")
    async with conn.transaction():
        if not await conn.fetchval("SELECT true FROM accounts WHERE account_id = $1", account_id):
            raise LookupError(f"no account {account_id}")
        row = await conn.fetchrow(
            """INSERT INTO account_quotas AS q (account_id, interactive, max_queued_jobs, rate_per_second, burst)
               VALUES ($1, coalesce($2, false), $3, $4, $5)
               ON CONFLICT (account_id) DO UPDATE SET
                   interactive = coalesce($2, q.interactive),
                   max_queued_jobs = CASE WHEN $6 THEN NULL ELSE coalesce($3, q.max_queued_jobs) END,
                   rate_per_second = CASE WHEN $6 THEN NULL ELSE coalesce($4, q.rate_per_second) END,
                   burst = CASE WHEN $6 THEN NULL ELSE coalesce($5, q.burst) END,
                   updated_at = now()
               RETURNING interactive, max_queued_jobs, rate_per_second, burst""",
            account_id,
            interactive,
            None if default else max_queued_jobs,
            None if default else rate_per_second,
            None if default else burst,
            default,
        )
    assert row is not None
    return {"account_id": str(account_id), **dict(row)}
