"""Prometheus metrics (issue 22 item 1, ADR 0061) on the real platform: every service of
``hypermedia up`` serves its own on the port platform.json names, and one completed and one failed
job move exactly the counters they should in the gateway, the image worker, credits, storage and
the reaper's gauges. The session's platform is shared, so each figure is a difference between two
scrapes around this test's own requests."""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import RunningPlatform, upload, wait_for, wait_job

EXIF = Path(__file__).resolve().parents[1] / "data" / "exif-orientation"
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _scrape(url: str) -> Samples:
    answer = wait_for(f"metrics at {url}", lambda: _get(url), timeout=60, interval=0.2)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/plain; version=")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(answer.text)
        for s in family.samples
    }


def _get(url: str) -> httpx.Response | None:
    """The answer at ``url``, or None while nothing listens there (a worker still starting)."""
    try:
        return httpx.get(url, timeout=10)
    except httpx.ConnectError:
        return None


def _value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def _moved(before: Samples, after: Samples, name: str, **labels: str) -> float:
    return _value(after, name, **labels) - _value(before, name, **labels)


def test_every_service_serves_its_own_metrics(platform: RunningPlatform) -> None:
    urls: dict[str, str] = platform.info["metrics"]
    assert {"gateway", "storage", "credits", "reaper", "imageworker", "docworker"} <= set(urls)
    for name, url in urls.items():
        samples = _scrape(url)
        assert _value(samples, "process_cpu_seconds_total") > 0, name  # the process's own collector
        assert _value(samples, "process_resident_memory_bytes") > 10 << 20, name
    assert urls["gateway"] != urls["storage"]
    # A worker unit registers once its execution started: the reaper counts it from then on.
    reaper = wait_for(
        "the image worker counted",
        lambda: (
            r
            if _value(r := _scrape(urls["reaper"]), "hypermedia_workers", queue="images", status="running")
            else None
        ),
        timeout=60,
        interval=0.5,
    )
    assert _value(reaper, "hypermedia_platform_gauges_up") == 1
    assert _value(_scrape(urls["credits"]), "hypermedia_credits_gauges_up") == 1
    worker = _scrape(urls["imageworker"])
    slots = _value(worker, "hypermedia_worker_slots", queue="images")
    assert slots >= 1
    reasons = {
        dict(labels)["reason"]: v for (n, labels), v in worker.items() if n == "hypermedia_worker_admission"
    }
    assert sum(reasons.values()) == 1 and len(reasons) == 7, reasons
    assert _value(worker, "hypermedia_sandbox_layer", layer="seccomp") == 1  # this machine has it


def test_a_completed_and_a_failed_job_move_their_counters(
    platform: RunningPlatform, client: httpx.Client
) -> None:
    urls: dict[str, str] = platform.info["metrics"]
    good = upload(client, EXIF / "Landscape_3.jpg")
    bad = client.post(
        "/v1/objects", files={"file": ("cut.jpg", (EXIF / "Landscape_1.jpg").read_bytes()[:20000])}
    ).json()
    names = ("gateway", "imageworker", "credits", "storage")
    before = {name: _scrape(urls[name]) for name in names}

    job_ids = [
        client.post(
            "/v1/hypermedia/process", json={"object_id": obj["object_id"], "operations": ["thumbnail"]}
        ).json()["job_ids"][0]
        for obj in (good, bad)
    ]
    done, failed = (wait_job(client, job_id) for job_id in job_ids)
    assert (done["status"], failed["status"], failed["error_code"]) == (
        "completed",
        "failed",
        "CORRUPT_INPUT",
    )
    assert client.get(f"/v1/jobs/{uuid.uuid4()}").status_code == 404

    # The worker counts an attempt once its row is committed, before the job's answer is read;
    # credits are settled just after: wait for both commits to be counted (the corrupt input is
    # charged its minimum: ADR 0068).
    charged = round((done["actual_credits"] + failed["actual_credits"]) * 1000)

    def settled() -> dict[str, Samples] | None:
        now = {name: _scrape(urls[name]) for name in names}
        committed = _moved(
            before["credits"], now["credits"], "hypermedia_credits_millicredits_total", action="committed"
        )
        return now if committed == charged else None

    after = wait_for("the commit counted", settled, timeout=20, interval=0.2)

    gateway = (before["gateway"], after["gateway"])
    route = "/v1/hypermedia/process"
    assert _moved(*gateway, "hypermedia_http_requests_total", method="POST", route=route, code="202") == 2
    assert _moved(*gateway, "hypermedia_http_request_duration_seconds_count", method="POST", route=route) == 2
    assert _moved(*gateway, "hypermedia_jobs_created_total", operation="thumbnail", queue="images") == 2
    assert _moved(*gateway, "hypermedia_api_errors_total", error_code="NOT_FOUND") == 1
    assert (
        _moved(
            *gateway, "hypermedia_http_requests_total", method="GET", route="/v1/jobs/{job_id}", code="404"
        )
        == 1
    )

    worker = (before["imageworker"], after["imageworker"])
    assert _moved(*worker, "hypermedia_attempts_total", operation="thumbnail", outcome="completed") == 1
    assert _moved(*worker, "hypermedia_attempts_total", operation="thumbnail", outcome="failed") == 1
    assert (
        _moved(*worker, "hypermedia_job_errors_total", operation="thumbnail", error_code="CORRUPT_INPUT") == 1
    )
    assert _moved(*worker, "hypermedia_attempt_duration_seconds_count", operation="thumbnail") == 2
    seconds = _moved(*worker, "hypermedia_attempt_duration_seconds_sum", operation="thumbnail")
    recorded = sum(a["duration_ms"] for job in (done, failed) for a in job["attempts"]) / 1000
    assert abs(seconds - recorded) < 0.01, (seconds, recorded)
    assert _moved(*worker, "hypermedia_attempt_peak_memory_bytes_count", operation="thumbnail") == 2
    peak = _moved(*worker, "hypermedia_attempt_peak_memory_bytes_sum", operation="thumbnail")
    assert peak == sum(a["peak_memory_mb"] for job in (done, failed) for a in job["attempts"]) * 2**20

    credits = (before["credits"], after["credits"])
    held = _moved(*credits, "hypermedia_credits_millicredits_total", action="held")
    assert held == round((done["estimated_credits"] + failed["estimated_credits"]) * 1000)
    assert _moved(*credits, "hypermedia_credits_millicredits_total", action="committed") == charged > 0
    released = _moved(*credits, "hypermedia_credits_millicredits_total", action="released")
    assert released == held - charged  # what the holds had beyond the charges
    assert (
        _moved(
            *credits,
            "grpc_server_handled_total",
            grpc_service="hypermedia.credits.v1.CreditsService",
            grpc_method="EstimateAndHold",
            grpc_code="OK",
        )
        == 2
    )

    storage = (before["storage"], after["storage"])
    served = sum(
        _moved(*storage, name, **dict(labels))
        for name, labels in after["storage"]
        if name == "grpc_server_handled_total" and dict(labels)["grpc_code"] == "OK"
    )
    assert served >= 2  # at least a grant of each job's input and the good one's registration
