"""An account's cap of running jobs per queue (issue 21 item 4, ADR 0060) end to end: set with
``hypermedia admin set-quota --max-running-jobs``, jobs created over REST and run by the real
image worker (4 slots). The capped account's jobs run one after the other, each exactly once and
from its one message (given back while held, never dropped and republished); another account's
job created behind them is not held back by their returned messages."""

from __future__ import annotations

import itertools
from pathlib import Path

import psycopg

from tests.e2e.conftest import RunningPlatform, upload, wait_job
from tests.e2e.slowjob import make_slow_png

PHOTO = Path(__file__).resolve().parents[1] / "data" / "exif-orientation" / "Landscape_2.jpg"


def test_a_capped_account_runs_one_job_at_a_time_and_another_account_is_not_held_back(
    platform: RunningPlatform, tmp_path: Path
) -> None:
    capped = platform.admin("create-account", "--credits", "1000")
    quota = platform.admin("set-quota", capped["account_id"], "--max-running-jobs", "1")
    assert quota["max_running_jobs"] == 1
    other = platform.admin("create-account", "--credits", "100")

    # Five jobs of about a second of CPU each (compress of a 1500 px noise PNG).
    png = make_slow_png(tmp_path / "noise.png", size=1500)
    with platform.client(capped, timeout=60) as client:
        obj = upload(client, png)
        ops = [{"name": "compress", "params": {"quality": q}} for q in range(60, 65)]
        created = client.post(
            "/v1/hypermedia/process", json={"object_id": obj["object_id"], "operations": ops}
        )
        assert created.status_code == 202, created.text
        capped_jobs = created.json()["job_ids"]
        with platform.client(other) as other_client:
            other_obj = upload(other_client, PHOTO)
            response = other_client.post(
                "/v1/hypermedia/process",
                json={"object_id": other_obj["object_id"], "operations": ["thumbnail"]},
            )
            assert response.status_code == 202, response.text
            [other_job] = response.json()["job_ids"]
            assert wait_job(other_client, other_job)["status"] == "completed"
        finished = [wait_job(client, job_id, timeout=120) for job_id in capped_jobs]
    assert {job["status"] for job in finished} == {"completed"}

    with psycopg.connect(platform.env["HM_DATABASE_URL"]) as conn:
        attempts = conn.execute(
            "SELECT job_id::text, started_at, finished_at FROM job_attempts WHERE job_id = ANY(%s::uuid[]) "
            "ORDER BY started_at",
            (capped_jobs,),
        ).fetchall()
        published = conn.execute(
            "SELECT count(*) FROM outbox WHERE job_id = ANY(%s::uuid[])", (capped_jobs,)
        ).fetchone()
        [(other_done,)] = conn.execute(
            "SELECT completed_at FROM processing_jobs WHERE job_id = %s", (other_job,)
        ).fetchall()
    assert sorted(job_id for job_id, _, _ in attempts) == sorted(capped_jobs), "one attempt each"
    # Each held job's one message came back (nak with a delay), never dropped and republished.
    assert published == (len(capped_jobs),)
    for (_, _, first_end), (_, second_start, _) in itertools.pairwise(attempts):
        assert second_start >= first_end, f"two of the capped account's jobs ran at once: {attempts}"
    assert other_done < max(end for _, _, end in attempts), (
        "the other account's job waited for the capped ones"
    )
