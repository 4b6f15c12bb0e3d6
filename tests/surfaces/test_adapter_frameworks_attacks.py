"""Pydantic AI and Anthropic runs where a promise of ``docs/frameworks.md`` does not hold yet.

Each test is the smallest run that shows one gap, against the real SDKs and a real DuckDB
store: a Pydantic AI agent answered by Pydantic AI's own ``FunctionModel`` (the script of the
model's answers, counted), an Anthropic client talking to the scripted model server on
127.0.0.1 (``support.llm_server``). They are marked ``xfail(strict=True)`` until the gap is
closed, so that the closing commit must remove the mark.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from anthropic import Anthropic
from pydantic_ai import Agent, RunContext
from pydantic_ai.exceptions import ApprovalRequired
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from support.clients import closed_after
from support.llm_server import LLMServer

import kernelext as kx

SECRET = "S3CRET-VALUE-" + "XYZ" * 3
CRASHED: set[str] = set()


def crash_once(tag: str) -> None:
    """A tool's first call in this process raises (a bug fixed before the resume)."""
    if tag not in CRASHED:
        CRASHED.add(tag)
        raise RuntimeError(f"{tag}: crashed once")


def scripted(*answers: ModelResponse, seen: list[str] | None = None) -> FunctionModel:
    """A model answering ``answers[i]`` once ``i`` tool results are in the conversation;
    ``seen`` collects every tool result and retry prompt the model was sent."""

    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        returned = [
            p for m in messages for p in m.parts if p.part_kind in ("tool-return", "retry-prompt")
        ]
        if seen is not None:
            seen[:] = [str(p.content) for p in returned]
        return answers[min(len(returned), len(answers) - 1)]

    return FunctionModel(answer)


def asks(tool: str, **arguments: Any) -> ModelResponse:
    return ModelResponse(parts=[ToolCallPart(tool, arguments, tool_call_id=f"call-{tool}")])


def says(text: str) -> ModelResponse:
    return ModelResponse(parts=[TextPart(text)])


@pytest.fixture
def llm() -> Iterator[LLMServer]:
    with LLMServer(script=[]) as server:
        yield server


def test_an_approved_edit_the_tool_refuses_never_reaches_the_model(store: Any) -> None:
    seen: list[str] = []
    paid: list[tuple[str, int]] = []
    agent = Agent(scripted(asks("pay", who="bob", amount=10), says("done"), seen=seen))

    @agent.tool_plain(requires_approval=True)
    def pay(who: str, amount: int) -> str:
        paid.append((who, amount))
        return "paid"

    kx.pydantic_ai.start(agent, "pay bob", run_id="edit").wait(timeout=30)
    resumed = next(iter(kx.approvals("edit"))).approve(edit={"amount": "lots"})
    assert resumed.wait(timeout=30) == "failed"
    assert not any("lots" in text for text in seen), seen
    assert paid == []
    assert isinstance(resumed.error, kx.LedgerError)
    assert "approved edit of pay does not fit" in str(resumed.error)
    assert "amount: Input should be a valid integer" in str(resumed.error)


def test_a_tool_result_with_a_secret_is_refused_clearly_on_resume(store: Any) -> None:
    kx.secrets.register(SECRET)
    agent = Agent(scripted(asks("token"), asks("later"), says("done")))

    @agent.tool_plain
    def token() -> str:
        return f"the token is {SECRET}"

    @agent.tool_plain
    def later() -> str:
        crash_once("secret-result")
        return "later"

    assert kx.pydantic_ai.start(agent, "go", run_id="sec").wait(timeout=30) == "failed"
    resumed = kx.resume("sec")
    resumed.wait(timeout=30)
    assert not isinstance(resumed.error, kx.EffectArgumentsMismatch), resumed.error
    assert "kx.secrets" in str(resumed.error)


def test_an_anthropic_tool_result_with_a_secret_is_refused_clearly(
    store: Any, llm: LLMServer
) -> None:
    kx.secrets.register(SECRET)
    llm.script[:] = [{"tool_calls": [{"name": "token", "arguments": {}}]}, {"content": "ok"}]
    client: Any = kx.anthropic(
        closed_after(Anthropic(base_url=llm.url, api_key="sk-ant-test-key", max_retries=0))
    )

    def token() -> str:
        """A token."""
        return SECRET

    tools = kx.tools(token)

    @kx.agent(name="anthropic-secret")
    def ask(run: kx.Run, question: str) -> str:
        messages: list[Any] = [{"role": "user", "content": question}]
        for turn in range(4):
            reply = client.messages.create(
                model="m", max_tokens=10, messages=messages, tools=tools.for_anthropic()
            )
            if turn == 1:
                crash_once("anthropic-secret")
            messages.append({"role": "assistant", "content": reply.content})
            if reply.stop_reason != "tool_use":
                return "".join(b.text for b in reply.content if b.type == "text")
            messages.append({"role": "user", "content": tools.call_all(reply)})
        return "too many turns"

    assert ask.start("go", run_id="asec").wait(timeout=30) == "failed"
    resumed = kx.resume("asec")
    resumed.wait(timeout=30)
    assert not isinstance(resumed.error, kx.EffectArgumentsMismatch), resumed.error
    assert "kx.secrets" in str(resumed.error)


def test_dynamic_instructions_do_not_block_a_resume(store: Any) -> None:
    day = {"n": 1}
    asked: list[int] = []

    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        asked.append(len(messages))
        done = any(p.part_kind == "tool-return" for m in messages for p in m.parts)
        return says("done") if done else asks("work")

    agent = Agent(FunctionModel(answer), instructions=lambda: f"Today is day {day['n']}.")

    @agent.tool_plain
    def work() -> str:
        crash_once("instructions")
        return "worked"

    assert kx.pydantic_ai.start(agent, "go", run_id="instr").wait(timeout=30) == "failed"
    day["n"] = 2  # the next day
    resumed = kx.resume("instr")
    resumed.wait(timeout=30)
    assert (str(resumed.status), resumed.result) == ("completed", "done"), resumed.error


def test_a_tool_that_raised_can_be_resumed_after_the_fix(store: Any) -> None:
    calls: list[int] = []
    agent = Agent(scripted(asks("work", n=1), says("done")))

    @agent.tool_plain
    def work(n: int) -> str:
        crash_once("raised")  # the bug, fixed before the resume
        calls.append(n)
        return "worked"

    assert kx.pydantic_ai.start(agent, "go", run_id="raised").wait(timeout=30) == "failed"
    resumed = kx.resume("raised")
    resumed.wait(timeout=30)
    assert str(resumed.status) in ("completed", "needs_decision"), resumed.error


def test_an_approval_asked_inside_a_pydantic_ai_tool_lets_the_call_through(store: Any) -> None:
    wired: list[int] = []

    @kx.effect(needs_approval=True)
    def wire(amount: int) -> str:
        wired.append(amount)
        return f"wired {amount}"

    agent = Agent(scripted(asks("transfer", amount=5), says("done")))

    @agent.tool_plain
    def transfer(amount: int) -> str:
        return wire(amount)

    assert kx.pydantic_ai.start(agent, "go", run_id="inner").wait(timeout=30) == "suspended"
    resumed = next(iter(kx.approvals("inner"))).approve()
    resumed.wait(timeout=30)
    assert (str(resumed.status), wired) == ("completed", [5])


def test_a_rejection_asked_inside_a_pydantic_ai_tool_is_told_to_the_model(store: Any) -> None:
    """As a rejected tool call of its own: the call is not made and the model is told."""
    wired: list[int] = []
    seen: list[str] = []

    @kx.effect(needs_approval=True)
    def wire(amount: int) -> str:
        wired.append(amount)
        return f"wired {amount}"

    agent = Agent(scripted(asks("transfer", amount=5), says("done"), seen=seen))

    @agent.tool_plain
    def transfer(amount: int) -> str:
        return wire(amount)

    assert kx.pydantic_ai.start(agent, "go", run_id="inner-no").wait(timeout=30) == "suspended"
    resumed = next(iter(kx.approvals("inner-no"))).reject(note="not today")
    assert resumed.wait(timeout=30) == "completed", resumed.error
    assert wired == []
    [told] = seen
    assert "A person rejected this call" in told and "not today" in told, told


def test_an_approval_asked_inside_a_kx_tools_function_lets_the_call_through(store: Any) -> None:
    wired: list[int] = []

    @kx.effect(needs_approval=True)
    def wire(amount: int) -> str:
        wired.append(amount)
        return f"wired {amount}"

    def send(amount: int) -> str:
        """Send an amount."""
        return wire(amount)

    tools = kx.tools(send)

    @kx.agent(name="tools-inner-approval")
    def answer(run: kx.Run, question: str) -> Any:
        return tools.call({"type": "tool_use", "id": "t1", "name": "send", "input": {"amount": 3}})

    assert answer.start("go", run_id="tinner").wait(timeout=30) == "suspended"
    resumed = next(iter(kx.approvals("tinner"))).approve()
    resumed.wait(timeout=30)
    assert (str(resumed.status), wired) == ("completed", [3])


def test_a_tool_raising_approval_required_is_asked_through_kernelext(store: Any) -> None:
    paid: list[int] = []
    agent = Agent(scripted(asks("pay", amount=500), says("done")))

    @agent.tool
    def pay(ctx: RunContext[None], amount: int) -> str:
        if amount > 100 and not ctx.tool_call_approved:
            raise ApprovalRequired()
        paid.append(amount)
        return "paid"

    assert kx.pydantic_ai.start(agent, "go", run_id="cond").wait(timeout=30) == "suspended"
    resumed = next(iter(kx.approvals("cond"))).approve()
    resumed.wait(timeout=30)
    assert (str(resumed.status), paid) == ("completed", [500])
