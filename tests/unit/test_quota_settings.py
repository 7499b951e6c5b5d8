"""The credits service's quota defaults (HM_QUOTA_*) are bounded where the bucket's maths holds:
a rate of 0 (no limit) or 0.001 to 1,000,000 requests a second; no infinity, no denormal."""

from __future__ import annotations

import pytest

from hypermedia.core import config
from services.credits.settings import CreditsSettings


@pytest.mark.parametrize("rate", ["1e-300", "5e-324", "0.0005", "inf", "nan", "-1", "1e7"])
def test_a_rate_outside_its_bounds_is_a_configuration_error(
    monkeypatch: pytest.MonkeyPatch, rate: str
) -> None:
    monkeypatch.setenv("HM_QUOTA_RATE_PER_SECOND", rate)
    with pytest.raises(config.ConfigError, match="HM_QUOTA_RATE_PER_SECOND"):
        config.load(CreditsSettings)


@pytest.mark.parametrize(("rate", "expected"), [("0", 0.0), ("0.001", 0.001), ("50", 50.0), ("1000000", 1e6)])
def test_a_rate_inside_its_bounds_is_taken(
    monkeypatch: pytest.MonkeyPatch, rate: str, expected: float
) -> None:
    monkeypatch.setenv("HM_QUOTA_RATE_PER_SECOND", rate)
    assert config.load(CreditsSettings).quota_defaults().rate_per_second == expected


@pytest.mark.parametrize(
    ("name", "value"), [("HM_QUOTA_BURST", "0"), ("HM_QUOTA_MAX_QUEUED_JOBS", "10000001")]
)
def test_bursts_and_waiting_jobs_are_bounded(monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(config.ConfigError, match=name):
        config.load(CreditsSettings)
