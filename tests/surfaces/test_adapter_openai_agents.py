"""``kx.openai_agents``: an OpenAI Agents SDK run stopped, resumed and never repeated.

The model is ``support.llm_server.LLMServer`` on 127.0.0.1 (the Responses API the SDK
speaks), which counts the requests of every conversation turn; the tools POST to the local
``DeliveryServer``, which counts deliveries. A run is stopped while a tool call is held,
resumed in this process or in a new one (``python -m support.sdk_agents``), killed with
SIGKILL right after a payment reached the server, gated by an approval given from the
command line, and ended by the SDK's own errors.
"""

from __future__ import annotations

import datetime
import functools
import json
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from agents import (
    Agent,
    GuardrailFunctionOutput,
    Handoff,
    InputGuardrailTripwireTriggered,
    LocalShellTool,
    MaxTurnsExceeded,
    function_tool,
    handoff,
    input_guardrail,
)
from pydantic import BaseModel
from support.agent_fixtures import TWO_AT_ONCE, held_at_pay, ledger, paid, stopped_at_pay
from support.agent_processes import env_with_tests_on_path, killed_after_first_payment, run_end
from support.agent_processes import in_new_process as agent_process
from support.http_server import DeliveryServer, post_json
from support.live import wait_until
from support.llm_server import LLMServer
from support.llm_views import kernelext_show, no_prices  # noqa: F401 - autouse: no prices left over
from support.sdk_agents import HOLD, PAY_SCRIPT, payer

import kernelext as kx
from kernelext._adapters.openai_agents import MODEL_TOOL
from kernelext._core.people.approvals import Approval
from kernelext._core.process.runtime import runtime
from kernelext.status import EffectStatus, Status

pytestmark = pytest.mark.usefixtures("released_hold")  # a held pay let go after each test
LLM_SCRIPT = PAY_SCRIPT  # what the llm fixture's model server answers

stopped_at = functools.partial(stopped_at_pay, kx.openai_agents)


def in_new_process(*argv: str, timeout: float = 120) -> dict[str, Any]:
    return run_end(agent_process("support.sdk_agents", *argv, timeout=timeout))


# -- Stop and resume ------------------------------------------------------------------------
def test_a_run_stopped_after_its_first_tool_call_is_resumed_in_a_new_process(
    store: Any, llm: LLMServer, deliveries: DeliveryServer
) -> None:
    stopped_at(payer(llm.base_url, deliveries.url), "oa-new")
    assert paid(deliveries) == ["/pay/bob"]  # the Stop landed before the next turn
    assert ledger("oa-new") == [
        ("turn 1", MODEL_TOOL, 0, EffectStatus.APPLIED),
        ("turn 1", "pay", 1, EffectStatus.APPLIED),
    ]
    (args,) = kx.sql("SELECT args FROM effects WHERE run_id = 'oa-new' AND tool = 'pay'")["args"]
    assert json.loads(args) == {"who": "bob", "amount": 10}  # by name, as the model gave them
    # What a person reads before Resume: the turn it goes on after, what is replayed.
    plan = kx.plan("oa-new").text()
    assert "Ready: the conversation continues after turn 1;" in plan, plan
    assert "replayed from the ledger: openai_agents:model ×1, pay ×1" in plan, plan
    runtime().close()  # the store file is the new process's now
    ended = in_new_process("resume", "oa-new", llm.base_url, deliveries.url)
    assert ended == {"status": "completed", "result": "paid bob 10 and ann 3"}
    assert paid(deliveries) == ["/pay/ann", "/pay/bob"]  # each once
    assert set(llm.per_turn().values()) == {1}  # no turn asked twice
    assert len(llm.per_turn()) == 3


def test_a_resume_in_the_same_kernel_replays_every_turn_it_had(
    store: Any, llm: LLMServer, deliveries: DeliveryServer
) -> None:
    agent = payer(llm.base_url, deliveries.url)
    handle = kx.openai_agents.start(agent, "pay bob 10 and ann 3", run_id="oa-same")
    assert handle.wait(30) == Status.COMPLETED
    assert handle.result == "paid bob 10 and ann 3"
    # Stopped at the second turn this time: turn 1's answer and tool are replayed, the
    # second turn's request (which holds the first's items) matches its record.
    stopped_at(agent, "oa-same-2", who="ann")
    resumed = kx.resume("oa-same-2")
    assert resumed.wait(30) == Status.COMPLETED
    assert resumed.result == "paid bob 10 and ann 3"
    assert [s for s in ledger("oa-same-2") if s[1] == "pay"] == [
        ("turn 1", "pay", 1, EffectStatus.APPLIED),
        ("turn 2", "pay", 1, EffectStatus.APPLIED),
    ]
    assert paid(deliveries) == ["/pay/ann", "/pay/ann", "/pay/bob", "/pay/bob"]  # two runs
    assert set(llm.per_turn().values()) == {2}  # each turn once per run


def test_tool_calls_of_one_answer_are_keyed_by_the_models_order_and_made_once(
    store: Any, llm: LLMServer, deliveries: DeliveryServer
) -> None:
    llm.script = list(TWO_AT_ONCE)
    agent = payer(llm.base_url, deliveries.url)
    # The first call waits: the second finishes first.
    handle = held_at_pay(kx.openai_agents, agent, "oa-two", who="bob", prompt="pay both")
    deliveries.wait_for(1)  # ann's, made while bob's waits
    handle.stop()
    HOLD.released.set()
    assert handle.wait(30) == Status.SUSPENDED
    pays = kx.sql(
        "SELECT call_ordinal, args FROM effects WHERE run_id = 'oa-two' AND tool = 'pay' "
        "ORDER BY call_ordinal"
    )
    assert list(pays["call_ordinal"]) == [1, 2]
    assert "bob" in pays["args"][0] and "ann" in pays["args"][1]  # the model's order
    resumed = kx.resume("oa-two")
    assert resumed.wait(30) == Status.COMPLETED
    assert resumed.result == "paid both"
    assert paid(deliveries) == ["/pay/ann", "/pay/bob"]
    assert set(llm.per_turn().values()) == {1}


# -- a kernel killed mid-call, an approval, a rejection -------------------------------------
def test_a_kernel_killed_after_a_payment_reached_its_server_never_pays_twice(
    store_path: Path, llm: LLMServer, deliveries: DeliveryServer
) -> None:
    killed_after_first_payment("support.sdk_agents", "oa-kill", llm, deliveries)
    assert paid(deliveries) == ["/pay/bob"]
    ended = in_new_process("resume", "oa-kill", llm.base_url, deliveries.url)
    assert ended["status"] == Status.NEEDS_DECISION  # bob's payment: nobody knows
    assert paid(deliveries) == ["/pay/bob"]
    # Decided from the server's own log: it did receive bob's payment.
    [unknown] = kx.reconcile("oa-kill")
    assert unknown.tool == "pay" and "bob" in str(unknown.args)
    assert [d["body"]["who"] for d in deliveries.deliveries] == ["bob"]
    unknown.mark_applied(result="paid bob 10 (200)")
    runtime().close()
    ended = in_new_process("resume", "oa-kill", llm.base_url, deliveries.url)
    assert ended == {"status": "completed", "result": "paid bob 10 and ann 3"}
    assert paid(deliveries) == ["/pay/ann", "/pay/bob"]
    assert set(llm.per_turn().values()) == {1}


def test_a_kernel_killed_while_the_model_thought_leaves_the_turn_to_a_person(
    store_path: Path, tmp_path: Path, deliveries: DeliveryServer
) -> None:
    with LLMServer(script=list(PAY_SCRIPT), hold_turns=(1,)) as llm:
        env = env_with_tests_on_path()
        argv = ["start", "oa-think", llm.base_url, deliveries.url]
        worker = subprocess.Popen(
            [sys.executable, "-m", "support.sdk_agents", *argv],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            asked = lambda: any(turn == 1 for _, turn in llm.per_turn())  # noqa: E731
            wait_until(asked, "the model was asked for its second answer")
        finally:
            worker.send_signal(signal.SIGKILL)
            worker.communicate(timeout=30)
        llm.release_held()
        ended = in_new_process("resume", "oa-think", llm.base_url, deliveries.url)
        assert ended["status"] == Status.NEEDS_DECISION  # did the model answer? nobody knows
        [unknown] = kx.reconcile("oa-think")
        assert unknown.tool == MODEL_TOOL
        unknown.mark_not_applied(note="the answer never reached the run: ask again")
        runtime().close()
        ended = in_new_process("resume", "oa-think", llm.base_url, deliveries.url)
        assert ended == {"status": "completed", "result": "paid bob 10 and ann 3"}
        assert paid(deliveries) == ["/pay/ann", "/pay/bob"]
        asked = sorted(llm.per_turn().values())
        assert asked == [1, 1, 2]  # the cut turn twice (a person said so), the others once


def asked_to_approve_paying_bob(
    llm: LLMServer, deliveries: DeliveryServer, run_id: str, *, answer: str
) -> Approval:
    """Starts run ``run_id`` of an agent whose pay tool needs approval, its model asking to
    pay bob (then answering ``answer``); returns the approval request the run waits on."""
    llm.script = [PAY_SCRIPT[0], {"content": answer}]
    agent = payer(llm.base_url, deliveries.url, needs_approval=True)
    handle = kx.openai_agents.start(agent, "pay bob", run_id=run_id)
    assert handle.wait(30) == Status.SUSPENDED
    [request] = kx.approvals(run_id)
    return request


def test_a_tool_that_needs_approval_waits_for_it_from_the_command_line(
    store_path: Path, llm: LLMServer, deliveries: DeliveryServer
) -> None:
    request = asked_to_approve_paying_bob(llm, deliveries, "oa-approve", answer="paid bob")
    assert paid(deliveries) == []
    assert request.tool == "pay"
    assert request.arguments == {"who": "bob", "amount": 10}  # what the person decides on
    runtime().close()
    done = subprocess.run(
        [sys.executable, "-m", "kernelext", "approve", str(request.key), "--store",
         str(store_path), "--note", "checked the invoice"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    resumed = kx.resume("oa-approve")
    assert resumed.wait(30) == Status.COMPLETED
    assert resumed.result == "paid bob"
    assert paid(deliveries) == ["/pay/bob"]
    assert set(llm.per_turn().values()) == {1}


def test_a_rejected_call_is_not_made_and_the_model_is_told(
    store: Any, llm: LLMServer, deliveries: DeliveryServer
) -> None:
    request = asked_to_approve_paying_bob(llm, deliveries, "oa-reject", answer="bob was not paid")
    request.reject(note="wrong account", resume=False)
    resumed = kx.resume("oa-reject")
    assert resumed.wait(30) == Status.COMPLETED
    assert resumed.result == "bob was not paid"
    assert paid(deliveries) == []
    told = [r for r in llm.requests if r["turn"] == 1]
    assert told, "the model was asked again after the rejection"


# -- the SDK's own errors -------------------------------------------------------------------
def test_max_turns_ends_the_run_failed_and_a_resume_with_more_turns_goes_on(
    store: Any, llm: LLMServer, deliveries: DeliveryServer
) -> None:
    agent = payer(llm.base_url, deliveries.url)
    handle = kx.openai_agents.start(agent, "pay bob 10 and ann 3", run_id="oa-max", max_turns=2)
    assert handle.wait(30) == Status.FAILED
    assert isinstance(handle.error, MaxTurnsExceeded)
    assert paid(deliveries) == ["/pay/ann", "/pay/bob"]
    kx.openai_agents.agent(agent, max_turns=5)  # the fix
    resumed = kx.resume("oa-max")
    assert resumed.wait(30) == Status.COMPLETED
    assert resumed.result == "paid bob 10 and ann 3"
    assert paid(deliveries) == ["/pay/ann", "/pay/bob"]  # not paid again
    assert set(llm.per_turn().values()) == {1}


def test_a_tripped_guardrail_ends_the_run_failed_with_the_sdks_error(
    store: Any, llm: LLMServer, deliveries: DeliveryServer
) -> None:
    @input_guardrail
    def no_millions(ctx: Any, agent: Any, given: Any) -> GuardrailFunctionOutput:
        return GuardrailFunctionOutput(output_info=None, tripwire_triggered="million" in given)

    agent = payer(llm.base_url, deliveries.url).clone(input_guardrails=[no_millions])
    handle = kx.openai_agents.start(agent, "pay bob a million", run_id="oa-guard")
    assert handle.wait(30) == Status.FAILED
    assert isinstance(handle.error, InputGuardrailTripwireTriggered)
    assert paid(deliveries) == []


# -- handoffs, the LLM view, bad input -------------------------------------------------------
@pytest.mark.parametrize("made_by", ["handoff()", "its own Handoff"])
def test_a_handoff_mid_run_is_stopped_and_resumed_on_the_agent_it_reached(
    made_by: str, store: Any, llm: LLMServer, deliveries: DeliveryServer
) -> None:
    llm.script = [
        {"tool_calls": [{"name": "transfer_to_payer", "arguments": {}}]},
        PAY_SCRIPT[0],
        {"content": "paid bob"},
    ]
    cashier = payer(llm.base_url, deliveries.url)
    to_cashier = handoff(cashier)
    if made_by == "its own Handoff":  # the agent is known only once the handoff ran

        async def reach(ctx: Any, arguments: str) -> Any:
            return cashier

        to_cashier = Handoff(
            tool_name="transfer_to_payer", tool_description="Hand over to the payer.",
            input_json_schema={"type": "object", "properties": {}, "additionalProperties": False},
            on_invoke_handoff=reach, agent_name="payer",
        )  # fmt: skip
    triage = Agent(
        name="triage", instructions="Hand payments over.", model=cashier.model,
        handoffs=[to_cashier],
    )  # fmt: skip
    stopped_at(triage, "oa-handoff", prompt="pay bob")
    resumed = kx.resume("oa-handoff")
    assert resumed.wait(30) == Status.COMPLETED
    assert resumed.result == "paid bob"
    assert paid(deliveries) == ["/pay/bob"]
    assert set(llm.per_turn().values()) == {1}
    assert len(llm.per_turn()) == 3


def test_the_runs_turns_tool_calls_tokens_and_cost_show_as_for_kx_openai(
    store_path: Path, llm: LLMServer, deliveries: DeliveryServer
) -> None:
    agent = payer(llm.base_url, deliveries.url)
    handle = kx.openai_agents.start(agent, "pay", run_id="oa-llm", prices={"scripted": (1, 2)})
    assert handle.wait(30) == Status.COMPLETED
    talk = re.compile(r"3 turns · 2 tool calls · ([\d,]+) tokens \(([\d,]+) prompt \+ "
                      r"([\d,]+) completion\) · \$0\.\d{4}")  # fmt: skip
    found = talk.search(handle.text_summary())
    assert found is not None, handle.text_summary()
    tokens, prompt, completion = (int(g.replace(",", "")) for g in found.groups())
    assert tokens == prompt + completion > 0
    runtime().close()
    shown = kernelext_show("oa-llm", store_path)  # another process, from the store alone
    assert "3 turns · 2 tool calls · " in shown and f"{tokens:,} tokens" in shown


def test_what_is_not_an_sdk_agent_or_cannot_be_recorded_is_refused_up_front(
    store: Any, llm: LLMServer, deliveries: DeliveryServer
) -> None:
    with pytest.raises(TypeError, match=r"takes an agents\.Agent"):
        kx.openai_agents.start(lambda: None, "pay", run_id="oa-bad")
    shell = Agent(name="sh", tools=[LocalShellTool(executor=lambda request: "")])
    with pytest.raises(TypeError, match=r"runs on this machine.*@function_tool"):
        kx.openai_agents.start(shell, "ls", run_id="oa-bad")
    with pytest.raises(ValueError, match="max_turns"):
        kx.openai_agents.start(payer(llm.base_url, deliveries.url), "x", max_turns=0)
    assert kx.sql("SELECT count(*) AS n FROM runs")["n"][0] == 0


def test_an_approval_with_an_edited_argument_makes_the_call_the_person_approved(
    store: Any, llm: LLMServer, deliveries: DeliveryServer
) -> None:
    request = asked_to_approve_paying_bob(llm, deliveries, "oa-edit", answer="done")
    request.approve(edit={"amount": 5}, resume=False)
    resumed = kx.resume("oa-edit")
    assert resumed.wait(30) == Status.COMPLETED
    assert [d["body"] for d in deliveries.deliveries] == [{"who": "bob", "amount": 5}]
    [sent] = [r for r in llm.requests if r["turn"] == 1]
    assert sent  # the model was told what was paid: the tool's answer, from the edited call
    [result] = kx.sql("SELECT result FROM effects WHERE run_id = 'oa-edit' AND tool = 'pay'")[
        "result"
    ]
    assert "paid bob 5" in result


def test_a_runs_options_are_its_own(store: Any, llm: LLMServer, deliveries: DeliveryServer) -> None:
    agent = payer(llm.base_url, deliveries.url)
    short = kx.openai_agents.start(agent, "pay bob 10 and ann 3", run_id="oa-short", max_turns=1)
    assert short.wait(30) == Status.FAILED
    other = kx.openai_agents.start(agent, "pay bob 10 and ann 3", run_id="oa-other")
    assert other.wait(30) == Status.COMPLETED  # the SDK's default, not the other run's 1


class Receipt(BaseModel):
    who: str
    amount: int
    at: datetime.datetime


def test_a_tool_returning_an_object_is_recorded_as_the_model_saw_it(
    store: Any, llm: LLMServer, deliveries: DeliveryServer
) -> None:
    @function_tool
    def pay(who: str, amount: int) -> Receipt:
        """Pay someone an amount of dollars."""
        if HOLD.holds(who):
            HOLD.wait_here()
        post_json(f"{deliveries.url}/pay/{who}", {"who": who, "amount": amount})
        return Receipt(who=who, amount=amount, at=datetime.datetime(2026, 1, 2, 3, 4))

    agent = payer(llm.base_url, deliveries.url).clone(tools=[pay])
    stopped_at(agent, "oa-object", who="ann")
    [bob] = kx.sql(
        "SELECT result FROM effects WHERE run_id = 'oa-object' AND tool = 'pay' ORDER BY step_key"
    )["result"][:1]
    assert "bob" in bob and "amount=10" in bob  # recorded as the model read it, not unknown
    resumed = kx.resume("oa-object")  # turn 2's request holds bob's receipt: it matches
    assert resumed.wait(30) == Status.COMPLETED, resumed.error
    assert paid(deliveries) == ["/pay/ann", "/pay/bob"]
    assert set(llm.per_turn().values()) == {1}


def test_a_tool_result_holding_nan_is_replayed_not_taken_for_a_masked_secret(
    store: Any, llm: LLMServer, deliveries: DeliveryServer
) -> None:
    @function_tool
    def pay(who: str, amount: int) -> dict[str, Any]:
        """Pay someone an amount of dollars."""
        if HOLD.holds(who):
            HOLD.wait_here()
        post_json(f"{deliveries.url}/pay/{who}", {"who": who, "amount": amount})
        return {"who": who, "fee": float("nan")}  # a computed value may well be NaN

    agent = payer(llm.base_url, deliveries.url).clone(tools=[pay])
    stopped_at(agent, "oa-nan", who="ann")
    resumed = kx.resume("oa-nan")  # bob's result, NaN and all, is replayed
    assert resumed.wait(30) == Status.COMPLETED, resumed.error
    assert paid(deliveries) == ["/pay/ann", "/pay/bob"]
