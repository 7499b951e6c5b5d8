"""``GET /v1/operations`` and gRPC ``ListOperations`` (issue 22 item 3) on the real platform: every
operation a request may name with its queue, input kinds, params schema, price terms and limits;
the schema is a valid JSON Schema that judges params as the gateway does, and the price terms with
the formula give exactly the estimate a real job is held for."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import grpc
import httpx
from google.protobuf import json_format
from jsonschema import Draft202012Validator

from hypermedia.api.jobs.v1 import jobs_pb2, jobs_pb2_grpc
from tests.e2e.conftest import RunningPlatform, upload

PHOTO = Path(__file__).resolve().parents[1] / "data" / "exif-orientation" / "Landscape_3.jpg"
ENGINES = {
    "images": {"thumbnail", "resize", "compress", "convert"},
    "documents": {"pdf_info", "pdf_preview", "text_extract", "office_to_pdf"},
    "ocr": {"ocr"},
    "media": {"probe", "waveform", "poster", "transcode_video", "transcode_audio"},
}


def test_every_operation_with_its_schema_price_and_limits(
    platform: RunningPlatform, client: httpx.Client, account: dict[str, Any]
) -> None:
    answer = client.get("/v1/operations")
    assert answer.status_code == 200, answer.text
    body = answer.json()
    operations = {o["name"]: o for o in body["operations"]}
    assert {o["name"]: o["queue"] for o in body["operations"]} == {
        name: queue for queue, names in ENGINES.items() for name in names
    }  # noop is not enabled on this platform, so not offered
    for op in operations.values():
        Draft202012Validator.check_schema(op["params_schema"])
        assert op["params_schema"]["type"] == "object", op["name"]
        assert op["limits"]["timeout_seconds"] > 0 and op["limits"]["max_input_bytes"] > 0
        assert op["input_kinds"], op["name"]
    thumbnail = operations["thumbnail"]
    assert thumbnail["input_kinds"] == ["image"]
    assert thumbnail["price"] == {
        "base_credits": 1.0,
        "per_mb_credits": 0.2,
        "escalation_per_page_credits": 0.0,
        "work_unit": "megapixel",
        "per_unit_credits": 0.05,
    }
    assert operations["ocr"]["price"]["escalation_per_page_credits"] == 0.3
    # Charged by the page or the megapixel, within the price by size (ADR 0068).
    assert {
        name: (operations[name]["price"]["work_unit"], operations[name]["price"]["per_unit_credits"])
        for name in ("pdf_preview", "ocr", "compress", "probe")
    } == {
        "pdf_preview": ("page", 0.05),
        "ocr": ("page", 0.2),
        "compress": ("megapixel", 0.075),
        "probe": (None, 0.0),
    }
    assert "size_bytes / 1048576" in body["price_formula"]

    # The schema judges params as the gateway does, on both sides of a bound.
    schema = Draft202012Validator(thumbnail["params_schema"])
    obj = upload(client, PHOTO)
    for params, accepted in (({"size": 4096}, True), ({"size": 4097}, False), ({"colour": "red"}, False)):
        assert schema.is_valid(params) is accepted, params
        created = client.post(
            "/v1/hypermedia/process",
            json={"object_id": obj["object_id"], "operations": [{"name": "thumbnail", "params": params}]},
        )
        assert (created.status_code == 202) is accepted, created.text
        if accepted:
            # The price terms give the estimate the job was held for (base + per MiB, rounded up).
            price = thumbnail["price"]
            millicredits = round(price["base_credits"] * 1000) + math.ceil(
                round(price["per_mb_credits"] * 1000) * obj["size_bytes"] / 1048576
            )
            assert created.json()["estimated_credits"] == millicredits / 1000
        else:
            assert created.json()["error_code"] == "INVALID_PARAMS"

    metadata = (("authorization", f"Bearer {account['api_key']}"),)
    with grpc.insecure_channel(platform.grpc_addr) as channel:
        listed = jobs_pb2_grpc.JobServiceStub(channel).ListOperations(
            jobs_pb2.ListOperationsRequest(), metadata=metadata
        )
    by_name = {o.name: o for o in listed.operations}
    assert set(by_name) == set(operations)
    grpc_thumbnail = by_name["thumbnail"]
    assert (grpc_thumbnail.queue, grpc_thumbnail.base_credits, grpc_thumbnail.per_mb_credits) == (
        "images",
        "1.000",
        "0.200",
    )
    assert (
        json_format.MessageToDict(grpc_thumbnail.params_schema)["properties"].keys()
        == thumbnail["params_schema"]["properties"].keys()
    )
    assert listed.price_formula == body["price_formula"]
    assert (by_name["ocr"].work_unit, by_name["ocr"].per_unit_credits) == ("page", "0.200")
    assert (grpc_thumbnail.work_unit, grpc_thumbnail.per_unit_credits) == ("megapixel", "0.050")
    assert (by_name["probe"].work_unit, by_name["probe"].per_unit_credits) == ("", "0.000")


def test_operations_need_an_api_key(platform: RunningPlatform) -> None:
    refused = httpx.get(f"{platform.rest_url}/v1/operations", timeout=10)
    assert (refused.status_code, refused.json()["error_code"]) == (401, "UNAUTHENTICATED")
