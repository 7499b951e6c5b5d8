"""Migration 0014 counts the originals that existed before it: each account's usage is the sum and
number of the originals it owns, pending ones included, derived outputs not."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import asyncpg

MIGRATION = (
    Path(__file__).resolve().parents[2] / "hypermedia" / "infra" / "migrations" / "0014_storage_quota.sql"
)


async def test_the_backfill_counts_owned_originals_only(fresh_pool: asyncpg.Pool) -> None:
    backfill = re.search(r"INSERT INTO storage_usage.*?;", MIGRATION.read_text(), re.S)
    assert backfill is not None
    accounts = [uuid.uuid4(), uuid.uuid4()]
    async with fresh_pool.acquire() as conn, conn.transaction():
        for account_id in accounts:
            await conn.execute("INSERT INTO accounts (account_id, name) VALUES ($1, 'a')", account_id)
            await conn.execute(
                "INSERT INTO pools (pool_id, account_id, name) VALUES ($1, $1, 'default')", account_id
            )
        originals = [
            (accounts[0], 100, "available"),
            (accounts[0], 20, "pending"),
            (accounts[1], 7, "available"),
        ]
        for account_id, size, state in originals:
            object_id = uuid.uuid4()
            await conn.execute(
                "INSERT INTO objects (object_id, pool_id, key, size_bytes, mime_type, sha256, state)"
                " VALUES ($1, $2, $3, $4, 'image/png', '', $5)",
                object_id,
                account_id,
                f"originals/{account_id}/{object_id}",
                size,
                state,
            )
            await conn.execute(
                "INSERT INTO object_ownership (object_id, account_id) VALUES ($1, $2)", object_id, account_id
            )
        derived = uuid.uuid4()
        await conn.execute(
            "INSERT INTO objects (object_id, pool_id, key, size_bytes, mime_type, sha256, state, source_object_id)"
            " VALUES ($1, $2, $3, 5000, 'image/webp', '', 'available', $4)",
            derived,
            accounts[0],
            f"derived/{accounts[0]}/{object_id}/1/thumb",
            object_id,
        )
        await conn.execute(
            "INSERT INTO object_ownership (object_id, account_id) VALUES ($1, $2)", derived, accounts[0]
        )
        await conn.execute("DELETE FROM storage_usage")
        await conn.execute(backfill.group(0))
        rows = await conn.fetch("SELECT account_id, used_bytes, used_objects, max_bytes FROM storage_usage")
    assert {r["account_id"]: (r["used_bytes"], r["used_objects"], r["max_bytes"]) for r in rows} == {
        accounts[0]: (120, 2, None),
        accounts[1]: (7, 1, None),
    }
