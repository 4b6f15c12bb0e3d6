"""The display door's Unicode data: invisible characters and look-alikes of plain ASCII.

Python's ``unicodedata`` has neither the Default_Ignorable_Code_Point property nor the
UTS 39 confusables, so kernelext/_unicode_data.py holds them, generated from Unicode's
files by tools/unicode_data.py. Here the table is checked against characters known from
the standard, and each trick (an invisible character after a letter, a look-alike of a
plain letter, digits of another script) against what the door shows.
"""

from __future__ import annotations

import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernelext._shown import invisible, shown
from kernelext._unicode_data import CONFUSABLES_VERSION, DEFAULT_IGNORABLE, TO_ASCII

# Default_Ignorable_Code_Point in DerivedCoreProperties.txt 17.0.0: some members (range
# ends included), 4174 code points in all; and neighbours that are not members.
IGNORABLE = (
    "\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180b\u180e\u180f\u200b\u200f\u202a\u202e"
    "\u2060\u2064\u2065\u2066\u206f\u3164\ufe00\ufe0f\ufeff\uffa0\ufff0\ufff8"
    "\U0001bca0\U0001bca3\U0001d173\U0001d17a\U000e0000\U000e0001\U000e0020\U000e007f"
    "\U000e0100\U000e01ef\U000e0fff"
)
NOT_IGNORABLE = "a\u00a0\u034e\u0350\u115e\u1161\u17b3\u17b6\u180a\u2010\u0301\ufe10\ufff9"
IGNORABLE_COUNT = 4174
BLANKS = "\u2800\u3164\u115f\u1160\uffa0"
# Format characters that draw a sign (Arabic number signs, ...): escaped as format, not
# ignorable.
VISIBLE_FORMAT = {*range(0x600, 0x606), 0x6DD, 0x70F, 0x890, 0x891, 0x8E2, 0x110BD, 0x110CD}


def test_the_ignorable_table_is_unicodes() -> None:
    members = {p for start, end in DEFAULT_IGNORABLE for p in range(start, end + 1)}
    assert len(members) == IGNORABLE_COUNT
    assert {ord(c) for c in IGNORABLE} <= members
    assert not {ord(c) for c in NOT_IGNORABLE} & members
    for point in range(0x110000):  # every format character but the visible ones
        if unicodedata.category(chr(point)) == "Cf" and point not in VISIBLE_FORMAT:
            assert point in members or 0xFFF9 <= point <= 0xFFFB or point >= 0x13430, hex(point)
    assert all(invisible(c) for c in IGNORABLE + BLANKS)
    assert not any(invisible(c) for c in NOT_IGNORABLE)


def test_the_confusables_are_unicodes() -> None:
    assert CONFUSABLES_VERSION >= "15.1.0"
    for char, prototype in {"\u217c": "l", "\u0131": "i", "\u0251": "a", "\u2024": ".",
                            "\u2215": "/", "\ua789": ":", "\u09ea": "8", "\u0430": "a",
                            "\u01c0": "l"}.items():  # fmt: skip
        assert TO_ASCII[char] == prototype
    assert all(prototype.isascii() and not char.isascii() for char, prototype in TO_ASCII.items())


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(["bob@bank.com", "paypal.com", "caf\u00e9", "\u6771\u4eac"]),
    st.integers(0, 20),
    st.one_of(
        st.sampled_from(IGNORABLE + BLANKS),
        st.integers(0xE0000, 0xE0FFF).map(chr),
        st.integers(0xFE00, 0xFE0F).map(chr),
    ),
)
def test_an_invisible_character_is_escaped_wherever_it_stands(
    word: str, at: int, hidden: str
) -> None:
    at = min(at, len(word))
    text = word[:at] + hidden + word[at:]
    seen = shown(text)
    assert hidden not in seen
    assert seen.startswith(word[:at]) and seen.count("\\") == 1
    assert shown(seen) == seen


LOOK = "[look-alike characters]"


@pytest.mark.parametrize(
    ("raw", "flags"),
    [
        ("paypa\u3163.com", ["mixed scripts: Latin + Hangul", LOOK]),  # Hangul i
        ("g\u3147\u3147gle.com", ["mixed scripts: Latin + Hangul", LOOK]),  # Hangul ieung
        ("paypa\u4e28.com", ["mixed scripts: Latin + Han", LOOK]),  # Han "gun" stroke
        ("g\u30edogle.com", ["mixed scripts: Latin + Katakana", LOOK]),  # Katakana ro
        ("paypa\u217c.com", [LOOK]),  # small roman numeral fifty
        ("paypa\u01c0.com", [LOOK]),  # dental click
        ("p\u0251ypal.com", [LOOK]),  # Latin alpha
        ("g\u0131thub.com", [LOOK]),  # dotless i
        ("paypal\u2024com", [LOOK]),  # one dot leader
        ("a.com\u2215evil", [LOOK]),  # division slash
        ("http\ua789//x", [LOOK]),  # modifier letter colon
        ("\u0440\u0430\u0443\u0440\u0430\u0406", [LOOK]),  # all Cyrillic, reads paypal
        ("12\u09ea4", [LOOK, "[digits of several scripts]"]),  # reads 1284, int() 1244
        ("\u0661\u0662\u0663\u0664\u0665\u0666\u0667 12", None),  # one script a number
    ],
)  # fmt: skip
def test_a_look_alike_of_plain_text_is_flagged(raw: str, flags: list[str] | None) -> None:
    seen = shown(f"pay {raw} now")
    if flags is None:
        assert "[" not in seen
        return
    expected = " ".join(f if f.startswith("[") else f"[{f}]" for f in flags)
    assert f"{expected} now" in seen, seen
    assert shown(seen) == seen


@pytest.mark.parametrize(
    "plain",
    [
        "caf\u00e9 cafe\u0301 na\u00efve \u00c5ngstr\u00f6m",
        "\u6771\u4eactokyo \u30e9\u30fc\u30e1\u30f3bar \uc11c\uc6b8seoul \uc774 \uc624",
        "don\u2019t \u201cquote\u201d 2020\u20132021 \u2014 wait\u2026",
        "3 rows \u00d7 3 columns, 3\u00d74, \u22125 \u00b0C, 5\u2032 2\u2033, a\u00b7b",
        "\u043c\u043e\u0441\u043a\u0432\u0430 \u0928\u092e\u0938\u094d\u0924\u0947 "
        "\u05e9\u05dc\u05d5\u05dd \u0645\u0631\u062d\u0628\u0627",
        "\u0967\u0968\u0969 \u0661\u0662 12",
    ],
)
def test_ordinary_words_are_not_flagged(plain: str) -> None:
    assert shown(plain) == plain
