"""What a long transcode pays for its checkpoints (issue 23, ADRs 0079 and 0080): a ladder
encoded in chunks (every rendition of a chunk from one decode, each chunk but the last kept as a
part, then joined by copying packets) and one rendition at a time (a pass over the input each,
each rendition but the last kept), against the same ladder in one pass (every rendition fed
from each decoded frame), on the same input, in the same run.

    .venv/bin/python bench/transcode_parts.py [--runs 2] [--seconds 20] [--threads 2]

The input is bench/media.py's (``make_video``: 1080p25 H.264 with grain and AAC sound; nothing
is downloaded). Each run is :func:`hypermedia.engines.media.transcode.run` with ``{"heights":
[1080, 720, 480]}`` in a fresh process (``part_seconds`` None for one pass, 0 for the others: a
chunk at each of the input's keyframes, every 10 s; by rendition, the same packets remuxed into
MPEG-TS, which is not cut into chunks), the order turned every round; the decode alone (``--threads`` frame threads, nothing encoded) is
timed too, since a pass per rendition adds one decode per extra rendition. Printed: wall and CPU
seconds of each run (the job's process and its threads), the ratios to one pass (medians), and
the frames of every rendition, which must be the same every way. No goal: the issue asks for
checkpoints, and this is their price.
"""

from __future__ import annotations

import argparse
import multiprocessing
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.media import make_video

HEIGHTS = [1080, 720, 480]


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _transcode(source: str, out_dir: str, threads: int, part_seconds: float | None) -> dict[str, Any]:
    """One job in this (fresh) process: wall and CPU seconds of the call, frames per rendition."""
    from hypermedia.engines.media.sources import MediaLimits
    from hypermedia.engines.media.transcode import run

    limits = MediaLimits(max_input_bytes=1 << 34, threads=threads, part_seconds=part_seconds)
    (Path(out_dir) / "output").mkdir(parents=True)
    cpu, started = _cpu(), time.perf_counter()
    outputs = run(
        "transcode_video", {"heights": HEIGHTS}, Path(source), Path(out_dir) / "output", limits=limits
    )
    return {
        "wall": time.perf_counter() - started,
        "cpu": _cpu() - cpu,
        "frames": {o.output_type: o.metadata["frame_count"] for o in outputs},
        "parts": sorted(p.name for p in (Path(out_dir) / "checkpoints").glob("*.zip")),
    }


def _decode(source: str, threads: int) -> dict[str, float]:
    """The input decoded once (video only, frame threads), nothing encoded."""
    import av

    cpu, started = _cpu(), time.perf_counter()
    with av.open(source) as container:
        stream = container.streams.video[0]
        stream.codec_context.thread_count = threads
        stream.codec_context.thread_type = "FRAME"  # type: ignore[assignment]
        frames = sum(1 for _ in container.decode(stream))
    return {"wall": time.perf_counter() - started, "cpu": _cpu() - cpu, "frames": frames}


def _fresh(fn: Any, *args: Any) -> Any:
    """``fn(*args)`` in a process of its own (spawned: nothing of this one's libraries warm)."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="hm-parts-") as root:
        source = Path(root) / "input.mp4"
        make_video(source, args.seconds)
        transport = Path(root) / "input.ts"
        subprocess.run(
            ["ffmpeg", "-v", "error", "-i", str(source), "-c", "copy", "-f", "mpegts", str(transport)],
            check=True,
        )
        _fresh(_decode, str(source), args.threads)  # warm the page cache and the libraries
        variants = [("one pass", source, None), ("in chunks", source, 0.0), ("by rendition", transport, 0.0)]
        runs: dict[str, list[dict[str, Any]]] = {label: [] for label, _, _ in variants}
        decodes = []
        for n in range(args.runs):
            for label, path, part_seconds in variants if n % 2 == 0 else variants[::-1]:
                out_dir = Path(root) / f"{label.replace(' ', '-')}-{n}"
                result = _fresh(_transcode, str(path), str(out_dir), args.threads, part_seconds)
                runs[label].append(result)
                print(
                    f"  {label:12s} run {n + 1}: wall {result['wall']:6.2f} s, CPU {result['cpu']:6.2f} s, parts {result['parts']}"
                )
            decodes.append(_fresh(_decode, str(source), args.threads))
    one = runs["one pass"]
    decode_cpu = statistics.median(d["cpu"] for d in decodes)
    same_frames = all(r["frames"] == one[0]["frames"] for label in runs for r in runs[label])
    print(
        f"ladder {HEIGHTS} of {args.seconds:g} s of 1080p25 H.264, {args.threads} threads, {len(one)} runs each:"
    )
    for label in ("in chunks", "by rendition"):
        wall = statistics.median(r["wall"] for r in runs[label]) / statistics.median(o["wall"] for o in one)
        cpu = statistics.median(r["cpu"] for r in runs[label]) / statistics.median(o["cpu"] for o in one)
        print(f"  {label} / one pass: wall {wall:.2f}x, CPU {cpu:.2f}x (medians)")
    print(
        f"  one decode of the input: {decode_cpu:.2f} s of CPU, "
        f"{decode_cpu / statistics.median(o['cpu'] for o in one):.1%} of the one-pass job's"
    )
    print(
        f"  frames per rendition {one[0]['frames']}: {'the same' if same_frames else 'DIFFERENT'} every way"
    )
    print("  no goal (ADRs 0079 and 0080: what checkpoints cost a long transcode)")
    return 0 if same_frames else 1


if __name__ == "__main__":
    raise SystemExit(main())
