"""Shared fixtures of the attack-corpus tests: a TCP listener that counts every connection made to
it (a hostile file that makes anything reach out shows up as a connection)."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest


@dataclass
class Listener:
    """A TCP server on 127.0.0.1 that accepts and closes connections, recording each peer."""

    sock: socket.socket
    connections: list[tuple[str, int]] = field(default_factory=list)

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}/x.png"


@pytest.fixture
def listener() -> Iterator[Listener]:
    """A listener that must see 0 connections: assert ``listener.connections == []`` at the end."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    sock.settimeout(0.2)
    box = Listener(sock)
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, peer = sock.accept()
            except (TimeoutError, OSError):
                continue
            box.connections.append(peer)
            conn.close()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield box
    finally:
        stop.set()
        thread.join(2)
        sock.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """In the unprivileged run (``HM_SECURITY_UNPRIVILEGED=1``, scripts/test_unprivileged.sh) a
    test skipped for lack of root fails instead: the same probes must hold without root (issue 18
    item 6). Other skips (a program not installed) stay skips and are listed by ``-rs``."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if os.environ.get("HM_SECURITY_UNPRIVILEGED") != "1" or not report.skipped:
        return
    reason = str(report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr)
    if "root" in reason.lower():
        report.outcome = "failed"
        report.longrepr = f"skipped for lack of root in the unprivileged run: {reason}"
