"""What the storage service needs from a place that keeps bytes, and the object key layout.

Two implementations: :class:`services.storage.localstore.LocalStore` (a directory served over HTTP
with HMAC-signed URLs, the embedded default) and :class:`services.storage.s3store.S3Store`
(SigV4-presigned URLs). Workers and the gateway only ever see URLs, so their code path is the same
for both.

Key layout (``pool_id`` and ``object_id`` are UUIDs in canonical lowercase form):

- originals: ``originals/{pool_id}/{object_id}``
- derived outputs: ``derived/{pool_id}/{object_id}/{profile_version}/{output_type}``, where
  ``pool_id``/``object_id`` are those of the SOURCE object.

The client's file name is metadata (``objects.filename``), never part of a key.
"""

from __future__ import annotations

import base64
import binascii
import re
from datetime import datetime
from typing import Protocol
from uuid import UUID

MAX_KEY_LENGTH = 512
"""Longest accepted object key (characters)."""

_SEGMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.=-]{0,127}$")
OUTPUT_TYPE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
"""An output type is one lowercase key segment, e.g. ``thumbnail``, ``webp``, ``page-1.png``."""


class ObjectBackend(Protocol):
    """Where object bytes live. Every method is async; keys are already validated by the caller.

    Backends raise :class:`hypermedia.core.errors.TransientError` (``STORAGE_UNAVAILABLE``) for failures
    worth retrying later; anything else is a bug or misconfiguration and surfaces as INTERNAL.
    """

    async def presign_get(self, key: str, ttl_seconds: int, content_type: str = "") -> tuple[str, datetime]:
        """A URL that GETs ``key`` until the returned UTC ``expires_at``.

        ``content_type``, when set, is the Content-Type the download is served with.
        """
        ...

    async def presign_put(self, key: str, ttl_seconds: int, content_type: str) -> tuple[str, datetime]:
        """A URL that PUTs ``key`` until the returned UTC ``expires_at``.

        The upload must carry exactly ``Content-Type: content_type``; the signature binds it.
        """
        ...

    async def grant_outputs(
        self, prefix: str, ttl_seconds: int, max_bytes: int
    ) -> tuple[str, str, dict[str, str], datetime]:
        """One grant to upload any key ``prefix`` + one output type segment until the returned UTC
        ``expires_at``, each upload at most ``max_bytes`` and carrying its SHA-256 (base64,
        ``x-amz-checksum-sha256``), which the store verifies while it writes.

        Returns ``(method, url, fields, expires_at)`` as ``OutputGrant`` of the proto describes
        them: ``PUT`` (the key appended to ``url``, ``fields`` as the query) or ``POST`` (an S3
        POST policy form).
        """
        ...

    async def verified_sha256(self, key: str) -> str | None:
        """Lowercase hex SHA-256 the store computed or verified when it wrote ``key``, without
        reading the bytes; None when it kept none (then :meth:`sha256` reads them).

        Raises:
            FileNotFoundError: nothing is stored at ``key``.
        """
        ...

    async def stat(self, key: str) -> int | None:
        """Size of the stored object in bytes, or None when nothing is stored at ``key``."""
        ...

    async def sha256(self, key: str) -> str:
        """Lowercase hex SHA-256 of the stored bytes, computed by streaming them (meant for small
        and medium objects: the cost is one full read).

        Raises:
            FileNotFoundError: nothing is stored at ``key``.
        """
        ...

    async def delete(self, key: str) -> None:
        """Remove ``key``; removing a missing key is not an error."""
        ...


def is_valid_key(key: str) -> bool:
    """Whether ``key`` is a safe relative key: ``/``-separated segments of ``[A-Za-z0-9_.=-]``, none
    empty and none starting with a dot (so no ``.``/``..``, no absolute path, no backslash, and
    never the name of a local temporary file, which starts with a dot)."""
    if not key or len(key) > MAX_KEY_LENGTH:
        return False
    return all(_SEGMENT.match(segment) for segment in key.split("/"))


def original_key(pool_id: UUID, object_id: UUID) -> str:
    """Key of an uploaded original."""
    return f"originals/{pool_id}/{object_id}"


def output_prefix(pool_id: UUID, source_object_id: UUID) -> str:
    """Common prefix (with trailing ``/``) of every output derived from one source object."""
    return f"derived/{pool_id}/{source_object_id}/"


def output_key(pool_id: UUID, source_object_id: UUID, profile_version: int, output_type: str) -> str:
    """Deterministic key of one output: the same job attempt always writes the same key."""
    return f"{output_prefix(pool_id, source_object_id)}{profile_version}/{output_type}"


def is_output_key_of(key: str, pool_id: UUID, source_object_id: UUID) -> bool:
    """Whether ``key`` is ``derived/{pool_id}/{source_object_id}/{profile_version}/{output_type}``."""
    prefix = output_prefix(pool_id, source_object_id)
    if not key.startswith(prefix):
        return False
    rest = key[len(prefix) :].split("/")
    return (
        len(rest) == 2
        and rest[0].isascii()
        and rest[0].isdigit()
        and int(rest[0]) >= 1
        and OUTPUT_TYPE.match(rest[1]) is not None
    )


def checksum_hex(value: str) -> str | None:
    """The lowercase hex form of an ``x-amz-checksum-sha256`` value (base64 of 32 bytes, as S3
    takes and answers it), or None when it is not one."""
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return None
    return raw.hex() if len(raw) == 32 else None
