"""How a video frame is put upright: its display matrix read, and applied as FFmpeg's command
line applies it (issue 15, item 8).

A video's display matrix (MP4/MOV ``tkhd``, Matroska's projection, H.264/HEVC display orientation
SEI: FFmpeg's decoders copy it onto every frame as ``AV_FRAME_DATA_DISPLAYMATRIX``) says how the
coded picture is transformed for display: turned by quarter turns, and *mirrored* when its
determinant is negative (a front camera's clip, stored as the sensor saw it). :class:`Orientation`
is what :func:`frame_orientation` reads of it: the rotation ``ffprobe`` reports and the pixel
operations that put the picture upright, chosen by the rule of FFmpeg's ``autorotate``
(``fftools/ffmpeg_filter.c``, ``configure_input_video_filter``; ``ffplay.c`` has the same):

* ``theta = -round(av_display_rotation_get(m))`` in ``[0, 360)`` (``cmdutils.c``
  ``get_rotation``), and ``m[0]``, ``m[3]``, ``m[4]`` of the matrix (16.16 fixed point, in the
  order ``a b u / c d v / x y w``);
* ``theta`` 90: ``transpose=cclock_flip`` when ``m[3] > 0`` (mirrored), else ``transpose=clock``;
* ``theta`` 180: ``hflip`` when ``m[0] < 0``, then ``vflip`` when ``m[4] < 0`` (both: a half
  turn; one: mirrored);
* ``theta`` 270: ``transpose=clock_flip`` when ``m[3] < 0`` (mirrored), else ``transpose=cclock``;
* ``theta`` 0: ``vflip`` when ``m[4] < 0`` (mirrored);
* any other angle: FFmpeg's ``rotate`` filter by ``theta``; not done here (the picture stays as
  coded and :attr:`Orientation.applied` is false).

The four ``transpose`` directions are a transposition (rows become columns) followed by
``hflip``, ``vflip``, both or neither, so every case is the three steps of :class:`Orientation`
in that order. Posters and sprite thumbnails apply them to RGB arrays (:meth:`Orientation.upright`),
transcodes as FFmpeg filters (:meth:`Orientation.filters`).
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

__all__ = ["UPRIGHT", "Orientation", "frame_orientation", "matrix_orientation", "matrix_rotation"]


@dataclass(frozen=True)
class Orientation:
    """A display matrix as the pixel operations that put a picture upright: transpose, then
    ``hflip``, then ``vflip`` (each only when true), and what ``ffprobe`` reports of it."""

    rotation: int = 0
    """Degrees counter-clockwise the matrix turns the picture, as ``ffprobe`` reports them
    (``av_display_rotation_get``, rounded; −90 for a phone's portrait video, 180 not −180).
    A mirrored matrix is read as the picture flipped top to bottom, then turned by this."""
    mirrored: bool = False
    """The matrix mirrors the picture (its determinant is negative)."""
    transpose: bool = False
    """Rows become columns (the display's width is the coded height)."""
    hflip: bool = False
    """Then left and right are swapped."""
    vflip: bool = False
    """Then top and bottom are swapped."""

    @property
    def applied(self) -> bool:
        """Whether the picture is changed at all (false without a matrix, for the identity and
        for an angle that is not a quarter turn)."""
        return self.transpose or self.hflip or self.vflip

    def upright(self, pixels: np.ndarray) -> np.ndarray:
        """``pixels`` (height × width × bands) put upright: a view, not a copy."""
        if self.transpose:
            pixels = np.swapaxes(pixels, 0, 1)
        if self.hflip:
            pixels = pixels[:, ::-1]
        if self.vflip:
            pixels = pixels[::-1]
        return pixels

    def filters(self) -> list[tuple[str, str | None]]:
        """The FFmpeg filters (name, arguments) that put a frame upright, as ``autorotate``
        inserts them: one ``transpose`` for a quarter turn, else ``hflip`` and/or ``vflip``."""
        if self.transpose:
            direction = {
                (False, False): "cclock_flip",
                (True, False): "clock",
                (False, True): "cclock",
                (True, True): "clock_flip",
            }[(self.hflip, self.vflip)]
            return [("transpose", direction)]
        return [(name, None) for name, on in (("hflip", self.hflip), ("vflip", self.vflip)) if on]


UPRIGHT: Final = Orientation()
"""No display matrix: nothing to do."""


def frame_orientation(frame: Any) -> Orientation:
    """The orientation of a decoded frame's display matrix (:data:`UPRIGHT` without one).
    ``frame`` is typed ``Any``: PyAV's stubs give ``VideoFrame.side_data`` the iteration of a
    mapping's keys."""
    for side_data in frame.side_data:
        if side_data.type.name == "DISPLAYMATRIX":
            return matrix_orientation(bytes(side_data))
    return UPRIGHT


def matrix_orientation(data: bytes) -> Orientation:
    """The orientation of a display matrix: 9 32-bit integers in native byte order, as FFmpeg
    stores ``AV_FRAME_DATA_DISPLAYMATRIX`` (module doc). A matrix too short or without a scale
    (a zero column) is :data:`UPRIGHT`."""
    if len(data) < 36:
        return UPRIGHT
    m = struct.unpack("=9i", data[:36])
    rotation = matrix_rotation(m)
    if rotation is None:
        return UPRIGHT
    mirrored = m[0] * m[4] - m[1] * m[3] < 0
    theta = (-rotation) % 360
    if theta == 90:
        return Orientation(rotation, mirrored, transpose=True, hflip=m[3] <= 0)
    if theta == 270:
        return Orientation(rotation, mirrored, transpose=True, hflip=m[3] < 0, vflip=True)
    if theta == 180:
        return Orientation(rotation, mirrored, hflip=m[0] < 0, vflip=m[4] < 0)
    if theta == 0:
        return Orientation(rotation, mirrored, vflip=m[4] < 0)
    return Orientation(rotation, mirrored)


def matrix_rotation(m: tuple[int, ...]) -> int | None:
    """``av_display_rotation_get`` (libavutil/display.c) of a matrix's 9 integers, rounded to
    whole degrees, 180 for −180; None when a column has no scale (FFmpeg's NaN). PyAV's
    ``VideoFrame.rotation`` truncates the same value, so −89.99… would be −89."""
    scale0 = math.hypot(m[0], m[3])
    scale1 = math.hypot(m[1], m[4])
    if scale0 == 0 or scale1 == 0:
        return None
    degrees = -math.degrees(math.atan2(m[1] / scale1, m[0] / scale0))
    rounded = int(math.copysign(math.floor(abs(degrees) + 0.5), degrees))  # C's round(): half away from 0
    return 180 if rounded == -180 else rounded
