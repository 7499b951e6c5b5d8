"""A long ``transcode_video`` that can be cut into chunks is encoded chunk by chunk, each chunk
but the last kept as a checkpoint part, and a later attempt takes the kept chunks
(:mod:`hypermedia.engines.media.chunk_parts`, issue 23, ADR 0080). Real files through real
FFmpeg: the outputs are decoded, and which chunks an attempt encodes is watched on the real
function."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import zipfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import av
import pytest

from hypermedia.engines.contract import CHECKPOINT_DIR, RESUME_DIR
from hypermedia.engines.media import chunk_parts, chunks, passes, rendition_parts, transcode
from hypermedia.engines.media.sources import MediaLimits
from tests.helpers.media import progress_seen, write_testsrc

LIMITS = MediaLimits(max_input_bytes=1 << 30, threads=2, part_seconds=8.0)
PARAMS: dict[str, Any] = {"heights": [240, 144], "hls": True, "hls_segment_seconds": 2}
LADDER = ["240p", "144p"]
FRAMES = 24 * 25


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """24 s at 25 fps with sound, a keyframe every second: three chunks of 8 s."""
    return write_testsrc(tmp_path_factory.mktemp("chunk-parts") / "clip.mp4")


@pytest.fixture
def encoded_chunks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The chunks the transcode encodes, in order: the real :func:`encode_chunk`, watched."""
    seen: list[int] = []
    real = chunk_parts.encode_chunk

    def watched(plan: Any, chunk: Any, *args: Any) -> Any:
        seen.append(chunk.index)
        return real(plan, chunk, *args)

    monkeypatch.setattr(chunk_parts, "encode_chunk", watched)
    return seen


def _transcode(job_dir: Path, source: Path, params: dict[str, Any] = PARAMS) -> dict[str, Any]:
    """The job's outputs' metadata by output type."""
    (job_dir / "output").mkdir(parents=True)
    outputs = transcode.run("transcode_video", params, source, job_dir / "output", limits=LIMITS)
    return {o.output_type: o.metadata for o in outputs}


def _times(path: Path) -> list[float]:
    """Every video frame's presentation time, in seconds."""
    with av.open(str(path)) as container:
        video = container.streams.video[0]
        assert video.time_base is not None
        return [float(f.pts * video.time_base) for f in container.decode(video) if f.pts is not None]


@pytest.fixture(scope="module")
def whole(source: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    job_dir = tmp_path_factory.mktemp("whole")
    return job_dir, _transcode(job_dir, source)


def test_every_chunk_but_the_last_is_kept_as_a_part(whole: tuple[Path, dict[str, Any]]) -> None:
    job_dir, outputs = whole
    assert sorted(p.name for p in (job_dir / CHECKPOINT_DIR).iterdir()) == ["c-0000.zip", "c-0001.zip"]
    with zipfile.ZipFile(job_dir / CHECKPOINT_DIR / "c-0001.zip") as part:
        assert sorted(part.namelist()) == ["144p", "240p", "chunk.json"]
        assert part.getinfo("240p").compress_type == zipfile.ZIP_STORED
        record = json.loads(part.read("chunk.json"))
    assert record["chunk"]["index"] == 1 and record["chunk"]["start_seconds"] == 8.0
    assert record["ladder"] == [["240p", 320, 240], ["144p", 192, 144]] and record["decode_errors"] == 0
    assert record["made_by"]["format"] == "chunk-1"
    for name in LADDER:
        assert outputs[f"video_{name}"]["frame_count"] == FRAMES and not outputs[f"video_{name}"]["resumed"]
        times = _times(job_dir / "output" / f"video_{name}.mp4")
        assert len(times) == FRAMES and times[0] == 0.0 and round(times[-1], 2) == 23.96
    # HLS from the joined files: a 2 s segment grid throughout.
    assert [outputs[f"hls_{n}"]["segments"] for n in LADDER] == [12, 12]
    assert "c-0002" not in {p.stem for p in (job_dir / CHECKPOINT_DIR).iterdir()}


def test_a_resumed_transcode_takes_the_kept_chunks_and_encodes_the_rest(
    whole: tuple[Path, dict[str, Any]], source: Path, tmp_path: Path, encoded_chunks: list[int]
) -> None:
    first, outputs = whole
    shutil.copytree(first / CHECKPOINT_DIR, tmp_path / RESUME_DIR)
    resumed = _transcode(tmp_path, source)
    assert encoded_chunks == [2]  # the first two were taken, not encoded again
    assert not (tmp_path / CHECKPOINT_DIR).exists(), "a resumed attempt keeps only what it encoded"
    for name in LADDER:
        assert resumed[f"video_{name}"]["resumed"]
        assert resumed[f"video_{name}"]["frame_count"] == FRAMES
        assert _times(tmp_path / "output" / f"video_{name}.mp4") == _times(
            first / "output" / f"video_{name}.mp4"
        )
        assert resumed[f"hls_{name}"]["segments"] == outputs[f"hls_{name}"]["segments"]


def _rezip(kept: Path, target: Path, change: Any) -> None:
    """``kept``'s members through ``change(members) -> members`` into ``target``."""
    with zipfile.ZipFile(kept) as part:
        members = {name: part.read(name) for name in part.namelist()}
    with zipfile.ZipFile(target, "w") as part:
        for name, data in change(members).items():
            part.writestr(name, data)


def _record(change: Any) -> Any:
    def changed(members: dict[str, bytes]) -> dict[str, bytes]:
        record = json.loads(members["chunk.json"])
        change(record)
        return members | {"chunk.json": json.dumps(record).encode()}

    return changed


def test_a_chunk_part_not_of_its_place_is_encoded_again(
    whole: tuple[Path, dict[str, Any]], source: Path, tmp_path: Path, encoded_chunks: list[int]
) -> None:
    first, _ = whole
    kept = first / CHECKPOINT_DIR / "c-0000.zip"
    hostile = {
        "other params": _record(lambda r: r["made_by"]["params"].update(quality=30)),
        "another chunk's record": _record(lambda r: r["chunk"].update(index=1)),
        "another ladder": _record(lambda r: r["ladder"].pop()),
        "decode errors below zero": _record(lambda r: r.update(decode_errors=-1)),
        "renditions swapped": lambda m: m | {"240p": m["144p"], "144p": m["240p"]},
        "a rendition cut short": lambda m: m | {"240p": m["240p"][:5000]},
        "a member more": lambda m: m | {"extra": b"x"},
        "the next chunk's media": lambda m: m | dict(_members(first / CHECKPOINT_DIR / "c-0001.zip", LADDER)),
    }
    for name, change in hostile.items():
        job_dir = tmp_path / name.replace(" ", "-").replace("'", "")
        (job_dir / RESUME_DIR).mkdir(parents=True)
        _rezip(kept, job_dir / RESUME_DIR / "c-0000.zip", change)
        encoded_chunks.clear()
        resumed = _transcode(job_dir, source)
        assert encoded_chunks == [0, 1, 2], name
        assert not resumed["video_240p"]["resumed"], name
        assert resumed["video_240p"]["frame_count"] == FRAMES, name
        assert not list((job_dir).glob("chunks-*")), name


def _last_moved(media: bytes, seconds: float) -> bytes:
    """A chunk file with its last packet's presentation and decode times both at ``seconds``."""
    with tempfile.TemporaryDirectory() as scratch:
        given, moved = Path(scratch) / "given.mp4", Path(scratch) / "moved.mp4"
        given.write_bytes(media)
        with av.open(str(given)) as chunk, av.open(str(moved), "w", format="mp4") as out:
            stream = out.add_stream_from_template(chunk.streams.video[0])
            packets = [p for p in chunk.demux(chunk.streams.video[0]) if p.size]
            assert packets[-1].time_base is not None
            packets[-1].pts = packets[-1].dts = round(seconds / packets[-1].time_base)
            for packet in packets:
                packet.stream = stream
                out.mux(packet)
        return moved.read_bytes()


def test_a_kept_chunk_whose_last_decode_time_crowds_the_next_one_still_joins(
    whole: tuple[Path, dict[str, Any]], source: Path, tmp_path: Path, encoded_chunks: list[int]
) -> None:
    """A kept chunk whose last packet is stamped 7.96 s for both times, a decode time later than
    x264 puts one: the next chunk, this attempt's, starts its decode times before that. The join
    moves them up (presentation times kept) instead of failing the job, as a hostile review
    found it did."""
    first, _ = whole
    (tmp_path / RESUME_DIR).mkdir(parents=True)
    _rezip(
        first / CHECKPOINT_DIR / "c-0000.zip",
        tmp_path / RESUME_DIR / "c-0000.zip",
        lambda m: m | {n: _last_moved(m[n], 7.96) for n in LADDER},
    )
    resumed = _transcode(tmp_path, source)
    assert encoded_chunks == [1, 2] and resumed["video_240p"]["resumed"]
    # Every frame is there; the moved one is shown where the kept part says (its content is
    # the earlier attempt's, as any kept chunk's: ADR 0080).
    assert len(_times(tmp_path / "output" / "video_240p.mp4")) == FRAMES


def test_a_part_of_the_last_chunk_is_never_taken(
    whole: tuple[Path, dict[str, Any]], source: Path, tmp_path: Path, encoded_chunks: list[int]
) -> None:
    """The last chunk is never kept, so a part of it in ``resume/`` is none this job made (a
    child an exploit took over could write one): it is encoded again, and the join keeps a
    chunk of this attempt's to measure the kept ones by."""
    first, _ = whole
    made = tmp_path / "made"
    (made / "output").mkdir(parents=True)
    plan = transcode.prepare("transcode_video", PARAMS, source, made / "output", LIMITS)
    planned = chunks.plan_chunks(plan, 8.0)
    (made / "scratch").mkdir()
    encoded = chunks.encode_chunk(replace(plan, out_dir=made / "scratch"), planned[2])
    record = {**rendition_parts.made_by(plan.options), "format": f"chunk-{chunk_parts.CHUNK_PART_FORMAT}"}
    chunk_parts._keep(plan, planned[2], ({e.rendition.name: e.path for e in encoded}, 0), record)
    shutil.copytree(first / CHECKPOINT_DIR, tmp_path / "job" / RESUME_DIR)
    shutil.copy(made / CHECKPOINT_DIR / "c-0002.zip", tmp_path / "job" / RESUME_DIR)
    resumed = _transcode(tmp_path / "job", source)
    assert encoded_chunks == [2] and resumed["video_240p"]["frame_count"] == FRAMES


def _members(path: Path, names: list[str]) -> list[tuple[str, bytes]]:
    with zipfile.ZipFile(path) as part:
        return [(name, part.read(name)) for name in names]


def test_a_taken_chunk_the_join_refuses_is_encoded_again(
    whole: tuple[Path, dict[str, Any]], source: Path, tmp_path: Path, encoded_chunks: list[int]
) -> None:
    """A kept chunk that passes every check of its own but was encoded with other settings (its
    parameter sets differ from the other chunks'): the join refuses it, and it is encoded again."""
    first, _ = whole
    (tmp_path / RESUME_DIR).mkdir(parents=True)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    members = dict(_members(first / CHECKPOINT_DIR / "c-0000.zip", ["chunk.json", *LADDER]))
    for name in LADDER:
        (scratch / f"{name}.mp4").write_bytes(members[name])
        subprocess.run(
            [
                "ffmpeg",
                "-v",
                "error",
                "-i",
                str(scratch / f"{name}.mp4"),
                "-c:v",
                "libx264",
                "-preset",
                "ultrafast",
                str(scratch / f"{name}-other.mp4"),
            ],
            check=True,
        )
        members[name] = (scratch / f"{name}-other.mp4").read_bytes()
    with zipfile.ZipFile(tmp_path / RESUME_DIR / "c-0000.zip", "w") as part:
        for name, data in members.items():
            part.writestr(name, data)
    resumed = _transcode(tmp_path, source)
    assert encoded_chunks == [1, 2, 0]  # taken first, refused by the join, then encoded
    # ... and kept again, so that a later attempt does not take the refused part.
    assert sorted(p.name for p in (tmp_path / CHECKPOINT_DIR).iterdir()) == ["c-0000.zip", "c-0001.zip"]
    [(_, again)] = _members(tmp_path / CHECKPOINT_DIR / "c-0000.zip", ["240p"])
    assert again != members["240p"]
    assert resumed["video_240p"]["frame_count"] == FRAMES and not resumed["video_240p"]["resumed"]
    assert len(_times(tmp_path / "output" / "video_240p.mp4")) == FRAMES


def test_a_video_that_cannot_be_cut_keeps_renditions_instead(tmp_path: Path) -> None:
    """One keyframe in 24 s: no chunk could start after the first, so the ladder is encoded a
    rendition at a time (:mod:`hypermedia.engines.media.rendition_parts`)."""
    source = write_testsrc(tmp_path / "one_keyframe.mp4", gop=10_000)
    _transcode(tmp_path / "job", source, {"heights": [240, 144]})
    assert sorted(p.name for p in (tmp_path / "job" / CHECKPOINT_DIR).iterdir()) == ["r-240p.zip"]


def test_progress_goes_on_over_the_chunks(
    source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each chunk's pass reports within its share of the job, never going back; the join ends at 1."""
    seen = progress_seen(monkeypatch, chunk_parts, passes)  # between and within the passes
    _transcode(tmp_path, source)
    assert seen == sorted(seen) and seen[-1] == 1.0
    for low, high in ((0.0, 0.95 / 3), (0.95 / 3, 2 * 0.95 / 3), (2 * 0.95 / 3, 0.95)):
        assert any(low < f < high for f in seen), (low, high)


def test_a_fanned_out_transcode_asks_for_children_whose_chunks_its_next_run_joins(
    whole: tuple[Path, dict[str, Any]], source: Path, tmp_path: Path, encoded_chunks: list[int]
) -> None:
    """ADR 0081 through the engine: 24 s over ``fan_out_seconds`` asks to fan out into three
    chunks and encodes nothing; each child's run encodes its own chunk and keeps it (the last
    chunk's child keeps nothing: it is the parent's); the parent's next run, fan-out off, takes
    the children's parts, encodes only the last chunk and joins one pass's frames."""
    fanned = replace(LIMITS, fan_out_seconds=10.0, fan_out_chunk_seconds=8.0)
    parent = tmp_path / "parent"
    (parent / "output").mkdir(parents=True)

    [request] = transcode.run("transcode_video", PARAMS, source, parent / "output", limits=fanned)

    assert (request.output_type, request.filename, request.metadata) == (
        "fan_out",
        "fanout.json",
        {"chunks": 3},
    )
    asked = json.loads((parent / "output" / "fanout.json").read_text())["chunks"]
    assert [c["start_seconds"] for c in asked] == [0.0, 8.0, 16.0]
    assert encoded_chunks == []
    (parent / "output" / "fanout.json").unlink()
    for index in (0, 1, 2):
        child = tmp_path / f"child-{index}"
        (child / "output").mkdir(parents=True)
        limits = replace(fanned, chunk=index)
        assert transcode.run("transcode_video", PARAMS, source, child / "output", limits=limits) == []
        kept = sorted(p.name for p in (child / CHECKPOINT_DIR).glob("*.zip"))
        assert kept == ([f"c-{index:04d}.zip"] if index < 2 else []), kept
        for name in kept:
            (parent / RESUME_DIR).mkdir(exist_ok=True)
            shutil.copy(child / CHECKPOINT_DIR / name, parent / RESUME_DIR / name)
    assert encoded_chunks == [0, 1]  # the last chunk's child encoded nothing

    joined = transcode.run(
        "transcode_video", PARAMS, source, parent / "output", limits=replace(fanned, fan_out=False)
    )

    assert encoded_chunks == [0, 1, 2]  # the parent encoded only its own last chunk
    first, _outputs = whole
    metadata = {o.output_type: o.metadata for o in joined}
    for name in LADDER:
        assert metadata[f"video_{name}"]["resumed"] and metadata[f"video_{name}"]["frame_count"] == FRAMES
        assert _times(parent / "output" / f"video_{name}.mp4") == _times(
            first / "output" / f"video_{name}.mp4"
        )
