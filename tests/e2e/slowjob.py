"""A slow job that is real work: ``compress`` of a large, smooth PNG.

A 5000×5000 RGB image of three Perlin-noise bands compresses badly, so ``pngsave(palette=True)``
at compression 9 (what ``compress`` does with a PNG) spends 10–15 s of CPU in libvips and
libimagequant: long enough to cancel a job or stop its worker while it runs, with no test hook in
the product.
"""

from __future__ import annotations

from pathlib import Path

import pyvips

SIZE = 5000
"""Width and height; 25 Mpx, well under the profiles' ``max_pixels`` (100 Mpx)."""


def make_slow_png(path: Path, size: int = SIZE) -> Path:
    """Write the PNG to ``path`` (about 15–20 MB; well under ``max_input_bytes``) and return it."""
    bands = [pyvips.Image.perlin(size, size, cell_size=400, uchar=True, seed=seed) for seed in (1, 2, 3)]
    bands[0].bandjoin(bands[1:]).pngsave(str(path), compression=9)
    return path
