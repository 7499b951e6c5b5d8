"""A transcode's renditions kept beyond the attempt (issue 23 item 1, ADR 0079): a long
``transcode_video`` (:attr:`~hypermedia.engines.media.sources.MediaLimits.part_seconds`) encodes
its ladder one rendition at a time (:func:`hypermedia.engines.media.transcode.run`), and each
finished rendition but the last becomes a part, ``r-720p``: the file as written, stored (encoded
media does not deflate), and ``rendition.json`` with what describing it needs (frames, the
encoder's parameter sets, sound, decode errors) and what made it (:func:`made_by`). The next
attempt takes a kept rendition (:func:`restored`) instead of encoding it again, when it was made
from the same params by the same libraries and opens as that rendition; anything else is encoded
again. Call in the sandbox child only (it opens files an earlier attempt wrote with FFmpeg).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Final

import av
import av.error

from hypermedia.engines.contract import keep_part, resumed_files
from hypermedia.engines.media.encoding import Encoded, Rendition

__all__ = ["MAX_PART_BYTES", "PART_FORMAT", "keep", "made_by", "part_name", "restored"]

PART_FORMAT: Final = 1
"""Version of a rendition part's layout; a part of another version is encoded again."""
MAX_PART_BYTES: Final = 10 * 1024**3
"""Largest rendition part, in bytes: the sandbox's ``RLIMIT_FSIZE`` (10 GiB), beyond which the
child cannot write the rendition at all. The mediaworker keeps and restores parts up to it,
streamed (:mod:`hypermedia.worker.checkpointing`)."""
MAX_RECORD_BYTES: Final = 64 * 1024
"""Largest ``rendition.json`` read back (a few hundred bytes written)."""
MEDIA: Final = "media"
RECORD: Final = "rendition.json"
_OPEN_OPTIONS: Final = {
    "protocol_whitelist": "file",
    "format_whitelist": "mov,mp4,m4a,3gp,3g2,mj2,matroska,webm",
}
"""A kept rendition is read as the MP4 or WebM the transcode writes, and as nothing else."""


def part_name(rendition: Rendition) -> str:
    """The part of ``rendition``: ``r-720p`` (at most 12 characters: rungs have at most 5 digits)."""
    return f"r-{rendition.name}"


def made_by(options: dict[str, Any]) -> dict[str, Any]:
    """What a kept rendition must have been made with to be taken: the part format, the job's
    normalised params and the versions of PyAV and of the FFmpeg libraries it encodes with (a
    deploy between two attempts encodes again). The encoder threads are not in it: a rendition
    encoded at another thread count is as valid (its bytes differ, its frames do not)."""
    made = {
        "format": PART_FORMAT,
        "params": options,
        "pyav": av.__version__,
        "libraries": {name: list(version) for name, version in sorted(av.library_versions.items())},
    }
    return json.loads(json.dumps(made))  # as a kept record reads back: tuples become lists


def keep(out_dir: Path, encoded: Encoded, made: dict[str, Any]) -> None:
    """Keeps the finished rendition ``encoded`` as its part (best effort:
    :func:`hypermedia.engines.contract.keep_part`)."""
    rendition = encoded.rendition
    record = {
        "made_by": made,
        "rendition": [rendition.name, rendition.width, rendition.height],
        "frames": encoded.frames,
        "extradata": encoded.extradata.hex(),
        "has_audio": encoded.has_audio,
        "decode_errors": encoded.decode_errors,
    }
    keep_part(out_dir, part_name(rendition), {RECORD: json.dumps(record).encode(), MEDIA: encoded.path})


def restored(out_dir: Path, rendition: Rendition, made: dict[str, Any], dest: Path) -> Encoded | None:
    """The kept part of ``rendition`` moved to ``dest`` (its file name in ``out_dir``), or
    ``None`` — nothing written — when there is none the job can take: none kept, damaged, made
    with another ``made``, of another rendition, or a file that does not open as a video of the
    rendition's size."""
    unpacked = Path(tempfile.mkdtemp(prefix="restored-", dir=Path(out_dir).parent))
    try:
        files = resumed_files(out_dir, part_name(rendition), unpacked, MAX_PART_BYTES)
        if files is None or set(files) != {MEDIA, RECORD} or files[RECORD].stat().st_size > MAX_RECORD_BYTES:
            return None
        record = json.loads(files[RECORD].read_bytes())
        if (
            not isinstance(record, dict)
            or record.get("made_by") != made
            or record.get("rendition") != [rendition.name, rendition.width, rendition.height]
            or not _opens_as(files[MEDIA], rendition)
        ):
            return None
        kept = Encoded(
            rendition,
            dest,
            int(record["frames"]),
            bytes.fromhex(record["extradata"]),
            bool(record["has_audio"]),
            int(record["decode_errors"]),
            resumed=True,
        )
        os.replace(files[MEDIA], dest)
        return kept
    except (OSError, ValueError, KeyError, TypeError):
        return None
    finally:
        shutil.rmtree(unpacked, ignore_errors=True)


def _opens_as(path: Path, rendition: Rendition) -> bool:
    """Whether ``path`` opens as a video of the rendition's size."""
    try:
        with av.open(str(path), options=_OPEN_OPTIONS) as container:
            video = container.streams.video[0]
            return (video.codec_context.width, video.codec_context.height) == (
                rendition.width,
                rendition.height,
            )
    except (av.error.FFmpegError, IndexError, OSError):
        return False
