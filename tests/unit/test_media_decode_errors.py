"""Damaged packets (issue 15, item 9): ``transcode_audio`` and ``waveform`` skip an MP3 frame
that does not decode and count it, as FFmpeg's command line does, and refuse a file that mostly
does not decode (:mod:`hypermedia.engines.media.decoding`), on the MP3s of ``tests/data/damaged-mp3``
(see their ``SOURCE.md`` for what ``ffmpeg`` makes of each); ``transcode_video`` shares the
bound. Outputs are decoded again with PyAV and their length and level checked."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest

from hypermedia.core.errors import PermanentJobError
from hypermedia.engines.media import audio, transcode, waveform
from hypermedia.engines.media.decoding import MAX_ERROR_RATE
from hypermedia.engines.media.sources import MediaLimits
from tests.helpers.media import _remux, decode, write_video

DATA = Path(__file__).resolve().parents[1] / "data" / "damaged-mp3"
LIMITS = MediaLimits(max_input_bytes=10 * 1024 * 1024)
FFMPEG_SECONDS = {  # the WAV ffmpeg 5.1 writes of each (SOURCE.md)
    "tone.mp3": 2.0,
    "last-frame.mp3": 1.986372,
    "middle-frame.mp3": 1.973878,
}
AMPLITUDE = 10 ** (-6 / 20)
"""The tone's peak: −6 dBFS."""


def samples(path: Path) -> tuple[np.ndarray, int]:
    """Every sample of the left channel of the file's first audio stream, as float, and the
    sample rate."""
    with av.open(str(path)) as container:
        stream = container.streams.audio[0]
        ctx = stream.codec_context
        resampler = av.AudioResampler(format="fltp", layout=ctx.layout, rate=ctx.sample_rate)
        converted = [c for frame in container.decode(stream) for c in resampler.resample(frame)]
        converted += resampler.resample(None)
        return np.concatenate([c.to_ndarray()[0] for c in converted]), ctx.sample_rate


def window_levels(signal: np.ndarray, rate: int) -> np.ndarray:
    """RMS of every 50 ms window but the first (the codec's priming) and the last."""
    window = rate // 20
    return np.array([np.sqrt(np.mean(signal[i : i + window] ** 2)) for i in range(0, len(signal), window)])[
        1:-1
    ]


def run_audio(name: str, out_dir: Path, params: dict[str, Any]) -> tuple[Any, Path]:
    out_dir.mkdir(exist_ok=True)
    [output] = audio.run("transcode_audio", params, DATA / name, out_dir, limits=LIMITS)
    return output, out_dir / output.filename


@pytest.mark.parametrize("name", sorted(FFMPEG_SECONDS))
@pytest.mark.parametrize("audio_format", ["aac", "mp3"])
def test_transcode_audio_skips_a_damaged_frame(name: str, audio_format: str, tmp_path: Path) -> None:
    output, path = run_audio(name, tmp_path, {"format": audio_format})
    assert output.metadata["decode_errors"] == (0 if name == "tone.mp3" else 1)
    assert abs(output.metadata["duration_seconds"] - FFMPEG_SECONDS[name]) < 0.001
    signal, rate = samples(path)
    assert rate == 48000
    # The encoders add their priming and padding (AAC 1024 samples and a frame, LAME 1105…).
    assert 0 <= len(signal) / rate - FFMPEG_SECONDS[name] < 0.08
    # The tone in every window, at the level of the undamaged file's transcode (a lossy encoder
    # moves the level of a pure tone a little): nothing went silent where a frame was skipped
    # (the decoder's overlap with the missing frame dips the level next to it), nothing stopped.
    _, clean_path = run_audio("tone.mp3", tmp_path / "clean", {"format": audio_format})
    clean = float(np.median(window_levels(*samples(clean_path))))
    assert clean > 0.8 * AMPLITUDE / np.sqrt(2)
    levels = window_levels(signal, rate)
    assert np.all(levels > 0.7 * clean), levels
    assert abs(float(np.median(levels)) / clean - 1) < 0.01


def test_loudness_normalisation_of_a_damaged_file(tmp_path: Path) -> None:
    """Both passes skip the frame; the level is measured and set on what decoded."""
    output, path = run_audio("last-frame.mp3", tmp_path, {"loudness": {"target_lufs": -23}})
    assert output.metadata["decode_errors"] == 1
    assert abs(output.metadata["loudness"]["output_lufs"] - -23.0) < 0.5
    assert abs(decode(path).lufs - -23.0) < 0.5  # the written file, decoded and measured again
    assert abs(output.metadata["duration_seconds"] - FFMPEG_SECONDS["last-frame.mp3"]) < 0.001


def peaks(name: str, out_dir: Path) -> tuple[Any, dict[str, Any]]:
    out_dir.mkdir(exist_ok=True)
    [output] = waveform.run("waveform", {"image": False}, DATA / name, out_dir, limits=LIMITS)
    return output, json.loads((out_dir / output.filename).read_text())


@pytest.mark.parametrize("name", sorted(FFMPEG_SECONDS))
def test_waveform_skips_a_damaged_frame(name: str, tmp_path: Path) -> None:
    output, report = peaks(name, tmp_path / "out")
    assert output.metadata["decode_errors"] == (0 if name == "tone.mp3" else 1)
    assert abs(report["duration_seconds"] - FFMPEG_SECONDS[name]) < 1e-5
    _, clean_report = peaks("tone.mp3", tmp_path / "clean")
    clean = float(np.median(clean_report["data"][0][1::2]))  # LAME's tone peaks a little below 0.5
    assert clean > 0.9 * AMPLITUDE
    for channel in report["data"]:
        highs = np.array(channel[1::2][:-1])  # the last bucket may be a few samples
        lows = np.array(channel[0::2][:-1])
        # Every 10 ms bucket holds the tone (next to a skipped frame a little less).
        assert np.all(highs > 0.6 * clean) and np.all(lows < -0.6 * clean)
        assert abs(float(np.median(highs)) / clean - 1) < 0.01


@pytest.mark.parametrize(
    "operation,entry,params",
    [
        ("transcode_audio", audio.run, {}),
        ("waveform", waveform.run, {}),
        ("transcode_audio", audio.run, {"loudness": {}}),
    ],
)
def test_most_frames_damaged_is_corrupt(
    operation: str, entry: Any, params: dict[str, Any], tmp_path: Path
) -> None:
    """66 of 78 frames fail (ffmpeg exits 69 on it): more than the bound."""
    with pytest.raises(PermanentJobError) as caught:
        entry(operation, params, DATA / "most-frames.mp3", tmp_path, limits=LIMITS)
    assert caught.value.error_code == "CORRUPT_INPUT"
    assert "66 of its packets do not decode" in str(caught.value)


def test_a_video_that_mostly_does_not_decode_is_corrupt(tmp_path: Path) -> None:
    """``transcode_video`` counts with the same rule: nine of every ten video packets replaced
    by noise is past the bound (one in ten is skipped and counted: the damaged-packet test of
    test_media_transcode.py)."""
    source = write_video(tmp_path / "in.mp4", seconds=2.0)
    rng = np.random.default_rng(4)
    seen = [0]

    def noise(packet: Any) -> Any:
        if packet.stream.type != "video":
            return None
        seen[0] += 1
        if seen[0] % 10 == 1:
            return None
        garbage = av.Packet(rng.integers(0, 256, packet.size, dtype=np.uint8).tobytes())
        garbage.pts, garbage.dts, garbage.time_base = packet.pts, packet.dts, packet.time_base
        return garbage

    damaged = _remux(source, tmp_path / "damaged.mkv", noise)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    with pytest.raises(PermanentJobError) as caught:
        transcode.run(
            "transcode_video", {"heights": [240], "preset": "ultrafast"}, damaged, out_dir, limits=LIMITS
        )
    assert caught.value.error_code == "CORRUPT_INPUT"
    assert "video stream 0 is damaged" in str(caught.value)
    assert MAX_ERROR_RATE == pytest.approx(2 / 3)
