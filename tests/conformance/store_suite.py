"""The store conformance suite: what every backend of ``kernelext._store.Store`` must do.

Nothing here knows which backend it runs on. A backend's test module provides a
``store_factory`` fixture that yields a :class:`StoreFactory` and imports the
``Test*`` classes listed in ``__all__`` below (see ``tests/store/test_store_conformance.py``)::

    from conformance.store_suite import *  # noqa: F403  (the Test* classes)

A factory call ``store_factory(clock=None)`` returns a fresh, empty, opened store;
``store_factory.reopen(store)`` closes ``store`` and opens its database again.
Timestamps come from the injected clock when one is given.

This module holds the run-level classes and gathers the others, one module per area:

* ``store_suite_records``: steps, snapshots, blobs, the effect ledger;
* ``store_suite_writer``: group commit and what reads see;
* ``store_suite_claims``: claims and facts;
* ``store_suite_lifecycle``: expiry, retention and restart;
* ``store_suite_approvals``: approval requests and questions (``run.ask``);
* ``store_suite_support``: the factory, the fake clock and the record helpers.
"""

from __future__ import annotations

import datetime as dt
import json
import os

import pytest

from kernelext._store import utcnow
from kernelext._store.records import stop_request
from kernelext._store.run_end import already_applied, apply_run_end
from kernelext._store.schema import MIGRATIONS, TABLES
from kernelext.errors import RunNotFound

from .store_suite_approvals import TestApprovals, TestQuestions
from .store_suite_claims import TestClaims, TestFacts
from .store_suite_lifecycle import TestExpiry, TestRestart
from .store_suite_records import TestBlobs, TestEffects, TestSteps
from .store_suite_support import Clock, FakeClock, StoreFactory, complete, events
from .store_suite_writer import TestGroupCommit, TestReads

__all__ = [
    "Clock",
    "FakeClock",
    "StoreFactory",
    "TestApprovals",
    "TestBlobs",
    "TestClaims",
    "TestEffects",
    "TestExpiry",
    "TestFacts",
    "TestGroupCommit",
    "TestQuestions",
    "TestReads",
    "TestRequestStop",
    "TestRestart",
    "TestRuns",
    "TestSchema",
    "TestSteps",
    "TestTimestamps",
    "TestTransitions",
]


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
        # user@host:pid.start (the start time tells a reused PID from the owner)
        assert f":{os.getpid()}." in event["actor"] or event["actor"].endswith(f":{os.getpid()}")
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

    def test_a_move_whose_caller_read_the_clock_earlier_is_dated_after_the_last_move(
        self, store_factory: StoreFactory
    ) -> None:
        # Two processes: one reads its clock, the other moves the run meanwhile; the first
        # then holds the row. Its move is the later one, and the history says so.
        clock = FakeClock()
        store = store_factory(clock=clock)
        store.create_run("r1", "agent")
        clock.advance(10)
        assert store.transition("r1", "stopping", ("running",), source="stopper").ok
        moved_at = clock.current
        clock.advance(-5)  # the clock the next caller read before the stopper's commit
        assert store.transition("r1", "suspended", ("stopping",), source="runner").ok
        history = events(store, "r1")
        assert [(e["from_status"], e["to_status"]) for e in history] == [
            (None, "running"),
            ("running", "stopping"),
            ("stopping", "suspended"),
        ]
        assert history[-1]["occurred_at"] == moved_at
        assert store.get_run("r1")["updated_at"] == moved_at
        # A record or a row write dated before the last move (another host's clock, behind)
        # does not date the run back either.
        assert store.transition("r1", "running", ("suspended",)).ok
        clock.advance(-5)
        complete(store, "r1", 0, "k0")
        store.update_run("r1", total_steps=3)
        assert store.get_run("r1")["updated_at"] == moved_at

    def test_a_record_applied_again_is_known_though_its_move_was_dated_later(
        self, store_factory: StoreFactory
    ) -> None:
        # A stop request and a run end carry their own time; a later move of the run dates
        # them later when applied. Applied a second time (a take-over folded the journal,
        # then its process folds it again), each is recognised and changes nothing.
        clock = FakeClock()
        store = store_factory(clock=clock)
        store.create_run("r1", "agent")
        asked = clock.advance(5)
        clock.advance(5)
        store.update_run("r1", total_steps=3)  # the run's row was written at T+10
        stop = {"run_id": "r1", "source": "api", "who": "me", "at": asked, "request": "q1"}
        store.write(lambda tx: stop_request(tx, stop))
        store.transition("r1", "suspended", ("stopping",))
        store.transition("r1", "running", ("suspended",))  # resumed
        store.write(lambda tx: stop_request(tx, stop))
        assert store.get_run("r1")["status"] == "running"
        assert len(events(store, "r1", "stop_requested")) == 1

        end = {"run_id": "r1", "status": "suspended", "kind": "suspended", "who": "owner",
               "at": asked, "source": "engine", "reason": "user_stop"}  # fmt: skip
        store.write(lambda tx: apply_run_end(tx, end))
        store.transition("r1", "running", ("suspended",))
        assert store.write(lambda tx: already_applied(tx, end))
        store.write(lambda tx: apply_run_end(tx, end))
        assert store.get_run("r1")["status"] == "running"
        assert len(events(store, "r1", "suspended")) == 1


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
