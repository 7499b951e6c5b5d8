"""transcode_video checkpoints in the engine (issue 23, ADR 0079): a video at least
``part_seconds`` long is encoded rendition by rendition, each but the last kept as a part; a
resumed job takes the kept renditions (their very bytes) and encodes only the rest, whose
frames, sizes and durations are an uninterrupted run's; a part made with other params, by
another rendition, or damaged is encoded again; a shorter video keeps nothing. Real FFmpeg
through PyAV."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import shutil
import struct
import zipfile
from pathlib import Path
from typing import Any

import av
import pytest

from hypermedia.engines import contract
from hypermedia.engines.contract import CHECKPOINT_DIR, RESUME_DIR, keep_part, resumed_files
from hypermedia.engines.media import passes, transcode
from hypermedia.engines.media.sources import MediaLimits
from tests.helpers.media import progress_seen, write_video

LIMITS = MediaLimits(max_input_bytes=1 << 30, threads=2, part_seconds=1.0)
PARAMS: dict[str, Any] = {"heights": [360, 240, 144], "hls": True, "hls_segment_seconds": 2}
LADDER = ["360p", "240p", "144p"]


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """3 s of 640×360 at 25 fps with sound."""
    return write_video(
        tmp_path_factory.mktemp("transcode-parts") / "clip.mp4", seconds=3.0, width=640, height=360
    )


def _transcode(
    job_dir: Path, source: Path, params: dict[str, Any] = PARAMS, limits: MediaLimits = LIMITS
) -> dict:
    """The job's outputs by output type: (SHA-256 of the bytes, metadata)."""
    (job_dir / "output").mkdir(parents=True)
    outputs = transcode.run("transcode_video", params, source, job_dir / "output", limits=limits)
    return {
        o.output_type: (
            hashlib.sha256((job_dir / "output" / o.filename).read_bytes()).hexdigest(),
            o.metadata,
        )
        for o in outputs
    }


def _decoded(path: Path) -> tuple[int, int, int, float]:
    """Frames decoded, width, height and duration (s) of a rendition."""
    with av.open(str(path)) as container:
        frames = sum(1 for _ in container.decode(video=0))
        video = container.streams.video[0]
        return (
            frames,
            video.codec_context.width,
            video.codec_context.height,
            round((container.duration or 0) / av.time_base, 2),
        )


@pytest.fixture(scope="module")
def whole(source: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    job_dir = tmp_path_factory.mktemp("whole")
    return job_dir, _transcode(job_dir, source)


def test_every_rendition_but_the_last_is_kept_as_a_part(whole: tuple[Path, dict]) -> None:
    job_dir, outputs = whole
    assert sorted(p.name for p in (job_dir / CHECKPOINT_DIR).iterdir()) == ["r-240p.zip", "r-360p.zip"]
    with zipfile.ZipFile(job_dir / CHECKPOINT_DIR / "r-360p.zip") as part:
        assert sorted(part.namelist()) == ["media", "rendition.json"]
        media = part.getinfo("media")
        assert media.compress_type == zipfile.ZIP_STORED
        assert hashlib.sha256(part.read("media")).hexdigest() == outputs["video_360p"][0]
        record = json.loads(part.read("rendition.json"))
    assert record["rendition"] == ["360p", 640, 360] and record["decode_errors"] == 0
    assert record["made_by"]["params"]["heights"] == [360, 240, 144]
    assert [outputs[f"video_{name}"][1]["resumed"] for name in LADDER] == [False] * 3


def test_a_resumed_transcode_takes_the_kept_renditions_and_encodes_the_rest(
    whole: tuple[Path, dict], source: Path, tmp_path: Path
) -> None:
    first, outputs = whole
    shutil.copytree(first / CHECKPOINT_DIR, tmp_path / RESUME_DIR)
    resumed = _transcode(tmp_path, source)
    assert [resumed[f"video_{name}"][1]["resumed"] for name in LADDER] == [True, True, False]
    # The kept renditions are the first attempt's bytes; the last one is encoded again.
    for name in ("360p", "240p"):
        assert resumed[f"video_{name}"][0] == outputs[f"video_{name}"][0]
    assert not (tmp_path / CHECKPOINT_DIR).exists(), "a resumed attempt keeps only what it encoded"
    for name in LADDER:
        again, before = resumed[f"video_{name}"][1], outputs[f"video_{name}"][1]
        assert {k: again[k] for k in ("frame_count", "duration_seconds", "width", "height")} == {
            k: before[k] for k in ("frame_count", "duration_seconds", "width", "height")
        }
        assert _decoded(tmp_path / "output" / f"video_{name}.mp4") == _decoded(
            first / "output" / f"video_{name}.mp4"
        )
    # HLS is packaged from the finished files either way: the same playlists' shape.
    assert resumed["hls_master"][1]["renditions"] == outputs["hls_master"][1]["renditions"]
    assert [resumed[f"hls_{n}"][1]["segments"] for n in LADDER] == [
        outputs[f"hls_{n}"][1]["segments"] for n in LADDER
    ]


def test_a_part_of_other_params_or_damaged_is_encoded_again(
    whole: tuple[Path, dict], source: Path, tmp_path: Path
) -> None:
    first, _ = whole
    resume = tmp_path / RESUME_DIR
    resume.mkdir(parents=True)
    # 360p: made with a quality the job does not have; 240p: the media is cut short.
    with zipfile.ZipFile(first / CHECKPOINT_DIR / "r-360p.zip") as kept:
        record, media = json.loads(kept.read("rendition.json")), kept.read("media")
    record["made_by"]["params"]["quality"] += 5
    with zipfile.ZipFile(resume / "r-360p.zip", "w") as part:
        part.writestr("rendition.json", json.dumps(record))
        part.writestr("media", media)
    with zipfile.ZipFile(first / CHECKPOINT_DIR / "r-240p.zip") as kept:
        record, media = json.loads(kept.read("rendition.json")), kept.read("media")
    with zipfile.ZipFile(resume / "r-240p.zip", "w") as part:
        part.writestr("rendition.json", json.dumps(record))
        part.writestr("media", media[:100])
    resumed = _transcode(tmp_path, source)
    assert [resumed[f"video_{name}"][1]["resumed"] for name in LADDER] == [False, False, False]
    assert sorted(p.name for p in (tmp_path / CHECKPOINT_DIR).iterdir()) == ["r-240p.zip", "r-360p.zip"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("restored-")]


def _zip(members: list[tuple[str, bytes]], method: int = zipfile.ZIP_STORED) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in members:
            archive.writestr(zipfile.ZipInfo(name, (1980, 1, 1, 0, 0, 0)), data, compress_type=method)
    return buffer.getvalue()


def _flagged(blob: bytes, offset_local: int, offset_central: int, value: int) -> bytes:
    """``blob`` with a 16-bit field of every local and central header or-ed with ``value``."""
    data = bytearray(blob)
    for signature, offset in ((b"PK\x03\x04", offset_local), (b"PK\x01\x02", offset_central)):
        at = 0
        while (at := data.find(signature, at)) >= 0:
            field = struct.unpack_from("<H", data, at + offset)[0]
            struct.pack_into("<H", data, at + offset, field | value)
            at += 4
    return bytes(data)


def _matroska_rawvideo(path: Path) -> bytes:
    """Three raw 640×360 frames in Matroska: a video of the rendition's size, not what the
    transcode writes (HLS packaging cannot even remux it)."""
    with av.open(str(path), "w", format="matroska") as container:
        stream = container.add_stream("rawvideo", rate=25)
        stream.width, stream.height, stream.pix_fmt = 640, 360, "yuv420p"
        for n in range(3):
            frame = av.VideoFrame(640, 360, "yuv420p")
            frame.pts = n
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return path.read_bytes()


def _hostile_parts(kept: Path, scratch: Path) -> dict[str, bytes]:
    """Parts an earlier attempt's child could have left for ``r-360p``, built from the genuine
    one: none of them may be taken, and none may fail the job."""
    with zipfile.ZipFile(kept) as archive:
        record, media = archive.read("rendition.json"), archive.read("media")
    genuine = json.loads(record)
    deflated = bytearray(_zip([("media", media), ("rendition.json", record)], zipfile.ZIP_DEFLATED))
    at = deflated.rfind(b"PK\x03\x04")  # rendition.json's local header: spoil its deflate stream
    deflated[at + 30 + len("rendition.json")] = 0xFF
    return {
        "a path for a name": _zip([("../media", media), ("rendition.json", record)]),
        "a member twice": _zip([("media", media), ("media", media), ("rendition.json", record)]),
        "a third member": _zip([("media", media), ("rendition.json", record), ("extra", b"x")]),
        "a damaged deflate stream": bytes(deflated),
        "encrypted": _flagged(_zip([("media", media), ("rendition.json", record)]), 6, 8, 0x1),
        "an unknown compression method": _flagged(
            _zip([("media", media), ("rendition.json", record)]), 8, 10, 99
        ),
        "a record nested 60,000 deep": _zip([("media", media), ("rendition.json", b"[" * 60_000)]),
        "a record of another rendition": _zip(
            [
                ("media", media),
                ("rendition.json", json.dumps(genuine | {"rendition": ["240p", 426, 240]}).encode()),
            ]
        ),
        "decode errors below zero": _zip(
            [("media", media), ("rendition.json", json.dumps(genuine | {"decode_errors": -7}).encode())]
        ),
        "decode errors a float": _zip(
            [("media", media), ("rendition.json", json.dumps(genuine | {"decode_errors": 1e308}).encode())]
        ),
        "media cut short": _zip([("media", media[:100]), ("rendition.json", record)]),
        "media not the transcode's": _zip(
            [("media", _matroska_rawvideo(scratch / "raw.mkv")), ("rendition.json", record)]
        ),
        "a record over 64 KiB": _zip([("media", media), ("rendition.json", record + b" " * 70_000)]),
    }


@pytest.mark.filterwarnings("ignore:Duplicate name:UserWarning")
def test_a_hostile_part_is_encoded_again_and_never_fails_the_job(
    whole: tuple[Path, dict], source: Path, tmp_path: Path
) -> None:
    first, _ = whole
    for name, blob in _hostile_parts(first / CHECKPOINT_DIR / "r-360p.zip", tmp_path).items():
        job_dir = tmp_path / name.replace(" ", "-")
        (job_dir / RESUME_DIR).mkdir(parents=True)
        (job_dir / RESUME_DIR / "r-360p.zip").write_bytes(blob)
        resumed = _transcode(job_dir, source)
        assert [resumed[f"video_{n}"][1]["resumed"] for n in LADDER] == [False] * 3, name
        assert resumed["video_360p"][1]["frame_count"] == 75, name
        assert not [p for p in job_dir.iterdir() if p.name.startswith("restored-")], name


def test_a_part_with_a_million_entries_is_refused_before_its_directory_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The end record says how many entries there are: anything but the part's two is refused
    without opening the archive, whose central directory a million entries make costly to parse
    (3.8 s and 363 MiB in the review). The real ``ZipFile`` is watched, not replaced."""
    job_dir = tmp_path / "job"
    (job_dir / "output").mkdir(parents=True)
    (job_dir / RESUME_DIR).mkdir()
    with zipfile.ZipFile(job_dir / RESUME_DIR / "r-360p.zip", "w") as archive:
        for n in range(70_000):
            archive.writestr(f"m{n}", b"")
    opened: list[object] = []
    real = zipfile.ZipFile

    def watched(*args: Any, **kwargs: Any) -> zipfile.ZipFile:
        opened.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(contract.zipfile, "ZipFile", watched)
    into = tmp_path / "into"
    into.mkdir()
    assert (
        resumed_files(job_dir / "output", "r-360p", into, {"media": 1 << 20, "rendition.json": 1 << 16})
        is None
    )
    assert opened == [] and not list(into.iterdir())


def test_a_shorter_video_or_a_single_rendition_is_encoded_in_one_pass(source: Path, tmp_path: Path) -> None:
    longer = dataclasses.replace(LIMITS, part_seconds=10.0)
    outputs = _transcode(tmp_path / "short", source, limits=longer)
    assert not (tmp_path / "short" / CHECKPOINT_DIR).exists()
    assert [outputs[f"video_{name}"][1]["frame_count"] for name in LADDER] == [75] * 3
    _transcode(tmp_path / "single", source, params={"heights": [240]})
    assert not (tmp_path / "single" / CHECKPOINT_DIR).exists()


def test_progress_goes_on_over_the_renditions(
    source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each rendition's pass reports within its share of the job; the job ends at 1."""
    seen = progress_seen(monkeypatch, transcode, passes)  # between and within the passes
    _transcode(tmp_path, source)
    assert seen == sorted(seen) and seen[-1] == 1.0
    assert any(1 / 3 < f < 2 / 3 for f in seen) and any(2 / 3 < f < 1 for f in seen)


def test_a_part_that_cannot_be_written_leaves_nothing_behind(tmp_path: Path) -> None:
    """A part whose writing fails (here a file that cannot be read; a full disk in life) is not
    kept, and its half-written temporary file does not stay to fill the disk."""
    job_dir = tmp_path / "job"
    (job_dir / "output").mkdir(parents=True)
    keep_part(job_dir / "output", "r-360p", {"rendition.json": b"{}", "media": tmp_path})  # a directory
    assert list((job_dir / CHECKPOINT_DIR).iterdir()) == []
