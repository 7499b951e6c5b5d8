"""Issue 14: no document shape brings a host file into an office conversion's PDF. A canary (a
text file, a magenta PNG and an SVG, world-readable, each with a unique marker) is planted in a
fresh directory under ``/srv`` and in another job's input directory; hostile documents reference
it from every place found so far (a paragraph background, an embedded object's own content, an
SVG picture, a linked section, Word and RTF fields, a package inside the package). Each is run
through the check and a real listener (refused ``LINKED_CONTENT_NOT_ALLOWED`` or converted
without the canary), and straight to a listener *past* the check, where only its Landlock view
(:func:`hypermedia.engines.documents.office.listener_view`) stands between LibreOffice and the file. A
control run without the view proves the documents do draw the canary, and a probe run under the
listener's confinement proves it cannot open the canary at all."""

from __future__ import annotations

import asyncio
import io
import json
import os
import secrets
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pypdfium2 as pdfium
import pytest
from PIL import Image

from hypermedia.core import config
from hypermedia.engines.documents import filters, office
from hypermedia.engines.documents.office import OfficeListener, OfficePool
from hypermedia.engines.documents.settings import OfficeSettings
from hypermedia.sandbox import landlock
from tests.helpers.office import (
    DOCX_MIME,
    IS_ROOT,
    LISTENER_UID,
    ODT_MIME,
    docx,
    docx_linked_picture,
    odt,
    odt_background,
    rtf_includepicture,
)

pytestmark = [
    pytest.mark.skipif(shutil.which("soffice") is None, reason="LibreOffice is not installed"),
    pytest.mark.skipif(landlock.abi_version() == 0, reason="the kernel has no Landlock"),
]

RTF = "application/rtf"
MAGENTA = (255, 0, 255)


@dataclass(frozen=True)
class Canary:
    marker: str
    text: Path
    png: Path
    svg: Path
    other_job_png: Path


@pytest.fixture
def canary(tmp_path: Path) -> Iterator[Canary]:
    marker = f"HMCANARY{secrets.token_hex(6).upper()}"
    root = Path("/srv") / f"hm-canary-{os.getpid()}-{secrets.token_hex(3)}"
    root.mkdir(mode=0o755, parents=True)
    # Outside /tmp, as a worker's work directory is: a listener's mount namespace covers /tmp.
    other_job = root / "work" / "jobs" / "other-job" / "input"
    other_job.mkdir(parents=True)
    try:
        text = root / "canary.txt"
        text.write_text(f"{marker} the host's secret\n")
        png = root / "canary.png"
        Image.new("RGB", (64, 64), MAGENTA).save(png)
        svg = root / "canary.svg"
        svg.write_text(
            '<svg xmlns="http://www.w3.org/2000/svg" width="200" height="60">'
            '<rect width="200" height="60" fill="#ff00ff"/>'
            f'<text x="5" y="40" font-size="20">{marker}</text></svg>'
        )
        other = other_job / "canary.png"
        shutil.copyfile(png, other)
        for path in (text, png, svg, other):
            path.chmod(0o644)
        for path in (*other_job.relative_to(root).parents, other_job.relative_to(root)):
            (root / path).chmod(0o755)
        yield Canary(marker, text, png, svg, other)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _image_frame(href: str) -> str:
    return (
        '<draw:frame draw:name="f" svg:width="4cm" svg:height="4cm" text:anchor-type="as-char">'
        f'<draw:image xlink:href="{href}" xlink:type="simple" xlink:show="embed" xlink:actuate="onLoad"/>'
        "</draw:frame>"
    )


def odt_with_embedded_object(href: str) -> bytes:
    """An ODT whose embedded drawing object (``Object 1``, its own content) links the image:
    the place the check did not read."""
    draw = (
        '<?xml version="1.0" encoding="UTF-8"?><office:document-content '
        'xmlns:office="urn:oasis:names:tc:opendocument:xmlns:office:1.0" '
        'xmlns:draw="urn:oasis:names:tc:opendocument:xmlns:drawing:1.0" '
        'xmlns:text="urn:oasis:names:tc:opendocument:xmlns:text:1.0" '
        'xmlns:svg="urn:oasis:names:tc:opendocument:xmlns:svg-compatible:1.0" '
        'xmlns:xlink="http://www.w3.org/1999/xlink" office:version="1.2"><office:body><office:drawing>'
        f'<draw:page draw:name="p">{_image_frame(href).replace("as-char", "page")}</draw:page>'
        "</office:drawing></office:body></office:document-content>"
    )
    return odt(
        '<text:p><draw:frame draw:name="o" svg:width="6cm" svg:height="6cm" text:anchor-type="as-char">'
        '<draw:object xlink:href="./Object 1" xlink:type="simple" xlink:show="embed" xlink:actuate="onLoad"/>'
        "</draw:frame></text:p>",
        {"Object 1/content.xml": draw.encode()},
    )


def odt_with_svg_picture(href: str) -> bytes:
    """An ODT whose embedded SVG picture references the file."""
    svg = (
        '<svg xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink" width="100" height="100">'
        f'<image xlink:href="{href}" width="100" height="100"/></svg>'
    )
    return odt(f"<text:p>{_image_frame('Pictures/p.svg')}</text:p>", {"Pictures/p.svg": svg.encode()})


def odt_with_section(href: str) -> bytes:
    return odt(f'<text:section text:name="s"><text:section-source xlink:href="{href}"/></text:section>')


def rtf_includetext(target: str) -> bytes:
    return ('{\\rtf1\\ansi T {\\field{\\*\\fldinst INCLUDETEXT "' + target + '"}{\\fldrslt }}}').encode()


def docx_with_field(instruction: str) -> bytes:
    """The tests' DOCX with a simple field in its body."""
    source, out = io.BytesIO(docx(["x"])), io.BytesIO()
    with zipfile.ZipFile(source) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        for item in src.infolist():
            data = src.read(item)
            if item.filename == "word/document.xml":
                field = (
                    f'<w:p><w:fldSimple w:instr="{instruction}"><w:r><w:t>f</w:t></w:r></w:fldSimple></w:p>'
                )
                data = data.decode().replace("<w:body>", "<w:body>" + field).encode()
            dst.writestr(item, data)
    return out.getvalue()


def docx_embedding(inner: bytes) -> bytes:
    """The tests' DOCX with ``inner`` as an embedded package."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(docx(["outer"]))) as src, zipfile.ZipFile(out, "w") as dst:
        for item in src.infolist():
            dst.writestr(item, src.read(item))
        dst.writestr("word/embeddings/inner.docx", inner)
    return out.getvalue()


def rtf_includepicture_doubled_brace(target: str) -> bytes:
    """The hostile review's RTF (issue 14, F1): the instruction in a group inside a group, which
    a pattern over the bytes did not see; LibreOffice follows it."""
    return (
        "{\\rtf1\\ansi\\deff0{\\fonttbl{\\f0 Arial;}}\\pard Before {\\field{\\*\\fldinst{{ INCLUDEPICTURE "
        f'"{target}" \\\\d}}}}}}{{\\fldrslt{{x}}}}}} After\\par}}'
    ).encode()


def docx_hyperlink_typed_picture(target: str) -> bytes:
    """The hostile review's DOCX (issue 14, F2): an external relationship of the hyperlink type
    that an ``a:blip r:link`` names; LibreOffice's oox filter draws it as a linked image."""
    return docx_linked_picture(
        "http://schemas.openxmlformats.org/officeDocument/2006/relationships/hyperlink", target
    )


def hostile(c: Canary) -> list[tuple[str, bytes, str]]:
    png, svg, text, other = (p.as_uri() for p in (c.png, c.svg, c.text, c.other_job_png))
    return [
        ("background", odt_background(png), ODT_MIME),
        ("background-other-job", odt_background(other), ODT_MIME),
        ("background-svg", odt_background(svg), ODT_MIME),
        ("embedded-object-image", odt_with_embedded_object(png), ODT_MIME),
        ("svg-picture-image", odt_with_svg_picture(png), ODT_MIME),
        ("section-source", odt_with_section(text), ODT_MIME),
        ("rtf-includepicture", rtf_includepicture(png), RTF),
        ("rtf-includepicture-svg", rtf_includepicture(svg), RTF),
        ("rtf-includetext", rtf_includetext(str(c.text)), RTF),
        ("rtf-includepicture-doubled-brace", rtf_includepicture_doubled_brace(png), RTF),
        ("docx-includepicture", docx_with_field(f"INCLUDEPICTURE &quot;{c.png}&quot; \\d"), DOCX_MIME),
        ("docx-includetext", docx_with_field(f"INCLUDETEXT &quot;{c.text}&quot;"), DOCX_MIME),
        ("docx-hyperlink-typed-picture", docx_hyperlink_typed_picture(png), DOCX_MIME),
        (
            "nested-package",
            docx_embedding(docx_with_field(f"INCLUDEPICTURE &quot;{c.png}&quot; \\d")),
            DOCX_MIME,
        ),
    ]


def magenta_pixels(pdf: bytes) -> int:
    """Pixels of the canary's colour on the PDF's pages rendered at 72 dpi."""
    total = 0
    for page in pdfium.PdfDocument(pdf):
        pixels = np.asarray(page.render(scale=1).to_pil().convert("RGB")).astype(int)
        red, green, blue = pixels[..., 0], pixels[..., 1], pixels[..., 2]
        total += int(((red > 200) & (green < 60) & (blue > 200)).sum())
    return total


def pdf_text(pdf: bytes) -> str:
    return "".join(page.get_textpage().get_text_range() for page in pdfium.PdfDocument(pdf))


def convert_all(
    tmp_path: Path, documents: list[tuple[str, bytes, str]], *, direct: bool
) -> dict[str, object]:
    """Each document through a one-listener pool (``direct``: straight to its listener, past the
    check); name → Conversion or the exception raised."""
    uid = (LISTENER_UID, LISTENER_UID) if IS_ROOT else None

    async def go() -> dict[str, object]:
        pool = OfficePool(tmp_path / "office", [uid], config.load(OfficeSettings))
        pool.start()
        await pool.started()
        results: dict[str, object] = {}
        try:
            for name, content, mime in documents:
                path = tmp_path / f"{name}.doc"
                path.write_bytes(content)
                try:
                    if direct:
                        listener = pool.listeners[0]
                        results[name] = await listener.convert(path, filters.IMPORT_FILTERS[mime], 60)
                    else:
                        results[name] = await pool.convert(path, mime, 60)
                except Exception as exc:
                    results[name] = exc
        finally:
            await pool.close()
        return results

    return asyncio.run(go())


def leaks(results: dict[str, object], marker: str) -> dict[str, str]:
    """Name → what of the canary its PDF shows (its marker, its colour)."""
    found = {}
    for name, result in results.items():
        if isinstance(result, office.Conversion):
            text, pixels = marker in pdf_text(result.pdf), magenta_pixels(result.pdf)
            if text or pixels:
                found[name] = f"marker={text} magenta_pixels={pixels}"
    return found


def test_the_check_and_the_listener_keep_every_shape_out(tmp_path: Path, canary: Canary) -> None:
    results = convert_all(tmp_path, hostile(canary), direct=False)
    codes = {n: getattr(r, "error_code", "converted") for n, r in results.items()}
    assert set(codes.values()) == {"LINKED_CONTENT_NOT_ALLOWED"}, codes
    assert leaks(results, canary.marker) == {}


def test_past_the_check_the_landlock_view_alone_keeps_the_canary_out(tmp_path: Path, canary: Canary) -> None:
    results = convert_all(tmp_path, hostile(canary), direct=True)
    converted = [n for n, r in results.items() if isinstance(r, office.Conversion)]
    assert len(converted) >= len(results) - 2, results  # LibreOffice opens nearly all of them
    assert leaks(results, canary.marker) == {}


def test_without_the_view_the_same_documents_draw_the_canary(
    tmp_path: Path, canary: Canary, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control: the listener without its Landlock view, past the check, does put the canary
    in the PDF (so the two tests above could fail)."""
    monkeypatch.setattr(OfficeListener, "_view", lambda self: None)
    shapes = {"background", "background-other-job", "rtf-includepicture", "rtf-includepicture-doubled-brace"}
    results = convert_all(tmp_path, [d for d in hostile(canary) if d[0] in shapes], direct=True)
    assert set(leaks(results, canary.marker)) == shapes, results


PROBE = """
import json, os, sys
result = {}
for path in sys.argv[1:]:
    try:
        with open(path, "rb") as fh:
            fh.read(1)
        result[path] = "read"
    except OSError as exc:
        result[path] = exc.strerror
print(json.dumps(result))
"""


def test_the_listener_cannot_open_the_canary(tmp_path: Path, canary: Canary) -> None:
    """A probe run under the listener's confinement (its spec, its Landlock view) opens what
    LibreOffice needs and nothing else: not the canary in ``/srv``, not another job's input,
    not ``/etc/hostname``."""
    uid = (LISTENER_UID, LISTENER_UID) if IS_ROOT else None
    settings = config.load(OfficeSettings)
    listener = OfficeListener("probe", tmp_path / "office", uid, settings)
    (listener.dir / "tmp").mkdir(parents=True)  # its private /tmp, as start() makes it
    if uid is not None:
        os.chown(listener.dir / "tmp", *uid)
    own = listener.dir / "own.txt"
    own.write_text("the listener's own file")
    own.chmod(0o644)
    fonts = next(Path("/usr/share/fonts").rglob("*.ttf"))
    paths = [canary.text, canary.png, canary.svg, canary.other_job_png, Path("/etc/hostname"), own, fonts]
    spec = listener.confinement([settings.python, "-I", "-c", PROBE, *map(str, paths)])
    assert spec["landlock"] is not None
    run = subprocess.run(
        [
            sys.executable,
            "-c",
            "from hypermedia.sandbox.helper import confined_exec_main; confined_exec_main()",
            json.dumps(spec),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    seen = json.loads(run.stdout)
    assert seen == {
        str(canary.text): "Permission denied",
        str(canary.png): "Permission denied",
        str(canary.svg): "Permission denied",
        str(canary.other_job_png): "Permission denied",
        "/etc/hostname": "Permission denied",
        str(own): "read",
        str(fonts): "read",
    }
    # Unconfined, every one of them is readable: the denials are the view's.
    for path in paths:
        assert path.read_bytes()
