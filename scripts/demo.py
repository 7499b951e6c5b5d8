"""`make demo`: start the platform on embedded defaults, process the sample photos, a PDF, an
OpenDocument text, three scanned pages (OCR) and a phone-style video clip (probe, poster with a
sprite sheet, waveform, an H.264 ladder packaged as HLS, loudness-normalised AAC) through REST the
way an app would, download the results into ./demo-output/, and shut everything down.

The clip is made here with PyAV (no video is in the corpus): 4 s of a moving test pattern,
640 × 360 stored with a −90° display matrix (a phone held upright) and a 440 Hz tone.

Nothing here talks to a service directly: it runs `hypermedia up`, `hypermedia admin
create-account`, and then only the public REST API.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from hypermedia.devtools.embedded import free_port

REPO = Path(__file__).resolve().parents[1]
PHOTOS = REPO / "tests" / "data" / "exif-orientation"
DOCUMENTS: list[tuple[Path, list[Any]]] = [
    (
        REPO / "tests" / "data" / "pdf" / "pdflatex-4-pages.pdf",
        [{"name": "pdf_preview", "params": {"pages": "1-4", "width": 400}}, "text_extract"],
    ),
    (REPO / "tests" / "data" / "office" / "libre-office-writer.odt", ["office_to_pdf", "text_extract"]),
]
OCR_PAGES: list[tuple[Path, list[Any]]] = [
    (
        REPO / "tests" / "data" / "ocr" / "phototest.tif",
        [{"name": "ocr", "params": {"outputs": ["text", "words", "searchable_pdf"]}}],
    ),
    (
        REPO / "tests" / "data" / "ocr" / "phototest-rotated-R.png",
        [{"name": "ocr", "params": {"outputs": ["text"]}}],
    ),
    (
        REPO / "tests" / "data" / "ocr" / "eurotext.tif",
        [
            {
                "name": "ocr",
                "params": {"languages": ["spa", "por", "deu", "fra", "ita", "eng"], "outputs": ["text"]},
            }
        ],
    ),
]
MEDIA_OPERATIONS: list[Any] = [
    "probe",
    {"name": "poster", "params": {"width": 240, "sprite": {"count": 8, "columns": 4, "width": 120}}},
    {"name": "waveform", "params": {"buckets_per_second": 50}},
    {"name": "transcode_video", "params": {"heights": [360, 240], "hls": True, "hls_segment_seconds": 2}},
    {"name": "transcode_audio", "params": {"format": "aac", "loudness": True}},
]
OUT = REPO / "demo-output"
STATE = REPO / ".hypermedia" / "demo"


def _port(preferred: int) -> int:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", preferred))
            return preferred
        except OSError:
            return free_port()


def _wait_ready(rest: str, up: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if up.poll() is not None:
            sys.exit(f"hypermedia up exited early; its log:\n{log.read_text()[-4000:]}")
        try:
            if httpx.get(f"{rest}/readyz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    sys.exit("the platform did not become ready within 180 s")


def _demo_clip(path: Path) -> Path:
    """4 s of H.264 (640 × 360 stored, −90° display matrix: 360 × 640 upright) with AAC stereo."""
    import av
    import numpy as np

    fps, width, height, rate = 25, 640, 360, 48000
    with av.open(str(path), "w") as container:
        video = container.add_stream("libx264", rate=fps, options={"preset": "veryfast"})
        video.width, video.height, video.pix_fmt = width, height, "yuv420p"
        video.set_display_rotation(-90)
        sound = container.add_stream("aac", rate=rate, layout="stereo")
        for i in range(4 * fps):
            image = np.zeros((height, width, 3), np.uint8)
            image[: height // 2] = (40, 90, 230)
            image[:, (i * 6) % width : (i * 6) % width + 40] = (240, 200, 40)
            frame = av.VideoFrame.from_ndarray(image, format="rgb24")
            frame.pts = i
            container.mux(video.encode(frame))
        container.mux(video.encode(None))
        for start in range(0, 4 * rate, 1024):
            t = np.arange(start, min(start + 1024, 4 * rate)) / rate
            tone = (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
            samples = av.AudioFrame.from_ndarray(np.stack([tone, tone]), format="fltp", layout="stereo")
            samples.sample_rate, samples.pts = rate, start
            container.mux(sound.encode(samples))
        container.mux(sound.encode(None))
    return path


def _wait_jobs(client: httpx.Client, job_ids: list[str]) -> list[dict[str, Any]]:
    done: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + 180
    while len(done) < len(job_ids) and time.monotonic() < deadline:
        for job_id in job_ids:
            if job_id not in done:
                job = client.get(f"/v1/jobs/{job_id}").json()
                if job["status"] in ("completed", "failed", "cancelled"):
                    done[job_id] = job
        time.sleep(0.1)
    return [done.get(j) or client.get(f"/v1/jobs/{j}").json() for j in job_ids]


_EXTENSIONS = {
    "image/jpeg": "jpg",
    "image/png": "png",
    "image/webp": "webp",
    "image/avif": "avif",
    "application/pdf": "pdf",
    "application/json": "json",
    "text/plain": "txt",
    "text/html": "hocr",
    "text/csv": "csv",
    "text/vtt": "vtt",
    "video/mp4": "mp4",
    "audio/mp4": "m4a",
    "application/vnd.apple.mpegurl": "m3u8",
}


def _describe(meta: dict[str, Any]) -> str:
    """What an output is in a few characters: pixel size, pages, or characters of text."""
    if "width" in meta:
        return f"{meta['width']}×{meta['height']}"
    if "chars" in meta:
        return f"{meta['chars']} chars"
    if "page_count" in meta:
        return f"{meta['page_count']} page(s)"
    if meta.get("duration_seconds") is not None:
        return f"{meta['duration_seconds']:.2f} s"
    return ""


def main() -> int:
    shutil.rmtree(STATE, ignore_errors=True)
    shutil.rmtree(OUT, ignore_errors=True)
    STATE.mkdir(parents=True)
    OUT.mkdir()
    http_port, grpc_port = _port(8080), _port(50051)
    env = {
        **os.environ,
        "HM_STATE_DIR": str(STATE),
        "HM_GATEWAY_HTTP_PORT": str(http_port),
        "HM_GATEWAY_GRPC_PORT": str(grpc_port),
    }
    for var in ("HM_DATABASE_URL", "HM_NATS_URL"):
        env.pop(var, None)  # the demo always runs on embedded defaults
    log = STATE / "up.log"
    hypermedia = [sys.executable, "-m", "hypermedia.devtools.cli"]
    print(f"starting the platform (embedded Postgres and NATS, local object store in {STATE}) ...")
    with log.open("ab") as log_file:
        up = subprocess.Popen(
            [*hypermedia, "up"], env=env, cwd=REPO, stdout=log_file, stderr=subprocess.STDOUT
        )
    rest = f"http://127.0.0.1:{http_port}"
    try:
        _wait_ready(rest, up, log)
        print(f"platform ready: REST {rest}, gRPC 127.0.0.1:{grpc_port}, logs in {STATE / 'logs'}")
        account = json.loads(
            subprocess.run(
                [*hypermedia, "admin", "create-account", "--credits", "100", "--name", "demo"],
                env=env,
                cwd=REPO,
                capture_output=True,
                check=True,
            ).stdout
        )
        print(f"account {account['account_id']} with {account['credits']} credits")
        rows = []
        with httpx.Client(
            base_url=rest, headers={"Authorization": f"Bearer {account['api_key']}"}, timeout=60
        ) as c:
            requests = []
            inputs: list[tuple[Path, list[Any]]] = []
            for photo in sorted(PHOTOS.glob("Landscape_*.jpg")):
                ops: list[Any] = ["thumbnail"]
                if photo.name == "Landscape_6.jpg":
                    ops += [
                        {"name": "resize", "params": {"width": 640, "height": 640, "fit": "cover"}},
                        {"name": "compress", "params": {"quality": 40}},
                        {"name": "convert", "params": {"format": "avif"}},
                    ]
                inputs.append((photo, ops))
            documents = DOCUMENTS
            if shutil.which("soffice") is None:
                print(
                    "LibreOffice is not installed (run make demo as root to install it): no office document"
                )
                documents = [(path, ops) for path, ops in DOCUMENTS if path.suffix == ".pdf"]
            scans = OCR_PAGES
            if shutil.which("tesseract") is None:
                print("tesseract is not installed (run make demo as root to install it): no OCR")
                scans = []
            clip = _demo_clip(STATE / "phone-clip.mp4")
            for path, ops in [*inputs, *documents, *scans, (clip, MEDIA_OPERATIONS)]:
                obj = c.post("/v1/objects", files={"file": (path.name, path.read_bytes())}).json()
                created = c.post(
                    "/v1/hypermedia/process", json={"object_id": obj["object_id"], "operations": ops}
                )
                created.raise_for_status()
                requests.append((path.name, created.json()["job_ids"]))
            for name, job_ids in requests:
                for job in _wait_jobs(c, job_ids):
                    for output in job["outputs"]:
                        ext = _EXTENSIONS.get(output["mime_type"].split(";")[0], "bin")
                        kind = "" if output["output_type"] == ext else f".{output['output_type']}"
                        target = OUT / f"{Path(name).stem}{kind}.{ext}"
                        target.write_bytes(httpx.get(output["url"], timeout=60).content)
                        rows.append(
                            (
                                name,
                                job["operation"],
                                job["status"],
                                _describe(output["metadata"]),
                                output["size_bytes"],
                                target.relative_to(REPO),
                            )
                        )
                    if not job["outputs"]:
                        rows.append((name, job["operation"], job["status"], job["error_code"] or "", 0, ""))
                    if job["operation"] == "transcode_video" and job["status"] == "completed":
                        # The playlists name their sibling outputs; the gateway resolves them into
                        # URLs (variant playlists signed, usable by a player without the API key).
                        master = c.get(f"/v1/jobs/{job['job_id']}/outputs/hls_master/resolved")
                        master.raise_for_status()
                        hls = OUT / f"{Path(name).stem}.hls_master.resolved.m3u8"
                        hls.write_text(master.text)
            bad = c.post("/v1/objects", files={"file": ("notes.jpg", b"this is not a photo")}).json()
            refused = c.post(
                "/v1/hypermedia/process", json={"object_id": bad["object_id"], "operations": ["thumbnail"]}
            )
            balance = c.get("/v1/credits").json()
        print()
        print(f"{'input':24} {'operation':15} {'status':10} {'what':>14} {'bytes':>8}  result")
        for name, op, status, dims, size, path in rows:
            print(f"{name:24} {op:15} {status:10} {dims:>14} {size:>8}  {path}")
        print()
        print(
            f"a text file named notes.jpg: HTTP {refused.status_code} {refused.json()['error_code']}"
            f" — {refused.json()['detail']}"
        )
        print(f"credits: balance {balance['balance']}, held {balance['held']}")
        print(f"\nresults are in {OUT}/")
        failed = [r for r in rows if r[2] != "completed"]
        return 1 if failed else 0
    finally:
        print("stopping the platform ...")
        up.send_signal(signal.SIGINT)
        try:
            up.wait(90)
        except subprocess.TimeoutExpired:
            up.kill()
        print(f"stopped (exit code {up.returncode})")


if __name__ == "__main__":
    sys.exit(main())
