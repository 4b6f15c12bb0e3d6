"""Store conformance: approval requests and questions to a person (see ``store_suite.py``).

An approval request is bound to one call (the effect's key and its argument hash),
decided once, consumed once (just before the intent of the call it allows), and
neither decided nor consumed once expired; a newer request for the same key supersedes
the open one. A question (``run.ask``) is answered once; an expired one not at all.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
import uuid
from typing import Any

import pytest
from support.old_schema import back_to_schema

from kernelext._core.people.approvals import decide_request
from kernelext._core.people.questions import store_answer
from kernelext._store import Store
from kernelext._store.approvals import APPROVED, NO_SUCH_REQUEST, NOT_OPEN, REJECTED
from kernelext._store.questions import ANSWERED
from kernelext._store.schema import MIGRATIONS
from kernelext.errors import LedgerError, RunStateError
from kernelext.status import EffectStatus, Status

from .store_suite_support import WAIT, FakeClock, StoreFactory, effect_row, events, move

__all__ = ["TestApprovals", "TestQuestions"]

HOUR = dt.timedelta(hours=1)


def request(
    store: Store,
    run_id: str,
    key: uuid.UUID,
    args_hash: str = "ab" * 16,
    expires_at: dt.datetime | None = None,
) -> dict[str, Any]:
    """Ask for approval of call 0 of ``send_email`` (key ``key``) in step ``s1``."""
    return store.request_approval(
        {
            "key": key,
            "run_id": run_id,
            "step": "s1",
            "step_ordinal": 0,
            "call_ordinal": 0,
            "tool": "send_email",
            "args_hash": args_hash,
            "args": json.dumps({"to": "x@example.org"}),
            "expires_at": expires_at if expires_at is not None else store.now() + HOUR,
        }
    )


def decide(store: Store, ident: uuid.UUID, decision: str = APPROVED) -> dict[str, Any]:
    """Decide through the core, which words a refused decision for a person."""
    return decide_request(store, ident, decision, who="erin@lab:5", note="looks right")


def ask(store: Store, run_id: str, prompt: str, expires_at: dt.datetime) -> uuid.UUID:
    key = uuid.uuid4()
    store.ask_question(
        {
            "key": key,
            "run_id": run_id,
            "step": "s1",
            "step_ordinal": 0,
            "call_ordinal": 1,
            "prompt": prompt,
            "answer_schema": json.dumps({"type": "string"}),
            "default_answer": None,
            "expires_at": expires_at,
        }
    )
    return key


class TestApprovals:
    def test_a_request_is_bound_to_key_and_argument_hash(self, store_factory: StoreFactory) -> None:
        clock = FakeClock()
        store = store_factory(clock)
        store.create_run("r1", "agent")
        key = uuid.uuid4()
        row = request(store, "r1", key, "cd" * 16)
        assert (row["key"], row["args_hash"], row["requested_at"]) == (key, "cd" * 16, clock())
        assert (row["decision"], row["consumed_at"], row["superseded_at"]) == (None, None, None)
        current = store.current_approval(key)
        assert current is not None
        assert (current["id"], current["run_id"], current["tool"]) == (
            row["id"],
            "r1",
            "send_email",
        )
        assert current["expires_at"] == clock() + HOUR
        assert [r["id"] for r in store.open_approvals("r1", clock())] == [row["id"]]
        assert store.current_approval(uuid.uuid4()) is None
        (event,) = events(store, "r1", "approval_requested")
        detail = json.loads(event["detail"])
        assert (detail["id"], detail["key"], detail["args_hash"]) == (
            str(row["id"]),
            str(key),
            "cd" * 16,
        )

    def test_a_new_request_for_the_same_call_supersedes_the_open_one(
        self, store_factory: StoreFactory
    ) -> None:
        clock = FakeClock()
        store = store_factory(clock)
        store.create_run("r1", "agent")
        key = uuid.uuid4()
        first = request(store, "r1", key, "aa" * 16)
        later = clock.advance(5)
        second = request(store, "r1", key, "bb" * 16)  # the arguments changed
        rows = {r["id"]: r for r in store.approval_rows(key=key)}
        assert rows[first["id"]]["superseded_at"] == later
        assert rows[second["id"]]["superseded_at"] is None
        current = store.current_approval(key)
        assert current is not None and current["args_hash"] == "bb" * 16
        assert json.loads(events(store, "r1", "approval_requested")[1]["detail"])["replaces"] == [
            str(first["id"])
        ]
        with pytest.raises(LedgerError, match=r"replaced .* by a newer request"):
            decide(store, first["id"])
        # The key has had two requests (its arguments changed), so it does not say which
        # one a person saw: deciding by it is refused; the request id decides.
        with pytest.raises(LedgerError, match=r"has had 2 approval requests"):
            decide(store, key)
        assert decide(store, second["id"])["id"] == second["id"]
        assert store.consume_approval(second["id"], "r1")
        # A consumed request is not superseded by the next one.
        clock.advance(5)
        third = request(store, "r1", key)
        assert store.approval_rows(key=key)[1]["superseded_at"] is None
        assert "replaces" not in json.loads(events(store, "r1", "approval_requested")[2]["detail"])
        assert store.current_approval(key) == third

    def test_a_request_is_decided_once(self, store_factory: StoreFactory) -> None:
        clock = FakeClock()
        store = store_factory(clock)
        store.create_run("r1", "agent")
        row = request(store, "r1", uuid.uuid4())
        decided_at = clock.advance(30)
        decided = decide(store, row["id"], REJECTED)
        assert (decided["decision"], decided["actor"], decided["note"]) == (
            REJECTED,
            "erin@lab:5",
            "looks right",
        )
        clock.advance(1)
        with pytest.raises(LedgerError, match="already rejected by erin@lab:5"):
            decide_request(store, row["id"], APPROVED, who="frank@lab:6", note=None)
        # The store says why, with the request as it stands; the core words it.
        late = store.decide_approval(row["id"], APPROVED, who="frank@lab:6", note=None)
        assert late.refused == NOT_OPEN and late.row is not None
        assert (late.row["decision"], late.row["actor"]) == (REJECTED, "erin@lab:5")
        nobody = store.decide_approval(uuid.uuid4(), APPROVED, who="x", note=None)
        assert nobody.refused == NO_SUCH_REQUEST
        (stored,) = store.approval_rows(run_id="r1")
        assert (stored["decision"], stored["decided_at"], stored["actor"]) == (
            REJECTED,
            decided_at,
            "erin@lab:5",
        )
        (event,) = events(store, "r1", "approval_decided")
        assert (event["actor"], json.loads(event["detail"])["decision"]) == ("erin@lab:5", REJECTED)
        assert store.open_approvals("r1", clock()) == []
        with pytest.raises(ValueError, match="decision must be"):
            decide_request(store, row["id"], "maybe", who="x", note=None)
        with pytest.raises(LedgerError, match="No approval request"):
            decide(store, uuid.uuid4())

    def test_of_racing_deciders_exactly_one_wins(self, store_factory: StoreFactory) -> None:
        store = store_factory()
        store.create_run("r1", "agent")
        row = request(store, "r1", uuid.uuid4())
        start = threading.Barrier(4)
        won: list[str] = []
        refused: list[str] = []

        def decider(n: int) -> None:
            decision = (APPROVED, REJECTED)[n % 2]
            start.wait(WAIT)
            try:
                decide_request(store, row["id"], decision, who=f"p{n}", note=None)
            except LedgerError as exc:
                refused.append(str(exc))
            else:
                won.append(decision)

        threads = [threading.Thread(target=decider, args=(n,)) for n in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(WAIT)
        assert len(won) == 1 and len(refused) == 3
        assert all("decided once" in text for text in refused)
        (stored,) = store.approval_rows(run_id="r1")
        assert stored["decision"] == won[0]
        assert len(events(store, "r1", "approval_decided")) == 1

    def test_an_approval_is_consumed_once(self, store_factory: StoreFactory) -> None:
        clock = FakeClock()
        store = store_factory(clock)
        store.create_run("r1", "agent")
        key = uuid.uuid4()
        row = request(store, "r1", key)
        assert not store.consume_approval(row["id"], "r1")  # not decided yet
        decide(store, row["id"])
        used_at = clock.advance(2)
        assert store.consume_approval(row["id"], "r1")
        assert not store.consume_approval(row["id"], "r1")
        (stored,) = store.approval_rows(key=key)
        assert stored["consumed_at"] == used_at
        assert store.current_approval(key) is None
        (event,) = events(store, "r1", "approval_consumed")
        assert json.loads(event["detail"])["id"] == str(row["id"])
        with pytest.raises(LedgerError, match="an approval allows one call"):
            decide(store, row["id"])
        rejected = request(store, "r1", uuid.uuid4())
        decide(store, rejected["id"], REJECTED)
        assert not store.consume_approval(rejected["id"], "r1")
        assert len(events(store, "r1", "approval_consumed")) == 1

    def test_an_expired_request_is_neither_decided_nor_consumed(
        self, store_factory: StoreFactory
    ) -> None:
        clock = FakeClock()
        store = store_factory(clock)
        store.create_run("r1", "agent")
        late = request(store, "r1", uuid.uuid4(), expires_at=clock() + 10 * dt.timedelta(seconds=1))
        unused = request(store, "r1", uuid.uuid4(), expires_at=clock() + HOUR)
        decide(store, unused["id"])
        clock.advance(3600)  # both deadlines passed (at the deadline it has expired)
        with pytest.raises(LedgerError, match=r"expired at .* can no longer be decided"):
            decide(store, late["id"])
        assert not store.consume_approval(unused["id"], "r1")
        rows = {r["id"]: r for r in store.approval_rows(run_id="r1")}
        assert rows[late["id"]]["decision"] is None
        assert rows[unused["id"]]["consumed_at"] is None
        assert store.open_approvals("r1", clock()) == []
        assert events(store, "r1", "approval_consumed") == []

    def test_the_intent_of_an_approved_call_consumes_its_approval(
        self, store_factory: StoreFactory
    ) -> None:
        store = store_factory()
        store.create_run("r1", "agent")
        call = effect_row("r1")
        pending = request(store, "r1", call["key"])
        # Not approved: nothing is consumed, no intent is written.
        assert store.write_intent_consuming_approval(call, pending["id"]) == (False, None)
        assert store.effect(call["key"]) is None
        decide(store, pending["id"])
        assert store.write_intent_consuming_approval(call, pending["id"]) == (True, None)
        stored = store.effect(call["key"])
        assert stored is not None
        assert (stored["status"], stored["args_hash"]) == (EffectStatus.PENDING, call["args_hash"])
        assert store.approval_rows(key=call["key"])[0]["consumed_at"] is not None
        # The call has its intent: a later approval is left unused, the ledger row returned.
        again = request(store, "r1", call["key"])
        decide(store, again["id"])
        consumed, existing = store.write_intent_consuming_approval(call, again["id"])
        assert not consumed and existing is not None
        assert existing["status"] == EffectStatus.PENDING
        assert store.current_approval(call["key"]) is not None
        assert len(events(store, "r1", "approval_consumed")) == 1

    def test_open_requests_are_those_of_runs_that_can_go_on(
        self, store_factory: StoreFactory
    ) -> None:
        clock = FakeClock()
        store = store_factory(clock)
        for run_id in ("r1", "r2", "r3"):
            store.create_run(run_id, "agent")
            request(store, run_id, uuid.uuid4())
            clock.advance(1)
        move(store, "r2", Status.CANCELLED)
        move(store, "r3", Status.SUSPENDED)
        assert [r["run_id"] for r in store.open_approvals(None, clock())] == ["r1", "r3"]
        assert [r["run_id"] for r in store.open_approvals("r3", clock())] == ["r3"]
        assert len(store.approval_rows()) == 3


class TestQuestions:
    def test_a_question_is_recorded_and_open(self, store_factory: StoreFactory) -> None:
        clock = FakeClock()
        store = store_factory(clock)
        store.create_run("r1", "agent")
        key = ask(store, "r1", "Which account?", clock() + HOUR)
        row = store.question_row(key)
        assert row is not None
        assert (row["prompt"], row["asked_at"], row["expires_at"]) == (
            "Which account?",
            clock(),
            clock() + HOUR,
        )
        assert (row["answer"], row["answered_at"], row["actor"]) == (None, None, None)
        assert [r["key"] for r in store.open_questions("r1", clock())] == [key]
        (event,) = events(store, "r1", "input_requested")
        assert json.loads(event["detail"])["prompt"] == "Which account?"
        assert store.question_row(uuid.uuid4()) is None

    def test_asking_again_renews_the_open_question(self, store_factory: StoreFactory) -> None:
        clock = FakeClock()
        store = store_factory(clock)
        store.create_run("r1", "agent")
        key = ask(store, "r1", "Which account?", clock() + HOUR)
        again_at = clock.advance(7200)  # expired: the resumed run asks again
        store.ask_question({**store.question_rows("r1")[0], "expires_at": again_at + HOUR})
        (row,) = store.question_rows("r1")
        assert (row["key"], row["asked_at"], row["expires_at"]) == (key, again_at, again_at + HOUR)
        assert len(events(store, "r1", "input_requested")) == 2

    def test_a_question_is_answered_once(self, store_factory: StoreFactory) -> None:
        clock = FakeClock()
        store = store_factory(clock)
        store.create_run("r1", "agent")
        key = ask(store, "r1", "Which account?", clock() + HOUR)
        answered_at = clock.advance(60)
        row = store_answer(store, key, '"ACME"', who="gina@lab:8", note="from the CRM")
        assert (row["answer"], row["answered_at"], row["actor"]) == (
            '"ACME"',
            answered_at,
            "gina@lab:8",
        )
        with pytest.raises(RunStateError, match="already answered by gina@lab:8"):
            store_answer(store, key, '"Other"', who="hank@lab:9", note=None)
        late = store.answer_question(key, '"Other"', who="hank@lab:9", note=None)
        assert late.refused == ANSWERED and late.row is not None and late.row["answer"] == '"ACME"'
        stored = store.question_row(key)
        assert stored is not None
        assert (stored["answer"], stored["actor"], stored["note"]) == (
            '"ACME"',
            "gina@lab:8",
            "from the CRM",
        )
        (event,) = events(store, "r1", "input_answered")
        assert (event["actor"], event["reason"]) == ("gina@lab:8", "from the CRM")
        assert store.open_questions("r1", clock()) == []

    def test_an_expired_or_unknown_question_cannot_be_answered(
        self, store_factory: StoreFactory
    ) -> None:
        clock = FakeClock()
        store = store_factory(clock)
        store.create_run("r1", "agent")
        key = ask(store, "r1", "Which account?", clock() + HOUR)
        clock.advance(3600)
        assert store.open_questions("r1", clock()) == []
        with pytest.raises(RunStateError, match=r"expired at .* can no longer be answered"):
            store_answer(store, key, '"ACME"', who="gina@lab:8", note=None)
        stored = store.question_row(key)
        assert stored is not None and stored["answered_at"] is None
        with pytest.raises(RunStateError, match="No question with key"):
            store_answer(store, uuid.uuid4(), '"x"', who="gina@lab:8", note=None)
        assert events(store, "r1", "input_answered") == []

    def test_open_questions_are_those_of_runs_that_can_go_on(
        self, store_factory: StoreFactory
    ) -> None:
        clock = FakeClock()
        store = store_factory(clock)
        for run_id in ("r1", "r2"):
            store.create_run(run_id, "agent")
            ask(store, run_id, f"For {run_id}?", clock() + HOUR)
            clock.advance(1)
        move(store, "r2", Status.CANCELLED)
        assert [r["run_id"] for r in store.open_questions(None, clock())] == ["r1"]
        assert [r["run_id"] for r in store.question_rows()] == ["r1", "r2"]

    def test_a_store_at_schema_7_keeps_its_questions_and_inputs_reads_them(
        self, store_factory: StoreFactory
    ) -> None:
        clock = FakeClock()
        store = store_factory(clock)
        store.create_run("r1", "agent")
        waiting = ask(store, "r1", "Which account?", clock() + HOUR)
        done = ask(store, "r1", "How many?", clock() + HOUR)
        store_answer(store, done, "3", who="gina@lab:8", note=None)
        back_to_schema(store, 7)
        assert store.read("SELECT count(*) FROM inputs") == [(2,)]  # schema 7's table

        store = store_factory.reopen(store)
        assert store.schema_version() == MIGRATIONS[-1].version
        assert [r["key"] for r in store.open_questions("r1", clock())] == [waiting]
        answered = store.question_row(done)
        assert answered is not None and (answered["answer"], answered["actor"]) == (
            "3",
            "gina@lab:8",
        )
        # The view: the same rows under the old name, and nothing can be written to it.
        names = "key, prompt, answer"
        query = f"SELECT {names} FROM {{}} ORDER BY asked_at, key"
        assert store.read(query.format("inputs")) == store.read(query.format("questions"))
        with pytest.raises(Exception, match=r"(?i)view|base table|not .*table|cannot"):
            store.write(lambda tx: tx.execute("DELETE FROM inputs"))
        assert len(store.question_rows("r1")) == 2
