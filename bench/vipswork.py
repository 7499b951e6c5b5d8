"""Everything the benchmarks do with libvips outside the platform: make the test images, and the
bare-pyvips baselines.

These functions run only in worker processes of a ``spawn`` process pool (see :func:`vips_pool`),
never in the benchmark's main process: a process that has run a libvips operation must not fork
(the child can deadlock in libvips' thread pool), and the main process starts the platform and the
sandbox zygote. ``spawn`` is fork + exec, so it is safe whatever the parent did. ``pyvips`` is
imported lazily so that ``VIPS_CONCURRENCY`` is set before libvips initialises.
"""

from __future__ import annotations

import multiprocessing
import os
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
CORPUS_PHOTO = REPO / "tests" / "data" / "exif-orientation" / "Landscape_1.jpg"


def vips_pool(workers: int, vips_concurrency: int | None) -> ProcessPoolExecutor:
    """A pool of ``workers`` fresh (spawned) processes, each warmed by one tiny libvips operation.

    ``vips_concurrency`` None means libvips' default (one thread per core); the platform's sandbox
    children run with 1.
    """
    return ProcessPoolExecutor(
        workers,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_init_worker,
        initargs=(vips_concurrency,),
    )


def _init_worker(vips_concurrency: int | None) -> None:
    import pyvips

    # Set explicitly: the spawned process re-imports the main module, which may import pyvips (and
    # so initialise libvips) before this runs, after which VIPS_CONCURRENCY is no longer read.
    pyvips.concurrency_set(vips_concurrency or os.cpu_count() or 1)
    pyvips.cache_set_max(0)  # as hypermedia.engines.imaging.sources does: no operation cache
    # Warm-up, so the timed loop does not pay libvips' first-operation costs (type system, thread
    # pool, webp encoder set-up); the platform's zygote is warm in the same sense (imports only).
    pyvips.Image.black(64, 64, bands=3).webpsave_buffer()


# --- image generation ------------------------------------------------------------------------------


def make_photos(out_dir: str, indexes: list[int], width: int = 4000, height: int = 3000) -> list[str]:
    """Writes ``photo-{i:03d}.jpg`` for each index: the corpus photo scaled up to ``width × height``
    with a per-image gain/offset per band, tiled Gaussian noise at a per-image offset (realistic
    entropy, so the JPEGs decode like camera photos, about 3 MB each) and every other one mirrored.
    No two files are identical. Returns the paths."""
    import pyvips

    src = pyvips.Image.new_from_file(str(CORPUS_PHOTO))
    base = src.resize(width / src.width, vscale=height / src.height).copy_memory()
    tile = pyvips.Image.gaussnoise(512, 512, sigma=5)
    tile = tile.bandjoin([pyvips.Image.gaussnoise(512, 512, sigma=5) for _ in range(2)]).copy_memory()
    across, down = -(-width // 512) + 1, -(-height // 512) + 1
    paths = []
    for i in indexes:
        noise = tile.replicate(across, down).crop((37 * i) % 512, (71 * i) % 512, width, height)
        gain = [0.85 + 0.01 * (i % 20), 1.0 - 0.005 * (i % 10), 0.9 + 0.008 * (i % 15)]
        offset = [float(i % 7), -float(i % 5), float(i % 11)]
        image = base.linear(gain, offset) + noise
        if i % 2:
            image = image.fliphor()
        path = Path(out_dir) / f"photo-{i:03d}.jpg"
        image.cast("uchar").jpegsave(str(path), Q=90)
        paths.append(str(path))
    return paths


def make_tiny_png(path: str, size: int = 64) -> str:
    """A ``size × size`` RGB PNG (a colour gradient) for the per-job overhead benchmark."""
    import pyvips

    x = pyvips.Image.xyz(size, size)
    r = x[0] * (255 / size)
    g = x[1] * (255 / size)
    b = (x[0] + x[1]) * (127 / size)
    r.bandjoin([g, b]).cast("uchar").pngsave(path)
    return path


# --- baselines ---------------------------------------------------------------------------------------


def bare_thumbnail(path: str, out_path: str, size: int) -> float:
    """The baseline operation: ``Image.thumbnail(path, size)`` → WebP file. Returns seconds."""
    import pyvips

    started = time.perf_counter()
    pyvips.Image.thumbnail(path, size).webpsave(out_path)
    return time.perf_counter() - started


def per_op_times(path: str, out_dir: str, size: int, repeats: int) -> dict[str, Any]:
    """Per-operation wall times (ms) in one warm process of the same small thumbnail two ways:
    ``bare`` (``Image.thumbnail`` → ``webpsave``) and ``pipeline`` (the platform's own
    ``hypermedia.engines.imaging.ops.run``: sniff, header check, thumbnail with sRGB output, save without
    metadata) — the work a sandbox child does, without the fork."""
    import sys

    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from hypermedia.engines.imaging.ops import ImageLimits, run

    limits = ImageLimits(max_pixels=100_000_000, max_input_bytes=50 * 1024 * 1024)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for _ in range(5):  # warm-up
        bare_thumbnail(path, str(out / "bare.webp"), size)
        run("thumbnail", {"size": size}, Path(path), out, limits)
    bare, pipeline = [], []
    for _ in range(repeats):
        bare.append(bare_thumbnail(path, str(out / "bare.webp"), size) * 1000)
        started = time.perf_counter()
        run("thumbnail", {"size": size}, Path(path), out, limits)
        pipeline.append((time.perf_counter() - started) * 1000)
    return {
        "bare_ms": statistics.median(bare),
        "pipeline_ms": statistics.median(pipeline),
        "bare_p99_ms": sorted(bare)[min(len(bare) - 1, int(len(bare) * 0.99))],
        "pipeline_p99_ms": sorted(pipeline)[min(len(pipeline) - 1, int(len(pipeline) * 0.99))],
    }


def pause(seconds: float) -> int:
    """Keeps a pool worker busy for a moment, so that submitting one per worker starts them all."""
    time.sleep(seconds)
    return os.getpid()


def concurrency() -> int:
    import pyvips

    return int(pyvips.concurrency_get())
