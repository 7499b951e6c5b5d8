"""A process request's schedule (``not_before``, ``delay_seconds``; ADR 0071): when its jobs
become due, and every refusal with its code."""

from __future__ import annotations

import datetime
import math

import pytest

from hypermedia.core.errors import InvalidArgument
from services.gateway.process_request import MAX_DELAY, check_schedule

NOW = datetime.datetime(2026, 12, 6, 10, 0, tzinfo=datetime.UTC)


def test_no_schedule_queues_at_once() -> None:
    assert check_schedule(None, None, NOW) is None


def test_not_before_in_any_offset_is_the_same_instant() -> None:
    due = check_schedule("2026-12-06T12:30:00+01:00", None, NOW)
    assert due == datetime.datetime(2026, 12, 6, 11, 30, tzinfo=datetime.UTC)
    assert check_schedule("2026-12-06T11:30:00Z", None, NOW) == due
    aware = datetime.datetime(2026, 12, 7, tzinfo=datetime.UTC)
    assert check_schedule(aware, None, NOW) == aware


def test_lowercase_letters_any_offset_and_nanoseconds_are_one_instant_in_utc() -> None:
    due = check_schedule("2026-12-06t12:30:00.5+01:00", None, NOW)
    assert due == datetime.datetime(2026, 12, 6, 11, 30, 0, 500000, tzinfo=datetime.UTC)
    assert due is not None and due.utcoffset() == datetime.timedelta(0)
    assert check_schedule("2026-12-06T11:30:00.5z", None, NOW) == due
    # Nanoseconds past a microsecond round up: never before the time given.
    assert check_schedule("2026-12-06T11:30:00.500000001Z", None, NOW) == due + datetime.timedelta(
        microseconds=1
    )
    assert check_schedule("2026-12-06T11:30:00.500000000Z", None, NOW) == due


def test_delay_seconds_counts_from_now() -> None:
    assert check_schedule(None, 90, NOW) == NOW + datetime.timedelta(seconds=90)
    assert check_schedule(None, 0.25, NOW) == NOW + datetime.timedelta(seconds=0.25)


@pytest.mark.parametrize(
    "past", ["2026-12-06T09:59:59Z", "2000-01-01T00:00:00Z", "0001-01-01T00:00:00+01:00"]
)
def test_a_time_not_in_the_future_runs_now(past: str) -> None:
    assert check_schedule(past, None, NOW) is None
    assert check_schedule(None, 0, NOW) is None


def test_the_horizon_is_thirty_days_and_inclusive() -> None:
    assert check_schedule(None, MAX_DELAY.total_seconds(), NOW) == NOW + MAX_DELAY
    assert check_schedule((NOW + MAX_DELAY).isoformat(), None, NOW) == NOW + MAX_DELAY


@pytest.mark.parametrize(
    ("not_before", "delay", "message"),
    [
        ("2026-12-24T18:00:00Z", 5, "not both"),
        ("tomorrow", None, "RFC 3339"),
        ("2026-13-01T00:00:00Z", None, "out of range"),
        ("2026-12-24T18:00:00", None, "RFC 3339 time with an offset"),
        ("2026-12-24", None, "RFC 3339"),
        ("2026-W50-1T18:00:00Z", None, "RFC 3339"),  # ISO 8601 week dates are not RFC 3339
        ("20261207T180000Z", None, "RFC 3339"),
        ("2026-12-07T18:00Z", None, "RFC 3339"),
        ("2026-12-07T18:00:00+0100", None, "RFC 3339"),
        ("2026-12-07T18:00:00.1234567890Z", None, "RFC 3339"),
        ("2026-12-06T23:59:60Z", None, "leap second"),
        ("2026-12-07T18:00:00+24:00", None, "out of range"),
        ("2027-01-05T10:00:01Z", None, "30 days"),
        ("9999-12-31T23:59:59-23:59", None, "30 days"),
        (None, -1, "≥ 0"),
        (None, math.inf, "finite"),
        (None, math.nan, "finite"),
        (None, MAX_DELAY.total_seconds() + 1, "30 days"),
        (None, 10**400, "finite"),
        (None, -(10**400), "finite"),
        (None, True, "number of seconds"),
        (None, "60", "number of seconds"),
    ],
)
def test_refusals_name_the_schedule(not_before: str | None, delay: object, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message) as refused:
        check_schedule(not_before, delay, NOW)  # type: ignore[arg-type]
    assert refused.value.error_code == "INVALID_SCHEDULE"
