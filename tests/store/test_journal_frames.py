"""Journal frames: a record encoded the fast way (orjson, flat records) reads back as the
same record the standard library's encoding (every frame before it) reads back as, and
anything else is encoded as before, byte for byte."""

from __future__ import annotations

import base64
import datetime as dt
import json
import uuid
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from kernelext._store.duckdb import frames
from kernelext._store.duckdb.journal import FORMAT_VERSION, Journal, scan_journal


def _old_payload(seq: int, kind: str, data: dict[str, Any]) -> bytes:
    """The payload as every frame was written before (one stdlib encoder)."""

    def default(obj: Any) -> Any:
        if isinstance(obj, uuid.UUID):
            return {"$u": obj.hex}
        if isinstance(obj, dt.datetime):
            return {"$t": obj.isoformat()}
        if isinstance(obj, (bytes, bytearray, memoryview)):
            return {"$b": base64.b64encode(bytes(obj)).decode()}
        raise TypeError(type(obj).__name__)

    return json.dumps([seq, kind, data], default=default, separators=(",", ":")).encode()


_FLAT_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(),
    st.uuids(),
    st.datetimes(),
    st.datetimes(timezones=st.timezones()),
)
_RECORDS = st.dictionaries(st.text(min_size=1, max_size=12), _FLAT_VALUES, max_size=12)


def _same(a: Any, b: Any) -> bool:
    """Equal as records, NaN equal to NaN, and of the same types throughout."""
    if isinstance(a, float) and isinstance(b, float) and a != a:
        return b != b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


@settings(max_examples=300, deadline=None)
@given(seq=st.integers(min_value=1, max_value=2**40), kind=st.text(max_size=20), data=_RECORDS)
def test_every_flat_record_reads_back_as_the_old_encoding_reads_back(
    seq: int, kind: str, data: dict[str, Any]
) -> None:
    new = frames.parse(frames.encode_payload(seq, kind, data))
    old = frames.parse(_old_payload(seq, kind, data))
    assert old is not None and new is not None
    assert _same(list(new), list(old))


def test_a_flat_record_is_encoded_by_orjson() -> None:
    key, at = uuid.uuid4(), dt.datetime(2026, 12, 7, 16, 0, 0, 123456)
    data = {"key": key, "run_id": "r-é", "n": 3, "ok": True, "at": at, "x": None, "d": 0.5}
    tagged = {**data, "key": {"$u": key.hex}, "at": {"$t": at.isoformat()}}
    assert frames.encode_body("intent", data) == (b',"intent",' + orjson.dumps(tagged) + b"]")


def test_what_orjson_cannot_write_as_it_is_is_encoded_as_before() -> None:
    cases: list[dict[str, Any]] = [
        {"n": 2**64},  # an integer orjson refuses
        {"f": float("nan"), "g": float("inf")},  # orjson would write null
        {"blobs": [[uuid.uuid4(), b"\x00\x01"]]},  # nested: ids inside a list
        {"detail": {"key": uuid.uuid4()}},
        {"data": b"bytes"},
        {1: "a key that is no text"},
        {"s": "a lone surrogate \ud800"},
    ]
    for data in cases:
        assert frames.encode_payload(9, "k", data) == _old_payload(9, "k", data), data


def test_a_journal_written_the_new_way_scans_as_written(tmp_path: Any) -> None:
    journal = Journal(str(tmp_path / "kx.duckdb"))
    written = [
        ("step_begin", {"id": uuid.uuid4(), "run_id": "r", "ordinal": 0, "key": "0"}),
        ("step_complete", {"step_id": uuid.uuid4(), "blobs": [[uuid.uuid4(), b"\xff"]]}),
        ("outcome", {"key": uuid.uuid4(), "status": "applied", "result": '{"ok":true}'}),
    ]
    try:
        for kind, data in written:
            journal.append(kind, data, sync=True, enqueue=lambda: None)
        with open(journal.path, "rb") as handle:
            assert handle.read(1)[0] == FORMAT_VERSION
        scan = scan_journal(journal.path)
        assert [(k, d) for _, k, d in scan.records] == written
        assert [seq for seq, _, _ in scan.records] == [1, 2, 3]
    finally:
        journal.close()
