"""Store conformance: expiry, retention and restart (see ``store_suite.py``).

Expiry: a waiting run past its deadline is expired exactly once, in a transaction that
re-checks the deadline, writes the event and (with the caller's release) frees its
claims; its snapshots stay until the retention period ends. Restart: a new run, in
``suspended``, carries the kept steps, snapshots, effects, facts and claims of the old
one, whose waiting status is superseded (cancelled) in the same transaction.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import uuid
from typing import Any

import pytest

from kernelext._store import Store
from kernelext._store.duckdb.backend import INLINE_LIMIT
from kernelext._store.expiry import Expiry
from kernelext._store.restart import RestartPlan
from kernelext.errors import RunStateError, StoreError
from kernelext.status import EffectStatus, Reason, Status, StepStatus

from .store_suite_support import (
    FakeClock,
    StoreFactory,
    complete,
    effect_row,
    events,
    fact,
    make_blob,
)

__all__ = ["TestExpiry", "TestRestart"]

SECOND = dt.timedelta(seconds=1)
DAY = dt.timedelta(days=1)


def waiting(store: Store, run_id: str, status: Status, deadline: dt.datetime) -> None:
    """A new run waiting in ``status`` (suspended by its user) until ``deadline``."""
    store.create_run(run_id, "agent")
    moved = store.transition(
        run_id, status, (Status.RUNNING,), reason=Reason.USER_STOP, fields={"deadline": deadline}
    )
    assert moved.ok


def expire(store: Store, run_id: str, now: dt.datetime) -> Expiry | None:
    """What the sweeper does for one due run: expire it and release its claims, at once."""

    def job(tx: Any) -> Expiry | None:
        expiry = store.expire_tx(tx, run_id, now, source="sweeper")
        if expiry is not None:
            store.release_run_claims_tx(tx, run_id, Status.EXPIRED, source="sweeper")
        return expiry

    return store.write(job)


def side_files(store: Store, run_id: str) -> list[str]:
    """The side files of a run (none on a backend that keeps payloads inline)."""
    if store.backend.side_files is None:
        return []
    folder = store.blob_dir(run_id)
    return sorted(os.listdir(folder)) if os.path.isdir(folder) else []


def old_run(store: Store) -> dict[str, Any]:
    """Run ``r1``: three completed steps (a delta chain, a large payload), an applied
    effect in step 0, a fact per step and a claim. Returns its blobs by name."""
    store.create_run("r1", "triage", fingerprint="fp", args='{"n": 1}', total_steps=4, owner="o")
    base, big = make_blob(b"[1]"), make_blob(os.urandom(INLINE_LIMIT + 1024), encoding="bytes")
    delta = make_blob(b"[1,2]", base, "json+append")
    complete(store, "r1", 0, "k0", [base], {"xs": base.id.hex})
    complete(store, "r1", 1, "k1", [delta, big], {"xs": delta.id.hex, "big": big.id.hex})
    complete(store, "r1", 2, "k2", [make_blob(b"3")], None)
    sent = {**effect_row("r1"), "step_key": "k0", "step_ordinal": 0}
    store.write_intent(sent)
    store.write_outcome(sent["key"], EffectStatus.APPLIED, result='{"id": 7}', wait=True)
    for ordinal in range(3):
        store.record_fact(fact("r1", f"f{ordinal}", ordinal, ordinal))
    store.claim("r1", "customer:42", 2.0)
    return {"base": base, "delta": delta, "big": big, "effect": sent}


def plan(store: Store, new_id: str, start: int, deadline: dt.datetime) -> RestartPlan:
    """What the core decides for restarting ``r1`` at step ``start``."""
    steps = [s for s in store.restart_steps("r1") if s["ordinal"] < start]
    effects = [
        {**e, "key": uuid.uuid4(), "run_id": new_id}
        for e in store.load_effects("r1").values()
        if e["status"] == EffectStatus.APPLIED and e["step_ordinal"] < start
    ]
    facts = [f for f in store.fact_rows("r1") if f["step_ordinal"] < start]
    old_status = store.get_run("r1")["status"]
    return RestartPlan(
        old_id="r1",
        new_id=new_id,
        start_ordinal=start,
        steps=steps,
        effects=effects,
        facts=facts,
        deadline=deadline,
        source="test",
        who="dora@lab:3",
        detail={"old_status": old_status},
    )


class TestExpiry:
    def test_due_runs_are_the_waiting_ones_past_their_deadline(
        self, store_factory: StoreFactory
    ) -> None:
        clock = FakeClock()
        store = store_factory(clock)
        t0 = clock.current
        waiting(store, "a", Status.SUSPENDED, t0 + 10 * SECOND)
        waiting(store, "b", Status.NEEDS_DECISION, t0 + 5 * SECOND)
        waiting(store, "c", Status.SUSPENDED, t0 + 100 * SECOND)
        store.create_run("d", "agent")
        store.create_run("e", "agent")
        store.transition("e", Status.COMPLETED, (Status.RUNNING,))
        assert store.due_for_expiry(t0 + 4 * SECOND) == []
        assert store.due_for_expiry(t0 + 5 * SECOND) == ["b"]  # at the deadline: due
        assert store.due_for_expiry(t0 + 10 * SECOND) == ["b", "a"]  # earliest deadline first
        assert store.due_for_expiry(t0 + DAY) == ["b", "a", "c"]

    def test_a_waiting_status_gets_its_deadline_from_the_policy(
        self, store_factory: StoreFactory
    ) -> None:
        clock = FakeClock()
        store = store_factory(clock)
        store.create_run("r1", "agent")
        store.transition("r1", Status.SUSPENDED, (Status.RUNNING,), reason=Reason.INPUT)
        expected = store.expiry.deadline(Reason.INPUT, clock.current)
        assert store.get_run("r1")["deadline"] == expected
        assert json.loads(events(store, "r1")[-1]["detail"]) == {"deadline": expected.isoformat()}
        clock.advance(60)
        store.transition("r1", Status.RUNNING, (Status.SUSPENDED,))
        assert store.get_run("r1")["deadline"] is None  # running again: no deadline
        store.transition("r1", Status.NEEDS_DECISION, (Status.RUNNING,), reason="unknown effect")
        decision = store.expiry.deadline(Reason.DECISION, clock.current)
        assert store.get_run("r1")["deadline"] == decision

    def test_expiry_happens_once_frees_claims_and_keeps_the_snapshot(
        self, store_factory: StoreFactory
    ) -> None:
        clock = FakeClock()
        store = store_factory(clock)
        deadline = clock.current + DAY
        waiting(store, "r1", Status.SUSPENDED, deadline)
        blob = make_blob(b'{"kept": true}')
        complete(store, "r1", 0, "k0", [blob], {"state": blob.id.hex})
        store.claim("r1", "customer:42")
        swept = clock.advance(2 * 86400)
        assert expire(store, "r1", swept) == Expiry("r1", Reason.USER_STOP, deadline)
        row = store.get_run("r1")
        assert (row["status"], row["reason"]) == (Status.EXPIRED, "deadline:user_stop")
        (event,) = events(store, "r1", Status.EXPIRED)
        assert (event["from_status"], event["to_status"], event["source"]) == (
            Status.SUSPENDED,
            Status.EXPIRED,
            "sweeper",
        )
        assert json.loads(event["detail"]) == {
            "deadline": deadline.isoformat(),
            "suspend_reason": Reason.USER_STOP,
            "swept_at": swept.isoformat(),
        }
        assert store.expired_at("r1") == swept
        (claim,) = store.claims("r1")
        assert (claim["released_at"], claim["release_reason"]) == (swept, Status.EXPIRED)
        assert len(events(store, "r1", "claim_released")) == 1
        # The snapshot stays until the retention period ends.
        snap = store.latest_snapshot("r1")
        assert snap is not None and snap["manifest"] == {"state": blob.id.hex}
        assert store.load_blobs("r1", [blob.id])[blob.id].data == b'{"kept": true}'
        # A second sweeper finds nothing to do and writes nothing.
        count = len(events(store, "r1"))
        assert expire(store, "r1", clock.advance(60)) is None
        assert len(events(store, "r1")) == count
        assert store.due_for_expiry(clock.current) == []

    def test_a_run_waiting_for_a_decision_expires_as_decision(
        self, store_factory: StoreFactory
    ) -> None:
        clock = FakeClock()
        store = store_factory(clock)
        deadline = clock.current + SECOND
        waiting(store, "r1", Status.NEEDS_DECISION, deadline)
        assert expire(store, "r1", clock.advance(2)) == Expiry("r1", Reason.DECISION, deadline)
        assert store.get_run("r1")["reason"] == "deadline:decision"

    def test_a_run_not_due_or_resumed_meanwhile_is_left_alone(
        self, store_factory: StoreFactory
    ) -> None:
        clock = FakeClock()
        store = store_factory(clock)
        deadline = clock.current + 10 * SECOND
        waiting(store, "early", Status.SUSPENDED, deadline)
        waiting(store, "resumed", Status.SUSPENDED, deadline)
        assert store.due_for_expiry(deadline) == ["early", "resumed"]
        # The sweeper listed "resumed", then a resume took it over before its transaction.
        store.transition("resumed", Status.RUNNING, (Status.SUSPENDED,))
        assert expire(store, "resumed", deadline) is None
        assert expire(store, "early", deadline - SECOND) is None  # re-checked: not due yet
        assert expire(store, "nobody", deadline) is None
        for run_id, status in (("early", Status.SUSPENDED), ("resumed", Status.RUNNING)):
            assert store.get_run(run_id)["status"] == status
            assert events(store, run_id, Status.EXPIRED) == []

    def test_retention_removes_payloads_and_keeps_the_record(
        self, store_factory: StoreFactory
    ) -> None:
        clock = FakeClock()
        store = store_factory(clock)
        waiting(store, "r1", Status.SUSPENDED, clock.current + SECOND)
        waiting(store, "r2", Status.SUSPENDED, clock.current + DAY)
        blobs = {}
        for run_id in ("r1", "r2"):
            big = make_blob(os.urandom(INLINE_LIMIT + 512), encoding="bytes")
            small = make_blob(b"[1]")
            complete(store, run_id, 0, "k0", [big, small], {"a": big.id.hex, "b": small.id.hex})
            blobs[run_id] = (big, small)
        file_count = len(side_files(store, "r1"))
        expired_at = clock.advance(2)
        assert expire(store, "r1", expired_at) is not None
        assert store.retention_due(expired_at - SECOND) == []
        assert store.retention_due(expired_at) == ["r1"]  # r2 is not expired
        removed_at = clock.advance(3600)
        removal = store.remove_payloads("r1", removed_at, retention_seconds=3600.0)
        assert removal is not None
        big, small = blobs["r1"]
        assert (removal.run_id, removal.snapshots, removal.blobs, removal.bytes) == (
            "r1",
            1,
            2,
            big.size + small.size,
        )
        assert removal.files == file_count
        assert side_files(store, "r1") == []
        assert store.load_blobs("r1", [big.id, small.id]) == {}
        assert store.snapshots_removed_at("r1") == removed_at
        (event,) = events(store, "r1", "snapshots_removed")
        assert json.loads(event["detail"])["retention_seconds"] == 3600.0
        assert store.retention_due(removed_at) == []
        # The audit record stays: the run, its steps and its events.
        assert store.get_run("r1")["status"] == Status.EXPIRED
        assert [s["status"] for s in store.steps("r1")] == [StepStatus.COMPLETED]
        # A run that did not expire keeps its payloads.
        assert store.remove_payloads("r2", removed_at, retention_seconds=0.0) is None
        big, small = blobs["r2"]
        assert set(store.load_blobs("r2", [big.id, small.id])) == {big.id, small.id}


class TestRestart:
    def test_restart_carries_the_kept_state_and_supersedes_the_old_run(
        self, store_factory: StoreFactory
    ) -> None:
        clock = FakeClock()
        store = store_factory(clock)
        old = old_run(store)
        store.transition("r1", Status.SUSPENDED, (Status.RUNNING,), reason=Reason.USER_STOP)
        at = clock.advance(60)
        store.write_restart(plan(store, "r1.1", 2, at + DAY))
        new = store.get_run("r1.1")
        assert (new["status"], new["reason"], new["parent_id"], new["deadline"]) == (
            Status.SUSPENDED,
            Reason.RESTART,
            "r1",
            at + DAY,
        )
        assert (new["agent"], new["fingerprint"], new["args"], new["total_steps"]) == (
            "triage",
            "fp",
            '{"n": 1}',
            4,
        )
        assert (new["owner"], new["completed_steps"], new["created_at"]) == ("dora@lab:3", 2, at)
        (created,) = events(store, "r1.1", "created")
        assert (created["to_status"], created["reason"]) == (Status.SUSPENDED, Reason.RESTART)
        assert json.loads(created["detail"]) == {
            "old_status": Status.SUSPENDED,
            "parent": "r1",
            "from_step": 2,
            "carried_steps": 2,
            "carried_effects": 1,
            "carried_answers": 0,
        }
        assert store.children("r1") == ["r1.1"]
        # Steps 0 and 1 with their snapshots, under new blob ids with the same bytes.
        assert [(s["ordinal"], s["key"]) for s in store.completed_steps("r1.1")] == [
            (0, "k0"),
            (1, "k1"),
        ]
        snap = store.latest_snapshot("r1.1")
        assert snap is not None and snap["step_ordinal"] == 1
        ids = {name: uuid.UUID(hex=h) for name, h in snap["manifest"].items()}
        assert set(ids) == {"xs", "big"}
        assert not set(ids.values()) & {old["delta"].id, old["big"].id}
        loaded = store.load_blobs("r1.1", list(ids.values()))
        assert loaded[ids["xs"]].data == old["delta"].data
        assert loaded[ids["big"]].data == old["big"].data
        base = loaded[ids["xs"]].base_id
        assert base is not None and base != old["base"].id
        assert loaded[base].data == old["base"].data  # the delta chain was carried whole
        # The applied effect, the facts of the kept steps, and the claim.
        (effect,) = store.load_effects("r1.1").values()
        assert (effect["status"], effect["result"], effect["tool"]) == (
            EffectStatus.APPLIED,
            '{"id": 7}',
            "send_email",
        )
        assert [f["name"] for f in store.facts("r1.1")] == ["f0", "f1"]
        (claim,) = store.claims("r1.1", active=True)
        assert (claim["resource"], claim["amount"]) == ("customer:42", 2.0)
        (taken,) = events(store, "r1.1", "claim_taken")
        assert taken["source"] == "restart"
        # The old run was superseded: cancelled, claims released, in the same transaction.
        assert store.get_run("r1")["status"] == Status.CANCELLED
        (superseded,) = events(store, "r1", StepStatus.SUPERSEDED)
        assert (superseded["from_status"], superseded["to_status"], superseded["reason"]) == (
            Status.SUSPENDED,
            Status.CANCELLED,
            "superseded by restart r1.1",
        )
        (released,) = store.claims("r1")
        assert released["release_reason"] == StepStatus.SUPERSEDED
        (restarted,) = events(store, "r1", "restarted")
        assert json.loads(restarted["detail"]) == {"new_run": "r1.1", "from_step": 2}
        # The old run's record is left as it was.
        assert [s["key"] for s in store.completed_steps("r1")] == ["k0", "k1", "k2"]
        assert len(store.load_effects("r1")) == 1

    def test_an_expired_run_stays_expired_and_its_removal_spares_the_new_run(
        self, store_factory: StoreFactory
    ) -> None:
        clock = FakeClock()
        store = store_factory(clock)
        old = old_run(store)
        store.transition("r1", Status.SUSPENDED, (Status.RUNNING,), fields={"deadline": clock()})
        assert expire(store, "r1", clock.advance(1)) is not None
        store.write_restart(plan(store, "r1.1", 3, clock.current + DAY))
        assert store.get_run("r1")["status"] == Status.EXPIRED
        assert events(store, "r1", StepStatus.SUPERSEDED) == []
        assert store.claims("r1.1", active=True)[0]["resource"] == "customer:42"
        files = side_files(store, "r1.1")
        assert len(files) == len(side_files(store, "r1"))
        assert store.remove_payloads("r1", clock.advance(60), retention_seconds=1.0) is not None
        assert side_files(store, "r1.1") == files
        snap = store.latest_snapshot("r1.1")
        assert snap is not None and snap["step_ordinal"] == 2
        steps = {s["key"]: s for s in store.restart_steps("r1.1")}
        big = uuid.UUID(hex=json.loads(steps["k1"]["manifest"])["big"])
        assert store.load_blobs("r1.1", [big])[big].data == old["big"].data

    def test_restart_after_the_payloads_were_removed_is_refused(
        self, store_factory: StoreFactory
    ) -> None:
        clock = FakeClock()
        store = store_factory(clock)
        old_run(store)
        store.transition("r1", Status.SUSPENDED, (Status.RUNNING,), fields={"deadline": clock()})
        expire(store, "r1", clock.advance(1))
        store.remove_payloads("r1", clock.advance(60), retention_seconds=1.0)
        with pytest.raises(StoreError, match="cannot be restarted"):
            store.write_restart(plan(store, "r1.1", 2, clock.current + DAY))
        assert store.find_run("r1.1") is None

    @pytest.mark.parametrize("case", ["taken_id", "running", "unknown"])
    def test_a_refused_restart_writes_nothing(self, store_factory: StoreFactory, case: str) -> None:
        clock = FakeClock()
        store = store_factory(clock)
        old_run(store)
        if case != "running":
            store.transition("r1", Status.SUSPENDED, (Status.RUNNING,))
        store.create_run("r2", "other")
        before = {run_id: (store.get_run(run_id), events(store, run_id)) for run_id in ("r1", "r2")}
        new_id = "r2" if case == "taken_id" else "r1.1"
        restart = plan(store, new_id, 0 if case == "unknown" else 2, clock.current + DAY)
        if case == "unknown":
            restart.old_id = "nobody"
        message = {"taken_id": "already exists", "running": "became running", "unknown": "No run"}
        with pytest.raises(RunStateError, match=message[case]):
            store.write_restart(restart)
        after = {run_id: (store.get_run(run_id), events(store, run_id)) for run_id in ("r1", "r2")}
        assert after == before
        assert store.find_run("r1.1") is None
        assert store.claims("r1", active=True)[0]["resource"] == "customer:42"
        assert side_files(store, new_id) == []  # payload files copied first were removed
