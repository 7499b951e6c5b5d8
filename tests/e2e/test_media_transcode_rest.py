"""The media transcodes end to end through REST on the real platform (`hypermedia up` with the
mediaworker): a rotated clip to an H.264 ladder and to HLS played through the resolved playlists
without an API key, an MP3 to loudness-normalised AAC, a sprite sheet with its WebVTT index.
Every output is downloaded and decoded again with PyAV (issue 7)."""

from __future__ import annotations

import hashlib
import json
import math
import re
import subprocess
from pathlib import Path
from typing import Any

import av
import httpx
import numpy as np
import pytest

from tests.e2e.conftest import upload, wait_job
from tests.helpers.media import write_mp3_with_cover, write_video

MEDIA_TIMEOUT = 180.0


def _process(client: httpx.Client, object_id: str, operation: str | dict[str, Any]) -> dict[str, Any]:
    created = client.post("/v1/hypermedia/process", json={"object_id": object_id, "operations": [operation]})
    assert created.status_code == 202, created.text
    job = wait_job(client, created.json()["job_ids"][0], timeout=MEDIA_TIMEOUT)
    assert job["status"] == "completed", (job["error_code"], job["error_message"])
    return job


def _download(url: str, path: Path) -> Path:
    response = httpx.get(url, timeout=60)
    assert response.status_code == 200
    path.write_bytes(response.content)
    return path


def test_transcode_video_ladder_of_a_rotated_clip(client: httpx.Client, tmp_path: Path) -> None:
    """A 640×360 clip with a −90° display matrix: 360p and 240p renditions (1080p and 720p are
    above the source and skipped), upright, 50 frames, 2.0 s, stereo 48 kHz AAC."""
    obj = upload(client, write_video(tmp_path / "phone.mp4", width=640, height=360, rotation=-90))
    params = {"heights": [1080, 720, 360, 240]}
    job = _process(client, obj["object_id"], {"name": "transcode_video", "params": params})
    outputs = {o["output_type"]: o for o in job["outputs"]}
    assert set(outputs) == {"video_360p", "video_240p"}
    for name, size in (("video_360p", (360, 640)), ("video_240p", (240, 426))):
        output = outputs[name]
        assert output["mime_type"] == "video/mp4"
        with av.open(str(_download(output["url"], tmp_path / f"{name}.mp4"))) as container:
            video, audio = container.streams.video[0], container.streams.audio[0]
            assert (video.codec_context.width, video.codec_context.height) == size
            assert (
                audio.codec_context.name,
                audio.codec_context.sample_rate,
                audio.codec_context.channels,
            ) == (
                "aac",
                48000,
                2,
            )
            assert abs(container.duration / av.time_base - 2.0) < 0.1
            frames = [frame for frame in container.decode(video=0)]
        assert len(frames) == 50 == output["metadata"]["frame_count"]
        first = frames[0].to_ndarray(format="rgb24")
        width = size[0]
        # The pattern's top half is blue; the quarter turn puts it on the right: upright.
        assert first[:, width * 3 // 4 :, 2].mean() > 200 and first[:, : width // 4, 2].mean() < 100
    assert outputs["video_360p"]["metadata"]["rotation_applied"] == -90
    _assert_charged_media_seconds(job, base_cost=5000, per_second=10)


def _assert_charged_media_seconds(job: dict[str, Any], base_cost: int, per_second: int) -> None:
    """ADR 0068: a transcode is charged ``base_cost`` and ``per_second`` millicredits a second of
    media written, summed over its renditions, within its price by size (migration 0028)."""
    written = sum(
        o["metadata"]["duration_seconds"] for o in job["outputs"] if "duration_seconds" in o["metadata"]
    )
    price = round(job["estimated_credits"] * 1000)
    work = min(math.ceil(per_second * written), price - base_cost)
    assert work > 0
    assert job["charge_lines"] == {"media_seconds": work / 1000}
    assert job["actual_credits"] == (base_cost + work) / 1000 <= job["estimated_credits"]


def test_hls_plays_through_the_resolved_playlists_without_a_key(client: httpx.Client, tmp_path: Path) -> None:
    obj = upload(client, write_video(tmp_path / "clip.mp4", seconds=4.0, width=640, height=360))
    params = {"heights": [360, 240], "hls": True, "hls_segment_seconds": 2}
    job = _process(client, obj["object_id"], {"name": "transcode_video", "params": params})
    names = {o["output_type"] for o in job["outputs"]}
    assert {"hls_master", "hls_360p", "hls_360p_media", "hls_240p", "hls_240p_media"} <= names
    master = client.get(f"/v1/jobs/{job['job_id']}/outputs/hls_master/resolved")
    assert master.status_code == 200 and master.headers["content-type"].startswith(
        "application/vnd.apple.mpegurl"
    )
    variant_urls = [line for line in master.text.splitlines() if line.startswith("http")]
    assert len(variant_urls) == 2 and "RESOLUTION=640x360" in master.text
    # A player has no API key: the variant URL is signed, the media URLs are presigned.
    variant = httpx.get(variant_urls[0], timeout=30)
    assert variant.status_code == 200
    init_uri, init_range = re.search(
        r'#EXT-X-MAP:URI="([^"]+)",BYTERANGE="(\d+)@(\d+)"', variant.text
    ).groups()[:2]
    segments = re.findall(r"#EXT-X-BYTERANGE:(\d+)@(\d+)\n(\S+)", variant.text)
    assert len(segments) == 2
    init = httpx.get(init_uri, headers={"Range": f"bytes=0-{int(init_range) - 1}"}, timeout=30)
    assert init.status_code == 206 and len(init.content) == int(init_range)
    length, offset, uri = segments[1]
    segment = httpx.get(uri, headers={"Range": f"bytes={offset}-{int(offset) + int(length) - 1}"}, timeout=30)
    assert segment.status_code == 206 and len(segment.content) == int(length)
    piece = tmp_path / "piece.mp4"
    piece.write_bytes(init.content + segment.content)
    with av.open(str(piece)) as container:
        assert (
            container.streams.video[0].codec_context.width,
            container.streams.video[0].codec_context.height,
        ) == (
            640,
            360,
        )
        assert sum(1 for _ in container.decode(video=0)) == 50
    # A real player: FFmpeg's HLS demuxer fetches the variant and every byte range over HTTP. It
    # refuses a segment whose URL has no media extension (allowed_segment_extensions, FFmpeg
    # 5.1.4 and later), which the output keys lacked: the resolved HLS did not play in ffplay.
    (tmp_path / "master.m3u8").write_text(master.text)
    count = ["-count_frames", "-show_entries", "stream=width,nb_read_frames", "-of", "json"]
    player = ["ffprobe", "-v", "error", "-protocol_whitelist", "file,http,tcp", "-select_streams", "v:0"]
    probe = subprocess.run(
        [*player, *count, str(tmp_path / "master.m3u8")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert probe.returncode == 0, probe.stderr
    [stream] = json.loads(probe.stdout)["streams"]
    assert (stream["width"], stream["nb_read_frames"]) == (640, "100")


def test_a_second_transcode_of_one_video_keeps_the_first_ones_bytes(
    client: httpx.Client, tmp_path: Path
) -> None:
    """libx264 with two frame threads (the platform's default) writes other bytes at each run, so
    the renditions of two transcodes of one video get keys, and objects, of their own (ADR 0050):
    one key for both let the second job overwrite the bytes the first one had registered, and
    the first one's object then no longer hashed to its recorded SHA-256."""
    obj = upload(client, write_video(tmp_path / "twice.mp4", seconds=3.0, width=640, height=360))
    operation = {"name": "transcode_video", "params": {"heights": [360]}}
    first, second = (_process(client, obj["object_id"], operation)["outputs"][0] for _ in range(2))
    assert first["object_id"] != second["object_id"]
    for output in (first, second):
        described = client.get(f"/v1/objects/{output['object_id']}").json()
        data = httpx.get(output["url"], timeout=60).content
        assert (len(data), hashlib.sha256(data).hexdigest()) == (described["size_bytes"], described["sha256"])


def test_transcode_audio_normalises_an_mp3_to_ebu_r128(client: httpx.Client, tmp_path: Path) -> None:
    """An MP3 with cover art (a 0.3-amplitude 440 Hz sine): AAC in M4A at −23 LUFS, no picture."""
    obj = upload(client, write_mp3_with_cover(tmp_path / "song.mp3", seconds=3.0))
    job = _process(client, obj["object_id"], {"name": "transcode_audio", "params": {"loudness": True}})
    [output] = job["outputs"]
    assert (output["output_type"], output["mime_type"]) == ("audio", "audio/mp4")
    loudness = output["metadata"]["loudness"]
    assert abs(loudness["output_lufs"] + 23) < 0.5 and loudness["limited_by_true_peak"] is False
    with av.open(str(_download(output["url"], tmp_path / "audio.m4a"))) as container:
        assert [s.type for s in container.streams] == ["audio"]
        stream = container.streams.audio[0]
        assert (
            stream.codec_context.name,
            stream.codec_context.sample_rate,
            stream.codec_context.channels,
        ) == (
            "aac",
            48000,
            2,
        )
        samples = np.concatenate([frame.to_ndarray().reshape(-1) for frame in container.decode(audio=0)])
    assert abs(len(samples) / 2 / 48000 - 3.0) < 0.1
    _assert_charged_media_seconds(job, base_cost=1000, per_second=1)


def test_poster_with_a_sprite_and_its_resolved_webvtt(client: httpx.Client, tmp_path: Path) -> None:
    obj = upload(client, write_video(tmp_path / "clip.mp4", seconds=4.0, audio=False))
    params = {"width": 160, "sprite": {"count": 8, "columns": 4, "width": 80}}
    job = _process(client, obj["object_id"], {"name": "poster", "params": params})
    outputs = {o["output_type"]: o for o in job["outputs"]}
    assert set(outputs) == {"poster", "sprite", "sprite_vtt"}
    sheet = outputs["sprite"]["metadata"]
    assert (sheet["count"], sheet["columns"], sheet["rows"], sheet["width"]) == (8, 4, 2, 320)
    track = client.get(f"/v1/jobs/{job['job_id']}/outputs/sprite_vtt/resolved")
    assert track.status_code == 200 and track.text.startswith("WEBVTT")
    cues = re.findall(r"(\S+) --> (\S+)\n(\S+)#xywh=(\d+),(\d+),(\d+),(\d+)", track.text)
    assert len(cues) == 8 and cues[-1][1] == "00:00:04.000"
    image = httpx.get(cues[0][2], timeout=30)
    assert image.status_code == 200 and image.headers["content-type"] == "image/jpeg"


@pytest.mark.parametrize(
    ("operation", "error_code"),
    [("transcode_video", "NO_VIDEO_STREAM"), ("transcode_audio", "NO_AUDIO_STREAM")],
)
def test_a_stream_the_transcode_needs_is_missing(
    client: httpx.Client, tmp_path: Path, operation: str, error_code: str
) -> None:
    if operation == "transcode_video":
        # An MP3 is audio: the profile takes video only, refused at creation.
        obj = upload(client, write_mp3_with_cover(tmp_path / "song.mp3", seconds=1.0))
        refused = client.post(
            "/v1/hypermedia/process", json={"object_id": obj["object_id"], "operations": [operation]}
        )
        assert refused.status_code == 415, refused.text
        return
    obj = upload(client, write_video(tmp_path / "mute.mp4", seconds=1.0, audio=False))
    created = client.post(
        "/v1/hypermedia/process", json={"object_id": obj["object_id"], "operations": [operation]}
    )
    job = wait_job(client, created.json()["job_ids"][0], timeout=MEDIA_TIMEOUT)
    assert (job["status"], job["error_code"], job["attempt_count"]) == ("failed", error_code, 1)
