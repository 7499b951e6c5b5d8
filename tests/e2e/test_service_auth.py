"""Service authentication as `hypermedia up` runs it (ADR 0044): the CA and certificates it made,
the admin CLI granting over mutual TLS, grpcurl (the real binary) with the admin certificate, and
a refusal logged by the real credits process."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import grpc
import pytest

from hypermedia.api.credits.v1 import credits_pb2, credits_pb2_grpc
from tests.e2e.conftest import RunningPlatform, wait_for

GRPCURL = Path(sys.executable).parent / "grpcurl"


def _grpcurl(platform: RunningPlatform, *args: str, cert: bool = True) -> subprocess.CompletedProcess[str]:
    tls = platform.state_dir / "tls"
    flags = ["-cacert", str(tls / "ca.pem")]
    if cert:
        flags += ["-cert", str(tls / "admin.pem"), "-key", str(tls / "admin-key.pem")]
    return subprocess.run(
        [str(GRPCURL), *flags, *args], capture_output=True, text=True, timeout=60, check=False
    )


def test_up_makes_a_private_ca_and_says_so(platform: RunningPlatform) -> None:
    tls = platform.state_dir / "tls"
    names = {p.name for p in tls.iterdir()}
    assert {"ca.pem", "admin.pem", "storage.pem", "credits.pem", "gateway-key.pem"} <= names
    assert all(p.stat().st_mode & 0o777 == 0o600 for p in tls.iterdir())
    assert platform.info["internal_auth"] == "mtls"
    up_log = (platform.state_dir / "up.log").read_text()
    assert "internal gRPC: mutual TLS, a new CA and one certificate per service in" in up_log
    assert "internal gRPC: mutual TLS as credits" in (platform.state_dir / "logs" / "credits.log").read_text()


def test_admin_cli_grants_over_mtls(platform: RunningPlatform, account: dict[str, Any]) -> None:
    granted = platform.admin("grant", account["account_id"], "--credits", "2.5")
    assert granted == {"account_id": account["account_id"], "balance": 1002.5}
    # HM_INTERNAL_AUTH=mtls without HM_TLS_*: still the platform's admin files; with another
    # identity's files named: credits refuses the grant.
    base = {k: v for k, v in platform.env.items() if k not in ("HM_DATABASE_URL", "HM_CREDITS_ADDR")}
    cmd = [
        sys.executable,
        "-m",
        "hypermedia.devtools.cli",
        "admin",
        "grant",
        account["account_id"],
        "--credits",
        "1",
    ]
    ok = subprocess.run(
        cmd, env=base | {"HM_INTERNAL_AUTH": "mtls"}, capture_output=True, text=True, timeout=60
    )
    assert ok.returncode == 0 and json.loads(ok.stdout)["balance"] == 1003.5, ok.stderr
    denied = subprocess.run(
        cmd, env=base | platform.tls_env("gateway"), capture_output=True, text=True, timeout=60
    )
    assert denied.returncode == 1
    assert "gateway may not call /hypermedia.credits.v1.CreditsService/Grant" in denied.stderr


def test_grpcurl_with_the_admin_certificate_lists_and_calls_worker_status(platform: RunningPlatform) -> None:
    address = platform.worker_status_addr()
    listed = _grpcurl(platform, address, "list")
    assert listed.returncode == 0, listed.stderr
    assert {"hypermedia.worker.v1.WorkerService", "grpc.health.v1.Health"} <= set(listed.stdout.split())
    called = _grpcurl(platform, address, "hypermedia.worker.v1.WorkerService/GetStatus")
    assert called.returncode == 0, called.stderr
    status = json.loads(called.stdout)
    assert status["queue"] == "images" and status["worker_id"].startswith("local/imageworker/"), status
    # Storage's methods are listed to the admin (reflection), but signing keys is not its right.
    denied = _grpcurl(
        platform,
        "-d",
        '{"key": "objects/x"}',
        platform.info["storage_addr"],
        "hypermedia.storage.v1.StorageService/PresignGet",
    )
    assert denied.returncode != 0 and "PermissionDenied" in denied.stderr, denied.stderr


def test_grpcurl_without_a_client_certificate_or_in_plaintext_is_refused(platform: RunningPlatform) -> None:
    for address in (platform.info["credits_addr"], platform.worker_status_addr()):
        no_cert = _grpcurl(platform, address, "list", cert=False)
        assert no_cert.returncode != 0
        plaintext = subprocess.run(
            [str(GRPCURL), "-plaintext", address, "list"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert plaintext.returncode != 0


def test_the_gateway_identity_may_not_grant_and_credits_logs_it(
    platform: RunningPlatform, account: dict[str, Any]
) -> None:
    with platform.internal_channel(platform.info["credits_addr"], "gateway") as chan:
        stub = credits_pb2_grpc.CreditsServiceStub(chan)
        with pytest.raises(grpc.RpcError) as err:
            stub.Grant(
                credits_pb2.GrantRequest(
                    account_id=account["account_id"], millicredits=10**9, grant_id=str(uuid.uuid4())
                ),
                timeout=10,
            )
        balance = stub.GetBalance(credits_pb2.GetBalanceRequest(account_id=account["account_id"]), timeout=10)
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED  # type: ignore[attr-defined]
    assert balance.balance_millicredits == 1_000_000
    credits_log = platform.state_dir / "logs" / "credits.log"
    wait_for(
        "the refusal in credits.log",
        lambda: (
            "outside its rights: gateway called /hypermedia.credits.v1.CreditsService/Grant"
            in credits_log.read_text()
        ),
        5,
    )
