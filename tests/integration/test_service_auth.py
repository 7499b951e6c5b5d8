"""Service authentication of internal gRPC (ADR 0044): real TLS handshakes, real storage and credits
servicers on a real Postgres, certificates made by :mod:`hypermedia.infra.mtls` as ``hypermedia up``
makes them.

Each refusal is checked against the database too: a refused Grant leaves the balance as it was.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding
from cryptography.x509.oid import NameOID
from prometheus_client import REGISTRY

from hypermedia.api.credits.v1 import credits_pb2, credits_pb2_grpc
from hypermedia.api.storage.v1 import storage_pb2, storage_pb2_grpc
from hypermedia.core.config import ConfigError, load
from hypermedia.core.errors import ERROR_CODE_METADATA_KEY
from hypermedia.infra import mtls
from hypermedia.infra.rpc import GrpcServer, channel
from services.credits.service import CreditsService
from services.storage.localstore import LocalStore
from services.storage.service import SERVICE_NAME, StorageServicer
from tests.integration.conftest import CREDITS_SERVICE_NAME, Seeder, Tenant

HEALTHCHECK = Path(__file__).resolve().parents[2] / "deploy" / "docker" / "healthcheck.py"


@dataclass
class Pki:
    directory: Path
    ca: tuple[x509.Certificate, ec.EllipticCurvePrivateKey]

    def tls(self, identity: str) -> mtls.Tls:
        return mtls.Tls.from_dir(self.directory, identity)


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    directory = tmp_path / "tls"
    ca = mtls.make_ca(directory)
    for identity in sorted(mtls.IDENTITIES):
        mtls.issue(directory, identity, ca)
    return Pki(directory, ca)


@dataclass
class Servers:
    credits: str
    storage: str


@pytest.fixture
async def servers(fresh_pool: asyncpg.Pool, pki: Pki, tmp_path: Path) -> AsyncIterator[Servers]:
    """Credits and storage, each on a real port with its own certificate, as their __main__ builds them."""
    credits = GrpcServer(
        "127.0.0.1:0",
        [(credits_pb2_grpc.add_CreditsServiceServicer_to_server, CreditsService(fresh_pool))],
        [CREDITS_SERVICE_NAME],
        tls=pki.tls("credits"),
    )
    store = LocalStore(tmp_path / "objects", b"k" * 32, "http://127.0.0.1:9")
    storage = GrpcServer(
        "127.0.0.1:0",
        [
            (
                storage_pb2_grpc.add_StorageServiceServicer_to_server,
                StorageServicer(fresh_pool, store, url_ttl_seconds=300, max_put_bytes=1 << 20),
            )
        ],
        [SERVICE_NAME],
        tls=pki.tls("storage"),
    )
    await credits.start()
    await storage.start()
    try:
        yield Servers(f"127.0.0.1:{credits.port}", f"127.0.0.1:{storage.port}")
    finally:
        await credits.stop(0)
        await storage.stop(0)


async def _balance(pool: asyncpg.Pool, tenant: Tenant) -> int:
    return int(
        await pool.fetchval("SELECT balance FROM credit_accounts WHERE account_id = $1", tenant.account_id)
    )


def _grant(tenant: Tenant) -> credits_pb2.GrantRequest:
    return credits_pb2.GrantRequest(
        account_id=str(tenant.account_id), millicredits=5000, grant_id=str(uuid.uuid4())
    )


def _code(exc: grpc.aio.AioRpcError) -> str:
    return dict(exc.trailing_metadata() or ()).get(ERROR_CODE_METADATA_KEY, "")


async def test_admin_grants_over_mtls(
    servers: Servers, pki: Pki, seed: Seeder, fresh_pool: asyncpg.Pool
) -> None:
    tenant = await seed.tenant(balance=1000)
    async with channel(servers.credits, pki.tls("admin"), "credits") as chan:
        response = await credits_pb2_grpc.CreditsServiceStub(chan).Grant(_grant(tenant), timeout=10)
    assert response.balance_millicredits == 6000
    assert await _balance(fresh_pool, tenant) == 6000


async def test_call_without_client_certificate_fails_the_handshake(
    servers: Servers, pki: Pki, seed: Seeder, fresh_pool: asyncpg.Pool
) -> None:
    tenant = await seed.tenant(balance=1000)
    ca = (pki.directory / "ca.pem").read_bytes()
    server_only = grpc.ssl_channel_credentials(root_certificates=ca)  # trusts the server, shows no cert
    async with grpc.aio.secure_channel(
        servers.credits, server_only, options=[("grpc.ssl_target_name_override", "credits")]
    ) as chan:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await credits_pb2_grpc.CreditsServiceStub(chan).Grant(_grant(tenant), timeout=5)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    async with grpc.aio.insecure_channel(servers.credits) as chan:  # plaintext: no TLS at all
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await credits_pb2_grpc.CreditsServiceStub(chan).Grant(_grant(tenant), timeout=5)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert await _balance(fresh_pool, tenant) == 1000


async def test_certificate_of_another_ca_fails_the_handshake(
    servers: Servers, pki: Pki, seed: Seeder, fresh_pool: asyncpg.Pool, tmp_path: Path
) -> None:
    tenant = await seed.tenant(balance=1000)
    rogue_dir = tmp_path / "rogue"
    rogue = mtls.issue(rogue_dir, "admin", mtls.make_ca(rogue_dir, "another CA"))  # same identity, other CA
    posing = mtls.Tls((pki.directory / "ca.pem").read_bytes(), rogue.cert, rogue.key)
    async with channel(servers.credits, posing, "credits") as chan:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await credits_pb2_grpc.CreditsServiceStub(chan).Grant(_grant(tenant), timeout=5)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert await _balance(fresh_pool, tenant) == 1000


async def test_certificate_naming_no_known_identity_is_unauthenticated(
    servers: Servers, pki: Pki, seed: Seeder, fresh_pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture
) -> None:
    """Signed by the platform's CA, but its URI SAN names no service: the handshake passes, the
    interceptor refuses."""
    tenant = await seed.tenant(balance=1000)
    ca_cert, ca_key = pki.ca
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "admin")]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.UniformResourceIdentifier("spiffe://hypermedia/intruder")]),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    stranger = mtls.Tls(
        ca_cert.public_bytes(Encoding.PEM), cert.public_bytes(Encoding.PEM), mtls._key_pem(key)
    )
    caplog.set_level(logging.WARNING, logger="hypermedia.infra.mtls")
    async with channel(servers.credits, stranger, "credits") as chan:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await credits_pb2_grpc.CreditsServiceStub(chan).Grant(_grant(tenant), timeout=5)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert _code(err.value) == "UNAUTHENTICATED"
    assert await _balance(fresh_pool, tenant) == 1000
    assert any(
        "no service identity" in r.getMessage() and "CreditsService/Grant" in r.getMessage()
        for r in caplog.records
    )


async def test_gateway_may_not_grant(
    servers: Servers, pki: Pki, seed: Seeder, fresh_pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture
) -> None:
    tenant = await seed.tenant(balance=1000)
    caplog.set_level(logging.WARNING, logger="hypermedia.infra.mtls")
    denied = {
        "grpc_service": "hypermedia.credits.v1.CreditsService",
        "grpc_method": "Grant",
        "grpc_code": "PERMISSION_DENIED",
    }
    before = REGISTRY.get_sample_value("grpc_server_handled_total", denied) or 0.0
    async with channel(servers.credits, pki.tls("gateway"), "credits") as chan:
        stub = credits_pb2_grpc.CreditsServiceStub(chan)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Grant(_grant(tenant), timeout=5)
        # The refusal is counted (it never reaches the interceptor that counts the handled calls).
        assert REGISTRY.get_sample_value("grpc_server_handled_total", denied) == before + 1
        # Within its rights the same channel works: the gateway reads balances.
        balance = await stub.GetBalance(
            credits_pb2.GetBalanceRequest(account_id=str(tenant.account_id)), timeout=5
        )
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert _code(err.value) == "PERMISSION_DENIED"
    assert "gateway may not call /hypermedia.credits.v1.CreditsService/Grant" in (err.value.details() or "")
    assert balance.balance_millicredits == 1000
    assert await _balance(fresh_pool, tenant) == 1000
    refusals = [r.getMessage() for r in caplog.records if "outside its rights" in r.getMessage()]
    assert refusals == [
        "internal call refused, outside its rights: gateway called /hypermedia.credits.v1.CreditsService/Grant"
    ]


async def test_worker_may_not_hold_credits(servers: Servers, pki: Pki, seed: Seeder) -> None:
    tenant = await seed.tenant(balance=100_000)
    async with channel(servers.credits, pki.tls("imageworker"), "credits") as chan:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await credits_pb2_grpc.CreditsServiceStub(chan).Hold(
                credits_pb2.HoldRequest(
                    account_id=str(tenant.account_id),
                    holds=[credits_pb2.JobHold(job_id=str(uuid.uuid4()), millicredits=1)],
                ),
                timeout=5,
            )
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED


async def test_worker_may_not_create_uploads_or_presign_keys(
    servers: Servers, pki: Pki, seed: Seeder
) -> None:
    tenant = await seed.tenant()
    async with channel(servers.storage, pki.tls("imageworker"), "storage") as chan:
        stub = storage_pb2_grpc.StorageServiceStub(chan)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.CreateUpload(
                storage_pb2.CreateUploadRequest(
                    account_id=str(tenant.account_id),
                    pool_id=str(tenant.pool_id),
                    size_bytes=10,
                    mime_type="image/png",
                ),
                timeout=5,
            )
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        # The per-key calls sign any key: no worker may make them (GrantJob replaced them).
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.PresignGet(storage_pb2.PresignGetRequest(key=f"objects/{tenant.object_id}"), timeout=5)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.PresignOutputPut(
                storage_pb2.PresignOutputPutRequest(
                    source_object_id=str(tenant.object_id),
                    profile_version=1,
                    output_type="x",
                    mime_type="image/png",
                ),
                timeout=5,
            )
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED


async def test_worker_grant_only_for_the_live_attempt_of_a_running_job(
    servers: Servers, pki: Pki, seed: Seeder, fresh_pool: asyncpg.Pool
) -> None:
    tenant = await seed.tenant()
    running = await seed.job(tenant, status="processing", attempt_count=2, claimed_by="w1", lease_in=60)
    queued = await seed.job(tenant, status="queued")
    done = await seed.job(tenant, status="processing", attempt_count=1, claimed_by="w1", lease_in=60)
    await fresh_pool.execute("UPDATE processing_jobs SET status = 'completed' WHERE job_id = $1", done)
    async with channel(servers.storage, pki.tls("imageworker"), "storage") as chan:
        stub = storage_pb2_grpc.StorageServiceStub(chan)
        grant = await stub.GrantJob(storage_pb2.GrantJobRequest(job_id=str(running), attempt=2), timeout=5)
        assert grant.source.object_id == str(tenant.object_id)
        assert grant.outputs.key_prefix == f"derived/{tenant.pool_id}/{tenant.object_id}/1/"
        for job_id, attempt in ((running, 1), (queued, 0), (queued, 1), (done, 1)):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.GrantJob(
                    storage_pb2.GrantJobRequest(job_id=str(job_id), attempt=attempt), timeout=5
                )
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION, (job_id, attempt)
            assert _code(err.value) == "ATTEMPT_FENCED"
        # Outputs outside the job's prefix are refused even for the live attempt.
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.RegisterOutputs(
                storage_pb2.RegisterOutputsRequest(
                    job_id=str(running),
                    attempt=2,
                    outputs=[
                        storage_pb2.OutputUpload(
                            key=f"derived/{tenant.pool_id}/{uuid.uuid4()}/1/thumb",
                            mime_type="image/png",
                            size_bytes=1,
                            sha256="0" * 64,
                        )
                    ],
                ),
                timeout=5,
            )
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_client_refuses_a_server_posing_as_another_service(
    fresh_pool: asyncpg.Pool, pki: Pki, seed: Seeder
) -> None:
    """A credits server running with a worker's certificate: the admin client, expecting
    ``credits``, refuses it before sending anything."""
    tenant = await seed.tenant(balance=1000)
    server = GrpcServer(
        "127.0.0.1:0",
        [(credits_pb2_grpc.add_CreditsServiceServicer_to_server, CreditsService(fresh_pool))],
        [CREDITS_SERVICE_NAME],
        tls=pki.tls("imageworker"),
    )
    await server.start()
    try:
        async with channel(f"127.0.0.1:{server.port}", pki.tls("admin"), "credits") as chan:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await credits_pb2_grpc.CreditsServiceStub(chan).Grant(_grant(tenant), timeout=5)
    finally:
        await server.stop(0)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert await _balance(fresh_pool, tenant) == 1000


def test_mtls_mode_without_files_is_a_config_error(monkeypatch: pytest.MonkeyPatch, pki: Pki) -> None:
    for name in ("HM_INTERNAL_AUTH", "HM_TLS_CA", "HM_TLS_CERT", "HM_TLS_KEY"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ConfigError) as err:
        mtls.from_environment()  # mtls is the default
    assert "HM_TLS_CA, HM_TLS_CERT, HM_TLS_KEY" in str(err.value)
    monkeypatch.setenv("HM_TLS_CA", str(pki.directory / "ca.pem"))
    monkeypatch.setenv("HM_TLS_CERT", str(pki.directory / "missing.pem"))
    monkeypatch.setenv("HM_TLS_KEY", str(pki.directory / "admin-key.pem"))
    with pytest.raises(ConfigError) as err:
        mtls.from_environment()
    assert "HM_TLS_CERT: cannot read the file it names" in str(err.value)
    monkeypatch.setenv("HM_TLS_CERT", str(pki.directory / "ca.pem"))  # readable, names no identity
    with pytest.raises(ConfigError) as err:
        mtls.from_environment()
    assert "names no service identity" in str(err.value)
    monkeypatch.setenv("HM_INTERNAL_AUTH", "none")
    assert mtls.from_environment() is None
    monkeypatch.setenv("HM_INTERNAL_AUTH", "plaintext")
    with pytest.raises(ConfigError) as err:
        load(mtls.InternalAuthSettings)
    assert "HM_INTERNAL_AUTH" in str(err.value)


def test_issued_files_are_private_and_short_lived(pki: Pki) -> None:
    for path in pki.directory.iterdir():
        assert path.stat().st_mode & 0o777 == 0o600, path
    assert pki.directory.stat().st_mode & 0o777 == 0o700
    cert = x509.load_pem_x509_certificate((pki.directory / "storage.pem").read_bytes())
    lifetime = cert.not_valid_after_utc - cert.not_valid_before_utc
    assert lifetime <= mtls.CERT_VALIDITY + datetime.timedelta(minutes=5)
    assert mtls.cert_identity((pki.directory / "storage.pem").read_bytes()) == "storage"
    assert cert.not_valid_after_utc.timestamp() > time.time()


async def test_container_healthcheck_speaks_mtls(servers: Servers, pki: Pki) -> None:
    """deploy/docker/healthcheck.py, the Kubernetes exec probe and compose HEALTHCHECK: SERVING with
    the service's own certificate, unhealthy (exit 1) without one."""
    script = HEALTHCHECK
    base = {"PATH": os.environ.get("PATH", ""), "HM_STORAGE_BIND": servers.storage}

    async def probe(env: dict[str, str]) -> tuple[int, str]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(script), "storage", env=base | env, stderr=asyncio.subprocess.PIPE
        )
        _, err = await asyncio.wait_for(proc.communicate(), 30)
        return proc.returncode or 0, err.decode()

    files = {
        "HM_TLS_CA": str(pki.directory / "ca.pem"),
        "HM_TLS_CERT": str(pki.directory / "storage.pem"),
        "HM_TLS_KEY": str(pki.directory / "storage-key.pem"),
    }
    assert await probe(files) == (0, "")
    code, err = await probe({})
    assert code == 1 and "unhealthy" in err
    code, err = await probe({"HM_INTERNAL_AUTH": "none"})
    assert code == 1 and "unhealthy" in err
