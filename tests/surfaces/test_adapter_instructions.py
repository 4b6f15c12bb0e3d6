"""A model turn is its conversation: instructions that changed since a turn was recorded
(today's date in the system prompt) do not block the resume, and are noted; a conversation
that changed is refused.

Each adapter that records model turns, against the real SDKs: ``kx.anthropic`` (``system=``),
``kx.openai`` (a chat ``system`` message, the Responses API's ``instructions=``), the OpenAI
Agents SDK (an agent's ``instructions`` as a function) and Pydantic AI (a dynamic system
prompt), the models answering from the scripted server on 127.0.0.1 (``support.llm_server``)
or Pydantic AI's ``FunctionModel``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from agents import Agent as SdkAgent
from agents import function_tool
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from support.agent_parts import close_clients
from support.llm_server import LLMServer
from support.model_loops import LOOPS
from support.sdk_agents import model_for

import kernelext as kx
from kernelext._adapters.asked_again import INSTRUCTIONS_CHANGED
from kernelext._adapters.model_call import ModelCall

SCRIPT = [{"tool_calls": [{"name": "work", "arguments": {}}]}, {"content": "done"}]
CRASHED: set[str] = set()


def crash_once(tag: str) -> None:
    """The first call in this process raises (a bug fixed before the resume)."""
    if tag not in CRASHED:
        CRASHED.add(tag)
        raise RuntimeError(f"{tag}: crashed once")


@pytest.fixture
def llm() -> Iterator[LLMServer]:
    with LLMServer(script=list(SCRIPT)) as server:
        yield server
    close_clients()


def noted(handle: kx.Handle) -> list[str]:
    return [str(e["reason"]) for e in handle.events() if e["kind"] == INSTRUCTIONS_CHANGED]


def first_turn_args(run_id: str) -> str:
    return str(
        kx.sql(
            "SELECT args FROM effects WHERE run_id = ? AND call_ordinal = 0 "
            "ORDER BY intent_at LIMIT 1",
            params=[run_id],
        ).iloc[0, 0]
    )


# -- the loops users write with kx.openai and kx.anthropic (support.model_loops) ----------
def work() -> str:
    """Do the work."""
    return "worked"


def crash_after_the_second_turn(turn: int) -> None:
    if turn == 1:
        crash_once("loop")  # a bug, fixed before the resume


def crashing_agent(
    llm: LLMServer, shape: str, name: str, system: Callable[[], str], question: Callable[[], str]
) -> kx.Agent:
    """The agent ``name``: the ``shape`` loop (``LOOPS``) with the tool ``work``, its system
    prompt and question as ``system()`` and ``question()`` give them; it crashes once, after
    the model's second answer."""
    CRASHED.discard("loop")
    loop = LOOPS[shape](llm, kx.tools(work), system, question, crash_after_the_second_turn)
    return kx.agent(name=name)(loop)


@pytest.mark.parametrize("shape", sorted(LOOPS))
def test_a_system_prompt_of_another_day_replays_the_turn_and_is_noted(
    store: Any, llm: LLMServer, shape: str
) -> None:
    day = {"n": 1}
    agent = crashing_agent(
        llm, shape, f"instructions-{shape}", lambda: f"Today is day {day['n']}.", lambda: "go"
    )

    assert agent.start("go", run_id=f"day-{shape}").wait(timeout=30) == "failed"
    day["n"] = 2  # the next day
    resumed = kx.resume(f"day-{shape}")
    resumed.wait(timeout=30)

    assert (str(resumed.status), resumed.result) == ("completed", "done"), resumed.error
    assert set(llm.per_turn().values()) == {1}  # no turn asked twice
    assert len(noted(resumed)) == 1, noted(resumed)
    assert "Today is day 1." in first_turn_args(f"day-{shape}")  # what the model was told


@pytest.mark.parametrize("shape", sorted(LOOPS))
def test_a_conversation_that_changed_is_still_refused(
    store: Any, llm: LLMServer, shape: str
) -> None:
    day = {"n": 1}
    agent = crashing_agent(
        llm, shape, f"conversation-{shape}", lambda: "Be brief.", lambda: f"go, on day {day['n']}"
    )

    assert agent.start("go", run_id=f"talk-{shape}").wait(timeout=30) == "failed"
    day["n"] = 2
    resumed = kx.resume(f"talk-{shape}")
    resumed.wait(timeout=30)

    assert isinstance(resumed.error, kx.EffectArgumentsMismatch), resumed.error
    assert noted(resumed) == []


# -- agent frameworks -----------------------------------------------------------------------
@pytest.mark.parametrize("streamed", [False, True], ids=["Runner.run", "on_event"])
def test_an_agents_sdk_agent_whose_instructions_are_of_the_day_is_resumed(
    store: Any, llm: LLMServer, streamed: bool
) -> None:
    day = {"n": 1}
    CRASHED.discard("sdk")
    events: list[Any] = []
    options: dict[str, Any] = {"on_event": events.append} if streamed else {}

    @function_tool(failure_error_function=None)
    def work() -> str:
        """Do the work."""
        crash_once("sdk")
        return "worked"

    def instructions(ctx: Any, agent: Any) -> str:
        return f"Today is day {day['n']}."

    agent = SdkAgent(
        name="dated", instructions=instructions, tools=[work], model=model_for(llm.base_url)
    )
    started = kx.openai_agents.start(agent, "go", run_id="sdk-day", **options)
    assert started.wait(timeout=30) == "failed"
    day["n"] = 2
    resumed = kx.resume("sdk-day")
    resumed.wait(timeout=30)

    assert (str(resumed.status), resumed.result) == ("completed", "done"), resumed.error
    assert len(noted(resumed)) == 1
    assert json.loads(first_turn_args("sdk-day"))["instructions"] == "Today is day 1."
    assert bool(events) == streamed


def test_an_agents_sdk_agent_built_with_the_day_in_its_text_is_resumed(
    store: Any, llm: LLMServer
) -> None:
    CRASHED.discard("sdk-text")

    @function_tool(failure_error_function=None)
    def work() -> str:
        """Do the work."""
        crash_once("sdk-text")
        return "worked"

    def build(day: int) -> Any:
        return SdkAgent(
            name="dated-text", instructions=f"Today is day {day}.", tools=[work],
            model=model_for(llm.base_url),
        )  # fmt: skip

    assert kx.openai_agents.start(build(1), "go", run_id="sdk-text").wait(timeout=30) == "failed"
    kx.openai_agents.agent(build(2))  # the agent built again, the next day
    resumed = kx.resume("sdk-text")
    resumed.wait(timeout=30)

    assert (str(resumed.status), resumed.result) == ("completed", "done"), resumed.error


def test_a_pydantic_ai_dynamic_system_prompt_is_asked_again_and_noted(store: Any) -> None:
    day = {"n": 1}
    CRASHED.discard("pai")
    told: list[str] = []

    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        told[:] = [
            str(p.content) for m in messages for p in m.parts if p.part_kind == "system-prompt"
        ]
        if any(p.part_kind == "tool-return" for m in messages for p in m.parts):
            return ModelResponse(parts=[TextPart("done")])
        return ModelResponse(parts=[ToolCallPart("work", {}, tool_call_id="c1")])

    agent = Agent(FunctionModel(answer))

    @agent.system_prompt(dynamic=True)
    def today() -> str:
        return f"Today is day {day['n']}."

    @agent.tool_plain
    def work() -> str:
        crash_once("pai")
        return "worked"

    assert kx.pydantic_ai.start(agent, "go", run_id="pai-day").wait(timeout=30) == "failed"
    day["n"] = 2
    resumed = kx.resume("pai-day")
    resumed.wait(timeout=30)

    assert (str(resumed.status), resumed.result) == ("completed", "done"), resumed.error
    assert told == ["Today is day 2."]  # the turn asked now is told today's
    assert len(noted(resumed)) == 1
    assert "Today is day 1." in first_turn_args("pai-day")


def test_a_kx_openai_run_recorded_by_the_earlier_release_is_resumed(
    store: Any, llm: LLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """0.1.0 identified a model call by its whole request, system message included."""
    agent = crashing_agent(llm, "chat", "recorded-before", lambda: "Be brief.", lambda: "go")
    with monkeypatch.context() as before:
        before.setattr(ModelCall, "split", lambda self, named: (dict(named), None))
        assert agent.start("go", run_id="before").wait(timeout=30) == "failed"
    resumed = kx.resume("before")
    resumed.wait(timeout=30)

    assert (str(resumed.status), resumed.result) == ("completed", "done"), resumed.error
    assert set(llm.per_turn().values()) == {1}
    assert noted(resumed) == []
