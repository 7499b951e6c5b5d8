"""KEDA's External Scaler API of the scheduler (services/scheduler/keda.py) over real gRPC on real
Postgres, called as the keda-operator calls it: the metric spec, the metric with running jobs
counted (a long job keeps its replica), IsActive and its stream, and bad trigger metadata."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import grpc
import pytest

from hypermedia.api.keda import externalscaler_pb2 as pb
from hypermedia.api.keda import externalscaler_pb2_grpc as pb_grpc
from hypermedia.infra.rpc import GrpcServer
from services.scheduler.keda import SERVICE_NAME, ExternalScaler
from tests.integration.conftest import Seeder


@pytest.fixture
async def scaler(fresh_pool: asyncpg.Pool) -> AsyncIterator[pb_grpc.ExternalScalerStub]:
    server = GrpcServer(
        "127.0.0.1:0",
        [
            (
                pb_grpc.add_ExternalScalerServicer_to_server,
                ExternalScaler(fresh_pool, arrival_window_seconds=60, stream_seconds=0.2),
            )
        ],
        [SERVICE_NAME],
    )
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")
    try:
        yield pb_grpc.ExternalScalerStub(channel)
    finally:
        await channel.close()
        await server.stop(0)


def ref(**metadata: str) -> pb.ScaledObjectRef:
    return pb.ScaledObjectRef(name="imageworker", namespace="hypermedia", scalerMetadata=metadata)


async def test_the_metric_counts_backlog_arrivals_and_running_jobs(
    scaler: pb_grpc.ExternalScalerStub, seed: Seeder, fresh_pool: asyncpg.Pool
) -> None:
    images = ref(queue="images", drainTargetSeconds="30", defaultJobSeconds="2")
    [spec] = (await scaler.GetMetricSpec(images)).metricSpecs
    assert (spec.metricName, spec.targetSizeFloat, spec.targetSize) == (
        "hypermedia-slots-images",
        pytest.approx(3.2),
        3,
    )
    assert not (await scaler.IsActive(images)).result
    [idle] = (
        await scaler.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=images, metricName=spec.metricName))
    ).metricValues
    assert idle.metricValueFloat == 0.0

    tenant = await seed.tenant()
    for _ in range(45):
        await seed.job(tenant)
    # 45 ready × 2 s / 30 s = 3 slots; 45 arrivals × 2 s / 60 s = 1.5 slots of arrival work.
    [value] = (
        await scaler.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=images, metricName=spec.metricName))
    ).metricValues
    assert value.metricValueFloat == pytest.approx(1.5 + 3.0) and value.metricValue == 4
    assert (await scaler.IsActive(images)).result

    # The queue drained, one long job still running: its slot is still needed.
    await fresh_pool.execute("DELETE FROM processing_jobs")
    await seed.worker("w1", heartbeat_ago=1)
    await seed.job(tenant, status="processing", attempt_count=1, claimed_by="w1", lease_in=600)
    await fresh_pool.execute("UPDATE processing_jobs SET created_at = now() - interval '1 hour'")
    [running] = (
        await scaler.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=images, metricName=spec.metricName))
    ).metricValues
    assert running.metricValueFloat == pytest.approx(1.0)
    assert (await scaler.IsActive(images)).result

    # Several queues, slots summed from their roles (images 4 + documents 2) × utilisation 0.5.
    [both] = (await scaler.GetMetricSpec(ref(queue="images,documents", utilisation="0.5"))).metricSpecs
    assert (both.metricName, both.targetSizeFloat) == (
        "hypermedia-slots-images-documents",
        pytest.approx(3.0),
    )


async def test_stream_is_active_follows_the_queue(scaler: pb_grpc.ExternalScalerStub, seed: Seeder) -> None:
    stream = scaler.StreamIsActive(ref(queue="ocr"))
    try:
        assert not (await asyncio.wait_for(stream.read(), 10)).result, "sent at once"
        tenant = await seed.tenant()
        await seed.job(tenant)  # a thumbnail job: images, not ocr
        await seed.pool.execute("UPDATE processing_jobs SET queue = 'ocr'")
        assert (await asyncio.wait_for(stream.read(), 10)).result
    finally:
        stream.cancel()


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        ({}, "queue: one or more of"),
        ({"queue": "pictures"}, "queue: one or more of"),
        ({"queue": "bulk"}, "queue: one or more of"),
        ({"queue": "images", "slotsPerReplica": "x"}, "slotsPerReplica: not a number"),
        ({"queue": "images", "utilisation": "2"}, "utilisation: must be between 0.01 and 1"),
    ],
)
async def test_bad_trigger_metadata_is_invalid_argument_naming_the_key(
    scaler: pb_grpc.ExternalScalerStub, metadata: dict[str, str], message: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await scaler.GetMetricSpec(ref(**metadata))
    assert failed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in (failed.value.details() or "")
