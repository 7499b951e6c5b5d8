"""Hostile PDFs through the docworker, end to end on a platform of their own: each ends within its
timeout with a specific code (or completes harmlessly), costs nothing when it is refused before
its engine runs out of anything (its minimum when it made the engine run out of memory: ADR
0068), reaches out to nothing, and leaves the platform working.

The attack corpus' generators (50,000 pages, a 1 GiB flate bomb, 100,000 nested arrays) come from
``tests/security/test_documents_and_media.py``; the rest are made here: a MediaBox of 200 × 200
inches, a broken cross-reference table, garbage after a PDF header, and a page whose link, launch
action, JavaScript, remote go-to and external stream all point at a listener.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from tests.e2e.conftest import RunningPlatform, isolated_platform, wait_for, wait_job
from tests.helpers.pdf import (
    PDF_DIR,
    build_pdf,
    one_page_pdf,
    pdf_deeply_nested,
    pdf_flate_bomb,
    pdf_with_pages,
)
from tests.security.conftest import Listener

TIMEOUT_SECONDS = {"pdf_info": 30, "pdf_preview": 60, "text_extract": 60}
"""The seeded profiles' CPU limits; the wall clock is 1.5 times that."""


def pdf_reaching_out(listener: Listener) -> bytes:
    """One page with every way a PDF names another resource, all pointing at ``listener``: a URI
    link, a launch action, document JavaScript (an OpenAction), a remote go-to, and an image
    XObject whose data is an external stream (``/F`` with a URL file specification)."""
    url = listener.url.encode()
    return build_pdf(
        [
            b"<< /Type /Catalog /Pages 2 0 R /OpenAction 6 0 R /Names << /JavaScript << /Names [(x) 6 0 R] >> >> >>",
            b"<< /Type /Pages /Count 1 /Kids [3 0 R] >>",
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 300 200] /Annots [4 0 R 5 0 R 7 0 R]"
            b" /Resources << /XObject << /Im1 8 0 R >> >> /Contents 9 0 R >>",
            b"<< /Type /Annot /Subtype /Link /Rect [0 0 100 100] /A << /S /URI /URI (%s) >> >>" % url,
            b"<< /Type /Annot /Subtype /Link /Rect [100 0 200 100] /A << /S /Launch /F (%s) >> >>" % url,
            b"<< /S /JavaScript /JS (app.launchURL('%s'); this.submitForm('%s');) >>" % (url, url),
            b"<< /Type /Annot /Subtype /Link /Rect [200 0 300 100] /A << /S /GoToR /F << /FS /URL /F (%s) >> /D [0 /Fit] >> >>"
            % url,
            b"<< /Type /XObject /Subtype /Image /Width 1 /Height 1 /ColorSpace /DeviceGray /BitsPerComponent 8"
            b" /Length 0 /F << /FS /URL /F (%s) >> >>\nstream\n\nendstream" % url,
            b"<< /Length 30 >>\nstream\nq 100 0 0 100 0 0 cm /Im1 Do Q\nendstream",
        ]
    )


@pytest.fixture(scope="module")
def pdf_platform(tmp_root: Path, database_url: str, nats_url: str) -> Iterator[RunningPlatform]:
    with isolated_platform(
        tmp_root, database_url, nats_url, "pdfcorpus", "credits,storage,gateway,docworker"
    ) as running:
        yield running


@pytest.fixture(scope="module")
def client(pdf_platform: RunningPlatform) -> Iterator[httpx.Client]:
    account = pdf_platform.admin("create-account", "--credits", "1000")
    with pdf_platform.client(account, timeout=120) as c:
        yield c


def _run(client: httpx.Client, content: bytes, name: str, operation: str | dict[str, Any]) -> dict[str, Any]:
    response = client.post("/v1/objects", files={"file": (name, content)})
    assert response.status_code == 201, response.text
    assert response.json()["mime_type"] == "application/pdf"
    created = client.post(
        "/v1/hypermedia/process", json={"object_id": response.json()["object_id"], "operations": [operation]}
    )
    assert created.status_code == 202, created.text
    return wait_job(client, created.json()["job_ids"][0], timeout=120)


def _failed_once(job: dict[str, Any], code: str, operation: str) -> None:
    """Failed at once with ``code``; free when refused before the engine ran out of anything, and
    charged its minimum (ADR 0068: base and 0.01 a second, within the price) when the input made
    the engine run out of memory."""
    assert (job["status"], job["error_code"]) == ("failed", code), job
    assert job["attempt_count"] == 1, "a permanent error is not retried"
    assert job["outputs"] == []
    if code == "RESOURCE_LIMIT":
        assert 0 < job["actual_credits"] <= job["estimated_credits"], job
        assert set(job["charge_lines"]) <= {"run_seconds"}
    else:
        assert job["actual_credits"] is None
    assert job["attempts"][0]["duration_ms"] < TIMEOUT_SECONDS[operation] * 1000


@pytest.mark.parametrize("operation", ["pdf_info", "pdf_preview", "text_extract"])
def test_page_count_bomb_is_refused_with_pdf_page_limit(client: httpx.Client, operation: str) -> None:
    job = _run(client, pdf_with_pages(50_000), "fifty-thousand-pages.pdf", operation)
    _failed_once(job, "PDF_PAGE_LIMIT", operation)
    assert job["attempts"][0]["duration_ms"] < 5000
    assert job["error_message"] == "The PDF has 50000 pages; at most 10000 are processed."


@pytest.mark.parametrize("operation", ["pdf_info", "pdf_preview", "text_extract"])
def test_flate_bomb_ends_at_the_memory_limit(client: httpx.Client, operation: str) -> None:
    job = _run(client, pdf_flate_bomb(), "flate-bomb.pdf", operation)
    _failed_once(job, "RESOURCE_LIMIT", operation)
    assert job["error_message"] == "The job exceeded its memory limit."
    assert 512 < job["attempts"][0]["peak_memory_mb"] < 2048


def test_deeply_nested_pdf_completes_as_a_blank_page(client: httpx.Client) -> None:
    job = _run(client, pdf_deeply_nested(), "nested.pdf", "text_extract")
    assert job["status"] == "completed", job
    assert {o["output_type"]: o["metadata"]["has_text_layer"] for o in job["outputs"]} == {
        "text": False,
        "text_json": False,
    }


def test_huge_mediabox_is_refused_before_rendering(client: httpx.Client) -> None:
    huge = one_page_pdf(b"/MediaBox [0 0 14400 14400]", b"0 0 0 rg 0 0 14400 14400 re f")
    job = _run(client, huge, "huge.pdf", {"name": "pdf_preview", "params": {"dpi": 144}})
    _failed_once(job, "PDF_PAGE_TOO_LARGE", "pdf_preview")
    assert job["attempts"][0]["peak_memory_mb"] < 300
    assert "28800 × 28800" in job["error_message"]


def test_damaged_pdfs_are_recovered_or_parse_error(client: httpx.Client) -> None:
    original = (PDF_DIR / "minimal-document.pdf").read_bytes()
    cut = original.rindex(b"startxref")
    recovered = _run(client, original[:cut] + b"startxref\n999999\n%%EOF\n", "broken-xref.pdf", "pdf_info")
    assert recovered["status"] == "completed", recovered
    assert recovered["outputs"][0]["metadata"]["page_count"] == 1
    garbage = _run(client, b"%PDF-1.7\n" + bytes(range(256)) * 40, "garbage.pdf", "pdf_info")
    _failed_once(garbage, "PARSE_ERROR", "pdf_info")


def test_nothing_in_a_pdf_reaches_out_and_the_platform_is_unharmed(
    pdf_platform: RunningPlatform, client: httpx.Client, listener: Listener
) -> None:
    data = pdf_reaching_out(listener)
    for operation in ("pdf_info", "pdf_preview", "text_extract"):
        job = _run(client, data, "reaching-out.pdf", operation)
        assert job["status"] == "completed", job
    assert listener.connections == []
    # Afterwards: no job left running, nothing held (the charge follows the completion at once,
    # from another service), no job directory left, and a normal job runs.
    wait_for("charged", lambda: client.get("/v1/credits").json()["held"] == 0, 10)
    with psycopg.connect(pdf_platform.env["HM_DATABASE_URL"]) as conn:
        unfinished = conn.execute(
            "SELECT count(*) FROM processing_jobs WHERE status NOT IN ('completed', 'failed', 'cancelled')"
        ).fetchone()
    assert unfinished == (0,)
    work = pdf_platform.state_dir / "work-docworker" / "jobs"
    assert not work.exists() or list(work.iterdir()) == []
    job = _run(client, (PDF_DIR / "pdflatex-4-pages.pdf").read_bytes(), "again.pdf", "pdf_info")
    assert job["status"] == "completed" and job["outputs"][0]["metadata"]["page_count"] == 4
