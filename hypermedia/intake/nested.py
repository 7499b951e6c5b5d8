"""Office packages inside office packages, checked for macros at upload like the package itself.

An embedded object is a whole document: a ``.docm`` or an ``.xlsm`` inside a ``.docx``
(``word/embeddings/``), an ODF object (``Object 1/``, which may hold its own ``Basic/``), an OLE
compound file (``oleObject1.bin``, an ``Object N`` storage in ODF) holding a VBA project or, in
its ``Package`` stream, an OOXML package. :func:`hypermedia.intake.archives.find_macros` and
:func:`hypermedia.intake.ole.find_macros` look at one container; this module finds every entry or
stream that is itself a zip or a compound file (by its first bytes, not its name) and checks it
with the same two functions and the same bounds (:func:`hypermedia.intake.archives.inspect`,
:func:`hypermedia.intake.ole.inspect`), at most :data:`MAX_DEPTH` levels down.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Final

import olefile

from hypermedia.intake import archives, ole

__all__ = ["MAX_DEPTH", "MAX_EMBEDDED_BYTES", "find_macros_in_ole", "find_macros_in_zip"]

MAX_DEPTH: Final = 3
"""Deepest package inside a package that is opened (Office writes one level; a chart or an
object inside an embedded object makes two); a deeper one is refused ``ARCHIVE_NESTED_TOO_DEEP``."""

MAX_EMBEDDED_BYTES: Final = 100 * 1024 * 1024
"""Largest embedded package read into memory to be checked (bytes): the largest upload
(``HM_MAX_UPLOAD_BYTES``' default); a larger one is refused ``ARCHIVE_TOO_LARGE``."""

_HEAD = 8


def _is_container(head: bytes) -> bool:
    return archives.is_zip(head) or head.startswith(ole.SIGNATURE)


def _check(name: str, data: bytes, depth: int) -> str | None:
    """Macros in one embedded container ``data`` (found as ``name``) at ``depth``, or None."""
    if depth > MAX_DEPTH:
        raise archives.ArchiveRejected(
            f"the document nests packages more than {MAX_DEPTH} deep ({name})", "ARCHIVE_NESTED_TOO_DEEP"
        )
    if data.startswith(ole.SIGNATURE):
        found = ole.inspect(data).macros or find_macros_in_ole(data, depth)
    else:
        inner = archives.inspect(data)
        found = archives.find_macros(inner, archives.package_types(inner)) or find_macros_in_zip(inner, depth)
    return None if found is None else (found if " in " in found else f"{found} in {name}")


def _too_large(name: str) -> archives.ArchiveRejected:
    return archives.ArchiveRejected(
        f"an embedded package ({name}) is larger than {MAX_EMBEDDED_BYTES} bytes", "ARCHIVE_TOO_LARGE"
    )


def find_macros_in_zip(archive: archives.Archive, depth: int = 0) -> str | None:
    """Macros in the packages embedded in ``archive`` (one that passed
    :func:`hypermedia.intake.archives.inspect`, found at nesting ``depth``), at any depth, or None.

    Returns:
        What carries them, e.g. ``"a VBA project (vbaProject.bin) in word/embeddings/x.docm"``.

    Raises:
        hypermedia.intake.archives.ArchiveRejected: an embedded package that fails its own container's
            checks (its ``ARCHIVE_*`` code), is larger than :data:`MAX_EMBEDDED_BYTES`
            (``ARCHIVE_TOO_LARGE``) or lies deeper than :data:`MAX_DEPTH` (``ARCHIVE_NESTED_TOO_DEEP``).
    """
    for info in archive.entries:
        if info.is_dir() or info.file_size < _HEAD:
            continue
        if not _is_container(archive.read_head(info, _HEAD)):
            continue
        if info.file_size > MAX_EMBEDDED_BYTES:
            raise _too_large(info.filename)
        found = _check(info.filename, archive.read(info, MAX_EMBEDDED_BYTES), depth + 1)
        if found is not None:
            return found
    return None


def _streams(data: bytes) -> Iterator[tuple[str, int, olefile.OleFileIO]]:
    with olefile.OleFileIO(io.BytesIO(data)) as compound:
        for entry in compound.listdir(streams=True, storages=False):
            yield "/".join(entry), compound.get_size(entry), compound


def find_macros_in_ole(data: bytes, depth: int = 0) -> str | None:
    """Macros in the packages embedded in the compound file ``data`` (one that passed
    :func:`hypermedia.intake.ole.inspect`): every stream that is a zip or a compound file, such as an
    OLE object's ``Package`` stream. See :func:`find_macros_in_zip` for the rest."""
    for name, size, compound in _streams(data):
        if size < _HEAD:
            continue
        with compound.openstream(name.split("/")) as stream:
            if not _is_container(stream.read(_HEAD)):
                continue
        if size > MAX_EMBEDDED_BYTES:
            raise _too_large(name)
        found = _check(name, bytes(compound.openstream(name.split("/")).read()), depth + 1)
        if found is not None:
            return found
    return None
