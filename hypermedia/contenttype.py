"""Content types decided from magic bytes, never from a file name or a client's Content-Type.

Images are recognised by their signatures (the formats the image pipeline loads); everything
else goes through puremagic's signature database. Each MIME type maps to a *kind* that processing
profiles accept (``processing_profiles.input_kinds``).
"""

from __future__ import annotations

import puremagic

HEAD_BYTES = 4096
"""How much of the start of a file detection reads."""

_HEVC_BRANDS = frozenset({b"heic", b"heix", b"heim", b"heis", b"hevc", b"hevx"})
_AVIF_BRANDS = frozenset({b"avif", b"avis"})
_GENERIC_HEIF_BRANDS = frozenset({b"mif1", b"msf1"})


def image_mime(head: bytes) -> str | None:
    """MIME type of image content from its magic bytes.

    Args:
        head: the first bytes of the file; 64 are enough (fewer work for every format but HEIF/AVIF
            files whose ``ftyp`` box lists many brands).

    Returns:
        ``image/jpeg``, ``image/png``, ``image/webp``, ``image/gif``, ``image/tiff``, ``image/avif`` or
        ``image/heif``; ``None`` for anything else, including SVG, PDF and BMP. Sources: the JPEG
        SOI marker, the PNG signature, RIFF/WEBP, GIF87a/89a, TIFF and BigTIFF byte-order headers,
        and ISO-BMFF ``ftyp`` brands (ISO/IEC 23008-12, AV1 Image File Format §9).
    """
    if head.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image/webp"
    if head[:6] in (b"GIF87a", b"GIF89a"):
        return "image/gif"
    if head[:4] in (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+"):
        return "image/tiff"
    if head[4:8] == b"ftyp" and len(head) >= 12:
        box_end = min(int.from_bytes(head[:4], "big"), len(head))
        major = head[8:12]
        compatible = {head[i : i + 4] for i in range(16, box_end - 3, 4)}
        # A specific major brand decides; a generic one (mif1) defers to the compatible brands.
        if major in _AVIF_BRANDS or (major not in _HEVC_BRANDS and compatible & _AVIF_BRANDS):
            return "image/avif"
        if major in _HEVC_BRANDS or compatible & (_HEVC_BRANDS | _GENERIC_HEIF_BRANDS):
            return "image/heif"
    return None


def detect(head: bytes) -> str:
    """MIME type of content starting with ``head`` (give at least :data:`HEAD_BYTES` when you have
    them); ``application/octet-stream`` when unknown."""
    image = image_mime(head)
    if image:
        return image
    if head.startswith(b"BM"):
        return "image/bmp"  # recognised, not processed
    if len(head) >= 12 and head[4:8] == b"ftyp":
        major = head[8:12]
        if major in (b"isom", b"iso2", b"mp41", b"mp42", b"avc1", b"dash", b"M4V "):
            return "video/mp4"
        if major == b"qt  ":
            return "video/quicktime"
        if major in (b"M4A ", b"M4B "):
            return "audio/mp4"
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
