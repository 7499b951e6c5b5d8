"""hypermedia.engines.documents.links on documents the tests write: every way found to make LibreOffice
load a file or a URL (the hostile review's: an RTF INCLUDEPICTURE field and an ODT paragraph
background image drew host files into the PDF), and documents that only carry hyperlinks or
nothing external, including ones LibreOffice itself writes."""

from __future__ import annotations

import io
import shutil
import zipfile
from pathlib import Path

import olefile
import pytest

from hypermedia.engines.documents.links import (
    MAX_NESTING,
    CheckLimitExceeded,
    MalformedDocument,
    find_external_content,
)
from hypermedia.engines.documents.rtf import MAX_RTF_NESTING
from hypermedia.intake import contenttype
from tests.helpers.office import (
    _R,
    DOCX_MIME,
    ODT,
    ODT_MIME,
    docx,
    docx_linked_picture,
    docx_with,
    flat_odf,
    libreoffice_convert,
    odt,
    odt_background,
    odt_with_links,
    written_by_libreoffice,
)

RTF = "application/rtf"
HOST_IMAGE = "/usr/share/doc/some/picture.png"


def rtf(body: str) -> bytes:
    return ("{\\rtf1\\ansi\\deff0{\\fonttbl{\\f0 Arial;}}\\f0 " + body + "}").encode()


def field_runs(instruction: str) -> str:
    """A complex field split over runs as Word writes it: begin, instruction in two parts, end."""
    half = len(instruction) // 2
    return (
        '<w:p><w:r><w:fldChar w:fldCharType="begin"/></w:r>'
        f'<w:r><w:instrText xml:space="preserve"> {instruction[:half]}</w:instrText></w:r>'
        f'<w:r><w:instrText xml:space="preserve">{instruction[half:]} </w:instrText></w:r>'
        '<w:r><w:fldChar w:fldCharType="end"/></w:r></w:p>'
    )


EXTERNAL = [
    (
        "rtf-includepicture-file",
        rtf(f'{{\\field{{\\*\\fldinst INCLUDEPICTURE "{HOST_IMAGE}" \\\\d}}{{\\fldrslt }}}}'),
        RTF,
        "INCLUDEPICTURE",
    ),
    (
        "rtf-includepicture-http",
        rtf('{\\field{\\*\\fldinst {\\rtlch INCLUDEPICTURE "http://127.0.0.1:9/a.png"}}{\\fldrslt }}'),
        RTF,
        "INCLUDEPICTURE",
    ),
    (
        "rtf-includetext",
        rtf('{\\field{\\*\\fldinst includetext "/etc/hostname"}{\\fldrslt }}'),
        RTF,
        "INCLUDETEXT",
    ),
    (
        "rtf-linked-object",
        rtf("{\\object\\objautlink\\objw10\\objh10{\\*\\objclass Word.Document.8}}"),
        RTF,
        "linked object",
    ),
    (
        "odt-paragraph-background-file",
        odt_background("file:///usr/share/doc/x.png"),
        ODT_MIME,
        "background-image",
    ),
    (
        "odt-paragraph-background-http",
        odt_background("http://127.0.0.1:9/x.png"),
        ODT_MIME,
        "background-image",
    ),
    (
        "odt-linked-image-and-section",
        odt_with_links("http://127.0.0.1:9/x.png", "file:///etc/hostname"),
        ODT_MIME,
        "image",
    ),
    ("odt-relative-escape", odt_background("../../../../etc/x.png"), ODT_MIME, "background-image"),
    (
        "docx-external-image",
        docx_with(
            "<w:p/>",
            '<Relationship Id="rX" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/image" Target="file:///etc/x.png" TargetMode="External"/>',
        ),
        DOCX_MIME,
        "external image",
    ),
    (
        "docx-includepicture-split",
        docx_with(field_runs(f'INCLUDEPICTURE "{HOST_IMAGE}" \\d')),
        DOCX_MIME,
        "INCLUDEPICTURE",
    ),
    (
        "docx-fldsimple-includetext",
        docx_with('<w:p><w:fldSimple w:instr=" INCLUDETEXT &quot;/etc/hostname&quot; "/></w:p>'),
        DOCX_MIME,
        "INCLUDETEXT",
    ),
    (
        "docx-ddeauto",
        docx_with(field_runs('DDEAUTO c:\\\\windows\\\\system32\\\\cmd.exe "/k calc"')),
        DOCX_MIME,
        "DDEAUTO",
    ),
]


def _zip(parts: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in parts.items():
            z.writestr(name, data)
    return out.getvalue()


def _with_parts(package: bytes, parts: dict[str, bytes]) -> bytes:
    with zipfile.ZipFile(io.BytesIO(package)) as src:
        return _zip({**{i.filename: src.read(i) for i in src.infolist()}, **parts})


_DRAW_OBJECT = (
    '<?xml version="1.0"?><office:document-content xmlns:office="urn:oasis:names:tc:opendocument:xmlns:office:1.0" '
    'xmlns:draw="urn:oasis:names:tc:opendocument:xmlns:drawing:1.0" xmlns:xlink="http://www.w3.org/1999/xlink">'
    '<office:body><office:drawing><draw:page><draw:frame><draw:image xlink:href="{href}"/></draw:frame>'
    "</draw:page></office:drawing></office:body></office:document-content>"
)
XLSX = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"
_SML = "http://schemas.openxmlformats.org/spreadsheetml/2006/main"
_W = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"

# Issue 14: every part LibreOffice renders, not two names.
EVERY_PART = [
    (
        "odf-embedded-object-content",
        odt("<text:p/>", {"Object 1/content.xml": _DRAW_OBJECT.format(href=f"file://{HOST_IMAGE}").encode()}),
        ODT_MIME,
        "in Object 1/content.xml",
    ),
    (
        "odf-object-leaving-the-package",
        odt("<text:p/>", {"Object 1/content.xml": _DRAW_OBJECT.format(href="../../x.png").encode()}),
        ODT_MIME,
        "Object 1/content.xml",
    ),
    (
        "odf-nested-sub-document",
        odt("<text:p/>", {"Object 1/Object 2/styles.xml": _DRAW_OBJECT.format(href=HOST_IMAGE).encode()}),
        ODT_MIME,
        "Object 1/Object 2/styles.xml",
    ),
    (
        "odf-meta-template",
        odt(
            "<text:p/>",
            {"meta.xml": b'<m xmlns:xlink="http://www.w3.org/1999/xlink"><t xlink:href="/srv/t.ott"/></m>'},
        ),
        ODT_MIME,
        "meta.xml",
    ),
    (
        "odf-svg-picture",
        odt(
            "<text:p/>",
            {
                "Pictures/p.svg": f'<svg xmlns="http://www.w3.org/2000/svg"><image href="file://{HOST_IMAGE}"/></svg>'.encode()
            },
        ),
        ODT_MIME,
        "Pictures/p.svg",
    ),
    (
        "odf-svg-css-url",
        odt(
            "<text:p/>",
            {
                "Pictures/p.svg": b'<svg xmlns="http://www.w3.org/2000/svg"><style>rect{fill:url(/etc/x.svg#a)}</style></svg>'
            },
        ),
        ODT_MIME,
        "style sheet",
    ),
    (
        "odf-formula-external-reference",
        odt(
            "<text:p/>",
            {
                "Object 1/content.xml": b'<t xmlns:table="urn:oasis:names:tc:opendocument:xmlns:table:1.0"><table:table-cell table:formula="of:=[\'file:///srv/a.ods\'#$Sheet1.A1]"/></t>'
            },
        ),
        ODT_MIME,
        "file URL",
    ),
    (
        "odf-part-padded-with-white-space",
        odt(
            "<text:p/>",
            {
                "Object 1/content.xml": b" \n" * 2048
                + _DRAW_OBJECT.format(href=HOST_IMAGE).removeprefix('<?xml version="1.0"?>').encode()
            },
        ),
        ODT_MIME,
        "Object 1/content.xml",
    ),
    (
        "odf-part-in-utf-16",
        odt("<text:p/>", {"Object 1/content.xml": _DRAW_OBJECT.format(href=HOST_IMAGE).encode("utf-16")}),
        ODT_MIME,
        "Object 1/content.xml",
    ),
    (
        "odf-xml-named-as-a-picture",
        odt("<text:p/>", {"Pictures/a.png": _DRAW_OBJECT.format(href=HOST_IMAGE).encode()}),
        ODT_MIME,
        "Pictures/a.png",
    ),
    (
        "odf-dde",
        odt('<text:p><office:dde-source office:dde-application="soffice"/></text:p>'),
        ODT_MIME,
        "DDE",
    ),
    (
        "docx-field-outside-word",
        _with_parts(
            docx(["x"]),
            {
                "customXml/item9.xml": field_runs('INCLUDEPICTURE "/etc/x.png"')
                .replace("<w:p>", f'<w:p xmlns:w="{_W}">')
                .encode()
            },
        ),
        DOCX_MIME,
        "INCLUDEPICTURE field in customXml/item9.xml",
    ),
    (
        "xlsx-dde-link",
        _zip(
            {
                "xl/externalLinks/externalLink1.xml": f'<externalLink xmlns="{_SML}"><ddeLink ddeService="cmd" ddeTopic="x"/></externalLink>'.encode()
            }
        ),
        XLSX,
        "DDE link",
    ),
    (
        "xlsx-text-connection",
        _zip(
            {
                "xl/connections.xml": f'<connections xmlns="{_SML}"><connection id="1"><textPr sourceFile="/srv/data.csv"/></connection></connections>'.encode()
            }
        ),
        XLSX,
        "linked textPr",
    ),
    (
        "docx-in-docx",
        _with_parts(
            docx(["outer"]),
            {"word/embeddings/inner.docx": docx_with(field_runs(f'INCLUDEPICTURE "{HOST_IMAGE}"'))},
        ),
        DOCX_MIME,
        "INCLUDEPICTURE",
    ),
    (
        "rtf-in-docx",
        _with_parts(
            docx(["outer"]),
            {
                "word/afchunk.rtf": rtf(
                    f'{{\\field{{\\*\\fldinst INCLUDETEXT "{HOST_IMAGE}"}}{{\\fldrslt }}}}'
                )
            },
        ),
        DOCX_MIME,
        "RTF INCLUDETEXT field",
    ),
]


def review_rtf(field: str) -> bytes:
    """The hostile review's RTF around ``field`` (issue 14, F1)."""
    return ("{\\rtf1\\ansi\\deff0{\\fonttbl{\\f0 Arial;}}\\pard Before " + field + " After\\par}").encode()


_PICTURE = f'INCLUDEPICTURE "file://{HOST_IMAGE}" \\\\d'

# Issue 14, F1: shapes of RTF field that passed a pattern over the bytes (the doubled brace drew
# a host PNG into a PDF); the tokenizer reads each as LibreOffice does.
RTF_SHAPES = [
    ("doubled-brace", f"{{\\field{{\\*\\fldinst{{{{ {_PICTURE}}}}}}}{{\\fldrslt{{x}}}}}}"),
    ("hex-escape", f"{{\\field{{\\*\\fldinst{{ \\'49{_PICTURE[1:]}}}}}{{\\fldrslt{{x}}}}}}"),
    ("unicode-escape", f"{{\\field{{\\*\\fldinst{{ \\uc1\\u73?{_PICTURE[1:]}}}}}{{\\fldrslt{{x}}}}}}"),
    ("split-over-groups", f"{{\\field{{\\*\\fldinst{{ INCLUDE}}{{{_PICTURE[7:]}}}}}{{\\fldrslt{{x}}}}}}"),
    ("after-a-bookmark", f"{{\\field{{\\*\\fldinst{{\\*\\bkmkstart a}} {_PICTURE}}}{{\\fldrslt{{x}}}}}}"),
    ("quoted", f'{{\\field{{\\*\\fldinst{{ "INCLUDEPICTURE" "file://{HOST_IMAGE}"}}}}{{\\fldrslt{{x}}}}}}'),
    ("no-break-space", f"{{\\field{{\\*\\fldinst{{\\~{_PICTURE}}}}}{{\\fldrslt{{x}}}}}}"),
    ("line-break", f"{{\\field{{\\*\\fldinst\r\n{{ {_PICTURE}}}}}{{\\fldrslt{{x}}}}}}"),
    ("negative-parameter", f"{{\\field{{\\*\\fldinst{{\\f0\\fs-24 {_PICTURE}}}}}{{\\fldrslt{{x}}}}}}"),
    ("two-spaces", f"{{\\field{{\\*\\fldinst{{\\fs24  {_PICTURE}}}}}{{\\fldrslt{{x}}}}}}"),
    ("line-break-in-the-word", f"{{\\field{{\\*\\fldinst INCLUDE\r\n{_PICTURE[7:]}}}{{\\fldrslt x}}}}"),
    (
        "hex-escapes-in-a-code-page",
        "{\\ansicpg1254" + f"{{\\field{{\\*\\fldinst \\'fd{_PICTURE[1:]}}}{{\\fldrslt x}}}}}}",
    ),
    (
        "includetext-doubled-brace",
        '{\\field{\\*\\fldinst{{ INCLUDETEXT "/tmp/rv/secret.txt"}}}{\\fldrslt{x}}}',
    ),
    (
        "nested-field-inside-the-instruction",
        f"{{\\field{{\\*\\fldinst {{\\field{{\\*\\fldinst {_PICTURE}}}{{\\fldrslt x}}}}}}{{\\fldrslt y}}}}",
    ),
    (
        "command-from-a-nested-field-result",
        '{\\field{\\*\\fldinst {\\field{\\*\\fldinst QUOTE "x"}{\\fldrslt INCLUDEPICTURE}}'
        f' "file://{HOST_IMAGE}"}}{{\\fldrslt y}}}}',
    ),
    (
        "after-binary-data",
        f"{{\\field{{\\*\\fldinst {{\\bin3 }}}}}}{_PICTURE}}}{{\\fldrslt x}}}}",
    ),
    ("huge-bin-parameter", "{\\field{\\*\\fldinst {\\bin" + "9" * 5000 + " }" + _PICTURE + "}{\\fldrslt x}}"),
    ("in-a-unicode-pair", f"{{\\field{{\\*\\fldinst {{\\upr{{x}}{{\\*\\ud {_PICTURE}}}}}}}{{\\fldrslt x}}}}"),
    (
        "after-an-unknown-destination",
        f"{{\\field{{\\*\\fldinst {{\\*\\hmunknown a}}{_PICTURE}}}{{\\fldrslt x}}}}",
    ),
    ("a-picture-before-the-word", f"{{\\field{{\\*\\fldinst {{\\pict 00ab}}{_PICTURE}}}{{\\fldrslt x}}}}"),
    ("fldinst-outside-a-field", f"{{\\*\\fldinst {_PICTURE}}}"),
    ("linked-object-after-an-escape", "{\\'41}{\\object\\objlink{\\*\\objclass Excel.Sheet.8}}"),
]

# Issue 14, F2: an external relationship typed as a hyperlink, drawn as a picture.
_HYPERLINK_TYPE = "http://schemas.openxmlformats.org/officeDocument/2006/relationships/hyperlink"
_STRICT_HYPERLINK_TYPE = "http://purl.oclc.org/ooxml/officeDocument/relationships/hyperlink"


REVIEW = [
    *((f"rtf-{name}", review_rtf(field), RTF, "RTF") for name, field in RTF_SHAPES),
    (
        "docx-hyperlink-typed-picture",
        docx_linked_picture(_HYPERLINK_TYPE, f"file://{HOST_IMAGE}"),
        DOCX_MIME,
        "external hyperlink used as blip",
    ),
    (
        "docx-strict-hyperlink-typed-picture",
        docx_linked_picture(_STRICT_HYPERLINK_TYPE, f"file://{HOST_IMAGE}", 'r:embed="rId5"'),
        DOCX_MIME,
        "external hyperlink used as blip",
    ),
    (
        "docx-hyperlink-and-picture",
        docx_linked_picture(
            _HYPERLINK_TYPE,
            f"file://{HOST_IMAGE}",
            before=f'<w:hyperlink xmlns:r="{_R}" r:id="rId5"><w:r><w:t>a link</w:t></w:r></w:hyperlink>',
        ),
        DOCX_MIME,
        "external hyperlink used as blip",
    ),
    (
        "docx-vml-imagedata-relid",
        docx_with(
            '<w:p><w:r><w:pict><v:shape xmlns:v="urn:schemas-microsoft-com:vml" xmlns:o="urn:schemas-microsoft-com:office:office">'
            '<v:imagedata o:relid="rId5"/></v:shape></w:pict></w:r></w:p>',
            f'<Relationship Id="rId5" Type="{_HYPERLINK_TYPE}" Target="file://{HOST_IMAGE}" TargetMode="External"/>',
        ),
        DOCX_MIME,
        "external hyperlink used as imagedata",
    ),
    (
        "docx-type-ending-in-hyperlink",
        docx_linked_picture("urn:x/hyperlink", f"file://{HOST_IMAGE}"),
        DOCX_MIME,
        "external hyperlink (file:",
    ),
    (
        "docx-quoted-field-word",
        docx_with(field_runs(f'"INCLUDEPICTURE" "{HOST_IMAGE}"')),
        DOCX_MIME,
        "INCLUDEPICTURE",
    ),
    (
        "docx-command-from-a-nested-field-result",
        docx_with(
            '<w:p><w:r><w:fldChar w:fldCharType="begin"/></w:r>'
            '<w:r><w:fldChar w:fldCharType="begin"/></w:r><w:r><w:instrText> QUOTE "x" </w:instrText></w:r>'
            '<w:r><w:fldChar w:fldCharType="separate"/></w:r><w:r><w:t>INCLUDEPICTURE</w:t></w:r>'
            '<w:r><w:fldChar w:fldCharType="end"/></w:r>'
            f'<w:r><w:instrText xml:space="preserve"> "{HOST_IMAGE}"</w:instrText></w:r>'
            '<w:r><w:fldChar w:fldCharType="end"/></w:r></w:p>'
        ),
        DOCX_MIME,
        "INCLUDEPICTURE",
    ),
    (
        "docx-instruction-without-a-begin",
        docx_with(
            f'<w:p><w:r><w:instrText xml:space="preserve"> INCLUDETEXT "{HOST_IMAGE}"</w:instrText></w:r></w:p>'
        ),
        DOCX_MIME,
        "INCLUDETEXT",
    ),
    (
        "docx-tab-before-the-word",
        docx_with('<w:p><w:fldSimple w:instr="&#9;\\INCLUDETEXT &quot;/etc/hostname&quot;"/></w:p>'),
        DOCX_MIME,
        "INCLUDETEXT",
    ),
]


@pytest.mark.parametrize(
    ("name", "content", "mime", "fragment"),
    EXTERNAL + EVERY_PART + REVIEW,
    ids=[e[0] for e in EXTERNAL + EVERY_PART + REVIEW],
)
def test_external_content_is_found(
    tmp_path: Path, name: str, content: bytes, mime: str, fragment: str
) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    found = find_external_content(path, mime)
    assert found is not None and fragment in found, found


HYPERLINKS = [
    (
        "odt-hyperlink",
        odt('<text:p><text:a xlink:type="simple" xlink:href="https://example.org/">a link</text:a></text:p>'),
        ODT_MIME,
    ),
    (
        "odt-internal-image",
        odt('<text:p><draw:frame><draw:image xlink:href="Pictures/a.png"/></draw:frame></text:p>'),
        ODT_MIME,
    ),
    (
        "docx-hyperlink",
        docx_with(
            "<w:p/>",
            '<Relationship Id="rH" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/hyperlink" Target="https://example.org/" TargetMode="External"/>',
        ),
        DOCX_MIME,
    ),
    ("docx-page-field", docx_with(field_runs("PAGE \\* MERGEFORMAT")), DOCX_MIME),
    (
        "docx-hyperlink-field-naming-a-loading-word",
        docx_with(field_runs('HYPERLINK "https://example.org/" \\o "INCLUDEPICTURE and LINK"')),
        DOCX_MIME,
    ),
    (
        "docx-picture-and-hyperlink-on-it",
        docx_with(
            f'<w:hyperlink xmlns:r="{_R}" r:id="rH"><w:r><w:t>a link</w:t></w:r></w:hyperlink>',
            f'<Relationship Id="rH" Type="{_HYPERLINK_TYPE}" Target="file:///srv/shared/report.pdf" TargetMode="External"/>',
        ),
        DOCX_MIME,
    ),
    (
        "rtf-bookmark-named-link-in-a-hyperlink-field",
        rtf('{\\field{\\*\\fldinst {\\*\\bkmkstart Link1}HYPERLINK "https://example.org/"}{\\fldrslt a}}'),
        RTF,
    ),
    (
        "rtf-hyperlink-field-naming-a-loading-word",
        rtf('{\\field{\\*\\fldinst {HYPERLINK "file:///srv/a.pdf" \\\\o "LINK"}}{\\fldrslt a}}'),
        RTF,
    ),
    (
        "rtf-page-field-and-words",
        rtf("Import, link and include these words. {\\field{\\*\\fldinst PAGE}{\\fldrslt 1}}"),
        RTF,
    ),
]


@pytest.mark.parametrize(("name", "content", "mime"), HYPERLINKS, ids=[h[0] for h in HYPERLINKS])
def test_hyperlinks_and_internal_content_are_not_external(
    tmp_path: Path, name: str, content: bytes, mime: str
) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    assert find_external_content(path, mime) is None


@pytest.mark.skipif(shutil.which("soffice") is None, reason="LibreOffice writes these documents")
@pytest.mark.parametrize(
    ("extension", "mime"),
    [
        ("docx", DOCX_MIME),
        ("doc", "application/msword"),
        ("rtf", RTF),
        ("odt", ODT_MIME),
        ("xlsx", "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"),
        ("pptx", "application/vnd.openxmlformats-officedocument.presentationml.presentation"),
        ("odp", "application/vnd.oasis.opendocument.presentation"),
    ],
)
def test_documents_libreoffice_writes_have_nothing_external(
    tmp_path: Path, extension: str, mime: str
) -> None:
    path = tmp_path / f"document.{extension}"
    path.write_bytes(written_by_libreoffice(extension))
    assert find_external_content(path, mime) is None


_LINKS = (
    '<text:a xlink:type="simple" xlink:href="https://example.org/page">web</text:a> '
    '<text:a xlink:type="simple" xlink:href="file:///srv/shared/report.pdf">file</text:a> '
    '<text:a xlink:type="simple" xlink:href="../other/doc.odt">relative</text:a> '
    '<text:a xlink:type="simple" xlink:href="mailto:a@example.org">mail</text:a>'
)
_SHEET_LINKS = (
    '<office:spreadsheet><table:table xmlns:table="urn:oasis:names:tc:opendocument:xmlns:table:1.0" table:name="S">'
    '<table:table-row><table:table-cell office:value-type="string"><text:p>'
    '<text:a xlink:href="https://example.org/x">web</text:a></text:p></table:table-cell>'
    '<table:table-cell office:value-type="string"><text:p><text:a xlink:href="file:///srv/shared/data.ods">file</text:a>'
    "</text:p></table:table-cell></table:table-row></table:table></office:spreadsheet>"
)
_SLIDE_LINKS = (
    '<office:presentation><draw:page draw:name="p1"><draw:frame svg:x="1cm" svg:y="1cm" svg:width="10cm" '
    f'svg:height="3cm"><draw:text-box><text:p>{_LINKS}</text:p></draw:text-box></draw:frame>'
    "</draw:page></office:presentation>"
)


@pytest.mark.skipif(shutil.which("soffice") is None, reason="LibreOffice writes these documents")
@pytest.mark.parametrize(
    ("source", "extension", "mime"),
    [
        ("text", "docx", DOCX_MIME),
        ("text", "doc", "application/msword"),
        ("text", "rtf", RTF),
        ("spreadsheet", "xlsx", XLSX),
        ("presentation", "pptx", "application/vnd.openxmlformats-officedocument.presentationml.presentation"),
    ],
)
def test_hyperlinks_libreoffice_writes_are_not_external(
    tmp_path: Path, source: str, extension: str, mime: str
) -> None:
    """Hyperlinks to the web, to a ``file:`` URL, to a relative path and to a mail address, as
    LibreOffice writes them: OOXML external hyperlink relationships named by ``w:hyperlink``,
    SpreadsheetML ``hyperlink`` and ``a:hlinkClick``; RTF and Word 97 ``HYPERLINK`` fields."""
    body = {
        "text": f"<office:text><text:p>Links: {_LINKS}</text:p></office:text>",
        "spreadsheet": _SHEET_LINKS,
        "presentation": _SLIDE_LINKS,
    }[source]
    content = libreoffice_convert(f"links.fod{source[0]}", flat_odf(source, body), extension)
    if extension in ("docx", "xlsx", "pptx"):
        with zipfile.ZipFile(io.BytesIO(content)) as package:
            rels = b"".join(package.read(n) for n in package.namelist() if n.endswith(".rels"))
        assert rels.count(_HYPERLINK_TYPE.encode()) >= 2 and b"shared/" in rels  # the file: link is there
    else:
        assert b"HYPERLINK" in content or b"H\x00Y\x00P\x00E\x00R\x00" in content
    path = tmp_path / f"links.{extension}"
    path.write_bytes(content)
    assert find_external_content(path, mime) is None


def test_the_corpus_odt_has_nothing_external() -> None:
    assert find_external_content(ODT, ODT_MIME) is None


def test_a_part_with_a_dtd_or_broken_xml_is_malformed(tmp_path: Path) -> None:
    for body in ('<!DOCTYPE x [<!ENTITY e "v">]><x/>', "<x><unclosed></x>"):
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as z:
            z.writestr("mimetype", ODT_MIME)
            z.writestr("content.xml", body)
        path = tmp_path / "bad.odt"
        path.write_bytes(buffer.getvalue())
        with pytest.raises(MalformedDocument):
            find_external_content(path, ODT_MIME)


def test_internal_references_of_embedded_objects_are_not_external(tmp_path: Path) -> None:
    """An object's own ``Pictures/``, a path up to the package's own, a ``data:`` image."""
    document = odt(
        '<text:p><draw:frame><draw:object xlink:href="./Object 1"/></draw:frame></text:p>',
        {
            "Object 1/content.xml": _DRAW_OBJECT.format(href="../Pictures/a.png").encode(),
            "Object 1/styles.xml": _DRAW_OBJECT.format(href="Pictures/b.png").encode(),
            "Pictures/p.svg": b'<svg xmlns="http://www.w3.org/2000/svg"><image href="data:image/png;base64,AA=="/></svg>',
        },
    )
    path = tmp_path / "fine.odt"
    path.write_bytes(document)
    assert find_external_content(path, ODT_MIME) is None


def test_packages_nested_too_deep_exceed_the_check(tmp_path: Path) -> None:
    inner = docx(["deepest"])
    for _ in range(MAX_NESTING + 1):
        inner = _with_parts(docx(["outer"]), {"word/embeddings/inner.docx": inner})
    path = tmp_path / "deep.docx"
    path.write_bytes(inner)
    with pytest.raises(CheckLimitExceeded):
        find_external_content(path, DOCX_MIME)


LIBREOFFICE_SHARE = Path("/usr/lib/libreoffice/share")


@pytest.mark.skipif(not LIBREOFFICE_SHARE.is_dir(), reason="LibreOffice's templates are not installed")
def test_every_document_libreoffice_ships_has_nothing_external_but_its_template() -> None:
    """The ODF templates and samples LibreOffice installs (119 with 7.4 on Debian 12), read in
    every part: old OpenOffice.org ones have a manifest with a DOCTYPE and prefixes bound only by
    it. Nothing is external but a ``meta:template`` naming another file, which LibreOffice opens
    when it loads the document (measured with strace), so it is refused like any link."""
    found = {}
    paths = sorted(p for p in LIBREOFFICE_SHARE.rglob("*.o[dt][tspg]") if p.is_file())
    assert len(paths) >= 50
    for path in paths:
        result = find_external_content(path, contenttype.identify(path.read_bytes()))
        if result is not None:
            found[path.name] = result
    assert all("linked template" in r and "in meta.xml" in r for r in found.values()), found
    assert len(found) <= 2, found


def test_rtf_groups_nested_too_deep_exceed_the_check(tmp_path: Path) -> None:
    """The tokenizer's bound on nesting (the upload checks bound the size)."""
    path = tmp_path / "deep.rtf"
    fine = "{" * (MAX_RTF_NESTING - 1) + "}" * (MAX_RTF_NESTING - 1)
    path.write_bytes(rtf(f"{{\\field{{\\*\\fldinst PAGE}}}}{fine}"))
    assert find_external_content(path, RTF) is None
    path.write_bytes(rtf("{\\field{\\*\\fldinst PAGE}}" + "{" * (MAX_RTF_NESTING + 1)))
    with pytest.raises(CheckLimitExceeded):
        find_external_content(path, RTF)


@pytest.mark.skipif(shutil.which("soffice") is None, reason="LibreOffice writes the document")
@pytest.mark.parametrize(
    ("instruction", "found"),
    [
        ('INCLUDETEXT "/nonexistent/t.txt"', "INCLUDETEXT"),
        ('"INCLUDETEXT" /nonexistent/t.tx', "INCLUDETEXT"),
        ('\t\\includetext "/nonexistent/t"', "INCLUDETEXT"),
        ('QUOTE "INCLUDETEXT /nonexist"', None),
    ],
)
def test_word_97_fields_are_judged_by_their_first_word(
    tmp_path: Path, instruction: str, found: str | None
) -> None:
    """A ``.doc`` LibreOffice writes from an RTF with an ``INCLUDETEXT`` field (in UTF-16 in the
    ``WordDocument`` stream), its instruction then rewritten in place (padded to the same length): a
    quoted word, a tab and a backslash before it (which a pattern after the 0x13 mark missed),
    and a field that only quotes the word."""
    original = 'INCLUDETEXT "/nonexistent/t.txt"'
    instruction = instruction.ljust(len(original))  # the same length: the stream is rewritten in place
    assert len(instruction) == len(original)
    source = rtf(f"Before {{\\field{{\\*\\fldinst {original}}}{{\\fldrslt y}}}} After\\par")
    path = tmp_path / "fields.doc"
    path.write_bytes(libreoffice_convert("fields.rtf", source, "doc"))
    with olefile.OleFileIO(str(path), write_mode=True) as compound:
        stream = compound.openstream("WordDocument").read()
        assert stream.count(original.encode("utf-16-le")) == 1
        compound.write_stream(
            "WordDocument", stream.replace(original.encode("utf-16-le"), instruction.encode("utf-16-le"))
        )
    result = find_external_content(path, "application/msword")
    assert (result is None) if found is None else (result == f"a Word {found} field"), result
