"""The forms a registered secret takes in stored text (as is, URL- and JSON-escaped, its
``repr``, hex and base64) and how each is matched: as a whole token, or anywhere. Read by
``kx.secrets`` (``secrets.SecretRegistry``) when a value is registered."""

from __future__ import annotations

import base64
import json
import re
import urllib.parse
from typing import TypeVar

__all__ = ["CREDENTIAL_MIN_LENGTH", "GLUED_FROM"]

CREDENTIAL_MIN_LENGTH = 4  # a credential's text: still scrubbed (as a whole token) from 4
F = TypeVar("F", str, bytes)


def _disown(table: dict[F, set[str | bytes]], owner: str | bytes) -> None:
    """Drop ``owner`` from every form's owners; a form nobody owns any more goes."""
    for form in [f for f, owners in table.items() if owner in owners]:
        table[form].discard(owner)
        if not table[form]:
            del table[form]


# Encoded forms shorter than this would match ordinary base64 / hex text by chance.
_MIN_ENCODED = 8
# A form this long is masked even glued to letters or digits: every value
# ``kx.secrets.register`` takes (``MIN_LENGTH``, 8), so that ``"abc" + secret + "xyz"`` is
# never stored. Only a credential's shorter text (4 to 7 characters: a PIN) is matched as a
# whole token, so that a PIN ``1424`` does not hide the amount ``142420``.
GLUED_FROM = 8


def _whole_token(form: str) -> str:
    """A pattern for ``form`` as a whole token: not glued to a letter or digit on a side
    where it begins or ends with one (``1424`` is not found in ``142420`` or ``A1424``).
    A form of ``GLUED_FROM`` characters or more is found anywhere: text that holds a
    registered value glued to other letters holds the value, not data that happens to
    look like it."""
    if len(form) >= GLUED_FROM:
        return re.escape(form)
    head = r"(?<![^\W_])" if form[0].isalnum() else ""
    tail = r"(?![^\W_])" if form[-1].isalnum() else ""
    return f"{head}{re.escape(form)}{tail}"


def _forms(value: str | bytes) -> tuple[set[str], set[str], set[bytes]]:
    """Every form a registered value takes in stored text, and as raw bytes.

    One list, so that what is covered is read in one place (docs/security.md, "What is
    stored, and what is redacted"). Each form costs one more alternative of the one compiled
    pattern (and one ``bytes.find`` in the byte-level refusal). Returned: the text forms
    (matched as whole tokens), those of them matched anywhere (hex and base64: inside a
    longer encoded text by construction), the byte forms. Not covered: a secret split in
    two, a form shorter than ``GLUED_FROM`` glued to letters or digits, a change of case,
    other encodings (UTF-16, gzip...)."""
    if isinstance(value, str):
        text: str | None = value
        raw = value.encode("utf-8", errors="surrogatepass")
    else:
        raw = bytes(value)
        try:
            text = raw.decode()
        except UnicodeDecodeError:
            text = None  # not UTF-8: only its raw bytes and its byte-derived forms
    forms: set[str] = set()
    if text is not None:
        forms |= {
            text,  # as is
            urllib.parse.quote(text, safe=""),  # a URL or DSN (space -> %20)
            urllib.parse.quote_plus(text, safe=""),  # a query string / urlencode (space -> +)
            json.dumps(text)[1:-1],  # inside JSON text, non-ASCII escaped (\u00e4)
            json.dumps(text, ensure_ascii=False)[1:-1],  # inside JSON text, as is
            repr(text)[1:-1],  # an exception message quoting it: repr()
            ascii(text)[1:-1],  # ascii() of a non-ASCII secret (\xe4)
        }
    forms.add(repr(raw)[2:-1])  # the repr of its UTF-8 bytes: b'p\xc3\xa4...'
    encoded = {raw.hex(), raw.hex().upper()}  # hex, lower and upper case
    # base64 of a longer text holding the secret depends on where it starts (mod 3): the
    # secret's own base64 at offsets 0, 1 and 2 (0-2 prefix bytes), minus the first and
    # last group, which mix in the neighbours. A substring of every rendition, padded or
    # not; standard and URL-safe alphabets.
    for k in range(3):
        whole = base64.b64encode(b"\0" * k + raw).decode()
        full = (k + len(raw)) // 3  # complete groups of three bytes
        middle = whole[(4 if k else 0) : 4 * full]
        encoded |= {middle, middle.replace("+", "-").replace("/", "_")}
    anywhere = {form for form in encoded if len(form) >= _MIN_ENCODED}
    text_forms = {f for f in forms | anywhere if len(f) >= CREDENTIAL_MIN_LENGTH}
    byte_forms = {raw} if len(raw) >= CREDENTIAL_MIN_LENGTH else set()
    return text_forms, anywhere, byte_forms


def _in_own_identity(value: str | bytes) -> bool:
    """Does ``value`` occur in this process's identity (``user@host:pid``)?"""
    from ..._store.base import actor

    me = actor()
    if isinstance(value, str):
        return value in me
    return bytes(value) in me.encode()
