"""The pool's release (hypermedia.infra.db.create_pool): no reset query, and still no state left
behind by a transaction that failed."""

from __future__ import annotations

import asyncpg
import pytest

from hypermedia.infra import db


async def test_a_release_sends_no_reset_query(database_url: str) -> None:
    pool = await db.create_pool(database_url, max_size=1)
    try:
        async with pool.acquire() as conn:
            pid = conn.get_server_pid()
            await conn.execute("SELECT 'the last query' AS marker")
        watcher = await db.connect(database_url)
        try:
            last = await watcher.fetchval("SELECT query FROM pg_stat_activity WHERE pid = $1", pid)
        finally:
            await watcher.close()
        assert last == "SELECT 'the last query' AS marker"  # not asyncpg's pg_advisory_unlock_all()
        async with pool.acquire() as again:
            assert again.get_server_pid() == pid  # the same connection came back
    finally:
        await pool.close()


async def test_a_transaction_broken_by_an_error_is_rolled_back_before_reuse(database_url: str) -> None:
    pool = await db.create_pool(database_url, max_size=1)
    try:
        with pytest.raises(asyncpg.DivisionByZeroError):
            async with pool.acquire() as conn, conn.transaction():
                await conn.execute("CREATE TEMP TABLE IF NOT EXISTS t_pool (x int)")
                await conn.execute("INSERT INTO t_pool VALUES (1)")
                await conn.execute("SELECT 1 / 0")
        async with pool.acquire() as conn:
            assert not conn.is_in_transaction()
            assert await conn.fetchval("SELECT to_regclass('pg_temp.t_pool') IS NULL")  # rolled back
    finally:
        await pool.close()
