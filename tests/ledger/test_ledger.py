"""The effect ledger (issue 3), in process, on a real DuckDB file and a real HTTP server.

Each effect here POSTs to the DeliveryServer on 127.0.0.1, so "nothing was sent" is
read from the server's own count, not from a mock.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.http_server import DeliveryServer, post_json

import kernelext as kx
from kernelext._core.encoding.keys import bound_hash
from kernelext._core.ledger.effect import effect_key
from kernelext._store import Store, open_store

SECRET = "sk-live-DO-NOT-LEAK-4242"
WAIT = 60  # generous: a loaded CI machine

pytestmark = pytest.mark.both_backends


@pytest.fixture
def store(store_path: Path) -> Iterator[Store]:
    opened = open_store(str(store_path))
    yield opened
    opened.close()


def finish(handle: kx.Handle) -> str:
    status = handle.wait(WAIT)
    assert status != "running", "the run did not end in time"
    return status


def deliver_via(server: DeliveryServer) -> Callable[..., Any]:
    """A tool that takes the ledger's key and hands it to the server."""

    def deliver(to: str, body: str, *, idempotency_key: str | None = None) -> Any:
        response = post_json(
            server.url + "/mail", {"to": to, "body": body}, idempotency_key=idempotency_key
        )
        if response.status != 200:
            raise RuntimeError(f"mail server answered HTTP {response.status}")
        return response.body

    return deliver


# -- keys ------------------------------------------------------------------------------
@pytest.mark.duckdb_only
def test_key_is_derived_from_run_step_tool_and_ordinal() -> None:
    key = effect_key("run-1", "step-a", "send", 0)
    assert key == effect_key("run-1", "step-a", "send", 0)
    others = {
        effect_key("run-2", "step-a", "send", 0),
        effect_key("run-1", "step-b", "send", 0),
        effect_key("run-1", "step-a", "sms", 0),
        effect_key("run-1", "step-a", "send", 1),
    }
    assert key not in others and len(others) == 4
    assert isinstance(key, uuid.UUID) and len(key.bytes) == 16  # compact, 128-bit


@pytest.mark.duckdb_only
def test_same_calls_get_the_same_keys_in_another_store_at_another_time(
    tmp_path: Path, delivery_server: DeliveryServer
) -> None:
    deliver = kx.effect(deliver_via(delivery_server))

    @kx.agent(name="ledger-keys")
    def agent(run: kx.Run) -> None:
        for item in run.steps(["a", "b"], key=str):
            deliver(f"{item}@example.org", "one")
            deliver(f"{item}@example.org", "two")

    seen: list[set[str]] = []
    for name in ("first", "second"):  # a different file, a later clock, same run id
        with open_store(str(tmp_path / f"{name}.duckdb")) as other:
            assert finish(agent.start(run_id="same-id", store=other)) == "completed"
            seen.append({str(k) for k in other.load_effects("same-id")})
    expected = {str(effect_key("same-id", s, "deliver", i)) for s in "ab" for i in (0, 1)}
    assert seen == [expected, expected]
    # The key went to the server as Idempotency-Key, once per call and store.
    sent = [d["idempotency_key"] for d in delivery_server.deliveries]
    assert sorted(sent) == sorted(list(expected) * 2)


@pytest.mark.duckdb_only
def test_key_is_passed_only_to_tools_that_declare_it(
    store: Store, delivery_server: DeliveryServer
) -> None:
    received: dict[str, Any] = {}

    @kx.effect
    def with_key(to: str, *, idempotency_key: str | None = None) -> str:
        received["with_key"] = idempotency_key
        return "ok"

    @kx.effect
    def without_key(to: str) -> str:  # would raise TypeError if a key were forced on it
        received["without_key"] = to
        return "ok"

    @kx.agent(name="ledger-declared")
    def agent(run: kx.Run) -> None:
        with run.step("only"):
            with_key("a")
            without_key("b")
            with_key("c", idempotency_key="caller-chosen")  # the ledger's key wins

    assert finish(agent.start(run_id="declared", store=store)) == "completed"
    assert received["with_key"] == str(effect_key("declared", "only", "with_key", 2))
    assert received["without_key"] == "b"
    rows = {r["tool"] + str(r["call_ordinal"]): r for r in store.load_effects("declared").values()}
    assert set(rows) == {"with_key0", "without_key1", "with_key2"}
    assert "caller-chosen" not in json.dumps([r["args"] for r in rows.values()])


# -- rows ------------------------------------------------------------------------------
def test_row_holds_hash_redacted_args_status_result_and_utc_times(
    store: Store, delivery_server: DeliveryServer
) -> None:
    @kx.effect
    def charge(
        account: str,
        amount: int,
        password: str,
        *,
        api_key: str,
        headers: dict[str, str],
        idempotency_key: str | None = None,
    ) -> Any:
        response = post_json(
            delivery_server.url + "/charge", {"account": account}, idempotency_key=idempotency_key
        )
        return {"charged": amount, "delivery": response.body["delivery"]}

    @kx.agent(name="ledger-rows")
    def agent(run: kx.Run) -> None:
        with run.step("pay"):
            run.state["receipt"] = charge(
                "acct-7",
                12,
                SECRET,
                api_key=SECRET,
                headers={"Authorization": SECRET, "Accept": "json"},
            )

    before = store.now()
    assert finish(agent.start(run_id="rows", store=store)) == "completed"
    after = store.now()
    (row,) = store.load_effects("rows").values()
    assert row["key"] == effect_key("rows", "pay", "charge", 0)
    assert (row["run_id"], row["step_key"], row["tool"], row["call_ordinal"]) == (
        "rows",
        "pay",
        "charge",
        0,
    )
    assert re.fullmatch(r"[0-9a-f]{64}", row["args_hash"])  # scheme 2 (scheme 1: 32)
    assert row["args_hash"] == bound_hash(  # bound by parameter name (scheme 2)
        {
            "account": "acct-7",
            "amount": 12,
            "password": SECRET,
            "api_key": SECRET,
            "headers": {"Authorization": SECRET, "Accept": "json"},
        }
    )
    args = json.loads(row["args"])
    assert args["account"] == "acct-7" and args["amount"] == 12
    assert args["password"] != SECRET and args["api_key"] != SECRET
    assert args["headers"]["Accept"] == "json" and args["headers"]["Authorization"] != SECRET
    assert "idempotency_key" not in args
    assert row["status"] == "applied" and row["error"] is None
    assert json.loads(row["result"]) == {"charged": 12, "delivery": 1}
    assert before <= row["intent_at"] <= row["outcome_at"] <= after
    assert row["intent_at"].tzinfo is None  # naive UTC, like every timestamp in the store
    assert abs(
        dt.datetime.now(dt.timezone.utc).replace(tzinfo=None) - row["intent_at"]
    ) < dt.timedelta(minutes=5)
    # The secret is nowhere in the store: not in the ledger, events or snapshots.
    for table in ("effects", "events", "snapshots", "runs", "steps"):
        dump = json.dumps(store.read(f"SELECT * FROM {table}"), default=str)
        assert SECRET not in dump, f"secret leaked into {table}"


def test_intent_is_committed_before_the_call(store: Store, delivery_server: DeliveryServer) -> None:
    seen: list[dict[str, Any] | None] = []

    @kx.effect
    def send(to: str, *, idempotency_key: str | None = None) -> str:
        assert idempotency_key is not None
        seen.append(store.effect(uuid.UUID(idempotency_key)))
        assert delivery_server.count(idempotency_key) == 0
        post_json(delivery_server.url + "/send", {"to": to}, idempotency_key=idempotency_key)
        return "sent"

    @kx.agent(name="ledger-intent")
    def agent(run: kx.Run) -> None:
        with run.step("s"):
            send("x")

    assert finish(agent.start(run_id="intent", store=store)) == "completed"
    (row,) = seen
    assert row is not None
    assert row["status"] == "pending" and row["outcome_at"] is None
    assert row["intent_at"] is not None and row["tool"] == "send"
    assert store.effect(row["key"])["status"] == "applied"


# -- resume ----------------------------------------------------------------------------
def test_resume_returns_the_recorded_result_and_sends_nothing(
    store: Store, delivery_server: DeliveryServer
) -> None:
    deliver = kx.effect(deliver_via(delivery_server))
    crash_after_send = [True]

    @kx.agent(name="ledger-replay")
    def agent(run: kx.Run) -> None:
        with run.step("mail"):
            run.state["answer"] = deliver("ana@example.org", "hello")
            if crash_after_send[0]:
                crash_after_send[0] = False
                raise ConnectionError("the kernel fell over after the mail went out")

    first = agent.start(run_id="replay", store=store)
    assert finish(first) == "failed"
    assert delivery_server.count() == 1
    (key,) = store.load_effects("replay")
    handle = kx.resume("replay", store=store)
    assert finish(handle) == "completed"
    assert delivery_server.count() == 1, "an applied effect was sent again"
    assert handle.run.state["answer"] == {
        "ok": True,
        "delivery": 1,
        "path": "/mail",
        "idempotency_key": str(key),
    }


def _fail_before_effects(store: Store, agent: kx.Agent, run_id: str, switch: list[bool]) -> None:
    """Start ``agent`` so that its first attempt fails before any effect call."""
    switch[0] = True
    assert finish(agent.start(run_id=run_id, store=store)) == "failed"
    switch[0] = False


def test_pending_intent_on_resume_becomes_unknown_and_blocks_the_call(
    store: Store, delivery_server: DeliveryServer
) -> None:
    deliver = kx.effect(deliver_via(delivery_server))
    fail_early = [False]

    @kx.agent(name="ledger-pending")
    def agent(run: kx.Run) -> None:
        with run.step("mail"):
            if fail_early[0]:
                raise RuntimeError("first attempt stops before the call")
            deliver("bo@example.org", "hi")

    _fail_before_effects(store, agent, "pending", fail_early)
    # What a process killed after the intent commit leaves behind: pending, no outcome.
    key = effect_key("pending", "mail", "deliver", 0)
    existing = store.write_intent(
        {
            "key": key,
            "run_id": "pending",
            "step_key": "mail",
            "step_ordinal": 0,
            "tool": "deliver",
            "call_ordinal": 0,
            "args_hash": bound_hash({"to": "bo@example.org", "body": "hi"}),
            "args": "{}",
            "resumable": True,
        }
    )
    assert existing is None
    handle = kx.resume("pending", store=store)
    assert handle.status == "needs_decision"
    assert handle.thread is None, "nothing may run before the unknown is decided"
    assert store.effect(key)["status"] == "unknown"
    kinds = [e["kind"] for e in store.events("pending")]
    assert "effect_unknown" in kinds and kinds[-1] == "needs_decision"
    again = kx.resume("pending", store=store)  # still undecided: still blocked
    assert again.status == "needs_decision" and again.thread is None
    assert delivery_server.count() == 0


def test_forced_stop_mid_call_leaves_an_unknown(
    store: Store, delivery_server: DeliveryServer
) -> None:
    entered = threading.Event()

    @kx.effect
    def slow_send(to: str, *, idempotency_key: str | None = None) -> str:
        entered.set()
        while True:  # a call that hangs; the forced stop lands between two sleeps
            threading.Event().wait(0.01)

    @kx.agent(name="ledger-forced")
    def agent(run: kx.Run) -> None:
        with run.step("s"):
            slow_send("x")

    handle = agent.start(run_id="forced", store=store)
    assert entered.wait(WAIT)
    handle.force_stop(cut_calls=True)
    assert finish(handle) == "suspended"
    (row,) = store.load_effects("forced").values()
    assert row["status"] == "unknown"
    resumed = kx.resume("forced", store=store)
    assert resumed.status == "needs_decision" and resumed.thread is None
    assert [u.tool for u in kx.reconcile("forced", store=store)] == ["slow_send"]


# -- failures --------------------------------------------------------------------------
def _failing_agent(name: str, tool: Any, caught: list[BaseException]) -> kx.Agent:
    @kx.agent(name=name)
    def agent(run: kx.Run) -> None:
        with run.step("mail"):
            try:
                run.state["answer"] = tool("cy@example.org", "hi")
            except RuntimeError as exc:  # the tool's own exception reaches agent code
                caught.append(exc)
                raise

    return agent


def test_failed_effect_is_recorded_raised_and_not_retried_silently(
    store: Store, delivery_server: DeliveryServer
) -> None:
    deliver = kx.effect(deliver_via(delivery_server))
    caught: list[BaseException] = []
    agent = _failing_agent("ledger-failed", deliver, caught)
    delivery_server.fail_next(1, status=503)
    handle = agent.start(run_id="failed", store=store)
    assert finish(handle) == "failed"
    assert type(handle.error) is RuntimeError and "HTTP 503" in str(handle.error)
    assert caught and caught[0] is handle.error
    (row,) = store.load_effects("failed").values()
    assert row["status"] == "failed"
    assert row["error"] == "RuntimeError: mail server answered HTTP 503"
    assert row["outcome_at"] is not None and row["result"] is None

    resumed = kx.resume("failed", store=store)
    assert finish(resumed) == "failed"
    assert isinstance(resumed.error, kx.EffectFailed)
    assert "retry=True" in str(resumed.error) and str(row["key"]) in str(resumed.error)
    assert delivery_server.count() == 0, "a failed effect was retried silently"


def test_failed_effect_with_retry_true_is_retried_under_the_same_key(
    store: Store, delivery_server: DeliveryServer
) -> None:
    deliver = kx.effect(retry=True)(deliver_via(delivery_server))
    agent = _failing_agent("ledger-retry", deliver, [])
    delivery_server.fail_next(1, status=503)
    assert finish(agent.start(run_id="retry", store=store)) == "failed"
    (key,) = store.load_effects("retry")
    resumed = kx.resume("retry", store=store)
    assert finish(resumed) == "completed"
    assert delivery_server.count() == 1 and delivery_server.count(str(key)) == 1
    assert store.effect(key)["status"] == "applied"


def test_same_key_with_other_arguments_is_refused_naming_the_key(
    store: Store, delivery_server: DeliveryServer
) -> None:
    deliver = kx.effect(deliver_via(delivery_server))
    body = ["first text"]

    @kx.agent(name="ledger-mismatch")
    def agent(run: kx.Run) -> None:
        with run.step("mail"):
            deliver("di@example.org", body[0])
            raise RuntimeError("fail after the call, so that the step runs again")

    assert finish(agent.start(run_id="mismatch", store=store)) == "failed"
    body[0] = "other text"  # the re-run step now makes another call under the same key
    resumed = kx.resume("mismatch", store=store)
    assert finish(resumed) == "failed"
    key = effect_key("mismatch", "mail", "deliver", 0)
    assert isinstance(resumed.error, kx.EffectArgumentsMismatch)
    assert str(key) in str(resumed.error)
    assert delivery_server.count() == 1
    assert store.effect(key)["status"] == "applied"


@pytest.mark.duckdb_only
def test_effect_outside_a_run_is_a_plain_call(
    store: Store, delivery_server: DeliveryServer
) -> None:
    deliver = kx.effect(deliver_via(delivery_server))
    answer = deliver("ed@example.org", "no run here")
    assert answer["delivery"] == 1
    assert delivery_server.deliveries[0]["idempotency_key"] is None  # no run, no key
    assert store.read("SELECT count(*) FROM effects") == [(0,)]
    page = (Path(__file__).resolve().parents[2] / "docs" / "agents.md").read_text()
    assert re.search(r"outside a run is a plain call", page), "document the pass-through"


@pytest.mark.duckdb_only
def test_unstorable_result_is_unknown_and_reconcile_decides_it(
    store: Store, delivery_server: DeliveryServer
) -> None:
    """Applied, result not storable: never a dead end. The effect is ``unknown`` (the run
    waits in needs_decision), kx.reconcile lists it, and the decision is replayed."""

    @kx.effect
    def send(to: str, *, idempotency_key: str | None = None) -> Any:
        post_json(delivery_server.url + "/send", {"to": to}, idempotency_key=idempotency_key)
        return object()  # a client object, say: not storable

    @kx.agent(name="ledger-unserialisable")
    def agent(run: kx.Run) -> Any:
        with run.step("s"):
            return send("fy@example.org")

    handle = agent.start(run_id="unser", store=store)
    assert finish(handle) == "needs_decision"
    message = store.get_run("unser")["reason"]  # the ResultNotStorable (a NeedsDecision)
    key = effect_key("unser", "s", "send", 0)
    assert "send" in message and str(key) in message and "object" in message
    assert "applied" in message and "kx.reconcile" in message
    row = store.effect(key)
    assert row is not None and row["status"] == "unknown"
    assert "cannot be stored" in (row["error"] or "")
    assert delivery_server.count() == 1
    # A resume does not call again: it waits for the decision.
    resumed = kx.resume("unser", store=store)
    assert finish(resumed) == "needs_decision"
    assert delivery_server.count() == 1
    (open_effect,) = kx.reconcile("unser", store=store)
    with pytest.raises(kx.SerializationError, match="cannot be stored"):
        open_effect.mark_applied(result=object())
    open_effect.mark_applied(result={"sent": dt.datetime(2026, 1, 2, tzinfo=dt.timezone.utc)})
    final = kx.resume("unser", store=store)
    assert finish(final) == "completed"
    assert final.result == {"sent": dt.datetime(2026, 1, 2, tzinfo=dt.timezone.utc)}
    assert delivery_server.count() == 1


# -- resumable=False -------------------------------------------------------------------
def test_non_resumable_effect_not_applied_needs_reconciliation(
    store: Store, delivery_server: DeliveryServer
) -> None:
    calls: list[Any] = []

    @kx.effect(resumable=False)
    def post_to_legacy_api(payload: dict[str, Any]) -> Any:
        calls.append(payload)
        response = post_json(delivery_server.url + "/legacy", payload)
        if len(calls) == 1:
            raise RuntimeError("garbled answer; the legacy API may or may not have done it")
        return response.body

    @kx.agent(name="ledger-legacy")
    def agent(run: kx.Run) -> None:
        with run.step("push"):
            run.state["answer"] = post_to_legacy_api({"order": 17})

    assert finish(agent.start(run_id="legacy", store=store)) == "failed"
    assert delivery_server.count() == 1
    resumed = kx.resume("legacy", store=store)
    assert finish(resumed) == "needs_decision"
    assert delivery_server.count() == 1, "passed a resumable=False effect without a decision"
    assert len(calls) == 1
    # The only way past it is an explicit reconciliation.
    (unknown,) = kx.reconcile("legacy", store=store)
    assert unknown.tool == "post_to_legacy_api"
    unknown.mark_applied(result={"ok": True, "delivery": 1}, note="seen in the legacy UI")
    done = kx.resume("legacy", store=store)
    assert finish(done) == "completed"
    assert done.run.state["answer"] == {"ok": True, "delivery": 1}
    assert len(calls) == 1 and delivery_server.count() == 1
