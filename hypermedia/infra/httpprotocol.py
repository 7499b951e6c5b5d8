"""uvicorn's httptools protocol with the limits of a :class:`~hypermedia.infra.httpguard.ConnectionGuard`:
head, body and send deadlines and rates, head bounds, eviction and a lingering close (see
:mod:`hypermedia.infra.httpserver`). It subclasses uvicorn 0.54's ``HttpToolsProtocol`` and
relies on its internals: check it on every uvicorn upgrade."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import socket
import struct
import termios
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from hypermedia.infra.httpguard import (
    RETRY_AFTER_SECONDS,
    STALL_SECONDS,
    ConnectionGuard,
    _Refused,
    _State,
    client_key,
    deadlines,
    problem_response,
)


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
        self._closing_cycle: RequestResponseCycle | None = None  # answered with connection: close
        self._running_cycle: RequestResponseCycle | None = None  # the last one whose app started

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
        one: then the connection is only aborted. Requests pipelined before it that are not
        answered yet are dropped with it (their apps' writes too): the answer and the close come
        first, and the client sends them again on a new connection."""
        if self.transport.is_closing():
            return
        queued = [cycle for cycle, _app in self.pipeline]
        self.pipeline.clear()
        pending = [
            c for c in (self._running_cycle, self.cycle, *queued) if c is not None and not c.response_complete
        ]
        for cycle in pending:
            cycle.disconnected = True  # the app's further writes are dropped
            cycle.message_event.set()
        if any(cycle.response_started for cycle in pending):
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
        # A head has begun, also when it came in the chunk that ended the previous message (its
        # bytes were counted before that message's end set the count back to 0).
        self._head_bytes = max(self._head_bytes, 1)

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

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        """Start the app on ``cycle`` (uvicorn's), with a ``send`` that adds ``connection: close``
        to a response started before the request's body was all received. Such a connection ends
        after the response (:meth:`on_response_complete` lingers), and a client told nothing sends
        its next request on it and finds it closed (httpx: "Server disconnected without sending a
        response", seen in CI after a read-only key's refused upload). uvicorn itself would close
        the transport at once for that header (a reset, with input unread), so its ``keep_alive``
        is set back: the close is the linger's."""
        send = cycle.send

        async def closing_when_unread(message: Any) -> None:
            if message["type"] != "http.response.start" or not cycle.more_body:
                await send(message)
                return
            headers = [
                (name, value) for name, value in message.get("headers", []) if name.lower() != b"connection"
            ]
            message["headers"] = [*headers, (b"connection", b"close")]
            await send(message)
            cycle.keep_alive = True
            self._closing_cycle = cycle

        cycle.send = closing_when_unread  # type: ignore[method-assign]
        self._running_cycle = cycle
        super()._start_asgi_task(cycle, app)

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
        if self.cycle is not None and (self.cycle.more_body or self.cycle is self._closing_cycle):
            # Answered before its body was read (401, 413…): the rest of the body would be parsed
            # as the next request, so the connection ends here, without a reset.
            self._linger()
            return
        if self._head_bytes and self.timeout_keep_alive_task is not None:
            # Part of the next head came during the response: it is no idle keep-alive
            # connection but a head on its deadline (408 and counted), not uvicorn's silent 5 s.
            self.timeout_keep_alive_task.cancel()
            self.timeout_keep_alive_task = None
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
