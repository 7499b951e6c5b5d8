"""The reaper's settings: its interval and thresholds, orphaned directories, webhook delivery."""

from __future__ import annotations

from pydantic import Field

from hypermedia.core.config import ComponentSettings


class ReaperSettings(ComponentSettings):
    interval_seconds: float = Field(5.0, gt=0, validation_alias="HM_REAPER_INTERVAL_SECONDS")
    scheduled_poll_seconds: float = Field(0.25, gt=0, le=1.0, validation_alias="HM_SCHEDULED_POLL_SECONDS")
    """How often the poller queues delayed jobs whose ``not_before`` passed (ADR 0071): a delayed
    job is queued at most this long after its time (one indexed read a poll)."""
    schedule_poll_seconds: float = Field(1.0, gt=0, le=60, validation_alias="HM_SCHEDULE_POLL_SECONDS")
    """How often the reaper records due schedule ticks and runs the pending maintenance runs
    (ADR 0072)."""
    requeue_stale_seconds: float = Field(60.0, gt=0, validation_alias="HM_REAPER_REQUEUE_STALE_SECONDS")
    """A job `queued` this long without being claimed is published again."""
    dead_worker_seconds: float = Field(120.0, gt=0, validation_alias="HM_REAPER_DEAD_WORKER_SECONDS")
    settle_grace_seconds: float = Field(60.0, gt=0, validation_alias="HM_REAPER_SETTLE_GRACE_SECONDS")
    """How long after a job ended a hold nobody settled waits before the reaper settles it."""
    work_dirs: str = Field("", validation_alias="HM_REAPER_WORK_DIRS")
    """Worker work directories on the reaper's machine (``:``-separated) whose orphaned job
    directories it removes; empty: none (each worker sweeps its own at start)."""
    orphan_dir_seconds: float = Field(300.0, gt=0, validation_alias="HM_REAPER_ORPHAN_DIR_SECONDS")
    """Age after which a job directory of a job that is not running is removed."""
    webhook_poll_seconds: float = Field(1.0, gt=0, validation_alias="HM_WEBHOOK_POLL_SECONDS")
    """How often the webhook dispatcher looks for due deliveries."""
    webhook_max_attempts: int = Field(8, ge=1, le=50, validation_alias="HM_WEBHOOK_MAX_ATTEMPTS")
    webhook_base_delay_seconds: float = Field(5.0, gt=0, validation_alias="HM_WEBHOOK_BASE_DELAY_SECONDS")
    """First retry delay of a webhook; doubles per attempt, capped at an hour."""
    retention_interval_seconds: float = Field(3600.0, gt=0, validation_alias="HM_RETENTION_INTERVAL_SECONDS")
    """How often the tables that grow with every job are pruned (:mod:`hypermedia.jobs.retention`)."""
    retain_job_events_days: float = Field(30.0, ge=0, validation_alias="HM_RETAIN_JOB_EVENTS_DAYS")
    """Days a job event is kept (0: for ever)."""
    retain_worker_metrics_days: float = Field(7.0, ge=0, validation_alias="HM_RETAIN_WORKER_METRICS_DAYS")
    """Days a worker metrics sample, and a stopped or dead worker's row, are kept (0: for ever)."""
    retain_webhook_deliveries_days: float = Field(
        30.0, ge=0, validation_alias="HM_RETAIN_WEBHOOK_DELIVERIES_DAYS"
    )
    """Days a delivered or failed webhook delivery is kept (0: for ever)."""
    webhook_allow_private: bool = Field(False, validation_alias="HM_WEBHOOK_ALLOW_PRIVATE")
    """Send webhooks to hosts that resolve to non-public addresses (loopback, private, link-local,
    cloud metadata). Off by default: such a delivery fails at once (``BlockedAddress``)."""
