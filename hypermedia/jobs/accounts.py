"""Accounts and API keys (the gateway authenticates with it; `hypermedia admin` creates accounts). API keys: ``hm_<key_id>_<secret>``. Only SHA-256 of the secret is stored (the secret has 256 bits
of entropy, so a fast hash is enough; a slow KDF protects low-entropy passwords, not random keys).
The key is shown once, at creation."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import uuid
from dataclasses import dataclass

import asyncpg

from hypermedia.core.errors import NotFound, PermissionDenied, Unauthenticated
from hypermedia.infra import db
from hypermedia.jobs.webhooks import new_webhook_secret


@dataclass(frozen=True)
class Caller:
    """The authenticated account behind a request, its default pool, and whether it is an
    admin account (the operators' API: ``accounts.is_admin``)."""

    account_id: str
    pool_id: str
    is_admin: bool = False
    read_only: bool = False
    """The key reads and changes nothing (:func:`check_write`): an observer's, a dashboard's on
    a wall screen (``hypermedia admin create-key --read-only``)."""


def new_key() -> tuple[str, str, bytes]:
    """A fresh key: (full key to hand out, key_id, secret hash to store)."""
    key_id = secrets.token_hex(6)
    secret = secrets.token_urlsafe(32)
    return f"hm_{key_id}_{secret}", key_id, hashlib.sha256(secret.encode()).digest()


def parse_bearer(header: str | None) -> tuple[str, str]:
    """(key_id, secret) from an ``Authorization: Bearer hm_…`` value. Raises Unauthenticated."""
    scheme, _, token = (header or "").strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:  # the scheme is case-insensitive (RFC 9110)
        raise Unauthenticated("missing bearer API key", "UNAUTHENTICATED")
    parts = token.split("_", 2)
    if len(parts) != 3 or parts[0] != "hm" or not parts[1] or not parts[2]:
        raise Unauthenticated("malformed API key", "UNAUTHENTICATED")
    return parts[1], parts[2]


async def authenticate(pool: asyncpg.Pool, header: str | None) -> Caller:
    """The caller of a request. Raises Unauthenticated for a missing, unknown or revoked key."""
    key_id, secret = parse_bearer(header)
    row = await pool.fetchrow(
        """
        SELECT k.account_id, k.secret_hash, k.read_only,
               (SELECT is_admin FROM accounts a WHERE a.account_id = k.account_id) AS is_admin,
               (SELECT pool_id FROM pools p WHERE p.account_id = k.account_id ORDER BY created_at LIMIT 1) AS pool_id
        FROM api_keys k WHERE k.key_id = $1 AND k.revoked_at IS NULL
        """,
        key_id,
    )
    digest = hashlib.sha256(secret.encode()).digest()
    if row is None or not hmac.compare_digest(bytes(row["secret_hash"]), digest) or row["pool_id"] is None:
        raise Unauthenticated("unknown API key", "UNAUTHENTICATED")
    return Caller(
        account_id=str(row["account_id"]),
        pool_id=str(row["pool_id"]),
        is_admin=bool(row["is_admin"]),
        read_only=bool(row["read_only"]),
    )


def check_write(caller: Caller) -> None:
    """Raises PermissionDenied (``READ_ONLY_KEY``) when ``caller``'s key is read-only: every
    request that creates, changes or deletes anything calls this first."""
    if caller.read_only:
        raise PermissionDenied(
            "this API key is read-only: it may read the account, not change it", "READ_ONLY_KEY"
        )


async def create_key(conn: db.Connection, account_id: str, *, read_only: bool = False) -> tuple[str, str]:
    """Another API key of the account (``read_only``: see :attr:`Caller.read_only`). Returns
    (api_key, key_id). Raises NotFound for an unknown account."""
    try:
        account_id = str(uuid.UUID(account_id))
    except ValueError:
        raise NotFound("account not found", "NOT_FOUND") from None
    key, key_id, digest = new_key()
    made = await conn.fetchval(
        "INSERT INTO api_keys (key_id, account_id, secret_hash, read_only) "
        "SELECT $1, account_id, $3, $4 FROM accounts WHERE account_id = $2::uuid RETURNING key_id",
        key_id,
        account_id,
        digest,
        read_only,
    )
    if made is None:
        raise NotFound("account not found", "NOT_FOUND")
    return key, key_id


async def revoke_key(conn: db.Connection, key_id: str) -> bool:
    """Revoke a key by its id (the ``hm_{key_id}_…`` part): requests with it are 401 from now on.
    Returns False when no live key has that id."""
    revoked = await conn.fetchval(
        "UPDATE api_keys SET revoked_at = now() WHERE key_id = $1 AND revoked_at IS NULL RETURNING key_id",
        key_id,
    )
    return revoked is not None


async def create_account(
    pool: asyncpg.Pool, name: str, *, admin: bool = False, interactive: bool = False
) -> tuple[str, str, str, str]:
    """Create an account with one pool, one API key and a webhook signing secret; an ``admin``
    one may also read the operators' API, an ``interactive`` one use priorities 1-3 (its job
    quota, hypermedia/jobs/quotas.py). Returns (account_id, api_key, pool_id, webhook_secret)."""
    account_id, pool_id = uuid.uuid4(), uuid.uuid4()
    key, key_id, digest = new_key()
    webhook_secret = new_webhook_secret()
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(
            "INSERT INTO accounts (account_id, name, webhook_secret, is_admin) VALUES ($1, $2, $3, $4)",
            account_id,
            name,
            webhook_secret,
            admin,
        )
        await conn.execute(
            "INSERT INTO pools (pool_id, account_id, name) VALUES ($1, $2, 'default')", pool_id, account_id
        )
        await conn.execute(
            "INSERT INTO api_keys (key_id, account_id, secret_hash) VALUES ($1, $2, $3)",
            key_id,
            account_id,
            digest,
        )
        await conn.execute("INSERT INTO credit_accounts (account_id) VALUES ($1)", account_id)
        await conn.execute(
            "INSERT INTO account_quotas (account_id, interactive) VALUES ($1, $2)", account_id, interactive
        )
    return str(account_id), key, str(pool_id), webhook_secret
