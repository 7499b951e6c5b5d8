"""Traces exported by OTLP (issue 22 item 2): a platform configured only by the standard ``OTEL_*``
variables sends the spans of one job to a real OTLP/gRPC receiver this test runs (the collector's
``TraceService`` from ``opentelemetry-proto``), and they make one trace: the REST request, the
gRPC calls it makes, the outbox row and the NATS message carrying it to the worker, the worker's
claim and execution, and the engine's run in the sandbox (``sandbox.run``, and inside it the
child's set-up and the engine's call: the job's process has no network, so it times them and the
worker sends them)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from hypermedia.devtools.embedded import free_port
from tests.e2e.conftest import RunningPlatform, isolated_platform, upload, wait_job

PHOTO = Path(__file__).resolve().parents[1] / "data" / "exif-orientation" / "Landscape_3.jpg"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"


class Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    """Keeps every span it is sent as ``(service.name, span name, trace id hex, kind)``."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, str, str, int]] = []
        self._lock = threading.Lock()

    def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: grpc.ServicerContext
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        with self._lock:
            for resource_spans in request.resource_spans:
                attributes = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
                for scope in resource_spans.scope_spans:
                    for span in scope.spans:
                        self.spans.append(
                            (attributes.get("service.name", ""), span.name, span.trace_id.hex(), span.kind)
                        )
        return trace_service_pb2.ExportTraceServiceResponse()

    def of_trace(self, trace_id: str) -> set[tuple[str, str]]:
        with self._lock:
            return {(service, name) for service, name, tid, _ in self.spans if tid == trace_id}


@pytest.fixture(scope="module")
def receiver() -> Iterator[tuple[Receiver, int]]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    servicer = Receiver()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(servicer, server)
    port = free_port()
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    try:
        yield servicer, port
    finally:
        server.stop(0)


@pytest.fixture(scope="module")
def traced(
    tmp_root: Path, database_url: str, nats_url: str, receiver: tuple[Receiver, int]
) -> Iterator[RunningPlatform]:
    _, port = receiver
    with isolated_platform(
        tmp_root,
        database_url,
        nats_url,
        "otlp",
        services="credits,storage,gateway,imageworker",
        OTEL_TRACES_EXPORTER="otlp",
        OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{port}",
        OTEL_EXPORTER_OTLP_INSECURE="true",
        OTEL_BSP_SCHEDULE_DELAY="100",
    ) as running:
        yield running


def test_one_jobs_spans_arrive_at_the_receiver_in_one_trace(
    traced: RunningPlatform, receiver: tuple[Receiver, int]
) -> None:
    spans, _ = receiver
    account = traced.admin("create-account", "--credits", "10")
    with traced.client(account) as client:
        obj = upload(client, PHOTO)
        created = client.post(
            "/v1/hypermedia/process",
            json={"object_id": obj["object_id"], "operations": ["thumbnail"]},
            headers={"traceparent": f"00-{TRACE_ID}-00f067aa0ba902b7-01"},
        )
        assert created.status_code == 202, created.text
        assert wait_job(client, created.json()["job_ids"][0])["status"] == "completed"

    expected = {
        ("hypermedia.gateway", "POST /v1/hypermedia/process"),  # REST
        ("hypermedia.credits", "/hypermedia.credits.v1.CreditsService/EstimateAndHold"),  # gRPC from it
        ("hypermedia.imageworker", "job.claim"),  # the outbox row's and NATS message's context
        ("hypermedia.imageworker", "job.execute"),
        ("hypermedia.imageworker", "storage.download"),
        ("hypermedia.storage", "/hypermedia.storage.v1.StorageService/GrantJob"),  # the worker's gRPC
        ("hypermedia.imageworker", "sandbox.run"),  # the engine's call, in the sandbox
        ("hypermedia.imageworker", "sandbox.setup"),  # timed by the job's child (no network), sent
        ("hypermedia.imageworker", "engine.thumbnail"),  # by the worker under sandbox.run
        ("hypermedia.imageworker", "storage.upload"),
        ("hypermedia.credits", "/hypermedia.credits.v1.CreditsService/Settle"),  # settled (a lone job)
    }
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not expected <= spans.of_trace(TRACE_ID):
        time.sleep(0.2)
    assert expected - spans.of_trace(TRACE_ID) == set(), sorted(spans.of_trace(TRACE_ID))
    # Every service of the job reported under its own name, and nothing of it left the trace.
    services = {service for service, _ in spans.of_trace(TRACE_ID)}
    assert services == {
        "hypermedia.gateway",
        "hypermedia.credits",
        "hypermedia.storage",
        "hypermedia.imageworker",
    }
