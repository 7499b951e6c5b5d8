"""An RTF document read for the linked-content check (:mod:`hypermedia.engines.documents.links`):
the loading fields in every ``\\fldinst`` (nested ones too) and linked objects (``\\objautlink``,
``\\objlink``; RTF 1.9.1 "Objects"), found by a tokenizer that reads RTF as LibreOffice does
(:func:`find_external`: groups, control words and symbols, ``\\'hh`` and ``\\uN`` escapes,
destinations), not by a pattern over the bytes (issue 14: a doubled brace, a hex escape, a field
split over groups passed the pattern).
"""

from __future__ import annotations

import codecs
import re
from dataclasses import dataclass
from typing import Final

from hypermedia.engines.documents.fields import Fields
from hypermedia.engines.documents.linkerrors import CheckLimitExceeded

__all__ = ["MAX_RTF_NESTING", "find_external"]


MAX_RTF_NESTING: Final = 1000
"""Deepest RTF group nesting (``{`` inside ``{``) the check reads; deeper is
:class:`CheckLimitExceeded`. Word and LibreOffice write a few dozen at most."""


_RTF_TOKEN: Final = re.compile(
    rb"\\([a-zA-Z]+)(-?[0-9]*) ?"  # a control word, its parameter, the space that ends it
    rb"|\\'[\r\n]*([0-9a-fA-F])[\r\n]*([0-9a-fA-F])"  # a hex escape (LibreOffice reads CR LF between)
    rb"|\\(.?)"  # a control symbol
    rb"|([{}])"
    rb"|[\r\n]+"  # ignored by readers
    rb"|([^\\{}\r\n]+)",
    re.DOTALL,
)
_RTF_SYMBOLS: Final = {
    b"~": "\xa0",
    b"_": "\u2011",
    b"\\": "\\",
    b"{": "{",
    b"}": "}",
    b"\n": " ",
    b"\r": " ",
}
"""Control symbols that stand for text (``\\~`` no-break space, ``\\_`` no-break hyphen, escaped
braces and backslash, a backslash before a line end is a paragraph); the others (``\\-``
optional hyphen, ``\\:``, ``\\|``) stand for none."""
_RTF_DESTINATIONS: Final = frozenset(
    (
        "annotation atnauthor atndate atnicn atnid atnparent atnref atntime atrfend atrfstart "
        "author background bkmkend bkmkstart blipuid buptim category colorschememapping colortbl "
        "comment company creatim datafield datastore defchp defpap do doccomm docvar dptxbxtext "
        "ebcend ebcstart factoidname falt fchars ffdeftext ffentrymcr ffexitmcr ffformat "
        "ffhelptext ffl ffname ffstattext file filetbl fldtype fname fontemb fontfile fonttbl "
        "footer footerf footerl footerr footnote formfield ftncn ftnsep ftnsepc g generator "
        "gridtbl header headerf headerl headerr hl hlfr hlinkbase hlloc hlsrc hsv htmltag info "
        "keycode keywords latentstyles lchars levelnumbers leveltext lfolevel linkval list "
        "listlevel listname listoverride listoverridetable listpicture liststylename listtable "
        "listtext lsdlockedexcept macc maccPr mailmerge manager mhtmltag mmath mmathPr "
        "nesttableprops nextfile nonesttables nonshppict objalias objclass objdata object "
        "objname objsect objtime oldcprops oldpprops oldsprops oldtprops oleclsid operator "
        "panose password passwordhash pgp pgptbl picprop pict pn pnseclvl pntext pntxta pntxtb "
        "printim private propname protend protstart protusertbl pxe result revtbl revtim rsidtbl "
        "rxe shp shpgrp shpinst shppict shprslt shptxt sn sp staticval stylesheet subject sv svb "
        "tc template themedata title txe ud upr userprops wgrffmtfilter windowcaption "
        "writereservation writereservhash xe xform xmlattrname xmlattrvalue xmlclose xmlname "
        "xmlnstbl xmlopen"
    ).split()
)
"""RTF 1.9.1's destinations (control words that send the rest of their group somewhere other
than the text), less ``field``, ``fldinst`` and ``fldrslt``: text in one of them, inside a field
instruction, is taken by the raw reading only (:class:`~hypermedia.engines.documents.fields.Fields`),
in case a reader keeps it."""


@dataclass
class _RtfGroup:
    """What an RTF group inherits from its parent and restores when it ends."""

    uc: int = 1
    """Fallback characters after a ``\\uN`` (``\\ucN``)."""
    skip: int = 0
    """Fallback characters still to pass over."""
    evaluated: bool = True
    """False in a destination (:data:`_RTF_DESTINATIONS`): its text is the raw reading's only."""
    ignored: bool = False
    """In a ``{\\*\\dest …}`` group whose destination readers do not know (they skip it whole) or
    in a bookmark's name: no reading takes its text; a ``\\fldinst`` in it is read all the same.
    A ``\\*`` destination they know (:data:`_RTF_DESTINATIONS`) is a destination like another."""
    starred: bool = False
    """``\\*`` came last: the next control word names an ignorable destination."""
    fields: int = 0
    """Fields this group's ``\\fldinst`` groups began, ended with it (the ``\\field`` group)."""
    instruction: bool = False
    """The group is a ``\\fldinst``: its end separates the instruction from the result."""


def find_external(data: bytes) -> str | None:
    """An RTF document's loading field (:func:`field_command`, in every ``\\fldinst``, nested
    ones too) or linked object (``\\objautlink``, ``\\objlink``), or None. Reads the document as
    LibreOffice's tokenizer does: groups, control words with their parameter and one space,
    control symbols, ``\\'hh`` in the ``\\ansicpg`` code page (or cp1252), ``\\uN`` and the
    ``\\ucN`` characters after it skipped, ``\\binN`` data passed over, CR and LF ignored.

    Raises:
        CheckLimitExceeded: groups nested deeper than :data:`MAX_RTF_NESTING`.
    """
    if not any(word in data for word in (b"\\fldinst", b"\\objlink", b"\\objautlink")):
        return None  # control words are plain ASCII in the bytes: nothing to find (29 MB of text: 3.6 s)
    fields = Fields()
    stack = [_RtfGroup()]
    codec = "cp1252"
    pending = bytearray()  # hex escapes in a row, decoded together (double-byte code pages)

    def emit(text: str) -> None:
        group = stack[-1]
        if group.skip:
            taken = min(group.skip, len(text))
            group.skip -= taken
            text = text[taken:]
        if text and fields.open and not group.ignored:
            fields.text(text, evaluated=group.evaluated)

    def flush() -> None:
        if pending:
            text = bytes(pending).decode(codec, "replace")
            pending.clear()
            emit(text)

    position, size = 0, len(data)
    while position < size and fields.found is None:
        match = _RTF_TOKEN.match(data, position)
        if match is None:  # pragma: no cover - the pattern matches any byte
            break
        position = match.end()
        word, parameter, high, low, symbol, brace, text = match.groups()
        if high is not None:
            if stack[-1].skip:
                stack[-1].skip -= 1
            else:
                pending.append(int(high + low, 16))
            continue
        flush()
        group = stack[-1]
        if text is not None:
            emit(text.decode(codec, "replace"))
        elif brace == b"{":
            if len(stack) > MAX_RTF_NESTING:
                raise CheckLimitExceeded(f"RTF groups nested more than {MAX_RTF_NESTING} deep")
            stack.append(_RtfGroup(group.uc, group.skip, group.evaluated, group.ignored))
        elif brace == b"}":
            if len(stack) > 1:
                ended = stack.pop()
                if ended.instruction:
                    fields.separate()
                for _ in range(ended.fields):
                    fields.end()
        elif symbol is not None:
            group.starred = symbol == b"*"
            if symbol in _RTF_SYMBOLS:
                emit(_RTF_SYMBOLS[symbol])
        elif word is not None:
            name = word.decode("ascii")
            starred, group.starred = group.starred, False
            number = int(parameter) if 0 < len(parameter.lstrip(b"-")) <= 10 else None
            if number is not None and not -(2**31) <= number < 2**31:
                number = None  # past a 32-bit parameter readers differ: \\bin is not skipped
            if name in ("objautlink", "objlink"):
                return "an RTF linked object"
            if name == "fldinst":
                fields.begin()
                group.instruction = True
                group.evaluated, group.ignored = True, False
                stack[-2 if len(stack) > 1 else -1].fields += 1
            elif name in ("field", "fldrslt"):
                pass
            elif name == "ud":
                group.evaluated = True  # LibreOffice reads a \\upr's Unicode half as plain text
            elif (starred and name not in _RTF_DESTINATIONS) or name in ("bkmkstart", "bkmkend"):
                group.ignored = True  # skipped whole, or a bookmark's name
            elif name in _RTF_DESTINATIONS:
                group.evaluated = False
            elif name == "bin" and number is not None and number > 0:
                position += number
            elif name == "u" and number is not None:
                emit(chr(number % 0x10000))
                group.skip = group.uc
            elif name == "uc" and number is not None:
                group.uc = max(number, 0)
            elif name == "ansicpg" and number is not None:
                codec = _rtf_codec(number, codec)
    flush()
    found = fields.finish()
    return None if found is None else f"an RTF {found} field"


def _rtf_codec(code_page: int, current: str) -> str:
    """Python's codec for an RTF ``\\ansicpgN``, or ``current`` if it has none (an unknown or
    EBCDIC code page: the words the check looks for are ASCII in every ANSI code page)."""
    name = f"cp{code_page}"
    try:
        codecs.lookup(name)
    except LookupError:
        return current
    return current if code_page in _EBCDIC_CODE_PAGES else name


_EBCDIC_CODE_PAGES: Final = frozenset({37, 273, 500, 875, 1026, 1140})
