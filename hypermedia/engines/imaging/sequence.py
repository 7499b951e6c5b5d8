"""Frames of an image sequence in an ISO-BMFF (HEIF/AVIF) file, counted from its boxes.

An animated AVIF (brand ``avis``) or HEIF sequence (``msf1``) keeps its frames as samples of a
track (``moov/trak``, handler ``pict``; ISO/IEC 23008-12 §7), beside the primary still image
(``meta/pitm``) that libvips' ``heifload`` reads. libvips' ``n-pages`` counts the still images
only (1 for such a file), so the frames are counted here: the ``sample_count`` of the ``stsz``
(or compact ``stz2``) box of the first ``pict`` track (ISO/IEC 14496-12 §8.7.3). Pure Python,
reading box headers only; fork-safe.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, Final

__all__ = ["track_frames"]

_MAX_BOXES: Final = 4096
"""Most boxes visited in one file (a sequence has a few dozen on the way to its sample table)."""


def _boxes(f: BinaryIO, start: int, end: int, budget: list[int]) -> Iterator[tuple[bytes, int, int]]:
    """``(type, payload start, payload end)`` of the boxes between ``start`` and ``end``."""
    offset = start
    while offset + 8 <= end and budget[0] > 0:
        budget[0] -= 1
        f.seek(offset)
        header = f.read(16)
        if len(header) < 8:
            return
        size, kind = struct.unpack(">I4s", header[:8])
        payload = offset + 8
        if size == 1:  # 64-bit largesize follows the type
            if len(header) < 16:
                return
            (size,) = struct.unpack(">Q", header[8:16])
            payload = offset + 16
        elif size == 0:  # to the end of the enclosing box
            size = end - offset
        if size < payload - offset or offset + size > end:
            return
        yield kind, payload, offset + size
        offset += size


def _handler(f: BinaryIO, mdia: tuple[int, int], budget: list[int]) -> bytes | None:
    for kind, start, end in _boxes(f, *mdia, budget):
        if kind == b"hdlr" and end - start >= 12:
            f.seek(start + 8)  # version and flags, pre_defined
            return f.read(4)
    return None


def _sample_count(f: BinaryIO, trak: tuple[int, int], budget: list[int]) -> int | None:
    """Samples of ``trak`` when it is a ``pict`` track, else ``None``."""
    for kind, start, end in _boxes(f, *trak, budget):
        if kind != b"mdia":
            continue
        if _handler(f, (start, end), budget) != b"pict":
            return None
        stack = [(start, end)]
        while stack:
            for inner, inner_start, inner_end in _boxes(f, *stack.pop(), budget):
                if inner in (b"minf", b"stbl"):
                    stack.append((inner_start, inner_end))
                elif inner in (b"stsz", b"stz2") and inner_end - inner_start >= 12:
                    f.seek(inner_start + 8)  # version and flags; sample_size or reserved and field_size
                    return int(struct.unpack(">I", f.read(4))[0])
    return None


def track_frames(path: Path) -> int | None:
    """Frames of the first image sequence track (``pict`` handler) of an ISO-BMFF file.

    Returns:
        The track's sample count; ``None`` when the file has no such track (a still image) or its
        boxes cannot be followed (the decoder then judges the file).
    """
    budget = [_MAX_BOXES]
    with path.open("rb") as f:
        f.seek(0, 2)
        size = f.tell()
        for kind, start, end in _boxes(f, 0, size, budget):
            if kind != b"moov":
                continue
            for inner, inner_start, inner_end in _boxes(f, start, end, budget):
                if inner == b"trak":
                    frames = _sample_count(f, (inner_start, inner_end), budget)
                    if frames is not None:
                        return frames
            return None
    return None
