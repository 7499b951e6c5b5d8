"""Idempotency-Key and cancellation end to end, over REST and gRPC, on real processes.

Most tests run on a platform without an imageworker (jobs stay ``queued`` and their holds stay
held, so what was created and held can be counted exactly). The last one runs a full platform
whose presigned URLs go through :class:`~tests.e2e.delayproxy.DelayingProxy`, which holds the
worker's output upload back until the test has asked for the cancellation.

Each platform gets a database of its own: another platform's reaper on a shared database would
republish these queued jobs to its own workers.
"""

from __future__ import annotations

import contextlib
import math
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import grpc
import httpx
import psycopg
import pytest

from hypermedia.api.jobs.v1 import jobs_pb2, jobs_pb2_grpc
from tests.e2e.conftest import RunningPlatform, own_database, start_platform, upload, wait_for, wait_job
from tests.e2e.delayproxy import DelayingProxy

EXIF = Path(__file__).resolve().parents[1] / "data" / "exif-orientation"
PHOTO = EXIF / "Landscape_3.jpg"
PRICES = {"thumbnail": (1000, 200), "resize": (1000, 200), "compress": (1500, 300), "convert": (1500, 300)}
"""Seeded prices (millicredits): base and per MiB, as in docs/api.md#credits."""


# -- fixtures and helpers ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def idle_platform(tmp_root: Path, database_url: str, nats_url: str) -> Iterator[RunningPlatform]:
    """No imageworker; the reaper does not republish queued jobs during the module."""
    with own_database(database_url, "idem") as dsn:
        running = start_platform(
            tmp_root,
            dsn,
            nats_url,
            services="credits,storage,gateway,reaper",
            HM_REAPER_REQUEUE_STALE_SECONDS="3600",
        )
        try:
            yield running
        finally:
            assert running.stop() == 0


@pytest.fixture
def pg(idle_platform: RunningPlatform) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(idle_platform.env["HM_DATABASE_URL"], autocommit=True) as conn:
        yield conn


@pytest.fixture
def new_account(idle_platform: RunningPlatform) -> Callable[[float], dict[str, Any]]:
    def create(credits: float = 100) -> dict[str, Any]:
        return idle_platform.admin("create-account", "--credits", str(credits))

    return create


@contextlib.contextmanager
def _client(platform: RunningPlatform, account: dict[str, Any]) -> Iterator[httpx.Client]:
    with platform.client(account) as c:
        yield c


def _price(operation: str, size_bytes: int) -> int:
    base, per_mb = PRICES[operation]
    return base + math.ceil(per_mb * size_bytes / 2**20)


def _process(client: httpx.Client, body: dict[str, Any], key: str | None) -> httpx.Response:
    headers = {"Idempotency-Key": key} if key is not None else {}
    return client.post("/v1/hypermedia/process", json=body, headers=headers)


def _jobs_with_key(pg: psycopg.Connection[Any], account_id: str, key: str) -> list[str]:
    rows = pg.execute(
        "SELECT job_id::text FROM processing_jobs WHERE account_id = %s AND idempotency_key = %s",
        (account_id, key),
    ).fetchall()
    return sorted(r[0] for r in rows)


def _holds(pg: psycopg.Connection[Any], account_id: str) -> dict[str, tuple[str, int]]:
    """``{job_id: (status, amount)}`` of every credit hold of the account."""
    rows = pg.execute(
        "SELECT job_id::text, status, amount FROM credit_holds WHERE account_id = %s", (account_id,)
    ).fetchall()
    return {r[0]: (r[1], r[2]) for r in rows}


def _outbox_rows(pg: psycopg.Connection[Any], job_ids: list[str]) -> int:
    return int(
        pg.execute(
            "SELECT count(*) FROM outbox WHERE payload->>'job_id' = ANY(%s)", (list(job_ids),)
        ).fetchone()[0]
    )


def _ledger(pg: psycopg.Connection[Any], job_id: str) -> list[str]:
    rows = pg.execute(
        "SELECT kind FROM credit_ledger WHERE job_id = %s ORDER BY entry_id", (job_id,)
    ).fetchall()
    return [r[0] for r in rows]


def _grpc_error(fn: Callable[[], Any]) -> tuple[grpc.StatusCode, str, str]:
    """Call ``fn``, which must fail; returns (status code, hm-error-code trailer, message)."""
    with pytest.raises(grpc.RpcError) as info:
        fn()
    err = info.value
    trailers = dict(err.trailing_metadata() or ())  # type: ignore[attr-defined]
    return err.code(), trailers.get("hm-error-code", ""), err.details()  # type: ignore[attr-defined]


# -- Idempotency-Key over REST ----------------------------------------------------------------------


def test_rest_same_key_same_request_replays_the_jobs_and_holds_once(
    idle_platform: RunningPlatform, pg: psycopg.Connection[Any], new_account: Callable[..., dict[str, Any]]
) -> None:
    account = new_account(100)
    key = f"order-{secrets.token_hex(4)}"
    with _client(idle_platform, account) as client:
        obj = upload(client, PHOTO)
        body = {"object_id": obj["object_id"], "operations": ["thumbnail"], "priority": 6}
        expected = _price("thumbnail", obj["size_bytes"])

        first = _process(client, body, key)
        assert first.status_code == 202, first.text
        created = first.json()
        assert len(created["job_ids"]) == 1
        assert created["estimated_credits"] == expected / 1000
        assert client.get("/v1/credits").json() == {
            "balance": 100.0,
            "held": expected / 1000,
            "available": (100_000 - expected) / 1000,
        }

        second = _process(client, body, key)
        assert second.status_code == 202, second.text
        assert second.json() == created
        # The same body with its keys in another order is the same request.
        same = _process(
            client, {"priority": 6, "operations": ["thumbnail"], "object_id": obj["object_id"]}, key
        )
        assert same.status_code == 202 and same.json() == created

        assert _jobs_with_key(pg, account["account_id"], key) == created["job_ids"]
        assert pg.execute(
            "SELECT count(*) FROM process_requests WHERE account_id = %s AND idempotency_key = %s",
            (account["account_id"], key),
        ).fetchone() == (1,)
        assert _holds(pg, account["account_id"]) == {created["job_ids"][0]: ("held", expected)}
        assert _ledger(pg, created["job_ids"][0]) == ["hold"]
        assert _outbox_rows(pg, created["job_ids"]) == 1, "queued once"
        assert client.get("/v1/credits").json()["held"] == expected / 1000, "held once"

        job = client.get(f"/v1/jobs/{created['job_ids'][0]}").json()
        assert (job["status"], job["priority"], job["operation"]) == ("queued", 6, "thumbnail")

        # After the job has ended (here: cancelled), the key still answers the same jobs, and
        # nothing is held again.
        assert client.post(f"/v1/jobs/{created['job_ids'][0]}:cancel").json()["status"] == "cancelled"
        after_end = _process(client, body, key)
        assert after_end.status_code == 202 and after_end.json() == created
        assert client.get("/v1/credits").json() == {"balance": 100.0, "held": 0.0, "available": 100.0}
        assert _holds(pg, account["account_id"]) == {created["job_ids"][0]: ("released", expected)}
        assert _outbox_rows(pg, created["job_ids"]) == 1

        # Without a key, the same body creates new jobs every time.
        plain = [_process(client, body, None).json()["job_ids"][0] for _ in range(2)]
        assert len(set(plain) | set(created["job_ids"])) == 3


def test_rest_same_key_with_another_request_is_409_and_creates_nothing(
    idle_platform: RunningPlatform, pg: psycopg.Connection[Any], new_account: Callable[..., dict[str, Any]]
) -> None:
    account = new_account(100)
    key = f"order-{secrets.token_hex(4)}"
    with _client(idle_platform, account) as client:
        obj = upload(client, PHOTO)
        other = upload(client, EXIF / "Landscape_4.jpg")
        body: dict[str, Any] = {"object_id": obj["object_id"], "operations": ["thumbnail"]}
        created = _process(client, body, key).json()
        credits = client.get("/v1/credits").json()
        holds = _holds(pg, account["account_id"])
        jobs = pg.execute(
            "SELECT count(*) FROM processing_jobs WHERE account_id = %s", (account["account_id"],)
        )
        assert jobs.fetchone() == (1,)

        variants: list[dict[str, Any]] = [
            body | {"priority": 4},
            body | {"operations": [{"name": "thumbnail", "params": {"size": 256}}]},  # default written out
            body | {"operations": [{"name": "thumbnail", "params": {"size": 128}}]},
            body | {"operations": ["thumbnail", "thumbnail"]},
            body | {"object_id": other["object_id"]},
            body | {"webhook_url": "https://example.com/hook"},
        ]
        for variant in variants:
            response = _process(client, variant, key)
            assert response.status_code == 409, (variant, response.text)
            problem = response.json()
            assert response.headers["content-type"] == "application/problem+json"
            assert (problem["status"], problem["title"], problem["error_code"]) == (
                409,
                "Conflict",
                "IDEMPOTENCY_KEY_REUSED",
            )

        assert client.get("/v1/credits").json() == credits
        assert _holds(pg, account["account_id"]) == holds
        assert pg.execute(
            "SELECT count(*) FROM processing_jobs WHERE account_id = %s", (account["account_id"],)
        ).fetchone() == (1,)
        # The original request still replays.
        assert _process(client, body, key).json() == created
        # A key longer than 200 characters is refused before anything else.
        too_long = _process(client, body, "k" * 201)
        assert (too_long.status_code, too_long.json()["error_code"]) == (422, "INVALID_REQUEST")


def test_rest_keys_are_per_account(
    idle_platform: RunningPlatform, pg: psycopg.Connection[Any], new_account: Callable[..., dict[str, Any]]
) -> None:
    key = f"shared-{secrets.token_hex(4)}"
    first, second = new_account(100), new_account(100)
    answers = {}
    for account in (first, second):
        with _client(idle_platform, account) as client:
            obj = upload(client, PHOTO)
            response = _process(client, {"object_id": obj["object_id"], "operations": ["thumbnail"]}, key)
            assert response.status_code == 202, response.text
            answers[account["account_id"]] = response.json()["job_ids"]
            assert client.get("/v1/credits").json()["held"] == _price("thumbnail", obj["size_bytes"]) / 1000

    assert answers[first["account_id"]] != answers[second["account_id"]]
    for account in (first, second):
        assert _jobs_with_key(pg, account["account_id"], key) == answers[account["account_id"]]
    assert pg.execute(
        "SELECT count(*) FROM processing_jobs WHERE idempotency_key = %s", (key,)
    ).fetchone() == (2,)
    # The second account reusing the key with its own other request is its own business: it
    # conflicts with its own earlier request only.
    with _client(idle_platform, second) as client:
        obj = upload(client, PHOTO)
        response = _process(client, {"object_id": obj["object_id"], "operations": ["thumbnail"]}, key)
        assert (response.status_code, response.json()["error_code"]) == (409, "IDEMPOTENCY_KEY_REUSED")


def test_rest_concurrent_requests_with_one_key_create_one_set_of_jobs(
    idle_platform: RunningPlatform, pg: psycopg.Connection[Any], new_account: Callable[..., dict[str, Any]]
) -> None:
    account = new_account(100)
    key = f"burst-{secrets.token_hex(4)}"
    n = 8
    with _client(idle_platform, account) as client:
        obj = upload(client, PHOTO)
    body = {
        "object_id": obj["object_id"],
        "operations": ["thumbnail", {"name": "convert", "params": {"format": "png"}}],
    }
    expected = _price("thumbnail", obj["size_bytes"]) + _price("convert", obj["size_bytes"])
    barrier = threading.Barrier(n)

    def fire(_: int) -> httpx.Response:
        with _client(idle_platform, account) as c:
            assert c.get("/v1/credits").status_code == 200  # connected before the burst
            barrier.wait(10)
            return _process(c, body, key)

    with ThreadPoolExecutor(n) as pool:
        responses = list(pool.map(fire, range(n)))

    assert [r.status_code for r in responses] == [202] * n, [r.text for r in responses]
    answers = [r.json() for r in responses]
    job_ids = sorted(answers[0]["job_ids"])
    assert len(job_ids) == 2
    assert all(sorted(a["job_ids"]) == job_ids for a in answers), answers
    assert all(a["estimated_credits"] == expected / 1000 for a in answers)
    assert _jobs_with_key(pg, account["account_id"], key) == job_ids
    assert _outbox_rows(pg, job_ids) == 2
    # The duplicates waited for the first request's transaction and replayed it: they never held
    # credits of their own.
    holds = _holds(pg, account["account_id"])
    assert sorted(holds) == job_ids
    assert {status for status, _ in holds.values()} == {"held"}
    assert sum(amount for _, amount in holds.values()) == expected
    with _client(idle_platform, account) as client:
        assert client.get("/v1/credits").json() == {
            "balance": 100.0,
            "held": expected / 1000,
            "available": (100_000 - expected) / 1000,
        }


def test_rest_concurrent_duplicates_of_an_affordable_request_are_not_refused(
    idle_platform: RunningPlatform, pg: psycopg.Connection[Any]
) -> None:
    account = idle_platform.admin("create-account", "--credits", "0")
    with _client(idle_platform, account) as client:
        obj = upload(client, PHOTO)
    price = _price("thumbnail", obj["size_bytes"])
    idle_platform.admin("grant", account["account_id"], "--credits", str(price / 1000))
    key = f"burst-{secrets.token_hex(4)}"
    body = {"object_id": obj["object_id"], "operations": ["thumbnail"]}
    n = 8
    barrier = threading.Barrier(n)

    def fire(_: int) -> tuple[int, Any]:
        with _client(idle_platform, account) as c:
            assert c.get("/v1/credits").json()["available"] == price / 1000  # connected before the burst
            barrier.wait(10)
            response = _process(c, body, key)
            return response.status_code, response.json().get("job_ids") or response.json()["error_code"]

    with ThreadPoolExecutor(n) as pool:
        answers = list(pool.map(fire, range(n)))

    [job_id] = _jobs_with_key(pg, account["account_id"], key)
    assert answers == [(202, [job_id])] * n


def test_rest_replay_keeps_the_order_of_operations(
    idle_platform: RunningPlatform, new_account: Callable[..., dict[str, Any]]
) -> None:
    account = new_account(100)
    operations = [
        "thumbnail",
        {"name": "resize", "params": {"width": 64}},
        "compress",
        {"name": "convert", "params": {"format": "png"}},
    ]
    with _client(idle_platform, account) as client:
        obj = upload(client, PHOTO)
        body = {"object_id": obj["object_id"], "operations": operations}
        # Job ids are random: take a request whose ids are not already in UUID order (1 in 24 is).
        for _ in range(5):
            key = f"order-{secrets.token_hex(4)}"
            created = _process(client, body, key).json()["job_ids"]
            if created != sorted(created):
                break
        assert [client.get(f"/v1/jobs/{j}").json()["operation"] for j in created] == [
            "thumbnail",
            "resize",
            "compress",
            "convert",
        ]
        replayed = _process(client, body, key).json()["job_ids"]
    assert replayed == created


# -- Idempotency-Key over gRPC ----------------------------------------------------------------------


def test_grpc_process_replays_with_the_same_key_and_conflicts_with_another_request(
    idle_platform: RunningPlatform, pg: psycopg.Connection[Any], new_account: Callable[..., dict[str, Any]]
) -> None:
    account = new_account(100)
    metadata = (("authorization", f"Bearer {account['api_key']}"),)
    key = f"grpc-{secrets.token_hex(4)}"
    with grpc.insecure_channel(idle_platform.grpc_addr) as chan:
        stub = jobs_pb2_grpc.JobServiceStub(chan)
        obj = stub.UploadObject(
            jobs_pb2.UploadObjectRequest(content=PHOTO.read_bytes(), filename=PHOTO.name), metadata=metadata
        )
        op = jobs_pb2.Operation(name="thumbnail")
        op.params.update({"size": 128})
        request = jobs_pb2.ProcessRequest(object_id=obj.object_id, operations=[op], idempotency_key=key)
        expected = _price("thumbnail", obj.size_bytes)

        first = stub.Process(request, metadata=metadata)
        assert len(first.job_ids) == 1 and first.estimated_credits == f"{expected / 1000:.3f}"
        again = stub.Process(request, metadata=metadata)
        assert list(again.job_ids) == list(first.job_ids)
        assert again.estimated_credits == first.estimated_credits
        # priority 0 is the proto default and means 5: the same request as an explicit 5.
        explicit = stub.Process(
            jobs_pb2.ProcessRequest(
                object_id=obj.object_id, operations=[op], priority=5, idempotency_key=key
            ),
            metadata=metadata,
        )
        assert list(explicit.job_ids) == list(first.job_ids)

        other = jobs_pb2.Operation(name="thumbnail")
        other.params.update({"size": 64})
        for conflicting in (
            jobs_pb2.ProcessRequest(
                object_id=obj.object_id, operations=[op], priority=7, idempotency_key=key
            ),
            jobs_pb2.ProcessRequest(object_id=obj.object_id, operations=[other], idempotency_key=key),
        ):
            code, error_code, message = _grpc_error(lambda r=conflicting: stub.Process(r, metadata=metadata))
            assert (code, error_code) == (grpc.StatusCode.FAILED_PRECONDITION, "IDEMPOTENCY_KEY_REUSED")
            assert message == "this Idempotency-Key was used with a different request"

        balance = stub.GetBalance(jobs_pb2.GetBalanceRequest(), metadata=metadata)
        assert (balance.balance, balance.held) == ("100.000", f"{expected / 1000:.3f}")
        job = stub.GetJob(jobs_pb2.GetJobRequest(job_id=first.job_ids[0]), metadata=metadata).job
        assert job.status == jobs_pb2.JOB_STATUS_QUEUED and job.params["size"] == 128

    assert _jobs_with_key(pg, account["account_id"], key) == list(first.job_ids)
    assert _holds(pg, account["account_id"]) == {first.job_ids[0]: ("held", expected)}

    # The key is the account's across transports: the same request over REST replays too.
    with _client(idle_platform, account) as client:
        body = {"object_id": obj.object_id, "operations": [{"name": "thumbnail", "params": {"size": 128}}]}
        rest = _process(client, body, key)
        assert rest.status_code == 202 and rest.json()["job_ids"] == list(first.job_ids)
        conflict = _process(client, body | {"priority": 9}, key)
        assert (conflict.status_code, conflict.json()["error_code"]) == (409, "IDEMPOTENCY_KEY_REUSED")
    assert _jobs_with_key(pg, account["account_id"], key) == list(first.job_ids)


# -- CancelJob over gRPC ----------------------------------------------------------------------------


def test_grpc_cancel_job(
    idle_platform: RunningPlatform, pg: psycopg.Connection[Any], new_account: Callable[..., dict[str, Any]]
) -> None:
    owner, stranger = new_account(100), new_account(100)
    owner_md = (("authorization", f"Bearer {owner['api_key']}"),)
    stranger_md = (("authorization", f"Bearer {stranger['api_key']}"),)
    with grpc.insecure_channel(idle_platform.grpc_addr) as chan:
        stub = jobs_pb2_grpc.JobServiceStub(chan)
        obj = stub.UploadObject(
            jobs_pb2.UploadObjectRequest(content=PHOTO.read_bytes(), filename=PHOTO.name), metadata=owner_md
        )
        created = stub.Process(
            jobs_pb2.ProcessRequest(
                object_id=obj.object_id,
                operations=[jobs_pb2.Operation(name="thumbnail"), jobs_pb2.Operation(name="compress")],
            ),
            metadata=owner_md,
        )
        target, bystander = created.job_ids
        held = _price("thumbnail", obj.size_bytes) + _price("compress", obj.size_bytes)
        assert stub.GetBalance(jobs_pb2.GetBalanceRequest(), metadata=owner_md).held == f"{held / 1000:.3f}"

        # Another account's job, an unknown id and a malformed id: NOT_FOUND, and nothing changes.
        for job_id, md in ((target, stranger_md), (secrets.token_hex(16), owner_md), ("nope", owner_md)):
            code, error_code, _ = _grpc_error(
                lambda j=job_id, m=md: stub.CancelJob(jobs_pb2.CancelJobRequest(job_id=j), metadata=m)
            )
            assert (code, error_code) == (grpc.StatusCode.NOT_FOUND, "NOT_FOUND")
        assert pg.execute("SELECT status FROM processing_jobs WHERE job_id = %s", (target,)).fetchone() == (
            "queued",
        )

        job = stub.CancelJob(jobs_pb2.CancelJobRequest(job_id=target), metadata=owner_md).job
        assert (job.job_id, job.status, job.attempt_count, len(job.outputs)) == (
            target,
            jobs_pb2.JOB_STATUS_CANCELLED,
            0,
            0,
        )
        assert job.HasField("completed_at") and job.actual_credits == "" and job.error_code == ""
        balance = stub.GetBalance(jobs_pb2.GetBalanceRequest(), metadata=owner_md)
        left = _price("compress", obj.size_bytes)
        assert (balance.balance, balance.held) == ("100.000", f"{left / 1000:.3f}"), (
            "only the target released"
        )
        assert _ledger(pg, target) == ["hold", "release"]
        assert _holds(pg, owner["account_id"])[target] == ("released", _price("thumbnail", obj.size_bytes))

        code, error_code, message = _grpc_error(
            lambda: stub.CancelJob(jobs_pb2.CancelJobRequest(job_id=target), metadata=owner_md)
        )
        assert (code, error_code, message) == (
            grpc.StatusCode.FAILED_PRECONDITION,
            "JOB_NOT_CANCELLABLE",
            "the job is already cancelled",
        )
        assert _ledger(pg, target) == ["hold", "release"]
        assert (
            stub.GetJob(jobs_pb2.GetJobRequest(job_id=bystander), metadata=owner_md).job.status
            == jobs_pb2.JOB_STATUS_QUEUED
        )
        # Clean up: the bystander is cancelled too, and the account is back to its grant.
        stub.CancelJob(jobs_pb2.CancelJobRequest(job_id=bystander), metadata=owner_md)
        balance = stub.GetBalance(jobs_pb2.GetBalanceRequest(), metadata=owner_md)
        assert (balance.balance, balance.held) == ("100.000", "0.000")
    assert pg.execute(
        "SELECT status FROM job_events WHERE job_id = %s AND kind = 'status' ORDER BY event_id", (target,)
    ).fetchall() == [("queued",), ("cancelled",)]


# -- cancel while the outputs upload ----------------------------------------------------------------


def test_cancel_while_the_output_uploads_deletes_it_and_charges_nothing(
    tmp_root: Path, database_url: str, nats_url: str
) -> None:
    with DelayingProxy(hold_prefix="/o/derived/") as proxy, own_database(database_url, "upcancel") as dsn:
        # Originals over HTTP (no same-host hand-off, ADR 0045): the proxy sees the worker's GET too.
        platform = start_platform(
            tmp_root,
            dsn,
            nats_url,
            "credits,storage,gateway,reaper,imageworker",  # a thumbnail is all it runs
            HM_STORAGE_PUBLIC_URL=proxy.url,
            HM_STORAGE_HANDOFF_SOCKET="",
        )
        try:
            proxy.set_upstream(platform.info["storage_http"])
            _cancel_during_upload(platform, proxy, dsn)
        finally:
            proxy.release.set()  # whatever failed, the held upload goes on
            code = platform.stop()
    assert code == 0, f"hypermedia up exited with {code}"


def _cancel_during_upload(platform: RunningPlatform, proxy: DelayingProxy, dsn: str) -> None:
    account = platform.admin("create-account", "--credits", "100")
    with _client(platform, account) as client, psycopg.connect(dsn, autocommit=True) as pg:
        before = client.get("/v1/credits").json()
        obj = upload(client, PHOTO)  # through the proxy too, not held: an originals/ key
        response = _process(client, {"object_id": obj["object_id"], "operations": ["thumbnail"]}, None)
        assert response.status_code == 202, response.text
        [job_id] = response.json()["job_ids"]

        assert proxy.held.wait(60), "the worker's output PUT did not arrive"
        [held_path] = proxy.held_paths
        key = unquote(urlsplit(held_path).path.removeprefix("/o/"))
        assert key.startswith(f"derived/{obj['pool_id']}/{obj['object_id']}/1/thumbnail-"), key
        assert client.get(f"/v1/jobs/{job_id}").json()["status"] == "processing"

        cancel = client.post(f"/v1/jobs/{job_id}:cancel")
        assert cancel.status_code == 200, cancel.text
        assert cancel.json()["status"] == "cancel_requested"
        released_at = time.monotonic()
        proxy.release.set()

        job = wait_job(client, job_id, timeout=15)
        elapsed = time.monotonic() - released_at

        assert job["status"] == "cancelled", job
        assert elapsed < 5, f"cancelled {elapsed:.1f}s after the upload went on"
        assert job["outputs"] == [] and job["actual_credits"] is None and job["error_code"] is None
        [attempt] = job["attempts"]
        assert (attempt["status"], attempt["error_code"]) == ("cancelled", "CANCELLED")

        # The upload did reach storage, and the presigned signatures held through the proxy (the
        # host is not signed): the original stored and downloaded, the output stored.
        seen = [(f.method, urlsplit(f.path).path.split("/")[2], f.status, f.held) for f in proxy.forwarded]
        assert ("PUT", "originals", 200, False) in seen, seen
        assert ("GET", "originals", 200, False) in seen, seen
        assert ("PUT", "derived", 200, True) in seen, seen
        # The proxy does not make storage lenient: a URL with a wrong signature is still refused.
        original = f"/o/originals/{obj['pool_id']}/{obj['object_id']}"
        forged = httpx.get(f"{proxy.url}{original}?expires={int(time.time()) + 60}&sig={'0' * 64}")
        assert (forged.status_code, forged.json()["error_code"]) == (403, "URL_REJECTED")

        # ...and the output was deleted again: no object row, no file, no output row.
        assert pg.execute(
            "SELECT count(*) FROM objects WHERE source_object_id = %s OR key = %s", (obj["object_id"], key)
        ).fetchone() == (0,)
        assert pg.execute("SELECT count(*) FROM job_outputs WHERE job_id = %s", (job_id,)).fetchone() == (0,)
        objects_dir = Path(platform.info["objects_dir"])
        assert not (objects_dir / key).exists()
        derived_dir = objects_dir / "derived" / obj["pool_id"] / obj["object_id"]
        assert not derived_dir.exists() or [p.name for p in derived_dir.rglob("*") if p.is_file()] == []
        assert (objects_dir / "originals" / obj["pool_id"] / obj["object_id"]).is_file()

        # Nothing charged: the hold was released, never committed.
        wait_for("hold released", lambda: client.get("/v1/credits").json()["held"] == 0, 5)
        assert (
            client.get("/v1/credits").json() == before == {"balance": 100.0, "held": 0.0, "available": 100.0}
        )
        assert _ledger(pg, job_id) == ["hold", "release"]
        assert pg.execute(
            "SELECT status FROM job_events WHERE job_id = %s AND kind = 'status' ORDER BY event_id", (job_id,)
        ).fetchall() == [("queued",), ("claimed",), ("processing",), ("cancel_requested",), ("cancelled",)]
