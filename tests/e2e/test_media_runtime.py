"""The worker runtime under long media jobs, end to end: progress reported from inside a running
sandbox child reaches the job's event stream, the heartbeat keeps a job's lease ahead of it while
it runs and while it waits, and the media coordinator runs one audio rendition at a time beside
other media work, and lets a waiting job be cancelled without running it.

The platform runs without its own mediaworker (a database of its own, so no other platform's
workers see these jobs); the test starts one mediaworker process, :mod:`tests.e2e.media_harness`:
the real :class:`services.mediaworker.MediaHandler` and settings, 3 slots, the coordinator at one
audio rendition, heartbeats every second, with the sandbox entry :mod:`tests.e2e.media_entries`,
whose run time each job's params choose (:func:`~tests.e2e.media_entries.run_seconds`). Jobs are
created and cancelled over REST, as a client would; what the worker wrote is read from Postgres.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from hypermedia.devtools.embedded import free_port
from hypermedia.engines.media import transcode
from hypermedia.sandbox import SandboxLimits
from tests.e2e.conftest import REPO, RunningPlatform, isolated_platform, upload, wait_for, wait_job
from tests.e2e.media_entries import run_seconds
from tests.helpers.media import write_video

SLOTS = 3
HEARTBEAT_SECONDS = 1
AUDIO_8S: tuple[dict[str, Any], ...] = (
    {"name": "transcode_audio", "params": {"bitrate": 256}},
    {"name": "transcode_audio", "params": {"bitrate": 257}},
)
"""Two audio renditions the test entry runs for 8 s (:func:`~tests.e2e.media_entries.run_seconds`),
different so that their outputs' keys differ."""
DEFAULT_NPROC = SandboxLimits(cpu_seconds=1, wall_seconds=1, memory_bytes=1, fsize_bytes=1).nproc
"""The ``RLIMIT_NPROC`` every job gets (16)."""


@dataclass
class MediaWorker:
    """A harness process and its worker id."""

    proc: subprocess.Popen[bytes]
    worker_id: str

    def stop(self) -> int:
        """SIGTERM (a drain), then its exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise


def start_media_worker(platform: RunningPlatform) -> MediaWorker:
    """A mediaworker (the harness) with 3 slots, one audio rendition at a time and a heartbeat
    every second, in a work directory of its own; returns once it has registered."""
    name = f"media-harness-{secrets.token_hex(3)}"
    env = platform.service_env() | {
        "HM_WORKER_SLOTS": str(SLOTS),
        "HM_MEDIA_MAX_AUDIO_JOBS": "1",
        "HM_MEDIA_MAX_VIDEO_JOBS": "3",
        "HM_HEARTBEAT_SECONDS": str(HEARTBEAT_SECONDS),
        "HM_WORK_DIR": str(platform.state_dir / f"work-{name}"),
        "HM_WORKER_STATUS_BIND": f"127.0.0.1:{free_port()}",
    }
    with (platform.state_dir / f"{name}.log").open("ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.e2e.media_harness"], env=env, cwd=REPO, stdout=log, stderr=log
        )
    with psycopg.connect(platform.env["HM_DATABASE_URL"], autocommit=True) as conn:

        def registered() -> str | None:
            if proc.poll() is not None:
                raise AssertionError(f"the media harness exited at start: {proc.returncode}")
            row = conn.execute(
                "SELECT worker_id FROM workers WHERE role = 'mediaworker' AND pid = %s AND status = 'running' "
                "AND queue NOT LIKE 'sched.%%'",
                (proc.pid,),
            ).fetchone()
            return None if row is None else str(row[0])

        try:
            worker_id = wait_for("the media harness registered", registered, timeout=60, interval=0.2)
        except BaseException:
            proc.kill()
            proc.wait()
            raise
    return MediaWorker(proc, worker_id)


@pytest.fixture(scope="module")
def media_platform(tmp_root: Path, database_url: str, nats_url: str) -> Iterator[RunningPlatform]:
    with isolated_platform(
        tmp_root, database_url, nats_url, "mediart", services="credits,storage,gateway,reaper"
    ) as running:
        yield running


@pytest.fixture
def media_worker(media_platform: RunningPlatform) -> Iterator[MediaWorker]:
    """The test's only mediaworker; stopped with SIGTERM at its end (or earlier by the test), which
    must exit 0."""
    worker = start_media_worker(media_platform)
    try:
        yield worker
    finally:
        code = worker.stop()
    assert code == 0, f"the media harness exited with {code}"


@pytest.fixture
def client(media_platform: RunningPlatform, media_worker: MediaWorker) -> Iterator[httpx.Client]:
    account = media_platform.admin("create-account", "--credits", "1000")
    with media_platform.client(account) as c:
        yield c


@pytest.fixture
def pg(media_platform: RunningPlatform) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(media_platform.env["HM_DATABASE_URL"], autocommit=True) as conn:
        yield conn


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An MP4 of 1 s of H.264 (320×240) and AAC: media every operation of these tests accepts."""
    return write_video(tmp_path_factory.mktemp("media-runtime") / "clip.mp4", seconds=1.0)


# -- helpers ------------------------------------------------------------------------------------------


def _process(client: httpx.Client, object_id: str, *operations: dict[str, Any]) -> list[str]:
    created = client.post(
        "/v1/hypermedia/process", json={"object_id": object_id, "operations": list(operations)}
    )
    assert created.status_code == 202, created.text
    return list(created.json()["job_ids"])


def _sse(client: httpx.Client, job_id: str) -> list[dict[str, Any]]:
    """Every event of the job as GET /v1/jobs/{id}/events streams it (it ends after the terminal
    status)."""
    events: list[dict[str, Any]] = []
    with client.stream("GET", f"/v1/jobs/{job_id}/events", timeout=60) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[len("data: ") :]))
    return events


def _progress_events(pg: psycopg.Connection[Any], job_id: str) -> list[tuple[float, str]]:
    """``(progress, stage)`` of the job's progress events, in order."""
    rows = pg.execute(
        "SELECT progress, detail->>'stage' FROM job_events WHERE job_id = %s AND kind = 'progress' "
        "ORDER BY event_id",
        (job_id,),
    ).fetchall()
    return [(float(r[0]), str(r[1])) for r in rows]


def _run(pg: psycopg.Connection[Any], job_id: str) -> dict[str, Any]:
    """The metadata of the job's ``run`` output (what the entry saw: times, threads, nproc)."""
    row = pg.execute(
        "SELECT metadata FROM job_outputs WHERE job_id = %s AND output_type = 'run'", (job_id,)
    ).fetchone()
    assert row is not None, f"job {job_id} has no run output"
    return dict(row[0])


def _job(pg: psycopg.Connection[Any], job_id: str) -> dict[str, Any]:
    row = pg.execute(
        "SELECT status, attempt_count, lost_attempts, visibility_timeout, now() AS now "
        "FROM processing_jobs WHERE job_id = %s",
        (job_id,),
    ).fetchone()
    assert row is not None
    return dict(
        zip(("status", "attempt_count", "lost_attempts", "visibility_timeout", "now"), row, strict=True)
    )


def _waiting(pg: psycopg.Connection[Any], job_id: str) -> bool:
    """Whether the job recorded that it waits for the coordinator."""
    return "waiting" in {stage for _, stage in _progress_events(pg, job_id)}


def _one_waits(pg: psycopg.Connection[Any], jobs: list[str]) -> tuple[str, str]:
    """``(waiting, running)`` of two jobs of which the coordinator admits one at a time: whichever
    downloads first runs (they are claimed together), the other records that it waits."""
    waiting = wait_for(
        "one of the jobs waits", lambda: [job_id for job_id in jobs if _waiting(pg, job_id)], timeout=30
    )
    assert len(waiting) == 1, waiting
    [running] = set(jobs) - set(waiting)
    return waiting[0], running


def _shorten_lease(pg: psycopg.Connection[Any], job_id: str, seconds: float) -> Any:
    """Cut the job's lease to ``seconds`` from now (the reaper, every second, would take the job
    back once it passed) and return the new ``visibility_timeout``."""
    row = pg.execute(
        "UPDATE processing_jobs SET visibility_timeout = now() + make_interval(secs => %s) "
        "WHERE job_id = %s RETURNING visibility_timeout",
        (seconds, job_id),
    ).fetchone()
    assert row is not None
    return row[0]


def _outlives_its_lease(pg: psycopg.Connection[Any], job_id: str, lease: float, state: str) -> None:
    """Shortens the job's lease to ``lease`` seconds and checks, once that time has passed, that
    the job is still on its first attempt in ``state`` (``running``: processing; ``waiting``:
    processing without a ``processing`` progress event yet) with its lease moved past it."""
    shortened = _shorten_lease(pg, job_id, lease)
    time.sleep(lease + 2 * HEARTBEAT_SECONDS)
    job = _job(pg, job_id)
    assert (job["status"], job["attempt_count"], job["lost_attempts"]) == ("processing", 1, 0)
    assert job["visibility_timeout"] > shortened and job["visibility_timeout"] > job["now"]
    stages = {stage for _, stage in _progress_events(pg, job_id)}
    assert ("processing" in stages) == (state == "running"), stages


# -- tests --------------------------------------------------------------------------------------------


def test_a_running_job_reports_its_progress_through_the_events_stream(
    client: httpx.Client, pg: psycopg.Connection[Any], clip: Path
) -> None:
    obj = upload(client, clip)
    params = {"codec": "h264", "heights": [240], "quality": 24}  # 6 s, 12 progress reports
    [job_id] = _process(client, obj["object_id"], {"name": "transcode_video", "params": params})
    job = wait_job(client, job_id, timeout=60)
    assert job["status"] == "completed", job

    events = _sse(client, job_id)
    progress = [(e["progress"], e["detail"]["stage"]) for e in events if e["kind"] == "progress"]
    stages = [stage for _, stage in progress]
    assert stages[0] == "downloaded" and stages[-2:] == ["processed", "uploaded"], progress
    processing = [value for value, stage in progress if stage == "processing"]
    # The entry reports for 6 s and the worker reads every 2 s: two or three events at least.
    assert len(processing) >= 2, progress
    assert all(0.25 < value <= 0.75 for value in processing), processing
    assert processing == sorted(set(processing)), processing
    processing_at = [i for i, stage in enumerate(stages) if stage == "processing"]
    assert stages.index("downloaded") < processing_at[0] and processing_at[-1] < stages.index("processed")

    # Encoder threads: HM_MEDIA_ENCODER_THREADS (2) for transcode_video, and RLIMIT_NPROC raised by
    # what the decoder and encoders start (the worker runs as root: a uid per slot, absolute limit).
    run = _run(pg, job_id)
    assert run["threads"] == 2
    nproc = DEFAULT_NPROC + transcode.thread_need(job["params"], 2)
    assert run["nproc"] == nproc if os.geteuid() == 0 else run["nproc"] >= nproc


def test_the_heartbeat_keeps_a_long_job_s_lease_ahead_of_it(
    client: httpx.Client, pg: psycopg.Connection[Any], clip: Path
) -> None:
    """A job running longer than its lease would allow: the lease is cut to 3 s while the job has
    10 s to run; the heartbeat (every second) moves it forward, so the reaper (every second)
    never takes the job back and it completes on its first attempt."""
    obj = upload(client, clip)
    params = {"codec": "h264", "heights": [240], "quality": 40}  # 10 s
    [job_id] = _process(client, obj["object_id"], {"name": "transcode_video", "params": params})
    wait_for(
        "the job reports progress",
        lambda: any(stage == "processing" for _, stage in _progress_events(pg, job_id)),
        timeout=30,
    )
    _outlives_its_lease(pg, job_id, lease=3, state="running")
    job = wait_job(client, job_id, timeout=60)
    assert (job["status"], job["attempt_count"], job["lost_attempts"]) == ("completed", 1, 0)
    assert [a["status"] for a in job["attempts"]] == ["completed"]


def test_the_coordinator_runs_one_audio_rendition_at_a_time_beside_other_media_work(
    client: httpx.Client, pg: psycopg.Connection[Any], clip: Path
) -> None:
    """Three slots, at most one ``transcode_audio`` at once: of two audio jobs one waits (one
    ``waiting`` event; the heartbeat keeps its lease meanwhile) and starts after the other ended,
    while a ``probe`` runs beside the first."""
    obj = upload(client, clip)
    jobs = _process(client, obj["object_id"], *AUDIO_8S, {"name": "probe"})
    waiting, _ = _one_waits(pg, jobs[:2])
    _outlives_its_lease(pg, waiting, lease=2, state="waiting")
    for job_id in jobs:
        job = wait_job(client, job_id, timeout=60)
        assert (job["status"], job["attempt_count"]) == ("completed", 1), job

    first, second = sorted((_run(pg, job_id) for job_id in jobs[:2]), key=lambda run: run["started"])
    probe = _run(pg, jobs[2])
    assert second["started"] >= first["ended"], (first, second)  # never two audio renditions at once
    assert probe["started"] < first["ended"] and probe["ended"] > first["started"], (probe, first)
    assert {run["threads"] for run in (first, second, probe)} == {1}
    later = next(job_id for job_id in jobs[:2] if _run(pg, job_id)["started"] == second["started"])
    assert later == waiting
    assert [stage for _, stage in _progress_events(pg, later)].count("waiting") == 1
    assert not _waiting(pg, jobs[2])


def test_a_job_cancelled_while_it_waits_for_the_coordinator_ends_without_running(
    client: httpx.Client, pg: psycopg.Connection[Any], clip: Path
) -> None:
    obj = upload(client, clip)
    waiting, running = _one_waits(pg, _process(client, obj["object_id"], *AUDIO_8S))
    assert client.post(f"/v1/jobs/{waiting}:cancel").status_code == 200

    job = wait_job(client, waiting, timeout=10)
    assert (job["status"], job["outputs"]) == ("cancelled", [])
    assert [a["status"] for a in job["attempts"]] == ["cancelled"]
    # Ended while the first still ran: it never got the coordinator, so its entry never ran.
    assert _job(pg, running)["status"] == "processing"
    assert "processing" not in {stage for _, stage in _progress_events(pg, waiting)}
    wait_for(
        "the cancelled job's hold is released",
        lambda: pg.execute(
            "SELECT 1 FROM credit_holds WHERE job_id = %s AND status = 'released'", (waiting,)
        ).fetchone(),
        timeout=10,
    )

    first = wait_job(client, running, timeout=60)
    assert first["status"] == "completed"
    assert _run(pg, running)["ended"] - _run(pg, running)["started"] >= run_seconds(
        "transcode_audio", AUDIO_8S[0]["params"]
    )


def test_a_drain_hands_back_a_waiting_job_at_once_and_lets_the_running_one_finish(
    client: httpx.Client,
    pg: psycopg.Connection[Any],
    clip: Path,
    media_platform: RunningPlatform,
    media_worker: MediaWorker,
) -> None:
    """SIGTERM while one audio rendition runs (8 s) and another waits for the coordinator: the
    waiting one, not started, is back in the queue within a second or two (one lost attempt),
    not at the end of the 35 s drain; the running one finishes within the drain; the worker exits
    0; another worker then runs the handed-back job."""
    obj = upload(client, clip)
    waiting, running = _one_waits(pg, _process(client, obj["object_id"], *AUDIO_8S))
    media_worker.proc.send_signal(signal.SIGTERM)

    back = wait_for(
        "the waiting job is handed back",
        lambda: (job := _job(pg, waiting))["status"] == "queued" and job,
        timeout=5,
        interval=0.1,
    )
    assert (back["attempt_count"], back["lost_attempts"]) == (1, 1)
    assert _job(pg, running)["status"] == "processing"
    assert media_worker.stop() == 0
    first = wait_job(client, running, timeout=15)
    assert (first["status"], first["attempt_count"], first["lost_attempts"]) == ("completed", 1, 0)

    other = start_media_worker(media_platform)
    try:
        job = wait_job(client, waiting, timeout=30)
    finally:
        assert other.stop() == 0
    assert (job["status"], job["attempt_count"], job["lost_attempts"]) == ("completed", 2, 1)
    assert [a["status"] for a in job["attempts"]] == ["lost", "completed"]
    assert [a["worker_id"] for a in job["attempts"]] == [media_worker.worker_id, other.worker_id]
