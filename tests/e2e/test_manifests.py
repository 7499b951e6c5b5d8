"""Resolved outputs end to end (``GET /v1/jobs/{job_id}/outputs/{output_type}/resolved``): an HLS
ladder and a sprite thumbnail track whose references to sibling outputs become URLs a player
fetches without an API key, on the real platform.

The platform runs without a mediaworker, so the jobs the tests create through REST stay queued
until the test does a worker's part itself, the way the worker runtime does it: claim
(``lifecycle.claim``), presigned PUT of each output under its rendition key, ``RegisterOutput``,
``lifecycle.complete``, credits ``Commit``. The outputs are what the media jobs will write (a real
fragmented MP4 from PyAV, a real JPEG); the operation is ``poster``, the media operation that
exists today — the endpoint goes by the outputs' media types, never by the operation."""

from __future__ import annotations

import asyncio
import hashlib
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import httpx
import pytest

from hypermedia.api.credits.v1 import credits_pb2_grpc
from hypermedia.api.storage.v1 import storage_pb2, storage_pb2_grpc
from hypermedia.infra import db
from hypermedia.jobs import lifecycle, settlement
from hypermedia.worker import transfer
from services.gateway.resolved import LinkSigner
from tests.e2e.conftest import RunningPlatform, isolated_platform, upload
from tests.helpers.media import write_video

HLS = "application/vnd.apple.mpegurl"
WORKER_ID = "test/manifests/worker"
SPRITE_JPEG = Path(__file__).resolve().parents[1] / "data" / "exif-orientation" / "Landscape_1.jpg"


@dataclass(frozen=True)
class Stored:
    """An output the test stores for a job: what a worker would upload."""

    output_type: str
    mime_type: str
    content: bytes


# --- the platform and a worker's part ------------------------------------------------------------


@pytest.fixture(scope="module")
def media_platform(tmp_root: Path, database_url: str, nats_url: str) -> Iterator[RunningPlatform]:
    # No workers: a job stays queued until the test completes it.
    with isolated_platform(
        tmp_root, database_url, nats_url, "manifests", "credits,storage,gateway"
    ) as running:
        yield running


@pytest.fixture(scope="module")
def tenant(media_platform: RunningPlatform) -> Iterator[httpx.Client]:
    with media_platform.client(media_platform.admin("create-account", "--credits", "1000")) as client:
        yield client


@pytest.fixture(scope="module")
def source(tenant: httpx.Client, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The uploaded video the jobs derive from."""
    return upload(tenant, write_video(tmp_path_factory.mktemp("src") / "clip.mp4", seconds=1.0))


def _create_job(client: httpx.Client, object_id: str) -> str:
    created = client.post("/v1/hypermedia/process", json={"object_id": object_id, "operations": ["poster"]})
    assert created.status_code == 202, created.text
    return str(created.json()["job_ids"][0])


async def _work(platform: RunningPlatform, job_id: str, outputs: list[Stored]) -> None:
    """Claim ``job_id``, store and register ``outputs`` and complete the job, as a worker does."""
    pool = await db.create_pool(platform.info["database_url"], max_size=2)
    try:
        job = await lifecycle.claim(pool, job_id, WORKER_ID)
        assert job is not None, "the job was not queued"
        async with (
            platform.internal_aio_channel(platform.info["storage_addr"], "imageworker") as storage_chan,
            platform.internal_aio_channel(platform.info["credits_addr"], "imageworker") as credits_chan,
            httpx.AsyncClient(timeout=30) as http,
        ):
            # As a worker does: one grant for the job's attempt, the uploads, one registration.
            storage = storage_pb2_grpc.StorageServiceStub(storage_chan)
            granted = await storage.GrantJob(
                storage_pb2.GrantJobRequest(job_id=job.job_id, attempt=job.attempt)
            )
            uploads = []
            for out in outputs:
                key = granted.outputs.key_prefix + transfer.rendition_name(job, out.output_type)
                digest = hashlib.sha256(out.content).hexdigest()
                stored = await transfer.send_output(
                    http, granted.outputs, key, out.content, out.mime_type, digest
                )
                assert stored.is_success, stored.text
                uploads.append(
                    storage_pb2.OutputUpload(
                        key=key, mime_type=out.mime_type, size_bytes=len(out.content), sha256=digest
                    )
                )
            done = await storage.RegisterOutputs(
                storage_pb2.RegisterOutputsRequest(job_id=job.job_id, attempt=job.attempt, outputs=uploads)
            )
            registered = [
                lifecycle.Output(out.output_type, obj.object_id, up.key, out.mime_type, len(out.content), {})
                for out, up, obj in zip(outputs, uploads, done.objects, strict=True)
            ]
            assert await lifecycle.complete(pool, job, WORKER_ID, registered, job.estimated_credits, 5, 20)
            await credits_pb2_grpc.CreditsServiceStub(credits_chan).Commit(
                settlement.commit_request(job_id, job.estimated_credits, {})
            )
    finally:
        await pool.close()


def completed_job(
    platform: RunningPlatform, client: httpx.Client, object_id: str, outputs: list[Stored]
) -> str:
    """A job created through REST and completed with ``outputs``; its id."""
    job_id = _create_job(client, object_id)
    asyncio.run(_work(platform, job_id, outputs))
    job = client.get(f"/v1/jobs/{job_id}").json()
    assert job["status"] == "completed" and len(job["outputs"]) == len(outputs)
    return job_id


# --- the HLS ladder -------------------------------------------------------------------------------

MASTER = (
    "#EXTM3U\n"
    "#EXT-X-VERSION:7\n"
    "#EXT-X-INDEPENDENT-SEGMENTS\n"
    '#EXT-X-SESSION-DATA:DATA-ID="com.example.title",URI="title.json"\n'
    '#EXT-X-STREAM-INF:BANDWIDTH=1500000,RESOLUTION=1280x720,CODECS="avc1.64001f,mp4a.40.2"\n'
    "hls_720p\n"
    '#EXT-X-STREAM-INF:BANDWIDTH=600000,RESOLUTION=640x360,CODECS="avc1.64001e,mp4a.40.2"\n'
    "hls_360p\n"
    "#EXT-X-STREAM-INF:BANDWIDTH=200000\n"
    "hls_160p\n"  # not an output of the job: left as it is
)


def _media_playlist(name: str, size: int) -> str:
    """A single-file fMP4 rendition: the init section and two segments as byte ranges of ``name``."""
    init, first = 800, (size - 800) // 2
    return (
        "#EXTM3U\n"
        "#EXT-X-VERSION:7\n"
        "#EXT-X-TARGETDURATION:4\n"
        "#EXT-X-PLAYLIST-TYPE:VOD\n"
        f'#EXT-X-MAP:URI="{name}",BYTERANGE="{init}@0"\n'
        "#EXTINF:4.000,\n"
        f"#EXT-X-BYTERANGE:{first}@{init}\n"
        f"{name}\n"
        "#EXTINF:2.000,\n"
        f"#EXT-X-BYTERANGE:{size - init - first}@{init + first}\n"
        f"{name}\n"
        "#EXT-X-ENDLIST\n"
    )


@dataclass(frozen=True)
class Ladder:
    job_id: str
    media: dict[str, bytes]
    """Rendition name (``hls_720p``) → the bytes of its fMP4."""


@pytest.fixture(scope="module")
def ladder(
    media_platform: RunningPlatform,
    tenant: httpx.Client,
    source: dict[str, Any],
    tmp_path_factory: pytest.TempPathFactory,
) -> Ladder:
    tmp = tmp_path_factory.mktemp("hls")
    fragmented = {"movflags": "frag_keyframe+empty_moov+default_base_moof"}
    media = {
        name: write_video(
            tmp / f"{name}.mp4", seconds=seconds, container_format="mp4", options=fragmented
        ).read_bytes()
        for name, seconds in (("hls_720p", 2.0), ("hls_360p", 1.0))
    }
    outputs = [Stored("hls_master", HLS, MASTER.encode())]
    for name, content in media.items():
        outputs.append(Stored(name, HLS, _media_playlist(f"{name}_media", len(content)).encode()))
        outputs.append(Stored(f"{name}_media", "video/mp4", content))
    return Ladder(completed_job(media_platform, tenant, source["object_id"], outputs), media)


def _resolved_path(job_id: str, output_type: str) -> str:
    return f"/v1/jobs/{job_id}/outputs/{output_type}/resolved"


def _max_age(response: httpx.Response) -> int:
    match = re.fullmatch(r"private, max-age=(\d+)", response.headers["cache-control"])
    assert match, response.headers["cache-control"]
    return int(match.group(1))


def _expires(url: str) -> int:
    return int(parse_qs(urlsplit(url).query)["expires"][0])


def test_a_master_playlist_links_variants_a_player_fetches_without_a_key(
    media_platform: RunningPlatform, tenant: httpx.Client, ladder: Ladder
) -> None:
    before = time.time()
    output_expires = _expires(tenant.get(f"/v1/jobs/{ladder.job_id}").json()["outputs"][0]["url"])
    master = tenant.get(_resolved_path(ladder.job_id, "hls_master"))
    elapsed = time.time() - before
    storage_ttl = output_expires - before
    assert master.status_code == 200, master.text
    assert master.headers["content-type"] == HLS
    assert 0 < _max_age(master) < storage_ttl
    lines = master.text.split("\n")
    kept = [line for i, line in enumerate(MASTER.split("\n")) if i not in (5, 7)]
    assert [line for i, line in enumerate(lines) if i not in (5, 7)] == kept  # tags, the unknown variant
    assert 'URI="title.json"' in lines[3] and lines[9] == "hls_160p"

    for index, name in ((5, "hls_720p"), (7, "hls_360p")):
        variant_url = lines[index]
        parts = urlsplit(variant_url)
        assert f"{parts.scheme}://{parts.netloc}" == media_platform.rest_url
        assert parts.path == _resolved_path(ladder.job_id, name)
        # The URLs live the storage TTL plus the longest variant's playing time (6 s): against a
        # URL signed just before the master, whatever the requests took on a loaded machine.
        assert 5 <= _expires(variant_url) - output_expires <= 7 + elapsed

        variant = httpx.get(variant_url, timeout=30)  # a player: no API key
        assert variant.status_code == 200, variant.text
        assert variant.headers["content-type"] == HLS
        assert variant.headers["access-control-allow-origin"] == "*"
        assert 0 < _max_age(variant) < storage_ttl
        content = ladder.media[name]
        expected = _media_playlist(f"{name}_media", len(content))
        media_urls = re.findall(r'URI="([^"]+)"', variant.text) + [
            line for line in variant.text.split("\n") if line.startswith("http")
        ]
        assert len(media_urls) == 3 and len(set(media_urls)) == 1
        media_url = media_urls[0]
        assert variant.text == expected.replace(f"{name}_media\n", f"{media_url}\n").replace(
            f'URI="{name}_media"', f'URI="{media_url}"'
        )

        whole = httpx.get(media_url, timeout=30)
        assert whole.status_code == 200 and whole.content == content
        assert whole.headers["content-type"] == "video/mp4" and whole.headers["accept-ranges"] == "bytes"
        # The first segment, as a player asks for it: #EXT-X-BYTERANGE:<n>@<o> → bytes=o-(o+n-1).
        n, o = map(int, re.findall(r"#EXT-X-BYTERANGE:(\d+)@(\d+)", variant.text)[0])
        part = httpx.get(media_url, headers={"Range": f"bytes={o}-{o + n - 1}"}, timeout=30)
        assert part.status_code == 206
        assert part.headers["content-range"] == f"bytes {o}-{o + n - 1}/{len(content)}"
        assert part.content == content[o : o + n]


def test_a_signature_opens_exactly_its_output_until_it_expires(
    media_platform: RunningPlatform, tenant: httpx.Client, ladder: Ladder
) -> None:
    master = tenant.get(_resolved_path(ladder.job_id, "hls_master")).text.split("\n")
    url = urlsplit(master[5])
    query = {k: v[0] for k, v in parse_qs(url.query).items()}
    path_720, path_360 = url.path, _resolved_path(ladder.job_id, "hls_360p")
    base = media_platform.rest_url

    def get(path: str, **params: str) -> httpx.Response:
        return httpx.get(f"{base}{path}?{urlencode(params)}", timeout=30)

    assert get(path_720, **query).status_code == 200
    flipped = query["sig"][:-1] + ("0" if query["sig"][-1] != "0" else "1")
    for path, params in (
        (path_720, {**query, "sig": flipped}),  # tampered
        (path_720, {**query, "expires": str(int(query["expires"]) + 1)}),  # a longer life
        (path_360, query),  # another output's signature
        (_resolved_path(ladder.job_id, "hls_master"), query),
        (path_720, {"sig": query["sig"]}),
        (path_720, {"expires": query["expires"]}),
    ):
        rejected = get(path, **params)
        assert rejected.status_code == 403, (path, params, rejected.text)
        assert rejected.json()["error_code"] == "URL_REJECTED"

    # The scheme as documented, with the platform's own HM_GATEWAY_SECRET_KEY: a well-signed URL
    # whose time is up is refused, one whose time is not is served.
    signer = LinkSigner.from_secret((media_platform.state_dir / "gateway.key").read_text().strip())
    past = int(time.time()) - 1
    expired = get(path_360, expires=str(past), sig=signer.sign(ladder.job_id, "hls_360p", past))
    assert expired.status_code == 403 and expired.json()["error_code"] == "URL_REJECTED"
    later = int(time.time()) + 60
    assert (
        get(path_360, expires=str(later), sig=signer.sign(ladder.job_id, "hls_360p", later)).status_code
        == 200
    )

    unauthenticated = httpx.get(f"{base}{path_720}", timeout=30)
    assert unauthenticated.status_code == 401 and unauthenticated.json()["error_code"] == "UNAUTHENTICATED"


def test_others_jobs_unknown_outputs_unfinished_jobs_and_media_are_refused(
    media_platform: RunningPlatform, tenant: httpx.Client, source: dict[str, Any], ladder: Ladder
) -> None:
    with media_platform.client(media_platform.admin("create-account", "--credits", "10")) as other:
        mine = other.get(_resolved_path(ladder.job_id, "hls_master"))
        assert mine.status_code == 404 and mine.json()["error_code"] == "NOT_FOUND"
    for path in (
        _resolved_path(ladder.job_id, "hls_160p"),  # not an output of the job
        _resolved_path("5c2e0a53-3bd4-4f0e-9d51-8b1f3b9f4a10", "hls_master"),
        _resolved_path("not-a-job", "hls_master"),
    ):
        missing = tenant.get(path)
        assert missing.status_code == 404 and missing.json()["error_code"] == "NOT_FOUND", path

    media = tenant.get(_resolved_path(ladder.job_id, "hls_720p_media"))
    assert media.status_code == 415 and media.json()["error_code"] == "OUTPUT_NOT_RESOLVABLE"
    stray = tenant.get(_resolved_path(ladder.job_id, "hls_master"), params={"x": "1"})
    assert stray.status_code == 422 and stray.json()["error_code"] == "UNKNOWN_PARAMETER"

    queued = _create_job(tenant, source["object_id"])
    waiting = tenant.get(_resolved_path(queued, "hls_master"))
    assert waiting.status_code == 409 and waiting.json()["error_code"] == "JOB_NOT_COMPLETED"
    assert "queued" in waiting.json()["detail"]


# --- a sprite thumbnail track ---------------------------------------------------------------------

SPRITE_VTT = (
    "WEBVTT\n"
    "\n"
    "NOTE tiles of 160x90 in sprite#xywh=…\n"
    "\n"
    "00:00:00.000 --> 00:00:00.500\n"
    "sprite#xywh=0,0,160,90\n"
    "\n"
    "00:00:00.500 --> 00:00:01.000\n"
    "sprite#xywh=160,0,160,90\n"
    "\n"
    "00:00:01.000 --> 00:00:01.500\n"
    "elsewhere.jpg#xywh=0,0,160,90\n"
)


def test_a_sprite_track_points_its_cues_at_the_sprite(
    media_platform: RunningPlatform, tenant: httpx.Client, source: dict[str, Any]
) -> None:
    sprite = SPRITE_JPEG.read_bytes()
    job_id = completed_job(
        media_platform,
        tenant,
        source["object_id"],
        [
            Stored("poster", "image/jpeg", sprite),
            Stored("sprite", "image/jpeg", sprite),
            Stored("sprite_vtt", "text/vtt", SPRITE_VTT.encode()),
        ],
    )
    before = time.time()
    output_url = tenant.get(f"/v1/jobs/{job_id}").json()["outputs"][0]["url"]
    track = tenant.get(_resolved_path(job_id, "sprite_vtt"))
    elapsed = time.time() - before
    assert track.status_code == 200, track.text
    assert track.headers["content-type"] == "text/vtt; charset=utf-8"
    assert "access-control-allow-origin" not in track.headers  # an API-key request
    lines = track.text.split("\n")
    sprite_url = lines[5].removesuffix("#xywh=0,0,160,90")
    assert sprite_url.startswith("http") and lines[8] == f"{sprite_url}#xywh=160,0,160,90"
    unchanged = [line for i, line in enumerate(SPRITE_VTT.split("\n")) if i not in (5, 8)]
    assert [line for i, line in enumerate(lines) if i not in (5, 8)] == unchanged
    image = httpx.get(sprite_url, timeout=30)
    assert image.status_code == 200 and image.content == sprite
    assert image.headers["content-type"] == "image/jpeg"
    # Media URLs live the storage TTL plus the track's length (1.5 s, rounded up): against a URL
    # signed just before the track, whatever the two requests took on a loaded machine.
    assert 1 <= _expires(sprite_url) - _expires(output_url) <= 3 + elapsed
    assert 0 < _max_age(track) < _expires(output_url) - before
