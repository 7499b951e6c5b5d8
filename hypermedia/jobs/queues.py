"""Job delivery over NATS JetStream with priorities.

JetStream has no per-message priority, so each queue is one stream with one subject per priority,
``{prefix}.jobs.{queue}.p{1..10}``, and one durable pull consumer per subject,
``{queue}-p{N}``. A worker asks the consumers in priority order with ``no_wait`` pull requests and
takes the first message it gets: the backlog of priority 1 is always drained before priority 2 is
looked at, and within one subject JetStream keeps publish (= creation) order. When every consumer
is empty the worker sleeps on a core-NATS doorbell subject ``{prefix}.ready.{queue}`` that the
outbox relay rings after publishing (with a timeout as the safety net). See docs/adr/0003.

A sweep need not ask the empty bands above the one that gave the last message every time (a
priority-5 job would cost four empty pulls): :meth:`PriorityFetcher.next` starts at that band
while nothing can have arrived above it, and sweeps from priority 1 again when the doorbell rang
(every publish through the outbox rings it), when the queue looked empty, and at least every
``idle_wait_seconds`` (a message nak'd with a delay or redelivered after ``ACK_WAIT_SECONDS`` does
not ring the doorbell; it is found within that bound, as an idle worker finds it).

The ``bulk`` queue (seed 000's batch regeneration and backfill, priorities 7-10 only) is one
stream with a lane per engine: a bulk job of an image operation is on
``{prefix}.jobs.bulk.images.p{7..10}`` (consumers ``bulk-images-p{N}``), and only a worker lane
configured for ``bulk.images`` takes it, with the image pipeline (ADR 0057). The ``sched`` queue
has the same shape with every band: the jobs of schedules' process runs are on
``{prefix}.jobs.sched.images.p{1..10}``, taken only by the one scheduler consumer a worker runs
beside its ordinary slots of that engine (ADR 0073). A job row's ``queue`` is its route: ``images``,
``bulk.images`` or ``sched.images``.

Streams use work-queue retention (a message is removed once acknowledged), file storage and a
two-minute duplicate window for ``Nats-Msg-Id`` de-duplication. Postgres is the system of record;
a message only says "job X may be ready".
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Final

import nats
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext, api
from nats.js.errors import APIError, BadRequestError, ServiceUnavailableError

from hypermedia.core.config import QUEUES, ROUTES, ConfigError, InfraSettings

log = logging.getLogger(__name__)

PRIORITIES = tuple(range(1, 11))
BULK = "bulk"
BULK_PRIORITIES = tuple(range(7, 11))
"""The bands of the bulk queue: seed 000's background priorities 7-10."""
SCHED = "sched"
"""The queue of scheduled work (seed 001's scheduler consumer): a lane per engine, every band."""
ENGINE_QUEUES = tuple(queue for queue in QUEUES if queue not in (BULK, SCHED))
ACK_WAIT_SECONDS = 30.0
"""A fetched message not acknowledged within this is delivered again."""
DUPLICATE_WINDOW_SECONDS = 120.0


def bulk_route(engine_queue: str) -> str:
    """The bulk queue's lane of an engine: ``bulk_route("images")`` → ``bulk.images``. Raises
    ValueError for a name that is not an engine's queue."""
    if engine_queue not in ENGINE_QUEUES:
        raise ValueError(f"no bulk lane for {engine_queue!r}: one of {', '.join(ENGINE_QUEUES)}")
    return f"{BULK}.{engine_queue}"


def sched_route(engine_queue: str) -> str:
    """The sched queue's lane of an engine: ``sched_route("images")`` → ``sched.images`` (ADR 0073).
    Raises ValueError for a name that is not an engine's queue."""
    if engine_queue not in ENGINE_QUEUES:
        raise ValueError(f"no sched lane for {engine_queue!r}: one of {', '.join(ENGINE_QUEUES)}")
    return f"{SCHED}.{engine_queue}"


def is_bulk(route: str) -> bool:
    """Whether ``route`` is a lane of the bulk queue (``bulk.images``)."""
    return route.startswith(BULK + ".")


def is_sched(route: str) -> bool:
    """Whether ``route`` is a lane of the sched queue (``sched.images``)."""
    return route.startswith(SCHED + ".")


def engine_of(route: str) -> str:
    """The engine's queue of a route: ``bulk.images`` and ``sched.images`` → ``images``,
    ``images`` → ``images``."""
    return route.removeprefix(BULK + ".").removeprefix(SCHED + ".")


def bands(route: str) -> tuple[int, ...]:
    """The priority bands a route has consumers for: 1-10 (a sched lane's too), or 7-10 for a bulk lane."""
    return BULK_PRIORITIES if is_bulk(route) else PRIORITIES


def _check_route(route: str) -> None:
    if route not in ROUTES:
        raise ValueError(f"not a queue route: {route[:40]!r} (one of {', '.join(ROUTES)})")


def stream_name(prefix: str, route: str) -> str:
    """Stream of one queue, e.g. ``HM_IMAGES``; every bulk lane is in ``HM_BULK``, every sched lane
    in ``HM_SCHED``."""
    return f"{prefix}_{route.split('.')[0].upper()}"


def subject(prefix: str, route: str, priority: int) -> str:
    """Subject of one priority band of a route, e.g. ``hm.jobs.images.p1``, ``hm.jobs.bulk.images.p8``.
    Raises ValueError for an unknown route or a band the route does not have (:func:`bands`)."""
    _check_route(route)
    if priority not in bands(route):
        allowed = bands(route)
        raise ValueError(f"priority of {route} must be {allowed[0]}..{allowed[-1]}, got {priority}")
    return f"{prefix.lower()}.jobs.{route}.p{priority}"


def doorbell_subject(prefix: str, route: str) -> str:
    """Core-NATS subject rung after messages were published to ``route`` (``hm.ready.bulk.images``)."""
    return f"{prefix.lower()}.ready.{route}"


def doorbell_for(job_subject: str) -> str:
    """The doorbell of the route a job subject belongs to (``hm.jobs.images.p1`` →
    ``hm.ready.images``, ``hm.jobs.bulk.images.p8`` → ``hm.ready.bulk.images``)."""
    prefix, _jobs, *route, _band = job_subject.split(".")
    return doorbell_subject(prefix, ".".join(route))


def consumer_name(route: str, priority: int) -> str:
    """The durable consumer of one band of a route: ``images-p1``, ``bulk-images-p8``."""
    return f"{route.replace('.', '-')}-p{priority}"


@dataclass(frozen=True)
class JobMessage:
    """Payload of a queue message: which job may be ready. Everything else is read from Postgres."""

    job_id: str
    queue: str
    priority: int

    def encode(self) -> bytes:
        return json.dumps({"job_id": self.job_id, "queue": self.queue, "priority": self.priority}).encode()

    @classmethod
    def decode(cls, data: bytes) -> JobMessage:
        """Raises ValueError for a payload that is not a job message."""
        try:
            raw = json.loads(data)
            return cls(str(raw["job_id"]), str(raw["queue"]), int(raw["priority"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"not a job message: {exc}") from None


async def connect(url: str, name: str) -> tuple[NatsClient, JetStreamContext]:
    """Connect to NATS (reconnecting forever) and return the client and its JetStream context.
    ``url`` is one server URL or a comma list of a cluster's (``HM_NATS_URL``): each is tried, and
    on a lost connection the client moves to another."""
    servers = [server.strip() for server in url.split(",") if server.strip()]
    nc = await nats.connect(servers, name=name, max_reconnect_attempts=-1, reconnect_time_wait=0.5)
    return nc, nc.jetstream()


@dataclass(frozen=True)
class StreamLayout:
    """How the queue streams are kept (``HM_STREAM_*``): replicas, storage, placement."""

    replicas: int = 1
    storage: str = "file"
    placement: str = ""
    """``cluster=…`` and ``tag=…`` entries, comma-separated; empty: anywhere."""

    @classmethod
    def of(cls, infra: InfraSettings) -> StreamLayout:
        return cls(infra.stream_replicas, infra.stream_storage, infra.stream_placement)

    def placement_config(self) -> api.Placement | None:
        """The placement the setting names. Raises ConfigError for an entry that is neither
        ``cluster=…`` nor ``tag=…``."""
        if not self.placement.strip():
            return None
        cluster, tags = None, []
        for entry in (e.strip() for e in self.placement.split(",") if e.strip()):
            key, _, value = entry.partition("=")
            if key == "cluster" and value:
                cluster = value
            elif key == "tag" and value:
                tags.append(value)
            else:
                raise ConfigError(f"HM_STREAM_PLACEMENT: {entry!r} is neither cluster=NAME nor tag=TAG")
        return api.Placement(cluster=cluster, tags=tags or None)


MIN_CLUSTER_VERSION: Final = (2, 12, 3)
"""The oldest NATS server the streams may be replicated on: the JetStream fixes of 2.12.3 after
Jepsen's 2025 analysis of NATS 2.12.1 (lost acknowledged writes under process crashes and
partitions with replicated streams)."""


def check_server(version: str, layout: StreamLayout) -> None:
    """Refuses (ConfigError) replicated streams on a NATS server older than
    :data:`MIN_CLUSTER_VERSION`; ``version`` is the server's (``"2.12.3"``)."""
    if layout.replicas <= 1:
        return
    numbers = re.match(r"(\d+)\.(\d+)\.(\d+)", version)
    found = tuple(int(n) for n in numbers.groups()) if numbers else (0, 0, 0)
    if found < MIN_CLUSTER_VERSION:
        wanted = ".".join(map(str, MIN_CLUSTER_VERSION))
        raise ConfigError(
            f"HM_STREAM_REPLICAS={layout.replicas} needs NATS {wanted} or later (the JetStream fixes "
            f"after Jepsen's 2025 analysis); the server is {version or 'of an unknown version'}"
        )


async def ensure_streams(js: JetStreamContext, prefix: str, layout: StreamLayout = StreamLayout()) -> None:
    """Create (or update) the six queue streams, kept as ``layout`` says, and the durable
    consumer of every band of every route (:data:`ROUTES`: 10 per engine queue and per sched
    lane, 4 per bulk lane). Raises ConfigError for a bad placement."""
    for queue in QUEUES:
        name = stream_name(prefix, queue)
        config = api.StreamConfig(
            name=name,
            subjects=[f"{prefix.lower()}.jobs.{queue}.>"],
            retention=api.RetentionPolicy.WORK_QUEUE,
            storage=api.StorageType.MEMORY if layout.storage == "memory" else api.StorageType.FILE,
            num_replicas=layout.replicas,
            placement=layout.placement_config(),
            duplicate_window=DUPLICATE_WINDOW_SECONDS,
            max_msg_size=64 * 1024,
            discard=api.DiscardPolicy.NEW,
        )
        try:
            try:
                await js.add_stream(config)
            except BadRequestError:  # it exists: with this layout, or one to change
                await js.update_stream(config)
        except ServiceUnavailableError:
            raise  # JetStream not ready yet: the caller's retry, not a configuration
        except APIError as exc:
            # The server cannot keep the stream as asked (replicas on a single server, a
            # placement no server matches, a change of storage): a configuration to fix.
            raise ConfigError(
                f"NATS refused stream {name} with HM_STREAM_REPLICAS={layout.replicas}, "
                f"HM_STREAM_STORAGE={layout.storage}, HM_STREAM_PLACEMENT={layout.placement!r}: "
                f"{exc.description}"
            ) from None
        bands_of_stream = [(r, p) for r in ROUTES if r.split(".")[0] == queue for p in bands(r)]
        for route, priority in bands_of_stream:
            await js.add_consumer(
                name,
                api.ConsumerConfig(
                    durable_name=consumer_name(route, priority),
                    filter_subject=subject(prefix, route, priority),
                    ack_policy=api.AckPolicy.EXPLICIT,
                    ack_wait=ACK_WAIT_SECONDS,
                    max_ack_pending=10_000,
                    deliver_policy=api.DeliverPolicy.ALL,
                ),
            )


class PriorityFetcher:
    """Takes the next message of a queue in priority order (see the module docstring).

    Args:
        nc: connected NATS client.
        prefix: stream prefix (``HM_STREAM_PREFIX``).
        queue: the route (:data:`ROUTES`): a queue's name, or a bulk lane's (``bulk.images``).
        idle_wait_seconds: longest sleep between sweeps when the queue is empty.
    """

    def __init__(self, nc: NatsClient, prefix: str, queue: str, idle_wait_seconds: float = 1.0) -> None:
        self._nc = nc
        self._stream = stream_name(prefix, queue)
        self._queue = queue
        self._doorbell_subject = doorbell_subject(prefix, queue)
        self._idle_wait = idle_wait_seconds
        self._bands = bands(queue)
        self._rung = asyncio.Event()
        self._rung_since_full_sweep = True
        """Set by the doorbell: a band above :attr:`_start_band` may have messages again."""
        self._start_band = self._bands[0]
        """The band that gave the last message; the bands above it were empty at :attr:`_full_at`."""
        self._full_at = float("-inf")
        """When the last sweep from priority 1 started (``time.monotonic()``)."""
        self._doorbell: Subscription | None = None
        self._inbox: Subscription | None = None

    async def start(self) -> None:
        async def ring(_msg: Msg) -> None:
            self._rung_since_full_sweep = True
            self._rung.set()

        self._doorbell = await self._nc.subscribe(self._doorbell_subject, cb=ring)
        # Pull responses come on a private inbox. JetStream delivers a message with its original
        # subject (routed by subscription id), so nc.request()'s reply matching cannot be used.
        self._inbox = await self._nc.subscribe(self._nc.new_inbox())

    async def stop(self) -> None:
        for sub in (self._doorbell, self._inbox):
            if sub is not None:
                await sub.unsubscribe()
        self._doorbell = self._inbox = None

    async def _pull(self, priority: int, batch: int) -> list[Msg]:
        """A ``no_wait`` pull of up to ``batch`` messages from the band's consumer: the server
        answers at once with the messages it has, ended by a 404/408 status when they are fewer
        than ``batch`` (none: the band is empty right now)."""
        assert self._inbox is not None, "start() first"
        api_subject = f"$JS.API.CONSUMER.MSG.NEXT.{self._stream}.{consumer_name(self._queue, priority)}"
        await self._nc.publish(
            api_subject, json.dumps({"batch": batch, "no_wait": True}).encode(), reply=self._inbox.subject
        )
        messages: list[Msg] = []
        while len(messages) < batch:
            try:
                msg = await self._inbox.next_msg(timeout=5.0)
            except nats.errors.TimeoutError:
                break
            if msg.headers and msg.headers.get("Status"):
                # 404 No Messages / 408 Request Timeout: nothing more in this band right now.
                break
            messages.append(msg)
        return messages

    async def sweep(self) -> Msg | None:
        """One pass over the route's bands (1..10, or 7..10 for bulk); the first message found, or None."""
        found = await self._sweep_from(self._bands[0], 1)
        return found[0] if found else None

    async def _sweep_from(self, first: int, batch: int) -> list[Msg]:
        """One pass over the bands ``first``..10: up to ``batch`` messages of the first band that
        has any (none of a lower band), remembering that band."""
        if first == self._bands[0]:
            self._rung_since_full_sweep = False
            self._full_at = time.monotonic()
        for priority in range(first, self._bands[-1] + 1):
            found = await self._pull(priority, batch)
            if found:
                self._start_band = priority
                return found
        return []

    def _first_band(self) -> int:
        """Where the next sweep starts: the last message's band while no band above it can have
        received a message since they were seen empty, else priority 1 (see the module docstring)."""
        if self._rung_since_full_sweep or time.monotonic() - self._full_at >= self._idle_wait:
            return self._bands[0]
        return self._start_band

    async def next(self, stop: asyncio.Event) -> Msg | None:
        """The next message, waiting (doorbell or ``idle_wait_seconds``) while the queue is empty.
        Returns None once ``stop`` is set."""
        found = await self.next_batch(stop, 1)
        return found[0] if found else None

    async def next_batch(self, stop: asyncio.Event, batch: int) -> list[Msg]:
        """The next 1..``batch`` messages, all of the highest band that has any, in delivery order
        (a worker with ``batch`` free slots asks for that many: none is taken that cannot start
        now); waits (doorbell or ``idle_wait_seconds``) while the queue is empty. Returns [] once
        ``stop`` is set. Raises ValueError when ``batch`` < 1."""
        if batch < 1:
            raise ValueError(f"batch must be at least 1, got {batch}")
        while not stop.is_set():
            self._rung.clear()
            first = self._first_band()
            found = await self._sweep_from(first, batch)
            if not found and first != self._bands[0]:
                found = await self._sweep_from(self._bands[0], batch)
            if found:
                return found
            waiters = [asyncio.ensure_future(self._rung.wait()), asyncio.ensure_future(stop.wait())]
            _done, pending = await asyncio.wait(
                waiters, timeout=self._idle_wait, return_when=asyncio.FIRST_COMPLETED
            )
            for task in pending:
                task.cancel()
        return []


async def open_jetstream(
    stack: AsyncExitStack, infra: InfraSettings, client_name: str
) -> tuple[NatsClient, JetStreamContext]:
    """A NATS connection (drained when ``stack`` unwinds) with the queue streams in place, kept as
    ``HM_STREAM_*`` say. Raises ConfigError (exit 78) for replicated streams on a server older
    than :data:`MIN_CLUSTER_VERSION`, or a bad placement."""
    nc, js = await connect(infra.nats_url, client_name)
    stack.push_async_callback(nc.drain)
    layout = StreamLayout.of(infra)
    server = nc.connected_server_version
    check_server(f"{server.major}.{server.minor}.{server.patch}", layout)
    await ensure_streams(js, infra.stream_prefix, layout)
    return nc, js
