"""The ``transcode_audio`` operation (:mod:`hypermedia.engines.media.audio`) on media these tests write with
PyAV; every output is decoded again with PyAV and measured with FFmpeg's ``ebur128`` filter."""

from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import av.error
import numpy as np
import pytest
from av.audio.stream import AudioStream

from hypermedia.core.errors import InvalidArgument, PermanentJobError
from hypermedia.engines.contract import OutputFile
from hypermedia.engines.media import params as media_params
from hypermedia.engines.media.audio import run
from hypermedia.engines.media.sources import MediaLimits
from hypermedia.sandbox import read_progress
from tests.helpers.media import (
    LOSSLESS,
    Decoded,
    decode,
    write_adts,
    write_mp3_with_cover,
    write_tone,
    write_video,
)

LIMITS = MediaLimits(max_input_bytes=100 * 1024 * 1024)
RATE = 48000
# write_tone: 1 s of a 1 kHz sine (0.5 left, 0.25 right), then 1 s of silence. BS.1770 weighs a
# 1 kHz sine at full scale on one channel −3.01 LUFS, so the tone's mean square is
# 0.5²/2 + 0.25²/2 = 0.156 (−8.06 LUFS); of the 400 ms blocks (100 ms apart) that are not silent,
# 7 lie in the tone and 3 straddle its end (75, 50 and 25 % tone, all within the relative gate):
# 10·log10(0.85 × 0.156) = −8.77 LUFS. The true peak is the left's 0.5: −6.02 dBTP.
TONE_LUFS = 10 * math.log10(0.85 * (0.5**2 / 2 + 0.25**2 / 2))
TONE_PEAK_DB = 20 * math.log10(0.5)
DECODERS = {"aac": "aac", "mp3": "mp3float", "opus": "opus"}


# --- media the tests write and measure -----------------------------------------------------------


def write_signal(
    path: Path,
    channels: np.ndarray,
    *,
    codec: str = "flac",
    container_format: str | None = None,
    rate: int = RATE,
    tags: dict[str, str] | None = None,
) -> Path:
    """``channels`` (channels × samples, floats −1…1) encoded with ``codec`` (FLAC: 16 bits)."""
    layout = {1: "mono", 2: "stereo", 6: "5.1"}[channels.shape[0]]
    with av.open(str(path), "w", format=container_format) as container:
        container.metadata.update(tags or {})
        stream = container.add_stream(codec, rate=rate, layout=layout)
        assert isinstance(stream, AudioStream)
        for start in range(0, channels.shape[1], 1024):
            block = np.ascontiguousarray(channels[:, start : start + 1024], dtype=np.float32)
            frame = av.AudioFrame.from_ndarray(block, format="fltp", layout=layout)
            frame.sample_rate, frame.pts = rate, start
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    return path


def sine(seconds: float, amplitude: float, frequency: float = 997.0, rate: int = RATE) -> np.ndarray:
    t = np.arange(round(seconds * rate)) / rate
    return amplitude * np.sin(2 * math.pi * frequency * t)


def transcode(
    path: Path, tmp_path: Path, params: dict[str, Any] | None = None, limits: MediaLimits = LIMITS
) -> tuple[OutputFile, Decoded]:
    out_dir = tmp_path / "out"
    out_dir.mkdir(parents=True, exist_ok=True)
    [output] = run("transcode_audio", params or {}, path, out_dir, limits=limits)
    file = out_dir / output.filename
    assert output.output_type == "audio"
    assert output.metadata["size_bytes"] == file.stat().st_size
    assert output.metadata["sample_rate"] == RATE
    decoded = decode(file)
    assert decoded.sample_rate == RATE
    assert decoded.channels == output.metadata["channels"]
    assert decoded.codec == DECODERS[output.metadata["format"]]
    assert decoded.seconds == pytest.approx(output.metadata["duration_seconds"], abs=0.1)
    assert read_progress(tmp_path) == 1.0
    return output, decoded


# --- formats -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("audio_format", "filename", "mime_type", "codec"),
    [
        ("aac", "audio.m4a", "audio/mp4", "aac"),
        ("mp3", "audio.mp3", "audio/mpeg", "libmp3lame"),
        ("opus", "audio.opus", "audio/ogg", "libopus"),
    ],
)
def test_each_format_keeps_the_levels(
    tmp_path: Path, audio_format: str, filename: str, mime_type: str, codec: str
) -> None:
    path = write_tone(tmp_path / "tone.wav", *LOSSLESS["wav"], rate=44100)
    output, decoded = transcode(path, tmp_path, {"format": audio_format, "bitrate": 96})
    assert (output.filename, output.mime_type) == (filename, mime_type)
    assert output.metadata == {
        "format": audio_format,
        "codec": codec,
        "bitrate": 96000,
        "sample_rate": RATE,
        "channels": 2,
        "duration_seconds": 2.0,  # 88 200 samples at 44.1 kHz are 96 000 at 48 kHz
        "decode_errors": 0,
        "size_bytes": output.metadata["size_bytes"],
    }
    assert decoded.seconds == pytest.approx(2.0, abs=0.1)
    assert decoded.lufs == pytest.approx(TONE_LUFS, abs=0.5)  # no normalisation asked: kept
    assert decoded.streams == ["audio"]


def test_mono_from_stereo(tmp_path: Path) -> None:
    path = write_tone(tmp_path / "tone.flac", *LOSSLESS["flac"])
    output, decoded = transcode(path, tmp_path, {"channels": 1})
    assert output.metadata["channels"] == decoded.channels == 1
    assert decoded.seconds == pytest.approx(2.0, abs=0.1)


def test_five_point_one_mixed_down_to_stereo(tmp_path: Path) -> None:
    tone = sine(1.0, 0.3)
    path = write_signal(tmp_path / "surround.flac", np.stack([tone] * 6))
    _, decoded = transcode(path, tmp_path, {"format": "opus"})
    assert decoded.channels == 2 and decoded.seconds == pytest.approx(1.0, abs=0.1)


def test_opus_mono_is_capped_at_its_maximum_bitrate(tmp_path: Path) -> None:
    path = write_tone(tmp_path / "tone.flac", *LOSSLESS["flac"])
    output, _ = transcode(path, tmp_path, {"format": "opus", "channels": 1, "bitrate": 320})
    assert output.metadata["bitrate"] == 256000


def test_a_layout_change_midstream_is_converted(tmp_path: Path) -> None:
    """Raw ADTS of 1 s mono then 1 s stereo: the decoder's layout changes at the second file."""
    mono = write_signal(tmp_path / "mono.aac", sine(1.0, 0.3)[None], codec="aac", container_format="adts")
    stereo = write_signal(
        tmp_path / "stereo.aac", np.stack([sine(1.0, 0.3)] * 2), codec="aac", container_format="adts"
    )
    path = tmp_path / "both.aac"
    path.write_bytes(mono.read_bytes() + stereo.read_bytes())
    output, decoded = transcode(path, tmp_path, {"format": "mp3"})
    assert decoded.channels == 2
    assert output.metadata["duration_seconds"] == pytest.approx(2.0, abs=0.1)


# --- loudness ------------------------------------------------------------------------------------


def test_loudness_normalised_to_ebu_r128(tmp_path: Path) -> None:
    path = write_tone(tmp_path / "tone.flac", *LOSSLESS["flac"])
    output, decoded = transcode(path, tmp_path, {"loudness": True})
    loudness = output.metadata["loudness"]
    assert loudness["input_lufs"] == pytest.approx(TONE_LUFS, abs=0.1)
    assert loudness["input_true_peak_db"] == pytest.approx(TONE_PEAK_DB, abs=0.1)
    assert loudness["gain_db"] == pytest.approx(-23.0 - loudness["input_lufs"], abs=0.01)
    assert loudness["output_lufs"] == pytest.approx(-23.0, abs=0.05)
    assert (loudness["target_lufs"], loudness["true_peak_db"], loudness["limited_by_true_peak"]) == (
        -23.0,
        -1.0,
        False,
    )
    assert decoded.lufs == pytest.approx(-23.0, abs=0.5)
    assert decoded.seconds == pytest.approx(2.0, abs=0.1)


def test_loudness_to_a_custom_target(tmp_path: Path) -> None:
    path = write_tone(tmp_path / "tone.wav", *LOSSLESS["wav"])
    output, decoded = transcode(path, tmp_path, {"format": "opus", "loudness": {"target_lufs": -14}})
    assert output.metadata["loudness"]["target_lufs"] == -14.0
    assert output.metadata["loudness"]["limited_by_true_peak"] is False
    assert decoded.lufs == pytest.approx(-14.0, abs=0.5)


def test_the_true_peak_limits_the_gain(tmp_path: Path) -> None:
    """A quiet sine (−30.5 LUFS) with a one-sample click at 0.9 every second (−0.9 dBTP): bringing
    it to −23 LUFS would put the clicks at +6.6 dBTP, so the gain stops at the −1 dBTP ceiling.
    The clicks carry little of the loudness (a lossy codec smears them)."""
    signal = sine(3.0, 0.03)
    signal[RATE // 2 :: RATE] = 0.9
    path = write_signal(tmp_path / "clicks.flac", np.stack([signal, signal]))
    output, decoded = transcode(path, tmp_path, {"format": "mp3", "bitrate": 320, "loudness": True})
    loudness = output.metadata["loudness"]
    assert loudness["limited_by_true_peak"] is True
    assert loudness["input_true_peak_db"] == pytest.approx(20 * math.log10(0.9), abs=0.1)
    assert loudness["gain_db"] == pytest.approx(-1.0 - loudness["input_true_peak_db"], abs=0.01)
    assert loudness["output_lufs"] == pytest.approx(loudness["input_lufs"] + loudness["gain_db"], abs=0.05)
    assert loudness["output_lufs"] < -23.0
    assert decoded.true_peak_db <= -1.0 + 0.5
    assert decoded.lufs == pytest.approx(loudness["output_lufs"], abs=0.5)


def test_silence_gets_no_gain(tmp_path: Path) -> None:
    path = write_signal(tmp_path / "silence.flac", np.zeros((2, RATE)))
    output, decoded = transcode(path, tmp_path, {"loudness": True})
    assert output.metadata["loudness"] == {
        "input_lufs": None,
        "input_true_peak_db": None,
        "gain_db": 0.0,
        "output_lufs": None,
        "target_lufs": -23.0,
        "true_peak_db": -1.0,
        "limited_by_true_peak": False,
    }
    assert decoded.true_peak_db == -math.inf


# --- sources -------------------------------------------------------------------------------------


def test_the_sound_of_a_video(tmp_path: Path) -> None:
    path = write_video(tmp_path / "clip.mp4")  # a 440 Hz sine at 0.3 on both channels
    _, decoded = transcode(path, tmp_path, {"format": "opus"})
    assert decoded.streams == ["audio"]
    assert decoded.seconds == pytest.approx(2.0, abs=0.1)


def test_mp3_cover_art_and_tags_are_not_copied(tmp_path: Path) -> None:
    path = write_mp3_with_cover(tmp_path / "song.mp3")  # 3 s of a 440 Hz sine at 0.3, a PNG cover
    for audio_format in ("mp3", "aac"):
        output, decoded = transcode(path, tmp_path / audio_format, {"format": audio_format})
        assert decoded.streams == ["audio"]
        assert decoded.seconds == pytest.approx(3.0, abs=0.1)
    tagged = write_signal(tmp_path / "tagged.flac", sine(1.0, 0.3)[None], tags={"title": "Private title"})
    output, decoded = transcode(tagged, tmp_path / "tagged", {"format": "mp3"})
    assert "Private title" not in decoded.tags.values()
    assert b"Private title" not in (tmp_path / "tagged" / "out" / output.filename).read_bytes()


# --- bad input and params ------------------------------------------------------------------------


def _error(path: Path, tmp_path: Path, params: dict[str, Any], limits: MediaLimits = LIMITS) -> str:
    out_dir = tmp_path / "out"
    out_dir.mkdir(exist_ok=True)
    with pytest.raises(PermanentJobError) as caught:
        run("transcode_audio", params, path, out_dir, limits=limits)
    assert str(tmp_path) not in caught.value.public_message
    return caught.value.error_code


def test_video_without_audio(tmp_path: Path) -> None:
    path = write_video(tmp_path / "silent.mp4", audio=False)
    assert _error(path, tmp_path, {}) == "NO_AUDIO_STREAM"


def test_longer_than_the_limit(tmp_path: Path) -> None:
    path = write_tone(tmp_path / "tone.wav", *LOSSLESS["wav"])
    limits = MediaLimits(max_input_bytes=LIMITS.max_input_bytes, max_duration_seconds=1.5)
    assert _error(path, tmp_path, {}, limits) == "MEDIA_TOO_LONG"


@pytest.mark.parametrize("loudness", [False, True])
def test_longer_than_the_limit_found_while_decoding(tmp_path: Path, loudness: bool) -> None:
    """Matroska written live has no duration in its header: the decoded samples are counted."""
    path = write_video(tmp_path / "live.mkv", container_format="matroska", options={"live": "1"})
    with av.open(str(path)) as container:
        assert container.duration is None
    limits = MediaLimits(max_input_bytes=LIMITS.max_input_bytes, max_duration_seconds=1.0)
    assert _error(path, tmp_path, {"loudness": loudness}, limits) == "MEDIA_TOO_LONG"


def test_adts_without_a_header_duration_transcodes_whole(tmp_path: Path) -> None:
    path = write_adts(tmp_path / "speech.aac", seconds=3.0, noise_seconds=0.5)
    output, decoded = transcode(path, tmp_path, {"format": "opus", "loudness": True})
    assert output.metadata["duration_seconds"] == pytest.approx(3.0, abs=0.1)
    assert decoded.lufs == pytest.approx(-23.0, abs=0.5)


def test_garbage_in_the_middle_is_skipped(tmp_path: Path) -> None:
    """4000 random bytes over a few frames of a 3 s MP3: the frames that do not decode are skipped
    and counted, the rest transcoded (FFmpeg's command line does the same; issue 15, item 9; the
    bound past which a file is corrupt: test_media_decode_errors.py)."""
    path = write_mp3_with_cover(tmp_path / "song.mp3")
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 4000] = np.random.default_rng(1).integers(0, 256, 4000, dtype=np.uint8).tobytes()
    path.write_bytes(bytes(data))
    output, decoded = transcode(path, tmp_path, {"format": "opus"})
    assert output.metadata["decode_errors"] >= 1
    assert 2.5 < output.metadata["duration_seconds"] < 3.0
    assert decoded.seconds == pytest.approx(output.metadata["duration_seconds"], abs=0.05)


def test_a_codec_without_a_decoder_is_unsupported(tmp_path: Path) -> None:
    path = write_signal(
        tmp_path / "pcm.mkv", sine(0.1, 0.3)[None], codec="pcm_s16le", container_format="matroska"
    )
    data = path.read_bytes()
    assert b"A_PCM/INT/LIT" in data
    path.write_bytes(data.replace(b"A_PCM/INT/LIT", b"A_ZZZ/INT/LIT"))
    assert _error(path, tmp_path, {}) == "UNSUPPORTED_FORMAT"


def test_text_is_unsupported(tmp_path: Path) -> None:
    path = tmp_path / "notes.mp3"
    path.write_text("not audio at all\n" * 100)
    assert _error(path, tmp_path, {}) == "UNSUPPORTED_FORMAT"


def test_default_params() -> None:
    assert media_params.validate_params("transcode_audio", None) == {
        "format": "aac",
        "bitrate": 128,
        "channels": 2,
        "loudness": None,
    }


@pytest.mark.parametrize(
    "params",
    [
        {"format": "flac"},
        {"bitrate": 16},
        {"bitrate": 128.5},
        {"channels": 6},
        {"loudness": {"target_lufs": -5}},
        {"loudness": {"true_peak_db": 1}},
        {"loudness": "ebu"},
        {"codec": "aac"},
    ],
)
def test_bad_params(tmp_path: Path, params: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgument) as err:
        run("transcode_audio", params, tmp_path / "never-read", tmp_path, limits=LIMITS)
    assert err.value.error_code == "INVALID_PARAMS"


def test_another_operation_is_unknown(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument) as err:
        run("waveform", {}, tmp_path / "never-read", tmp_path, limits=LIMITS)
    assert err.value.error_code == "UNKNOWN_OPERATION"


def test_timestamps_do_not_matter(tmp_path: Path) -> None:
    """A FLAC whose frames start at 10 s: the output starts at 0 and lasts as long as the audio."""
    path = tmp_path / "late.mkv"
    with av.open(str(path), "w", format="matroska") as container:
        stream = container.add_stream("flac", rate=RATE, layout="mono")
        stream.format = "s16"
        samples = np.round(sine(1.0, 0.3) * 32767).astype(np.int16)
        for start in range(0, len(samples), 1024):
            frame = av.AudioFrame.from_ndarray(
                samples[None, start : start + 1024], format="s16", layout="mono"
            )
            frame.sample_rate, frame.pts, frame.time_base = RATE, 10 * RATE + start, Fraction(1, RATE)
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    output, decoded = transcode(path, tmp_path, {"format": "aac"})
    assert output.metadata["duration_seconds"] == pytest.approx(1.0, abs=0.03)
    assert decoded.seconds == pytest.approx(1.0, abs=0.1)


def _float_wav(path: Path, channels: np.ndarray, layout: str) -> Path:
    """32-bit float PCM in WAV: any value, NaN and infinities included, is a valid sample."""
    with av.open(str(path), "w", format="wav") as container:
        stream = container.add_stream("pcm_f32le", rate=RATE, layout=layout)
        for start in range(0, channels.shape[1], 4096):
            block = np.ascontiguousarray(channels[:, start : start + 4096].T.reshape(1, -1), dtype=np.float32)
            frame = av.AudioFrame.from_ndarray(block, format="flt", layout=layout)
            frame.sample_rate, frame.pts = RATE, start
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    return path


@pytest.mark.parametrize("bad", [np.nan, np.inf, 1e30])
@pytest.mark.parametrize("audio_format", ["aac", "mp3"])
def test_non_finite_and_huge_float_samples_are_cleaned(tmp_path: Path, bad: float, audio_format: str) -> None:
    """A float WAV with a NaN, an infinity or 1e30 in it: FFmpeg's AAC encoder refused it
    (INTERNAL), LAME aborted the child (SIGABRT); the samples are now zeroed or clipped."""
    signal = np.stack([sine(2.0, 0.3), sine(2.0, 0.3)])
    signal[:, RATE // 2 : RATE // 2 + 100] = bad
    path = _float_wav(tmp_path / "bad.wav", signal, "stereo")
    output, decoded = transcode(path, tmp_path, {"format": audio_format, "loudness": True})
    assert decoded.seconds == pytest.approx(2.0, abs=0.1)
    assert output.metadata["loudness"]["input_true_peak_db"] <= 20


def test_an_unnamed_32_channel_layout_is_unsupported_not_corrupt(tmp_path: Path) -> None:
    path = _float_wav(tmp_path / "ch32.wav", np.tile(sine(0.5, 0.3), (32, 1)), "32 channels")
    assert _error(path, tmp_path, {}) == "UNSUPPORTED_FORMAT"


def test_packets_spanning_past_the_limit_are_refused_before_decoding(tmp_path: Path) -> None:
    """A clip whose last audio packet is stamped at 5 h (the header says 2 s): MEDIA_TOO_LONG
    from the demux pass before any decoding (a header understating a long file used to be
    decoded until the CPU limit)."""
    from tests.helpers.media import with_a_late_audio_packet

    path = with_a_late_audio_packet(write_video(tmp_path / "in.mp4", seconds=2.0), tmp_path / "late.mkv")
    assert _error(path, tmp_path, {}) == "MEDIA_TOO_LONG"
    assert list((tmp_path / "out").iterdir()) == []
