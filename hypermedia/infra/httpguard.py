"""The connection limits one HTTP server's connections share (:class:`ConnectionGuard`): caps per
client address and per server with eviction of connections not serving a request, the health
reserve, the deadline arithmetic and the problem+json refusals (see :mod:`hypermedia.infra.httpserver`)."""

from __future__ import annotations

import ipaddress
import json
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterator
from http import HTTPStatus
from typing import TYPE_CHECKING, Literal

from hypermedia.core import metrics
from hypermedia.infra.httplimits import HttpSettings

if TYPE_CHECKING:
    from hypermedia.infra.httpprotocol import GuardedHttpProtocol

log = logging.getLogger(__name__)

DEFAULT_LIMITS = HttpSettings.model_construct()
"""The limits of :class:`~hypermedia.infra.httplimits.HttpSettings` at their defaults (no environment)."""

IPV6_CLIENT_PREFIX = 64
"""IPv6 clients are counted per /64: one host commonly holds a whole /64."""

SUMMARY_SECONDS = 60.0
"""Least time between two log warnings that count what the limits closed or refused."""

EVICTION_PEEKS = 16
"""Sockets of one eviction tier asked (``FIONREAD``) whether bytes wait unread, per eviction."""

STALL_SECONDS = 1.0
"""Least paused time over which a response's send rate is judged for eviction (shorter is noise)."""

RETRY_AFTER_SECONDS = 1
"""``Retry-After`` of a 429 or 503 connection refusal."""


def client_key(host: str) -> str:
    """The key a client address is counted under: an IPv4 address as it is (an IPv4-mapped IPv6
    address as its IPv4 address), an IPv6 address as its /64 (``2001:db8:1:2::/64``), anything
    else (a Unix socket's empty name) as given."""
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, IPV6_CLIENT_PREFIX), strict=False))
    return str(address)


def deadlines(seen: float, idle: float, started: float, count: int, rate: int) -> tuple[float, float]:
    """The two deadlines of a transfer, in loop seconds: ``(idle, rate)``. The idle one is ``idle``
    seconds after progress was last ``seen``; the rate one, as mod_reqtimeout's ``MinRate``,
    starts ``idle`` seconds (the grace) after the transfer's clock ``started`` (moved on by the
    time the wait was the server's) and moves on a second per ``rate`` bytes of the ``count``
    transferred. ``rate`` 0: no rate deadline (it equals the idle one)."""
    due = seen + idle
    return due, (started + idle + count / rate if rate else due)


def problem_response(
    status: int, detail: str, error_code: str, headers: dict[str, str] | None = None
) -> bytes:
    """A complete ``HTTP/1.1`` answer with an ``application/problem+json`` body (the shape of the
    apps' errors: type, title, status, detail, error_code) and ``Connection: close``, as bytes."""
    phrase = HTTPStatus(status).phrase
    body = json.dumps(
        {
            "type": "about:blank",
            "title": phrase,
            "status": status,
            "detail": detail,
            "error_code": error_code,
        },
        separators=(",", ":"),
    ).encode()
    lines = [
        f"HTTP/1.1 {status} {phrase}",
        "content-type: application/problem+json",
        f"content-length: {len(body)}",
        "connection: close",
        *(f"{name}: {value}" for name, value in (headers or {}).items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("ascii") + body


class _Refused(Exception):
    """Raised inside an httptools callback to stop parsing a request that breaks a head limit;
    the answer is in :attr:`GuardedHttpProtocol._refusal`."""


_State = Literal["waiting", "active", "lingering"]


class ConnectionGuard:
    """Bookkeeping of one server's connections, shared by their protocols (one event loop, no locks).

    A connection is *waiting* while no request of it is being served: from its connect, or from
    the end of a response, until a complete request head; *active* while a request is served;
    *lingering* after its answer while what the client still sends is discarded. When a cap is
    reached, the connection evicted is, in this order: the longest-lingering one; the
    longest-waiting one that has never had a request served and has no unread bytes in its
    socket; the longest-waiting one idle after a served request (a real client's keep-alive
    connection) without unread bytes; then any waiting one, longest-waiting first. Unread bytes
    mean a head has arrived that the server has not read yet (a burst of connects is admitted
    before any of them is read), so a real client's fresh connection is spared while silent
    ones are there. An active connection is evicted only when none of those is left and its
    response is stalled on a slow reader: writing paused, and the client has taken less than
    ``send_min_bytes_per_second`` for the time since its write buffer first filled (at least a
    second of it), longest-stalled first. Other active connections are never evicted.

    Args:
        limits: the caps and deadlines (:class:`~hypermedia.infra.httplimits.HttpSettings`).
        reserve_paths: request paths (``/healthz``) that a connection admitted over the cap, into
            the reserve of ``limits.reserve_connections``, may ask for with ``GET`` or ``HEAD``;
            empty: no reserve.
    """

    def __init__(self, limits: HttpSettings, reserve_paths: frozenset[str] = frozenset()) -> None:
        self.limits = limits
        self.reserve_paths = reserve_paths
        self.open: set[GuardedHttpProtocol] = set()
        self.reserved: set[GuardedHttpProtocol] = set()
        """Connections admitted over the server cap for a health path (also in :attr:`open`)."""
        self._by_client: dict[str, dict[GuardedHttpProtocol, None]] = {}
        # Eviction tiers, each in the order its connections entered it (oldest first).
        self._lingering: dict[GuardedHttpProtocol, None] = {}
        self._fresh: dict[GuardedHttpProtocol, None] = {}  # waiting, never served a request
        self._idle: dict[GuardedHttpProtocol, None] = {}  # waiting after a served request
        self._stalled: dict[GuardedHttpProtocol, None] = {}  # writing paused: the client is slow
        self.closed: Counter[str] = Counter()
        """Connections the limits closed or refused since the start, by reason: ``evicted``,
        ``too_many_per_address`` (429), ``server_busy`` (503), ``head_timeout``, ``body_idle``,
        ``body_slow`` (below ``body_min_bytes_per_second``), ``send_idle``, ``send_slow`` (below
        ``send_min_bytes_per_second``), ``head_too_large`` (431/414), ``malformed`` (400)."""
        self._reported: Counter[str] = Counter()
        self._reported_at = -SUMMARY_SECONDS

    def note(self, reason: str) -> None:
        """Count a connection closed or refused for ``reason`` (see :attr:`closed`); logs a warning
        with the counts since the last one at the first such event and then at most once every
        :data:`SUMMARY_SECONDS`, so a flood is visible in the log without a line per connection;
        counted in :data:`~hypermedia.core.metrics.HTTP_CONNECTIONS_CLOSED` too."""
        self.closed[reason] += 1
        metrics.HTTP_CONNECTIONS_CLOSED.labels(reason).inc()
        now = time.monotonic()
        if now - self._reported_at >= SUMMARY_SECONDS:
            since = self.closed - self._reported
            log.warning(
                "HTTP connection limits closed or refused %s since %.0f s ago; %d connections open",
                dict(since),
                min(now - self._reported_at, SUMMARY_SECONDS),
                len(self.open),
            )
            self._reported = self.closed.copy()
            self._reported_at = now

    def admit(self, conn: GuardedHttpProtocol) -> bytes | None:
        """Count a new connection in, evicting a waiting one when a cap is reached. Returns
        ``None`` when admitted, else the answer to write before closing it (429 when its address
        has ``max_connections_per_address`` connections all serving requests, 503 when the server
        has ``max_connections`` all serving requests and its reserve for health paths is full or
        absent). A connection admitted into the reserve has ``reserved`` set."""
        per_client = self.limits.max_connections_per_address
        same = self._by_client.get(conn.client_key, {})
        if per_client and len(same) >= per_client:
            if not self._evict(lambda tier: (c for c in same if c in tier)):  # ≤ per_client each
                detail = f"more than {per_client} connections from one address are serving requests"
                return self._refuse(429, detail, "TOO_MANY_CONNECTIONS")
        if len(self.open) - len(self.reserved) >= self.limits.max_connections and not self._evict(
            lambda tier: iter(tier)
        ):
            if not self.reserve_paths or len(self.reserved) >= self.limits.reserve_connections:
                detail = f"all {self.limits.max_connections} connections are serving requests"
                return self._refuse(503, detail, "SERVER_BUSY")
            conn.reserved = True  # outside every eviction tier; one health request, then closed
            self.reserved.add(conn)
        self.open.add(conn)
        self._by_client.setdefault(conn.client_key, {})[conn] = None
        self.set_state(conn, "waiting")
        return None

    def _refuse(self, status: int, detail: str, error_code: str) -> bytes:
        self.note("too_many_per_address" if status == 429 else "server_busy")
        return problem_response(status, detail, error_code, {"retry-after": str(RETRY_AFTER_SECONDS)})

    def _evict(
        self, among: Callable[[dict[GuardedHttpProtocol, None]], Iterator[GuardedHttpProtocol]]
    ) -> bool:
        """Close the first connection of the eviction order (see the class) that ``among`` yields
        from a tier; whether there was one. At most :data:`EVICTION_PEEKS` sockets of each tier
        are asked for unread bytes."""
        victim = next(among(self._lingering), None)
        if victim is None:
            for tier in (self._fresh, self._idle):
                for _, candidate in zip(range(EVICTION_PEEKS), among(tier), strict=False):
                    if not candidate.has_unread_input():
                        victim = candidate
                        break
                if victim is not None:
                    break
        if victim is None:
            victim = next(among(self._fresh), None) or next(among(self._idle), None)
        if victim is None:
            now = time.monotonic()
            stalled = zip(range(EVICTION_PEEKS), among(self._stalled), strict=False)
            victim = next((c for _, c in stalled if c.below_send_rate(now)), None)
        if victim is None:
            return False
        self.note("evicted")
        self.release(victim)
        victim.evict()
        return True

    def stalled(self, conn: GuardedHttpProtocol, paused: bool) -> None:
        """Note that ``conn``'s writing paused (the client takes its response slower than it is
        made) or resumed: a connection paused while under ``send_min_bytes_per_second`` may be
        evicted at a cap, after every waiting one."""
        self._stalled.pop(conn, None)
        if paused and conn in self.open and not conn.reserved:
            self._stalled[conn] = None

    def set_state(self, conn: GuardedHttpProtocol, state: _State) -> None:
        """Move an admitted connection to ``state``; a connection entering waiting or lingering
        goes to the back of its tier."""
        if conn not in self.open or conn.reserved:
            return
        for tier in (self._lingering, self._fresh, self._idle):
            tier.pop(conn, None)
        if state == "lingering":
            self._lingering[conn] = None
        elif state == "waiting":
            (self._idle if conn.served else self._fresh)[conn] = None

    def release(self, conn: GuardedHttpProtocol) -> None:
        """Count a connection out (idempotent)."""
        if conn in self.open:
            self.set_state(conn, "active")  # out of every tier
            self._stalled.pop(conn, None)
            self.open.discard(conn)
            self.reserved.discard(conn)
            same = self._by_client[conn.client_key]
            del same[conn]
            if not same:
                del self._by_client[conn.client_key]
