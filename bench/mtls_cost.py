"""What mutual TLS costs a worker per internal call (issue 18 item 5): ``GrantJob`` (a worker's
one storage call before the engine) against the same servicer on a plaintext and an mTLS port,
in the same run.

    .venv/bin/python bench/mtls_cost.py [--calls 300] [--rounds 3]

An embedded Postgres, migrated, with one tenant and one running job (the integration tests'
``Seeder``); a private CA and every service identity issued (``hypermedia.infra.mtls``); a
``StorageServicer`` served twice, plaintext and mTLS. Per round and transport: 30 calls to warm
the channel, then ``--calls`` sequential calls on it, timed; then 20 new mTLS channels, each with
its first call (the handshake). Printed: the medians per round, and the extra milliseconds mTLS
adds to a call (median over rounds) against the goal of at most 2 ms (MET/MISSED): a job's
claim-to-done overhead is tens of ms (docs/performance.md). It was a timed test until
2026-12-07, when a CPU-loaded CI run failed it (+2.8 ms, with two busy loops on two cores).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from hypermedia.api.storage.v1 import storage_pb2, storage_pb2_grpc  # noqa: E402
from hypermedia.devtools.embedded import EmbeddedPostgres  # noqa: E402
from hypermedia.infra import db, mtls  # noqa: E402
from hypermedia.infra.rpc import GrpcServer, channel  # noqa: E402
from services.storage.localstore import LocalStore  # noqa: E402
from services.storage.service import SERVICE_NAME, StorageServicer  # noqa: E402
from tests.integration.conftest import Seeder  # noqa: E402

GOAL_MS = 2.0
"""Most milliseconds mTLS may add to a warm call."""


async def _timed(
    stub: storage_pb2_grpc.StorageServiceStub, request: storage_pb2.GrantJobRequest, calls: int
) -> float:
    """Median milliseconds of ``calls`` sequential GrantJob calls, after 30 to warm up."""
    for _ in range(30):
        await stub.GrantJob(request, timeout=5)
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        await stub.GrantJob(request, timeout=5)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


async def measure(root: Path, dsn: str, calls: int, rounds: int) -> list[tuple[float, float, float]]:
    """Per round: (plaintext ms, mTLS ms, new mTLS channel + first call ms), medians."""
    pool = await db.create_pool(dsn, max_size=8)
    tls_dir = root / "tls"
    ca = mtls.make_ca(tls_dir)
    for identity in sorted(mtls.IDENTITIES):
        mtls.issue(tls_dir, identity, ca)
    seed = Seeder(pool)
    tenant = await seed.tenant()
    job = await seed.job(tenant, status="processing", attempt_count=1, claimed_by="w1", lease_in=600)
    store = LocalStore(root / "objects", b"k" * 32, "http://127.0.0.1:9")
    servicer = StorageServicer(pool, store, url_ttl_seconds=300, max_put_bytes=1 << 20)
    add = storage_pb2_grpc.add_StorageServiceServicer_to_server
    plain = GrpcServer("127.0.0.1:0", [(add, servicer)], [SERVICE_NAME])
    secure = GrpcServer(
        "127.0.0.1:0", [(add, servicer)], [SERVICE_NAME], tls=mtls.Tls.from_dir(tls_dir, "storage")
    )
    await plain.start()
    await secure.start()
    request = storage_pb2.GrantJobRequest(job_id=str(job), attempt=1)
    worker = mtls.Tls.from_dir(tls_dir, "imageworker")
    results = []
    try:
        for _ in range(rounds):
            async with channel(f"127.0.0.1:{plain.port}", None, "storage") as chan:
                plaintext = await _timed(storage_pb2_grpc.StorageServiceStub(chan), request, calls)
            async with channel(f"127.0.0.1:{secure.port}", worker, "storage") as chan:
                secured = await _timed(storage_pb2_grpc.StorageServiceStub(chan), request, calls)
            handshakes = []
            for _ in range(20):
                start = time.perf_counter()
                async with channel(f"127.0.0.1:{secure.port}", worker, "storage") as chan:
                    await storage_pb2_grpc.StorageServiceStub(chan).GrantJob(request, timeout=5)
                handshakes.append((time.perf_counter() - start) * 1000)
            results.append((plaintext, secured, statistics.median(handshakes)))
            print(
                f"  GrantJob p50: plaintext {plaintext:.3f} ms, mTLS {secured:.3f} ms "
                f"(+{secured - plaintext:.3f} ms); new mTLS channel + first call p50 "
                f"{statistics.median(handshakes):.2f} ms",
                flush=True,
            )
    finally:
        await plain.stop(0)
        await secure.stop(0)
        await pool.close()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="hm-mtls-") as tmp:
        root = Path(tmp)
        pg = EmbeddedPostgres(root / "pg").start()
        try:
            dsn = pg.create_database("hm_mtls")
            db.migrate(dsn)
            results = asyncio.run(measure(root, dsn, args.calls, args.rounds))
        finally:
            pg.stop()
    extra = statistics.median(secured - plaintext for plaintext, secured, _ in results)
    verdict = "MET" if extra <= GOAL_MS else "MISSED"
    print(
        f"mTLS adds {extra:+.3f} ms to a warm GrantJob call, median of {len(results)} rounds (goal <= {GOAL_MS} ms: {verdict})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
