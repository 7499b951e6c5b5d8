"""Image fixtures and helpers the imaging tests share."""

from __future__ import annotations

from pathlib import Path

import pyvips

from hypermedia.engines.imaging import ops

EXIF = Path(__file__).resolve().parents[1] / "data" / "exif-orientation"
LIMITS = ops.ImageLimits(max_pixels=50_000_000, max_input_bytes=50 * 1024 * 1024)


def run_one(operation: str, params: dict, input_path: Path, out_dir: Path) -> tuple[ops.OutputFile, Path]:
    """``operation`` run once on ``input_path`` under :data:`LIMITS`: its one output and that file's path
    in ``out_dir``."""
    (output,) = ops.run(operation, params, input_path, out_dir, LIMITS)
    assert "/" not in output.filename
    return output, out_dir / output.filename


def load(path: Path) -> pyvips.Image:
    """The image at ``path``, opened by libvips."""
    return pyvips.Image.new_from_file(str(path))


def small_gray(image: pyvips.Image) -> pyvips.Image:
    """48×32 grayscale, for comparing orientation and content."""
    gray = image.flatten(background=[255, 255, 255]) if image.hasalpha() else image
    gray = gray.colourspace("b-w")
    return gray.resize(48 / gray.width, vscale=32 / gray.height)


def mean_abs_diff(a: pyvips.Image, b: pyvips.Image) -> float:
    """Mean absolute grey difference (0–255) of ``a`` and ``b`` at :func:`small_gray` size."""
    return float((small_gray(a) - small_gray(b)).abs().avg())
