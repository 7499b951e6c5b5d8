"""A malformed ``HM_DATABASE_URL`` stops ``hypermedia up`` and ``hypermedia migrate`` at once with
exit 78 and the variable's name, never its value (it holds a password); URLs libpq and asyncpg
take pass (:func:`hypermedia.infra.db.check_url`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hypermedia.infra import db

HYPERMEDIA = str(Path(sys.executable).with_name("hypermedia"))


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://user:pw@db.example:5432/hypermedia",
        "postgres://user:pw@db.example/hypermedia",
        "postgresql://user:pw@h1:5432,h2:5433/hypermedia?target_session_attrs=read-write",
        "postgresql://user:pw@[::1]:5432/hypermedia",
        "postgresql:///hypermedia?host=/var/run/postgresql",
        "postgresql://user@db.example",
    ],
)
def test_urls_postgres_takes_pass(url: str) -> None:
    db.check_url("HM_DATABASE_URL", url)


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("postgres://user:s3cretpw@db.example:notaport/hypermedia", "port is not a number"),
        ("postgres://user:s3cretpw@h1:5432,h2:99999/hypermedia", "port is not a number"),
        ("mysql://user:s3cretpw@db.example/hypermedia", "not a PostgreSQL URL"),
        ("db.example:5432 user=x password=s3cretpw", "not a PostgreSQL URL"),
    ],
)
@pytest.mark.parametrize("command", [["up", "--services", "gateway"], ["migrate"]])
def test_a_malformed_url_exits_78_naming_the_variable_not_its_value(
    url: str, reason: str, command: list[str], tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HM_")} | {"HM_DATABASE_URL": url}
    done = subprocess.run(
        [HYPERMEDIA, *command], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 78, done.stderr
    assert "HM_DATABASE_URL: " in done.stderr and reason in done.stderr
    assert "s3cretpw" not in done.stderr + done.stdout
    assert "Traceback" not in done.stderr
    assert not (tmp_path / ".hypermedia").exists()  # nothing started
