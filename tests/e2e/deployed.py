"""The infrastructure of a deployment, started for a test platform: an S3 endpoint of its own
(``moto_server``, moto's server mode: a separate process that speaks S3's REST API, presigned URLs
and POST policies included) and PgBouncer in transaction pooling in front of the session's
Postgres server (Debian's ``pgbouncer``).

:func:`deployed_settings` gives both as one platform's environment. The session's shared
platform runs on it when ``HM_TEST_PLATFORM=deployed`` (``make test-deployed``: every e2e module
that uses the shared platform, through PgBouncer and on S3; issue 24 items 2 and 3).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import boto3
import httpx

from hypermedia.devtools.embedded import EmbeddedPgBouncer, free_port

BUCKET = "hm-e2e"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
CORS_RULE = {
    "AllowedOrigins": ["*"],
    "AllowedMethods": ["GET", "HEAD", "PUT"],
    "AllowedHeaders": ["Range", "Content-Type"],
    "ExposeHeaders": ["Content-Length", "Content-Range", "Accept-Ranges", "ETag"],
    "MaxAgeSeconds": 3600,
}
"""The bucket CORS rule of docs/operations.md, as a deployment sets it."""


def s3_client(endpoint: str) -> Any:
    """boto3's S3 client of ``endpoint`` with moto's credentials."""
    return boto3.client(
        "s3",
        region_name="us-east-1",
        endpoint_url=endpoint,
        aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
    )


def _answers(endpoint: str) -> bool:
    try:
        httpx.get(endpoint, timeout=1)
    except httpx.HTTPError:
        return False
    return True


@contextlib.contextmanager
def moto_endpoint(log_dir: Path) -> Iterator[str]:
    """``moto_server`` in a process of its own on a free loopback port, with :data:`BUCKET` and its
    CORS rule; yields the endpoint URL, stops the server at the end. Its log is ``moto.log`` in
    ``log_dir``. AssertionError when it does not answer within 30 s."""
    from tests.e2e.conftest import wait_for

    port = free_port()
    server = shutil.which("moto_server", path=str(Path(sys.executable).parent))
    assert server is not None, "moto_server is installed with moto (the dev group)"
    with (log_dir / "moto.log").open("ab") as log:
        process = subprocess.Popen(
            [server, "-H", "127.0.0.1", "-p", str(port)],
            stdout=log,
            stderr=log,
            env={**os.environ, **CREDENTIALS},
        )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        wait_for("moto_server", lambda: _answers(endpoint), 30)
        s3 = s3_client(endpoint)
        s3.create_bucket(Bucket=BUCKET)
        s3.put_bucket_cors(Bucket=BUCKET, CORSConfiguration={"CORSRules": [CORS_RULE]})
        yield endpoint
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextlib.contextmanager
def pgbouncer_for(data_dir: Path, database_url: str) -> Iterator[EmbeddedPgBouncer]:
    """PgBouncer (transaction pooling) in front of ``database_url``'s server, stopped at the end.
    The server must let ``postgres`` in without a password from this machine (the embedded one,
    or a local server with trust authentication): ValueError for a DSN with another user or a
    password."""
    parts = urlsplit(database_url)
    if (parts.username or "postgres") != "postgres" or parts.password:
        raise ValueError("the deployed test platform needs a DSN of user postgres without a password")
    query = parse_qs(parts.query)
    host = parts.hostname or query["host"][0]
    port = parts.port or int(query.get("port", ["5432"])[0])
    pgbouncer = EmbeddedPgBouncer(data_dir, host, port).start()
    try:
        yield pgbouncer
    finally:
        pgbouncer.stop()


@contextlib.contextmanager
def deployed_settings(root: Path, database_url: str) -> Iterator[dict[str, str]]:
    """The environment of a platform on ``database_url``'s database through PgBouncer (its session
    work on the server itself, ADR 0076) and on the S3 backend against a moto endpoint."""
    root.mkdir(parents=True, exist_ok=True)
    with pgbouncer_for(root / "pgbouncer", database_url) as bouncer, moto_endpoint(root) as endpoint:
        yield {
            "HM_DATABASE_URL": bouncer.dsn(urlsplit(database_url).path.lstrip("/")),
            "HM_DATABASE_SESSION_URL": database_url,
            "HM_DATABASE_POOLER": "transaction",
            "HM_STORAGE_BACKEND": "s3",
            "HM_S3_BUCKET": BUCKET,
            "HM_S3_ENDPOINT_URL": endpoint,
            **CREDENTIALS,
        }
