"""Webhook signing secrets in the Standard Webhooks format (https://www.standardwebhooks.com/)."""

from __future__ import annotations

import base64
import secrets

import asyncpg


def new_webhook_secret() -> str:
    """A signing secret: ``whsec_`` + base64 of 24 random bytes (192 bits)."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()


async def account_secret(pool: asyncpg.Pool, account_id: object) -> str:
    """The account's signing secret, created on first use for accounts made before there were any
    (concurrent first uses agree: the UPDATE keeps whichever secret was stored first)."""
    return str(
        await pool.fetchval(
            "UPDATE accounts SET webhook_secret = coalesce(webhook_secret, $2) WHERE account_id = $1 "
            "RETURNING webhook_secret",
            account_id,
            new_webhook_secret(),
        )
    )
