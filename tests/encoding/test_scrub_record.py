"""The door for hot-path records (``scrub_record``) gives what it gives when it looks each
field's column up per record: the same values, refusals and masks, with and without secrets
registered. Ids and state are checked only while a secret is registered (none holds one
before), as the door for statements (``scrub_params``) does."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kernelext as kx
from kernelext._store import columns
from kernelext._store.columns import SCRUBBED, SecretRefused
from kernelext._store.record_door import _RECORD_FIELDS, scrub_record

SECRET = "sk-live-0123456789abcdef"


def _reference(kind: str, data: dict[str, Any]) -> dict[str, Any]:
    """The door's rule read per record: the column of each field looked up every time."""
    fields = _RECORD_FIELDS.get(kind, {})
    armed = columns._SCRUBBER is not None and columns._SCRUBBER.armed()
    out = dict(data)
    for name, value in data.items():
        if type(value) in columns._INERT:
            continue
        label = f"a {kind} record's {name}"
        if name not in fields:
            column = columns._DEFAULT
        elif fields[name] is None or SCRUBBED[fields[name]].mode == "plain":
            if armed:  # kernelext's own values: checked, never changed
                columns._clean("key", value, label)
            continue
        else:
            where = fields[name]
            column, label = SCRUBBED[where], f"{where[0]}.{where[1]}"
        if armed or column.mode not in ("key", "exact"):
            out[name] = columns._clean(column.mode, value, label)
    return out


def _outcome(fn: Any, kind: str, data: dict[str, Any]) -> Any:
    try:
        return fn(kind, data)
    except SecretRefused as exc:
        return ("refused", str(exc))


_TEXTS = st.one_of(
    st.text(max_size=30),
    st.sampled_from([SECRET, f"Bearer {SECRET}", f"password={SECRET}", "https://u:pw@h/x"]),
    st.builds(lambda a, b: f'{{"{a}":"{b}"}}', st.sampled_from(["i", "api_key"]), st.text()),
)
_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False),
    _TEXTS,
    st.just(uuid.UUID(int=7)),
    st.just(dt.datetime(2026, 1, 1)),
    st.lists(st.lists(st.one_of(_TEXTS, st.binary(max_size=8)), max_size=3), max_size=2),
)
_KINDS = st.sampled_from([*_RECORD_FIELDS, "unknown_kind"])


@st.composite
def _records(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    kind = draw(_KINDS)
    names = [*_RECORD_FIELDS.get(kind, {}), "note", "extra"]
    chosen = draw(st.lists(st.sampled_from(names), unique=True, max_size=len(names)))
    return kind, {name: draw(_VALUES) for name in chosen}


@pytest.mark.parametrize("registered", [False, True])
def test_every_record_is_scrubbed_as_before(registered: bool) -> None:
    if registered:
        kx.secrets.register(SECRET)

    @settings(max_examples=300, deadline=None)
    @given(record=_records())
    def check(record: tuple[str, dict[str, Any]]) -> None:
        kind, data = record
        assert _outcome(scrub_record, kind, data) == _outcome(_reference, kind, data)

    check()


def test_a_registered_secret_in_an_id_is_refused_and_in_text_masked() -> None:
    data = {"run_id": "r", "key": f"step-{SECRET}", "step_key": "0", "tool": "t"}
    assert scrub_record("intent", {**data, "key": uuid.uuid4()})["step_key"] == "0"
    assert scrub_record("step_begin", {"run_id": "r", "key": f"k-{SECRET}"})  # not armed
    kx.secrets.register(SECRET)
    with pytest.raises(SecretRefused, match=r"steps\.key"):
        scrub_record("step_begin", {"run_id": "r", "key": f"k-{SECRET}"})
    with pytest.raises(SecretRefused, match=r"blobs\.data"):
        scrub_record("step_complete", {"run_id": "r", "blobs": [[SECRET.encode()]]})
    shown = scrub_record("step_begin", {"run_id": "r", "key": "k", "name": f"n {SECRET}"})
    assert SECRET not in shown["name"]
