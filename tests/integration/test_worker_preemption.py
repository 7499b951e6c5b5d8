"""A spot worker's interruption notice (hypermedia/worker/preemption.py) from a small fake instance
metadata service speaking EC2's IMDSv2 and GCE's metadata API over real HTTP: mid-job, the notice
cuts the drain to the time left, the running job is handed back ``preempted`` (its attempts
against ``max_attempts`` unchanged) and another worker completes it."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import threading
from collections.abc import Awaitable, Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from hypermedia.worker import preemption
from tests.integration.test_worker_runtime import ORIGINAL, Rig, _status_is, _true, make_rig  # noqa: F401 (fixture)


class Metadata(ThreadingHTTPServer):
    """EC2's and GCE's metadata endpoints; :attr:`notice_in` set posts a notice (seconds ahead)."""

    notice_in: float | None = None
    token = "tok-123"
    seen_tokens: list[str]

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.seen_tokens = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: Metadata

    def log_message(self, *args: Any) -> None:
        pass

    def _reply(self, code: int, body: str = "") -> None:
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_PUT(self) -> None:
        if self.path == "/latest/api/token" and self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
            self._reply(200, self.server.token)
        else:
            self._reply(400)

    def do_GET(self) -> None:
        notice = self.server.notice_in
        if self.path == "/latest/meta-data/spot/instance-action":
            self.server.seen_tokens.append(self.headers.get("X-aws-ec2-metadata-token", ""))
            if self.headers.get("X-aws-ec2-metadata-token") != self.server.token:
                self._reply(401)
            elif notice is None:
                self._reply(404, "Not Found")
            else:
                when = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=notice)
                self._reply(
                    200, json.dumps({"action": "terminate", "time": when.strftime("%Y-%m-%dT%H:%M:%SZ")})
                )
        elif (
            self.path == "/computeMetadata/v1/instance/preempted"
            and self.headers.get("Metadata-Flavor") == "Google"
        ):
            self._reply(200, "FALSE" if notice is None else "TRUE")
        else:
            self._reply(404)


@pytest.fixture
def metadata() -> Iterator[Metadata]:
    server = Metadata()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


async def test_a_notice_mid_job_hands_it_back_preempted_and_another_worker_completes_it(
    make_rig: Callable[..., Awaitable[Rig]],  # noqa: F811 (the fixture imported above)
    metadata: Metadata,
) -> None:
    spot = await make_rig(
        HM_SPOT_NOTICE="ec2",
        HM_SPOT_METADATA_URL=metadata.url,
        HM_SPOT_POLL_SECONDS=0.1,
        HM_DRAIN_SECONDS=300,
    )
    spot.sandbox.hold.clear()  # the job runs until the drain ends it
    job_id = await spot.job()
    await spot.publish(job_id)
    async with spot.loop() as (stop, task):
        watching = asyncio.create_task(preemption.watch(spot.runtime.settings, [spot.runtime], stop))
        spot.runtime.drain_requested = stop.set
        await asyncio.wait_for(spot.sandbox.started.wait(), 15)
        await asyncio.sleep(0.3)
        assert not stop.is_set() and not watching.done(), "no notice yet: the worker goes on"
        metadata.notice_in = 12.0  # reclaimed in 12 s: the drain gets 12 - 10 = 2 s of it
        loop = asyncio.get_running_loop()
        noticed = loop.time()
        await asyncio.wait_for(task, 15)
        took = loop.time() - noticed
        await watching
    assert took < 6, f"the drain was cut to the notice, not HM_DRAIN_SECONDS (took {took:.1f}s)"
    assert set(metadata.seen_tokens) == {metadata.token}, "IMDSv2: every read with the session token"
    assert spot.sandbox.cancelled == [job_id]
    row = await spot.row(job_id)
    assert (row["status"], row["attempt_count"] - row["lost_attempts"]) == ("queued", 0)
    assert await spot.attempts(job_id) == [(1, spot.runtime.worker_id, "preempted", "PREEMPTED")]

    elsewhere = await make_rig()
    elsewhere.storage.put_original(f"objects/{spot.tenant.object_id}", ORIGINAL)
    await elsewhere.publish(job_id)
    await elsewhere.run_until(lambda: _status_is(elsewhere, job_id, "completed"))
    attempts = await elsewhere.attempts(job_id)
    assert [(a[2], a[3]) for a in attempts] == [("preempted", "PREEMPTED"), ("completed", None)]
    assert attempts[1][1] == elsewhere.runtime.worker_id


async def test_gce_preemption_is_read_from_its_metadata_flag(
    make_rig: Callable[..., Awaitable[Rig]],  # noqa: F811 (the fixture imported above)
    metadata: Metadata,
) -> None:
    rig = await make_rig(HM_SPOT_NOTICE="gce", HM_SPOT_METADATA_URL=metadata.url)
    settings = rig.runtime.settings
    import httpx

    async with httpx.AsyncClient() as http:
        assert await preemption.notice_seconds(settings, http, []) is None
        metadata.notice_in = 0.0
        assert await preemption.notice_seconds(settings, http, []) == preemption.GCE_NOTICE_SECONDS
    # An unreachable metadata service is asked again, never a stop.
    unreachable = rig.runtime.settings.model_copy(
        update={"spot_metadata_url": "http://127.0.0.1:9", "spot_poll_seconds": 0.05}
    )
    stop = asyncio.Event()
    watching = asyncio.create_task(preemption.watch(unreachable, [rig.runtime], stop))
    await asyncio.sleep(0.5)
    assert not watching.done() and rig.runtime.preempted_within is None
    stop.set()
    await asyncio.wait_for(watching, 5)
    assert await _true(True)
