"""The agent-framework adapters under attack, third round: what each run shows broken.

Each test is the smallest real run that shows one promise of ``docs/frameworks.md`` (issue 34)
not kept: the frameworks' own scripted models (Pydantic AI's ``FunctionModel``, an Agents SDK
``Model``) or the local model server, the local delivery server counting what a tool sent, a
real DuckDB store. They are expected to fail until the adapters are fixed.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agents import (
    Agent as SdkAgent,
)
from agents import (
    Model,
    ModelResponse,
    Usage,
    function_tool,
    set_tracing_disabled,
)
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, TextPart, ToolCallPart
from pydantic_ai.messages import ModelResponse as PaiResponse
from pydantic_ai.models.function import AgentInfo, FunctionModel
from support import llm_server
from support.clients import closed_after
from support.http_server import DeliveryServer, post_json
from support.live import wait_until
from support.llm_server import LLMServer

import kernelext as kx

set_tracing_disabled(True)  # the SDK would send its traces to a server of its own
TESTS = Path(__file__).resolve().parents[1]


# -- scripted models ------------------------------------------------------------------------
def answers(*replies: list[Any], hold: threading.Event | None = None) -> FunctionModel:
    """A Pydantic AI model answering its request ``n`` with ``replies[n]``: each item a tool
    call ``(name, args)`` or a text; with ``hold``, the second request waits until it is set."""

    async def reply(messages: list[ModelMessage], info: AgentInfo) -> PaiResponse:
        n = sum(1 for m in messages if isinstance(m, PaiResponse))
        while n == 1 and hold is not None and not hold.is_set():
            await _tick()
        parts: list[Any] = []
        for i, item in enumerate(replies[n]):
            if isinstance(item, tuple):
                parts.append(ToolCallPart(item[0], item[1], tool_call_id=f"c{n}-{i}"))
            else:
                parts.append(TextPart(item))
        return PaiResponse(parts=parts)

    return FunctionModel(reply)


async def _tick() -> None:
    import asyncio

    await asyncio.sleep(0.01)


class SdkScript(Model):
    """An Agents SDK model: a call of ``pay(who=bob)`` first (unless ``pays`` is false), then
    the text ``done``; with ``hold``, that answer waits until it is set."""

    def __init__(self, *, pays: bool = True, hold: threading.Event | None = None) -> None:
        self.pays, self.hold = pays, hold
        self.asked = 0

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        self.asked += 1
        items: list[Any]
        if self.pays and self.asked == 1:
            items = [
                ResponseFunctionToolCall(
                    type="function_call", call_id="call_1", name="pay",
                    arguments='{"who": "bob"}', id="fc_1",
                )
            ]  # fmt: skip
        else:
            while self.hold is not None and not self.hold.is_set():
                await _tick()
            text = ResponseOutputText(type="output_text", text="done", annotations=[])
            items = [
                ResponseOutputMessage(
                    id="m", type="message", role="assistant", status="completed", content=[text]
                )
            ]
        return ModelResponse(output=items, usage=Usage(), response_id=f"r{self.asked}")

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("these runs are not streamed")


def sdk_pay(*, needs_approval: bool = False) -> Any:
    """The Agents SDK's ``pay`` tool."""

    def pay(who: str) -> str:
        """Pay someone."""
        return f"paid {who}"

    return function_tool(pay, needs_approval=needs_approval)


def effect_rows(run_id: str) -> list[tuple[str, str, int, str]]:
    frame = kx.sql(
        "SELECT step_key, tool, call_ordinal, status FROM effects WHERE run_id = ? "
        "ORDER BY step_key, call_ordinal",
        params=[run_id],
    )
    return [tuple(row) for row in frame.itertuples(index=False)]  # type: ignore[misc]


def _subprocess(code: str, store_path: Any) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KERNELEXT_STORE": str(store_path), "KERNELEXT_STORE_WAIT": "120"}
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=180
    )


# -- 1. a tool that raised after its request left is sent again by the resume ---------------
@pytest.mark.parametrize("framework", ["pydantic_ai", "openai_agents"])
def test_tool_that_raised_after_its_request_left_is_not_sent_again_on_resume(
    store: Any, delivery_server: DeliveryServer, framework: str
) -> None:
    """A framework tool call is an ``Effect(retry=True)``: a tool that raised its own
    exception after its POST reached the server may have acted, so the resume leaves it to
    kx.reconcile instead of sending it again (an Agents SDK tool raises through the run with
    ``failure_error_function=None``)."""
    broken = [True]
    run_id = f"raised-after-send-{framework}"

    def pay(who: str) -> str:
        """Pay someone."""
        post_json(f"{delivery_server.url}/pay/{who}", {"who": who})
        if broken[0]:
            raise KeyError("status")  # reading the answer failed: the payment went out
        return "paid"

    if framework == "pydantic_ai":
        agent = Agent(answers([("pay", {"who": "bob"})], ["done"]), name="raiser")
        agent.tool_plain(pay)
        h = kx.pydantic_ai.start(agent, "pay bob", run_id=run_id)
    else:
        tools = [function_tool(pay, failure_error_function=None)]
        sdk_agent = SdkAgent(name="raiser", instructions="Pay.", tools=tools, model=SdkScript())
        h = kx.openai_agents.start(sdk_agent, "pay bob", run_id=run_id)
    assert h.wait(30) == "failed"
    broken[0] = False  # the code fix
    if framework == "pydantic_ai":
        kx.pydantic_ai.agent(agent)
    else:
        kx.openai_agents.agent(sdk_agent)
    again = kx.resume(run_id)
    assert again.wait(30) == "needs_decision", again.error_text()
    assert delivery_server.count() == 1
    (unknown,) = kx.reconcile(run_id)
    assert unknown.tool == "pay"


def test_tool_that_raised_before_it_sent_is_made_again_on_resume(
    store: Any, delivery_server: DeliveryServer
) -> None:
    """The same tool raising before its request left: nothing went out, so the resume makes
    the call again and the run completes."""
    broken = [True]
    agent = Agent(answers([("pay", {"who": "bob"})], ["done"]), name="early")

    @agent.tool_plain
    def pay(who: str) -> str:
        """Pay someone."""
        if broken[0]:
            raise KeyError("account")  # before anything was sent
        post_json(f"{delivery_server.url}/pay/{who}", {"who": who})
        return "paid"

    h = kx.pydantic_ai.start(agent, "pay bob", run_id="raised-before-send")
    assert h.wait(30) == "failed"
    broken[0] = False
    kx.pydantic_ai.agent(agent)
    again = kx.resume("raised-before-send")
    assert again.wait(30) == "completed", again.error_text()
    assert delivery_server.count() == 1


# -- 2. a model turn decided "it happened" without its answer breaks the run ----------------
@pytest.mark.parametrize("framework", ["pydantic_ai", "openai_agents"])
def test_model_turn_marked_applied_without_its_answer_is_asked_again(
    store: Any, framework: str
) -> None:
    hold = threading.Event()
    run_id = f"cut-turn-{framework}"
    if framework == "pydantic_ai":
        agent = Agent(answers([("pay", {"who": "bob"})], ["done"], hold=hold), name="cut")

        @agent.tool_plain
        def pay(who: str) -> str:
            """Pay someone."""
            return f"paid {who}"

        h = kx.pydantic_ai.start(agent, "pay bob", run_id=run_id)
    else:
        model = SdkScript(hold=hold)
        sdk_agent = SdkAgent(name="cut", instructions="Pay.", tools=[sdk_pay()], model=model)
        h = kx.openai_agents.start(sdk_agent, "pay bob", run_id=run_id)
    wait_until(lambda: len(effect_rows(run_id)) == 3, "the second turn to be asked")
    h.force_stop(cut_calls=True)
    h.wait(30)
    (unknown,) = kx.reconcile(run_id)
    unknown.mark_applied()  # "the model got it", as the server's log says; no answer known
    hold.set()
    again = kx.resume(run_id)
    assert again.wait(30) == "completed", again.error_text()
    assert again.result == "done"


# -- 3. two starts of one run id: the run takes the losing start's options ------------------
def test_concurrent_starts_of_one_run_id_run_with_the_winners_options(store: Any) -> None:
    seen: dict[str, list[str]] = {}

    def instructions(ctx: Any, agent: Any) -> str:
        seen.setdefault(ctx.context["run"], []).append(ctx.context["by"])
        return "Answer."

    mixed = []
    for attempt in range(12):
        run_id = f"twice-{attempt}"
        agent = SdkAgent(name="twice", instructions=instructions, model=SdkScript(pays=False))
        winner, handle = _started_twice(agent, run_id)
        handle.wait(30)
        if seen[run_id] != [winner]:
            mixed.append((winner, seen[run_id]))
    assert mixed == []


def test_concurrent_pydantic_ai_starts_run_with_the_winners_deps(store: Any) -> None:
    seen: dict[str, list[str]] = {}
    mixed = []
    for attempt in range(12):
        run_id = f"twice-pai-{attempt}"
        agent = Agent(answers(["done"]), name="twice", deps_type=dict)

        @agent.instructions
        def instructions(ctx: Any) -> str:
            seen.setdefault(ctx.deps["run"], []).append(ctx.deps["by"])
            return "Answer."

        winner, handle = _started_twice(agent, run_id, pydantic_ai=True)
        handle.wait(30)
        if seen[run_id] != [winner]:
            mixed.append((winner, seen[run_id]))
    assert mixed == []


def _started_twice(agent: Any, run_id: str, *, pydantic_ai: bool = False) -> tuple[str, Any]:
    """``start`` called by two threads at once (A and B) with their own context: the one
    that started the run, and its handle (the other got RunStateError)."""
    started: dict[str, Any] = {}
    barrier = threading.Barrier(2)

    def start(by: str) -> None:
        barrier.wait()
        context = {"by": by, "run": run_id}
        with contextlib.suppress(kx.RunStateError):
            if pydantic_ai:
                started[by] = kx.pydantic_ai.start(agent, "hi", run_id=run_id, deps=context)
            else:
                started[by] = kx.openai_agents.start(agent, "hi", run_id=run_id, context=context)

    threads = [threading.Thread(target=start, args=(by,)) for by in ("A", "B")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    ((winner, handle),) = started.items()
    return winner, handle


# -- 4. the handle start() returned goes stale once an approval resumes the run here --------
def test_handle_from_start_gives_the_result_after_an_approval_resumes_the_run(
    store: Any,
) -> None:
    agent = Agent(answers([("pay", {"who": "bob"})], ["done"]), name="approved")

    @agent.tool_plain(requires_approval=True)
    def pay(who: str) -> str:
        """Pay someone."""
        time.sleep(0.5)
        return f"paid {who}"

    h = kx.pydantic_ai.start(agent, "pay bob", run_id="approved-here")
    assert h.wait(30) == "suspended"
    kx.approvals("approved-here")[0].approve(note="ok")
    assert h.wait(30) == "completed"
    assert h.result == "done"


# -- 5. kx.anthropic's tokens and cost leave out the prompt read from or written to the cache -
@pytest.fixture
def cached_anthropic(monkeypatch: pytest.MonkeyPatch) -> Iterator[LLMServer]:
    """The model server, its Anthropic answers reporting a cached prompt as Anthropic does:
    ``input_tokens`` only the uncached part, the rest in ``cache_*_input_tokens``."""
    plain = llm_server.messages

    def cached(owner: Any, body: dict[str, Any], headers: Any) -> tuple[list[Any], Any]:
        events, message = plain(owner, body, headers)
        usage = {"cache_read_input_tokens": 9000, "cache_creation_input_tokens": 1000}
        message["usage"].update(usage)
        start = json.loads(events[0][1])
        start["message"]["usage"].update(usage)
        return [(events[0][0], json.dumps(start)), *events[1:]], message

    monkeypatch.setattr(llm_server, "messages", cached)
    with LLMServer(script=[{"content": "hello"}]) as server:
        yield server


def test_anthropic_tokens_count_the_cached_prompt(store: Any, cached_anthropic: LLMServer) -> None:
    from anthropic import Anthropic

    wrapped = closed_after(Anthropic(base_url=cached_anthropic.url, api_key="sk-ant-" + "k" * 24))
    client = kx.anthropic(wrapped, prices={"claude-x": (3.0, 15.0)})
    system = [{"type": "text", "text": "Long rules. " * 10, "cache_control": {"type": "ephemeral"}}]

    @kx.agent(name="cached_prompt")
    def cached_prompt(run: kx.Run) -> str:
        reply = client.messages.create(
            model="claude-x", max_tokens=50, system=system,
            messages=[{"role": "user", "content": "hi"}],
        )  # fmt: skip
        return str(reply.content[0].text)

    h = cached_prompt.start(run_id="cached-prompt")
    assert h.wait(30) == "completed"
    wrapped.close()
    shown = re.search(r"\(([\d,]+) prompt", h.text_summary())
    assert shown is not None, h.text_summary()
    assert int(shown.group(1).replace(",", "")) >= 10_000
    # 4 x $3 + 1,000 written x $3.75 + 9,000 read x $0.30 + 2 x $15, per million tokens
    assert h.text_summary().endswith("· $0.0065"), h.text_summary()


# -- 6. a tool's own argument named idempotency_key is replaced by the ledger's --------------
def test_tool_argument_named_idempotency_key_reaches_the_tool_as_the_model_gave_it(
    store: Any,
) -> None:
    got: list[str] = []
    call = ("charge", {"amount": 10, "idempotency_key": "order-42"})
    agent = Agent(answers([call], ["done"]), name="charger")

    @agent.tool_plain
    def charge(amount: int, idempotency_key: str) -> str:
        """Charge an order once: the payment API dedupes on the order's key."""
        got.append(idempotency_key)
        return "charged"

    assert kx.pydantic_ai.start(agent, "charge", run_id="own-key").wait(30) == "completed"
    assert got == ["order-42"]


class SdkCharge(SdkScript):
    """An Agents SDK model: a call of ``charge`` with the order's own key, then ``done``."""

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        if self.asked:
            return await super().get_response(*args, **kwargs)
        self.asked += 1
        call = ResponseFunctionToolCall(
            type="function_call", call_id="call_1", name="charge", id="fc_1",
            arguments='{"amount": 10, "idempotency_key": "order-42"}',
        )  # fmt: skip
        return ModelResponse(output=[call], usage=Usage(), response_id="r1")


def test_agents_sdk_tool_argument_named_idempotency_key_is_the_models(store: Any) -> None:
    got: list[str] = []

    def charge(amount: int, idempotency_key: str) -> str:
        """Charge an order once."""
        got.append(idempotency_key)
        return "charged"

    agent = SdkAgent(name="charger", tools=[function_tool(charge)], model=SdkCharge(pays=False))
    assert kx.openai_agents.start(agent, "charge", run_id="sdk-own-key").wait(30) == "completed"
    assert got == ["order-42"]


def test_langchain_tool_showing_idempotency_key_gets_the_models_value(store: Any) -> None:
    from langchain_core.tools import tool as langchain_tool

    got: list[str] = []

    @langchain_tool
    def charge(amount: int, idempotency_key: str) -> str:
        """Charge an order once."""
        got.append(idempotency_key)
        return "charged"

    @kx.effect
    def ship(order: str, *, idempotency_key: str | None = None) -> str:
        got.append(str(idempotency_key))
        return "shipped"

    recorded, shipped = kx.langgraph.tool(charge), kx.langgraph.tool(ship.fn)

    @kx.agent(name="lc_charger")
    def charger(run: kx.Run) -> str:
        recorded.invoke({"amount": 10, "idempotency_key": "order-42"})
        return str(shipped.invoke({"order": "o-1"}))

    assert charger.start(run_id="lc-own-key").wait(30) == "completed"
    assert got[0] == "order-42"
    assert str(uuid.UUID(got[1])) == got[1]  # a tool the model is not shown it: kernelext's


# -- 7. Force stop cuts a framework's tool call at once, and the tool goes on unrecorded -----
def test_force_stop_waits_for_a_framework_tool_call_in_flight(
    store: Any, delivery_server: DeliveryServer
) -> None:
    reached, release = threading.Event(), threading.Event()
    agent = Agent(answers([("pay", {"who": "bob"})], ["done"]), name="forced")

    @agent.tool_plain
    def pay(who: str) -> str:
        """Pay someone."""
        reached.set()
        release.wait(30)
        post_json(f"{delivery_server.url}/pay/{who}", {"who": who})
        return "paid"

    h = kx.pydantic_ai.start(agent, "pay bob", run_id="forced-tool")
    assert reached.wait(30)
    threading.Timer(0.5, release.set).start()  # returns well within the grace (10 s)
    h.force_stop()
    h.wait(30)
    wait_until(lambda: delivery_server.count() == 1, "the payment to be sent")
    assert dict((tool, status) for _, tool, _, status in effect_rows("forced-tool"))["pay"] == (
        "applied"
    )


def test_force_stop_waits_for_an_agents_sdk_tool_call_in_flight(
    store: Any, delivery_server: DeliveryServer
) -> None:
    reached, release = threading.Event(), threading.Event()

    def pay(who: str) -> str:
        """Pay someone."""
        reached.set()
        release.wait(30)
        post_json(f"{delivery_server.url}/pay/{who}", {"who": who})
        return f"paid {who}"

    agent = SdkAgent(
        name="forced", instructions="Pay.", tools=[function_tool(pay)], model=SdkScript()
    )
    h = kx.openai_agents.start(agent, "pay bob", run_id="forced-sdk-tool")
    assert reached.wait(30)
    threading.Timer(0.5, release.set).start()  # returns well within the grace (10 s)
    h.force_stop()
    assert h.wait(30) == "suspended"
    assert delivery_server.count() == 1  # sent before the run ended, not after
    assert dict((tool, status) for _, tool, _, status in effect_rows("forced-sdk-tool"))["pay"] == (
        "applied"
    )


# -- 8. resuming in a new process without the agent names a decorator the user never wrote --
def test_resume_without_the_agent_names_how_to_hand_it_over(store: Any, store_path: Any) -> None:
    tools = [sdk_pay(needs_approval=True)]
    agent = SdkAgent(name="away", instructions="Pay.", tools=tools, model=SdkScript())
    assert kx.openai_agents.start(agent, "pay bob", run_id="away").wait(30) == "suspended"
    code = (
        "import kernelext as kx, os\n"
        "kx.open_store(os.environ['KERNELEXT_STORE'])\n"
        "try:\n    kx.resume('away')\n"
        "except kx.AgentError as exc:\n    print(exc)\n"
    )
    out = _subprocess(code, store_path)
    assert "belongs to agent" in out.stdout, out.stderr[-2000:]
    assert "kx.openai_agents.agent(agent)" in out.stdout
    assert "@kx.agent" not in out.stdout


@pytest.mark.parametrize(
    ("agent", "call"),
    [
        ("pydantic_ai:helper", "kx.pydantic_ai.agent(agent)"),
        ("langgraph:LangGraph", "kx.langgraph.agent(graph)"),
        ("mine", "@kx.agent(name='mine')"),
    ],
)
def test_unknown_agent_names_the_call_that_defines_it(agent: str, call: str) -> None:
    from kernelext._core.plan.code import how_to_define

    assert call in how_to_define(agent)


# -- 9. a Pydantic AI output function is not recorded: a crash after it sent sends again -----
OUTPUT_FUNCTION_RUN = """
import os, signal, sys
import kernelext as kx
from pydantic_ai import Agent
from pydantic_ai.messages import ModelResponse, ToolCallPart
from pydantic_ai.models.function import FunctionModel
from support.http_server import post_json

verb, url = sys.argv[1], sys.argv[2]
kx.open_store(os.environ["KERNELEXT_STORE"])

def submit(who: str) -> str:
    \"\"\"Submit the payment order: the run's final output.\"\"\"
    post_json(url + "/submit/" + who, {"who": who})
    if verb == "start":
        os.kill(os.getpid(), signal.SIGKILL)  # the kernel dies right after it sent
    return "submitted " + who

def model(messages, info):
    return ModelResponse(parts=[ToolCallPart(info.output_tools[0].name, {"who": "bob"})])

agent = Agent(FunctionModel(model), name="submitter", output_type=submit)
if verb == "start":
    kx.pydantic_ai.start(agent, "submit", run_id="submitted").wait(60)
else:
    kx.pydantic_ai.agent(agent)
    print(kx.resume("submitted").wait(60))
"""


@pytest.mark.crash
def test_output_function_killed_after_it_sent_is_not_sent_again(
    store: Any, store_path: Any, delivery_server: DeliveryServer
) -> None:
    from kernelext._core.process.runtime import runtime

    runtime().close()  # the processes below are the kernels
    for verb in ("start", "resume"):
        _subprocess_argv(OUTPUT_FUNCTION_RUN, store_path, verb, delivery_server.url)
    assert delivery_server.count() == 1


def _subprocess_argv(code: str, store_path: Any, *argv: str) -> None:
    env = {**os.environ, "KERNELEXT_STORE": str(store_path), "KERNELEXT_STORE_WAIT": "120"}
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")])
    subprocess.run([sys.executable, "-c", code, *argv], env=env, timeout=180, check=False)


def test_output_function_is_an_effect_of_its_turn(store: Any) -> None:
    """An output function's call is recorded as a tool call is: an effect of its name, keyed
    by its turn and its place among the answer's calls, applied once."""
    made: list[str] = []

    def submit(who: str) -> str:
        """Submit the payment order: the run's final output."""
        made.append(who)
        return "submitted " + who

    def model(messages: list[ModelMessage], info: AgentInfo) -> PaiResponse:
        call = ToolCallPart(info.output_tools[0].name, {"who": "bob"}, tool_call_id="o1")
        return PaiResponse(parts=[call])

    agent = Agent(FunctionModel(model), name="submits", output_type=submit)
    h = kx.pydantic_ai.start(agent, "submit", run_id="output-effect")
    assert h.wait(30) == "completed", h.error_text()
    assert h.result == "submitted bob" and made == ["bob"]
    assert ("turn 1", "submit", 1, "applied") in effect_rows("output-effect")
