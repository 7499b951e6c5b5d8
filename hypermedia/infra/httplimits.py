"""The connection limits of every HTTP server (:mod:`hypermedia.infra.httpserver`), read from ``HM_HTTP_*``."""

from __future__ import annotations

from pydantic import Field, model_validator

from hypermedia.core.config import ComponentSettings


class HttpSettings(ComponentSettings):
    """Connection limits of every HTTP server (:class:`hypermedia.infra.httpserver.HttpServer`: the
    gateway's REST API and the storage service's signed-URL server), so that clients that send
    slowly, nothing, or too much cannot take the server from everyone else."""

    head_timeout_seconds: float = Field(10.0, gt=0, le=3600, validation_alias="HM_HTTP_HEAD_TIMEOUT_SECONDS")
    """Time a connection has to send a complete request head, from its connect or from the end of
    the previous response; past it the connection is closed (``408`` if part of a head came)."""
    body_idle_seconds: float = Field(30.0, gt=0, le=3600, validation_alias="HM_HTTP_BODY_IDLE_SECONDS")
    """Longest gap between two pieces of a request body while the server is reading it, and the
    grace a body starts with under :attr:`body_min_bytes_per_second`."""
    body_min_bytes_per_second: int = Field(
        1024, ge=0, le=1024**3, validation_alias="HM_HTTP_BODY_MIN_BYTES_PER_SECOND"
    )
    """Least average rate of a request body (bytes per second), as Apache's mod_reqtimeout
    ``MinRate``: a body's deadline starts at :attr:`body_idle_seconds` after its head and moves on
    one second per this many bytes received; past it, ``408``. It bounds the rate, not the time:
    a 2 GiB upload needs 2 GiB / 1 KiB/s = 2,097,152 s (24 days) at the default, so any real link
    gets through; a connection dripping a byte every few seconds is cut after the grace. Time the
    server is the one not reading is not counted. 0: no minimum rate."""
    send_idle_seconds: float = Field(60.0, gt=0, le=3600, validation_alias="HM_HTTP_SEND_IDLE_SECONDS")
    """Longest time a response may wait for a client that does not read it (the write buffer stays
    full); past it the connection is aborted. Also the grace of :attr:`send_min_bytes_per_second`."""
    send_min_bytes_per_second: int = Field(
        1024, ge=0, le=1024**3, validation_alias="HM_HTTP_SEND_MIN_BYTES_PER_SECOND"
    )
    """Least average rate at which a client must take a response it keeps the server waiting on
    (bytes per second): from the first time the write buffer fills, the connection's deadline is
    :attr:`send_idle_seconds` later and moves on one second per this many bytes the client
    acknowledges (time the server is the one not writing is not counted); past it the connection
    is aborted. 0: no minimum rate."""
    linger_seconds: float = Field(5.0, gt=0, le=60, validation_alias="HM_HTTP_LINGER_SECONDS")
    """After an answer sent before its request was read (401, 413, 431…), how long the server keeps
    reading and discarding what the client still sends, so the answer reaches it instead of a reset."""
    max_connections: int = Field(1024, ge=16, le=1_000_000, validation_alias="HM_HTTP_MAX_CONNECTIONS")
    """Open connections of one server. At the cap a new connection evicts the connection that has
    waited longest without sending a complete head; when every connection is serving a request,
    the new one gets ``503`` with ``Retry-After``."""
    max_connections_per_address: int = Field(
        32, ge=0, le=1_000_000, validation_alias="HM_HTTP_MAX_CONNECTIONS_PER_ADDRESS"
    )
    """Open connections from one client address (IPv6: one /64). At the cap a new connection evicts
    that address's longest-waiting connection without a request; when all of them are serving
    requests it gets ``429`` with ``Retry-After``. 0: no per-address cap (behind a proxy, every
    client has the proxy's address)."""
    reserve_connections: int = Field(16, ge=0, le=10_000, validation_alias="HM_HTTP_RESERVE_CONNECTIONS")
    """Connections admitted over :attr:`max_connections` when every connection is serving a
    request, for the server's health paths only (the gateway's ``/healthz`` and ``/readyz``): one
    request each, then closed; any other request on them gets ``503 SERVER_BUSY``. 0: none."""
    max_head_bytes: int = Field(
        64 * 1024, ge=4096, le=16 * 1024 * 1024, validation_alias="HM_HTTP_MAX_HEAD_BYTES"
    )
    """Largest request head (request line and header fields), bytes; larger gets ``431``."""
    max_headers: int = Field(100, ge=16, le=10_000, validation_alias="HM_HTTP_MAX_HEADERS")
    """Most header fields in one request; more gets ``431``."""
    max_target_bytes: int = Field(
        8 * 1024, ge=1024, le=1024 * 1024, validation_alias="HM_HTTP_MAX_TARGET_BYTES"
    )
    """Longest request target (path and query), bytes; longer gets ``414``."""

    @model_validator(mode="after")
    def _target_fits_head(self) -> HttpSettings:
        if self.max_target_bytes > self.max_head_bytes:
            raise ValueError("HM_HTTP_MAX_TARGET_BYTES must not exceed HM_HTTP_MAX_HEAD_BYTES")
        return self
