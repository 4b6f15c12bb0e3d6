"""Effects called inside a framework's tool call: each call is made once, and replayed.

A framework's tool call is recorded at a fixed place of its model turn (its call site), and
so is every ``@kx.effect`` its body calls. Two calls of one effect in one tool call (the same
arguments or others) are two calls: each is made once, gets a key of its own, and a resume
(after the tool raised once, a bug fixed) replays both instead of making either again. The
first call of each effect at a site keeps the key it always had (runs recorded before keep
resuming); a later call of the same effect there is keyed by its count at that site.

Against the real frameworks (Pydantic AI's ``FunctionModel``, the OpenAI Agents SDK with the
scripted model server, LangGraph) and a real DuckDB store.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypedDict

import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from support.llm_views import kernelext_show

import kernelext as kx
from kernelext._core.encoding.keys import call_text, effect_key, repeated_call
from kernelext._core.engine.context import current_run
from kernelext._core.process.runtime import runtime
from kernelext.status import EffectStatus

CRASHED: set[str] = set()
# Keys of run "pa-keys" as every release computed them: effect_key(run, "turn 1", tool, place).
PINNED = {
    ("work", 1): "e2e3156c-fafd-c163-e63d-444f70b6c597",
    ("note", 1): "84fa6101-2977-2058-f474-d497bd7639f2",
    ("note", 2): "befa23d8-f294-43a3-4ad3-0275defa95db",
}
OURS = ("1", "1 (2nd)", "2", "2 (2nd)")


def crash_once(tag: str) -> None:
    """A tool's first call in this process raises (a bug fixed before the resume)."""
    if tag not in CRASHED:
        CRASHED.add(tag)
        raise RuntimeError(f"{tag}: crashed once")


class Notes:
    """An effect ``note`` that counts the calls made (not replayed), and a tool body."""

    def __init__(self) -> None:
        self.made: list[int] = []
        self.lock = threading.Lock()

        @kx.effect
        def note(n: int) -> int:
            with self.lock:
                self.made.append(n)
            return n

        self.note = note

    def body(self, *ns: int, crash: str | None = None) -> Callable[[], str]:
        def work() -> str:
            out = [self.note(n) for n in ns]
            if crash is not None:
                crash_once(crash)
            return " ".join(map(str, out))

        return work


def ledger(run_id: str, tool: str = "note") -> list[dict[str, Any]]:
    rows = kx.sql(
        "SELECT key, step_key, call_ordinal, status, result FROM effects"
        " WHERE run_id = ? AND tool = ? ORDER BY intent_at",
        [run_id, tool],
    )
    return list(rows.to_dict("records"))


# -- Pydantic AI ----------------------------------------------------------------------------
def scripted(*answers: ModelResponse) -> FunctionModel:
    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        returned = [p for m in messages for p in m.parts if p.part_kind == "tool-return"]
        return answers[min(len(returned), len(answers) - 1)]

    return FunctionModel(answer)


def asks(*tools: str) -> ModelResponse:
    return ModelResponse(
        parts=[ToolCallPart(t, {}, tool_call_id=f"call-{i}") for i, t in enumerate(tools)]
    )


def says(text: str) -> ModelResponse:
    return ModelResponse(parts=[TextPart(text)])


@pytest.mark.parametrize("second", [1, 2])
def test_two_calls_of_one_effect_in_a_pydantic_ai_tool_are_both_made(
    store: Any, second: int
) -> None:
    notes = Notes()
    agent = Agent(scripted(asks("work"), says("done")))
    agent.tool_plain(name="work")(notes.body(1, second))
    handle = kx.pydantic_ai.start(agent, "go", run_id=f"pa-two-{second}")
    assert handle.wait(timeout=30) == "completed", handle.error
    assert notes.made == [1, second]
    rows = ledger(f"pa-two-{second}")
    assert len({r["key"] for r in rows}) == 2
    assert [r["status"] for r in rows] == [EffectStatus.APPLIED] * 2


def test_a_pydantic_ai_tool_resumed_after_it_raised_replays_both_calls(store: Any) -> None:
    notes = Notes()
    agent = Agent(scripted(asks("work"), says("done")))
    agent.tool_plain(name="work")(notes.body(1, 1, 2, crash="pa-crash"))
    assert kx.pydantic_ai.start(agent, "go", run_id="pa-crash").wait(timeout=30) == "failed"
    assert notes.made == [1, 1, 2]
    resumed = kx.resume("pa-crash")
    assert resumed.wait(timeout=30) == "completed", resumed.error
    assert notes.made == [1, 1, 2]  # replayed, none made again
    assert len({r["key"] for r in ledger("pa-crash")}) == 3


def test_awaited_calls_of_async_effects_in_an_async_tool_are_counted_by_name(
    store: Any,
) -> None:
    made: list[str] = []

    @kx.effect
    async def ping() -> str:
        made.append("ping")
        return "ping"

    @kx.effect
    async def note(n: int) -> int:
        made.append(str(n))
        return n

    agent = Agent(scripted(asks("work"), says("done")))

    @agent.tool_plain
    async def work() -> str:
        first = [await ping(), await note(1)]
        crash_once("pa-async")
        return f"{first} {await note(1)} {await note(2)}"

    assert kx.pydantic_ai.start(agent, "go", run_id="pa-async").wait(timeout=30) == "failed"
    resumed = kx.resume("pa-async")
    assert resumed.wait(timeout=30) == "completed", resumed.error
    assert made == ["ping", "1", "1", "2"]
    keys = [str(r["key"]) for r in ledger("pa-async")]
    assert len(set(keys)) == 3
    assert keys[0] == str(effect_key("pa-async", "turn 1", "note", 1))  # the first note's


def test_a_limited_effect_replayed_in_a_tool_call_waits_for_no_slot(store: Any) -> None:
    """Replays of recorded calls take no slot of their limit, inside a tool call too: the
    resume replays ``send`` without waiting an hour for the limit's next slot."""
    kx.limit("hourly", rate="1/h")
    sent: list[int] = []

    @kx.effect(limit="hourly")
    def send(n: int) -> int:
        sent.append(n)
        return n

    agent = Agent(scripted(asks("work"), says("done")))

    @agent.tool_plain
    def work() -> str:
        out = send(1)
        crash_once("pa-limit")
        return str(out)

    assert kx.pydantic_ai.start(agent, "go", run_id="pa-limit").wait(timeout=30) == "failed"
    resumed = kx.resume("pa-limit")
    assert resumed.wait(timeout=30) == "completed", resumed.error
    assert sent == [1]


def test_two_questions_and_two_calls_in_a_pydantic_ai_tool_are_each_asked_and_made_once(
    store: Any,
) -> None:
    """``run.ask`` in a tool's body is keyed by the turn's step (each question its own);
    the tool call is made again once answered and what it made before is replayed."""
    notes = Notes()
    agent = Agent(scripted(asks("work"), says("done")))

    @agent.tool_plain
    def work() -> str:
        run = current_run().facade  # the run, as the agent function's ``run``
        first = run.ask("first?", schema=str)
        notes.note(1)
        second = run.ask("second?", schema=str)
        notes.note(1)
        return f"{first} {second}"

    assert kx.pydantic_ai.start(agent, "go", run_id="pa-ask").wait(timeout=30) == "suspended"
    for answer, then in (("A", "suspended"), ("B", "completed")):
        resumed = kx.answer("pa-ask", answer)
        assert resumed is not None and resumed.wait(timeout=30) == then, resumed.error
    assert notes.made == [1, 1]
    asked = kx.sql("SELECT prompt, answer FROM questions WHERE run_id = 'pa-ask'")
    assert sorted(map(tuple, asked.to_numpy().tolist())) == [("first?", '"A"'), ("second?", '"B"')]
    assert len({r["key"] for r in ledger("pa-ask")}) == 2


def test_the_first_call_at_a_site_keeps_its_key_and_sites_never_share_one(
    store: Any, store_path: Path
) -> None:
    """Two tool calls of one answer, each calling ``note`` twice: four keys. The tool calls
    and the first ``note`` of each keep the keys they always had (turn, tool, place); the
    second ``note`` of each is keyed by its count at the site, and shown as such."""
    notes = Notes()
    agent = Agent(scripted(asks("work", "work"), says("done")))
    agent.tool_plain(name="work")(notes.body(7, 7))
    handle = kx.pydantic_ai.start(agent, "go", run_id="pa-keys")
    assert handle.wait(timeout=30) == "completed", handle.error
    assert notes.made == [7, 7, 7, 7]
    rows = ledger("pa-keys")
    keys = {str(r["key"]) for r in rows}
    assert str(effect_key("pa-keys", "turn 1", "work", 1)) == PINNED["work", 1]
    for place in (1, 2):  # as keyed before: effect_key(run, step, tool, place)
        assert str(effect_key("pa-keys", "turn 1", "note", place)) == PINNED["note", place]
        assert PINNED["note", place] in keys
        assert str(effect_key("pa-keys", "turn 1", "work", place)) in {
            str(r["key"]) for r in ledger("pa-keys", "work")
        }
        again = effect_key("pa-keys", "turn 1", "note", repeated_call(place, 1))
        assert str(again) in keys
    assert len(keys) == 4
    ordinals = sorted(int(r["call_ordinal"]) for r in rows)
    assert [call_text(o) for o in ordinals] == ["2 (2nd)", "1 (2nd)", "1", "2"]
    ticks = [t.title.splitlines()[0] for t in kx.timeline("pa-keys").ticks if t.tool == "note"]
    assert set(ticks) == {f"note [step 1 (turn 1)] call {c}: applied" for c in OURS}
    runtime().close()
    shown = kernelext_show("pa-keys", store_path)  # another process, from the store alone
    calls = re.findall(r"^note +1 +turn 1 +(\d+(?: \(2nd\))?) +applied", shown, re.M)
    assert sorted(calls) == sorted(OURS), shown


# -- OpenAI Agents SDK ------------------------------------------------------------------------
@pytest.fixture
def closing() -> Iterator[None]:
    yield
    from support.sdk_agents import close_clients

    close_clients()


@pytest.mark.parametrize("crash", [False, True])
def test_two_calls_of_one_effect_in_an_openai_agents_tool_are_both_made(
    store: Any, closing: None, crash: bool
) -> None:
    pytest.importorskip("agents")
    from agents import Agent as SDKAgent
    from agents import function_tool
    from support.llm_server import LLMServer
    from support.sdk_agents import model_for

    notes = Notes()
    body = notes.body(1, 1, 2, crash="oa-crash" if crash else None)
    run_id = f"oa-two-{crash}"

    def work() -> str:
        """Work."""
        return body()

    # What a tool raises reaches the model as text, unless the SDK is told otherwise.
    tool = function_tool(work, failure_error_function=None) if crash else function_tool(work)

    script = [{"tool_calls": [{"name": "work", "arguments": {}}]}, {"content": "done"}]
    with LLMServer(script=script) as llm:
        agent = SDKAgent(name="w", instructions="x", tools=[tool], model=model_for(llm.base_url))
        handle = kx.openai_agents.start(agent, "go", run_id=run_id)
        if crash:
            assert handle.wait(60) == "failed", handle.error
            assert notes.made == [1, 1, 2]
            handle = kx.resume(run_id)
        assert handle.wait(60) == "completed", handle.error
        assert set(llm.per_turn().values()) == {1}  # each turn asked once
    assert notes.made == [1, 1, 2]
    assert len({r["key"] for r in ledger(run_id)}) == 3


# -- LangGraph ----------------------------------------------------------------------------------
class Log(TypedDict):
    log: list[str]


@pytest.mark.parametrize("crash", [False, True])
def test_two_calls_of_one_effect_in_a_langgraph_tool_are_both_made(store: Any, crash: bool) -> None:
    pytest.importorskip("langgraph")
    from langgraph.graph import END, START, StateGraph

    from kernelext._adapters import langgraph as kx_langgraph

    notes = Notes()
    body = notes.body(1, 1, 2, crash="lg-crash" if crash else None)
    run_id = f"lg-two-{crash}"

    @kx_langgraph.tool(retry=True)  # a call that raised is made again on resume
    def work(what: str) -> str:
        """Work."""
        return body()

    def node(state: Log) -> Log:
        return {"log": [*state["log"], work("x")]}

    builder = StateGraph(Log)
    builder.add_node("node", node)
    builder.add_edge(START, "node")
    builder.add_edge("node", END)
    handle = kx_langgraph.start(builder.compile(), {"log": []}, run_id=run_id)
    if crash:
        assert handle.wait(30) == "failed", handle.error
        assert notes.made == [1, 1, 2]
        handle = kx.resume(run_id)
    assert handle.wait(30) == "completed", handle.error
    assert handle.result == {"log": ["1 1 2"]}
    assert notes.made == [1, 1, 2]
    assert len({r["key"] for r in ledger(run_id)}) == 3


# -- kx.tools --------------------------------------------------------------------------------
def test_two_calls_of_one_effect_in_a_kx_tools_function_are_both_made(store: Any) -> None:
    """In a ``@kx.agent`` the step counts its calls: the tool call and the calls its body
    makes are each keyed by their place in the step."""
    notes = Notes()
    tools = kx.tools(notes.body(1, 1, 2))

    @kx.agent(name="kt-two")
    def answer(run: kx.Run, question: str) -> Any:
        out = tools.call({"type": "tool_use", "id": "t1", "name": "work", "input": {}})
        crash_once("kt-two")
        return out["content"]

    assert answer.start("go", run_id="kt-two").wait(30) == "failed"
    resumed = kx.resume("kt-two")
    assert resumed.wait(30) == "completed", resumed.error
    assert (resumed.result, notes.made) == ("1 1 2", [1, 1, 2])
    assert len({r["key"] for r in ledger("kt-two")}) == 3


@pytest.mark.parametrize("crash", [False, True])
def test_a_kx_tools_function_called_in_a_framework_tool_makes_each_call_once(
    store: Any, crash: bool
) -> None:
    """A kx.tools function (recorded as an effect of its own name) inside a Pydantic AI tool
    call is made at that call's site, as are the effects its body calls."""
    notes = Notes()
    tools = kx.tools()
    tools.add(notes.body(1, 1, 2), name="lookup", description="Look up.")
    agent = Agent(scripted(asks("work"), says("done")))
    run_id = f"kt-pa-{crash}"

    @agent.tool_plain
    def work() -> str:
        first = tools.call({"type": "tool_use", "id": "a", "name": "lookup", "input": {}})
        again = tools.call({"type": "tool_use", "id": "b", "name": "lookup", "input": {}})
        if crash:
            crash_once(run_id)
        return f"{first['content']} / {again['content']}"

    handle = kx.pydantic_ai.start(agent, "go", run_id=run_id)
    if crash:  # the tool call is made again on resume: what it made before is replayed
        assert handle.wait(timeout=30) == "failed"
        assert notes.made == [1, 1, 2, 1, 1, 2]
        handle = kx.resume(run_id)
    assert handle.wait(timeout=30) == "completed", handle.error
    assert notes.made == [1, 1, 2, 1, 1, 2]
    assert len({r["key"] for r in ledger(run_id)}) == 6
    assert len({r["key"] for r in ledger(run_id, "lookup")}) == 2
