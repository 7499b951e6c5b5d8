"""The gateway's settings (REST and gRPC listeners, upload bounds, virus scanning, its secret key)."""

from __future__ import annotations

from pydantic import Field, SecretStr, model_validator

from hypermedia.core.config import ComponentSettings, env


class GatewaySettings(ComponentSettings):
    """The public REST and gRPC API."""

    http_host: str = Field("127.0.0.1", validation_alias=env("HM_GATEWAY_HTTP_HOST"))
    http_port: int = Field(8080, ge=0, le=65535, validation_alias=env("HM_GATEWAY_HTTP_PORT"))
    grpc_host: str = Field("127.0.0.1", validation_alias=env("HM_GATEWAY_GRPC_HOST"))
    grpc_port: int = Field(50051, ge=0, le=65535, validation_alias=env("HM_GATEWAY_GRPC_PORT"))
    max_upload_bytes: int = Field(100 * 1024 * 1024, gt=0, validation_alias="HM_MAX_UPLOAD_BYTES")
    """Largest original accepted by POST /v1/objects (bytes)."""
    max_concurrent_uploads_per_account: int = Field(
        16, ge=0, le=100_000, validation_alias="HM_MAX_CONCURRENT_UPLOADS_PER_ACCOUNT"
    )
    """Requests with a body (uploads and JSON bodies alike) one account may have in progress at
    once on one gateway process; one more gets ``429 TOO_MANY_UPLOADS`` with ``Retry-After``
    before its body is read. 0: no cap."""
    max_operations: int = Field(16, gt=0, le=100, validation_alias="HM_MAX_OPERATIONS")
    """Most operations in one process request."""
    relay_poll_seconds: float = Field(1.0, gt=0, validation_alias="HM_RELAY_POLL_SECONDS")
    webhook_allow_private: bool = Field(False, validation_alias="HM_WEBHOOK_ALLOW_PRIVATE")
    """Accept a ``webhook_url`` whose host is a loopback, private or link-local IP literal or
    ``localhost`` (refused with INVALID_WEBHOOK_URL by default; ``hypermedia up`` allows them)."""
    noop_operation: bool = Field(False, validation_alias="HM_NOOP_OPERATION")
    """Accept the ``noop`` operation (benchmarks and tests only: :mod:`hypermedia.jobs.noop`,
    ADR 0038); refused with ``OPERATION_NOT_ENABLED`` by default."""
    clamd_url: str = Field("", validation_alias=env("HM_CLAMD_URL"))
    """ClamAV daemon that scans every upload before it is stored: ``unix:///run/clamav/clamd.ctl``
    or ``tcp://host:3310``. Empty (the default): no virus scan."""
    clamd_timeout_seconds: float = Field(60.0, gt=0, le=3600, validation_alias="HM_CLAMD_TIMEOUT_SECONDS")
    """Longest one scan may take, connecting, sending and clamd's verdict included (seconds)."""
    clamd_max_stream_bytes: int = Field(100 * 1024 * 1024, gt=0, validation_alias="HM_CLAMD_MAX_STREAM_BYTES")
    """Largest upload sent to clamd (bytes); larger ones are refused while scanning is on. At most
    clamd's ``StreamMaxLength`` (100M by default)."""
    secret_key: SecretStr = Field(SecretStr(""), validation_alias="HM_GATEWAY_SECRET_KEY")
    """The gateway's own secret (at least 16 characters; ``hypermedia up`` generates one). Keys, per
    use with a label, the HMAC-SHA256 of a document ``password`` in the Idempotency-Key request
    hash (:mod:`hypermedia.jobs.secrets`). Empty: requests with a ``password`` are refused. Every
    gateway replica needs the same value; changing it makes a stored key sent again with its
    password answer 409."""

    @model_validator(mode="after")
    def _clamd_url(self) -> GatewaySettings:
        if self.clamd_url:
            from hypermedia.intake.clamav import ClamdAddress  # here: only a gateway that scans needs it

            ClamdAddress.parse(self.clamd_url)  # ValueError naming HM_CLAMD_URL, not its value
        return self

    @model_validator(mode="after")
    def _secret_key(self) -> GatewaySettings:
        if 0 < len(self.secret_key.get_secret_value()) < 16:
            raise ValueError("HM_GATEWAY_SECRET_KEY must be at least 16 characters (or unset)")
        return self
