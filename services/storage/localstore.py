"""The embedded object store: a local directory, served over HTTP with expiring HMAC-signed URLs.

URLs look like ``{public_url}/o/{key}?expires={unix_seconds}&sig={hex}[&ct={content_type}]`` where
``sig = hex(HMAC-SHA256(signing_key, f"{METHOD}\\n{key}\\n{expires}\\n{content_type}"))``:

- for ``PUT`` the content type is the request's ``Content-Type`` header, so an upload with another
  type fails the signature (as with S3's signed ``Content-Type``);
- for ``GET`` it is the ``ct`` query parameter (empty when absent), the type the file is served
  with (``application/octet-stream`` by default).

A job's outputs are uploaded through one **prefix grant** (:meth:`LocalStore.grant_outputs`):
``PUT {public_url}/o/{key}?prefix={prefix}&expires={unix_seconds}&sig={hex}`` where
``sig = hex(HMAC-SHA256(signing_key, f"PUT-PREFIX\\n{prefix}\\n{expires}\\n"))`` admits any key that
is ``prefix`` plus one output type segment, with any Content-Type; such a PUT must carry
``x-amz-checksum-sha256`` (base64 SHA-256, as S3 takes it).

A PUT streams into a temporary file beside the target (``.{name}.*.part``, never a valid key),
hashed while it is written, is fsynced and then renamed over the key, so a crash mid-upload never
leaves a partial object. A PUT that carried ``x-amz-checksum-sha256`` and whose bytes differ stores
nothing (400 ``CHECKSUM_MISMATCH``). The SHA-256 of what was written is kept with the file (the
extended attribute :data:`SHA256_XATTR`), so registration does not read the bytes again.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import os
import tempfile
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from http import HTTPStatus
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import quote, urlencode

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Route

from hypermedia.core.errors import PayloadTooLarge
from services.storage.backends import OUTPUT_TYPE, checksum_hex, is_valid_key

READ_CHUNK_BYTES = 1024 * 1024
"""Read size when hashing a file, write batch size of an upload, and the chunk a download is
served in (bytes): one worker-thread round trip per MiB instead of per 64 KiB."""
SHA256_XATTR = "user.hypermedia.sha256"
"""Extended attribute holding the lowercase hex SHA-256 the store computed while writing a file.
Missing (a file from before, or a file system without user xattrs) means "unknown": storage then
hashes the file."""
CHECKSUM_HEADER = "x-amz-checksum-sha256"
"""Header with the base64 SHA-256 of a PUT body (S3's name)."""
DEFAULT_MIME = "application/octet-stream"

CORS: dict[str, Any] = {
    "allow_origins": ["*"],
    "allow_methods": ["GET", "HEAD", "PUT"],
    "allow_headers": ["Range", "Content-Type", CHECKSUM_HEADER],
    "expose_headers": ["Content-Length", "Content-Range", "Accept-Ranges", "ETag"],
    "max_age": 3600,
}
"""Cross-origin access to signed URLs (Starlette's ``CORSMiddleware``): a web player on the app's
origin (hls.js fetching segments by byte range) or a browser uploading with a presigned PUT. Any
origin, no credentials: the signature in the URL is the only authority, as with an S3 bucket whose
CORS rule allows ``*`` (docs/operations.md gives that rule for S3)."""


def _sign(key: bytes, method: str, object_key: str, expires: int, content_type: str) -> str:
    message = f"{method}\n{object_key}\n{expires}\n{content_type}".encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


class ChecksumMismatch(Exception):
    """The bytes of a PUT do not have the SHA-256 it declared; nothing was stored."""


class _File(FileResponse):
    chunk_size = READ_CHUNK_BYTES


class LocalStore:
    """An :class:`~services.storage.backends.ObjectBackend` on a local directory.

    Args:
        root: directory holding the objects (created when missing); key ``a/b`` is ``root/a/b``.
        signing_key: HMAC-SHA256 key of the URLs (the same one the HTTP app verifies with).
        public_url: base URL the HTTP app is reachable at, e.g. ``http://127.0.0.1:50063``.
    """

    def __init__(self, root: Path, signing_key: bytes, public_url: str) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self._signing_key = signing_key
        self._public_url = public_url.rstrip("/")

    def path(self, key: str) -> Path:
        """File of ``key``. ``key`` must satisfy :func:`~services.storage.backends.is_valid_key`."""
        if not is_valid_key(key):
            raise ValueError("invalid object key")
        return self.root / key

    def _url(
        self, method: str, key: str, ttl_seconds: int, content_type: str, *, ct_in_url: bool
    ) -> tuple[str, datetime]:
        expires = int(time.time()) + ttl_seconds
        query = {"expires": str(expires), "sig": _sign(self._signing_key, method, key, expires, content_type)}
        if ct_in_url and content_type:
            query["ct"] = content_type
        url = f"{self._public_url}/o/{quote(key, safe='/')}?{urlencode(query)}"
        return url, datetime.fromtimestamp(expires, UTC)

    async def presign_get(self, key: str, ttl_seconds: int, content_type: str = "") -> tuple[str, datetime]:
        """See :meth:`ObjectBackend.presign_get`."""
        self.path(key)
        return self._url("GET", key, ttl_seconds, content_type, ct_in_url=True)

    async def presign_put(self, key: str, ttl_seconds: int, content_type: str) -> tuple[str, datetime]:
        """See :meth:`ObjectBackend.presign_put`."""
        self.path(key)
        return self._url("PUT", key, ttl_seconds, content_type, ct_in_url=False)

    async def grant_outputs(
        self, prefix: str, ttl_seconds: int, max_bytes: int
    ) -> tuple[str, str, dict[str, str], datetime]:
        """See :meth:`ObjectBackend.grant_outputs`: ``PUT`` to ``{public_url}/o/{key}`` with
        ``fields`` as the query."""
        expires = int(time.time()) + ttl_seconds
        fields = {
            "prefix": prefix,
            "expires": str(expires),
            "sig": _sign(self._signing_key, "PUT-PREFIX", prefix, expires, ""),
        }
        return "PUT", f"{self._public_url}/o/", fields, datetime.fromtimestamp(expires, UTC)

    def verify_grant(self, key: str, prefix: str, expires: str, sig: str) -> bool:
        """Whether ``sig`` is an unexpired prefix grant for ``prefix`` and ``key`` is ``prefix``
        plus one output type segment."""
        rest = key[len(prefix) :] if prefix.endswith("/") and key.startswith(prefix) else ""
        if not OUTPUT_TYPE.match(rest):
            return False
        return self.verify("PUT-PREFIX", prefix, expires, sig, "")

    def verify(self, method: str, key: str, expires: str, sig: str, content_type: str) -> bool:
        """Whether ``sig`` signs (method, key, expires, content_type) and ``expires`` (unix seconds)
        has not passed."""
        if not expires.isascii() or not expires.isdigit() or len(expires) > 12:
            return False
        if int(expires) < time.time():
            return False
        expected = _sign(self._signing_key, method, key, int(expires), content_type)
        return hmac.compare_digest(expected.encode(), sig.encode("utf-8", "replace"))

    async def stat(self, key: str) -> int | None:
        """See :meth:`ObjectBackend.stat`."""
        try:
            st = await asyncio.to_thread(os.stat, self.path(key))
        except FileNotFoundError:
            return None
        return st.st_size

    async def sha256(self, key: str) -> str:
        """See :meth:`ObjectBackend.sha256`."""
        return await asyncio.to_thread(_hash_file, self.path(key))

    async def verified_sha256(self, key: str) -> str | None:
        """See :meth:`ObjectBackend.verified_sha256` (the file's :data:`SHA256_XATTR`)."""
        return await asyncio.to_thread(_stored_sha256, self.path(key))

    async def delete(self, key: str) -> None:
        """See :meth:`ObjectBackend.delete`."""
        await asyncio.to_thread(self.path(key).unlink, missing_ok=True)

    async def write(
        self, key: str, chunks: AsyncIterator[bytes], max_bytes: int, sha256: str | None = None
    ) -> int:
        """Store ``chunks`` at ``key`` atomically (temp file → fsync → rename), hashing them as
        they are written, and keep their SHA-256 with the file; returns the size.

        Args:
            sha256: lowercase hex SHA-256 the bytes must have, or None.

        Raises:
            PayloadTooLarge: more than ``max_bytes`` arrived; nothing is stored.
            ChecksumMismatch: the bytes do not have ``sha256``; nothing is stored.
            starlette.requests.ClientDisconnect: the client went away; nothing is stored.
        """
        path = self.path(key)
        await asyncio.to_thread(path.parent.mkdir, parents=True, exist_ok=True)
        fd, tmp = await asyncio.to_thread(
            tempfile.mkstemp, dir=path.parent, prefix=f".{path.name}.", suffix=".part"
        )
        file = os.fdopen(fd, "wb")
        digest = hashlib.sha256()
        try:
            size = 0
            batch = bytearray()
            async for chunk in chunks:
                size += len(chunk)
                if size > max_bytes:
                    raise PayloadTooLarge(f"upload exceeds {max_bytes} bytes")
                batch += chunk
                if len(batch) >= READ_CHUNK_BYTES:
                    await asyncio.to_thread(_write, file, digest, bytes(batch))
                    batch.clear()
            await asyncio.to_thread(_finish, file, digest, bytes(batch), sha256, tmp, path)
        except BaseException:
            file.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        return size


def _write(file: BinaryIO, digest: Any, data: bytes) -> None:
    file.write(data)
    digest.update(data)


def _finish(file: BinaryIO, digest: Any, tail: bytes, expected: str | None, tmp: str, path: Path) -> None:
    _write(file, digest, tail)
    actual = digest.hexdigest()
    if expected is not None and actual != expected:
        raise ChecksumMismatch(f"the body's SHA-256 is {actual}, not the declared {expected}")
    file.flush()
    try:
        os.setxattr(file.fileno(), SHA256_XATTR, actual.encode())
    except OSError:
        pass  # no user xattrs here: registration hashes the file instead
    os.fsync(file.fileno())
    file.close()
    os.chmod(tmp, 0o600)  # only the storage service reads objects; jobs must not
    os.replace(tmp, path)
    # The rename is durable only once the directory entry is.
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _stored_sha256(path: Path) -> str | None:
    try:
        value = os.getxattr(path, SHA256_XATTR).decode("ascii", "replace")
    except FileNotFoundError:
        raise
    except OSError:
        return None
    return value if len(value) == 64 else None


def _hash_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(READ_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def _problem(status: int, title: str, detail: str, error_code: str) -> JSONResponse:
    return JSONResponse(
        {"type": "about:blank", "title": title, "status": status, "detail": detail, "error_code": error_code},
        status_code=status,
        media_type="application/problem+json",
    )


def build_app(store: LocalStore, max_put_bytes: int) -> Starlette:
    """The HTTP app behind the local URLs: ``GET`` and ``PUT /o/{key}``, open to any origin
    (:data:`CORS`: preflights answered, ``Content-Range`` readable by scripts).

    A ``PUT`` with a ``prefix`` query parameter is an upload through a prefix grant
    (:meth:`LocalStore.grant_outputs`) and must carry ``x-amz-checksum-sha256``.

    Answers (``application/problem+json`` on error): 400 invalid key, Content-Length or checksum
    (``INVALID_CHECKSUM``), a body whose SHA-256 differs from its checksum (``CHECKSUM_MISMATCH``,
    nothing stored), 403 bad or expired signature, or a key outside the grant's prefix, 404 no
    such object, 413 body larger than ``max_put_bytes``.
    """

    async def handle(request: Request) -> Response:
        key = request.path_params["key"]
        if not is_valid_key(key):
            return _problem(400, "Bad Request", "invalid object key", "INVALID_KEY")
        method = "PUT" if request.method == "PUT" else "GET"
        query = request.query_params
        checksum = request.headers.get(CHECKSUM_HEADER)
        sha256 = None if checksum is None else checksum_hex(checksum)
        if checksum is not None and sha256 is None:
            return _problem(
                400, "Bad Request", f"{CHECKSUM_HEADER} must be a base64 SHA-256", "INVALID_CHECKSUM"
            )
        if method == "PUT" and "prefix" in query:
            if not store.verify_grant(key, query["prefix"], query.get("expires", ""), query.get("sig", "")):
                return _problem(
                    403,
                    "Forbidden",
                    "the grant is expired, its signature does not match, or the key is outside its prefix",
                    "URL_REJECTED",
                )
            if sha256 is None:
                return _problem(
                    400,
                    "Bad Request",
                    f"an upload through a grant needs {CHECKSUM_HEADER}",
                    "INVALID_CHECKSUM",
                )
            return await _put(request, key, sha256)
        signed_type = request.headers.get("content-type", "") if method == "PUT" else query.get("ct", "")
        if not store.verify(method, key, query.get("expires", ""), query.get("sig", ""), signed_type):
            return _problem(
                403, "Forbidden", "the URL is expired or its signature does not match", "URL_REJECTED"
            )
        if method == "GET":
            return await _get(key, signed_type)
        return await _put(request, key, sha256)

    async def _get(key: str, content_type: str) -> Response:
        path = store.path(key)
        try:
            st = await asyncio.to_thread(os.stat, path)
        except FileNotFoundError:
            return _problem(404, "Not Found", "no such object", "NOT_FOUND")
        return _File(path, media_type=content_type or DEFAULT_MIME, stat_result=st)

    async def _put(request: Request, key: str, sha256: str | None) -> Response:
        length = request.headers.get("content-length")
        if length is not None:
            if not length.isascii() or not length.isdigit():
                return _problem(400, "Bad Request", "invalid Content-Length", "INVALID_REQUEST")
            if int(length) > max_put_bytes:
                return _problem(
                    413,
                    "Content Too Large",
                    f"uploads are limited to {max_put_bytes} bytes",
                    "INPUT_TOO_LARGE",
                )
        try:
            await store.write(key, request.stream(), max_put_bytes, sha256)
        except ChecksumMismatch as exc:
            return _problem(400, "Bad Request", str(exc), "CHECKSUM_MISMATCH")
        except PayloadTooLarge:
            return _problem(
                413, "Content Too Large", f"uploads are limited to {max_put_bytes} bytes", "INPUT_TOO_LARGE"
            )
        except ClientDisconnect:
            return _problem(400, "Bad Request", "the upload was cut off", "INCOMPLETE_UPLOAD")
        return Response(status_code=200)

    async def _http_error(request: Request, exc: Exception) -> Response:
        status = getattr(exc, "status_code", 500)
        code = {404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED"}.get(status, "HTTP_ERROR")
        return _problem(status, HTTPStatus(status).phrase, HTTPStatus(status).description or code, code)

    return Starlette(
        routes=[Route("/o/{key:path}", handle, methods=["GET", "PUT"])],
        exception_handlers={HTTPException: _http_error},
        middleware=[Middleware(CORSMiddleware, **CORS)],
    )
