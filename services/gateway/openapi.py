"""The gateway's OpenAPI document, complete enough for a generator (issue 22 item 4): the response
shapes of the routes that render results by hand (the models below, documentation only: the
renderers in :mod:`services.gateway.rest` stay the truth, and schemathesis checks the answers
against them), the bearer scheme, ``application/problem+json`` errors on every route, and each
operation's params (:data:`hypermedia.engines.schemas.PARAMS_SCHEMAS`) in the process request.
"""

from __future__ import annotations

import copy
from typing import Any, Final

from fastapi import FastAPI
from pydantic import BaseModel, Field

from hypermedia.engines.schemas import PARAMS_SCHEMAS

PUBLIC_PATHS: Final = frozenset({"/healthz", "/readyz"})
"""Routes that take no API key."""
SIGNED_PATHS: Final = frozenset({"/v1/jobs/{job_id}/outputs/{output_type}/resolved"})
"""Routes that take an API key or a signed URL (``expires`` and ``sig``) instead."""


class Problem(BaseModel):
    """An error (RFC 9457 problem details), ``application/problem+json``."""

    type: str = Field(description="always about:blank")
    title: str = Field(description="the HTTP status's phrase")
    status: int
    detail: str = Field(description="what is wrong, for a person; never a path or a stack trace")
    error_code: str = Field(description="stable code for programs (docs/api.md, Errors)")


class AttemptOut(BaseModel):
    attempt_number: int
    worker_id: str | None
    status: str = Field(description="processing, completed, failed, lost, cancelled or preempted")
    error_code: str | None
    error_message: str | None
    started_at: str | None
    finished_at: str | None
    duration_ms: int | None
    peak_memory_mb: int | None


class OutputOut(BaseModel):
    output_type: str
    object_id: str
    key: str
    mime_type: str
    size_bytes: int
    metadata: dict[str, Any]
    url: str = Field(description="presigned GET URL, valid 15 minutes")
    link: str = Field(description="stable link: /v1/jobs/{job_id}/outputs/{output_type}")


class PresetRef(BaseModel):
    name: str
    version: int


class JobSummaryOut(BaseModel):
    job_id: str
    object_id: str
    operation: str
    profile_version: int
    queue: str
    params: dict[str, Any]
    preset: PresetRef | None
    status: str = Field(
        description="created, scheduled (delayed: waits for not_before), queued, claimed, processing, "
        "completed, retry_wait, failed, cancelled, cancel_requested"
    )
    priority: int
    attempt_count: int
    max_attempts: int
    lost_attempts: int
    error_code: str | None
    error_message: str | None
    estimated_credits: float | None
    actual_credits: float | None
    charge_lines: dict[str, float]
    created_at: str | None
    queued_at: str | None
    started_at: str | None
    completed_at: str | None
    next_attempt_at: str | None
    not_before: str | None = Field(
        description="A delayed job's due time (RFC 3339); null for a job queued at once"
    )


class JobOut(JobSummaryOut):
    attempts: list[AttemptOut]
    outputs: list[OutputOut]


class JobPageOut(BaseModel):
    jobs: list[JobSummaryOut]
    next_cursor: str | None = Field(description="the next page's cursor; null on the last page")


class LedgerEntryOut(BaseModel):
    entry_id: int
    at: str = Field(description="when (ISO 8601, UTC)")
    kind: str = Field(description="grant, hold, commit or release")
    line: str = Field(
        description="a commit's charge line: base, pages, media_seconds, megapixels, run_seconds, ocr_escalation; base otherwise"
    )
    credits: float = Field(
        description="a grant (+) and a commit (-): the change of the balance; a hold and a release: "
        "the amount held or given back (+), the balance unchanged"
    )
    job_id: str | None = Field(description="null for a grant")
    operation: str | None
    job_status: str | None = Field(description="the job's status now")
    error_code: str | None = Field(description="why the job failed, when it did")


class LedgerOut(BaseModel):
    entries: list[LedgerEntryOut]
    next_cursor: str | None = Field(description="the next page's cursor; null on the last page")


class ObjectInfoOut(BaseModel):
    object_id: str
    pool_id: str
    size_bytes: int
    mime_type: str
    sha256: str
    filename: str
    source_object_id: str | None
    created_at: str | None
    url: str
    url_expires_at: str | None


class ObjectSummaryOut(BaseModel):
    object_id: str
    size_bytes: int
    mime_type: str
    sha256: str
    filename: str = Field(description='an original\'s display name; "" when none was given, and for outputs')
    source_object_id: str | None = Field(description="for an output, the object it was derived from")
    created_at: str | None


class ObjectPageOut(BaseModel):
    objects: list[ObjectSummaryOut]
    next_cursor: str | None = Field(description="the next page's cursor; null on the last page")


class OutputLinkOut(BaseModel):
    output_type: str
    object_id: str
    mime_type: str
    size_bytes: int
    url: str
    url_expires_at: str | None


class PriceOut(BaseModel):
    base_credits: float | None
    per_mb_credits: float | None
    escalation_per_page_credits: float | None
    work_unit: str | None = Field(
        description="What a completed job is charged by beside base_credits (page, media_second, megapixel), never more "
        "than its price by size; null: charged that price"
    )
    per_unit_credits: float | None


class LimitsOut(BaseModel):
    timeout_seconds: int
    max_attempts: int
    max_input_bytes: int
    max_pixels: int
    memory_limit_mb: int
    max_duration_seconds: int


class OperationOut(BaseModel):
    name: str
    queue: str
    profile_version: int
    input_kinds: list[str]
    params_schema: dict[str, Any] = Field(description="JSON Schema (draft 2020-12) of its params")
    price: PriceOut
    limits: LimitsOut


class OperationsOut(BaseModel):
    operations: list[OperationOut]
    price_formula: str


class LanguagesOut(BaseModel):
    languages: list[str]


class ReadinessOut(BaseModel):
    status: str = Field(description="ok or unavailable")
    checks: dict[str, bool]


def _problem_responses() -> dict[str, Any]:
    content = {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}}
    return {
        "4XX": {"description": "The request is refused; error_code says why", "content": content},
        "5XX": {"description": "The platform could not answer now (503: retry)", "content": content},
    }


def _operation_schemas() -> dict[str, Any]:
    """A ``Params_<operation>`` schema per operation and ``OperationRequest``: one operation of a
    process request (a name, ``{name, params}`` with that operation's params, or ``{preset}``)."""
    schemas: dict[str, Any] = {}
    choices: list[dict[str, Any]] = [
        {
            "type": "string",
            "enum": sorted(PARAMS_SCHEMAS),
            "description": "an operation with its default params",
        }
    ]
    for name, schema in sorted(PARAMS_SCHEMAS.items()):
        params = {k: v for k, v in copy.deepcopy(schema).items() if k != "$schema"}
        schemas[f"Params_{name}"] = params
        choices.append(
            {
                "type": "object",
                "title": name,
                "additionalProperties": False,
                "required": ["name"],
                "properties": {
                    "name": {"const": name},
                    "params": {"$ref": f"#/components/schemas/Params_{name}"},
                },
            }
        )
    choices.append({"$ref": "#/components/schemas/PresetOperation"})
    schemas["OperationRequest"] = {"oneOf": choices, "description": "One operation of a process request"}
    return schemas


def enrich(doc: dict[str, Any]) -> dict[str, Any]:
    """FastAPI's document with the bearer scheme (each route's ``authorization`` header parameter
    replaced by it), problem responses on every route (FastAPI's own 422 schema replaced), and the
    operations' params; returns ``doc``, changed."""
    components = doc.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    schemas["Problem"] = Problem.model_json_schema()
    schemas.update(_operation_schemas())
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    components["securitySchemes"] = {
        "bearerAuth": {
            "type": "http",
            "scheme": "bearer",
            "description": "An API key: Authorization: Bearer hm_…",
        }
    }
    for body in ("ProcessBody", "EstimateBody"):
        listed = schemas.get(body, {}).get("properties", {}).get("operations")
        if listed is not None:
            listed["items"] = {"$ref": "#/components/schemas/OperationRequest"}
    for path, operations in doc.get("paths", {}).items():
        for operation in operations.values():
            parameters = [p for p in operation.get("parameters", []) if p["name"].lower() != "authorization"]
            if parameters:
                operation["parameters"] = parameters
            else:
                operation.pop("parameters", None)
            if path not in PUBLIC_PATHS:
                operation["security"] = [{"bearerAuth": []}] + ([{}] if path in SIGNED_PATHS else [])
            responses = operation.setdefault("responses", {})
            responses.pop("422", None)
            responses.update(_problem_responses())
    return doc


def install(app: FastAPI) -> None:
    """Serve :func:`enrich`'s document at ``/openapi.json`` (built once, on first request)."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = enrich(build())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
