"""The credits service's settings."""

from __future__ import annotations

from pydantic import Field, field_validator

from hypermedia.core.config import ComponentSettings
from hypermedia.jobs.quotas import (
    DEFAULTS,
    MAX_BURST,
    MAX_QUEUED_JOBS,
    MAX_RATE,
    MIN_RATE,
    QuotaDefaults,
)


class CreditsSettings(ComponentSettings):
    grpc_bind: str = Field("127.0.0.1:50061", validation_alias="HM_CREDITS_BIND")
    quota_max_queued_jobs: int = Field(
        DEFAULTS.max_queued_jobs, ge=0, le=MAX_QUEUED_JOBS, validation_alias="HM_QUOTA_MAX_QUEUED_JOBS"
    )
    """Jobs an account may have queued or waiting for a retry at once, unless its quota says
    otherwise (hypermedia/jobs/quotas.py)."""
    quota_rate_per_second: float = Field(
        DEFAULTS.rate_per_second, ge=0, le=MAX_RATE, validation_alias="HM_QUOTA_RATE_PER_SECOND"
    )
    """Job-creating requests an account may make a second, on average: 0 (no limit) or 0.001 to
    1,000,000."""
    quota_burst: int = Field(DEFAULTS.burst, ge=1, le=MAX_BURST, validation_alias="HM_QUOTA_BURST")
    """Job-creating requests an account may make at once after a pause (the token bucket's size)."""

    @field_validator("quota_rate_per_second")
    @classmethod
    def _rate(cls, value: float) -> float:
        if value and value < MIN_RATE:
            raise ValueError(f"must be 0 (no limit) or {MIN_RATE:g} to {MAX_RATE:g}")
        return value

    def quota_defaults(self) -> QuotaDefaults:
        return QuotaDefaults(self.quota_max_queued_jobs, self.quota_rate_per_second, self.quota_burst)
