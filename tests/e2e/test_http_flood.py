"""A flood of idle and slow connections against the real platform (`hypermedia up`: credits,
storage, gateway, imageworker) on loopback (issue 14, item 2): hundreds of TCP connections that
send nothing or drip a request head, from 127.0.0.1 and twenty other loopback addresses, held
open (each one opened again as soon as the server closes it) against both the gateway and the
storage service's signed-URL server. Throughout, health answers and a job's REST calls (upload,
process, poll) and its download from storage work; after release everything is normal.

Before the fix, uvicorn's ``limit_concurrency`` (256) answered 503 to every request while the
connections were open, and nothing ever closed them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
import pyvips

from tests.e2e.conftest import RunningPlatform, isolated_platform

IMAGE = Path(__file__).resolve().parents[1] / "data" / "exif-orientation" / "Landscape_1.jpg"
HEAD_TIMEOUT = 3
BODY_IDLE = 2
MAX_CONNECTIONS = 128
IDLE_PER_ADDRESS = 12
"""Idle connections per address and server: under the per-address cap (32), so the server cap
(128) is what the 21 addresses' 252 connections per server run into."""
DRIPPING = 20
"""Connections per server sending a request head one byte per second."""
UPLOADS_PER_ACCOUNT = 4
"""``HM_MAX_CONCURRENT_UPLOADS_PER_ACCOUNT`` of the flood platform."""
RECONNECT_SECONDS = 0.2
"""A flood slot's pause before it connects again after the server closed its connection. With
272 slots per server over its cap of 128, that is about 700 new connections per second per
server, each evicting the longest-waiting silent one: a silent connection lives about 0.2 s."""


@pytest.fixture(scope="module")
def flood_platform(tmp_root: Path, database_url: str, nats_url: str) -> Iterator[RunningPlatform]:
    with isolated_platform(
        tmp_root,
        database_url,
        nats_url,
        "flood",
        services="credits,storage,gateway,imageworker",
        HM_HTTP_HEAD_TIMEOUT_SECONDS=str(HEAD_TIMEOUT),
        HM_HTTP_BODY_IDLE_SECONDS=str(BODY_IDLE),
        HM_HTTP_MAX_CONNECTIONS=str(MAX_CONNECTIONS),
        HM_MAX_CONCURRENT_UPLOADS_PER_ACCOUNT=str(UPLOADS_PER_ACCOUNT),
    ) as running:
        yield running


@dataclass
class Flood:
    """Connection slots that hold a connection open, opening a new one :data:`RECONNECT_SECONDS`
    after the server closes theirs, until :meth:`release`."""

    closed_by_server: int = 0
    refused: int = 0
    opened: int = 0

    def __post_init__(self) -> None:
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def hold(self, port: int, source: str, drip: bool = False) -> None:
        self._tasks.append(asyncio.create_task(self._slot(port, source, drip)))

    async def _slot(self, port: int, source: str, drip: bool) -> None:
        while not self._stop.is_set():
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
            except OSError:
                self.refused += 1
                await asyncio.sleep(0.2)
                continue
            self.opened += 1
            try:
                if drip:
                    await self._drip(reader, writer)
                else:
                    await self._until_closed(reader)
            finally:
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), RECONNECT_SECONDS)

    async def _until_closed(self, reader: asyncio.StreamReader) -> None:
        stop = asyncio.create_task(self._stop.wait())
        read = asyncio.create_task(reader.read())
        await asyncio.wait({stop, read}, return_when=asyncio.FIRST_COMPLETED)
        if read.done():
            self.closed_by_server += 1
        for task in (stop, read):
            task.cancel()
        await asyncio.gather(stop, read, return_exceptions=True)

    async def _drip(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"s" * 200
        for byte in head:
            if self._stop.is_set():
                return
            try:
                writer.write(bytes([byte]))
                await writer.drain()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(reader.read(1), 1.0)  # one byte a second
            except ConnectionError:  # reset: evicted, or closed with our bytes unread
                self.closed_by_server += 1
                return
            if reader.at_eof():
                self.closed_by_server += 1
                return

    async def release(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)


def _job_round(platform: RunningPlatform, api_key: str) -> dict[str, Any]:
    """Health, upload, process, poll until completed, download the output: every status checked.
    Run in a thread of its own, as a client apart from the flood (whose event loop is busy)."""
    auth = {"Authorization": f"Bearer {api_key}"}
    with httpx.Client(base_url=platform.rest_url, headers=auth, timeout=30) as client:
        assert client.get("/healthz").status_code == 200
        uploaded = client.post("/v1/objects", files={"file": (IMAGE.name, IMAGE.read_bytes())})
        assert uploaded.status_code == 201, uploaded.text
        created = client.post(
            "/v1/hypermedia/process",
            json={"object_id": uploaded.json()["object_id"], "operations": ["thumbnail"]},
        )
        assert created.status_code == 202, created.text
        job_id = created.json()["job_ids"][0]
        deadline = time.monotonic() + 60
        while True:
            assert client.get("/healthz").status_code == 200
            polled = client.get(f"/v1/jobs/{job_id}")
            assert polled.status_code == 200, polled.text
            job = polled.json()
            if job["status"] in ("completed", "failed", "cancelled") or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert job["status"] == "completed", job
        output = client.get(job["outputs"][0]["url"])  # the storage service's signed URL
        assert output.status_code == 200
        thumbnail = pyvips.Image.new_from_buffer(output.content, "")
        assert (thumbnail.width, thumbnail.height) == (256, 171)
        return dict(job)


async def test_idle_and_dripping_connections_do_not_take_the_gateway_or_storage_down(
    flood_platform: RunningPlatform,
) -> None:
    account = flood_platform.admin("create-account", "--credits", "100")
    ports = [
        int(flood_platform.rest_url.rsplit(":", 1)[1]),
        int(flood_platform.info["storage_http"].rsplit(":", 1)[1]),
    ]
    flood = Flood()
    for port in ports:
        for i in range(1, 22):  # 127.0.0.1 (where the real client is too) … 127.0.0.21
            for _ in range(IDLE_PER_ADDRESS):
                flood.hold(port, f"127.0.0.{i}")
        for i in range(DRIPPING):
            flood.hold(port, f"127.0.0.{22 + i % 4}", drip=True)
    try:
        await asyncio.sleep(2)  # the flood is in place: both servers at their cap
        assert flood.opened >= 2 * MAX_CONNECTIONS
        job = await asyncio.to_thread(_job_round, flood_platform, account["api_key"])
        # Hold the flood past the head deadline: the dripping and idle ones are closed at it.
        await asyncio.sleep(max(0.0, HEAD_TIMEOUT + 1.5))
        health = await asyncio.to_thread(httpx.get, flood_platform.rest_url + "/healthz")
        assert health.status_code == 200
    finally:
        await flood.release()
    # The servers closed connections throughout (evicted at the cap, or at the head deadline);
    # none was refused at connect.
    assert flood.closed_by_server >= 2 * (21 * IDLE_PER_ADDRESS - MAX_CONNECTIONS)
    assert flood.refused == 0
    assert job["status"] == "completed"

    # After the release: everything normal, the same calls again.
    again = _job_round(flood_platform, account["api_key"])
    assert again["status"] == "completed"


async def _exchange(port: int, data: bytes, pieces: list[bytes] | None = None, gap: float = 0.0) -> bytes:
    """Send ``data``, then each of ``pieces`` ``gap`` seconds apart; read the answer until the
    server closes the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        with contextlib.suppress(ConnectionError):
            writer.write(data)
            await writer.drain()
            for piece in pieces or []:
                await asyncio.sleep(gap)
                writer.write(piece)
                await writer.drain()
        return await asyncio.wait_for(reader.read(), 30)
    finally:
        writer.close()


def _problem(raw: bytes) -> tuple[int, str]:
    head, _, body = raw.partition(b"\r\n\r\n")
    assert b"content-type: application/problem+json" in head.lower(), raw[:300]
    return int(head.split(b" ", 2)[1]), str(json.loads(body)["error_code"])


async def test_the_gateway_refuses_huge_heads_and_cuts_a_stalled_upload_but_not_a_slow_one(
    flood_platform: RunningPlatform,
) -> None:
    account = flood_platform.admin("create-account", "--credits", "10")
    port = int(flood_platform.rest_url.rsplit(":", 1)[1])
    auth = f"Authorization: Bearer {account['api_key']}\r\n"

    huge = f"GET /v1/credits HTTP/1.1\r\nHost: x\r\n{auth}X-Big: {'a' * 1024 * 1024}\r\n\r\n"
    assert _problem(await _exchange(port, huge.encode())) == (431, "HEADERS_TOO_LARGE")
    many = f"GET /v1/credits HTTP/1.1\r\nHost: x\r\n{auth}" + "".join(f"X-{i}: v\r\n" for i in range(5000))
    assert _problem(await _exchange(port, (many + "\r\n").encode())) == (431, "HEADERS_TOO_LARGE")

    # A multipart upload sent in 6 pieces a second apart (longer than both deadlines in all).
    boundary = "hmflood"
    content = bytes(range(256)) * 24  # 6 KiB
    part = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="slow.bin"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode()
    body = part + content + f"\r\n--{boundary}--\r\n".encode()
    head = (
        f"POST /v1/objects HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n"
        f"Content-Type: multipart/form-data; boundary={boundary}\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    step = -(-len(body) // 6)
    pieces = [body[i : i + step] for i in range(0, len(body), step)]
    slow = await _exchange(port, head, pieces, gap=1.0)
    assert slow.startswith(b"HTTP/1.1 201"), slow[:300]
    stored = json.loads(slow.partition(b"\r\n\r\n")[2])
    assert stored["size_bytes"] == len(content)

    # The same upload stopping after its first piece: 408, and no object is stored.
    stalled = await _exchange(port, head + pieces[0])
    assert _problem(stalled) == (408, "REQUEST_TIMEOUT")
    with flood_platform.client(account) as client:
        assert client.get("/v1/credits").status_code == 200  # normal requests still work
    conn = await asyncpg.connect(flood_platform.env["HM_DATABASE_URL"])
    try:
        count = await conn.fetchval(
            "SELECT count(*) FROM objects WHERE pool_id = $1", uuid.UUID(account["pool_id"])
        )
    finally:
        await conn.close()
    assert count == 1  # the slow upload only


async def _slow_upload_slot(
    port: int, source: str, api_key: str, answers: Counter[str], stop: asyncio.Event
) -> None:
    """Upload after upload, as the review's F3 did: a valid key, a 10 MB multipart
    ``Content-Length``, the first boundary, then a byte every 0.5 s, until the server answers;
    each answer is counted as ``"{status} {error_code}"`` and the upload started again."""
    head = (
        f"POST /v1/objects HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {api_key}\r\n"
        "Content-Type: multipart/form-data; boundary=BND\r\nContent-Length: 10000000\r\n\r\n--BND\r\n"
    ).encode()
    while not stop.is_set():
        reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
        try:
            writer.write(head)
            got = b""
            while not got and not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    got = await asyncio.wait_for(reader.read(1), 0.5)
                if not got:
                    writer.write(b"a")
            if got:
                got += await asyncio.wait_for(reader.read(), 10)
                status, code = _problem(got)
                answers[f"{status} {code}"] += 1
        except ConnectionError:
            answers["reset"] += 1
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.5)


async def test_one_key_s_slow_uploads_are_capped_while_health_and_another_account_s_job_answer(
    flood_platform: RunningPlatform,
) -> None:
    flooder = flood_platform.admin("create-account", "--credits", "0")  # no credits needed
    other = flood_platform.admin("create-account", "--credits", "100")
    port = int(flood_platform.rest_url.rsplit(":", 1)[1])
    answers: Counter[str] = Counter()
    stop = asyncio.Event()
    slots = [
        asyncio.create_task(
            _slow_upload_slot(port, f"127.0.1.{1 + i % 4}", flooder["api_key"], answers, stop)
        )
        for i in range(12 * UPLOADS_PER_ACCOUNT)
    ]
    try:
        await asyncio.sleep(1)
        job = await asyncio.to_thread(_job_round, flood_platform, other["api_key"])
        assert job["status"] == "completed"
        await asyncio.sleep(BODY_IDLE + 1)  # past the uploads' grace: the held ones are cut
        health = await asyncio.to_thread(httpx.get, flood_platform.rest_url + "/healthz")
        assert health.status_code == 200
    finally:
        stop.set()
        await asyncio.gather(*slots)
    # The key's uploads past its cap were refused before their bodies were read; those it held
    # sent less than the minimum body rate and were cut at their deadline.
    assert answers["429 TOO_MANY_UPLOADS"] >= 11 * UPLOADS_PER_ACCOUNT
    assert answers["408 REQUEST_TIMEOUT"] >= UPLOADS_PER_ACCOUNT
    assert set(answers) <= {"429 TOO_MANY_UPLOADS", "408 REQUEST_TIMEOUT"}, answers
    # Its slots are free again: the same key uploads normally.
    with flood_platform.client(flooder) as client:
        uploaded = client.post("/v1/objects", files={"file": ("after.bin", b"after the flood")})
    assert uploaded.status_code == 201, uploaded.text
