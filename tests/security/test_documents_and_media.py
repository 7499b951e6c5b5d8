"""The document and media part of the attack corpus: hostile PDFs, an OOXML document with an
external link, HLS and concat playlists, PostScript.

What these tests prove: the gateway types each file from its content without parsing it, stores
it like any upload, refuses *image* operations on it with ``415 UNSUPPORTED_FORMAT`` before any job
exists, and nothing reaches out to the listener. PDFs are processed by the docworker; the same
hostile PDFs go through pdfium in ``tests/security/test_pdf_corpus.py``; office documents go
through the docworker's checks (``tests/security/test_office_listener.py``). The playlists are
typed as text, so the media operations refuse them at creation too (checked here with ``probe``);
the mediaworker's own refusal of a playlist that reached it is proven in
``tests/unit/test_media_probe.py`` (segments never opened).
"""

from __future__ import annotations

import io
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.e2e.conftest import RunningPlatform, isolated_platform, upload, wait_job
from tests.security.conftest import Listener

PHOTO = Path(__file__).resolve().parents[1] / "data" / "exif-orientation" / "Landscape_3.jpg"


def build_pdf(objects: list[bytes], trailer: bytes = b"") -> bytes:
    """A PDF with ``objects`` as objects 1…n (object 1 the catalog), a correct xref table and
    ``trailer`` added to the trailer dictionary."""
    out = io.BytesIO()
    out.write(b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(out.tell())
        out.write(b"%d 0 obj\n" % number + body + b"\nendobj\n")
    xref = out.tell()
    out.write(b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1))
    out.writelines(b"%010d 00000 n \n" % offset for offset in offsets)
    out.write(
        b"trailer\n<< /Size %d /Root 1 0 R %s >>\nstartxref\n%d\n%%%%EOF\n"
        % (len(objects) + 1, trailer, xref)
    )
    return out.getvalue()


def pdf_with_pages(count: int) -> bytes:
    """A real ``count``-page PDF: catalog, one page tree node, ``count`` distinct page objects."""
    kids = b" ".join(b"%d 0 R" % (3 + i) for i in range(count))
    pages = [b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] >>"] * count
    return build_pdf(
        [
            b"<< /Type /Catalog /Pages 2 0 R >>",
            b"<< /Type /Pages /Count %d /Kids [%s] >>" % (count, kids),
            *pages,
        ]
    )


def pdf_flate_bomb(inflated: int = 1 << 30) -> bytes:
    """A one-page PDF whose content stream inflates to ``inflated`` bytes of zeros (≈ 1 MiB
    compressed: one full-flush DEFLATE block of 1 MiB of zeros, repeated)."""
    chunk = b"\0" * (1 << 20)
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)  # raw DEFLATE: the zlib frame is ours
    block = compressor.compress(chunk) + compressor.flush(zlib.Z_FULL_FLUSH)
    count = inflated // len(chunk)
    checksum = 1
    for _ in range(count):
        checksum = zlib.adler32(chunk, checksum)
    # RFC 1950 header (deflate, 32 KiB window, level 9), the blocks, a final empty block, Adler-32.
    stream = b"\x78\xda" + block * count + compressor.flush() + checksum.to_bytes(4, "big")
    return build_pdf(
        [
            b"<< /Type /Catalog /Pages 2 0 R >>",
            b"<< /Type /Pages /Count 1 /Kids [3 0 R] >>",
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R >>",
            b"<< /Length %d /Filter /FlateDecode >>\nstream\n" % len(stream) + stream + b"\nendstream",
        ]
    )


def pdf_deeply_nested(depth: int = 100_000) -> bytes:
    """A PDF whose page carries an array nested ``depth`` levels deep (a recursive parser's stack)."""
    nested = b"[" * depth + b"]" * depth
    return build_pdf(
        [
            b"<< /Type /Catalog /Pages 2 0 R >>",
            b"<< /Type /Pages /Count 1 /Kids [3 0 R] >>",
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Junk " + nested + b" >>",
        ]
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
        z.writestr(
            "_rels/.rels",
            '<?xml version="1.0" encoding="UTF-8"?>'
            '<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">'
            '<Relationship Id="rId1" Type="http://schemas.openxmlformats.org/officeDocument/2006/'
            'relationships/officeDocument" Target="word/document.xml"/></Relationships>',
        )
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


def corpus(listener: Listener) -> list[tuple[str, bytes, str]]:
    """(file name, content, the type the gateway must give it)."""
    local = "/etc/passwd"
    return [
        ("fifty-thousand-pages.pdf", pdf_with_pages(50_000), "application/pdf"),
        ("flate-bomb.pdf", pdf_flate_bomb(), "application/pdf"),
        ("nested.pdf", pdf_deeply_nested(), "application/pdf"),
        ("pdf-named.jpg", pdf_with_pages(1), "application/pdf"),
        (
            "external-image.docx",
            docx_with_external_image(listener.url),
            "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
        ),
        (
            "playlist.m3u8",
            f"#EXTM3U\n#EXT-X-TARGETDURATION:10\n#EXTINF:10,\nhttp://{listener.address}/seg0.ts\n"
            f"#EXTINF:10,\nfile://{local}\n#EXT-X-ENDLIST\n".encode(),
            "",
        ),
        (
            "concat.txt",
            f"ffconcat version 1.0\nfile '{local}'\nfile 'http://{listener.address}/a.mp4'\n".encode(),
            "",
        ),
        ("drawing.ps", b"%!PS-Adobe-3.0\n%%BoundingBox: 0 0 10 10\n(/etc/passwd) (r) file\nshowpage\n", ""),
        ("figure.eps", b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\nshowpage\n", ""),
    ]


@pytest.fixture(scope="module")
def docs_platform(tmp_root: Path, database_url: str, nats_url: str) -> Iterator[RunningPlatform]:
    with isolated_platform(tmp_root, database_url, nats_url, "docmedia") as running:
        yield running


def test_documents_and_media_are_stored_typed_and_refused_by_image_operations(
    docs_platform: RunningPlatform, listener: Listener
) -> None:
    account = docs_platform.admin("create-account", "--credits", "100")
    with docs_platform.client(account, timeout=60) as client:
        for name, content, expected_type in corpus(listener):
            response = client.post("/v1/objects", files={"file": (name, content)})
            assert response.status_code == 201, (name, response.text)
            obj: dict[str, Any] = response.json()
            if expected_type:
                assert obj["mime_type"] == expected_type, name
            assert not obj["mime_type"].startswith("image/"), (name, obj["mime_type"])
            refused = client.post(
                "/v1/hypermedia/process", json={"object_id": obj["object_id"], "operations": ["thumbnail"]}
            )
            assert refused.status_code == 415, (name, refused.text)
            assert refused.json()["error_code"] == "UNSUPPORTED_FORMAT"
            if name in ("playlist.m3u8", "concat.txt"):
                probed = client.post(
                    "/v1/hypermedia/process", json={"object_id": obj["object_id"], "operations": ["probe"]}
                )
                assert probed.status_code == 415, (name, probed.text)
            with psycopg.connect(docs_platform.env["HM_DATABASE_URL"]) as conn:
                jobs = conn.execute(
                    "SELECT count(*) FROM processing_jobs WHERE object_id = %s", (obj["object_id"],)
                ).fetchone()
            assert jobs == (0,), name
        assert client.get("/v1/credits").json()["held"] == 0
        # The platform is unharmed: a normal job right after.
        photo = upload(client, PHOTO)
        job_id = client.post(
            "/v1/hypermedia/process", json={"object_id": photo["object_id"], "operations": ["thumbnail"]}
        ).json()["job_ids"][0]
        assert wait_job(client, job_id)["status"] == "completed"
    assert listener.connections == []


def test_the_generated_pdfs_are_what_they_claim() -> None:
    """The corpus files are real: the page count, the inflated size and the nesting depth."""
    many = pdf_with_pages(50_000)
    assert many.count(b"/Type /Page ") == 50_000 and b"/Count 50000" in many
    bomb = pdf_flate_bomb(64 << 20)
    start = bomb.index(b"stream\n") + len(b"stream\n")
    stream = bomb[start : bomb.rindex(b"\nendstream")]
    inflater = zlib.decompressobj()
    assert len(inflater.decompress(stream)) == 64 << 20 and inflater.eof  # checksum verified
    assert len(stream) < (64 << 20) // 500
    assert b"[" * 1000 + b"]" * 1000 in pdf_deeply_nested(1000)
