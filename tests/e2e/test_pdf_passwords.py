"""Encrypted PDFs with a password, end to end over REST and gRPC on real processes: the password is
taken out of the params, kept in ``job_secrets`` only while the job runs, distinguishes
Idempotency-Key requests through an HMAC, and is in no job JSON, event, database row or log line.

Two platforms, each on a database of its own (the whole database is searched for the password):
``worker_platform`` runs the docworker, ``idle_platform`` has no worker (its jobs stay ``queued``,
so the stored secret can be looked at before the job ends).
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import psycopg
import pytest

from hypermedia.api.jobs.v1 import jobs_pb2, jobs_pb2_grpc
from tests.e2e.conftest import RunningPlatform, isolated_platform, upload, wait_job

DATA = Path(__file__).resolve().parents[1] / "data"
ENCRYPTED = DATA / "pdf" / "libreoffice-writer-password.pdf"
PASSWORD = "openpassword"
"""The user password of ``libreoffice-writer-password.pdf``."""
PHOTO = DATA / "exif-orientation" / "Landscape_3.jpg"
TERMINAL = ("completed", "failed", "cancelled")


@pytest.fixture(scope="module")
def worker_platform(tmp_root: Path, database_url: str, nats_url: str) -> Iterator[RunningPlatform]:
    with isolated_platform(tmp_root, database_url, nats_url, "pdfpw") as running:
        yield running


@pytest.fixture(scope="module")
def idle_platform(tmp_root: Path, database_url: str, nats_url: str) -> Iterator[RunningPlatform]:
    """No worker; the reaper does not republish queued jobs during the module."""
    with isolated_platform(
        tmp_root,
        database_url,
        nats_url,
        "pdfpwidle",
        services="credits,storage,gateway,reaper",
        HM_REAPER_REQUEUE_STALE_SECONDS="3600",
    ) as running:
        yield running


def _pg(platform: RunningPlatform) -> psycopg.Connection[Any]:
    return psycopg.connect(platform.env["HM_DATABASE_URL"], autocommit=True)


def _op(name: str, password: Any = None, **params: Any) -> dict[str, Any]:
    if password is not None:
        params["password"] = password
    return {"name": name, "params": params}


def _process(
    client: httpx.Client, object_id: str, *operations: dict[str, Any], key: str | None = None, **body: Any
) -> httpx.Response:
    headers = {"Idempotency-Key": key} if key is not None else {}
    return client.post(
        "/v1/hypermedia/process",
        json={"object_id": object_id, "operations": list(operations), **body},
        headers=headers,
    )


def _created(response: httpx.Response) -> list[str]:
    assert response.status_code == 202, response.text
    return list(response.json()["job_ids"])


def _secret_rows(pg: psycopg.Connection[Any], job_ids: list[str]) -> dict[str, str]:
    rows = pg.execute(
        "SELECT job_id::text, password FROM job_secrets WHERE job_id = ANY(%s::uuid[])", (job_ids,)
    ).fetchall()
    return {r[0]: r[1] for r in rows}


def _rows_containing(pg: psycopg.Connection[Any], literal: str) -> dict[str, int]:
    """``{table: rows}`` of every table of the database with a row whose text contains ``literal``:
    a search of the whole database, as a grep of its dump would be."""
    tables = [
        r[0]
        for r in pg.execute(
            "SELECT table_name FROM information_schema.tables"
            " WHERE table_schema = 'public' AND table_type = 'BASE TABLE'"
        ).fetchall()
    ]
    found = {}
    for table in tables:
        count = pg.execute(
            f'SELECT count(*) FROM "{table}" t WHERE strpos(t::text, %s) > 0',  # names from the catalog
            (literal,),
        ).fetchone()
        assert count is not None
        if count[0]:
            found[table] = count[0]
    return found


def _logs_containing(platform: RunningPlatform, literal: str) -> list[str]:
    """The platform's log files (every service's, and ``hypermedia up``'s own) that contain ``literal``."""
    files = [*sorted((platform.state_dir / "logs").glob("*.log")), platform.state_dir / "up.log"]
    return [str(f) for f in files if f.exists() and literal.encode() in f.read_bytes()]


# -- the worker: required, incorrect, opened ---------------------------------------------------------


def test_without_a_password_the_job_fails_with_password_required(worker_platform: RunningPlatform) -> None:
    account = worker_platform.admin("create-account", "--credits", "100")
    with worker_platform.client(account) as client:
        obj = upload(client, ENCRYPTED)
        [job_id] = _created(_process(client, obj["object_id"], _op("pdf_info")))
        job = wait_job(client, job_id)
    assert (job["status"], job["error_code"]) == ("failed", "PASSWORD_REQUIRED"), job
    assert job["params"] == {} and job["actual_credits"] is None


def test_a_wrong_password_fails_with_password_incorrect_and_costs_nothing(
    worker_platform: RunningPlatform,
) -> None:
    account = worker_platform.admin("create-account", "--credits", "100")
    wrong = f"wrong-{secrets.token_hex(6)}"
    with worker_platform.client(account) as client:
        obj = upload(client, ENCRYPTED)
        [job_id] = _created(_process(client, obj["object_id"], _op("pdf_info", wrong)))
        job = wait_job(client, job_id)
        assert client.get("/v1/credits").json() == {"balance": 100.0, "held": 0.0, "available": 100.0}
    assert (job["status"], job["error_code"]) == ("failed", "PASSWORD_INCORRECT"), job
    assert job["error_message"] == "The password does not open the PDF."
    assert job["attempt_count"] == 1 and job["params"] == {} and job["outputs"] == []


def test_the_user_password_opens_it_for_info_and_preview(worker_platform: RunningPlatform) -> None:
    account = worker_platform.admin("create-account", "--credits", "100")
    with worker_platform.client(account) as client:
        obj = upload(client, ENCRYPTED)
        info_id, preview_id = _created(
            _process(
                client,
                obj["object_id"],
                _op("pdf_info", PASSWORD),
                _op("pdf_preview", PASSWORD, format="png", dpi=36),
            )
        )
        info_job = wait_job(client, info_id)
        preview_job = wait_job(client, preview_id)
        assert info_job["status"] == "completed", info_job
        assert info_job["params"] == {}
        [output] = info_job["outputs"]
        info = httpx.get(output["url"], timeout=30).json()
        assert info["page_count"] == 1 and info["encrypted"] is True

        assert preview_job["status"] == "completed", preview_job
        assert preview_job["params"] == {"pages": [1], "format": "png", "dpi": 36}
        [preview] = preview_job["outputs"]
        assert (preview["output_type"], preview["mime_type"]) == ("preview_p1", "image/png")
        assert httpx.get(preview["url"], timeout=30).content.startswith(b"\x89PNG")


# -- where the password is kept ----------------------------------------------------------------------


def test_the_password_is_in_no_job_json_event_row_or_log_and_its_secret_ends_with_the_job(
    worker_platform: RunningPlatform,
) -> None:
    account = worker_platform.admin("create-account", "--credits", "100")
    wrong = f"never-stored-{secrets.token_hex(8)}"
    key = f"pw-{secrets.token_hex(4)}"
    with worker_platform.client(account) as client:
        obj = upload(client, ENCRYPTED)
        job_ids = _created(
            _process(
                client,
                obj["object_id"],
                _op("pdf_info", PASSWORD),
                _op("text_extract", wrong),
                _op("pdf_preview", PASSWORD, pages="1"),
                key=key,
                webhook_url="http://127.0.0.1:9/hook",  # nothing listens: recorded, never delivered
            )
        )
        jobs = [wait_job(client, job_id) for job_id in job_ids]
        events = [client.get(f"/v1/jobs/{job_id}/events").text for job_id in job_ids]
    assert all(job["status"] in TERMINAL for job in jobs)
    assert [job["params"] for job in jobs] == [{}, {}, {"pages": [1], "format": "webp", "dpi": 96}]
    with _pg(worker_platform) as pg:
        stored = pg.execute(
            "SELECT params FROM processing_jobs WHERE job_id = ANY(%s::uuid[])", (job_ids,)
        ).fetchall()
        assert all("password" not in row[0] for row in stored)
        assert _secret_rows(pg, job_ids) == {}, "deleted when each job ended"
        assert pg.execute(
            "SELECT count(*) FROM webhook_deliveries WHERE job_id = ANY(%s::uuid[])", (job_ids,)
        ).fetchone() == (3,)
        for literal in (
            PASSWORD,
            wrong,
            hashlib.sha256(PASSWORD.encode()).hexdigest(),
            hashlib.sha256(wrong.encode()).hexdigest(),
        ):
            assert _rows_containing(pg, literal) == {}, literal
            assert _logs_containing(worker_platform, literal) == [], literal
    for text in [*(str(job) for job in jobs), *events]:
        assert PASSWORD not in text and wrong not in text


# -- idempotency -----------------------------------------------------------------------------------


def test_the_same_key_replays_with_the_same_password_and_conflicts_with_another(
    idle_platform: RunningPlatform,
) -> None:
    account = idle_platform.admin("create-account", "--credits", "100")
    key = f"pw-{secrets.token_hex(4)}"
    with idle_platform.client(account) as client, _pg(idle_platform) as pg:
        obj = upload(client, ENCRYPTED)
        first = _created(_process(client, obj["object_id"], _op("pdf_info", PASSWORD), key=key))
        again = _created(_process(client, obj["object_id"], _op("pdf_info", PASSWORD), key=key))
        assert again == first
        for other in (
            _op("pdf_info", "another-password"),
            _op("pdf_info"),
            _op("pdf_info", PASSWORD + " "),
        ):
            response = _process(client, obj["object_id"], other, key=key)
            assert (response.status_code, response.json()["error_code"]) == (409, "IDEMPOTENCY_KEY_REUSED")
            assert "password" not in response.text
        # Without a password first, a password later is another request too.
        plain_key = f"plain-{secrets.token_hex(4)}"
        _created(_process(client, obj["object_id"], _op("pdf_info"), key=plain_key))
        conflict = _process(client, obj["object_id"], _op("pdf_info", PASSWORD), key=plain_key)
        assert conflict.status_code == 409

        count = pg.execute(
            "SELECT count(*) FROM processing_jobs WHERE account_id = %s", (account["account_id"],)
        ).fetchone()
        assert count == (2,)
        assert _secret_rows(pg, first) == {first[0]: PASSWORD}, "one secret, kept while the job is queued"
        request = pg.execute(
            "SELECT request_hash FROM process_requests WHERE account_id = %s AND idempotency_key = %s",
            (account["account_id"], key),
        ).fetchone()
        assert request is not None and PASSWORD not in request[0]
        assert request[0] != hashlib.sha256(PASSWORD.encode()).hexdigest()

        # Cancelling the queued job (the gateway's path, not the worker's) deletes its secret.
        assert client.post(f"/v1/jobs/{first[0]}:cancel").json()["status"] == "cancelled"
        assert _secret_rows(pg, first) == {}


# -- refused passwords -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("password", "shown"),
    [
        (918273645, "918273645"),
        (["openpassword"], PASSWORD),
        ({"value": "openpassword"}, PASSWORD),
        (True, None),
        (None, None),
        ("", None),
        ("p" * 1024 + "q", "p" * 1024),
        ("nul\u0000inside-8f3a", "inside-8f3a"),
    ],
)
def test_a_password_that_is_not_a_non_empty_string_of_1024_characters_is_422(
    idle_platform: RunningPlatform, password: Any, shown: str | None
) -> None:
    account = idle_platform.admin("create-account", "--credits", "100")
    with idle_platform.client(account) as client, _pg(idle_platform) as pg:
        obj = upload(client, ENCRYPTED)
        body = {
            "object_id": obj["object_id"],
            "operations": [{"name": "pdf_preview", "params": {"password": password}}],
        }
        response = client.post("/v1/hypermedia/process", json=body)
        assert response.status_code == 422, response.text
        problem = response.json()
        if isinstance(password, str) and "\x00" in password:
            # A NUL is refused by the one rule for strings Postgres refuses (issue 14, ADR 0030),
            # before the params are validated, naming the field and not the value.
            assert problem["error_code"] == "INVALID_REQUEST"
            assert problem["field"] == "operations[0].params.password"
        else:
            assert problem["error_code"] == "INVALID_PARAMS"
            assert problem["detail"].startswith("password ")
        if shown is not None:
            assert shown not in response.text
        assert pg.execute(
            "SELECT count(*) FROM processing_jobs WHERE account_id = %s", (account["account_id"],)
        ).fetchone() == (0,)


def test_the_longest_password_is_accepted_and_an_image_operation_takes_none(
    idle_platform: RunningPlatform,
) -> None:
    account = idle_platform.admin("create-account", "--credits", "100")
    longest = "é" * 1024
    with idle_platform.client(account) as client, _pg(idle_platform) as pg:
        pdf = upload(client, ENCRYPTED)
        [job_id] = _created(_process(client, pdf["object_id"], _op("text_extract", longest)))
        assert _secret_rows(pg, [job_id]) == {job_id: longest}
        assert client.get(f"/v1/jobs/{job_id}").json()["params"] == {}

        photo = upload(client, PHOTO)
        refused = _process(client, photo["object_id"], _op("thumbnail", "secret-8f3a"))
        assert (refused.status_code, refused.json()["error_code"]) == (422, "INVALID_PARAMS")
        assert refused.json()["detail"] == "operation 'thumbnail' does not take a password"
        assert "secret-8f3a" not in refused.text


# -- gRPC ------------------------------------------------------------------------------------------


def _grpc_error(fn: Callable[[], Any]) -> tuple[grpc.StatusCode, str, str]:
    with pytest.raises(grpc.RpcError) as info:
        fn()
    err = info.value
    trailers = dict(err.trailing_metadata() or ())  # type: ignore[attr-defined]
    return err.code(), trailers.get("hm-error-code", ""), err.details()  # type: ignore[attr-defined]


def test_grpc_process_takes_a_password_and_keeps_it_out_of_the_job(idle_platform: RunningPlatform) -> None:
    account = idle_platform.admin("create-account", "--credits", "100")
    metadata = (("authorization", f"Bearer {account['api_key']}"),)
    key = f"grpc-pw-{secrets.token_hex(4)}"

    def operation(password: Any) -> jobs_pb2.Operation:
        op = jobs_pb2.Operation(name="pdf_preview")
        op.params.update({"dpi": 36, "password": password})
        return op

    with grpc.insecure_channel(idle_platform.grpc_addr) as chan, _pg(idle_platform) as pg:
        stub = jobs_pb2_grpc.JobServiceStub(chan)
        obj = stub.UploadObject(
            jobs_pb2.UploadObjectRequest(content=ENCRYPTED.read_bytes(), filename=ENCRYPTED.name),
            metadata=metadata,
        )

        def process(password: Any) -> jobs_pb2.ProcessResponse:
            request = jobs_pb2.ProcessRequest(
                object_id=obj.object_id, operations=[operation(password)], idempotency_key=key
            )
            return stub.Process(request, metadata=metadata)

        first = process(PASSWORD)
        assert list(process(PASSWORD).job_ids) == list(first.job_ids)
        code, error_code, _ = _grpc_error(lambda: process("another-password"))
        assert (code, error_code) == (grpc.StatusCode.FAILED_PRECONDITION, "IDEMPOTENCY_KEY_REUSED")
        code, error_code, message = _grpc_error(lambda: process(""))
        assert (code, error_code) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_PARAMS")
        assert message.startswith("password ")

        job = stub.GetJob(jobs_pb2.GetJobRequest(job_id=first.job_ids[0]), metadata=metadata).job
        assert job.status == jobs_pb2.JOB_STATUS_QUEUED
        assert "password" not in job.params and job.params["dpi"] == 36
        assert PASSWORD not in str(job)
        assert _secret_rows(pg, list(first.job_ids)) == {first.job_ids[0]: PASSWORD}
        cancelled = stub.CancelJob(jobs_pb2.CancelJobRequest(job_id=first.job_ids[0]), metadata=metadata)
        assert cancelled.job.status == jobs_pb2.JOB_STATUS_CANCELLED
        assert _secret_rows(pg, list(first.job_ids)) == {}
