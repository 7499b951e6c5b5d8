"""Webhook signing secrets in the Standard Webhooks format (https://www.standardwebhooks.com/)."""

from __future__ import annotations

import base64
import secrets


def new_webhook_secret() -> str:
    """A signing secret: ``whsec_`` + base64 of 24 random bytes (192 bits)."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()
