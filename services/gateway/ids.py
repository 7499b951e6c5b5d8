"""Ids in requests: a path or body id becomes a canonical UUID, or the same 404 as an id of
another account."""

from __future__ import annotations

import uuid

from hypermedia.core.errors import NotFound


def parse_uuid(value: str, what: str) -> str:
    """``value`` as a canonical lowercase UUID (``str(uuid.UUID(value))``).

    Raises:
        NotFound: ``NOT_FOUND`` ("{what} not found") for anything that is not a UUID, so a
            malformed id is answered like one the caller may not see.
    """
    try:
        return str(uuid.UUID(str(value)))
    except (ValueError, TypeError, AttributeError):
        raise NotFound(f"{what} not found", "NOT_FOUND") from None
