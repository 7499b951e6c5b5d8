"""RFC 3339 times as a request gives them (a delayed job's ``not_before``, ADR 0071): parsed
strictly, to an aware UTC datetime, by the gateway and by the client CLI before it uploads."""

from __future__ import annotations

import datetime
import re

from hypermedia.core.errors import InvalidArgument

RFC3339 = re.compile(
    r"(?P<date>\d{4}-\d{2}-\d{2})[Tt](?P<time>\d{2}:\d{2}:\d{2})(?:\.(?P<fraction>\d{1,9}))?"
    r"(?P<offset>[Zz]|[+-]\d{2}:\d{2})"
)
"""An RFC 3339 ``date-time`` (section 5.6): a ``T`` (or ``t``), seconds, at most nine fraction
digits, ``Z`` (or ``z``) or a ``±hh:mm`` offset."""


def parse_rfc3339(text: str) -> datetime.datetime:
    """``text`` as an aware UTC datetime. A fraction past microseconds rounds up (a job must not
    start before the time it was given). Raises InvalidArgument (``INVALID_SCHEDULE``) for
    anything else, a leap second (``:60``, which Python's datetime cannot hold) included."""
    match = RFC3339.fullmatch(text)
    if match is None:
        raise InvalidArgument(
            "not_before must be an RFC 3339 time with an offset, such as 2026-12-24T18:00:00Z",
            "INVALID_SCHEDULE",
        )
    if match["time"].endswith(":60"):
        raise InvalidArgument("not_before may not be a leap second (:60)", "INVALID_SCHEDULE")
    fraction = match["fraction"] or ""
    offset = "+00:00" if match["offset"] in ("Z", "z") else match["offset"]
    try:
        parsed = datetime.datetime.fromisoformat(
            f"{match['date']}T{match['time']}{'.' + fraction[:6].ljust(6, '0') if fraction else ''}{offset}"
        )
    except ValueError:
        raise InvalidArgument(
            "not_before is not a valid time (its date, time or offset is out of range)", "INVALID_SCHEDULE"
        ) from None
    try:
        if fraction[6:].strip("0"):
            parsed += datetime.timedelta(microseconds=1)
        return parsed.astimezone(datetime.UTC)
    except OverflowError:  # within an offset of year 1 or of 9999: long past, or past the horizon
        edge = datetime.datetime.min if parsed.year == 1 else datetime.datetime.max
        return edge.replace(tzinfo=datetime.UTC)
