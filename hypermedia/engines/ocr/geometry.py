"""Affine maps between a prepared OCR page and its source page: the quarter turns and the deskew
rotation of :mod:`hypermedia.engines.ocr.preprocess`, as :class:`Transform`, and the upscale step's
fitting of a page to the limits (pure Python)."""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Transform", "deskew_transform", "fitted_size", "rotation_transform"]


@dataclass(frozen=True)
class Transform:
    """An affine map of the plane, ``(x, y) → (a·x + b·y + c, d·x + e·y + f)``."""

    a: float = 1.0
    b: float = 0.0
    c: float = 0.0
    d: float = 0.0
    e: float = 1.0
    f: float = 0.0

    def then(self, other: Transform) -> Transform:
        """``other ∘ self``: first this map, then ``other``."""
        return Transform(
            other.a * self.a + other.b * self.d,
            other.a * self.b + other.b * self.e,
            other.a * self.c + other.b * self.f + other.c,
            other.d * self.a + other.e * self.d,
            other.d * self.b + other.e * self.e,
            other.d * self.c + other.e * self.f + other.f,
        )

    def apply(self, x: float, y: float) -> tuple[float, float]:
        return self.a * x + self.b * y + self.c, self.d * x + self.e * y + self.f

    def as_list(self) -> list[float]:
        """``[a, b, c, d, e, f]``, rounded to 6 decimals."""
        return [round(v, 6) + 0.0 for v in (self.a, self.b, self.c, self.d, self.e, self.f)]


def rotation_transform(rotate: int, width: int, height: int) -> Transform:
    """Maps a point of the page turned ``rotate`` degrees clockwise (``rot("d90")`` …) back to
    the page before (continuous coordinates)."""
    if rotate == 90:  # (x, y) → (H − y, x); back: (x', y') → (y', H − x')
        return Transform(0, 1, 0, -1, 0, height)
    if rotate == 180:
        return Transform(-1, 0, width, 0, -1, height)
    if rotate == 270:  # (x, y) → (y, W − x); back: (x', y') → (W − y', x')
        return Transform(0, -1, width, 1, 0, 0)
    return Transform()


def deskew_transform(angle: float, width: int, height: int) -> Transform:
    """Maps a point of ``image.rotate(angle)`` back to ``image`` (``width`` × ``height``).

    libvips' ``rotate`` is ``similarity`` with the matrix ``[[cos, −sin], [sin, cos]]`` (clockwise
    in image coordinates, y down) and an output area that is the bounding box of the turned page:
    ``out = R·p − min(R·corners)``; back: ``p = R⁻¹·(out + min)``."""
    radians = math.radians(angle)
    cos, sin = math.cos(radians), math.sin(radians)
    corners = [(0.0, 0.0), (width, 0.0), (0.0, height), (width, height)]
    min_x = min(cos * x - sin * y for x, y in corners)
    min_y = min(sin * x + cos * y for x, y in corners)
    # R⁻¹ = [[cos, sin], [−sin, cos]]
    return Transform(cos, sin, cos * min_x + sin * min_y, -sin, cos, -sin * min_x + cos * min_y)


def fitted_size(
    width: int, height: int, scale_x: float, scale_y: float, max_pixels: int, max_side: int
) -> tuple[int, int]:
    """The size, in whole pixels, nearest to ``width`` × ``height`` scaled by ``scale_x`` ×
    ``scale_y`` (both at least 1) that is within ``max_pixels`` and ``max_side``: the side
    scaled the more gives way first, neither below the page's own size (a page within the limits
    always has a size that fits: its own)."""
    new_width, new_height = min(round(width * scale_x), max_side), min(round(height * scale_y), max_side)
    for _ in range(2):
        if new_width * new_height <= max_pixels:
            break
        if new_width / width >= new_height / height and new_width > width:
            new_width = max(width, max_pixels // new_height)
        else:
            new_height = max(height, max_pixels // new_width)
    return new_width, new_height
