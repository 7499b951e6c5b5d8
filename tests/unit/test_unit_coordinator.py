"""The unit's media coordinator (hypermedia/worker/unit/coordinator.py): control's bookkeeping
(bounds per operation, FIFO grants, a withdrawn wait, a contained generation's grants freed), and
the mediaworker's handler asking it over a real unit socket with the attempt's identity."""

from __future__ import annotations

import asyncio
import os
import time
import types
from pathlib import Path
from typing import Any

import pytest

from hypermedia.worker.unit import peer
from hypermedia.worker.unit.channel import Channel, Execution
from hypermedia.worker.unit.coordinator import MAX_OUTSTANDING, MediaCoordinator, Request, TooManyRequests
from services.mediaworker.__main__ import MediaHandler
from services.mediaworker.settings import MediaSettings
from tests.helpers.media import admitted_by, media_job

OWN = peer.UnitIdentity("prod", "media-a", "ab" * 16, 2, 0)


def _req(request: int, operation: str = "transcode_audio", generation: int = 0) -> Request:
    return Request(generation, request, f"job-{request}", 1, operation)


def test_grants_follow_the_bounds_in_the_order_asked() -> None:
    c = MediaCoordinator({"transcode_video": 2, "transcode_audio": 1})
    assert c.request(_req(1)) == [_req(1)]
    assert c.request(_req(2)) == [] and c.request(_req(3)) == []  # waiting, in this order
    assert c.request(_req(2)) == []  # asked again: still one request
    assert c.request(_req(4, "probe")) == [_req(4, "probe")]  # no bound: at once
    assert c.request(_req(5, "transcode_video")) == [_req(5, "transcode_video")]
    assert c.release(0, 1) == [_req(2)]
    assert c.release(0, 2) == [_req(3)]
    assert c.holding("transcode_audio") == 1 and c.holding("transcode_video") == 1


def test_a_withdrawn_wait_is_never_granted() -> None:
    c = MediaCoordinator({"transcode_audio": 1})
    c.request(_req(1))
    c.request(_req(2))
    c.request(_req(3))
    assert c.release(0, 2) == []  # withdrawn while waiting
    assert c.release(0, 1) == [_req(3)]


def test_a_contained_generations_grants_and_waits_are_dropped() -> None:
    c = MediaCoordinator({"transcode_audio": 1})
    c.request(_req(1, generation=0))
    c.request(_req(2, generation=0))
    assert c.drop(0) == 1
    assert c.held == {} and c.request(_req(1, generation=1)) == [_req(1, generation=1)]
    assert c.release(0, 2) == []  # the old generation's request is gone, not granted


def test_a_request_number_is_one_request_whatever_operation_it_names() -> None:
    """Reusing a waiting request's number for another operation must not buy a second grant."""
    c = MediaCoordinator({"transcode_video": 1, "transcode_audio": 1})
    c.request(_req(1, "transcode_video"))
    assert c.request(_req(2, "transcode_video")) == []
    assert c.request(_req(2, "transcode_audio")) == []  # number 2 waits already
    assert c.release(0, 1) == [_req(2, "transcode_video")]
    assert c.holding("transcode_video") == 1 and c.holding("transcode_audio") == 0
    assert c.request(_req(3, "transcode_audio")) == [_req(3, "transcode_audio")]
    assert c.request(_req(4, "transcode_audio")) == []


def test_a_generation_may_not_ask_without_bound() -> None:
    c = MediaCoordinator({"transcode_audio": 1})
    for n in range(MAX_OUTSTANDING):
        c.request(_req(n))
    with pytest.raises(TooManyRequests):
        c.request(_req(MAX_OUTSTANDING))
    assert c.request(_req(0, generation=1)) == []  # another generation's count is its own
    c.release(0, 5)  # a withdrawn wait makes room
    assert c.request(_req(MAX_OUTSTANDING)) == []


@pytest.mark.parametrize(
    "message",
    [
        {"request": "1", "job_id": "j", "attempt": 1, "operation": "transcode_audio"},
        {"request": 1, "job_id": "j", "attempt": True, "operation": "transcode_audio"},
        {"request": 1, "attempt": 1, "operation": "transcode_audio"},
    ],
)
def test_a_request_without_the_attempts_identity_is_malformed(message: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="a media request needs"):
        Request.of(0, message)


def test_the_mediaworkers_handler_asks_controls_coordinator_over_the_socket(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The same bounds as the process's own coordinator (test_coordinator_and_limits.py), now
    kept by control: an audio rendition waits while another holds the grant, a video transcode
    and a probe do not; a cancelled wait leaves nothing held in control."""
    coordinator = MediaCoordinator({"transcode_video": 2, "transcode_audio": 1})
    path = str(tmp_path / "c.sock")
    # This test's process is execution: the channel takes its hello (SO_PEERCRED).
    ex = Execution(OWN, types.SimpleNamespace(pid=os.getpid()), None, time.monotonic(), ("w-1",))  # type: ignore[arg-type]
    handler = MediaHandler(
        MediaSettings.model_validate({"HM_MEDIA_MAX_VIDEO_JOBS": 1, "HM_MEDIA_MAX_AUDIO_JOBS": 9})
    )

    async def run() -> list[dict[str, Any]]:
        channel = Channel(lambda: OWN, lambda: ex, lambda: {"coordinator": coordinator.bounds}, coordinator)
        server = await asyncio.start_unix_server(channel.serve, path, limit=peer.MAX_MESSAGE_BYTES)
        link = peer.ControlLink(OWN, path, lambda m: None, lambda: {"busy": 0})
        await asyncio.wait_for(link.connect("w-1"), 5)
        handler.attach_control(link)
        reading = asyncio.create_task(link.run())

        async def admitted(operation: str) -> bool:
            return await admitted_by(handler, operation, 0.3)

        held = []
        async with handler.admit(media_job("transcode_audio")):
            held.append(dict(coordinator.held))
            assert not await admitted("transcode_audio")
            assert await admitted("transcode_video") and await admitted("probe")
            async with (
                handler.admit(media_job("transcode_video")),
                handler.admit(media_job("transcode_video")),
            ):
                assert not await admitted("transcode_video")
        for _ in range(50):  # the last release is on its way
            if not coordinator.held:
                break
            await asyncio.sleep(0.02)
        assert coordinator.held == {} and coordinator.waiting() == 0
        assert await admitted("transcode_audio")
        await link.close()
        await asyncio.wait_for(reading, 5)
        server.close()
        return [
            {"ops": [r.operation for r in h.values()], "attempts": [r.attempt for r in h.values()]}
            for h in held
        ]

    with caplog.at_level("INFO", logger="hypermedia.worker.unit.channel"):
        held = asyncio.run(run())
    assert held == [{"ops": ["transcode_audio"], "attempts": [1]}]  # control's bound, not the process's 9
    assert "media coordinator: transcode_audio granted (1 of 1)" in caplog.text
