"""Profile versions and outdated outputs on real Postgres (hypermedia/jobs/profiles.py, issue 21
item 1): a new version becomes the one active version in one step, with its changes, and the
outputs of the older version become outdated exactly for the (object, operation, params) not yet
made again under the new one; `hypermedia admin profile-version` and `admin outdated` print them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import asyncpg
import pytest

from hypermedia.jobs import profiles
from tests.integration.conftest import Seeder, Tenant, _with_database

REPO = Path(__file__).resolve().parents[2]


async def output(
    pool: asyncpg.Pool, seed: Seeder, tenant: Tenant, version: int, params: dict[str, int]
) -> uuid.UUID:
    """A completed thumbnail job of ``tenant``'s object under profile ``version`` with one output."""
    job_id = await seed.job(tenant, status="completed")
    await pool.execute(
        "UPDATE processing_jobs SET profile_version = $2, params = $3 WHERE job_id = $1",
        job_id,
        version,
        params,
    )
    derived = await seed.output_object(tenant)
    await pool.execute(
        "INSERT INTO job_outputs (job_id, output_type, profile_version, object_id, key, mime_type, size_bytes) "
        "VALUES ($1, 'thumbnail', $2, $3, $4, 'image/webp', 100)",
        job_id,
        version,
        derived,
        f"derived/{derived}",
    )
    return job_id


async def test_a_new_version_is_the_one_active_and_makes_older_outputs_outdated(
    fresh_pool: asyncpg.Pool, seed: Seeder
) -> None:
    tenant, other = await seed.tenant(), await seed.tenant()
    small = await output(fresh_pool, seed, tenant, 1, {"size": 128})
    await output(fresh_pool, seed, tenant, 1, {"size": 256})
    foreign = await output(fresh_pool, seed, other, 1, {"size": 128})
    async with fresh_pool.acquire() as conn:
        assert await profiles.outdated_outputs(conn) == [], "nothing is outdated while v1 is active"
        created = await profiles.new_version(conn, "thumbnail", {"timeout_seconds": 45})
        assert (created["version"], created["active"], created["timeout_seconds"]) == (2, True, 45)
        active = await conn.fetch(
            "SELECT version, timeout_seconds FROM processing_profiles WHERE operation = 'thumbnail'"
        )
        assert sorted((r["version"], r["timeout_seconds"]) for r in active) == [(1, 30), (2, 45)]
        assert (
            await conn.fetchval(
                "SELECT version FROM processing_profiles WHERE operation = 'thumbnail' AND active"
            )
            == 2
        )
        outdated = await profiles.outdated_outputs(conn)
        assert len(outdated) == 3 and {o["active_version"] for o in outdated} == {2}
        # The 128 px thumbnail of the first tenant's object is made again under v2: only it is current.
        await output(fresh_pool, seed, tenant, 2, {"size": 128})
        outdated = await profiles.outdated_outputs(conn)
        assert sorted((o["account_id"], o["params"]["size"]) for o in outdated) == sorted(
            [(str(tenant.account_id), 256), (str(other.account_id), 128)]
        )
        assert str(small) not in {o["job_id"] for o in outdated}
        mine = await profiles.outdated_outputs(conn, account_id=str(other.account_id))
        assert [o["job_id"] for o in mine] == [str(foreign)]
        assert await profiles.outdated_outputs(conn, operation="resize") == []
        with pytest.raises(ValueError, match="memory_limit_mb: must be between"):
            await profiles.new_version(conn, "thumbnail", {"memory_limit_mb": 1})
        with pytest.raises(ValueError, match="queue: not a field"):
            await profiles.new_version(conn, "thumbnail", {"queue": 1})
        with pytest.raises(LookupError, match="no active profile"):
            await profiles.new_version(conn, "nope", {})
        assert (
            await conn.fetchval("SELECT max(version) FROM processing_profiles WHERE operation = 'thumbnail'")
            == 2
        )


async def test_the_admin_commands_make_a_version_and_list_what_it_outdates(
    fresh_pool: asyncpg.Pool, seed: Seeder, database_url: str
) -> None:
    tenant = await seed.tenant()
    job_id = await output(fresh_pool, seed, tenant, 1, {"size": 64})
    env = os.environ | {
        "HM_DATABASE_URL": _with_database(
            database_url, await fresh_pool.fetchval("SELECT current_database()")
        )
    }

    def admin(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "hypermedia.devtools.cli", "admin", *args],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )

    made = admin("profile-version", "thumbnail", "--set", "max_attempts=5")
    assert made.returncode == 0, made.stderr
    assert (json.loads(made.stdout)["version"], json.loads(made.stdout)["max_attempts"]) == (2, 5)
    listed = admin("outdated", "--operation", "thumbnail")
    assert listed.returncode == 0, listed.stderr
    [row] = json.loads(listed.stdout)["outputs"]
    assert (row["job_id"], row["profile_version"], row["active_version"], row["params"]) == (
        str(job_id),
        1,
        2,
        {"size": 64},
    )
    bad = admin("profile-version", "thumbnail", "--set", "timeout_seconds=0")
    assert (bad.returncode, bad.stderr.strip()) == (
        1,
        "hypermedia admin profile-version: timeout_seconds: must be between 1 and 86400",
    )
    assert admin("profile-version", "thumbnail", "--set", "oops").returncode == 2
