"""Contract tests: the platform on the S3 backend end to end (issue 24 item 3). ``hypermedia up``
with ``HM_STORAGE_BACKEND=s3`` against a separate S3 endpoint process, moto's server mode
(``moto_server``: a stand-in that speaks S3's REST API, presigned URLs and POST policies
included). The real thing is opt-in: set ``HM_TEST_S3_BUCKET`` (and ``HM_TEST_S3_ENDPOINT_URL``
for an S3-compatible store other than AWS) with credentials in boto3's default chain, and the
same tests run against that bucket, which must already carry the CORS rule
:data:`tests.e2e.deployed.CORS_RULE`.

Uploads go to the bucket through storage; workers download originals by presigned GET and upload
outputs by presigned POST policy with their SHA-256, straight to the endpoint; the API's output
links are the endpoint's presigned URLs, which answer byte ranges (206) and, with the bucket CORS
rule docs/operations.md gives, a player's cross-origin preflight; deleting an object deletes its
keys from the bucket."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest

from tests.e2e.conftest import RunningPlatform, isolated_platform, upload, wait_job
from tests.e2e.deployed import BUCKET, CREDENTIALS, moto_endpoint, s3_client
from tests.helpers.pdf import text_pages_pdf

PHOTO = Path(__file__).resolve().parents[1] / "data" / "exif-orientation" / "Landscape_5.jpg"
REAL_BUCKET = os.environ.get("HM_TEST_S3_BUCKET", "")
"""Opt-in: a real bucket to run against instead of moto."""


@pytest.fixture(scope="module")
def s3_endpoint(tmp_root: Path) -> Iterator[str]:
    """``moto_server`` in a process of its own (:func:`deployed.moto_endpoint`), with the bucket
    and its CORS rule; or, opted in, the real endpoint (``HM_TEST_S3_ENDPOINT_URL``, AWS's when
    empty)."""
    if REAL_BUCKET:
        yield os.environ.get("HM_TEST_S3_ENDPOINT_URL", "")
        return
    with moto_endpoint(tmp_root) as endpoint:
        yield endpoint


def _client(endpoint: str) -> Any:
    """boto3's S3 client of the bucket: moto's credentials, or the default chain when opted in."""
    if REAL_BUCKET:
        return boto3.client("s3", endpoint_url=endpoint or None)
    return s3_client(endpoint)


@pytest.fixture(scope="module")
def on_s3(tmp_root: Path, database_url: str, nats_url: str, s3_endpoint: str) -> Iterator[RunningPlatform]:
    with isolated_platform(
        tmp_root,
        database_url,
        nats_url,
        "s3",
        services="credits,storage,gateway,imageworker,docworker,reaper",
        HM_STORAGE_BACKEND="s3",
        HM_S3_BUCKET=REAL_BUCKET or BUCKET,
        HM_S3_ENDPOINT_URL=s3_endpoint,
        **({} if REAL_BUCKET else CREDENTIALS),
    ) as running:
        yield running


@pytest.fixture(scope="module")
def account(on_s3: RunningPlatform) -> dict[str, Any]:
    return on_s3.admin("create-account", "--credits", "100")


def _keys(endpoint: str) -> set[str]:
    listed = _client(endpoint).list_objects_v2(Bucket=REAL_BUCKET or BUCKET)
    return {o["Key"] for o in listed.get("Contents", [])}


def test_jobs_read_and_write_the_bucket_through_presigned_urls(
    on_s3: RunningPlatform, account: dict[str, Any], s3_endpoint: str
) -> None:
    with on_s3.client(account) as client:
        obj = upload(client, PHOTO)
        assert any(key.startswith("originals/") for key in _keys(s3_endpoint))
        created = client.post(
            "/v1/hypermedia/process",
            json={"object_id": obj["object_id"], "operations": ["thumbnail", "compress"]},
        )
        assert created.status_code == 202, created.text
        jobs = [wait_job(client, job_id) for job_id in created.json()["job_ids"]]
    assert [j["status"] for j in jobs] == ["completed", "completed"], jobs
    outputs = [o for j in jobs for o in j["outputs"]]
    keys = _keys(s3_endpoint)
    for output in outputs:
        assert output["key"] in keys
        assert output["url"].startswith(s3_endpoint or "https://"), output["url"]
        body = httpx.get(output["url"], timeout=30)
        assert body.status_code == 200 and len(body.content) == output["size_bytes"]
    thumbnail = next(o for o in outputs if o["output_type"] == "thumbnail")
    assert httpx.get(thumbnail["url"], timeout=30).content[:4] == b"RIFF"


def test_a_multi_page_preview_uploads_every_page(on_s3: RunningPlatform, account: dict[str, Any]) -> None:
    with on_s3.client(account) as client:
        obj = client.post(
            "/v1/objects",
            files={"file": ("three.pdf", text_pages_pdf(["One", "Two", "Three"]), "application/pdf")},
        ).json()
        created = client.post(
            "/v1/hypermedia/process",
            json={
                "object_id": obj["object_id"],
                "operations": [{"name": "pdf_preview", "params": {"pages": "1-3"}}],
            },
        )
        assert created.status_code == 202, created.text
        job = wait_job(client, created.json()["job_ids"][0])
    assert job["status"] == "completed", job
    assert sorted(o["output_type"] for o in job["outputs"]) == ["preview_p1", "preview_p2", "preview_p3"]
    for output in job["outputs"]:
        assert httpx.get(output["url"], timeout=30).content[:4] == b"RIFF"


def test_output_links_answer_ranges_and_a_players_preflight(
    on_s3: RunningPlatform, account: dict[str, Any], s3_endpoint: str
) -> None:
    with on_s3.client(account) as client:
        obj = upload(client, PHOTO)
        job_id = client.post(
            "/v1/hypermedia/process", json={"object_id": obj["object_id"], "operations": ["compress"]}
        ).json()["job_ids"][0]
        output = wait_job(client, job_id)["outputs"][0]
        # The API's stable link redirects to a fresh presigned URL of the endpoint.
        link = client.get(output["link"], follow_redirects=False)
        assert link.status_code == 307 and link.headers["location"].startswith(s3_endpoint or "https://")
    whole = httpx.get(output["url"], timeout=30).content
    ranged = httpx.get(output["url"], headers={"Range": "bytes=100-199"}, timeout=30)
    assert ranged.status_code == 206 and ranged.content == whole[100:200]
    assert ranged.headers["content-range"] == f"bytes 100-199/{len(whole)}"
    preflight = httpx.options(
        output["url"],
        headers={
            "Origin": "https://player.example",
            "Access-Control-Request-Method": "GET",
            "Access-Control-Request-Headers": "range",
        },
        timeout=30,
    )
    assert preflight.status_code == 200, preflight.text
    assert preflight.headers.get("access-control-allow-origin") in ("*", "https://player.example")
    # What the bucket's rule says, not an endpoint's default (moto answers any preflight of a
    # bucket without a rule, with every method and no max-age).
    methods = {m.strip() for m in preflight.headers.get("access-control-allow-methods", "").split(",")}
    assert methods == {"GET", "HEAD", "PUT"} and preflight.headers.get("access-control-max-age") == "3600"
    assert "range" in preflight.headers.get("access-control-allow-headers", "").lower()
    # A player reads Content-Range of a cross-origin range answer only when it is exposed.
    seen = httpx.get(
        output["url"], headers={"Origin": "https://player.example", "Range": "bytes=0-9"}, timeout=30
    )
    assert "content-range" in seen.headers.get("access-control-expose-headers", "").lower()


def test_deleting_an_object_deletes_its_keys_from_the_bucket(
    on_s3: RunningPlatform, account: dict[str, Any], s3_endpoint: str
) -> None:
    with on_s3.client(account) as client:
        obj = upload(client, PHOTO)
        job = wait_job(
            client,
            client.post(
                "/v1/hypermedia/process", json={"object_id": obj["object_id"], "operations": ["thumbnail"]}
            ).json()["job_ids"][0],
        )
        assert job["status"] == "completed", job
        keys = {o["key"] for o in job["outputs"]} | {k for k in _keys(s3_endpoint) if obj["object_id"] in k}
        assert keys <= _keys(s3_endpoint)
        assert any(k.startswith("derived/") for k in keys) and any(
            k.startswith("originals/") for k in keys
        ), keys
        assert client.delete(f"/v1/objects/{obj['object_id']}").status_code == 200
    deadline = time.monotonic() + 30
    while keys & _keys(s3_endpoint):
        assert time.monotonic() < deadline, keys & _keys(s3_endpoint)
        time.sleep(0.2)
