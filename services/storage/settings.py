"""The storage service's settings: the backend (a local directory served over HTTP, or S3), signed URLs, quotas."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr, model_validator

from hypermedia.core.config import ComponentSettings


class StorageSettings(ComponentSettings):
    """Object storage: a local directory served over HTTP, or S3."""

    grpc_bind: str = Field("127.0.0.1:50062", validation_alias="HM_STORAGE_BIND")
    backend: Literal["local", "s3"] = Field("local", validation_alias="HM_STORAGE_BACKEND")
    http_host: str = Field("127.0.0.1", validation_alias="HM_STORAGE_HTTP_HOST")
    http_port: int = Field(50063, ge=0, le=65535, validation_alias="HM_STORAGE_HTTP_PORT")
    public_url: str = Field("", validation_alias="HM_STORAGE_PUBLIC_URL")
    """Base URL that presigned local URLs start with; default ``http://{http_host}:{http_port}``."""
    local_dir: str = Field(".hypermedia/objects", validation_alias="HM_STORAGE_DIR")
    handoff_socket: str = Field("", validation_alias="HM_STORAGE_HANDOFF_SOCKET")
    """Unix socket on which a worker on this machine trades a presigned GET URL of the local
    store for an open file descriptor (:mod:`services.storage.handoff`, ADR 0045); empty: off.
    Workers given the same path use it (``hypermedia up`` sets it)."""
    signing_key: SecretStr = Field(SecretStr(""), validation_alias="HM_STORAGE_SIGNING_KEY")
    """HMAC-SHA256 key of local presigned URLs (required for the local backend)."""
    url_ttl_seconds: int = Field(900, gt=0, le=7 * 24 * 3600, validation_alias="HM_STORAGE_URL_TTL_SECONDS")
    max_put_bytes: int = Field(1024 * 1024 * 1024, gt=0, validation_alias="HM_STORAGE_MAX_PUT_BYTES")
    quota_bytes: int = Field(10 * 1024**3, ge=0, validation_alias="HM_STORAGE_QUOTA_BYTES")
    """Default storage quota of an account, bytes of originals (ADR 0029); per account:
    ``hypermedia admin set-storage-quota``."""
    quota_objects: int = Field(100_000, ge=0, validation_alias="HM_STORAGE_QUOTA_OBJECTS")
    """Default storage quota of an account, originals stored at once."""
    s3_bucket: str = Field("", validation_alias="HM_S3_BUCKET")
    s3_endpoint_url: str = Field("", validation_alias="HM_S3_ENDPOINT_URL")
    s3_region: str = Field("us-east-1", validation_alias="HM_S3_REGION")

    @model_validator(mode="after")
    def _backend_fields(self) -> StorageSettings:
        if self.backend == "local" and len(self.signing_key.get_secret_value()) < 16:
            raise ValueError("HM_STORAGE_SIGNING_KEY must be at least 16 characters for the local backend")
        if self.backend == "s3" and not self.s3_bucket:
            raise ValueError("HM_S3_BUCKET is required for the s3 backend")
        return self
