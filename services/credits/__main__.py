"""``python -m services.credits``: the credits gRPC service and the gauges of open holds (gauges.py).
Only wires; see service.py."""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack

from prometheus_client import REGISTRY

from hypermedia.api.credits.v1 import credits_pb2_grpc
from hypermedia.core import config
from hypermedia.infra import mtls
from hypermedia.infra.rpc import GrpcServer
from hypermedia.infra.service import Lifetime, open_postgres, run_service
from services.credits.gauges import HoldsCollector
from services.credits.service import CreditsService
from services.credits.settings import CreditsSettings


async def serve(stack: AsyncExitStack, stop: Lifetime) -> GrpcServer:
    infra = config.load(config.InfraSettings)
    settings = config.load(CreditsSettings)
    tls = mtls.from_environment()
    pool = await open_postgres(stack, infra, max_size=10)
    server = GrpcServer(
        settings.grpc_bind,
        [
            (
                credits_pb2_grpc.add_CreditsServiceServicer_to_server,
                CreditsService(pool, settings.quota_defaults()),
            )
        ],
        ["hypermedia.credits.v1.CreditsService"],
        tls=tls,
    )
    await server.start()
    stack.push_async_callback(server.stop)
    holds = HoldsCollector(pool, asyncio.get_running_loop())
    REGISTRY.register(holds)
    stack.callback(REGISTRY.unregister, holds)
    return server


if __name__ == "__main__":
    run_service("credits", serve)
