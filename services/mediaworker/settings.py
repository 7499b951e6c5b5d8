"""The mediaworker's own settings (its media coordinator, encoder threads)."""

from __future__ import annotations

from pydantic import Field

from hypermedia.core.config import ComponentSettings


class MediaSettings(ComponentSettings):
    """The mediaworker's media coordinator and encoder threads (``services/mediaworker``), read
    beside its :class:`WorkerSettings`. The coordinator bounds operations *within* the worker's
    slots: it matters only when ``HM_WORKER_SLOTS`` (1 by default for the mediaworker) is raised
    above 1; a job that waits for it holds its slot meanwhile."""

    max_video_jobs: int = Field(3, ge=1, le=64, validation_alias="HM_MEDIA_MAX_VIDEO_JOBS")
    """``transcode_video`` jobs one unit (or worker process run alone) runs at once (the seed's media coordinator: 3)."""
    max_audio_jobs: int = Field(1, ge=1, le=64, validation_alias="HM_MEDIA_MAX_AUDIO_JOBS")
    """``transcode_audio`` jobs (audio renditions) one unit (or worker process run alone) runs at once (the seed: 1)."""

    def coordinator_bounds(self) -> dict[str, int]:
        """The media coordinator's bounds, operation → jobs at once (a unit's control keeps them:
        :mod:`hypermedia.worker.unit.coordinator`)."""
        return {"transcode_video": self.max_video_jobs, "transcode_audio": self.max_audio_jobs}

    encoder_threads: int = Field(2, ge=1, le=16, validation_alias="HM_MEDIA_ENCODER_THREADS")
    """Threads of a ``transcode_video`` job's decoder and of each of its encoders
    (``MediaLimits.threads``); its ``RLIMIT_NPROC`` is raised to match (measured up to 16:
    ``services.mediaworker.MediaHandler.sandbox_limits``). The other media operations run one
    thread each."""

    checkpoint_seconds: float = Field(120.0, ge=0.0, validation_alias="HM_MEDIA_CHECKPOINT_SECONDS")
    """A ``transcode_video`` of media at least this long (seconds) with more than one rendition
    encodes them one at a time and keeps each finished one but the last as a checkpoint, so a
    drain, a deploy or a crash costs at most the rendition under way (``MediaLimits.part_seconds``,
    ADR 0079). Each rendition then pays a decode of its own: a 1080/720/480 ladder of 1080p
    H.264 takes 1.24× the CPU and wall clock of one pass (``bench/transcode_parts.py``), so
    shorter media keeps the one pass and starts over when interrupted."""

    fan_out_seconds: float = Field(300.0, ge=0.0, validation_alias="HM_MEDIA_FAN_OUT_SECONDS")
    """A ``transcode_video`` of media at least this long (seconds; 0: never) that can be cut
    into at least three chunks fans out: child jobs on any media unit encode its chunks but the
    last, and the job joins them (``MediaLimits.fan_out_seconds``, ADR 0081)."""
    fan_out_chunk_seconds: float = Field(
        30.0, ge=1.0, le=600.0, validation_alias="HM_MEDIA_FAN_OUT_CHUNK_SECONDS"
    )
    """Length of a fanned-out job's chunks (seconds; longer where a video would have more than
    60): each is a child job, cut at the keyframe at or after its start."""
