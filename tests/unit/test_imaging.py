"""hypermedia.engines.imaging.ops against real files and real libvips; outputs checked by decoded values."""

from __future__ import annotations

import base64
import io
import os
import struct
import time
import zlib
from pathlib import Path

import pytest
import pyvips

from hypermedia.core.errors import InvalidArgument, PermanentJobError
from hypermedia.engines.imaging import ops, sources
from tests.helpers.images import EXIF, LIMITS, load, mean_abs_diff, run_one


@pytest.fixture
def out_dir(tmp_path: Path) -> Path:
    path = tmp_path / "output"
    path.mkdir()
    return path


def write_png_header(path: Path, width: int, height: int) -> None:
    """A PNG whose IHDR (valid CRC) claims width × height; the pixel data is a stub."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    body = chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + body)


# --- orientation ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def upright_reference() -> pyvips.Image:
    # Landscape_1.jpg has orientation 1: its pixels are already upright.
    return pyvips.Image.thumbnail(str(EXIF / "Landscape_1.jpg"), 256).copy_memory()


@pytest.mark.parametrize("n", range(9))
def test_thumbnail_of_every_exif_orientation_is_upright_landscape(
    n: int, out_dir: Path, upright_reference: pyvips.Image
) -> None:
    output, path = run_one("thumbnail", {"size": 256}, EXIF / f"Landscape_{n}.jpg", out_dir)

    image = load(path)
    assert image.get("vips-loader") == "webpload"
    assert (image.width, image.height) == (256, 171)
    assert output.mime_type == "image/webp"
    assert output.metadata["width"] == 256 and output.metadata["height"] == 171
    assert output.metadata["format"] == "webp"
    assert mean_abs_diff(image, upright_reference) < 8
    assert mean_abs_diff(image.rot180(), upright_reference) > 30
    assert mean_abs_diff(image.flip("horizontal"), upright_reference) > 30


ULTRA_HDR = EXIF.parent / "ultrahdr" / "landscape-ultrahdr.jpg"


def test_the_ultra_hdr_sample_is_what_libvips_opens_with_uhdrload() -> None:
    """The sample is real Ultra HDR: libvips' sniffing picks uhdrload and finds a gain map."""
    image = pyvips.Image.new_from_file(str(ULTRA_HDR))
    assert image.get("vips-loader") == "uhdrload"
    assert image.get_typeof("gainmap-data")


def ultra_hdr_base_by_pillow() -> pyvips.Image:
    """The sample's primary (base) image decoded by Pillow, an independent JPEG decoder."""
    from PIL import Image

    buffer = io.BytesIO()
    with Image.open(ULTRA_HDR) as decoded:
        decoded.convert("RGB").save(buffer, "PNG")
    return pyvips.Image.new_from_buffer(buffer.getvalue(), "")


@pytest.mark.parametrize(
    ("operation", "params", "size", "loader"),
    [
        ("thumbnail", {"size": 256}, (256, 171), "webpload"),
        ("resize", {"width": 600, "height": 600, "fit": "cover"}, (600, 600), "jpegload"),
        ("compress", {"quality": 60}, (1200, 800), "jpegload"),
        ("convert", {"format": "png"}, (1200, 800), "pngload"),
        ("convert", {"format": "avif"}, (1200, 800), "heifload"),
    ],
)
def test_an_ultra_hdr_jpeg_is_read_as_its_base_image_without_the_gain_map(
    operation: str,
    params: dict,
    size: tuple[int, int],
    loader: str,
    out_dir: Path,
) -> None:
    """Issue 15, item 2: an Ultra HDR JPEG was UNSUPPORTED_FORMAT (libvips chose uhdrload, not
    the allowed jpegload). Its base image is decoded by jpegload; the gain map is dropped."""
    _, path = run_one(operation, params, ULTRA_HDR, out_dir)
    image = load(path)
    assert image.get("vips-loader") == loader
    assert (image.width, image.height) == size
    assert not image.get_typeof("gainmap-data") and not image.get_typeof("exif-data")
    assert image.interpretation == "srgb" and image.format == "uchar"
    if operation != "resize":  # the cover crop shows part of the picture only
        # Like the base image (the SDR rendition) as Pillow decodes it, not like the photo it was
        # made from: libultrahdr tone-maps the base (mean difference 19 from Landscape_1).
        base = ultra_hdr_base_by_pillow()
        assert mean_abs_diff(image, base) < 4
        assert mean_abs_diff(image.rot180(), base) > 20
    data = path.read_bytes()
    assert b"MPF\x00" not in data and data.count(b"\xff\xd8\xff") <= 1  # no second JPEG


def test_source_md_describes_the_corpus() -> None:
    text = (EXIF / "SOURCE.md").read_text()
    assert "recurser/exif-orientation-examples" in text and "256×171" in text
    assert sorted(p.name for p in EXIF.glob("Landscape_*.jpg")) == [f"Landscape_{n}.jpg" for n in range(9)]


def test_thumbnail_never_enlarges(tmp_path: Path, out_dir: Path) -> None:
    source = tmp_path / "small.png"
    pyvips.Image.thumbnail(str(EXIF / "Landscape_1.jpg"), 90).pngsave(str(source))
    output, path = run_one("thumbnail", {"size": 256}, source, out_dir)
    assert (load(path).width, load(path).height) == (90, 60)
    assert output.metadata["source_format"] == "png"


def test_same_input_and_params_give_the_same_bytes(tmp_path: Path) -> None:
    for index, (operation, params) in enumerate(
        [
            ("thumbnail", {"size": 128}),
            ("convert", {"format": "avif"}),
            ("convert", {"format": "png"}),
            ("compress", {"quality": 40}),
        ]
    ):
        first, second = tmp_path / f"{index}-a", tmp_path / f"{index}-b"
        first.mkdir()
        second.mkdir()
        _, a = run_one(operation, params, EXIF / "Landscape_6.jpg", first)
        _, b = run_one(operation, params, EXIF / "Landscape_6.jpg", second)
        assert a.read_bytes() == b.read_bytes(), operation


# --- resize -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "size"),
    [
        ({"width": 300, "height": 300}, (300, 200)),
        ({"width": 900}, (900, 600)),
        ({"height": 600}, (900, 600)),
        ({"width": 3600, "height": 3600}, (3600, 2400)),
        ({"width": 300, "height": 300, "fit": "cover"}, (300, 300)),
        ({"width": 300, "height": 100, "fit": "fill"}, (300, 100)),
    ],
)
def test_resize_sizes(params: dict, size: tuple[int, int], out_dir: Path) -> None:
    # Landscape_6 is stored 1200×1800 with orientation 6: upright it is 1800×1200.
    output, path = run_one("resize", params, EXIF / "Landscape_6.jpg", out_dir)
    image = load(path)
    assert (image.width, image.height) == size
    assert image.get("vips-loader") == "jpegload"
    assert output.mime_type == "image/jpeg" and output.output_type == "resized"


def test_resize_cover_crops_the_centre_and_fill_stretches(tmp_path: Path) -> None:
    reference = pyvips.Image.new_from_file(str(EXIF / "Landscape_1.jpg"))
    cover_dir, fill_dir = tmp_path / "cover", tmp_path / "fill"
    cover_dir.mkdir()
    fill_dir.mkdir()

    _, cover = run_one(
        "resize", {"width": 400, "height": 400, "fit": "cover"}, EXIF / "Landscape_3.jpg", cover_dir
    )
    centre = reference.crop(300, 0, 1200, 1200)
    assert mean_abs_diff(load(cover), centre) < 8

    _, fill = run_one(
        "resize", {"width": 200, "height": 400, "fit": "fill"}, EXIF / "Landscape_8.jpg", fill_dir
    )
    assert mean_abs_diff(load(fill), reference) < 8


def test_resize_keeps_or_changes_the_format(tmp_path: Path, out_dir: Path) -> None:
    source = tmp_path / "in.gif"
    pyvips.Image.thumbnail(str(EXIF / "Landscape_1.jpg"), 100).gifsave(str(source))
    output, path = run_one("resize", {"width": 50}, source, out_dir)
    assert output.mime_type == "image/png" and load(path).get("vips-loader") == "pngload"

    output, path = run_one("resize", {"width": 50, "format": "webp"}, source, out_dir)
    assert output.mime_type == "image/webp" and load(path).get("vips-loader") == "webpload"


def test_resize_output_beyond_the_pixel_limit_is_refused(out_dir: Path) -> None:
    limits = ops.ImageLimits(max_pixels=3_000_000, max_input_bytes=LIMITS.max_input_bytes)
    with pytest.raises(PermanentJobError) as err:
        ops.run("resize", {"width": 16384}, EXIF / "Landscape_1.jpg", out_dir, limits)
    assert err.value.error_code == "INVALID_PARAMS"


# --- compress and convert ----------------------------------------------------------------------------


def test_compress_jpeg_quality(tmp_path: Path) -> None:
    sizes = {}
    for quality in (30, 90):
        out = tmp_path / str(quality)
        out.mkdir()
        output, path = run_one("compress", {"quality": quality}, EXIF / "Landscape_5.jpg", out)
        image = load(path)
        assert image.get("vips-loader") == "jpegload"
        assert (image.width, image.height) == (1800, 1200)
        assert output.output_type == "compressed"
        sizes[quality] = path.stat().st_size
    assert sizes[30] < sizes[90]
    assert sizes[30] < (EXIF / "Landscape_5.jpg").stat().st_size


def test_compress_png_quantises_to_a_palette(tmp_path: Path, out_dir: Path) -> None:
    source = tmp_path / "in.png"
    pyvips.Image.thumbnail(str(EXIF / "Landscape_1.jpg"), 600).pngsave(str(source))
    output, path = run_one("compress", {"quality": 50}, source, out_dir)
    image = load(path)
    assert image.get("vips-loader") == "pngload" and output.mime_type == "image/png"
    assert path.stat().st_size < source.stat().st_size / 2
    assert mean_abs_diff(image, load(source)) < 4


@pytest.mark.parametrize(
    ("fmt", "loader", "mime"),
    [
        ("png", "pngload", "image/png"),
        ("webp", "webpload", "image/webp"),
        ("avif", "heifload", "image/avif"),
        ("jpeg", "jpegload", "image/jpeg"),
    ],
)
def test_convert_decodes_with_the_right_loader(fmt: str, loader: str, mime: str, out_dir: Path) -> None:
    output, path = run_one("convert", {"format": fmt}, EXIF / "Landscape_7.jpg", out_dir)
    image = load(path)
    assert image.get("vips-loader") == loader
    assert output.mime_type == mime and output.metadata["format"] == fmt
    assert (image.width, image.height) == (1800, 1200)
    assert sources.sniff_mime(path.read_bytes()[:64]) == mime
    assert mean_abs_diff(image, load(EXIF / "Landscape_1.jpg")) < 8


def test_convert_to_jpeg_flattens_alpha_onto_white(tmp_path: Path, out_dir: Path) -> None:
    source = tmp_path / "transparent.png"
    pyvips.Image.black(64, 48, bands=4).cast("uchar").pngsave(str(source))  # black, alpha 0
    _, path = run_one("convert", {"format": "jpeg"}, source, out_dir)
    image = load(path)
    assert image.bands == 3
    assert image.getpoint(10, 10) == pytest.approx([255, 255, 255], abs=2)


# --- colour and metadata --------------------------------------------------------------------------


@pytest.mark.parametrize("embed_profile", [True, False])
def test_cmyk_jpeg_becomes_srgb(embed_profile: bool, tmp_path: Path, out_dir: Path) -> None:
    source = tmp_path / "cmyk.jpg"
    original = pyvips.Image.new_from_file(str(EXIF / "Landscape_1.jpg"))
    cmyk = original.icc_transform("cmyk")
    cmyk.jpegsave(str(source), keep="icc" if embed_profile else "none")
    assert load(source).interpretation == "cmyk"

    for operation, params in [("thumbnail", {"size": 256}), ("convert", {"format": "png"})]:
        _, path = run_one(operation, params, source, out_dir)
        image = load(path)
        assert image.interpretation == "srgb" and image.bands == 3
        assert abs(image.avg() - original.avg()) < 6
        assert mean_abs_diff(image, original) < 8


def test_plain_srgb_skips_the_colour_transform_and_a_profile_keeps_it(tmp_path: Path, out_dir: Path) -> None:
    """The plain path (8-bit sRGB, no ICC profile) gives the very pixels of the colour-managed
    one; a Display P3 photo still goes through the transform to sRGB."""
    plain = EXIF / "Landscape_1.jpg"
    assert sources.open_source(plain, LIMITS).plain_srgb
    _, path = run_one("thumbnail", {"size": 256}, plain, out_dir)
    managed = tmp_path / "managed.webp"
    pyvips.Image.thumbnail(str(plain), 256, output_profile="srgb").webpsave(str(managed), keep="none")
    assert (load(path) - load(managed)).abs().max() == 0  # the same pixels into the same encoder

    p3 = tmp_path / "p3.jpg"
    original = pyvips.Image.new_from_file(str(plain))
    original.icc_transform("p3", input_profile="srgb").jpegsave(str(p3), keep="icc", Q=95)
    assert not sources.open_source(p3, LIMITS).plain_srgb
    _, path = run_one("convert", {"format": "png"}, p3, out_dir)
    image = load(path)
    assert not image.get_typeof("icc-profile-data")
    # Back in sRGB (mean colour difference measured 0.74 of 255); P3 numbers read as sRGB: 2.28.
    assert (image - original).abs().avg() < 1.2
    assert (pyvips.Image.new_from_file(str(p3)) - original).abs().avg() > 1.8


def test_metadata_is_stripped(tmp_path: Path, out_dir: Path) -> None:
    source = tmp_path / "gps.jpg"
    image = pyvips.Image.new_from_file(str(EXIF / "Landscape_6.jpg")).copy()
    image.set_type(pyvips.GValue.gstr_type, "exif-ifd3-GPSLatitudeRef", "N")
    image.set_type(pyvips.GValue.gstr_type, "exif-ifd0-Artist", "Jane Doe")
    image.set_type(pyvips.GValue.blob_type, "xmp-data", b'<x:xmpmeta xmlns:x="adobe:ns:meta/"/>')
    image.jpegsave(str(source))
    assert "exif-ifd3-GPSLatitudeRef" in load(source).get_fields()

    for operation, params in [
        ("thumbnail", {"size": 256}),
        ("compress", {"quality": 50}),
        ("convert", {"format": "png"}),
        ("convert", {"format": "avif"}),
        ("resize", {"width": 300, "format": "webp"}),
    ]:
        _, path = run_one(operation, params, source, out_dir)
        fields = load(path).get_fields()
        leaked = [f for f in fields if f.startswith(("exif", "xmp", "iptc", "icc")) or f == "orientation"]
        assert leaked == [], (operation, leaked)
        data = path.read_bytes()
        assert b"Jane Doe" not in data and b"xmpmeta" not in data
        assert load(path).width > load(path).height  # upright without an orientation tag


# Marker bytes of metadata containers: JPEG APP1 Exif/XMP and APP2 ICC, PNG text/EXIF/ICC chunks,
# WebP EXIF/XMP/ICCP chunks, HEIF Exif items and XMP packets.
METADATA_MARKERS = (
    b"Exif",
    b"ICC_PROFILE",
    b"iCCP",
    b"tEXt",
    b"zTXt",
    b"iTXt",
    b"eXIf",
    b"EXIF",
    b"ICCP",
    b"XMP ",
)


@pytest.mark.parametrize("container", ["jpeg", "png"])
def test_no_output_format_carries_metadata(container: str, tmp_path: Path, out_dir: Path) -> None:
    source = tmp_path / f"meta.{container}"
    image = pyvips.Image.new_from_file(str(EXIF / "Landscape_1.jpg")).icc_transform("srgb").copy()
    image.set_type(pyvips.GValue.gstr_type, "exif-ifd3-GPSLatitudeRef", "N")
    image.set_type(pyvips.GValue.gstr_type, "exif-ifd3-GPSLatitude", "51/1 30/1 1234/100")
    image.set_type(pyvips.GValue.gstr_type, "exif-ifd0-Artist", "Jane Doe")
    image.set_type(pyvips.GValue.blob_type, "xmp-data", b'<x:xmpmeta xmlns:x="adobe:ns:meta/"/>')
    image.set_type(pyvips.GValue.gstr_type, "png-comment-0-Comment", "Secret comment")
    getattr(image, f"{container}save")(str(source), keep="all")
    fields = load(source).get_fields()
    assert {"exif-ifd3-GPSLatitude", "xmp-data", "icc-profile-data"} <= set(fields)
    if container == "png":
        assert any(f.startswith("png-comment-") for f in fields)

    for fmt in ("jpeg", "png", "webp", "avif"):
        _, path = run_one("convert", {"format": fmt}, source, out_dir)
        leaked = [
            f for f in load(path).get_fields() if f.startswith(("exif", "xmp", "iptc", "icc", "png-comment"))
        ]
        assert leaked == [], (fmt, leaked)
        data = path.read_bytes()
        assert [m for m in METADATA_MARKERS if m in data] == [], fmt
        assert b"Jane Doe" not in data and b"xmpmeta" not in data and b"Secret" not in data


def test_animated_gif_gives_the_first_frame(tmp_path: Path, out_dir: Path) -> None:
    source = tmp_path / "anim.gif"
    frames = [
        pyvips.Image.black(40, 30).new_from_image(colour).cast("uchar")
        for colour in ([255, 0, 0], [0, 255, 0], [0, 0, 255])
    ]
    animation = pyvips.Image.arrayjoin(frames, across=1).copy()
    animation.set_type(pyvips.GValue.gint_type, "page-height", 30)
    animation.set_type(pyvips.GValue.array_int_type, "delay", [100, 100, 100])
    animation.gifsave(str(source))
    assert pyvips.Image.new_from_file(str(source), n=-1).get("n-pages") == 3

    output, path = run_one("thumbnail", {"size": 256}, source, out_dir)
    image = pyvips.Image.new_from_file(str(path), n=-1)
    assert (image.width, image.height) == (40, 30)  # one frame, not enlarged
    assert not image.get_typeof("n-pages") or image.get("n-pages") == 1
    assert image.getpoint(20, 15)[:3] == pytest.approx([255, 0, 0], abs=8)
    assert output.metadata["source_pages"] == 3

    output, path = run_one("convert", {"format": "webp"}, source, out_dir)
    assert (load(path).width, load(path).height) == (40, 30)


def test_frames_beyond_the_page_limit_are_refused_from_the_header(tmp_path: Path, out_dir: Path) -> None:
    source = tmp_path / "anim.gif"
    frames = [
        pyvips.Image.black(20, 10).new_from_image([level, 0, 0]).cast("uchar") for level in range(0, 250, 50)
    ]
    animation = pyvips.Image.arrayjoin(frames, across=1).copy()
    animation.set_type(pyvips.GValue.gint_type, "page-height", 10)
    animation.gifsave(str(source))
    limits = ops.ImageLimits(
        max_pixels=LIMITS.max_pixels, max_input_bytes=LIMITS.max_input_bytes, max_pages=4
    )
    assert run_error(source, out_dir, limits).error_code == "INPUT_TOO_MANY_PAGES"
    limits = ops.ImageLimits(
        max_pixels=LIMITS.max_pixels, max_input_bytes=LIMITS.max_input_bytes, max_pages=5
    )
    (output,) = ops.run("thumbnail", {"size": 64}, source, out_dir, limits)
    assert output.metadata["source_pages"] == 5


# --- refused input ----------------------------------------------------------------------------------


def run_error(input_path: Path, out_dir: Path, limits: ops.ImageLimits = LIMITS) -> PermanentJobError:
    with pytest.raises(PermanentJobError) as err:
        ops.run("thumbnail", {"size": 64}, input_path, out_dir, limits)
    assert os.listdir(out_dir) == []
    return err.value


def test_random_bytes_are_unsupported(tmp_path: Path, out_dir: Path) -> None:
    source = tmp_path / "noise.jpg"
    source.write_bytes(os.urandom(4096).replace(b"\xff\xd8", b"\x00\x00"))
    assert run_error(source, out_dir).error_code == "UNSUPPORTED_FORMAT"


@pytest.mark.parametrize(
    "content",
    [
        b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n",
        b'<svg:g xmlns:svg="http://www.w3.org/2000/svg"/>',
        b"P6\n10 10\n255\n" + b"\0" * 300,
        b"1 2 3\n4 5 6\n",
        b"",
    ],
)
def test_formats_outside_the_allowlist_are_unsupported(content: bytes, tmp_path: Path, out_dir: Path) -> None:
    source = tmp_path / "input.png"
    source.write_bytes(content)
    assert run_error(source, out_dir).error_code == "UNSUPPORTED_FORMAT"


def test_truncated_jpeg_is_corrupt(tmp_path: Path, out_dir: Path) -> None:
    source = tmp_path / "truncated.jpg"
    data = (EXIF / "Landscape_1.jpg").read_bytes()
    source.write_bytes(data[: len(data) // 2])
    error = run_error(source, out_dir)
    assert error.error_code == "CORRUPT_INPUT"
    assert str(tmp_path) not in error.public_message


def test_truncated_png_is_corrupt_not_a_partial_image(tmp_path: Path, out_dir: Path) -> None:
    source = tmp_path / "truncated.png"
    data = pyvips.Image.thumbnail(str(EXIF / "Landscape_1.jpg"), 400).pngsave_buffer()
    source.write_bytes(data[: len(data) * 2 // 3])
    for operation, params in [("thumbnail", {"size": 64}), ("convert", {"format": "webp"})]:
        with pytest.raises(PermanentJobError) as err:
            ops.run(operation, params, source, out_dir, LIMITS)
        assert err.value.error_code == "CORRUPT_INPUT"
    assert os.listdir(out_dir) == [] or all(
        (out_dir / name).stat().st_size == 0 for name in os.listdir(out_dir)
    )


def test_png_magic_with_garbage_is_corrupt(tmp_path: Path, out_dir: Path) -> None:
    source = tmp_path / "garbage.png"
    source.write_bytes(b"\x89PNG\r\n\x1a\n" + os.urandom(512))
    assert run_error(source, out_dir).error_code == "CORRUPT_INPUT"


def test_pixel_bomb_fails_fast_from_the_header(tmp_path: Path, out_dir: Path) -> None:
    source = tmp_path / "bomb.png"
    write_png_header(source, 100_000, 100_000)
    started = time.perf_counter()
    assert run_error(source, out_dir).error_code == "INPUT_TOO_LARGE_PIXELS"
    assert time.perf_counter() - started < 0.5


def test_input_bigger_than_the_byte_limit(out_dir: Path) -> None:
    limits = ops.ImageLimits(max_pixels=LIMITS.max_pixels, max_input_bytes=1000)
    assert run_error(EXIF / "Landscape_1.jpg", out_dir, limits).error_code == "INPUT_TOO_LARGE"


# --- SVG ----------------------------------------------------------------------------------------------

NS = 'xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink"'


def data_uri(mime: str, data: bytes) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def blue_png(width: int = 8, height: int = 6) -> bytes:
    return bytes(pyvips.Image.black(width, height).new_from_image([0, 0, 255]).cast("uchar").pngsave_buffer())


def write_svg(tmp_path: Path, body: str, size: str = 'width="40" height="30"') -> Path:
    source = tmp_path / "input.svg"
    source.write_text(f"<svg {NS} {size}>{body}</svg>")
    return source


def test_svg_with_an_id_reference_and_a_data_png_renders(tmp_path: Path, out_dir: Path) -> None:
    source = write_svg(
        tmp_path,
        '<defs><linearGradient id="g"><stop offset="0" stop-color="#f00"/><stop offset="1" stop-color="#f00"/>'
        '</linearGradient><rect id="r" width="20" height="30"/></defs>'
        '<use href="#r" style="fill: url(#g)"/>'
        f'<image x="20" width="20" height="30" xlink:href="{data_uri("image/png", blue_png())}" '
        'preserveAspectRatio="none"/>',
    )
    output, path = run_one("convert", {"format": "png"}, source, out_dir)
    image = load(path)
    assert (image.width, image.height) == (40, 30) == (output.metadata["width"], output.metadata["height"])
    assert output.metadata["source_format"] == "svg" and output.metadata["source_pages"] == 1
    assert image.getpoint(5, 15)[:3] == pytest.approx([255, 0, 0], abs=2)
    assert image.getpoint(30, 15)[:3] == pytest.approx([0, 0, 255], abs=2)

    output, path = run_one("resize", {"width": 80}, source, out_dir)
    assert (load(path).width, load(path).height) == (80, 60) and output.mime_type == "image/png"
    output, path = run_one("thumbnail", {"size": 256}, source, out_dir)
    assert (load(path).width, load(path).height) == (40, 30)  # never enlarged


def test_svgload_is_blocked_except_for_a_vetted_document(tmp_path: Path, out_dir: Path) -> None:
    document = f'<svg {NS} width="4" height="3"><rect width="4" height="3"/></svg>'.encode()
    source = tmp_path / "input.svg"
    source.write_bytes(document)
    run_one("thumbnail", {"size": 64}, source, out_dir)
    for load_svg in (
        lambda: pyvips.Image.new_from_buffer(document, ""),
        lambda: pyvips.Image.svgload_buffer(document),
        lambda: pyvips.Image.svgload(str(source)),
    ):
        with pytest.raises(pyvips.Error):
            load_svg().avg()


def test_svg_with_a_w3c_doctype_and_no_namespace_still_renders(tmp_path: Path, out_dir: Path) -> None:
    source = tmp_path / "input.svg"
    source.write_text(
        '<?xml version="1.0" encoding="UTF-8" standalone="no"?>\n'
        '<!DOCTYPE svg PUBLIC "-//W3C//DTD SVG 1.1//EN" "http://www.w3.org/Graphics/SVG/1.1/DTD/svg11.dtd">\n'
        '<!-- made by hand --><svg width="10mm" height="1in" viewBox="0 0 10 20"><rect width="10" height="20"/></svg>'
    )
    output, _ = run_one("convert", {"format": "png"}, source, out_dir)
    assert (output.metadata["width"], output.metadata["height"]) == (28, 72)  # 72 dpi


HOSTILE_SVG = {
    "xxe": ('<!DOCTYPE svg [<!ENTITY x SYSTEM "file:///etc/passwd">]>', "<text>&x;</text>", "SVG_FORBIDDEN"),
    "parameter entity": (
        '<!DOCTYPE svg [<!ENTITY % p SYSTEM "http://127.0.0.1:9/x.dtd"> %p;]>',
        "",
        "SVG_FORBIDDEN",
    ),
    "billion laughs": (
        '<!DOCTYPE svg [<!ENTITY a "aaaa"><!ENTITY b "&a;&a;&a;&a;">]>',
        "<text>&b;</text>",
        "SVG_FORBIDDEN",
    ),
    "attribute default": (
        '<!DOCTYPE svg [<!ATTLIST image href CDATA "file:///etc/passwd">]>',
        "<image/>",
        "SVG_FORBIDDEN",
    ),
    "foreign dtd": ('<!DOCTYPE svg SYSTEM "http://127.0.0.1:9/x.dtd">', "", "SVG_EXTERNAL_REFERENCE"),
    "xinclude": (
        "",
        '<text><xi:include xmlns:xi="http://www.w3.org/2001/XInclude" href="/etc/passwd" parse="text"/></text>',
        "SVG_FORBIDDEN",
    ),
    "xinclude namespace": ("", '<g xmlns:xi="http://www.w3.org/2001/XInclude"/>', "SVG_FORBIDDEN"),
    "http image": ("", '<image href="http://127.0.0.1:9/x.png"/>', "SVG_EXTERNAL_REFERENCE"),
    "file image": ("", '<image xlink:href="file:///etc/passwd"/>', "SVG_EXTERNAL_REFERENCE"),
    "character reference": ("", '<image href="&#x66;ile:///etc/passwd"/>', "SVG_EXTERNAL_REFERENCE"),
    "relative use": ("", '<use href="other.svg#shape"/>', "SVG_EXTERNAL_REFERENCE"),
    "empty href": ("", '<use href=""/>', "SVG_EXTERNAL_REFERENCE"),
    "hyperlink": (
        "",
        '<a href="https://example.com/"><rect width="4" height="4"/></a>',
        "SVG_EXTERNAL_REFERENCE",
    ),
    "xml:base": ("", '<g xml:base="file:///etc/"><use href="#passwd"/></g>', "SVG_EXTERNAL_REFERENCE"),
    "css import": ("", "<style>@import url(http://127.0.0.1:9/a.css);</style>", "SVG_EXTERNAL_REFERENCE"),
    "css import string": ("", '<style><![CDATA[@IMPORT "a.css";]]></style>', "SVG_EXTERNAL_REFERENCE"),
    "css url": ("", '<style>rect { fill: URL( "http://127.0.0.1:9/#g" ) }</style>', "SVG_EXTERNAL_REFERENCE"),
    "style attribute url": (
        "",
        "<rect style=\"fill:url('file:///etc/passwd#g')\"/>",
        "SVG_EXTERNAL_REFERENCE",
    ),
    "presentation attribute url": ("", '<rect filter="url(f.svg#f)"/>', "SVG_EXTERNAL_REFERENCE"),
    "unterminated url": ("", '<rect fill="url(#g"/>', "SVG_EXTERNAL_REFERENCE"),
    "css escape": ("", '<rect fill="\\75 rl(http://127.0.0.1:9/#g)"/>', "SVG_FORBIDDEN"),
    "xml-stylesheet": (
        '<?xml-stylesheet type="text/css" href="http://127.0.0.1:9/s.css"?>',
        "",
        "SVG_EXTERNAL_REFERENCE",
    ),
    "processing instruction": ("<?render fast?>", "", "SVG_FORBIDDEN"),
    "script": ("", "<script>alert(1)</script>", "SVG_FORBIDDEN"),
    "foreignObject": (
        "",
        '<foreignObject><p xmlns="http://www.w3.org/1999/xhtml">x</p></foreignObject>',
        "SVG_FORBIDDEN",
    ),
    "nested svg": ("", f'<image href="{data_uri("image/svg+xml", b"<svg/>")}"/>', "SVG_FORBIDDEN"),
    "data gif": ("", '<image href="data:image/gif;base64,R0lGODlhAQABAAAAACw="/>', "SVG_FORBIDDEN"),
    "data not base64": ("", '<image href="data:image/png,%89PNG"/>', "SVG_FORBIDDEN"),
    "data mislabelled": (
        "",
        f'<image href="{data_uri("image/png", b"GIF89a" + bytes(20))}"/>',
        "SVG_FORBIDDEN",
    ),
    "data bad base64": ("", '<image href="data:image/png;base64,@@@@"/>', "CORRUPT_INPUT"),
    "latin-1": ('<?xml version="1.0" encoding="ISO-8859-1"?>', "", "SVG_FORBIDDEN"),
    "malformed": ("", "<rect>", "CORRUPT_INPUT"),
    "undefined entity": ("", "<text>&nbsp;</text>", "CORRUPT_INPUT"),
}


@pytest.mark.parametrize(("prolog", "body", "code"), HOSTILE_SVG.values(), ids=HOSTILE_SVG.keys())
def test_svg_that_is_not_self_contained_is_refused(
    prolog: str, body: str, code: str, tmp_path: Path, out_dir: Path
) -> None:
    source = tmp_path / "input.svg"
    source.write_text(f'{prolog}<svg {NS} width="40" height="30">{body}</svg>')
    error = run_error(source, out_dir)
    assert error.error_code == code
    assert "passwd" not in error.public_message and "127.0.0.1" not in error.public_message


def test_svg_that_is_not_utf8_is_corrupt(tmp_path: Path, out_dir: Path) -> None:
    source = tmp_path / "input.svg"
    source.write_bytes(f"<svg {NS}><text>".encode() + b"\xff\xfe</text></svg>")
    assert run_error(source, out_dir).error_code == "CORRUPT_INPUT"


@pytest.mark.parametrize(
    "size",
    [
        'width="100000" height="100000"',
        'width="2000in" height="2000in"',
        'viewBox="0 0 100000 100000"',
        'width="100%" viewBox="0,0,100000,100000"',
        "",  # no size at all: librsvg measures the content, libvips' header is checked
    ],
)
def test_svg_pixel_bomb_is_refused_before_rendering(size: str, tmp_path: Path, out_dir: Path) -> None:
    source = write_svg(tmp_path, '<rect width="100000" height="100000" filter="url(#b)"/>', size)
    started = time.perf_counter()
    assert run_error(source, out_dir).error_code == "INPUT_TOO_LARGE_PIXELS"
    assert time.perf_counter() - started < 0.5


def test_svg_embedded_images_count_against_the_pixel_limit(tmp_path: Path, out_dir: Path) -> None:
    bomb = tmp_path / "bomb.png"
    write_png_header(bomb, 100_000, 100_000)
    source = write_svg(
        tmp_path, f'<image width="4" height="3" href="{data_uri("image/png", bomb.read_bytes())}"/>'
    )
    assert run_error(source, out_dir).error_code == "INPUT_TOO_LARGE_PIXELS"

    big = data_uri("image/png", blue_png(6000, 5000))  # 30 MP each, 60 MP together
    source = write_svg(tmp_path, f'<image href="{big}"/><image href="{big}"/>')
    assert run_error(source, out_dir).error_code == "INPUT_TOO_LARGE_PIXELS"


# --- params and sniffing ------------------------------------------------------------------------------


def test_validate_params_fills_defaults() -> None:
    assert ops.validate_params("thumbnail", None) == {"size": 256}
    assert ops.validate_params("resize", {"width": 10}) == {"width": 10, "fit": "contain"}
    assert ops.validate_params("resize", {"width": 10, "height": 5, "fit": "fill", "format": "png"}) == {
        "width": 10,
        "height": 5,
        "fit": "fill",
        "format": "png",
    }
    assert ops.validate_params("compress", {}) == {"quality": 75}
    assert ops.validate_params("convert", {"format": "avif"}) == {"format": "avif"}
    assert ops.validate_params("convert", {"format": "jpeg", "quality": 90}) == {
        "format": "jpeg",
        "quality": 90,
    }


@pytest.mark.parametrize(
    ("operation", "params", "code"),
    [
        ("sharpen", {}, "UNKNOWN_OPERATION"),
        ("thumbnail", {"size": 0}, "INVALID_PARAMS"),
        ("thumbnail", {"size": 4097}, "INVALID_PARAMS"),
        ("thumbnail", {"size": True}, "INVALID_PARAMS"),
        ("thumbnail", {"size": 25.0}, "INVALID_PARAMS"),
        ("thumbnail", {"size": "256"}, "INVALID_PARAMS"),
        ("thumbnail", {"width": 10}, "INVALID_PARAMS"),
        ("thumbnail", [], "INVALID_PARAMS"),
        ("resize", {}, "INVALID_PARAMS"),
        ("resize", {"width": 16385}, "INVALID_PARAMS"),
        ("resize", {"width": 10, "fit": "cover"}, "INVALID_PARAMS"),
        ("resize", {"height": 10, "fit": "fill"}, "INVALID_PARAMS"),
        ("resize", {"width": 10, "fit": "stretch"}, "INVALID_PARAMS"),
        ("resize", {"width": 10, "format": "gif"}, "INVALID_PARAMS"),
        ("compress", {"quality": 101}, "INVALID_PARAMS"),
        ("compress", {"quality": 0}, "INVALID_PARAMS"),
        ("convert", {}, "INVALID_PARAMS"),
        ("convert", {"format": "tiff"}, "INVALID_PARAMS"),
        ("convert", {"format": "png", "quality": -1}, "INVALID_PARAMS"),
    ],
)
def test_validate_params_rejects(operation: str, params: dict, code: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        ops.validate_params(operation, params)
    assert err.value.error_code == code


def test_run_validates_params_too(out_dir: Path) -> None:
    with pytest.raises(InvalidArgument):
        ops.run("thumbnail", {"size": -1}, EXIF / "Landscape_1.jpg", out_dir, LIMITS)


@pytest.mark.parametrize(
    ("head", "mime"),
    [
        (b"\xff\xd8\xff\xe0\x00\x10JFIF", "image/jpeg"),
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "image/png"),
        (b"RIFF\x24\x00\x00\x00WEBPVP8 ", "image/webp"),
        (b"GIF89a\x01\x00", "image/gif"),
        (b"GIF87a\x01\x00", "image/gif"),
        (b"II*\x00\x08\x00\x00\x00", "image/tiff"),
        (b"MM\x00*\x00\x00\x00\x08", "image/tiff"),
        (b"\x00\x00\x00\x1cftypavif\x00\x00\x00\x00avifmif1miaf", "image/avif"),
        (b"\x00\x00\x00\x1cftypmif1\x00\x00\x00\x00mif1avifmiaf", "image/avif"),
        (b"\x00\x00\x00\x18ftypheic\x00\x00\x00\x00mif1heic", "image/heif"),
        (b"\x00\x00\x00\x18ftypmif1\x00\x00\x00\x00mif1heic", "image/heif"),
        (b"\x00\x00\x00\x18ftypisom\x00\x00\x02\x00isomiso2", None),
        (b"<svg xmlns=", "image/svg+xml"),
        (b'<?xml version="1.0"?>\n<!-- x -->\n<svg width="1">', "image/svg+xml"),
        (b"<svgx>", None),
        (b"%PDF-1.7", None),
        (b"BM\x36\x00", None),
        (b"", None),
    ],
)
def test_sniff_mime(head: bytes, mime: str | None) -> None:
    assert sources.sniff_mime(head) == mime


@pytest.mark.parametrize(
    "detail",
    [
        "heifsave: Failed to allocate context buffers",  # libaom under RLIMIT_AS (a 100 MP AVIF)
        "vips_tracked_malloc: out of memory --- size == 400MB",
        "GLib: failed to allocate 1048576 bytes",
    ],
)
def test_allocation_failures_are_resource_limits_not_corrupt_input(detail: str) -> None:
    with pytest.raises(MemoryError):
        sources.reraise_vips_error(pyvips.Error("save failed", detail))
    with pytest.raises(PermanentJobError) as corrupt:
        sources.reraise_vips_error(pyvips.Error("load failed", "Premature end of JPEG file"))
    assert corrupt.value.error_code == "CORRUPT_INPUT"
