"""What every picture taken from a video shares: the pixel bound of one decoded frame, one decoding
thread, and the upright display size from the coded size, the sample aspect ratio and the
orientation (poster, sprite and transcode use these)."""

from __future__ import annotations

from fractions import Fraction
from typing import Final

from av.video.stream import VideoStream

from hypermedia.core.errors import PermanentJobError
from hypermedia.engines.media.orientation import Orientation

MAX_PIXELS: Final = 64_000_000
"""Largest frame converted to RGB (``INPUT_TOO_LARGE_PIXELS``): 192 MB as 8-bit RGB."""


def check_pixels(width: int, height: int) -> None:
    """Raises PermanentJobError ``INPUT_TOO_LARGE_PIXELS`` for a frame over :data:`MAX_PIXELS`;
    called before a frame is converted (the sprite sheet calls it too)."""
    if width * height > MAX_PIXELS:
        raise PermanentJobError(
            f"The picture is {width}×{height} pixels; at most {MAX_PIXELS} pixels are accepted.",
            "INPUT_TOO_LARGE_PIXELS",
        )


def one_thread(stream: VideoStream) -> None:
    """Decodes ``stream`` with one thread: no frame threads, no slice threads."""
    context = stream.codec_context
    context.thread_count = 1
    context.thread_type = "NONE"  # type: ignore[assignment]  # PyAV takes the flag's name


def display_size(
    width: int, height: int, sar: Fraction | None, orientation: Orientation
) -> tuple[float, float]:
    """The display size of a ``width`` × ``height`` frame, upright: the sample aspect ratio
    stretches the coded width (at least 1 pixel), and a quarter turn (the orientation's
    transposition) swaps the two."""
    ratio = float(sar) if sar else 1.0
    display_width, display_height = max(1.0, width * ratio), float(height)
    if orientation.transpose:
        return display_height, display_width
    return display_width, display_height
