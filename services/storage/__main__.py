"""Entry point of the storage service: ``python -m services.storage``. Only wiring lives here.

Environment: ``HM_DATABASE_URL`` and the ``HM_STORAGE_*`` / ``HM_S3_*`` variables of
:class:`services.storage.settings.StorageSettings`. Exits 78 (EX_CONFIG) when they are invalid.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import AsyncExitStack
from pathlib import Path

from hypermedia.api.storage.v1 import storage_pb2_grpc
from hypermedia.core.config import InfraSettings, load
from hypermedia.infra import mtls
from hypermedia.infra.httplimits import HttpSettings
from hypermedia.infra.httpserver import HttpServer
from hypermedia.infra.rpc import GrpcServer
from hypermedia.infra.service import Lifetime, every, open_postgres, run_service
from services.storage.backends import ObjectBackend
from services.storage.handoff import HandoffServer
from services.storage.localstore import LocalStore, build_app
from services.storage.service import CHECKPOINT_SWEEP_SECONDS, SERVICE_NAME, StorageQuota, StorageServicer
from services.storage.settings import StorageSettings

GRPC_GRACE_SECONDS = 10.0
"""How long in-flight RPCs may finish after SIGTERM (seconds)."""

log = logging.getLogger("services.storage")


async def serve(stack: AsyncExitStack, stop: Lifetime) -> None:
    """Open the pool, the backend (and for the local backend its HTTP server) and the gRPC server.
    Unwound in reverse on stop: health NOT_SERVING and gRPC stop with grace → HTTP stop → pool."""
    infra = load(InfraSettings)
    settings = load(StorageSettings)
    http_limits = load(HttpSettings)
    tls = mtls.from_environment()
    pool = await open_postgres(stack, infra, max_size=10)

    backend: ObjectBackend
    if settings.backend == "local":
        http = HttpServer(settings.http_host, settings.http_port, limits=http_limits)
        stack.push_async_callback(http.stop)
        public_url = settings.public_url or f"http://{settings.http_host}:{http.port}"
        local = LocalStore(
            Path(settings.local_dir), settings.signing_key.get_secret_value().encode(), public_url
        )
        await http.start(build_app(local, settings.max_put_bytes))
        if settings.handoff_socket:
            handoff = HandoffServer(local, Path(settings.handoff_socket))
            handoff.start()
            stack.push_async_callback(handoff.stop)
        backend = local
    else:
        from services.storage.s3store import S3Store  # boto3 costs 0.45 s of start a local store need not pay

        backend = S3Store(settings.s3_bucket, settings.s3_region, settings.s3_endpoint_url)

    servicer = StorageServicer(
        pool,
        backend,
        url_ttl_seconds=settings.url_ttl_seconds,
        max_put_bytes=settings.max_put_bytes,
        quota=StorageQuota(settings.quota_bytes, settings.quota_objects),
    )
    grpc_server = GrpcServer(
        settings.grpc_bind,
        [(storage_pb2_grpc.add_StorageServiceServicer_to_server, servicer)],
        [SERVICE_NAME],
        tls=tls,
    )
    await grpc_server.start()
    stack.push_async_callback(grpc_server.stop, GRPC_GRACE_SECONDS)
    sweep_stop = asyncio.Event()
    sweep = asyncio.create_task(every(CHECKPOINT_SWEEP_SECONDS, servicer.sweep_checkpoints, sweep_stop))

    async def stop_sweep() -> None:
        sweep_stop.set()
        await sweep

    stack.push_async_callback(stop_sweep)
    log.info("storage serving: grpc %s, backend %s", settings.grpc_bind, settings.backend)


if __name__ == "__main__":
    run_service("storage", serve)
