"""SVG vetting: an SVG reaches libvips only when every reference in it is local to the document.

librsvg (behind libvips' ``svgload``) can load other resources while it renders: ``<image>``,
``<use>`` and ``<feImage>`` hrefs, ``xi:include``, CSS ``@import`` and ``<?xml-stylesheet?>``. It
resolves them through one policy (``rsvg/src/url_resolver.rs``, "Security and locations of
referenced files" in the librsvg crate docs): ``data:`` URLs always load, anything else needs a
base file and must be that file's sibling or below it. :mod:`hypermedia.engines.imaging.ops` hands librsvg
the bytes (``svgload_buffer``), so there is no base file and only ``data:`` URLs would load; this
module does not rely on that alone. The policy is librsvg's own code, it has had a path traversal
through a disagreement of two URL parsers (CVE-2023-38633, fixed in 2.56.3), and libvips flags
``svgload`` *untrusted* (``VIPS_OPERATION_UNTRUSTED``: "depends on external libraries which have
not been hardened against attack"), so ``block_untrusted`` blocks it unless the pipeline lifts the
block for an SVG this module accepted.

:func:`vet` parses the document with defusedxml's expat parser (no DTD processing, no entity
expansion, no external entities; nothing is fetched) and walks it as a stream, before libvips sees
it, in the sandbox child. It accepts the document only if:

* the XML is well formed, UTF-8 (or ASCII), and its root element is ``svg`` in the SVG namespace
  (or in none, which librsvg also renders) — else ``CORRUPT_INPUT``, or ``SVG_FORBIDDEN`` for
  another declared encoding (expat and libxml2 must read the same characters);
* a DOCTYPE, if any, has no internal subset (no entity, attribute-default or notation
  declarations) and no system identifier other than the W3C SVG DTDs (which neither parser loads);
* there are no processing instructions (``<?xml-stylesheet?>`` is an external stylesheet), no
  XInclude (namespace declaration, element or attribute), no ``script``, ``foreignObject`` or
  ``handler`` element and no ``xml:base``;
* every ``href`` (plain or ``xlink:``), ``src`` and CSS ``url(…)`` — in ``style`` attributes,
  presentation attributes and ``<style>`` elements — is a same-document reference (``#id``) or a
  ``data:`` URI of a PNG or JPEG (:data:`EMBEDDED_IMAGE_TYPES`, base64, whose bytes carry that
  format's signature). These are the raster types the bundled librsvg decodes (measured: other
  types render nothing). ``data:image/svg+xml`` is refused rather than vetted recursively: a
  nested document brings its own references and limits, and nothing a picture needs. Hyperlinks
  (``<a href>``) fall under the same rule: one rule with no exceptions is easier to trust than one
  that knows which elements fetch.
* CSS has no ``@import`` and no backslash escapes (``\\75 rl(`` is ``url(`` to a CSS parser).

A reference that points outside the document is ``SVG_EXTERNAL_REFERENCE``; a forbidden construct
is ``SVG_FORBIDDEN``. Public messages never echo the document's content. What stays for librsvg
to bound: rendering work (its ``MAX_REFERENCED_ELEMENTS`` = 500,000 and ``MAX_LOADED_ELEMENTS``
= 1,000,000 in ``rsvg/src/limits.rs``), and the sandbox's CPU and memory limits behind it.

This module is pure Python and runs no libvips; :mod:`hypermedia.engines.imaging.sources` checks the pixel
sizes of the result (declared size, embedded images, libvips' header) before anything renders.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass, field
from typing import Final

from defusedxml import DefusedXmlException
from defusedxml.ElementTree import DefusedXMLParser, ParseError

from hypermedia.core.errors import PermanentJobError
from hypermedia.intake import contenttype

__all__ = ["EMBEDDED_IMAGE_TYPES", "EmbeddedImage", "VettedSvg", "vet"]

SVG_NS: Final = "http://www.w3.org/2000/svg"
XLINK_NS: Final = "http://www.w3.org/1999/xlink"
XINCLUDE_NS: Final = "http://www.w3.org/2001/XInclude"
XML_NS: Final = "http://www.w3.org/XML/1998/namespace"

EMBEDDED_IMAGE_TYPES: Final = frozenset({"image/png", "image/jpeg"})
"""MIME types a ``data:`` URI may carry: the raster formats the bundled librsvg decodes."""

_W3C_SVG_DTD: Final = "http://www.w3.org/Graphics/SVG/"
_UTF8_NAMES: Final = frozenset({"utf-8", "utf8", "us-ascii", "ascii"})
_FORBIDDEN_ELEMENTS: Final = frozenset({"script", "foreignObject", "handler"})
_URL_FUNCTION: Final = re.compile(r"url\s*\(", re.IGNORECASE)
_URL_ARGUMENT: Final = re.compile(r"""\s*(?:"([^"]*)"|'([^']*)'|([^\s"'()]*))\s*\)""")
_IMPORT: Final = re.compile(r"@import", re.IGNORECASE)
_XML_SPACE: Final = " \t\n\r"

# CSS absolute units in px at libvips' default 72 dpi (svgload renders 1 pt = 1 px).
_PX_PER_UNIT: Final = {
    "": 1.0,
    "px": 1.0,
    "pt": 1.0,
    "pc": 12.0,
    "in": 72.0,
    "cm": 72.0 / 2.54,
    "mm": 7.2 / 2.54,
}
_LENGTH: Final = re.compile(r"\s*([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)\s*([a-zA-Z%]*)\s*")
_NUMBER_LIST: Final = re.compile(r"[\s,]+")


@dataclass(frozen=True)
class EmbeddedImage:
    """A raster image carried by a ``data:`` URI."""

    mime: str
    """``image/png`` or ``image/jpeg``: declared by the URI and matching the bytes' signature."""
    data: bytes
    """The decoded bytes; their header is checked against the pixel limit before rendering."""


@dataclass(frozen=True)
class VettedSvg:
    """An SVG document :func:`vet` accepted."""

    data: bytes
    """The document, unchanged: what librsvg will parse."""
    declared_size: tuple[float, float] | None
    """``(width, height)`` in px from the root's ``width``/``height`` (absolute units at 72 dpi),
    falling back to its ``viewBox``; ``None`` when neither says (e.g. ``%`` or ``em`` without a
    viewBox). libvips' header gives the exact size afterwards."""
    images: tuple[EmbeddedImage, ...]
    """Every ``data:`` image, in document order."""


def _forbidden(what: str) -> PermanentJobError:
    return PermanentJobError(f"The SVG uses {what}, which is not accepted.", "SVG_FORBIDDEN")


def _external() -> PermanentJobError:
    return PermanentJobError(
        "The SVG refers to a file or URL outside itself; only #id references and embedded PNG or "
        "JPEG data: URIs are accepted.",
        "SVG_EXTERNAL_REFERENCE",
    )


def _malformed() -> PermanentJobError:
    return PermanentJobError("The SVG document is malformed.", "CORRUPT_INPUT")


def _split(name: str) -> tuple[str | None, str]:
    """``{uri}local`` (ElementTree's form) → ``(uri, local)``; no namespace → ``(None, name)``."""
    if name.startswith("{"):
        uri, _, local = name[1:].partition("}")
        return uri, local
    return None, name


@dataclass
class _Walker:
    """ElementTree parser target: checks each element as expat reports it, keeping no tree."""

    root: dict[str, str] | None = None
    images: list[EmbeddedImage] = field(default_factory=list)
    style_depth: int = 0
    style_text: list[str] = field(default_factory=list)

    def start(self, tag: str, attrib: dict[str, str]) -> None:
        namespace, local = _split(tag)
        if self.root is None:
            if local != "svg" or namespace not in (SVG_NS, None):
                raise _malformed()
            self.root = attrib
        if namespace == XINCLUDE_NS:
            raise _forbidden("XInclude")
        if local in _FORBIDDEN_ELEMENTS:
            raise _forbidden(f"a <{local}> element")
        if local == "style":
            self.style_depth += 1
        for name, value in attrib.items():
            attr_namespace, attr_local = _split(name)
            if attr_namespace == XINCLUDE_NS:
                raise _forbidden("XInclude")
            if attr_namespace == XML_NS and attr_local == "base":
                raise _external()
            if (attr_local == "href" and attr_namespace in (None, XLINK_NS)) or (
                attr_local == "src" and attr_namespace is None
            ):
                self.reference(value)
            if attr_namespace in (None, SVG_NS):
                self.css(value)  # style="…" and presentation attributes are CSS to librsvg

    def start_ns(self, prefix: str, uri: str) -> None:
        if uri == XINCLUDE_NS:
            raise _forbidden("XInclude")

    def end(self, tag: str) -> None:
        if _split(tag)[1] == "style":
            self.style_depth -= 1
            if self.style_depth == 0:
                self.css("".join(self.style_text))
                self.style_text.clear()

    def data(self, text: str) -> None:
        if self.style_depth:
            self.style_text.append(text)

    def pi(self, target: str, data: str) -> None:
        if target.lower() == "xml-stylesheet":
            raise _external()
        raise _forbidden("a processing instruction")

    def close(self) -> None:
        if self.style_depth:
            raise _malformed()

    def css(self, text: str) -> None:
        if "\\" in text:
            raise _forbidden("a CSS escape")
        if _IMPORT.search(text):
            raise _external()
        for match in _URL_FUNCTION.finditer(text):
            argument = _URL_ARGUMENT.match(text, match.end())
            if argument is None:
                raise _external()
            self.reference(next(group for group in argument.groups() if group is not None))

    def reference(self, value: str) -> None:
        target = value.strip(_XML_SPACE)
        if target.startswith("#"):
            return
        if target[:5].lower() == "data:":
            self.images.append(_data_image(target[5:]))
            return
        raise _external()


def _data_image(rest: str) -> EmbeddedImage:
    """The image of a ``data:`` URI (after ``data:``): PNG or JPEG, base64, signature matching."""
    header, comma, payload = rest.partition(",")
    if not comma:
        raise _malformed()
    parts = [part.strip().lower() for part in header.split(";")]
    mime = parts[0]
    if mime == "image/svg+xml":
        raise _forbidden("a nested SVG document")
    if mime not in EMBEDDED_IMAGE_TYPES or parts[-1] != "base64":
        raise _forbidden("an embedded image that is not base64 PNG or JPEG")
    try:
        data = base64.b64decode("".join(payload.split()), validate=True)
    except (binascii.Error, ValueError):
        raise _malformed() from None
    if contenttype.image_mime(data[:64]) != mime:
        raise _forbidden("an embedded image whose content is not its declared type")
    return EmbeddedImage(mime=mime, data=data)


class _Parser(DefusedXMLParser):
    """defusedxml's expat parser (entities and external references refused) that also lets a
    DOCTYPE through when it has no internal subset and names no DTD but the W3C's SVG ones, and
    refuses encodings other than UTF-8."""

    def __init__(self, target: _Walker) -> None:
        super().__init__(target=target, forbid_dtd=True, forbid_entities=True, forbid_external=True)
        self.parser.XmlDeclHandler = self._xml_declaration

    def defused_start_doctype_decl(
        self, name: str, sysid: str | None, pubid: str | None, has_internal_subset: int
    ) -> None:
        if has_internal_subset:
            raise _forbidden("a DTD internal subset (entity declarations)")
        if sysid is not None and not sysid.startswith(_W3C_SVG_DTD):
            raise _external()

    @staticmethod
    def _xml_declaration(version: str, encoding: str | None, standalone: int) -> None:
        if encoding is not None and encoding.lower() not in _UTF8_NAMES:
            raise _forbidden("an encoding other than UTF-8")


def vet(data: bytes) -> VettedSvg:
    """Checks an SVG document against the policy in this module's docstring.

    Args:
        data: the whole file.

    Returns:
        The accepted document, its declared size and its embedded images.

    Raises:
        PermanentJobError: ``CORRUPT_INPUT`` (malformed XML, not UTF-8, root not ``svg``, bad
            base64), ``SVG_FORBIDDEN`` or ``SVG_EXTERNAL_REFERENCE``.
    """
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        raise _malformed() from None
    walker = _Walker()
    parser = _Parser(walker)
    try:
        parser.feed(data)
        parser.close()
    except DefusedXmlException:  # an entity declaration or reference got past the DOCTYPE check
        raise _forbidden("XML entities") from None
    except ParseError:
        raise _malformed() from None
    if walker.root is None:
        raise _malformed()
    return VettedSvg(data=data, declared_size=_declared_size(walker.root), images=tuple(walker.images))


def _declared_size(root: dict[str, str]) -> tuple[float, float] | None:
    box: tuple[float, float] | None = None
    numbers = _NUMBER_LIST.split(root.get("viewBox", "").strip())
    if len(numbers) == 4:
        try:
            box = (abs(float(numbers[2])), abs(float(numbers[3])))
        except ValueError:
            box = None
    width, height = _px(root.get("width")), _px(root.get("height"))
    if width is None or height is None:
        if box is None:
            return None
        # One side given: librsvg keeps the viewBox's aspect ratio.
        if width is not None and box[0] > 0:
            return width, width * box[1] / box[0]
        if height is not None and box[1] > 0:
            return height * box[0] / box[1], height
        return box
    return width, height


def _px(value: str | None) -> float | None:
    """An absolute SVG length in px at 72 dpi; ``None`` when absent or relative (``%``, ``em``)."""
    if value is None:
        return None
    match = _LENGTH.fullmatch(value)
    if match is None:
        return None
    factor = _PX_PER_UNIT.get(match.group(2).lower())
    return None if factor is None else abs(float(match.group(1))) * factor
