"""The gateway's typed results rendered by each transport (``services.gateway.results``): REST
into the JSON it has always answered (ISO 8601 strings, credits as numbers rounded to three
decimals), gRPC into ``jobs.v1`` messages (Timestamps from the datetimes, credits as decimal
strings from the millicredits), each checked field by field after a round trip through the wire
format (``json`` text, protobuf bytes)."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime, timedelta, timezone

import pytest
from google.protobuf import json_format, timestamp_pb2

from hypermedia.api.jobs.v1 import jobs_pb2
from services.gateway.grpc_api import credits_text, job_message, status_name, upload_message, usage_message
from services.gateway.rest import balance_json, credits_number, job_json, process_json
from services.gateway.results import (
    Attempt,
    Balance,
    Job,
    Output,
    ProcessResult,
    StorageUsage,
    StoredObject,
)
from services.gateway.status import JOB_STATUSES

CREATED = datetime(2026, 3, 4, 5, 6, 7, 123456, tzinfo=UTC)
QUEUED = datetime(2026, 3, 4, 5, 6, 8, tzinfo=UTC)
STARTED = datetime(2026, 3, 4, 7, 6, 9, 500000, tzinfo=timezone(timedelta(hours=2)))  # 05:06:09.5Z
COMPLETED = datetime(2026, 3, 4, 5, 6, 12, 250000, tzinfo=UTC)
NEXT = datetime(2026, 3, 4, 5, 16, 0, tzinfo=UTC)
NOT_BEFORE = datetime(2026, 3, 4, 5, 6, 7, 500000, tzinfo=UTC)

ATTEMPTS = (
    Attempt(
        attempt_number=1,
        worker_id="ocrworker-a:1",
        status="failed",
        error_code="TIMEOUT",
        error_message="the job took longer than 120 s",
        started_at=QUEUED,
        finished_at=STARTED,
        duration_ms=3500,
        peak_memory_mb=212,
    ),
    Attempt(
        attempt_number=2,
        worker_id="ocrworker-b:2",
        status="completed",
        error_code=None,
        error_message=None,
        started_at=STARTED,
        finished_at=COMPLETED,
        duration_ms=2750,
        peak_memory_mb=None,
    ),
)
OUTPUTS = (
    Output(
        output_type="text",
        object_id="5d0c6a43-4f4e-4a8e-9b56-3c4d2f0e9a11",
        key="derived/p1/o1/3/text-abc",
        mime_type="text/plain; charset=utf-8",
        size_bytes=4321,
        metadata={"pages": 2, "languages": ["eng", "deu"], "mean_confidence": 91.5},
        url="http://127.0.0.1:9000/derived/p1/o1/3/text-abc?X-Amz-Signature=00",
    ),
)
JOB = Job(
    job_id="0b9f4c1e-7a2d-4c55-8f0e-6d1b2a3c4d5e",
    object_id="9e8d7c6b-5a49-4382-b1a0-f9e8d7c6b5a4",
    operation="ocr",
    profile_version=3,
    queue="ocr",
    params={"languages": ["eng", "deu"], "escalate": True, "dpi": 300},
    preset=("scans", 2),
    status="completed",
    priority=4,
    attempt_count=2,
    max_attempts=3,
    lost_attempts=1,
    error_code="TIMEOUT",
    error_message="the first attempt timed out",
    estimated_millicredits=1234,
    actual_millicredits=2005,
    charge_lines={"ocr_escalation": 771, "base": 1234},
    created_at=CREATED,
    queued_at=QUEUED,
    started_at=STARTED,
    completed_at=COMPLETED,
    next_attempt_at=NEXT,
    not_before=NOT_BEFORE,
    attempts=ATTEMPTS,
    outputs=OUTPUTS,
)


def _seconds(ts: timestamp_pb2.Timestamp) -> float:
    return ts.seconds + ts.nanos / 1e9


def test_a_job_with_every_field_as_the_rest_json() -> None:
    body = json.loads(json.dumps(job_json(JOB)))
    assert list(body) == [
        "job_id",
        "object_id",
        "operation",
        "profile_version",
        "queue",
        "params",
        "preset",
        "status",
        "priority",
        "attempt_count",
        "max_attempts",
        "lost_attempts",
        "error_code",
        "error_message",
        "estimated_credits",
        "actual_credits",
        "charge_lines",
        "created_at",
        "queued_at",
        "started_at",
        "completed_at",
        "next_attempt_at",
        "not_before",
        "attempts",
        "outputs",
    ]
    assert body["job_id"] == "0b9f4c1e-7a2d-4c55-8f0e-6d1b2a3c4d5e"
    assert body["object_id"] == "9e8d7c6b-5a49-4382-b1a0-f9e8d7c6b5a4"
    assert body["operation"] == "ocr"
    assert body["profile_version"] == 3
    assert body["queue"] == "ocr"
    assert body["params"] == {"languages": ["eng", "deu"], "escalate": True, "dpi": 300}
    assert body["preset"] == {"name": "scans", "version": 2}
    assert body["status"] == "completed"
    assert body["priority"] == 4
    assert (body["attempt_count"], body["max_attempts"], body["lost_attempts"]) == (2, 3, 1)
    assert body["error_code"] == "TIMEOUT"
    assert body["error_message"] == "the first attempt timed out"
    assert body["estimated_credits"] == 1.234 and isinstance(body["estimated_credits"], float)
    assert body["actual_credits"] == 2.005
    assert body["charge_lines"] == {"ocr_escalation": 0.771, "base": 1.234}
    assert body["created_at"] == "2026-03-04T05:06:07.123456+00:00"
    assert body["queued_at"] == "2026-03-04T05:06:08+00:00"
    assert body["started_at"] == "2026-03-04T07:06:09.500000+02:00"  # the offset it came with
    assert body["completed_at"] == "2026-03-04T05:06:12.250000+00:00"
    assert body["next_attempt_at"] == "2026-03-04T05:16:00+00:00"
    assert body["not_before"] == "2026-03-04T05:06:07.500000+00:00"
    assert body["attempts"] == [
        {
            "attempt_number": 1,
            "worker_id": "ocrworker-a:1",
            "status": "failed",
            "error_code": "TIMEOUT",
            "error_message": "the job took longer than 120 s",
            "started_at": "2026-03-04T05:06:08+00:00",
            "finished_at": "2026-03-04T07:06:09.500000+02:00",
            "duration_ms": 3500,
            "peak_memory_mb": 212,
        },
        {
            "attempt_number": 2,
            "worker_id": "ocrworker-b:2",
            "status": "completed",
            "error_code": None,
            "error_message": None,
            "started_at": "2026-03-04T07:06:09.500000+02:00",
            "finished_at": "2026-03-04T05:06:12.250000+00:00",
            "duration_ms": 2750,
            "peak_memory_mb": None,
        },
    ]
    assert body["outputs"] == [
        {
            "output_type": "text",
            "object_id": "5d0c6a43-4f4e-4a8e-9b56-3c4d2f0e9a11",
            "key": "derived/p1/o1/3/text-abc",
            "mime_type": "text/plain; charset=utf-8",
            "size_bytes": 4321,
            "metadata": {"pages": 2, "languages": ["eng", "deu"], "mean_confidence": 91.5},
            "url": "http://127.0.0.1:9000/derived/p1/o1/3/text-abc?X-Amz-Signature=00",
            "link": "/v1/jobs/0b9f4c1e-7a2d-4c55-8f0e-6d1b2a3c4d5e/outputs/text",
        }
    ]
    # Every time parses back to the instant it was made from.
    assert datetime.fromisoformat(body["started_at"]) == STARTED
    assert datetime.fromisoformat(body["attempts"][1]["finished_at"]) == COMPLETED


def test_a_job_with_every_field_as_the_grpc_message() -> None:
    message = jobs_pb2.Job.FromString(job_message(JOB).SerializeToString())
    assert message.job_id == "0b9f4c1e-7a2d-4c55-8f0e-6d1b2a3c4d5e"
    assert message.object_id == "9e8d7c6b-5a49-4382-b1a0-f9e8d7c6b5a4"
    assert message.operation == "ocr"
    assert json_format.MessageToDict(message.params) == {
        "languages": ["eng", "deu"],
        "escalate": True,
        "dpi": 300,
    }
    assert message.status == jobs_pb2.JOB_STATUS_COMPLETED
    assert (message.preset_name, message.preset_version) == ("scans", 2)
    assert message.priority == 4
    assert (message.attempt_count, message.max_attempts, message.lost_attempts) == (2, 3, 1)
    assert message.error_code == "TIMEOUT"
    assert message.error_message == "the first attempt timed out"
    assert message.estimated_credits == "1.234"
    assert message.actual_credits == "2.005"
    assert dict(message.charge_lines) == {"ocr_escalation": "0.771", "base": "1.234"}
    assert message.created_at.ToDatetime(tzinfo=UTC) == CREATED
    assert (message.created_at.seconds, message.created_at.nanos) == (int(CREATED.timestamp()), 123456000)
    assert message.started_at.ToDatetime(tzinfo=UTC) == STARTED  # the same instant, in UTC
    assert message.started_at.ToJsonString() == "2026-03-04T05:06:09.500Z"
    assert message.completed_at.ToJsonString() == "2026-03-04T05:06:12.250Z"
    assert message.not_before.ToJsonString() == "2026-03-04T05:06:07.500Z"
    [out] = message.outputs
    assert (out.output_type, out.key, out.mime_type, out.size_bytes) == (
        "text",
        "derived/p1/o1/3/text-abc",
        "text/plain; charset=utf-8",
        4321,
    )
    assert out.url == "http://127.0.0.1:9000/derived/p1/o1/3/text-abc?X-Amz-Signature=00"
    assert json_format.MessageToDict(out.metadata) == {
        "pages": 2.0,
        "languages": ["eng", "deu"],
        "mean_confidence": 91.5,
    }


def test_unset_fields_are_null_in_json_and_absent_in_the_message() -> None:
    job = dataclasses.replace(
        JOB,
        status="queued",
        preset=None,
        error_code=None,
        error_message=None,
        actual_millicredits=None,
        charge_lines={},
        started_at=None,
        completed_at=None,
        queued_at=None,
        next_attempt_at=None,
        not_before=None,
        attempts=(),
        outputs=(),
    )
    body = job_json(job)
    assert body["actual_credits"] is None and body["charge_lines"] == {} and body["preset"] is None
    assert body["started_at"] is body["completed_at"] is body["queued_at"] is body["next_attempt_at"] is None
    assert body["not_before"] is None
    assert body["attempts"] == [] and body["outputs"] == []
    message = jobs_pb2.Job.FromString(job_message(job).SerializeToString())
    assert message.status == jobs_pb2.JOB_STATUS_QUEUED
    assert message.actual_credits == "" and message.error_code == "" and message.error_message == ""
    assert (message.preset_name, message.preset_version) == ("", 0)
    assert message.HasField("created_at")
    assert not message.HasField("started_at") and not message.HasField("completed_at")
    assert not message.HasField("not_before")


def test_naive_and_aware_datetimes() -> None:
    """A naive time (Postgres ``timestamp`` rather than ``timestamptz``) is written without an
    offset by REST and taken as UTC by gRPC (``Timestamp.FromDatetime``); an aware one keeps its
    offset in REST and becomes the same instant in gRPC."""
    naive = datetime(2026, 3, 4, 5, 6, 7, 890000)
    aware_utc = naive.replace(tzinfo=UTC)
    aware_east = aware_utc.astimezone(timezone(timedelta(hours=5, minutes=30)))
    for created, iso in (
        (naive, "2026-03-04T05:06:07.890000"),
        (aware_utc, "2026-03-04T05:06:07.890000+00:00"),
        (aware_east, "2026-03-04T10:36:07.890000+05:30"),
    ):
        job = dataclasses.replace(JOB, created_at=created)
        assert job_json(job)["created_at"] == iso
        message = job_message(job)
        assert message.created_at.ToJsonString() == "2026-03-04T05:06:07.890Z"
        assert _seconds(message.created_at) == pytest.approx(aware_utc.timestamp(), abs=1e-6)
        # What gRPC answered before the typed results: the REST string parsed back.
        before = timestamp_pb2.Timestamp()
        before.FromDatetime(datetime.fromisoformat(iso))
        assert message.created_at == before


@pytest.mark.parametrize(
    ("millicredits", "number", "text"),
    [
        (1234, 1.234, "1.234"),
        (0, 0.0, "0.000"),
        (5, 0.005, "0.005"),
        (1000, 1.0, "1.000"),
        (100_000_000, 100_000.0, "100000.000"),
        (-5, -0.005, "-0.005"),
        (-1234, -1.234, "-1.234"),
        (None, None, ""),
    ],
)
def test_credits(millicredits: int | None, number: float | None, text: str) -> None:
    assert credits_number(millicredits) == number
    assert credits_text(millicredits) == text


def test_credit_strings_are_those_grpc_made_from_the_rest_floats() -> None:
    """Before the typed results gRPC formatted REST's float (``f"{credits:.3f}"``); the integer
    rendering gives the same string for every amount around zero and for large balances."""
    amounts = [*range(-3000, 3001), *range(10**9 - 3000, 10**9 + 3000), 2**40 + 7, -(2**40) - 999]
    for amount in amounts:
        value = credits_number(amount)
        assert value is not None
        assert credits_text(amount) == f"{value:.3f}", amount


def test_process_balance_upload_and_usage() -> None:
    result = ProcessResult(job_ids=("a", "b"), estimated_millicredits=2468)
    assert json.loads(json.dumps(process_json(result))) == {
        "job_ids": ["a", "b"],
        "estimated_credits": 2.468,
        "not_before": None,
    }
    delayed = dataclasses.replace(result, not_before=NOT_BEFORE)
    assert process_json(delayed)["not_before"] == "2026-03-04T05:06:07.500000+00:00"

    balance = Balance(balance_millicredits=10_000, held_millicredits=1_234)
    assert balance.available_millicredits == 8_766
    assert balance_json(balance) == {"balance": 10.0, "held": 1.234, "available": 8.766}

    obj = StoredObject(
        object_id="o1",
        pool_id="p1",
        size_bytes=42,
        mime_type="image/png",
        sha256="ab" * 32,
        filename="scan.jpg",
        claimed_mime_type="image/jpeg",
        name_mime_type=None,
        type_mismatch=True,
    )
    upload = jobs_pb2.UploadObjectResponse.FromString(upload_message(obj).SerializeToString())
    assert (upload.object_id, upload.pool_id, upload.size_bytes) == ("o1", "p1", 42)
    assert (upload.mime_type, upload.sha256, upload.filename) == ("image/png", "ab" * 32, "scan.jpg")
    assert (upload.claimed_mime_type, upload.name_mime_type, upload.type_mismatch) == ("image/jpeg", "", True)

    usage = usage_message(StorageUsage(used_bytes=1, limit_bytes=2, used_objects=3, limit_objects=4))
    assert (usage.used_bytes, usage.limit_bytes, usage.used_objects, usage.limit_objects) == (1, 2, 3, 4)


@pytest.mark.parametrize("status", JOB_STATUSES)
def test_every_job_status_has_its_enum_value(status: str) -> None:
    message = job_message(dataclasses.replace(JOB, status=status))
    assert jobs_pb2.JobStatus.Name(message.status) == f"JOB_STATUS_{status.upper()}"
    assert status_name(message.status) == status  # ListJobs reads the enum back


def test_the_statuses_are_the_enums_and_an_unknown_number_stays_unknown() -> None:
    assert {f"JOB_STATUS_{s.upper()}" for s in JOB_STATUSES} | {"JOB_STATUS_UNSPECIFIED"} == set(
        jobs_pb2.JobStatus.keys()
    )
    assert status_name(jobs_pb2.JOB_STATUS_UNSPECIFIED) == "unspecified"
    assert status_name(99) == "99"
