"""A process request as the transports hand it over (``POST /v1/hypermedia/process``, gRPC
``Process``): its operations (:func:`parse_operations`) and the checks that need nothing but the
request itself — the bounds of its strings, its priority, its webhook URL. What needs the object,
the profiles or the credits is :mod:`services.gateway.creation`'s."""

from __future__ import annotations

import datetime
import math
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

from hypermedia.core import pgtext
from hypermedia.core.errors import InvalidArgument
from hypermedia.core.rfc3339 import parse_rfc3339
from hypermedia.jobs import queues
from hypermedia.jobs.webhooks import literal_private_host

DEFAULT_PRIORITY = 5
"""The priority of a request that gives none (1 is the highest, 10 the lowest)."""
DEFAULT_BULK_PRIORITY = 8
"""The priority of a bulk request that gives none (seed 000's example of a bulk regeneration)."""


@dataclass(frozen=True)
class OperationRequest:
    """One operation as a client asked for it, before validation."""

    name: str
    """The operation's name (a ``processing_profiles.operation``, once checked); empty for a preset."""
    params: dict[str, Any]
    """Its params as sent (JSON object)."""
    preset: str = ""
    """The name of the caller's preset that stands for the operation and its params
    (:mod:`hypermedia.jobs.presets`), or empty."""


SHAPES = "an operation is a name, {name, params} or {preset}"


def parse_operations(raw: Any) -> list[OperationRequest]:
    """``operations`` of a request: names, ``{name, params}`` objects or ``{preset}`` objects.
    Raises InvalidArgument: ``UNKNOWN_PRESET`` for a preset named ``""``, ``INVALID_REQUEST`` for
    an empty list or anything else."""
    if not isinstance(raw, list) or not raw:
        raise InvalidArgument("operations must be a non-empty list", "INVALID_REQUEST")
    parsed = []
    for item in raw:
        if isinstance(item, str):
            parsed.append(OperationRequest(item, {}))
        elif isinstance(item, dict) and isinstance(item.get("name"), str):
            params = item.get("params") or {}
            if not isinstance(params, dict) or set(item) - {"name", "params"}:
                raise InvalidArgument(SHAPES, "INVALID_REQUEST")
            parsed.append(OperationRequest(item["name"], params))
        elif isinstance(item, dict) and set(item) == {"preset"} and isinstance(item["preset"], str):
            if not item["preset"]:  # else taken for an operation without a name
                raise InvalidArgument("unknown preset '': a preset is named", "UNKNOWN_PRESET")
            parsed.append(OperationRequest("", {}, item["preset"]))
        else:
            raise InvalidArgument(SHAPES, "INVALID_REQUEST")
    return parsed


def check_priority(priority: int | None, *, bulk: bool = False) -> int:
    """The request's priority, :data:`DEFAULT_PRIORITY` (:data:`DEFAULT_BULK_PRIORITY` for a bulk
    request) when None. Raises InvalidArgument (``INVALID_PRIORITY``) for anything but an integer
    from 1 to 10 (a bool is not one), or, for a bulk request, from 7 to 10 (the bulk queue's
    bands: :data:`hypermedia.jobs.queues.BULK_PRIORITIES`)."""
    default = DEFAULT_BULK_PRIORITY if bulk else DEFAULT_PRIORITY
    priority = default if priority is None else priority
    if not isinstance(priority, int) or isinstance(priority, bool) or priority not in queues.PRIORITIES:
        raise InvalidArgument("priority must be an integer from 1 (highest) to 10", "INVALID_PRIORITY")
    if bulk and priority not in queues.BULK_PRIORITIES:
        raise InvalidArgument(
            "a bulk request's priority must be 7 to 10 (the bulk queue's background bands)",
            "INVALID_PRIORITY",
        )
    return priority


def check_queue(queue: str | None) -> bool:
    """Whether the request goes to the bulk queue: ``queue`` is ``"bulk"``; None or empty means
    each operation's own queue (its profile's). Raises InvalidArgument (``INVALID_QUEUE``) for
    anything else: the other queues are the operations' to choose, not the caller's."""
    if queue is None or queue == "":
        return False
    if queue != queues.BULK:
        raise InvalidArgument(
            'queue must be "bulk" or left out (each operation then goes to its own queue)', "INVALID_QUEUE"
        )
    return True


MAX_DELAY = datetime.timedelta(days=30)
"""The horizon of a delayed request (ADR 0071): ``not_before`` at most 30 days ahead. Its credits
stay held while it waits, so the horizon bounds how long an account can park them; a longer wait
belongs to a schedule, which holds nothing until its run."""


def check_schedule(
    not_before: str | datetime.datetime | None, delay_seconds: float | None, now: datetime.datetime
) -> datetime.datetime | None:
    """When the request's jobs become due, in UTC: ``not_before`` (an RFC 3339 string with an
    offset, such as ``2026-12-24T18:00:00Z``: :func:`parse_rfc3339`, or an aware datetime) or
    ``now + delay_seconds`` (finite, ≥ 0). None when neither is given or the time is not after
    ``now`` (the jobs are queued at once). Raises InvalidArgument (``INVALID_SCHEDULE``) for both
    given, a string that is not such a time, a time without an offset, a bad delay, or a time more
    than :data:`MAX_DELAY` after ``now``."""
    if not_before is not None and delay_seconds is not None:
        raise InvalidArgument("give not_before or delay_seconds, not both", "INVALID_SCHEDULE")
    if delay_seconds is not None:
        if isinstance(delay_seconds, bool) or not isinstance(delay_seconds, int | float):
            raise InvalidArgument("delay_seconds must be a number of seconds", "INVALID_SCHEDULE")
        try:
            seconds = float(delay_seconds)
        except OverflowError:  # an integer beyond any float
            seconds = math.inf if delay_seconds > 0 else -math.inf
        if not math.isfinite(seconds) or seconds < 0:
            raise InvalidArgument("delay_seconds must be a finite number ≥ 0", "INVALID_SCHEDULE")
        if seconds > MAX_DELAY.total_seconds():
            raise InvalidArgument(_BEYOND_HORIZON, "INVALID_SCHEDULE")
        due = now + datetime.timedelta(seconds=seconds)
    elif isinstance(not_before, str):
        due = parse_rfc3339(not_before)
    elif not_before is None:
        return None
    else:
        due = not_before
    if due.tzinfo is None or due.utcoffset() is None:
        raise InvalidArgument("not_before must carry a time zone offset (Z or +hh:mm)", "INVALID_SCHEDULE")
    if due - now > MAX_DELAY:
        raise InvalidArgument(_BEYOND_HORIZON, "INVALID_SCHEDULE")
    return due.astimezone(datetime.UTC) if due > now else None


_BEYOND_HORIZON = f"a request may be delayed by at most {MAX_DELAY.days} days"


MAX_WEBHOOK_URL_LENGTH = 2048
"""Longest ``webhook_url`` (characters)."""


def check_webhook_url(url: str, *, allow_private: bool = False) -> None:
    """Raises InvalidArgument (INVALID_WEBHOOK_URL) unless ``url`` is an absolute http(s) URL of at
    most 2048 characters with a host, a valid port and no whitespace or control characters, and,
    unless ``allow_private``, a host that is not a non-public IP literal or ``localhost``
    (:func:`hypermedia.jobs.webhooks.literal_private_host`; names are resolved and checked when the
    reaper sends)."""
    if len(url) > MAX_WEBHOOK_URL_LENGTH:
        raise InvalidArgument(
            f"webhook_url may be at most {MAX_WEBHOOK_URL_LENGTH} characters", "INVALID_WEBHOOK_URL"
        )
    if any(ch <= " " or ch == "\x7f" for ch in url):
        raise InvalidArgument(
            "webhook_url must not contain spaces or control characters", "INVALID_WEBHOOK_URL"
        )
    try:
        parts = urlsplit(url)
        _ = parts.port  # raises ValueError for a port that is not a number in 0..65535
    except ValueError:
        raise InvalidArgument("webhook_url is not a valid URL", "INVALID_WEBHOOK_URL") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidArgument("webhook_url must be an http(s) URL", "INVALID_WEBHOOK_URL")
    try:
        host = httpx.URL(url).host  # as the reaper's client reads it (IDNA, full-width dots)
    except (httpx.InvalidURL, UnicodeError):  # UnicodeEncodeError: a lone surrogate
        raise InvalidArgument("webhook_url is not a valid URL", "INVALID_WEBHOOK_URL") from None
    if not allow_private and literal_private_host(host):
        raise InvalidArgument(
            "webhook_url must point to a public address, not a loopback, private or link-local one",
            "INVALID_WEBHOOK_URL",
        )


def check_text(operations: list[OperationRequest], idempotency_key: str | None) -> None:
    """The bounds of a process request's strings under :mod:`hypermedia.core.pgtext`'s rule, for REST
    and gRPC alike: an operation name of at most :data:`~hypermedia.core.pgtext.MAX_OPERATION_NAME_LENGTH`
    characters, params of at most :data:`~hypermedia.core.pgtext.MAX_PARAMS_BYTES` bytes of JSON, a
    key of at most :data:`~hypermedia.core.pgtext.MAX_IDEMPOTENCY_KEY_LENGTH` characters and without
    NUL (a header: no body check sees it; the webhook URL's 2048 is :func:`check_webhook_url`'s).
    NUL and lone surrogates in the body were refused where it entered, once: the REST body
    validator, the gRPC interceptor. Raises InvalidText naming the field."""
    pgtext.check(idempotency_key, "idempotency_key", pgtext.MAX_IDEMPOTENCY_KEY_LENGTH)
    for i, op in enumerate(operations):
        pgtext.check(op.name, f"operations[{i}].name", pgtext.MAX_OPERATION_NAME_LENGTH)
        pgtext.check(op.preset, f"operations[{i}].preset", pgtext.MAX_OPERATION_NAME_LENGTH)
        if pgtext.json_size(op.params) > pgtext.MAX_PARAMS_BYTES:
            raise pgtext.InvalidText(
                f"operations[{i}].params", f"may be at most {pgtext.MAX_PARAMS_BYTES} bytes of JSON"
            )
