"""What the worker takes of an entry's request to fan out (:func:`hypermedia.worker.fanout.requested`,
ADR 0081): the sandboxed child ran on a hostile file, so the request is checked before a single
child job is made from it."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from hypermedia.core.errors import TransientError
from hypermedia.engines.media import chunk_parts
from hypermedia.jobs.lifecycle import ClaimedJob
from hypermedia.sandbox import OutputFile, SandboxResult
from hypermedia.worker import fanout

JOB = ClaimedJob(
    job_id="00000000-0000-4000-8000-000000000001",
    account_id="00000000-0000-4000-8000-000000000002",
    object_id="00000000-0000-4000-8000-000000000003",
    operation="transcode_video",
    profile_version=1,
    queue="media",
    params={},
    priority=5,
    attempt=1,
    max_attempts=3,
    estimated_credits=5000,
    timeout_seconds=3600,
    max_input_bytes=1 << 31,
    max_pixels=1 << 26,
    memory_limit_mb=8192,
    backoff_base_seconds=60,
)


def _result(*outputs: OutputFile) -> SandboxResult:
    return SandboxResult(list(outputs), None, None, False, 10, 1)


def _ask(chunks: Any) -> OutputFile:
    return OutputFile("fan_out", "fanout.json", "application/json", {"chunks": chunks})


def test_a_run_with_outputs_asks_nothing() -> None:
    video = OutputFile("video_720p", "video_720p.mp4", "video/mp4", {"chunks": 5})
    assert fanout.requested(_result(video), JOB) is None
    assert fanout.requested(_result(), JOB) is None


def test_a_request_gives_the_plans_chunk_count() -> None:
    assert fanout.requested(_result(_ask(3)), JOB) == 3
    assert fanout.requested(_result(_ask(60)), JOB) == 60


@pytest.mark.parametrize("chunks", [2, 61, 0, -4, True, 3.0, "5", None, [3]])
def test_a_count_out_of_bounds_or_of_another_type_is_refused(chunks: Any) -> None:
    with pytest.raises(TransientError) as refused:
        fanout.requested(_result(_ask(chunks)), JOB)
    assert refused.value.error_code == "INTERNAL"


def test_a_request_beside_other_outputs_is_refused() -> None:
    video = OutputFile("video_720p", "video_720p.mp4", "video/mp4", {})
    with pytest.raises(TransientError):
        fanout.requested(_result(_ask(4), video), JOB)
    with pytest.raises(TransientError):
        fanout.requested(_result(_ask(4), _ask(4)), JOB)


def test_the_workers_bounds_are_the_engines() -> None:
    assert (fanout.MIN_CHUNKS, fanout.MAX_CHUNKS) == (chunk_parts.MIN_FAN_OUT, chunk_parts.MAX_CHUNKS)


def test_a_job_that_may_not_fan_out_is_refused_its_request() -> None:
    """A child, or a job that fanned out before (its entry was told not to): a request from its
    entry is a hostile file's doing, never more children."""
    for job in (replace(JOB, fanned_out=True), replace(JOB, parent_job_id=JOB.account_id, chunk_index=0)):
        with pytest.raises(TransientError):
            fanout.requested(_result(_ask(4)), job)
