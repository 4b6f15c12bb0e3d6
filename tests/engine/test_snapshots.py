"""Snapshots of run.state: safe encodings, pickle opt-in, clear failures, small storage."""

from __future__ import annotations

import json
import threading
import uuid
from fractions import Fraction
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest

import kernelext as kx
from kernelext._core.encoding.codec import dumps_json
from kernelext._core.engine.snapshot import Snapshotter
from kernelext._core.process.runtime import runtime
from kernelext._store import Store

WAIT = 60.0


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def reopen(store_path: Path) -> Store:
    """Close the default store and open the file again: nothing survives in memory."""
    runtime().settings.close()
    return kx.open_store(str(store_path))


def blob_totals(store: Store, run_id: str) -> tuple[int, int]:
    count, size = store.read(
        "SELECT count(*), coalesce(sum(size), 0) FROM blobs WHERE run_id = ?", (run_id,)
    )[0]
    return int(count), int(size)


def sample_frame() -> pd.DataFrame:
    return pd.DataFrame(
        {"sku": ["a-1", "b-2", "c-3"], "price": [9.5, 12.0, 0.25], "qty": [1, 20, 300]},
        index=pd.Index(["x", "y", "z"], name="row"),
    )


def sample_table() -> pa.Table:
    return pa.table(
        {
            "id": pa.array([1, 2, 3], pa.int64()),
            "tag": pa.array(["p", None, "r"], pa.string()),
            "score": pa.array([0.5, 1.5, None], pa.float64()),
        }
    )


PLAIN = {
    "text": 'héllo ✓ "quoted"\n',
    "number": 3.25,
    "big_int": 2**62,
    "none": None,
    "flag": True,
    "nested": {"list": [1, "two", [3.0, {"four": None}]], "empty": {}, "flags": [True, False]},
}


def test_json_bytes_arrow_and_pandas_round_trip(store: Store, store_path: Path) -> None:
    restored: dict[str, Any] = {}

    @kx.agent(name=name("kinds"))
    def kinds(run: kx.Run) -> None:
        with run.step("fill"):
            run.state.update(PLAIN)
            run.state["raw"] = bytes(range(256))
            run.state["table"] = sample_table()
            run.state["frame"] = sample_frame()
            kx.stop(run.id)
        with run.step("read"):
            restored.update(run.state)

    assert kinds.start(run_id="kinds-1").wait(WAIT) == "suspended"
    reopened = reopen(store_path)
    encodings = {r[0] for r in reopened.read("SELECT encoding FROM blobs")}
    assert {"json", "bytes", "arrow", "arrow-pandas"} <= encodings
    assert "pickle" not in encodings
    assert kx.resume("kinds-1").wait(WAIT) == "completed"
    for key, value in PLAIN.items():
        assert restored[key] == value, key
    assert restored["raw"] == bytes(range(256))
    assert isinstance(restored["table"], pa.Table)
    assert restored["table"].equals(sample_table())
    assert isinstance(restored["frame"], pd.DataFrame)
    pd.testing.assert_frame_equal(restored["frame"], sample_frame())


def test_pickle_is_refused_without_opt_in(store: Store) -> None:
    @kx.agent(name=name("nopickle"))
    def no_pickle(run: kx.Run) -> None:
        with run.step("one"):
            run.state["ratio"] = Fraction(1, 3)

    handle = no_pickle.start(run_id="nopickle-1")
    assert handle.wait(WAIT) == "failed"
    assert isinstance(handle.error, kx.SerializationError)
    message = str(handle.error)
    assert "run.state['ratio']" in message and "Fraction" in message
    assert "pickle=True" in message
    assert store.read("SELECT count(*) FROM blobs") == [(0,)]


def test_pickle_with_opt_in_round_trips_and_loading_needs_the_opt_in(
    store: Store, store_path: Path
) -> None:
    agent_name = name("pickled")
    restored: dict[str, Any] = {}

    @kx.agent(name=agent_name, pickle=True)
    def pickled(run: kx.Run) -> None:
        with run.step("one"):
            run.state["ratio"] = Fraction(1, 3)
            run.state["plain"] = [1, 2]
            kx.stop(run.id)
        with run.step("two"):
            restored.update(run.state)

    assert pickled.start(run_id="pickled-1").wait(WAIT) == "suspended"
    reopened = reopen(store_path)
    encodings = sorted(r[0] for r in reopened.read("SELECT encoding FROM blobs"))
    assert encodings == ["json", "pickle"], "only the value JSON cannot hold is pickled"

    # The same agent declared without pickle=True must not load the pickle.
    @kx.agent(name=agent_name)
    def cautious(run: kx.Run) -> None:
        with run.step("one"):
            pass

    with pytest.raises(kx.SerializationError, match="pickle"):
        kx.resume("pickled-1", allow_code_change=True)
    assert reopened.get_run("pickled-1")["status"] == "suspended"
    assert restored == {}

    # Declared with the opt-in again, it resumes and gets the exact value back.
    @kx.agent(name=agent_name, pickle=True)
    def pickled_again(run: kx.Run) -> None:
        with run.step("one"):
            raise AssertionError("completed steps never run again")
        with run.step("two"):
            restored.update(run.state)

    assert kx.resume("pickled-1", allow_code_change=True).wait(WAIT) == "completed"
    assert restored == {"ratio": Fraction(1, 3), "plain": [1, 2]}
    assert type(restored["ratio"]) is Fraction


@pytest.mark.parametrize(
    ("value", "type_name"),
    [
        ({"a", "b"}, "set"),
        ({"deep": [1, object()]}, "object"),
        (threading.Lock(), "lock"),
    ],
)
def test_unserialisable_state_fails_the_step_and_keeps_the_last_snapshot(
    store: Store, store_path: Path, value: Any, type_name: str
) -> None:
    @kx.agent(name=name("bad"))
    def bad(run: kx.Run) -> None:
        for i in run.steps(range(5)):
            run.state["good"] = i
            if i == 2:
                run.state["culprit"] = value

    handle = bad.start(run_id="bad-1")
    assert handle.wait(WAIT) == "failed"
    assert isinstance(handle.error, kx.SerializationError)
    message = str(handle.error)
    assert "run.state['culprit']" in message
    assert type_name in message
    row = store.get_run("bad-1")
    assert row["status"] == "failed"
    assert "run.state['culprit']" in row["reason"]
    steps = {s["key"]: s for s in store.steps("bad-1")}
    assert [steps[k]["status"] for k in ("0", "1", "2")] == ["completed", "completed", "failed"]
    assert "SerializationError" in steps["2"]["error"]
    assert "3" not in steps

    reopened = reopen(store_path)
    snapshot = reopened.latest_snapshot("bad-1")
    assert snapshot is not None and snapshot["step_ordinal"] == 1
    assert Snapshotter("bad-1").restore(reopened, snapshot["manifest"]) == {"good": 1}


def test_state_keys_must_be_strings(store: Store) -> None:
    @kx.agent(name=name("intkey"))
    def int_key(run: kx.Run) -> None:
        with run.step("one"):
            run.state[7] = "seven"  # type: ignore[index]

    handle = int_key.start(run_id="intkey-1")
    assert handle.wait(WAIT) == "failed"
    assert isinstance(handle.error, kx.SerializationError)
    assert "keys must be strings" in str(handle.error)


def test_unchanged_values_are_not_rewritten(store: Store) -> None:
    big = "x" * 100_000

    @kx.agent(name=name("steady"))
    def steady(run: kx.Run) -> None:
        for i in run.steps(range(50)):
            run.state["big"] = big  # the same value again at every step
            run.state["phase"] = i // 10  # changes every tenth step

    assert steady.start(run_id="steady-1").wait(WAIT) == "completed"
    count, size = blob_totals(store, "steady-1")
    assert count == 1 + 5, "one blob for big, one per phase value"
    assert len(big) < size < 2 * len(big)
    snapshots = store.read(
        "SELECT count(*), sum(bytes) FROM snapshots WHERE run_id = ?", ("steady-1",)
    )[0]
    assert snapshots[0] == 50
    assert snapshots[1] == size
    manifests = [
        json.loads(r[0])
        for r in store.read("SELECT manifest FROM snapshots WHERE run_id = ?", ("steady-1",))
    ]
    big_ids = {m["big"] for m in manifests}
    assert len(big_ids) == 1, "every snapshot points at the one blob of big"


def test_appending_to_a_list_stores_deltas_and_restores_exactly(
    store: Store, store_path: Path
) -> None:
    steps, stop_at = 200, 149

    def message(i: int) -> dict[str, Any]:
        return {
            "role": "assistant" if i % 2 else "user",
            "n": i,
            "text": f"message number {i} " + "lorem ipsum " * 10,
        }

    @kx.agent(name=name("chat"))
    def chat(run: kx.Run) -> list[dict[str, Any]]:
        for i in run.steps(range(steps)):
            run.state.setdefault("messages", []).append(message(i))
            if i == stop_at:
                kx.stop(run.id)
        return list(run.state["messages"])

    assert chat.start(run_id="chat-1").wait(WAIT) == "suspended"
    reopened = reopen(store_path)
    snapshot = reopened.latest_snapshot("chat-1")
    assert snapshot is not None
    halfway = Snapshotter("chat-1").restore(reopened, snapshot["manifest"])
    assert halfway == {"messages": [message(i) for i in range(stop_at + 1)]}

    handle = kx.resume("chat-1")
    assert handle.wait(WAIT) == "completed"
    expected = [message(i) for i in range(steps)]
    assert handle.result == expected
    final_store = runtime().settings.store()
    final = final_store.latest_snapshot("chat-1")
    assert final is not None
    assert Snapshotter("chat-1").restore(final_store, final["manifest"]) == {"messages": expected}

    count, size = blob_totals(final_store, "chat-1")
    one_copy = len(dumps_json(expected))
    full_copies = sum(len(dumps_json(expected[: i + 1])) for i in range(steps))
    assert count == steps
    assert size < 2 * one_copy, f"{size} bytes stored for a {one_copy}-byte list"
    assert size * 50 < full_copies
    encodings = {r[0] for r in final_store.read("SELECT encoding FROM blobs")}
    assert encodings == {"json", "json+append"}


def test_large_values_go_to_side_files_and_a_failed_snapshot_leaves_none(
    store: Store, store_path: Path
) -> None:
    big = bytes(range(256)) * 1024  # 256 KiB: a side file, written while it is hashed

    @kx.agent(name=name("sidefiles"))
    def side_files(run: kx.Run) -> None:
        with run.step("one"):
            run.state["big"] = big
        with run.step("two"):
            run.state["big"] = big[::-1]
            run.state["ratio"] = Fraction(1, 3)  # refused: the step fails after staging "big"

    handle = side_files.start(run_id="side-1")
    assert handle.wait(WAIT) == "failed"
    assert isinstance(handle.error, kx.SerializationError)
    folder = Path(store.blob_dir("side-1"))
    files = sorted(p.name for p in folder.iterdir())
    assert len(files) == 1 and not files[0].endswith(".tmp")  # step one's, nothing else
    [(location,)] = store.read("SELECT location FROM blobs WHERE run_id = 'side-1'")
    # Relative to the blob folder (the project can move); found through payload_path.
    assert location == f"file:{folder.name}/{files[0]}"
    assert store.payload_path(location) == str(folder / files[0])
    assert Snapshotter("side-1").restore(store, store.latest_snapshot("side-1")["manifest"]) == {
        "big": big
    }
