"""transcode_video checkpoints in the engine (issue 23, ADR 0079): a video at least
``part_seconds`` long is encoded rendition by rendition, each but the last kept as a part; a
resumed job takes the kept renditions (their very bytes) and encodes only the rest, whose
frames, sizes and durations are an uninterrupted run's; a part made with other params, by
another rendition, or damaged is encoded again; a shorter video keeps nothing. Real FFmpeg
through PyAV."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import zipfile
from pathlib import Path
from typing import Any

import av
import pytest

from hypermedia.engines.contract import CHECKPOINT_DIR, RESUME_DIR, report_progress
from hypermedia.engines.media import rendition_parts, transcode
from hypermedia.engines.media.sources import MediaLimits
from tests.helpers.media import write_video

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
            round(container.duration / av.time_base, 2),
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
    assert record["rendition"] == ["360p", 640, 360] and record["frames"] == 75 and record["has_audio"]
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


def test_a_part_of_another_rendition_or_with_a_path_for_a_name_is_not_taken(tmp_path: Path) -> None:
    """The part's record must name the rendition asked for; a member name that is a path is
    never written (the part is ignored whole)."""
    job_dir = tmp_path / "job"
    (job_dir / "output").mkdir(parents=True)
    (job_dir / RESUME_DIR).mkdir()
    with zipfile.ZipFile(job_dir / RESUME_DIR / "r-360p.zip", "w") as part:
        part.writestr("rendition.json", "{}")
        part.writestr("../media", b"x")
    made = rendition_parts.made_by(transcode.validate_params("transcode_video", PARAMS))
    rendition = transcode.plan_ladder(640, 360, [360])[0]
    assert rendition_parts.restored(job_dir / "output", rendition, made, job_dir / "output" / "v.mp4") is None
    assert not (tmp_path / "media").exists() and not (job_dir / "media").exists()


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
    seen: list[float] = []

    def record(out_dir: Path, fraction: float) -> None:
        seen.append(fraction)
        report_progress(out_dir, fraction)

    monkeypatch.setattr(transcode, "report_progress", record)
    _transcode(tmp_path, source)
    assert seen == sorted(seen) and seen[-1] == 1.0
    assert any(1 / 3 < f < 2 / 3 for f in seen) and any(2 / 3 < f < 1 for f in seen)
