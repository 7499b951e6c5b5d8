"""The optional virus scan, against a real clamd: the client (``hypermedia.intake.clamav``) over a unix
socket and TCP, and uploads through the platform's REST and gRPC APIs with and without HM_CLAMD_URL.

Each clamd here is started by the test with its own configuration and a one-signature database
written by the test (official signatures cannot be downloaded here): an ``.ndb`` body signature
named ``Eicar-Test-Signature`` for the 68-byte EICAR test string, which matches it anywhere in a
file. clamd reports names from unsigned databases with ``.UNOFFICIAL`` appended. Loading that
database takes clamd well under a second.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import psycopg
import pytest

from hypermedia.api.jobs.v1 import jobs_pb2, jobs_pb2_grpc
from hypermedia.core import config
from hypermedia.devtools.embedded import free_port
from hypermedia.intake.clamav import (
    CHUNK_BYTES,
    ClamdAddress,
    ClamdScanner,
    ScannerUnavailable,
    TooLargeToScan,
    VirusFound,
)
from services.gateway.settings import GatewaySettings
from tests.e2e.conftest import RunningPlatform, own_database, start_platform, upload, wait_job

# Assembled from two halves so that this source file is not itself detected as the test file.
EICAR = b"X5O!P%@AP[4\\PZX54(P^)7CC)7}$" + b"EICAR-STANDARD-ANTIVIRUS-TEST-FILE!$H+H*"
SIGNATURE = "Eicar-Test-Signature"
REPORTED = f"{SIGNATURE}.UNOFFICIAL"
"""What clamd answers for SIGNATURE: it marks names from unsigned databases as unofficial."""
STREAM_MAX_BYTES = 1024 * 1024
"""StreamMaxLength of the test clamd."""
PHOTO = Path(__file__).resolve().parents[1] / "data" / "exif-orientation" / "Landscape_3.jpg"


@dataclass
class Clamd:
    """A clamd process listening on a unix socket and on 127.0.0.1:``tcp_port``."""

    process: subprocess.Popen[bytes]
    directory: Path
    tcp_port: int

    @property
    def socket_path(self) -> Path:
        return self.directory / "clamd.sock"

    @property
    def unix_url(self) -> str:
        return f"unix://{self.socket_path}"

    @property
    def tcp_url(self) -> str:
        return f"tcp://127.0.0.1:{self.tcp_port}"

    def log(self) -> str:
        return (self.directory / "clamd.log").read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def _clamd_binary() -> str:
    found = shutil.which("clamd") or next(
        (p for p in ("/usr/sbin/clamd", "/usr/local/sbin/clamd") if os.access(p, os.X_OK)), None
    )
    if found is None:
        pytest.fail(
            "clamd is not installed: run `scripts/ensure_debian_packages.sh clamav-daemon` as root "
            "(make test does) to install Debian's clamav-daemon",
            pytrace=False,
        )
    return found


def _ping(path: Path) -> bool:
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(1)
            sock.connect(str(path))
            sock.sendall(b"zPING\0")
            return sock.recv(16) == b"PONG\0"
    except OSError:
        return False


def start_clamd(parent: Path) -> Clamd:
    """Start ``clamd --foreground`` in a new directory under ``parent`` (kept short: a unix socket
    path has at most 107 bytes) with the EICAR database; return once it answers PING."""
    binary = _clamd_binary()
    directory = parent / f"clamd-{secrets.token_hex(3)}"
    database = directory / "db"
    database.mkdir(parents=True)
    (database / "eicar.ndb").write_text(f"{SIGNATURE}:0:*:{EICAR.hex()}\n")
    tcp_port = free_port()
    conf = directory / "clamd.conf"
    conf.write_text(
        "\n".join(
            [
                "Foreground yes",
                f"LocalSocket {directory / 'clamd.sock'}",
                f"TCPSocket {tcp_port}",
                "TCPAddr 127.0.0.1",
                f"DatabaseDirectory {database}",
                f"TemporaryDirectory {directory}",
                f"PidFile {directory / 'clamd.pid'}",
                f"StreamMaxLength {STREAM_MAX_BYTES // 1024}K",
                "SelfCheck 0",
                "",
            ]
        )
    )
    log = (directory / "clamd.log").open("ab")
    process = subprocess.Popen(
        [binary, "--foreground", f"--config-file={conf}"], stdout=log, stderr=subprocess.STDOUT
    )
    clamd = Clamd(process, directory, tcp_port)
    deadline = time.monotonic() + 30
    while not _ping(clamd.socket_path):
        if process.poll() is not None or time.monotonic() > deadline:
            clamd.stop()
            pytest.fail(f"clamd did not start:\n{clamd.log()[-3000:]}", pytrace=False)
        time.sleep(0.05)
    return clamd


@pytest.fixture(scope="module")
def clamd(tmp_root: Path) -> Iterator[Clamd]:
    """One clamd for the module's read-only tests and the scanning platform."""
    daemon = start_clamd(tmp_root)
    try:
        yield daemon
    finally:
        daemon.stop()


@pytest.fixture
def own_clamd(tmp_root: Path) -> Iterator[Clamd]:
    """A clamd of the test's own, for tests that stop or kill it."""
    daemon = start_clamd(tmp_root)
    try:
        yield daemon
    finally:
        if daemon.process.poll() is None:
            daemon.process.send_signal(signal.SIGCONT)
        daemon.stop()


def scanner(url: str, timeout: float = 10.0, max_stream_bytes: int = 8 * STREAM_MAX_BYTES) -> ClamdScanner:
    return ClamdScanner(ClamdAddress.parse(url), timeout_seconds=timeout, max_stream_bytes=max_stream_bytes)


# -- configuration -----------------------------------------------------------------------------


def test_clamd_url_forms() -> None:
    assert ClamdAddress.parse("unix:///run/clamav/clamd.ctl") == ClamdAddress(
        unix_path="/run/clamav/clamd.ctl"
    )
    assert ClamdAddress.parse("tcp://clamav:3310") == ClamdAddress(host="clamav", port=3310)
    assert ClamdAddress.parse("tcp://[::1]:3310") == ClamdAddress(host="::1", port=3310)
    for bad in (
        "unix://relative/clamd.ctl",
        "tcp://clamav",
        "tcp://clamav:0",
        "tcp://clamav:70000",
        "http://x:1",
    ):
        with pytest.raises(ValueError, match="HM_CLAMD_URL"):
            ClamdAddress.parse(bad)


def test_scanning_is_off_by_default_and_a_bad_url_stops_the_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HM_CLAMD_URL", raising=False)
    settings = config.load(GatewaySettings)
    assert settings.clamd_url == ""
    assert (settings.clamd_timeout_seconds, settings.clamd_max_stream_bytes) == (60.0, 100 * 1024 * 1024)
    monkeypatch.setenv("HM_CLAMD_URL", "clamd.example:3310")
    with pytest.raises(config.ConfigError, match="HM_CLAMD_URL must be") as info:
        config.load(GatewaySettings)
    assert "clamd.example" not in str(info.value)


# -- the client against a real clamd -------------------------------------------------------------


@pytest.mark.parametrize("transport", ["unix", "tcp"])
async def test_clean_bytes_pass_and_eicar_is_found_by_name(clamd: Clamd, transport: str) -> None:
    client = scanner(clamd.unix_url if transport == "unix" else clamd.tcp_url)
    assert await client.ping()
    assert (await client.scan(b"just some bytes\n")).signature is None
    assert not (await client.scan(PHOTO.read_bytes())).infected
    result = await client.scan(EICAR)
    assert result.infected and result.signature == REPORTED
    with pytest.raises(VirusFound) as info:
        await client.ensure_clean(EICAR)
    err = info.value
    assert (err.error_code, err.http_status, err.retryable) == ("VIRUS_FOUND", 422, False)
    assert err.signature == REPORTED and REPORTED in err.public_message


async def test_eicar_inside_a_larger_file_across_a_chunk_boundary(clamd: Clamd) -> None:
    filler = os.urandom(3 * CHUNK_BYTES)
    at = 2 * CHUNK_BYTES - len(EICAR) // 2  # the string straddles the second chunk boundary
    content = filler[:at] + EICAR + filler[at:]
    assert len(content) < STREAM_MAX_BYTES
    assert (await scanner(clamd.unix_url).scan(content)).signature == REPORTED
    assert (await scanner(clamd.unix_url).scan(filler)).signature is None


@pytest.mark.parametrize("transport", ["unix", "tcp"])
async def test_a_stream_above_clamds_stream_max_length_is_refused_clearly(
    clamd: Clamd, transport: str
) -> None:
    client = scanner(clamd.unix_url if transport == "unix" else clamd.tcp_url)
    assert (await client.scan(bytes(STREAM_MAX_BYTES))).signature is None  # the limit itself passes
    with pytest.raises(TooLargeToScan) as info:
        await client.scan(bytes(STREAM_MAX_BYTES + 1))
    assert (info.value.error_code, info.value.http_status) == ("INPUT_TOO_LARGE_TO_SCAN", 413)
    with pytest.raises(TooLargeToScan):
        await client.scan(bytes(6 * STREAM_MAX_BYTES))  # clamd closes while the client still sends
    assert (await client.scan(EICAR)).signature == REPORTED  # clamd serves on


async def test_the_client_limit_refuses_before_connecting(tmp_root: Path) -> None:
    client = scanner(f"unix://{tmp_root}/no-clamd-here.sock", max_stream_bytes=1000)
    with pytest.raises(TooLargeToScan, match="1000 bytes"):
        await client.scan(bytes(1001))  # a size error, not SCANNER_UNAVAILABLE: nothing was dialled


async def test_a_scanner_that_is_down_is_unavailable_never_clean(own_clamd: Clamd, tmp_root: Path) -> None:
    own_clamd.process.kill()  # SIGKILL leaves the socket file behind: connection refused
    own_clamd.process.wait()
    assert own_clamd.socket_path.exists()
    targets = [own_clamd.unix_url, own_clamd.tcp_url, f"unix://{tmp_root}/never-existed.sock"]
    for url in targets:
        client = scanner(url)
        assert not await client.ping()
        for call in (client.scan, client.ensure_clean):
            with pytest.raises(ScannerUnavailable) as info:
                await call(b"anything")
            err = info.value
            assert (err.error_code, err.http_status, err.retryable) == ("SCANNER_UNAVAILABLE", 503, True)


async def test_a_scanner_that_does_not_answer_times_out(own_clamd: Clamd) -> None:
    own_clamd.process.send_signal(signal.SIGSTOP)  # it still accepts connections, but never replies
    try:
        client = scanner(own_clamd.unix_url, timeout=0.5)
        started = time.monotonic()
        with pytest.raises(ScannerUnavailable, match="did not answer in time"):
            await client.scan(EICAR)
        assert time.monotonic() - started < 2
        assert not await client.ping()
    finally:
        own_clamd.process.send_signal(signal.SIGCONT)
    assert (await scanner(own_clamd.unix_url).scan(EICAR)).signature == REPORTED


async def test_concurrent_scans(clamd: Clamd) -> None:
    client = scanner(clamd.unix_url)
    results = await asyncio.gather(*(client.scan(EICAR if i % 2 else b"clean %d" % i) for i in range(20)))
    assert [r.signature for r in results] == [REPORTED if i % 2 else None for i in range(20)]


# -- end to end through the platform -------------------------------------------------------------


@pytest.fixture(scope="module")
def clamav_database(database_url: str) -> Iterator[str]:
    """A database of this module's platforms alone (their reapers must not see other jobs)."""
    with own_database(database_url, "clamav") as dsn:
        yield dsn


@pytest.fixture(scope="module")
def scanning_platform(
    tmp_root: Path, clamav_database: str, nats_url: str, clamd: Clamd
) -> Iterator[RunningPlatform]:
    # The imageworker is the only worker these tests use (thumbnail): no office listeners to start.
    running = start_platform(
        tmp_root,
        clamav_database,
        nats_url,
        "credits,storage,gateway,reaper,imageworker",
        HM_CLAMD_URL=clamd.unix_url,
    )
    try:
        yield running
    finally:
        assert running.stop() == 0


@pytest.fixture(scope="module")
def dead_scanner_platform(tmp_root: Path, clamav_database: str, nats_url: str) -> Iterator[RunningPlatform]:
    """A gateway whose clamd was killed after the platform became ready (readiness waits for clamd)."""
    daemon = start_clamd(tmp_root)
    try:
        running = start_platform(
            tmp_root,
            clamav_database,
            nats_url,
            services="credits,storage,gateway",
            HM_CLAMD_URL=daemon.unix_url,
        )
    finally:
        daemon.process.kill()
        daemon.process.wait()
    try:
        yield running
    finally:
        assert running.stop() == 0


@pytest.fixture(scope="module")
def plain_platform(tmp_root: Path, clamav_database: str, nats_url: str) -> Iterator[RunningPlatform]:
    running = start_platform(tmp_root, clamav_database, nats_url, services="credits,storage,gateway")
    try:
        yield running
    finally:
        assert running.stop() == 0


ClientOf = Callable[[RunningPlatform], tuple[httpx.Client, dict[str, Any]]]


@pytest.fixture
def client_of() -> Iterator[ClientOf]:
    """Makes a fresh account on a platform and an authenticated REST client of it."""
    opened: list[httpx.Client] = []

    def make(platform: RunningPlatform) -> tuple[httpx.Client, dict[str, Any]]:
        account = platform.admin("create-account", "--credits", "100")
        client = platform.client(account)
        opened.append(client)
        return client, account

    yield make
    for client in opened:
        client.close()


def stored(platform: RunningPlatform, dsn: str, pool_id: str) -> tuple[int, list[Path]]:
    """Objects rows and original files of ``pool_id``."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT count(*) FROM objects WHERE pool_id = %s", (pool_id,)).fetchone()
    originals = Path(platform.info["objects_dir"]) / "originals" / pool_id
    files = [p for p in originals.rglob("*") if p.is_file()] if originals.exists() else []
    return (rows[0] if rows else -1), files


def test_eicar_upload_is_rejected_naming_the_signature_and_nothing_is_stored(
    scanning_platform: RunningPlatform, clamav_database: str, client_of: ClientOf
) -> None:
    client, account = client_of(scanning_platform)
    ready = httpx.get(scanning_platform.rest_url + "/readyz", timeout=10).json()
    assert ready["checks"]["clamd"] is True
    for name, content in (("eicar.com", EICAR), ("holiday.jpg", PHOTO.read_bytes()[:4096] + EICAR)):
        response = client.post("/v1/objects", files={"file": (name, content)})
        assert response.status_code == 422, response.text
        assert response.headers["content-type"].startswith("application/problem+json")
        problem = response.json()
        assert problem["error_code"] == "VIRUS_FOUND"
        assert REPORTED in problem["detail"]
        assert problem["signature"] == REPORTED
    assert stored(scanning_platform, clamav_database, account["pool_id"]) == (0, [])
    log = (scanning_platform.state_dir / "logs" / "gateway.log").read_text()
    assert f"virus scan: {REPORTED} FOUND" in log


def test_eicar_over_grpc_is_rejected_with_the_error_code(
    scanning_platform: RunningPlatform, client_of: ClientOf
) -> None:
    _, account = client_of(scanning_platform)

    async def call() -> grpc.aio.AioRpcError:
        async with grpc.aio.insecure_channel(scanning_platform.grpc_addr) as chan:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await jobs_pb2_grpc.JobServiceStub(chan).UploadObject(
                    jobs_pb2.UploadObjectRequest(content=EICAR, filename="eicar.txt"),
                    metadata=(("authorization", f"Bearer {account['api_key']}"),),
                )
            return info.value

    err = asyncio.run(call())
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert dict(err.trailing_metadata())["hm-error-code"] == "VIRUS_FOUND"
    assert REPORTED in (err.details() or "")


def test_a_clean_photo_is_scanned_stored_and_processed(
    scanning_platform: RunningPlatform, clamav_database: str, client_of: ClientOf
) -> None:
    client, account = client_of(scanning_platform)
    obj = upload(client, PHOTO)
    assert obj["mime_type"] == "image/jpeg"
    assert stored(scanning_platform, clamav_database, account["pool_id"])[0] == 1
    created = client.post(
        "/v1/hypermedia/process", json={"object_id": obj["object_id"], "operations": ["thumbnail"]}
    )
    assert created.status_code == 202, created.text
    job = wait_job(client, created.json()["job_ids"][0])
    assert job["status"] == "completed", job
    assert job["outputs"][0]["mime_type"] == "image/webp"


def test_a_dead_scanner_refuses_uploads_with_503(
    dead_scanner_platform: RunningPlatform, clamav_database: str, client_of: ClientOf
) -> None:
    client, account = client_of(dead_scanner_platform)
    for content in (PHOTO.read_bytes(), EICAR):
        response = client.post("/v1/objects", files={"file": ("x.jpg", content)})
        assert response.status_code == 503, response.text
        assert response.json()["error_code"] == "SCANNER_UNAVAILABLE"
    assert stored(dead_scanner_platform, clamav_database, account["pool_id"]) == (0, [])
    ready = httpx.get(dead_scanner_platform.rest_url + "/readyz", timeout=10)
    assert ready.status_code == 503 and ready.json()["checks"]["clamd"] is False


def test_without_clamd_url_uploads_are_not_scanned(
    plain_platform: RunningPlatform, clamav_database: str, client_of: ClientOf
) -> None:
    client, account = client_of(plain_platform)
    response = client.post("/v1/objects", files={"file": ("eicar.com", EICAR)})
    assert response.status_code == 201, response.text
    assert response.json()["size_bytes"] == len(EICAR)
    assert stored(plain_platform, clamav_database, account["pool_id"])[0] == 1
    assert "clamd" not in httpx.get(plain_platform.rest_url + "/readyz", timeout=10).json()["checks"]
