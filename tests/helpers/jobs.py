"""A :class:`ClaimedJob` as a worker holds one after its claim, for tests of handlers and hooks."""

from __future__ import annotations

from typing import Any

from hypermedia.jobs.lifecycle import ClaimedJob


def claimed_job(operation: str, queue: str, **fields: Any) -> ClaimedJob:
    """A first attempt of ``operation`` on ``queue`` with the shipped profiles' usual values
    (3 attempts, 60 s backoff); ``fields`` override any of them."""
    values: dict[str, Any] = {
        "job_id": "00000000-0000-0000-0000-000000000001",
        "account_id": "00000000-0000-0000-0000-000000000002",
        "object_id": "00000000-0000-0000-0000-000000000003",
        "operation": operation,
        "profile_version": 1,
        "queue": queue,
        "params": {},
        "priority": 5,
        "attempt": 1,
        "max_attempts": 3,
        "estimated_credits": 1000,
        "timeout_seconds": 60,
        "max_input_bytes": 100 << 20,
        "max_pixels": 100_000_000,
        "memory_limit_mb": 2048,
        "backoff_base_seconds": 60,
    }
    return ClaimedJob(**(values | fields))
