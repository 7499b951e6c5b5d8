"""An HTTP server (uvicorn) run inside a service's own event loop, with bounds on what one
connection may hold.

The service owns signal handling (SIGTERM starts its ordered shutdown), so uvicorn's own signal
capture is switched off; the socket is bound at construction so a bind error surfaces as OSError
there and port 0 is known before the app is built.

uvicorn bounds none of this by itself: it starts no timer before a connection's first byte, has
no limit on a request head's size or header count with httptools, and its ``limit_concurrency``
answers 503 to every request once that many connections are open, so a few hundred connections
that send nothing took the gateway and the storage service down (issue 14).
:class:`GuardedHttpProtocol`, uvicorn's httptools protocol with a :class:`ConnectionGuard` shared by
the connections of one server, adds the limits of :class:`~hypermedia.infra.httplimits.HttpSettings`
(ADR 0028):

- a deadline for each request head (from the connect, or from the end of the previous response),
  an idle deadline between body pieces while the app reads and a minimum average body rate (as
  Apache's mod_reqtimeout ``MinRate``), and for a response the client keeps the server waiting
  on, an idle deadline and a minimum average rate at which it must take it;
- a cap on open connections per client address and per server, where a new connection is
  admitted and evicts a connection that is not serving a request (lingering, then silent and
  never served, then idle after a served request; oldest first) instead of being refused, so a
  flood of idle connections only replaces itself and cannot keep real requests out; when every
  connection is serving, a small reserve over the cap answers the server's health paths;
- bounds on the request head (bytes, header fields, request target): ``431`` / ``414``;
- a lingering close after an answer sent before the request was read, so the answer is read by the
  client instead of being destroyed by the reset a close with unread input sends.

Refusals written by the protocol itself are ``application/problem+json`` like the apps' errors.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import ipaddress
import json
import logging
import resource
import socket
import struct
import termios
import time
from collections import Counter
from collections.abc import Callable, Iterator
from http import HTTPStatus
from typing import Any, Literal

import httptools
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from hypermedia.infra.httplimits import HttpSettings

log = logging.getLogger(__name__)

DEFAULT_LIMITS = HttpSettings.model_construct()
"""The limits of :class:`~hypermedia.infra.httplimits.HttpSettings` at their defaults (no environment)."""

FD_HEADROOM = 256
"""File descriptors kept for everything but HTTP connections (database pool, gRPC, NATS, files):
the soft ``RLIMIT_NOFILE`` is raised, up to the hard limit, to ``max_connections`` plus this."""

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
        :data:`SUMMARY_SECONDS`, so a flood is visible in the log without a line per connection."""
        self.closed[reason] += 1
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


class GuardedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol under the limits of a :class:`ConnectionGuard`. uvicorn makes
    one per connection; :func:`guarded_protocol` binds the guard of a server."""

    guard: ConnectionGuard

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limits = self.guard.limits
        self.client_key = ""
        self.state: _State = "waiting"
        self.served = 0  # responses completed on this connection
        self.reserved = False  # admitted over the cap for a health path (ConnectionGuard.admit)
        self._refusal: bytes | None = None
        self._refusal_reason = ""  # ConnectionGuard.closed's reason of _refusal
        self._in_head = True  # the parser is between messages or inside a request head
        self._head_bytes = 0  # bytes received since the last message ended, while _in_head
        self._head_fields = 0  # header fields of the request head being parsed
        self._head_size = 0  # request target + header names and values of that head
        self._target_size = 0
        self._head_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._body_seen = 0.0  # loop time a body piece last arrived
        self._body_started = 0.0  # loop time the body's rate clock started
        self._body_received = 0  # bytes of the body received
        self._body_credit = 0.0  # seconds the server, not the client, was the one waiting
        self._body_checked = 0.0  # loop time of the last check of the body's deadlines
        self._send_timer: asyncio.TimerHandle | None = None
        self._send_started: float | None = None  # loop time the send-rate clock started
        self._send_credit = 0.0  # seconds writing was not paused since then
        self._send_seen = 0.0  # loop time the client was last seen taking bytes (or writing paused)
        self._send_resumed = 0.0  # loop time writing last resumed
        self._send_acked = 0  # bytes the client took while writing was paused, since the start
        self._send_pending = 0  # bytes not yet acknowledged at the last look (buffer + socket)
        self._linger_timer: asyncio.TimerHandle | None = None

    # Connection

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.client_key = client_key(self.client[0]) if self.client else ""
        refusal = self.guard.admit(self)
        if refusal is not None:
            # Nothing read yet: a plain close sends the answer and a FIN, and holds no descriptor.
            self.state = "lingering"
            self.transport.write(refusal)
            self.transport.close()
            return
        self._wait_for_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self.guard.release(self)
        for timer in (self._head_timer, self._body_timer, self._send_timer, self._linger_timer):
            if timer is not None:
                timer.cancel()
        super().connection_lost(exc)

    def has_unread_input(self) -> bool:
        """Whether bytes the client sent wait in the socket, not read yet (``FIONREAD``)."""
        sock = self.transport.get_extra_info("socket")
        if sock is None:
            return False
        try:
            pending: int = struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0]
        except OSError:
            return False
        return pending > 0

    def evict(self) -> None:
        """Close this connection to make room (called by the guard, which has counted it out)."""
        if self.state == "lingering":
            self.transport.abort()  # its answer is out; what it still sends is not wanted
        elif self.flow.write_paused:
            self.reset()  # a response stalled on a slow reader: a close would wait for it
        else:
            self.transport.close()

    def shutdown(self) -> None:
        """The server stops: close a connection that waits for a head or lingers at once, let an
        active one finish its response."""
        if self.state == "active":
            super().shutdown()
        else:
            self.transport.close()

    def _wait_for_head(self) -> None:
        self.state = "waiting"
        self.guard.set_state(self, "waiting")
        self._head_timer = self.loop.call_later(self.limits.head_timeout_seconds, self._head_timed_out)

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.state != "waiting" or self.transport.is_closing():
            return
        self.guard.note("head_timeout")
        if self._head_bytes == 0:
            self.transport.close()  # an idle connection: nothing to answer
            return
        seconds = self.limits.head_timeout_seconds
        self._answer_and_linger(
            problem_response(408, f"the request head did not arrive within {seconds:g} s", "REQUEST_TIMEOUT")
        )

    def _answer_and_linger(self, answer: bytes) -> None:
        """Write ``answer`` and close the connection without losing it: a FIN after it, then what
        the client still sends is read and discarded until it closes its side or
        ``linger_seconds`` pass (a close with unread input sends a reset, which can destroy the
        answer before the client reads it). A response in progress cannot be followed by another
        one: then the connection is only aborted."""
        if self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True  # the app's further writes are dropped
            self.cycle.message_event.set()
            if self.cycle.response_started:
                self.transport.abort()
                return
        self.transport.write(answer)
        self._linger()

    def _linger(self) -> None:
        self.state = "lingering"
        self.guard.set_state(self, "lingering")
        self._unset_keepalive_if_required()
        for timer in (self._head_timer, self._body_timer):
            if timer is not None:
                timer.cancel()
        self._head_timer = self._body_timer = None
        if self.transport.is_closing():
            return
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.flow.resume_reading()
        self._linger_timer = self.loop.call_later(self.limits.linger_seconds, self.transport.abort)

    # Reading

    def data_received(self, data: bytes) -> None:
        """Feed the parser (uvicorn's, without its warning per malformed request); a request that
        breaks a head limit or is not HTTP is answered here (431, 414 or 400) and closed."""
        if self.state == "lingering":
            return  # discarded: the answer is sent, the connection closes
        self._unset_keepalive_if_required()
        if self._in_head:
            self._head_bytes += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._unsupported_upgrade_warning()  # no WebSocket here (ws="none"), as uvicorn does
        except httptools.HttpParserError:
            self.guard.note(self._refusal_reason if self._refusal else "malformed")
            answer = self._refusal or problem_response(
                400, "the request is not valid HTTP/1.1", "MALFORMED_REQUEST"
            )
            self._refusal = None
            self._refusal_reason = ""
            self._answer_and_linger(answer)
            return
        if self.state == "active" and self._body_timer is None and self.cycle.more_body:
            # A body still to come (armed here, not per request: most requests have none).
            now = self.loop.time()
            self._body_seen = self._body_started = self._body_checked = now
            self._body_credit = 0.0
            self._body_timer = self.loop.call_later(self.limits.body_idle_seconds, self._check_body)
        if self._in_head and self._head_bytes > self.limits.max_head_bytes:
            # More bytes than a head may have and still no complete head (a chunk that completed
            # it would have ended _in_head): a header line that never ends, or many of them.
            self.guard.note("head_too_large")
            self._answer_and_linger(
                problem_response(
                    431,
                    f"the request head is larger than {self.limits.max_head_bytes} bytes",
                    "HEADERS_TOO_LARGE",
                )
            )

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_fields = self._head_size = self._target_size = 0

    def on_url(self, url: bytes) -> None:
        self._target_size += len(url)
        if self._target_size > self.limits.max_target_bytes:
            self._refusal = problem_response(
                414, f"the request target is longer than {self.limits.max_target_bytes} bytes", "URI_TOO_LONG"
            )
            self._refusal_reason = "head_too_large"
            raise _Refused
        self._head_size += len(url)
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_fields += 1
        self._head_size += len(name) + len(value) + 4  # ": " and CRLF
        if self._head_fields > self.limits.max_headers:
            self._refusal = problem_response(
                431, f"the request has more than {self.limits.max_headers} header fields", "HEADERS_TOO_LARGE"
            )
            self._refusal_reason = "head_too_large"
            raise _Refused
        if self._head_size > self.limits.max_head_bytes:
            self._refusal = problem_response(
                431,
                f"the request head is larger than {self.limits.max_head_bytes} bytes",
                "HEADERS_TOO_LARGE",
            )
            self._refusal_reason = "head_too_large"
            raise _Refused
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        if self.reserved and not self._is_reserve_request():
            limit = self.limits.max_connections
            self._refusal = problem_response(
                503,
                f"all {limit} connections are serving requests",
                "SERVER_BUSY",
                {"retry-after": str(RETRY_AFTER_SECONDS)},
            )
            self._refusal_reason = "server_busy"
            raise _Refused
        self.state = "active"
        self._body_received = 0
        self.guard.set_state(self, "active")
        super().on_headers_complete()
        if self.reserved and self.cycle is not None:
            self.cycle.keep_alive = False  # one request over the cap, then the connection ends

    def _is_reserve_request(self) -> bool:
        """Whether the request whose head was just parsed is a ``GET``/``HEAD`` of one of the
        guard's reserve paths (the target's path, without its query)."""
        if self.parser.get_method() not in (b"GET", b"HEAD"):
            return False
        try:
            path = httptools.parse_url(self.url).path
        except httptools.HttpParserInvalidURLError:
            return False
        return path is not None and path.decode("latin-1") in self.guard.reserve_paths

    def on_body(self, body: bytes) -> None:
        self._body_seen = self.loop.time()
        self._body_received += len(body)
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._in_head = True
        self._head_bytes = 0
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
        super().on_message_complete()

    def _check_body(self) -> None:
        """The body's two deadlines, checked when the earlier one is due: no piece for
        ``body_idle_seconds``, or fewer bytes than ``body_min_bytes_per_second`` allow for the time
        since the head (after a grace of ``body_idle_seconds``). Past either, answer 408 and close,
        unless the wait is the server's (reading paused while the app has not taken what arrived,
        or a client waiting for its ``100 Continue``, which comes when the app first reads): the
        time since the last check is then not counted against the client."""
        self._body_timer = None
        if self.state != "active" or self.transport.is_closing():
            return
        now = self.loop.time()
        if self.flow.read_paused or (self.cycle is not None and self.cycle.waiting_for_100_continue):
            self._body_seen = now
            self._body_credit += now - self._body_checked
        self._body_checked = now
        idle, rate = self.limits.body_idle_seconds, self.limits.body_min_bytes_per_second
        due, slow_due = deadlines(
            self._body_seen, idle, self._body_started + self._body_credit, self._body_received, rate
        )
        if now < due and now < slow_due:
            self._body_timer = self.loop.call_later(min(due, slow_due) - now, self._check_body)
            return
        if now >= due:
            self.guard.note("body_idle")
            detail = f"no part of the request body arrived for {idle:g} s"
        else:
            self.guard.note("body_slow")
            detail = f"the request body arrived slower than {rate} bytes per second"
        self._answer_and_linger(problem_response(408, detail, "REQUEST_TIMEOUT"))

    def on_response_complete(self) -> None:
        self.served += 1
        pipelined = bool(self.pipeline)
        super().on_response_complete()
        if self.transport.is_closing() or pipelined:
            return
        if self.cycle is not None and self.cycle.more_body:
            # Answered before its body was read (401, 413…): the rest of the body would be parsed
            # as the next request, so the connection ends here, without a reset.
            self._linger()
            return
        self._wait_for_head()

    # Writing

    def pause_writing(self) -> None:
        super().pause_writing()
        now = self.loop.time()
        self._send_seen = now
        if self._send_started is not None:
            self._send_credit += now - self._send_resumed  # the server's own time, not the client's
            self._send_pending = self._unacknowledged()
            _, slow_due = deadlines(
                now,
                self.limits.send_idle_seconds,
                self._send_started + self._send_credit,
                self._send_acked,
                self.limits.send_min_bytes_per_second,
            )
            delay = max(0.0, min(self.limits.send_idle_seconds, slow_due - now))
        else:
            delay = min(STALL_SECONDS, self.limits.send_idle_seconds)  # then the rate clock starts
        self.guard.stalled(self, True)
        if self._send_timer is None:
            self._send_timer = self.loop.call_later(delay, self._check_send)

    def _unacknowledged(self) -> int:
        """Bytes written but not yet acknowledged by the client: the transport's buffer plus the
        socket's send queue (``SIOCOUTQ``: sent and unacknowledged, and not sent)."""
        pending = self.transport.get_write_buffer_size()
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError, ValueError):
                queued = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0")
                pending += struct.unpack("i", queued)[0]
        return pending

    def _took(self) -> None:
        """Count what the client acknowledged since the last look (writing is paused: the app
        writes nothing meanwhile, so the pending bytes only go down)."""
        pending = self._unacknowledged()
        if pending < self._send_pending:
            self._send_acked += self._send_pending - pending
            self._send_seen = self.loop.time()
        self._send_pending = pending

    def _check_send(self) -> None:
        """While writing is paused (the client takes the response slower than the app makes it).
        The first check, :data:`STALL_SECONDS` after the connection's first pause, starts the rate
        clock: what the client's socket buffers took before it is not counted. Abort when the
        client has acknowledged nothing for ``send_idle_seconds`` (seen at the checks, so between
        one and two times that), or has taken less than ``send_min_bytes_per_second`` allow for
        the paused time since the clock started (after a grace of ``send_idle_seconds``). Progress
        is read from the kernel (``SIOCOUTQ``), not from the write buffer's pauses: a slow but
        steady reader can keep writing paused far longer than the deadline while a few MiB of
        socket buffer drain. An abort, as a close would wait for the buffer."""
        self._send_timer = None
        if self.transport.is_closing() or not self.flow.write_paused:
            return
        now = self.loop.time()
        if self._send_started is None:
            self._send_started = self._send_seen = now
            self._send_pending = self._unacknowledged()
        else:
            self._took()
        due, slow_due = deadlines(
            self._send_seen,
            self.limits.send_idle_seconds,
            self._send_started + self._send_credit,
            self._send_acked,
            self.limits.send_min_bytes_per_second,
        )
        if now < due and now < slow_due:
            self._send_timer = self.loop.call_later(min(due, slow_due) - now, self._check_send)
            return
        self.guard.note("send_idle" if now >= due else "send_slow")
        self.reset()

    def reset(self) -> None:
        """Abort with a reset (``SO_LINGER`` 0): a plain abort closes the descriptor, but the
        kernel goes on sending its socket's queue (MiBs on a fast link) to the slow client."""
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.transport.abort()

    def below_send_rate(self, now: float) -> bool:
        """Whether this connection's writing is paused and the client has taken less than
        ``send_min_bytes_per_second`` over the paused time since its rate clock started (see
        :meth:`_check_send`), which is at least :data:`STALL_SECONDS` (``now``: the loop's clock,
        ``time.monotonic()``)."""
        rate = self.limits.send_min_bytes_per_second
        if not rate or not self.flow.write_paused or self._send_started is None:
            return False
        self._took()
        paused = now - self._send_started - self._send_credit
        return paused >= STALL_SECONDS and self._send_acked < rate * paused

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._send_started is not None:
            self._took()
        self._send_resumed = self.loop.time()
        self.guard.stalled(self, False)
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None


def guarded_protocol(guard: ConnectionGuard) -> type[GuardedHttpProtocol]:
    """A :class:`GuardedHttpProtocol` class bound to ``guard``, for uvicorn's ``Config(http=…)``
    (uvicorn constructs the protocol itself, one per connection)."""
    return type("GuardedHttpProtocol", (GuardedHttpProtocol,), {"guard": guard})


def ensure_descriptors(connections: int) -> int:
    """Raise the soft ``RLIMIT_NOFILE`` (up to the hard limit) so ``connections`` connections plus
    :data:`FD_HEADROOM` descriptors fit, as Go's runtime does at start. Returns the soft limit
    after; logs a warning when the hard limit is too low (connections past it fail to be
    accepted: asyncio then pauses accepting for a second)."""
    need = connections + FD_HEADROOM
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
    if soft != resource.RLIM_INFINITY and soft < need:
        log.warning(
            "RLIMIT_NOFILE is %d: below HM_HTTP_MAX_CONNECTIONS (%d) plus %d; raise the hard limit",
            soft,
            connections,
            FD_HEADROOM,
        )
    return soft


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: the service's main owns SIGTERM/SIGINT."""

    @contextlib.contextmanager
    def capture_signals(self):  # type: ignore[no-untyped-def]
        yield


class HttpServer:
    """uvicorn serving an ASGI app inside the caller's event loop, on a socket bound at construction
    (so a bind error is an ``OSError`` here, and port 0 is known before the app is built), with the
    connection limits of :class:`GuardedHttpProtocol`.

    Args:
        host, port: address to listen on; port 0 picks a free port (see :attr:`port`).
        grace_seconds: how long :meth:`stop` waits for in-flight requests.
        limits: deadlines and caps per connection (default: :data:`DEFAULT_LIMITS`; services pass
            ``load(HttpSettings)``, the ``HM_HTTP_*`` variables).
        reserve_paths: paths a connection over the cap may still ``GET`` while every connection
            is serving (``{"/healthz", "/readyz"}``; see :class:`ConnectionGuard`); none by default.
    """

    def __init__(
        self,
        host: str,
        port: int,
        grace_seconds: float = 10.0,
        limits: HttpSettings = DEFAULT_LIMITS,
        reserve_paths: frozenset[str] = frozenset(),
    ) -> None:
        # IPPROTO_TCP explicitly: asyncio enables TCP_NODELAY on accepted connections only when the
        # listening socket says so; with protocol 0 every response waited ~40 ms for the client's
        # delayed ACK (Nagle). Measured in bench/job_overhead.py: REST GET 56.6 → 15.6 ms p50.
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            self._sock.bind((host, port))
        except OSError:
            self._sock.close()
            raise
        self.host = host
        self.port: int = self._sock.getsockname()[1]
        self._grace = grace_seconds
        self.guard = ConnectionGuard(limits, reserve_paths)
        """This server's connections (for tests and diagnostics: ``open``, ``closed``)."""
        self._server: _Server | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self, app: Any) -> None:
        """Serve ``app`` until :meth:`stop`; returns once the server accepts connections."""
        limits = self.guard.limits
        ensure_descriptors(
            limits.max_connections + (limits.reserve_connections if self.guard.reserve_paths else 0)
        )
        config = uvicorn.Config(
            app,
            http=guarded_protocol(self.guard),
            ws="none",  # no app here speaks WebSocket; an upgrade would leave the guard's limits
            log_level="warning",
            log_config=None,  # uvicorn's own handlers print plain text; ours write JSON lines
            access_log=False,
            lifespan="off",
            limit_concurrency=None,  # the guard caps connections; uvicorn's cap answered 503 to all
            timeout_graceful_shutdown=int(self._grace),
            server_header=False,
        )
        self._server = _Server(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[self._sock]), name="http-server")
        while not self._server.started:
            if self._task.done():
                self._task.result()
                raise RuntimeError("HTTP server exited during startup")
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        """Stop accepting, wait up to the grace period for in-flight requests, close the socket."""
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            await self._task
        self._sock.close()
