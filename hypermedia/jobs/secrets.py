"""Secrets a job needs that must not be stored with it: today the ``password`` of a document
operation (an encrypted PDF's user password). ADR 0019.

A password never enters ``processing_jobs.params``, which the API returns and Postgres keeps for
ever. The gateway takes it out of the operation's params (:func:`take_password`) before the params
are validated, hashed or stored, and inserts it into ``job_secrets`` (:func:`store`) in the
transaction that inserts the job. The docworker reads it (:func:`fetch_password`) just before it
runs the job and hands it to the sandbox beside the params. A trigger (migration
``0009_job_secrets.sql``) deletes the row in the transaction that makes the job ``completed``,
``failed`` or ``cancelled``, whatever path ends it; :func:`delete` does the same on demand.

The Idempotency-Key request hash must tell two requests that differ only in their password apart
without storing the password or a plain hash of it (a weak password falls to a dictionary): it
includes :func:`password_digest`, an HMAC-SHA256 keyed by a server-side secret
(``HM_GATEWAY_SECRET_KEY`` through :func:`derive_key`), which a copy of the database alone does
not reveal.

Nothing here logs a password or puts one in an exception message.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping
from typing import Any, Final

import asyncpg

from hypermedia.core.errors import InvalidArgument
from hypermedia.infra import db

__all__ = [
    "IDEMPOTENCY_KEY_LABEL",
    "MAX_PASSWORD_LENGTH",
    "PASSWORD_PARAM",
    "delete",
    "derive_key",
    "fetch_password",
    "password_digest",
    "store",
    "take_password",
]

PASSWORD_PARAM: Final = "password"
"""The params key that carries a document password in a request."""
MAX_PASSWORD_LENGTH: Final = 1024
"""Longest password accepted (characters). PDF passwords are at most 127 bytes (revision 6) or 32
(older revisions); the bound only keeps hostile requests small."""
IDEMPOTENCY_KEY_LABEL: Final = b"hypermedia/idempotency-password/v1"
"""Label that derives the key of :func:`password_digest` from ``HM_GATEWAY_SECRET_KEY``, so the
same secret can key other uses later without the digests of one matching another's."""

Executor = asyncpg.Pool | db.Connection
"""A pool, a plain connection or one borrowed from a pool."""


def _invalid(message: str) -> InvalidArgument:
    return InvalidArgument(message, "INVALID_PARAMS")


def take_password(params: Mapping[str, Any]) -> tuple[dict[str, Any], str | None]:
    """Split a request's operation params into the params without :data:`PASSWORD_PARAM` and the
    password (None when absent). The input is not changed.

    Raises:
        InvalidArgument: ``INVALID_PARAMS`` when the password is not a string, is empty, is longer
            than :data:`MAX_PASSWORD_LENGTH` characters, contains NUL (PDFium reads a C string: the
            rest would be ignored) or is not valid Unicode (a lone surrogate). The message never
            contains the password.
    """
    rest = {key: value for key, value in params.items() if key != PASSWORD_PARAM}
    if PASSWORD_PARAM not in params:
        return rest, None
    password = params[PASSWORD_PARAM]
    if not isinstance(password, str):
        raise _invalid("password must be a string")
    if not password:
        raise _invalid("password must not be empty (a PDF with an empty user password needs none)")
    if len(password) > MAX_PASSWORD_LENGTH:
        raise _invalid(f"password may be at most {MAX_PASSWORD_LENGTH} characters")
    if "\x00" in password:
        raise _invalid("password must not contain NUL characters")
    try:
        password.encode("utf-8")
    except UnicodeEncodeError:
        raise _invalid("password must be valid Unicode text") from None
    return rest, password


def derive_key(secret: str, label: bytes = IDEMPOTENCY_KEY_LABEL) -> bytes:
    """The key for one use of a server secret: ``HMAC-SHA256(secret, label)`` (32 bytes).

    Raises:
        ValueError: ``secret`` is empty (a digest keyed by nothing would be a plain hash).
    """
    if not secret:
        raise ValueError("a secret is required to derive a key")
    return hmac.new(secret.encode("utf-8"), label, hashlib.sha256).digest()


def password_digest(key: bytes, password: str) -> str:
    """``HMAC-SHA256(key, password)`` as 64 hex digits: what the Idempotency-Key request hash
    includes instead of the password. ``key`` comes from :func:`derive_key`."""
    return hmac.new(key, password.encode("utf-8"), hashlib.sha256).hexdigest()


async def store(conn: Executor, secrets: Iterable[tuple[str, str]]) -> None:
    """Insert ``(job_id, password)`` rows into ``job_secrets``; call inside the transaction that
    inserts those jobs.

    Raises:
        asyncpg.PostgresError: e.g. a foreign-key violation for a job that does not exist, or a
            unique violation for a job that has a secret already (neither message holds the
            password).
    """
    rows = [(job_id, password) for job_id, password in secrets]
    if rows:
        await conn.executemany("INSERT INTO job_secrets (job_id, password) VALUES ($1, $2)", rows)


async def fetch_password(conn: Executor, job_id: str) -> str | None:
    """The password stored for ``job_id``, or None when it was given none (or it has ended, which
    deletes it). The docworker calls it just before running the job.

    Raises:
        asyncpg.PostgresError, OSError: when Postgres fails or is unreachable (see
            :func:`hypermedia.infra.db.is_transient`). A malformed ``job_id`` raises asyncpg's
            ``DataError`` before any query is sent.
    """
    value = await conn.fetchval("SELECT password FROM job_secrets WHERE job_id = $1", job_id)
    return None if value is None else str(value)


async def delete(conn: Executor, job_ids: Iterable[str]) -> int:
    """Delete the secrets of ``job_ids``; returns how many rows were deleted. The trigger of
    migration 0009 already does this when a job becomes terminal, so callers need it only for a
    job that ends some other way.

    Raises:
        asyncpg.PostgresError, OSError: when Postgres fails or is unreachable.
    """
    ids = [str(job_id) for job_id in job_ids]
    if not ids:
        return 0
    result = await conn.execute("DELETE FROM job_secrets WHERE job_id = ANY($1::uuid[])", ids)
    return int(result.rsplit(" ", 1)[-1])
