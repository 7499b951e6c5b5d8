"""Checkpoints end to end (issue 23 item 1, ADR 0069) on a real platform with ocrworkers and
docworkers the test starts and drains: an OCR of 20 pages whose worker is drained after page 8
resumes on another worker at the page after the last one kept, the pages kept are not read again
(the attempts' checkpoint rows and the engine's own ``resumed_pages``), the outputs are those of
one uninterrupted run, and the checkpoints are deleted once the job ended; a 20-page preview at
300 dpi drained after two kept parts resumes after them the same way."""

from __future__ import annotations

import hashlib
import itertools
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import av
import httpx
import psycopg
import pypdfium2 as pdfium
import pytest

from hypermedia.devtools.embedded import free_port
from hypermedia.jobs import charges
from tests.e2e.conftest import REPO, RunningPlatform, own_database, start_platform, upload, wait_for, wait_job
from tests.helpers.media import write_video
from tests.helpers.pdf import text_pages_pdf

PAGES = 20
"""The OCR page cap of one job (``MAX_OCR_PAGES``)."""
DRAIN_AFTER = 8
WORDS = [
    "harbour",
    "lantern",
    "meadow",
    "orchard",
    "pebble",
    "quartz",
    "saddle",
    "thimble",
    "violet",
    "walnut",
]


@pytest.fixture(scope="module")
def checkpoints_database_url(database_url: str) -> Iterator[str]:
    with own_database(database_url, "checkpoints") as dsn:
        yield dsn


@pytest.fixture(scope="module")
def platform_without_workers(
    tmp_root: Path, checkpoints_database_url: str, nats_url: str
) -> Iterator[RunningPlatform]:
    """Credits, storage, gateway and reaper; the ocrworkers are the test's."""
    running = start_platform(
        tmp_root,
        checkpoints_database_url,
        nats_url,
        services="credits,storage,gateway,reaper",
        # A worker killed outright is declared dead after 12 s without a heartbeat (every 5 s
        # here), not the default 120 s, and its job recovered then.
        HM_REAPER_DEAD_WORKER_SECONDS="12",
    )
    try:
        yield running
    finally:
        assert running.stop() == 0


def _worker(
    platform: RunningPlatform, name: str, service: str = "ocrworker", **extra_env: str
) -> subprocess.Popen[bytes]:
    """A worker of ``service`` (``ocrworker``) with one slot, whose drain hands a running job back
    after 0.2 s; returned once it has registered."""
    env = platform.service_env(service) | {
        "HM_WORKER_SLOTS": "1",
        "HM_WORK_DIR": str(platform.state_dir / f"work-{name}"),
        "HM_WORKER_STATUS_BIND": f"127.0.0.1:{free_port()}",
        "HM_DRAIN_SECONDS": "0.2",
        **extra_env,
    }
    with (platform.state_dir / "logs" / f"{service}-{name}.log").open("ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", f"services.{service}"], env=env, cwd=REPO, stdout=log, stderr=log
        )
    with psycopg.connect(platform.env["HM_DATABASE_URL"], autocommit=True) as conn:
        wait_for(
            f"{service} {name} registered",
            lambda: (
                proc.poll() is None
                and conn.execute(
                    "SELECT 1 FROM workers WHERE pid = %s AND status = 'running'", (proc.pid,)
                ).fetchone()
            ),
            60,
        )
    assert proc.poll() is None, f"{service} {name} exited {proc.returncode}"
    return proc


def _status_and_kept(conn: psycopg.Connection[Any], job_id: str) -> tuple[str, dict[str, int]]:
    """The job's status and its checkpoint rows (part → attempt), read in one statement."""
    rows = conn.execute(
        """SELECT j.status, c.part, c.attempt FROM processing_jobs j
           LEFT JOIN job_checkpoints c ON c.job_id = j.job_id WHERE j.job_id = %s""",
        (job_id,),
    ).fetchall()
    return rows[0][0], {part: attempt for _, part, attempt in rows if part is not None}


def _kept(conn: psycopg.Connection[Any], job_id: str) -> dict[str, int]:
    rows = conn.execute("SELECT part, attempt FROM job_checkpoints WHERE job_id = %s", (job_id,)).fetchall()
    return {part: attempt for part, attempt in rows}


def _stored(platform: RunningPlatform, conn: psycopg.Connection[Any], job_id: str) -> dict[str, int]:
    """The parts whose bytes the store holds whole (part → attempt). A worker records a part
    before it uploads it: a worker killed in between leaves a row whose bytes never came, and
    the next attempt makes that part again."""
    rows = conn.execute(
        "SELECT part, attempt, key, size_bytes FROM job_checkpoints WHERE job_id = %s", (job_id,)
    ).fetchall()
    objects = Path(platform.info["objects_dir"])
    return {
        part: attempt
        for part, attempt, key, size in rows
        if (objects / key).is_file() and (objects / key).stat().st_size == size
    }


def _stopped_and_resumed(
    platform: RunningPlatform,
    client: httpx.Client,
    conn: psycopg.Connection[Any],
    obj: dict[str, Any],
    operation: dict[str, Any],
    service: str,
    parts: int,
    *,
    kill: bool = False,
    **worker_env: str,
) -> tuple[dict[str, int], dict[str, int], dict[str, Any]]:
    """Runs ``operation`` on ``obj`` on a first one-slot ``service`` worker, drains that worker
    once the job kept ``parts`` parts (the running job is handed back: it waits ``queued``), or
    with ``kill`` kills it (SIGKILL: the reaper declares it dead later), checks that the parts
    are the first attempt's, then follows the job on a second worker until it completed.
    Returns the parts the first attempt kept and every part seen (part → attempt), and the
    completed job."""
    first = _worker(platform, "first", service, **worker_env)
    second: subprocess.Popen[bytes] | None = None
    try:
        created = client.post(
            "/v1/hypermedia/process", json={"object_id": obj["object_id"], "operations": [operation]}
        )
        assert created.status_code == 202, created.text
        job_id = created.json()["job_ids"][0]
        if kill:
            wait_for(f"{parts} parts stored", lambda: len(_stored(platform, conn, job_id)) >= parts, 180)
            first.kill()
            first.wait(30)
            kept_first = _stored(platform, conn, job_id)  # what a part recorded at the kill lacks
        else:
            wait_for(f"{parts} parts kept", lambda: len(_kept(conn, job_id)) >= parts, 180)
            first.terminate()  # the drain: the running job is handed back 0.2 s later
            assert first.wait(60) == 0
            kept_first = _kept(conn, job_id)
        assert set(kept_first.values()) == {1}
        status = client.get(f"/v1/jobs/{job_id}").json()["status"]
        assert status in (("claimed", "processing") if kill else ("queued",)), status

        second = _worker(platform, "second", service, **worker_env)
        seen = dict(kept_first)
        deadline = time.monotonic() + 240
        while True:
            # The status and the rows in one snapshot: a part recorded just before the job
            # completed is seen (reading the rows, then the status, missed the last one when the
            # job completed in between; storage's sweep deletes the rows of ended jobs).
            status, kept = _status_and_kept(conn, job_id)
            seen |= kept
            if status == "completed":
                break
            assert status in ("queued", "claimed", "processing"), status
            assert time.monotonic() < deadline, "not completed within 240 s"
            time.sleep(0.01)
        job = client.get(f"/v1/jobs/{job_id}").json()
    finally:
        first.kill()
        if second is not None:
            second.terminate()
            second.wait(60)
    return kept_first, seen, job


def _uninterrupted(
    platform: RunningPlatform,
    client: httpx.Client,
    obj: dict[str, Any],
    operation: dict[str, Any],
    service: str,
) -> dict[str, Any]:
    """The same job run again, on a worker of its own that is never drained: completed."""
    worker = _worker(platform, "again", service)
    try:
        again = client.post(
            "/v1/hypermedia/process", json={"object_id": obj["object_id"], "operations": [operation]}
        )
        assert again.status_code == 202, again.text
        job = wait_job(client, again.json()["job_ids"][0], timeout=120)
    finally:
        worker.terminate()
        worker.wait(60)
    assert job["status"] == "completed", job
    return job


def _assert_swept(platform: RunningPlatform, conn: psycopg.Connection[Any], job_id: str) -> None:
    """Storage's sweep deleted the ended job's checkpoints, rows and bytes, within 30 s."""
    wait_for("checkpoints deleted", lambda: not _kept(conn, job_id), 30)
    objects = Path(platform.info["objects_dir"])
    assert not [p for p in objects.rglob("checkpoint-*") if job_id in p.name]


def _texts(client: httpx.Client, job: dict[str, Any]) -> dict[str, bytes]:
    """The bytes of each output of ``job``, by output type."""
    return {o["output_type"]: httpx.get(o["url"], timeout=30).content for o in job["outputs"]}


def test_an_ocr_drained_after_page_8_resumes_after_its_last_kept_page_on_another_worker(
    platform_without_workers: RunningPlatform,
) -> None:
    platform = platform_without_workers
    account = platform.admin("create-account", "--credits", "100")
    texts = [f"Page {n} {WORDS[n % len(WORDS)]} {WORDS[(3 * n) % len(WORDS)]}" for n in range(1, PAGES + 1)]
    with (
        platform.client(account) as client,
        psycopg.connect(platform.env["HM_DATABASE_URL"], autocommit=True) as conn,
    ):
        obj = client.post("/v1/objects", files={"file": ("pages.pdf", text_pages_pdf(texts))}).json()
        operation = {"name": "ocr", "params": {"outputs": ["text", "words", "hocr", "searchable_pdf"]}}
        kept_first, seen, job = _stopped_and_resumed(
            platform, client, conn, obj, operation, "ocrworker", DRAIN_AFTER
        )
        last_kept = len(kept_first)
        assert DRAIN_AFTER <= last_kept < PAGES - 1, kept_first
        assert sorted(kept_first) == [f"page-{n:05d}" for n in range(1, last_kept + 1)]

        # The second attempt kept only the pages it read: those after the last kept one (every
        # one but the last page of the job); the kept ones were taken, not read again.
        assert {part: attempt for part, attempt in seen.items() if attempt == 2} == {
            f"page-{n:05d}": 2 for n in range(last_kept + 1, PAGES)
        }
        [first_attempt, second_attempt] = job["attempts"]
        assert (first_attempt["status"], second_attempt["status"]) == ("lost", "completed")
        outputs = {o["output_type"]: o for o in job["outputs"]}
        assert outputs["text"]["metadata"]["resumed_pages"] == list(range(1, last_kept + 1))
        assert outputs["text"]["metadata"]["pages"] == list(range(1, PAGES + 1))
        resumed = _texts(client, job)
        pages = resumed["text"].decode().split("\f")
        assert len(pages) == PAGES and all(f"Page {n}" in page for n, page in enumerate(pages, 1)), pages

        # One uninterrupted run of the same job gives the same bytes: text, hOCR, words and the
        # searchable PDF.
        uninterrupted = _uninterrupted(platform, client, obj, operation, "ocrworker")
        assert uninterrupted["outputs"][0]["metadata"]["resumed_pages"] == []
        whole = _texts(client, uninterrupted)
        assert {k: hashlib.sha256(v).hexdigest() for k, v in resumed.items()} == {
            k: hashlib.sha256(v).hexdigest() for k, v in whole.items()
        }

        # Once the job ended, storage's sweep deleted its checkpoints: rows and bytes.
        _assert_swept(platform, conn, job["job_id"])


def _positions(part: str) -> range:
    """The job's page positions a preview part holds (``p004-006`` → 4, 5, 6)."""
    first, last = part.removeprefix("p").split("-")
    return range(int(first), int(last) + 1)


def test_a_preview_drained_after_two_kept_parts_resumes_after_them_on_another_worker(
    platform_without_workers: RunningPlatform,
) -> None:
    """20 A4 pages at 300 dpi as WebP take about 0.35 s a page here: a part every 3 pages or so."""
    platform = platform_without_workers
    account = platform.admin("create-account", "--credits", "100")
    document = text_pages_pdf(
        [f"Page {n} {WORDS[n % len(WORDS)]}" for n in range(1, PAGES + 1)], b"[0 0 595 842]"
    )
    operation = {"name": "pdf_preview", "params": {"pages": list(range(1, PAGES + 1)), "dpi": 300}}
    with (
        platform.client(account) as client,
        psycopg.connect(platform.env["HM_DATABASE_URL"], autocommit=True) as conn,
    ):
        obj = client.post("/v1/objects", files={"file": ("pages.pdf", document)}).json()
        kept_first, seen, job = _stopped_and_resumed(platform, client, conn, obj, operation, "docworker", 2)
        covered = sorted(p for part in kept_first for p in _positions(part))
        last_kept = covered[-1]
        assert covered == list(range(1, last_kept + 1)) and last_kept < PAGES - 1, kept_first

        # The second attempt rendered, and kept, only pages after the last kept one.
        later = [p for part, attempt in seen.items() if attempt == 2 for p in _positions(part)]
        assert later and min(later) == last_kept + 1 and max(later) < PAGES, seen
        [first_attempt, second_attempt] = job["attempts"]
        assert (first_attempt["status"], second_attempt["status"]) == ("lost", "completed")
        outputs = sorted(job["outputs"], key=lambda o: o["metadata"]["page"])
        assert [o["metadata"]["page"] for o in outputs] == list(range(1, PAGES + 1))
        assert [o["metadata"]["resumed"] for o in outputs] == [n <= last_kept for n in range(1, PAGES + 1)]
        resumed = {k: hashlib.sha256(v).hexdigest() for k, v in _texts(client, job).items()}

        # One uninterrupted run of the same job gives the same bytes, page by page.
        uninterrupted = _uninterrupted(platform, client, obj, operation, "docworker")
        assert not any(o["metadata"]["resumed"] for o in uninterrupted["outputs"])
        assert resumed == {k: hashlib.sha256(v).hexdigest() for k, v in _texts(client, uninterrupted).items()}
        assert len(resumed) == PAGES

        # Once the job ended, storage's sweep deleted its checkpoints: rows and bytes.
        _assert_swept(platform, conn, job["job_id"])


LADDER = ["360p", "288p", "240p", "144p"]
LADDER_HEIGHTS = [360, 288, 240, 144]


def _decoded(path: Path) -> tuple[int, int, int, float]:
    """Frames decoded, width, height and duration (s) of a downloaded rendition."""
    with av.open(str(path)) as container:
        frames = sum(1 for _ in container.decode(video=0))
        video = container.streams.video[0]
        duration = (container.duration or 0) / av.time_base
        return frames, video.codec_context.width, video.codec_context.height, round(duration, 1)


def _killed_transcode(
    platform: RunningPlatform, tmp_path: Path, source: Path, params: dict[str, Any], checkpoint_seconds: str
) -> tuple[dict[str, int], dict[str, int], dict[str, Any]]:
    """A ``transcode_video`` of the 20 s ``source`` into :data:`LADDER` with HLS on a worker
    killed (SIGKILL: no drain, no hand-back) once two parts are kept, then completed by the next
    worker once the reaper declared the first dead (:func:`_stopped_and_resumed`). Checks what
    both ways of keeping parts promise: two attempts, lost then completed; every rendition
    decodes to the source's 500 frames at its size and 20 s; the HLS master lists all four; the
    checkpoints are swept. Returns the parts the first attempt kept, every part seen (part →
    attempt) and the job."""
    account = platform.admin("create-account", "--credits", "100")
    operation = {"name": "transcode_video", "params": {"heights": LADDER_HEIGHTS, "hls": True, **params}}
    with (
        platform.client(account) as client,
        psycopg.connect(platform.env["HM_DATABASE_URL"], autocommit=True) as conn,
    ):
        obj = upload(client, source)
        kept_first, seen, job = _stopped_and_resumed(
            platform,
            client,
            conn,
            obj,
            operation,
            "mediaworker",
            2,
            kill=True,
            HM_MEDIA_CHECKPOINT_SECONDS=checkpoint_seconds,
        )
        [first_attempt, second_attempt] = job["attempts"]
        assert (first_attempt["status"], second_attempt["status"]) == ("lost", "completed")
        _assert_ladder(client, tmp_path, job)
        # Once the job ended, storage's sweep deleted its checkpoints: rows and bytes.
        _assert_swept(platform, conn, job["job_id"])
    return kept_first, seen, job


def _assert_ladder(client: httpx.Client, tmp_path: Path, job: dict[str, Any]) -> None:
    """Every rendition of ``job`` (a transcode of the 20 s test video into :data:`LADDER` with
    HLS) decodes to the source's 500 frames, 40 ms apart, at its size and 20 s, and the resolved
    HLS master lists all four."""
    videos = {o["output_type"]: o for o in job["outputs"] if o["output_type"].startswith("video_")}
    sizes = {"360p": (640, 360), "288p": (512, 288), "240p": (426, 240), "144p": (256, 144)}
    for name in LADDER:
        path = tmp_path / f"{name}.mp4"
        path.write_bytes(httpx.get(videos[f"video_{name}"]["url"], timeout=60).content)
        assert _decoded(path) == (500, *sizes[name], 20.0), name
        assert videos[f"video_{name}"]["metadata"]["frame_count"] == 500
        with av.open(str(path)) as container:
            times = [float(frame.time) for frame in container.decode(video=0)]
        assert all(abs(b - a - 0.04) < 1e-6 for a, b in itertools.pairwise(times)), name
    master = client.get(f"/v1/jobs/{job['job_id']}/outputs/hls_master/resolved")
    assert master.status_code == 200 and master.text.count("#EXT-X-STREAM-INF") == 4


def _resumed(job: dict[str, Any]) -> list[bool]:
    """Each rendition's ``resumed``, highest first."""
    videos = {o["output_type"]: o for o in job["outputs"]}
    return [videos[f"video_{name}"]["metadata"]["resumed"] for name in LADDER]


def test_a_transcode_killed_after_its_second_rendition_resumes_at_the_third(
    platform_without_workers: RunningPlatform, tmp_path: Path
) -> None:
    """A ladder of four renditions of 20 s of video, encoded one at a time (the worker's
    ``HM_MEDIA_CHECKPOINT_SECONDS`` is 1 here); the worker is killed once the first two are
    kept. The next worker's attempt takes the two kept renditions and encodes only the third and
    fourth, keeping the third. The video has one keyframe, so it cannot be cut into chunks (the
    next test)."""
    source = write_video(tmp_path / "ladder.mp4", seconds=20.0, width=640, height=360, gop=1000)
    kept_first, seen, job = _killed_transcode(platform_without_workers, tmp_path, source, {}, "1")
    assert kept_first == {"r-360p": 1, "r-288p": 1}, kept_first
    # The second attempt kept only the third rendition: the first two were taken, not encoded
    # again (their rows are still the first attempt's), the last one is never kept.
    assert seen == {"r-360p": 1, "r-288p": 1, "r-240p": 2}, seen
    assert _resumed(job) == [True, True, False, False]


def test_a_transcode_killed_after_its_second_chunk_resumes_at_the_third(
    platform_without_workers: RunningPlatform, tmp_path: Path
) -> None:
    """20 s of video with a keyframe every second, cut into five chunks of 4 s (the worker's
    ``HM_MEDIA_CHECKPOINT_SECONDS`` is 4 here; HLS segments of 2 s), each chunk of all four
    renditions from one decode (ADR 0080). The worker is killed once two chunks are kept; the
    next worker's attempt takes every kept chunk and encodes only the rest, keeping each but the
    last."""
    source = write_video(tmp_path / "chunks.mp4", seconds=20.0, width=640, height=360, gop=25)
    kept_first, seen, job = _killed_transcode(
        platform_without_workers, tmp_path, source, {"hls_segment_seconds": 2}, "4"
    )
    # The first attempt kept the first chunks in order (at least two; the kill may come after a
    # third); the second took them, not encoding them again (their rows are still the first
    # attempt's), and kept the others but the last.
    chunks = [f"c-{n:04d}" for n in range(4)]
    assert 2 <= len(kept_first) <= 4 and set(kept_first) == set(chunks[: len(kept_first)]), kept_first
    assert seen == kept_first | {part: 2 for part in chunks[len(kept_first) :]}, seen
    assert _resumed(job) == [True] * 4


# -- fan-out (issue 23 item 2, ADR 0081) -----------------------------------------------------------

FAN_OUT_ENV = {"HM_MEDIA_FAN_OUT_SECONDS": "10", "HM_MEDIA_FAN_OUT_CHUNK_SECONDS": "4"}
"""20 s of video fans out into five chunks of 4 s: four children and the parent's own last."""


@pytest.fixture(scope="module")
def fan_out_workers(platform_without_workers: RunningPlatform) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Two one-slot mediaworkers that fan out videos of at least 10 s (:data:`FAN_OUT_ENV`)."""
    workers = [_worker(platform_without_workers, f"fan-{n}", "mediaworker", **FAN_OUT_ENV) for n in (1, 2)]
    try:
        yield workers
    finally:
        for worker in workers:
            worker.terminate()
        for worker in workers:
            worker.wait(60)


def _children(conn: psycopg.Connection[Any], job_id: str) -> list[tuple[str, int, str, int]]:
    """The children of ``job_id``: (job id, chunk, status, estimated credits), by chunk."""
    rows = conn.execute(
        "SELECT job_id::text, chunk_index, status, estimated_credits FROM processing_jobs "
        "WHERE parent_job_id = %s ORDER BY chunk_index",
        (job_id,),
    ).fetchall()
    return [(r[0], r[1], r[2], r[3]) for r in rows]


def _completed_with_makers(
    client: httpx.Client, conn: psycopg.Connection[Any], job_id: str
) -> tuple[dict[str, Any], dict[str, str | None]]:
    """``job_id`` once completed (within 240 s), and who made each of its checkpoint parts
    (part → the child job's id, None for the job itself), read while it ran: storage's sweep
    deletes the rows once it ended."""
    made_by: dict[str, str | None] = {}
    deadline = time.monotonic() + 240
    while (status := client.get(f"/v1/jobs/{job_id}").json()["status"]) != "completed":
        assert status in ("queued", "claimed", "processing"), status
        assert time.monotonic() < deadline, "not completed within 240 s"
        made_by |= dict(
            conn.execute(
                "SELECT part, made_by_job::text FROM job_checkpoints WHERE job_id = %s", (job_id,)
            ).fetchall()
        )
        time.sleep(0.05)
    return client.get(f"/v1/jobs/{job_id}").json(), made_by


def _assert_children_unlisted_and_unbilled(
    client: httpx.Client, conn: psycopg.Connection[Any], job: dict[str, Any], kids: list[str]
) -> None:
    """The children of the completed ``job`` are no one's to list, hold nothing and are charged
    nothing; the job's hold is committed once, at its charge."""
    job_id = job["job_id"]
    assert [j["job_id"] for j in client.get("/v1/jobs").json()["jobs"]] == [job_id]
    wait_for(
        "the job's hold committed",
        lambda: (
            conn.execute("SELECT status FROM credit_holds WHERE job_id = %s", (job_id,)).fetchone()
            == ("committed",)
        ),
        30,
    )
    holds = conn.execute(
        "SELECT job_id::text, charged FROM credit_holds WHERE job_id = ANY(%s::uuid[])", ([job_id, *kids],)
    ).fetchall()
    assert holds == [(job_id, round(job["actual_credits"] * 1000))]
    assert conn.execute(
        "SELECT count(*) FROM credit_ledger WHERE job_id = ANY(%s::uuid[])", (kids,)
    ).fetchone() == (0,)


def _fan_out_job(client: httpx.Client, tmp_path: Path, params: dict[str, Any]) -> str:
    """The id of a ``transcode_video`` into :data:`LADDER` with ``params`` of 20 s of 640 × 360
    video with a keyframe every second, uploaded by ``client``'s account."""
    source = write_video(tmp_path / "fan.mp4", seconds=20.0, width=640, height=360, gop=25)
    obj = upload(client, source)
    operation = {"name": "transcode_video", "params": {"heights": LADDER_HEIGHTS, **params}}
    created = client.post(
        "/v1/hypermedia/process", json={"object_id": obj["object_id"], "operations": [operation]}
    )
    assert created.status_code == 202, created.text
    return str(created.json()["job_ids"][0])


def test_a_long_transcode_fans_out_to_children_on_both_workers_and_joins_their_chunks(
    platform_without_workers: RunningPlatform, fan_out_workers: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    """20 s of video, a keyframe every second: the job fans out into four children (chunks of
    4 s), which both one-slot workers run while the parent is parked without its slot; the
    parent then takes their kept chunks, encodes the last and joins. Every rendition has every
    frame at continuous timestamps and the source's duration, the HLS master plays all four, the
    children hold and are charged nothing, and the job is charged once."""
    platform = platform_without_workers
    with (
        platform.client(platform.admin("create-account", "--credits", "100")) as client,
        psycopg.connect(platform.env["HM_DATABASE_URL"], autocommit=True) as conn,
    ):
        job_id = _fan_out_job(client, tmp_path, {"hls": True, "hls_segment_seconds": 2})
        job, made_by = _completed_with_makers(client, conn, job_id)

        kids = _children(conn, job_id)
        assert [(chunk, status, credits) for _, chunk, status, credits in kids] == [
            (n, "completed", 0) for n in range(4)
        ]
        # Each chunk part was made by its own child, never by the parent (seen before the sweep).
        assert made_by == {f"c-{n:04d}": kids[n][0] for n in range(4)}, made_by
        workers = {
            row[0]
            for row in conn.execute(
                "SELECT DISTINCT worker_id FROM job_attempts WHERE job_id = ANY(%s::uuid[])",
                ([k[0] for k in kids],),
            ).fetchall()
        }
        assert len(workers) == 2, workers
        # The parent's one attempt, parked while its children ran, its progress theirs summed.
        assert [a["status"] for a in job["attempts"]] == ["completed"]
        stages = conn.execute(
            "SELECT progress FROM job_events WHERE job_id = %s AND kind = 'progress' "
            "AND detail->>'stage' = 'children' ORDER BY event_id",
            (job_id,),
        ).fetchall()
        fractions = [row[0] for row in stages]
        assert fractions == sorted(fractions) and len(fractions) >= 2 and fractions[-1] == 0.25 + 0.5 * 4 / 5
        _assert_ladder(client, tmp_path, job)
        assert _resumed(job) == [True] * 4  # every rendition took the children's chunks
        _assert_children_unlisted_and_unbilled(client, conn, job, [k[0] for k in kids])
        _assert_swept(platform, conn, job_id)


def test_cancelling_a_fanned_out_job_stops_every_child(
    platform_without_workers: RunningPlatform, fan_out_workers: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    """The job is cancelled as soon as its children exist: the children still queued end
    ``cancelled`` without running, a running one is stopped and ends ``cancelled``, the parent
    ends ``cancelled`` and its hold is released whole."""
    platform = platform_without_workers
    with (
        platform.client(platform.admin("create-account", "--credits", "100")) as client,
        psycopg.connect(platform.env["HM_DATABASE_URL"], autocommit=True) as conn,
    ):
        job_id = _fan_out_job(client, tmp_path, {})
        wait_for("children created", lambda: len(_children(conn, job_id)) == 4, 120)

        cancelled = client.post(f"/v1/jobs/{job_id}:cancel")
        assert cancelled.status_code == 200, cancelled.text
        at_cancel = {kid: status for kid, _, status, _ in _children(conn, job_id)}

        job = wait_job(client, job_id, timeout=60)
        assert job["status"] == "cancelled", job
        wait_for(
            "every child ended",
            lambda: all(status in ("completed", "cancelled") for _, _, status, _ in _children(conn, job_id)),
            60,
        )
        ended = {kid: status for kid, _, status, _ in _children(conn, job_id)}
        # Only a child that had completed before the cancel stays completed.
        assert all(ended[kid] == "cancelled" for kid, status in at_cancel.items() if status != "completed"), (
            at_cancel,
            ended,
        )
        assert list(ended.values()).count("cancelled") >= 3, ended
        wait_for(
            "hold released",
            lambda: (
                conn.execute("SELECT status FROM credit_holds WHERE job_id = %s", (job_id,)).fetchone()
                == ("released",)
            ),
            30,
        )


OCR_FAN_OUT_PAGES = 25
"""Over the ocrworker's default ``HM_OCR_FAN_OUT_PAGES`` (20): three groups, of 9, 9 and 7 pages."""


def test_a_long_ocr_fans_out_to_children_on_both_workers_and_assembles_their_pages(
    platform_without_workers: RunningPlatform,
) -> None:
    """25 pages on two one-slot ocrworkers with the default fan-out (ADR 0082): two children read
    pages 1–9 and 10–18, on both workers, each page kept as the job's part made by its child;
    the job reads 19–25 and writes every page, in order, in each output; the children hold and
    are charged nothing, the job once, for its 25 pages."""
    platform = platform_without_workers
    texts = [
        f"Page {n} {WORDS[n % len(WORDS)]} {WORDS[(3 * n) % len(WORDS)]}"
        for n in range(1, OCR_FAN_OUT_PAGES + 1)
    ]
    workers = [_worker(platform, f"ocr-fan-{n}") for n in (1, 2)]
    try:
        with (
            platform.client(platform.admin("create-account", "--credits", "100")) as client,
            psycopg.connect(platform.env["HM_DATABASE_URL"], autocommit=True) as conn,
        ):
            obj = client.post("/v1/objects", files={"file": ("long.pdf", text_pages_pdf(texts))}).json()
            created = client.post(
                "/v1/hypermedia/process",
                json={
                    "object_id": obj["object_id"],
                    "operations": [{"name": "ocr", "params": {"outputs": ["text", "searchable_pdf"]}}],
                },
            )
            assert created.status_code == 202, created.text
            job_id = created.json()["job_ids"][0]
            job, made_by = _completed_with_makers(client, conn, job_id)

            kids = _children(conn, job_id)
            assert [(chunk, status, credits) for _, chunk, status, credits in kids] == [
                (0, "completed", 0),
                (1, "completed", 0),
            ]
            # Pages 1–18 kept by their children; 19–24 by the job itself, as any attempt keeps
            # every page it reads but the last (ADR 0069).
            assert made_by == {f"page-{n:05d}": kids[(n - 1) // 9][0] for n in range(1, 19)} | {
                f"page-{n:05d}": None for n in range(19, OCR_FAN_OUT_PAGES)
            }, made_by
            ran_on = conn.execute(
                "SELECT DISTINCT worker_id FROM job_attempts WHERE job_id = ANY(%s::uuid[])",
                ([k[0] for k in kids],),
            ).fetchall()
            assert len(ran_on) == 2, ran_on
            assert [a["status"] for a in job["attempts"]] == ["completed"]
            outputs = {o["output_type"]: o for o in job["outputs"]}
            meta = outputs["text"]["metadata"]
            assert meta["pages"] == list(range(1, OCR_FAN_OUT_PAGES + 1)) and meta["resumed_pages"] == list(
                range(1, 19)
            )
            pages = _texts(client, job)["text"].decode().split("\f")
            assert [page.split()[:2] for page in pages] == [
                ["Page", str(n)] for n in range(1, OCR_FAN_OUT_PAGES + 1)
            ], pages
            searchable = pdfium.PdfDocument(_texts(client, job)["searchable_pdf"])
            try:
                assert len(searchable) == OCR_FAN_OUT_PAGES
            finally:
                searchable.close()

            _assert_children_unlisted_and_unbilled(client, conn, job, [k[0] for k in kids])
            # Charged for its 25 pages (ADR 0068), within its hold.
            priced = conn.execute(
                "SELECT p.base_cost, p.per_unit, j.estimated_credits FROM processing_jobs j JOIN "
                "processing_profiles p ON (p.operation, p.version) = (j.operation, j.profile_version) "
                "WHERE j.job_id = %s",
                (job_id,),
            ).fetchone()
            assert priced is not None
            base, per_unit, price = priced
            work = min(per_unit * OCR_FAN_OUT_PAGES, price - min(base, price))
            assert work > 0 and job["actual_credits"] == round((min(base, price) + work) / 1000, 3), job
            _assert_swept(platform, conn, job_id)
    finally:
        for worker in workers:
            worker.terminate()
        for worker in workers:
            worker.wait(60)


def test_a_child_out_of_memory_fails_its_long_ocr_at_once_and_the_job_is_charged_its_run(
    platform_without_workers: RunningPlatform,
) -> None:
    """A 25-page OCR whose pages need more memory than the operation's profile allows (lowered to
    160 MB here, which the first run, reading only the page sizes, stays under): the first child's
    ``RESOURCE_LIMIT`` fails the job at once with that code, naming the part, instead of the job
    reading every page again itself; the other child is stopped or fails alike; the job is
    charged as one failed because of its input, its children's runs included (ADR 0081), and its
    hold committed at that."""
    platform = platform_without_workers
    texts = [f"Page {n} {WORDS[n % len(WORDS)]}" for n in range(1, OCR_FAN_OUT_PAGES + 1)]
    with psycopg.connect(platform.env["HM_DATABASE_URL"], autocommit=True) as conn:
        [(memory,)] = conn.execute(
            "SELECT DISTINCT memory_limit_mb FROM processing_profiles WHERE operation = 'ocr'"
        ).fetchall()
        conn.execute("UPDATE processing_profiles SET memory_limit_mb = 160 WHERE operation = 'ocr'")
        worker = _worker(platform, "ocr-small")
        try:
            with platform.client(platform.admin("create-account", "--credits", "100")) as client:
                obj = client.post(
                    "/v1/objects",
                    files={"file": ("letter.pdf", text_pages_pdf(texts, media=b"[0 0 612 792]"))},
                ).json()
                created = client.post(
                    "/v1/hypermedia/process", json={"object_id": obj["object_id"], "operations": ["ocr"]}
                )
                assert created.status_code == 202, created.text
                job_id = created.json()["job_ids"][0]
                job = wait_job(client, job_id, timeout=120)

                assert (job["status"], job["error_code"]) == ("failed", "RESOURCE_LIMIT"), job
                assert job["error_message"] == (
                    "part 1, done by a child job, failed: The job exceeded its memory limit."
                ), job
                assert [a["status"] for a in job["attempts"]] == ["failed"]

                def ended() -> list[tuple[str, int, str, int]] | None:
                    kids = _children(conn, job_id)
                    return (
                        kids if all(status in ("failed", "cancelled") for _, _, status, _ in kids) else None
                    )

                kids = wait_for("both children ended", ended, 60)
                assert kids[0][1:3] == (0, "failed") and kids[1][1:3] in ((1, "failed"), (1, "cancelled")), (
                    kids
                )
                run_ms, price, base = conn.execute(
                    # The attempts failed by the input: the job's and its children's; not a
                    # stopped child's.
                    """SELECT (SELECT sum(a.duration_ms) FROM job_attempts a JOIN processing_jobs c USING (job_id)
                               WHERE (c.job_id = j.job_id OR c.parent_job_id = j.job_id)
                                 AND a.status = 'failed' AND a.error_code = 'RESOURCE_LIMIT'),
                              j.estimated_credits, p.base_cost
                       FROM processing_jobs j JOIN processing_profiles p
                         ON (p.operation, p.version) = (j.operation, j.profile_version)
                       WHERE j.job_id = %s""",
                    (job_id,),
                ).fetchone()
                charged = charges.for_failure(price=price, base_cost=base, run_ms=int(run_ms))
                assert round(charged.actual / 1000, 3) == job["actual_credits"], (charged, job)
                assert charged.lines.get("run_seconds", 0) > 0, charged
                wait_for(
                    "the job's hold committed",
                    lambda: (
                        conn.execute(
                            "SELECT status, charged FROM credit_holds WHERE job_id = %s", (job_id,)
                        ).fetchone()
                        == ("committed", charged.actual)
                    ),
                    30,
                )
        finally:
            conn.execute(
                "UPDATE processing_profiles SET memory_limit_mb = %s WHERE operation = 'ocr'", (memory,)
            )
            worker.terminate()
            worker.wait(60)
