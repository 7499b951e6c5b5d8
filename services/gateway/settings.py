"""The gateway's settings (REST and gRPC listeners, upload bounds, virus scanning, its secret key)."""

from __future__ import annotations

import math

from pydantic import Field, SecretStr, model_validator

from hypermedia.core.config import ComponentSettings, env

BRAKE_DEFAULT = "images=5,documents=30,ocr=120,media=300"
"""The brake's targets: the top of seed 000's typical job duration for images (0.1-5 s),
documents (1-30 s) and OCR (5-120 s); five minutes for media, whose typical 30 s-30 min would let
bulk work crowd a waiting transcode for half an hour."""
INTERACTIVE_QUEUES = ("images", "documents", "ocr", "media")


def parse_brake(text: str) -> dict[str, float]:
    """``images=5,documents=30`` as ``{"images": 5.0, "documents": 30.0}``. Raises ValueError
    naming ``HM_BACKFILL_BRAKE`` for a queue that is not interactive, a repeated queue, or seconds
    that are not a number from 0.1 to 86400."""
    targets: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        queue, _, seconds = part.partition("=")
        queue = queue.strip()
        if queue not in INTERACTIVE_QUEUES or queue in targets:
            raise ValueError(
                f"HM_BACKFILL_BRAKE: {queue!r} is not one of {', '.join(INTERACTIVE_QUEUES)} named once"
            )
        try:
            value = float(seconds)
        except ValueError:
            value = math.nan
        if not 0.1 <= value <= 86_400:
            raise ValueError(f"HM_BACKFILL_BRAKE: {queue}'s seconds must be a number from 0.1 to 86400")
        targets[queue] = value
    return targets


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

    schedule_poll_seconds: float = Field(1.0, gt=0, le=60, validation_alias="HM_SCHEDULE_POLL_SECONDS")
    """How often this gateway's schedule runner records due ticks and runs the pending process and
    backfill runs (seconds; ADR 0072)."""
    backfill_poll_seconds: float = Field(0.5, gt=0, le=60, validation_alias="HM_BACKFILL_POLL_SECONDS")
    """How often this gateway's backfill runner ticks (seconds): each tick enqueues what the
    running runs' buckets hold."""
    backfill_brake: str = Field(BRAKE_DEFAULT, validation_alias="HM_BACKFILL_BRAKE")
    """``queue=seconds,…``: bulk dispatch stops while one of these interactive queues' oldest
    queued job has waited longer than its seconds (ADR 0058). Empty: no brake."""

    @property
    def brake_targets(self) -> dict[str, float]:
        """:attr:`backfill_brake` as queue → seconds."""
        return parse_brake(self.backfill_brake)

    @model_validator(mode="after")
    def _brake(self) -> GatewaySettings:
        parse_brake(self.backfill_brake)
        return self

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
