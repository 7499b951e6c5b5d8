"""The HTTP servers' connection limits (hypermedia.infra.httpserver, issue 14), through a real
``HttpServer`` around the storage service's real signed-URL app on loopback: raw TCP clients that
send nothing, drip a head, stall a body, send huge or countless headers, or open too many
connections, from 127.0.0.1 and other loopback addresses.

Limits are small here (seconds, a few connections) so each test is short; the defaults are the
same code with larger numbers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from prometheus_client import REGISTRY

from hypermedia.core import config
from hypermedia.infra.httpguard import client_key
from hypermedia.infra.httplimits import HttpSettings
from hypermedia.infra.httpserver import HttpServer
from services.storage.localstore import LocalStore, build_app

SIGNING_KEY = b"test-signing-key-0123456789"
MAX_PUT_BYTES = 64 * 1024 * 1024
HEAD_TIMEOUT = 1.5
BODY_IDLE = 1.5
SEND_IDLE = 1.5
PER_ADDRESS = 8
MAX_CONNECTIONS = 24
LIMITS = HttpSettings(
    HM_HTTP_HEAD_TIMEOUT_SECONDS=HEAD_TIMEOUT,
    HM_HTTP_BODY_IDLE_SECONDS=BODY_IDLE,
    HM_HTTP_LINGER_SECONDS=2,
    HM_HTTP_SEND_IDLE_SECONDS=SEND_IDLE,
    HM_HTTP_MAX_CONNECTIONS=MAX_CONNECTIONS,
    HM_HTTP_MAX_CONNECTIONS_PER_ADDRESS=PER_ADDRESS,
)


@dataclass
class Store:
    server: HttpServer
    store: LocalStore

    async def put_url(self, key: str, content_type: str = "application/octet-stream") -> str:
        return (await self.store.presign_put(key, 300, content_type))[0]

    async def get_url(self, key: str) -> str:
        return (await self.store.presign_get(key, 300))[0]


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Store]:
    server = HttpServer("127.0.0.1", 0, limits=LIMITS)
    store = LocalStore(tmp_path / "objects", SIGNING_KEY, f"http://127.0.0.1:{server.port}")
    await server.start(build_app(store, MAX_PUT_BYTES))
    try:
        yield Store(server, store)
    finally:
        await server.stop()


@contextlib.asynccontextmanager
async def connections(
    port: int, count: int, source: str = "127.0.0.1"
) -> AsyncIterator[list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]:
    """``count`` TCP connections to ``port`` from ``source``, opened one after another (so their
    order is the server's accept order); all closed at the end."""
    opened: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    try:
        for _ in range(count):
            opened.append(await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0)))
            await asyncio.sleep(0.01)  # accepted (and counted) in this order
        yield opened
    finally:
        for _, writer in opened:
            writer.close()
        for _, writer in opened:
            with contextlib.suppress(OSError):
                await writer.wait_closed()


async def exchange(port: int, data: bytes, source: str = "127.0.0.1", timeout: float = 10) -> bytes:
    """Send ``data`` on a new connection and read until the server closes it (or ``timeout``)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
    try:
        with contextlib.suppress(ConnectionError):
            writer.write(data)
            await writer.drain()
        return await asyncio.wait_for(reader.read(), timeout)
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


def answer(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    """(status, lower-cased headers, body) of one HTTP/1.1 answer."""
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return int(lines[0].split(" ")[1]), headers, body


def problem_code(raw: bytes) -> tuple[int, str]:
    status, headers, body = answer(raw)
    assert headers["content-type"] == "application/problem+json", raw[:300]
    return status, json.loads(body)["error_code"]


async def closed_by_server(reader: asyncio.StreamReader, within: float) -> bool:
    """Whether the server ends the connection within ``within`` seconds (EOF or a reset)."""
    try:
        await asyncio.wait_for(reader.read(), within)
    except TimeoutError:
        return False
    except ConnectionError:
        return True
    return True


def target(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.path}?{parts.query}"


async def test_a_huge_head_thousands_of_headers_and_a_long_target_are_refused(served: Store) -> None:
    port = served.server.port
    refused_before = {reason: closed_metric(reason) for reason in ("head_too_large", "malformed")}
    await served.store.write("a/b", _chunks([b"stored"]), MAX_PUT_BYTES)
    get = target(await served.get_url("a/b"))

    huge = f"GET {get} HTTP/1.1\r\nHost: x\r\nX-Big: {'a' * 1024 * 1024}\r\n\r\n".encode()
    assert problem_code(await exchange(port, huge)) == (431, "HEADERS_TOO_LARGE")

    many = f"GET {get} HTTP/1.1\r\nHost: x\r\n".encode()
    many += b"".join(b"X-H%d: v\r\n" % i for i in range(5000)) + b"\r\n"
    assert problem_code(await exchange(port, many)) == (431, "HEADERS_TOO_LARGE")

    # 101 small fields: over the count, far under the size.
    over_count = f"GET {get} HTTP/1.1\r\nHost: x\r\n".encode() + b"X-A: 1\r\n" * 100 + b"\r\n"
    assert problem_code(await exchange(port, over_count)) == (431, "HEADERS_TOO_LARGE")

    long_target = f"GET /o/a/b?pad={'p' * 9000} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
    assert problem_code(await exchange(port, long_target)) == (414, "URI_TOO_LONG")

    assert problem_code(await exchange(port, b"NOT HTTP\r\n\r\n")) == (400, "MALFORMED_REQUEST")

    # A head just under the limits is served, on the same server, right after.
    fine = f"GET {get} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n".encode()
    fine += b"".join(b"X-F%d: %s\r\n" % (i, b"f" * 500) for i in range(90)) + b"\r\n"
    status, _, body = answer(await exchange(port, fine))
    assert (status, body) == (200, b"stored")
    # An operator sees the refusals no route answered (the metric the status port serves).
    assert closed_metric("head_too_large") - refused_before["head_too_large"] == 4
    assert closed_metric("malformed") - refused_before["malformed"] == 1


def closed_metric(reason: str) -> float:
    """``hypermedia_http_connections_closed_total{reason}`` in this process's registry."""
    value = REGISTRY.get_sample_value("hypermedia_http_connections_closed_total", {"reason": reason})
    return value or 0.0


async def test_a_head_sent_byte_by_byte_is_closed_at_its_deadline_and_a_silent_one_quietly(
    served: Store,
) -> None:
    port = served.server.port
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    started = time.monotonic()
    got = b""
    try:
        for byte in b"GET /o/a/b HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"s" * 100:
            writer.write(bytes([byte]))
            await writer.drain()
            with contextlib.suppress(TimeoutError):
                got = await asyncio.wait_for(reader.read(), 0.2)  # one byte per 0.2 s
            if got or reader.at_eof():
                break
    except ConnectionError:
        pass
    finally:
        writer.close()
    elapsed = time.monotonic() - started
    assert problem_code(got) == (408, "REQUEST_TIMEOUT")
    assert HEAD_TIMEOUT <= elapsed < HEAD_TIMEOUT + 5  # closed at the deadline, not before

    async with connections(port, 1) as [(silent, _)]:
        started = time.monotonic()
        assert await silent.read() == b""  # closed without an answer: it asked nothing
        assert time.monotonic() - started >= HEAD_TIMEOUT - 0.1


async def test_a_slow_steady_upload_completes_and_a_stalled_one_is_cut_off(served: Store) -> None:
    port = served.server.port
    piece = b"0123456789" * 100
    pieces = 8  # one every 0.5 s: 4 s in all, longer than both deadlines, no gap as long as either
    head = await _put_in_pieces(port, target(await served.put_url("slow/steady")), piece, pieces, 0.5)
    assert head.startswith(b"HTTP/1.1 200"), head
    assert (served.store.root / "slow" / "steady").read_bytes() == piece * pieces

    put = target(await served.put_url("slow/stalled"))
    started = time.monotonic()
    got = await exchange(
        port,
        f"PUT {put} HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
        f"Content-Length: 100000\r\n\r\n".encode()
        + piece,
    )
    assert problem_code(got) == (408, "REQUEST_TIMEOUT")
    assert time.monotonic() - started >= BODY_IDLE
    await asyncio.sleep(0.2)  # the app's cleanup after the disconnect
    assert not (served.store.root / "slow" / "stalled").exists()
    assert [p.name for p in (served.store.root / "slow").iterdir()] == ["steady"]  # no .part left


async def test_connections_per_address_evict_idle_ones_then_refuse_with_429(served: Store) -> None:
    port = served.server.port
    # Idle connections past the cap evict that address's oldest idle ones.
    async with connections(port, PER_ADDRESS + 4, "127.0.0.5") as idle:
        closed = await asyncio.gather(*(closed_by_server(r, 0.3) for r, _ in idle))
        assert closed == [True] * 4 + [False] * PER_ADDRESS

    # Connections all serving requests (uploads in progress): the next one is refused.
    put = target(await served.put_url("busy/x"))
    head = (
        f"PUT {put} HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
        "Content-Length: 1000\r\n\r\n".encode()
    )
    async with connections(port, PER_ADDRESS, "127.0.0.6") as busy:

        async def drip() -> None:  # a byte of each body every 0.3 s: slow, never idle long
            for _, writer in busy:
                writer.write(head)
            while True:
                for _, writer in busy:
                    writer.write(b"x")
                await asyncio.sleep(0.3)

        dripping = asyncio.create_task(drip())
        await asyncio.sleep(0.3)
        refused = await exchange(port, b"", source="127.0.0.6")
        status, headers, body = answer(refused)
        assert (status, json.loads(body)["error_code"]) == (429, "TOO_MANY_CONNECTIONS")
        assert headers["retry-after"] == "1"
        # Another address is served meanwhile.
        get = target(await served.get_url("missing"))
        other = await exchange(
            port, f"GET {get} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode(), "127.0.0.7"
        )
        assert problem_code(other) == (404, "NOT_FOUND")
        still = await asyncio.gather(*(closed_by_server(r, 0.1) for r, _ in busy))
        assert not any(still)  # all still being served
        dripping.cancel()


async def test_at_the_server_cap_a_new_connection_evicts_the_oldest_waiting_one(served: Store) -> None:
    port = served.server.port
    await served.store.write("k", _chunks([b"v"]), MAX_PUT_BYTES)
    url = await served.get_url("k")
    # The cap filled with idle connections from many addresses (none over its own cap) ...
    async with contextlib.AsyncExitStack() as stack:
        flood = []
        for i in range(MAX_CONNECTIONS // 4):
            flood += await stack.enter_async_context(connections(port, 4, f"127.0.1.{i + 1}"))
        assert len(served.server.guard.open) == MAX_CONNECTIONS
        # ... a real client is served, and the connection that waited longest made room for it.
        async with httpx.AsyncClient() as http:
            response = await http.get(url)
        assert (response.status_code, response.content) == (200, b"v")
        assert await closed_by_server(flood[0][0], 0.5)
        assert not await closed_by_server(flood[-1][0], 0.05)
        assert served.server.guard.closed["evicted"] >= 1


async def test_an_answer_sent_before_the_body_is_read_reaches_the_client(served: Store) -> None:
    # A PUT with a bad signature is refused before its 8 MiB body is read; the client, still
    # sending, must get the 403 and not a reset.
    body = b"z" * (8 * 1024 * 1024)
    raw = await exchange(
        served.server.port,
        b"PUT /o/a/b?expires=1&sig=00 HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body,
    )
    assert problem_code(raw) == (403, "URL_REJECTED")
    assert b"\r\nconnection: close\r\n" in raw.partition(b"\r\n\r\n")[0].lower() + b"\r\n"


async def test_a_client_told_the_connection_ends_sends_its_next_request_on_a_new_one(served: Store) -> None:
    # The connection of an answer sent before the body was read ends after it; the answer says so,
    # so a keep-alive client does not send its next request into the closing connection. Told
    # nothing, the client sees the FIN that follows the answer only if it arrives before its next
    # request: CI once lost that race (httpx's "Server disconnected without sending a response").
    async with httpx.AsyncClient() as http:
        for i in range(5):
            url = await served.put_url(f"kept-{i}")
            refused = await http.put(url.replace("sig=", "sig=00"), content=b"z" * (256 * 1024))
            assert refused.status_code == 403 and refused.headers["connection"] == "close"
            stored = await http.put(url, content=b"v", headers={"content-type": "application/octet-stream"})
            assert stored.status_code in (200, 201, 204), stored.text


async def test_a_bad_head_behind_pipelined_requests_is_answered_and_closed_without_an_error(
    served: Store, caplog: pytest.LogCaptureFixture
) -> None:
    # Two requests pipelined, then garbage: the 400 and the close come first, the two unanswered
    # requests are dropped (a client sends them again), and no app writes after the close (was a
    # RuntimeError "Cannot call write() after write_eof()" logged per connection).
    await served.store.write("p/q", _chunks([b"stored"]), MAX_PUT_BYTES)
    get = target(await served.get_url("p/q"))
    request = f"GET {get} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
    with caplog.at_level(logging.ERROR):
        raw = await exchange(served.server.port, request * 2 + b"BLAH\r\n\r\n")
        await asyncio.sleep(0.3)  # the apps of the dropped requests end meanwhile
    assert raw.count(b"HTTP/1.1 ") == 1 and problem_code(raw) == (400, "MALFORMED_REQUEST")
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


async def test_a_head_begun_during_a_response_gets_its_408_at_its_deadline(served: Store) -> None:
    # The next head's first bytes came with the first request: past the head deadline it is a
    # 408 and counted, as a head begun later is (was: closed silently at uvicorn's keep-alive).
    await served.store.write("p/r", _chunks([b"stored"]), MAX_PUT_BYTES)
    get = target(await served.get_url("p/r"))
    before = served.server.guard.closed["head_timeout"]
    started = time.monotonic()
    raw = await exchange(
        served.server.port, f"GET {get} HTTP/1.1\r\nHost: x\r\n\r\nGET {get} HTTP/1.1\r\nHo".encode()
    )
    first, _, rest = raw.partition(b"stored")
    assert answer(first + b"stored")[0] == 200
    assert problem_code(rest) == (408, "REQUEST_TIMEOUT")
    assert HEAD_TIMEOUT <= time.monotonic() - started < HEAD_TIMEOUT + 3
    assert served.server.guard.closed["head_timeout"] == before + 1


async def test_a_response_the_client_does_not_read_is_aborted(served: Store) -> None:
    size = 32 * 1024 * 1024  # more than loopback's socket buffers hold on both sides
    await served.store.write("big", _chunks([b"b" * (1024 * 1024)] * 32), MAX_PUT_BYTES)
    get = target(await served.get_url("big"))
    reader, writer = await asyncio.open_connection("127.0.0.1", served.server.port)
    writer.write(f"GET {get} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    await asyncio.sleep(SEND_IDLE + 1.5)  # not reading: the server's writes stall
    received = 0
    try:
        while chunk := await asyncio.wait_for(reader.read(1024 * 1024), 10):
            received += len(chunk)
    except ConnectionResetError:
        pass  # aborted: what was still buffered on our side is dropped with it
    finally:
        writer.close()
    assert received < size
    assert served.server.guard.closed["send_idle"] == 1


@contextlib.asynccontextmanager
async def serving(
    tmp_path: Path, limits: HttpSettings, reserve_paths: frozenset[str] = frozenset()
) -> AsyncIterator[Store]:
    """A real ``HttpServer`` with ``limits`` around the storage app, which also answers
    ``GET /healthz`` with ``ok`` (as the gateway does), for tests that need other limits."""
    server = HttpServer("127.0.0.1", 0, limits=limits, reserve_paths=reserve_paths)
    store = LocalStore(tmp_path / "objects", SIGNING_KEY, f"http://127.0.0.1:{server.port}")
    storage_app = build_app(store, MAX_PUT_BYTES)

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/healthz":
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
            await send({"type": "http.response.body", "body": b"ok"})
            return
        await storage_app(scope, receive, send)

    await server.start(app)
    try:
        yield Store(server, store)
    finally:
        await server.stop()


async def _put_in_pieces(port: int, put: str, piece: bytes, pieces: int, gap: float) -> bytes:
    """PUT ``pieces`` copies of ``piece`` to ``put``, ``gap`` seconds before each; the answer's head."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(_put_head(put, len(piece) * pieces))
    for _ in range(pieces):
        await asyncio.sleep(gap)
        writer.write(piece)
        await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    writer.close()
    return head


def _put_head(put: str, length: int) -> bytes:
    return (
        f"PUT {put} HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()


async def test_a_body_below_the_minimum_rate_is_cut_at_its_deadline_and_a_slow_one_above_it_is_not(
    tmp_path: Path,
) -> None:
    grace, rate = 1.0, 4096
    limits = HttpSettings(HM_HTTP_BODY_IDLE_SECONDS=grace, HM_HTTP_BODY_MIN_BYTES_PER_SECOND=rate)
    async with serving(tmp_path, limits) as served:
        port = served.server.port
        # Above the rate: 1,000 bytes every 0.1 s (10 KB/s) for 3 s, three times the grace.
        piece, pieces = b"a" * 1000, 30
        head = await _put_in_pieces(port, target(await served.put_url("rate/above")), piece, pieces, 0.1)
        assert head.startswith(b"HTTP/1.1 200"), head
        assert (served.store.root / "rate" / "above").read_bytes() == piece * pieces

        # Below it, never idle: 400 bytes every 0.25 s (1.6 KB/s). Its deadline is the grace plus a
        # second per 4,096 bytes received: about 1.6 s, long before its 100,000 bytes would be in.
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_put_head(target(await served.put_url("rate/below")), 100_000))
        started = time.monotonic()
        got = b""
        with contextlib.suppress(ConnectionError):
            for _ in range(200):
                writer.write(b"b" * 400)
                await writer.drain()
                with contextlib.suppress(TimeoutError):
                    got += await asyncio.wait_for(reader.read(4096), 0.25)
                if got or reader.at_eof():
                    break
        elapsed = time.monotonic() - started
        writer.close()
        assert problem_code(got) == (408, "REQUEST_TIMEOUT")
        assert b"slower than 4096 bytes per second" in got
        assert grace <= elapsed < 10  # cut after the grace, not at the end of a 62 s upload
        assert (served.server.guard.closed["body_slow"], served.server.guard.closed["body_idle"]) == (1, 0)
        await asyncio.sleep(0.2)  # the app's cleanup after the disconnect
        assert sorted(p.name for p in (served.store.root / "rate").iterdir()) == ["above"]


async def _slow_reader(port: int, path: str, chunk: int, every: float, source: str = "127.0.0.1") -> int:
    """GET ``path`` on a socket with a 4 KiB receive buffer, reading ``chunk`` bytes every
    ``every`` seconds until the server ends the connection; returns the bytes received."""
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.bind((source, 0))
    sock.setblocking(False)
    received = 0
    try:
        await loop.sock_connect(sock, ("127.0.0.1", port))
        await loop.sock_sendall(sock, f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        for _ in range(int(60 / every)):
            await asyncio.sleep(every)
            try:
                data = await asyncio.wait_for(loop.sock_recv(sock, chunk), 5)
            except ConnectionError:
                break
            if not data:
                break
            received += len(data)
    finally:
        sock.close()
    return received


BIG = 32 * 1024 * 1024
"""A response larger than loopback's socket buffers on both sides hold, so writing pauses."""


async def test_a_reader_below_the_minimum_send_rate_is_aborted_and_a_fast_one_is_not(tmp_path: Path) -> None:
    grace, rate = 3.0, 128 * 1024
    limits = HttpSettings(HM_HTTP_SEND_IDLE_SECONDS=grace, HM_HTTP_SEND_MIN_BYTES_PER_SECOND=rate)
    async with serving(tmp_path, limits) as served:
        await served.store.write("big", _chunks([b"b" * (1024 * 1024)] * 32), MAX_PUT_BYTES)
        url = await served.get_url("big")
        # Never still for the idle deadline (writing pauses and resumes every second or so), but
        # at about 40 KB/s, a third of the minimum rate.
        received = await _slow_reader(served.server.port, target(url), 4096, 0.1)
        assert received < BIG
        assert (served.server.guard.closed["send_slow"], served.server.guard.closed["send_idle"]) == (1, 0)
        async with httpx.AsyncClient() as http:  # a client that reads at once gets it all
            response = await http.get(url)
        assert (response.status_code, len(response.content)) == (200, BIG)
        assert served.server.guard.closed["send_slow"] == 1


async def test_at_the_cap_a_reader_below_the_send_rate_is_evicted_for_a_new_client(tmp_path: Path) -> None:
    cap = 16
    limits = HttpSettings(
        HM_HTTP_MAX_CONNECTIONS=cap,
        HM_HTTP_MAX_CONNECTIONS_PER_ADDRESS=0,
        HM_HTTP_SEND_IDLE_SECONDS=30,
        HM_HTTP_SEND_MIN_BYTES_PER_SECOND=64 * 1024,
    )
    async with serving(tmp_path, limits) as served:
        await served.store.write("big", _chunks([b"b" * (1024 * 1024)] * 32), MAX_PUT_BYTES)
        await served.store.write("small", _chunks([b"s"]), MAX_PUT_BYTES)
        big, small = target(await served.get_url("big")), await served.get_url("small")
        # Every connection serves a response its client reads at 512 bytes a second.
        readers = [asyncio.create_task(_slow_reader(served.server.port, big, 512, 1.0)) for _ in range(cap)]
        try:
            await asyncio.sleep(3)  # writing paused, and the rate clocks past their first second
            assert len(served.server.guard.open) == cap
            assert all(c.state == "active" for c in served.server.guard.open)
            async with httpx.AsyncClient() as http:
                response = await http.get(small)
            assert (response.status_code, response.content) == (200, b"s")
            assert served.server.guard.closed["evicted"] == 1
            assert served.server.guard.closed["server_busy"] == 0
        finally:
            for reader in readers:
                reader.cancel()
            await asyncio.gather(*readers, return_exceptions=True)


async def test_health_answers_over_the_cap_when_every_connection_is_serving(tmp_path: Path) -> None:
    cap, reserve = 16, 2
    limits = HttpSettings(
        HM_HTTP_MAX_CONNECTIONS=cap,
        HM_HTTP_MAX_CONNECTIONS_PER_ADDRESS=0,
        HM_HTTP_RESERVE_CONNECTIONS=reserve,
        HM_HTTP_BODY_IDLE_SECONDS=20,
        HM_HTTP_BODY_MIN_BYTES_PER_SECOND=0,
    )
    async with serving(tmp_path, limits, reserve_paths=frozenset({"/healthz"})) as served:
        port = served.server.port
        put = target(await served.put_url("held"))
        async with connections(port, cap) as held:
            for _, writer in held:  # uploads whose bodies have not come yet: all serving
                writer.write(_put_head(put, 1000))
            await asyncio.sleep(0.3)
            assert all(c.state == "active" for c in served.server.guard.open)

            health = await exchange(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            status, headers, body = answer(health)
            assert (status, body, headers["connection"]) == (200, b"ok", "close")
            # Anything else over the cap is refused once its head is read.
            other = await exchange(
                port, f"GET {target(await served.get_url('x'))} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
            )
            assert problem_code(other) == (503, "SERVER_BUSY")
            # The reserve is bounded: with it full, a new connection is refused at once.
            async with connections(port, reserve):
                await asyncio.sleep(0.1)
                refused = await exchange(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                assert problem_code(refused) == (503, "SERVER_BUSY")
            assert len(served.server.guard.open) - len(served.server.guard.reserved) == cap


def test_clients_are_counted_per_address_and_ipv6_per_64() -> None:
    assert client_key("127.0.0.1") == "127.0.0.1"
    assert client_key("::ffff:10.1.2.3") == "10.1.2.3"
    assert client_key("2001:db8:1:2:aaaa::1") == client_key("2001:db8:1:2:bbbb::9") == "2001:db8:1:2::/64"
    assert client_key("2001:db8:1:3::1") != client_key("2001:db8:1:2::1")
    assert client_key("fe80::1%eth0") == "fe80::/64"


async def _chunks(parts: list[bytes]) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


def test_the_limits_are_read_from_the_environment_and_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HM_HTTP_MAX_HEADERS", "50")
    monkeypatch.setenv("HM_HTTP_MAX_CONNECTIONS_PER_ADDRESS", "0")
    limits = config.load(HttpSettings)
    assert (limits.max_headers, limits.max_connections_per_address) == (50, 0)
    assert (limits.head_timeout_seconds, limits.max_head_bytes) == (10.0, 64 * 1024)  # defaults

    monkeypatch.setenv("HM_HTTP_MAX_HEADERS", "5")
    monkeypatch.setenv("HM_HTTP_HEAD_TIMEOUT_SECONDS", "soon")
    with pytest.raises(config.ConfigError) as raised:
        config.load(HttpSettings)
    assert "HM_HTTP_MAX_HEADERS" in str(raised.value) and "HM_HTTP_HEAD_TIMEOUT_SECONDS" in str(raised.value)
    assert "soon" not in str(raised.value)

    monkeypatch.delenv("HM_HTTP_MAX_HEADERS")
    monkeypatch.delenv("HM_HTTP_HEAD_TIMEOUT_SECONDS")
    monkeypatch.setenv("HM_HTTP_MAX_TARGET_BYTES", str(128 * 1024))
    with pytest.raises(config.ConfigError, match="HM_HTTP_MAX_TARGET_BYTES must not exceed"):
        config.load(HttpSettings)
