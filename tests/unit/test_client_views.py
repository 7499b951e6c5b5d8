"""What the client CLI shows (:mod:`hypermedia.client.views`): the names outputs are saved as,
and what a job's credits column says before and after it ends."""

from __future__ import annotations

import pytest

from hypermedia.client.views import credits_shown, saved_name, status_shown


@pytest.mark.parametrize(
    ("stem", "output_type", "mime", "name"),
    [
        ("report", "pdf", "application/pdf", "report.pdf"),  # not report.pdf.pdf
        ("cat", "thumbnail", "image/webp", "cat.thumbnail.webp"),
        ("cat", "converted", "image/png; charset=binary", "cat.converted.png"),
        ("clip", "hls_720p", "application/vnd.apple.mpegurl", "clip.hls_720p.m3u8"),
        ("scan", "text", "text/plain", "scan.text.txt"),
        ("x", "blob", "application/x-unheard-of", "x.blob.bin"),
    ],
)
def test_an_output_is_saved_as_stem_type_and_extension_without_a_doubled_extension(
    stem: str, output_type: str, mime: str, name: str
) -> None:
    assert saved_name(stem, output_type, mime) == name


@pytest.mark.parametrize(
    ("job", "shown"),
    [
        ({"status": "completed", "actual_credits": 1.025, "estimated_credits": 1.3}, "1.025"),
        ({"status": "failed", "actual_credits": 1.004, "estimated_credits": 1.004}, "1.004"),
        # Released: the estimate was never charged (a fresh user's trial read it as a charge).
        ({"status": "failed", "actual_credits": None, "estimated_credits": 1.003}, "0"),
        ({"status": "cancelled", "actual_credits": None, "estimated_credits": 1.067}, "0"),
        ({"status": "processing", "actual_credits": None, "estimated_credits": 1.3}, "1.3 held"),
        ({"status": "scheduled", "actual_credits": None, "estimated_credits": 2.0}, "2.0 held"),
    ],
)
def test_a_jobs_credits_are_its_charge_once_it_ended_and_its_hold_before(job: dict, shown: str) -> None:
    assert credits_shown(job) == shown


def test_a_delayed_job_says_when_it_will_be_queued() -> None:
    waiting = {"status": "scheduled", "not_before": "2026-12-24T18:00:00+00:00"}
    assert status_shown(waiting) == "scheduled for 2026-12-24T18:00:00+00:00"
    assert status_shown({"status": "queued", "not_before": "2026-12-24T18:00:00+00:00"}) == "queued"
