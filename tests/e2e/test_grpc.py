"""The gRPC JobService end to end, with generated stubs and with a reflection-only client (no
stubs, as grpcurl works)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor_pool, json_format, message_factory
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from hypermedia.api.jobs.v1 import jobs_pb2, jobs_pb2_grpc
from hypermedia.api.worker.v1 import worker_pb2, worker_pb2_grpc
from tests.e2e.conftest import RunningPlatform

EXIF = Path(__file__).resolve().parents[1] / "data" / "exif-orientation"


def test_upload_process_and_get_job_over_grpc(platform: RunningPlatform, account: dict[str, Any]) -> None:
    metadata = (("authorization", f"Bearer {account['api_key']}"),)

    async def flow() -> jobs_pb2.Job:
        async with grpc.aio.insecure_channel(platform.grpc_addr) as chan:
            stub = jobs_pb2_grpc.JobServiceStub(chan)
            obj = await stub.UploadObject(
                jobs_pb2.UploadObjectRequest(
                    content=(EXIF / "Landscape_8.jpg").read_bytes(), filename="x.png"
                ),
                metadata=metadata,
            )
            assert obj.mime_type == "image/jpeg"
            # The name said PNG: recorded as metadata, the content decides.
            assert (obj.filename, obj.name_mime_type, obj.type_mismatch) == ("x.png", "image/png", True)
            op = jobs_pb2.Operation(name="thumbnail")
            op.params.update({"size": 128})
            created = await stub.Process(
                jobs_pb2.ProcessRequest(object_id=obj.object_id, operations=[op], priority=4),
                metadata=metadata,
            )
            assert len(created.job_ids) == 1 and float(created.estimated_credits) > 0
            deadline = time.monotonic() + 60
            while True:
                job = (
                    await stub.GetJob(jobs_pb2.GetJobRequest(job_id=created.job_ids[0]), metadata=metadata)
                ).job
                if job.status in (jobs_pb2.JOB_STATUS_COMPLETED, jobs_pb2.JOB_STATUS_FAILED):
                    return job
                assert time.monotonic() < deadline
                await asyncio.sleep(0.1)

    job = asyncio.run(flow())
    assert job.status == jobs_pb2.JOB_STATUS_COMPLETED, job.error_message
    [output] = job.outputs
    assert output.mime_type == "image/webp"
    assert json_format.MessageToDict(output.metadata)["width"] == 128
    assert output.url.startswith("http://127.0.0.1:")

    async def ledger() -> jobs_pb2.ListLedgerResponse:
        async with grpc.aio.insecure_channel(platform.grpc_addr) as chan:
            stub = jobs_pb2_grpc.JobServiceStub(chan)
            for _ in range(100):  # the commit follows the completion the loop above saw
                page = await stub.ListLedger(jobs_pb2.ListLedgerRequest(page_size=1000), metadata=metadata)
                if any(e.job_id == job.job_id and e.kind == "commit" for e in page.entries):
                    return page
                await asyncio.sleep(0.05)
        raise AssertionError("no commit in the ledger")

    entries = [
        (e.kind, e.line, e.credits, e.operation, e.job_status)
        for e in asyncio.run(ledger()).entries
        if e.job_id == job.job_id
    ]
    # Charged its megapixels (1800 × 1200 at 0.05 a megapixel, 0.108) cut to what its bytes held.
    megapixels = job.charge_lines["megapixels"]
    assert float(megapixels) == pytest.approx(float(job.estimated_credits) - 1, abs=1e-9)
    assert float(megapixels) < 0.108
    assert job.actual_credits == job.estimated_credits
    assert sorted(entries) == [
        ("commit", "base", "-1.000", "thumbnail", "completed"),
        ("commit", "megapixels", f"-{megapixels}", "thumbnail", "completed"),
        ("hold", "base", job.estimated_credits, "thumbnail", "completed"),
    ]


@pytest.mark.parametrize(
    ("request_", "code", "error_code"),
    [
        (
            jobs_pb2.ProcessRequest(
                object_id="00000000-0000-0000-0000-000000000000",
                operations=[jobs_pb2.Operation(name="thumbnail")],
            ),
            grpc.StatusCode.NOT_FOUND,
            "NOT_FOUND",
        ),
        (jobs_pb2.GetJobRequest(job_id="nope"), grpc.StatusCode.NOT_FOUND, "NOT_FOUND"),
    ],
)
def test_grpc_errors_carry_status_and_error_code(
    platform: RunningPlatform, account: dict[str, Any], request_: Any, code: grpc.StatusCode, error_code: str
) -> None:
    async def call() -> grpc.aio.AioRpcError:
        async with grpc.aio.insecure_channel(platform.grpc_addr) as chan:
            stub = jobs_pb2_grpc.JobServiceStub(chan)
            method = stub.Process if isinstance(request_, jobs_pb2.ProcessRequest) else stub.GetJob
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await method(request_, metadata=(("authorization", f"Bearer {account['api_key']}"),))
            return info.value

    err = asyncio.run(call())
    assert err.code() == code
    assert dict(err.trailing_metadata())["hm-error-code"] == error_code


def test_unauthenticated_grpc_call(platform: RunningPlatform) -> None:
    async def call() -> grpc.StatusCode:
        async with grpc.aio.insecure_channel(platform.grpc_addr) as chan:
            try:
                await jobs_pb2_grpc.JobServiceStub(chan).GetBalance(jobs_pb2.GetBalanceRequest())
            except grpc.aio.AioRpcError as exc:
                return exc.code()
        return grpc.StatusCode.OK

    assert asyncio.run(call()) == grpc.StatusCode.UNAUTHENTICATED


def test_reflection_only_client_lists_and_calls_every_service(
    platform: RunningPlatform, account: dict[str, Any]
) -> None:
    """What grpcurl does: discover services and message types by reflection, then call."""
    addresses = {
        platform.grpc_addr: "hypermedia.jobs.v1.JobService",
        platform.info["credits_addr"]: "hypermedia.credits.v1.CreditsService",
        platform.info["storage_addr"]: "hypermedia.storage.v1.StorageService",
        platform.worker_status_addr(): "hypermedia.worker.v1.WorkerService",
    }
    for address, service in addresses.items():
        open_ = grpc.insecure_channel if address == platform.grpc_addr else platform.internal_channel
        with open_(address) as chan:
            db = ProtoReflectionDescriptorDatabase(chan)
            services = db.get_services()
            assert service in services
            assert "grpc.health.v1.Health" in services
            health = health_pb2_grpc.HealthStub(chan).Check(health_pb2.HealthCheckRequest(service=service))
            assert health.status == health_pb2.HealthCheckResponse.SERVING

    with grpc.insecure_channel(platform.grpc_addr) as chan:
        pool = descriptor_pool.DescriptorPool(ProtoReflectionDescriptorDatabase(chan))
        method = pool.FindServiceByName("hypermedia.jobs.v1.JobService").FindMethodByName("GetBalance")
        request_cls = message_factory.GetMessageClass(method.input_type)
        response_cls = message_factory.GetMessageClass(method.output_type)
        call = chan.unary_unary(
            "/hypermedia.jobs.v1.JobService/GetBalance",
            request_serializer=request_cls.SerializeToString,
            response_deserializer=response_cls.FromString,
        )
        response = call(request_cls(), metadata=(("authorization", f"Bearer {account['api_key']}"),))
        assert json_format.MessageToDict(response) == {"balance": "1000.000", "held": "0.000"}


def test_worker_status_shows_slots_and_admission(platform: RunningPlatform) -> None:
    with platform.internal_channel(platform.worker_status_addr()) as chan:
        status = worker_pb2_grpc.WorkerServiceStub(chan).GetStatus(worker_pb2.GetStatusRequest())
    assert status.queue == "images"
    assert status.slots_total == 4 and 0 <= status.slots_busy <= 4
    assert status.reason in ("ok", "slots_full") and status.admission_open == (status.reason == "ok")
    assert status.worker_id.startswith("local/imageworker/")
    assert 0 <= status.sample_age_seconds < 5
    assert status.available_memory_mb > 512 and status.pid_headroom > 64
    # Its scheduler consumer (ADR 0073) is a lane of its own, outside the totals, and control's
    # admission (the imageworker is a unit) decides nothing for it.
    images, consumer = status.queues
    assert (images.queue, images.slots_total) == ("images", 4) and images.admission_target >= 0
    assert (consumer.queue, consumer.slots_total, consumer.admission_target) == ("sched.images", 1, -1)
    assert consumer.worker_id == status.worker_id + "/sched" and consumer.reason in ("ok", "slots_full")
