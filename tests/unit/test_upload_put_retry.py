"""The gateway's PUT of an original to the store is tried once more on a new connection when the
first fails at the connection level (:func:`services.gateway.uploads.put_original`): a real
local server that closes the first connection after reading the request, as a store closing or
evicting a kept-alive connection does; not when the store answers, nor on a timeout."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from services.gateway.uploads import put_original


async def _server(behaviour: list[str]) -> tuple[asyncio.Server, str, list[bytes]]:
    """A server that takes each connection's request whole, then per ``behaviour`` item (one per
    connection, in order) ``close``s without answering, answers ``ok`` (200), or ``stalls``."""
    seen: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(v)
            for k, _, v in (line.partition(b":") for line in head.split(b"\r\n"))
            if k.lower() == b"content-length"
        )
        body = await reader.readexactly(length)
        seen.append(body)
        action = behaviour.pop(0)
        if action == "ok":
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
        elif action == "stall":
            await asyncio.sleep(5)
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}/o/originals/x", seen


async def test_a_connection_the_store_closed_is_tried_once_more_on_a_new_one() -> None:
    server, url, seen = await _server(["close", "ok"])
    async with server, httpx.AsyncClient() as http:
        response = await put_original(http, url, b"the original", "image/jpeg")
    assert response.status_code == 200 and seen == [b"the original"] * 2


async def test_two_closed_connections_give_the_error_up() -> None:
    server, url, seen = await _server(["close", "close"])
    async with server, httpx.AsyncClient() as http:
        with pytest.raises(httpx.RemoteProtocolError):
            await put_original(http, url, b"the original", "image/jpeg")
    assert len(seen) == 2


async def test_a_timeout_is_not_tried_again() -> None:
    server, url, seen = await _server(["stall", "ok"])
    async with server, httpx.AsyncClient(timeout=httpx.Timeout(0.5)) as http:
        with pytest.raises(httpx.ReadTimeout):
            await put_original(http, url, b"the original", "image/jpeg")
    assert len(seen) == 1
