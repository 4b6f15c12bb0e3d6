"""The conversation view of a ``kx.anthropic`` run: Anthropic turns counted, tokens from
``usage.input_tokens`` / ``output_tokens`` (a stream's from its ``message_start`` and
``message_delta`` events), the cost from ``prices=``, and the model's last words.

The real ``anthropic`` client talks to the scripted local server's ``/v1/messages``
(``support.llm_server``); the run is read back from the DuckDB file, here and by
``kernelext show`` in another process.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from anthropic import Anthropic
from support.clients import closed_after
from support.llm_server import LLMServer
from support.llm_views import MODEL, kernelext_show, no_prices, refund_desk  # noqa: F401
from support.model_loops import anthropic_reply, anthropic_take

import kernelext as kx
from kernelext._core.views import conversation
from kernelext.status import Status
from kernelext.widgets._render import to_text, view_of

PRICE = (3.0, 15.0)  # dollars per million input / output tokens


def test_anthropic_turns_tokens_and_cost_are_counted(
    store: Any, store_path: Path, llm: LLMServer
) -> None:
    plain = closed_after(Anthropic(base_url=llm.url, api_key="EMPTY", max_retries=0))
    client = kx.anthropic(plain, prices={MODEL: PRICE})
    live: list[Any] = []

    def lookup_order(order_id: str) -> Any:
        return {"order": order_id, "total": 25.0}

    tools = refund_desk(lookup_order)

    @kx.agent(name="anthropic-view")
    def support(run: kx.Run, question: str) -> str:
        messages: list[Any] = [{"role": "user", "content": question}]
        for turn in range(10):
            reply = anthropic_reply(
                client, tools, turn, model=MODEL, max_tokens=512, messages=messages
            )
            live.append(reply)
            answer = anthropic_take(reply, tools, messages)
            if answer is not None:
                return answer
        raise AssertionError("no answer")

    handle = support.start("refund A-1001", run_id="claude")
    assert handle.wait(30) == Status.COMPLETED, repr(handle.error)
    assert len(live) == sum(llm.per_turn("messages").values()) == 4
    prompt = sum(r.usage.input_tokens for r in live)
    completion = sum(r.usage.output_tokens for r in live)
    talk = conversation.conversation_of(store.load_effects("claude").values())
    assert (talk.turns, talk.tool_calls) == (4, 3)
    assert (talk.prompt_tokens, talk.completion_tokens) == (prompt, completion)
    assert talk.cost == pytest.approx((prompt * PRICE[0] + completion * PRICE[1]) / 1e6)
    assert talk.last == f"assistant: {handle.result}"

    summary = handle.text_summary()
    assert f"4 turns · 3 tool calls · {prompt + completion:,} tokens" in summary, summary
    assert f"${talk.cost:.4f}" in summary
    panel = to_text(view_of(handle))
    assert "4 turns" in panel and "last: assistant: Order A-1001 was refunded" in panel, panel
    shown = kernelext_show("claude", store_path)
    assert f"conversation: {talk.text().split(' · $')[0]}\n" in shown, shown


def test_a_streamed_tool_request_is_shown_as_the_tools_it_asked_for(
    store: Any, llm: LLMServer
) -> None:
    plain = closed_after(Anthropic(base_url=llm.url, api_key="EMPTY", max_retries=0))
    client = kx.anthropic(plain)

    @kx.agent(name="anthropic-asks")
    def agent(run: kx.Run) -> str:
        ask = {"model": MODEL, "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}
        events = list(client.messages.create(**ask, stream=True))  # read to its end
        return str(events[-1].type)

    handle = agent.start(run_id="asks")
    assert handle.wait(30) == Status.COMPLETED, repr(handle.error)
    talk = conversation.conversation_of(store.load_effects("asks").values())
    assert talk.turns == 1 and talk.prompt_tokens > 0 and talk.completion_tokens > 1
    assert talk.last == "assistant asked for lookup_order"
