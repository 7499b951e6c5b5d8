"""Content types decided from magic bytes, never from a file name or a client's Content-Type.

Images are recognised by their signatures (the formats the image pipeline loads); everything
else goes through puremagic's signature database. Zip containers are typed from inside, after
:mod:`hypermedia.intake.archives` checked them: ODF by its ``mimetype`` entry, OOXML by the main part in
``[Content_Types].xml`` (:mod:`hypermedia.intake.officetypes`); OLE2 compound files (legacy Word,
Excel, PowerPoint) by their root streams, after :mod:`hypermedia.intake.ole` checked them; flat ODF
(one XML file) by its root element (:mod:`hypermedia.intake.officetypes`, from :func:`identify`). Each MIME type maps to a *kind* that processing profiles accept
(``processing_profiles.input_kinds``). What a client *claims* (a Content-Type, a file name's
extension) is only recorded (:func:`claimed_mime`, :func:`name_mime`).
"""

from __future__ import annotations

import mimetypes
import re

import puremagic

from hypermedia.intake import archives, nested, officetypes, ole

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
    them); ``application/octet-stream`` when unknown. A judgement of the head alone: a compound
    file is ``application/x-ole-storage`` here and a flat ODF head its flat type;
    :func:`identify` decides both from the whole file."""
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
    if ole.is_ole(head):
        # Which Office format (if any) only the directory says: identify() reads it. puremagic
        # calls a compound file application/msword or nothing, by its header's minor version,
        # whatever it holds (an MSI, an .msg).
        return ole.OLE_STORAGE
    if head.startswith(b"PK\x03\x04") and head[30:38] == b"mimetype":
        # ODF: the first zip entry, stored uncompressed, is "mimetype" holding the type.
        declared = head[38 : 38 + 80].split(b"PK", 1)[0].decode("ascii", "replace").strip()
        if declared.startswith("application/vnd.oasis.opendocument."):
            return declared
    flat = officetypes.flat_odf_mime(head)
    if flat:
        return flat  # from the root element only: identify() parses the whole file
    media = _media_container(head)
    if media:
        return media
    return _magic(head)


_TS_PACKET = 188


def _media_container(head: bytes) -> str | None:
    """Ogg (RFC 3533: pages start ``OggS``) as ``audio/ogg``, or ``video/ogg`` when its first page
    is a Theora header (RFC 7845 and the Theora spec name the types); an MPEG transport stream
    (ISO/IEC 13818-1: 188-byte packets, each starting with the sync byte 0x47) as ``video/mp2t``
    when three packets in a row start so. puremagic calls the first ``application/ogg`` and does
    not know the second: both would be kind ``other`` and refused by the media operations."""
    if head.startswith(b"OggS"):
        return "video/ogg" if b"\x80theora" in head[:512] else "audio/ogg"
    if len(head) > 2 * _TS_PACKET and all(head[i * _TS_PACKET] == 0x47 for i in range(3)):
        return "video/mp2t"
    return None


def _magic(head: bytes) -> str:
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


LEGACY_OFFICE_MIME_TYPES = frozenset(
    {ole.MSWORD, ole.MSEXCEL, ole.MSPOWERPOINT, "application/rtf", "text/rtf"}
)
"""Word, Excel and PowerPoint 97–2003 (typed from a compound file's streams by :mod:`hypermedia.intake.ole`)
and RTF (``{\\rtf1``; ``text/rtf`` is the other registered name, RFC 2045 era, and is normalised to
``application/rtf`` by :func:`identify`): office documents that LibreOffice converts."""


OFFICE_MIME_TYPES = frozenset(
    {
        "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
        "application/vnd.openxmlformats-officedocument.wordprocessingml.template",
        "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
        "application/vnd.openxmlformats-officedocument.spreadsheetml.template",
        "application/vnd.openxmlformats-officedocument.presentationml.presentation",
        "application/vnd.openxmlformats-officedocument.presentationml.slideshow",
        "application/vnd.openxmlformats-officedocument.presentationml.template",
        "application/vnd.oasis.opendocument.text",
        "application/vnd.oasis.opendocument.text-template",
        "application/vnd.oasis.opendocument.spreadsheet",
        "application/vnd.oasis.opendocument.spreadsheet-template",
        "application/vnd.oasis.opendocument.presentation",
        "application/vnd.oasis.opendocument.presentation-template",
        "application/vnd.oasis.opendocument.graphics",
        *LEGACY_OFFICE_MIME_TYPES,
    }
)
"""The office documents the docworker converts to PDF: exactly the types that have a LibreOffice
import filter (``IMPORT_FILTERS`` in :mod:`hypermedia.engines.documents.filters`; a unit test keeps the two
equal). Other ODF types (formula, chart, database, master and web documents), flat ODF
(``…-flat-xml``, typed and checked for macros) and generic compound files (:data:`ole.OLE_STORAGE`)
are not among them."""


KIND_OTHER_EXPLAINED = {
    ole.OLE_STORAGE: (
        "a compound file that is no Word, Excel or PowerPoint document LibreOffice can open: an Outlook "
        "message, an installer, or an office document encrypted with a password"
    ),
    "application/zip": "a zip that is no office package, or an ODF document encrypted with a password",
}
"""Containers an upload of kind ``other`` may be typed as for more than one reason: what the
gateway's ``415 UNSUPPORTED_FORMAT`` at job creation says of each (an encrypted document is typed
by its container, :func:`identify`)."""


def kind(mime_type: str) -> str:
    """The kind of input a MIME type is, as named in ``processing_profiles.input_kinds``:
    ``image``, ``pdf``, ``office`` (:data:`OFFICE_MIME_TYPES`), ``audio``, ``video`` or ``other``,
    so that the gateway refuses at job creation (415) what the worker could not process."""
    if mime_type in IMAGE_MIME_TYPES:
        return "image"
    if mime_type == "application/pdf":
        return "pdf"
    if mime_type.startswith("audio/"):
        return "audio"
    if mime_type.startswith("video/"):
        return "video"
    if mime_type in OFFICE_MIME_TYPES:
        return "office"
    return "other"


def _refuse_macros(finding: str | None) -> None:
    if finding:
        raise archives.MacrosNotAllowed(
            f"documents with macros are not accepted: this one contains {finding}", "MACROS_NOT_ALLOWED"
        )


def identify(content: bytes) -> str:
    """MIME type of a whole file, refused when it is a hostile container or carries macros.

    - A compound file (OLE2, :func:`ole.is_ole`) is checked by :func:`ole.inspect` and typed from
      its root streams: ``application/msword``, ``application/vnd.ms-excel``,
      ``application/vnd.ms-powerpoint``, or ``application/x-ole-storage`` for any other (an
      ``.msg``, an MSI, an encrypted OOXML package, a Word, Excel or PowerPoint file encrypted
      with a password, :func:`ole.find_encryption`: never an office kind).
    - A zip container is checked by :func:`archives.inspect` (nothing is unpacked), then typed from
      inside (OOXML by ``[Content_Types].xml``; ODF by its ``mimetype`` entry; any other zip is
      ``application/zip``, and so is an ODF document saved with a password,
      :func:`archives.find_encryption`; OOXML encrypted with one is a compound file, above).
      An encrypted document is thus typed by its container, of kind ``other``: the gateway
      refuses it at job creation with ``415 UNSUPPORTED_FORMAT`` (LibreOffice gets no password).
    - XML whose root is ``office:document`` with a known ``office:mimetype`` is flat ODF
      (:data:`~hypermedia.intake.officetypes.FLAT_ODF_MIME_BY_DECLARED`) when the whole file parses
      (:func:`~hypermedia.intake.officetypes.find_flat_odf_macros`); otherwise it keeps puremagic's type.
    - Anything else is :func:`detect` of its head (``text/rtf`` normalised to ``application/rtf``).

    Raises:
        archives.ArchiveRejected: the zip or compound file failed a check (an ``ARCHIVE_*`` code,
            HTTP 422).
        archives.MacrosNotAllowed: the document carries macros (VBA in any container, macro-enabled
            OOXML, Excel 4.0 macro sheets, ODF Basic or scripts, packaged or flat), whatever its name,
            itself or in a package embedded in it at any depth (:mod:`hypermedia.intake.nested`:
            a ``.docm`` in a ``.docx``, a VBA project in an ``oleObject*.bin``)
            (``MACROS_NOT_ALLOWED``, HTTP 415).
    """
    head = content[:HEAD_BYTES]
    if ole.is_ole(head):
        compound = ole.inspect(content)
        _refuse_macros(compound.macros)
        _refuse_macros(nested.find_macros_in_ole(content))
        return compound.mime_type
    mime = detect(head)
    if mime == "text/rtf":
        return "application/rtf"
    if not archives.is_zip(head):
        flat = officetypes.flat_odf_mime(content[: officetypes.FLAT_ODF_HEAD_BYTES])
        if flat is None:
            return mime
        try:
            _refuse_macros(officetypes.find_flat_odf_macros(content))
        except officetypes.NotFlatODF:
            return _magic(head)  # looked like flat ODF, is not: what puremagic says (XML)
        return flat
    archive = archives.inspect(content)
    types = archives.package_types(archive)
    ooxml = officetypes.ooxml_mime(types) if types else None
    _refuse_macros(archives.find_macros(archive, types))
    if ooxml or mime.startswith("application/vnd.oasis.opendocument."):
        _refuse_macros(nested.find_macros_in_zip(archive))
    if ooxml:
        archives.check_part_names(archive)
        return ooxml
    if mime.startswith("application/vnd.oasis.opendocument."):
        archives.check_part_names(archive)
        if archives.find_encryption(archive):
            return "application/zip"  # encrypted with a password: no operation could open it
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
    "text/rtf": "application/rtf",
    "application/x-rtf": "application/rtf",
    "application/excel": "application/vnd.ms-excel",
    "application/x-msexcel": "application/vnd.ms-excel",
    "application/mspowerpoint": "application/vnd.ms-powerpoint",
    "application/x-mspowerpoint": "application/vnd.ms-powerpoint",
}
"""Other names clients use for a type :func:`detect` names: a claim under an alias is no mismatch."""

MAX_CLAIM_LENGTH = 127
_CLAIM = re.compile(r"^[a-z0-9][a-z0-9!#$&^_.+-]*/[a-z0-9][a-z0-9!#$&^_.+-]*$")

_EXTENSIONS_MIMETYPES_LACKS = {
    ".webp": "image/webp",
    ".heif": "image/heif",
    ".heic": "image/heif",
    ".avifs": "image/avif",  # an AVIF image sequence (animated AVIF): still an AVIF file
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
    ".xlt": "application/vnd.ms-excel",
    ".fodt": "application/vnd.oasis.opendocument.text-flat-xml",
    ".fods": "application/vnd.oasis.opendocument.spreadsheet-flat-xml",
    ".fodp": "application/vnd.oasis.opendocument.presentation-flat-xml",
    ".fodg": "application/vnd.oasis.opendocument.graphics-flat-xml",
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
