"""Settings: every variable named ``HM_*``, the old names still read (with a warning), defaults
given to ``load`` beneath the environment, errors naming variables and never values."""

from __future__ import annotations

import logging

import asyncpg
import pytest

from hypermedia.core import config
from hypermedia.core.config import ConfigError, InfraSettings
from hypermedia.infra import db
from hypermedia.worker.settings import WorkerSettings
from services.gateway.settings import GatewaySettings


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in [*config.DEPRECATED_NAMES, *config.DEPRECATED_NAMES.values(), "HM_WORKER_SLOTS"]:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    monkeypatch.setattr(config, "_warned", set())
    return monkeypatch


def test_the_new_name_is_read(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("HM_DATABASE_URL", "postgresql://new@db/hm")
    clean_env.setenv("HM_GATEWAY_HTTP_PORT", "8181")
    assert config.load(InfraSettings).database_url.get_secret_value() == "postgresql://new@db/hm"
    assert config.load(GatewaySettings).http_port == 8181


def test_an_old_name_is_still_read_with_a_warning(
    clean_env: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    clean_env.setenv("DATABASE_URL", "postgresql://old@db/hm")
    clean_env.setenv("NATS_URL", "nats://old:4222")
    with caplog.at_level(logging.WARNING, logger="hypermedia.core.config"):
        infra = config.load(InfraSettings)
    assert infra.database_url.get_secret_value() == "postgresql://old@db/hm"
    assert infra.nats_url == "nats://old:4222"
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert "DATABASE_URL is deprecated" in warned and "HM_DATABASE_URL" in warned
    assert "NATS_URL is deprecated" in warned and "HM_NATS_URL" in warned


def test_the_new_name_wins_over_the_old(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("HM_DATABASE_URL", "postgresql://new@db/hm")
    clean_env.setenv("DATABASE_URL", "postgresql://old@db/hm")
    clean_env.setenv("HYPERMEDIA_GRPC_PORT", "1")
    clean_env.setenv("HM_GATEWAY_GRPC_PORT", "2")
    assert config.load(InfraSettings).database_url.get_secret_value() == "postgresql://new@db/hm"
    assert config.load(GatewaySettings).grpc_port == 2


def test_defaults_given_to_load_stand_beneath_the_environment(clean_env: pytest.MonkeyPatch) -> None:
    assert config.load(WorkerSettings, HM_WORKER_SLOTS=2).slots == 2
    clean_env.setenv("HM_WORKER_SLOTS", "3")
    assert config.load(WorkerSettings, HM_WORKER_SLOTS=2).slots == 3


def test_a_missing_or_bad_variable_is_named_without_its_value(clean_env: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="HM_DATABASE_URL"):
        config.load(InfraSettings)
    clean_env.setenv("HM_DATABASE_URL", "postgresql://u:pw@db/hm")
    clean_env.setenv("HM_GATEWAY_HTTP_PORT", "secret-99999")
    with pytest.raises(ConfigError) as raised:
        config.load(GatewaySettings)
    assert "HM_GATEWAY_HTTP_PORT" in str(raised.value) and "secret-99999" not in str(raised.value)


def test_the_warning_comes_once_from_the_class_that_reads_the_name_and_not_when_the_new_is_set(
    clean_env: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    clean_env.setenv("HM_DATABASE_URL", "postgresql://new@db/hm")
    clean_env.setenv("hypermedia_http_port", "18080")  # names are read case-insensitively
    with caplog.at_level(logging.WARNING, logger="hypermedia.core.config"):
        config.load(InfraSettings)  # does not read the gateway's port: no warning
        assert not caplog.records
        assert config.load(GatewaySettings).http_port == 18080
        config.load(GatewaySettings)  # once per process
    [record] = caplog.records
    assert "HYPERMEDIA_HTTP_PORT is deprecated" in record.getMessage()
    caplog.clear()
    clean_env.setenv("DATABASE_URL", "postgresql://old@db/hm")  # the new name is set: it is not read
    with caplog.at_level(logging.WARNING, logger="hypermedia.core.config"):
        config.load(InfraSettings)
    assert not caplog.records
    assert config.deprecated_in_use({"DATABASE_URL": "x"}) == [("DATABASE_URL", "HM_DATABASE_URL")]
    assert config.deprecated_in_use({"DATABASE_URL": "x", "hm_database_url": "y"}) == []


def test_lookup_reads_what_the_settings_read() -> None:
    assert config.lookup({"HM_NATS_URL": "nats://new"}, "HM_NATS_URL") == "nats://new"
    assert config.lookup({"NATS_URL": "nats://old"}, "HM_NATS_URL") == "nats://old"
    assert (
        config.lookup({"nats_url": "nats://old", "hm_nats_url": "nats://new"}, "HM_NATS_URL") == "nats://new"
    )
    assert config.lookup({}, "HM_GATEWAY_HTTP_PORT", "8080") == "8080"


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://u:pw@db1:5432,db2:5433/hm",  # libpq's multi-host form, which asyncpg takes
        "postgresql://u@[::1]:5432/hm",
        "postgres:///hm?host=/var/run/postgresql",
        "postgresql://u@db/hm?sslmode=verify-full",
    ],
)
def test_postgres_urls_libpq_takes_pass(url: str) -> None:
    assert config.postgres_url_problem(url) is None


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("postgresql://u@db:99999/hm", "a host has a port that is not a number from 1 to 65535"),
        (
            "postgresql://u@db:５４３２/hm",
            "a host has a port that is not a number from 1 to 65535",
        ),  # full-width
        ("postgresql://u@db1,:5432/hm", "a host is empty"),
        ("postgresql://u@db/hm?sslmode=bogus", "sslmode must be one of disable, allow, prefer, require"),
        ("mysql://u@db/hm", "must be a postgresql:// (or postgres://) URL"),
        ("postgresql:///hm", "names no host"),
    ],
)
def test_a_postgres_url_of_the_wrong_form_says_what_without_the_value(url: str, said: str) -> None:
    problem = config.postgres_url_problem(url)
    assert problem is not None and problem.startswith(said) and "u@" not in problem


@pytest.mark.parametrize(
    ("name", "value", "said"),
    [
        ("HM_NATS_URL", "nats://n:99999", "a server URL has a port that is not a number from 1 to 65535"),
        ("HM_NATS_URL", "nats://user:S3cretPW@host\uff1a4222", "a server URL is malformed"),
        ("HM_STORAGE_ADDR", "storage:５００６２", "must be host:port with a port from 1 to 65535"),
        ("HM_CREDITS_ADDR", "credits:0", "must be host:port with a port from 1 to 65535"),
    ],
)
def test_ports_are_ascii_numbers_from_1_to_65535(
    clean_env: pytest.MonkeyPatch, name: str, value: str, said: str
) -> None:
    clean_env.setenv("HM_DATABASE_URL", "postgresql://u@db/hm")
    clean_env.setenv(name, value)
    with pytest.raises(config.ConfigError, match=said) as raised:
        config.load(InfraSettings)
    assert "S3cret" not in str(raised.value)


def test_behind_a_transaction_pooler_the_session_url_is_required_and_used(
    clean_env: pytest.MonkeyPatch,
) -> None:
    """ADR 0076: HM_DATABASE_POOLER=transaction without HM_DATABASE_SESSION_URL would put LISTEN
    and the scheduler's session lock through the pooler; it is refused at start, naming the fix,
    never showing a URL's password."""
    for name in ("HM_DATABASE_SESSION_URL", "HM_DATABASE_POOLER"):
        clean_env.delenv(name, raising=False)
    clean_env.setenv("HM_DATABASE_URL", "postgresql://u:pooledpw@pgbouncer:6432/hm")
    direct = config.load(InfraSettings)
    assert (direct.database_pooler, direct.session_url) == (
        "none",
        "postgresql://u:pooledpw@pgbouncer:6432/hm",
    )
    clean_env.setenv("HM_DATABASE_SESSION_URL", "")  # empty is unset, as hypermedia up reads it
    assert config.load(InfraSettings).database_session_url is None
    clean_env.delenv("HM_DATABASE_SESSION_URL")
    clean_env.setenv("HM_DATABASE_POOLER", "transaction")
    with pytest.raises(ConfigError, match="needs HM_DATABASE_SESSION_URL") as raised:
        config.load(InfraSettings)
    assert "pooledpw" not in str(raised.value)
    clean_env.setenv("HM_DATABASE_SESSION_URL", "mysql://u:sessionpw@primary/hm")
    with pytest.raises(ConfigError, match="HM_DATABASE_SESSION_URL") as raised:
        config.load(InfraSettings)
    assert "sessionpw" not in str(raised.value)
    clean_env.setenv("HM_DATABASE_SESSION_URL", "postgresql://u:sessionpw@primary:5432/hm")
    pooled = config.load(InfraSettings)
    assert pooled.session_url == "postgresql://u:sessionpw@primary:5432/hm"
    clean_env.setenv("HM_DATABASE_POOLER", "statement")
    with pytest.raises(ConfigError, match="HM_DATABASE_POOLER"):
        config.load(InfraSettings)


def test_a_prepared_statement_refused_is_named_as_a_pooler_setting() -> None:
    """What a pool keeping statements gets through a transaction-pooling PgBouncer, however deep
    the exception that carries it (a worker loop's crash wraps it)."""
    missing = asyncpg.exceptions.InvalidSQLStatementNameError(
        'prepared statement "__asyncpg_stmt_a__" does not exist'
    )
    twice = asyncpg.exceptions.DuplicatePreparedStatementError(
        'prepared statement "__asyncpg_stmt_1__" already exists'
    )
    assert db.pooler_mismatch(missing) and db.pooler_mismatch(twice)
    try:
        try:
            raise missing
        except asyncpg.PostgresError as exc:
            raise RuntimeError("the worker loop") from exc
    except RuntimeError as wrapped:
        assert db.pooler_mismatch(wrapped)
    assert not db.pooler_mismatch(asyncpg.exceptions.UniqueViolationError("duplicate key value"))
    assert not db.pooler_mismatch(ValueError("prepared statement"))  # not Postgres' word
    assert "HM_DATABASE_POOLER=transaction" in db.POOLER_HINT
