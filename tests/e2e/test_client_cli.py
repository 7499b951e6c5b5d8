"""The client commands (issue 22 item 5) as a user runs them, against the real platform: ``hypermedia
submit`` uploads, runs, waits for and downloads a photo's outputs; ``jobs`` and ``objects`` read,
list and delete; each failure has its exit code and a one-line error, never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from hypermedia.devtools.embedded import free_port
from tests.e2e.conftest import REPO, RunningPlatform
from tests.helpers.media import write_video

EXIF = Path(__file__).resolve().parents[1] / "data" / "exif-orientation"


def _run(env: dict[str, str], *args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    base = {"PATH": "/usr/bin:/bin", "HOME": str(cwd), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "hypermedia.devtools.cli", *args],
        env={**base, **env},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def user(platform: RunningPlatform, account: dict[str, Any]) -> dict[str, str]:
    return {"HM_API_URL": platform.rest_url, "HM_API_KEY": account["api_key"]}


def test_a_downloaded_hls_set_plays_from_its_folder(user: dict[str, str], tmp_path: Path) -> None:
    """The playlists name their sibling outputs by output type; saved, they name the files saved
    beside them, so that FFmpeg plays the folder's master (a fresh user's trial found them
    pointing at ``hls_240p``, which no file is called)."""
    clip = write_video(tmp_path / "clip.mp4", seconds=2.0, width=320, height=240)
    out = tmp_path / "out"
    op = "transcode_video:heights=[240],hls=true,hls_segment_seconds=2"
    done = _run(user, "submit", str(clip), "--op", op, "--download", str(out), "--json")
    assert done.returncode == 0, done.stderr
    master = out / "clip.hls_master.m3u8"
    assert "clip.hls_240p.m3u8" in master.read_text()
    assert 'URI="clip.hls_240p_media.mp4"' in (out / "clip.hls_240p.m3u8").read_text()
    count = ["-count_frames", "-show_entries", "stream=width,nb_read_frames", "-of", "json"]
    probe = subprocess.run(
        ["ffprobe", "-v", "error", "-protocol_whitelist", "file", *count, str(master)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert probe.returncode == 0, probe.stderr
    [stream] = [s for s in json.loads(probe.stdout)["streams"] if "width" in s]
    assert (stream["width"], stream["nb_read_frames"]) == (320, "50")


def test_submit_watches_and_downloads_then_jobs_and_objects_read_and_delete(
    user: dict[str, str], tmp_path: Path
) -> None:
    out = tmp_path / "out"
    done = _run(
        user,
        "submit",
        str(EXIF / "Landscape_3.jpg"),
        "--op",
        "thumbnail:size=128",
        "--op",
        "convert:format=png",
        "--download",
        str(out),
        "--json",
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert [j["status"] for j in result["jobs"]] == ["completed", "completed"]
    saved = sorted(Path(p).name for p in result["downloaded"])
    assert saved == ["Landscape_3.converted.png", "Landscape_3.thumbnail.webp"]
    with Image.open(out / "Landscape_3.thumbnail.webp") as thumb:
        assert (thumb.format, thumb.size) == ("WEBP", (128, 85))
    with Image.open(out / "Landscape_3.converted.png") as png:
        assert (png.format, png.size) == ("PNG", (1800, 1200))

    object_id = result["object"]["object_id"]
    listed = _run(user, "jobs", "ls", "--object", object_id, "--json")
    assert listed.returncode == 0, listed.stderr
    assert {j["job_id"] for j in json.loads(listed.stdout)["jobs"]} == set(result["job_ids"])
    table = _run(user, "jobs", "get", result["job_ids"][0])
    assert table.returncode == 0 and "completed" in table.stdout and "thumbnail" in table.stdout
    none = _run(user, "jobs", "ls", "--object", "00000000-0000-4000-8000-000000000000")
    assert (none.returncode, none.stdout.strip()) == (0, "no jobs"), (
        "an empty page says so, not a bare header"
    )

    # The balance and the ledger that explains it, as GET /v1/credits and /v1/account/ledger say.
    shown = _run(user, "credits", "--ledger", "1000", "--json")
    assert shown.returncode == 0, shown.stderr
    credits = json.loads(shown.stdout)
    assert set(credits["credits"]) == {"balance", "held", "available"}
    charged = {e["job_id"] for e in credits["ledger"]["entries"] if e["kind"] == "commit"}
    assert set(result["job_ids"]) <= charged
    table = _run(user, "credits")
    assert table.returncode == 0 and "available" in table.stdout
    assert str(credits["credits"]["available"]) in table.stdout

    originals = json.loads(_run(user, "objects", "ls", "--kind", "original", "--json").stdout)["objects"]
    assert object_id in [o["object_id"] for o in originals]
    outputs = json.loads(_run(user, "objects", "ls", "--kind", "output", "--limit", "1000", "--json").stdout)
    assert sorted(o["mime_type"] for o in outputs["objects"] if o["source_object_id"] == object_id) == [
        "image/png",
        "image/webp",
    ]
    shown = _run(user, "objects", "ls", "--limit", "1")
    assert shown.returncode == 0 and "more: --cursor " in shown.stdout, shown.stdout
    wrong = _run(user, "objects", "ls", "--kind", "video")
    assert wrong.returncode == 3 and "INVALID_KIND" in wrong.stderr

    assert _run(user, "objects", "rm", object_id).returncode == 0
    gone = _run(user, "objects", "get", object_id)
    assert gone.returncode == 3
    assert "404 NOT_FOUND" in gone.stderr and "Traceback" not in gone.stderr


def test_submit_with_a_delay_makes_scheduled_jobs_and_cancel_stops_them(user: dict[str, str]) -> None:
    submitted = _run(
        user, "submit", str(EXIF / "Landscape_4.jpg"), "--op", "thumbnail", "--delay", "3600", "--json"
    )
    assert submitted.returncode == 0, submitted.stderr
    created = json.loads(submitted.stdout)
    assert created["not_before"] is not None
    [job_id] = created["job_ids"]
    shown = json.loads(_run(user, "jobs", "get", job_id, "--json").stdout)
    assert (shown["status"], shown["not_before"]) == ("scheduled", created["not_before"])
    cancelled = _run(user, "jobs", "cancel", job_id, "--json")
    assert cancelled.returncode == 0, cancelled.stderr
    assert json.loads(cancelled.stdout)["status"] == "cancelled"

    plain = _run(user, "submit", str(EXIF / "Landscape_4.jpg"), "--op", "thumbnail", "--delay", "3600")
    assert plain.returncode == 0 and "; scheduled for 20" in plain.stdout, plain.stdout
    job = plain.stdout.split("jobs ", 1)[1].split(";")[0].strip()
    waiting = _run(user, "jobs", "get", job)
    assert waiting.returncode == 0 and f"{shown['estimated_credits']} held" in waiting.stdout, waiting.stdout
    assert "scheduled for 20" in waiting.stdout, "when it will be queued"
    stopped = _run(user, "jobs", "cancel", job)
    assert stopped.returncode == 0
    [row] = [line for line in stopped.stdout.splitlines() if job in line]
    assert "cancelled" in row and " 0 " in row and "held" not in row, "released: nothing charged"

    # Flag mistakes are usage errors (2), found before anything is uploaded; the horizon is the
    # gateway's to refuse (3).
    for flags, said in (
        (("--at", "tomorrow"), "--at 'tomorrow': must be an RFC 3339 time with an offset"),
        (("--at", "2026-12-24T18:00:00"), "must be an RFC 3339 time with an offset"),
        (("--at", "2026-12-24T18:00:00Z", "--delay", "5"), "give --at or --delay, not both"),
        (("--delay", "-1"), "--delay -1.0: must be a finite number of seconds"),
        (("--delay", "inf"), "--delay inf: must be a finite number of seconds"),
    ):
        refused = _run(user, "submit", str(EXIF / "Landscape_4.jpg"), "--op", "thumbnail", *flags)
        assert refused.returncode == 2 and said in refused.stderr, (flags, refused.stderr)
        assert "Traceback" not in refused.stderr
    far = _run(user, "submit", str(EXIF / "Landscape_4.jpg"), "--op", "thumbnail", "--delay", "99999999")
    assert far.returncode == 3 and "INVALID_SCHEDULE" in far.stderr, far.stderr


def test_schedules_are_added_run_listed_paused_and_removed(user: dict[str, str]) -> None:
    uploaded = _run(
        user, "submit", str(EXIF / "Landscape_6.jpg"), "--op", "thumbnail:size=64", "--watch", "--json"
    )
    assert uploaded.returncode == 0, uploaded.stderr
    object_id = json.loads(uploaded.stdout)["object"]["object_id"]
    added = _run(
        user,
        "schedules",
        "add",
        "nightly",
        "--cron",
        "30 2 * * *",
        "--time-zone",
        "Europe/Berlin",
        "--object",
        object_id,
        "--op",
        "thumbnail:size=64",
        "--json",
    )
    assert added.returncode == 0, added.stderr
    assert json.loads(added.stdout)["process"]["object_ids"] == [object_id]

    triggered = _run(user, "schedules", "trigger", "nightly")
    assert triggered.returncode == 0 and "pending" in triggered.stdout, triggered.stderr
    for _ in range(60):
        runs = json.loads(_run(user, "schedules", "runs", "nightly", "--json").stdout)["runs"]
        if runs and runs[0]["state"] == "succeeded":
            break
        time.sleep(0.5)
    assert runs[0]["state"] == "succeeded" and len(runs[0]["outcome"]["job_ids"]) == 1
    table = _run(user, "schedules", "ls")
    assert "nightly" in table.stdout and "Europe/Berlin" in table.stdout and "succeeded" in table.stdout
    assert "paused" in _run(user, "schedules", "pause", "nightly").stdout

    bad = _run(
        user, "schedules", "add", "x", "--cron", "every day", "--object", object_id, "--op", "thumbnail"
    )
    assert bad.returncode == 3 and "INVALID_CRON" in bad.stderr and "Traceback" not in bad.stderr
    assert _run(user, "schedules", "rm", "nightly").returncode == 0
    gone = _run(user, "schedules", "runs", "nightly")
    assert gone.returncode == 3 and "SCHEDULE_NOT_FOUND" in gone.stderr


def test_a_failed_job_is_exit_1_and_says_why(user: dict[str, str], tmp_path: Path) -> None:
    cut = tmp_path / "cut.jpg"
    cut.write_bytes((EXIF / "Landscape_1.jpg").read_bytes()[:20000])
    done = _run(user, "submit", str(cut), "--op", "thumbnail", "--watch")
    assert done.returncode == 1, done.stderr
    assert "failed" in done.stdout and "CORRUPT_INPUT" in done.stdout


def test_the_key_may_come_from_the_config_file(user: dict[str, str], tmp_path: Path) -> None:
    config = tmp_path / "client.toml"
    config.write_text(f'url = "{user["HM_API_URL"]}"\napi_key = "{user["HM_API_KEY"]}"\n')
    done = _run({"HM_CLIENT_CONFIG": str(config)}, "operations", "--json")
    assert done.returncode == 0, done.stderr
    assert "thumbnail" in {o["name"] for o in json.loads(done.stdout)["operations"]}


@pytest.mark.parametrize(
    ("env", "args", "code", "said"),
    [
        ({}, ("jobs", "ls"), 2, "no API key: set HM_API_KEY"),
        ({"HM_API_KEY": "hm_wrong"}, ("jobs", "ls"), 3, "401 UNAUTHENTICATED"),
        ({"HM_API_KEY": "k", "HM_API_URL": "http://127.0.0.1:{port}"}, ("jobs", "ls"), 4, "UNREACHABLE"),
        (
            {"HM_API_KEY": "k"},
            ("submit", str(EXIF / "Landscape_1.jpg"), "--op", "resize:width"),
            2,
            "key=value",
        ),
    ],
)
def test_each_failure_has_its_exit_code_and_one_line(
    platform: RunningPlatform,
    tmp_path: Path,
    env: dict[str, str],
    args: tuple[str, ...],
    code: int,
    said: str,
) -> None:
    env = {"HM_API_URL": platform.rest_url, **{k: v.format(port=free_port()) for k, v in env.items()}}
    done = _run({**env, "XDG_CONFIG_HOME": str(tmp_path)}, *args)
    assert done.returncode == code, (done.stdout, done.stderr)
    assert said in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize(
    "args", [("jobs", "watch", "JOB_ID"), ("jobs", "get", "00000000-0000-4000-8000-000000000000")]
)
def test_an_unknown_job_is_exit_3_not_a_traceback(user: dict[str, str], args: tuple[str, ...]) -> None:
    """Found running the README: an API error raised inside the event stream's ``with`` crashed
    with a traceback (the error was a frozen dataclass, whose ``__traceback__`` cannot be set)."""
    done = _run(user, *args)
    assert done.returncode == 3, done.stderr
    assert "404 NOT_FOUND" in done.stderr and "Traceback" not in done.stderr


def test_what_a_hostile_review_found(user: dict[str, str], tmp_path: Path) -> None:
    """Each of these printed a traceback, lost a file or left an upload behind before."""
    photo = str(EXIF / "Landscape_1.jpg")
    markup = _run(user, "submit", photo, "--op", "[/red]")  # rich markup in a value: shown as it is
    assert markup.returncode == 3 and "unknown operation '[/red]'" in markup.stderr, markup.stderr
    assert "Traceback" not in markup.stderr and markup.stderr.count("\n") == 1  # one line

    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    blocked = _run(user, "submit", photo, "--op", "thumbnail", "--download", str(a_file))
    assert blocked.returncode == 2 and "--download" in blocked.stderr and "Traceback" not in blocked.stderr

    for url in ("http://[::1", "ftp://example.org", "notaurl"):
        bad = _run({**user, "HM_API_URL": url}, "jobs", "ls")
        assert bad.returncode == 2 and "HM_API_URL" in bad.stderr, (url, bad.stderr)
    assert _run({**user, "HM_API_KEY": "hm_a\nb"}, "jobs", "ls").returncode == 2
    assert _run(user, "jobs", "get", "../operations").returncode == 3

    two = _run(
        user,
        "submit",
        photo,
        "--op",
        "thumbnail:size=64",
        "--op",
        "thumbnail:size=300",
        "--download",
        str(tmp_path / "two"),
        "--json",
    )
    assert two.returncode == 0, two.stderr
    saved = json.loads(two.stdout)["downloaded"]
    assert len(set(saved)) == 2 and all(p.endswith(".webp") for p in saved)
    sizes = sorted(Image.open(p).size[0] for p in saved)
    assert sizes == [64, 300]
