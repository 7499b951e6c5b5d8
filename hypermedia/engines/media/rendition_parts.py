"""A transcode's renditions kept beyond the attempt (issue 23 item 1, ADR 0079): a long
``transcode_video`` (:attr:`~hypermedia.engines.media.sources.MediaLimits.part_seconds`) encodes
its ladder one rendition at a time (:func:`hypermedia.engines.media.transcode.run`), and each
finished rendition but the last becomes a part, ``r-720p``: the file as written, stored (encoded
media does not deflate), and ``rendition.json`` with the source's decode errors and what made it
(:func:`made_by`). The next attempt takes a kept rendition (:func:`restored`) instead of encoding
it again, when it was made from the same params by the same libraries and is what the transcode
writes for that rendition; anything else is encoded again. Call in the sandbox child only (it
opens files an earlier attempt wrote with FFmpeg).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

import av

from hypermedia.engines.contract import keep_part, resumed_files
from hypermedia.engines.media.encoding import Encoded, Rendition

__all__ = [
    "MAX_PART_BYTES",
    "OPEN_OPTIONS",
    "PART_FORMAT",
    "keep",
    "made_by",
    "opened_part",
    "part_name",
    "restored",
]

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
OPEN_OPTIONS: Final = {
    "protocol_whitelist": "file",
    "format_whitelist": "mov,mp4,m4a,3gp,3g2,mj2,matroska,webm",
}
"""A kept rendition is read as the MP4 or WebM the transcode writes, and as nothing else."""
MAX_DECODE_ERRORS: Final = 1 << 31
"""Most decode errors a kept record may state (a count of the source's packets)."""
_EXPECTED: Final = {
    "h264": ("mov,mp4,m4a,3gp,3g2,mj2", {"h264"}, "aac"),
    "vp9": ("matroska,webm", {"vp9", "libvpx-vp9"}, "opus"),
    "av1": ("mov,mp4,m4a,3gp,3g2,mj2", {"av1", "libdav1d", "libaom-av1"}, "aac"),
}
"""Per ``codec`` param: the demuxer a kept rendition opens with, its video decoders' names and
its audio decoder's (what :data:`~hypermedia.engines.media.encoding.CODECS` writes)."""


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
        "decode_errors": encoded.decode_errors,
    }
    keep_part(out_dir, part_name(rendition), {RECORD: json.dumps(record).encode(), MEDIA: encoded.path})


def restored(
    out_dir: Path, rendition: Rendition, codec: str, made: dict[str, Any], dest: Path
) -> Encoded | None:
    """The kept part of ``rendition`` (encoded with the ``codec`` param) moved to ``dest`` (its
    file name in ``out_dir``), or ``None`` — nothing written — when there is none the job can
    take. The part was written by an earlier attempt's child, on the same hostile input, so
    nothing of it is trusted: it must hold exactly the record and the media (the record at most
    :data:`MAX_RECORD_BYTES`), the record must name ``rendition`` and ``made``, and the media
    must be what the transcode writes (:func:`_described`); what describing it needs (frames,
    parameter sets, sound) is read from the media, not from the record. Anything else, whatever
    it raises, is ``None``: the rendition is encoded again."""
    try:
        expected = {"rendition": [rendition.name, rendition.width, rendition.height]}
        with opened_part(
            out_dir,
            part_name(rendition),
            Path(out_dir).parent,
            RECORD,
            {MEDIA: MAX_PART_BYTES},
            made,
            expected,
        ) as opened:
            if opened is None:
                return None
            files, errors = opened
            described = _described(files[MEDIA], rendition, codec)
            if described is None:
                return None
            frames, extradata, has_audio = described
            os.replace(files[MEDIA], dest)
            return Encoded(rendition, dest, frames, extradata, has_audio, errors, resumed=True)
    except Exception:  # best effort: a part that cannot be taken is encoded again
        return None


@contextmanager
def opened_part(
    out_dir: Path,
    part: str,
    scratch: Path,
    record: str,
    media: dict[str, int],
    made: dict[str, Any],
    expected: dict[str, Any],
) -> Iterator[tuple[dict[str, Path], int] | None]:
    """An earlier attempt's kept ``part`` unpacked into a directory of its own under ``scratch``
    (removed on exit): yields its files (name → path) and the decode errors its record states,
    or ``None`` when the part is not one to take. It must hold exactly the ``record`` member (at
    most :data:`MAX_RECORD_BYTES`) and the ``media`` members (name → most bytes), and the record
    must be a JSON object whose ``made_by`` is ``made``, whose other keys equal ``expected``'s and
    whose ``decode_errors`` is an integer from 0 to :data:`MAX_DECODE_ERRORS`. Nothing else of
    the part is checked here; what the caller reads of it may raise."""
    unpacked = Path(tempfile.mkdtemp(prefix="restored-", dir=scratch))
    try:
        files = resumed_files(out_dir, part, unpacked, {record: MAX_RECORD_BYTES} | media)
        if files is None:
            yield None
            return
        kept = json.loads(files[record].read_bytes())
        errors = kept.get("decode_errors") if isinstance(kept, dict) else None
        if (
            not isinstance(kept, dict)
            or kept.get("made_by") != made
            or any(kept.get(key) != value for key, value in expected.items())
            or type(errors) is not int
            or not 0 <= errors <= MAX_DECODE_ERRORS
        ):
            yield None
            return
        yield files, errors
    finally:
        shutil.rmtree(unpacked, ignore_errors=True)


def _described(path: Path, rendition: Rendition, codec: str) -> tuple[int, bytes, bool] | None:
    """``(frames, the video's parameter sets, has sound)`` of a kept rendition when it is what
    the transcode writes for ``codec`` (:data:`~hypermedia.engines.media.encoding.CODECS`): its
    container, one video stream of that codec at the rendition's size with at least one packet,
    at most one audio stream of that codec, nothing else. Frames are its video packets, counted
    without decoding. ``None`` otherwise."""
    container_name, video_codecs, audio_codec = _EXPECTED[codec]
    with av.open(str(path), options=OPEN_OPTIONS) as container:
        video, audio = container.streams.video, container.streams.audio
        if (
            container.format.name != container_name
            or len(video) != 1
            or len(audio) > 1
            or len(container.streams) != len(video) + len(audio)
            or video[0].codec_context.name not in video_codecs
            or (video[0].codec_context.width, video[0].codec_context.height)
            != (rendition.width, rendition.height)
            or (audio and audio[0].codec_context.name != audio_codec)
        ):
            return None
        extradata = bytes(video[0].codec_context.extradata or b"")
        frames = sum(1 for packet in container.demux(video[0]) if packet.size)
    return (frames, extradata, bool(audio)) if frames else None
