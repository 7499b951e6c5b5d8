"""What the linked-content check (:mod:`hypermedia.engines.documents.links`, and the readers it
uses: :mod:`~hypermedia.engines.documents.xmlparts`, :mod:`~hypermedia.engines.documents.rtf`)
raises when it cannot be sure of a document.
"""

from __future__ import annotations

__all__ = ["CheckLimitExceeded", "MalformedDocument"]


class MalformedDocument(ValueError):
    """A part the check reads is not well-formed XML or declares a DTD with an internal subset
    (entities), or a container (the document, or a package or compound file inside it) does not
    open: nothing is sure about what LibreOffice would make of it."""


class CheckLimitExceeded(MalformedDocument):
    """The document nests packages deeper than :data:`~hypermedia.engines.documents.links.MAX_NESTING`
    or makes the check decompress more than
    :data:`~hypermedia.engines.documents.links.MAX_CHECKED_BYTES`."""
