"""Faults other than SIGKILL on the write path: a disk that fills, a fold that fails,
a record the tables refuse, damaged and unknown journal records.

Each test checks against a real local HTTP server counting deliveries: no duplicate,
every delivery in the ledger, every ambiguous effect ``unknown`` until decided.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from support.http_server import DeliveryServer, post_json
from support.journal_records import step_begin_record
from support.small_disk import fill

import kernelext as kx
from kernelext._store import Store, open_store
from kernelext._store.duckdb.journal import scan_journal
from kernelext.errors import StoreWriteError

pytestmark = pytest.mark.slow


# -- the agent: one delivery per item ----------------------------------------------------
def make_agent(server: DeliveryServer, name: str, on_delivered: Any = None) -> kx.Agent:
    @kx.effect(name=f"deliver_{name}")
    def deliver(item: int, *, idempotency_key: str | None = None) -> int:
        response = post_json(server.url + "/items", {"item": item}, idempotency_key)
        if on_delivered is not None:
            on_delivered(item)
        return response.status

    @kx.agent(name=name)
    def agent(run: kx.Run, items: list[int]) -> int:
        for item in run.steps(items, key=str):
            deliver(item)
            run.state["done"] = run.state.get("done", 0) + 1
        return int(run.state.get("done", 0))

    return agent


def delivered_items(server: DeliveryServer) -> Counter[int]:
    return Counter(int(d["body"]["item"]) for d in server.deliveries)


def settle_unknowns(store: Store, run_id: str, server: DeliveryServer) -> int:
    """Decide each unknown effect from the server's own record, as a person would."""
    keys = {d["idempotency_key"] for d in server.deliveries}
    decided = 0
    for unknown in kx.reconcile(run_id, store=store):
        if str(unknown.key) in keys:
            unknown.mark_applied(result=200)
        else:
            unknown.mark_not_applied()
        decided += 1
    return decided


def resume_to_the_end(store: Store, run_id: str, server: DeliveryServer) -> str:
    for _ in range(5):
        status = kx.resume(run_id, store=store).wait(timeout=120)
        if status != "needs_decision":
            return status
        assert settle_unknowns(store, run_id, server) > 0
    raise AssertionError("the run kept asking for decisions")


def ledger_matches_server(store: Store, run_id: str, server: DeliveryServer) -> None:
    rows = store.read(
        "SELECT key, status FROM effects WHERE run_id = ? AND status = 'applied'", (run_id,)
    )
    applied = {str(r[0]) for r in rows}
    keys = [d["idempotency_key"] for d in server.deliveries]
    assert sorted(applied) == sorted(k for k in keys if k is not None)


# -- the disk fills mid-run ----------------------------------------------------------------
def test_a_disk_that_fills_mid_run_ends_it_cleanly_and_a_resume_repeats_nothing(
    small_disk: Path, delivery_server: DeliveryServer
) -> None:
    store = open_store(str(small_disk / "store.duckdb"))
    filler = small_disk / "filler"
    items = list(range(30))

    def fill_after(item: int) -> None:
        if item == 12:
            fill(filler)

    agent = make_agent(delivery_server, "disk_full", fill_after)
    try:
        handle = agent.start(items, run_id="disk-full", store=store)
        assert handle.wait(timeout=120) == "failed"  # returns: nothing loops
        assert isinstance(handle.error, StoreWriteError)
        assert "kx.resume('disk-full')" in str(handle.error)
        before = delivered_items(delivery_server)
        assert 13 <= len(before) < len(items)  # it stopped once nothing could be stored

        filler.unlink()  # the fault clears
        assert resume_to_the_end(store, "disk-full", delivery_server) == "completed"
        counts = delivered_items(delivery_server)
        assert sorted(counts) == items
        assert set(counts.values()) == {1}, counts  # nothing applied twice
        ledger_matches_server(store, "disk-full", delivery_server)
        assert kx.sql("SELECT count(*) AS n FROM quarantine", store=store)["n"][0] == 0
    finally:
        store.close()


def test_an_intent_that_could_not_be_stored_leaves_no_phantom(
    small_disk: Path, delivery_server: DeliveryServer
) -> None:
    """ENOSPC on the intent itself: the call is not made, and nothing claims it was.

    The intent of item 3 is larger than any free room left in the journal's last page,
    so its append is the one that fails.
    """
    store = open_store(str(small_disk / "store.duckdb"))
    filler = small_disk / "filler"
    items = list(range(6))
    filled: list[bool] = []

    @kx.effect
    def deliver_padded(item: int, pad: str, *, idempotency_key: str | None = None) -> int:
        return post_json(delivery_server.url + "/items", {"item": item}, idempotency_key).status

    @kx.agent(name="phantom")
    def agent(run: kx.Run, items: list[int]) -> None:
        for item in run.steps(items, key=str):
            if item == 3 and not filled:
                filled.append(True)
                fill(filler)
            deliver_padded(item, "x" * 8192 if item == 3 else "")

    try:
        handle = agent.start(items, run_id="phantom", store=store)
        assert handle.wait(timeout=120) == "failed"
        assert isinstance(handle.error, StoreWriteError)
        assert delivered_items(delivery_server) == Counter({0: 1, 1: 1, 2: 1})
        filler.unlink()
        # The same process resumes: it must not remember an intent that was never stored
        # (it would wait for a decision on an effect that is not in the ledger).
        handle = kx.resume("phantom", store=store)
        status = handle.wait(timeout=120)
        assert status == "completed"
        assert delivered_items(delivery_server) == Counter(dict.fromkeys(items, 1))
        ledger_matches_server(store, "phantom", delivery_server)
    finally:
        store.close()


# -- a fold that fails for a transient reason ---------------------------------------------
LONG_READER = """
import sys
import kernelext as kx
store = kx.open_store(sys.argv[1])
print("querying", flush=True)
kx.sql("SELECT sum(hash(i)) AS s FROM range(400000000) t(i)", store=store)
print("done", flush=True)
store.close()
"""


def test_a_fold_that_fails_for_a_transient_reason_is_retried_and_loses_nothing(
    store_path: Path,
    delivery_server: DeliveryServer,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A long query in another process holds the store file while the agent runs, longer
    than this process waits for it: every fold fails meanwhile. The records wait in the
    journal and are folded once the file is free; nothing is split off or dropped."""
    monkeypatch.setenv("KERNELEXT_STORE_WAIT", "0.2")
    store = open_store(str(store_path))
    items = list(range(20))
    reader_querying, reader_done = threading.Event(), threading.Event()
    # the reader waits for the store file as any process does: the short wait set above is
    # this process's own (under load a fold here can hold the file longer than 0.2 s)
    reader_env = {k: v for k, v in os.environ.items() if k != "KERNELEXT_STORE_WAIT"}
    reader = subprocess.Popen(
        [sys.executable, "-c", LONG_READER, str(store_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=reader_env,
    )

    def pace(item: int) -> None:
        if item == 5:  # from here on the other process holds the file
            assert reader_querying.wait(120)
        if 5 <= item < 15:
            time.sleep(0.05)
        if item == 15:  # the run ends once the file is free again
            assert reader_done.wait(120)

    agent = make_agent(delivery_server, "transient", pace)
    try:
        handle = agent.start(items, run_id="transient", store=store)
        assert reader.stdout is not None
        assert reader.stdout.readline().strip() == "querying"
        reader_querying.set()
        out, err = reader.communicate(timeout=120)
        assert "done" in out, err[-2000:]
        reader_done.set()
        assert handle.wait(timeout=120) == "completed"
        failures = [r for r in caplog.records if "folding the journal" in r.getMessage()]
        assert 1 <= len(failures) <= 2  # the fault is reported, not once per retry
        steps = store.read(
            "SELECT count(*) FROM steps WHERE run_id = 'transient' AND status = 'completed'"
        )
        assert steps[0][0] == len(items)
        counts = delivered_items(delivery_server)
        assert counts == Counter(dict.fromkeys(items, 1))
        ledger_matches_server(store, "transient", delivery_server)
    finally:
        reader.kill()
        store.close()


# -- journals left by processes that died ----------------------------------------------------
def dead_journal(store_path: Path, frames: list[bytes]) -> Path:
    """The journal file a killed process leaves: its frames, and nobody holding its lock."""
    path = Path(f"{store_path}.journal.{2**22 + 17}.{uuid.uuid4().hex[:8]}")
    path.write_bytes(b"".join(frames))
    return path


def step_records(
    run_id: str, count: int, first_seq: int = 1
) -> list[tuple[int, str, dict[str, Any]]]:
    """A run's journal: each step begun and completed (with an empty snapshot)."""
    import datetime as dt

    at = dt.datetime(2026, 1, 1)
    records: list[tuple[int, str, dict[str, Any]]] = []
    seq = first_seq
    for ordinal in range(count):
        begin = step_begin_record(run_id, ordinal, at)
        complete = {
            "step_id": begin["id"],
            "run_id": run_id,
            "ordinal": ordinal,
            "at": at,
            "duration_s": 0.001,
            "snapshot_id": uuid.uuid4(),
            "manifest": "{}",
            "bytes": 0,
            "blobs": [],
        }
        records += [(seq, "step_begin", begin), (seq + 1, "step_complete", complete)]
        seq += 2
    return records


def completed_steps(store: Store, run_id: str) -> list[int]:
    rows = store.read(
        "SELECT ordinal FROM steps WHERE run_id = ? AND status = 'completed' ORDER BY ordinal",
        (run_id,),
    )
    return [r[0] for r in rows]


@pytest.fixture
def run_in_store(store_path: Path) -> str:
    """A store with one suspended run in it, closed again."""
    with open_store(str(store_path)) as store:
        store.create_run("orphan", "orphan_agent")
        store.transition("orphan", "suspended", ("running",), kind="suspended")
    return "orphan"


def test_a_corrupt_byte_in_a_dead_journal_loses_only_that_record(
    store_path: Path, run_in_store: str
) -> None:
    from kernelext._store.duckdb.journal import frame

    records = step_records(run_in_store, 6)
    frames = [frame(*r) for r in records]
    path = dead_journal(store_path, frames)
    damaged = bytearray(path.read_bytes())
    target = sum(len(f) for f in frames[:5]) + 20  # inside record 6: step 2's completion
    damaged[target] ^= 0xFF
    path.write_bytes(bytes(damaged))

    with open_store(str(store_path)) as store:  # opens, for everyone
        assert completed_steps(store, run_in_store) == [0, 1, 3, 4, 5]
        kept = store.read("SELECT kind, file, run_id FROM quarantine ORDER BY run_id NULLS FIRST")
        assert [(k[0], k[2]) for k in kept] == [("(damage)", None), ("(damage)", run_in_store)]
        assert not path.exists()  # moved aside, kept for inspection
        assert Path(kept[0][1]).read_bytes() == bytes(damaged)
        # Its run may miss a record that was in the damaged bytes: it waits for a person.
        run = store.get_run(run_in_store)
        assert run["status"] == "needs_decision" and "damaged" in run["reason"]
        events = store.read("SELECT count(*) FROM events WHERE kind = 'record_quarantined'")
        assert events[0][0] == 2
    with open_store(str(store_path)) as store:  # and again: nothing left to trip on
        assert completed_steps(store, run_in_store) == [0, 1, 3, 4, 5]
        assert store.read("SELECT count(*) FROM quarantine")[0][0] == 2


def test_a_record_the_tables_refuse_is_quarantined_and_its_run_waits_for_a_decision(
    store_path: Path, run_in_store: str
) -> None:
    from kernelext._store.duckdb.journal import frame

    records = step_records(run_in_store, 4)
    del records[3][2]["blobs"]  # well-formed JSON, but not a record the tables take
    path = dead_journal(store_path, [frame(*r) for r in records])

    with open_store(str(store_path)) as store:
        assert completed_steps(store, run_in_store) == [0, 2, 3]
        (row,) = store.read_dicts("SELECT * FROM quarantine")
        assert row["kind"] == "step_complete" and row["run_id"] == run_in_store
        assert "blobs" in row["error"] and row["seq"] == 4
        run = store.get_run(run_in_store)
        assert run["status"] == "needs_decision" and "quarantined" in run["reason"]
        assert run["deadline"] is not None
        assert not path.exists()
    with open_store(str(store_path)) as store:  # opening again never trips on it
        assert store.read("SELECT count(*) FROM quarantine")[0][0] == 1


def test_an_unknown_record_kind_is_quarantined_not_dropped(
    store_path: Path, run_in_store: str
) -> None:
    from kernelext._store.duckdb.journal import frame

    records = step_records(run_in_store, 2)
    records.insert(2, (99, "approval_request", {"run_id": run_in_store, "tool": "pay"}))
    path = dead_journal(store_path, [frame(*r) for r in records])
    with open_store(str(store_path)) as store:
        assert completed_steps(store, run_in_store) == [0, 1]
        (row,) = store.read_dicts("SELECT kind, payload, error FROM quarantine")
        assert row["kind"] == "approval_request" and '"tool":"pay"' in row["payload"]
        assert "does not know" in row["error"]
    assert not path.exists()


def test_frames_carry_a_version_and_first_release_frames_still_fold(
    store_path: Path, run_in_store: str
) -> None:
    import json
    import struct
    import zlib

    from kernelext._store.duckdb.journal import FORMAT_VERSION, encode_payload, frame

    records = step_records(run_in_store, 2)
    assert frame(*records[0])[0] == FORMAT_VERSION
    legacy = []
    for seq, kind, data in records:  # the first release: length and crc, no version
        payload = encode_payload(seq, kind, data)
        legacy.append(struct.pack(">II", len(payload), zlib.crc32(payload)) + payload)
    json.loads(legacy[0][8:])  # a plain frame
    dead_journal(store_path, legacy)
    with open_store(str(store_path)) as store:
        assert completed_steps(store, run_in_store) == [0, 1]


def test_a_torn_last_record_is_a_normal_crash_not_damage(
    store_path: Path, run_in_store: str
) -> None:
    from kernelext._store.duckdb.journal import frame

    frames = [frame(*r) for r in step_records(run_in_store, 3)]
    frames[-1] = frames[-1][: len(frames[-1]) // 2]  # the append a SIGKILL cut off
    path = dead_journal(store_path, frames)
    assert scan_journal(str(path)).torn_tail
    with open_store(str(store_path)) as store:
        assert completed_steps(store, run_in_store) == [0, 1]
        assert store.read("SELECT count(*) FROM quarantine")[0][0] == 0
    assert not path.exists()


# -- a record refused while the process lives ------------------------------------------------
def test_a_live_record_the_tables_refuse_is_quarantined_and_its_neighbours_fold(
    store_path: Path,
) -> None:
    import datetime as dt

    with open_store(str(store_path)) as store:
        store.create_run("live", "live_agent")
        good = step_records("live", 3)
        bad = dict(good[2][2], ordinal="not a number")  # passes the check, refused by DuckDB
        for _seq, kind, data in good[:2]:
            store.record(kind, data, sync=False)
        store.record("step_begin", bad, sync=False)
        for _seq, kind, data in good[3:]:
            store.record(kind, data, sync=True)
        store.flush()
        assert completed_steps(store, "live") == [0, 2]
        (row,) = store.read_dicts("SELECT kind, run_id, error FROM quarantine")
        assert row["kind"] == "step_begin" and "Conversion" in row["error"]
        assert store.get_run("live")["status"] == "needs_decision"
        assert "live" in store.quarantined_runs
        assert store.hot_path is not None and not store.hot_path.unfolded
        del dt


# -- a read-only store folder --------------------------------------------------------------
def test_a_store_on_a_read_only_mount_can_be_read_and_refuses_writes_clearly(
    small_disk: Path, delivery_server: DeliveryServer
) -> None:
    path = small_disk / "store.duckdb"
    agent = make_agent(delivery_server, "readonly")
    with open_store(str(path)) as store:
        assert agent.start([1, 2, 3], run_id="ro", store=store).wait(timeout=60) == "completed"
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    store = open_store(str(path))
    try:
        assert store.read_only
        assert completed_steps(store, "ro") == [0, 1, 2]
        frame = kx.sql("SELECT status FROM runs WHERE id = 'ro'", store=store)
        assert list(frame["status"]) == ["completed"]
        with pytest.raises(StoreWriteError, match="read-only"):
            agent.start([4], run_id="ro-2", store=store)
    finally:
        store.close()
    with pytest.raises(kx.KernelextError, match="read_only=True"):
        open_store(str(path), read_only=False)  # asked to write: says how to read it


# -- a killed process's journal, damaged, end to end -------------------------------------------
def test_a_damaged_journal_of_a_killed_run_folds_what_is_intact_and_holds_the_run(
    store_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker runs while another process holds the store file (so its records stay in
    its journal), and is SIGKILLed. A byte in the middle of its journal is then flipped.
    The next open folds the records before and after the damage, keeps the file, and holds
    the run in needs_decision: its ledger may miss a call. Resumed deliberately, nothing
    is delivered twice (the server honours the ledger's idempotency keys, as real APIs do)."""
    from crash import CRASH_DIR
    from crash.fault_agent import AGENT_STATE, damage

    with DeliveryServer(dedupe=True, log_path=tmp_path / "deliveries.jsonl") as server:
        env = dict(
            os.environ,
            KERNELEXT_STORE_WAIT="0.2",
            PYTHONPATH=os.pathsep.join([str(CRASH_DIR.parent), str(CRASH_DIR)]),
        )
        worker = subprocess.Popen(
            [
                sys.executable,
                str(CRASH_DIR / "damage_worker.py"),
                str(store_path),
                server.url,
                "12",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert worker.stdout is not None and worker.stdin is not None
        assert worker.stdout.readline().strip() == "started"
        reader = subprocess.Popen(
            [sys.executable, "-c", LONG_READER, str(store_path)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert reader.stdout is not None
        assert reader.stdout.readline().strip() == "querying"
        worker.stdin.write("go\n")
        worker.stdin.flush()
        assert worker.wait(120) == -9  # killed after its last delivery
        assert reader.wait(120) == 0
        for pipe in (worker.stdin, worker.stdout, reader.stdout):
            pipe.close()
        assert server.count() == 12

        (journal,) = Path(store_path).parent.glob(Path(store_path).name + ".journal.*")
        raw = bytearray(journal.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        journal.write_bytes(bytes(raw))

        store = open_store(str(store_path))
        try:
            run = store.get_run("damaged")
            assert run["status"] == "needs_decision" and "damaged" in run["reason"]
            kept = store.read_dicts("SELECT kind, run_id, file FROM quarantine")
            assert {k["kind"] for k in kept} == {"(damage)"}
            assert Path(kept[0]["file"]).exists() and not journal.exists()
            folded = len(completed_steps(store, "damaged"))
            assert 0 < folded < 12  # before and after the damage, not the damaged record

            AGENT_STATE.update(url=server.url, last=-1, on_last=None, first=None)
            assert damage.fn is not None
            assert resume_to_the_end(store, "damaged", server) == "completed"
            assert server.count() == 12  # each item delivered once; repeats were replays
            assert all(server.count(d["idempotency_key"]) == 1 for d in server.deliveries)
        finally:
            store.close()


BUSY_HOLDER = """
import sys, time
import kernelext as kx
store = kx.open_store(sys.argv[1])

@kx.agent(name="busy")
def busy(run):
    for _ in run.steps(range(3)):
        time.sleep(2)

handle = busy.start(run_id="busy", store=store)
print("running", flush=True)
handle.wait()
"""


def test_a_read_only_opener_gets_its_turn_from_a_busy_writer(store_path: Path) -> None:
    """A read-only process cannot create the hand-over files; the writer made them, so
    it is still seen waiting and handed the store within its wait."""
    with subprocess.Popen(
        [sys.executable, "-c", BUSY_HOLDER, str(store_path)], stdout=subprocess.PIPE, text=True
    ) as holder:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "running"
        reader = subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys; from kernelext._store import open_store; "
                "s = open_store(sys.argv[1], read_only=True); "
                'print(s.read("SELECT id FROM runs")[0][0]); s.close()',
                str(store_path),
            ],
            env=dict(os.environ, KERNELEXT_STORE_WAIT="5"),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        holder.kill()
    assert reader.returncode == 0, reader.stderr[-2000:]
    assert reader.stdout.strip() == "busy"
