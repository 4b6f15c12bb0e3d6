"""``kx.secrets``: values and names that never reach the store or kernelext's log.

What is scrubbed, before anything is written (effect arguments and results, error
text, events, kernelext's log lines):

- **Values registered here** (``kx.secrets.register(value)``, at least ``MIN_LENGTH``
  characters) and every credential recorded with ``run.fact(name, value,
  kind="credential")`` or refreshed on resume: each occurrence becomes ``***``, glued to
  other letters too; only a credential's text shorter than 8 characters is masked as a
  whole token (a PIN ``1424`` is not masked inside the amount ``142420``). Its hex and
  base64 forms are masked wherever they occur.
- **Passwords inside URLs and DSNs**: ``postgresql://app:PW@host/db`` is stored as
  ``postgresql://app:***@host/db``.
- **Arguments and keys named like a secret** (password, passwd, pwd, secret, token,
  bearer, api_key, access_key, private_key, auth, authorization, cookie, session,
  credential, signature, in any case and with ``_``, ``-``, ``.`` or camelCase between
  the words: ``accessKey``, ``X-Api-Key``, ``client_secret``), plus names registered
  with ``kx.secrets.register(name=...)``: the whole value becomes ``***redacted***``.
- In free text (error messages, events, log lines, string arguments) also
  ``name=value`` / ``name: value`` pairs with such a name, and ``Bearer <token>``.

Values a run gets back (item and effect results, facts, answers: ``result=True``) are
never changed by a name or pattern guess: only registered values (``***``) and keys of a
name registered with ``register(name=...)`` (``***redacted***``) are masked in them, so
that what a resume returns is what the run computed (:func:`scrub_result`). The guesses
above are for what is shown: arguments, errors, events, log lines, displays.

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
from collections.abc import Mapping
from typing import Any, TypeVar, overload

from ..._shown import install_scrubber, shown, shows
from ..._store.columns import scrubbed_excerpt
from ..._validate import check_name, check_secret, optional, validated
from .secret_forms import (
    CREDENTIAL_MIN_LENGTH,
    _disown,
    _forms,
    _in_own_identity,
    _whole_token,
)

__all__ = [
    "CREDENTIAL_MIN_LENGTH",
    "MASK",
    "MIN_LENGTH",
    "REDACTED",
    "SECRETS",
    "SECRET_NAME",
    "ScrubFilter",
    "SecretRegistry",
    "is_secret_name",
    "scrub",
    "scrub_result",
    "scrub_text",
    "scrubbed_excerpt",
    "shown_json",
]

S = TypeVar("S", str, bytes)
MASK = "***"  # what a secret value inside text becomes
REDACTED = "***redacted***"  # what the value of an argument named like a secret becomes
MIN_LENGTH = 8  # kx.secrets.register: a shorter value cannot be told apart from data

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


def is_registered_name(name: str) -> bool:
    """Whether ``name`` was registered with ``kx.secrets.register(name=...)`` (any case or
    separator): the only names that mask a value a run gets back."""
    names = SECRETS.name_set
    return bool(names) and _classify(name)[1] in names


class SecretRegistry:
    """``kx.secrets``: register values (and argument names) that must never be stored.

    ``kx.secrets.register(value)`` returns the value, so it fits inline:
    ``key = kx.secrets.register(os.environ["API_KEY"])``. ``register(name="x_sig")``
    treats every argument or key called ``x_sig`` (any case or separator) as a secret.
    Registered values are never shown, not even in ``repr``.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # Every form (variant) of every registered value, with the values it came from:
        # forgetting one value drops a form only when no other registered value has it.
        self._owners: dict[str, set[str | bytes]] = {}
        self._anywhere: set[str] = set()  # encoded forms (hex, base64): not whole tokens
        self._byte_owners: dict[bytes, set[str | bytes]] = {}
        self._counts: dict[str | bytes, int] = {}  # a value registered twice: forgotten twice
        self._names: set[str] = set()
        self.name_set: frozenset[str] = frozenset()
        self.pattern: re.Pattern[str] | None = None  # published whole: read without the lock
        self.byte_values: tuple[bytes, ...] = ()  # every form as bytes, for bytes.find

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
        if not isinstance(value, (str, bytes, bytearray)) or len(value) < MIN_LENGTH:
            raise ValueError(
                f"kx.secrets.register needs a str (or bytes) of at least {MIN_LENGTH} "
                f"characters, not a {type(value).__name__}"
                + (f" of {len(value)}" if isinstance(value, (str, bytes, bytearray)) else "")
                + ": a shorter value cannot be told apart from data (a PIN 1424 would hide "
                "the amount 1424). For a short secret such as a PIN, register the name of "
                "the argument that carries it instead: kx.secrets.register(name='pin') "
                "redacts that argument's whole value wherever it is passed."
            )
        if _in_own_identity(value):
            raise ValueError(
                "kx.secrets.register refuses this value: it occurs in this process's own "
                "identity (user@host:pid, recorded as the owner of every run it leases), so "
                "every run would be refused. Register the whole secret, not a user or host "
                "name."
            )
        self._add(value if isinstance(value, str) else bytes(value), count=True)
        return value

    @validated("kx.secrets.add", text=check_secret)
    def add(self, text: str | bytes) -> bool:
        """Scrub ``text`` (str or bytes) from now on; False when it is too short to scrub
        or occurs in this process's own identity (then it is not registered)."""
        owner: str | bytes = text if isinstance(text, str) else bytes(text)
        if len(owner) < CREDENTIAL_MIN_LENGTH:
            return False
        if _in_own_identity(owner):
            _log.warning(
                "kernelext: a credential value occurs in this process's identity "
                "(user@host:pid); it is not scrubbed (every run's owner would be refused)"
            )
            return False
        self._add(owner, count=False)
        return True

    def _add(self, owner: str | bytes, *, count: bool) -> None:
        """Register ``owner``'s forms. ``count``: one more registration (``register``; one
        ``forget`` undoes one); else (a credential recorded again) once is enough."""
        forms, anywhere, byte_forms = _forms(owner)
        with self._lock:
            self._anywhere |= anywhere
            if count or owner not in self._counts:
                self._counts[owner] = self._counts.get(owner, 0) + 1
            changed = False
            for form in forms:
                owners = self._owners.setdefault(form, set())
                changed |= owner not in owners
                owners.add(owner)
            for raw in byte_forms:
                owners = self._byte_owners.setdefault(raw, set())
                changed |= owner not in owners
                owners.add(owner)
            if changed:
                self._publish()

    @validated("kx.secrets.forget", value=optional(check_secret), name=optional(check_name))
    def forget(self, value: str | bytes | None = None, /, *, name: str | None = None) -> None:
        """Stop scrubbing ``value`` (or stop redacting arguments called ``name``).

        Registered twice, a value is forgotten after two ``forget``; a form it shares with
        another registered value (its URL-encoded text is another secret) stays."""
        with self._lock:
            if name is not None:
                self._names.discard(_normalise(name))
                self.name_set = frozenset(self._names)
            if value is None:
                return
            owner: str | bytes = value if isinstance(value, str) else bytes(value)
            count = self._counts.get(owner, 0)
            if count > 1:
                self._counts[owner] = count - 1
                return
            if count == 0:
                return
            del self._counts[owner]
            _disown(self._owners, owner)
            _disown(self._byte_owners, owner)
            self._publish()

    def _publish(self) -> None:
        if not self._owners and not self._byte_owners:
            self.pattern = None
            self.byte_values = ()
            return
        ordered = sorted(self._owners, key=len, reverse=True)  # the longest wins
        raw = {v.encode() for v in ordered} | set(self._byte_owners)
        self.byte_values = tuple(sorted(raw, key=len, reverse=True))
        self._anywhere &= self._owners.keys()
        alternatives = [
            re.escape(form) if form in self._anywhere else _whole_token(form) for form in ordered
        ]
        self.pattern = re.compile("|".join(alternatives)) if ordered else None

    def names(self) -> list[str]:
        """The registered argument names (normalised); the values are never listed."""
        with self._lock:
            return sorted(self._names)

    def __len__(self) -> int:
        with self._lock:
            return len(self._owners) + len(self._byte_owners)

    def __contains__(self, value: object) -> bool:
        if isinstance(value, (bytes, bytearray)):
            value = bytes(value)
        elif not isinstance(value, str):
            return False
        with self._lock:
            return value in self._counts or (isinstance(value, str) and value in self._owners)

    def scrub(self, value: Any) -> Any:
        """A copy of ``value`` (text, or dicts and lists of it) with every secret replaced."""
        return scrub(value)

    def log_filter(self) -> logging.Filter:
        """A ``logging.Filter`` that scrubs secrets from the records of your own loggers, as
        kernelext's logger is: ``logging.getLogger("myapp").addFilter(kx.secrets.log_filter())``
        (or on a handler, for every logger it serves)."""
        return ScrubFilter()

    @shows
    def __repr__(self) -> str:
        names = ", ".join(self.names()) or "none"
        return f"<kx.secrets: {len(self)} value(s) (never shown); names: {names}>"


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


# "SecretRefused: kernelext refuses ..." is an exception's name, not a name: value pair.
_EXCEPTION_NAME = re.compile(r"[A-Z][A-Za-z0-9]*(?:Error|Exception|Refused|Warning)")


def _mask_pair(match: re.Match[str]) -> str:
    if not match["q"] and ":" in match["sep"] and _EXCEPTION_NAME.fullmatch(match["name"]):
        return match[0]
    if not is_secret_name(match["name"]):
        return match[0]
    return f"{match['q']}{match['name']}{match['q']}{match['sep']}{MASK}"


def scrub(value: Any, name: str = "", *, heuristics: bool = True, result: bool = False) -> Any:
    """A copy of ``value`` with secrets replaced: by name (dict keys), then by content.

    Dicts, lists and tuples are walked (keys kept; tuples come back as lists, as JSON has
    them); strings are scrubbed with :func:`scrub_text`; anything else is returned as is.
    ``result=True`` (a value the run gets back): see :func:`scrub_result`.
    """
    if result:
        return scrub_result(value, name)
    if name and is_secret_name(name):
        return REDACTED
    if isinstance(value, str):
        return scrub_text(value, heuristics=heuristics)
    if isinstance(value, Mapping):
        return {
            _scrub_key(k): scrub(v, k if isinstance(k, str) else "", heuristics=heuristics)
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [scrub(v, heuristics=heuristics) for v in value]
    return value


def registered_only(text: str) -> str:
    """``text`` with registered values replaced by ``***``, and nothing else changed."""
    pattern = SECRETS.pattern
    return text if pattern is None else pattern.sub(MASK, text)


def scrub_result(value: Any, name: str = "") -> Any:
    """A value the run gets back (an item's or an effect's result, a fact, an answer) as
    it may be stored: registered values become ``***`` and a key registered with
    ``register(name=...)`` ``***redacted***``; no name or pattern is guessed, so with
    nothing registered the value comes back exactly as it was."""
    if name and is_registered_name(name):
        return REDACTED
    if isinstance(value, str):
        return registered_only(value)
    if isinstance(value, Mapping):
        return {
            (registered_only(k) if isinstance(k, str) else k): scrub_result(
                v, k if isinstance(k, str) else ""
            )
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [scrub_result(v) for v in value]
    return value


def shown_json(value: Any) -> Any:
    """A stored value (JSON text, as in ``effects.result``) as it is shown to people: keys
    named like a secret and ``name=value`` pairs masked as arguments are. Only for display:
    the stored value itself is what the run gets back."""
    if not isinstance(value, str):
        return value
    return StoreScrubber().json(value, result=False)


def _scrub_key(key: Any) -> Any:
    """A dict key keeps its name, but not a registered secret or a URL password in it."""
    if isinstance(key, str) and (SECRETS.pattern is not None or "://" in key):
        return scrub_text(key, heuristics=False)
    return key


# -- the store's one door (kernelext._store.columns) ----------------------------------------
_JSON_KEY = re.compile(r'"((?:[^"\\]|\\.)*)"\s*:')  # the keys of a JSON text (and a few more)


def _secret_key(name: str, result: bool) -> bool:
    return is_registered_name(name) if result else is_secret_name(name)


def _mask_numbers(value: Any, pattern: re.Pattern[str]) -> Any:
    """``value`` with every number whose text holds a registered value turned into ``***``."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, (int, float)):
        return MASK if pattern.search(json.dumps(value)) or pattern.search(str(value)) else value
    if isinstance(value, Mapping):
        return {k: _mask_numbers(v, pattern) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_mask_numbers(v, pattern) for v in value]
    return value


def _no_secret_left(text: str) -> str:
    """The last check of the door: JSON text with no registered value left in it.

    What still holds one gets the plain-text replacement; when that is no longer JSON,
    the whole value is stored as the JSON string ``"***"``. Never the secret."""
    pattern = SECRETS.pattern
    if pattern is None or pattern.search(text) is None:
        return text
    replaced = pattern.sub(MASK, text)
    try:
        json.loads(replaced)
    except ValueError:
        return json.dumps(MASK)
    if pattern.search(replaced) is not None:  # a replacement made a new one: give up
        return json.dumps(MASK)
    return replaced


class StoreScrubber:
    """What the store's write path calls for each value (see ``kernelext._store.columns``)."""

    def text(self, value: str) -> str:
        return scrub_text(value)

    def json(self, value: str, *, result: bool) -> str:
        """JSON text scrubbed by name and by value; unchanged text when nothing changed.

        Text holding no registered value (in any escaped form), no URL password and no
        key named like a secret is returned at once, without a parse. A ``result`` (a value
        the run gets back) is changed only by registered values and names (``scrub_result``)."""
        pattern = SECRETS.pattern  # it knows the JSON-escaped forms: the raw text is enough
        if not (pattern is not None and pattern.search(value)) and not (
            not result and "://" in value and _URL_PASSWORD.search(value)
        ):
            if result and not SECRETS.name_set:
                return value
            names = _JSON_KEY.findall(value)
            if not any(_secret_key(name, result) for name in names) and (
                result or not _has_hint(value)  # arguments: also name=value pairs in text
            ):
                return value
        try:
            decoded = json.loads(value)
        except ValueError:
            if result:
                return _no_secret_left(registered_only(value))
            return _no_secret_left(scrub_text(value))
        clean = scrub(decoded, result=result)
        out = value if clean == decoded else json.dumps(clean, ensure_ascii=False, default=str)
        if pattern is None or pattern.search(out) is None:
            return out
        # Still there, by construction checked: a number (4111222233334444 for the secret
        # "4111222233334444"), which scrub() leaves alone. Such a number becomes "***".
        out = json.dumps(_mask_numbers(clean, pattern), ensure_ascii=False, default=str)
        return _no_secret_left(out)

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
    """Scrubs every record of the ``kernelext`` logger before any handler sees it (and of
    any logger given one: ``kx.secrets.log_filter()``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a broken format: keep what can be shown, scrubbed
            message = f"{record.msg} {record.args!r}"
        clean = shown(scrub_text(message))  # one line: a newline may not forge another
        if clean != message or record.args:
            record.msg, record.args = clean, ()
        if record.exc_info and not record.exc_text:
            exc_text = logging.Formatter().formatException(record.exc_info)
            record.exc_text = shown(scrub_text(exc_text), lines=True)
        elif record.exc_text:
            record.exc_text = shown(scrub_text(record.exc_text), lines=True)
        if record.stack_info:
            record.stack_info = shown(scrub_text(record.stack_info), lines=True)
        return True


def _install_log_filter() -> None:
    if not any(isinstance(f, ScrubFilter) for f in _log.filters):
        _log.addFilter(ScrubFilter())


def _install_store_scrubber() -> None:
    """The store may not import core: hand its write path (store/columns.py) the scrubber."""
    from ..._store import columns

    columns.install(StoreScrubber())


_install_log_filter()
_install_store_scrubber()
install_scrubber(registered_only)  # every text the display door shows masks them
