"""Content types decided from magic bytes, never from a file name or a client's Content-Type.

Images are recognised by their signatures (the formats the image pipeline loads); everything
else goes through puremagic's signature database. Zip containers are typed from inside, after
:mod:`hypermedia.archives` checked them: ODF by its ``mimetype`` entry, OOXML by the main part in
``[Content_Types].xml`` (:func:`identify`). Each MIME type maps to a *kind* that processing
profiles accept (``processing_profiles.input_kinds``). What a client *claims* (a Content-Type, a
file name's extension) is only recorded (:func:`claimed_mime`, :func:`name_mime`).
"""

from __future__ import annotations

import mimetypes
import re

import puremagic

from hypermedia import archives

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
        ``image/jpeg``, ``image/png``, ``image/webp``, ``image/gif``, ``image/tiff``, ``image/avif``,
        ``image/heif`` or ``image/svg+xml``; ``None`` for anything else, including PDF and BMP. Sources: the JPEG
        SOI marker, the PNG signature, RIFF/WEBP, GIF87a/89a, TIFF and BigTIFF byte-order headers,
        and ISO-BMFF ``ftyp`` brands (ISO/IEC 23008-12, AV1 Image File Format §9); SVG is XML text
        whose first element, within ``head``, is ``<svg``.
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
    if _looks_like_svg(head):
        return "image/svg+xml"
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


def _looks_like_svg(head: bytes) -> bool:
    """XML text (optional BOM, prolog, comments, DOCTYPE with or without an internal subset)
    whose first element is ``<svg``. A DOCTYPE is only skipped here; the SVG loader rejects it."""
    text = head.removeprefix(b"\xef\xbb\xbf").lstrip()
    while text.startswith(b"<?") or text.startswith(b"<!"):
        if text.startswith(b"<!--"):
            end = text.find(b"-->") + 3
        elif text.startswith(b"<?"):
            end = text.find(b"?>") + 2
        else:
            bracket, close = text.find(b"["), text.find(b">")
            end = text.find(b"]>") + 2 if 0 <= bracket < close else close + 1
        if end <= 2:
            return False
        text = text[end:].lstrip()
    return text.startswith(b"<svg") and text[4:5] in (b" ", b">", b"\t", b"\n", b"\r", b"/")


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
    {
        "image/jpeg",
        "image/png",
        "image/gif",
        "image/webp",
        "image/tiff",
        "image/avif",
        "image/heif",
        "image/svg+xml",
    }
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


OOXML_MIME_BY_MAIN_PART = {
    "application/vnd.openxmlformats-officedocument.wordprocessingml.document.main+xml": (
        "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
    ),
    "application/vnd.openxmlformats-officedocument.wordprocessingml.template.main+xml": (
        "application/vnd.openxmlformats-officedocument.wordprocessingml.template"
    ),
    "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet.main+xml": (
        "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"
    ),
    "application/vnd.openxmlformats-officedocument.spreadsheetml.template.main+xml": (
        "application/vnd.openxmlformats-officedocument.spreadsheetml.template"
    ),
    "application/vnd.openxmlformats-officedocument.presentationml.presentation.main+xml": (
        "application/vnd.openxmlformats-officedocument.presentationml.presentation"
    ),
    "application/vnd.openxmlformats-officedocument.presentationml.slideshow.main+xml": (
        "application/vnd.openxmlformats-officedocument.presentationml.slideshow"
    ),
    "application/vnd.openxmlformats-officedocument.presentationml.template.main+xml": (
        "application/vnd.openxmlformats-officedocument.presentationml.template"
    ),
    # Macro-enabled: recognised so that they can be named, and always refused at upload.
    "application/vnd.ms-word.document.macroenabled.main+xml": "application/vnd.ms-word.document.macroEnabled.12",
    "application/vnd.ms-word.template.macroenabledtemplate.main+xml": (
        "application/vnd.ms-word.template.macroEnabled.12"
    ),
    "application/vnd.ms-excel.sheet.macroenabled.main+xml": "application/vnd.ms-excel.sheet.macroEnabled.12",
    "application/vnd.ms-excel.template.macroenabled.main+xml": "application/vnd.ms-excel.template.macroEnabled.12",
    "application/vnd.ms-excel.addin.macroenabled.main+xml": "application/vnd.ms-excel.addin.macroEnabled.12",
    "application/vnd.ms-excel.sheet.binary.macroenabled.main": (
        "application/vnd.ms-excel.sheet.binary.macroEnabled.12"
    ),
    "application/vnd.ms-powerpoint.presentation.macroenabled.main+xml": (
        "application/vnd.ms-powerpoint.presentation.macroEnabled.12"
    ),
    "application/vnd.ms-powerpoint.slideshow.macroenabled.main+xml": (
        "application/vnd.ms-powerpoint.slideshow.macroEnabled.12"
    ),
    "application/vnd.ms-powerpoint.template.macroenabled.main+xml": (
        "application/vnd.ms-powerpoint.template.macroEnabled.12"
    ),
    "application/vnd.ms-powerpoint.addin.macroenabled.main+xml": (
        "application/vnd.ms-powerpoint.addin.macroEnabled.12"
    ),
}
"""Content type of an OOXML package's main part (lowercase, as :func:`archives.package_types`
returns it) → the MIME type of the file (ECMA-376 Part 1 §11–13 and [MS-OFFMACRO2] for the
macro-enabled variants; file types as registered with IANA and in Office's MIME map)."""


def ooxml_mime(types: archives.PackageTypes) -> str | None:
    """The file MIME type of an OOXML package from its declared main part (overrides first), or
    None when no known main part is declared."""
    for content_type in types.all_types():
        if content_type in OOXML_MIME_BY_MAIN_PART:
            return OOXML_MIME_BY_MAIN_PART[content_type]
    return None


def identify(content: bytes) -> str:
    """MIME type of a whole file: :func:`detect` on its head; a zip container is first checked by
    :func:`archives.inspect` (nothing is unpacked), then typed from inside (OOXML by
    ``[Content_Types].xml``; ODF by its ``mimetype`` entry; any other zip is ``application/zip``)
    and refused when it carries macros.

    Raises:
        archives.ArchiveRejected: the archive failed a check (an ``ARCHIVE_*`` code, HTTP 422).
        archives.MacrosNotAllowed: the document carries macros, whatever its name (HTTP 415).
    """
    head = content[:HEAD_BYTES]
    mime = detect(head)
    if not archives.is_zip(head):
        return mime
    archive = archives.inspect(content)
    types = archives.package_types(archive)
    ooxml = ooxml_mime(types) if types else None
    finding = archives.find_macros(archive, types)
    if finding:
        raise archives.MacrosNotAllowed(
            f"documents with macros are not accepted: this one contains {finding}", "MACROS_NOT_ALLOWED"
        )
    if ooxml:
        return ooxml
    if mime.startswith("application/vnd.oasis.opendocument."):
        return mime  # ODF, from its first entry (see detect)
    # puremagic guesses zips from the names it sees in the head (a zip holding a.txt "is" a docx):
    # whatever an inspected zip is not typed as from inside, it is a plain zip.
    return "application/zip"


GENERIC_MIME_TYPES = frozenset({"application/octet-stream", "binary/octet-stream", "application/unknown"})
"""Claims that say nothing (what curl and browsers send for an unknown file): recorded as no claim."""

_MIME_ALIASES = {
    "image/jpg": "image/jpeg",
    "image/pjpeg": "image/jpeg",
    "image/x-png": "image/png",
    "image/heic": "image/heif",
    "image/heic-sequence": "image/heif",
    "image/heif-sequence": "image/heif",
    "image/avif-sequence": "image/avif",
    "application/x-pdf": "application/pdf",
    "application/x-zip-compressed": "application/zip",
    "application/x-gzip": "application/gzip",
}
"""Other names clients use for a type :func:`detect` names: a claim under an alias is no mismatch."""

MAX_CLAIM_LENGTH = 127
_CLAIM = re.compile(r"^[a-z0-9][a-z0-9!#$&^_.+-]*/[a-z0-9][a-z0-9!#$&^_.+-]*$")

_EXTENSIONS_MIMETYPES_LACKS = {
    ".webp": "image/webp",
    ".heif": "image/heif",
    ".heic": "image/heif",
    ".docx": "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
    ".dotx": "application/vnd.openxmlformats-officedocument.wordprocessingml.template",
    ".xlsx": "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
    ".xltx": "application/vnd.openxmlformats-officedocument.spreadsheetml.template",
    ".pptx": "application/vnd.openxmlformats-officedocument.presentationml.presentation",
    ".ppsx": "application/vnd.openxmlformats-officedocument.presentationml.slideshow",
    ".potx": "application/vnd.openxmlformats-officedocument.presentationml.template",
    ".docm": "application/vnd.ms-word.document.macroEnabled.12",
    ".dotm": "application/vnd.ms-word.template.macroEnabled.12",
    ".xlsm": "application/vnd.ms-excel.sheet.macroEnabled.12",
    ".xltm": "application/vnd.ms-excel.template.macroEnabled.12",
    ".xlam": "application/vnd.ms-excel.addin.macroEnabled.12",
    ".xlsb": "application/vnd.ms-excel.sheet.binary.macroEnabled.12",
    ".pptm": "application/vnd.ms-powerpoint.presentation.macroEnabled.12",
    ".ppsm": "application/vnd.ms-powerpoint.slideshow.macroEnabled.12",
    ".potm": "application/vnd.ms-powerpoint.template.macroEnabled.12",
    ".ppam": "application/vnd.ms-powerpoint.addin.macroEnabled.12",
    ".odt": "application/vnd.oasis.opendocument.text",
    ".ods": "application/vnd.oasis.opendocument.spreadsheet",
    ".odp": "application/vnd.oasis.opendocument.presentation",
    ".odg": "application/vnd.oasis.opendocument.graphics",
}
_BY_EXTENSION = mimetypes.MimeTypes()  # the built-in table only, never the host's /etc/mime.types
for _extension, _mime in _EXTENSIONS_MIMETYPES_LACKS.items():
    _BY_EXTENSION.add_type(_mime, _extension)
_MIME_BY_ENCODING = {
    "gzip": "application/gzip",
    "bzip2": "application/x-bzip2",
    "xz": "application/x-xz",
    "br": "application/x-brotli",
    "compress": "application/x-compress",
}
"""``mimetypes`` reads ``x.tar.gz`` as a tar encoded with gzip: the file itself is the gzip."""


def claimed_mime(value: str | None) -> str | None:
    """A client's claimed type (a multipart part's ``Content-Type``) normalised for the record:
    lowercase, without parameters, aliases resolved; None when absent, generic
    (:data:`GENERIC_MIME_TYPES`) or not a media type at all."""
    if not value:
        return None
    mime = value.split(";", 1)[0].strip().lower()
    if len(mime) > MAX_CLAIM_LENGTH or not _CLAIM.match(mime) or mime in GENERIC_MIME_TYPES:
        return None
    return _MIME_ALIASES.get(mime, mime)


def name_mime(filename: str | None) -> str | None:
    """The type a file name's extension implies (Python's built-in ``mimetypes`` table plus the
    office and image formats it lacks), normalised like :func:`claimed_mime`; None when unknown."""
    if not filename:
        return None
    guess, encoding = _BY_EXTENSION.guess_type(filename.replace("\\", "/"), strict=False)
    return claimed_mime(_MIME_BY_ENCODING.get(encoding or "", guess))


def type_mismatch(real: str, *claims: str | None) -> bool:
    """Whether any claim (normalised by :func:`claimed_mime` or :func:`name_mime`; None is no
    claim) names another type than ``real``, the type decided from the content."""
    normalised = real.lower()
    normalised = _MIME_ALIASES.get(normalised, normalised)
    return any(claim is not None and claim != normalised for claim in claims)
