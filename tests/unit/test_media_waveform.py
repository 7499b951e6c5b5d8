"""The ``waveform`` operation (:mod:`hypermedia.engines.media.waveform`) on tones these tests write with PyAV:
1 s of a 1 kHz sine (0.5 left, 0.25 right) then 1 s of silence."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import pyvips

from hypermedia.core.errors import InvalidArgument, PermanentJobError
from hypermedia.engines.media import engine
from hypermedia.engines.media import params as media_params
from hypermedia.engines.media import waveform as waveform_module
from hypermedia.engines.media.sources import MediaLimits
from hypermedia.engines.media.waveform import run
from tests.helpers.media import LEFT, LOSSLESS, RATE, RIGHT, write_mp3_with_cover, write_tone, write_video

LIMITS = MediaLimits(max_input_bytes=100 * 1024 * 1024)


def waveform(
    path: Path, tmp_path: Path, params: dict[str, Any] | None = None, limits: MediaLimits = LIMITS
) -> tuple[dict[str, Any], np.ndarray | None, list[Any]]:
    out_dir = tmp_path / "out"
    out_dir.mkdir(parents=True, exist_ok=True)
    outputs = engine.run("waveform", params or {}, path, out_dir, limits=limits)
    peaks = json.loads((out_dir / "waveform.json").read_text())
    assert outputs[0].output_type == "peaks" and outputs[0].mime_type == "application/json"
    assert outputs[0].metadata["length"] == peaks["length"]
    assert outputs[0].metadata["channels"] == peaks["channels"]
    assert outputs[0].metadata["duration_seconds"] == peaks["duration_seconds"]
    assert outputs[0].metadata["size_bytes"] == (out_dir / "waveform.json").stat().st_size
    assert all(len(channel) == 2 * peaks["length"] for channel in peaks["data"])
    pixels = None
    if len(outputs) == 2:
        assert (outputs[1].output_type, outputs[1].filename, outputs[1].mime_type) == (
            "waveform",
            "waveform.png",
            "image/png",
        )
        image = pyvips.Image.new_from_file(str(out_dir / "waveform.png"))
        assert (image.width, image.height) == (outputs[1].metadata["width"], outputs[1].metadata["height"])
        pixels = image.numpy()
    return peaks, pixels, outputs


def halves(channel: list[float]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Mins and maxes of the loud first half and of the silent second half of one channel."""
    values = np.array(channel).reshape(-1, 2)
    half = len(values) // 2
    return values[:half, 0], values[:half, 1], values[half:, 0], values[half:, 1]


# --- peaks -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(LOSSLESS))
def test_lossless_peaks_per_channel(tmp_path: Path, kind: str) -> None:
    path = write_tone(tmp_path / f"tone.{kind}", *LOSSLESS[kind])
    peaks, pixels, outputs = waveform(path, tmp_path, {"buckets_per_second": 50})
    assert pixels is not None and pixels.shape == (280, 1800, 4)
    assert [o.output_type for o in outputs] == ["peaks", "waveform"]
    assert peaks["version"] == 1
    assert peaks["sample_rate"] == RATE and peaks["channels"] == 2 and peaks["channel_mode"] == "all"
    assert peaks["buckets_per_second"] == 50 and peaks["samples_per_bucket"] == RATE / 50
    assert peaks["duration_seconds"] == pytest.approx(2.0, abs=1e-6)
    assert peaks["length"] == 100
    for channel, amplitude in zip(peaks["data"], (LEFT, RIGHT), strict=True):
        loud_min, loud_max, quiet_min, quiet_max = halves(channel)
        assert loud_max == pytest.approx(np.full(50, amplitude), abs=0.02)
        assert loud_min == pytest.approx(np.full(50, -amplitude), abs=0.02)
        assert np.abs(quiet_min).max() < 0.01 and np.abs(quiet_max).max() < 0.01


def test_aac_in_mp4(tmp_path: Path) -> None:
    path = write_tone(tmp_path / "tone.m4a", "aac", "mp4", "fltp")
    peaks, _, _ = waveform(path, tmp_path)
    assert peaks["buckets_per_second"] == 100
    # Lossy: the tone's onset overshoots for a few buckets and the peaks ripple by a few per cent.
    assert peaks["length"] in (200, 201, 202)
    assert peaks["duration_seconds"] == pytest.approx(2.0, abs=0.03)
    for channel, amplitude in zip(peaks["data"], (LEFT, RIGHT), strict=True):
        values = np.array(channel).reshape(-1, 2)
        assert np.median(values[:100, 1]) == pytest.approx(amplitude, abs=0.01)
        assert np.median(values[:100, 0]) == pytest.approx(-amplitude, abs=0.01)
        assert values[10:99, 1] == pytest.approx(np.full(89, amplitude), abs=0.05)
        assert values[10:99, 0] == pytest.approx(np.full(89, -amplitude), abs=0.05)
        assert np.abs(values[102:]).max() < 0.01  # silence stays silent after the codec's tail


def test_mix_is_the_mean_of_the_channels(tmp_path: Path) -> None:
    path = write_tone(tmp_path / "tone.flac", *LOSSLESS["flac"])
    peaks, _, outputs = waveform(path, tmp_path, {"channels": "mix", "image": False})
    assert [o.output_type for o in outputs] == ["peaks"]
    assert peaks["channels"] == 1 and peaks["channel_mode"] == "mix" and peaks["length"] == 200
    (channel,) = peaks["data"]
    loud_min, loud_max, quiet_min, quiet_max = halves(channel)
    assert loud_max == pytest.approx(np.full(100, (LEFT + RIGHT) / 2), abs=0.02)
    assert loud_min == pytest.approx(np.full(100, -(LEFT + RIGHT) / 2), abs=0.02)
    assert np.abs(quiet_min).max() < 0.01 and np.abs(quiet_max).max() < 0.01


def test_a_total_number_of_buckets(tmp_path: Path) -> None:
    path = write_tone(tmp_path / "tone.wav", *LOSSLESS["wav"])
    peaks, _, _ = waveform(path, tmp_path, {"buckets": 64, "image": False})
    assert peaks["length"] == 64
    assert peaks["samples_per_bucket"] == 2 * RATE / 64
    left = np.array(peaks["data"][0]).reshape(-1, 2)
    assert left[:32, 1] == pytest.approx(np.full(32, LEFT), abs=0.02)
    assert np.abs(left[32:]).max() < 0.01


def test_buckets_shorter_than_a_sample_hold_its_value(tmp_path: Path) -> None:
    # 8 kHz for 2 s is 16 000 samples: 40 000 buckets leave some empty.
    path = write_tone(tmp_path / "tone.wav", *LOSSLESS["wav"], rate=8000)
    peaks, _, _ = waveform(path, tmp_path, {"buckets": 40000, "image": False})
    assert peaks["length"] == 40000
    left = np.array(peaks["data"][0]).reshape(-1, 2)
    assert left[:20000].max() == pytest.approx(LEFT, abs=0.02)
    assert np.abs(left[20000:]).max() < 0.01


def test_the_sound_of_a_video(tmp_path: Path) -> None:
    path = write_video(tmp_path / "clip.mp4")  # a 440 Hz sine at 0.3 on both channels
    peaks, _, _ = waveform(path, tmp_path, {"image": False})
    assert peaks["channels"] == 2 and peaks["duration_seconds"] == pytest.approx(2.0, abs=0.05)
    left = np.array(peaks["data"][0]).reshape(-1, 2)
    assert np.median(left[:, 1]) == pytest.approx(0.3, abs=0.02)


def test_mp3_with_cover_art_draws_the_audio(tmp_path: Path) -> None:
    path = write_mp3_with_cover(tmp_path / "song.mp3")  # 3 s of a 440 Hz sine at 0.3
    peaks, pixels, _ = waveform(path, tmp_path, {"buckets_per_second": 10})
    assert peaks["channels"] == 2
    assert peaks["duration_seconds"] == pytest.approx(3.0, abs=0.1)
    assert peaks["length"] == pytest.approx(30, abs=1)
    left = np.array(peaks["data"][0]).reshape(-1, 2)
    assert np.median(left[:, 1]) == pytest.approx(0.3, abs=0.03)
    assert pixels is not None and pixels.shape == (280, 1800, 4)


# --- the image -------------------------------------------------------------------------------------


def test_png_with_a_background_is_inked_in_its_first_half_only(tmp_path: Path) -> None:
    path = write_tone(tmp_path / "tone.flac", *LOSSLESS["flac"])
    image = {"width": 400, "height": 200, "color": "#ff0000", "background": "#FFFFFF"}
    _, pixels, outputs = waveform(path, tmp_path, {"image": image})
    assert outputs[1].metadata == {
        "duration_seconds": 2.0,
        "channels": 2,
        "length": 200,
        "decode_errors": 0,
        "width": 400,
        "height": 200,
    }
    assert pixels is not None and pixels.shape == (200, 400, 3)
    white = np.all(pixels == 255, axis=2)
    assert white[:, 200:].all()  # the silent second: background only
    inked = ~white
    assert inked[:, 4:196].any(axis=0).all()  # every column of the tone has ink
    assert (pixels[inked][:, 0] == 255).all()  # red over white: the red channel stays full
    # Left lane (rows 0–99): the tone spans 0.5 of full scale around the middle row 50.
    left = np.flatnonzero(inked[:100, 100])
    assert left.min() == pytest.approx(25, abs=2) and left.max() == pytest.approx(74, abs=2)
    right = np.flatnonzero(inked[100:, 100])  # 0.25: rows 37.5–62.5 of the lower lane
    assert right.min() == pytest.approx(37, abs=2) and right.max() == pytest.approx(62, abs=2)
    assert pixels[50, 100].tolist() == [255, 0, 0]  # fully covered: the colour itself


def test_png_transparent_by_default(tmp_path: Path) -> None:
    path = write_tone(tmp_path / "tone.wav", *LOSSLESS["wav"])
    _, pixels, _ = waveform(path, tmp_path, {"channels": "mix", "image": {"width": 64, "height": 32}})
    assert pixels is not None and pixels.shape == (32, 64, 4)
    alpha = pixels[:, :, 3]
    assert (alpha[:, 32:] == 0).all()
    assert (alpha[:, :31] > 0).any(axis=0).all()
    assert alpha[16, 10] == 255
    assert (pixels[alpha > 0][:, :3] == (0x3B, 0x82, 0xF6)).all()


# --- bad input and params ----------------------------------------------------------------------------


def test_video_without_audio(tmp_path: Path) -> None:
    path = write_video(tmp_path / "silent.mp4", audio=False)
    with pytest.raises(PermanentJobError) as err:
        waveform(path, tmp_path)
    assert err.value.error_code == "NO_AUDIO_STREAM"


def test_longer_than_the_limit(tmp_path: Path) -> None:
    path = write_tone(tmp_path / "tone.wav", *LOSSLESS["wav"])
    limits = MediaLimits(max_input_bytes=LIMITS.max_input_bytes, max_duration_seconds=1.5)
    with pytest.raises(PermanentJobError) as err:
        waveform(path, tmp_path, limits=limits)
    assert err.value.error_code == "MEDIA_TOO_LONG"


def test_playlist_is_unsupported(tmp_path: Path) -> None:
    path = tmp_path / "list.wav"
    path.write_text("#EXTM3U\n#EXTINF:2.0,\n/etc/passwd\n")
    with pytest.raises(PermanentJobError) as err:
        waveform(path, tmp_path)
    assert err.value.error_code == "UNSUPPORTED_FORMAT"


def test_default_params() -> None:
    assert media_params.validate_params("waveform", None) == {
        "buckets_per_second": 100,
        "buckets": None,
        "channels": "all",
        "image": {"width": 1800, "height": 280, "color": "#3B82F6", "background": "transparent"},
    }
    normalised = media_params.validate_params(
        "waveform", {"buckets": 16, "channels": "mix", "image": {"color": "#abcdef", "background": "#000000"}}
    )
    assert normalised["buckets"] == 16 and normalised["buckets_per_second"] is None
    assert normalised["image"]["color"] == "#ABCDEF"
    assert media_params.validate_params("waveform", {"image": False})["image"] is False


@pytest.mark.parametrize(
    "params",
    [
        {"buckets_per_second": 10, "buckets": 100},
        {"buckets_per_second": 0},
        {"buckets_per_second": 1001},
        {"buckets_per_second": 10.0},
        {"buckets_per_second": True},
        {"buckets": 15},
        {"buckets": 100_001},
        {"channels": "left"},
        {"image": "yes"},
        {"image": {"width": 63}},
        {"image": {"height": 4096}},
        {"image": {"color": "blue"}},
        {"image": {"color": "#12345"}},
        {"image": {"background": "none"}},
        {"image": {"depth": 8}},
        {"resolution": 10},
        [],
    ],
)
def test_bad_params(tmp_path: Path, params: Any) -> None:
    with pytest.raises(InvalidArgument) as err:
        media_params.validate_params("waveform", params)
    assert err.value.error_code == "INVALID_PARAMS"
    with pytest.raises(InvalidArgument) as err:  # the worker checks again
        run("waveform", params, tmp_path / "never-read", tmp_path, limits=LIMITS)
    assert err.value.error_code == "INVALID_PARAMS"


def test_batches_do_not_change_the_peaks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_tone(tmp_path / "tone.flac", *LOSSLESS["flac"], rate=44100)  # 441 samples a bucket
    whole, _, _ = waveform(path, tmp_path / "whole", {"buckets_per_second": 100, "image": False})
    monkeypatch.setattr(waveform_module, "BATCH_SAMPLES", 1000)  # batches end inside buckets
    batched, _, _ = waveform(path, tmp_path / "batched", {"buckets_per_second": 100, "image": False})
    assert batched == whole and whole["length"] == 200


def test_too_many_peaks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_tone(tmp_path / "tone.wav", *LOSSLESS["wav"])
    monkeypatch.setattr(waveform_module, "MAX_PEAK_VALUES", 1000)  # 250 stereo buckets
    with pytest.raises(PermanentJobError) as err:  # 2 s × 1000 buckets/s, refused from the header
        waveform(path, tmp_path, {"buckets_per_second": 1000})
    assert err.value.error_code == "MEDIA_TOO_LONG"
    peaks, _, _ = waveform(path, tmp_path, {"buckets_per_second": 100, "image": False})
    assert peaks["length"] == 200


@pytest.mark.parametrize("channels", [8, 16])
def test_eight_or_more_channels(tmp_path: Path, channels: int) -> None:
    """7.1 and 16-channel WAV (written with the standard library's wave module), channel c at
    amplitude (c + 1) / 20: each channel's own peaks. PyAV 18 miscounts the planes of planar
    frames with 8 or more channels (the job crashed, or returned memory that was not audio)."""
    import wave

    rate, seconds = 8000, 1
    t = np.arange(rate * seconds) / rate
    columns = [(c + 1) / 20 * np.sin(2 * math.pi * 440 * t) for c in range(channels)]
    interleaved = (np.stack(columns, axis=1) * 32767).astype("<i2")
    path = tmp_path / f"ch{channels}.wav"
    with wave.open(str(path), "wb") as out:
        out.setnchannels(channels)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(interleaved.tobytes())
    peaks, _pixels, _outputs = waveform(path, tmp_path, {"buckets_per_second": 10, "image": False})
    assert peaks["channels"] == channels and len(peaks["data"]) == channels
    for c, data in enumerate(peaks["data"]):
        maxima = np.array(data).reshape(-1, 2)[:, 1]
        assert np.allclose(maxima, (c + 1) / 20, atol=0.01), (c, maxima[:3])
