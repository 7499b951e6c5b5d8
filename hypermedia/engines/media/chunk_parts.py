"""A long transcode's chunks kept beyond the attempt (issue 23 items 1 and 2, ADR 0080): a
``transcode_video`` of at least :attr:`~hypermedia.engines.media.sources.MediaLimits.part_seconds`
that :func:`hypermedia.engines.media.chunks.plan_chunks` can cut is encoded chunk by chunk, every
rendition of a chunk from one decode of it (:func:`encode_in_chunks`), and each finished chunk but
the last becomes a part, ``c-0003``: every rendition's chunk file as written, stored (encoded
media does not deflate), and ``chunk.json`` with the chunk, the ladder, the source's decode
errors and what made it. The next attempt takes a kept chunk instead of encoding it again, when
it was made for the same chunk and ladder, from the same params by the same libraries, and every
file is what a chunk encode writes for its place; anything else is encoded again. The chunks are
then joined (:func:`hypermedia.engines.media.chunks.join`). A job that fans out (ADR 0081) asks
for children instead (:func:`ask_fan_out`); each child encodes one chunk and keeps it as a part
of its parent (:func:`encode_for_parent`), and the parent's next run takes them here as any kept
chunk. Call in the sandbox child only (it opens files an earlier attempt wrote with FFmpeg).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any, Final

from hypermedia.core.errors import PermanentJobError
from hypermedia.engines.contract import OutputFile, fan_out_request, keep_part, report_progress
from hypermedia.engines.media import rendition_parts
from hypermedia.engines.media.chunks import (
    Chunk,
    ChunkRefused,
    check_chunk,
    chunk_name,
    chunk_windows,
    encode_chunk,
    join,
)
from hypermedia.engines.media.decoding import MAX_ERROR_RATE
from hypermedia.engines.media.encoding import Encoded
from hypermedia.engines.media.passes import Plan, WindowUnreachable

__all__ = [
    "CHUNK_PART_FORMAT",
    "MAX_CHUNKS",
    "MIN_FAN_OUT",
    "ask_fan_out",
    "chunk_seconds",
    "encode_for_parent",
    "encode_in_chunks",
    "part_name",
]

MAX_CHUNKS: Final = 60
"""Most chunks of one video (:func:`chunk_seconds`): each is a checkpoint part, and a worker
keeps at most 64 parts an attempt (:data:`hypermedia.worker.checkpointing.MAX_PARTS`)."""
MIN_FAN_OUT: Final = 3
"""Fewest chunks a job fans out into: two children beside the parent's own last chunk
(:data:`hypermedia.worker.fanout.MIN_CHUNKS`)."""
CHUNK_PART_FORMAT: Final = 1
"""Version of a chunk part's layout; a part of another version is encoded again."""
RECORD: Final = "chunk.json"


def chunk_seconds(seconds: float, part_seconds: float) -> float:
    """The chunk length of a video of ``seconds``: ``part_seconds``, longer where the video would
    have more than :data:`MAX_CHUNKS` chunks."""
    return max(part_seconds, seconds / MAX_CHUNKS)


def encode_in_chunks(plan: Plan, planned: list[Chunk]) -> list[Encoded] | None:
    """The whole transcode in ``planned`` chunks, one after the other, then joined (module doc):
    a chunk an earlier attempt kept is taken (:func:`_restored`), any other encoded and
    kept unless it is the last. A taken chunk the join refuses is encoded again. The decode
    errors of all chunks are judged together, as one pass judges the whole file
    (:data:`~hypermedia.engines.media.decoding.MAX_ERROR_RATE`).

    Returns:
        The joined renditions, highest first; ``resumed`` when a chunk of them was taken.
        ``None`` when the file cannot be made in chunks after all — a chunk's seek landed far
        before it, or the join refuses a chunk this attempt encoded (a frame rate that drops at
        a chunk's start leaves decode times that do not follow; a frame whose timestamp jumps
        past its chunk's end): the caller then makes it without chunks, as one pass would.

    Raises:
        PermanentJobError: ``CORRUPT_INPUT`` when the chunks' decode errors together pass the
            bound or no frame decoded, and as :func:`encode_chunk` and :func:`join`.
    """
    scratch = Path(tempfile.mkdtemp(prefix="chunks-", dir=plan.out_dir.parent))
    try:
        work = replace(plan, out_dir=scratch)
        made = _made(plan)
        files: dict[str, list[Path]] = {r.name: [] for r in plan.ladder}
        errors: list[int] = []
        frames = 0
        taken: set[int] = set()
        for chunk in planned:
            share = 0.95 / len(planned)
            # The last chunk is never kept, so never taken: a part of it is none this job made,
            # and the join needs one chunk of this attempt's to measure the others by.
            last = chunk.index == len(planned) - 1
            kept = None if last else _restored(plan, work, planned, chunk, made)
            if kept is None:
                try:
                    encoded = encode_chunk(work, chunk, (chunk.index * share, share))
                except WindowUnreachable:
                    return None
                kept = (
                    {e.rendition.name: e.path for e in encoded},
                    encoded[0].decode_errors,
                    encoded[0].frames,
                )
                if not last and encoded[0].frames:
                    _keep(plan, chunk, kept[:2], made)
            else:
                taken.add(chunk.index)
            for name, path in kept[0].items():
                files[name].append(path)
            errors.append(kept[1])
            frames += kept[2]
            report_progress(plan.out_dir, (chunk.index + 1) * share)
        _judge(sum(errors), frames)
        while True:
            try:
                trusted = set(range(len(planned))) - taken
                joined = join(plan, planned, files, sum(errors), trusted)
                break
            except ChunkRefused as refused:
                if refused.index not in taken:
                    return None  # a chunk of this attempt: the file is made without chunks
                taken.discard(refused.index)
                chunk = planned[refused.index]
                try:
                    encoded = encode_chunk(work, chunk, (0.95, 0.0))
                except WindowUnreachable:
                    return None
                for e in encoded:
                    files[e.rendition.name][chunk.index] = e.path
                errors[chunk.index] = encoded[0].decode_errors
                # Kept again, so that a later attempt does not take the refused part.
                _keep(plan, chunk, ({e.rendition.name: e.path for e in encoded}, errors[chunk.index]), made)
        report_progress(plan.out_dir, 1.0)
        return [replace(e, resumed=bool(taken)) for e in joined]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def ask_fan_out(plan: Plan, planned: list[Chunk]) -> OutputFile:
    """A run's request to fan out ``planned`` (:func:`hypermedia.engines.contract.fan_out_request`,
    each chunk as :meth:`Chunk.as_json`)."""
    return fan_out_request(plan.out_dir, [chunk.as_json() for chunk in planned])


def encode_for_parent(plan: Plan, planned: list[Chunk], index: int) -> None:
    """A child job's run: chunk ``index`` of ``planned`` (the plan its parent made of the same file
    with the same limits) into every rendition, kept as the parent's part of it, as
    :func:`encode_in_chunks` keeps a chunk. Nothing is kept — the parent's next run encodes the
    chunk itself — for the last chunk, an index the plan does not have, a chunk whose seek lands
    far before it, or one without a frame.

    Raises:
        PermanentJobError: as :func:`encode_chunk`.
    """
    if not 0 <= index < len(planned) - 1:
        return
    chunk = planned[index]
    scratch = Path(tempfile.mkdtemp(prefix="chunk-", dir=plan.out_dir.parent))
    try:
        try:
            encoded = encode_chunk(replace(plan, out_dir=scratch), chunk, (0.0, 0.95))
        except WindowUnreachable:
            return
        if encoded[0].frames:
            files = {e.rendition.name: e.path for e in encoded}
            _keep(plan, chunk, (files, encoded[0].decode_errors), _made(plan))
        report_progress(plan.out_dir, 1.0)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _made(plan: Plan) -> dict[str, Any]:
    """What makes a chunk part (:func:`rendition_parts.made_by`, and this layout's version)."""
    return {**rendition_parts.made_by(plan.options), "format": f"chunk-{CHUNK_PART_FORMAT}"}


def _judge(errors: int, frames: int) -> None:
    """The bound one pass applies to its decode errors (:class:`~hypermedia.engines.media.decoding.DecodeErrors`),
    over every chunk's errors and frames together: a burst of damage in one chunk does not fail
    a file that one pass would take."""
    if frames == 0:
        raise PermanentJobError("No frame of the video can be decoded.", "CORRUPT_INPUT")
    if errors / (errors + frames) > MAX_ERROR_RATE:
        raise PermanentJobError(
            f"The video stream is damaged: {errors} of its packets do not decode, against {frames} "
            f"decoded frames (more than {MAX_ERROR_RATE:.3g} of the attempts failed).",
            "CORRUPT_INPUT",
        )


def part_name(chunk: Chunk) -> str:
    """The part of ``chunk``: ``c-0003`` (at most 12 characters)."""
    return f"c-{chunk.index:04d}"


def _keep(plan: Plan, chunk: Chunk, kept: tuple[dict[str, Path], int], made: dict[str, Any]) -> None:
    """Keeps a finished chunk as its part: every rendition's chunk file (stored) and
    ``chunk.json`` (best effort: :func:`hypermedia.engines.contract.keep_part`)."""
    record = {
        "made_by": made,
        "chunk": chunk.as_json(),
        "ladder": [[r.name, r.width, r.height] for r in plan.ladder],
        "decode_errors": kept[1],
    }
    keep_part(plan.out_dir, part_name(chunk), {RECORD: json.dumps(record).encode(), **kept[0]})


def _restored(
    plan: Plan, work: Plan, planned: list[Chunk], chunk: Chunk, made: dict[str, Any]
) -> tuple[dict[str, Path], int, int] | None:
    """The kept part of ``chunk``: its files moved into ``work.out_dir`` as :func:`encode_chunk`
    names them, its decode errors and its frames (the highest rendition's packets); ``None`` — nothing left — when there is none the job can
    take. Nothing of it is trusted (an earlier attempt's child wrote it, on the same hostile
    input): exactly the record and one file per rendition, the record naming this chunk, this
    ladder and ``made``, and each file passing :func:`check_chunk` for its place. Anything else,
    whatever it raises, is ``None``: the chunk is encoded again."""
    expected = {"chunk": chunk.as_json(), "ladder": [[r.name, r.width, r.height] for r in plan.ladder]}
    media = {r.name: rendition_parts.MAX_PART_BYTES for r in plan.ladder}
    try:
        with rendition_parts.opened_part(
            plan.out_dir, part_name(chunk), work.out_dir, RECORD, media, made, expected
        ) as opened:
            if opened is None:
                return None
            files, errors = opened
            windows, slack = chunk_windows(plan, planned)
            taken, frames = {}, []
            for rendition in plan.ladder:
                checked = check_chunk(
                    files[rendition.name], chunk.index, rendition, None, windows[chunk.index], slack
                )
                dest = work.out_dir / f"{chunk_name(chunk.index, rendition.name)}.mp4"
                os.replace(files[rendition.name], dest)
                taken[rendition.name] = dest
                frames.append(checked.frames)
            return taken, errors, frames[0]
    except Exception:  # best effort: a part that cannot be taken is encoded again
        return None
