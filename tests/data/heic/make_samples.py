"""Makes the HEIC samples of this directory with pillow-heif's encoder (libheif 1.23, x265 4.3).

Run from the repository root: ``.venv/bin/python tests/data/heic/make_samples.py``. x265 is
deterministic at a fixed preset, so a rerun gives the same pixels (not necessarily the same bytes
across x265 versions).
"""

from __future__ import annotations

from pathlib import Path

import pillow_heif
import pyvips
from PIL import Image

HERE = Path(__file__).resolve().parent
EXIF = HERE.parent / "exif-orientation"


def display_p3(path: Path, scale: float) -> tuple[Image.Image, bytes]:
    """The stored (not yet oriented) pixels of ``path``, scaled, converted from sRGB to Display P3
    with libvips' built-in P3 profile; returns them and that profile."""
    stored = pyvips.Image.new_from_file(str(path)).resize(scale)  # no autorot: the stored pixels
    p3 = stored.icc_transform("p3", input_profile="srgb")
    pixels = Image.frombytes("RGB", (p3.width, p3.height), p3.write_to_memory())
    return pixels, p3.get("icc-profile-data")


def oriented_p3(n: int) -> None:
    """Landscape_N as an iPhone writes a photo: the EXIF orientation N kept, and the same
    orientation as ``irot``/``imir`` boxes (pillow-heif turns the EXIF orientation into them),
    with a Display P3 ICC profile."""
    source = EXIF / f"Landscape_{n}.jpg"
    pixels, icc = display_p3(source, 1 / 3)
    exif = Image.open(source).getexif()
    assert exif[0x0112] == n
    pillow_heif.from_pillow(pixels).save(
        HERE / f"landscape-{n}-p3.heic", quality=50, exif=exif.tobytes(), icc_profile=icc
    )


def primary_second() -> None:
    """Two top-level images: a flat green 320×240 first, the upright photo (sRGB, no profile)
    second and primary."""
    photo = pyvips.Image.new_from_file(str(EXIF / "Landscape_1.jpg")).resize(0.25)
    photo_pil = Image.frombytes("RGB", (photo.width, photo.height), photo.write_to_memory())
    green = Image.new("RGB", (320, 240), (0, 200, 0))
    heif = pillow_heif.from_pillow(green)
    heif.add_from_pillow(photo_pil)
    heif.save(HERE / "primary-second.heic", quality=50, primary_index=1)


def relabelled_vvc() -> None:
    """landscape-6-p3.heic with its coded item's type ``hvc1`` and configuration ``hvcC`` renamed
    ``vvc1``/``vvcC`` (H.266/VVC, ISO/IEC 23008-12 Annex L): what a VVC-coded HEIF's boxes say,
    for a codec neither libvips' libheif nor pillow-heif's decodes. Only the two four-character
    codes change; the (HEVC) payload is never reached."""
    data = (HERE / "landscape-6-p3.heic").read_bytes()
    meta_end = data.index(b"mdat")
    head = data[:meta_end].replace(b"hvc1", b"vvc1").replace(b"hvcC", b"vvcC")
    (HERE / "relabelled-vvc.heic").write_bytes(head + data[meta_end:])


if __name__ == "__main__":
    oriented_p3(6)
    oriented_p3(7)
    primary_second()
    relabelled_vvc()
