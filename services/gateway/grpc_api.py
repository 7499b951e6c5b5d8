"""gRPC ``hypermedia.jobs.v1.JobService``: the same use cases as REST
(:class:`~services.gateway.usecases.UseCases`), their results rendered into ``jobs.v1`` messages
here: ``Timestamp`` from datetimes, credits as decimal strings from millicredits."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import grpc
from google.protobuf import json_format, struct_pb2, timestamp_pb2

from hypermedia.api.jobs.v1 import jobs_pb2, jobs_pb2_grpc
from hypermedia.core.errors import DomainError, InvalidArgument
from hypermedia.infra import rpc
from hypermedia.jobs.accounts import Caller, check_write
from services.gateway.catalogue import PRICE_FORMULA, OperationInfo
from services.gateway.process_request import parse_operations
from services.gateway.results import Job, ObjectInfo, StorageUsage, StoredObject
from services.gateway.status import JobFilter
from services.gateway.usecases import UseCases


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


def timestamp_of(value: datetime | None) -> timestamp_pb2.Timestamp | None:
    """``value`` as a Timestamp (``Timestamp.FromDatetime``: an aware time converted to UTC, a
    naive one taken as UTC); None for None, leaving the field unset."""
    if value is None:
        return None
    ts = timestamp_pb2.Timestamp()
    ts.FromDatetime(value)
    return ts


def time_of(message: Any, name: str) -> datetime | None:
    """The Timestamp field ``name`` of ``message`` as an aware UTC datetime; None when unset
    (the inverse of :func:`timestamp_of`)."""
    if not message.HasField(name):
        return None
    value: timestamp_pb2.Timestamp = getattr(message, name)
    return value.ToDatetime(tzinfo=UTC)


def _not_before(request: jobs_pb2.ProcessRequest) -> datetime | None:
    """``not_before`` of a Process request as an aware UTC time, None when unset. Raises
    InvalidArgument (``INVALID_SCHEDULE``) for a Timestamp outside what a time can hold (years
    1 to 9999)."""
    try:
        return time_of(request, "not_before")
    except (ValueError, OverflowError):
        raise InvalidArgument("not_before is not a valid time", "INVALID_SCHEDULE") from None


def credits_text(millicredits: int | None) -> str:
    """Millicredits as ``jobs.v1``'s credits: a decimal string of credits with three decimals
    (1234 → ``"1.234"``, -5 → ``"-0.005"``), ``""`` for None. Integer arithmetic, so no amount
    passes through a float."""
    if millicredits is None:
        return ""
    whole, thousandths = divmod(abs(millicredits), 1000)
    return f"{'-' if millicredits < 0 else ''}{whole}.{thousandths:03d}"


def job_message(job: Job) -> jobs_pb2.Job:
    """A :class:`~services.gateway.results.Job` as a ``jobs.v1.Job`` (which has no
    ``profile_version``, ``queued_at``, ``next_attempt_at`` or attempts)."""
    message = jobs_pb2.Job(
        job_id=job.job_id,
        object_id=job.object_id,
        operation=job.operation,
        params=_struct(job.params),
        status=jobs_pb2.JobStatus.Value(f"JOB_STATUS_{job.status.upper()}"),
        priority=job.priority,
        attempt_count=job.attempt_count,
        max_attempts=job.max_attempts,
        lost_attempts=job.lost_attempts,
        error_code=job.error_code or "",
        error_message=job.error_message or "",
        estimated_credits=credits_text(job.estimated_millicredits),
        actual_credits=credits_text(job.actual_millicredits),
        charge_lines={name: credits_text(amount) for name, amount in job.charge_lines.items()},
        preset_name=job.preset[0] if job.preset else "",
        queue=job.queue,
        preset_version=job.preset[1] if job.preset else 0,
        created_at=timestamp_of(job.created_at),
        started_at=timestamp_of(job.started_at),
        completed_at=timestamp_of(job.completed_at),
        not_before=timestamp_of(job.not_before),
    )
    for out in job.outputs:
        message.outputs.add(
            output_type=out.output_type,
            key=out.key,
            mime_type=out.mime_type,
            size_bytes=out.size_bytes,
            url=out.url,
            metadata=_struct(out.metadata),
        )
    return message


_STATUS_NAMES = {
    int(value): name.removeprefix("JOB_STATUS_").lower() for name, value in jobs_pb2.JobStatus.items()
}


def status_name(status: int) -> str:
    """A ``JobStatus`` enum value as the status it names (``JOB_STATUS_RETRY_WAIT`` →
    ``retry_wait``); ``JOB_STATUS_UNSPECIFIED`` and unknown numbers as themselves, which
    :meth:`JobStatus.list_jobs` refuses (``INVALID_STATUS``)."""
    return _STATUS_NAMES.get(status, str(status))


def upload_message(obj: StoredObject) -> jobs_pb2.UploadObjectResponse:
    """A stored original as ``UploadObjectResponse`` (a missing claimed or name-implied type is ``""``)."""
    return jobs_pb2.UploadObjectResponse(
        object_id=obj.object_id,
        pool_id=obj.pool_id,
        size_bytes=obj.size_bytes,
        mime_type=obj.mime_type,
        sha256=obj.sha256,
        filename=obj.filename,
        claimed_mime_type=obj.claimed_mime_type or "",
        name_mime_type=obj.name_mime_type or "",
        type_mismatch=obj.type_mismatch,
    )


def object_message(obj: ObjectInfo) -> jobs_pb2.GetObjectResponse:
    """An object as ``GetObjectResponse`` (an original's ``source_object_id`` is ``""``)."""
    return jobs_pb2.GetObjectResponse(
        object_id=obj.object_id,
        pool_id=obj.pool_id,
        size_bytes=obj.size_bytes,
        mime_type=obj.mime_type,
        sha256=obj.sha256,
        filename=obj.filename,
        source_object_id=obj.source_object_id or "",
        created_at=timestamp_of(obj.created_at),
        url=obj.url,
        url_expires_at=timestamp_of(obj.url_expires_at),
    )


def usage_message(usage: StorageUsage) -> jobs_pb2.DeleteObjectResponse:
    """The storage usage after a delete as ``DeleteObjectResponse``."""
    return jobs_pb2.DeleteObjectResponse(
        used_bytes=usage.used_bytes,
        limit_bytes=usage.limit_bytes,
        used_objects=usage.used_objects,
        limit_objects=usage.limit_objects,
    )


def operation_message(op: OperationInfo) -> jobs_pb2.OperationInfo:
    """An operation as ``ListOperations`` lists it (credits as decimal strings)."""
    return jobs_pb2.OperationInfo(
        name=op.name,
        queue=op.queue,
        profile_version=op.profile_version,
        input_kinds=list(op.input_kinds),
        params_schema=_struct(op.params_schema),
        base_credits=credits_text(op.base_millicredits),
        per_mb_credits=credits_text(op.per_mb_millicredits),
        escalation_per_page_credits=credits_text(op.escalation_per_page_millicredits),
        work_unit=op.work_unit or "",
        per_unit_credits=credits_text(op.per_unit_millicredits),
        timeout_seconds=op.timeout_seconds,
        max_attempts=op.max_attempts,
        max_input_bytes=op.max_input_bytes,
        max_pixels=op.max_pixels,
        memory_limit_mb=op.memory_limit_mb,
        max_duration_seconds=op.max_duration_seconds,
    )


def _operation(op: jobs_pb2.Operation) -> dict[str, Any]:
    """``op`` as REST's JSON has it: ``{name, params}``, ``{preset}``, or with both (refused by
    :func:`parse_operations`). A typed one (the ``typed`` oneof) is ``{name: its field's name,
    params: its set fields}`` (a waveform's ``no_image`` as ``"image": false``); with a name,
    params or preset beside it, ``INVALID_REQUEST``; a waveform's ``image`` with ``no_image``,
    ``INVALID_PARAMS``."""
    typed = op.WhichOneof("typed")
    if typed is not None:
        if op.name or op.preset or op.params.fields:
            raise InvalidArgument(
                f"operation {typed!r} is typed: give no name, params or preset beside it", "INVALID_REQUEST"
            )
        params = json_format.MessageToDict(getattr(op, typed), preserving_proto_field_name=True)
        if params.pop("no_image", False):  # WaveformParams: REST's "image": false
            if "image" in params:
                raise InvalidArgument("waveform: give image or no_image, not both", "INVALID_PARAMS")
            params["image"] = False
        return {"name": typed, "params": params}
    if op.preset and not op.name and not op.params.fields:
        return {"preset": op.preset}
    shape: dict[str, Any] = {"name": op.name, "params": _plain(json_format.MessageToDict(op.params))}
    if op.preset:
        shape["preset"] = op.preset
    return shape


async def authenticated(
    context: grpc.aio.ServicerContext,
    authenticate: Callable[[str | None], Awaitable[Caller]],
    *,
    write: bool = True,
) -> Caller:
    """The caller of a public RPC, from its ``authorization`` metadata entry (the last one).
    ``write``: the RPC changes something (the default, so an RPC not marked a read is refused
    to a read-only key). Raises Unauthenticated as ``authenticate`` does, PermissionDenied
    (``READ_ONLY_KEY``) for a read-only key's write (:func:`hypermedia.jobs.accounts.check_write`)."""
    header = None
    for key, value in context.invocation_metadata() or ():
        if key == "authorization":
            header = str(value)
    caller = await authenticate(header)
    if write:
        check_write(caller)
    return caller


class JobService(jobs_pb2_grpc.JobServiceServicer):
    """Authenticates each call from the ``authorization`` metadata entry, then delegates."""

    def __init__(self, api: UseCases, authenticate: Callable[[str | None], Awaitable[Caller]]) -> None:
        self._api = api
        self._authenticate = authenticate

    async def _caller(self, context: grpc.aio.ServicerContext, *, write: bool = True) -> Caller:
        return await authenticated(context, self._authenticate, write=write)

    async def UploadObject(
        self, request: jobs_pb2.UploadObjectRequest, context: grpc.aio.ServicerContext
    ) -> jobs_pb2.UploadObjectResponse:
        caller = await self._caller(context)
        return upload_message(
            await self._api.uploads.upload_object(caller, request.content, request.filename)
        )

    async def GetObject(
        self, request: jobs_pb2.GetObjectRequest, context: grpc.aio.ServicerContext
    ) -> jobs_pb2.GetObjectResponse:
        caller = await self._caller(context, write=False)
        return object_message(await self._api.uploads.get_object(caller, request.object_id))

    async def GetOutputUrl(
        self, request: jobs_pb2.GetOutputUrlRequest, context: grpc.aio.ServicerContext
    ) -> jobs_pb2.GetOutputUrlResponse:
        caller = await self._caller(context, write=False)
        link = await self._api.status.output_link(caller, request.job_id, request.output_type)
        return jobs_pb2.GetOutputUrlResponse(
            output_type=link.output_type,
            object_id=link.object_id,
            mime_type=link.mime_type,
            size_bytes=link.size_bytes,
            url=link.url,
            url_expires_at=timestamp_of(link.url_expires_at),
        )

    async def ListObjects(
        self, request: jobs_pb2.ListObjectsRequest, context: grpc.aio.ServicerContext
    ) -> jobs_pb2.ListObjectsResponse:
        caller = await self._caller(context, write=False)
        page = await self._api.uploads.list_objects(
            caller, request.kind, request.page_size or 50, request.page_token or None
        )
        return jobs_pb2.ListObjectsResponse(
            objects=[
                jobs_pb2.ObjectSummary(
                    object_id=o.object_id,
                    size_bytes=o.size_bytes,
                    mime_type=o.mime_type,
                    sha256=o.sha256,
                    filename=o.filename,
                    source_object_id=o.source_object_id or "",
                    created_at=timestamp_of(o.created_at),
                )
                for o in page.objects
            ],
            next_page_token=page.next_cursor or "",
        )

    async def DeleteObject(
        self, request: jobs_pb2.DeleteObjectRequest, context: grpc.aio.ServicerContext
    ) -> jobs_pb2.DeleteObjectResponse:
        caller = await self._caller(context)
        return usage_message(await self._api.uploads.delete_object(caller, request.object_id))

    async def Process(
        self, request: jobs_pb2.ProcessRequest, context: grpc.aio.ServicerContext
    ) -> jobs_pb2.ProcessResponse:
        caller = await self._caller(context)
        operations = parse_operations([_operation(op) for op in request.operations])
        result = await self._api.creation.process(
            caller,
            request.object_id,
            operations,
            request.priority or None,
            request.webhook_url or None,
            request.idempotency_key or None,
            request.queue or None,
            not_before=_not_before(request),
            delay_seconds=request.delay_seconds if request.HasField("delay_seconds") else None,
        )
        return jobs_pb2.ProcessResponse(
            job_ids=result.job_ids,
            estimated_credits=credits_text(result.estimated_millicredits),
            not_before=timestamp_of(result.not_before),
        )

    async def Estimate(
        self, request: jobs_pb2.EstimateRequest, context: grpc.aio.ServicerContext
    ) -> jobs_pb2.EstimateResponse:
        caller = await self._caller(context, write=False)
        operations = parse_operations([_operation(op) for op in request.operations])
        result = await self._api.creation.estimate(
            caller, request.object_id, operations, request.priority or None
        )
        return jobs_pb2.EstimateResponse(
            estimated_credits=credits_text(sum(e.millicredits for e in result.operations)),
            held_credits=credits_text(result.total_millicredits),
            operations=[
                jobs_pb2.OperationEstimate(
                    operation=e.operation,
                    credits=credits_text(e.millicredits),
                    allowance_credits=credits_text(e.allowance_millicredits),
                    predicted_seconds=e.predicted_seconds,
                    samples=e.samples,
                    basis=e.basis,
                )
                for e in result.operations
            ],
        )

    async def GetJob(
        self, request: jobs_pb2.GetJobRequest, context: grpc.aio.ServicerContext
    ) -> jobs_pb2.GetJobResponse:
        caller = await self._caller(context, write=False)
        return jobs_pb2.GetJobResponse(
            job=job_message(await self._api.status.get_job(caller, request.job_id))
        )

    async def ListJobs(
        self, request: jobs_pb2.ListJobsRequest, context: grpc.aio.ServicerContext
    ) -> jobs_pb2.ListJobsResponse:
        caller = await self._caller(context, write=False)
        filters = JobFilter(
            statuses=tuple(status_name(s) for s in request.statuses),
            operation=request.operation or None,
            object_id=request.object_id or None,
            created_after=time_of(request, "created_after"),
            created_before=time_of(request, "created_before"),
        )
        page = await self._api.status.list_jobs(
            caller, filters, request.page_size or 50, request.page_token or None
        )
        return jobs_pb2.ListJobsResponse(
            jobs=[job_message(job) for job in page.jobs], next_page_token=page.next_cursor or ""
        )

    async def CancelJob(
        self, request: jobs_pb2.CancelJobRequest, context: grpc.aio.ServicerContext
    ) -> jobs_pb2.CancelJobResponse:
        caller = await self._caller(context)
        return jobs_pb2.CancelJobResponse(
            job=job_message(await self._api.cancellation.cancel_job(caller, request.job_id))
        )

    async def WatchJob(
        self, request: jobs_pb2.WatchJobRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[jobs_pb2.WatchJobResponse]:
        # Streams bypass the unary error interceptor: map domain errors here.
        try:
            caller = await self._caller(context, write=False)
            events = await self._api.status.watch_job(caller, request.job_id, request.after_event_id)
        except DomainError as exc:
            await rpc.abort(context, exc)
            return
        async for event in events:
            if event is None:  # a keep-alive (15 s): the key again, the stream ends once revoked
                try:
                    await self._caller(context, write=False)
                except DomainError as exc:
                    await rpc.abort(context, exc)
                    return
                continue
            yield jobs_pb2.WatchJobResponse(
                event_id=event.event_id,
                job_id=event.job_id,
                kind=event.kind,
                status=jobs_pb2.JobStatus.Value(f"JOB_STATUS_{event.status.upper()}"),
                progress=event.progress or 0.0,
                detail=_struct(event.detail),
                created_at=timestamp_of(event.created_at),
            )

    async def ListOperations(
        self, request: jobs_pb2.ListOperationsRequest, context: grpc.aio.ServicerContext
    ) -> jobs_pb2.ListOperationsResponse:
        await self._caller(context, write=False)
        return jobs_pb2.ListOperationsResponse(
            operations=[operation_message(o) for o in await self._api.catalogue.operations()],
            price_formula=PRICE_FORMULA,
        )

    async def ListOcrLanguages(
        self, request: jobs_pb2.ListOcrLanguagesRequest, context: grpc.aio.ServicerContext
    ) -> jobs_pb2.ListOcrLanguagesResponse:
        await self._caller(context, write=False)
        return jobs_pb2.ListOcrLanguagesResponse(languages=await self._api.creation.ocr_languages())

    async def ListLedger(
        self, request: jobs_pb2.ListLedgerRequest, context: grpc.aio.ServicerContext
    ) -> jobs_pb2.ListLedgerResponse:
        caller = await self._caller(context, write=False)
        page = await self._api.accounts.ledger(caller, request.page_size or 50, request.page_token or None)
        return jobs_pb2.ListLedgerResponse(
            entries=[
                jobs_pb2.LedgerEntry(
                    entry_id=e.entry_id,
                    kind=e.kind,
                    line=e.line,
                    credits=credits_text(e.millicredits),
                    job_id=e.job_id or "",
                    operation=e.operation or "",
                    job_status=e.job_status or "",
                    error_code=e.error_code or "",
                    created_at=timestamp_of(e.created_at),
                )
                for e in page.entries
            ],
            next_page_token=page.next_cursor or "",
        )

    async def GetBalance(
        self, request: jobs_pb2.GetBalanceRequest, context: grpc.aio.ServicerContext
    ) -> jobs_pb2.GetBalanceResponse:
        caller = await self._caller(context, write=False)
        balance = await self._api.accounts.balance(caller)
        return jobs_pb2.GetBalanceResponse(
            balance=credits_text(balance.balance_millicredits), held=credits_text(balance.held_millicredits)
        )
