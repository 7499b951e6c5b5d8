"""The mediaworker's hooks into the worker runtime (``services/mediaworker``): its settings, the
media coordinator (:meth:`MediaHandler.admit`) and the encoder threads counted in a job's
``RLIMIT_NPROC`` (:meth:`MediaHandler.sandbox_limits`), the last proved by the real
``transcode_video`` engine in a real sandbox child. The runtime side (waiting events, leases,
cancellation, progress) is tested end to end in tests/e2e/test_media_runtime.py."""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from hypermedia.core import config
from hypermedia.core.config import ConfigError
from hypermedia.engines.media import transcode
from hypermedia.jobs.lifecycle import ClaimedJob
from hypermedia.sandbox import Sandbox, SandboxLimits, SandboxResult
from services.mediaworker.__main__ import MediaHandler
from services.mediaworker.settings import MediaSettings
from tests.helpers.media import admitted_by, media_job, write_video

LIMITS = SandboxLimits(cpu_seconds=120, wall_seconds=180, memory_bytes=8 << 30, fsize_bytes=1 << 30)
UIDS = (61390,) if os.geteuid() == 0 else None
"""A uid of its own (as the worker gives each slot): ``RLIMIT_NPROC`` is then the job's alone."""
LADDER = [1080, 720, 480, 360, 240, 144]


def test_media_settings_defaults_and_every_error_named(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HM_MEDIA_MAX_VIDEO_JOBS", "HM_MEDIA_MAX_AUDIO_JOBS", "HM_MEDIA_ENCODER_THREADS"):
        monkeypatch.delenv(name, raising=False)
    settings = config.load(MediaSettings)
    assert (settings.max_video_jobs, settings.max_audio_jobs, settings.encoder_threads) == (3, 1, 2)

    monkeypatch.setenv("HM_MEDIA_MAX_AUDIO_JOBS", "0")
    monkeypatch.setenv("HM_MEDIA_ENCODER_THREADS", "lots")
    with pytest.raises(ConfigError) as raised:
        config.load(MediaSettings)
    assert "HM_MEDIA_MAX_AUDIO_JOBS" in str(raised.value) and "HM_MEDIA_ENCODER_THREADS" in str(raised.value)
    assert "lots" not in str(raised.value)


async def test_the_coordinator_bounds_transcodes_per_operation_and_nothing_else() -> None:
    handler = MediaHandler(
        MediaSettings.model_validate({"HM_MEDIA_MAX_VIDEO_JOBS": 2, "HM_MEDIA_MAX_AUDIO_JOBS": 1})
    )

    async def admitted(operation: str) -> bool:
        return await admitted_by(handler, operation)

    async with handler.admit(media_job("transcode_audio")):
        assert not await admitted("transcode_audio")
        assert await admitted("transcode_video") and await admitted("probe")
        async with handler.admit(media_job("transcode_video")), handler.admit(media_job("transcode_video")):
            assert not await admitted("transcode_video")
            assert all([await admitted(op) for op in ("probe", "waveform", "poster")])
    # A wait that was cancelled (a cancel request, a lost lease) left nothing held.
    assert await admitted("transcode_audio") and await admitted("transcode_video")


def test_encoder_threads_and_nproc_for_video_transcodes_only() -> None:
    handler = MediaHandler(MediaSettings.model_validate({"HM_MEDIA_ENCODER_THREADS": 4}))
    video = media_job("transcode_video", {"heights": [720, 480, 360]})
    assert handler.entry_kwargs(video)["limits"].threads == 4
    limits = handler.sandbox_limits(video, LIMITS)
    assert limits.nproc == LIMITS.nproc + transcode.thread_need(video.params, 4)
    assert (limits.memory_bytes, limits.cpu_seconds) == (LIMITS.memory_bytes, LIMITS.cpu_seconds)
    for operation in ("transcode_audio", "probe", "waveform", "poster"):
        job = media_job(operation)
        assert handler.entry_kwargs(job)["limits"].threads == 1
        assert handler.sandbox_limits(job, LIMITS) is LIMITS


# -- the real engine in a real sandbox ---------------------------------------------------------------


@pytest.fixture(scope="module")
async def sandbox(tmp_root: Path) -> AsyncIterator[Sandbox]:
    work_dir = tmp_root / f"coordinator-{secrets.token_hex(4)}"
    work_dir.mkdir(mode=0o755)
    box = Sandbox(work_dir, preload=("av", "hypermedia.engines.media.engine"), uid=UIDS)
    await box.start()
    yield box
    await box.close()


def _write_1080p(path: Path) -> Path:
    """10 frames of 1920×1080 H.264 and 0.4 s of AAC stereo: every rung of :data:`LADDER` fits."""
    return write_video(path, seconds=0.4, width=1920, height=1080, container_format="mp4")


async def _transcode(
    sandbox: Sandbox, handler: MediaHandler, job: ClaimedJob, limits: SandboxLimits
) -> SandboxResult:
    """The real ``transcode_video`` entry on :func:`_write_1080p`'s clip in a child of ``sandbox``."""
    job_id = f"job-{secrets.token_hex(6)}"
    job_dir = sandbox.prepare(job_id)
    try:
        source = _write_1080p(job_dir / "input" / "source")
        return await sandbox.run(
            job_id,
            handler.entry,
            job.operation,
            job.params,
            source,
            limits,
            entry_kwargs=handler.entry_kwargs(job),
        )
    finally:
        sandbox.cleanup(job_id)


@pytest.mark.parametrize("threads", [2, 4, 8])
async def test_a_six_rung_ladder_with_sound_fits_the_nproc_the_handler_gives_it(
    sandbox: Sandbox, threads: int
) -> None:
    """Six H.264 renditions with sound at once from one decode need ``RLIMIT_NPROC`` 24 at 2
    threads (the default ``HM_MEDIA_ENCODER_THREADS``), 36 at 4, 72 at 8: more than the 16 every
    job gets, within the handler's 16 + ``thread_need`` (51, 65, 93)."""
    handler = MediaHandler(MediaSettings.model_validate({"HM_MEDIA_ENCODER_THREADS": threads}))
    job = media_job("transcode_video", {"heights": LADDER})
    result = await _transcode(sandbox, handler, job, handler.sandbox_limits(job, LIMITS))
    assert result.error_code is None, (result.error_code, result.error_message)
    assert [o.output_type for o in result.outputs] == [f"video_{h}p" for h in LADDER]


async def test_the_same_ladder_fails_within_the_16_tasks_of_other_jobs(sandbox: Sandbox) -> None:
    """Why the handler raises ``RLIMIT_NPROC``: the default ladder cannot start its threads
    within 16, and says so (``RESOURCE_LIMIT``, not an input it blames)."""
    handler = MediaHandler(MediaSettings.model_validate({}))
    job = media_job("transcode_video", {"heights": LADDER})
    result = await _transcode(sandbox, handler, job, LIMITS)
    assert (result.error_code, result.retryable, result.outputs) == ("RESOURCE_LIMIT", False, [])
