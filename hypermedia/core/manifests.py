"""Text outputs that name sibling outputs of their job — HLS playlists (RFC 8216) and WebVTT
thumbnail tracks — and their references rewritten into URLs. Pure text: no I/O here; the use case
that reads outputs and signs URLs is :mod:`services.gateway.resolved`, and the client's
``submit --download`` rewrites them into the names of the files it saved
(:mod:`hypermedia.client.commands`).

A reference is a sibling's ``output_type`` written as it is (``hls_720p``, ``sprite``), never a
path or a URL: a worker stores every output under a key of its own
(``derived/{pool}/{source}/{profile_version}/{output_type}-{digest}``), so only the gateway knows
where each one can be downloaded from. What is rewritten:

- HLS: a URI line (RFC 8216 §4.1: a line that is neither blank nor starts with ``#``) equal to a
  name, and a quoted ``URI="name"`` attribute of any ``#EXT`` tag (``EXT-X-MAP``, ``EXT-X-MEDIA``,
  ``EXT-X-I-FRAME-STREAM-INF``, …). Every other byte stays, ``EXT-X-BYTERANGE`` and ``BYTERANGE=``
  included.
- WebVTT: a cue payload line that is ``name`` or ``name#fragment`` (``sprite#xywh=0,0,160,90``:
  Media Fragments, the form thumbnail tracks use); the fragment is kept after the URL. Headers,
  ``NOTE``/``STYLE``/``REGION`` blocks, cue identifiers and timings stay.

Anything that names no sibling is left as it is. Line terminators (LF, CRLF, CR) are kept.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator
from enum import Enum

HLS_MIME_TYPES = frozenset(
    {"application/vnd.apple.mpegurl", "application/x-mpegurl", "audio/mpegurl", "audio/x-mpegurl"}
)
"""Media types of an HLS playlist (RFC 8216 §4 names the first; players accept the others)."""
VTT_MIME_TYPES = frozenset({"text/vtt"})

Link = Callable[[str], str | None]
"""Maps a name found in the text to its URL, or None to leave the reference as it is."""

_NAME = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}")
"""What a reference may be: one output type (the storage service's form of ``output_type``)."""
_LINE = re.compile(r"([^\r\n]*)(\r\n|\r|\n|$)")
_URI_ATTRIBUTE = re.compile(r'([:,]URI=")([^"\r\n]*)(")')
_VTT_REFERENCE = re.compile(r"^([a-z0-9][a-z0-9_.-]{0,63})(#[^\s]*)?$")
_EXTINF = re.compile(r"^#EXTINF:\s*([0-9]{1,9}(?:\.[0-9]{1,9})?)")
_VTT_END = re.compile(r"-->\s*(?:([0-9]{1,9}):)?([0-5][0-9]):([0-5][0-9])\.([0-9]{3})")
MAX_PRESENTATION_SECONDS = 7 * 24 * 3600
"""Cap of :func:`presentation_seconds` (a week: the longest a presigned URL may live anyway)."""


class ManifestKind(Enum):
    """Which rewriting a text output takes."""

    HLS = "hls"
    VTT = "vtt"


def kind_of(mime_type: str) -> ManifestKind | None:
    """The kind of an output of ``mime_type`` (parameters such as ``; charset=utf-8`` ignored),
    None when it is neither an HLS playlist nor WebVTT."""
    base = mime_type.split(";", 1)[0].strip().lower()
    if base in HLS_MIME_TYPES:
        return ManifestKind.HLS
    if base in VTT_MIME_TYPES:
        return ManifestKind.VTT
    return None


def _lines(text: str) -> Iterator[tuple[str, str]]:
    """``(line, terminator)`` pairs covering ``text`` exactly (the last terminator may be "")."""
    for match in _LINE.finditer(text):
        line, end = match.group(1), match.group(2)
        if not line and not end:  # the empty match at the very end
            return
        yield line, end


def rewrite(kind: ManifestKind, text: str, link: Link) -> str:
    """``text`` with every reference ``link`` maps to a URL replaced by that URL."""
    return rewrite_hls(text, link) if kind is ManifestKind.HLS else rewrite_vtt(text, link)


def references(kind: ManifestKind, text: str) -> set[str]:
    """The names :func:`rewrite` would offer to ``link``: the text's candidate references."""
    found: set[str] = set()

    def record(name: str) -> None:
        found.add(name)

    rewrite(kind, text, record)
    return found


def rewrite_hls(text: str, link: Link) -> str:
    """An HLS playlist (master or media) with URI lines and ``URI="…"`` tag attributes that name
    a sibling replaced by their URLs."""

    def attribute(match: re.Match[str]) -> str:
        name = match.group(2)
        url = link(name) if _NAME.fullmatch(name) else None
        return f"{match.group(1)}{url}{match.group(3)}" if url is not None else match.group(0)

    out = []
    for line, end in _lines(text):
        if line.startswith("#EXT"):
            line = _URI_ATTRIBUTE.sub(attribute, line)
        elif line and not line.startswith("#") and _NAME.fullmatch(line):
            line = link(line) or line
        out.append(line + end)
    return "".join(out)


def rewrite_vtt(text: str, link: Link) -> str:
    """A WebVTT file with cue payload lines ``name`` / ``name#fragment`` that name a sibling
    replaced by ``{url}`` / ``{url}#fragment``.

    A block is a cue when its first or second line holds ``-->`` (the timing line, after an
    optional identifier); the lines after the timing line up to the next blank line are its
    payload. A ``NOTE`` block cannot contain ``-->`` (WebVTT §4.1), so it is never taken for one.
    """
    out = []
    in_block = 0  # lines of the current block seen so far
    in_payload = False
    for line, end in _lines(text):
        if not line:
            in_block, in_payload = 0, False
            out.append(end)
            continue
        in_block += 1
        if in_payload:
            match = _VTT_REFERENCE.match(line)
            url = link(match.group(1)) if match else None
            if match and url is not None:
                line = url + (match.group(2) or "")
        elif "-->" in line and in_block <= 2:
            in_payload = True
        out.append(line + end)
    return "".join(out)


def presentation_seconds(kind: ManifestKind, text: str) -> int:
    """How long playing the text takes, rounded up (seconds, at most
    :data:`MAX_PRESENTATION_SECONDS`): an HLS media playlist's ``#EXTINF`` durations added up, a
    WebVTT file's latest cue end. 0 for a master playlist (it has no segments) or no cues."""
    total = 0.0
    for line, _end in _lines(text):
        if kind is ManifestKind.HLS:
            match = _EXTINF.match(line)
            if match:
                total += float(match.group(1))
        else:
            end_match = _VTT_END.search(line)
            if end_match:
                hours, minutes, seconds, millis = (int(g or 0) for g in end_match.groups())
                total = max(total, hours * 3600 + minutes * 60 + seconds + millis / 1000)
        if total >= MAX_PRESENTATION_SECONDS:
            return MAX_PRESENTATION_SECONDS
    return math.ceil(total)
