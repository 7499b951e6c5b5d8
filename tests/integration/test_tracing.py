"""Trace context crosses process boundaries: REST headers (the caller's ``traceparent`` → the
gateway's request span), gRPC metadata (client span → server span) and the outbox → JetStream
headers (the request's trace reaches the worker)."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import asyncpg
import httpx
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from hypermedia.api.credits.v1 import credits_pb2, credits_pb2_grpc
from hypermedia.core import telemetry
from hypermedia.infra import rpc
from hypermedia.jobs import lifecycle, queues
from hypermedia.jobs.outbox import OutboxRelay
from services.credits.service import CreditsService
from services.gateway.rest import TraceRequests

_EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module")
def spans() -> Iterator[InMemorySpanExporter]:
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
    yield _EXPORTER


async def test_grpc_server_span_continues_the_client_span(
    spans: InMemorySpanExporter, pool: asyncpg.Pool
) -> None:
    server = rpc.GrpcServer(
        "127.0.0.1:0",
        [(credits_pb2_grpc.add_CreditsServiceServicer_to_server, CreditsService(pool))],
        ["hypermedia.credits.v1.CreditsService"],
    )
    await server.start()
    spans.clear()
    try:
        async with rpc.channel(f"127.0.0.1:{server.port}") as chan:
            stub = credits_pb2_grpc.CreditsServiceStub(chan)
            with trace.get_tracer("test").start_as_current_span("request") as root:
                await rpc.call(
                    stub.Estimate, credits_pb2.EstimateRequest(operations=["thumbnail"], size_bytes=1)
                )
    finally:
        await server.stop(0)
    finished = {s.name: s for s in spans.get_finished_spans()}
    method = "/hypermedia.credits.v1.CreditsService/Estimate"
    client = [s for s in spans.get_finished_spans() if s.name == method and s.kind == trace.SpanKind.CLIENT]
    server_side = [
        s for s in spans.get_finished_spans() if s.name == method and s.kind == trace.SpanKind.SERVER
    ]
    assert client and server_side, finished.keys()
    trace_id = root.get_span_context().trace_id
    assert client[0].context.trace_id == server_side[0].context.trace_id == trace_id
    assert server_side[0].parent is not None and server_side[0].parent.span_id == client[0].context.span_id


async def test_outbox_messages_carry_the_trace_of_the_transaction_that_wrote_them(
    spans: InMemorySpanExporter, pool: asyncpg.Pool, nats_url: str
) -> None:
    prefix = f"TR{secrets.token_hex(3).upper()}"
    nc, js = await queues.connect(nats_url, "test-tracing")
    try:
        await queues.ensure_streams(js, prefix)
        job_id = "00000000-0000-4000-8000-" + secrets.token_hex(6)
        with trace.get_tracer("test").start_as_current_span("create") as root:
            async with pool.acquire() as conn, conn.transaction():
                await lifecycle.enqueue_outbox(conn, prefix, job_id, "images", 3)
        await OutboxRelay(pool, nc, js).run_once()
        fetcher = queues.PriorityFetcher(nc, prefix, "images")
        await fetcher.start()
        msg = await fetcher.sweep()
        await fetcher.stop()
        assert msg is not None and queues.JobMessage.decode(msg.data).job_id == job_id
        await msg.ack()
        carried = trace.get_current_span(telemetry.extract(msg.headers)).get_span_context()
        assert carried.trace_id == root.get_span_context().trace_id
        assert carried.span_id == root.get_span_context().span_id
    finally:
        for queue in ("images", "documents", "ocr", "media", "bulk"):
            await js.delete_stream(queues.stream_name(prefix, queue))
        await nc.close()


async def test_the_gateways_request_span_continues_the_callers_trace_and_records_the_status(
    spans: InMemorySpanExporter,
) -> None:
    """TraceRequests (pure ASGI): one SERVER span per request under the caller's ``traceparent``,
    with the status sent; an exception of the app ends the span as an error and still becomes
    starlette's 500."""

    async def ok(_request: Request) -> PlainTextResponse:
        return PlainTextResponse("ok", status_code=202)

    async def boom(_request: Request) -> PlainTextResponse:
        raise RuntimeError("boom")

    app = Starlette(
        routes=[Route("/ok", ok, methods=["POST"]), Route("/boom", boom)],
        middleware=[Middleware(TraceRequests)],
    )
    caller_trace, caller_span = secrets.token_hex(16), secrets.token_hex(8)
    spans.clear()
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
        answered = await client.post("/ok", headers={"traceparent": f"00-{caller_trace}-{caller_span}-01"})
        failed = await client.get("/boom")
    assert (answered.status_code, failed.status_code) == (202, 500)
    by_name = {s.name: s for s in spans.get_finished_spans() if s.kind == trace.SpanKind.SERVER}
    ok_span, boom_span = by_name["POST /ok"], by_name["GET /boom"]
    assert format(ok_span.context.trace_id, "032x") == caller_trace
    assert ok_span.parent is not None and format(ok_span.parent.span_id, "016x") == caller_span
    assert ok_span.attributes is not None and ok_span.attributes["http.status_code"] == 202
    assert boom_span.parent is None  # no traceparent: a trace of its own
    assert boom_span.status.status_code == StatusCode.ERROR
    assert [e.name for e in boom_span.events] == ["exception"]
