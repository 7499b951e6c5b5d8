"""Resolved outputs: an HLS playlist or WebVTT output of a completed job, served with every
reference to a sibling output replaced by a URL a player can fetch
(``GET /v1/jobs/{job_id}/outputs/{output_type}/resolved``; the text rules are in
:mod:`hypermedia.core.manifests`).

A reference becomes:

- for a sibling that is itself a playlist or WebVTT (a master's variant playlists, alternative
  renditions, subtitles): the URL of this same endpoint for that sibling, signed so that it works
  without an API key (a video player cannot send one): ``?expires={unix seconds}&sig={hex}``,
  ``sig = HMAC-SHA256(k, "{job_id}\\n{output_type}\\n{expires}")`` with
  ``k = HMAC-SHA256(HM_GATEWAY_SECRET_KEY, "hypermedia/resolved-output-url/v1")``
  (:class:`LinkSigner`);
- for any other sibling (the fMP4 of a rendition, a sprite image): a presigned storage URL.

Lifetimes: ``TTL + presentation``, where TTL is the storage URL lifetime (what a plain
``PresignGet`` gives, ``HM_STORAGE_URL_TTL_SECONDS``) and presentation the playing time of the
text (:func:`~hypermedia.core.manifests.presentation_seconds`; for a master playlist that of its
longest variant), at most a week. A player that starts within the TTL and plays through then never
meets an expired URL mid-stream: a VOD media playlist is read once and its segments are fetched
with Range requests until the end, and a master's variants are fetched when the player first
switches to them, which may be late in the presentation.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC

import asyncpg
import grpc
import httpx

from hypermedia.api.storage.v1 import storage_pb2, storage_pb2_grpc
from hypermedia.core import manifests
from hypermedia.core.errors import (
    Conflict,
    DomainError,
    InvalidArgument,
    NotFound,
    TransientError,
    UnsupportedInput,
)
from hypermedia.infra.rpc import call
from hypermedia.jobs import secrets as jobsecrets
from services.gateway.ids import parse_uuid

log = logging.getLogger(__name__)

SIGNATURE_LABEL = b"hypermedia/resolved-output-url/v1"
"""Label deriving the signing key of resolved-output URLs from ``HM_GATEWAY_SECRET_KEY``
(:func:`hypermedia.jobs.secrets.derive_key`), so these signatures never match another use's HMACs."""
MAX_MANIFEST_BYTES = 4 * 1024 * 1024
"""Largest output resolved (bytes); a larger one answers 422 ``OUTPUT_TOO_LARGE``. An HLS media
playlist of a two-hour rendition in 4 s segments is about 150 KiB."""
CACHE_MAX_AGE_SECONDS = 300
"""Upper bound of ``Cache-Control: max-age`` of a resolved output; it is also at most half the
storage URL lifetime, so a cached copy still holds URLs with half their life or more."""
MAX_URL_LIFETIME_SECONDS = 7 * 24 * 3600
"""Longest lifetime given to any URL (seconds): the storage service's limit (SigV4 allows no more)."""


class UrlRejected(DomainError):
    """A signed URL whose signature does not match its job and output, or whose time is up (HTTP 403)."""

    grpc_code = grpc.StatusCode.PERMISSION_DENIED
    http_status = 403
    default_code = "URL_REJECTED"


class LinkSigner:
    """Signs and checks ``(job_id, output_type, expires)`` of resolved-output URLs.

    Args:
        key: the HMAC-SHA256 key, 32 bytes from :meth:`from_secret`.
    """

    def __init__(self, key: bytes) -> None:
        self._key = key

    @classmethod
    def from_secret(cls, secret: str) -> LinkSigner:
        """The signer keyed by ``HM_GATEWAY_SECRET_KEY`` (through :data:`SIGNATURE_LABEL`)."""
        return cls(jobsecrets.derive_key(secret, SIGNATURE_LABEL))

    def sign(self, job_id: str, output_type: str, expires: int) -> str:
        """64 hex digits: HMAC-SHA256 over ``"{job_id}\\n{output_type}\\n{expires}"``; ``job_id``
        in canonical lowercase form, ``expires`` in unix seconds."""
        message = f"{job_id}\n{output_type}\n{expires}".encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()

    def valid(self, job_id: str, output_type: str, expires: str, sig: str, now: float) -> bool:
        """Whether ``sig`` signs exactly this job, output and ``expires``, and ``expires`` (decimal
        unix seconds) is not before ``now``. The signatures are compared in constant time."""
        if not expires.isascii() or not expires.isdigit() or len(expires) > 12 or int(expires) < now:
            return False
        expected = self.sign(job_id, output_type, int(expires))
        return hmac.compare_digest(expected.encode(), sig.encode("utf-8", "replace"))


@dataclass(frozen=True)
class ResolvedOutput:
    """A resolved text output, ready to send."""

    content: bytes
    """The rewritten text, UTF-8."""
    mime_type: str
    """The output's media type, as registered."""
    max_age_seconds: int
    """How long the answer may be cached (seconds); always less than the lifetime of its URLs."""


@dataclass(frozen=True)
class _Output:
    output_type: str
    key: str
    mime_type: str
    size_bytes: int


EndpointUrl = Callable[[str, str, int, str], str]
"""``(job_id, output_type, expires, sig) → URL`` of the resolved-output endpoint: the transport
knows how its clients reach it (scheme, host, path prefix)."""


class OutputResolver:
    """The resolved-output use case. Dependencies come in through the constructor.

    Args:
        pool: the system of record (``processing_jobs``, ``job_outputs``).
        storage: presigned GET URLs of outputs.
        http: reads the text output through its presigned URL.
        signer: signs links to sibling playlists; None (``HM_GATEWAY_SECRET_KEY`` unset): signed
            URLs are refused (403) and an output that links a sibling playlist answers 422
            ``SIGNED_URLS_NOT_ENABLED``.
        max_bytes: largest output resolved.
    """

    def __init__(
        self,
        pool: asyncpg.Pool,
        storage: storage_pb2_grpc.StorageServiceStub,
        http: httpx.AsyncClient,
        signer: LinkSigner | None,
        *,
        max_bytes: int = MAX_MANIFEST_BYTES,
    ) -> None:
        self._pool = pool
        self._storage = storage
        self._http = http
        self._signer = signer
        self._max_bytes = max_bytes

    def check_signature(self, job_id: str, output_type: str, expires: str, sig: str) -> None:
        """Accept a signed request for exactly ``job_id``'s ``output_type`` until ``expires``.

        Raises:
            UrlRejected: a malformed job id, a signature of anything else, a time that passed, or
                no signing key configured.
        """
        try:
            canonical = str(uuid.UUID(job_id))
        except ValueError:
            canonical = ""
        if not canonical or self._signer is None:
            raise UrlRejected("the URL is expired or its signature does not match")
        if not self._signer.valid(canonical, output_type, expires, sig, time.time()):
            raise UrlRejected("the URL is expired or its signature does not match")

    async def resolve(
        self, job_id: str, output_type: str, endpoint_url: EndpointUrl, *, account_id: str | None
    ) -> ResolvedOutput:
        """The output ``output_type`` of ``job_id`` with its references to siblings rewritten.

        ``account_id``: the caller's account (API key), or None for a request whose signature
        :meth:`check_signature` accepted.

        Raises:
            NotFound: unknown or malformed job id, another account's job, no such output.
            Conflict: ``JOB_NOT_COMPLETED`` — the job has not completed (yet).
            UnsupportedInput: ``OUTPUT_NOT_RESOLVABLE`` — the output is not HLS or WebVTT.
            InvalidArgument: ``OUTPUT_TOO_LARGE`` above ``max_bytes``; ``OUTPUT_NOT_TEXT`` not
                UTF-8; ``SIGNED_URLS_NOT_ENABLED`` (see the constructor).
            TransientError: storage unreachable or answering with an error.
        """
        job_id = parse_uuid(job_id, "job")
        job = await self._pool.fetchrow(
            "SELECT status, profile_version FROM processing_jobs"
            " WHERE job_id = $1 AND ($2::uuid IS NULL OR account_id = $2::uuid)",
            job_id,
            account_id,
        )
        if job is None:
            raise NotFound("job not found", "NOT_FOUND")
        if job["status"] != "completed":
            raise Conflict(
                f"the job is {job['status']}; its outputs can be resolved once it is completed",
                "JOB_NOT_COMPLETED",
            )
        rows = await self._pool.fetch(
            "SELECT j.output_type, j.key, j.mime_type, j.size_bytes FROM job_outputs j JOIN objects o USING (object_id)"
            " WHERE j.job_id = $1 AND j.profile_version = $2 AND o.state = 'available'",
            job_id,
            job["profile_version"],
        )
        outputs = {r["output_type"]: _Output(**dict(r)) for r in rows}
        target = outputs.get(output_type)
        if target is None:
            raise NotFound("output not found", "NOT_FOUND")
        kind = manifests.kind_of(target.mime_type)
        if kind is None:
            raise UnsupportedInput(
                f"output {output_type!r} is {target.mime_type}, not an HLS playlist or WebVTT",
                "OUTPUT_NOT_RESOLVABLE",
            )
        text, ttl = await self._read(target)
        referenced = [outputs[name] for name in sorted(manifests.references(kind, text)) if name in outputs]
        # Siblings that are playlists or WebVTT themselves are linked to this endpoint, signed.
        linked = {o.output_type: k for o in referenced if (k := manifests.kind_of(o.mime_type)) is not None}
        if linked and self._signer is None:
            raise InvalidArgument(
                "this server cannot sign links to playlists (HM_GATEWAY_SECRET_KEY is unset)",
                "SIGNED_URLS_NOT_ENABLED",
            )
        playing = manifests.presentation_seconds(kind, text)
        if not playing and linked:  # a master playlist: as long as its longest variant
            variants = [o for o in referenced if o.output_type in linked]
            reads = await asyncio.gather(*(self._read(o) for o in variants))
            playing = max(
                manifests.presentation_seconds(linked[o.output_type], variant_text)
                for o, (variant_text, _ttl) in zip(variants, reads, strict=True)
            )
        lifetime = min(MAX_URL_LIFETIME_SECONDS, ttl + playing)
        expires = int(time.time()) + lifetime
        found = await asyncio.gather(
            *(
                self._url_of(job_id, o, o.output_type in linked, endpoint_url, expires, lifetime)
                for o in referenced
            )
        )
        urls = {o.output_type: url for o, url in zip(referenced, found, strict=True)}
        return ResolvedOutput(
            content=manifests.rewrite(kind, text, urls.get).encode(),
            mime_type=target.mime_type,
            max_age_seconds=min(CACHE_MAX_AGE_SECONDS, ttl // 2),
        )

    async def _url_of(
        self,
        job_id: str,
        output: _Output,
        linked: bool,
        endpoint_url: EndpointUrl,
        expires: int,
        lifetime: int,
    ) -> str:
        """The URL that replaces a reference to ``output``: a signed link to this endpoint when it
        is ``linked`` (a playlist or WebVTT), else a presigned storage URL living ``lifetime`` s."""
        if linked:
            assert self._signer is not None  # resolve() refused it otherwise
            sig = self._signer.sign(job_id, output.output_type, expires)
            return endpoint_url(job_id, output.output_type, expires, sig)
        presigned = await call(
            self._storage.PresignGet,
            storage_pb2.PresignGetRequest(key=output.key, expires_in_seconds=lifetime),
        )
        return str(presigned.url)

    async def _read(self, output: _Output) -> tuple[str, int]:
        """The output's text, read through a presigned URL, and that URL's lifetime (seconds):
        the storage URL TTL."""
        if output.size_bytes > self._max_bytes:
            raise _too_large(output.output_type, self._max_bytes)
        presigned = await call(self._storage.PresignGet, storage_pb2.PresignGetRequest(key=output.key))
        ttl = max(1, int(presigned.expires_at.ToDatetime(tzinfo=UTC).timestamp() - time.time()))
        body = bytearray()
        try:
            async with self._http.stream("GET", presigned.url) as response:
                if response.status_code != 200:
                    log.error("storage answered %s to the GET of an output", response.status_code)
                    raise TransientError("object storage did not return the output", "STORAGE_UNAVAILABLE")
                async for chunk in response.aiter_bytes():
                    body += chunk
                    if len(body) > self._max_bytes:
                        raise _too_large(output.output_type, self._max_bytes)
        except httpx.HTTPError as exc:
            raise TransientError("object storage is unavailable", "STORAGE_UNAVAILABLE") from exc
        try:
            return body.decode("utf-8"), ttl
        except UnicodeDecodeError:
            raise InvalidArgument(
                f"output {output.output_type!r} is not UTF-8 text", "OUTPUT_NOT_TEXT"
            ) from None


def _too_large(output_type: str, limit: int) -> InvalidArgument:
    return InvalidArgument(f"output {output_type!r} is larger than {limit} bytes", "OUTPUT_TOO_LARGE")
