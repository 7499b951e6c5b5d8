"""Where the platform's own CPU goes: py-spy on its services while a batch of 12-MP thumbnails runs.

    .venv/bin/python bench/profile_services.py --out DIR [--jobs 48] [--photos 24] [--rate 250]

A tool for issue 17, not part of ``make bench``. It needs ptrace on the platform's processes
(root, or ``kernel.yama.ptrace_scope`` 0) and ``py-spy`` from the ``dev`` group.

1. Makes ``--photos`` 4000×3000 JPEGs exactly as ``bench/thumbnail_throughput.py`` does.
2. Starts a private platform with ``bench/common.py`` (embedded Postgres + NATS + ``hypermedia up``
   with the services an image job touches: credits, storage, gateway, imageworker, reaper; sandbox
   uids from ``HM_SANDBOX_UID_BASE``, 550000 unless set), runs one warm-up job, uploads every photo (not
   profiled).
3. Starts ``py-spy record --format raw`` on the gateway, storage, credits and imageworker
   processes and on the imageworker's sandbox zygote (the child whose command line contains
   ``_zygote_main``), then submits ``--jobs`` thumbnail jobs (256 px WebP, the photos in turn, 4
   concurrent submitters), waits until all of them ended, and stops py-spy with SIGINT: the
   profiles cover the batch and nothing else.
4. Writes ``DIR/<process>.txt`` (collapsed stacks: ``frame;frame;...;frame count``, the root
   first, each frame ``function (/full/path/file.py:line)``), ``DIR/<process>.pyspy.log`` (py-spy's own output)
   and ``DIR/summary.txt``, a copy of what it prints: per process its CPU seconds during the batch
   (from psutil), its samples, and the top ``--top`` functions by own samples (the frame was on
   top of the stack) and by inclusive samples (the frame was anywhere in the stack, counted once
   per stack), each with its share of the process's samples, and the inclusive share per package.

py-spy records with ``--gil``: each sample is the stack of the thread holding the GIL, so a
process's samples / rate is roughly the CPU its Python code used. Without it (``--all-threads``)
py-spy's idle detection, on this kernel, keeps threads blocked in ``Condition.wait``,
``selector.select`` or a thread pool's queue as busy, and the waits drown the work. What runs
without the GIL is not in these profiles: gRPC's C-core threads, file and socket I/O, hashing of
large buffers, libvips in the job children; the psutil CPU seconds printed beside each process
include them. ``--report DIR`` prints the
summary of profiles already recorded, without running anything.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import common  # noqa: E402

SERVICES = "credits,storage,gateway,imageworker,reaper"
PROFILED = ("gateway", "storage", "credits", "imageworker")
SIZE = 256
UID_BASE = "550000"
# "func (file.py:123)" → "func (file.py)": one entry per function, whatever line was running.
_LINE = re.compile(r":\d+\)$")
# py-spy runs with --full-filenames; a path is shortened here to where its package starts.
_PREFIX = re.compile(r"\((?:[^()]*/site-packages/|[^()]*/lib/python3\.\d+/|" + re.escape(str(REPO)) + "/)")
# The frames under every sample (interpreter start, the event loop, thread start): left out of the
# inclusive lists, which would otherwise begin with a dozen rows at 100 %.
PLUMBING = re.compile(
    r"\(<frozen runpy>\)|\(asyncio/runners\.py\)|"
    r"^BaseEventLoop\.(run_forever|run_until_complete|_run_once) \(asyncio/base_events\.py\)|"
    r"^Handle\._run \(asyncio/events\.py\)|^Thread\.(_bootstrap|_bootstrap_inner|run) \(threading\.py\)|"
    r"^<module> \(services/\w+/__main__\.py\)|^run_service \(hypermedia/infra/service\.py\)|"
    r"^_worker \(concurrent/futures/thread\.py\)|^_zygote_main |^_Zygote\.serve |^<module> \(<string>\)"
)


@dataclass
class Profile:
    """One process's collapsed stacks, aggregated by function (``func (package/file.py)``)."""

    name: str
    samples: int = 0
    own: Counter[str] = field(default_factory=Counter)
    inclusive: Counter[str] = field(default_factory=Counter)
    own_packages: Counter[str] = field(default_factory=Counter)
    packages: Counter[str] = field(default_factory=Counter)


def function_of(frame: str) -> str:
    return _PREFIX.sub("(", _LINE.sub(")", frame.strip()))


def package_of(frame: str) -> str:
    """The top-level package of a frame ``func (path/to/file.py)``: ``grpc``, ``opentelemetry``,
    ``hypermedia``, ``asyncio``; a module of the standard library without a directory by its
    name (``json`` is a directory, ``threading`` a file)."""
    path = frame[frame.rfind("(") + 1 :].rstrip(")")
    return path.split("/")[0] if "/" in path else path.removesuffix(".py")


def parse_collapsed(name: str, lines: Iterable[str]) -> Profile:
    """Aggregates ``frame;frame;...;frame count`` lines (py-spy ``--format raw``)."""
    profile = Profile(name)
    for line in lines:
        line = line.rstrip("\n")
        if not line:
            continue
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [function_of(f) for f in stack.split(";") if f]
        if not frames:
            continue
        profile.samples += count
        profile.own[frames[-1]] += count
        profile.own_packages[package_of(frames[-1])] += count
        work = {f for f in frames if not PLUMBING.search(f)}
        for frame in work:
            profile.inclusive[frame] += count
        for package in {package_of(f) for f in work}:
            profile.packages[package] += count
    return profile


def report(profile: Profile, top: int, cpu_s: float | None, jobs: int | None, rate: int) -> str:
    """The summary of one process; with ``cpu_s`` and ``jobs`` each row also gets ≈ ms per job:
    its share of the samples × the process's CPU per job."""
    out = [f"== {profile.name}: {profile.samples} samples (≈ {profile.samples / rate:.2f} s holding the GIL)"]
    per_job_ms = cpu_s / jobs * 1000 if cpu_s is not None and jobs else None
    if cpu_s is not None:
        out[0] += f"; psutil CPU during the batch {cpu_s:.2f} s"
        out[0] += f", {per_job_ms:.1f} ms per job" if per_job_ms is not None else ""
    if not profile.samples:
        return out[0] + "\n   (no samples)"

    def row(count: int, label: str) -> str:
        share = count / profile.samples
        ms = f" {share * per_job_ms:5.2f} ms/job" if per_job_ms is not None else ""
        return f"     {share:6.1%} {count:6d}{ms}  {label}"

    for title, counter in (
        ("own", profile.own),
        ("inclusive (event loop and thread start left out)", profile.inclusive),
    ):
        out.append(f"   top {top} by {title} samples:")
        out.extend(row(count, frame) for frame, count in counter.most_common(top))
    for title, counter in (("own", profile.own_packages), ("inclusive", profile.packages)):
        listed = ", ".join(
            f"{p} {c / profile.samples:.0%}"
            for p, c in counter.most_common(14)
            if c / profile.samples >= 0.01
        )
        out.append(f"   {title} by package: {listed}")
    return "\n".join(out)


def processes(bp: common.BenchPlatform) -> dict[str, int]:
    """pid of each profiled service, of the imageworker unit's control process as
    ``unit-control`` and of the imageworker's zygote as ``zygote``."""
    import psutil

    found: dict[str, int] = {}
    # The imageworker runs as a worker unit: its control process (``-m hypermedia.worker.unit``)
    # starts the execution process (``-m services.imageworker``) that owns the zygote.
    for proc in psutil.Process(bp.platform.process.pid).children(recursive=True):
        cmd = proc.cmdline()
        module = cmd[cmd.index("-m") + 1] if "-m" in cmd else ""
        name = module.removeprefix("services.")
        if name in PROFILED and name not in found:
            found[name] = proc.pid
        elif module == "hypermedia.worker.unit" and "unit-control" not in found:
            found["unit-control"] = proc.pid
        elif "_zygote_main" in " ".join(cmd) and "zygote" not in found:
            found["zygote"] = proc.pid
    return found


@contextlib.contextmanager
def recording(
    pids: dict[str, int], out: Path, rate: int, nonblocking: bool, all_threads: bool
) -> Iterator[None]:
    """``py-spy record`` on every pid while the block runs; SIGINT makes py-spy write its file."""
    spy = Path(sys.executable).with_name("py-spy")
    running: list[tuple[str, subprocess.Popen[bytes]]] = []
    try:
        for name, pid in pids.items():
            cmd = [str(spy), "record", "--pid", str(pid), "--rate", str(rate), "--format", "raw"]
            cmd += ["--output", str(out / f"{name}.txt")] + (["--nonblocking"] if nonblocking else [])
            cmd += ["--full-filenames"] + ([] if all_threads else ["--gil"])
            log = (out / f"{name}.pyspy.log").open("wb")
            running.append((name, subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)))
        time.sleep(1.0)  # py-spy attaches and starts sampling
        for name, proc in running:
            if proc.poll() is not None:
                raise RuntimeError(f"py-spy on {name} exited: {(out / f'{name}.pyspy.log').read_text()}")
        yield
    finally:
        for _, proc in running:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGINT)
        for _, proc in running:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def run(
    out: Path, jobs: int, photos: int, rate: int, top: int, nonblocking: bool, all_threads: bool = False
) -> str:
    from bench.thumbnail_throughput import make_images

    out.mkdir(parents=True, exist_ok=True)
    root = common.temp_root("hm-bench-prof-")
    lines = [
        f"profile of {jobs} thumbnail jobs (12 MP JPEG → {SIZE} px WebP), {common.machine()}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    ]
    print(lines[0], flush=True)
    try:
        paths = make_images(root / "images", photos)
        env = {"HM_SANDBOX_UID_BASE": os.environ.get("HM_SANDBOX_UID_BASE", UID_BASE)}
        with common.running_platform(root / "platform", env=env, services=SERVICES) as bp:
            with bp.client() as client, ThreadPoolExecutor(4) as threads:
                warm = common.upload(client, paths[0])["object_id"]
                common.wait_all_terminal(bp.dsn, [common.submit_thumbnail(client, warm, SIZE)], timeout=120)
                objects = [common.upload(client, p)["object_id"] for p in paths]
                pids = processes(bp)
                print(f"  profiling {pids}", flush=True)
                wanted = [objects[i % len(objects)] for i in range(jobs)]
                noise = common.Background()
                with recording(pids, out, rate, nonblocking, all_threads):
                    noise.start()
                    cpu_before = common.cpu_snapshot(bp)
                    started = time.time()
                    job_ids = list(threads.map(lambda o: common.submit_thumbnail(client, o, SIZE), wanted))
                    common.wait_all_terminal(bp.dsn, job_ids, timeout=60 + 10 * jobs)
                    wall = time.time() - started
                    cpu = common.cpu_delta(cpu_before, common.cpu_snapshot(bp))
                    noise.stop()
                statuses = Counter(t["status"] for t in common.job_timings(bp.dsn, job_ids))
        lines.append(
            f"  batch: {wall:.2f} s wall ({jobs / wall:.2f} jobs/s), jobs {dict(statuses)}; other processes"
            f" used {noise.cores:.2f} cores meanwhile (py-spy, a child of this script, not counted)"
        )
        lines.append("  CPU seconds during the batch: " + ", ".join(f"{k} {v:.2f}" for k, v in cpu.items()))
        cpu_of = {**cpu, "zygote": cpu.get("sandbox zygote", 0.0)}
        print("\n".join(lines[1:]), flush=True)
        body = summarise(out, top, rate, jobs, cpu_of)
        text = "\n".join([*lines, body])
        print(body)
        (out / "summary.txt").write_text(text + "\n")
        return text
    finally:
        import shutil

        shutil.rmtree(root, ignore_errors=True)


def summarise(out: Path, top: int, rate: int, jobs: int | None, cpu: dict[str, float] | None = None) -> str:
    parts = []
    for name in (*PROFILED, "unit-control", "zygote"):
        path = out / f"{name}.txt"
        if path.exists():
            with path.open() as lines:
                profile = parse_collapsed(name, lines)
            parts.append(report(profile, top, (cpu or {}).get(name), jobs, rate))
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, help="directory for the profiles and summary.txt")
    parser.add_argument(
        "--jobs", type=int, default=48, help="thumbnail jobs in the profiled batch (default 48)"
    )
    parser.add_argument(
        "--photos", type=int, default=24, help="different 12-MP photos, used in turn (default 24)"
    )
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second (default 250)")
    parser.add_argument("--top", type=int, default=15, help="functions listed per process (default 15)")
    parser.add_argument("--nonblocking", action="store_true", help="py-spy without pausing the processes")
    parser.add_argument(
        "--all-threads",
        action="store_true",
        help="every thread py-spy thinks busy, not only the one holding the GIL (here it counts blocked waits)",
    )
    parser.add_argument("--report", type=Path, help="only summarise the profiles already in this directory")
    args = parser.parse_args(argv)
    if args.report:
        print(summarise(args.report, args.top, args.rate, None))
        return 0
    if args.out is None:
        parser.error("--out DIR is required")
    if os.geteuid() != 0:
        print("note: py-spy needs ptrace on the services (root, or ptrace_scope 0)", file=sys.stderr)
    run(args.out, args.jobs, args.photos, args.rate, args.top, args.nonblocking, args.all_threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
