"""The platform behind PgBouncer in transaction pooling (issue 24 item 2, ADR 0076): Debian's
PgBouncer in front of the session's Postgres, every service's pool through it
(``HM_DATABASE_POOLER=transaction``), the session-state connections (``LISTEN`` for job events and
the outbox relays, migrations, the admin commands) on the server itself
(``HM_DATABASE_SESSION_URL``).

Jobs complete and settle; transaction-scoped advisory locks hold (an Idempotency-Key replayed
concurrently makes one job; a preset); a delayed job is queued by the reaper's poller; a job's
event stream ends right after its completion, which only a working ``LISTEN`` gives (a stream
without notifications wakes at its 15 s keep-alive); and PgBouncer's own statistics show the
services' transactions went through it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import psycopg
import pytest
from psycopg.rows import dict_row

from hypermedia.devtools.embedded import EmbeddedPgBouncer
from tests.e2e.conftest import RunningPlatform, own_database, start_platform, upload, wait_for, wait_job
from tests.e2e.deployed import pgbouncer_for
from tests.e2e.slowjob import make_slow_png

PHOTO = Path(__file__).resolve().parents[1] / "data" / "exif-orientation" / "Landscape_5.jpg"


@pytest.fixture(scope="module")
def bouncer(tmp_root: Path, database_url: str) -> Iterator[EmbeddedPgBouncer]:
    """PgBouncer in front of the session's Postgres server."""
    with pgbouncer_for(tmp_root / "pgbouncer", database_url) as pgbouncer:
        yield pgbouncer


@pytest.fixture(scope="module")
def pooled(
    tmp_root: Path, database_url: str, nats_url: str, bouncer: EmbeddedPgBouncer
) -> Iterator[RunningPlatform]:
    """``hypermedia up`` on a database of its own, every pool through PgBouncer."""
    with own_database(database_url, "pgbouncer") as direct:
        name = urlsplit(direct).path.lstrip("/")
        running = start_platform(
            tmp_root,
            bouncer.dsn(name),
            nats_url,
            HM_DATABASE_SESSION_URL=direct,
            HM_DATABASE_POOLER="transaction",
        )
        try:
            yield running
        finally:
            assert running.stop() == 0


@pytest.fixture(scope="module")
def account(pooled: RunningPlatform) -> dict[str, Any]:
    return pooled.admin("create-account", "--credits", "100")


def _transactions(bouncer: EmbeddedPgBouncer, database: str) -> int:
    """PgBouncer's count of the transactions it pooled for ``database`` (its admin console's
    ``SHOW STATS``)."""
    with psycopg.connect(bouncer.dsn("pgbouncer"), autocommit=True, row_factory=dict_row) as conn:
        rows = conn.execute("SHOW STATS").fetchall()
    return sum(int(r["total_xact_count"]) for r in rows if r["database"] == database)


def test_jobs_complete_and_settle_with_every_pool_through_pgbouncer(
    pooled: RunningPlatform, account: dict[str, Any], bouncer: EmbeddedPgBouncer
) -> None:
    database = urlsplit(pooled.env["HM_DATABASE_URL"]).path.lstrip("/")
    before = _transactions(bouncer, database)
    with pooled.client(account) as client:
        obj = upload(client, PHOTO)
        created = client.post(
            "/v1/hypermedia/process",
            json={"object_id": obj["object_id"], "operations": ["thumbnail", "compress"]},
        )
        assert created.status_code == 202, created.text
        jobs = [wait_job(client, job_id) for job_id in created.json()["job_ids"]]
        assert [j["status"] for j in jobs] == ["completed"] * 2, jobs
        assert all(j["outputs"] for j in jobs)
        thumbnail = next(o for o in jobs[0]["outputs"] if o["output_type"] == "thumbnail")
        assert httpx.get(thumbnail["url"], timeout=30).content[:4] == b"RIFF"

        def settled() -> bool:
            entries = client.get("/v1/account/ledger").json()["entries"]
            return {j["job_id"] for j in jobs} <= {e["job_id"] for e in entries if e["kind"] == "commit"}

        wait_for("both jobs' commits in the ledger", settled, 15)
    # Every service's statements went through PgBouncer: many transactions a job.
    assert _transactions(bouncer, database) - before >= 2 * 5


def test_transaction_scoped_locks_hold_through_pgbouncer(
    pooled: RunningPlatform, account: dict[str, Any]
) -> None:
    """An Idempotency-Key sent 8 times at once makes one job (the key's advisory lock is the
    transaction's); a preset put 4 times at once is made once under its lock, and used."""
    with pooled.client(account) as client:
        obj = upload(client, PHOTO)
        body = {"object_id": obj["object_id"], "operations": ["thumbnail"]}

        def send(_: int) -> httpx.Response:
            return client.post(
                "/v1/hypermedia/process", json=body, headers={"Idempotency-Key": "pgbouncer-once"}
            )

        with ThreadPoolExecutor(8) as threads:
            answers = list(threads.map(send, range(8)))
        assert {a.status_code for a in answers} <= {200, 202}, [a.text for a in answers]
        assert len({tuple(a.json()["job_ids"]) for a in answers}) == 1

        # Four puts of one preset at once: its lock makes one version, the rest find it unchanged.
        def put(_: int) -> httpx.Response:
            return client.put("/v1/presets/small", json={"operation": "thumbnail", "params": {"size": 64}})

        with ThreadPoolExecutor(4) as threads:
            puts = list(threads.map(put, range(4)))
        assert sorted(p.status_code for p in puts) == [200, 200, 200, 201], [p.text for p in puts]
        assert {p.json()["version"] for p in puts} == {1}
        job_id = client.post(
            "/v1/hypermedia/process",
            json={"object_id": obj["object_id"], "operations": [{"preset": "small"}]},
        ).json()["job_ids"][0]
        assert wait_job(client, job_id)["status"] == "completed"


def test_a_delayed_job_is_queued_by_the_poller_through_pgbouncer(
    pooled: RunningPlatform, account: dict[str, Any]
) -> None:
    with pooled.client(account) as client:
        obj = upload(client, PHOTO)
        created = client.post(
            "/v1/hypermedia/process",
            json={"object_id": obj["object_id"], "operations": ["thumbnail"], "delay_seconds": 1},
        )
        assert created.status_code == 202, created.text
        job = wait_job(client, created.json()["job_ids"][0])
        assert job["status"] == "completed"
        started = datetime.fromisoformat(job["attempts"][0]["started_at"])
        assert started >= datetime.fromisoformat(created.json()["not_before"])


def test_an_event_stream_ends_at_once_after_its_job_so_listen_works(
    pooled: RunningPlatform, account: dict[str, Any], tmp_path: Path
) -> None:
    """The gateway's events hub listens on HM_DATABASE_SESSION_URL. Through PgBouncer a LISTEN
    would be on a pooled server connection, and the stream would learn of the job's end only at
    its 15 s keep-alive; on the session URL it ends within a few seconds."""
    png = make_slow_png(tmp_path / "perlin.png", 1500)
    with pooled.client(account) as client:
        obj = upload(client, png)
        job_id = client.post(
            "/v1/hypermedia/process", json={"object_id": obj["object_id"], "operations": ["compress"]}
        ).json()["job_ids"][0]
        statuses = []
        with client.stream("GET", f"/v1/jobs/{job_id}/events", timeout=60) as response:
            assert response.status_code == 200
            for line in response.iter_lines():
                if line.startswith("data: "):
                    statuses.append(line)
        ended = time.time()
        job = wait_job(client, job_id)
    assert job["status"] == "completed" and '"completed"' in statuses[-1]
    assert ended - datetime.fromisoformat(job["completed_at"]).timestamp() < 5, statuses
    with psycopg.connect(pooled.info["database_url"], autocommit=True) as conn:
        listening = {
            row[0]
            for row in conn.execute(
                "SELECT query FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'LISTEN%'"
            ).fetchall()
        }
    assert {'LISTEN "hm_outbox"', 'LISTEN "job_events"'} <= listening, listening
