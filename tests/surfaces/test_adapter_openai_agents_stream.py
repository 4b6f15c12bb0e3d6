"""``kx.openai_agents.start(..., on_event=...)``: a streamed Agents SDK run, stopped and resumed.

The run is ``Runner.run_streamed``; the callback gets each event the SDK yields. The model is
``support.llm_server.LLMServer`` on 127.0.0.1 answering the Responses API with server-sent
events (``response.created``, text deltas, ``response.output_item.done``,
``response.completed``) and counting the requests of every conversation turn; ``pay`` POSTs
to the local ``DeliveryServer``, which counts payments. A turn is recorded as its final
response, so a run recorded streamed resumes unstreamed and the other way round.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import pytest
from agents import RawResponsesStreamEvent, RunItemStreamEvent
from openai.types.responses import ResponseTextDeltaEvent
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
from support.sdk_agents import HOLD, PAY_SCRIPT, payer

import kernelext as kx
from kernelext._adapters.openai_agents import MODEL_TOOL
from kernelext.status import EffectStatus, Status

pytestmark = pytest.mark.usefixtures("released_hold")  # a held pay let go after each test
LLM_SCRIPT = PAY_SCRIPT  # what the llm fixture's model server answers

ANSWER = "paid bob 10 and ann 3"


def raw(events: list[Any]) -> list[str]:
    return [e.data.type for e in events if isinstance(e, RawResponsesStreamEvent)]


def items(events: list[Any]) -> list[str]:
    return [e.name for e in events if isinstance(e, RunItemStreamEvent)]


stopped_at_first_pay = functools.partial(stopped_at_pay, kx.openai_agents)


def test_a_streamed_run_stopped_after_its_first_tool_call_resumes_streamed_and_once(
    store: Any, llm: LLMServer, deliveries: DeliveryServer
) -> None:
    seen: list[Any] = []
    stopped_at_first_pay(payer(llm.base_url, deliveries.url), "oas-1", on_event=seen.append)
    assert paid(deliveries) == ["/pay/bob"]  # the Stop landed before the next turn
    assert ledger("oas-1") == [
        ("turn 1", MODEL_TOOL, 0, EffectStatus.APPLIED),
        ("turn 1", "pay", 1, EffectStatus.APPLIED),
    ]
    # The first turn as the server streamed it, then its items as the SDK made them.
    assert raw(seen) == ["response.created", "response.output_item.done", "response.completed"]
    assert items(seen) == ["tool_called", "tool_output"]
    before = len(seen)
    # Streamed again: the run's on_event is kept in this process.
    resumed = resumed_to_the_answer("oas-1", llm, deliveries)
    assert streamed(llm) == [True, True, True]
    summary = resumed.text_summary()  # the streamed turns' usage, recorded as get_response's
    assert re.search(r"3 turns · 2 tool calls · [1-9][\d,]* tokens", summary), summary
    after = seen[before:]
    # Turn 1 replayed (created and completed from the record), then its items again; turns 2
    # and 3 live, the answer's words as they came.
    assert raw(after)[:2] == ["response.created", "response.completed"]
    assert items(after) == ["tool_called", "tool_output", "tool_called", "tool_output",
                            "message_output_created"]  # fmt: skip
    words = [e.data.delta for e in after if isinstance(getattr(e, "data", None),
                                                       ResponseTextDeltaEvent)]  # fmt: skip
    assert len(words) > 1 and "".join(words) == ANSWER


def test_a_turn_recorded_streamed_replays_in_a_run_resumed_unstreamed(
    store: Any, llm: LLMServer, deliveries: DeliveryServer
) -> None:
    agent = payer(llm.base_url, deliveries.url)
    seen: list[Any] = []
    stopped_at_first_pay(agent, "oas-2", on_event=seen.append)
    before = len(seen)
    kx.openai_agents.agent(agent)  # registered again without on_event: Runner.run
    resumed_to_the_answer("oas-2", llm, deliveries)
    assert len(seen) == before  # no callback in this run
    assert streamed(llm) == [True, False, False]


def test_a_turn_recorded_unstreamed_replays_in_a_run_resumed_streamed(
    store: Any, llm: LLMServer, deliveries: DeliveryServer
) -> None:
    agent = payer(llm.base_url, deliveries.url)
    stopped_at_first_pay(agent, "oas-3")

    seen: list[Any] = []

    async def collect(event: Any) -> None:  # an async callback is awaited
        seen.append(event)

    kx.openai_agents.agent(agent, on_event=collect)
    resumed_to_the_answer("oas-3", llm, deliveries)
    assert streamed(llm) == [False, True, True]
    assert raw(seen)[:2] == ["response.created", "response.completed"]  # turn 1, replayed
    [replayed] = [e.data.response for e in seen[:3] if raw([e]) == ["response.completed"]]
    assert [item.type for item in replayed.output] == ["function_call"]
    assert items(seen)[:2] == ["tool_called", "tool_output"]
    assert seen[-1].name == "message_output_created"


def test_a_callback_that_raises_ends_the_run_failed_and_a_resume_goes_on(
    store: Any, llm: LLMServer, deliveries: DeliveryServer
) -> None:
    class Broken(Exception):
        pass

    def broken(event: Any) -> None:
        if isinstance(event, RunItemStreamEvent) and event.name == "tool_output":
            raise Broken("the display went away")

    agent = payer(llm.base_url, deliveries.url)
    handle = kx.openai_agents.start(agent, PROMPT, run_id="oas-4", on_event=broken)
    assert handle.wait(30) == Status.FAILED
    assert isinstance(handle.error, Broken)
    assert paid(deliveries) == ["/pay/bob"]
    kx.openai_agents.agent(agent)  # without the callback: the recorded turn goes on
    resumed = kx.resume("oas-4")
    assert resumed.wait(30) == Status.COMPLETED, resumed.error
    assert resumed.result == ANSWER
    assert paid(deliveries) == ["/pay/ann", "/pay/bob"]
    assert set(llm.per_turn().values()) == {1}
    with pytest.raises(TypeError, match="on_event must be a function"):
        kx.openai_agents.start(agent, PROMPT, run_id="oas-5", on_event="print")


def test_a_call_cut_by_a_force_stop_of_a_streamed_run_waits_in_reconcile(
    store: Any, llm: LLMServer, deliveries: DeliveryServer
) -> None:
    seen: list[Any] = []
    HOLD.arm(who="bob")
    agent = payer(llm.base_url, deliveries.url)
    handle = kx.openai_agents.start(agent, PROMPT, run_id="oas-cut", on_event=seen.append)
    assert HOLD.reached.wait(30)
    handle.force_stop(cut_calls=True)
    assert handle.wait(30) == Status.SUSPENDED, handle.error
    # The run's end was recorded once its SDK run had ended: the cut call is settled.
    assert ("turn 1", "pay", 1, EffectStatus.UNKNOWN) in ledger("oas-cut")
    HOLD.released.set()  # the payment goes out after all: the ledger cannot know it did
    assert kx.resume("oas-cut").wait(30) == Status.NEEDS_DECISION
    (cut,) = kx.reconcile("oas-cut").open
    cut.mark_applied("paid bob 10 (200)")  # a person looked at the bank's side
    resumed = kx.resume("oas-cut")
    assert resumed.wait(30) == Status.COMPLETED, resumed.error
    assert resumed.result == ANSWER
    assert paid(deliveries) == ["/pay/ann", "/pay/bob"]  # bob once, as decided
    assert set(llm.per_turn().values()) == {1}
