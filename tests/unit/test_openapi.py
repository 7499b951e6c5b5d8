"""The gateway's OpenAPI document (issue 22 item 4) is one a generator can use: valid OpenAPI 3.1
(openapi-spec-validator), every route with its response schema, the bearer scheme instead of an
Authorization parameter, problem+json errors everywhere, and each operation's params schema in
the process request. (tests/e2e/test_openapi_fuzz.py checks the running API against it.)"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from openapi_spec_validator import validate

from hypermedia.engines.schemas import PARAMS_SCHEMAS
from services.gateway.rest import build_app


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    use_cases = SimpleNamespace(operators=None, presets=None, backfills=None, schedules=None)
    app = build_app(use_cases, None, None, None)  # type: ignore[arg-type]
    return dict(app.openapi())


def test_the_document_is_valid_openapi_3_1(doc: dict[str, Any]) -> None:
    assert doc["openapi"].startswith("3.1")
    validate(doc)


def test_every_route_has_a_success_schema_problem_errors_and_the_bearer_scheme(doc: dict[str, Any]) -> None:
    assert doc["components"]["securitySchemes"]["bearerAuth"] == {
        "type": "http",
        "scheme": "bearer",
        "description": "An API key: Authorization: Bearer hm_…",
    }
    routes = [(path, method, op) for path, ops in doc["paths"].items() for method, op in ops.items()]
    assert len(routes) >= 30
    for path, method, op in routes:
        where = f"{method.upper()} {path}"
        assert not [p for p in op.get("parameters", []) if p["name"].lower() == "authorization"], where
        if path in ("/healthz", "/readyz"):
            assert "security" not in op, where
        else:
            assert {"bearerAuth": []} in op["security"], where
        success = [code for code in op["responses"] if code[0] in "23"]
        assert success, where
        for code in success:
            content = op["responses"][code].get("content")
            assert code in ("204", "307") or content, f"{where} {code} has no content"
            for media in (content or {}).values():
                assert media.get("schema") not in (None, {}), f"{where} {code}"
        for family in ("4XX", "5XX"):
            problem = op["responses"][family]["content"]["application/problem+json"]["schema"]
            assert problem == {"$ref": "#/components/schemas/Problem"}, where
        assert "422" not in op["responses"], where


def test_the_process_request_types_each_operations_params(doc: dict[str, Any]) -> None:
    schemas = doc["components"]["schemas"]
    items = schemas["ProcessBody"]["properties"]["operations"]["items"]
    assert items == {"$ref": "#/components/schemas/OperationRequest"}
    choices = schemas["OperationRequest"]["oneOf"]
    named = {c["properties"]["name"]["const"]: c for c in choices if c.get("type") == "object"}
    assert set(named) == set(PARAMS_SCHEMAS)
    assert set(choices[0]["enum"]) == set(PARAMS_SCHEMAS)
    # Each params schema as served judges params as the platform's own schema does.
    resolver_doc = {**schemas["Params_resize"], "$defs": {}}
    resize = Draft202012Validator(resolver_doc)
    assert resize.is_valid({"width": 800}) and not resize.is_valid({"fit": "cover", "width": 800})
    assert schemas["Params_thumbnail"]["properties"]["size"]["maximum"] == 4096


def test_the_bounds_the_api_checks_are_in_the_document(doc: dict[str, Any]) -> None:
    """What the API refuses with a specific code is stated where a generator reads it, so that
    one does not build requests the API then refuses (schemathesis' positive data)."""

    def parameter(path: str, method: str, name: str) -> dict[str, Any]:
        [found] = [p for p in doc["paths"][path][method]["parameters"] if p["name"] == name]
        return dict(found["schema"])

    schemas = doc["components"]["schemas"]
    for method in ("put", "get", "delete"):
        assert parameter("/v1/presets/{name}", method, "name")["pattern"] == "^[a-z][a-z0-9_-]{0,63}$"
    assert parameter("/v1/schedules/{name}", "get", "name")["pattern"] == "^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
    assert schemas["ScheduleIn"]["properties"]["name"]["pattern"] == "^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
    for body in ("ProcessBody", "EstimateBody"):
        assert schemas[body]["properties"]["operations"]["minItems"] == 1
        priority = schemas[body]["properties"]["priority"]
        assert (priority["minimum"], priority["maximum"]) == (1, 10)
    assert parameter("/v1/objects", "get", "kind")["enum"] == ["", "original", "output"]
    state = parameter("/v1/backfills/{run_id}/items", "get", "state")
    assert state["enum"] == ["", "pending", "enqueued", "existing", "skipped"]
    created = parameter("/v1/jobs", "get", "created_before")
    assert [c.get("format") for c in created["anyOf"] if c.get("type") == "string"] == ["date-time"]
