"""The same-host hand-off of originals (ADR 0045): a presigned GET URL traded on a Unix socket for
a file descriptor, checked exactly as the HTTP GET is, and the worker's fall back to HTTP."""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from hypermedia.core.errors import PermanentJobError
from hypermedia.infra.httpserver import HttpServer
from hypermedia.worker.handoff import Handoff
from hypermedia.worker.transfer import Transfers
from services.storage import handoff as storage_handoff
from services.storage.handoff import HandoffServer
from services.storage.localstore import LocalStore, build_app

KEY = "originals/acct/obj-1"
DATA = secrets.token_bytes(3 * 1024 * 1024 + 17)


@pytest.fixture
def store(tmp_path: Path) -> LocalStore:
    local = LocalStore(tmp_path / "objects", b"k" * 32, "http://127.0.0.1:9")  # nothing listens on 9
    path = local.path(KEY)
    path.parent.mkdir(parents=True)
    path.write_bytes(DATA)
    return local


@pytest.fixture
async def server(store: LocalStore) -> Iterator[Path]:
    sock = Path(f"/tmp/hm-handoff-{secrets.token_hex(4)}.sock")
    handoff = HandoffServer(store, sock)
    handoff.start()
    yield sock
    await handoff.stop()
    assert not await asyncio.to_thread(sock.exists)


async def test_a_signed_url_gets_the_bytes_by_descriptor_and_no_http(
    store: LocalStore, server: Path, tmp_path: Path
) -> None:
    url, _ = await store.presign_get(KEY, 60, "image/jpeg")
    dest = tmp_path / "input"
    # The HTTP client points at a closed port: any HTTP request would fail the download.
    async with httpx.AsyncClient() as http:
        transfers = Transfers(storage=None, http=http, handoff_socket=str(server))  # type: ignore[arg-type]
        await transfers.download(url, dest, max_bytes=len(DATA))
    assert await asyncio.to_thread(dest.read_bytes) == DATA
    assert stat.S_IMODE((await asyncio.to_thread(server.stat)).st_mode) == 0o660


@pytest.mark.parametrize(
    "tamper",
    [
        lambda url: url.replace("sig=", "sig=0"),
        lambda url: url.replace("originals/acct/obj-1", "originals/acct/obj-2"),
        lambda url: url.replace("ct=image%2Fjpeg", "ct=text%2Fhtml"),
    ],
    ids=["signature", "other-key", "other-type"],
)
async def test_a_tampered_url_gets_no_descriptor(
    store: LocalStore, server: Path, tamper, tmp_path: Path
) -> None:
    url, _ = await store.presign_get(KEY, 60, "image/jpeg")
    reply, fd = await _raw(server, tamper(url))
    assert fd is None and reply["status"] == 403 and reply["error_code"] == "URL_REJECTED"
    assert not await Handoff(str(server)).fetch(tamper(url), tmp_path / "input", len(DATA))
    assert not (tmp_path / "input").exists()


async def test_expired_missing_and_invalid_keys_are_refused(store: LocalStore, server: Path) -> None:
    url, _ = await store.presign_get(KEY, 1, "")
    await asyncio.sleep(2.1)
    assert (await _raw(server, url))[0]["status"] == 403
    gone, _ = await store.presign_get("originals/acct/nothing", 60, "")
    assert (await _raw(server, gone))[0] == {
        "status": 404,
        "error_code": "NOT_FOUND",
        "detail": "no such object",
    }
    assert (await _raw(server, "/o/../../etc/passwd?expires=1&sig=x"))[0]["error_code"] == "INVALID_KEY"
    assert (await _raw(server, "\xff garbage"))[0]["status"] == 400


async def test_a_symlink_in_the_store_is_not_followed(store: LocalStore, server: Path) -> None:
    link = store.path("originals/acct/link")
    link.symlink_to("/etc/hostname")
    url, _ = await store.presign_get("originals/acct/link", 60, "")
    assert (await _raw(server, url))[0]["status"] == 404


async def test_an_input_over_the_limit_is_refused(store: LocalStore, server: Path, tmp_path: Path) -> None:
    url, _ = await store.presign_get(KEY, 60, "")
    with pytest.raises(PermanentJobError) as caught:
        await Handoff(str(server)).fetch(url, tmp_path / "input", len(DATA) - 1)
    assert caught.value.error_code == "INPUT_TOO_LARGE"


async def test_without_the_socket_the_download_goes_over_http(store: LocalStore, tmp_path: Path) -> None:
    http_server = HttpServer("127.0.0.1", 0)
    served = LocalStore(store.root, b"k" * 32, f"http://127.0.0.1:{http_server.port}")
    await http_server.start(build_app(served, 1 << 20))
    try:
        url, _ = await served.presign_get(KEY, 60, "")
        async with httpx.AsyncClient() as http:
            transfers = Transfers(storage=None, http=http, handoff_socket=str(tmp_path / "none.sock"))  # type: ignore[arg-type]
            await transfers.download(url, tmp_path / "input", len(DATA))
    finally:
        await http_server.stop()
    assert (tmp_path / "input").read_bytes() == DATA


async def test_a_silent_or_flooding_client_does_not_hold_the_server(store: LocalStore, server: Path) -> None:
    idle = socket.socket(socket.AF_UNIX)
    idle.connect(str(server))
    flood = socket.socket(socket.AF_UNIX)
    flood.connect(str(server))
    flood.sendall(b"x" * 20000)
    try:
        url, _ = await store.presign_get(KEY, 60, "")
        reply, fd = await _raw(server, url)
        assert reply["status"] == 200 and fd is not None
        os.close(fd)
    finally:
        idle.close()
        flood.close()


async def _raw(path: Path, request: str) -> tuple[dict, int | None]:
    handoff = Handoff(str(path))
    line = request if request.startswith(("/", "\xff")) else request.split("127.0.0.1:9", 1)[1]
    return handoff._exchange(line.encode("utf-8", "surrogateescape") + b"\n")


async def test_a_dripping_client_is_cut_at_the_line_deadline_and_a_flood_is_bounded(
    store: LocalStore, server: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One byte every 0.3 s never makes a line within the deadline (1 s here): the connection is
    closed however it drips. Beyond MAX_EXCHANGES connections at once the next is closed before a
    thread is started for it; once the drips are cut, exchanges are served again."""
    monkeypatch.setattr(storage_handoff, "REQUEST_TIMEOUT_SECONDS", 1.0)
    drips = []
    for _ in range(storage_handoff.MAX_EXCHANGES):
        conn = socket.socket(socket.AF_UNIX)
        conn.connect(str(server))
        drips.append(conn)
    try:
        await asyncio.sleep(0.2)  # every drip holds its slot
        extra = socket.socket(socket.AF_UNIX)
        extra.connect(str(server))
        extra.settimeout(2)
        assert await asyncio.to_thread(extra.recv, 10) == b""  # closed at once, nothing answered
        extra.close()
        started = time.monotonic()
        closed = 0
        while closed < len(drips) and time.monotonic() - started < 4:
            closed = 0
            for conn in drips:
                try:
                    conn.send(b"A")
                except OSError:
                    closed += 1
            await asyncio.sleep(0.3)
        assert closed == len(drips), f"{closed} of {len(drips)} drips cut"
        assert time.monotonic() - started < 3
        url, _ = await store.presign_get(KEY, 60, "")
        reply, fd = await _raw(server, url)
        assert reply["status"] == 200 and fd is not None
        os.close(fd)
    finally:
        for conn in drips:
            conn.close()
