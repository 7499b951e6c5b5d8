"""gRPC ``hypermedia.jobs.v1.JobService``: the same use cases as REST, over :class:`JobsAPI`."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime
from typing import Any

import grpc
from google.protobuf import json_format, struct_pb2, timestamp_pb2

from hypermedia.api.jobs.v1 import jobs_pb2, jobs_pb2_grpc
from hypermedia.core.errors import DomainError
from hypermedia.infra import rpc
from hypermedia.jobs.accounts import Caller
from services.gateway.jobs import JobsAPI


def _struct(value: dict[str, Any] | None) -> struct_pb2.Struct:
    out = struct_pb2.Struct()
    if value:
        out.update(value)
    return out


def _plain(value: Any) -> Any:
    """Struct params as the JSON a REST client would send: protobuf's Struct has only doubles, so
    integral numbers (``128.0``) become ints again."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _ts(value: str | None) -> timestamp_pb2.Timestamp | None:
    if not value:
        return None
    ts = timestamp_pb2.Timestamp()
    ts.FromDatetime(datetime.fromisoformat(value))
    return ts


def _credits(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}"


def job_message(job: dict[str, Any]) -> jobs_pb2.Job:
    """A job dict of :meth:`JobsAPI.get_job` as a ``jobs.v1.Job``."""
    message = jobs_pb2.Job(
        job_id=job["job_id"],
        object_id=job["object_id"],
        operation=job["operation"],
        params=_struct(job["params"]),
        status=jobs_pb2.JobStatus.Value(f"JOB_STATUS_{job['status'].upper()}"),
        priority=job["priority"],
        attempt_count=job["attempt_count"],
        max_attempts=job["max_attempts"],
        lost_attempts=job["lost_attempts"],
        error_code=job["error_code"] or "",
        error_message=job["error_message"] or "",
        estimated_credits=_credits(job["estimated_credits"]),
        actual_credits=_credits(job["actual_credits"]),
        charge_lines={name: _credits(value) for name, value in job["charge_lines"].items()},
    )
    for field in ("created_at", "started_at", "completed_at"):
        ts = _ts(job[field])
        if ts is not None:
            getattr(message, field).CopyFrom(ts)
    for out in job["outputs"]:
        message.outputs.add(
            output_type=out["output_type"],
            key=out["key"],
            mime_type=out["mime_type"],
            size_bytes=out["size_bytes"],
            url=out["url"],
            metadata=_struct(out["metadata"]),
        )
    return message


class JobService(jobs_pb2_grpc.JobServiceServicer):
    """Authenticates each call from the ``authorization`` metadata entry, then delegates."""

    def __init__(self, api: JobsAPI, authenticate: Callable[[str | None], Awaitable[Caller]]) -> None:
        self._api = api
        self._authenticate = authenticate

    async def _caller(self, context: grpc.aio.ServicerContext) -> Caller:
        header = None
        for key, value in context.invocation_metadata() or ():
            if key == "authorization":
                header = str(value)
        return await self._authenticate(header)

    async def UploadObject(
        self, request: jobs_pb2.UploadObjectRequest, context: grpc.aio.ServicerContext
    ) -> jobs_pb2.UploadObjectResponse:
        caller = await self._caller(context)
        obj = await self._api.upload_object(caller, request.content, request.filename)
        # The response carries the fields jobs.v1 declares (the REST answer has more).
        fields = jobs_pb2.UploadObjectResponse.DESCRIPTOR.fields_by_name
        return jobs_pb2.UploadObjectResponse(
            **{k: v for k, v in obj.items() if k in fields and v is not None}
        )

    async def DeleteObject(
        self, request: jobs_pb2.DeleteObjectRequest, context: grpc.aio.ServicerContext
    ) -> jobs_pb2.DeleteObjectResponse:
        caller = await self._caller(context)
        return jobs_pb2.DeleteObjectResponse(**await self._api.delete_object(caller, request.object_id))

    async def Process(
        self, request: jobs_pb2.ProcessRequest, context: grpc.aio.ServicerContext
    ) -> jobs_pb2.ProcessResponse:
        caller = await self._caller(context)
        operations = self._api.parse_operations(
            [
                {"name": op.name, "params": _plain(json_format.MessageToDict(op.params))}
                for op in request.operations
            ]
        )
        result = await self._api.process(
            caller,
            request.object_id,
            operations,
            request.priority or None,
            request.webhook_url or None,
            request.idempotency_key or None,
        )
        return jobs_pb2.ProcessResponse(
            job_ids=result["job_ids"], estimated_credits=_credits(result["estimated_credits"])
        )

    async def GetJob(
        self, request: jobs_pb2.GetJobRequest, context: grpc.aio.ServicerContext
    ) -> jobs_pb2.GetJobResponse:
        caller = await self._caller(context)
        return jobs_pb2.GetJobResponse(job=job_message(await self._api.get_job(caller, request.job_id)))

    async def CancelJob(
        self, request: jobs_pb2.CancelJobRequest, context: grpc.aio.ServicerContext
    ) -> jobs_pb2.CancelJobResponse:
        caller = await self._caller(context)
        return jobs_pb2.CancelJobResponse(job=job_message(await self._api.cancel_job(caller, request.job_id)))

    async def WatchJob(
        self, request: jobs_pb2.WatchJobRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[jobs_pb2.WatchJobResponse]:
        # Streams bypass the unary error interceptor: map domain errors here.
        try:
            caller = await self._caller(context)
            events = await self._api.watch_job(caller, request.job_id, request.after_event_id)
        except DomainError as exc:
            await rpc.abort(context, exc)
            return
        async for event in events:
            if event is None:
                continue
            created = timestamp_pb2.Timestamp()
            created.FromDatetime(event.created_at)
            yield jobs_pb2.WatchJobResponse(
                event_id=event.event_id,
                job_id=event.job_id,
                kind=event.kind,
                status=jobs_pb2.JobStatus.Value(f"JOB_STATUS_{event.status.upper()}"),
                progress=event.progress or 0.0,
                detail=_struct(event.detail),
                created_at=created,
            )

    async def ListOcrLanguages(
        self, request: jobs_pb2.ListOcrLanguagesRequest, context: grpc.aio.ServicerContext
    ) -> jobs_pb2.ListOcrLanguagesResponse:
        await self._caller(context)
        return jobs_pb2.ListOcrLanguagesResponse(languages=await self._api.ocr_languages())

    async def GetBalance(
        self, request: jobs_pb2.GetBalanceRequest, context: grpc.aio.ServicerContext
    ) -> jobs_pb2.GetBalanceResponse:
        caller = await self._caller(context)
        balance = await self._api.balance(caller)
        return jobs_pb2.GetBalanceResponse(
            balance=_credits(balance["balance"]), held=_credits(balance["held"])
        )
