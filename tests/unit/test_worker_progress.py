"""A job's progress events are held back in its first second: a short job writes none, a long one
writes the latest held event when it reaches that age, then every event as it comes."""

from __future__ import annotations

import asyncio
import logging

import pytest

from hypermedia.worker.progress import JobProgress

AFTER = 0.2
"""A shorter age than the product's (PROGRESS_AFTER_SECONDS, 1 s), so the tests wait less."""


class _Recorder:
    def __init__(self, delay: float = 0.0) -> None:
        self.events: list[tuple[float, str]] = []
        self.delay = delay

    async def write(self, fraction: float, stage: str) -> None:
        await asyncio.sleep(self.delay)  # a transaction takes a while: order must hold anyway
        self.events.append((fraction, stage))


async def test_a_job_that_ends_within_the_age_writes_no_event() -> None:
    recorder = _Recorder()
    progress = JobProgress(recorder.write, after_seconds=AFTER)
    await progress.report(0.25, "downloaded")
    await progress.report(0.75, "processed")
    await progress.report(0.95, "uploaded")
    progress.close()
    await asyncio.sleep(AFTER * 2)
    assert recorder.events == []
    await progress.report(1.0, "late")  # nothing after close
    assert recorder.events == []


async def test_a_long_job_writes_its_latest_held_event_at_the_age_then_each_event_in_order() -> None:
    recorder = _Recorder(delay=0.05)
    progress = JobProgress(recorder.write, after_seconds=AFTER)
    await progress.report(0.25, "downloaded")
    await progress.report(0.25, "waiting")  # replaces the held one
    assert recorder.events == []
    await asyncio.sleep(AFTER + 0.01)
    # The held event's write is under way; one reported now comes after it.
    await progress.report(0.5, "processing")
    await progress.report(0.75, "processed")
    progress.close()
    assert recorder.events == [(0.25, "waiting"), (0.5, "processing"), (0.75, "processed")]


async def test_an_event_reported_once_the_job_is_old_enough_is_written_at_once() -> None:
    recorder = _Recorder()
    loop = asyncio.get_running_loop()
    progress = JobProgress(recorder.write, after_seconds=AFTER, started=loop.time() - AFTER)
    await progress.report(0.25, "downloaded")
    assert recorder.events == [(0.25, "downloaded")]
    progress.close()


async def test_a_failing_write_of_the_held_event_is_logged_not_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def broken(fraction: float, stage: str) -> None:
        raise RuntimeError("database gone")

    progress = JobProgress(broken, after_seconds=0.01)
    await progress.report(0.25, "downloaded")
    await asyncio.sleep(0.05)
    progress.close()  # the flush ended on its own: nothing left to raise
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        "progress event not recorded"
    ]


async def test_an_attempts_progress_never_goes_back() -> None:
    """A fanned-out job's second run reports its own fraction from 0 after its children's 0.65
    (ADR 0081): the events stay at the highest fraction reached until the run passes it."""
    recorder = _Recorder()
    loop = asyncio.get_running_loop()
    progress = JobProgress(recorder.write, after_seconds=AFTER, started=loop.time() - AFTER)
    await progress.report(0.65, "children")
    await progress.report(0.3, "processing")
    await progress.report(0.7, "processing")
    progress.close()
    assert recorder.events == [(0.65, "children"), (0.65, "processing"), (0.7, "processing")]
