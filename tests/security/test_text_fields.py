"""Strings Postgres refuses (issue 14, item 3): a NUL (U+0000), a lone surrogate (U+D800–U+DFFF)
or a string above its field's bound, in any field of a process request, over REST and over gRPC,
is a 422 ``INVALID_REQUEST`` / ``INVALID_ARGUMENT`` naming the field, and nothing is created (no
job row, no idempotency row, no credits held). The internal services (credits, storage) refuse a
NUL the same way (their gRPC interceptor). Every request goes to a real platform."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import psycopg
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from hypermedia.api.credits.v1 import credits_pb2, credits_pb2_grpc
from hypermedia.api.jobs.v1 import jobs_pb2, jobs_pb2_grpc
from hypermedia.api.storage.v1 import storage_pb2, storage_pb2_grpc
from hypermedia.core import pgtext
from hypermedia.core.errors import ERROR_CODE_METADATA_KEY
from tests.e2e.conftest import RunningPlatform, isolated_platform

JPEG = (Path(__file__).resolve().parents[1] / "data" / "exif-orientation" / "Landscape_1.jpg").read_bytes()
LONG_NAME = "t" * (pgtext.MAX_OPERATION_NAME_LENGTH + 1)
BIG_PARAMS = {"format": "webp", "note": "n" * pgtext.MAX_PARAMS_BYTES}


@pytest.fixture(scope="module")
def text_platform(tmp_root: Path, database_url: str, nats_url: str) -> Iterator[RunningPlatform]:
    """Gateway, credits and storage only: nothing here should ever reach a worker."""
    with isolated_platform(
        tmp_root, database_url, nats_url, "text", services="credits,storage,gateway"
    ) as running:
        yield running


@pytest.fixture
def account(text_platform: RunningPlatform) -> dict[str, Any]:
    return text_platform.admin("create-account", "--credits", "100")


def _object_id(platform: RunningPlatform, account: dict[str, Any]) -> str:
    with platform.client(account) as client:
        response = client.post("/v1/objects", files={"file": ("a.jpg", JPEG)})
        assert response.status_code == 201, response.text
        return str(response.json()["object_id"])


def _nothing_created(platform: RunningPlatform, account: dict[str, Any]) -> None:
    with psycopg.connect(platform.info["database_url"]) as conn:
        [(jobs, requests)] = conn.execute(
            "SELECT (SELECT count(*) FROM processing_jobs WHERE account_id = %(a)s),"
            " (SELECT count(*) FROM process_requests WHERE account_id = %(a)s)",
            {"a": account["account_id"]},
        ).fetchall()
    assert (jobs, requests) == (0, 0)
    with platform.client(account) as client:
        assert client.get("/v1/credits").json()["held"] == 0


# (what is sent as raw JSON with OBJ for the object id, the extra headers, the field named)
REST_CASES = [
    ('{"object_id": "OBJ", "operations": ["thumb\\u0000nail"]}', {}, "operations[0]"),
    ('{"object_id": "OBJ", "operations": [{"name": "thumb\\u0000nail"}]}', {}, "operations[0].name"),
    ('{"object_id": "OBJ", "operations": [{"name": "\\ud800"}]}', {}, "operations[0].name"),
    (json.dumps({"object_id": "OBJ", "operations": [LONG_NAME]}), {}, "operations[0].name"),
    (
        '{"object_id": "OBJ", "operations": ["thumbnail", {"name": "convert", "params": {"format": "web\\u0000p"}}]}',
        {},
        "operations[1].params.format",
    ),
    (
        '{"object_id": "OBJ", "operations": [{"name": "convert", "params": {"for\\u0000mat": "webp"}}]}',
        {},
        "operations[0].params",
    ),
    (
        '{"object_id": "OBJ", "operations": [{"name": "ocr", "params": {"languages": ["eng", "\\udfff"]}}]}',
        {},
        "operations[0].params.languages[1]",
    ),
    (
        json.dumps({"object_id": "OBJ", "operations": [{"name": "convert", "params": BIG_PARAMS}]}),
        {},
        "operations[0].params",
    ),
    (
        '{"object_id": "OBJ", "operations": ["thumbnail"], "webhook_url": "https://example.com/\\u0000"}',
        {},
        "webhook_url",
    ),
    ('{"object_id": "OBJ\\u0000", "operations": ["thumbnail"]}', {}, "object_id"),
    ('{"object_id": "OBJ", "operations": ["thumbnail"]}', {"Idempotency-Key": "k" * 201}, "idempotency_key"),
]


@pytest.mark.parametrize(
    ("body", "headers", "field"), REST_CASES, ids=[f"{i}-{c[2]}" for i, c in enumerate(REST_CASES)]
)
def test_rest_refuses_strings_postgres_refuses_naming_the_field(
    text_platform: RunningPlatform, account: dict[str, Any], body: str, headers: dict[str, str], field: str
) -> None:
    content = body.replace("OBJ", _object_id(text_platform, account)).encode()
    with text_platform.client(account) as client:
        response = client.post(
            "/v1/hypermedia/process",
            content=content,
            headers={"Content-Type": "application/json", **headers},
        )
    assert response.status_code == 422, response.text
    problem = response.json()
    assert (problem["error_code"], problem["field"]) == ("INVALID_REQUEST", field)
    assert problem["detail"].startswith(field + " ")
    _nothing_created(text_platform, account)


def _op(name: str, params: dict[str, Any] | None = None) -> jobs_pb2.Operation:
    op = jobs_pb2.Operation(name=name)
    if params:
        op.params.update(params)
    return op


# (the ProcessRequest's fields besides object_id, the field named)
GRPC_CASES: list[tuple[dict[str, Any], str]] = [
    ({"operations": [_op("thumb\x00nail")]}, "operations[0].name"),
    ({"operations": [_op(LONG_NAME)]}, "operations[0].name"),
    (
        {"operations": [_op("thumbnail"), _op("convert", {"format": "web\x00p"})]},
        "operations[1].params.format",
    ),
    ({"operations": [_op("convert", {"for\x00mat": "webp"})]}, "operations[0].params"),
    ({"operations": [_op("ocr", {"languages": ["eng", "de\x00u"]})]}, "operations[0].params.languages[1]"),
    ({"operations": [_op("convert", BIG_PARAMS)]}, "operations[0].params"),
    ({"operations": [_op("thumbnail")], "idempotency_key": "key\x00"}, "idempotency_key"),
    ({"operations": [_op("thumbnail")], "idempotency_key": "k" * 201}, "idempotency_key"),
    ({"operations": [_op("thumbnail")], "idempotency_key": "k" * 5000}, "idempotency_key"),
    ({"operations": [_op("thumbnail")], "webhook_url": "https://example.com/\x00"}, "webhook_url"),
    ({"operations": [_op("thumbnail")], "object_id": "\x00"}, "object_id"),
    # A Struct's numbers are doubles: NaN and ±Infinity cross the wire, JSON has neither
    # (json_format raised ValueError: INTERNAL, hostile review).
    ({"operations": [_op("thumbnail", {"size": float("inf")})]}, "operations[0].params.size"),
    ({"operations": [_op("thumbnail", {"zzz": float("nan")})]}, "operations[0].params.zzz"),
    ({"operations": [_op("pdf_preview", {"pages": [1, float("-inf")]})]}, "operations[0].params.pages[1]"),
]


def _grpc_error(call: Any) -> tuple[grpc.StatusCode, str, str]:
    """(status, ``hm-error-code``, message) of an awaited call expected to fail."""

    async def run() -> tuple[grpc.StatusCode, str, str]:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call()
        err = info.value
        code = dict(err.trailing_metadata() or ()).get(ERROR_CODE_METADATA_KEY, "")
        return err.code(), str(code), err.details() or ""

    return asyncio.run(run())


@pytest.mark.parametrize(
    ("fields", "field"), GRPC_CASES, ids=[f"{i}-{c[1]}" for i, c in enumerate(GRPC_CASES)]
)
def test_grpc_refuses_strings_postgres_refuses_naming_the_field(
    text_platform: RunningPlatform, account: dict[str, Any], fields: dict[str, Any], field: str
) -> None:
    request = jobs_pb2.ProcessRequest(object_id=_object_id(text_platform, account))
    for name, value in fields.items():
        if name == "operations":
            request.operations.extend(value)
        else:
            setattr(request, name, value)
    metadata = (("authorization", f"Bearer {account['api_key']}"),)

    async def call() -> Any:
        async with grpc.aio.insecure_channel(text_platform.grpc_addr) as chan:
            return await jobs_pb2_grpc.JobServiceStub(chan).Process(request, metadata=metadata)

    code, error_code, message = _grpc_error(call)
    assert (code, error_code) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_REQUEST"), message
    assert message.startswith(field + " "), message
    _nothing_created(text_platform, account)


def test_the_bounds_themselves_are_accepted(text_platform: RunningPlatform, account: dict[str, Any]) -> None:
    """The control: a key of exactly 200 characters and non-ASCII text (no NUL, no surrogate)
    create the job, over REST and gRPC, and a replay of the REST key answers the same jobs."""
    object_id = _object_id(text_platform, account)
    key = "é" * pgtext.MAX_IDEMPOTENCY_KEY_LENGTH
    body = {"object_id": object_id, "operations": [{"name": "thumbnail", "params": {"size": 64}}]}
    with text_platform.client(account) as client:
        first = client.post("/v1/hypermedia/process", json=body, headers={"Idempotency-Key": "k" * 200})
        again = client.post("/v1/hypermedia/process", json=body, headers={"Idempotency-Key": "k" * 200})
    assert first.status_code == 202, first.text
    assert again.json()["job_ids"] == first.json()["job_ids"]

    async def call() -> jobs_pb2.ProcessResponse:
        async with grpc.aio.insecure_channel(text_platform.grpc_addr) as chan:
            return await jobs_pb2_grpc.JobServiceStub(chan).Process(
                jobs_pb2.ProcessRequest(
                    object_id=object_id, operations=[_op("thumbnail")], idempotency_key=key
                ),
                metadata=(("authorization", f"Bearer {account['api_key']}"),),
            )

    assert len(asyncio.run(call()).job_ids) == 1
    with psycopg.connect(text_platform.info["database_url"]) as conn:
        keys = {
            r[0]
            for r in conn.execute(
                "SELECT idempotency_key FROM process_requests WHERE account_id = %s", (account["account_id"],)
            )
        }
    assert keys == {"k" * 200, key}


def test_a_nul_in_an_upload_file_name_is_cleaned_over_grpc_as_over_rest(
    text_platform: RunningPlatform, account: dict[str, Any]
) -> None:
    """The one string a NUL may reach the handler in: a file name is a display name, cleaned of
    control characters rather than stored as sent (tests/security/test_validation.py, REST)."""

    async def call() -> jobs_pb2.UploadObjectResponse:
        async with grpc.aio.insecure_channel(text_platform.grpc_addr) as chan:
            return await jobs_pb2_grpc.JobServiceStub(chan).UploadObject(
                jobs_pb2.UploadObjectRequest(content=JPEG, filename="evil\x00.jpg"),
                metadata=(("authorization", f"Bearer {account['api_key']}"),),
            )

    assert asyncio.run(call()).filename == "evil.jpg"


def test_the_internal_services_refuse_a_nul_too(
    text_platform: RunningPlatform, account: dict[str, Any]
) -> None:
    """Credits and storage answer INVALID_ARGUMENT naming the field (the shared interceptor), not
    INTERNAL from Postgres; a grant id above its bound (a unique index) likewise."""
    info = text_platform.info

    async def estimate() -> Any:
        async with text_platform.internal_aio_channel(info["credits_addr"], "gateway") as chan:
            return await credits_pb2_grpc.CreditsServiceStub(chan).Estimate(
                credits_pb2.EstimateRequest(operations=["thumbnail", "x\x00"], size_bytes=10)
            )

    async def grant() -> Any:
        async with text_platform.internal_aio_channel(info["credits_addr"], "admin") as chan:
            return await credits_pb2_grpc.CreditsServiceStub(chan).Grant(
                credits_pb2.GrantRequest(
                    account_id=account["account_id"], millicredits=1, grant_id="g" * 5000
                )
            )

    async def create_upload() -> Any:
        async with text_platform.internal_aio_channel(info["storage_addr"], "gateway") as chan:
            return await storage_pb2_grpc.StorageServiceStub(chan).CreateUpload(
                storage_pb2.CreateUploadRequest(
                    account_id=account["account_id"],
                    pool_id=account["pool_id"],
                    size_bytes=3,
                    mime_type="image/png",
                    sha256="0" * 64,
                    filename="a\x00.png",
                )
            )

    for call, field in ((estimate, "operations[1]"), (grant, "grant_id"), (create_upload, "filename")):
        code, error_code, message = _grpc_error(call)
        assert (code, error_code) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_REQUEST"), message
        assert message.startswith(field + " "), message
    with text_platform.client(account) as client:
        assert client.get("/v1/credits").json()["balance"] == 100
    with psycopg.connect(info["database_url"]) as conn:
        [(rows,)] = conn.execute(
            "SELECT count(*) FROM objects WHERE pool_id = %s", (account["pool_id"],)
        ).fetchall()
    assert rows == 0


def test_rest_answers_stay_json_after_a_refusal(
    text_platform: RunningPlatform, account: dict[str, Any]
) -> None:
    """An unknown member whose name is a lone surrogate would appear in pydantic's error location
    and break the 422's own JSON (a 500): the body check runs first."""
    object_id = _object_id(text_platform, account)
    with text_platform.client(account) as client:
        response = client.post(
            "/v1/hypermedia/process",
            content=b'{"object_id": "OBJ", "operations": ["thumbnail"], "\\ud83d": 1}'.replace(
                b"OBJ", object_id.encode()
            ),
            headers={"Content-Type": "application/json"},
        )
        assert (response.status_code, response.json()["field"]) == (422, "the body"), response.text


def test_a_grpc_string_that_is_not_utf8_is_invalid_argument(
    text_platform: RunningPlatform, account: dict[str, Any]
) -> None:
    """A client that writes the wire format itself can send a string field that is not UTF-8
    (here a surrogate encoded as UTF-8 would encode it, which proto3 refuses to parse)."""
    raw = b"\x0a\x03\xed\xa0\x80"  # ProcessRequest.object_id = ED A0 80

    async def call() -> Any:
        async with grpc.aio.insecure_channel(text_platform.grpc_addr) as chan:
            method = chan.unary_unary("/hypermedia.jobs.v1.JobService/Process")
            return await method(raw, metadata=(("authorization", f"Bearer {account['api_key']}"),))

    code, error_code, message = _grpc_error(call)
    assert (code, error_code) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_REQUEST"), message
    _nothing_created(text_platform, account)


def _nested_lists(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize(
    ("depth", "field"),
    [
        (pgtext.MAX_JSON_DEPTH, "operations[0].params.x" + "[0]" * (pgtext.MAX_JSON_DEPTH - 4)),
        (1_000, "the body"),  # past Python's parser: FastAPI's 400 "error parsing the body" before
        (30_000, "the body"),  # 60 KB, under the 64 KiB a JSON body may have
    ],
)
def test_rest_refuses_a_body_nested_too_deep_naming_the_limit(
    text_platform: RunningPlatform, account: dict[str, Any], depth: int, field: str
) -> None:
    object_id = _object_id(text_platform, account)
    body = (
        f'{{"object_id": "{object_id}", "operations": [{{"name": "convert", "params": '
        f'{{"format": "webp", "x": {_nested_lists(depth)}}}}}]}}'
    )
    with text_platform.client(account) as client:
        response = client.post(
            "/v1/hypermedia/process", content=body.encode(), headers={"Content-Type": "application/json"}
        )
        problem = response.json()
        assert (response.status_code, problem["error_code"], problem["field"]) == (
            422,
            "INVALID_REQUEST",
            field,
        )
        assert (
            problem["detail"]
            == f"{field} nests arrays and objects deeper than {pgtext.MAX_JSON_DEPTH} levels"
        )
        # One level less passes the body check and reaches the params' own: "x" is no param.
        shallow = body.replace(_nested_lists(depth), _nested_lists(pgtext.MAX_JSON_DEPTH - 4))
        response = client.post(
            "/v1/hypermedia/process", content=shallow.encode(), headers={"Content-Type": "application/json"}
        )
        assert (response.status_code, response.json()["error_code"]) == (422, "INVALID_PARAMS"), response.text
    _nothing_created(text_platform, account)


def _length_delimited(field: int, data: bytes) -> bytes:
    """One length-delimited protobuf field (wire type 2), the length as a varint."""
    size, length = len(data), b""
    while size >= 0x80:
        length += bytes([size & 0x7F | 0x80])
        size >>= 7
    return bytes([field << 3 | 2]) + length + bytes([size]) + data


def test_a_grpc_struct_nested_past_protobufs_limit_is_invalid_argument_saying_so(
    text_platform: RunningPlatform, account: dict[str, Any]
) -> None:
    """A Struct param nested 200 lists deep, written on the wire by hand (the Python client itself
    refuses to build it): upb stops at 100 levels, and the answer says that rather than guessing
    at UTF-8."""
    value = _length_delimited(3, b"x")  # Value.string_value
    for _ in range(200):
        value = _length_delimited(6, _length_delimited(1, value))  # Value.list_value.values[0]
    params = _length_delimited(1, _length_delimited(1, b"x") + _length_delimited(2, value))  # Struct.fields
    operation = _length_delimited(1, b"convert") + _length_delimited(2, params)
    raw = _length_delimited(1, _object_id(text_platform, account).encode()) + _length_delimited(2, operation)

    async def call() -> Any:
        async with grpc.aio.insecure_channel(text_platform.grpc_addr) as chan:
            method = chan.unary_unary("/hypermedia.jobs.v1.JobService/Process")
            return await method(raw, metadata=(("authorization", f"Bearer {account['api_key']}"),))

    code, error_code, message = _grpc_error(call)
    assert (code, error_code) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_REQUEST"), message
    assert message == (
        "the request is not a valid message of this method"
        " (it nests messages deeper than protobuf's limit of 100 levels)"
    )
    _nothing_created(text_platform, account)


def test_a_watch_request_that_does_not_parse_or_holds_a_nul_is_invalid_argument(
    text_platform: RunningPlatform, account: dict[str, Any]
) -> None:
    """The server stream (WatchJob) is checked like the unary calls; health's Watch still works."""
    metadata = (("authorization", f"Bearer {account['api_key']}"),)

    async def raw() -> Any:
        async with grpc.aio.insecure_channel(text_platform.grpc_addr) as chan:
            method = chan.unary_stream("/hypermedia.jobs.v1.JobService/WatchJob")
            return [item async for item in method(b"\x0a\x03\xed\xa0\x80", metadata=metadata)]

    async def nul() -> Any:
        async with grpc.aio.insecure_channel(text_platform.grpc_addr) as chan:
            stub = jobs_pb2_grpc.JobServiceStub(chan)
            return [
                item
                async for item in stub.WatchJob(jobs_pb2.WatchJobRequest(job_id="\x00"), metadata=metadata)
            ]

    for call, start in ((raw, "the request is not a valid message"), (nul, "job_id holds a NUL")):
        code, error_code, message = _grpc_error(call)
        assert (code, error_code) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_REQUEST"), message
        assert message.startswith(start), message

    async def health() -> int:
        async with grpc.aio.insecure_channel(text_platform.grpc_addr) as chan:
            async for answer in health_pb2_grpc.HealthStub(chan).Watch(
                health_pb2.HealthCheckRequest(service="")
            ):
                return int(answer.status)
        return -1

    assert asyncio.run(health()) == 1  # SERVING
