"""Typed, validated configuration of every component, read from the environment.

Each component has a frozen settings class (pydantic-settings): defaults → environment → validation,
with every error reported at once and each naming its variable. Secrets are ``SecretStr`` and error
messages never include input values, so a bad ``DATABASE_URL`` with a password in it is never
printed. The variable names are a stable contract, documented in ``docs/operations.md``.
"""

from __future__ import annotations

from typing import Literal, TypeVar

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

QueueName = Literal["images", "documents", "ocr", "media", "bulk"]
QUEUES: tuple[QueueName, ...] = ("images", "documents", "ocr", "media", "bulk")


class ConfigError(Exception):
    """Configuration is invalid. ``str()`` lists every problem as ``VARIABLE: reason``, no values."""

    exit_code = 78  # EX_CONFIG from sysexits.h


class _Settings(BaseSettings):
    model_config = SettingsConfigDict(frozen=True, extra="ignore", case_sensitive=False)


class InfraSettings(_Settings):
    """Connections every service needs."""

    database_url: SecretStr = Field(validation_alias="DATABASE_URL")
    """asyncpg DSN of the system of record, e.g. ``postgresql://user:pw@host:5432/hypermedia``."""
    nats_url: str = Field("nats://127.0.0.1:4222", validation_alias="NATS_URL")
    """NATS server with JetStream."""
    stream_prefix: str = Field("HM", validation_alias="HM_STREAM_PREFIX", pattern=r"^[A-Z][A-Z0-9_]{0,15}$")
    """Prefix of JetStream stream and subject names, so two platforms can share one NATS server."""
    credits_addr: str = Field("127.0.0.1:50061", validation_alias="HM_CREDITS_ADDR")
    """host:port of the credits service."""
    storage_addr: str = Field("127.0.0.1:50062", validation_alias="HM_STORAGE_ADDR")
    """host:port of the storage service's gRPC API."""
    log_level: str = Field("INFO", validation_alias="HM_LOG_LEVEL")


class GatewaySettings(_Settings):
    """The public REST and gRPC API."""

    http_host: str = Field("127.0.0.1", validation_alias="HYPERMEDIA_HTTP_HOST")
    http_port: int = Field(8080, ge=0, le=65535, validation_alias="HYPERMEDIA_HTTP_PORT")
    grpc_host: str = Field("127.0.0.1", validation_alias="HYPERMEDIA_GRPC_HOST")
    grpc_port: int = Field(50051, ge=0, le=65535, validation_alias="HYPERMEDIA_GRPC_PORT")
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
    clamd_url: str = Field("", validation_alias="CLAMD_URL")
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

            ClamdAddress.parse(self.clamd_url)  # ValueError naming CLAMD_URL, not its value
        return self

    @model_validator(mode="after")
    def _secret_key(self) -> GatewaySettings:
        if 0 < len(self.secret_key.get_secret_value()) < 16:
            raise ValueError("HM_GATEWAY_SECRET_KEY must be at least 16 characters (or unset)")
        return self


class HttpSettings(_Settings):
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


class CreditsSettings(_Settings):
    grpc_bind: str = Field("127.0.0.1:50061", validation_alias="HM_CREDITS_BIND")


class StorageSettings(_Settings):
    """Object storage: a local directory served over HTTP, or S3."""

    grpc_bind: str = Field("127.0.0.1:50062", validation_alias="HM_STORAGE_BIND")
    backend: Literal["local", "s3"] = Field("local", validation_alias="HM_STORAGE_BACKEND")
    http_host: str = Field("127.0.0.1", validation_alias="HM_STORAGE_HTTP_HOST")
    http_port: int = Field(50063, ge=0, le=65535, validation_alias="HM_STORAGE_HTTP_PORT")
    public_url: str = Field("", validation_alias="HM_STORAGE_PUBLIC_URL")
    """Base URL that presigned local URLs start with; default ``http://{http_host}:{http_port}``."""
    local_dir: str = Field(".hypermedia/objects", validation_alias="HM_STORAGE_DIR")
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


class WorkerSettings(_Settings):
    """A worker process of one queue."""

    queue: QueueName = Field("images", validation_alias="HM_WORKER_QUEUE")
    slots: int = Field(4, ge=1, le=64, validation_alias="HM_WORKER_SLOTS")
    """Jobs run at once. The seed's profiles: images 4–8, documents 2–4, ocr 1–2, media 1."""
    deployment: str = Field("local", validation_alias="HM_DEPLOYMENT")
    generation: int = Field(0, ge=0, validation_alias="HM_WORKER_GENERATION")
    work_dir: str = Field(".hypermedia/work", validation_alias="HM_WORK_DIR")
    """Parent of the per-job sandbox directories ``jobs/{job_id}/``."""
    status_bind: str = Field("127.0.0.1:0", validation_alias="HM_WORKER_STATUS_BIND")
    heartbeat_seconds: float = Field(30.0, gt=0, validation_alias="HM_HEARTBEAT_SECONDS")
    metrics_seconds: float = Field(60.0, gt=0, validation_alias="HM_METRICS_SECONDS")
    drain_seconds: float = Field(35.0, gt=0, validation_alias="HM_DRAIN_SECONDS")
    min_available_memory_mb: int = Field(512, ge=0, validation_alias="HM_MIN_AVAILABLE_MEMORY_MB")
    """Admission closes while available memory is below this (MiB)."""
    min_pid_headroom: int = Field(64, ge=0, validation_alias="HM_MIN_PID_HEADROOM")
    """Admission closes while fewer processes/threads than this may still be started (the
    cgroup's pids.max, else the kernel's limits): a job may use up to 16 (RLIMIT_NPROC)."""
    sandbox_uid_base: int = Field(61000, ge=1, le=2**31 - 1 - 64, validation_alias="HM_SANDBOX_UID_BASE")
    """When the worker runs as root, slot i's jobs run as uid ``base + i`` (no passwd entry
    needed), so ``RLIMIT_NPROC`` (counted per uid by the kernel) is per job, not shared."""


class MediaSettings(_Settings):
    """The mediaworker's media coordinator and encoder threads (``services/mediaworker``), read
    beside its :class:`WorkerSettings`. The coordinator bounds operations *within* the worker's
    slots: it matters only when ``HM_WORKER_SLOTS`` (1 by default for the mediaworker) is raised
    above 1; a job that waits for it holds its slot meanwhile."""

    max_video_jobs: int = Field(3, ge=1, le=64, validation_alias="HM_MEDIA_MAX_VIDEO_JOBS")
    """``transcode_video`` jobs one worker process runs at once (the seed's media coordinator: 3)."""
    max_audio_jobs: int = Field(1, ge=1, le=64, validation_alias="HM_MEDIA_MAX_AUDIO_JOBS")
    """``transcode_audio`` jobs (audio renditions) one worker process runs at once (the seed: 1)."""
    encoder_threads: int = Field(2, ge=1, le=16, validation_alias="HM_MEDIA_ENCODER_THREADS")
    """Threads of a ``transcode_video`` job's decoder and of each of its encoders
    (``MediaLimits.threads``); its ``RLIMIT_NPROC`` is raised to match (measured up to 16:
    ``services.mediaworker.MediaHandler.sandbox_limits``). The other media operations run one
    thread each."""


class OfficeSettings(_Settings):
    """The docworker's LibreOffice listeners (see :mod:`hypermedia.engines.documents.office`)."""

    python: str = Field("/usr/bin/python3", validation_alias="HM_OFFICE_PYTHON")
    """A Python with LibreOffice's ``uno`` module (Debian: ``python3-uno``) that runs the
    conversion host."""
    soffice: str = Field("/usr/lib/libreoffice/program/soffice", validation_alias="HM_OFFICE_SOFFICE")
    max_conversions: int = Field(200, ge=1, validation_alias="HM_OFFICE_MAX_CONVERSIONS")
    """Conversions before a listener is restarted (bounds what one document can leave behind)."""
    start_timeout: float = Field(60.0, gt=0, validation_alias="HM_OFFICE_START_TIMEOUT")
    """Seconds a listener may take to start (LibreOffice: about 2 s)."""
    memory_mb: int = Field(4096, ge=512, validation_alias="HM_OFFICE_MEMORY_MB")
    """``RLIMIT_AS`` of a listener, MiB (LibreOffice maps about 1.3 GiB of address space at start)."""
    nproc: int = Field(64, ge=16, validation_alias="HM_OFFICE_NPROC")
    """``RLIMIT_NPROC`` of a listener's uid (soffice runs about 10 threads)."""
    fsize_mb: int = Field(2048, ge=1, validation_alias="HM_OFFICE_FSIZE_MB")
    """``RLIMIT_FSIZE`` of a listener: the largest file it may write, MiB."""
    require_landlock: bool = Field(False, validation_alias="HM_OFFICE_REQUIRE_LANDLOCK")
    """Refuse to start a listener on a kernel without Landlock (its conversions then fail
    ``OFFICE_UNAVAILABLE``) instead of starting it, with a warning, without the filesystem view
    (:func:`hypermedia.engines.documents.office.listener_view`)."""
    read_paths: str = Field("", validation_alias="HM_OFFICE_READ_PATHS")
    """More paths (``:``-separated, absolute) a listener may read besides
    :func:`hypermedia.engines.documents.office.listener_view`'s, e.g. a font directory outside ``/usr``."""

    @field_validator("read_paths")
    @classmethod
    def _absolute_read_paths(cls, value: str) -> str:
        for path in filter(None, value.split(":")):
            if not path.startswith("/"):
                raise ValueError(f"{path!r} is not an absolute path")
        return value


class ReaperSettings(_Settings):
    interval_seconds: float = Field(5.0, gt=0, validation_alias="HM_REAPER_INTERVAL_SECONDS")
    requeue_stale_seconds: float = Field(60.0, gt=0, validation_alias="HM_REAPER_REQUEUE_STALE_SECONDS")
    """A job `queued` this long without being claimed is published again."""
    dead_worker_seconds: float = Field(120.0, gt=0, validation_alias="HM_REAPER_DEAD_WORKER_SECONDS")
    settle_grace_seconds: float = Field(60.0, gt=0, validation_alias="HM_REAPER_SETTLE_GRACE_SECONDS")
    """How long after a job ended a hold nobody settled waits before the reaper settles it."""
    work_dirs: str = Field("", validation_alias="HM_REAPER_WORK_DIRS")
    """Worker work directories on the reaper's machine (``:``-separated) whose orphaned job
    directories it removes; empty: none (each worker sweeps its own at start)."""
    orphan_dir_seconds: float = Field(300.0, gt=0, validation_alias="HM_REAPER_ORPHAN_DIR_SECONDS")
    """Age after which a job directory of a job that is not running is removed."""
    webhook_poll_seconds: float = Field(1.0, gt=0, validation_alias="HM_WEBHOOK_POLL_SECONDS")
    """How often the webhook dispatcher looks for due deliveries."""
    webhook_max_attempts: int = Field(8, ge=1, le=50, validation_alias="HM_WEBHOOK_MAX_ATTEMPTS")
    webhook_base_delay_seconds: float = Field(5.0, gt=0, validation_alias="HM_WEBHOOK_BASE_DELAY_SECONDS")
    """First retry delay of a webhook; doubles per attempt, capped at an hour."""
    webhook_allow_private: bool = Field(False, validation_alias="HM_WEBHOOK_ALLOW_PRIVATE")
    """Send webhooks to hosts that resolve to non-public addresses (loopback, private, link-local,
    cloud metadata). Off by default: such a delivery fails at once (``BlockedAddress``)."""


S = TypeVar("S", bound=BaseSettings)


def load(cls: type[S]) -> S:
    """Read ``cls`` from the environment.

    Raises:
        ConfigError: listing every invalid or missing variable, without any value.
    """
    try:
        return cls()
    except ValidationError as exc:
        problems = []
        for err in exc.errors(include_input=False, include_url=False):
            where = ".".join(str(p) for p in err["loc"]) or cls.__name__
            problems.append(f"{where.upper()}: {err['msg']}")
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(problems)) from None
