"""``kx.secrets``: values and names that never reach the store or kernelext's log.

What is scrubbed, before anything is written (effect arguments and results, error
text, events, kernelext's log lines):

- **Values registered here** (``kx.secrets.register(value)``) and every credential
  recorded with ``run.fact(name, value, kind="credential")`` or refreshed on resume:
  each occurrence (substring) becomes ``***``.
- **Passwords inside URLs and DSNs**: ``postgresql://app:PW@host/db`` is stored as
  ``postgresql://app:***@host/db``.
- **Arguments and keys named like a secret** (password, passwd, pwd, secret, token,
  bearer, api_key, access_key, private_key, auth, authorization, cookie, session,
  credential, signature, in any case and with ``_``, ``-``, ``.`` or camelCase between
  the words: ``accessKey``, ``X-Api-Key``, ``client_secret``), plus names registered
  with ``kx.secrets.register(name=...)``: the whole value becomes ``***redacted***``.
- In free text (error messages, events, log lines, string arguments) also
  ``name=value`` / ``name: value`` pairs with such a name, and ``Bearer <token>``.

The hot path stays cheap: with nothing registered no value search runs at all, the
patterns are compiled once, and the pattern scans run only on text that contains
their anchor (``://``; for pairs and tokens one of the secret words, then ``=``/``:``).
"""

from __future__ import annotations

import functools
import json
import logging
import re
import threading
import urllib.parse
from collections.abc import Mapping
from typing import Any, TypeVar, overload

from ..validate import check_name, check_secret, optional, validated

__all__ = [
    "MASK",
    "MIN_LENGTH",
    "REDACTED",
    "SECRETS",
    "SECRET_NAME",
    "ScrubFilter",
    "SecretRegistry",
    "is_secret_name",
    "scrub",
    "scrub_text",
]

S = TypeVar("S", str, bytes)
MASK = "***"  # what a secret value inside text becomes
REDACTED = "***redacted***"  # what the value of an argument named like a secret becomes
MIN_LENGTH = 4  # shorter values would scrub ordinary text

# Applied to a normalised name (camelCase split, lower case, separators turned into "_").
# Unambiguous stems count anywhere; short ones (token, auth, session, pass) only as a whole
# word, so that ``max_tokens``, ``author`` or ``passenger`` are not secrets.
SECRET_NAME = re.compile(
    r"pass(?:word|wd|phrase)|pwd|secret|credential|api_?key|access_?key|private_?key"
    r"|bearer|cookie|authori[sz]ation|signature"
    r"|(?:^|_)(?:[a-z0-9]*token|o?auth|session[a-z0-9]*|pass)(?=_|$)"
)
_CAMEL = re.compile(r"([a-z0-9])([A-Z])")
_SEPARATORS = re.compile(r"[^a-z0-9]+")

# scheme://user:PASSWORD@host — the password may hold "@", so the last "@" before the host.
_URL_PASSWORD = re.compile(
    r"(?P<head>\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s:/?#@\"'<>]*):"
    r"(?P<secret>[^\s/?#\"'<>]*)@"
)
# name=value, name: value, "name": "value" — the name decides (is_secret_name).
_PAIR = re.compile(
    r"(?P<q>[\"']?)(?P<name>[A-Za-z_][\w.\-]*)(?P=q)(?P<sep>\s*[:=]\s*)"
    r"(?P<value>\"[^\"]*\"|'[^']*'|(?:Bearer|Basic|Digest|Token)\s+[^\s,;&\"']+"
    r"|[^\s,;&)}\]\"']+)"
)
_BEARER = re.compile(r"(?P<head>\bBearer\s+)[A-Za-z0-9\-._~+/]+=*", re.IGNORECASE)
# A cheap first look (substring tests, far faster than a case-blind regex): without one of
# these words no pair or Bearer token can match.
_HINTS = (
    "pass", "pwd", "secret", "credential", "key", "bearer", "cookie", "auth", "signature",
    "token", "session",
)  # fmt: skip

_log = logging.getLogger("kernelext")


def _normalise(name: str) -> str:
    return _SEPARATORS.sub("_", _CAMEL.sub(r"\1_\2", name).lower()).strip("_")


@functools.lru_cache(maxsize=4096)
def _classify(name: str) -> tuple[bool, str]:
    """(matches the built-in list, normalised name): argument names repeat, so cached."""
    normal = _normalise(name)
    return bool(SECRET_NAME.search(normal)), normal


def is_secret_name(name: str) -> bool:
    """Whether an argument or key called ``name`` holds a secret (see the module doc)."""
    builtin, normal = _classify(name)
    return builtin or normal in SECRETS.name_set


class SecretRegistry:
    """``kx.secrets``: register values (and argument names) that must never be stored.

    ``kx.secrets.register(value)`` returns the value, so it fits inline:
    ``key = kx.secrets.register(os.environ["API_KEY"])``. ``register(name="x_sig")``
    treats every argument or key called ``x_sig`` (any case or separator) as a secret.
    Registered values are never shown, not even in ``repr``.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: set[str] = set()
        self._names: set[str] = set()
        self.name_set: frozenset[str] = frozenset()
        self.pattern: re.Pattern[str] | None = None  # published whole: read without the lock
        self.byte_values: tuple[bytes, ...] = ()  # the values as UTF-8, for bytes.find

    @overload
    def register(self, value: S, /) -> S: ...

    @overload
    def register(self, value: None = None, /, *, name: str) -> str: ...

    @validated("kx.secrets.register", name=optional(check_name))  # value: checked below
    def register(self, value: str | bytes | None = None, /, *, name: str | None = None) -> Any:
        """Scrub ``value`` everywhere from now on; or, with ``name=``, redact that argument."""
        if (value is None) == (name is None):
            raise TypeError(
                "kx.secrets.register takes a value (kx.secrets.register(token)) or a name "
                "(kx.secrets.register(name='x_signature')), one of the two."
            )
        if name is not None:
            if not isinstance(name, str) or not _normalise(name):
                raise ValueError(f"A secret's name must be a non-empty string, not {name!r}.")
            with self._lock:
                self._names.add(_normalise(name))
                self.name_set = frozenset(self._names)
            return name
        text = _as_text(value)
        if text is None or len(text) < MIN_LENGTH:
            raise ValueError(
                f"kx.secrets.register needs a str (or UTF-8 bytes) of at least {MIN_LENGTH} "
                f"characters, not a {type(value).__name__}"
                + (f" of {len(text)}" if text is not None else "")
                + ": a shorter value would be scrubbed out of ordinary text."
            )
        self.add(text)
        return value

    @validated("kx.secrets.add", text=check_secret)
    def add(self, text: str) -> bool:
        """Scrub ``text`` from now on (no checks); False when it is too short to scrub."""
        if len(text) < MIN_LENGTH:
            return False
        variants = _variants(text)
        with self._lock:
            if variants <= self._values:
                return True
            self._values |= variants
            self._publish()
        return True

    @validated("kx.secrets.forget", value=optional(check_secret), name=optional(check_name))
    def forget(self, value: str | bytes | None = None, /, *, name: str | None = None) -> None:
        """Stop scrubbing ``value`` (or stop redacting arguments called ``name``)."""
        with self._lock:
            if name is not None:
                self._names.discard(_normalise(name))
                self.name_set = frozenset(self._names)
            text = _as_text(value) if value is not None else None
            if text is not None:
                self._values -= _variants(text)
                self._publish()

    def _publish(self) -> None:
        if not self._values:
            self.pattern = None
            self.byte_values = ()
            return
        ordered = sorted(self._values, key=len, reverse=True)  # the longest wins
        self.byte_values = tuple(v.encode() for v in ordered)
        self.pattern = re.compile("|".join(map(re.escape, ordered)))

    def names(self) -> list[str]:
        """The registered argument names (normalised); the values are never listed."""
        with self._lock:
            return sorted(self._names)

    def __len__(self) -> int:
        with self._lock:
            return len(self._values)

    def __contains__(self, value: object) -> bool:
        text = _as_text(value)
        with self._lock:
            return text is not None and text in self._values

    def scrub(self, value: Any) -> Any:
        """A copy of ``value`` (text, or dicts and lists of it) with every secret replaced."""
        return scrub(value)

    def __repr__(self) -> str:
        names = ", ".join(self.names()) or "none"
        return f"<kx.secrets: {len(self)} value(s) (never shown); names: {names}>"


def _variants(text: str) -> set[str]:
    """The forms a value takes in stored text: as is, URL-encoded, escaped as in JSON
    (ASCII or not) and as in a Python ``repr`` (an exception's message quoting it)."""
    forms = {
        text,
        urllib.parse.quote(text, safe=""),
        json.dumps(text)[1:-1],
        json.dumps(text, ensure_ascii=False)[1:-1],
        repr(text)[1:-1],
    }
    return {form for form in forms if len(form) >= MIN_LENGTH}


def _as_text(value: object) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray)):
        try:
            return bytes(value).decode()
        except UnicodeDecodeError:
            return None
    return None


SECRETS = SecretRegistry()


# -- scrubbing ---------------------------------------------------------------------------
def scrub_text(text: str, *, heuristics: bool = True) -> str:
    """``text`` with registered values and URL passwords replaced by ``***``.

    ``heuristics`` also masks ``name=value`` pairs and ``Bearer`` tokens: right for text
    that is only shown (errors, events, logs), not for data a resume returns (results).
    """
    pattern = SECRETS.pattern
    if pattern is not None:
        text = pattern.sub(MASK, text)
    if "://" in text:
        text = _URL_PASSWORD.sub(r"\g<head>:" + MASK + "@", text)
    if heuristics and _has_hint(text):
        if "=" in text or ":" in text:
            text = _PAIR.sub(_mask_pair, text)
        text = _BEARER.sub(r"\g<head>" + MASK, text)
    return text


def _has_hint(text: str) -> bool:
    lower = text.lower()
    return any(word in lower for word in _HINTS)


def _mask_pair(match: re.Match[str]) -> str:
    if not is_secret_name(match["name"]):
        return match[0]
    return f"{match['q']}{match['name']}{match['q']}{match['sep']}{MASK}"


# Words that name a secret in an argument list but often name plain data in a result
# (``{"token": "Hello", "logprob": -0.1}`` in a model's answer): a result keeps them.
AMBIGUOUS_IN_RESULTS = frozenset({"token", "tokens", "session", "auth", "key", "pass"})


def scrub(value: Any, name: str = "", *, heuristics: bool = True, result: bool = False) -> Any:
    """A copy of ``value`` with secrets replaced: by name (dict keys), then by content.

    Dicts, lists and tuples are walked (keys kept; tuples come back as lists, as JSON has
    them); strings are scrubbed with :func:`scrub_text`; anything else is returned as is.
    ``result=True`` (an effect's result, replayed on resume) keeps keys named only by an
    ambiguous word such as ``token``; ``access_token``, ``password`` … are still redacted.
    """
    ambiguous = result and _normalise(name) in AMBIGUOUS_IN_RESULTS
    if name and not ambiguous and is_secret_name(name):
        return REDACTED
    if isinstance(value, str):
        return scrub_text(value, heuristics=heuristics)
    if isinstance(value, Mapping):
        return {
            _scrub_key(k): scrub(
                v, k if isinstance(k, str) else "", heuristics=heuristics, result=result
            )
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [scrub(v, heuristics=heuristics, result=result) for v in value]
    return value


def _scrub_key(key: Any) -> Any:
    """A dict key keeps its name, but not a registered secret or a URL password in it."""
    if isinstance(key, str) and (SECRETS.pattern is not None or "://" in key):
        return scrub_text(key, heuristics=False)
    return key


# -- the store's one door (kernelext.store.columns) ----------------------------------------
_JSON_KEY = re.compile(r'"((?:[^"\\]|\\.)*)"\s*:')  # the keys of a JSON text (and a few more)


def _secret_key(name: str, result: bool) -> bool:
    if result and _classify(name)[1] in AMBIGUOUS_IN_RESULTS:
        return False
    return is_secret_name(name)


class StoreScrubber:
    """What the store's write path calls for each value (see ``kernelext.store.columns``)."""

    def text(self, value: str) -> str:
        return scrub_text(value)

    def json(self, value: str, *, result: bool) -> str:
        """JSON text scrubbed by name and by value; unchanged text when nothing changed.

        Text holding no registered value (in any escaped form), no URL password and no
        key named like a secret is returned at once, without a parse."""
        pattern = SECRETS.pattern  # it knows the JSON-escaped forms: the raw text is enough
        if not (pattern is not None and pattern.search(value)) and not (
            "://" in value and _URL_PASSWORD.search(value)
        ):
            names = _JSON_KEY.findall(value)
            if not any(_secret_key(name, result) for name in names) and (
                result or not _has_hint(value)  # arguments: also name=value pairs in text
            ):
                return value
        try:
            decoded = json.loads(value)
        except ValueError:
            return scrub_text(value, heuristics=not result)
        clean = scrub(decoded, heuristics=not result, result=result)
        if clean == decoded:
            return value
        return json.dumps(clean, ensure_ascii=False, default=str)

    def armed(self) -> bool:
        return SECRETS.pattern is not None

    def holds_secret(self, value: Any) -> bool:
        """Does ``value`` (text or bytes) contain a registered value? One ``find`` per value
        when some are registered; nothing at all otherwise."""
        pattern = SECRETS.pattern
        if pattern is None:
            return False
        if isinstance(value, str):
            return pattern.search(value) is not None
        if isinstance(value, (bytes, bytearray, memoryview)):
            data = value if isinstance(value, (bytes, bytearray)) else bytes(value)
            return any(data.find(v) >= 0 for v in SECRETS.byte_values)
        return False


# -- kernelext's log lines -----------------------------------------------------------------
class ScrubFilter(logging.Filter):
    """Scrubs every record of the ``kernelext`` logger before any handler sees it."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a broken format: keep what can be shown, scrubbed
            message = f"{record.msg} {record.args!r}"
        clean = scrub_text(message)
        if clean != message or record.args:
            record.msg, record.args = clean, ()
        if record.exc_info and not record.exc_text:
            record.exc_text = scrub_text(logging.Formatter().formatException(record.exc_info))
        elif record.exc_text:
            record.exc_text = scrub_text(record.exc_text)
        if record.stack_info:
            record.stack_info = scrub_text(record.stack_info)
        return True


def _install_log_filter() -> None:
    if not any(isinstance(f, ScrubFilter) for f in _log.filters):
        _log.addFilter(ScrubFilter())


def _install_store_scrubber() -> None:
    """The store may not import core: hand its write path (store/columns.py) the scrubber."""
    from ..store import columns

    columns.install(StoreScrubber())


_install_log_filter()
_install_store_scrubber()
