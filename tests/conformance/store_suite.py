"""The store conformance suite: what every backend of ``kernelext.store.Store`` must do.

Nothing here knows which backend it runs on. A backend's test module provides a
``store_factory`` fixture that yields a :class:`StoreFactory` and imports the
``Test*`` classes below (see ``tests/test_store_conformance.py``)::

    from conformance.store_suite import *  # noqa: F403  (the Test* classes)

A factory call ``store_factory(clock=None)`` returns a fresh, empty, opened store;
``store_factory.reopen(store)`` closes ``store`` and opens its database again.
Timestamps come from the injected clock when one is given.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, cast

import pytest

from kernelext.errors import LedgerError, ReadOnlyError, RunNotFound
from kernelext.store import Blob, Store, utcnow
from kernelext.store.duckdb.backend import INLINE_LIMIT
from kernelext.store.schema import MIGRATIONS, TABLES

__all__ = [
    "FakeClock",
    "StoreFactory",
    "TestBlobs",
    "TestEffects",
    "TestGroupCommit",
    "TestReads",
    "TestRequestStop",
    "TestRuns",
    "TestSchema",
    "TestSteps",
    "TestTimestamps",
    "TestTransitions",
]

Clock = Callable[[], dt.datetime]
WAIT = 60.0  # generous bound for anything the writer thread must do


class StoreFactory:
    """Opens stores for the suite. A backend subclasses it (two methods)."""

    def __init__(self) -> None:
        self.opened: list[Store] = []
        self._locations: dict[int, str] = {}

    # -- what a backend implements ------------------------------------------------
    def fresh_location(self) -> str:
        """A location (path, URL) of a database no test has used yet."""
        raise NotImplementedError

    def open_location(self, location: str, clock: Clock | None) -> Store:
        raise NotImplementedError

    # -- what tests use ---------------------------------------------------------------
    def __call__(self, clock: Clock | None = None) -> Store:
        return self._open(self.fresh_location(), clock)

    def reopen(self, store: Store, clock: Clock | None = None) -> Store:
        location = self._locations[id(store)]
        store.close()
        return self._open(location, clock)

    def close_all(self) -> None:
        for store in self.opened:
            store.close()

    def _open(self, location: str, clock: Clock | None) -> Store:
        store = self.open_location(location, clock)
        self.opened.append(store)
        self._locations[id(store)] = location
        return store


class FakeClock:
    """A clock the test moves by hand (naive UTC, like the store)."""

    def __init__(self, start: dt.datetime | None = None) -> None:
        self.current = start or dt.datetime(2030, 1, 2, 3, 4, 5, 678000)

    def __call__(self) -> dt.datetime:
        return self.current

    def advance(self, seconds: float) -> dt.datetime:
        self.current += dt.timedelta(seconds=seconds)
        return self.current


# -- helpers -----------------------------------------------------------------------------
def make_blob(data: bytes, base: Blob | None = None, encoding: str = "json") -> Blob:
    digest = hashlib.sha256(data).hexdigest()
    return Blob(uuid.uuid4(), encoding, digest, len(data), base.id if base else None, data)


def complete(
    store: Store,
    run_id: str,
    ordinal: int,
    key: str,
    blobs: Sequence[Blob] = (),
    manifest: dict[str, str] | None = None,
) -> uuid.UUID:
    """Begin and complete one step; returns the step id."""
    step_id = uuid.uuid4()
    store.begin_step(run_id, step_id, ordinal, key, f"name-{key}")
    store.complete_step(
        run_id,
        step_id,
        ordinal,
        0.25,
        manifest if manifest is not None else {b.id.hex: b.id.hex for b in blobs},
        list(blobs),
        sum(b.size for b in blobs),
    )
    return step_id


def events(store: Store, run_id: str, kind: str | None = None) -> list[dict[str, Any]]:
    rows = store.events(run_id)
    return [r for r in rows if kind is None or r["kind"] == kind]


def effect_row(run_id: str, tool: str = "send_email", call: int = 0) -> dict[str, Any]:
    return {
        "key": uuid.uuid4(),
        "run_id": run_id,
        "step_key": "s1",
        "step_ordinal": 0,
        "tool": tool,
        "call_ordinal": call,
        "args_hash": "ab" * 16,
        "args": json.dumps({"to": "x@example.org"}),
        "resumable": True,
    }


class Gate:
    """A job that holds the writer thread until released, so later jobs queue up."""

    def __init__(self, store: Store) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.future = store.write_async(self._job)
        assert self.entered.wait(WAIT), "the writer thread never ran the gate job"

    def _job(self, tx: Any) -> None:
        self.entered.set()
        self.release.wait(WAIT)

    def open(self) -> None:
        self.release.set()
        self.future.result(WAIT)


def insert_event_job(store: Store, run_id: str, label: str) -> Callable[[Any], str]:
    def job(tx: Any) -> str:
        store.event(tx, run_id, "probe", source="suite", reason=label)
        return label

    return job


def probe_labels(store: Store, run_id: str) -> list[str]:
    return sorted(str(r["reason"]) for r in events(store, run_id, "probe"))


# -- schema -----------------------------------------------------------------------------
class TestSchema:
    def test_fresh_store_has_latest_schema_and_every_table(
        self, store_factory: StoreFactory
    ) -> None:
        store = store_factory()
        assert store.schema_version() == MIGRATIONS[-1].version
        rows = store.read("SELECT version, description FROM schema_version ORDER BY version")
        assert [(r[0], r[1]) for r in rows] == [(m.version, m.description) for m in MIGRATIONS]
        for table in TABLES:
            assert store.read(f"SELECT count(*) FROM {table}") == [(0,)], table

    def test_migration_versions_are_append_only(self) -> None:
        versions = [m.version for m in MIGRATIONS]
        assert versions == list(range(1, len(versions) + 1))

    def test_reopen_is_idempotent_and_keeps_data(self, store_factory: StoreFactory) -> None:
        store = store_factory()
        assert store.create_run("r1", "agent")
        applied = store.read("SELECT version, applied_at FROM schema_version ORDER BY version")
        for _ in range(2):
            store = store_factory.reopen(store)
            assert store.schema_version() == MIGRATIONS[-1].version
            again = store.read("SELECT version, applied_at FROM schema_version ORDER BY version")
            assert again == applied, "reopening must not re-apply migrations"
            assert store.get_run("r1")["status"] == "running"
            assert len(events(store, "r1", "created")) == 1


# -- runs ---------------------------------------------------------------------------------
class TestRuns:
    def test_create_run_records_row_and_one_event(self, store_factory: StoreFactory) -> None:
        store = store_factory()
        assert store.create_run(
            "r1",
            "triage",
            fingerprint="f" * 16,
            max_step_seconds=2.5,
            args='{"args":[],"kwargs":{}}',
            owner="me@host:1",
            total_steps=7,
            source="test",
        )
        row = store.get_run("r1")
        assert row["agent"] == "triage"
        assert row["status"] == "running"
        assert row["fingerprint"] == "f" * 16
        assert row["max_step_seconds"] == 2.5
        assert row["total_steps"] == 7
        assert row["completed_steps"] == 0
        (created,) = events(store, "r1")
        assert created["kind"] == "created"
        assert created["to_status"] == "running"
        assert created["source"] == "test"

    def test_create_run_conflict_returns_false_and_changes_nothing(
        self, store_factory: StoreFactory
    ) -> None:
        store = store_factory()
        assert store.create_run("r1", "first", fingerprint="aaa")
        before = store.get_run("r1")
        assert store.create_run("r1", "second", fingerprint="bbb") is False
        assert store.get_run("r1") == before
        assert len(events(store, "r1")) == 1

    def test_unknown_run_is_run_not_found(self, store_factory: StoreFactory) -> None:
        store = store_factory()
        with pytest.raises(RunNotFound, match="nope"):
            store.get_run("nope")
        assert store.find_run("nope") is None
        with pytest.raises(RunNotFound):
            store.transition("nope", "suspended", ("running",))
        with pytest.raises(RunNotFound):
            store.request_stop("nope", source="test")

    def test_list_runs_filters_by_status(self, store_factory: StoreFactory) -> None:
        clock = FakeClock()
        store = store_factory(clock)
        for name in ("a", "b", "c"):
            store.create_run(name, "agent")
            clock.advance(1)
        store.transition("b", "suspended", ("running",))
        assert [r["id"] for r in store.list_runs()] == ["a", "b", "c"]
        assert [r["id"] for r in store.list_runs("running")] == ["a", "c"]
        assert [r["id"] for r in store.list_runs("suspended")] == ["b"]


class TestTransitions:
    def test_allowed_transition_writes_exactly_one_event(self, store_factory: StoreFactory) -> None:
        store = store_factory()
        store.create_run("r1", "agent")
        deadline = dt.datetime(2031, 5, 6, 7, 8, 9)
        result = store.transition(
            "r1",
            "suspended",
            ("running", "stopping"),
            kind="suspended",
            source="unit-test",
            reason="user_stop",
            who="alice@lab:42",
            detail={"note": "lunch"},
            fields={"deadline": deadline},
        )
        assert result.ok
        assert (result.before, result.after) == ("running", "suspended")
        row = store.get_run("r1")
        assert (row["status"], row["reason"], row["deadline"]) == (
            "suspended",
            "user_stop",
            deadline,
        )
        moved = events(store, "r1")[1:]
        assert len(moved) == 1
        (event,) = moved
        assert event["kind"] == "suspended"
        assert (event["from_status"], event["to_status"]) == ("running", "suspended")
        assert (event["source"], event["reason"], event["actor"]) == (
            "unit-test",
            "user_stop",
            "alice@lab:42",
        )
        assert json.loads(event["detail"]) == {"note": "lunch"}

    def test_refused_transition_changes_nothing_and_writes_no_event(
        self, store_factory: StoreFactory
    ) -> None:
        store = store_factory()
        store.create_run("r1", "agent")
        before = store.get_run("r1")
        result = store.transition("r1", "completed", ("stopping",), reason="nope")
        assert not result.ok
        assert (result.before, result.after) == ("running", "running")
        assert store.get_run("r1") == before
        assert [e["kind"] for e in events(store, "r1")] == ["created"]

    def test_default_actor_names_user_host_and_process(self, store_factory: StoreFactory) -> None:
        store = store_factory()
        store.create_run("r1", "agent")
        store.transition("r1", "failed", ("running",), source="engine", reason="boom")
        event = events(store, "r1")[-1]
        assert event["actor"].endswith(f":{os.getpid()}")
        assert "@" in event["actor"]

    def test_every_transition_of_a_lifecycle_is_one_event(
        self, store_factory: StoreFactory
    ) -> None:
        store = store_factory()
        store.create_run("r1", "agent")
        path = [
            ("running", "stopping"),
            ("stopping", "suspended"),
            ("suspended", "running"),
            ("running", "completed"),
        ]
        for before, after in path:
            assert store.transition("r1", after, (before,), source="t").ok
        # A final state refuses to move on.
        assert not store.transition("r1", "running", ("suspended",)).ok
        moves = [(e["from_status"], e["to_status"]) for e in events(store, "r1")[1:]]
        assert moves == path


class TestRequestStop:
    def test_first_request_moves_running_to_stopping(self, store_factory: StoreFactory) -> None:
        clock = FakeClock()
        store = store_factory(clock)
        store.create_run("r1", "agent")
        result = store.request_stop("r1", source="button", who="bob@lab:7")
        assert result.ok and (result.before, result.after) == ("running", "stopping")
        row = store.get_run("r1")
        assert row["status"] == "stopping"
        assert row["stop_requested_at"] == clock.current
        assert row["stop_source"] == "button"
        (event,) = events(store, "r1", "stop_requested")
        assert (event["from_status"], event["to_status"]) == ("running", "stopping")
        assert (event["source"], event["actor"], event["occurred_at"]) == (
            "button",
            "bob@lab:7",
            clock.current,
        )

    def test_later_requests_only_add_events(self, store_factory: StoreFactory) -> None:
        clock = FakeClock()
        store = store_factory(clock)
        store.create_run("r1", "agent")
        first_at = clock.current
        store.request_stop("r1", source="button")
        for source in ("button", "api", "sigint"):
            clock.advance(1)
            result = store.request_stop("r1", source=source)
            assert not result.ok
            assert (result.before, result.after) == ("stopping", "stopping")
        row = store.get_run("r1")
        assert (row["status"], row["stop_requested_at"], row["stop_source"]) == (
            "stopping",
            first_at,
            "button",
        )
        stops = events(store, "r1", "stop_requested")
        assert [e["source"] for e in stops] == ["button", "button", "api", "sigint"]
        assert [e["to_status"] for e in stops] == ["stopping", None, None, None]
        assert all("already stopping" in e["reason"] for e in stops[1:])

    def test_request_on_a_suspended_run_is_recorded_without_transition(
        self, store_factory: StoreFactory
    ) -> None:
        store = store_factory()
        store.create_run("r1", "agent")
        store.transition("r1", "suspended", ("running",))
        result = store.request_stop("r1", source="api")
        assert not result.ok and result.after == "suspended"
        assert store.get_run("r1")["status"] == "suspended"
        assert len(events(store, "r1", "stop_requested")) == 1


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


# -- the writer ---------------------------------------------------------------------------
class TestGroupCommit:
    def test_queued_jobs_share_commits_and_resolve_after_commit(
        self, store_factory: StoreFactory
    ) -> None:
        store = store_factory()
        jobs = 50
        seen_committed: dict[str, bool] = {}

        def check_visible(label: str) -> Callable[[Future[str]], None]:
            def callback(fut: Future[str]) -> None:
                # Runs when the future resolves: the row must already be readable
                # through a reader connection, i.e. committed.
                seen_committed[label] = label in probe_labels(store, "g")

            return callback

        gate = Gate(store)
        before = store.commits
        futures = []
        for i in range(jobs):
            fut = store.write_async(insert_event_job(store, "g", f"{i:03d}"))
            fut.add_done_callback(check_visible(f"{i:03d}"))
            futures.append(fut)
        assert not any(f.done() for f in futures)
        gate.open()
        assert [f.result(WAIT) for f in futures] == [f"{i:03d}" for i in range(jobs)]
        store.flush()
        commits = store.commits - before
        assert commits <= 3, f"{jobs} queued jobs took {commits} commits"
        assert seen_committed == {f"{i:03d}": True for i in range(jobs)}
        assert probe_labels(store, "g") == [f"{i:03d}" for i in range(jobs)]

    def test_a_failing_job_does_not_lose_its_neighbours(self, store_factory: StoreFactory) -> None:
        store = store_factory()

        def bad(tx: Any) -> None:
            store.event(tx, "g", "probe", reason="bad")
            raise ValueError("this job is broken")

        gate = Gate(store)
        first = store.write_async(insert_event_job(store, "g", "first"))
        broken = store.write_async(bad)
        last = store.write_async(insert_event_job(store, "g", "last"))
        gate.open()
        assert first.result(WAIT) == "first"
        assert last.result(WAIT) == "last"
        with pytest.raises(ValueError, match="broken"):
            broken.result(WAIT)
        assert probe_labels(store, "g") == ["first", "last"]
        # The writer survives and keeps working.
        assert store.write(insert_event_job(store, "g", "after")) == "after"

    def test_sync_write_returns_the_job_result_and_raises_its_error(
        self, store_factory: StoreFactory
    ) -> None:
        store = store_factory()
        assert store.write(lambda tx: tx.fetchone("SELECT 41 + 1")) == (42,)

        def broken(tx: Any) -> None:
            store.event(tx, "g", "probe", reason="rolled back")
            raise KeyError("nope")

        with pytest.raises(KeyError):
            store.write(broken)
        assert probe_labels(store, "g") == []

    def test_closed_store_refuses_writes_clearly(self, store_factory: StoreFactory) -> None:
        store = store_factory()
        store.close()
        with pytest.raises(RuntimeError, match="closed"):
            store.write(lambda tx: None)
        store.close()  # closing twice is harmless


class TestReads:
    def test_reads_see_only_committed_data(self, store_factory: StoreFactory) -> None:
        store = store_factory()
        inside = threading.Event()
        release = threading.Event()

        def job(tx: Any) -> None:
            store.event(tx, "g", "probe", reason="uncommitted")
            inside.set()
            release.wait(WAIT)

        fut = store.write_async(job)
        assert inside.wait(WAIT)
        # A backend may answer a read at once (from the last commit) or hold it until
        # the open transaction ends; it may never answer with the uncommitted row.
        seen: list[tuple[list[str], bool]] = []

        def read() -> None:
            labels = probe_labels(store, "g")
            seen.append((labels, release.is_set()))

        readers = [threading.Thread(target=read) for _ in range(3)]
        try:
            for reader in readers:
                reader.start()
            for reader in readers:
                reader.join(2.0)
        finally:
            release.set()
        for reader in readers:
            reader.join(WAIT)
        fut.result(WAIT)
        assert len(seen) == len(readers)
        for labels, released in seen:
            assert released or labels == [], "a read saw a row before its commit"
        assert probe_labels(store, "g") == ["uncommitted"]

    @pytest.mark.parametrize(
        "statement",
        [
            "DELETE FROM events",
            "INSERT INTO events (run_id, occurred_at, kind) VALUES ('x', now(), 'probe')",
            "UPDATE runs SET status = 'completed'",
            "DROP TABLE runs",
            "CREATE TABLE sneaky (x INTEGER)",
            "SELECT 1; DELETE FROM events",
            "",
        ],
    )
    def test_read_arrow_refuses_writes(self, store_factory: StoreFactory, statement: str) -> None:
        store = store_factory()
        store.create_run("r1", "agent")
        with pytest.raises(ReadOnlyError, match="read-only"):
            store.backend.read_arrow(statement)
        assert store.get_run("r1")["status"] == "running"
        assert len(events(store, "r1")) == 1
        assert store.read("SELECT count(*) FROM runs") == [(1,)]

    def test_read_arrow_returns_a_table(self, store_factory: StoreFactory) -> None:
        store = store_factory()
        store.create_run("r1", "agent")
        table = store.backend.read_arrow("SELECT id, status FROM runs")
        assert table.num_rows == 1
        assert table.to_pylist() == [{"id": "r1", "status": "running"}]
        # Still writable afterwards: the read-only transaction was closed.
        assert store.create_run("r2", "agent")


class TestTimestamps:
    def test_every_timestamp_comes_from_the_clock(self, store_factory: StoreFactory) -> None:
        clock = FakeClock()
        store = store_factory(clock)
        applied = store.read("SELECT max(applied_at) FROM schema_version")[0][0]
        assert applied == clock.current
        created_at = clock.current
        store.create_run("r1", "agent")
        later = clock.advance(90)
        store.transition("r1", "suspended", ("running",))
        row = store.get_run("r1")
        assert (row["created_at"], row["updated_at"]) == (created_at, later)
        assert [e["occurred_at"] for e in events(store, "r1")] == [created_at, later]
        for value in (row["created_at"], row["updated_at"]):
            assert isinstance(value, dt.datetime) and value.tzinfo is None

    def test_default_clock_is_utc(self, store_factory: StoreFactory) -> None:
        store = store_factory()
        low = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
        store.create_run("r1", "agent")
        high = utcnow()
        created = store.get_run("r1")["created_at"]
        assert created.tzinfo is None
        assert low <= created <= high
