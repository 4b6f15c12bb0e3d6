"""No value of a hot-path record reaches a journal frame or a column unchecked.

The record door (``scrub_record``) and the statement door (``scrub_params``) pass a value
untouched only when its type holds no text (None, flags, numbers, ids, timestamps); text
is scrubbed, lists, tuples and dicts walked (keys too), bytes refused when they hold a
secret, and any other object (an ``Enum`` member, a ``str`` subclass, a dataclass, a numpy
value) reduced to the text an encoder writes of it or refused. A registered value is found
anywhere, glued to other letters too (``"abc" + secret + "xyz"``)."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import enum
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kernelext as kx
from kernelext._store.columns import SecretRefused, scrub_params
from kernelext._store.duckdb.frames import encode_body, parse
from kernelext._store.record_door import _RECORD_FIELDS, scrub_record

LONG = f"sk-live-{uuid.uuid4().hex}"  # 40 characters
SHORT = f"Gl{uuid.uuid4().hex[:10]}"  # 12: register's least is 8
SECRETS = (LONG, SHORT)


class Text(str):
    """A str subclass that shows another text than it holds."""

    def __str__(self) -> str:
        return "harmless"

    def __repr__(self) -> str:
        return "harmless"


@dataclasses.dataclass
class Box:
    text: str


class Id(uuid.UUID):
    """An id whose ``hex`` (what the journal writes of an id) is another text."""

    __slots__ = ("shown",)

    def __init__(self, shown: str) -> None:
        super().__init__(int=7)
        object.__setattr__(self, "shown", shown)

    @property
    def hex(self) -> str:  # type: ignore[override]
        return self.shown


def _containing(draw: st.DrawFn) -> str:
    """A text holding a registered value at the start, inside a word or at the end."""
    secret = draw(st.sampled_from(SECRETS))
    head = draw(st.sampled_from(["", "abc", "x ", "9", "_", "id-"]))
    tail = draw(st.sampled_from(["", "xyz", " y", "7", "_", ".json"]))
    return f"{head}{secret}{tail}"


@st.composite
def _leaf(draw: st.DrawFn) -> Any:
    text = _containing(draw) if draw(st.booleans()) else draw(st.text(max_size=12))
    shape = draw(st.integers(0, 9))
    if shape == 0:
        return text
    if shape == 1:
        return enum.Enum("Status", {"A": text}, type=str).A  # a text Enum: its value
    if shape == 2:
        return enum.Enum("Choice", {"A": text}).A  # orjson writes its value
    if shape == 3:
        return Text(text)
    if shape == 4:
        return text.encode()
    if shape == 5:
        return Box(text)
    if shape == 6:
        return np.str_(text)
    if shape == 7:
        return bytearray(text.encode())
    if shape == 8:
        return Id(text)
    return draw(_INERT)


_INERT = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63),
    st.floats(allow_nan=False, allow_infinity=False),
    st.just(uuid.UUID(int=7)),
    st.just(dt.datetime(2026, 1, 1, 12)),
)
_KEYS = st.sampled_from([f"k{SHORT}", f"{LONG}z", Text(f"{SHORT}"), 3])
_VALUES = st.recursive(
    _leaf(),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.lists(inner, max_size=3).map(tuple),
        st.dictionaries(st.one_of(st.text(max_size=5), _KEYS), inner, max_size=3),
    ),
    max_leaves=6,
)  # fmt: skip


@st.composite
def _records(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    kind = draw(st.sampled_from(list(_RECORD_FIELDS)))
    names = [*_RECORD_FIELDS[kind], "extra", "note", "at", "id"]
    chosen = draw(st.lists(st.sampled_from(names), unique=True, min_size=1))
    return kind, {name: draw(_VALUES) for name in chosen}


def _found(value: Any) -> bool:
    """Does a decoded record hold a registered value in any text or bytes of it?"""
    if isinstance(value, str):
        return any(s in value for s in SECRETS)
    if isinstance(value, bytes):
        return any(s.encode() in value for s in SECRETS)
    if isinstance(value, dict):
        return any(_found(k) or _found(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_found(v) for v in value)
    return False


_SLOW_OK = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture]


@pytest.fixture
def registered() -> None:
    for secret in SECRETS:
        kx.secrets.register(secret)


@settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=_SLOW_OK,
)
@given(record=_records())
def test_no_frame_holds_a_registered_secret(registered: None, record: Any) -> None:
    kind, data = record
    try:
        clean = scrub_record(kind, data)
    except SecretRefused:
        return  # refused: nothing written
    try:
        body = encode_body(kind, clean)
    except TypeError:  # an object the journal cannot hold is not written either
        return
    assert not any(s.encode() in body for s in SECRETS), (kind, data, body)
    decoded = parse(b"[1" + body)  # None: an id whose text is no id (the bytes are checked)
    assert decoded is None or not _found(decoded[2]), (kind, data, decoded)


def _unchecked(value: Any) -> bool:
    """Does a parameter a driver binds hold a registered value in what it may write?"""
    if isinstance(value, (str, bytes, dict, list, tuple)):
        return _found(value if not isinstance(value, tuple) else list(value))
    return value is not None and any(s in f"{value}{value!r}" for s in SECRETS)


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=_SLOW_OK,
)
@given(value=_VALUES)
def test_no_statement_parameter_holds_a_registered_secret(registered: None, value: Any) -> None:
    for sql in (
        "UPDATE effects SET error = ? WHERE key = ?",  # text
        "UPDATE effects SET result = ? WHERE key = ?",  # result
        "UPDATE steps SET key = ? WHERE id = ?",  # key: refused
        "UPDATE effects SET args = ? WHERE key = ?",  # args
        "UPDATE effects SET status = ? WHERE key = ?",  # plain: checked, kept
    ):
        try:
            out = scrub_params(sql, [value, uuid.UUID(int=1)])
        except SecretRefused:
            continue
        assert not _unchecked(out[0]), (sql, value, out[0])


def test_each_leak_of_the_earlier_door(registered: None) -> None:
    """The cases the door let through: each now masked or refused."""
    base = {"key": uuid.uuid4(), "status": "applied", "at": dt.datetime(2026, 1, 1)}
    masked = scrub_record("outcome", {**base, "error": f"denied abc{SHORT}xyz"})
    assert masked["error"] == "denied abc***xyz"
    assert scrub_record("outcome", {**base, "extra": [f"x {LONG}"]})["extra"] == ["x ***"]
    assert scrub_record("outcome", {**base, "extra": {LONG: 1}})["extra"] == {"***": 1}
    text_enum = enum.Enum("Status", {"A": LONG}, type=str).A
    for refused in (
        {**base, "extra": LONG.encode()},
        {**base, "status": text_enum},
        {**base, "extra": enum.Enum("Choice", {"A": LONG}).A},
        {**base, "extra": Box(SHORT)},
        {**base, "extra": Id(LONG)},
    ):
        with pytest.raises(SecretRefused):
            scrub_record("outcome", refused)
    with pytest.raises(SecretRefused, match=r"steps\.key"):
        scrub_record("step_begin", {"run_id": "r", "key": f"k{SHORT}z"})
    assert scrub_params("UPDATE effects SET error = ? WHERE key = ?", [f"a{SHORT}b", 1]) == [
        "a***b",
        1,
    ]
    with pytest.raises(SecretRefused, match=r"effects\.status"):  # a plain column: checked
        scrub_params("UPDATE effects SET status = ? WHERE key = ?", [text_enum, 1])


def test_a_value_without_a_secret_passes_as_it_was(registered: None) -> None:
    status = enum.Enum("Status", {"A": "applied"}, type=str).A
    data = {"key": uuid.uuid4(), "status": status, "at": dt.datetime(2026, 1, 1), "n": 3}
    out = scrub_record("outcome", {**data, "extra": ["a", {"b": (1, 2.5)}]})
    assert out["status"] is status  # kernelext's own enums stay as they are
    assert out["extra"] == ["a", {"b": (1, 2.5)}]
    assert {k: out[k] for k in data} == data
    sql = "UPDATE effects SET status = ?, error = ? WHERE key = ?"
    params = scrub_params(sql, [status, "e", 1])
    assert params[0] is status and params[1:] == ["e", 1]


# -- through the public API, on a DuckDB store ------------------------------------------------
@kx.effect
def lookup(query: str) -> str:
    return f"row{SHORT}x"


@kx.effect
def deny(query: str) -> None:
    raise PermissionError(f"denied{SHORT}: {query}")


@kx.agent(name="record-door-glued")
def glued_agent(run: kx.Run) -> None:
    with run.step("look"):
        lookup(f"q{SHORT}z")
        with contextlib.suppress(PermissionError):
            deny("again")


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_secret_glued_to_letters_is_in_no_file_of_the_store(store: Any, store_path: Path) -> None:
    from kernelext._core.process.runtime import runtime

    kx.secrets.register(SHORT)
    handle = glued_agent.start(run_id="glued")
    assert handle.wait(60.0) == "completed", handle.error
    (row,) = [r for r in store.load_effects("glued").values() if r["tool"] == "lookup"]
    assert row["result"] == '"row***x"'
    written = [_files(store_path.parent)]  # the journal before it is folded away
    runtime().settings.close()
    written.append(_files(store_path.parent))
    assert any(str(store_path) in files for files in written)
    assert [
        name for files in written for name, data in files.items() if SHORT.encode() in data
    ] == []
