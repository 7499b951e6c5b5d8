"""The outbox relay and priority delivery against a real Postgres and a real nats-server (JetStream).

Each test has its own database (so the relay sees only its rows) and its own stream prefix.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
import uuid
from collections.abc import Awaitable

import asyncpg
import pytest
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import api

from hypermedia.core.config import QUEUES, ConfigError
from hypermedia.jobs import lifecycle, outbox, queues
from hypermedia.jobs.outbox import OutboxRelay
from tests.integration.conftest import Broker


async def _enqueue(pool: asyncpg.Pool, prefix: str, count: int, priority: int = 5) -> list[str]:
    """``count`` outbox rows announcing fresh job ids on the images queue; returns the ids in order."""
    job_ids = [str(uuid.uuid4()) for _ in range(count)]
    async with pool.acquire() as conn, conn.transaction():
        for job_id in job_ids:
            await lifecycle.enqueue_outbox(conn, prefix, job_id, "images", priority)
    return job_ids


async def _drain(sub: Subscription, quiet_seconds: float = 0.3) -> int:
    """How many messages ``sub`` receives until it has been quiet for ``quiet_seconds``."""
    received = 0
    while True:
        try:
            await sub.next_msg(timeout=quiet_seconds)
        except TimeoutError:
            return received
        received += 1


async def _unpublished(pool: asyncpg.Pool) -> int:
    return int(await pool.fetchval("SELECT count(*) FROM outbox WHERE published_at IS NULL"))


# -- outbox relay ---------------------------------------------------------------------------------


async def test_run_once_publishes_marks_and_rings_the_doorbell(
    fresh_pool: asyncpg.Pool, broker: Broker
) -> None:
    doorbell = await broker.nc.subscribe(queues.doorbell_subject(broker.prefix, "images"))
    await broker.nc.flush()
    await _enqueue(fresh_pool, broker.prefix, 2, priority=5)
    await _enqueue(fresh_pool, broker.prefix, 1, priority=1)
    relay = OutboxRelay(fresh_pool, broker.nc, broker.js)

    result = await relay.run_once()

    assert result.published == 3
    assert await _unpublished(fresh_pool) == 0
    assert await broker.stream_messages("images") == 3
    # One batch touching one queue rings that queue's doorbell once.
    assert await _drain(doorbell) == 1
    again = await relay.run_once()
    assert again.published == 0
    assert await broker.stream_messages("images") == 3
    assert await _drain(doorbell) == 0


async def test_crash_between_publish_and_mark_leaves_one_message(
    fresh_pool: asyncpg.Pool, broker: Broker
) -> None:
    await _enqueue(fresh_pool, broker.prefix, 1)
    wire = await broker.nc.subscribe(f"{broker.prefix.lower()}.jobs.>")
    await broker.nc.flush()
    relay = OutboxRelay(fresh_pool, broker.nc, broker.js)
    assert (await relay.run_once()).published == 1
    # The relay died after the JetStream ack but before its transaction committed.
    await fresh_pool.execute("UPDATE outbox SET published_at = NULL")

    assert (await relay.run_once()).published == 1

    assert await _drain(wire) == 2, "the row went out twice"
    assert await _unpublished(fresh_pool) == 0
    assert await broker.stream_messages("images") == 1, "JetStream kept one copy (Nats-Msg-Id)"


async def test_row_already_published_by_hand_is_deduplicated(
    fresh_pool: asyncpg.Pool, broker: Broker
) -> None:
    await _enqueue(fresh_pool, broker.prefix, 1)
    row = await fresh_pool.fetchrow("SELECT subject, msg_id, payload FROM outbox")
    message = queues.JobMessage(row["payload"]["job_id"], "images", row["payload"]["priority"])
    ack = await broker.js.publish(row["subject"], message.encode(), headers={"Nats-Msg-Id": row["msg_id"]})
    assert not ack.duplicate

    assert (await OutboxRelay(fresh_pool, broker.nc, broker.js).run_once()).published == 1

    assert await broker.stream_messages("images") == 1


async def test_concurrent_relays_publish_each_row_once(fresh_pool: asyncpg.Pool, broker: Broker) -> None:
    rows = 60
    await _enqueue(fresh_pool, broker.prefix, rows)
    # A core subscriber sees every publish, including copies JetStream would drop as duplicates.
    wire = await broker.nc.subscribe(f"{broker.prefix.lower()}.jobs.>")
    await broker.nc.flush()
    relays = [OutboxRelay(fresh_pool, broker.nc, broker.js, batch_size=7) for _ in range(2)]

    published = 0
    while True:
        results = await asyncio.gather(*(r.run_once() for r in relays))
        if not any(r.published for r in results):
            break
        published += sum(r.published for r in results)

    assert published == rows
    assert await _drain(wire) == rows
    assert await _unpublished(fresh_pool) == 0
    assert await broker.stream_messages("images") == rows


async def test_row_without_a_stream_does_not_block_the_batch(
    fresh_pool: asyncpg.Pool, broker: Broker
) -> None:
    await _enqueue(fresh_pool, broker.prefix, 1)
    orphan = await fresh_pool.fetchval(
        "INSERT INTO outbox (subject, msg_id, payload) VALUES ($1, $2, $3) RETURNING outbox_id",
        "tnostream.jobs.images.p1",
        "orphan-1",
        {"job_id": str(uuid.uuid4()), "queue": "images", "priority": 1},
    )
    await _enqueue(fresh_pool, broker.prefix, 1)
    relay = OutboxRelay(fresh_pool, broker.nc, broker.js)

    started = time.monotonic()
    result = await relay.run_once()

    assert time.monotonic() - started < 5
    assert result.published == 2
    assert await broker.stream_messages("images") == 2
    pending = await fresh_pool.fetch("SELECT outbox_id FROM outbox WHERE published_at IS NULL")
    assert [r["outbox_id"] for r in pending] == [orphan]


async def test_published_rows_are_purged_after_retention(fresh_pool: asyncpg.Pool, broker: Broker) -> None:
    await _enqueue(fresh_pool, broker.prefix, 3)
    relay = OutboxRelay(fresh_pool, broker.nc, broker.js, retain_seconds=60, purge_every_seconds=0.5)
    assert (await relay.run_once()).published == 3
    await fresh_pool.execute(
        "UPDATE outbox SET published_at = now() - interval '2 minutes' "
        "WHERE outbox_id = (SELECT min(outbox_id) FROM outbox)"
    )

    assert (await relay.run_once()).purged == 0  # within purge_every_seconds of the first run's purge
    await asyncio.sleep(0.6)
    result = await relay.run_once()

    assert (result.published, result.purged) == (0, 1)
    assert await fresh_pool.fetchval("SELECT count(*) FROM outbox") == 2


# -- priority delivery ----------------------------------------------------------------------------


async def _publish(broker: Broker, priority: int, count: int) -> list[str]:
    job_ids = [str(uuid.uuid4()) for _ in range(count)]
    for job_id in job_ids:
        message = queues.JobMessage(job_id, "images", priority)
        await broker.js.publish(queues.subject(broker.prefix, "images", priority), message.encode())
    return job_ids


async def test_fetcher_drains_priority_1_before_a_priority_8_backlog_fifo_within_each(
    broker: Broker,
) -> None:
    backlog = await _publish(broker, 8, 5)
    urgent = await _publish(broker, 1, 2)
    fetcher = queues.PriorityFetcher(broker.nc, broker.prefix, "images")
    await fetcher.start()
    try:
        order = []
        for _ in range(7):
            msg = await fetcher.sweep()
            assert msg is not None
            order.append(queues.JobMessage.decode(msg.data))
            await msg.ack_sync()
        assert await fetcher.sweep() is None
    finally:
        await fetcher.stop()

    assert [m.job_id for m in order] == urgent + backlog
    assert [m.priority for m in order] == [1, 1, 8, 8, 8, 8, 8]
    # Work-queue retention: acknowledged messages are gone.
    assert await broker.stream_messages("images") == 0


async def _taken(next_message: Awaitable[Msg | None]) -> str:
    """The job id of the message ``next_message`` gives, acknowledged."""
    msg = await next_message
    assert msg is not None
    await msg.ack_sync()
    return queues.JobMessage.decode(msg.data).job_id


async def _ring(broker: Broker) -> None:
    """Rings the images doorbell as the outbox relay does after publishing, and lets it arrive."""
    await broker.nc.publish(queues.doorbell_subject(broker.prefix, "images"), b"")
    await broker.nc.flush()
    await asyncio.sleep(0.1)


async def _pull_requests(spy: Subscription) -> list[str]:
    """The consumers the pull requests seen by ``spy`` went to (``images-p5``, …), in order."""
    consumers = []
    while True:
        try:
            request = await spy.next_msg(timeout=0.2)
        except TimeoutError:
            return consumers
        consumers.append(request.subject.rsplit(".", 1)[1])


async def test_next_skips_the_empty_bands_above_the_last_message_until_the_doorbell_rings(
    broker: Broker,
) -> None:
    spy = await broker.nc.subscribe(f"$JS.API.CONSUMER.MSG.NEXT.{broker.stream('images')}.>")
    await broker.nc.flush()
    backlog = await _publish(broker, 5, 3)
    fetcher = queues.PriorityFetcher(broker.nc, broker.prefix, "images", idle_wait_seconds=30)
    await fetcher.start()
    stop = asyncio.Event()
    try:
        assert await _taken(fetcher.next(stop)) == backlog[0]
        assert await _pull_requests(spy) == [f"images-p{p}" for p in range(1, 6)]

        assert await _taken(fetcher.next(stop)) == backlog[1]
        assert await _pull_requests(spy) == ["images-p5"], "bands 1-4 were empty and nothing rang"

        # A publish rings the doorbell: the next sweep starts at priority 1 again.
        [urgent] = await _publish(broker, 1, 1)
        await _ring(broker)
        assert await _taken(fetcher.next(stop)) == urgent

        # The band of the last message (1) is empty now: the sweep goes on down to band 5.
        assert await _taken(fetcher.next(stop)) == backlog[2]
        await _pull_requests(spy)

        # A message above the start band that rang nothing (a redelivery) is found as soon as
        # the start band runs dry: that sweep goes on from priority 1 before it waits.
        [redelivered] = await _publish(broker, 2, 1)
        assert await _taken(asyncio.wait_for(fetcher.next(stop), timeout=5)) == redelivered
        assert await _pull_requests(spy) == [f"images-p{p}" for p in (*range(5, 11), 1, 2)]
    finally:
        await fetcher.stop()
        await spy.unsubscribe()


async def test_a_higher_band_message_that_rang_nothing_is_found_within_the_idle_wait(
    broker: Broker,
) -> None:
    """A nak'd or redelivered message does not ring the doorbell; while the worker stays busy with a
    lower band it is still taken first once ``idle_wait_seconds`` passed since the last full sweep."""
    backlog = await _publish(broker, 5, 3)
    fetcher = queues.PriorityFetcher(broker.nc, broker.prefix, "images", idle_wait_seconds=0.5)
    await fetcher.start()
    stop = asyncio.Event()
    try:
        assert await _taken(fetcher.next(stop)) == backlog[0]
        [redelivered] = await _publish(broker, 1, 1)
        await asyncio.sleep(0.6)

        assert await _taken(fetcher.next(stop)) == redelivered
    finally:
        await fetcher.stop()


async def test_next_batch_takes_up_to_the_batch_from_the_highest_band_only(broker: Broker) -> None:
    """A batch never mixes bands: the single priority-1 message comes alone although 3 were asked
    for; then the priority-5 backlog in order, 3 and then the last 1; a full batch leaves no stale
    reply behind (the next pulls answer for their own band: the priority-2 message is next)."""
    urgent = await _publish(broker, 1, 1)
    backlog = await _publish(broker, 5, 4)
    fetcher = queues.PriorityFetcher(broker.nc, broker.prefix, "images", idle_wait_seconds=30)
    await fetcher.start()
    stop = asyncio.Event()
    try:
        batches = []
        for _ in range(3):
            found = await fetcher.next_batch(stop, 3)
            batches.append([queues.JobMessage.decode(msg.data).job_id for msg in found])
            for msg in found:
                await msg.ack_sync()
        [later] = await _publish(broker, 2, 1)
        await _ring(broker)
        found = await fetcher.next_batch(stop, 3)
        batches.append([queues.JobMessage.decode(msg.data).job_id for msg in found])
        await found[0].ack_sync()
        with pytest.raises(ValueError, match="batch must be at least 1"):
            await fetcher.next_batch(stop, 0)
    finally:
        await fetcher.stop()

    assert batches == [urgent, backlog[:3], backlog[3:], [later]]
    assert await broker.stream_messages("images") == 0


async def test_ensure_streams_is_idempotent(broker: Broker) -> None:
    await queues.ensure_streams(broker.js, broker.prefix)

    for queue in ("images", "documents", "ocr", "media"):
        info = await broker.js.stream_info(broker.stream(queue))
        assert info.config.subjects == [f"{broker.prefix.lower()}.jobs.{queue}.>"]
        assert info.state.consumer_count == len(queues.PRIORITIES)
    bulk = await broker.js.stream_info(broker.stream("bulk"))
    assert bulk.config.subjects == [f"{broker.prefix.lower()}.jobs.bulk.>"]
    assert bulk.state.consumer_count == 4 * 4  # a lane per engine, bands 7-10
    consumer = await broker.js.consumer_info(broker.stream("bulk"), "bulk-images-p8")
    assert consumer.config.filter_subject == f"{broker.prefix.lower()}.jobs.bulk.images.p8"
    sched = await broker.js.stream_info(broker.stream("sched"))
    assert sched.config.subjects == [f"{broker.prefix.lower()}.jobs.sched.>"]
    assert sched.state.consumer_count == 4 * 10  # a lane per engine, every band (ADR 0073)
    consumer = await broker.js.consumer_info(broker.stream("sched"), "sched-ocr-p1")
    assert consumer.config.filter_subject == f"{broker.prefix.lower()}.jobs.sched.ocr.p1"


async def test_a_bulk_lane_takes_its_engines_bulk_jobs_only_in_bands_7_to_10(broker: Broker) -> None:
    """The bulk queue's lanes (ADR 0057): a job published for ``bulk.images`` is fetched by a
    ``bulk.images`` fetcher, not by the ``images`` one nor by ``bulk.documents``; a bulk route has
    no band above 7."""
    for route, job in (("bulk.images", "a"), ("images", "b")):
        await broker.js.publish(
            queues.subject(broker.prefix, route, 8), queues.JobMessage(job, route, 8).encode()
        )
    with pytest.raises(ValueError, match=r"priority of bulk\.images must be 7\.\.10"):
        queues.subject(broker.prefix, "bulk.images", 3)
    taken: dict[str, list[str]] = {}
    for route in ("bulk.documents", "images", "bulk.images"):
        fetcher = queues.PriorityFetcher(broker.nc, broker.prefix, route)
        await fetcher.start()
        try:
            msg = await fetcher.sweep()
            taken[route] = [] if msg is None else [queues.JobMessage.decode(msg.data).job_id]
            if msg is not None:
                await msg.ack_sync()
        finally:
            await fetcher.stop()
    assert taken == {"bulk.documents": [], "images": ["b"], "bulk.images": ["a"]}


async def test_empty_sweep_returns_none_quickly(broker: Broker) -> None:
    fetcher = queues.PriorityFetcher(broker.nc, broker.prefix, "images")
    await fetcher.start()
    try:
        started = time.monotonic()
        assert await fetcher.sweep() is None
        elapsed = time.monotonic() - started
    finally:
        await fetcher.stop()

    assert elapsed < 1.0


async def test_next_wakes_on_the_doorbell_rung_by_the_relay(fresh_pool: asyncpg.Pool, broker: Broker) -> None:
    fetcher = queues.PriorityFetcher(broker.nc, broker.prefix, "images", idle_wait_seconds=30)
    await fetcher.start()
    stop = asyncio.Event()
    try:
        waiting = asyncio.create_task(fetcher.next(stop))
        await asyncio.sleep(0.5)
        assert not waiting.done(), "an empty queue must make next() wait"
        [job_id] = await _enqueue(fresh_pool, broker.prefix, 1, priority=3)
        started = time.monotonic()
        assert (await OutboxRelay(fresh_pool, broker.nc, broker.js).run_once()).published == 1

        msg = await asyncio.wait_for(waiting, timeout=5)

        # Far sooner than the 30-second idle wait: the doorbell woke it.
        assert time.monotonic() - started < 5
        assert msg is not None
        assert queues.JobMessage.decode(msg.data).job_id == job_id
        await msg.ack()

        stopping = asyncio.create_task(fetcher.next(stop))
        await asyncio.sleep(0.2)
        stop.set()
        assert await asyncio.wait_for(stopping, timeout=5) is None
    finally:
        await fetcher.stop()


async def test_rows_without_a_stream_do_not_starve_later_batches(
    fresh_pool: asyncpg.Pool, broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full batch of rows that cannot be published must not hold back the rows behind it; they are
    tried again after the backoff."""
    monkeypatch.setattr(outbox, "FAILED_ROW_BACKOFF_SECONDS", 1.0)
    orphan_prefix = broker.prefix.lower() + "x"
    for n in range(3):
        await fresh_pool.execute(
            "INSERT INTO outbox (subject, msg_id, payload) VALUES ($1, $2, $3)",
            f"{orphan_prefix}.jobs.images.p1",
            f"orphan-{n}",
            {"job_id": str(uuid.uuid4()), "queue": "images", "priority": 1},
        )
    [job_id] = await _enqueue(fresh_pool, broker.prefix, 1)
    relay = OutboxRelay(fresh_pool, broker.nc, broker.js, batch_size=2)

    published = sum([(await relay.run_once()).published for _ in range(3)])

    assert published == 1
    assert await broker.stream_messages("images") == 1
    assert await fresh_pool.fetchval(
        "SELECT published_at IS NOT NULL FROM outbox WHERE payload->>'job_id' = $1", job_id
    )
    assert await _unpublished(fresh_pool) == 3
    # The stream appears; once the backoff has passed the rows go out.
    orphan_stream = broker.prefix + "X_IMAGES"
    await broker.js.add_stream(name=orphan_stream, subjects=[f"{orphan_prefix}.jobs.images.>"])
    try:
        assert (await relay.run_once()).published == 0, "still backing off"
        await asyncio.sleep(1.2)
        assert (await relay.run_once()).published == 2
        assert (await relay.run_once()).published == 1
        assert await _unpublished(fresh_pool) == 0
    finally:
        await broker.js.delete_stream(orphan_stream)


async def test_streams_are_kept_as_the_layout_says_and_a_layout_the_server_cannot_keep_is_refused(
    nats_url: str,
) -> None:
    """HM_STREAM_STORAGE=memory gives memory streams; three replicas on the session's single
    (unclustered) server is a configuration error naming the server's reason, not a crash."""
    prefix = "L" + uuid.uuid4().hex[:8].upper()
    nc, js = await queues.connect(nats_url, name=f"test-{prefix}")
    try:
        await queues.ensure_streams(js, prefix, queues.StreamLayout(storage="memory"))
        info = await js.stream_info(queues.stream_name(prefix, "images"))
        assert (info.config.storage, info.config.num_replicas) == (api.StorageType.MEMORY, 1)
        with pytest.raises(ConfigError, match=r"NATS refused stream .* HM_STREAM_REPLICAS=3"):
            await queues.ensure_streams(js, prefix, queues.StreamLayout(replicas=3, storage="memory"))
    finally:
        for queue in QUEUES:
            with contextlib.suppress(Exception):
                await js.delete_stream(queues.stream_name(prefix, queue))
        await nc.close()


async def test_a_session_host_that_never_answers_does_not_slow_the_relay(
    fresh_pool: asyncpg.Pool, broker: Broker
) -> None:
    """The relay's own listening connection (HM_DATABASE_SESSION_URL, ADR 0076) is opened
    beside the publishing, never in its way: with a host that accepts TCP and never speaks,
    rows still go out on the relay's poll (0.2 s here), each within 2 s, not at a connect
    timeout (asyncpg's default is 60 s)."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(100)
    relay = OutboxRelay(
        fresh_pool, broker.nc, broker.js, listen_dsn=f"postgresql://u@127.0.0.1:{silent.getsockname()[1]}/x"
    )
    stop = asyncio.Event()
    running = asyncio.create_task(relay.run(stop, poll_seconds=0.2))
    try:
        for _ in range(3):
            await _enqueue(fresh_pool, broker.prefix, 1)
            started = time.monotonic()
            while await _unpublished(fresh_pool):
                assert time.monotonic() - started < 2.0, "the row waited on the listener"
                await asyncio.sleep(0.05)
    finally:
        stop.set()
        await asyncio.wait_for(running, timeout=5)  # the listening task is cancelled, not awaited out
        silent.close()
