"""``hypermedia.worker.v1.WorkerService``: a worker's admission state for operators and probes."""

from __future__ import annotations

import time

import grpc
from google.protobuf import timestamp_pb2

from hypermedia.runtime import WorkerRuntime
from hypermedia.worker.v1 import worker_pb2, worker_pb2_grpc


class WorkerStatusService(worker_pb2_grpc.WorkerServiceServicer):
    def __init__(self, runtime: WorkerRuntime) -> None:
        self._runtime = runtime

    async def GetStatus(
        self, request: worker_pb2.GetStatusRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.GetStatusResponse:
        rt = self._runtime
        started = timestamp_pb2.Timestamp()
        started.FromSeconds(int(rt.started_at))
        return worker_pb2.GetStatusResponse(
            worker_id=rt.worker_id,
            queue=rt.settings.queue,
            slots_total=rt.admission.slots,
            slots_busy=rt.admission.busy,
            admission_open=rt.admission.open,
            reason=rt.admission.reason,
            sample_age_seconds=time.monotonic() - rt.admission.sampled_at,
            jobs_completed=rt.jobs_completed,
            jobs_failed=rt.jobs_failed,
            started_at=started,
        )
