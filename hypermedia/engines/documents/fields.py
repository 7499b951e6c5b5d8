"""Word fields as the linked-content check (:mod:`hypermedia.engines.documents.links`) reads them, in
any container: which field instructions load content (:data:`FIELD_INSTRUCTIONS`,
:func:`field_command`, one rule for OOXML, Word 97 and RTF), the fields open as a reader meets
them (:class:`Fields`: begin, instruction, separate, result, end; nested), and the fields of a
Word 97–2003 ``WordDocument`` stream (:func:`word_fields`, [MS-DOC] 2.8.25).
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["FIELD_INSTRUCTIONS", "MAX_FIELD_NESTING", "Fields", "field_command", "word_fields"]


FIELD_INSTRUCTIONS: Final = frozenset({"INCLUDEPICTURE", "INCLUDETEXT", "IMPORT", "LINK", "DDE", "DDEAUTO"})
"""Word field instructions that load content from a file or another program."""


_DOC_FIELD_MARKS: Final = re.compile("([\x13\x14\x15])")


MAX_FIELD_NESTING: Final = 20
"""Most fields open inside one another that the check follows (Office writes two or three: an
``IF`` around a ``MERGEFIELD``); past it the outermost is judged on the instruction text it has
and dropped, so that stray field marks in a Word 97 stream's binary parts cost nothing."""


_FIELD_LEADING: Final = (
    "".join(map(chr, range(0x21)))
    + "\x7f\xa0\xad\u1680\u180e\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
    "\u200b\u200c\u200d\u2028\u2029\u202f\u205f\u2060\u3000\ufeff"
    "\"'`\\\u00ab\u00bb\u2018\u2019\u201a\u201b\u201c\u201d\u201e\u201f\u2039\u203a\uff02\uff07"
)
"""What may stand before a field's instruction word and is passed over: white space of any kind,
control characters, quotes of any kind, backslashes (LibreOffice's ``splitFieldCommand`` takes
a quoted first token and skips one leading backslash, tdf#54584)."""
_FIELD_WORD: Final = re.compile(r"[^\W\d_]+")
_FIELD_PREFIX: Final = 64
"""Characters kept of an instruction once its first one is seen: the longest instruction word
(``INCLUDEPICTURE``) is 14."""


def field_command(instruction: str) -> str | None:
    """The loading instruction (upper case, one of :data:`FIELD_INSTRUCTIONS`) that a Word field
    instruction ``instruction`` starts with, or None: the first word after white space, quotes
    and backslashes (:data:`_FIELD_LEADING`), letters only, compared without case. The one rule
    for OOXML, Word 97 and RTF fields; it takes more than Word and LibreOffice do (``\\u00a0``
    or a tab before the word, Unicode letters that upper-case to ASCII), never less."""
    match = _FIELD_WORD.match(instruction.lstrip(_FIELD_LEADING))
    if match is None:
        return None
    word = match.group().upper()
    return word if word in FIELD_INSTRUCTIONS else None


class _Field:
    """One open field: its instruction read two ways. ``evaluated`` is what Word and LibreOffice
    take as the instruction (its own text, and the result of a field nested in it); ``raw`` adds
    everything else inside (a nested field's own instruction, text of RTF destinations that the
    readers may or may not route elsewhere). Both keep :data:`_FIELD_PREFIX` characters from the
    first that is not leading (:data:`_FIELD_LEADING`)."""

    __slots__ = ("evaluated", "in_result", "raw")

    def __init__(self) -> None:
        self.raw = ""
        self.evaluated = ""
        self.in_result = False


def _keep(kept: str, text: str) -> str:
    if not kept:
        text = text.lstrip(_FIELD_LEADING)
    return kept + text[: _FIELD_PREFIX - len(kept)] if len(kept) < _FIELD_PREFIX else kept


class Fields:
    """Word fields as a reader meets them, in any container: :meth:`begin`, instruction
    :meth:`text`, :meth:`separate` (the result follows), result :meth:`text`, :meth:`end`; fields
    nest. ``found`` is the first loading instruction (:func:`field_command`) of any field, in
    either reading of it (:class:`_Field`)."""

    def __init__(self) -> None:
        self.open: list[_Field] = []
        self.found: str | None = None

    def begin(self) -> None:
        if len(self.open) >= MAX_FIELD_NESTING:
            self._judge(self.open.pop(0))
        self.open.append(_Field())

    def text(self, text: str, *, evaluated: bool = True) -> None:
        """``text`` inside the innermost field (its instruction, or its result after
        :meth:`separate`); ``evaluated=False``: text that only the raw reading takes."""
        visible = evaluated
        for field in reversed(self.open):
            if not field.in_result:
                field.raw = _keep(field.raw, text)
                if visible:
                    field.evaluated = _keep(field.evaluated, text)
            visible = visible and field.in_result

    def separate(self) -> None:
        if self.open and not self.open[-1].in_result:
            self.open[-1].in_result = True
            self._judge(self.open[-1])

    def end(self) -> None:
        if self.open:
            field = self.open.pop()
            if not field.in_result:
                self._judge(field)

    def finish(self) -> str | None:
        """Judges the fields left open (a document may end inside one); returns ``found``."""
        while self.open:
            self.end()
        return self.found

    def _judge(self, field: _Field) -> None:
        if self.found is None:
            self.found = field_command(field.evaluated) or field_command(field.raw)


def word_fields(data: bytes) -> str | None:
    """A loading field instruction in a ``WordDocument`` stream, or None: the stream read as
    8-bit text and as UTF-16 at both alignments (the text's pieces may be either), its field
    marks (0x13 begin, 0x14 separate, 0x15 end) followed as :class:`Fields`."""
    for text in (
        data.decode("latin-1"),
        data.decode("utf-16-le", "replace"),
        data[1:].decode("utf-16-le", "replace"),
    ):
        fields = Fields()
        for piece in _DOC_FIELD_MARKS.split(text):
            if piece == "\x13":
                fields.begin()
            elif piece == "\x14":
                fields.separate()
            elif piece == "\x15":
                fields.end()
            elif fields.open:
                fields.text(piece)
            if fields.found is not None:
                break
        found = fields.finish()
        if found is not None:
            return f"a Word {found} field"
    return None
