"""Listing the caller's jobs (issue 22 item 3): ``GET /v1/jobs`` and gRPC ``ListJobs`` against the
real platform, newest first, filtered by status, operation, object and creation time, paged with
an opaque cursor, never showing another account's jobs, and a specific 422 / INVALID_ARGUMENT
for each bad filter."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from google.protobuf import timestamp_pb2

from hypermedia.api.jobs.v1 import jobs_pb2, jobs_pb2_grpc
from tests.e2e.conftest import RunningPlatform, upload, wait_job

PHOTOS = Path(__file__).resolve().parents[1] / "data" / "exif-orientation"


@pytest.fixture(scope="module")
def listed(platform: RunningPlatform) -> dict[str, Any]:
    """A fresh account with three completed jobs: thumbnail and convert of one photo, then a
    thumbnail of another, in that order of creation."""
    account = platform.admin("create-account", "--credits", "100")
    with platform.client(account) as client:
        first, second = upload(client, PHOTOS / "Landscape_0.jpg"), upload(client, PHOTOS / "Landscape_1.jpg")
        jobs = []
        for obj, ops in (
            (first, ["thumbnail", {"name": "convert", "params": {"format": "png"}}]),
            (second, ["thumbnail"]),
        ):
            response = client.post(
                "/v1/hypermedia/process", json={"object_id": obj["object_id"], "operations": ops}
            )
            assert response.status_code == 202, response.text
            jobs += [wait_job(client, job_id) for job_id in response.json()["job_ids"]]
    assert {job["status"] for job in jobs} == {"completed"}
    return {"account": account, "jobs": jobs, "objects": [first["object_id"], second["object_id"]]}


def _ids(page: dict[str, Any]) -> list[str]:
    return [job["job_id"] for job in page["jobs"]]


def test_jobs_are_listed_newest_first_and_paged_with_a_cursor(
    platform: RunningPlatform, listed: dict[str, Any]
) -> None:
    newest_first = sorted(listed["jobs"], key=lambda j: (j["created_at"], j["job_id"]), reverse=True)
    with platform.client(listed["account"]) as client:
        everything = client.get("/v1/jobs").json()
        assert _ids(everything) == [j["job_id"] for j in newest_first]
        assert everything["next_cursor"] is None
        summary = everything["jobs"][0]
        assert "outputs" not in summary and "attempts" not in summary
        assert summary == {
            k: v
            for k, v in client.get(f"/v1/jobs/{summary['job_id']}").json().items()
            if k not in ("outputs", "attempts")
        }

        seen, cursor, pages = [], None, 0
        while True:
            response = client.get("/v1/jobs", params={"limit": 1, **({"cursor": cursor} if cursor else {})})
            assert response.status_code == 200, response.text
            seen += _ids(response.json())
            pages += 1
            cursor = response.json()["next_cursor"]
            if cursor is None:
                break
        assert (seen, pages) == (_ids(everything), 3)


def test_filters_by_status_operation_object_and_creation_time(
    platform: RunningPlatform, listed: dict[str, Any]
) -> None:
    jobs = listed["jobs"]
    first_object, second_object = listed["objects"]
    with platform.client(listed["account"]) as client:

        def ids(**params: Any) -> set[str]:
            response = client.get("/v1/jobs", params=params)
            assert response.status_code == 200, response.text
            return set(_ids(response.json()))

        thumbnails = {j["job_id"] for j in jobs if j["operation"] == "thumbnail"}
        assert len(thumbnails) == 2
        assert ids(operation="thumbnail") == thumbnails
        assert ids(object_id=second_object) == {jobs[2]["job_id"]}
        assert ids(object_id=first_object, operation="convert") == {jobs[1]["job_id"]}
        assert ids(status="completed") == {j["job_id"] for j in jobs}
        assert ids(status=["queued", "failed"]) == set()

        oldest = min(datetime.fromisoformat(j["created_at"]) for j in jobs)
        newest = max(datetime.fromisoformat(j["created_at"]) for j in jobs)
        assert ids(created_before=oldest.isoformat()) == set()
        assert ids(created_after=oldest.isoformat()) == {j["job_id"] for j in jobs}
        assert ids(created_after=newest.isoformat()) == {
            j["job_id"] for j in jobs if datetime.fromisoformat(j["created_at"]) == newest
        }
        naive_utc = (newest + timedelta(seconds=1)).astimezone(UTC).replace(tzinfo=None)
        assert ids(created_before=naive_utc.isoformat()) == {j["job_id"] for j in jobs}  # read as UTC

    # Another account sees none of them, whatever it asks.
    other = platform.admin("create-account", "--credits", "1")
    with platform.client(other) as client:
        assert client.get("/v1/jobs").json() == {"jobs": [], "next_cursor": None}
        assert client.get("/v1/jobs", params={"object_id": first_object}).json()["jobs"] == []


@pytest.mark.parametrize(
    ("params", "code", "says"),
    [
        ({"status": "done"}, "INVALID_STATUS", "retry_wait"),
        ({"operation": "thumbnale"}, "UNKNOWN_OPERATION", "thumbnail"),
        ({"object_id": "not-a-uuid"}, "INVALID_ID", "not-a-uuid"),
        ({"cursor": "bm90IGEgY3Vyc29y"}, "INVALID_CURSOR", "next_cursor"),
        ({"cursor": "%%%"}, "INVALID_CURSOR", "next_cursor"),
        # A well-formed position whose time is outside years 1-9999 in UTC (was a 500).
        (
            {
                "cursor": "eyJ0IjogIjAwMDEtMDEtMDFUMDA6MDA6MDArMTQ6MDAiLCAiaiI6ICIwZmQ4YmFjMy02OTk1LTRiZmItYTQ2MC0xMzk4OGNjMmY2ZDQifQ"
            },
            "INVALID_CURSOR",
            "next_cursor",
        ),
        (
            {"created_after": "2026-01-02T00:00:00Z", "created_before": "2026-01-01T00:00:00Z"},
            "INVALID_RANGE",
            "created_after",
        ),
        ({"created_after": "0001-01-01T00:00:00+14:00"}, "INVALID_RANGE", "created_after"),
        ({"created_before": "9999-12-31T23:59:59-14:00"}, "INVALID_RANGE", "created_before"),
        ({"limit": 0}, "INVALID_REQUEST", "limit"),
        ({"limit": 1001}, "INVALID_REQUEST", "limit"),
        ({"created_after": "yesterday"}, "INVALID_REQUEST", "created_after"),
        # Unix seconds are not a time here (pydantic took 0.5 as 1970-01-01T00:00:00.5Z).
        ({"created_before": "0.5"}, "INVALID_REQUEST", "created_before"),
        ({"statuss": "failed"}, "UNKNOWN_PARAMETER", "'statuss'; this path takes: created_after"),
        ({"created_after": "1700000000"}, "INVALID_REQUEST", "created_after"),
    ],
)
def test_a_bad_filter_is_a_specific_422(
    client: httpx.Client, params: dict[str, Any], code: str, says: str
) -> None:
    response = client.get("/v1/jobs", params=params)
    assert response.status_code == 422, response.text
    problem = response.json()
    assert problem["error_code"] == code
    assert says in (problem["detail"] if code != "INVALID_REQUEST" else str(problem["errors"]))
    assert "Traceback" not in response.text


def test_list_jobs_over_grpc(platform: RunningPlatform, listed: dict[str, Any]) -> None:
    metadata = (("authorization", f"Bearer {listed['account']['api_key']}"),)
    rest_order = sorted(listed["jobs"], key=lambda j: (j["created_at"], j["job_id"]), reverse=True)
    with grpc.insecure_channel(platform.grpc_addr) as channel:
        stub = jobs_pb2_grpc.JobServiceStub(channel)
        first = stub.ListJobs(jobs_pb2.ListJobsRequest(page_size=2), metadata=metadata)
        assert len(first.jobs) == 2 and first.next_page_token
        rest = stub.ListJobs(
            jobs_pb2.ListJobsRequest(page_size=2, page_token=first.next_page_token), metadata=metadata
        )
        assert rest.next_page_token == ""
        assert [j.job_id for j in [*first.jobs, *rest.jobs]] == [j["job_id"] for j in rest_order]
        assert all(j.status == jobs_pb2.JOB_STATUS_COMPLETED and not j.outputs for j in first.jobs)

        oldest = min(datetime.fromisoformat(j["created_at"]) for j in listed["jobs"])
        before = timestamp_pb2.Timestamp()
        before.FromDatetime(oldest)
        filtered = stub.ListJobs(
            jobs_pb2.ListJobsRequest(
                statuses=[jobs_pb2.JOB_STATUS_COMPLETED], operation="thumbnail", created_before=before
            ),
            metadata=metadata,
        )
        assert list(filtered.jobs) == []
        thumbnails = stub.ListJobs(jobs_pb2.ListJobsRequest(operation="thumbnail"), metadata=metadata)
        assert len(thumbnails.jobs) == 2

        for request, code in (
            (jobs_pb2.ListJobsRequest(statuses=[jobs_pb2.JOB_STATUS_UNSPECIFIED]), "INVALID_STATUS"),
            (jobs_pb2.ListJobsRequest(page_size=5000), "INVALID_PAGE_SIZE"),
            (jobs_pb2.ListJobsRequest(page_token="junk"), "INVALID_CURSOR"),
            (
                jobs_pb2.ListJobsRequest(
                    page_token="eyJ0IjogIjk5OTktMTItMzFUMjM6NTk6NTktMTQ6MDAiLCAiaiI6ICIwZmQ4YmFjMy02OTk1LTRiZmItYTQ2MC0xMzk4OGNjMmY2ZDQifQ"
                ),
                "INVALID_CURSOR",
            ),
        ):
            with pytest.raises(grpc.RpcError) as refused:
                stub.ListJobs(request, metadata=metadata)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert dict(refused.value.trailing_metadata())["hm-error-code"] == code  # type: ignore[attr-defined]
