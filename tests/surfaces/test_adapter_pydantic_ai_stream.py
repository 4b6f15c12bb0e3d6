"""``kx.pydantic_ai.start(..., event_stream_handler=...)``: a streamed run, stopped and resumed.

The model is Pydantic AI's own ``OpenAIChatModel`` pointed at ``support.llm_server.LLMServer``
on 127.0.0.1, which streams chat completions (a chunk per word, tool calls in pieces) and
counts the requests of every conversation turn; ``pay`` POSTs to the local
``DeliveryServer``, which counts payments. A request is streamed to the handler and recorded
as its final ``ModelResponse``, so a run recorded streamed resumes unstreamed and the other way
round; a replayed request gives the handler its recorded parts.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterable
from typing import Any

import pytest
from pydantic_ai import (
    FunctionToolCallEvent,
    FunctionToolResultEvent,
    PartDeltaEvent,
    PartEndEvent,
    PartStartEvent,
    TextPart,
    TextPartDelta,
    ToolCallPart,
)
from support.agent_fixtures import (
    PROMPT,
    ledger,
    paid,
    resumed_to_the_answer,
    stopped_at_pay,
    streamed,
)
from support.http_server import DeliveryServer
from support.llm_server import LLMServer
from support.llm_views import no_prices  # noqa: F401 - autouse: no prices left over
from support.pydantic_agents import PAY_SCRIPT, payer

import kernelext as kx
from kernelext._adapters.pydantic_ai import MODEL_TOOL
from kernelext.status import EffectStatus, Status

pytestmark = pytest.mark.usefixtures("released_hold")  # a held pay let go after each test
LLM_SCRIPT = PAY_SCRIPT  # what the llm fixture's model server answers

ANSWER = "paid bob 10 and ann 3"


class Seen:
    """An ``event_stream_handler`` that keeps every event it is given."""

    def __init__(self) -> None:
        self.events: list[Any] = []

    async def __call__(self, ctx: Any, events: AsyncIterable[Any]) -> None:
        async for event in events:
            self.events.append(event)


def kinds(events: list[Any]) -> list[str]:
    return [type(e).__name__ for e in events]


stopped_at_first_pay = functools.partial(stopped_at_pay, kx.pydantic_ai)


def test_a_streamed_run_stopped_after_its_first_tool_call_resumes_streamed_and_once(
    store: Any, llm: LLMServer, deliveries: DeliveryServer
) -> None:
    seen = Seen()
    agent = payer(llm.base_url, deliveries.url)
    stopped_at_first_pay(agent, "pas-1", event_stream_handler=seen)
    assert paid(deliveries) == ["/pay/bob"]  # the Stop landed before the next turn
    assert ledger("pas-1") == [
        ("turn 1", MODEL_TOOL, 0, EffectStatus.APPLIED),
        ("turn 1", "pay", 1, EffectStatus.APPLIED),
    ]
    # The first request as the server streamed it (the call's arguments in a delta), then
    # the call as Pydantic AI made it.
    first = seen.events
    assert kinds(first) == ["PartStartEvent", "PartDeltaEvent", "PartEndEvent",
                            "FunctionToolCallEvent", "FunctionToolResultEvent"]  # fmt: skip
    assert first[2].part.tool_name == "pay" and first[2].part.args_as_dict() == {
        "who": "bob",
        "amount": 10,
    }
    before = len(first)
    # Streamed again: the run's handler is kept in this process.
    resumed_to_the_answer("pas-1", llm, deliveries)
    assert streamed(llm) == [True, True, True]
    after = seen.events[before:]
    # The replayed request: its recorded part, started and ended, no delta; then its call.
    assert kinds(after[:4]) == ["PartStartEvent", "PartEndEvent",
                                "FunctionToolCallEvent", "FunctionToolResultEvent"]  # fmt: skip
    assert isinstance(after[0].part, ToolCallPart) and after[0].part == after[1].part
    assert after[0].part.args_as_dict() == {"who": "bob", "amount": 10}
    # The last request live, its words as they came.
    texts = [e for e in after if isinstance(e, PartStartEvent) and isinstance(e.part, TextPart)]
    deltas = [e.delta.content_delta for e in after
              if isinstance(e, PartDeltaEvent) and isinstance(e.delta, TextPartDelta)]  # fmt: skip
    assert len(texts) == 1 and len(deltas) > 1
    assert texts[0].part.content + "".join(deltas) == ANSWER
    assert isinstance(after[-1], PartEndEvent) and after[-1].part.content == ANSWER


def test_a_request_recorded_streamed_replays_in_a_run_resumed_unstreamed(
    store: Any, llm: LLMServer, deliveries: DeliveryServer
) -> None:
    agent = payer(llm.base_url, deliveries.url)
    seen = Seen()
    stopped_at_first_pay(agent, "pas-2", event_stream_handler=seen)
    before = len(seen.events)
    kx.pydantic_ai.agent(agent)  # registered again without a handler: agent.run unstreamed
    resumed_to_the_answer("pas-2", llm, deliveries)
    assert len(seen.events) == before  # no handler in this run
    assert streamed(llm) == [True, False, False]


def test_a_request_recorded_unstreamed_replays_in_a_run_resumed_streamed(
    store: Any, llm: LLMServer, deliveries: DeliveryServer
) -> None:
    agent = payer(llm.base_url, deliveries.url)
    stopped_at_first_pay(agent, "pas-3")
    seen = Seen()
    kx.pydantic_ai.agent(agent, event_stream_handler=seen)
    resumed_to_the_answer("pas-3", llm, deliveries)
    assert streamed(llm) == [False, True, True]
    replayed = seen.events[:4]  # turn 1, from its record
    assert kinds(replayed) == ["PartStartEvent", "PartEndEvent",
                               "FunctionToolCallEvent", "FunctionToolResultEvent"]  # fmt: skip
    assert isinstance(replayed[2], FunctionToolCallEvent) and replayed[2].part.tool_name == "pay"
    assert isinstance(replayed[3], FunctionToolResultEvent)
    assert "paid bob 10" in str(replayed[3].part.content)  # the recorded result, not a call


def test_an_agent_built_with_a_handler_streams_its_runs_and_a_bad_handler_is_refused(
    store: Any, llm: LLMServer, deliveries: DeliveryServer
) -> None:
    seen = Seen()
    built = payer(llm.base_url, deliveries.url, durable=True, handler=seen)
    handle = kx.pydantic_ai.start(built, PROMPT, run_id="pas-4")
    assert handle.wait(30) == Status.COMPLETED, handle.error
    assert handle.result == ANSWER
    assert streamed(llm) == [True, True, True]
    assert kinds(seen.events).count("FunctionToolResultEvent") == 2
    with pytest.raises(TypeError, match="event_stream_handler must be an async function"):
        kx.pydantic_ai.start(built, PROMPT, run_id="pas-5", event_stream_handler="print")


def test_a_handler_that_raises_ends_the_run_failed_and_a_resume_goes_on(
    store: Any, llm: LLMServer, deliveries: DeliveryServer
) -> None:
    class Broken(Exception):
        pass

    async def broken(ctx: Any, events: AsyncIterable[Any]) -> None:
        async for event in events:
            if isinstance(event, FunctionToolResultEvent):
                raise Broken("the display went away")

    agent = payer(llm.base_url, deliveries.url)
    handle = kx.pydantic_ai.start(agent, PROMPT, run_id="pas-6", event_stream_handler=broken)
    assert handle.wait(30) == Status.FAILED
    assert isinstance(handle.error, Broken)
    assert paid(deliveries) == ["/pay/bob"]
    kx.pydantic_ai.agent(agent)
    resumed = kx.resume("pas-6")
    assert resumed.wait(30) == Status.COMPLETED, resumed.error
    assert resumed.result == ANSWER
    assert paid(deliveries) == ["/pay/ann", "/pay/bob"]
    assert set(llm.per_turn().values()) == {1}
