"""Container HEALTHCHECK of one hypermedia service: exit 0 when healthy, 1 otherwise (Docker reserves 2).

Usage: ``python /opt/hypermedia/healthcheck.py SERVICE``. The port is read from the same environment
variable the service binds to, so overriding a port does not break the check. gRPC services are
asked ``grpc.health.v1.Health/Check`` for the whole server (the same check a Kubernetes ``grpc``
probe makes); the gateway answers ``GET /healthz``. Kubernetes ignores Docker HEALTHCHECKs and uses
the probes in ``deploy/k8s``; this script serves ``docker run`` and compose.
"""

from __future__ import annotations

import os
import sys
import urllib.request
from pathlib import Path
from typing import Any

TIMEOUT_SECONDS = 3.0

GRPC_BIND_VARIABLES = {
    "credits": ("HM_CREDITS_BIND", "0.0.0.0:50061"),
    "storage": ("HM_STORAGE_BIND", "0.0.0.0:50062"),
    "imageworker": ("HM_WORKER_STATUS_BIND", "0.0.0.0:50071"),
    "docworker": ("HM_WORKER_STATUS_BIND", "0.0.0.0:50071"),
    "ocrworker": ("HM_WORKER_STATUS_BIND", "0.0.0.0:50071"),
    "mediaworker": ("HM_WORKER_STATUS_BIND", "0.0.0.0:50072"),
    "scheduler": ("HM_SCHEDULER_KEDA_BIND", "0.0.0.0:50081"),
}
PLAINTEXT = {"scheduler"}
"""Services whose port is plaintext gRPC whatever ``HM_INTERNAL_AUTH`` says (the scheduler's KEDA
port: the keda-operator presents no platform certificate)."""


def _local_target(bind: str) -> str:
    """``0.0.0.0:50061`` / ``[::]:50061`` → ``127.0.0.1:50061``: probe the port from inside."""
    port = bind.rsplit(":", 1)[1]
    return f"127.0.0.1:{port}"


def _channel(grpc: Any, target: str, plaintext: bool = False) -> Any:
    """Mutual TLS with the service's own certificate (HM_TLS_CA, HM_TLS_CERT, HM_TLS_KEY; every
    platform identity may call Health, ADR 0044), checking the server by the 127.0.0.1 IP SAN every
    platform certificate carries; plaintext when HM_INTERNAL_AUTH=none."""
    if plaintext or os.environ.get("HM_INTERNAL_AUTH", "mtls").strip().lower() == "none":
        return grpc.insecure_channel(target)
    files = [
        Path(os.environ.get(name, "")).read_bytes() for name in ("HM_TLS_CA", "HM_TLS_KEY", "HM_TLS_CERT")
    ]
    credentials = grpc.ssl_channel_credentials(files[0], files[1], files[2])
    return grpc.secure_channel(target, credentials)


def check_grpc(target: str, plaintext: bool = False) -> bool:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with _channel(grpc, target, plaintext) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        response = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=TIMEOUT_SECONDS)
    return bool(response.status == health_pb2.HealthCheckResponse.SERVING)


def check_http(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=TIMEOUT_SECONDS) as response:
        return bool(response.status == 200)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: healthcheck.py SERVICE", file=sys.stderr)
        return 1
    service = argv[1]
    try:
        if service == "gateway":
            port = os.environ.get("HM_GATEWAY_HTTP_PORT", "8080")
            healthy = check_http(f"http://127.0.0.1:{port}/healthz")
        elif service in GRPC_BIND_VARIABLES:
            variable, default = GRPC_BIND_VARIABLES[service]
            healthy = check_grpc(_local_target(os.environ.get(variable, default)), service in PLAINTEXT)
        else:
            print(f"healthcheck.py: no check for service {service!r}", file=sys.stderr)
            return 1
    except Exception as exc:  # any failure to get an answer is "unhealthy"
        print(f"unhealthy: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    if not healthy:
        print("unhealthy: not SERVING", file=sys.stderr)
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
