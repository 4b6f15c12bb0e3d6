"""What a person reads: the one door for every text kernelext shows.

Every surface passes its text through :func:`shown` (the command line: all it prints; the
``repr`` and ``text()`` of public objects; the widgets and the saved copy, through
:func:`shown_html`; error messages). Stored text was written by code and by the outside
world, so it may hold characters that draw something other than what is there:

- **Escaped** (an allow-list): letters, digits, punctuation, symbols and the plain space
  pass as they are; a combining mark passes after a letter, digit, punctuation or symbol
  (up to ``MARKS_IN_A_ROW`` in a row). Everything else is shown as its escape: control
  characters (``\\x1b``, ``\\x07``; ``\\n``, ``\\r``, ``\\t`` in a one-line value), format
  characters such as the zero-width space ``\\u200b`` and the bidi overrides and isolates
  (``\\u202e``), other spaces (``\\xa0``), line and paragraph separators, private-use,
  unassigned and surrogate code points.
- **Flagged in place**: a word (text between spaces) that mixes scripts the way no real
  word does (UTS 39, "highly restrictive": Latin with Han, Hiragana, Katakana, Bopomofo
  or Hangul is allowed) reads ``pаypal.com [mixed scripts: Latin + Cyrillic]``; one with
  look-alike forms of plain letters or digits (fullwidth ``ｐ``, mathematical ``𝐩``) reads
  ``[look-alike characters]``, as does any word that is not plain ASCII but reads as
  plain ASCII (its UTS 39 skeleton, from Unicode's confusables, is ASCII: ``paypaⅼ.com``,
  ``gıthub.com``, ``paypal․com``, ``a.com∕evil``; typographic quotes, dashes, primes,
  ``×``, ``−`` and the ellipsis excepted); Latin mixes with Han, Kana or Hangul only
  where those letters do not draw a plain letter or digit (``paypaㅣ.com`` and
  ``gロogle.com`` are flagged); a number with digits of several scripts (``12৪4``,
  which ``int()`` reads as 1244) reads ``[digits of several scripts]``; a line with
  right-to-left letters and digits, whose order a display may turn around, ends with
  ``[right-to-left text]``.
- **Invisible wherever they stand**: every Default_Ignorable_Code_Point (variation
  selectors, the combining grapheme joiner, Hangul fillers, tag characters...) and the
  blank-looking Braille pattern U+2800 are escaped, even after a letter.
- **Masked**: values registered with ``kx.secrets.register`` read ``***`` (the secrets
  module installs its scrubber here: :func:`install_scrubber`).

:func:`shown` is idempotent: text that went through it once comes back the same, so a
text made of shown parts can pass the door again (the command line's streams do).
"""

from __future__ import annotations

import functools
import html
import re
import unicodedata
from collections.abc import Callable
from typing import Any, TypeVar

from ._unicode_data import DEFAULT_IGNORABLE, TO_ASCII

__all__ = [
    "MARKS_IN_A_ROW",
    "install_scrubber",
    "invisible",
    "shown",
    "shown_frame",
    "shown_html",
    "shows",
]

MARKS_IN_A_ROW = 3  # combining marks after one base character (vowel signs, accents)
_RAW = frozenset("LNPS")  # the major categories shown as they are (and the space)
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_WORD = re.compile(r"[^ \n\t]+")
# Scripts that mix in ordinary words (UTS 39 "highly restrictive"), besides a single one.
_MIXES = (
    frozenset({"Latin", "Han", "Hiragana", "Katakana"}),
    frozenset({"Latin", "Han", "Bopomofo"}),
    frozenset({"Latin", "Han", "Hangul"}),
)
_SCRIPT_WORDS = {"CJK": "Han", "KANGXI": "Han", "IDEOGRAPHIC": "Han"}
_RTL = frozenset({"R", "AL"})
_LOOK_ALIKE_FORMS = ("<wide>", "<font>")  # fullwidth ``ｐ``, mathematical ``𝐩``
# Blank-looking characters that are not Default_Ignorable: the Braille blank, the
# musical null notehead.
_BLANKS = frozenset("\u2800\U0001d159")
# Typography that reads as what it is in prose (quotes, dashes, the ellipsis, primes, the
# signs of multiplication and minus, the middle dot).
_PROSE = frozenset("\u2018\u2019\u201c\u201d\u2013\u2014\u2026\u02bc\u2032\u2033\u00d7\u2212\u00b7")
# CJK letters drawn as a plain letter or digit, which confusables.txt maps to other CJK
# letters only (one stroke: l, I, 1; a ring or a box: o; a bar: -).
_CJK_TO_ASCII = {
    **dict.fromkeys("\u4e28\u3163\u1175\uffdc\u2f01", "l"),
    **dict.fromkeys("\u3147\u110b\u11bc\uffb7\u3007\u30ed\uff9b\u53e3\u2f1d", "o"),
    **dict.fromkeys("\u4e00\u3161\u1173\uffda\u2f00", "-"),
    **dict.fromkeys("\u5de5\u30a8\uff74", "I"),
    **dict.fromkeys("\u3134\u1102", "L"),
}
_CJK = frozenset({"Han", "Hiragana", "Katakana", "Bopomofo", "Hangul"})
_SCRUB: Callable[[str], str] | None = None


def install_scrubber(scrub: Callable[[str], str]) -> None:
    """Called by ``kernelext._core.encoding.secrets`` at import: what is shown masks registered
    values (the door knows no secrets itself)."""
    global _SCRUB
    _SCRUB = scrub


@functools.lru_cache(maxsize=8192)
def invisible(char: str) -> bool:
    """A Default_Ignorable_Code_Point or a blank-looking character: escaped wherever it is."""
    point = ord(char)
    if char in _BLANKS:
        return True
    return any(start <= point <= end for start, end in DEFAULT_IGNORABLE)


@functools.lru_cache(maxsize=8192)
def _escape(char: str) -> str:
    if char in _NAMED:
        return _NAMED[char]
    point = ord(char)
    if point < 0x100:
        return f"\\x{point:02x}"
    return f"\\u{point:04x}" if point < 0x10000 else f"\\U{point:08x}"


@functools.lru_cache(maxsize=8192)
def _raw(char: str) -> bool:
    """Shown as it is wherever it stands (not a mark: see :func:`_escaped`)."""
    if char == " ":
        return True
    return unicodedata.category(char)[0] in _RAW and not invisible(char)


def _escaped(text: str, lines: bool) -> str:
    out: list[str] = []
    marks = MARKS_IN_A_ROW  # none may follow the start of the text
    for char in text:
        if _raw(char):
            out.append(char)
            marks = 0 if char != " " else MARKS_IN_A_ROW  # a mark may follow a base
        elif lines and char == "\n":
            out.append(char)
            marks = MARKS_IN_A_ROW
        elif _mark(char) and marks < MARKS_IN_A_ROW:
            out.append(char)
            marks += 1
        else:
            out.append(_escape(char))
            marks = MARKS_IN_A_ROW
    return "".join(out)


@functools.lru_cache(maxsize=8192)
def _mark(char: str) -> bool:
    return unicodedata.category(char)[0] == "M" and not invisible(char)


@functools.lru_cache(maxsize=8192)
def _script(char: str) -> str | None:
    """The script of a letter, from its Unicode name (``CYRILLIC SMALL LETTER A``); that of
    its plain form for a compatibility letter (fullwidth ``ｐ`` is Latin)."""
    category = unicodedata.category(char)
    if category[0] != "L" or category == "Lm":
        return None  # digits, punctuation, marks, modifier letters: common to scripts
    plain = unicodedata.normalize("NFKC", char)
    if plain != char and len(plain) == 1:
        return _script(plain)
    name = unicodedata.name(char, "")
    first = name.split(" ", 1)[0] if name else "Unknown"
    return _SCRIPT_WORDS.get(first, first.capitalize())


@functools.lru_cache(maxsize=8192)
def _flags(word: str) -> tuple[str, ...]:
    scripts = {s for s in map(_script, word) if s is not None}
    flags = []
    if len(scripts) > 1 and not _allowed_mix(word, scripts):
        flags.append("mixed scripts: " + " + ".join(sorted(scripts, key=_script_order)))
    if any(_look_alike(char) for char in word) or _reads_as_ascii(word):
        flags.append("look-alike characters")
    if len({_zero(char) for char in word if unicodedata.category(char) == "Nd"}) > 1:
        flags.append("digits of several scripts")
    return tuple(flags)


def _allowed_mix(word: str, scripts: set[str]) -> bool:
    """A mix of UTS 39 "highly restrictive", whose CJK letters draw no plain letter."""
    if not any(scripts <= mix for mix in _MIXES):
        return False
    return not any(_script(c) in _CJK and _skeleton(c).isascii() for c in word)


def _zero(digit: str) -> int:
    return ord(digit) - unicodedata.digit(digit, 0)


@functools.lru_cache(maxsize=8192)
def _skeleton(char: str) -> str:
    """What ``char`` reads as (UTS 39: its decomposition, each part's prototype); a
    Hangul syllable is drawn as one, not as its parts."""
    if "\uac00" <= char <= "\ud7a3":
        return char
    parts = unicodedata.normalize("NFD", char)
    return "".join(TO_ASCII.get(p) or _CJK_TO_ASCII.get(p) or p for p in parts)


def _reads_as_ascii(word: str) -> bool:
    """Not plain ASCII, but drawn as plain ASCII (typographic quotes and dashes aside)."""
    if all(c.isascii() or c in _PROSE for c in word):
        return False
    return all(c.isascii() or c in _PROSE or _skeleton(c).isascii() for c in word)


def _script_order(script: str) -> tuple[int, str]:
    return (script != "Latin", script)  # Latin first: "Latin + Cyrillic"


@functools.lru_cache(maxsize=8192)
def _look_alike(char: str) -> bool:
    """A fullwidth or mathematical form of a plain letter or digit (not a superscript
    ``ª`` or ``²``, which read as what they are)."""
    if char.isascii() or not unicodedata.decomposition(char).startswith(_LOOK_ALIKE_FORMS):
        return False
    plain = unicodedata.normalize("NFKC", char)
    return plain.isascii() and plain.isalnum()


def _flagged(text: str) -> str:
    """``text`` with a flag after each suspicious word (not twice: see the module doc)."""
    if text.isascii():
        return text
    out: list[str] = []
    end = 0
    for match in _WORD.finditer(text):
        flags = _flags(match[0])
        if not flags:
            continue
        out.append(text[end : match.end()])
        end = match.end()
        for flag in flags:
            label = f" [{flag}]"
            if not text.startswith(label, end):
                out.append(label)
            else:  # already flagged (the text passed the door before)
                out.append(label)
                end += len(label)
    out.append(text[end:])
    return "\n".join(map(_rtl_flagged, "".join(out).split("\n")))


_RTL_FLAG = " [right-to-left text]"


def _rtl_flagged(line: str) -> str:
    """A line whose right-to-left letters may turn the order of its digits around."""
    if line.endswith(_RTL_FLAG) or not any(c.isdigit() for c in line):
        return line
    if not any(unicodedata.bidirectional(c) in _RTL for c in line):
        return line
    return line + _RTL_FLAG


def shown(value: Any, *, lines: bool = False) -> str:
    """``value`` (``str()`` of it) as a person may read it: what could draw something else
    escaped, suspicious words flagged (see the module doc). ``lines``: newlines stay (a
    text of several lines); else a one-line value shows them as ``\\n``."""
    text = value if isinstance(value, str) else str(value)
    if _SCRUB is not None:
        text = _SCRUB(text)
    if text.isascii() and (text.isprintable() or _ascii_lines(text, lines)):
        return text  # the usual case, at the cost of two scans
    return _flagged(_escaped(text, lines))


def _ascii_lines(text: str, lines: bool) -> bool:
    return lines and text.replace("\n", "").isprintable()


def shown_html(value: Any, *, lines: bool = True) -> str:
    """:func:`shown`, then escaped for HTML (text of an element or of an attribute)."""
    return html.escape(shown(value, lines=lines))


def _cell(value: Any) -> Any:
    return shown(value) if isinstance(value, str) else value


def _column_name(name: Any) -> str:
    """A column's name as read: a name that is not text says its type (``0 (int)``), so
    columns ``0`` and ``"0"`` do not look the same."""
    return shown(name) if isinstance(name, str) else shown(f"{name!r} ({type(name).__name__})")


def shown_frame(frame: Any) -> Any:
    """``frame`` (a pandas DataFrame) as it may be read: a copy whose text cells and column
    names passed the door (a name that is not text marked with its type), columns holding
    no such text left as they are (dtype and all); ``frame`` itself when nothing changes."""
    copy = frame
    for index in range(frame.shape[1]):
        column = frame.iloc[:, index]
        if any(isinstance(v, str) and shown(v) != v for v in column):
            copy = frame.copy() if copy is frame else copy
            copy.isetitem(index, column.map(_cell))
    names = [_column_name(name) for name in frame.columns]
    if getattr(frame.columns, "nlevels", 1) == 1 and names != list(frame.columns):
        copy = frame.copy() if copy is frame else copy
        copy.columns = names
    return copy


F = TypeVar("F", bound=Callable[..., str])


def shows(method: F) -> F:
    """A ``repr``/``text()``/``__str__`` whose text passes the door (several lines kept)."""

    @functools.wraps(method)
    def door(*args: Any, **kwargs: Any) -> str:
        return shown(method(*args, **kwargs), lines=True)

    return door  # type: ignore[return-value]
