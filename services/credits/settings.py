"""The credits service's settings."""

from __future__ import annotations

from pydantic import Field

from hypermedia.core.config import ComponentSettings


class CreditsSettings(ComponentSettings):
    grpc_bind: str = Field("127.0.0.1:50061", validation_alias="HM_CREDITS_BIND")
