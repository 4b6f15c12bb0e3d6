"""One door for stored text: what each column may hold, and the scrubbing write path.

Every value that reaches a store column goes through :class:`ScrubbingTx`, the wrapper
the writer hands to every job (DuckDB and PostgreSQL alike); every hot-path record goes
through :mod:`kernelext._store.record_door` (the same rules per field) before it is
journaled or applied; side files refuse secrets in :func:`refuse_secret`. The ``?``
parameters of a write statement are mapped to their ``(table, column)`` by reading our own
statement text once (cached per SQL string, in :mod:`kernelext._store.param_columns`), and
each column is declared in :data:`SCRUBBED`:

- ``text``: registered values, credentials and URL passwords become ``***``, and
  ``password=…`` / ``Bearer …`` pairs are masked (text that is only shown).
- ``args``: JSON; keys named like a secret become ``***redacted***``, strings as ``text``.
- ``result``: JSON a run gets back (replayed on resume): never changed by a name or a
  pattern, only registered values (``***``) and registered names (``***redacted***``).
- ``key``: an id or lookup key (run id, step key, tool, fact name): scrubbing would break
  lookups, so a value holding a registered secret is refused (:class:`SecretRefused`).
- ``exact``: data that must round-trip byte for byte (``run.state`` snapshots, LangGraph
  checkpoints): refused when it holds a registered secret (use ``run.credential``).
- ``plain``: not scrubbed; the reason says why (hashes, enums, timestamps, paths we made).

Whatever the mode, a value passes untouched only when its type holds no text (``_INERT``:
None, flags, numbers, ids, timestamps); text is scrubbed, lists, tuples and dicts are walked
(keys too), bytes are refused when they hold a secret, and any other object (an ``Enum``
member, a ``str`` subclass, a dataclass) is reduced to its text or refused (``_clean``).

A statement the mapper cannot read gets the conservative default: every ``str``
parameter scrubbed as ``text`` and every ``bytes`` one refused if it holds a secret.
The store knows no secrets itself: ``kernelext._core.encoding.secrets`` installs the scrubber
(:func:`install`). With nothing registered, ``key``/``exact`` checks cost nothing and
``text`` costs two substring tests.
"""

from __future__ import annotations

import datetime as dt
import enum
import functools
import uuid
from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol

from ..errors import SecretRefused
from .param_columns import param_columns

__all__ = [
    "SCRUBBED",
    "Column",
    "Scrubber",
    "ScrubbingTx",
    "SecretRefused",
    "install",
    "param_columns",
    "refuse_secret",
    "scrub_params",
    "scrubbed_excerpt",
]


class Column(NamedTuple):
    mode: str  # text | args | result | key | exact | plain
    why: str


_T = "text"
_ID = Column("key", "an id or lookup key: scrubbing it would break lookups, so a secret is refused")
_RUN = Column("key", "a run id: refused when it holds a registered secret (lookups need it exact)")
_TS = Column("plain", "a timestamp")
_ENUM = Column("plain", "a status or kind chosen by kernelext (an enum)")
_HASH = Column("plain", "a hash or fingerprint kernelext computed")
_STATE = Column(
    "exact",
    "run.state / checkpoint data must round-trip exactly: a registered secret is refused "
    "(use run.credential / kx.credentials)",
)
_NOTE = Column(_T, "free text a person or the engine wrote (note, reason, error)")
_WHO = Column(_T, "who: user@host:pid, or a name a person gave")
_ARGS = Column("args", "JSON arguments, only shown: names and values scrubbed")
_RESULT = Column(
    "result", "JSON a run gets back on resume: only registered secrets masked, no name guessed"
)

# Every TEXT, JSON or BLOB column of the schema (store/schema.py, all migrations).
# tests/test_store_columns.py fails when a live schema has one that is not declared here.
SCRUBBED: dict[tuple[str, str], Column] = {
    # runs
    ("runs", "id"): _RUN,
    ("runs", "agent"): _ID,
    ("runs", "status"): _ENUM,
    ("runs", "reason"): _NOTE,
    ("runs", "parent_id"): _RUN,
    ("runs", "fingerprint"): _HASH,
    ("runs", "args"): Column(
        "args",
        "the agent's start arguments (JSON); a resume of a run whose arguments lost "
        "a secret asks for them again",
    ),
    ("runs", "stop_source"): Column(_T, "who or what asked to stop (free text)"),
    ("runs", "owner"): Column("key", "the lease owner, compared for ownership: refused"),
    ("runs", "error"): _NOTE,
    # steps
    ("steps", "run_id"): _RUN,
    ("steps", "key"): _ID,
    ("steps", "name"): Column(_T, "a step's display name"),
    ("steps", "status"): _ENUM,
    ("steps", "error"): _NOTE,
    ("steps", "result"): _RESULT,
    # snapshots and their blobs
    ("snapshots", "run_id"): _RUN,
    ("snapshots", "manifest"): Column("exact", "state keys -> blob ids, read back exactly"),
    ("blobs", "run_id"): _RUN,
    ("blobs", "encoding"): _ENUM,
    ("blobs", "sha256"): _HASH,
    ("blobs", "location"): Column("plain", "'inline' or a side-file path kernelext chose"),
    ("blobs", "data"): _STATE,
    # effects
    ("effects", "run_id"): _RUN,
    ("effects", "step_key"): _ID,
    ("effects", "tool"): _ID,
    ("effects", "args_hash"): _HASH,
    ("effects", "args"): _ARGS,
    ("effects", "status"): _ENUM,
    ("effects", "result"): _RESULT,
    ("effects", "error"): _NOTE,
    ("effects", "decided_by"): _WHO,
    ("effects", "decision_note"): _NOTE,
    # facts
    ("facts", "run_id"): _RUN,
    ("facts", "name"): _ID,
    ("facts", "kind"): _ENUM,
    ("facts", "value"): _RESULT,
    ("facts", "fingerprint"): _HASH,
    ("facts", "check_name"): Column("key", "a check's registered name, resolved on resume"),
    ("facts", "check_args"): Column(
        "exact", "the check's arguments, passed again on resume: a secret is refused"
    ),
    ("facts", "current_value"): _RESULT,
    ("facts", "check_status"): _ENUM,
    ("facts", "check_detail"): _NOTE,
    ("facts", "compare_name"): Column("key", "a comparator's qualified name, resolved on resume"),
    # claims
    ("claims", "resource"): _ID,
    ("claims", "run_id"): _RUN,
    ("claims", "release_reason"): _NOTE,
    # events
    ("events", "run_id"): _RUN,
    ("events", "kind"): _ENUM,
    ("events", "from_status"): _ENUM,
    ("events", "to_status"): _ENUM,
    ("events", "source"): Column(_T, "who or what caused it (free text)"),
    ("events", "actor"): _WHO,
    ("events", "reason"): _NOTE,
    ("events", "detail"): _ARGS,
    # journal bookkeeping and quarantine
    ("journal_state", "journal_id"): Column("plain", "a journal file's random id"),
    ("quarantine", "journal_id"): Column("plain", "a journal file's random id"),
    ("quarantine", "kind"): _ENUM,
    ("quarantine", "run_id"): Column(_T, "a run id, kept to be shown (never looked up exactly)"),
    ("quarantine", "payload"): Column(_T, "a refused record's JSON, kept to be shown"),
    ("quarantine", "error"): _NOTE,
    ("quarantine", "file"): Column("plain", "a journal file path kernelext chose"),
    ("schema_version", "description"): Column("plain", "a migration's description (code)"),
    # approvals
    ("approvals", "run_id"): _RUN,
    ("approvals", "step"): _ID,
    ("approvals", "tool"): _ID,
    ("approvals", "args_hash"): _HASH,
    ("approvals", "args"): _ARGS,
    ("approvals", "decision"): _ENUM,
    ("approvals", "actor"): _WHO,
    ("approvals", "note"): _NOTE,
    ("approvals", "edit"): Column("result", "a person's edited argument values, given to the call"),
    ("approvals", "edited_args"): _ARGS,
    ("approvals", "edited_args_hash"): _HASH,
    # questions (run.ask)
    ("questions", "run_id"): _RUN,
    ("questions", "step"): _ID,
    ("questions", "prompt"): Column(_T, "the question shown to a person"),
    ("questions", "answer_schema"): Column(_T, "the answer's schema, shown"),
    ("questions", "default_answer"): _RESULT,
    ("questions", "answer"): _RESULT,
    ("questions", "actor"): _WHO,
    ("questions", "note"): _NOTE,
    # LangGraph checkpoints (store/checkpoints.py)
    ("langgraph_checkpoints", "thread_id"): _RUN,
    ("langgraph_checkpoints", "checkpoint_ns"): _ID,
    ("langgraph_checkpoints", "checkpoint_id"): _ID,
    ("langgraph_checkpoints", "parent_checkpoint_id"): _ID,
    ("langgraph_checkpoints", "source"): _ENUM,
    ("langgraph_checkpoints", "graph_run_id"): _ID,
    ("langgraph_checkpoints", "encoding"): _ENUM,
    ("langgraph_checkpoints", "checkpoint"): _STATE,
    ("langgraph_checkpoints", "metadata"): _ARGS,
    ("langgraph_checkpoints", "channel_versions"): Column("exact", "versions LangGraph compares"),
    ("langgraph_blobs", "thread_id"): _RUN,
    ("langgraph_blobs", "checkpoint_ns"): _ID,
    ("langgraph_blobs", "channel"): _ID,
    ("langgraph_blobs", "version"): _ID,
    ("langgraph_blobs", "encoding"): _ENUM,
    ("langgraph_blobs", "value"): _STATE,
    ("langgraph_writes", "thread_id"): _RUN,
    ("langgraph_writes", "checkpoint_ns"): _ID,
    ("langgraph_writes", "checkpoint_id"): _ID,
    ("langgraph_writes", "task_id"): _ID,
    ("langgraph_writes", "task_path"): _ID,
    ("langgraph_writes", "channel"): _ID,
    ("langgraph_writes", "encoding"): _ENUM,
    ("langgraph_writes", "value"): _STATE,
}


# -- the scrubber, installed by kernelext._core.encoding.secrets ------------------------------
class Scrubber(Protocol):
    def text(self, value: str) -> str: ...

    def json(self, value: str, *, result: bool) -> str: ...

    def holds_secret(self, value: Any) -> bool: ...

    def armed(self) -> bool:
        """Are values registered (else ``holds_secret`` is always False)?"""
        ...


_SCRUBBER: Scrubber | None = None


def install(scrubber: Scrubber) -> None:
    """Called by ``kernelext._core.encoding.secrets`` at import: the store knows no secrets
    itself."""
    global _SCRUBBER
    _SCRUBBER = scrubber


def _scrub_value(mode: str, value: Any, where: str) -> Any:
    s = _SCRUBBER
    if s is None or mode == "plain" or value is None:
        return value
    if isinstance(value, str):
        if mode == _T:
            return s.text(value)
        if mode == "args":
            return s.json(value, result=False)
        if mode == "result":
            return s.json(value, result=True)
    refuse = mode in ("key", "exact") or isinstance(value, (bytes, bytearray, memoryview))
    if refuse and s.holds_secret(value):
        raise SecretRefused(_refusal(mode, where))
    return value


def _refusal(mode: str, where: str) -> str:
    if mode == "key":
        return (
            f"kernelext refuses to store {where}: it contains a registered secret "
            "(kx.secrets / a credential), and an id or key cannot be scrubbed without breaking "
            "lookups. Use an id without the secret."
        )
    return (
        f"kernelext refuses to store {where}: it contains a registered secret (kx.secrets / "
        "a credential), and it must be stored exactly (run.state, checkpoints, check "
        "arguments). Keep secrets out of it: use run.credential(...) / kx.credentials, "
        "or keep the secret in memory only."
    )


def scrubbed_excerpt(text: str, limit: int) -> str:
    """``text`` scrubbed, then cut to ``limit`` characters: the one way to shorten an error
    text before it is stored. Cutting first could leave the start of a secret, which the
    scrubber no longer recognises."""
    s = _SCRUBBER
    if s is not None:
        text = s.text(text)
    return text[:limit]


def refuse_secret(value: Any, where: str) -> None:
    """Raise :class:`SecretRefused` when ``value`` (text or bytes) holds a registered secret."""
    s = _SCRUBBER
    if s is not None and value is not None and s.holds_secret(value):
        raise SecretRefused(_refusal("exact", where))


# -- the column each ``?`` of a statement lands in: kernelext._store.param_columns ---------
_DEFAULT = Column(_T, "not declared: scrubbed as text (conservative)")


@functools.lru_cache(maxsize=2048)
def _modes(sql: str) -> tuple[tuple[str, str] | None, ...] | None:
    """(mode, label) of each ``?`` of ``sql`` (None: not stored); None: unreadable."""
    plan = param_columns(sql)
    if plan is None:
        return None
    out: list[tuple[str, str] | None] = []
    for where in plan:
        column = SCRUBBED.get(where, _DEFAULT) if isinstance(where, tuple) else None
        if column is None:
            out.append(None)
        else:
            assert isinstance(where, tuple)
            out.append((column.mode, f"{where[0]}.{where[1]}"))
    return tuple(out) if any(out) else ()


# Types that hold no text, compared exactly (``type(v) in _INERT``): they pass both doors
# untouched. A subclass (an ``IntEnum``, a ``datetime`` with its own ``isoformat``) does not.
_INERT = frozenset({type(None), bool, int, float, uuid.UUID, dt.datetime, dt.date, dt.time,
                    dt.timedelta})  # fmt: skip
_BYTES = (bytes, bytearray, memoryview)
# Checked only while secrets are registered (until then no value holds one): ids and state
# (refused when they hold a secret), and kernelext's own values (``plain``: a status, a
# hash, a path it made), which are checked as ids are but never changed.
_REFUSING = frozenset({"key", "exact", "plain"})


def _clean(mode: str, value: Any, where: str) -> Any:
    """``value`` as it may be stored in a ``mode`` column: the allow-list of both doors.

    Text is scrubbed (a ``str`` subclass, a text ``Enum`` member too: as the exact text an
    encoder writes of it), lists, tuples and dicts are walked (dict keys as their values),
    bytes are refused when they hold a secret, numbers and ids pass. Any other object
    (an ``Enum`` member, a dataclass, a numpy value) is kept only when neither its text nor
    its ``repr`` (nor an ``Enum`` member's value) holds a registered secret: neither the
    journal nor a database driver writes anything else of it."""
    kind = type(value)
    if kind in _INERT:
        return value
    if kind is str:
        return _scrub_value(mode, value, where)
    if isinstance(value, str):
        return _scrub_value(mode, str.__str__(value), where)
    if isinstance(value, (int, float)):  # IntEnum, numpy.float64: written as the number
        return value
    if isinstance(value, _BYTES):
        return _scrub_value(mode, value, where)
    if isinstance(value, (list, tuple)):
        return (list if isinstance(value, list) else tuple)(_clean(mode, v, where) for v in value)
    if isinstance(value, dict):
        return {_clean(mode, k, where): _clean(mode, v, where) for k, v in value.items()}
    _refuse_opaque(mode, value, where)
    return value


def _refuse_opaque(mode: str, value: Any, where: str) -> None:
    """Refuse an object of no known type whose text, ``repr`` or value holds a secret (an
    ``Enum`` member's value; the ``hex`` or ``isoformat()`` the journal writes of an id or
    a timestamp of a subclass)."""
    s = _SCRUBBER
    if s is None or not s.armed():
        return
    check = "key" if mode == "key" else "exact"
    try:
        texts = (str(value), repr(value))
        if isinstance(value, enum.Enum):
            _clean(check, value.value, where)
        elif isinstance(value, uuid.UUID):
            _clean(check, value.hex, where)
        elif isinstance(value, dt.datetime):
            _clean(check, value.isoformat(), where)
    except SecretRefused:
        raise
    except Exception:  # its text cannot be read, so it cannot be checked
        raise SecretRefused(_unreadable(type(value).__name__, where)) from None
    if any(s.holds_secret(text) for text in texts):
        raise SecretRefused(_refusal(check, where))


def _unreadable(name: str, where: str) -> str:
    return (
        f"kernelext refuses to store {where}: a {name} whose text cannot be read, so it "
        "cannot be checked for a registered secret (kx.secrets / a credential). Store text, "
        "numbers or JSON instead."
    )


def _check(value: Any, where: str) -> None:
    """Refuse a value kept as it is (kernelext's own: ``plain``) that holds a secret."""
    for v in value if type(value) is list else (value,):
        if type(v) not in _INERT:
            _clean("key", v, where)


def scrub_params(sql: str, params: Sequence[Any]) -> Sequence[Any]:
    """``params`` as they may be stored by ``sql`` (see the module doc)."""
    if not params or _SCRUBBER is None:
        return params
    modes = _modes(sql)
    if modes == ():
        return params
    if modes is None or len(modes) != len(params):  # unreadable, or bound otherwise: be safe
        return [v if type(v) in _INERT else _clean(_T, v, "a value") for v in params]
    out = list(params)
    refusals = _SCRUBBER.armed()  # ids and state: checked only when secrets are registered
    for i, mode in enumerate(modes):
        if mode is not None and (refusals or mode[0] not in _REFUSING):
            value = out[i]
            if mode[0] == "plain":
                _check(value, mode[1])
            elif type(value) is list:  # a column's values, unnested in SQL (duckdb.bulk)
                out[i] = [v if type(v) in _INERT else _clean(mode[0], v, mode[1]) for v in value]
            elif type(value) not in _INERT:
                out[i] = _clean(mode[0], value, mode[1])
    return out


class ScrubbingTx:
    """The Tx every job sees: parameters scrubbed on their way to the columns."""

    __slots__ = ("_tx",)

    def __init__(self, tx: Any) -> None:
        self._tx = tx

    def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        self._tx.execute(sql, scrub_params(sql, params))

    def fetchone(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        result: tuple[Any, ...] | None = self._tx.fetchone(sql, scrub_params(sql, params))
        return result

    def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        result: list[tuple[Any, ...]] = self._tx.fetchall(sql, scrub_params(sql, params))
        return result

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        self._tx.executemany(sql, [scrub_params(sql, row) for row in rows])

    def __getattr__(self, name: str) -> Any:  # backend extras (a job may need the raw tx)
        return getattr(self._tx, name)
