"""Keys and argument hashes of effect calls and questions, by the run's key scheme.

Scheme 1 (runs recorded before schema 7, ``runs.key_scheme`` NULL): keys are SHA-256 of the
parts joined with NUL, argument hashes JSON with any other value as its type name. Kept
as they were, so a resume of such a run finds its effects and repeats nothing.

Scheme 2 (every run recorded since): keys hash a length-prefixed, injective framing of the
parts (``canonical.frame``); argument hashes the canonical, type-tagged encoding of every
argument (``canonical.canonical``), so a call is bound to its arguments by value. What an
approver sees (``effects.args``) and a stored result use the same tags.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import uuid
from collections.abc import Sequence
from typing import Any

from ..._store.runs import KEY_SCHEME
from ...errors import LedgerError, UnencodableArgument
from .canonical import Unencodable, canonical, frame
from .codec import dumps_json, loads_json
from .secrets import (
    MIN_LENGTH,
    REDACTED,
    SECRETS,
    is_registered_name,
    is_secret_name,
    registered_only,
    scrub_text,
)
from .tagged import _BIG_INT_BITS, tagged, untag
from .type_names import type_name

__all__ = [
    "KEY_SCHEME",
    "args_hash",
    "bound_hash",
    "call_hashes",
    "call_place",
    "call_text",
    "display_args",
    "effect_key",
    "load_result",
    "question_key",
    "redact",
    "repeated_call",
    "stored_result",
]


def _key(raw: bytes) -> uuid.UUID:
    return uuid.UUID(bytes=hashlib.sha256(raw).digest()[:16])


def effect_key(
    run_id: str, step_key: str, tool: str, call_ordinal: int, scheme: int = KEY_SCHEME
) -> uuid.UUID:
    """The deterministic 128-bit key of one call: run, step, tool and ordinal in the step.
    The keys of plain texts and integers are kept for the calls of the moment (a call's
    ``idempotency_key`` is the key of the call in its chain's first run, its own for most
    runs); any other argument (``True`` for 1, a text subclass with its own equality) is
    never looked up in that cache, whose equality would take it for another call."""
    if (
        type(run_id) is str
        and type(step_key) is str
        and type(tool) is str
        and type(call_ordinal) is int
        and type(scheme) is int
    ):
        return _kept_key(run_id, step_key, tool, call_ordinal, scheme)
    return _effect_key(run_id, step_key, tool, call_ordinal, scheme)


def _effect_key(
    run_id: str, step_key: str, tool: str, call_ordinal: int, scheme: int = KEY_SCHEME
) -> uuid.UUID:
    if scheme == 1:
        return _key("\0".join((run_id, step_key, tool, str(call_ordinal))).encode())
    return _key(b"kernelext.effect\0" + frame(run_id, step_key, tool, call_ordinal))


_kept_key = functools.lru_cache(maxsize=1024)(_effect_key)


def question_key(
    run_id: str, step_key: str, call_ordinal: int, scheme: int = KEY_SCHEME
) -> uuid.UUID:
    """The deterministic key of one question: run, step and ordinal of the call in the step."""
    if scheme == 1:
        return _key("\0".join(("kernelext.ask", run_id, step_key, str(call_ordinal))).encode())
    return _key(b"kernelext.ask\0" + frame(run_id, step_key, call_ordinal))


# -- calls at one site ------------------------------------------------------------------------
# A framework's tool call is made at a fixed place of its model turn (its call site, an ordinal
# >= 0: ``kernelext._adapters.turns.CallSite``), and so is each effect its body calls. The
# first call of each effect there has the site's ordinal (the key it always had); the one made
# after ``n >= 1`` calls of that effect there has ``-1 - pair(site, n - 1)``, ``pair`` the
# Cantor pairing: injective over (site, n), never the ordinal of a site (those are >= 0).
# The stores keep call ordinals as 32-bit integers: ``site + n`` stays under about 65,000.
_LOWEST = -(2**31)


def repeated_call(ordinal: int, earlier: int) -> int:
    """The call ordinal of an effect's call made at the site of ``ordinal`` after ``earlier``
    calls of the same effect there: ``ordinal`` itself for the first (``earlier == 0``)."""
    if ordinal < 0 or earlier < 0:
        raise ValueError(f"a site's ordinal and a count are >= 0, not {ordinal}, {earlier}")
    if earlier == 0:
        return ordinal
    total = ordinal + earlier - 1
    code = -1 - (total * (total + 1) // 2 + earlier - 1)
    if code < _LOWEST:
        raise LedgerError(
            f"More than {earlier} calls of one effect inside one recorded call (call {ordinal} "
            "of its step): the ledger cannot key more calls of it there. Nothing of this call "
            "was recorded. Pass many items to one call (a list) instead of one call each."
        )
    return code


def call_place(call_ordinal: int) -> tuple[int, int]:
    """``(site ordinal, earlier calls of the effect there)`` of a stored call ordinal: the
    inverse of :func:`repeated_call` (``(n, 0)`` for an ordinal ``n >= 0``)."""
    if call_ordinal >= 0:
        return call_ordinal, 0
    z = -1 - call_ordinal
    total = (math.isqrt(8 * z + 1) - 1) // 2
    before = z - total * (total + 1) // 2
    return total - before, before + 1


def call_text(call_ordinal: Any) -> str:
    """A stored call ordinal as a person reads it: ``3``, or ``3 (2nd)`` for the second call
    of an effect at the site of ordinal 3 (a framework's tool call: ``repeated_call``)."""
    if call_ordinal is None:
        return ""
    ordinal, earlier = call_place(int(call_ordinal))
    if not earlier:
        return str(ordinal)
    nth = earlier + 1
    suffix = "th" if nth % 100 in (11, 12, 13) else {1: "st", 2: "nd", 3: "rd"}.get(nth % 10, "th")
    return f"{ordinal} ({nth}{suffix})"


# -- argument hashes -------------------------------------------------------------------------
def _type_name(obj: object) -> str:
    return f"<{type_name(type(obj))}>"  # a moved kernelext class: its former name


def _args_hash_v1(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    text = json.dumps(
        {"a": list(args), "k": kwargs}, sort_keys=True, default=_type_name, separators=(",", ":")
    )
    return hashlib.sha256(text.encode()).hexdigest()[:32]


_PASS_INSTEAD = (
    "Pass plain values: str, int, float, bool, None, Decimal, bytes, datetime, date, time, "
    "timedelta, UUID, Path, enums, dataclasses, pydantic models, lists, tuples, dicts and sets "
    "of them, numpy arrays, pandas or pyarrow data. Keep clients, connections, open files and "
    "functions out of an effect's arguments (use them from the enclosing scope)."
)


def unencodable(tool: str, exc: Unencodable) -> UnencodableArgument:
    return UnencodableArgument(
        f"Effect {tool}: argument {exc.path} is a {exc.type_name} ({exc.why}). A call is bound "
        "to its arguments by value (for its approval, and so that a resume with other "
        "arguments is refused), and kernelext cannot encode this one faithfully; nothing was "
        f"recorded. {_PASS_INSTEAD}"
    )


def args_hash(
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    scheme: int = KEY_SCHEME,
    *,
    tool: str = "the effect",
    names: Sequence[str] = (),
) -> str:
    """The hash a call's arguments are bound by. ``names``: the positional parameters'
    names, for the error that refuses an argument (``UnencodableArgument``)."""
    if scheme == 1:
        return _args_hash_v1(args, kwargs)
    try:
        positional = [
            canonical(a, names[i] if i < len(names) else f"#{i + 1}") for i, a in enumerate(args)
        ]
        named = sorted(frame(k) + canonical(v, k) for k, v in kwargs.items())
    except Unencodable as exc:
        raise unencodable(tool, exc) from None
    raw = frame(len(positional)) + b"".join(positional) + frame(len(named)) + b"".join(named)
    return hashlib.sha256(b"kernelext.args\0" + raw).hexdigest()  # 64 digits; scheme 1: 32


def bound_hash(bound: dict[str, Any], *, tool: str = "the effect") -> str:
    """The hash of a call bound to its function's parameters by name, defaults applied
    (scheme 2): ``pay("bob", 10)``, ``pay("bob", amount=10)`` and ``pay("bob")`` with
    ``amount=10`` as its default are one call; the default's value is bound with it."""
    try:
        named = sorted(frame(k) + canonical(v, k) for k, v in bound.items())
    except Unencodable as exc:
        raise unencodable(tool, exc) from None
    raw = frame(len(named)) + b"".join(named)
    return hashlib.sha256(b"kernelext.bound\0" + raw).hexdigest()


def call_hashes(
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    scheme: int,
    *,
    tool: str,
    names: Sequence[str] = (),
    bound: dict[str, Any] | None = None,
) -> tuple[str, str | None]:
    """``(hash, old)``: the hash a new intent records, and for a scheme-1 run the scheme-1
    hash its rows of an earlier release were recorded with (``None`` otherwise).

    A scheme-1 run keeps its keys, and its rows their hashes; a call it records now is bound
    by value (scheme 2, told apart by its length) unless an argument cannot be encoded, which
    an earlier release accepted: then the old hash, so that such a run can still go on
    (not for a gated call: the ledger refuses that one, see ``Effect.__call__``).
    ``bound`` (scheme 2 only): the call bound by parameter name with defaults applied.
    """
    if scheme >= 2:
        if bound is not None:
            return bound_hash(bound, tool=tool), None
        return args_hash(args, kwargs, scheme, tool=tool, names=names), None
    old = args_hash(args, kwargs, 1)
    try:
        return args_hash(args, kwargs, 2, tool=tool, names=names), old
    except UnencodableArgument:
        return old, old


def hash_for(row_hash: str, new: str, old: str | None) -> str:
    """Which of a call's hashes a recorded row's hash is compared with."""
    return old if old is not None and len(row_hash) == 32 else new


# -- what a person sees ----------------------------------------------------------------------
def redact(value: Any, name: str = "", *, full: bool = False) -> Any:
    """An argument as stored and shown: secrets by name become ``***redacted***``, secrets
    inside text ``***`` (see ``kernelext._core.encoding.secrets``), values JSON has no type
    for tagged
    (``{"$kx": "decimal", "v": "10"}``, see ``kernelext._core.encoding.canonical``). Raises
    ``canonical.Unencodable`` for a value that has no faithful encoding. ``full``: data values
    (arrays, tables) with every value, as an approval request stores them. A text value
    redacted by its name is scrubbed from every text written from now on too (the call's
    error message, a log line), as a registered secret is."""
    if name and is_secret_name(name):
        if isinstance(value, str) and len(value) >= MIN_LENGTH:
            SECRETS.add(value)
        return REDACTED
    return tagged(
        value, secret=is_secret_name, text=scrub_text, redacted=REDACTED, path=name, full=full
    )


def _redact_v1(value: Any, name: str = "") -> Any:
    if name and is_secret_name(name):
        return REDACTED
    if isinstance(value, dict):
        return {str(k): _redact_v1(v, str(k)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_redact_v1(v) for v in value]
    if isinstance(value, str):
        return scrub_text(value)
    if isinstance(value, (int, float, bool)) or value is None:
        return value
    return _type_name(value)


def display_args(
    named: dict[str, Any], scheme: int = KEY_SCHEME, *, tool: str = "", full: bool = False
) -> str:
    """``effects.args``: the call's arguments by name, redacted, data values summarised;
    ``full=True``: ``approvals.args``, data values with every value (``data_args``)."""
    if scheme == 1:
        return json.dumps({k: _redact_v1(v, k) for k, v in named.items()}, default=_type_name)
    try:
        return dumps_json({k: redact(v, k, full=full) for k, v in named.items()}).decode()
    except Unencodable as exc:
        raise unencodable(tool or "the effect", exc) from None


# -- results ---------------------------------------------------------------------------------
def _result_secret(name: str) -> bool:
    return is_registered_name(name)  # never a guess: a resume returns what the run computed


def stored_result(result: Any) -> str:
    """The JSON a result is stored (and replayed on resume) as: plain JSON as it is, other
    types tagged so that a resume gives them back (datetime, Decimal, bytes, tuple, set, …).
    Only registered secrets are masked (values ``***``, keys registered with
    ``kx.secrets.register(name=...)`` ``***redacted***``); no name is guessed, so a resume
    returns what the run computed. The caller gets the result unchanged.
    Raises ``canonical.Unencodable`` for a result that cannot be stored faithfully."""
    kind = type(result)
    if (  # what tagging leaves as it is (a run.map item's count or flag): no walk
        result is None
        or kind is bool
        or (kind is int and result.bit_length() <= _BIG_INT_BITS)
        or (kind is float and math.isfinite(result))
    ):
        return dumps_json(result).decode()
    encoded = tagged(
        result, result=True, secret=_result_secret, text=registered_only, redacted=REDACTED
    )
    return dumps_json(encoded).decode()


def load_result(text: str | bytes) -> Any:
    """A stored result as the value it was (``stored_result`` reversed)."""
    return untag(loads_json(text))
