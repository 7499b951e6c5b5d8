"""Ids in requests: a path or body id becomes a canonical UUID, or the same 404 as an id of
another account."""

from __future__ import annotations

import uuid

from hypermedia.core.errors import NotFound


def canonical_uuid(value: object) -> str | None:
    """``value`` as a canonical lowercase UUID (``str(uuid.UUID(value))``), None when it is not one."""
    try:
        return str(uuid.UUID(str(value)))
    except (ValueError, TypeError, AttributeError):
        return None


def parse_uuid(value: str, what: str) -> str:
    """``value`` as a canonical lowercase UUID (``str(uuid.UUID(value))``).

    Raises:
        NotFound: ``NOT_FOUND`` ("{what} not found") for anything that is not a UUID, so a
            malformed id is answered like one the caller may not see.
    """
    canonical = canonical_uuid(value)
    if canonical is None:
        raise NotFound(f"{what} not found", "NOT_FOUND")
    return canonical
