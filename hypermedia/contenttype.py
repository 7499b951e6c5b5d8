"""Content types decided from magic bytes, never from a file name or a client's Content-Type.

Images are recognised by their signatures (the formats the image pipeline loads); everything
else goes through puremagic's signature database. Each MIME type maps to a *kind* that processing
profiles accept (``processing_profiles.input_kinds``).
"""

from __future__ import annotations

import puremagic

HEAD_BYTES = 4096
"""How much of the start of a file detection reads."""

_IMAGE_SIGNATURES: tuple[tuple[int, bytes, str], ...] = (
    (0, b"\xff\xd8\xff", "image/jpeg"),
    (0, b"\x89PNG\r\n\x1a\n", "image/png"),
    (0, b"GIF87a", "image/gif"),
    (0, b"GIF89a", "image/gif"),
    (0, b"II*\x00", "image/tiff"),
    (0, b"MM\x00*", "image/tiff"),
    (0, b"BM", "image/bmp"),
)


def _isobmff_brand(head: bytes) -> str | None:
    if len(head) >= 12 and head[4:8] == b"ftyp":
        major = head[8:12]
        if major in (b"avif", b"avis"):
            return "image/avif"
        if major in (b"heic", b"heix", b"heim", b"heis", b"mif1", b"msf1"):
            return "image/heif"
        if major in (b"isom", b"iso2", b"mp41", b"mp42", b"avc1", b"dash", b"M4V "):
            return "video/mp4"
        if major == b"qt  ":
            return "video/quicktime"
        if major in (b"M4A ", b"M4B "):
            return "audio/mp4"
    return None


def detect(head: bytes) -> str:
    """MIME type of content starting with ``head`` (give at least :data:`HEAD_BYTES` when you have
    them); ``application/octet-stream`` when unknown."""
    for offset, signature, mime in _IMAGE_SIGNATURES:
        if head[offset : offset + len(signature)] == signature:
            return mime
    if len(head) >= 12 and head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image/webp"
    brand = _isobmff_brand(head)
    if brand:
        return brand
    if head.startswith(b"%PDF-"):
        return "application/pdf"
    if head.startswith(b"PK\x03\x04") and head[30:38] == b"mimetype":
        # ODF: the first zip entry, stored uncompressed, is "mimetype" holding the type.
        declared = head[38 : 38 + 80].split(b"PK", 1)[0].decode("ascii", "replace").strip()
        if declared.startswith("application/vnd.oasis.opendocument."):
            return declared
    try:
        guess = puremagic.from_string(head, mime=True)
    except (puremagic.PureError, ValueError):
        return "application/octet-stream"
    return guess or "application/octet-stream"


IMAGE_MIME_TYPES = frozenset(
    {"image/jpeg", "image/png", "image/gif", "image/webp", "image/tiff", "image/avif", "image/heif"}
)
"""Image types the image pipeline decodes (BMP is recognised but not accepted)."""


def kind(mime_type: str) -> str:
    """The kind of input a MIME type is, as named in ``processing_profiles.input_kinds``:
    ``image``, ``pdf``, ``office``, ``audio``, ``video`` or ``other``."""
    if mime_type in IMAGE_MIME_TYPES:
        return "image"
    if mime_type == "application/pdf":
        return "pdf"
    if mime_type.startswith("audio/"):
        return "audio"
    if mime_type.startswith("video/"):
        return "video"
    if mime_type.startswith("application/vnd.openxmlformats") or mime_type.startswith(
        "application/vnd.oasis.opendocument"
    ):
        return "office"
    return "other"
