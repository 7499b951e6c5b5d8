"""HEVC-coded HEIF (iPhone photos) through hypermedia.engines.imaging.ops and the OCR engine, on the real
samples in ``tests/data/heic/`` (see its ``SOURCE.md``) and on files pillow-heif's x265 encoder
makes here; every output decoded by Pillow (not libvips) and checked by its pixels.

Issue 15, item 1: the libvips of ``pyvips-binary`` has no HEVC decoder, and an iPhone photo failed
``CORRUPT_INPUT``."""

from __future__ import annotations

import io
import struct
from pathlib import Path

import pillow_heif
import pytest
import pyvips
from PIL import Image, ImageOps

from hypermedia.core.errors import PermanentJobError
from hypermedia.engines.imaging import heifcodec, ops, sources

DATA = Path(__file__).resolve().parents[1] / "data"
HEIC = DATA / "heic"
EXIF = DATA / "exif-orientation"
ARROW = HEIC / "iphone-8-plus-arrow.heic"
PUG = HEIC / "iphone-xs-pug-two-images.heic"
LIMITS = ops.ImageLimits(max_pixels=50_000_000, max_input_bytes=50 * 1024 * 1024)

# Marker bytes of metadata containers in JPEG, PNG, WebP and HEIF/AVIF outputs.
METADATA_MARKERS = (b"Exif", b"ICC_PROFILE", b"iCCP", b"eXIf", b"EXIF", b"ICCP", b"XMP ", b"colr", b"prof")


def run_one(operation: str, params: dict, source: Path, tmp_path: Path) -> tuple[ops.OutputFile, Path]:
    out_dir = tmp_path / f"out-{operation}-{len(list(tmp_path.iterdir()))}"
    out_dir.mkdir()
    (output,) = ops.run(operation, params, source, out_dir, LIMITS)
    return output, out_dir / output.filename


def decoded(path: Path) -> Image.Image:
    """The output as Pillow decodes it, in RGB."""
    with Image.open(path) as image:
        image.load()
        assert image.info.get("icc_profile") in (None, b"")
        assert not image.getexif()
        return image.convert("RGB")


def gray(image: Image.Image) -> Image.Image:
    return image.convert("L").resize((48, 32), Image.Resampling.BOX)


def distance(a: Image.Image, b: Image.Image) -> float:
    """Mean absolute difference of small grayscale versions (0–255)."""
    pairs = zip(gray(a).tobytes(), gray(b).tobytes(), strict=True)
    return sum(abs(x - y) for x, y in pairs) / (48 * 32)


@pytest.fixture(scope="module")
def upright() -> Image.Image:
    """Landscape_1.jpg (stored upright, orientation 1) as Pillow decodes it."""
    with Image.open(EXIF / "Landscape_1.jpg") as image:
        return image.convert("RGB")


def error_of(source: Path, tmp_path: Path, limits: ops.ImageLimits = LIMITS) -> PermanentJobError:
    out_dir = tmp_path / "refused"
    out_dir.mkdir(exist_ok=True)
    with pytest.raises(PermanentJobError) as err:
        ops.run("thumbnail", {"size": 256}, source, out_dir, limits)
    return err.value


# --- the premise ------------------------------------------------------------------------------------


def test_libvips_alone_cannot_decode_hevc() -> None:
    """Why this path exists: libvips' heifload opens an HEIC's header and fails on its pixels
    (if pyvips-binary ever gains HEVC, this test says the detour may go)."""
    image = pyvips.Image.heifload(str(ARROW))
    assert (image.width, image.height) == (3024, 4032)
    with pytest.raises(pyvips.Error) as err:
        image.avg()
    assert "has not been built in: HEVC" in err.value.detail
    # ...which ops reads as a missing decoder, not as a damaged file.
    with pytest.raises(PermanentJobError) as mapped:
        sources.reraise_vips_error(err.value)
    assert mapped.value.error_code == "UNSUPPORTED_FORMAT" and "HEVC" in str(mapped.value)


# --- orientation and colour ---------------------------------------------------------------------------


@pytest.mark.parametrize("n", [6, 7])
def test_oriented_p3_heic_thumbnail_is_upright_srgb(n: int, tmp_path: Path, upright: Image.Image) -> None:
    """landscape-6 is stored turned (irot), landscape-7 turned and mirrored (irot + imir); both
    carry a Display P3 ICC profile and the EXIF orientation an iPhone keeps beside irot."""
    source = HEIC / f"landscape-{n}-p3.heic"
    assert heifcodec.primary_codec(source.read_bytes()).is_hevc
    output, path = run_one("thumbnail", {"size": 256}, source, tmp_path)
    assert output.mime_type == "image/webp"
    assert output.metadata | {"size_bytes": 0} == {
        "width": 256,
        "height": 171,
        "format": "webp",
        "size_bytes": 0,
        "source_format": "heif",
        "source_pages": 1,
        "source_width": 600,  # the displayed size (irot applied): the pixels the job decodes
        "source_height": 400,
    }
    image = decoded(path)
    assert image.size == (256, 171)
    assert distance(image, upright) < 8
    assert distance(image.rotate(180), upright) > 30
    assert distance(ImageOps.mirror(image), upright) > 30


def flat_colours() -> tuple[list[tuple[int, int, int]], pyvips.Image]:
    """Three saturated sRGB patches and the same colours in Display P3 (libvips' built-in
    profile attached): P3 values differ from the sRGB ones by up to 55."""
    colours = [(200, 30, 40), (30, 180, 60), (40, 60, 200)]
    patches = [
        pyvips.Image.black(64, 64, bands=3).new_from_image(list(c)).cast("uchar").copy(interpretation="srgb")
        for c in colours
    ]
    return colours, pyvips.Image.arrayjoin(patches, across=3).icc_transform("p3", input_profile="srgb")


@pytest.mark.parametrize("described_by", ["icc", "nclx"])
def test_display_p3_heic_becomes_srgb(described_by: str, tmp_path: Path) -> None:
    """iPhones describe Display P3 with an ICC profile; other writers with an nclx box
    (colour_primaries 12). Either way the output holds the sRGB colours, not the P3 numbers."""
    colours, p3 = flat_colours()
    pixels = Image.frombytes("RGB", (p3.width, p3.height), p3.write_to_memory())
    described: dict = (
        {"icc_profile": p3.get("icc-profile-data")}
        if described_by == "icc"
        else {"color_primaries": 12, "transfer_characteristics": 13, "matrix_coefficients": 6}
    )
    source = tmp_path / "p3.heic"
    pillow_heif.from_pillow(pixels).save(source, quality=90, **described)
    assert heifcodec.primary_codec(source.read_bytes()).is_hevc

    for operation, params in [("convert", {"format": "png"}), ("thumbnail", {"size": 192})]:
        _, path = run_one(operation, params, source, tmp_path)
        image = decoded(path)
        assert image.size == (192, 64)
        for i, colour in enumerate(colours):
            got = image.getpixel((32 + 64 * i, 32))
            assert got == pytest.approx(colour, abs=4), (operation, i, got)
    # Read without its colour description, the file would give the P3 numbers: 55 off for green.
    stored = [p3.getpoint(32 + 64 * i, 32) for i in range(3)]
    assert (
        max(abs(a - b) for s, c in zip(stored, colours, strict=True) for a, b in zip(s, c, strict=True)) > 40
    )


def test_real_iphone_portrait_is_upright(tmp_path: Path) -> None:
    """iPhone 8 Plus: 4032×3024 coded in 512×512 HEVC tiles (a grid), irot 270° and EXIF
    orientation 6, Display P3 profile. Upright it is portrait, the drawn arrow pointing up."""
    output, path = run_one("thumbnail", {"size": 256}, ARROW, tmp_path)
    assert (output.metadata["width"], output.metadata["height"]) == (192, 256)
    image = decoded(path).convert("L")
    assert image.size == (192, 256)
    ink = [1 if value < 100 else 0 for value in image.tobytes()]
    half = len(ink) // 2
    top, bottom = sum(ink[:half]), sum(ink[half:])
    # The arrowhead (two sides and its base) is in the top half, the thinner shaft below it.
    assert top > 1.4 * bottom, (top, bottom)
    assert b"Apple" not in path.read_bytes() and b"iPhone" not in path.read_bytes()


# --- every operation, no metadata -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("operation", "params", "size", "pillow_format"),
    [
        ("thumbnail", {"size": 256}, (192, 256), "WEBP"),
        ("resize", {"width": 300, "height": 300, "fit": "cover"}, (300, 300), "PNG"),
        ("compress", {"quality": 60}, (3024, 4032), "PNG"),
        ("convert", {"format": "jpeg"}, (3024, 4032), "JPEG"),
        ("convert", {"format": "webp", "quality": 50}, (3024, 4032), "WEBP"),
        ("convert", {"format": "avif"}, (3024, 4032), "AVIF"),
    ],
)
def test_every_operation_reads_an_iphone_heic_and_writes_no_metadata(
    operation: str, params: dict, size: tuple[int, int], pillow_format: str, tmp_path: Path
) -> None:
    output, path = run_one(operation, params, ARROW, tmp_path)
    with Image.open(path) as image:
        assert image.format == pillow_format
    image = decoded(path)
    assert image.size == size == (output.metadata["width"], output.metadata["height"])
    data = path.read_bytes()
    assert [m for m in METADATA_MARKERS if m in data] == []
    assert b"Apple" not in data and b"iPhone" not in data
    # Not a blank frame: the paper is light, the pen lines dark.
    values = sorted(image.convert("L").tobytes())
    assert values[len(values) // 100] < 110 and values[len(values) // 2] > 150


# --- several images --------------------------------------------------------------------------------------


def test_the_primary_image_is_used_when_it_is_not_the_first(tmp_path: Path, upright: Image.Image) -> None:
    """primary-second.heic: a flat green 320×240 image first, the photo (450×300) second and
    primary: outputs are of the photo."""
    output, path = run_one("thumbnail", {"size": 256}, HEIC / "primary-second.heic", tmp_path)
    assert output.metadata["source_pages"] == 2
    image = decoded(path)
    assert image.size == (256, 171)
    assert distance(image, upright) < 8
    r, g, b = image.getpixel((128, 85))
    assert not (g > 150 and r < 60 and b < 60)  # not the green first image


def test_a_real_iphone_heic_with_two_images_gives_its_primary(tmp_path: Path) -> None:
    """iPhone XS, an edited photo: the primary image (1025×900) and the 932×1044 original."""
    output, path = run_one("convert", {"format": "png"}, PUG, tmp_path)
    assert output.metadata["source_pages"] == 2
    assert decoded(path).size == (1025, 900)
    reference = pillow_heif.open_heif(PUG)  # the primary, as pillow-heif itself reads it
    assert reference.primary_index == 0 and reference.size == (1025, 900)


# --- refused input -----------------------------------------------------------------------------------------


def test_a_codec_no_decoder_here_reads_is_unsupported_and_named(tmp_path: Path) -> None:
    err = error_of(HEIC / "relabelled-vvc.heic", tmp_path)
    assert err.error_code == "UNSUPPORTED_FORMAT"
    assert "H.266 (VVC)" in str(err)


@pytest.mark.parametrize(
    ("item_type", "name"),
    [("j2k1", "JPEG 2000"), ("jpeg", "JPEG"), ("avc1", "H.264"), ("unci", "uncompressed")],
)
def test_every_other_codec_is_unsupported_and_named(item_type: str, name: str, tmp_path: Path) -> None:
    data = (HEIC / "landscape-6-p3.heic").read_bytes()
    meta_end = data.index(b"mdat")
    source = tmp_path / f"{item_type}.heic"
    source.write_bytes(data[:meta_end].replace(b"hvc1", item_type.encode()) + data[meta_end:])
    err = error_of(source, tmp_path)
    assert err.error_code == "UNSUPPORTED_FORMAT" and name in str(err)


def test_an_av1_heif_still_goes_to_libvips(tmp_path: Path, upright: Image.Image) -> None:
    """An AVIF (av01 item, av1C) is libvips' heifload's, as before; the HEVC path is not tried."""
    source = tmp_path / "photo.avif"
    pyvips.Image.thumbnail(str(EXIF / "Landscape_6.jpg"), 600).heifsave(str(source), compression="av1")
    assert sources.heif_decoder(source.read_bytes()) == "heifload"
    assert sources.heif_decoder((HEIC / "landscape-6-p3.heic").read_bytes()) == "hevc"
    output, path = run_one("thumbnail", {"size": 256}, source, tmp_path)
    assert output.metadata["source_format"] == "avif"
    assert distance(decoded(path), upright) < 8


def test_pixels_are_checked_from_the_header_before_decoding(tmp_path: Path) -> None:
    """The sample's ``ispe`` made to claim 20000×20000: refused from the header alone
    (INPUT_TOO_LARGE_PIXELS); under a limit that lets it through, libheif decodes and finds the
    coded picture is not that size (CORRUPT_INPUT), so the header was all the first answer read."""
    data = bytearray((HEIC / "landscape-6-p3.heic").read_bytes())
    ispe = data.index(b"ispe")
    assert struct.unpack(">II", data[ispe + 8 : ispe + 16]) == (400, 600)  # as coded, before irot
    data[ispe + 8 : ispe + 16] = struct.pack(">II", 20000, 20000)
    source = tmp_path / "claims-400-megapixels.heic"
    source.write_bytes(bytes(data))
    assert error_of(source, tmp_path).error_code == "INPUT_TOO_LARGE_PIXELS"
    huge = ops.ImageLimits(max_pixels=20000 * 20000, max_input_bytes=LIMITS.max_input_bytes)
    assert error_of(source, tmp_path, huge).error_code == "CORRUPT_INPUT"


def test_an_image_count_beyond_the_page_limit_is_refused(tmp_path: Path) -> None:
    one = ops.ImageLimits(max_pixels=LIMITS.max_pixels, max_input_bytes=LIMITS.max_input_bytes, max_pages=1)
    assert error_of(PUG, tmp_path, one).error_code == "INPUT_TOO_MANY_PAGES"


@pytest.mark.parametrize("keep", [0.5, 0.9])
def test_a_truncated_heic_is_corrupt(keep: float, tmp_path: Path) -> None:
    data = (HEIC / "landscape-6-p3.heic").read_bytes()
    source = tmp_path / "cut.heic"
    source.write_bytes(data[: int(len(data) * keep)])
    assert error_of(source, tmp_path).error_code == "CORRUPT_INPUT"


def test_a_damaged_container_is_corrupt(tmp_path: Path) -> None:
    data = bytearray((HEIC / "landscape-6-p3.heic").read_bytes())
    meta = data.index(b"meta") - 4
    data[meta : meta + 4] = (1 << 20).to_bytes(4, "big")  # a meta box longer than the file
    source = tmp_path / "overrun.heic"
    source.write_bytes(bytes(data))
    err = error_of(source, tmp_path)
    assert err.error_code == "CORRUPT_INPUT" and "meta" in str(err)


# --- OCR ------------------------------------------------------------------------------------------------------


def test_ocr_reads_a_heic_photo_of_a_page(tmp_path: Path) -> None:
    """phototest.tif encoded as a HEIC turned 90° (irot, as a phone held sideways stores it): the
    OCR engine reads it upright through the same HEVC path."""
    from hypermedia.engines.ocr.engine import OcrLimits, run
    from hypermedia.engines.ocr.metrics import cer

    ocr_dir = DATA / "ocr"
    with Image.open(ocr_dir / "phototest.tif") as page:
        stored = page.convert("RGB").rotate(90, expand=True)  # what the sensor stored
    exif = Image.Exif()
    exif[0x0112] = 8  # "rotate 90° clockwise to view": undoes rotate(90)
    buffer = io.BytesIO()
    pillow_heif.from_pillow(stored).save(buffer, quality=90, exif=exif.tobytes())
    source = tmp_path / "page.heic"
    source.write_bytes(buffer.getvalue())
    assert b"irot" in source.read_bytes()

    out_dir = tmp_path / "ocr"
    out_dir.mkdir()
    outputs = run(
        "ocr", {}, source, out_dir, limits=OcrLimits(max_input_bytes=1 << 24, max_page_pixels=10**8)
    )
    text = (out_dir / outputs[0].filename).read_text(encoding="utf-8")
    gold = (ocr_dir / "phototest.gold.txt").read_text(encoding="utf-8")
    assert outputs[0].metadata["source_format"] == "heif"
    assert cer(text, gold) < 0.05, text


# --- pixel layouts ---------------------------------------------------------------------------------------------


def test_a_10_bit_grey_heic_becomes_8_bit_grey_values(tmp_path: Path) -> None:
    """A monochrome 10-bit HEIC comes from libheif as 16-bit grey; the output holds its levels."""
    ramp = Image.new("I;16", (256, 32))
    ramp.putdata([x * 257 for _ in range(32) for x in range(256)])  # 0…65535 across
    source = tmp_path / "grey10.heic"
    pillow_heif.from_pillow(ramp).save(source, quality=-1)
    assert pillow_heif.open_heif(source).info["bit_depth"] == 10
    _, path = run_one("convert", {"format": "png"}, source, tmp_path)
    image = decoded(path).convert("L")
    assert image.size == (256, 32)
    for x in (0, 64, 128, 192, 255):
        assert abs(image.getpixel((x, 16)) - x) <= 3, x


def test_alpha_is_kept_and_flattened_onto_white_for_jpeg(tmp_path: Path) -> None:
    left = Image.new("RGBA", (64, 64), (200, 30, 40, 255))
    right = Image.new("RGBA", (64, 64), (0, 0, 0, 0))
    both = Image.new("RGBA", (128, 64))
    both.paste(left, (0, 0))
    both.paste(right, (64, 0))
    source = tmp_path / "alpha.heic"
    pillow_heif.from_pillow(both).save(source, quality=90)
    _, png = run_one("convert", {"format": "png"}, source, tmp_path)
    with Image.open(png) as image:
        rgba = image.convert("RGBA")
    assert rgba.getpixel((32, 32))[3] == 255 and rgba.getpixel((96, 32))[3] == 0
    assert rgba.getpixel((32, 32))[:3] == pytest.approx((200, 30, 40), abs=6)
    _, jpeg = run_one("convert", {"format": "jpeg"}, source, tmp_path)
    assert decoded(jpeg).getpixel((96, 32)) == pytest.approx((255, 255, 255), abs=3)


def box(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", 8 + len(payload)) + kind + payload


def test_an_hevc_sequence_without_a_still_image_is_unsupported_and_said_so(tmp_path: Path) -> None:
    """An image sequence (brand msf1) whose frames are only a moov track of hvc1 samples, no
    meta/pitm: the box reader names its codec from the track's sample entry."""
    sample_entry = box(b"hvc1", bytes(78) + box(b"hvcC", bytes(23)))
    stsd = box(b"stsd", bytes(4) + struct.pack(">I", 1) + sample_entry)
    moov = box(b"moov", box(b"trak", box(b"mdia", box(b"minf", box(b"stbl", stsd)))))
    data = box(b"ftyp", b"msf1" + bytes(4) + b"msf1iso8") + moov
    codec = heifcodec.primary_codec(data)
    assert (codec.item_type, codec.sequence_only, codec.name) == ("hvc1", True, "HEVC")
    source = tmp_path / "sequence.heics"
    source.write_bytes(data)
    assert sources.sniff_mime(data[:64]) == "image/heif"
    err = error_of(source, tmp_path)
    assert err.error_code == "UNSUPPORTED_FORMAT" and "sequences without a still image" in str(err)
