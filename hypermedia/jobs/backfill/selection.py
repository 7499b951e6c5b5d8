"""What a backfill run regenerates: its :class:`Selector`, the items it matches
(:func:`candidates`), their idempotency keys and a dry run's :class:`Estimate`."""

from __future__ import annotations

import datetime
import hashlib
import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg

from hypermedia.infra import db
from hypermedia.jobs.pricing import price

MAX_ITEMS = 100_000
"""Most items one run may have; a selector matching more is refused (``RUN_TOO_LARGE``): narrow it
by a creation-time range and make several runs."""
MAX_OBJECT_IDS = 1_000
"""Most object ids a selector may name (a REST body is at most 64 KiB: about 1,600 ids)."""
MIN_RATE, MAX_RATE = 0.01, 1000.0
"""The bounds of a run's ``rate_per_second`` (jobs a second)."""
DEFAULT_RATE = 10.0
"""A run's rate when the request gives none (jobs a second)."""
WAITING = ("created", "scheduled", "queued", "retry_wait")
"""Job statuses a run's cancellation cancels at once (never executed)."""
ENDED = ("completed", "failed", "cancelled")
"""Job statuses that end a job."""
STATES = ("running", "paused", "dispatched", "completed", "cancelled", "expired")


@dataclass(frozen=True)
class Selector:
    """What a run regenerates."""

    operation: str
    """The operation (a preset's, for a preset run)."""
    params: dict[str, Any] | None
    """Normalised params; None: each outdated output's own params (an operation's outdated run)."""
    preset: tuple[str, int] | None = None
    """The account's preset (name, active version at creation) the jobs are made from, or None."""
    outdated_only: bool = True
    """Only (object, params) whose outputs are of a version below the target (else every object)."""
    object_ids: tuple[str, ...] | None = None
    """Only these objects (canonical UUIDs), or None for all of the account's."""
    created_after: datetime.datetime | None = None
    """Only objects uploaded at or after this time."""
    created_before: datetime.datetime | None = None
    """Only objects uploaded before this time."""


@dataclass(frozen=True)
class Candidate:
    """One item a selector matched."""

    object_id: str
    params: dict[str, Any]
    size_bytes: int
    mime_type: str


@dataclass(frozen=True)
class Estimate:
    """A dry run's answer (and what a created run started with)."""

    matched: int
    """Items the selector matched."""
    existing: int
    """Of them, items whose idempotency key has a job already (linked, never enqueued again)."""
    to_enqueue: int
    """Jobs the run would create: ``matched - existing``."""
    estimated_millicredits: int
    """The sum of those jobs' prices (:func:`hypermedia.jobs.pricing.price` of the active profile)."""
    estimated_seconds: float
    """``to_enqueue / rate``: how long enqueuing takes at the run's rate, the brake aside."""
    fits_deadline: bool | None
    """Whether that ends before the deadline; None without a deadline."""
    target_version: int
    first_job_millicredits: int | None = None
    """The price of the first job it would create (None: it would create none)."""
    available_millicredits: int | None = None
    """The account's credits not held, when the caller asked the credits service."""


def params_hash(params: Mapping[str, Any]) -> str:
    """The first 32 hex digits of the SHA-256 of ``params`` as canonical JSON (sorted keys, no
    spaces): equal params, equal hash."""
    canonical = json.dumps(params, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()[:32]


def idempotency_key(
    object_id: str, operation: str, params: Mapping[str, Any], target_version: int, replays: int = 0
) -> str:
    """The process request's Idempotency-Key of an item: ``backfill:{object}:{operation}:{params
    hash}:v{target version}``, with ``:replay{n}`` after the n-th replay of its failure. At most
    about 160 characters (the key's bound is 200)."""
    key = f"backfill:{object_id}:{operation}:{params_hash(params)}:v{target_version}"
    return f"{key}:replay{replays}" if replays else key


_OBJECTS = """
    ob.state = 'available'
    AND ($2::uuid[] IS NULL OR ob.object_id = ANY($2::uuid[]))
    AND ($3::timestamptz IS NULL OR ob.created_at >= $3)
    AND ($4::timestamptz IS NULL OR ob.created_at < $4)
"""


async def candidates(
    conn: db.Connection | asyncpg.Pool, account_id: str, selector: Selector, target_version: int
) -> list[Candidate]:
    """The items ``selector`` matches among ``account_id``'s available objects, oldest object
    first, at most :data:`MAX_ITEMS` + 1 (the caller refuses more than :data:`MAX_ITEMS`):

    - every original (``outdated_only`` false): one item per object the account uploaded (not
      the outputs its jobs made), with the selector's params;
    - an operation's outdated outputs: one item per (object, params) with an output of a
      version below ``target_version`` and none of it or later (``params`` given: those only);
    - a preset's outdated outputs: one item per object with an output of a job made from a
      version of the preset below the selector's and none from it or a later one.

    The caller still filters by the operation's input types (the library does not know them)."""
    filters = (
        account_id,
        list(selector.object_ids) if selector.object_ids is not None else None,
        selector.created_after,
        selector.created_before,
    )
    if not selector.outdated_only:
        rows = await conn.fetch(
            f"""
            SELECT ob.object_id::text AS object_id, ob.size_bytes, ob.mime_type, NULL::jsonb AS params
            FROM objects ob
            JOIN object_ownership ow ON ow.object_id = ob.object_id AND ow.account_id = $1
            WHERE {_OBJECTS} AND ob.source_object_id IS NULL  -- originals, not the outputs made of them
            ORDER BY ob.created_at, ob.object_id
            LIMIT $5
            """,
            *filters,
            MAX_ITEMS + 1,
        )
    elif selector.preset is not None:
        rows = await conn.fetch(
            f"""
            SELECT DISTINCT ON (ob.created_at, ob.object_id)
                   ob.object_id::text AS object_id, ob.size_bytes, ob.mime_type, NULL::jsonb AS params
            FROM processing_jobs j
            JOIN job_outputs o ON o.job_id = j.job_id
            JOIN objects ob ON ob.object_id = j.object_id
            WHERE j.account_id = $1 AND j.preset_name = $5 AND j.preset_version < $6 AND {_OBJECTS}
              AND NOT EXISTS (
                  SELECT 1 FROM processing_jobs j2 JOIN job_outputs o2 ON o2.job_id = j2.job_id
                  WHERE j2.account_id = j.account_id AND j2.preset_name = j.preset_name
                    AND j2.object_id = j.object_id AND j2.preset_version >= $6
              )
            ORDER BY ob.created_at, ob.object_id
            LIMIT $7
            """,
            *filters,
            selector.preset[0],
            selector.preset[1],
            MAX_ITEMS + 1,
        )
    else:
        rows = await conn.fetch(
            f"""
            SELECT DISTINCT ON (ob.created_at, ob.object_id, j.params)
                   ob.object_id::text AS object_id, ob.size_bytes, ob.mime_type, j.params
            FROM processing_jobs j
            JOIN job_outputs o ON o.job_id = j.job_id
            JOIN objects ob ON ob.object_id = j.object_id
            WHERE j.account_id = $1 AND j.operation = $5 AND o.profile_version < $6
              AND ($7::jsonb IS NULL OR j.params = $7::jsonb) AND {_OBJECTS}
              AND NOT EXISTS (
                  SELECT 1 FROM processing_jobs j2 JOIN job_outputs o2 ON o2.job_id = j2.job_id
                  WHERE j2.object_id = j.object_id AND j2.operation = j.operation
                    AND j2.params = j.params AND o2.profile_version >= $6
              )
            ORDER BY ob.created_at, ob.object_id, j.params
            LIMIT $8
            """,
            *filters,
            selector.operation,
            target_version,
            selector.params,
            MAX_ITEMS + 1,
        )
    return [
        Candidate(
            object_id=r["object_id"],
            params=dict(r["params"]) if r["params"] is not None else dict(selector.params or {}),
            size_bytes=r["size_bytes"],
            mime_type=r["mime_type"],
        )
        for r in rows
    ]


async def existing_jobs(
    conn: db.Connection | asyncpg.Pool, account_id: str, keys: Sequence[str]
) -> dict[str, str]:
    """Of ``keys``, those the account has made a process request with, each with its first job
    id (a backfill key's request has one job)."""
    rows = await conn.fetch(
        "SELECT idempotency_key, job_ids[1]::text AS job_id FROM process_requests"
        " WHERE account_id = $1 AND idempotency_key = ANY($2::text[])",
        uuid.UUID(account_id),
        list(keys),
    )
    return {r["idempotency_key"]: r["job_id"] for r in rows if r["job_id"] is not None}


async def estimate(
    conn: db.Connection | asyncpg.Pool,
    account_id: str,
    selector: Selector,
    items: Sequence[Candidate],
    profile: Mapping[str, Any] | asyncpg.Record,
    rate_per_second: float,
    deadline: datetime.datetime | None,
) -> Estimate:
    """What a run of ``items`` would do under ``profile`` (the operation's active
    ``processing_profiles`` row: ``version``, ``base_cost``, ``per_mb``): how many have a job
    already, how many it would create and their prices, and how long enqueuing them takes at
    ``rate_per_second``."""
    target_version = profile["version"]
    keys = [idempotency_key(i.object_id, selector.operation, i.params, target_version) for i in items]
    existing = await existing_jobs(conn, account_id, keys)
    new = [i for i, k in zip(items, keys, strict=True) if k not in existing]
    prices = [price(profile["base_cost"], profile["per_mb"], i.size_bytes) for i in new]
    seconds = len(new) / rate_per_second
    now = datetime.datetime.now(datetime.UTC)
    return Estimate(
        matched=len(items),
        existing=len(items) - len(new),
        to_enqueue=len(new),
        estimated_millicredits=sum(prices),
        estimated_seconds=round(seconds, 3),
        fits_deadline=None if deadline is None else now + datetime.timedelta(seconds=seconds) <= deadline,
        target_version=target_version,
        first_job_millicredits=prices[0] if prices else None,
    )
