"""A worker process's settings: its queue, slots, identity, work directory, timings, admission gates, sandbox uids and cgroups."""

from __future__ import annotations

import uuid
from typing import Literal

from pydantic import Field, field_validator

from hypermedia.core.config import ComponentSettings, LaneName
from hypermedia.sandbox import cgroups, layers


class WorkerSettings(ComponentSettings):
    """A worker process of one queue."""

    queue: LaneName = Field("images", validation_alias="HM_WORKER_QUEUE")
    """The route it consumes: its role's queue (``images``), or that engine's lane of the bulk
    queue (``bulk.images``: regeneration and backfill jobs, priorities 7-10; ADR 0057). A sched
    lane (``sched.images``) is only ever a scheduler consumer's (:mod:`hypermedia.worker.scheduled`)."""
    slots: int = Field(4, ge=1, le=64, validation_alias="HM_WORKER_SLOTS")
    """Jobs run at once. The seed's profiles: images 4–8, documents 2–4, ocr 1–2, media 1."""
    scheduler: Literal["on", "off"] = Field("on", validation_alias="HM_WORKER_SCHEDULER")
    """``on``: beside the slots of an engine's queue, one scheduler consumer of that engine's sched
    lane (``sched.images``: the jobs of schedules' runs), its own slot that admission never parks
    (seed 001; ADR 0073). ``off``: none; schedules' jobs wait for a worker that has one."""
    deployment: str = Field("local", validation_alias="HM_DEPLOYMENT")
    generation: int = Field(0, ge=0, validation_alias="HM_WORKER_GENERATION")
    burst_worker_id: str = Field("", validation_alias="HM_BURST_WORKER_ID")
    """The scheduler's ``burst_workers`` row this process runs for (a UUID; given by the provider
    that launched it, services/scheduler); empty for a standing worker. Recorded in ``workers``
    so that the scheduler stops only its own workers, and only idle ones (ADR 0047)."""

    @field_validator("burst_worker_id")
    @classmethod
    def _burst_worker_uuid(cls, value: str) -> str:
        value = value.strip()
        if value:
            try:
                uuid.UUID(value)
            except ValueError:
                raise ValueError("must be a UUID (the scheduler's burst worker id) or empty") from None
        return value

    work_dir: str = Field(".hypermedia/work", validation_alias="HM_WORK_DIR")
    """Parent of the per-job sandbox directories ``jobs/{job_id}/``."""
    status_bind: str = Field("127.0.0.1:0", validation_alias="HM_WORKER_STATUS_BIND")
    heartbeat_seconds: float = Field(30.0, gt=0, validation_alias="HM_HEARTBEAT_SECONDS")
    metrics_seconds: float = Field(60.0, gt=0, validation_alias="HM_METRICS_SECONDS")
    drain_seconds: float = Field(35.0, gt=0, validation_alias="HM_DRAIN_SECONDS")
    spot_notice: Literal["off", "ec2", "gce"] = Field("off", validation_alias="HM_SPOT_NOTICE")
    """Watch this cloud's interruption notice (a spot or preemptible instance; issue 20): ``ec2``
    (``spot/instance-action``, 2 minutes' notice), ``gce`` (``instance/preempted``, 30 s). On a
    notice the drain is cut to the time left and what cannot finish is handed back ``preempted``
    (:mod:`hypermedia.worker.preemption`)."""
    spot_metadata_url: str = Field("http://169.254.169.254", validation_alias="HM_SPOT_METADATA_URL")
    """The instance metadata service (both clouds answer at this address)."""
    spot_poll_seconds: float = Field(5.0, gt=0, le=60, validation_alias="HM_SPOT_POLL_SECONDS")
    min_available_memory_mb: int = Field(512, ge=0, validation_alias="HM_MIN_AVAILABLE_MEMORY_MB")
    """Admission closes while available memory is below this (MiB)."""
    min_pid_headroom: int = Field(64, ge=0, validation_alias="HM_MIN_PID_HEADROOM")
    """Admission closes while fewer processes/threads than this may still be started (the
    cgroup's pids.max, else the kernel's limits): a job may use up to 16 (RLIMIT_NPROC)."""
    noop_operation: bool = Field(False, validation_alias="HM_NOOP_OPERATION")
    """Run ``noop`` jobs (benchmarks and tests only: :mod:`hypermedia.jobs.noop`); without it such a
    job fails at once with ``OPERATION_NOT_ENABLED``."""
    storage_handoff_socket: str = Field("", validation_alias="HM_STORAGE_HANDOFF_SOCKET")
    """The local store's hand-off socket (ADR 0045): originals arrive as a file descriptor copied
    by the kernel instead of over HTTP; empty, or unreachable, and they come over HTTP."""
    sandbox_uid_base: int = Field(61000, ge=1, le=2**31 - 1 - 64, validation_alias="HM_SANDBOX_UID_BASE")
    """When the worker runs as root, slot i's jobs run as uid ``base + i`` (no passwd entry
    needed), so ``RLIMIT_NPROC`` (counted per uid by the kernel) is per job, not shared."""
    sandbox_cgroup: str = Field("auto", validation_alias="HM_SANDBOX_CGROUP")
    """Per-job cgroups (memory limit with swap 0, pids.max, group OOM kill): ``auto`` (under the
    worker's own cgroup, where it is delegated), ``off`` (RLIMIT_AS only), or a cgroup path as
    /proc/self/cgroup spells it, nested under the worker's own. See docs/operations.md."""

    @field_validator("sandbox_cgroup")
    @classmethod
    def _cgroup_setting(cls, value: str) -> str:
        if (problem := cgroups.setting_problem(value)) is not None:
            raise ValueError(problem)
        return value

    sandbox_require: str = Field(layers.REQUIRE_FULL, validation_alias="HM_SANDBOX_REQUIRE")
    """Isolation layers the worker must be able to apply or it exits 78 at start: ``full`` (every
    layer but ``uid_switch``), ``best-effort`` (start with whatever holds; ``hypermedia up``'s
    default) or a comma list of :data:`hypermedia.sandbox.layers.LAYER_NAMES`."""

    @field_validator("sandbox_require")
    @classmethod
    def _known_layers(cls, value: str) -> str:
        layers.parse_require(value)
        return value.strip().lower()
