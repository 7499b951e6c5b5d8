"""The web dashboard (issue 22 item 6) clicked through in a real headless browser (Debian's
chromium through Selenium and chromedriver, which make test installs): sign in with an API key,
the credits and the waiting jobs, the jobs list and a job's page with its attempt and its
thumbnail shown, cancel a waiting job and run it again, sign out. A job of the ``bulk.documents``
lane, which the session's platform does not run, stays queued for as long as the test needs."""

from __future__ import annotations

import datetime
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from tests.e2e.browser import follow, open_browser, sign_in, table
from tests.e2e.conftest import RunningPlatform, upload, wait_for, wait_job
from tests.helpers.media import write_video

PHOTO = Path(__file__).resolve().parents[1] / "data" / "exif-orientation" / "Landscape_3.jpg"
PDF = Path(__file__).resolve().parents[3] / "shared" / "corpus" / "pdf" / "google-doc-document.pdf"


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    with open_browser() as session:
        yield session


def _ms_between(start: str, end: str) -> int:
    return round(
        (datetime.datetime.fromisoformat(end) - datetime.datetime.fromisoformat(start)).total_seconds() * 1000
    )


def _text(browser: WebDriver, css: str) -> str:
    return str(browser.find_element(By.CSS_SELECTOR, css).text)


def test_sign_in_look_at_a_job_cancel_and_run_again_sign_out(
    platform: RunningPlatform, browser: WebDriver
) -> None:
    account: dict[str, Any] = platform.admin("create-account", "--credits", "50")
    base = platform.rest_url
    with platform.client(account) as client:
        photo = upload(client, PHOTO)
        done = client.post(
            "/v1/hypermedia/process", json={"object_id": photo["object_id"], "operations": ["thumbnail"]}
        )
        thumbnail = wait_job(client, done.json()["job_ids"][0])
        pdf = upload(client, PDF)
        waiting = client.post(
            "/v1/hypermedia/process",
            json={"object_id": pdf["object_id"], "operations": ["pdf_info"], "queue": "bulk"},
        ).json()["job_ids"][0]

    browser.get(f"{base}/dashboard")
    assert browser.current_url.endswith("/dashboard/login")
    browser.find_element(By.NAME, "api_key").send_keys("hm_000000000000_wrong")
    follow(browser, browser.find_element(By.CSS_SELECTOR, "form button"))
    assert "not known" in _text(browser, "[role=alert]")

    browser.find_element(By.NAME, "api_key").send_keys(account["api_key"])
    follow(browser, browser.find_element(By.CSS_SELECTOR, "form button"))
    assert browser.current_url.endswith("/dashboard")
    credits = [c.text for c in browser.find_elements(By.CSS_SELECTOR, "#credits td")]
    assert float(credits[0]) == pytest.approx(50 - thumbnail["actual_credits"])
    assert float(credits[1]) > 0  # the waiting job's hold
    queues = [
        [c.text for c in row.find_elements(By.TAG_NAME, "td")]
        for row in browser.find_elements(By.CSS_SELECTOR, "#queues tr")[1:]
    ]
    assert [q[:3] for q in queues] == [["bulk.documents", "8", "1"]]
    # The last hour's charts: this account's one completed job, in the minute it ended, with its latency.
    ended = [
        (g.get_attribute("data-minute"), g.get_attribute("data-completed"), g.get_attribute("data-failed"))
        for g in browser.find_elements(By.CSS_SELECTOR, "#throughput g[data-minute]")
    ]
    assert len(ended) == 60 and [e for e in ended if e[1:] != ("0", "0")] == [
        (thumbnail["completed_at"][11:16], "1", "0")
    ]
    [latency] = browser.find_elements(By.CSS_SELECTOR, "#latency g[data-minute]")
    took = _ms_between(thumbnail["queued_at"], thumbnail["completed_at"])
    assert latency.get_attribute("data-minute") == thumbnail["completed_at"][11:16]
    assert abs(int(latency.get_attribute("data-p50-ms") or -1) - took) <= 1

    follow(browser, browser.find_element(By.LINK_TEXT, "Jobs"))
    rows = browser.find_elements(By.CSS_SELECTOR, "#jobs tr")[1:]
    assert {r.find_element(By.TAG_NAME, "code").text for r in rows} == {thumbnail["job_id"], waiting}
    follow(browser, browser.find_element(By.LINK_TEXT, thumbnail["job_id"]))
    assert _text(browser, "#status") == "completed"
    [attempt] = browser.find_elements(By.CSS_SELECTOR, "#attempts tr")[1:]
    cells = [c.text for c in attempt.find_elements(By.TAG_NAME, "td")]
    assert cells[1] == thumbnail["attempts"][0]["worker_id"] and cells[2] == "completed"
    assert re.fullmatch(r"\d+ ms", cells[3]) and re.fullmatch(r"\d+ MiB", cells[4])
    preview = browser.find_element(By.CSS_SELECTOR, "figure[data-output=thumbnail] img")
    assert browser.execute_script("return arguments[0].complete && arguments[0].naturalWidth", preview) == 256
    events = [
        [c.text for c in row.find_elements(By.TAG_NAME, "td")]
        for row in browser.find_elements(By.CSS_SELECTOR, "#events tr")[1:]
    ]
    statuses = [e[2] for e in events if e[1] == "status"]
    assert statuses[0] == "queued" and statuses[-1] == "completed" and "processing" in statuses, events

    # The credits page explains the charge line by line, and shows the waiting job's hold.
    follow(browser, browser.find_element(By.LINK_TEXT, "Credits"))
    ledger = [
        [c.text for c in row.find_elements(By.TAG_NAME, "td")]
        for row in browser.find_elements(By.CSS_SELECTOR, "#ledger tr")[1:]
    ]
    short_id = thumbnail["job_id"][:8]
    megapixels = f"-{thumbnail['charge_lines']['megapixels']:.3f}"
    for line in (["commit", "base", "-1.000"], ["commit", "megapixels", megapixels]):
        assert [*line, short_id, "thumbnail", "completed"] in [row[1:7] for row in ledger], ledger
    assert any(row[1:3] == ["hold", "base"] and row[5:7] == ["pdf_info", "queued"] for row in ledger), ledger
    assert any(row[1] == "grant" and row[3] == "+50.000" for row in ledger), ledger
    browser.get(f"{base}/dashboard/workers")
    assert "admin accounts" in browser.page_source  # not an admin: no workers page

    browser.get(f"{base}/dashboard/jobs?status=queued")
    [row] = browser.find_elements(By.CSS_SELECTOR, "#jobs tr")[1:]
    follow(browser, row.find_element(By.TAG_NAME, "a"))
    assert _text(browser, "#status") == "queued"
    follow(browser, browser.find_element(By.ID, "cancel"))
    assert _text(browser, "#status") == "cancelled"
    follow(browser, browser.find_element(By.ID, "retry"))
    again = browser.current_url.rsplit("/", 1)[1]
    assert again != waiting and _text(browser, "#status") == "queued"
    follow(browser, browser.find_element(By.ID, "cancel"))
    assert _text(browser, "#status") == "cancelled"

    follow(browser, browser.find_element(By.CSS_SELECTOR, "header form button"))
    browser.get(f"{base}/dashboard/jobs")
    assert browser.current_url.endswith("/dashboard/login")


def test_an_admin_sees_the_workers_with_their_heartbeats_and_slots(
    platform: RunningPlatform, browser: WebDriver
) -> None:
    admin: dict[str, Any] = platform.admin("create-account", "--admin")
    base = platform.rest_url
    browser.get(f"{base}/dashboard/login")
    browser.find_element(By.NAME, "api_key").send_keys(admin["api_key"])
    follow(browser, browser.find_element(By.CSS_SELECTOR, "form button"))
    follow(browser, browser.find_element(By.LINK_TEXT, "Workers"))

    def sampled() -> dict[str, list[str]] | None:
        """The rows once the imageworker's first metrics sample (every 60 s) is in."""
        browser.refresh()
        rows = {
            row.get_attribute("data-queue"): [c.text for c in row.find_elements(By.TAG_NAME, "td")]
            for row in browser.find_elements(By.CSS_SELECTOR, "#workers tr[data-queue]")
        }
        return rows if rows.get("images", ["", "", "", "", "", ""])[5] else None

    rows = wait_for("the imageworker's metrics sample", sampled, timeout=90, interval=2)
    assert {"images", "documents", "ocr", "media", "sched.images"} <= set(rows), rows
    images = rows["images"]
    assert images[1].startswith("local/imageworker/") and images[2] == "running"
    assert int(images[3].removesuffix(" s ago")) < 60 and images[4].endswith(" of 4")
    # Admission as the unit's control set it: the imageworker is a unit with a target.
    assert images[5].split(" ")[0] in ("ok", "slots_full", "parked") and "(target " in images[5], images
    consumer = rows["sched.images"]  # its scheduler consumer (ADR 0073): one slot, no target
    assert consumer[1] == images[1] + "/sched" and consumer[4].endswith(" of 1"), consumer
    follow(browser, browser.find_element(By.CSS_SELECTOR, "header form button"))


def test_the_schedules_page_shows_next_and_last_runs(platform: RunningPlatform, browser: WebDriver) -> None:
    account: dict[str, Any] = platform.admin("create-account", "--credits", "10")
    with platform.client(account) as client:
        obj = upload(client, PHOTO)
        for name, cron in (("hourly-thumbs", "0 * * * *"), ("paused-one", "@daily")):
            body = {
                "name": name,
                "cron": cron,
                "process": {"object_ids": [obj["object_id"]], "operations": ["thumbnail"]},
            }
            assert client.post("/v1/schedules", json=body).status_code == 201
        client.post("/v1/schedules/paused-one:pause").raise_for_status()
        run_id = client.post("/v1/schedules/hourly-thumbs:trigger").json()["run_id"]
        for _ in range(100):
            runs = client.get("/v1/schedules/hourly-thumbs/runs").json()["runs"]
            if runs[0]["run_id"] == run_id and runs[0]["state"] == "succeeded":
                break
            time.sleep(0.2)
        next_run = client.get("/v1/schedules/hourly-thumbs").json()["next_run_at"]
        delayed = client.post(
            "/v1/hypermedia/process",
            json={
                "object_id": obj["object_id"],
                "operations": ["thumbnail"],
                "not_before": "2099-01-01T00:00:00Z",
            },
        )
        assert delayed.status_code == 422  # beyond the 30-day horizon
        due = client.post(
            "/v1/hypermedia/process",
            json={"object_id": obj["object_id"], "operations": ["thumbnail"], "delay_seconds": 86400},
        ).json()["not_before"]
    base = platform.rest_url
    browser.get(f"{base}/dashboard/login")
    browser.find_element(By.NAME, "api_key").send_keys(account["api_key"])
    follow(browser, browser.find_element(By.CSS_SELECTOR, "form button"))
    # The Overview counts the delayed job that holds credits, with when it is due.
    assert browser.find_elements(By.ID, "queues-empty") == []
    assert _text(browser, "#delayed").startswith(
        f"1 delayed job scheduled, the next due {due[:10]} {due[11:19]} UTC"
    )
    follow(browser, browser.find_element(By.LINK_TEXT, "list"))
    [listed] = browser.find_elements(By.CSS_SELECTOR, "#jobs tr")[1:]
    assert "scheduled" in listed.text
    follow(browser, browser.find_element(By.LINK_TEXT, "Schedules"))

    rows = {
        row.get_attribute("data-name"): [c.text for c in row.find_elements(By.TAG_NAME, "td")]
        for row in browser.find_elements(By.CSS_SELECTOR, "#schedules tr[data-name]")
    }

    assert rows["hourly-thumbs"][:4] == ["hourly-thumbs", "process", "0 * * * *", "UTC"]
    assert rows["hourly-thumbs"][4] == next_run[:16].replace("T", " ")
    assert rows["hourly-thumbs"][5].endswith("(manual)") and rows["hourly-thumbs"][6] == "succeeded"
    assert rows["paused-one"][4:] == ["paused", "", ""]
    follow(browser, browser.find_element(By.CSS_SELECTOR, "header form button"))


def test_a_form_without_the_sessions_token_changes_nothing(platform: RunningPlatform) -> None:
    """A page of another origin could post the form (the cookie is SameSite=Strict too), but it
    cannot read the token: the cancel is refused and the job keeps waiting."""
    account: dict[str, Any] = platform.admin("create-account", "--credits", "10")
    with platform.client(account) as client:
        pdf = upload(client, PDF)
        job_id = client.post(
            "/v1/hypermedia/process",
            json={"object_id": pdf["object_id"], "operations": ["pdf_info"], "queue": "bulk"},
        ).json()["job_ids"][0]
        with httpx.Client(base_url=platform.rest_url, follow_redirects=False, timeout=10) as page:
            assert page.post("/dashboard/login", data={"api_key": account["api_key"]}).status_code == 303
            forged = page.post(f"/dashboard/jobs/{job_id}/cancel", data={"csrf": "0" * 64})
            assert forged.status_code == 403
            assert page.get(f"/dashboard/jobs/{job_id}").status_code == 200
        assert client.get(f"/v1/jobs/{job_id}").json()["status"] == "queued"
        assert client.post(f"/v1/jobs/{job_id}:cancel").json()["status"] == "cancelled"


def test_the_backfills_page_shows_a_runs_progress_and_only_admins_see_the_scheduler(
    platform: RunningPlatform, browser: WebDriver
) -> None:
    account: dict[str, Any] = platform.admin("create-account", "--credits", "10")
    # A fresh account's Overview: nothing waiting, no job ended in the last hour.
    sign_in(browser, platform.rest_url, account["api_key"])
    assert browser.find_elements(By.ID, "queues-empty") and browser.find_elements(By.ID, "delayed") == []
    assert len(browser.find_elements(By.CSS_SELECTOR, "#throughput g[data-completed='0']")) == 60
    assert browser.find_elements(By.CSS_SELECTOR, "#latency g") == []
    with platform.client(account) as client:
        upload(client, PHOTO)
        created = client.post("/v1/backfills", json={"selector": {"operation": "thumbnail", "scope": "all"}})
        assert created.status_code == 201, created.text
        run_id = created.json()["run_id"]
        wait_for(
            "the run's job done",
            lambda: client.get(f"/v1/backfills/{run_id}").json()["progress"]["completed"] == 1,
            timeout=60,
            interval=0.3,
        )
    sign_in(browser, platform.rest_url, account["api_key"])
    follow(browser, browser.find_element(By.LINK_TEXT, "Backfills"))
    row = table(browser, "#backfills", "data-run")[run_id]
    # matched, enqueued, completed / failed, in flight: the run may still be `running` or
    # `dispatched` (every item enqueued; its last tick has not seen the job end), or `completed`.
    assert row[1] in ("running", "dispatched", "completed"), row
    assert row[2:7] == ["thumbnail", "1", "1", "1 / 0", "0"], row
    assert browser.find_elements(By.LINK_TEXT, "Scheduler") == []  # not an admin
    browser.get(f"{platform.rest_url}/dashboard/scheduler")
    assert "admin accounts" in browser.page_source
    follow(browser, browser.find_element(By.CSS_SELECTOR, "header form button"))


def test_a_transcodes_hls_plays_in_the_job_page(
    platform: RunningPlatform, browser: WebDriver, tmp_path: Path
) -> None:
    """The job page of an HLS transcode plays its master playlist with the bundled hls.js: the
    playlist from the dashboard (same origin), its variants signed by the API, its fMP4 fetched
    by byte range from storage (CORS); the video plays past its first second."""
    account: dict[str, Any] = platform.admin("create-account", "--credits", "100")
    with platform.client(account) as client:
        obj = upload(client, write_video(tmp_path / "clip.mp4", seconds=4.0, width=640, height=360))
        created = client.post(
            "/v1/hypermedia/process",
            json={
                "object_id": obj["object_id"],
                "operations": [
                    {
                        "name": "transcode_video",
                        "params": {"heights": [360], "hls": True, "hls_segment_seconds": 2},
                    }
                ],
            },
        )
        job = wait_job(client, created.json()["job_ids"][0], timeout=120)
    assert job["status"] == "completed", job
    sign_in(browser, platform.rest_url, account["api_key"])
    browser.get(f"{platform.rest_url}/dashboard/jobs/{job['job_id']}")
    video = browser.find_element(By.CSS_SELECTOR, "figure[data-output=hls_master] video[data-hls]")
    assert browser.execute_script("return typeof window.Hls") == "function"
    browser.execute_script("arguments[0].play()", video)

    def played() -> float | None:
        error = video.get_attribute("data-hls-error")
        assert not error, error
        at = float(browser.execute_script("return arguments[0].currentTime", video))
        return at if at > 1.0 else None

    wait_for("the HLS video to play past 1 s", played, timeout=30, interval=0.2)
    assert round(float(browser.execute_script("return arguments[0].duration", video))) == 4
    assert browser.execute_script("return [arguments[0].videoWidth, arguments[0].videoHeight]", video) == [
        640,
        360,
    ]
    # The bundled scripts are served by the gateway itself, and nothing else from that folder.
    bundled = httpx.get(f"{platform.rest_url}/dashboard/static/hls.light.min.js", timeout=10)
    assert bundled.status_code == 200 and bundled.headers["content-type"].startswith("text/javascript")
    for other in ("README.md", "hls.js-LICENSE", "..%2Fdashboard.py"):
        assert httpx.get(f"{platform.rest_url}/dashboard/static/{other}", timeout=10).status_code == 404
    # Without the session, the page's playlist is not served.
    assert (
        httpx.get(
            f"{platform.rest_url}/dashboard/jobs/{job['job_id']}/outputs/hls_master/resolved"
        ).status_code
        == 401
    )
