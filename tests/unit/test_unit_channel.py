"""Control's end of the unit socket (hypermedia/worker/unit/channel.py) on a real Unix socket:
what is refused, what is counted, and that only execution's own process gets the evidence (a real
child process plays execution)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from hypermedia.worker.unit import channel, peer
from hypermedia.worker.unit.channel import Channel, Execution

OWN = peer.UnitIdentity("prod", "images-a", "ab" * 16, 4, 0)

EXECUTION = """
import socket, sys, time
s = socket.socket(socket.AF_UNIX)
for _ in range(200):  # until the test's server listens
    try:
        s.connect(sys.argv[1])
        break
    except OSError:
        time.sleep(0.05)
f = s.makefile("rwb")
f.write(sys.argv[2].encode() + b"\\n"); f.flush()
sys.stdout.write(f.readline().decode()); sys.stdout.flush()
f.write(sys.argv[3].encode() + b"\\n"); f.flush()
f.write(sys.argv[4].encode() + b"\\n"); f.flush()
sys.stdin.read()
"""


async def _serve(tmp_path: Path, process: Any) -> tuple[Channel, Execution, asyncio.AbstractServer, str]:
    ex = Execution(OWN, process, None, time.monotonic(), "w-1")
    ch = Channel(lambda: OWN, lambda: ex, lambda: {"lease_expires_at": "soon"})
    path = str(tmp_path / "c.sock")
    server = await asyncio.start_unix_server(ch.serve, path, limit=peer.MAX_MESSAGE_BYTES)
    return ch, ex, server, path


def _line(kind: str, **body: Any) -> str:
    return peer.encode(kind, OWN, **body).decode().strip()


def test_only_executions_own_process_gets_the_evidence_and_is_ready_after_it(tmp_path: Path) -> None:
    path = str(tmp_path / "c.sock")
    lines = [_line("hello", worker_id="w-1"), _line("ready"), _line("status", busy=1)]
    child = subprocess.Popen(
        [sys.executable, "-c", EXECUTION, path, *lines], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )

    async def run() -> tuple[Channel, Execution]:
        ex = Execution(OWN, child, None, time.monotonic(), "w-1")
        ch = Channel(lambda: OWN, lambda: ex, lambda: {"lease_expires_at": "soon"})
        server = await asyncio.start_unix_server(ch.serve, path, limit=peer.MAX_MESSAGE_BYTES)
        try:
            await asyncio.wait_for(ex.ready.wait(), 10)
            for _ in range(100):
                if ex.status:
                    break
                await asyncio.sleep(0.05)
            # Another process (this test) saying the same hello is an impostor.
            reader, writer = await asyncio.open_unix_connection(path)
            writer.write(peer.encode("hello", OWN, worker_id="w-1"))
            await writer.drain()
            assert await asyncio.wait_for(reader.read(), 5) == b""  # closed, no evidence
            writer.close()
        finally:
            server.close()
        return ch, ex

    try:
        ch, ex = asyncio.run(run())
    finally:
        child.stdin.close()  # type: ignore[union-attr]
        out = child.stdout.read().decode()  # type: ignore[union-attr]
        child.wait(10)
    evidence = peer.decode(out.encode())
    assert evidence["kind"] == "evidence" and evidence["lease_expires_at"] == "soon"
    assert peer.stale_reason(evidence, OWN) is None
    assert ex.status == {"busy": 1} and ex.status_at > 0
    assert ch.refused == 1


def test_messages_before_hello_oversized_lines_and_silent_connections_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(channel, "HELLO_SECONDS", 0.3)
    sleeper = subprocess.Popen(["sleep", "30"])

    async def run() -> tuple[Channel, Execution]:
        ch, ex, server, path = await _serve(tmp_path, sleeper)
        try:
            # ready and status before any hello: refused, the connection stays until its deadline
            reader, writer = await asyncio.open_unix_connection(path)
            writer.write(peer.encode("ready", OWN) + peer.encode("status", OWN, busy=9))
            await writer.drain()
            assert await asyncio.wait_for(reader.read(), 5) == b""  # closed at the hello deadline
            # a line longer than a message may be: the connection ends
            reader, writer = await asyncio.open_unix_connection(path)
            writer.write(b"x" * (peer.MAX_MESSAGE_BYTES + 10) + b"\n")
            await writer.drain()
            assert await asyncio.wait_for(reader.read(), 5) == b""
        finally:
            server.close()
        return ch, ex

    try:
        with caplog.at_level("WARNING", logger="hypermedia.worker.unit.channel"):
            ch, ex = asyncio.run(run())
    finally:
        sleeper.kill()
        sleeper.wait()
    assert not ex.ready.is_set() and ex.status == {}
    assert ch.refused == 4  # ready, status, no hello in time, oversized
    said = caplog.text
    assert "a ready message before hello refused" in said and "no hello within" in said
    assert f"a line over {peer.MAX_MESSAGE_BYTES} bytes refused" in said
    assert "a status message before hello refused" not in said  # one line per kind per 10 s


def test_connections_over_the_limit_are_closed_at_once(tmp_path: Path) -> None:
    sleeper = subprocess.Popen(["sleep", "30"])

    async def run() -> tuple[Channel, list[bytes]]:
        ch, _ex, server, path = await _serve(tmp_path, sleeper)
        held = [await asyncio.open_unix_connection(path) for _ in range(channel.MAX_CONNECTIONS)]
        await asyncio.sleep(0.1)
        extra = [await asyncio.open_unix_connection(path) for _ in range(20)]
        ends = [await asyncio.wait_for(r.read(), 5) for r, _w in extra]
        assert ch.open == channel.MAX_CONNECTIONS
        for _r, w in held + extra:
            w.close()
        server.close()
        return ch, ends

    try:
        ch, ends = asyncio.run(run())
    finally:
        sleeper.kill()
        sleeper.wait()
    assert ends == [b""] * 20 and ch.refused == 20
