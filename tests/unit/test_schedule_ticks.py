"""A schedule's ticks and its missed-tick policy (hypermedia/jobs/schedules.py, ADR 0072): cron
read in a time zone through DST, the latest due ticks, and which run or are skipped."""

from __future__ import annotations

import datetime

import pytest

from hypermedia.core.errors import InvalidArgument
from hypermedia.jobs import schedules

UTC = datetime.UTC


def _t(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text).astimezone(UTC)


def test_next_tick_reads_the_cron_in_its_zone() -> None:
    after = _t("2026-12-06T10:00:00Z")
    assert schedules.next_tick("0 9 * * *", "Europe/Berlin", after) == _t("2026-12-07T08:00:00Z")
    assert schedules.next_tick("0 9 * * *", "UTC", after) == _t("2026-12-07T09:00:00Z")
    assert schedules.next_tick("*/15 * * * *", "UTC", after) == _t("2026-12-06T10:15:00Z")
    assert schedules.next_tick("@hourly", "UTC", after) == _t("2026-12-06T11:00:00Z")


def test_dst_gap_runs_once_after_it_and_the_repeated_hour_runs_at_both_instants() -> None:
    # Berlin, 29 March 2026: 02:00 → 03:00; 25 October 2026: 03:00 → 02:00.
    spring = schedules.next_tick("30 2 * * *", "Europe/Berlin", _t("2026-03-28T12:00:00Z"))
    assert spring == _t("2026-03-29T03:00:00+02:00")
    autumn = schedules.due_ticks(
        "0 * * * *", "Europe/Berlin", _t("2026-10-24T23:30:00Z"), _t("2026-10-25T02:30:00Z"), 10
    )
    assert autumn == [  # 01:30+02:00 to 03:30+01:00
        _t("2026-10-25T02:00:00+02:00"),
        _t("2026-10-25T02:00:00+01:00"),
        _t("2026-10-25T03:00:00+01:00"),
    ]
    assert [t.hour for t in autumn] == [0, 1, 2]  # an hour apart in UTC


def test_due_ticks_are_the_latest_up_to_now_inclusive() -> None:
    since, now = _t("2026-12-06T10:00:00Z"), _t("2026-12-06T10:05:00Z")
    every_minute = schedules.due_ticks("* * * * *", "UTC", since, now, 100)
    assert every_minute == [_t(f"2026-12-06T10:0{m}:00Z") for m in range(6)]
    assert schedules.due_ticks("* * * * *", "UTC", since, now, 2) == every_minute[-2:]
    year = schedules.due_ticks("* * * * *", "UTC", _t("2025-12-06T10:00:00Z"), now, 3)
    assert year == every_minute[-3:]  # walked back from now: three steps, not a year's
    assert schedules.due_ticks("0 0 1 1 *", "UTC", since, now, 10) == []


def test_an_on_time_tick_runs_under_either_policy() -> None:
    now = _t("2026-12-06T10:00:30Z")
    ticks = [_t("2026-12-06T10:00:00Z")]
    assert schedules.plan(ticks, now, "skip", 1) == (ticks, [])
    assert schedules.plan(ticks, now, "catch_up", 3) == (ticks, [])


def test_missed_ticks_are_skipped_or_the_latest_caught_up() -> None:
    ticks = [_t(f"2026-12-06T10:0{m}:00Z") for m in range(5)]
    now = _t("2026-12-06T10:04:10Z")  # the last tick is on time, the four before it missed
    assert schedules.plan(ticks, now, "skip", 3) == (ticks[4:], ticks[:4])
    assert schedules.plan(ticks, now, "catch_up", 2) == (ticks[2:], ticks[:2])
    assert schedules.plan(ticks, now, "catch_up", 100) == (ticks, [])
    assert schedules.plan(ticks, now, "catch_up", 5) == (ticks, [])  # a limit just above the missed
    assert schedules.plan(ticks, now, "catch_up", 4) == (ticks, [])
    assert schedules.plan(ticks, now, "catch_up", 3) == (ticks[1:], ticks[:1])


def test_skipped_ticks_recorded_are_bounded() -> None:
    start = _t("2026-11-01T00:00:00Z")
    ticks = [start + datetime.timedelta(minutes=m) for m in range(500)]
    to_run, skipped = schedules.plan(ticks, ticks[-1] + datetime.timedelta(hours=1), "skip", 1)
    assert to_run == [] and skipped == ticks[-schedules.MAX_RECORDED_SKIPS :]


@pytest.mark.parametrize(
    ("cron", "zone", "code"),
    [
        ("* * * *", "UTC", "INVALID_CRON"),
        ("* * * * * *", "UTC", "INVALID_CRON"),  # seconds: minute resolution only
        ("61 * * * *", "UTC", "INVALID_CRON"),
        ("0 0 30 2 *", "UTC", "INVALID_CRON"),  # 30 February
        ("@reboot", "UTC", "INVALID_CRON"),
        ("every day", "UTC", "INVALID_CRON"),
        ("0 9 * * *", "Mars/Olympus", "INVALID_TIME_ZONE"),
        ("0 9 * * *", "../../etc/passwd", "INVALID_TIME_ZONE"),
        ("0 9 * * *", "", "INVALID_TIME_ZONE"),
        ("0 9 * * *", "localtime", "INVALID_TIME_ZONE"),  # the host's, whatever it is
        ("0 9 * * *", "posixrules", "INVALID_TIME_ZONE"),
        ("0 9 * * *", "right/UTC", "INVALID_TIME_ZONE"),
        ("0 9 * * *", "Factory", "INVALID_TIME_ZONE"),
        ("R * * * *", "UTC", "INVALID_CRON"),  # croniter's random minute: a new one at each reading
    ],
)
def test_bad_cron_and_zones_are_refused(cron: str, zone: str, code: str) -> None:
    with pytest.raises(InvalidArgument) as refused:
        schedules.check_cron(cron, zone)
    assert refused.value.error_code == code


def test_good_cron_passes() -> None:
    for cron in ("*/5 * * * *", "0 9 * * 1-5", "@daily", "0 3 1 * *", " @daily ", "0 0 * * MON-FRI"):
        schedules.check_cron(cron, "Europe/Berlin")
