"""The upload endpoint under hostile HTTP: the body of an anonymous request is never read, and a
chunked body (no Content-Length) is cut off at the limit, so neither the temp directory nor the
gateway's memory grows with what a client sends."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.e2e.conftest import RunningPlatform, isolated_platform

LIMIT = 2 * 1024 * 1024
"""HM_MAX_UPLOAD_BYTES of this module's platform."""


@pytest.fixture(scope="module")
def small_platform(tmp_root: Path, database_url: str, nats_url: str) -> Iterator[RunningPlatform]:
    with isolated_platform(
        tmp_root,
        database_url,
        nats_url,
        "limits",
        services="credits,storage,gateway",
        HM_MAX_UPLOAD_BYTES=str(LIMIT),
    ) as running:
        yield running


def _gateway(platform: RunningPlatform) -> psutil.Process:
    pid = int((platform.state_dir / "run" / "gateway.pid").read_text())
    return psutil.Process(pid)


def _chunked_upload(platform: RunningPlatform, total: int, api_key: str | None) -> tuple[int, bytes, int]:
    """Send a multipart upload of ``total`` bytes with chunked encoding; returns (status, body,
    bytes the server let us send before answering)."""
    port = int(platform.rest_url.rsplit(":", 1)[1])
    boundary = "hmboundary"
    head = (
        f"POST /v1/objects HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
        f"Content-Type: multipart/form-data; boundary={boundary}\r\n"
        + (f"Authorization: Bearer {api_key}\r\n" if api_key else "")
        + "\r\n"
    ).encode()
    sent = 0
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head)
        part = (
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.bin"\r\n\r\n'.encode()
        )
        sock.sendall(b"%x\r\n" % len(part) + part + b"\r\n")
        chunk = b"A" * (256 * 1024)
        try:
            while sent < total:
                sock.sendall(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
                sent += len(chunk)
            tail = f"\r\n--{boundary}--\r\n".encode()
            sock.sendall(b"%x\r\n" % len(tail) + tail + b"\r\n0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and closed: what we want
        answer = b""
        deadline = time.monotonic() + 30
        while b"\r\n\r\n" not in answer and time.monotonic() < deadline:
            data = sock.recv(65536)
            if not data:
                break
            answer += data
    status = int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1") else 0
    return status, answer, sent


def test_an_anonymous_chunked_upload_is_refused_before_its_body_is_read(
    small_platform: RunningPlatform,
) -> None:
    gateway = _gateway(small_platform)
    rss_before = gateway.memory_info().rss
    status, answer, _sent = _chunked_upload(small_platform, 64 * LIMIT, api_key=None)
    assert status == 401, answer[:300]
    assert b"UNAUTHENTICATED" in answer or b"401" in answer
    assert gateway.memory_info().rss - rss_before < 32 * 1024 * 1024


def test_a_chunked_upload_past_the_limit_is_cut_off_with_413(small_platform: RunningPlatform) -> None:
    account = small_platform.admin("create-account", "--credits", "10")
    status, answer, _sent = _chunked_upload(small_platform, 64 * LIMIT, api_key=account["api_key"])
    assert status == 413, answer[:300]
    assert b'"error_code":"INPUT_TOO_LARGE"' in answer
    with small_platform.client(account) as client:
        ok = client.post("/v1/objects", files={"file": ("a.bin", b"B" * 1000)})
        assert ok.status_code == 201, ok.text


def test_empty_and_oversized_uploads_are_specific_errors(small_platform: RunningPlatform) -> None:
    account = small_platform.admin("create-account", "--credits", "10")
    with small_platform.client(account) as client:
        empty = client.post("/v1/objects", files={"file": ("e.bin", b"")})
        assert (empty.status_code, empty.json()["error_code"]) == (422, "EMPTY_FILE")
        big = client.post("/v1/objects", files={"file": ("b.bin", b"C" * (LIMIT + 1))})
        assert (big.status_code, big.json()["error_code"]) == (413, "INPUT_TOO_LARGE")
