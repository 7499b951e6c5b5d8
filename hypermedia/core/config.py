"""Typed, validated configuration, read from the environment: the base every component's settings
class extends, the connections every service shares (:class:`InfraSettings`), and :func:`load`.

Each component keeps its own frozen settings class beside its code (pydantic-settings: defaults →
environment → validation, with every error reported at once and each naming its variable): the
gateway's in ``services/gateway/settings.py``, a worker's in :mod:`hypermedia.worker.settings`, the
HTTP limits in :mod:`hypermedia.infra.httplimits`, and so on. Secrets are ``SecretStr`` and error
messages never include input values, so a bad ``HM_DATABASE_URL`` with a password in it is never
printed. Every variable starts with ``HM_``; the older names in :data:`DEPRECATED_NAMES` are still
read for one release, with a warning. The names are a stable contract, documented in
``docs/operations.md``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from typing import Any, Final, Literal, TypeVar, get_args
from urllib.parse import parse_qs, urlsplit

from pydantic import AliasChoices, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

log = logging.getLogger(__name__)

QueueName = Literal["images", "documents", "ocr", "media", "bulk", "sched"]
QUEUES: tuple[QueueName, ...] = ("images", "documents", "ocr", "media", "bulk", "sched")
RouteName = Literal[
    "images",
    "documents",
    "ocr",
    "media",
    "bulk.images",
    "bulk.documents",
    "bulk.ocr",
    "bulk.media",
    "sched.images",
    "sched.documents",
    "sched.ocr",
    "sched.media",
]
"""What a worker lane consumes and a job row's ``queue`` holds: an engine's queue, the ``bulk``
queue's lane of that engine (``bulk.images``: bulk jobs run by the image pipeline; ADR 0057), or
the ``sched`` queue's (``sched.images``: the jobs of schedules' runs, taken only by the scheduler
consumer beside the engine's ordinary slots; ADR 0073)."""
LaneName = Literal[
    "images", "documents", "ocr", "media", "bulk.images", "bulk.documents", "bulk.ocr", "bulk.media"
]
"""What a worker lane may be configured to consume (``HM_WORKER_QUEUE``, a pool's queues): every
route but the sched lanes, which only the scheduler consumers beside them take."""
ROUTES: tuple[RouteName, ...] = get_args(RouteName)

DEPRECATED_NAMES: Final = {
    "DATABASE_URL": "HM_DATABASE_URL",
    "NATS_URL": "HM_NATS_URL",
    "CLAMD_URL": "HM_CLAMD_URL",
    "HYPERMEDIA_HTTP_HOST": "HM_GATEWAY_HTTP_HOST",
    "HYPERMEDIA_HTTP_PORT": "HM_GATEWAY_HTTP_PORT",
    "HYPERMEDIA_GRPC_HOST": "HM_GATEWAY_GRPC_HOST",
    "HYPERMEDIA_GRPC_PORT": "HM_GATEWAY_GRPC_PORT",
}
"""Variables renamed to the ``HM_`` prefix (issue 16): old name → new name. The old one is read when
the new one is not set, for one release, and :func:`load` logs a warning naming both."""


class ConfigError(Exception):
    """Configuration is invalid. ``str()`` lists every problem as ``VARIABLE: reason``, no values."""

    exit_code = 78  # EX_CONFIG from sysexits.h


def env(name: str) -> AliasChoices | str:
    """The ``validation_alias`` of a field read from the variable ``name``, and from its deprecated
    old name too when :data:`DEPRECATED_NAMES` has one (the new name wins)."""
    old = [o for o, new in DEPRECATED_NAMES.items() if new == name]
    return AliasChoices(name, *old) if old else name


class ComponentSettings(BaseSettings):
    """Base of every component's settings: frozen, unknown variables ignored, names
    case-insensitive. Keyword arguments given to :func:`load` are *defaults*: the environment
    still overrides them (a worker service's own slot count, say)."""

    model_config = SettingsConfigDict(frozen=True, extra="ignore", case_sensitive=False)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return env_settings, dotenv_settings, init_settings, file_secret_settings


class InfraSettings(ComponentSettings):
    """Connections every service needs."""

    database_url: SecretStr = Field(validation_alias=env("HM_DATABASE_URL"))
    """asyncpg DSN of the system of record, e.g. ``postgresql://user:pw@host:5432/hypermedia``."""
    database_session_url: SecretStr | None = Field(None, validation_alias="HM_DATABASE_SESSION_URL")
    """DSN of the connections that keep session state: the ``LISTEN`` connections (job events,
    the outbox relays' wake-ups) and the scheduler's leader lock. Give it the primary itself when
    ``HM_DATABASE_URL`` is a PgBouncer in transaction pooling (ADR 0076); unset: ``HM_DATABASE_URL``."""
    database_pooler: Literal["none", "transaction"] = Field("none", validation_alias="HM_DATABASE_POOLER")
    """``transaction`` when ``HM_DATABASE_URL`` is a connection pooler in transaction mode
    (PgBouncer ``pool_mode = transaction``): the pools then keep no prepared statements
    (asyncpg's ``statement_cache_size=0``; ADR 0076)."""
    nats_url: str = Field("nats://127.0.0.1:4222", validation_alias=env("HM_NATS_URL"))
    """NATS server with JetStream."""
    stream_prefix: str = Field("HM", validation_alias="HM_STREAM_PREFIX", pattern=r"^[A-Z][A-Z0-9_]{0,15}$")
    """Prefix of JetStream stream and subject names, so two platforms can share one NATS server."""
    stream_replicas: int = Field(1, ge=1, le=5, validation_alias="HM_STREAM_REPLICAS")
    """Replicas of each queue stream: 1 for one server (the embedded one), 3 for a cluster. More
    than 1 needs NATS 2.12.3 or later (:data:`hypermedia.jobs.queues.MIN_CLUSTER_VERSION`)."""
    stream_storage: Literal["file", "memory"] = Field("file", validation_alias="HM_STREAM_STORAGE")
    """Where the streams keep their messages: ``file`` (survives a restart) or ``memory``."""
    stream_placement: str = Field("", validation_alias="HM_STREAM_PLACEMENT")
    """Where a cluster places the streams: ``cluster`` and/or ``tag:…`` entries, comma-separated
    (``cluster=east,tag=ssd``); empty: anywhere."""
    credits_addr: str = Field("127.0.0.1:50061", validation_alias="HM_CREDITS_ADDR")
    """host:port of the credits service."""
    storage_addr: str = Field("127.0.0.1:50062", validation_alias="HM_STORAGE_ADDR")
    """host:port of the storage service's gRPC API."""
    log_level: str = Field("INFO", validation_alias="HM_LOG_LEVEL")

    @field_validator("database_session_url", mode="before")
    @classmethod
    def _unset_when_empty(cls, value: object) -> object:
        return None if value == "" else value  # as ``hypermedia up`` reads an empty one

    @field_validator("database_url", "database_session_url")
    @classmethod
    def _postgres_url(cls, value: SecretStr | None) -> SecretStr | None:
        problem = None if value is None else postgres_url_problem(value.get_secret_value())
        if problem:
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _session_url_behind_a_pooler(self) -> InfraSettings:
        if self.database_pooler == "transaction" and self.database_session_url is None:
            raise ValueError(
                "HM_DATABASE_POOLER=transaction needs HM_DATABASE_SESSION_URL: the primary itself, "
                "for LISTEN, the scheduler's leader lock and migrations (docs/operations.md, "
                "'Postgres behind PgBouncer')"
            )
        return self

    @property
    def session_url(self) -> str:
        """The DSN for session-state connections: ``HM_DATABASE_SESSION_URL``, else ``HM_DATABASE_URL``."""
        return (self.database_session_url or self.database_url).get_secret_value()

    @property
    def separate_session_url(self) -> str | None:
        """``HM_DATABASE_SESSION_URL`` when it is set, else None: where a listener needs a
        connection of its own because the pool's may go through a transaction pooler (ADR 0076)."""
        return self.database_session_url.get_secret_value() if self.database_session_url else None

    @field_validator("nats_url")
    @classmethod
    def _nats_url(cls, value: str) -> str:
        for server in value.split(","):
            try:
                parts = urlsplit(server.strip())
            except ValueError:  # its message quotes the URL, password included
                raise ValueError("a server URL is malformed (its host or brackets)") from None
            if parts.scheme not in NATS_SCHEMES or not parts.hostname:
                raise ValueError(
                    "must be a comma list of nats://host:port (or tls://, ws://, wss://) server URLs"
                )
            if (problem := _port_problem(parts.netloc.rpartition("@")[2], "a server URL")) is not None:
                raise ValueError(problem)
        return value

    @field_validator("credits_addr", "storage_addr")
    @classmethod
    def _host_port(cls, value: str) -> str:
        host, sep, port = value.rpartition(":")
        if not sep or not host or not _is_port(port):
            raise ValueError("must be host:port with a port from 1 to 65535")
        return value


NATS_SCHEMES: Final = frozenset({"nats", "tls", "ws", "wss"})
"""URL schemes nats-py connects with."""


SSL_MODES: Final = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
"""libpq's ``sslmode`` values (PostgreSQL documentation, "SSL Support"), the ones asyncpg takes."""


def postgres_url_problem(url: str) -> str | None:
    """What is wrong with the form of a Postgres URL (libpq's: ``postgres[ql]://user:pw@host:port/db``,
    several ``host:port`` separated by commas, or a socket directory as ``?host=/path``), without
    its value: None when the form is right."""
    try:
        parts = urlsplit(url)
    except ValueError:  # an unbalanced [ of an IPv6 address
        return "must be a postgresql:// URL; its host is malformed"
    if parts.scheme not in ("postgres", "postgresql"):
        return "must be a postgresql:// (or postgres://) URL"
    hosts = parts.netloc.rpartition("@")[2]
    for host in hosts.split(",") if hosts else ():
        if (problem := _port_problem(host, "a host")) is not None:
            return problem
    query = parse_qs(parts.query)
    if not hosts and not query.get("host"):
        return "names no host: give host[:port] after the @, or a socket directory as ?host=/path"
    if any(mode not in SSL_MODES for mode in query.get("sslmode", [])):
        return f"sslmode must be one of {', '.join(SSL_MODES)}"
    return None


def _port_problem(host_port: str, what: str) -> str | None:
    """What is wrong with one ``host[:port]`` (``[v6]:port`` too): an empty host, a port that is not
    1-65535 in ASCII digits."""
    if host_port.startswith("["):
        host, _, rest = host_port[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else None if rest else ""
    else:
        host, _, port = host_port.partition(":")
    if not host:
        return f"{what} is empty"
    if port is None or (port and not _is_port(port)):
        return f"{what} has a port that is not a number from 1 to 65535"
    return None


def _is_port(text: str) -> bool:
    return text.isascii() and text.isdigit() and 0 < int(text) < 65536


S = TypeVar("S", bound=BaseSettings)


def load(cls: type[S], **defaults: Any) -> S:
    """Read ``cls`` from the environment; ``defaults`` (by variable name, e.g.
    ``HM_WORKER_SLOTS=2``) stand in for variables that are not set. Logs a warning for each
    deprecated variable ``cls`` reads because only its old name is set (:data:`DEPRECATED_NAMES`),
    once per process.

    Raises:
        ConfigError: listing every invalid or missing variable, without any value.
    """
    try:
        settings = cls(**defaults)
    except ValidationError as exc:
        problems = []
        for err in exc.errors(include_input=False, include_url=False):
            where = ".".join(str(p) for p in err["loc"]) or cls.__name__
            problems.append(f"{where.upper()}: {err['msg']}")
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(problems)) from None
    for old, new in deprecated_in_use(os.environ, _aliases(cls)):
        if old not in _warned:
            _warned.add(old)
            log.warning("%s is deprecated and will stop being read in the next release: set %s", old, new)
    return settings


_warned: set[str] = set()
"""Deprecated names this process has warned about already (one warning each)."""


def deprecated_in_use(
    environ: Mapping[str, str], names: Iterable[str] | None = None
) -> list[tuple[str, str]]:
    """``[(old, new)]`` for each deprecated variable in ``environ`` that is read because its new name
    is not set (names compared case-insensitively, as the settings read them); only those among
    ``names`` (new names) when given."""
    present = {key.upper() for key in environ}
    wanted = None if names is None else {name.upper() for name in names}
    return [
        (old, new)
        for old, new in DEPRECATED_NAMES.items()
        if old in present and new not in present and (wanted is None or new in wanted)
    ]


def lookup(environ: Mapping[str, str], name: str, default: str = "") -> str:
    """The value the settings would read for the variable ``name`` from ``environ``: ``name``, else
    its deprecated old name (:data:`DEPRECATED_NAMES`), compared case-insensitively as the settings
    compare them; ``default`` when neither is set."""
    by_name = {key.upper(): value for key, value in environ.items()}
    for candidate in (name, *(old for old, new in DEPRECATED_NAMES.items() if new == name)):
        if candidate.upper() in by_name:
            return by_name[candidate.upper()]
    return default


def _aliases(cls: type[BaseSettings]) -> set[str]:
    """The variable names the fields of ``cls`` read (every choice of an ``AliasChoices``)."""
    names: set[str] = set()
    for field in cls.model_fields.values():
        alias = field.validation_alias
        if isinstance(alias, str):
            names.add(alias)
        elif isinstance(alias, AliasChoices):
            names.update(choice for choice in alias.choices if isinstance(choice, str))
    return names
