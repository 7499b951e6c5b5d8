"""The image part of the attack corpus (issue 4). Every hostile file is made here (no binary blobs)
and goes through the real pipeline (``hypermedia.engines.imaging.ops``, real libvips) in the real sandbox;
the important ones also go end to end through REST on a platform of this module's own.

For every case: a specific ``error_code`` or a clean output, the job ends within 30 s, the test
listener sees no connection, and neither the outputs nor the job's error carry ``/etc/passwd``
content or the listener's address. The sandbox here runs **without** its network namespace, so a
connection the library made would reach the listener: these cases prove the library's own
refusals; the platform below runs with the full isolation on top. Decisions the cases pin down:
truncated JPEG/PNG are ``CORRUPT_INPUT`` (no partial image); a GIF whose logical screen is huge
but whose frames are tiny decodes to its frames' size (libvips sizes the image by the frames, so
the screen allocates nothing); SVG references must stay inside the document
(:mod:`hypermedia.engines.imaging.svg`).
"""

from __future__ import annotations

import base64
import random
import secrets
import struct
import time
import zlib
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import pyvips

from hypermedia.engines.imaging import ops
from hypermedia.sandbox import Sandbox, SandboxLimits, SandboxResult
from tests.e2e.conftest import (
    RunningPlatform,
    isolated_platform,
    upload,
    wait_for,
    wait_job,
)
from tests.security.conftest import Listener

EXIF = Path(__file__).resolve().parents[1] / "data" / "exif-orientation"
# The default image profile: timeout 30 s (wall clock × 1.5), 2 GiB, 100 MP, 50 MiB.
SANDBOX_LIMITS = SandboxLimits(cpu_seconds=30, wall_seconds=45, memory_bytes=2 << 30, fsize_bytes=1 << 30)
IMAGE_LIMITS = ops.ImageLimits(max_pixels=100_000_000, max_input_bytes=50 << 20)
JOB_SECONDS = 30
PASSWD_LINE = Path("/etc/passwd").read_bytes().splitlines()[0]


# --- hostile files ------------------------------------------------------------------------------


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_header_bomb() -> bytes:
    """A PNG whose IHDR (valid CRC) claims 100000×100000 RGB; the IDAT holds 64 zero bytes."""
    ihdr = struct.pack(">IIBBBBB", 100_000, 100_000, 8, 2, 0, 0, 0)
    chunks = _png_chunk(b"IHDR", ihdr) + _png_chunk(b"IDAT", zlib.compress(b"\0" * 64))
    return b"\x89PNG\r\n\x1a\n" + chunks + _png_chunk(b"IEND", b"")


def png_256_megapixels() -> bytes:
    """A real, complete 16384×16384 black PNG (about 260 KB; 768 MB of RGB once decoded)."""
    return bytes(pyvips.Image.black(16384, 16384).pngsave_buffer(compression=6))


def gif(screen: tuple[int, int], frame: tuple[int, int], frames: int) -> bytes:
    """A GIF89a with a logical screen, ``frames`` image descriptors of size ``frame`` and a
    one-pixel LZW stream each (clear, index 0, end)."""
    out = bytearray(b"GIF89a" + struct.pack("<HHBBB", *screen, 0x80, 0, 0) + b"\0\0\0\xff\xff\xff")
    out += b"\x21\xff\x0bNETSCAPE2.0\x03\x01\x00\x00\x00"
    for _ in range(frames):
        out += b"\x21\xf9\x04\x04\x0a\x00\x00\x00"  # graphic control: delay 10
        out += b"\x2c" + struct.pack("<HHHHB", 0, 0, *frame, 0)
        out += b"\x02\x02\x44\x01\x00"
    return bytes(out + b"\x3b")


def jpeg_sof_bomb() -> bytes:
    """A baseline JPEG whose SOF0 claims 65000×65000 (one component), with tables and a stub scan."""
    sof = b"\xff\xc0" + struct.pack(">HBHHB", 11, 8, 65000, 65000, 1) + b"\x01\x11\x00"
    dqt = b"\xff\xdb\x00\x43\x00" + bytes([1] * 64)
    dht = b"".join(
        b"\xff\xc4\x00\x14" + bytes([table]) + bytes([1] + [0] * 15) + b"\x00" for table in (0, 16)
    )
    sos = b"\xff\xda\x00\x08\x01\x01\x00\x00\x3f\x00"
    return b"\xff\xd8" + dqt + sof + dht + sos + bytes(64) + b"\xff\xd9"


def tiff_pages(pages: int) -> bytes:
    frames = [pyvips.Image.black(2, 2).cast("uchar")] * pages
    image = pyvips.Image.arrayjoin(frames, across=1).copy()
    image.set_type(pyvips.GValue.gint_type, "page-height", 2)
    return bytes(image.tiffsave_buffer())


def photo(fmt: str) -> bytes:
    image = pyvips.Image.new_from_file(str(EXIF / "Landscape_1.jpg"))
    return bytes(image.jpegsave_buffer() if fmt == "jpeg" else image.pngsave_buffer())


def truncated(fmt: str) -> bytes:
    data = photo(fmt)
    return data[: len(data) // 2]


def garbage_after(signature: bytes) -> bytes:
    return signature + random.Random(4).randbytes(4096).replace(b"\xff", b"\x00")


def gps_jpeg() -> bytes:
    """The sample photo with GPS EXIF (latitude, longitude, altitude), an Artist, XMP and ICC."""
    image = pyvips.Image.new_from_file(str(EXIF / "Landscape_1.jpg")).icc_transform("srgb").copy()
    for field, value in {
        "exif-ifd3-GPSLatitudeRef": "N",
        "exif-ifd3-GPSLatitude": "51/1 30/1 1234/100",
        "exif-ifd3-GPSLongitudeRef": "W",
        "exif-ifd3-GPSLongitude": "0/1 7/1 3900/100",
        "exif-ifd3-GPSAltitude": "35/1",
        "exif-ifd0-Artist": "Jane Doe",
    }.items():
        image.set_type(pyvips.GValue.gstr_type, field, value)
    image.set_type(pyvips.GValue.blob_type, "xmp-data", b'<x:xmpmeta xmlns:x="adobe:ns:meta/"/>')
    data = bytes(image.jpegsave_buffer(keep="all"))
    assert "exif-ifd3-GPSLatitude" in pyvips.Image.new_from_buffer(data, "").get_fields()
    return data


SVG_NS = 'xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink"'


HEIC = EXIF.parent / "heic" / "landscape-6-p3.heic"


def heic_claiming(width: int, height: int) -> bytes:
    """The HEIC sample (600×400, HEVC) with its ``ispe`` box claiming ``width × height``."""
    data = bytearray(HEIC.read_bytes())
    ispe = data.index(b"ispe")
    data[ispe + 8 : ispe + 16] = struct.pack(">II", width, height)
    return bytes(data)


def heic_with_meta_size(size: int) -> bytes:
    data = bytearray(HEIC.read_bytes())
    meta = data.index(b"meta") - 4
    data[meta : meta + 4] = struct.pack(">I", size)
    return bytes(data)


def svg(body: str, prolog: str = "", size: str = 'width="40" height="30"') -> bytes:
    return f'<?xml version="1.0" encoding="UTF-8"?>{prolog}<svg {SVG_NS} {size}>{body}</svg>'.encode()


def svg_with_local_references() -> bytes:
    """Left half: a red rect through ``<use href="#r">``; right half: a blue data: PNG."""
    blue = pyvips.Image.black(8, 6).new_from_image([0, 0, 255]).cast("uchar").pngsave_buffer()
    uri = "data:image/png;base64," + base64.b64encode(blue).decode()
    return svg(
        '<defs><rect id="r" width="20" height="30" fill="red"/></defs><use xlink:href="#r"/>'
        f'<image x="20" width="20" height="30" href="{uri}" preserveAspectRatio="none"/>'
    )


@dataclass(frozen=True)
class Case:
    make: Callable[[Listener], bytes]
    error_code: str | None
    """The job's error, or None for a clean output."""
    operation: str = "thumbnail"
    params: dict[str, Any] | None = None


CASES: dict[str, Case] = {
    "png_header_100000x100000": Case(lambda _: png_header_bomb(), "INPUT_TOO_LARGE_PIXELS"),
    "png_real_256_megapixels": Case(lambda _: png_256_megapixels(), "INPUT_TOO_LARGE_PIXELS"),
    "gif_frame_65535x65535": Case(lambda _: gif((10, 10), (65535, 65535), 1), "INPUT_TOO_LARGE_PIXELS"),
    "gif_screen_65535x65535": Case(lambda _: gif((65535, 65535), (1, 1), 1), None),
    "gif_12000_frames": Case(lambda _: gif((100, 100), (1, 1), 12_000), "INPUT_TOO_MANY_PAGES"),
    "jpeg_sof_65000x65000": Case(lambda _: jpeg_sof_bomb(), "INPUT_TOO_LARGE_PIXELS"),
    "tiff_12000_pages": Case(lambda _: tiff_pages(12_000), "INPUT_TOO_MANY_PAGES"),
    "jpeg_truncated": Case(lambda _: truncated("jpeg"), "CORRUPT_INPUT"),
    "png_truncated": Case(lambda _: truncated("png"), "CORRUPT_INPUT", "convert", {"format": "webp"}),
    "png_signature_then_garbage": Case(lambda _: garbage_after(b"\x89PNG\r\n\x1a\n"), "CORRUPT_INPUT"),
    "jpeg_signature_then_garbage": Case(lambda _: garbage_after(b"\xff\xd8\xff\xe0"), "CORRUPT_INPUT"),
    "random_bytes": Case(lambda _: random.Random(5).randbytes(4096), "UNSUPPORTED_FORMAT"),
    "heic_ispe_65535x65535": Case(lambda _: heic_claiming(65535, 65535), "INPUT_TOO_LARGE_PIXELS"),
    "heic_truncated": Case(lambda _: HEIC.read_bytes()[:20000], "CORRUPT_INPUT"),
    "heic_meta_overruns_the_file": Case(lambda _: heic_with_meta_size(1 << 30), "CORRUPT_INPUT"),
    "heif_vvc_codec": Case(
        lambda _: (HEIC.parent / "relabelled-vvc.heic").read_bytes(), "UNSUPPORTED_FORMAT"
    ),
    "svg_xxe_file": Case(
        lambda _: svg("<text>&x;</text>", '<!DOCTYPE svg [<!ENTITY x SYSTEM "file:///etc/passwd">]>'),
        "SVG_FORBIDDEN",
        "convert",
        {"format": "png"},
    ),
    "svg_xxe_parameter_entity_to_listener": Case(
        lambda listener: svg("", f'<!DOCTYPE svg [<!ENTITY % p SYSTEM "{listener.url}"> %p;]>'),
        "SVG_FORBIDDEN",
    ),
    "svg_billion_laughs": Case(
        lambda _: svg(
            "<text>&e;</text>",
            "<!DOCTYPE svg ["
            + '<!ENTITY a "lol">'
            + "".join(f'<!ENTITY {chr(98 + i)} "{("&" + chr(97 + i) + ";") * 10}">' for i in range(4))
            + "]>",
        ),
        "SVG_FORBIDDEN",
    ),
    "svg_xinclude_passwd": Case(
        lambda _: svg(
            '<text y="20"><xi:include xmlns:xi="http://www.w3.org/2001/XInclude" '
            'href="file:///etc/passwd" parse="text"/></text>'
        ),
        "SVG_FORBIDDEN",
        "convert",
        {"format": "png"},
    ),
    "svg_image_href_listener": Case(
        lambda listener: svg(f'<image width="40" height="30" href="{listener.url}"/>'),
        "SVG_EXTERNAL_REFERENCE",
    ),
    "svg_image_xlink_href_file_passwd": Case(
        lambda _: svg('<image width="40" height="30" xlink:href="file:///etc/passwd"/>'),
        "SVG_EXTERNAL_REFERENCE",
    ),
    "svg_css_import_listener": Case(
        lambda listener: svg(f"<style>@import url({listener.url});</style>"), "SVG_EXTERNAL_REFERENCE"
    ),
    "svg_style_url_listener": Case(
        lambda listener: svg(f'<rect width="9" height="9" style="fill: url({listener.url}#g)"/>'),
        "SVG_EXTERNAL_REFERENCE",
    ),
    "svg_xml_stylesheet_listener": Case(
        lambda listener: svg("", f'<?xml-stylesheet type="text/css" href="{listener.url}"?>'),
        "SVG_EXTERNAL_REFERENCE",
    ),
    "svg_use_sibling_file": Case(lambda _: svg('<use href="source#x"/>'), "SVG_EXTERNAL_REFERENCE"),
    "svg_script": Case(lambda _: svg("<script>fetch('/')</script>"), "SVG_FORBIDDEN"),
    "svg_foreign_object": Case(
        lambda listener: svg(
            f'<foreignObject><iframe xmlns="http://www.w3.org/1999/xhtml" src="{listener.url}"/></foreignObject>'
        ),
        "SVG_FORBIDDEN",
    ),
    "svg_100000x100000": Case(
        lambda _: svg("", size='width="100000" height="100000"'), "INPUT_TOO_LARGE_PIXELS"
    ),
    "svg_embedded_png_bomb": Case(
        lambda _: svg(
            f'<image href="data:image/png;base64,{base64.b64encode(png_header_bomb()).decode()}"/>'
        ),
        "INPUT_TOO_LARGE_PIXELS",
    ),
    "svg_malformed": Case(lambda _: svg("<g><rect></g>"), "CORRUPT_INPUT"),
    "svg_local_references_render": Case(
        lambda _: svg_with_local_references(), None, "convert", {"format": "png"}
    ),
}

# The ones that also go end to end through REST.
E2E_CASES = [
    "png_header_100000x100000",
    "png_real_256_megapixels",
    "gif_frame_65535x65535",
    "jpeg_sof_65000x65000",
    "jpeg_truncated",
    "png_signature_then_garbage",
    "svg_xxe_file",
    "svg_xinclude_passwd",
    "svg_image_href_listener",
    "svg_image_xlink_href_file_passwd",
    "svg_100000x100000",
]


def assert_nothing_leaked(listener: Listener, *texts: bytes) -> None:
    assert listener.connections == []
    for text in texts:
        assert b"root:" not in text and PASSWD_LINE not in text
        assert listener.address.encode() not in text


def assert_local_references_rendered(image: pyvips.Image) -> None:
    assert (image.width, image.height) == (40, 30)
    assert image.getpoint(5, 15)[:3] == pytest.approx([255, 0, 0], abs=2)
    assert image.getpoint(30, 15)[:3] == pytest.approx([0, 0, 255], abs=2)


# --- in the sandbox --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
async def sandbox(tmp_root: Path) -> AsyncIterator[Sandbox]:
    work_dir = tmp_root / f"security-images-{secrets.token_hex(4)}"
    work_dir.mkdir(mode=0o755)
    box = Sandbox(work_dir, isolate_network=False)  # see the module docstring
    await box.start()
    yield box
    await box.close()


async def run_in_sandbox(
    box: Sandbox, content: bytes, operation: str, params: dict[str, Any] | None
) -> tuple[SandboxResult, list[bytes]]:
    """Runs one image operation on ``content`` in a fresh job of the sandbox; returns the result
    and the bytes of the outputs. The job directory is gone afterwards."""
    job = f"hostile-{secrets.token_hex(6)}"
    source = box.prepare(job) / "input" / "source"
    source.write_bytes(content)
    source.chmod(0o600)
    try:
        result = await box.run(
            job,
            "hypermedia.engines.imaging.ops:run",
            operation,
            params or {},
            source,
            SANDBOX_LIMITS,
            entry_kwargs={"limits": IMAGE_LIMITS},
        )
        outputs = [(box.job_dir(job) / "output" / output.filename).read_bytes() for output in result.outputs]
    finally:
        box.cleanup(job)
    assert not box.job_dir(job).exists()
    return result, outputs


@pytest.mark.parametrize("name", CASES)
async def test_hostile_image_in_the_sandbox(sandbox: Sandbox, listener: Listener, name: str) -> None:
    case = CASES[name]
    content = case.make(listener)
    started = time.monotonic()
    result, outputs = await run_in_sandbox(sandbox, content, case.operation, case.params)
    elapsed = time.monotonic() - started

    assert result.error_code == case.error_code, result
    assert elapsed < JOB_SECONDS
    assert not result.retryable
    assert_nothing_leaked(listener, str(result.error_message).encode(), *outputs)
    if case.error_code is not None:
        assert outputs == []
        # Refused from the header: no pixel buffer was ever allocated (a decode of the 256 MP
        # PNG alone would take 768 MB).
        assert result.peak_memory_mb < 200, result
    else:
        (output,) = outputs
        image = pyvips.Image.new_from_buffer(output, "")
        if name == "svg_local_references_render":
            assert_local_references_rendered(image)
        else:
            assert image.width * image.height <= 64


async def test_gps_jpeg_outputs_carry_no_metadata_in_any_format(sandbox: Sandbox, listener: Listener) -> None:
    content = gps_jpeg()
    for operation, params in [
        ("thumbnail", {"size": 128}),
        ("resize", {"width": 300}),
        ("compress", {"quality": 60}),
        *[("convert", {"format": fmt}) for fmt in ("jpeg", "png", "webp", "avif")],
    ]:
        result, (output,) = await run_in_sandbox(sandbox, content, operation, params)
        assert result.error_code is None, result
        assert_no_metadata(output, (operation, params))
    assert listener.connections == []


def assert_no_metadata(data: bytes, label: object) -> None:
    image = pyvips.Image.new_from_buffer(data, "")
    leaked = [f for f in image.get_fields() if f.startswith(("exif", "xmp", "iptc", "icc", "png-comment"))]
    assert leaked == [] and image.get_typeof("orientation") == 0, (label, leaked)
    markers = (b"Exif", b"GPS", b"ICC_PROFILE", b"iCCP", b"tEXt", b"zTXt", b"iTXt", b"eXIf", b"EXIF", b"ICCP")
    assert [m for m in markers if m in data] == [], label
    assert b"Jane Doe" not in data and b"xmpmeta" not in data, label


# --- end to end through REST --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hostile_platform(tmp_root: Path, database_url: str, nats_url: str) -> Iterator[RunningPlatform]:
    """A platform of this module's own, on its own database (no other platform's reaper shares
    its jobs)."""
    with isolated_platform(
        tmp_root, database_url, nats_url, "hostile", "credits,storage,gateway,imageworker"
    ) as running:
        yield running


@pytest.fixture(scope="module")
def client(hostile_platform: RunningPlatform) -> Iterator[httpx.Client]:
    account = hostile_platform.admin("create-account", "--credits", "1000")
    with hostile_platform.client(account) as c:
        yield c


def upload_bytes(client: httpx.Client, content: bytes, name: str) -> dict[str, Any]:
    response = client.post("/v1/objects", files={"file": (name, content)})
    assert response.status_code == 201, response.text
    return dict(response.json())


def process(
    client: httpx.Client, object_id: str, operations: list[Any]
) -> list[tuple[dict[str, Any], float]]:
    """Asks for the operations and waits for each job; returns each job with the seconds from the
    request to its end."""
    started = time.monotonic()
    created = client.post("/v1/hypermedia/process", json={"object_id": object_id, "operations": operations})
    assert created.status_code == 202, created.text
    return [
        (wait_job(client, job_id, timeout=JOB_SECONDS), time.monotonic() - started)
        for job_id in created.json()["job_ids"]
    ]


def operation(case: Case) -> dict[str, Any]:
    return {"name": case.operation, "params": case.params or {}}


@pytest.mark.parametrize("name", E2E_CASES)
def test_hostile_image_end_to_end(
    hostile_platform: RunningPlatform, client: httpx.Client, listener: Listener, name: str
) -> None:
    case = CASES[name]
    obj = upload_bytes(client, case.make(listener), name)
    [(job, seconds)] = process(client, obj["object_id"], [operation(case)])
    assert (job["status"], job["error_code"]) == ("failed", case.error_code), job
    assert job["attempt_count"] == 1 and job["outputs"] == []
    assert seconds < JOB_SECONDS
    assert_nothing_leaked(listener, httpx.Response(200, json=job).content)
    # The worker removes the job dir right after recording the outcome the client just saw.
    job_dir = hostile_platform.state_dir / "work" / "jobs" / job["job_id"]
    wait_for("job dir removed", lambda: not job_dir.exists(), 5)


def test_svg_with_local_references_end_to_end(client: httpx.Client, listener: Listener) -> None:
    obj = upload_bytes(client, svg_with_local_references(), "drawing.svg")
    assert obj["mime_type"] == "image/svg+xml"
    [(job, seconds)] = process(client, obj["object_id"], [operation(CASES["svg_local_references_render"])])
    assert job["status"] == "completed", job
    assert seconds < JOB_SECONDS
    [output] = job["outputs"]
    data = httpx.get(output["url"], timeout=30).content
    assert_local_references_rendered(pyvips.Image.new_from_buffer(data, ""))
    assert output["metadata"]["source_format"] == "svg"
    assert_nothing_leaked(listener, data)


def test_gps_jpeg_end_to_end_outputs_carry_no_metadata(client: httpx.Client) -> None:
    obj = upload_bytes(client, gps_jpeg(), "holiday.jpg")
    formats = ("jpeg", "png", "webp", "avif")
    operations = ["thumbnail", *({"name": "convert", "params": {"format": fmt}} for fmt in formats)]
    for job, seconds in process(client, obj["object_id"], operations):
        assert job["status"] == "completed", job
        assert seconds < JOB_SECONDS
        [output] = job["outputs"]
        assert_no_metadata(httpx.get(output["url"], timeout=30).content, output["mime_type"])


def test_worker_completes_a_normal_job_after_the_hostile_files(client: httpx.Client) -> None:
    obj = upload(client, EXIF / "Landscape_6.jpg")
    [(job, _)] = process(client, obj["object_id"], ["thumbnail"])
    assert job["status"] == "completed" and job["attempt_count"] == 1, job
    image = pyvips.Image.new_from_buffer(httpx.get(job["outputs"][0]["url"], timeout=30).content, "")
    assert (image.width, image.height) == (256, 171)
