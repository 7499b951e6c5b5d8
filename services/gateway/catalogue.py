"""The operations a caller may ask for, as ``GET /v1/operations`` and gRPC ``ListOperations``
answer them: each active processing profile with its params schema
(:data:`hypermedia.engines.schemas.PARAMS_SCHEMAS`), its price formula and its limits."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import asyncpg

from hypermedia.engines.schemas import PARAMS_SCHEMAS
from hypermedia.jobs import noop

PRICE_FORMULA = (
    "base_credits + per_mb_credits × ceil-to-a-millicredit(size_bytes / 1048576), held; charged: "
    "the same, or with a work_unit base_credits + per_unit_credits × units done, never more"
)
"""How a job's estimate (the hold) follows from its profile (:func:`hypermedia.jobs.pricing.price`,
seed 000's ``base_cost + per_mb × size_mb``) and what it is charged (:mod:`hypermedia.jobs.charges`)."""


@dataclass(frozen=True)
class OperationInfo:
    """One operation as a caller may ask for it: its active profile's terms."""

    name: str
    queue: str
    """Where its jobs run: ``images``, ``documents``, ``ocr`` or ``media`` (``queue: "bulk"`` in
    a request sends them to that engine's lane of the bulk queue instead)."""
    profile_version: int
    input_kinds: tuple[str, ...]
    """The kinds of original it takes: ``image``, ``pdf``, ``office``, ``video``, ``audio``, …"""
    params_schema: dict[str, Any]
    """JSON Schema (draft 2020-12) of its ``params``."""
    base_millicredits: int
    per_mb_millicredits: int
    escalation_per_page_millicredits: int
    """``ocr``: the most its escalation line adds per page (held beside the price; 0 elsewhere)."""
    work_unit: str | None
    """What a completed job is charged by beside its base (``page``, ``media_second``, ``megapixel``), within its price; None:
    charged its price (:mod:`hypermedia.jobs.charges`)."""
    per_unit_millicredits: int
    timeout_seconds: int
    max_attempts: int
    max_input_bytes: int
    max_pixels: int
    memory_limit_mb: int
    max_duration_seconds: int
    """Longest media it takes (seconds; only media operations check it)."""


class OperationCatalogue:
    """The operations use case. ``pool``: the system of record (``processing_profiles``);
    ``noop_enabled``: whether ``noop`` is offered (``HM_NOOP_OPERATION``)."""

    def __init__(self, pool: asyncpg.Pool, noop_enabled: bool) -> None:
        self._pool = pool
        self._noop_enabled = noop_enabled

    async def operations(self) -> list[OperationInfo]:
        """Every operation a request may name now, by name: the active profiles (``noop`` only
        where it is enabled), each with the params schema the gateway checks requests against.
        An active profile of an operation this gateway has no schema for is left out (a newer
        engine's profile, before this gateway is upgraded)."""
        rows = await self._pool.fetch("SELECT * FROM processing_profiles WHERE active ORDER BY operation")
        return [
            OperationInfo(
                name=r["operation"],
                queue=r["queue"],
                profile_version=r["version"],
                input_kinds=tuple(r["input_kinds"]),
                params_schema=PARAMS_SCHEMAS[r["operation"]],
                base_millicredits=r["base_cost"],
                per_mb_millicredits=r["per_mb"],
                escalation_per_page_millicredits=r["escalation_per_page"],
                work_unit=r["work_unit"],
                per_unit_millicredits=r["per_unit"],
                timeout_seconds=r["timeout_seconds"],
                max_attempts=r["max_attempts"],
                max_input_bytes=r["max_input_bytes"],
                max_pixels=r["max_pixels"],
                memory_limit_mb=r["memory_limit_mb"],
                max_duration_seconds=r["max_duration_seconds"],
            )
            for r in rows
            if r["operation"] in PARAMS_SCHEMAS and (r["operation"] != noop.OPERATION or self._noop_enabled)
        ]
