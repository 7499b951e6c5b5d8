"""Media end to end through REST on the real platform (`hypermedia up` with the mediaworker): media
PyAV writes in the test uploaded, probed in the sandbox, and ``probe.json`` downloaded and checked;
bad input of issue 7 (a playlist disguised as media, a truncated MP4, media longer than the
profile allows)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from tests.e2e.conftest import RunningPlatform, upload, wait_job
from tests.helpers.media import write_mp3_with_cover, write_video

MEDIA_TIMEOUT = 120.0


def _process(client: httpx.Client, object_id: str, operation: str | dict[str, Any]) -> dict[str, Any]:
    created = client.post("/v1/hypermedia/process", json={"object_id": object_id, "operations": [operation]})
    assert created.status_code == 202, created.text
    return wait_job(client, created.json()["job_ids"][0], timeout=MEDIA_TIMEOUT)


def _probe_json(job: dict[str, Any]) -> dict[str, Any]:
    assert job["status"] == "completed", (job["error_code"], job["error_message"])
    [output] = job["outputs"]
    assert (output["output_type"], output["mime_type"]) == ("probe", "application/json")
    response = httpx.get(output["url"], timeout=30)
    assert response.status_code == 200
    return dict(json.loads(response.content))


def test_probe_of_an_mp4_with_a_rotated_video(client: httpx.Client, tmp_path: Path) -> None:
    """H.264 320×240 at 25 fps with a −90° display matrix and AAC stereo at 48 kHz, 2.0 s."""
    obj = upload(client, write_video(tmp_path / "clip.mp4", rotation=-90))
    assert obj["mime_type"] == "video/mp4"
    report = _probe_json(_process(client, obj["object_id"], "probe"))
    assert abs(report["duration_seconds"] - 2.0) < 0.05
    video = next(s for s in report["streams"] if s["type"] == "video")
    audio = next(s for s in report["streams"] if s["type"] == "audio")
    assert (video["codec"], video["width"], video["height"]) == ("h264", 320, 240)
    assert video["rotation"] == -90 and (video["display_width"], video["display_height"]) == (240, 320)
    assert video["average_frame_rate"] == 25 and video["bit_depth"] == 8
    assert (audio["codec"], audio["sample_rate"], audio["channels"]) == ("aac", 48000, 2)


def test_probe_of_an_mp3_with_cover_art(client: httpx.Client, tmp_path: Path) -> None:
    obj = upload(client, write_mp3_with_cover(tmp_path / "song.mp3"))
    assert obj["mime_type"].startswith("audio/")
    report = _probe_json(_process(client, obj["object_id"], "probe"))
    kinds = {(s["type"], s["attached_picture"]) for s in report["streams"]}
    assert ("audio", False) in kinds and ("video", True) in kinds


def test_a_truncated_mp4_fails_with_a_specific_error_and_the_worker_lives_on(
    client: httpx.Client, tmp_path: Path
) -> None:
    whole = write_video(tmp_path / "whole.mp4").read_bytes()
    cut = tmp_path / "cut.mp4"
    cut.write_bytes(whole[: len(whole) // 2])  # the index (moov) is at the end: gone
    obj = upload(client, cut)
    job = _process(client, obj["object_id"], "probe")
    assert (job["status"], job["error_code"], job["attempt_count"]) == ("failed", "CORRUPT_INPUT", 1)
    assert "moov" in job["error_message"] and str(tmp_path) not in job["error_message"]
    again = upload(client, write_video(tmp_path / "after.mp4", seconds=1.0))
    assert _probe_json(_process(client, again["object_id"], "probe"))["duration_seconds"] > 0.9


def test_a_playlist_disguised_as_media_is_refused(client: httpx.Client) -> None:
    playlist = b"#EXTM3U\n#EXT-X-TARGETDURATION:10\n#EXTINF:10,\nfile:///etc/passwd\n#EXT-X-ENDLIST\n"
    response = client.post("/v1/objects", files={"file": ("movie.mp4", playlist)})
    assert response.status_code == 201, response.text
    obj = response.json()
    assert not obj["mime_type"].startswith(("video/", "audio/"))
    refused = client.post(
        "/v1/hypermedia/process", json={"object_id": obj["object_id"], "operations": ["probe"]}
    )
    assert refused.status_code == 415 and refused.json()["error_code"] == "UNSUPPORTED_FORMAT"


def test_an_image_operation_on_a_video_names_the_operations_that_take_video(
    client: httpx.Client, tmp_path: Path
) -> None:
    """A fresh user asked for a ``thumbnail`` of a video: 415, and the message names ``poster``
    among the operations that do take video. The request is refused whole: no job was made."""
    obj = upload(client, write_video(tmp_path / "clip.mp4", seconds=1.0))
    refused = client.post(
        "/v1/hypermedia/process",
        json={"object_id": obj["object_id"], "operations": ["thumbnail", "poster"]},
    )
    assert refused.status_code == 415 and refused.json()["error_code"] == "UNSUPPORTED_FORMAT"
    detail = refused.json()["detail"]
    assert "'thumbnail' does not accept video/mp4 input; for video input: " in detail, detail
    named = detail.rpartition(": ")[2].split(", ")
    assert {"poster", "probe", "transcode_video"} <= set(named) and "thumbnail" not in named
    assert client.get("/v1/jobs", params={"object_id": obj["object_id"]}).json()["jobs"] == []


def test_media_longer_than_the_profile_allows_is_refused_at_probe_time(
    platform: RunningPlatform, client: httpx.Client, tmp_path: Path
) -> None:
    """The profile's max_duration_seconds (4 h) lowered to 1 s for this test: a 2 s clip fails
    MEDIA_TOO_LONG from its header, permanently, and costs nothing."""
    obj = upload(client, write_video(tmp_path / "two-seconds.mp4"))
    balance = client.get("/v1/credits").json()
    with psycopg.connect(platform.env["HM_DATABASE_URL"], autocommit=True) as conn:
        conn.execute(
            "UPDATE processing_profiles SET max_duration_seconds = 1 WHERE operation = 'probe' AND active"
        )
        try:
            job = _process(client, obj["object_id"], "probe")
        finally:
            conn.execute(
                "UPDATE processing_profiles SET max_duration_seconds = 14400 WHERE operation = 'probe' AND active"
            )
    assert (job["status"], job["error_code"], job["attempt_count"]) == ("failed", "MEDIA_TOO_LONG", 1)
    assert client.get("/v1/credits").json()["balance"] == balance["balance"]


@pytest.mark.parametrize("params", [{"verbose": True}, {"pages": "1"}])
def test_probe_params_are_checked_at_creation(client: httpx.Client, tmp_path: Path, params: Any) -> None:
    obj = upload(client, write_video(tmp_path / "clip.mp4", seconds=1.0, audio=False))
    response = client.post(
        "/v1/hypermedia/process",
        json={"object_id": obj["object_id"], "operations": [{"name": "probe", "params": params}]},
    )
    assert response.status_code == 422 and response.json()["error_code"] == "INVALID_PARAMS"


def test_waveform_of_a_flac_tone_then_silence(client: httpx.Client, tmp_path: Path) -> None:
    """1 s of a 1 kHz sine (0.5 left, 0.25 right) then 1 s of silence: peaks per channel at 50
    buckets per second, and a 400 × 100 PNG inked in its first half only."""
    import numpy as np
    import pyvips

    from tests.helpers.media import write_tone

    obj = upload(client, write_tone(tmp_path / "tone.flac", "flac", "flac", "s16"))
    assert obj["mime_type"].startswith("audio/")
    params = {"buckets_per_second": 50, "image": {"width": 400, "height": 100, "background": "#FFFFFF"}}
    job = _process(client, obj["object_id"], {"name": "waveform", "params": params})
    assert job["status"] == "completed", (job["error_code"], job["error_message"])
    outputs = {o["output_type"]: o for o in job["outputs"]}
    peaks = json.loads(httpx.get(outputs["peaks"]["url"], timeout=30).content)
    assert peaks["channels"] == 2 and peaks["length"] == 100
    left = np.array(peaks["data"][0]).reshape(-1, 2)
    right = np.array(peaks["data"][1]).reshape(-1, 2)
    assert np.allclose(left[:50, 1], 0.5, atol=0.02) and np.allclose(right[:50, 1], 0.25, atol=0.02)
    assert np.abs(left[50:]).max() < 0.01 and np.abs(right[50:]).max() < 0.01
    png = pyvips.Image.new_from_buffer(httpx.get(outputs["waveform"]["url"], timeout=30).content, "")
    assert (png.width, png.height) == (400, 100)
    pixels = np.ndarray(buffer=png.write_to_memory(), dtype=np.uint8, shape=(100, 400, png.bands))
    assert (pixels[:, 210:] == 255).all() and (pixels[:, :190] != 255).any()


def test_a_waveform_asked_without_an_image_has_peaks_only(client: httpx.Client, tmp_path: Path) -> None:
    """``"image": false`` through REST: the job's params say false and its only output is the
    peaks (issue 15, item 10: it was stored as null, which the worker read as the default PNG)."""
    from tests.helpers.media import write_tone

    obj = upload(client, write_tone(tmp_path / "tone.flac", "flac", "flac", "s16"))
    job = _process(client, obj["object_id"], {"name": "waveform", "params": {"image": False}})
    assert job["status"] == "completed", (job["error_code"], job["error_message"])
    assert job["params"]["image"] is False
    assert [o["output_type"] for o in job["outputs"]] == ["peaks"]


def test_waveform_of_a_video_without_sound_is_a_specific_error(client: httpx.Client, tmp_path: Path) -> None:
    obj = upload(client, write_video(tmp_path / "silent.mp4", seconds=1.0, audio=False))
    job = _process(client, obj["object_id"], "waveform")
    assert (job["status"], job["error_code"], job["attempt_count"]) == ("failed", "NO_AUDIO_STREAM", 1)


def test_poster_skips_the_black_start_and_is_upright(client: httpx.Client, tmp_path: Path) -> None:
    """A −90° rotated clip: the poster is portrait (the display size), a JPEG of the pattern."""
    import pyvips

    obj = upload(client, write_video(tmp_path / "clip.mp4", rotation=-90))
    job = _process(client, obj["object_id"], {"name": "poster", "params": {"width": 120}})
    assert job["status"] == "completed", (job["error_code"], job["error_message"])
    [output] = job["outputs"]
    assert (output["output_type"], output["mime_type"]) == ("poster", "image/jpeg")
    image = pyvips.Image.new_from_buffer(httpx.get(output["url"], timeout=30).content, "")
    assert image.width == 120 and image.height == 160
    assert output["metadata"]["source"] == "video_frame"


def test_poster_of_an_mp3_is_its_cover(client: httpx.Client, tmp_path: Path) -> None:
    obj = upload(client, write_mp3_with_cover(tmp_path / "song.mp3"))
    job = _process(client, obj["object_id"], "poster")
    assert job["status"] == "completed", (job["error_code"], job["error_message"])
    assert job["outputs"][0]["metadata"]["source"] == "cover_art"
