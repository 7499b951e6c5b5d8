"""The production object store: S3 (or an S3-compatible endpoint) through boto3.

boto3 is synchronous, so every call runs in a worker thread (``asyncio.to_thread``). Transient
failures (connection errors, timeouts, throttling, 5xx) are retried here, bounded: at most
:data:`MAX_ATTEMPTS` attempts with exponential backoff; botocore's own retries are switched off so
the bound is this one. When they run out the call raises ``TransientError(STORAGE_UNAVAILABLE)``.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError, HTTPClientError
from botocore.exceptions import ConnectionError as BotoConnectionError
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential

from hypermedia.core.errors import TransientError
from services.storage.backends import checksum_hex

MAX_ATTEMPTS = 3
"""Attempts per S3 call, the first included."""
READ_CHUNK_BYTES = 1024 * 1024
_RETRYABLE_CODES = frozenset(
    {"Throttling", "ThrottlingException", "SlowDown", "RequestTimeout", "InternalError", "ServiceUnavailable"}
)
_MISSING_CODES = frozenset({"404", "NoSuchKey", "NotFound"})

T = TypeVar("T")


def _is_transient(exc: BaseException) -> bool:
    if isinstance(exc, BotoConnectionError | HTTPClientError):
        return True
    if isinstance(exc, ClientError):
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        return status >= 500 or exc.response.get("Error", {}).get("Code") in _RETRYABLE_CODES
    return False


def _is_missing(exc: ClientError) -> bool:
    return str(exc.response.get("Error", {}).get("Code")) in _MISSING_CODES


class S3Store:
    """An :class:`~services.storage.backends.ObjectBackend` on one S3 bucket.

    Args:
        bucket: bucket name (must exist).
        region: AWS region of the bucket.
        endpoint_url: S3-compatible endpoint (MinIO, moto in tests); empty for AWS itself.

    Credentials come from the standard AWS chain (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``,
    profile, instance role); this service is the only one that holds them.
    """

    def __init__(self, bucket: str, region: str, endpoint_url: str = "") -> None:
        self.bucket = bucket
        self._client = boto3.session.Session().client(
            "s3",
            region_name=region,
            endpoint_url=endpoint_url or None,
            config=Config(
                signature_version="s3v4",
                retries={"total_max_attempts": 1},
                connect_timeout=5,
                read_timeout=30,
                # Keep presigned PUT URLs free of SDK checksum parameters plain HTTP clients cannot honour.
                request_checksum_calculation="when_required",
            ),
        )

    async def _call(self, fn: Callable[..., T], /, **kwargs: Any) -> T:
        try:
            async for attempt in AsyncRetrying(
                stop=stop_after_attempt(MAX_ATTEMPTS),
                wait=wait_exponential(multiplier=0.2, max=2.0),
                retry=retry_if_exception(_is_transient),
                reraise=True,
            ):
                with attempt:
                    return await asyncio.to_thread(fn, **kwargs)
        except Exception as exc:
            if _is_transient(exc):
                raise TransientError("object storage is unavailable", "STORAGE_UNAVAILABLE") from exc
            raise
        raise AssertionError("unreachable")

    def _presign(self, operation: str, params: dict[str, str], ttl_seconds: int) -> tuple[str, datetime]:
        expires_at = datetime.now(UTC) + timedelta(seconds=ttl_seconds)
        url = self._client.generate_presigned_url(
            operation, Params={"Bucket": self.bucket, **params}, ExpiresIn=ttl_seconds
        )
        return url, expires_at

    async def presign_get(self, key: str, ttl_seconds: int, content_type: str = "") -> tuple[str, datetime]:
        """See :meth:`ObjectBackend.presign_get` (``content_type`` becomes ResponseContentType)."""
        params = {"Key": key}
        if content_type:
            params["ResponseContentType"] = content_type
        return await asyncio.to_thread(self._presign, "get_object", params, ttl_seconds)

    async def presign_put(self, key: str, ttl_seconds: int, content_type: str) -> tuple[str, datetime]:
        """See :meth:`ObjectBackend.presign_put` (the Content-Type header is signed)."""
        params = {"Key": key, "ContentType": content_type}
        return await asyncio.to_thread(self._presign, "put_object", params, ttl_seconds)

    async def grant_outputs(
        self, prefix: str, ttl_seconds: int, max_bytes: int
    ) -> tuple[str, str, dict[str, str], datetime]:
        """See :meth:`ObjectBackend.grant_outputs`: an S3 presigned POST policy whose conditions
        are ``starts-with $key prefix``, any ``Content-Type``, ``x-amz-checksum-algorithm``
        SHA256 with an ``x-amz-checksum-sha256`` field (so S3 verifies each upload's SHA-256 and
        keeps it), and ``content-length-range 0..max_bytes``. The one-segment rule below the
        prefix is checked at registration (a policy cannot say it)."""
        return await asyncio.to_thread(self._presign_post, prefix, ttl_seconds, max_bytes)

    def _presign_post(
        self, prefix: str, ttl_seconds: int, max_bytes: int
    ) -> tuple[str, str, dict[str, str], datetime]:
        expires_at = datetime.now(UTC) + timedelta(seconds=ttl_seconds)
        post = self._client.generate_presigned_post(
            self.bucket,
            prefix + "${filename}",  # boto3 turns this into ["starts-with", "$key", prefix]
            Fields={"x-amz-checksum-algorithm": "SHA256"},
            Conditions=[
                ["starts-with", "$Content-Type", ""],
                {"x-amz-checksum-algorithm": "SHA256"},
                ["starts-with", "$x-amz-checksum-sha256", ""],
                ["content-length-range", 0, max_bytes],
            ],
            ExpiresIn=ttl_seconds,
        )
        fields = {name: value for name, value in post["fields"].items() if name != "key"}
        return "POST", post["url"], fields, expires_at

    async def verified_sha256(self, key: str) -> str | None:
        """See :meth:`ObjectBackend.verified_sha256`: the ``ChecksumSHA256`` S3 verified and kept
        at upload (HEAD with ``ChecksumMode=ENABLED``), None when the upload sent none (or the
        endpoint, moto among them, keeps none for POST uploads).

        Raises:
            FileNotFoundError: nothing is stored at ``key``.
        """
        try:
            head = await self._call(
                self._client.head_object, Bucket=self.bucket, Key=key, ChecksumMode="ENABLED"
            )
        except ClientError as exc:
            if _is_missing(exc):
                raise FileNotFoundError(key) from None
            raise
        value = head.get("ChecksumSHA256")
        if not value or head.get("ChecksumType", "FULL_OBJECT") != "FULL_OBJECT":
            return None
        return checksum_hex(value)

    async def stat(self, key: str) -> int | None:
        """See :meth:`ObjectBackend.stat` (HEAD object)."""
        try:
            head = await self._call(self._client.head_object, Bucket=self.bucket, Key=key)
        except ClientError as exc:
            if _is_missing(exc):
                return None
            raise
        return int(head["ContentLength"])

    async def sha256(self, key: str) -> str:
        """See :meth:`ObjectBackend.sha256` (streams the object once)."""
        try:
            return await self._call(self._hash, key=key)
        except ClientError as exc:
            if _is_missing(exc):
                raise FileNotFoundError(key) from None
            raise

    def _hash(self, key: str) -> str:
        body = self._client.get_object(Bucket=self.bucket, Key=key)["Body"]
        digest = hashlib.sha256()
        try:
            for chunk in body.iter_chunks(READ_CHUNK_BYTES):
                digest.update(chunk)
        finally:
            body.close()
        return digest.hexdigest()

    async def delete(self, key: str) -> None:
        """See :meth:`ObjectBackend.delete` (deleting a missing key succeeds)."""
        await self._call(self._client.delete_object, Bucket=self.bucket, Key=key)
