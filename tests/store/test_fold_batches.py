"""Folding in batches gives the same tables as applying each record on its own.

The journal's fold merges a step's begin and completion, and an effect's intent and
outcome, into one INSERT when they fall in one batch. Whatever the batch boundaries (and
folding a journal twice after a crash), the tables must end up as the per-record path
(the one PostgreSQL uses) leaves them.
"""

from __future__ import annotations

import datetime as dt
import json
import random
import uuid
from pathlib import Path
from typing import Any

import pytest
from support.journal_records import step_begin_record

from kernelext._store import Store, open_store
from kernelext._store.duckdb.bulk import apply_records
from kernelext._store.records import apply_record

Record = tuple[int, str, dict[str, Any]]
T0 = dt.datetime(2026, 1, 1)


def run_records(run_id: str, steps: int, seed: int) -> list[Record]:
    """A run's journal: steps that begin, call effects (applied, failed, left pending),
    record facts and complete; the last step is left open, and the run's end (a
    ``run_end`` record) suspends the run and cancels that step."""
    rng = random.Random(seed)
    records: list[Record] = []

    def add(kind: str, data: dict[str, Any]) -> None:
        records.append((len(records) + 1, kind, data))

    for ordinal in range(steps):
        at = T0 + dt.timedelta(seconds=ordinal)
        begin = step_begin_record(run_id, ordinal, at)
        add("step_begin", begin)
        for call in range(rng.randint(0, 3)):
            key = uuid.uuid5(uuid.NAMESPACE_URL, f"{run_id}/{ordinal}/{call}")
            add(
                "intent",
                {
                    "key": key,
                    "run_id": run_id,
                    "step_key": str(ordinal),
                    "step_ordinal": ordinal,
                    "tool": "send",
                    "call_ordinal": call,
                    "args_hash": f"h{call}",
                    "args": "{}",
                    "resumable": True,
                    "at": at,
                },
            )
            fate = rng.choice(["applied", "applied", "failed", None])
            if fate is not None:
                add(
                    "outcome",
                    {
                        "key": key,
                        "status": fate,
                        "result": "1" if fate == "applied" else None,
                        "error": "boom" if fate == "failed" else None,
                        "at": at,
                    },
                )
        if rng.random() < 0.3:
            add(
                "fact",
                {
                    "run_id": run_id,
                    "name": f"f{ordinal % 2}",
                    "kind": "value",
                    "value": str(ordinal),
                    "fingerprint": None,
                    "check_name": None,
                    "check_args": None,
                    "tolerance": None,
                    "step_ordinal": ordinal,
                    "compare_name": None,
                    "at": at,
                },
            )
        if ordinal < steps - 1:
            add(
                "step_complete",
                {
                    "step_id": begin["id"],
                    "run_id": run_id,
                    "ordinal": ordinal,
                    "at": at,
                    "duration_s": 0.5,
                    "snapshot_id": uuid.uuid5(uuid.NAMESPACE_URL, f"{run_id}/{ordinal}/snap"),
                    "manifest": "{}",
                    "bytes": 0,
                    "blobs": [],
                },
            )
    end = T0 + dt.timedelta(seconds=steps)
    add(
        "run_end",
        {
            "run_id": run_id,
            "status": "suspended",
            "kind": "suspended",
            "source": "button",
            "who": "bob@lab:7",
            "reason": "user_stop",
            "detail": json.dumps({"deadline": (end + dt.timedelta(days=7)).isoformat()}),
            "deadline": end + dt.timedelta(days=7),
            "at": end,
            "claims": False,
            "step_id": uuid.uuid5(uuid.NAMESPACE_URL, f"{run_id}/{steps - 1}"),
            "step_status": "cancelled",
            "step_error": "stopped",
            "step_forced": False,
            "step_duration_s": 0.25,
        },
    )
    return records


def tables(store: Store) -> dict[str, list[tuple[Any, ...]]]:
    queries = {
        "steps": "SELECT id, ordinal, status, ended_at, duration_s, snapshot_id FROM steps",
        "effects": "SELECT key, status, result, error, outcome_at FROM effects",
        "snapshots": "SELECT id, step_ordinal FROM snapshots",
        "facts": "SELECT name, value, step_ordinal FROM facts",
        "runs": "SELECT id, completed_steps, status, reason, deadline FROM runs",
        "events": "SELECT kind, from_status, to_status, occurred_at, source, actor, detail"
        " FROM events WHERE kind <> 'created'",
    }
    return {name: sorted(store.read(sql), key=repr) for name, sql in queries.items()}


def fresh(path: Path) -> Store:
    """A store holding run ``r``, created at T0, before its records."""
    store = open_store(str(path), clock=lambda: T0)
    store.create_run("r", "agent")
    return store


@pytest.mark.parametrize("seed", range(8))
def test_any_batching_gives_the_tables_of_one_record_at_a_time(tmp_path: Path, seed: int) -> None:
    records = run_records("r", 12, seed)
    with fresh(tmp_path / "one.duckdb") as one:
        for _, kind, data in records:
            one.write(lambda tx, k=kind, d=data: apply_record(tx, k, d))
        expected = tables(one)
    end = T0 + dt.timedelta(seconds=12)
    assert expected["runs"] == [("r", 11, "suspended", "user_stop", end + dt.timedelta(days=7))]
    assert [e[:4] for e in expected["events"]] == [("suspended", "running", "suspended", end)]
    assert [s[2:5] for s in expected["steps"] if s[1] == 11] == [("cancelled", end, 0.25)]

    rng = random.Random(seed)
    with fresh(tmp_path / "batched.duckdb") as batched:
        start = 0
        while start < len(records):
            end = start + rng.randint(1, 12)
            batch = records[start:end]
            batched.write(lambda tx, b=batch: apply_records(tx, b))
            start = end
        assert tables(batched) == expected
        # A crash after the fold, before journal_state moved on: folded again, same tables.
        batched.write(lambda tx: apply_records(tx, records))
        assert tables(batched) == expected


def test_a_batch_holding_a_record_the_tables_refuse_fails_as_permanent(tmp_path: Path) -> None:
    """Whatever batch the refused record lands in (alone, or mixed into a VALUES list with
    good ones), the failure is classified permanent: the fold goes record by record and
    quarantines it, instead of retrying the batch as if the disk were full."""
    records = run_records("r", 3, 0)
    begins = [r for r in records if r[1] == "step_begin"]
    bad = (99, "step_begin", dict(begins[0][2], id=uuid.uuid4(), ordinal="not a number"))
    with fresh(tmp_path / "s.duckdb") as store:
        for batch in ([bad], [*begins, bad], [bad, *begins]):
            with pytest.raises(Exception) as caught:
                store.write(lambda tx, b=batch: apply_records(tx, b))
            assert store.backend.is_permanent(caught.value), repr(caught.value)


def test_a_read_waits_for_what_was_written_before_it_not_for_what_comes_after(
    tmp_path: Path,
) -> None:
    """Read-your-writes folds the records appended before the read; a writer that keeps
    appending (a fast batch) does not hold the read until it pauses."""
    import threading
    import time

    store = fresh(tmp_path / "busy.duckdb")
    stop, capped = threading.Event(), threading.Event()
    made = [0]

    def produce() -> None:
        deadline = time.monotonic() + 30  # a read that waits for the writer ends after this
        while not stop.is_set():  # about a record a millisecond: less than a fold can take
            if time.monotonic() > deadline:
                capped.set()
                return
            n = made[0]
            row = {
                "id": str(uuid.uuid4()),
                "run_id": "r",
                "ordinal": n,
                "key": str(n),
                "name": None,
            }
            store.record("step_begin", {**row, "started_at": T0}, sync=False)
            made[0] = n + 1
            time.sleep(0.001)

    writer = threading.Thread(target=produce, daemon=True)
    writer.start()
    try:
        while made[0] < 200 and writer.is_alive():
            time.sleep(0.01)
        before = made[0]
        assert store.get_run("r")["id"] == "r"  # a read: folds first (read-your-writes)
        returned_while_writing = not capped.is_set()
        folded = store.read("SELECT count(*) FROM steps WHERE run_id = ?", ("r",))[0][0]
    finally:
        stop.set()
        writer.join(40)
        store.close()
    assert returned_while_writing, "the read waited until the writer stopped"
    assert folded >= before  # everything appended before the read is in the tables
