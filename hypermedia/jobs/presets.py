"""Named presets per account (issue 21 item 1): a name → an operation and its params, versioned
as the processing profiles are, so that an app asks for ``{"preset": "avatar"}`` instead of
spelling ``{"name": "thumbnail", "params": {"size": 128, "format": "webp"}}`` every time.

``presets(account_id, name, version)`` holds every version; at most one of a name is ``active``
(a unique partial index). :func:`put` makes the next version the active one when the operation
or params change (a PUT of what is active already changes nothing), :func:`delete` leaves none
active, and a later :func:`put` goes on from the highest version. A job made from a preset
records ``preset_name`` and ``preset_version``, so :func:`outdated_outputs` can say which outputs
an account's newer version has made outdated. The params are checked by the caller (the
gateway validates them as a process request's, ``services/gateway/presets_api.py``).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import asyncpg

from hypermedia.infra import db

NAME = re.compile(r"[a-z][a-z0-9_-]{0,63}")
"""A preset's name: lowercase, starting with a letter, at most 64 characters (the table's CHECK)."""
MAX_PRESETS = 1000
"""Active presets one account may have."""
_COLUMNS = "name, version, operation, params, created_at"


def check_name(name: str) -> str:
    """``name`` if it is a preset's name. Raises ValueError otherwise."""
    if not NAME.fullmatch(name):
        raise ValueError(
            "a preset's name is 1-64 lowercase letters, digits, '_' or '-', starting with a letter"
        )
    return name


async def put(
    conn: db.Connection, account_id: uuid.UUID, name: str, operation: str, params: Mapping[str, Any]
) -> tuple[dict[str, Any], bool]:
    """Makes ``operation`` with ``params`` the active version of the account's preset ``name``:
    the same active version when nothing changed, else the next version (after the highest ever,
    a deleted one's included), in one transaction that waits for a concurrent put of the name.
    Returns the active row (``name``, ``version``, ``operation``, ``params``, ``created_at``) and
    whether it is new. Raises ValueError for a bad name or when the account has
    :data:`MAX_PRESETS` active presets and this is another."""
    check_name(name)
    async with conn.transaction():
        # One put of a name at a time: the lock is the account's and the name's, for the transaction.
        await conn.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", f"preset:{account_id}:{name}"
        )
        current = await conn.fetchrow(
            f"SELECT {_COLUMNS} FROM presets WHERE account_id = $1 AND name = $2 AND active", account_id, name
        )
        if current is not None and current["operation"] == operation and current["params"] == dict(params):
            return dict(current), False
        if current is None:
            count = await conn.fetchval(
                "SELECT count(*) FROM presets WHERE account_id = $1 AND active", account_id
            )
            if count >= MAX_PRESETS:
                raise ValueError(f"an account has at most {MAX_PRESETS} presets")
        latest = await conn.fetchval(
            "SELECT max(version) FROM presets WHERE account_id = $1 AND name = $2", account_id, name
        )
        await conn.execute(
            "UPDATE presets SET active = false WHERE account_id = $1 AND name = $2 AND active",
            account_id,
            name,
        )
        created = await conn.fetchrow(
            f"INSERT INTO presets (account_id, name, version, operation, params) VALUES ($1, $2, $3, $4, $5) "
            f"RETURNING {_COLUMNS}",
            account_id,
            name,
            (latest or 0) + 1,
            operation,
            dict(params),
        )
    assert created is not None
    return dict(created), True


async def active(
    conn: asyncpg.Pool | db.Connection, account_id: uuid.UUID, names: Sequence[str]
) -> dict[str, dict[str, Any]]:
    """The account's active presets among ``names``, by name (a name without one is absent)."""
    rows = await conn.fetch(
        f"SELECT {_COLUMNS} FROM presets WHERE account_id = $1 AND active AND name = ANY($2::text[])",
        account_id,
        list(names),
    )
    return {r["name"]: dict(r) for r in rows}


async def list_active(conn: db.Connection, account_id: uuid.UUID) -> list[dict[str, Any]]:
    """The account's active presets, by name."""
    rows = await conn.fetch(
        f"SELECT {_COLUMNS} FROM presets WHERE account_id = $1 AND active ORDER BY name", account_id
    )
    return [dict(r) for r in rows]


async def delete(conn: db.Connection, account_id: uuid.UUID, name: str) -> bool:
    """Leaves the account's preset ``name`` without an active version (its versions stay, for
    the jobs that name them). Returns whether it had one."""
    status = await conn.execute(
        "UPDATE presets SET active = false WHERE account_id = $1 AND name = $2 AND active", account_id, name
    )
    return status != "UPDATE 0"


async def outdated_outputs(
    conn: db.Connection, account_id: uuid.UUID, name: str, *, limit: int = 100
) -> list[dict[str, Any]]:
    """The outputs of the account's jobs made from an older version of preset ``name`` than the
    active one, for an object that has no output of a job made from the active version (or a
    later one): ``output_id``, ``job_id``, ``object_id``, ``output_type``, ``preset_version``,
    ``active_version``, ``created_at``; oldest first, at most ``limit`` (1 to 10,000). None when
    the preset has no active version."""
    rows = await conn.fetch(
        """
        SELECT o.output_id, o.job_id::text AS job_id, j.object_id::text AS object_id, o.output_type,
               j.preset_version, p.version AS active_version, o.created_at
        FROM presets p
        JOIN processing_jobs j ON j.account_id = p.account_id AND j.preset_name = p.name
        JOIN job_outputs o ON o.job_id = j.job_id
        WHERE p.account_id = $1 AND p.name = $2 AND p.active AND j.preset_version < p.version
          AND NOT EXISTS (
              SELECT 1 FROM processing_jobs j2 JOIN job_outputs o2 ON o2.job_id = j2.job_id
              WHERE j2.account_id = p.account_id AND j2.preset_name = p.name
                AND j2.object_id = j.object_id AND j2.preset_version >= p.version
          )
        ORDER BY o.created_at, o.output_id
        LIMIT $3
        """,
        account_id,
        name,
        max(1, min(limit, 10_000)),
    )
    return [dict(r) for r in rows]
