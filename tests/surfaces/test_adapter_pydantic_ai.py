"""``kx.pydantic_ai``: a Pydantic AI agent's run stopped, resumed and never repeated.

The model is Pydantic AI's own ``OpenAIChatModel`` pointed at ``support.llm_server.LLMServer``
on 127.0.0.1 (chat completions), which counts the requests of every conversation turn; the
tools POST to the local ``DeliveryServer``, which counts deliveries. A run is stopped while a
tool call is held, resumed in this process or in a new one (``python -m
support.pydantic_agents``), gated by an approval given from the command line, and ended by
Pydantic AI's own errors, then resumed once the code is fixed.
"""

from __future__ import annotations

import datetime
import functools
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from pydantic_ai import Agent, Tool, UsageLimits
from pydantic_ai.exceptions import UnexpectedModelBehavior, UsageLimitExceeded
from pydantic_ai.models.test import TestModel
from support.agent_fixtures import PROMPT, TWO_AT_ONCE, held_at_pay, ledger, paid, stopped_at_pay
from support.agent_processes import in_new_process, killed_after_first_payment, run_end
from support.http_server import DeliveryServer, post_json
from support.llm_server import LLMServer
from support.llm_views import no_prices  # noqa: F401 - autouse: no prices left over
from support.pydantic_agents import (
    ASKED_AWAY,
    CALLED,
    HOLD,
    PAY_SCRIPT,
    model_for,
    payer,
)

import kernelext as kx
from kernelext._adapters.adapter_loop import run_on_adapter_loop
from kernelext._adapters.pydantic_ai import MODEL_TOOL
from kernelext._core.people.approvals import Approval
from kernelext._core.process.runtime import runtime
from kernelext._core.views.conversation import conversation_of
from kernelext._store import open_store
from kernelext.status import EffectStatus, Reason, Status

pytestmark = pytest.mark.usefixtures("released_hold")  # a held pay let go after each test
LLM_SCRIPT = PAY_SCRIPT  # what the llm fixture's model server answers

stopped_at = functools.partial(stopped_at_pay, kx.pydantic_ai)
held_at = functools.partial(held_at_pay, kx.pydantic_ai)


def second_request(run_id: str) -> str:
    """What the model was sent at the run's second turn (the recorded request's args):
    where a person's decision on a call of the first turn is told to it."""
    rows = kx.sql(
        "SELECT args FROM effects WHERE run_id = ? AND step_key = 'turn 2' AND tool = ?",
        params=[run_id, MODEL_TOOL],
    )
    return str(rows["args"][0])


# -- Stop and resume ------------------------------------------------------------------------
def test_a_run_stopped_after_its_first_tool_call_is_resumed_in_a_new_process(
    store: Any, store_path: Path, llm: LLMServer, deliveries: DeliveryServer
) -> None:
    stopped_at(payer(llm.base_url, deliveries.url), "pa-new")
    assert paid(deliveries) == ["/pay/bob"]  # the Stop landed before the next turn
    assert ledger("pa-new") == [
        ("turn 1", MODEL_TOOL, 0, EffectStatus.APPLIED),
        ("turn 1", "pay", 1, EffectStatus.APPLIED),
    ]
    runtime().close()  # the store file is the new process's now
    done = in_new_process(
        "support.pydantic_agents", "resume", "pa-new", llm.base_url, deliveries.url
    )
    ended = run_end(done)
    assert ended == {"status": "completed", "result": "paid bob 10 and ann 3"}
    assert paid(deliveries) == ["/pay/ann", "/pay/bob"]  # each once
    assert set(llm.per_turn().values()) == {1}  # no turn asked twice
    assert len(llm.per_turn()) == 3
    # The panel's conversation, from the store alone: turns, calls, tokens, the last words.
    talk = conversation_of(open_store(str(store_path)).load_effects("pa-new").values())
    assert (talk.turns, talk.tool_calls) == (3, 2) and talk.tokens > 0
    assert talk.last == "assistant: paid bob 10 and ann 3"


def test_a_priced_run_shows_what_its_tokens_cost(
    store: Any, llm: LLMServer, deliveries: DeliveryServer
) -> None:
    agent = payer(llm.base_url, deliveries.url)
    handle = kx.pydantic_ai.start(agent, "pay", run_id="pa-priced", prices={"scripted": (1, 2)})
    assert handle.wait(30) == Status.COMPLETED
    assert re.search(
        r"3 turns · 2 tool calls · [\d,]+ tokens .* · \$0\.\d{4}", handle.text_summary()
    )
    with pytest.raises(TypeError, match=r"kx\.pydantic_ai\(prices=\.\.\.\)"):
        kx.pydantic_ai.start(agent, "pay", run_id="pa-badly-priced", prices={"scripted": 1})


def test_a_resume_in_the_same_process_replays_every_turn_it_had(
    store: Any, llm: LLMServer, deliveries: DeliveryServer
) -> None:
    agent = payer(llm.base_url, deliveries.url)
    stopped_at(agent, "pa-same", who="ann")  # stopped in the second turn this time
    assert paid(deliveries) == ["/pay/ann", "/pay/bob"]
    resumed = kx.resume("pa-same")
    assert resumed.wait(30) == Status.COMPLETED, resumed.error
    assert resumed.result == "paid bob 10 and ann 3"
    assert ledger("pa-same") == [
        ("turn 1", MODEL_TOOL, 0, EffectStatus.APPLIED),
        ("turn 1", "pay", 1, EffectStatus.APPLIED),
        ("turn 2", MODEL_TOOL, 0, EffectStatus.APPLIED),
        ("turn 2", "pay", 1, EffectStatus.APPLIED),
        ("turn 3", MODEL_TOOL, 0, EffectStatus.APPLIED),
    ]
    assert paid(deliveries) == ["/pay/ann", "/pay/bob"]  # turn 1 and 2's calls replayed
    assert set(llm.per_turn().values()) == {1}


@pytest.mark.parametrize("llm", [TWO_AT_ONCE], indirect=True)
def test_two_tool_calls_of_one_answer_are_keyed_by_the_models_order(
    store: Any, llm: LLMServer, deliveries: DeliveryServer
) -> None:
    # bob's call (the model's first) is held until ann's (its second) was delivered: the
    # ordinals follow the model's order, not the order the calls ended in.
    handle = held_at(payer(llm.base_url, deliveries.url), "pa-two", who="bob")
    for _ in range(300):
        if paid(deliveries) == ["/pay/ann"]:
            break
        time.sleep(0.05)
    assert paid(deliveries) == ["/pay/ann"]
    handle.stop()
    HOLD.released.set()
    assert handle.wait(30) == Status.SUSPENDED, handle.error
    rows = kx.sql(
        "SELECT call_ordinal, args FROM effects WHERE run_id = 'pa-two' AND tool = 'pay' "
        "ORDER BY call_ordinal"
    )
    assert [(o, json.loads(a)["who"]) for o, a in rows.itertuples(index=False)] == [
        (1, "bob"),
        (2, "ann"),
    ]
    resumed = kx.resume("pa-two")
    assert resumed.wait(30) == Status.COMPLETED, resumed.error
    assert resumed.result == "paid both"
    assert paid(deliveries) == ["/pay/ann", "/pay/bob"]  # both replayed on resume
    assert set(llm.per_turn().values()) == {1}


def test_a_tools_retry_request_is_its_recorded_answer_and_replayed(
    store: Any, llm: LLMServer, deliveries: DeliveryServer
) -> None:
    # bob is away: pay asks the model to retry (ModelRetry); the model then pays ann. A
    # resume replays that answer to the model instead of failing the call or asking again.
    ASKED_AWAY.clear()
    agent = payer(llm.base_url, deliveries.url, away=frozenset({"bob"}))
    stopped_at(agent, "pa-away", who="ann")
    assert [row[1:] for row in ledger("pa-away") if row[1] == "pay"] == [
        ("pay", 1, EffectStatus.APPLIED),
        ("pay", 1, EffectStatus.APPLIED),
    ]
    resumed = kx.resume("pa-away")
    assert resumed.wait(30) == Status.COMPLETED, resumed.error
    assert resumed.result == "paid bob 10 and ann 3"
    assert ASKED_AWAY == ["bob"]  # the tool was not called again
    assert paid(deliveries) == ["/pay/ann"]
    assert set(llm.per_turn().values()) == {1}


def test_a_call_cut_by_a_force_stop_waits_in_reconcile_and_is_not_made_again(
    store: Any, llm: LLMServer, deliveries: DeliveryServer
) -> None:
    handle = held_at(payer(llm.base_url, deliveries.url), "pa-cut", who="bob")
    handle.force_stop(cut_calls=True)
    assert handle.wait(30) == Status.SUSPENDED, handle.error
    HOLD.released.set()  # the payment goes out after all: the ledger cannot know it did
    assert ("turn 1", "pay", 1, EffectStatus.UNKNOWN) in ledger("pa-cut")
    assert kx.resume("pa-cut").wait(30) == Status.NEEDS_DECISION
    (cut,) = kx.reconcile("pa-cut").open
    assert (cut.tool, json.loads(cut.args or "")) == ("pay", {"who": "bob", "amount": 10})
    cut.mark_applied("paid bob 10 (200)")  # a person looked at the bank's side
    resumed = kx.resume("pa-cut")
    assert resumed.wait(30) == Status.COMPLETED, resumed.error
    assert resumed.result == "paid bob 10 and ann 3"
    assert paid(deliveries) == ["/pay/ann", "/pay/bob"]  # bob once, as decided
    assert set(llm.per_turn().values()) == {1}


class Receipt(BaseModel):
    who: str
    on: datetime.date


def test_a_kernel_killed_after_a_payment_reached_its_server_never_pays_twice(
    store_path: Path, llm: LLMServer, deliveries: DeliveryServer
) -> None:
    killed_after_first_payment("support.pydantic_agents", "pa-kill", llm, deliveries)
    assert paid(deliveries) == ["/pay/bob"]

    def resumed() -> dict[str, Any]:
        done = in_new_process(
            "support.pydantic_agents", "resume", "pa-kill", llm.base_url, deliveries.url
        )
        return run_end(done)

    assert resumed()["status"] == Status.NEEDS_DECISION  # bob's payment: nobody knows
    assert paid(deliveries) == ["/pay/bob"]
    # Decided from the server's own log: it did receive bob's payment.
    [unknown] = kx.reconcile("pa-kill")
    assert unknown.tool == "pay" and "bob" in str(unknown.args)
    assert [d["body"]["who"] for d in deliveries.deliveries] == ["bob"]
    unknown.mark_applied(result="paid bob 10 (200)")
    runtime().close()
    assert resumed() == {"status": "completed", "result": "paid bob 10 and ann 3"}
    assert paid(deliveries) == ["/pay/ann", "/pay/bob"]
    assert set(llm.per_turn().values()) == {1}


def test_a_tool_returning_an_object_is_applied_and_replayed_as_the_model_was_given_it(
    store: Any, llm: LLMServer, deliveries: DeliveryServer
) -> None:
    agent = Agent(model_for(llm.base_url), name="receipts")

    @agent.tool_plain
    def pay(who: str, amount: int) -> Receipt:
        """Pay someone an amount of dollars."""
        if HOLD.holds(who):
            HOLD.wait_here()
        post_json(f"{deliveries.url}/pay/{who}", {"who": who, "amount": amount})
        return Receipt(who=who, on=datetime.date(2026, 1, 2))

    stopped_at(agent, "pa-receipt", who="ann")
    assert [s for s in ledger("pa-receipt") if s[1] == "pay"] == [
        ("turn 1", "pay", 1, EffectStatus.APPLIED),
        ("turn 2", "pay", 1, EffectStatus.APPLIED),
    ]
    resumed = kx.resume("pa-receipt")
    assert resumed.wait(30) == Status.COMPLETED, resumed.error
    assert paid(deliveries) == ["/pay/ann", "/pay/bob"]
    assert set(llm.per_turn().values()) == {1}  # turn 2's request, with bob's receipt, matched


LOOKUP = [
    {"tool_calls": [{"name": "lookup", "arguments": {"order-id": "A-1", "class": "gold"}}]},
    {"content": "found"},
]


@pytest.mark.parametrize("llm", [LOOKUP], indirect=True)
def test_a_tool_whose_argument_names_are_no_python_names_is_recorded(
    store: Any, llm: LLMServer, deliveries: DeliveryServer
) -> None:
    # A tool of a JSON schema (an MCP server's, Tool.from_schema) may name its arguments
    # "order-id" or "class": the call is recorded with them as one mapping.
    def lookup(**arguments: Any) -> str:
        post_json(f"{deliveries.url}/lookup", arguments)
        return "order A-1: shipped"

    schema = {
        "type": "object",
        "properties": {"order-id": {"type": "string"}, "class": {"type": "string"}},
    }
    tool = Tool.from_schema(lookup, "lookup", "Look an order up.", schema)
    agent = Agent(model_for(llm.base_url), name="orders", tools=[tool])
    handle = kx.pydantic_ai.start(agent, "look A-1 up", run_id="pa-names")
    assert handle.wait(30) == Status.COMPLETED, handle.error
    (args,) = kx.sql("SELECT args FROM effects WHERE run_id = 'pa-names' AND tool = 'lookup'")[
        "args"
    ]
    assert json.loads(args) == {"given": {"order-id": "A-1", "class": "gold"}}
    assert [d["body"] for d in deliveries.deliveries] == [{"order-id": "A-1", "class": "gold"}]


# -- approvals ------------------------------------------------------------------------------
def test_a_tool_needing_approval_is_asked_through_kernelext_and_approved_from_the_cli(
    store: Any, store_path: Path, llm: LLMServer, deliveries: DeliveryServer
) -> None:
    CALLED.clear()
    agent = payer(llm.base_url, deliveries.url, approval=True)
    handle = kx.pydantic_ai.start(agent, PROMPT, run_id="pa-approve")
    assert handle.wait(30) == Status.SUSPENDED, handle.error
    assert handle.info()["reason"] == Reason.APPROVAL  # with the approval's expiry and text
    (request,) = list(kx.approvals("pa-approve"))
    assert request.tool == "pay" and request.arguments == {"who": "bob", "amount": 10}
    assert paid(deliveries) == []  # nothing paid before a person said yes
    runtime().close()
    done = in_new_process("kernelext", "approve", str(request.key), "--store", str(store_path))
    assert done.returncode == 0, done.stdout + done.stderr
    kx.open_store(str(store_path))
    resumed = kx.resume("pa-approve")
    assert resumed.wait(30) == Status.SUSPENDED  # ann's payment needs its own approval
    (second,) = list(kx.approvals("pa-approve"))
    assert second.arguments == {"who": "ann", "amount": 3}
    # Approved here, with an edit: the run goes on at once, the call made as edited.
    last = kx.approve(second.key, edit={"amount": 4}).handle
    assert last.wait(30) == Status.COMPLETED, last.error
    assert last.result == "paid bob 10 and ann 3"
    assert paid(deliveries) == ["/pay/ann", "/pay/bob"]
    assert [d["body"]["amount"] for d in deliveries.deliveries] == [10, 4]  # the edited call
    assert CALLED == [("bob", True), ("ann", True)]  # the tool is told a person approved it
    assert set(llm.per_turn().values()) == {1}


def test_a_rejected_call_is_not_made_and_the_model_is_told(
    store: Any, llm: LLMServer, deliveries: DeliveryServer
) -> None:
    agent = payer(llm.base_url, deliveries.url, approval=True)
    handle = kx.pydantic_ai.start(agent, PROMPT, run_id="pa-reject")
    for who in ("bob", "ann"):
        assert handle.wait(30) == Status.SUSPENDED, handle.error
        (request,) = list(kx.approvals("pa-reject"))
        assert request.arguments["who"] == who
        handle = kx.reject(request.key, note="not this week").handle  # the run goes on
    assert handle.wait(30) == Status.COMPLETED, handle.error
    assert paid(deliveries) == []
    told = second_request("pa-reject")
    assert "A person rejected this call" in told and "not this week" in told


def test_a_tool_asking_for_approval_itself_is_asked_through_kernelext_and_made_once(
    store: Any, store_path: Path, llm: LLMServer, deliveries: DeliveryServer
) -> None:
    CALLED.clear()
    agent = payer(llm.base_url, deliveries.url, approve_over=5)  # ApprovalRequired over 5
    handle = kx.pydantic_ai.start(agent, PROMPT, run_id="pa-asks")
    assert handle.wait(30) == Status.SUSPENDED, handle.error
    assert handle.info()["reason"] == Reason.APPROVAL
    (request,) = list(kx.approvals("pa-asks"))
    assert request.tool == "pay" and request.arguments == {"who": "bob", "amount": 10}
    assert kx.resume("pa-asks").wait(30) == Status.SUSPENDED  # still waiting: not called again
    assert (paid(deliveries), CALLED) == ([], [("bob", False)])
    runtime().close()
    done = in_new_process("kernelext", "approve", str(request.key), "--store", str(store_path))
    assert done.returncode == 0, done.stdout + done.stderr
    kx.open_store(str(store_path))
    HOLD.arm(who="ann")  # stopped after the approved call: a resume replays it
    resumed = kx.resume("pa-asks")
    assert HOLD.reached.wait(30)
    resumed.stop()
    HOLD.released.set()
    assert resumed.wait(30) == Status.SUSPENDED, resumed.error
    resumed = kx.resume("pa-asks")
    assert resumed.wait(30) == Status.COMPLETED, resumed.error
    assert resumed.result == "paid bob 10 and ann 3"
    assert paid(deliveries) == ["/pay/ann", "/pay/bob"]  # ann's 3 was not asked for
    assert CALLED == [("bob", False), ("bob", True), ("ann", False)]
    assert ledger("pa-asks") == [
        ("turn 1", MODEL_TOOL, 0, EffectStatus.APPLIED),
        ("turn 1", "pay", 1, EffectStatus.APPLIED),
        ("turn 2", MODEL_TOOL, 0, EffectStatus.APPLIED),
        ("turn 2", "pay", 1, EffectStatus.APPLIED),
        ("turn 3", MODEL_TOOL, 0, EffectStatus.APPLIED),
    ]
    assert set(llm.per_turn().values()) == {1}


def asked_by_the_tool(llm: LLMServer, deliveries: DeliveryServer, run_id: str) -> Approval:
    """Starts run ``run_id`` of the payer whose tool asks for approval itself (over 5), with
    no call noted yet in ``CALLED``; returns the approval request of bob's 10 it waits on."""
    CALLED.clear()
    agent = payer(llm.base_url, deliveries.url, approve_over=5)
    handle = kx.pydantic_ai.start(agent, PROMPT, run_id=run_id)
    assert handle.wait(30) == Status.SUSPENDED, handle.error
    (request,) = list(kx.approvals(run_id))
    return request


def test_a_call_the_tool_asked_approval_for_and_a_person_rejected_tells_the_model(
    store: Any, llm: LLMServer, deliveries: DeliveryServer
) -> None:
    request = asked_by_the_tool(llm, deliveries, "pa-asks-no")
    handle = kx.reject(request.key, note="too much").handle
    assert handle.wait(30) == Status.COMPLETED, handle.error
    assert paid(deliveries) == ["/pay/ann"]
    assert ("bob", True) not in CALLED
    told = second_request("pa-asks-no")
    assert "A person rejected this call" in told and "too much" in told


def test_an_edit_of_a_call_the_tool_asked_approval_for_is_refused_and_nothing_paid(
    store: Any, llm: LLMServer, deliveries: DeliveryServer
) -> None:
    request = asked_by_the_tool(llm, deliveries, "pa-asks-edit")
    handle = kx.approve(request.key, edit={"amount": 4}).handle
    assert handle.wait(30) == Status.FAILED
    assert isinstance(handle.error, kx.LedgerError)
    assert "edited arguments" in str(handle.error) and "nothing was sent" in str(handle.error)
    assert (paid(deliveries), CALLED) == ([], [("bob", False)])


# -- the agent built with kernelext's durability capability -----------------------------------
def test_an_agent_built_with_the_capability_runs_plain_outside_a_run_and_recorded_in_one(
    store: Any, llm: LLMServer, deliveries: DeliveryServer
) -> None:
    agent = payer(llm.base_url, deliveries.url, durable=True)
    plain = run_on_adapter_loop(lambda: agent.run(PROMPT))  # outside a run: as without it
    assert plain.output == "paid bob 10 and ann 3"
    assert kx.sql("SELECT count(*) FROM effects").iloc[0, 0] == 0
    handle = kx.pydantic_ai.start(agent, PROMPT, run_id="pa-built")  # its own, not a second
    assert handle.wait(30) == Status.COMPLETED, handle.error
    assert [row[1] for row in ledger("pa-built")] == [MODEL_TOOL, "pay"] * 2 + [MODEL_TOOL]
    assert paid(deliveries) == ["/pay/ann", "/pay/ann", "/pay/bob", "/pay/bob"]  # two runs


def test_a_model_given_to_start_answers_that_run_only(
    store: Any, llm: LLMServer, deliveries: DeliveryServer
) -> None:
    nowhere = payer("http://127.0.0.1:9/v1", deliveries.url)  # its own model answers nothing
    stopped_at(nowhere, "pa-model", model=model_for(llm.base_url))
    # Another run of the same agent is given only what its own start was given ...
    later = kx.pydantic_ai.start(nowhere, PROMPT, run_id="pa-model-2")
    assert later.wait(30) == Status.FAILED
    # ... a start refused for its taken run id changes nothing of it ...
    with pytest.raises(kx.RunStateError):
        kx.pydantic_ai.start(nowhere, PROMPT, run_id="pa-model")
    # ... and the first, resumed here, still has its own model.
    resumed = kx.resume("pa-model")
    assert resumed.wait(30) == Status.COMPLETED, resumed.error
    assert resumed.result == "paid bob 10 and ann 3"
    assert set(llm.per_turn().values()) == {1} and len(llm.per_turn()) == 3


# -- the framework's errors -------------------------------------------------------------------
@pytest.mark.parametrize("llm", [[{"content": "done"}]], indirect=True)
def test_output_retries_exceeded_fail_the_run_and_a_fixed_validator_goes_on(
    store: Any, llm: LLMServer, deliveries: DeliveryServer
) -> None:
    picky = payer(llm.base_url, deliveries.url, accepts=lambda text: text == "paid")
    handle = kx.pydantic_ai.start(picky, PROMPT, run_id="pa-retries")
    assert handle.wait(30) == Status.FAILED
    assert isinstance(handle.error, UnexpectedModelBehavior)
    assert "retries" in (handle.error_text() or "")
    asked = llm.count()
    assert [row[:2] for row in ledger("pa-retries")] == [
        ("turn 1", MODEL_TOOL),
        ("turn 2", MODEL_TOOL),
    ]
    kx.pydantic_ai.agent(payer(llm.base_url, deliveries.url, accepts=lambda text: True))
    resumed = kx.resume("pa-retries")
    assert resumed.wait(30) == Status.COMPLETED, resumed.error
    assert resumed.result == "done"
    assert llm.count() == asked  # the recorded answer was accepted, not asked again


def test_a_usage_limit_fails_the_run_and_a_higher_limit_goes_on(
    store: Any, llm: LLMServer, deliveries: DeliveryServer
) -> None:
    agent = payer(llm.base_url, deliveries.url)
    handle = kx.pydantic_ai.start(
        agent, PROMPT, run_id="pa-limit", usage_limits=UsageLimits(request_limit=1)
    )
    assert handle.wait(30) == Status.FAILED
    assert isinstance(handle.error, UsageLimitExceeded)
    assert paid(deliveries) == ["/pay/bob"]
    kx.pydantic_ai.agent(agent, usage_limits=UsageLimits(request_limit=5))
    resumed = kx.resume("pa-limit")
    assert resumed.wait(30) == Status.COMPLETED, resumed.error
    assert resumed.result == "paid bob 10 and ann 3"
    assert paid(deliveries) == ["/pay/ann", "/pay/bob"]
    assert set(llm.per_turn().values()) == {1}


# -- bad input ------------------------------------------------------------------------------
def test_something_that_is_not_an_agent_is_a_clear_type_error(store: Any) -> None:
    with pytest.raises(TypeError, match=r"takes a pydantic_ai\.Agent .* not str"):
        kx.pydantic_ai.start("payer", PROMPT, run_id="pa-bad")
    with pytest.raises(TypeError, match=r"needs an agent built with a model"):
        kx.pydantic_ai.start(Agent(None, name="modelless"), PROMPT, run_id="pa-bad")
    with pytest.raises(TypeError, match=r"does not take toolsets="):
        kx.pydantic_ai.start(Agent(TestModel()), PROMPT, run_id="pa-bad", toolsets=[])
    assert kx.sql("SELECT count(*) FROM runs").iloc[0, 0] == 0


def test_without_pydantic_ai_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pydantic_ai", None)  # as if not installed
    with pytest.raises(ImportError, match=r"pip install 'kernelext\[pydantic-ai\]'"):
        kx.pydantic_ai.agent(object())
