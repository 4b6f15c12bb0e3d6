"""Store conformance: steps, snapshots, blobs and the effect ledger (see ``store_suite.py``)."""

from __future__ import annotations

import hashlib
import json
import os
import time
import uuid
from typing import Any, cast

import pytest

from kernelext._store.duckdb.backend import INLINE_LIMIT
from kernelext._store.heartbeats import HEARTBEAT_LAPSE_SECONDS
from kernelext.errors import LedgerError

from .store_suite_support import (
    FakeClock,
    StoreFactory,
    complete,
    effect_row,
    events,
    make_blob,
    with_runs,
)

__all__ = ["TestBlobs", "TestEffects", "TestSteps"]


# -- steps and snapshots ------------------------------------------------------------
class TestSteps:
    def test_complete_step_writes_step_snapshot_and_blobs_together(
        self, store_factory: StoreFactory
    ) -> None:
        store = store_factory()
        store.create_run("r1", "agent")
        blob = make_blob(b'{"a":1}')
        step_id = complete(store, "r1", 0, "k0", [blob], {"a": blob.id.hex})
        (step,) = store.steps("r1")
        assert step["id"] == step_id
        assert (step["status"], step["key"], step["name"], step["ordinal"]) == (
            "completed",
            "k0",
            "name-k0",
            0,
        )
        assert step["duration_s"] == 0.25
        assert step["ended_at"] is not None and step["started_at"] <= step["ended_at"]
        snap = store.latest_snapshot("r1")
        assert snap is not None
        assert snap["id"] == step["snapshot_id"]
        assert snap["manifest"] == {"a": blob.id.hex}
        assert store.get_run("r1")["completed_steps"] == 1
        loaded = store.load_blobs("r1", [blob.id])
        assert loaded[blob.id].data == b'{"a":1}'
        assert loaded[blob.id].sha256 == blob.sha256

    def test_a_read_sees_what_this_process_queued(self, store_factory: StoreFactory) -> None:
        store = store_factory()
        store.create_run("r1", "agent")
        store.write_async(lambda tx: time.sleep(0.3))  # the writer is busy for a while
        store.begin_step("r1", uuid.uuid4(), 0, "k0", None)  # queued, not waited for
        store.record_event("r1", "note", wait=False)
        assert [s["key"] for s in store.steps("r1")] == ["k0"]
        assert "note" in [e["kind"] for e in store.events("r1")]

    def test_a_failing_completion_leaves_no_partial_rows(self, store_factory: StoreFactory) -> None:
        store = store_factory()
        store.create_run("r1", "agent")
        step_id = uuid.uuid4()
        store.begin_step("r1", step_id, 0, "k0", None)
        blob = make_blob(b"[1,2,3]")
        # The snapshot row cannot be written (its byte count is NOT NULL): the blob
        # inserted earlier in the same transaction must vanish with it.
        with pytest.raises(Exception):  # noqa: B017 - backend-specific error type
            store.complete_step("r1", step_id, 0, 0.1, {"x": blob.id.hex}, [blob], cast(int, None))
        (step,) = store.steps("r1")
        assert step["status"] == "running" and step["snapshot_id"] is None
        assert store.read("SELECT count(*) FROM blobs") == [(0,)]
        assert store.read("SELECT count(*) FROM snapshots") == [(0,)]
        assert store.get_run("r1")["completed_steps"] == 0
        assert store.latest_snapshot("r1") is None

    def test_end_step_and_abandon(self, store_factory: StoreFactory) -> None:
        store = store_factory()
        store.create_run("r1", "agent")
        forced, dangling = uuid.uuid4(), uuid.uuid4()
        store.begin_step("r1", forced, 0, "a", None)
        store.begin_step("r1", dangling, 1, "b", None)
        store.end_step("r1", forced, "cancelled", error="forced stop", forced=True, duration_s=3.0)
        abandoned = store.write(lambda tx: store.abandon_running_steps(tx, "r1"))
        assert abandoned == 1
        rows = {r["key"]: r for r in store.steps("r1")}
        assert (rows["a"]["status"], rows["a"]["forced"], rows["a"]["error"]) == (
            "cancelled",
            True,
            "forced stop",
        )
        assert rows["b"]["status"] == "abandoned" and rows["b"]["forced"] is False
        assert store.completed_steps("r1") == []

    def test_a_heartbeat_keeps_an_item_live_until_it_lapses(
        self, store_factory: StoreFactory
    ) -> None:
        clock = FakeClock()
        store = with_runs(store_factory(clock), "r1", "r2")
        beaten, quiet, other = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
        store.begin_step("r1", beaten, 0, "item-0", None, wait=True)
        store.begin_step("r1", quiet, 1, "item-1", None, wait=True)
        store.begin_step("r2", other, 0, "item-0", None, wait=True)
        assert store.live_item_keys("r1") == set(), "no heartbeat: nothing is live"
        store.beat_steps("r1", [beaten, other])  # another run's step is not moved
        assert store.live_item_keys("r1") == {"item-0"}
        assert store.live_item_keys("r2") == set()
        store.write(lambda tx: store.abandon_running_steps(tx, "r1"))
        assert store.write(lambda tx: store.live_item_keys_tx(tx, "r1")) == {"item-0"}, (
            "an attempt the owner abandoned is live while its worker beats"
        )
        clock.advance(HEARTBEAT_LAPSE_SECONDS + 1)
        assert store.live_item_keys("r1") == set(), "a worker not heard of is gone"

    def test_latest_snapshot_and_before_ordinal(self, store_factory: StoreFactory) -> None:
        store = store_factory()
        store.create_run("r1", "agent")
        ids = {}
        for ordinal in range(3):
            blob = make_blob(str(ordinal).encode())
            complete(store, "r1", ordinal, f"k{ordinal}", [blob], {"n": blob.id.hex})
            ids[ordinal] = blob.id.hex
        # A step that started but never completed has no snapshot to offer.
        store.begin_step("r1", uuid.uuid4(), 3, "k3", None)
        store.flush()

        def ordinal_of(snap: dict[str, Any] | None) -> int | None:
            return None if snap is None else int(snap["step_ordinal"])

        latest = store.latest_snapshot("r1")
        assert ordinal_of(latest) == 2 and latest is not None
        assert latest["manifest"] == {"n": ids[2]}
        assert ordinal_of(store.latest_snapshot("r1", before_ordinal=2)) == 1
        assert ordinal_of(store.latest_snapshot("r1", before_ordinal=1)) == 0
        assert store.latest_snapshot("r1", before_ordinal=0) is None
        assert store.latest_snapshot("other") is None
        assert [s["key"] for s in store.completed_steps("r1")] == ["k0", "k1", "k2"]

    def test_snapshots_of_two_runs_do_not_mix(self, store_factory: StoreFactory) -> None:
        store = store_factory()
        for run_id in ("r1", "r2"):
            store.create_run(run_id, "agent")
            blob = make_blob(run_id.encode())
            complete(store, run_id, 0, "k0", [blob], {"who": blob.id.hex})
        for run_id in ("r1", "r2"):
            snap = store.latest_snapshot(run_id)
            assert snap is not None
            bid = uuid.UUID(hex=snap["manifest"]["who"])
            assert store.load_blobs(run_id, [bid])[bid].data == run_id.encode()
            # A blob of another run is not handed out.
            other = "r2" if run_id == "r1" else "r1"
            assert store.load_blobs(other, [bid]) == {}


class TestBlobs:
    def test_load_blobs_follows_the_whole_delta_chain(self, store_factory: StoreFactory) -> None:
        store = store_factory()
        store.create_run("r1", "agent")
        base = make_blob(b"[1]")
        chain = [base]
        for ordinal in range(1, 5):
            chain.append(make_blob(f"[{ordinal + 1}]".encode(), chain[-1], "json+append"))
        for ordinal, blob in enumerate(chain):
            complete(store, "r1", ordinal, f"k{ordinal}", [blob], {"xs": blob.id.hex})
        unrelated = make_blob(b'"other"')
        complete(store, "r1", 5, "k5", [unrelated], {"y": unrelated.id.hex})
        loaded = store.load_blobs("r1", [chain[-1].id])
        assert set(loaded) == {b.id for b in chain}
        for blob in chain:
            got = loaded[blob.id]
            assert (got.data, got.base_id, got.encoding, got.size, got.sha256) == (
                blob.data,
                blob.base_id,
                blob.encoding,
                blob.size,
                blob.sha256,
            )
        assert store.blob_chain_ids("r1")[chain[3].id] == chain[2].id
        assert store.load_blobs("r1", []) == {}

    def test_large_blob_goes_to_a_side_file_with_hash_and_location(
        self, store_factory: StoreFactory
    ) -> None:
        store = store_factory()
        store.create_run("r1", "agent")
        data = os.urandom(INLINE_LIMIT + 4096)
        big = make_blob(data, encoding="bytes")
        small = make_blob(b'"small"')
        complete(store, "r1", 0, "k0", [big, small], {"big": big.id.hex, "s": small.id.hex})
        rows = {
            r[0]: r[1:]
            for r in store.read("SELECT id, location, sha256, size, data IS NULL FROM blobs")
        }
        location, sha, size, data_is_null = rows[big.id]
        if store.backend.inline_limit >= len(data):
            # A server backend keeps payloads in the database, readable from every host.
            assert (location, sha, size, data_is_null) == (
                "inline",
                hashlib.sha256(data).hexdigest(),
                len(data),
                False,
            )
            assert store.load_blobs("r1", [big.id])[big.id].data == data
            return
        assert location.startswith("file:")
        assert not os.path.isabs(location.removeprefix("file:"))  # relative: the folder can move
        assert (sha, size, data_is_null) == (hashlib.sha256(data).hexdigest(), len(data), True)
        path = store.payload_path(location)
        assert path == os.path.join(store.blob_dir("r1"), big.id.hex)
        with open(path, "rb") as handle:
            assert hashlib.sha256(handle.read()).hexdigest() == sha
        assert os.stat(path).st_mode & 0o777 == 0o600
        assert rows[small.id][0] == "inline" and rows[small.id][3] is False
        loaded = store.load_blobs("r1", [big.id, small.id])
        assert loaded[big.id].data == data
        assert loaded[small.id].data == b'"small"'


# -- effects --------------------------------------------------------------------------
class TestEffects:
    def test_intent_then_outcome(self, store_factory: StoreFactory) -> None:
        clock = FakeClock()
        store = store_factory(clock)
        store.create_run("r1", "agent")
        row = effect_row("r1")
        assert store.write_intent(row) is None
        stored = store.effect(row["key"])
        assert stored is not None
        assert (stored["status"], stored["intent_at"], stored["tool"]) == (
            "pending",
            clock.current,
            "send_email",
        )
        # A second intent with the same key returns what is there instead of inserting.
        again = store.write_intent(row)
        assert again is not None and again["status"] == "pending"
        clock.advance(2)
        store.write_outcome(row["key"], "applied", result='{"id": 7}', wait=True)
        stored = store.effect(row["key"])
        assert stored is not None
        assert (stored["status"], stored["result"], stored["outcome_at"]) == (
            "applied",
            '{"id": 7}',
            clock.current,
        )
        # An outcome only lands on a pending row.
        store.write_outcome(row["key"], "failed", error="late", wait=True)
        stored = store.effect(row["key"])
        assert stored is not None and stored["status"] == "applied" and stored["error"] is None
        assert set(store.load_effects("r1")) == {row["key"]}

    def test_queued_outcome_is_stored_after_flush(self, store_factory: StoreFactory) -> None:
        store = store_factory()
        store.create_run("r1", "agent")
        row = effect_row("r1")
        store.write_intent(row)
        store.write_outcome(row["key"], "failed", error="HTTP 500")
        store.flush()
        stored = store.effect(row["key"])
        assert stored is not None and (stored["status"], stored["error"]) == ("failed", "HTTP 500")

    def test_pending_becomes_unknown_with_an_event(self, store_factory: StoreFactory) -> None:
        store = store_factory()
        store.create_run("r1", "agent")
        pending, done = effect_row("r1", call=0), effect_row("r1", call=1)
        store.write_intent(pending)
        store.write_intent(done)
        store.write_outcome(done["key"], "applied", result="null", wait=True)
        keys = store.write(lambda tx: store.mark_pending_unknown(tx, "r1"))
        assert keys == [pending["key"]]
        assert [r["key"] for r in store.open_unknowns("r1")] == [pending["key"]]
        (event,) = events(store, "r1", "effect_unknown")
        assert json.loads(event["detail"])["key"] == str(pending["key"])
        # Running it again finds nothing new.
        assert store.write(lambda tx: store.mark_pending_unknown(tx, "r1")) == []

    @pytest.mark.parametrize(
        ("decision", "status", "run_status"),
        [
            ("applied", "applied", "needs_decision"),
            ("not_applied", "not_applied", "needs_decision"),
            ("give_up", "given_up", "cancelled"),
        ],
    )
    def test_decide_unknown(
        self, store_factory: StoreFactory, decision: str, status: str, run_status: str
    ) -> None:
        store = store_factory()
        store.create_run("r1", "agent")
        store.transition("r1", "needs_decision", ("running",))
        row = effect_row("r1")
        store.write_intent(row)
        store.write(lambda tx: store.mark_pending_unknown(tx, "r1"))
        run_id = store.decide_effect(
            row["key"], decision, result='"sent"', who="carol@lab:1", note="checked the outbox"
        )
        assert run_id == "r1"
        stored = store.effect(row["key"])
        assert stored is not None
        assert (stored["status"], stored["decided_by"], stored["decision_note"]) == (
            status,
            "carol@lab:1",
            "checked the outbox",
        )
        assert stored["result"] == ('"sent"' if decision == "applied" else None)
        (event,) = events(store, "r1", "effect_decided")
        assert json.loads(event["detail"])["decision"] == decision
        assert store.get_run("r1")["status"] == run_status
        assert store.open_unknowns("r1") == []

    def test_deciding_a_known_or_missing_effect_is_refused(
        self, store_factory: StoreFactory
    ) -> None:
        store = store_factory()
        store.create_run("r1", "agent")
        row = effect_row("r1")
        store.write_intent(row)
        with pytest.raises(LedgerError, match="only unknown effects"):
            store.decide_effect(row["key"], "applied", result=None, who="x", note=None)
        with pytest.raises(LedgerError, match="No effect"):
            store.decide_effect(uuid.uuid4(), "applied", result=None, who="x", note=None)
        stored = store.effect(row["key"])
        assert stored is not None and stored["status"] == "pending"
