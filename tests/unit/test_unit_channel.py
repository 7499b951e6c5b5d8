"""Control's end of the unit socket (hypermedia/worker/unit/channel.py) on a real Unix socket:
what is refused, what is counted, and that only execution's own process gets the evidence (a real
child process plays execution)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import types
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
    ex = Execution(OWN, process, None, time.monotonic(), ("w-1",))
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
        ex = Execution(OWN, child, None, time.monotonic(), ("w-1",))
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


def test_idle_connections_cannot_keep_execution_out(tmp_path: Path) -> None:
    """Four connections that never say hello fill the socket; more connections close the oldest
    idle one each, never more than four are open, and execution still gets its evidence."""
    path = str(tmp_path / "c.sock")
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            EXECUTION,
            path,
            _line("hello", worker_id="w-1"),
            _line("ready"),
            _line("status"),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )

    async def run() -> tuple[Channel, list[bytes], int]:
        ex = Execution(OWN, child, None, time.monotonic(), ("w-1",))
        ch = Channel(lambda: OWN, lambda: ex, lambda: {})
        server = await asyncio.start_unix_server(ch.serve, path, limit=peer.MAX_MESSAGE_BYTES)
        idle = [await asyncio.open_unix_connection(path) for _ in range(channel.MAX_CONNECTIONS + 20)]
        await asyncio.sleep(0.2)
        most = ch.open
        ends = [await asyncio.wait_for(r.read(), 5) for r, _w in idle[:20]]  # the oldest: closed
        await asyncio.wait_for(ex.ready.wait(), 10)
        for _r, w in idle:
            w.close()
        server.close()
        return ch, ends, most

    try:
        ch, ends, most = asyncio.run(run())
    finally:
        child.stdin.close()  # type: ignore[union-attr]
        out = child.stdout.read().decode()  # type: ignore[union-attr]
        child.wait(10)
    assert most <= channel.MAX_CONNECTIONS and ends == [b""] * 20
    assert peer.decode(out.encode())["kind"] == "evidence"
    assert ch.refused >= 20


def test_a_connection_of_an_earlier_generation_is_closed_after_a_relaunch(tmp_path: Path) -> None:
    """After a relaunch a connection that said hello as generation 0 cannot mark generation 1
    ready, nor report for it."""
    identity = [OWN]
    me = types.SimpleNamespace(pid=os.getpid())
    ex0 = Execution(OWN, me, None, time.monotonic(), ("w-1",))  # type: ignore[arg-type]
    current = [ex0]

    async def run() -> tuple[Channel, Execution, bytes]:
        ch = Channel(lambda: identity[0], lambda: current[0], lambda: {})
        path = str(tmp_path / "c.sock")
        server = await asyncio.start_unix_server(ch.serve, path, limit=peer.MAX_MESSAGE_BYTES)
        reader, writer = await asyncio.open_unix_connection(path)
        writer.write(peer.encode("hello", OWN))
        await writer.drain()
        await asyncio.wait_for(reader.readline(), 5)  # evidence
        g1 = peer.UnitIdentity(**{**OWN.__dict__, "generation": 1})
        identity[0] = g1
        current[0] = Execution(g1, types.SimpleNamespace(pid=999_999), None, time.monotonic(), ("w-2",))  # type: ignore[arg-type]
        writer.write(peer.encode("ready", g1) + peer.encode("status", g1, busy=7))
        await writer.drain()
        end = await asyncio.wait_for(reader.read(), 5)
        writer.close()
        server.close()
        return ch, current[0], end

    ch, ex1, end = asyncio.run(run())
    assert end == b"" and not ex1.ready.is_set() and ex1.status == {}
    assert ch.refused == 1
