"""OOXML and ODF documents the office tests build, and the LibreOffice helpers they share."""

from __future__ import annotations

import asyncio
import atexit
import functools
import io
import os
import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path

from hypermedia.core import config
from hypermedia.engines.documents import filters
from hypermedia.engines.documents.office import OfficePool
from hypermedia.engines.documents.settings import OfficeSettings

OFFICE_DIR = Path(__file__).resolve().parents[1] / "data" / "office"
ODT = OFFICE_DIR / "libre-office-writer.odt"
DOCX_MIME = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
ODT_MIME = "application/vnd.oasis.opendocument.text"
LOREM = (
    "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt ut "
    "labore et dolore magna aliqua. Ut enim ad minim veniam, quis nostrud exercitation ullamco. "
)


_WORD_PACKAGE_RELS = (
    '<?xml version="1.0" encoding="UTF-8"?>'
    '<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">'
    '<Relationship Id="rId1" Type="http://schemas.openxmlformats.org/officeDocument/2006/'
    'relationships/officeDocument" Target="word/document.xml"/></Relationships>'
)
"""``_rels/.rels`` of a WordprocessingML package whose main part is ``word/document.xml``."""


def docx(paragraphs: list[str], font: str = "Calibri", size_half_points: int = 22) -> bytes:
    """A minimal WordprocessingML package (ECMA-376 Part 1): one run per paragraph in ``font``
    (``w:rFonts`` on the document defaults and on every run), 11 pt by default."""
    fonts = f'<w:rFonts w:ascii="{font}" w:hAnsi="{font}" w:cs="{font}" w:eastAsia="{font}"/>'
    body = "".join(
        f'<w:p><w:r><w:rPr>{fonts}<w:sz w:val="{size_half_points}"/></w:rPr>'
        f'<w:t xml:space="preserve">{text}</w:t></w:r></w:p>'
        for text in paragraphs
    )
    w = 'xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"'
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(
            "[Content_Types].xml",
            '<?xml version="1.0" encoding="UTF-8"?>'
            '<Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types">'
            '<Default Extension="rels" ContentType="application/vnd.openxmlformats-package.relationships+xml"/>'
            '<Default Extension="xml" ContentType="application/xml"/>'
            '<Override PartName="/word/document.xml" ContentType="application/'
            'vnd.openxmlformats-officedocument.wordprocessingml.document.main+xml"/>'
            '<Override PartName="/word/styles.xml" ContentType="application/'
            'vnd.openxmlformats-officedocument.wordprocessingml.styles+xml"/></Types>',
        )
        z.writestr("_rels/.rels", _WORD_PACKAGE_RELS)
        z.writestr(
            "word/_rels/document.xml.rels",
            '<?xml version="1.0" encoding="UTF-8"?>'
            '<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">'
            '<Relationship Id="rId1" Type="http://schemas.openxmlformats.org/officeDocument/2006/'
            'relationships/styles" Target="styles.xml"/></Relationships>',
        )
        z.writestr(
            "word/styles.xml",
            f'<?xml version="1.0" encoding="UTF-8"?><w:styles {w}><w:docDefaults><w:rPrDefault>'
            f'<w:rPr>{fonts}<w:sz w:val="{size_half_points}"/></w:rPr></w:rPrDefault></w:docDefaults></w:styles>',
        )
        z.writestr(
            "word/document.xml",
            f'<?xml version="1.0" encoding="UTF-8"?><w:document {w}><w:body>{body}'
            '<w:sectPr><w:pgSz w:w="11906" w:h="16838"/>'
            '<w:pgMar w:top="1440" w:right="1440" w:bottom="1440" w:left="1440"/></w:sectPr>'
            "</w:body></w:document>",
        )
    return buffer.getvalue()


def long_odt(paragraphs: int) -> bytes:
    """An ODT of ``paragraphs`` paragraphs of 500 characters: LibreOffice lays out about 50 pages
    a second here, so 20,000 paragraphs (2,300 pages, a 110 kB file) keep it busy for about 40 s."""
    para = (LOREM * 3)[:500]
    body = "".join(f"<text:p>{i} {para}</text:p>" for i in range(paragraphs))
    content = (
        '<?xml version="1.0" encoding="UTF-8"?><office:document-content '
        'xmlns:office="urn:oasis:names:tc:opendocument:xmlns:office:1.0" '
        'xmlns:text="urn:oasis:names:tc:opendocument:xmlns:text:1.0" office:version="1.2">'
        f"<office:body><office:text>{body}</office:text></office:body></office:document-content>"
    )
    manifest = (
        '<?xml version="1.0" encoding="UTF-8"?><manifest:manifest '
        'xmlns:manifest="urn:oasis:names:tc:opendocument:xmlns:manifest:1.0" manifest:version="1.2">'
        f'<manifest:file-entry manifest:full-path="/" manifest:media-type="{ODT_MIME}"/>'
        '<manifest:file-entry manifest:full-path="content.xml" manifest:media-type="text/xml"/>'
        "</manifest:manifest>"
    )
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        z.writestr(zipfile.ZipInfo("mimetype"), ODT_MIME)
        z.writestr("content.xml", content, zipfile.ZIP_DEFLATED)
        z.writestr("META-INF/manifest.xml", manifest, zipfile.ZIP_DEFLATED)
    return buffer.getvalue()


FIGURES_CSV = b"quarter,revenue\nQ1,100\nQ2,120\n"


def written_by_libreoffice(extension: str) -> bytes:
    """A document in ``extension``'s format written by LibreOffice (cold, in the test) from a flat
    ODF text or presentation, or from a CSV for spreadsheets."""
    if extension in ("docx", "doc", "rtf", "odt"):
        return libreoffice_convert("minutes.fodt", flat_odf("text", text_body()), extension)
    if extension in ("xlsx", "xls", "ods"):
        return libreoffice_convert("figures.csv", FIGURES_CSV, extension)
    return libreoffice_convert("slides.fodp", flat_odf("presentation", SLIDES_BODY), extension)


LISTENER_UID = 59_900
"""A uid no other test uses (platforms started by tests take theirs from 100,000 up; the default
range starts at 61,000)."""


IS_ROOT = os.geteuid() == 0
_NS = {
    "office": "urn:oasis:names:tc:opendocument:xmlns:office:1.0",
    "text": "urn:oasis:names:tc:opendocument:xmlns:text:1.0",
    "draw": "urn:oasis:names:tc:opendocument:xmlns:drawing:1.0",
    "xlink": "http://www.w3.org/1999/xlink",
    "svg": "urn:oasis:names:tc:opendocument:xmlns:svg-compatible:1.0",
    "script": "urn:oasis:names:tc:opendocument:xmlns:script:1.0",
}


def odt(body: str, extra: dict[str, bytes] | None = None, head: str = "") -> bytes:
    """An ODT package (ODF 1.2 part 3) with ``body`` inside ``office:text`` and ``head`` before
    ``office:body``; ``extra`` files are added to the package and its manifest."""
    xmlns = " ".join(f'xmlns:{k}="{v}"' for k, v in _NS.items())
    content = (
        f'<?xml version="1.0" encoding="UTF-8"?><office:document-content {xmlns} office:version="1.2">'
        f"{head}<office:body><office:text>{body}</office:text></office:body></office:document-content>"
    )
    entries = "".join(
        f'<manifest:file-entry manifest:full-path="{name}" manifest:media-type="text/xml"/>'
        for name in extra or {}
    )
    manifest = (
        '<?xml version="1.0" encoding="UTF-8"?><manifest:manifest '
        'xmlns:manifest="urn:oasis:names:tc:opendocument:xmlns:manifest:1.0" manifest:version="1.2">'
        f'<manifest:file-entry manifest:full-path="/" manifest:media-type="{ODT_MIME}"/>'
        '<manifest:file-entry manifest:full-path="content.xml" manifest:media-type="text/xml"/>'
        f"{entries}</manifest:manifest>"
    )
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        z.writestr(zipfile.ZipInfo("mimetype"), ODT_MIME)
        z.writestr("content.xml", content)
        z.writestr("META-INF/manifest.xml", manifest)
        for name, data in (extra or {}).items():
            z.writestr(name, data)
    return buffer.getvalue()


def odt_with_links(image_href: str, section_href: str) -> bytes:
    """A linked (not embedded) image and a section whose content is linked from another file."""
    return odt(
        '<text:p>linked: <draw:frame draw:name="f" svg:width="2cm" svg:height="2cm" text:anchor-type="as-char">'
        f'<draw:image xlink:href="{image_href}" xlink:type="simple" xlink:show="embed" xlink:actuate="onLoad"/>'
        "</draw:frame></text:p>"
        f'<text:section text:name="s"><text:section-source xlink:href="{section_href}"/></text:section>'
    )


def run_pool(
    tmp_path: Path, uid: tuple[int, int] | None, documents: list[tuple[bytes, str]], *, direct: bool = False
) -> list[object]:
    """Starts a one-listener pool, converts ``documents`` in turn, stops it; returns each
    conversion or the exception it raised. ``direct``: hand the documents to the listener itself,
    past the pool's checks (what LibreOffice's own settings do with a document)."""
    base = tmp_path / "office"

    async def go() -> list[object]:
        pool = OfficePool(base, [uid], config.load(OfficeSettings))
        pool.start()
        await pool.started()
        results: list[object] = []
        try:
            for n, (content, mime) in enumerate(documents):
                path = tmp_path / f"doc{n}"
                path.write_bytes(content)
                try:
                    if direct:
                        results.append(
                            await pool.listeners[0].convert(path, filters.IMPORT_FILTERS[mime], 60)
                        )
                    else:
                        results.append(await pool.convert(path, mime, 60))
                except Exception as exc:
                    results.append(exc)
        finally:
            await pool.close()
        return results

    os.chmod(tmp_path, 0o755)
    return asyncio.run(go())


def odt_background(href: str) -> bytes:
    """An ODT whose paragraph style has a linked background image (LibreOffice 7.4 loads it)."""
    return odt(
        '<text:p text:style-name="P1">styled</text:p>',
        head='<office:automatic-styles><style:style xmlns:style="urn:oasis:names:tc:opendocument:xmlns:style:1.0" '
        'style:name="P1" style:family="paragraph"><style:paragraph-properties>'
        f'<style:background-image xlink:href="{href}" xlink:type="simple" xlink:actuate="onLoad"/>'
        "</style:paragraph-properties></style:style></office:automatic-styles>",
    )


def rtf_includepicture(target: str) -> bytes:
    """An RTF with an ``INCLUDEPICTURE`` field (LibreOffice 7.4 loads the picture)."""
    return (
        '{\\rtf1\\ansi PIC {\\field{\\*\\fldinst INCLUDEPICTURE "' + target + '" \\\\d}{\\fldrslt }}}'
    ).encode()


SOFFICE = shutil.which("soffice") or "/usr/lib/libreoffice/program/soffice"
_FLAT_XMLNS = (
    'xmlns:office="urn:oasis:names:tc:opendocument:xmlns:office:1.0" '
    'xmlns:text="urn:oasis:names:tc:opendocument:xmlns:text:1.0" '
    'xmlns:draw="urn:oasis:names:tc:opendocument:xmlns:drawing:1.0" '
    'xmlns:svg="urn:oasis:names:tc:opendocument:xmlns:svg-compatible:1.0" '
    'xmlns:script="urn:oasis:names:tc:opendocument:xmlns:script:1.0" '
    'xmlns:ooo="http://openoffice.org/2004/office" '
    'xmlns:xlink="http://www.w3.org/1999/xlink"'
)


TEXT = "Minutes of the meeting"
SLIDE = "Slide one"


def flat_odf(mimetype: str, body: str, scripts: str = "", prolog: str = "") -> bytes:
    """A flat ODF document (ODF 1.2 Part 1): root ``office:document`` with ``scripts``
    (the content of ``office:scripts``, none when empty) before ``office:body``."""
    script_part = f"<office:scripts>{scripts}</office:scripts>" if scripts else ""
    return (
        f'<?xml version="1.0" encoding="UTF-8"?>{prolog}<office:document {_FLAT_XMLNS} office:version="1.2" '
        f'office:mimetype="application/vnd.oasis.opendocument.{mimetype}">{script_part}'
        f"<office:body>{body}</office:body></office:document>"
    ).encode()


def text_body(text: str = TEXT, extra: str = "") -> str:
    """An ``office:text`` body: one paragraph of ``text``, then ``extra`` (ODF markup)."""
    return f"<office:text><text:p>{text}</text:p>{extra}</office:text>"


SLIDES_BODY = (
    '<office:presentation><draw:page draw:name="page1"><draw:frame svg:x="2cm" svg:y="2cm" '
    f'svg:width="10cm" svg:height="3cm"><draw:text-box><text:p>{SLIDE}</text:p></draw:text-box>'
    "</draw:frame></draw:page></office:presentation>"
)


@functools.cache
def _workdir() -> Path:
    path = Path(tempfile.mkdtemp(prefix="hm-legacy-office-"))
    atexit.register(shutil.rmtree, path, True)
    return path


def libreoffice_convert(name: str, data: bytes, target: str) -> bytes:
    """``data`` saved as ``name`` and converted by LibreOffice to ``target`` (an extension, with
    ``:filter`` when needed), in a profile of this test run's own."""
    work = _workdir()
    source_dir = Path(tempfile.mkdtemp(dir=work))
    source = source_dir / name
    source.write_bytes(data)
    out = source_dir / "out"
    command = [
        SOFFICE,
        f"-env:UserInstallation={(work / 'profile').as_uri()}",
        "--headless",
        "--norestore",
        "--convert-to",
        target,
        "--outdir",
        str(out),
        str(source),
    ]
    assert Path(SOFFICE).exists(), f"LibreOffice is needed for these tests: {SOFFICE} is missing"
    done = subprocess.run(command, capture_output=True, timeout=180, check=False)
    result = out / f"{source.stem}.{target.split(':')[0]}"
    assert result.exists(), (done.returncode, done.stdout, done.stderr)
    return result.read_bytes()


BASIC_MODULE = (
    b'<?xml version="1.0" encoding="UTF-8"?><script:module xmlns:script="http://openoffice.org/2000/script" '
    b'script:name="Module1" script:language="StarBasic">Sub Main\n  Shell("sh -c id")\nEnd Sub</script:module>'
)


BASIC_LIBRARY = {
    "Basic/script-lc.xml": b'<?xml version="1.0" encoding="UTF-8"?><library:libraries '
    b'xmlns:library="http://openoffice.org/2000/library"><library:library library:name="Standard" '
    b'library:link="false"/></library:libraries>',
    "Basic/Standard/script-lb.xml": b'<?xml version="1.0" encoding="UTF-8"?><library:library '
    b'xmlns:library="http://openoffice.org/2000/library" library:name="Standard">'
    b'<library:element library:name="Module1"/></library:library>',
    "Basic/Standard/Module1.xml": BASIC_MODULE,
}
"""A Basic library ``Standard`` with one module (:data:`BASIC_MODULE`), as LibreOffice stores it
in an ODF package: ``{path in the zip: bytes}``."""


@functools.cache
def odt_with_basic() -> bytes:
    """A LibreOffice ``.odt`` with a Basic library added the way LibreOffice stores one
    (``Basic/`` files listed in the manifest)."""
    odt = libreoffice_convert("minutes.fodt", flat_odf("text", text_body()), "odt")
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(odt)) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            data = src.read(info)
            if info.filename == "META-INF/manifest.xml":
                entries = "".join(
                    f'<manifest:file-entry manifest:full-path="{name}" manifest:media-type="text/xml"/>'
                    for name in BASIC_LIBRARY
                )
                data = data.replace(b"</manifest:manifest>", entries.encode() + b"</manifest:manifest>")
            dst.writestr(info, data)
        for name, data in BASIC_LIBRARY.items():
            dst.writestr(name, data)
    return out.getvalue()


@functools.cache
def fodt_with_basic() -> bytes:
    """LibreOffice's flat rewrite of :func:`odt_with_basic`: the library goes into
    ``office:scripts`` as ``ooo:library-embedded``/``ooo:module``/``ooo:source-code``."""
    return libreoffice_convert("minutes.odt", odt_with_basic(), "fodt")


def docx_with(document_body: str, rels: str = "") -> bytes:
    """The tests' DOCX with ``document_body`` as the body and extra document relationships."""
    source = io.BytesIO(docx(["x"]))
    out = io.BytesIO()
    with zipfile.ZipFile(source) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        for item in src.infolist():
            data = src.read(item)
            if item.filename == "word/document.xml":
                text = data.decode()
                start, end = text.index("<w:body>") + len("<w:body>"), text.index("<w:sectPr>")
                data = (text[:start] + document_body + text[end:]).encode()
            elif item.filename == "word/_rels/document.xml.rels" and rels:
                data = data.decode().replace("</Relationships>", rels + "</Relationships>").encode()
            dst.writestr(item, data)
    return out.getvalue()


_R = "http://schemas.openxmlformats.org/officeDocument/2006/relationships"


def docx_linked_picture(kind: str, target: str, attribute: str = 'r:link="rId5"', before: str = "") -> bytes:
    """The review's DOCX: an external relationship of type ``kind`` that an ``a:blip`` names
    (after ``before`` in the body)."""
    picture = (
        f'<w:p><w:r><w:drawing><wp:inline xmlns:wp="http://schemas.openxmlformats.org/drawingml/2006/wordprocessingDrawing">'
        '<wp:extent cx="1905000" cy="1905000"/><wp:docPr id="1" name="P1"/>'
        '<a:graphic xmlns:a="http://schemas.openxmlformats.org/drawingml/2006/main">'
        '<a:graphicData uri="http://schemas.openxmlformats.org/drawingml/2006/picture">'
        '<pic:pic xmlns:pic="http://schemas.openxmlformats.org/drawingml/2006/picture">'
        '<pic:nvPicPr><pic:cNvPr id="1" name="p.png"/><pic:cNvPicPr/></pic:nvPicPr>'
        f'<pic:blipFill><a:blip xmlns:r="{_R}" {attribute}/><a:stretch><a:fillRect/></a:stretch></pic:blipFill>'
        '<pic:spPr><a:xfrm><a:off x="0" y="0"/><a:ext cx="1905000" cy="1905000"/></a:xfrm>'
        '<a:prstGeom prst="rect"/></pic:spPr></pic:pic></a:graphicData></a:graphic></wp:inline></w:drawing></w:r></w:p>'
    )
    return docx_with(
        before + picture, f'<Relationship Id="rId5" Type="{kind}" Target="{target}" TargetMode="External"/>'
    )


def docx_with_external_image(url: str) -> bytes:
    """A minimal DOCX whose picture is an external relationship (``TargetMode="External"``)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(
            "[Content_Types].xml",
            '<?xml version="1.0" encoding="UTF-8"?>'
            '<Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types">'
            '<Default Extension="rels" ContentType="application/vnd.openxmlformats-package.relationships+xml"/>'
            '<Default Extension="xml" ContentType="application/xml"/>'
            '<Override PartName="/word/document.xml" ContentType="application/'
            'vnd.openxmlformats-officedocument.wordprocessingml.document.main+xml"/></Types>',
        )
        z.writestr("_rels/.rels", _WORD_PACKAGE_RELS)
        z.writestr(
            "word/_rels/document.xml.rels",
            '<?xml version="1.0" encoding="UTF-8"?>'
            '<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">'
            '<Relationship Id="rIdImg" Type="http://schemas.openxmlformats.org/officeDocument/2006/'
            f'relationships/image" Target="{url}" TargetMode="External"/></Relationships>',
        )
        z.writestr(
            "word/document.xml",
            '<?xml version="1.0" encoding="UTF-8"?>'
            '<w:document xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main" '
            'xmlns:r="http://schemas.openxmlformats.org/officeDocument/2006/relationships">'
            "<w:body><w:p><w:r><w:t>linked picture: </w:t></w:r></w:p></w:body></w:document>",
        )
    return buffer.getvalue()
