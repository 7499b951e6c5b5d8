"""The mediaworker's lanes of one process share its media coordinator (seed 001's bounds: three
video jobs and one audio rendition at once per unit): control's, through one client per link,
or, without a unit, one set of semaphores. The scheduler consumer (ADR 0073) is such a lane."""

from __future__ import annotations

import asyncio
from typing import Any

from hypermedia.core import config
from hypermedia.jobs.lifecycle import ClaimedJob
from hypermedia.worker.unit import peer
from services.mediaworker.__main__ import MediaHandler
from services.mediaworker.settings import MediaSettings


def _job(job_id: str) -> Any:
    return type("Job", (), {"job_id": job_id, "attempt": 1, "operation": "transcode_video"})()


def test_without_a_unit_the_lanes_share_one_set_of_bounds() -> None:
    settings = config.load(MediaSettings)
    lane, consumer = MediaHandler(settings), MediaHandler(settings)
    assert lane.admit(_job("a")) is consumer.admit(_job("b"))  # the same semaphore


async def test_in_a_unit_every_lane_asks_control_through_one_client() -> None:
    """Two lanes' requests get ids 1 and 2 of one client, and each grant reaches its own."""
    sent: list[tuple[str, dict[str, Any]]] = []
    both_asked = asyncio.Event()

    async def send(kind: str, **body: Any) -> None:
        sent.append((kind, body))
        if len(sent) == 2:
            both_asked.set()

    identity = peer.UnitIdentity("local", "media", "0" * 32, 1, 0)
    link = peer.ControlLink(identity, "/nonexistent", lambda _message: None, dict)
    link.evidence = {"coordinator": {"video": 3, "audio": 1}}
    link.send = send  # type: ignore[method-assign]  # what the connection would write
    settings = config.load(MediaSettings)
    lane, consumer = MediaHandler(settings), MediaHandler(settings)
    lane.attach_control(link)
    consumer.attach_control(link)

    async def run(handler: MediaHandler, job_id: str, done: list[str]) -> None:
        job: ClaimedJob = _job(job_id)
        async with handler.admit(job):
            done.append(job_id)

    done: list[str] = []
    first = asyncio.create_task(run(lane, "ordinary", done))
    second = asyncio.create_task(run(consumer, "scheduled", done))
    await asyncio.wait_for(both_asked.wait(), 5)
    requests = {body["job_id"]: body["request"] for kind, body in sent if kind == "media_request"}
    assert sorted(requests.values()) == [1, 2]
    link.handlers["media_grant"]({"request": requests["scheduled"]})
    await second
    assert done == ["scheduled"] and not first.done()
    link.handlers["media_grant"]({"request": requests["ordinary"]})
    await first
    assert done == ["scheduled", "ordinary"]
