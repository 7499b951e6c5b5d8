"""Versions of an operation's processing profile, and the outputs a newer version makes outdated
(issue 21 item 1).

A profile is ``processing_profiles(operation, version)``; exactly one version of an operation is
``active`` (a unique partial index), and a job records the version it was created under, its
outputs too (``job_outputs.profile_version``, part of their storage keys). :func:`new_version`
makes the next version the active one, so every job created from then on runs under it, while jobs
created before keep theirs. :func:`outdated_outputs` answers which outputs an active version has
made outdated: made under a lower version for an ``(object, operation, params)`` that has no
output of the active version yet. Operators do both with ``hypermedia admin profile-version`` and
``hypermedia admin outdated`` (docs/operations.md "Profile versions").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hypermedia.infra import db

CHANGEABLE = {
    "base_cost": (0, 10**12),
    "per_mb": (0, 10**12),
    "timeout_seconds": (1, 86_400),
    "max_attempts": (1, 100),
    "max_input_bytes": (1, 1 << 40),
    "max_pixels": (1, 10**12),
    "memory_limit_mb": (64, 1 << 20),
    "backoff_base_seconds": (1, 86_400),
    "per_unit": (0, 2**31 - 1),
}
"""The fields a new version may change, each with its inclusive bounds (the table's CHECKs and
what a worker can honour: a timeout of at most a day, memory of at least 64 MiB)."""
DEFAULT_LIMIT = 100
MAX_LIMIT = 10_000


async def new_version(conn: db.Connection, operation: str, changes: Mapping[str, int]) -> dict[str, Any]:
    """Copies ``operation``'s active profile as the next version with ``changes`` applied, makes it
    the active one and the old one inactive, in one transaction (a second concurrent call waits
    for the first and builds on it). Returns the new row. Raises LookupError when the operation
    has no active profile, ValueError for a field outside :data:`CHANGEABLE` or a value outside
    its bounds."""
    for field, value in changes.items():
        if field not in CHANGEABLE:
            raise ValueError(f"{field}: not a field a version may change ({', '.join(sorted(CHANGEABLE))})")
        low, high = CHANGEABLE[field]
        if not low <= value <= high:
            raise ValueError(f"{field}: must be between {low} and {high}")
    async with conn.transaction():
        current = await conn.fetchrow(
            "SELECT * FROM processing_profiles WHERE operation = $1 AND active FOR UPDATE", operation
        )
        if current is None:
            raise LookupError(f"no active profile for operation {operation!r}")
        latest = await conn.fetchval(
            "SELECT max(version) FROM processing_profiles WHERE operation = $1", operation
        )
        row = dict(current) | dict(changes) | {"version": latest + 1, "active": True}
        await conn.execute(
            "UPDATE processing_profiles SET active = false WHERE operation = $1 AND version = $2",
            operation,
            current["version"],
        )
        columns = list(row)
        created = await conn.fetchrow(
            f"INSERT INTO processing_profiles ({', '.join(columns)}) "
            f"VALUES ({', '.join(f'${i}' for i in range(1, len(columns) + 1))}) RETURNING *",
            *row.values(),
        )
    assert created is not None
    return dict(created)


async def outdated_outputs(
    conn: db.Connection,
    *,
    operation: str = "",
    account_id: str | None = None,
    limit: int = DEFAULT_LIMIT,
) -> list[dict[str, Any]]:
    """Outputs made under a lower version than the active one of their operation, for an
    ``(object, operation, params)`` that has no output of the active version: ``output_id``,
    ``job_id``, ``object_id``, ``account_id``, ``operation``, ``params``, ``output_type``,
    ``profile_version``, ``active_version``, ``created_at``; oldest first, at most ``limit``
    (1 to :data:`MAX_LIMIT`), of ``operation`` and ``account_id`` when given."""
    rows = await conn.fetch(
        """
        SELECT o.output_id, o.job_id::text AS job_id, j.object_id::text AS object_id,
               j.account_id::text AS account_id, j.operation, j.params, o.output_type,
               o.profile_version, p.version AS active_version, o.created_at
        FROM job_outputs o
        JOIN processing_jobs j ON j.job_id = o.job_id
        JOIN processing_profiles p ON p.operation = j.operation AND p.active
        WHERE o.profile_version < p.version
          AND ($1 = '' OR j.operation = $1)
          AND ($2::uuid IS NULL OR j.account_id = $2::uuid)
          AND NOT EXISTS (
              SELECT 1 FROM job_outputs o2 JOIN processing_jobs j2 ON j2.job_id = o2.job_id
              WHERE j2.object_id = j.object_id AND j2.operation = j.operation AND j2.params = j.params
                AND o2.profile_version >= p.version
          )
        ORDER BY o.created_at, o.output_id
        LIMIT $3
        """,
        operation,
        account_id,
        max(1, min(limit, MAX_LIMIT)),
    )
    return [dict(r) for r in rows]
