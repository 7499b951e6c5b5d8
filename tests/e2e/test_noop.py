"""The ``noop`` operation (ADR 0038) through REST, the way a client calls it: refused by a
platform that does not enable it, and on one that does (``HM_NOOP_OPERATION=1``, the benchmark's
setting) created, claimed, completed and settled at zero by the real services."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from hypermedia.jobs.lifecycle import FAIR_WINDOW
from tests.e2e.conftest import RunningPlatform, isolated_platform, upload, wait_for, wait_job

PHOTO = Path(__file__).resolve().parents[1] / "data" / "exif-orientation" / "Landscape_1.jpg"


@pytest.fixture(scope="module")
def noop_platform(tmp_root: Path, database_url: str, nats_url: str) -> Iterator[RunningPlatform]:
    with isolated_platform(
        tmp_root, database_url, nats_url, "noop", "credits,storage,gateway,imageworker", HM_NOOP_OPERATION="1"
    ) as running:
        yield running


def test_noop_is_refused_where_it_is_not_enabled(client: httpx.Client) -> None:
    obj = upload(client, PHOTO)
    response = client.post(
        "/v1/hypermedia/process", json={"object_id": obj["object_id"], "operations": ["noop"]}
    )
    assert response.status_code == 422, response.text
    body = response.json()
    assert body["error_code"] == "OPERATION_NOT_ENABLED"
    assert "HM_NOOP_OPERATION" in body["detail"]


def test_noop_jobs_run_through_the_job_system_and_cost_nothing(noop_platform: RunningPlatform) -> None:
    account = noop_platform.admin("create-account", "--credits", "1")
    with noop_platform.client(account) as client:
        obj = upload(client, PHOTO)
        response = client.post(
            "/v1/hypermedia/process", json={"object_id": obj["object_id"], "operations": ["noop"] * 16}
        )
        assert response.status_code == 202, response.text
        assert response.json()["estimated_credits"] == 0
        job_ids = response.json()["job_ids"]
        assert len(set(job_ids)) == 16
        jobs = [wait_job(client, job_id) for job_id in job_ids]
        assert {j["status"] for j in jobs} == {"completed"}
        assert all(j["outputs"] == [] for j in jobs)
    with psycopg.connect(noop_platform.env["HM_DATABASE_URL"], autocommit=True) as conn:

        def settled() -> list[Any] | None:
            rows = conn.execute(
                "SELECT status, count(*) FROM credit_holds WHERE job_id = ANY(%s::uuid[]) GROUP BY status",
                (job_ids,),
            ).fetchall()
            return rows if rows == [("committed", 16)] else None

        # A job's settlement follows its completed status (CI once read two holds still held).
        holds = wait_for("every hold committed", settled, timeout=15, interval=0.1)
        statuses = conn.execute(
            "SELECT array_agg(status ORDER BY event_id) FROM job_events WHERE job_id = %s AND kind = 'status'",
            (job_ids[0],),
        ).fetchone()
        charged = conn.execute(
            "SELECT coalesce(sum(amount), 0) FROM credit_ledger WHERE job_id = ANY(%s::uuid[])", (job_ids,)
        ).fetchone()
    assert holds == [("committed", 16)]
    assert statuses is not None and statuses[0][-1] == "completed" and "processing" in statuses[0]
    assert charged == (0,)
    with noop_platform.client(account) as client:
        balance = client.get("/v1/credits").json()
    assert (balance["balance"], balance["held"]) == (1, 0)


def test_one_tenants_flood_does_not_hold_another_tenants_job_back(noop_platform: RunningPlatform) -> None:
    """ADR 0059, loosely (bench/fairness.py measures it): tenant A creates about 1,000 no-op jobs
    at priority 5, then tenant B one. While B's job waited, at most A's window and a few of the
    worker's batches of A's jobs started, not the rest of the flood queued before it."""
    flood = noop_platform.admin("create-account", "--credits", "1")
    noop_platform.admin(
        "set-quota",
        flood["account_id"],
        "--rate",
        "100000",
        "--burst",
        "100000",
        "--max-queued-jobs",
        "100000",
    )
    other = noop_platform.admin("create-account", "--credits", "1")
    with noop_platform.client(flood) as a, noop_platform.client(other) as b:
        a_object, b_object = upload(a, PHOTO)["object_id"], upload(b, PHOTO)["object_id"]
        flooded: list[str] = []
        for _ in range(63):
            made = a.post(
                "/v1/hypermedia/process",
                json={"object_id": a_object, "operations": ["noop"] * 16, "priority": 5},
            )
            assert made.status_code == 202, made.text
            flooded += made.json()["job_ids"]
        behind = b.post(
            "/v1/hypermedia/process", json={"object_id": b_object, "operations": ["noop"], "priority": 5}
        ).json()["job_ids"][0]
        assert wait_job(b, behind, timeout=120)["status"] == "completed"
    with psycopg.connect(noop_platform.env["HM_DATABASE_URL"], autocommit=True) as conn:
        created, started = conn.execute(
            "SELECT created_at, started_at FROM processing_jobs WHERE job_id = %s", (behind,)
        ).fetchone()  # type: ignore[misc]
        waiting, ahead = conn.execute(
            """SELECT count(*) FILTER (WHERE started_at IS NULL OR started_at > %s),
                      count(*) FILTER (WHERE started_at > %s AND started_at < %s)
               FROM processing_jobs WHERE job_id = ANY(%s::uuid[])""",
            (created, created, started, flooded),
        ).fetchone()  # type: ignore[misc]
    assert waiting > 300, "the flood was still queued when B's job was created (else this shows nothing)"
    assert ahead <= FAIR_WINDOW + 32, (ahead, waiting)
