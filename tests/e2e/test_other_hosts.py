"""Workers on other hosts (issue 24, item 4): each worker unit in a network namespace of its own
and a filesystem root of its own, so that any hidden assumption of a shared disk or of loopback
fails here.

The platform (credits, storage, gateway, reaper; no workers) runs on this machine on its own
database. A bridge joins this machine (``10.231.N.1``) to four hosts (:mod:`tests.e2e.hosts`); each
runs one unit, ``python -m hypermedia.worker.unit ROLE`` (imageworker, docworker, ocrworker,
mediaworker), with:

* routes only to the bridge's subnet, on which this machine answers only for Postgres, NATS,
  storage's gRPC, storage's presigned URLs and credits (forwarded ports, as a Service would);
* a root with the system, the checkout and its Python read-only, its TLS files copied in, and an
  empty work directory: not the platform's state directory, object store or hand-off socket (its
  path is given, as ``hypermedia up`` gives it, and must be found missing and passed over);
* the sandbox at ``HM_SANDBOX_REQUIRE=full``, as a deployment runs it.

One job of each engine must then complete with the right result, and the probe run on a host
first shows that the isolation is real: the platform's loopback ports refused, its files absent.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, parse_qsl, urlencode, urlsplit, urlunsplit

import httpx
import psycopg
import pytest
import pyvips

from hypermedia.engines.ocr.metrics import cer
from tests.e2e.conftest import REPO, RunningPlatform, isolated_platform, upload
from tests.e2e.hosts import Forwarder, Host, Network
from tests.helpers.media import write_video
from tests.helpers.ocr import GOLD, PHOTOTEST

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="network namespaces and pivot_root need root (CI's run)"
)

ROLES = ("imageworker", "docworker", "ocrworker", "mediaworker")
WORK_DIR = "/var/lib/hypermedia/work"
TLS_DIR = "/var/lib/hypermedia/tls"
STATUS_PORT = 7070
PHOTO = Path(__file__).resolve().parents[1] / "data" / "exif-orientation" / "Landscape_1.jpg"
FOUR_PAGES = Path(__file__).resolve().parents[1] / "data" / "pdf" / "pdflatex-4-pages.pdf"

PROBE = """
import json, os, socket, sys
targets = json.loads(sys.argv[1])
reached = {}
for name, address in targets["ports"].items():
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=2).close()
        reached[name] = True
    except OSError:
        reached[name] = False
processes = [pid for pid in os.listdir("/proc") if pid.isdigit()]
present = {p: os.path.exists(p) for p in targets["paths"]}
print(json.dumps({"reached": reached, "present": present, "processes": len(processes), "pid": os.getpid()}))
"""


@dataclass
class Elsewhere:
    """The platform on this machine, the network, the forwarded addresses and the hosts' units."""

    platform: RunningPlatform
    network: Network
    forwarded: dict[str, str]
    units: dict[str, tuple[Host, subprocess.Popen[bytes], Path]]


def postgres_upstream(dsn: str) -> str:
    """Where ``dsn``'s server listens here: ``host:port``, or the Unix socket's path when the DSN
    names a socket directory (``?host=/dir``, the embedded server's)."""
    parts = urlsplit(dsn)
    query = parse_qs(parts.query)
    address = parts.netloc.rpartition("@")[2]
    port = parts.port or int(query.get("port", ["5432"])[0])
    if "host" in query and query["host"][0].startswith("/"):
        return f"{query['host'][0]}/.s.PGSQL.{port}"
    return address if parts.port else f"{address or '127.0.0.1'}:{port}"


def _rehost(dsn: str, address: str) -> str:
    """``dsn`` with its server at ``address`` (``host:port``) and no ``host``/``port`` parameter."""
    parts = urlsplit(dsn)
    credentials = parts.netloc.rpartition("@")[0]
    query = urlencode([(k, v) for k, v in parse_qsl(parts.query) if k not in ("host", "port")])
    netloc = f"{credentials}@{address}" if credentials else address
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def read_only_paths() -> list[str]:
    """The system, the checkout and the Python that runs it, as a host's root sees them."""
    paths = ["/usr", "/etc", str(REPO)]
    for prefix in (sys.prefix, sys.base_prefix):
        real = os.path.realpath(prefix)
        if not any(real == p or real.startswith(p + "/") for p in paths):
            paths.append(real)
    return paths


def _unit_env(platform: RunningPlatform, forwarded: dict[str, str], role: str, k: int) -> dict[str, str]:
    env = {name: value for name, value in platform.env.items() if name.startswith("HM_")}
    del env["HM_STATE_DIR"]
    env.update(
        {
            "PATH": "/usr/bin:/bin",
            "HOME": "/tmp",
            "LANG": "C.UTF-8",
            "PYTHONUNBUFFERED": "1",
            "HM_DATABASE_URL": _rehost(platform.env["HM_DATABASE_URL"], forwarded["postgres"]),
            "HM_NATS_URL": f"nats://{forwarded['nats']}",
            "HM_STORAGE_ADDR": forwarded["storage"],
            "HM_CREDITS_ADDR": forwarded["credits"],
            # As hypermedia up gives it on one machine: a path that does not exist on this host.
            "HM_STORAGE_HANDOFF_SOCKET": str(platform.state_dir / "run" / "storage.sock"),
            "HM_WORK_DIR": WORK_DIR,
            "HM_WORKER_STATUS_BIND": f"0.0.0.0:{STATUS_PORT}",
            "HM_UNIT_NAME": f"far-{role}",
            "HM_SANDBOX_REQUIRE": "full",
            "HM_SANDBOX_UID_BASE": str(int(platform.env["HM_SANDBOX_UID_BASE"]) + 200 * (k + 1)),
            "HM_INTERNAL_AUTH": "mtls",
            "HM_TLS_CA": f"{TLS_DIR}/ca.pem",
            "HM_TLS_CERT": f"{TLS_DIR}/{role}.pem",
            "HM_TLS_KEY": f"{TLS_DIR}/{role}-key.pem",
        }
    )
    return env


def _tls_files(platform: RunningPlatform, role: str) -> dict[str, str]:
    tls = platform.state_dir / "tls"
    return {
        f"{TLS_DIR}/ca.pem": str(tls / "ca.pem"),
        f"{TLS_DIR}/{role}.pem": str(tls / f"{role}.pem"),
        f"{TLS_DIR}/{role}-key.pem": str(tls / f"{role}-key.pem"),
    }


@pytest.fixture(scope="module")
def elsewhere(tmp_root: Path, database_url: str, nats_url: str) -> Iterator[Elsewhere]:
    with Network() as network:
        forwarder = Forwarder(network.gateway)
        storage_http = forwarder.add(None)
        try:
            with isolated_platform(
                tmp_root,
                database_url,
                nats_url,
                "hosts",
                services="credits,storage,gateway,reaper",
                HM_STORAGE_PUBLIC_URL=f"http://{forwarder.address(storage_http)}",
            ) as platform:
                forwarder.point(storage_http, urlsplit(platform.info["storage_http"]).netloc)
                forwarded = {
                    "postgres": forwarder.address(
                        forwarder.add(postgres_upstream(platform.env["HM_DATABASE_URL"]))
                    ),
                    "nats": forwarder.address(forwarder.add(urlsplit(nats_url).netloc.rpartition("@")[2])),
                    "storage": forwarder.address(forwarder.add(platform.info["storage_addr"])),
                    "credits": forwarder.address(forwarder.add(platform.info["credits_addr"])),
                    "storage_http": forwarder.address(storage_http),
                }
                here = Elsewhere(platform, network, forwarded, {})
                try:
                    yield here
                finally:
                    for _host, proc, _log in here.units.values():
                        proc.terminate()
                    for _host, proc, _log in here.units.values():
                        try:
                            proc.wait(60)
                        except subprocess.TimeoutExpired:
                            proc.kill()
                            proc.wait()
        finally:
            forwarder.close()


def _start_unit(here: Elsewhere, role: str) -> None:
    host = here.network.host()
    log = here.platform.state_dir / "logs" / f"far-{role}.log"
    with log.open("ab") as out:
        proc = host.popen(
            [sys.executable, "-m", "hypermedia.worker.unit", role],
            _unit_env(here.platform, here.forwarded, role, len(here.units)),
            read_only=read_only_paths(),
            files=_tls_files(here.platform, role),
            dirs=[WORK_DIR],
            cwd=str(REPO),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    here.units[role] = (host, proc, log)


def _wait(here: Elsewhere, client: httpx.Client, job_id: str, timeout: float = 240) -> dict[str, Any]:
    """The job once it ended; AssertionError with the units' logs if one of them exited first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for role, (_host, proc, log) in here.units.items():
            if proc.poll() is not None:
                raise AssertionError(
                    f"{role} exited {proc.returncode}:\n{log.read_text(errors='replace')[-4000:]}"
                )
        job = client.get(f"/v1/jobs/{job_id}").json()
        if job["status"] in ("completed", "failed", "cancelled"):
            return dict(job)
        time.sleep(0.2)
    logs = {role: log.read_text(errors="replace")[-2000:] for role, (_h, _p, log) in here.units.items()}
    raise AssertionError(f"job {job_id} not done in {timeout}s; units' logs: {json.dumps(logs, indent=1)}")


def _create(client: httpx.Client, path: Path, operation: str | dict[str, Any]) -> str:
    obj = upload(client, path)
    created = client.post(
        "/v1/hypermedia/process", json={"object_id": obj["object_id"], "operations": [operation]}
    )
    assert created.status_code == 202, created.text
    return str(created.json()["job_ids"][0])


def _image(output: dict[str, Any]) -> pyvips.Image:
    response = httpx.get(output["url"], timeout=30)
    assert response.status_code == 200 and len(response.content) == output["size_bytes"]
    return pyvips.Image.new_from_buffer(response.content, "")


def test_a_host_reaches_the_forwarded_services_and_nothing_of_this_machine(elsewhere: Elsewhere) -> None:
    """The isolation the next test relies on: from a host the forwarded services answer, while
    the platform's own ports are refused both at loopback and at this machine's bridge address
    (they bind loopback), its state directory, object store and hand-off socket do not exist,
    and its processes cannot be seen (the host's command is pid 1, alone in its ``/proc``)."""
    platform = elsewhere.platform
    loopback = {
        "nats": urlsplit(platform.env["HM_NATS_URL"]).netloc.rpartition("@")[2],
        "storage": platform.info["storage_addr"],
        "credits": platform.info["credits_addr"],
        "storage_http": urlsplit(platform.info["storage_http"]).netloc,
        "gateway": urlsplit(platform.rest_url).netloc,
    }
    paths = [
        str(platform.state_dir),
        platform.info["objects_dir"],
        str(platform.state_dir / "run" / "storage.sock"),
    ]
    postgres = postgres_upstream(platform.env["HM_DATABASE_URL"])
    if postgres.startswith("/"):
        paths.append(postgres)  # the embedded server's socket
    else:
        loopback["postgres"] = postgres
    gateway = elsewhere.network.gateway
    direct = {f"loopback {k}": v for k, v in loopback.items()} | {
        f"bridge {k}": f"{gateway}:{v.rpartition(':')[2]}" for k, v in loopback.items()
    }
    targets = {"ports": direct | elsewhere.forwarded, "paths": paths}
    host = elsewhere.network.host()
    found = json.loads(
        host.run(
            [sys.executable, "-c", PROBE, json.dumps(targets)], {"PATH": "/usr/bin:/bin"}, read_only_paths()
        )
    )
    assert found["reached"] == dict.fromkeys(direct, False) | dict.fromkeys(elsewhere.forwarded, True)
    assert found["present"] == dict.fromkeys(paths, False)
    assert (found["pid"], found["processes"]) == (1, 1)
    assert Path(platform.state_dir / "run" / "storage.sock").exists(), (
        "storage's hand-off socket is on this machine"
    )


def test_each_engine_runs_its_job_on_a_host_of_its_own(elsewhere: Elsewhere, tmp_path: Path) -> None:
    """imageworker, docworker, ocrworker and mediaworker, each on its own host, each complete a job
    of its engine with the right result, its original over a presigned URL (the hand-off socket is
    not on its disk) and its outputs put the same way; the attempts ran on those hosts (the
    ``workers`` rows' hostnames)."""
    for role in ROLES:
        _start_unit(elsewhere, role)
    platform = elsewhere.platform
    account = platform.admin("create-account", "--credits", "100")
    with platform.client(account) as client:
        jobs = {
            "imageworker": _create(client, PHOTO, "thumbnail"),
            "docworker": _create(
                client,
                FOUR_PAGES,
                {"name": "pdf_preview", "params": {"pages": "2", "format": "png", "dpi": 36}},
            ),
            "ocrworker": _create(client, PHOTOTEST, {"name": "ocr", "params": {"outputs": ["text"]}}),
            "mediaworker": _create(
                client, write_video(tmp_path / "clip.mp4"), {"name": "poster", "params": {"width": 120}}
            ),
        }
        done = {role: _wait(elsewhere, client, job_id) for role, job_id in jobs.items()}
    for role, job in done.items():
        assert job["status"] == "completed", (role, job["error_code"], job["error_message"])
    [thumbnail] = done["imageworker"]["outputs"]
    assert (_image(thumbnail).width, _image(thumbnail).height) == (256, 171)
    [preview] = done["docworker"]["outputs"]
    assert preview["output_type"] == "preview_p2" and preview["metadata"]["page_count"] == 4
    assert (_image(preview).width, _image(preview).height) == (298, 421)
    [text] = done["ocrworker"]["outputs"]
    assert cer(httpx.get(text["url"], timeout=30).content.decode(), GOLD) < 0.02
    [poster] = done["mediaworker"]["outputs"]
    assert (_image(poster).width, _image(poster).height) == (120, 90)

    with psycopg.connect(platform.env["HM_DATABASE_URL"]) as conn:
        ran_on = dict(
            conn.execute(
                "SELECT w.role, w.hostname FROM job_attempts a JOIN workers w USING (worker_id) "
                "WHERE a.job_id = ANY(%s::uuid[])",
                (list(jobs.values()),),
            ).fetchall()
        )
    assert ran_on == {role: host.name for role, (host, _proc, _log) in elsewhere.units.items()}
    for role, (_host, _proc, log) in elsewhere.units.items():
        assert "storage hand-off unavailable" in log.read_text(errors="replace"), role
