"""The gRPC servers under the connection flood that took the HTTP servers down (issue 14, item
2), and their own bounds on request metadata: a real :class:`hypermedia.infra.rpc.GrpcServer` on
loopback with the standard health service.

grpc-core needs no guard of ours for idle connections: it answers every connection with its
HTTP/2 settings at once and has no concurrency cap that idle connections could fill (the 503 of
uvicorn's ``limit_concurrency``). Its metadata limit (16 KiB hard, ``grpc.max_metadata_size``
8 KiB soft by default) is what bounds a request's headers.
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import socket
import time
from collections.abc import AsyncIterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from hypermedia.infra.rpc import GrpcServer

IDLE_CONNECTIONS = 1500
"""More than the HTTP servers' default cap (1024) and six times uvicorn's old 256."""


@pytest.fixture
async def server() -> AsyncIterator[GrpcServer]:
    srv = GrpcServer("127.0.0.1:0", [], [])
    await srv.start()
    yield srv
    await srv.stop(0)


async def test_idle_connections_do_not_keep_health_or_calls_out(server: GrpcServer) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 2 * IDLE_CONNECTIONS + 256:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 2 * IDLE_CONNECTIONS + 256), hard))
    idle: list[socket.socket] = []
    try:
        for _ in range(IDLE_CONNECTIONS):
            sock = socket.socket()
            sock.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                sock.connect(("127.0.0.1", server.port))
            idle.append(sock)
        await asyncio.sleep(1)  # every connection accepted and waiting for a preface
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            for _ in range(20):
                started = time.monotonic()
                reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=5)
                assert reply.status == health_pb2.HealthCheckResponse.SERVING
                assert time.monotonic() - started < 5
        # The flood's connections were all taken (each has the server's settings frame waiting).
        answered = 0
        for sock in idle:
            with contextlib.suppress(BlockingIOError, OSError):
                answered += bool(sock.recv(9))
        assert answered > IDLE_CONNECTIONS * 0.9
    finally:
        for sock in idle:
            sock.close()


async def test_oversized_metadata_is_refused_and_a_normal_call_works(server: GrpcServer) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.Check(
                health_pb2.HealthCheckRequest(), metadata=[("x-big", "a" * (1 << 20))], timeout=5
            )
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        reply = await stub.Check(health_pb2.HealthCheckRequest(), metadata=[("x-small", "v")], timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
