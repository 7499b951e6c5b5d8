"""Issue 15, items 3 and 4: animated AVIF gives its first frame; TIFFs whose compression the libtiff
inside pyvips-binary lacks are decoded by Pillow (old-style JPEG, LZMA, ZSTD) or refused by name.

Samples: ``tests/data/avif`` and ``tests/data/tiff-fallback`` (see their ``SOURCE.md``). Outputs
are decoded by libvips and compared with independent decodes: Pillow's libavif for AVIF frames,
libvips' JPEG loader for the JPEG stream an old-style JPEG TIFF carries, the photo the lossless
TIFFs were made from.
"""

from __future__ import annotations

import io
import struct
from pathlib import Path
from typing import Any

import pytest
import pyvips
from PIL import Image, TiffImagePlugin

from hypermedia.core.errors import PermanentJobError
from hypermedia.engines.imaging import ops, sequence, sources, tiff
from hypermedia.engines.ocr import assemble
from hypermedia.engines.ocr import engine as ocr_engine
from hypermedia.engines.ocr.metrics import cer
from hypermedia.intake import contenttype
from tests.helpers.images import EXIF, LIMITS, load, mean_abs_diff, run_one
from tests.helpers.ocr import EUROTEXT_LANGUAGES, OCR_DIR
from tests.helpers.ocr import GOLD as PHOTOTEST_GOLD
from tests.helpers.ocr import LIMITS as OCR_LIMITS

DATA = Path(__file__).resolve().parents[1] / "data"
STAR = DATA / "avif" / "star.avifs"
BARS = DATA / "avif" / "ffmpeg-bars.avif"
OJPEG = DATA / "tiff-fallback" / "old-style-jpeg-compression.tif"
LZMA = DATA / "tiff-fallback" / "landscape-6-lzma.tif"
ZSTD = DATA / "tiff-fallback" / "landscape-6-zstd.tif"


@pytest.fixture
def out_dir(tmp_path: Path) -> Path:
    path = tmp_path / "output"
    path.mkdir()
    return path


def frame_by_pillow(path: Path, index: int) -> pyvips.Image:
    """Frame ``index`` of an animated AVIF decoded by Pillow (libavif, reading the track's
    samples), independent of libheif, which the platform decodes with."""
    with Image.open(path) as picture:
        picture.seek(index)
        buffer = io.BytesIO()
        picture.convert("RGBA").save(buffer, "PNG")
    return pyvips.Image.new_from_buffer(buffer.getvalue(), "")


def colour_diff(image: pyvips.Image, reference: pyvips.Image) -> float:
    """Mean absolute RGB difference, ``reference`` scaled to ``image``'s size: of the colour bands
    where both are opaque when ``image`` has alpha, of ``reference`` flattened onto white (as the
    JPEG output is) when not.

    Alpha is compared by its shape only (:func:`alpha_shape_diff`): the sample's alpha is coded
    limited-range; libavif stretches it to 0..255, libheif (the platform's decoder) leaves the
    inside of the star at 235."""
    reference = reference.resize(image.width / reference.width, vscale=image.height / reference.height)
    if not image.hasalpha():
        return float((image - reference.flatten(background=[255.0] * 3)).abs().avg())
    # Where both are opaque: the colour of a transparent pixel is anyone's (WebP drops it).
    both = ((image[3] > 128) & (reference[3] > 128)) / 255
    return float(((image[0:3] - reference[0:3]).abs() * both).avg() / max(both.avg(), 1e-9))


def alpha_shape_diff(image: pyvips.Image, reference: pyvips.Image) -> float:
    """Fraction of pixels transparent in one image and not in the other."""
    reference = reference.resize(image.width / reference.width, vscale=image.height / reference.height)
    return float(((image[3] > 128) ^ (reference[3] > 128)).avg() / 255)


# --- animated AVIF --------------------------------------------------------------------------------


@pytest.mark.parametrize("path", [STAR, BARS], ids=["libavif", "ffmpeg"])
def test_libvips_sniffing_does_not_know_the_avis_brand(path: Path) -> None:
    """Why the item failed: thumbnail() sniffs the file, and libvips' HEIF sniffing lists the
    ``avif`` major brand, not ``avis``; heifload itself reads the file."""
    assert path.read_bytes()[4:12] == b"ftypavis"
    with pytest.raises(pyvips.Error, match="not a known file format"):
        pyvips.Image.thumbnail(str(path), 64)
    assert ops._sniffed_loader(path) == "load"
    assert pyvips.Image.heifload(str(path)).get("vips-loader") == "heifload"
    assert sources.sniff_mime(path.read_bytes()[:64]) == "image/avif"
    assert contenttype.name_mime(path.name) == "image/avif"  # .avifs too: no type mismatch


@pytest.mark.parametrize(
    ("operation", "params", "size", "loader"),
    [
        ("thumbnail", {"size": 64}, (64, 64), "webpload"),
        ("resize", {"width": 100}, (100, 100), "heifload"),
        ("compress", {"quality": 60}, (159, 159), "heifload"),
        ("convert", {"format": "png"}, (159, 159), "pngload"),
        ("convert", {"format": "jpeg"}, (159, 159), "jpegload"),
    ],
)
def test_animated_avif_gives_its_first_frame(
    operation: str, params: dict, size: tuple[int, int], loader: str, out_dir: Path
) -> None:
    """Issue 15, item 3: ``star.avifs`` (libavif, 5 frames with alpha) failed CORRUPT_INPUT."""
    output, path = run_one(operation, params, STAR, out_dir)
    image = load(path)
    assert image.get("vips-loader") == loader
    assert (image.width, image.height) == size
    assert output.metadata["source_format"] == "avif"
    assert output.metadata["source_pages"] == 5  # the track's frames, not libvips' 1 still
    first, third = frame_by_pillow(STAR, 0), frame_by_pillow(STAR, 2)
    assert colour_diff(image, first) < 6  # WebP's lossy alpha edge included
    # The star turns from frame to frame: its outline tells the frames apart.
    if image.hasalpha():
        assert alpha_shape_diff(image, first) < 0.01 and alpha_shape_diff(image, third) > 0.2
    else:
        assert colour_diff(image, third) > 6


def test_an_ffmpeg_animated_avif_gives_its_first_frame(out_dir: Path) -> None:
    """FFmpeg's avif muxer (SVT-AV1): 8 frames, frame i with a green bar 24 (i + 1) pixels wide."""
    output, path = run_one("convert", {"format": "png"}, BARS, out_dir)
    image = load(path)
    assert (image.width, image.height) == (192, 128)
    assert output.metadata["source_pages"] == 8
    assert mean_abs_diff(image, frame_by_pillow(BARS, 0)) < 3
    assert mean_abs_diff(image, frame_by_pillow(BARS, 7)) > 20
    # Frame 0: red 40, the green bar over x < 24 only, the blue square at 70..120 × 40..88.
    red, green, blue = image.getpoint(10, 10)[:3]
    assert abs(red - 40) < 16 and green > 180 and blue < 30
    assert image.getpoint(60, 10)[1] < 40
    assert image.getpoint(95, 64)[2] > 200


def test_an_animated_avif_with_more_frames_than_the_limit_is_refused(out_dir: Path) -> None:
    limits = ops.ImageLimits(
        max_pixels=LIMITS.max_pixels, max_input_bytes=LIMITS.max_input_bytes, max_pages=4
    )
    with pytest.raises(PermanentJobError) as caught:
        ops.run("thumbnail", {}, STAR, out_dir, limits)
    assert caught.value.error_code == "INPUT_TOO_MANY_PAGES"


def test_a_truncated_animated_avif_is_corrupt(tmp_path: Path, out_dir: Path) -> None:
    path = tmp_path / "cut.avifs"
    # Inside the primary image's colour data (its iloc extent: bytes 3386..7451); frames of the
    # track cut off after it are never read, so a cut there still gives the primary image.
    path.write_bytes(STAR.read_bytes()[:5000])
    with pytest.raises(PermanentJobError) as caught:
        ops.run("thumbnail", {}, path, out_dir, LIMITS)
    assert caught.value.error_code == "CORRUPT_INPUT"


def test_track_frames_counts_the_sequence_only(tmp_path: Path) -> None:
    still = tmp_path / "still.avif"
    pyvips.Image.black(32, 32).heifsave(str(still), compression="av1", effort=0)
    assert sequence.track_frames(still) is None
    assert sequence.track_frames(STAR) == 5
    assert sequence.track_frames(BARS) == 8
    assert sequence.track_frames(OJPEG) is None  # not ISO-BMFF at all
    cut = tmp_path / "cut.avif"
    cut.write_bytes(BARS.read_bytes()[:400])
    assert sequence.track_frames(cut) is None


# --- TIFF compressions ----------------------------------------------------------------------------


def tiff_with_compression(compression: int) -> bytes:
    """A 64×48 RGB TIFF whose IFD says ``compression`` over uncompressed strips: what libvips
    does with a scheme is decided by the tag, before any strip is read."""
    buffer = io.BytesIO()
    Image.new("RGB", (64, 48), (200, 30, 90)).save(buffer, "TIFF")
    data = bytearray(buffer.getvalue())
    (offset,) = struct.unpack("<I", data[4:8])
    (count,) = struct.unpack("<H", data[offset : offset + 2])
    for entry in range(offset + 2, offset + 2 + 12 * count, 12):
        if struct.unpack("<H", data[entry : entry + 2])[0] == 259:
            data[entry + 8 : entry + 10] = struct.pack("<H", compression)
            return bytes(data)
    raise AssertionError("no compression tag")


def libtiff_lacks(data: bytes) -> bool:
    """libvips' libtiff has no codec for the file's compression (fail_on="error" shows it; the
    pipeline's fail_on="truncated" decoded such files as black pixels)."""
    try:
        pyvips.Image.new_from_buffer(data, "", fail_on="error").avg()
    except pyvips.Error as exc:
        return "is not configured" in exc.detail or "decoding is not implemented" in exc.detail
    return False


@pytest.mark.parametrize("compression", sorted(tiff.COMPRESSION_NAMES))
def test_the_libvips_compressions_are_the_codecs_its_libtiff_has(compression: int) -> None:
    assert libtiff_lacks(tiff_with_compression(compression)) == (compression not in tiff.LIBVIPS_COMPRESSIONS)


@pytest.mark.parametrize(("path", "compression"), [(OJPEG, 6), (LZMA, 34925), (ZSTD, 50000)])
def test_the_pillow_compressions_are_decoded_by_pillow_and_not_by_libvips(
    path: Path, compression: int
) -> None:
    assert tiff.page_compression(path) == compression
    assert compression in tiff.PILLOW_COMPRESSIONS
    assert libtiff_lacks(path.read_bytes())
    with Image.open(path) as picture:
        grey = picture.convert("L")
    assert pyvips.Image.new_from_memory(grey.tobytes(), *grey.size, 1, "uchar").max() > 100  # not black
    assert tiff.PILLOW_COMPRESSIONS == {6, 34925, 50000}


def embedded_jpeg() -> pyvips.Image:
    """The JPEG stream the old-style JPEG sample carries (its JPEGInterchangeFormat, tag 513, at
    byte 768, as its one strip), decoded by libvips' JPEG loader: not libtiff, not Pillow."""
    with TiffImagePlugin.TiffImageFile(OJPEG) as picture:
        start = picture.tag_v2[513]
        length = picture.tag_v2[279][0]
    return pyvips.Image.jpegload_buffer(OJPEG.read_bytes()[start : start + length])


@pytest.mark.parametrize(
    ("operation", "params", "size", "loader"),
    [
        ("thumbnail", {"size": 256}, (256, 54), "webpload"),
        ("resize", {"width": 1040}, (1040, 218), "pngload"),
        ("convert", {"format": "png"}, (4160, 870), "pngload"),
        ("convert", {"format": "jpeg"}, (4160, 870), "jpegload"),
    ],
)
def test_an_old_style_jpeg_tiff_is_decoded(
    operation: str, params: dict, size: tuple[int, int], loader: str, out_dir: Path
) -> None:
    """Issue 15, item 4: it failed CORRUPT_INPUT ("Old-style JPEG compression support is not
    configured" in pyvips-binary's libtiff); Pillow's libtiff decodes it."""
    output, path = run_one(operation, params, OJPEG, out_dir)
    image = load(path)
    assert image.get("vips-loader") == loader
    assert (image.width, image.height) == size
    assert image.interpretation == "srgb" and image.bands == 3
    assert output.metadata["source_format"] == "tiff"
    reference = embedded_jpeg()
    assert (reference.width, reference.height) == (4160, 870)
    assert mean_abs_diff(image, reference) < 2
    assert mean_abs_diff(image.flip("vertical"), reference) > 10


@pytest.mark.parametrize("path", [LZMA, ZSTD], ids=["lzma", "zstd"])
def test_lzma_and_zstd_tiffs_are_decoded_upright_not_black(path: Path, out_dir: Path) -> None:
    """These decoded to black pixels without an error before (libvips' libtiff lacks both codecs).
    The samples hold Landscape_6.jpg's stored pixels at 1/8 with orientation 6: upright 225×150."""
    _, output = run_one("convert", {"format": "png"}, path, out_dir)
    image = load(output)
    assert (image.width, image.height) == (225, 150)
    stored = pyvips.Image.new_from_file(str(EXIF / "Landscape_6.jpg"), autorotate=False).resize(0.125)
    upright = stored.rot90()
    assert float((image - upright).abs().max()) <= 1  # lossless: the very pixels
    thumbnail, _ = run_one("thumbnail", {"size": 64}, path, out_dir)
    assert (thumbnail.metadata["width"], thumbnail.metadata["height"]) == (64, 43)


def test_a_tiff_of_tiles_with_separate_planes_is_decoded_by_pillow(out_dir: Path) -> None:
    """libvips refuses tiled separate planes ("tiled separate planes not supported"): it was
    CORRUPT_INPUT. Compared with libvips' decode of the chunky 16-bit file GDAL made it from."""
    planar = DATA / "tiff-fallback" / "tiff_tiled_planar_16bit_RGB.tiff"
    with pytest.raises(pyvips.Error, match="tiled separate planes not supported"):
        pyvips.Image.tiffload(str(planar)).avg()
    assert tiff.page_compression(planar) == 5 and tiff.decoder_for(planar) == "pillow"
    _, path = run_one("convert", {"format": "png"}, planar, out_dir)
    image = load(path)
    assert (image.width, image.height, image.bands) == (100, 40, 3)
    chunky = pyvips.Image.tiffload(str(DATA / "tiff-fallback" / "tiff_16bit_RGB.tiff"), fail_on="error")
    assert chunky.format == "ushort" and float(chunky.avg()) > 1000
    assert float((image - (chunky / 256).cast("uchar")).abs().max()) <= 1


@pytest.mark.parametrize(
    ("compression", "name"),
    [
        (34661, "ISO JBIG (34661)"),
        (34887, "LERC (34887)"),
        (32909, "PixarLog (32909)"),
        (12345, "unknown (12345)"),
    ],
)
def test_a_tiff_compression_neither_decoder_has_is_unsupported_by_name(
    compression: int, name: str, tmp_path: Path, out_dir: Path
) -> None:
    """These gave a black image without an error before (libvips' fail_on="truncated")."""
    path = tmp_path / "image.tif"
    path.write_bytes(tiff_with_compression(compression))
    with pytest.raises(PermanentJobError) as caught:
        ops.run("thumbnail", {}, path, out_dir, LIMITS)
    assert caught.value.error_code == "UNSUPPORTED_FORMAT"
    assert f"TIFF compression {name} is not supported" in str(caught.value)


def test_a_truncated_old_style_jpeg_tiff_is_corrupt(tmp_path: Path, out_dir: Path) -> None:
    path = tmp_path / "cut.tif"
    path.write_bytes(OJPEG.read_bytes()[:100_000])
    with pytest.raises(PermanentJobError) as caught:
        ops.run("convert", {"format": "png"}, path, out_dir, LIMITS)
    assert caught.value.error_code == "CORRUPT_INPUT"


def test_the_pixel_limit_bounds_the_pillow_decode_from_the_header(out_dir: Path) -> None:
    limits = ops.ImageLimits(max_pixels=4160 * 870 - 1, max_input_bytes=LIMITS.max_input_bytes)
    with pytest.raises(PermanentJobError) as caught:
        ops.run("thumbnail", {}, OJPEG, out_dir, limits)
    assert caught.value.error_code == "INPUT_TOO_LARGE_PIXELS"


def test_a_pillow_decode_of_another_size_than_libvips_read_is_corrupt() -> None:
    with pytest.raises(PermanentJobError) as caught:
        tiff.decode_page(OJPEG, 4160, 871)
    assert caught.value.error_code == "CORRUPT_INPUT"


def test_page_compression_reads_classic_big_and_big_endian_tiffs(tmp_path: Path) -> None:
    image = pyvips.Image.black(16, 16)
    for name, options in (
        ("lzw.tif", {"compression": "lzw"}),
        ("big.tif", {"compression": "deflate", "bigtiff": True}),
    ):
        image.tiffsave(str(tmp_path / name), **options)
    assert tiff.page_compression(tmp_path / "lzw.tif") == 5
    assert (tmp_path / "big.tif").read_bytes()[2:4] in (b"+\0", b"\0+")
    assert tiff.page_compression(tmp_path / "big.tif") == 8
    big_endian = tmp_path / "mm.tif"
    # Big-endian header, IFD at 8 with one entry: Compression (259) SHORT 1 = 34925.
    big_endian.write_bytes(b"MM\0*" + struct.pack(">I", 8) + struct.pack(">HHHIHH", 1, 259, 3, 1, 34925, 0))
    assert tiff.page_compression(big_endian) == 34925
    assert tiff.page_compression(OJPEG) == 6
    no_tag = tmp_path / "no-tag.tif"
    no_tag.write_bytes(b"II*\0" + struct.pack("<I", 8) + struct.pack("<H", 0) + bytes(6))
    assert tiff.page_compression(no_tag) == 1  # the TIFF 6.0 default
    looped = tmp_path / "looped.tif"  # one IFD whose next-IFD offset is itself
    looped.write_bytes(
        b"II*\0" + struct.pack("<I", 8) + struct.pack("<H", 0) + struct.pack("<I", 8) + bytes(2)
    )
    assert tiff.page_compression(looped, 0) == 1
    assert tiff.page_compression(looped, 5) is None
    assert tiff.page_compression(OJPEG, 1) is None  # one page only
    broken = tmp_path / "broken.tif"
    broken.write_bytes(b"II*\0" + struct.pack("<I", 10_000) + bytes(8))  # the IFD lies past the end
    assert tiff.page_compression(broken) is None


# --- OCR reads the same TIFFs ---------------------------------------------------------------------


def ocr_text(source: Path, tmp_path: Path, **job_params: Any) -> str:
    out_dir = tmp_path / f"ocr-{len(list(tmp_path.iterdir()))}"
    out_dir.mkdir()
    outputs = ocr_engine.run("ocr", {"outputs": ["text"], **job_params}, source, out_dir, limits=OCR_LIMITS)
    (text,) = (output for output in outputs if output.output_type == "text")
    return (out_dir / text.filename).read_text(encoding="utf-8")


def test_ocr_reads_an_old_style_jpeg_scan(tmp_path: Path) -> None:
    """The Kodak grey-scale card the old-style JPEG sample shows is captioned "KODAK Gray Scale";
    before, OCR failed CORRUPT_INPUT on it."""
    assert "Gray Scale" in ocr_text(OJPEG, tmp_path)


def test_ocr_reads_each_tiff_page_by_its_own_compression(tmp_path: Path) -> None:
    """Page 1 (eurotext.tif) ZSTD, page 2 (phototest.tif) LZMA, written by Pillow's libtiff: libvips
    read both as blank pages without an error before; a JBIG page is refused by name."""
    first, second = (Image.open(OCR_DIR / name).convert("L") for name in ("eurotext.tif", "phototest.tif"))
    second.encoderinfo = {"compression": "lzma", "dpi": (300, 300)}  # the appended page's own options
    source = tmp_path / "two.tif"
    first.save(source, compression="zstd", save_all=True, append_images=[second], dpi=(300, 300))
    assert [tiff.page_compression(source, page) for page in (0, 1, 2)] == [50000, 34925, None]
    pages = ocr_text(source, tmp_path, languages=EUROTEXT_LANGUAGES).split(assemble.PAGE_SEPARATOR)
    assert len(pages) == 2
    assert "preguiçoso" in pages[0]
    assert cer(pages[1], PHOTOTEST_GOLD) < 0.03

    jbig = tmp_path / "jbig.tif"
    jbig.write_bytes(tiff_with_compression(34661))
    with pytest.raises(PermanentJobError) as caught:
        ocr_text(jbig, tmp_path)
    assert caught.value.error_code == "UNSUPPORTED_FORMAT" and "ISO JBIG (34661)" in str(caught.value)
