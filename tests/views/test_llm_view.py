"""A run of model and tool calls as a person sees it: turns, tool calls, tokens and their
cost, counted from the server's ``usage`` across a stop and a resume, with no internal
step name shown.

The real ``openai`` client talks to the scripted local server (``support.llm_server``);
a tool waits until the test asked for the stop, which lands at the next model call.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from openai import OpenAI
from support.llm_server import LLMServer
from support.llm_views import (
    MODEL,
    client_of,
    kernelext_show,
    no_prices,  # noqa: F401 - autouse: no prices left over
    refund_desk,
)
from support.support_desk import chat_with_tools

import kernelext as kx
from kernelext._core.encoding.names import OUTSIDE_STEPS
from kernelext._core.views import conversation
from kernelext.status import Status
from kernelext.widgets._render import to_text, view_of

PRICE = (2.0, 8.0)  # dollars per million prompt / completion tokens


def test_turns_tool_calls_tokens_and_cost_are_counted_once_across_a_stop_and_a_resume(
    store: Any, store_path: Path, llm: LLMServer
) -> None:
    client = client_of(llm, prices={MODEL: PRICE})
    reached, opened = threading.Event(), threading.Event()
    live: list[Any] = []

    def lookup_order(order_id: str) -> dict[str, Any]:
        reached.set()
        assert opened.wait(30)
        return {"order": order_id, "total": 25.0}

    tools = refund_desk(lookup_order)

    @kx.agent(name="llm-view")
    def support(run: kx.Run, question: str) -> str:
        return chat_with_tools(client, MODEL, tools, question, live)

    handle = support.start("refund A-1001", run_id="talk")
    assert reached.wait(30)
    handle.stop()
    opened.set()
    assert handle.wait(30) == Status.SUSPENDED
    stopped = conversation_now("talk")
    assert stopped.turns == sum(llm.per_turn().values()) >= 1
    plan = str(kx.plan("talk"))
    assert f"continues after turn {stopped.turns}" in plan
    assert "first item not completed" not in plan

    resumed = kx.resume("talk")
    assert resumed.wait(30) == Status.COMPLETED, repr(resumed.error)
    asked = sum(llm.per_turn().values())  # each turn asked once, replays not
    first_live = {id(r): r for r in live}
    # The server's usage of every turn it answered: the replies of the first attempt and
    # those of the resume that were not replayed (a replayed reply equals a live one).
    answered: dict[str, Any] = {}
    for r in first_live.values():
        answered.setdefault(r.id, r.usage)
    assert len(answered) == asked
    prompt = sum(u.prompt_tokens for u in answered.values())
    completion = sum(u.completion_tokens for u in answered.values())
    talk = conversation_now("talk")
    assert (talk.turns, talk.prompt_tokens, talk.completion_tokens) == (asked, prompt, completion)
    tool_rows = kx.sql(
        "SELECT count(*) AS n FROM effects WHERE run_id = 'talk' AND tool NOT LIKE 'openai:%'"
    )
    assert talk.tool_calls == int(tool_rows["n"][0]) >= 1
    assert talk.cost == pytest.approx((prompt * PRICE[0] + completion * PRICE[1]) / 1e6)

    summary = resumed.text_summary()
    assert f"{asked} turns" in summary and f"{prompt + completion:,} tokens" in summary
    assert "$" in summary
    panel_text = to_text(view_of(resumed))
    assert f"{asked} turns" in panel_text and "last: assistant: " in panel_text, panel_text
    shown_cli = kernelext_show("talk", store_path)
    # prices are given in the process that runs the agent; another process shows no cost
    assert f"conversation: {talk.text().split(' · $')[0]}\n" in shown_cli, shown_cli
    for shown in (summary, panel_text, plan, shown_cli):
        assert OUTSIDE_STEPS not in shown, shown


def conversation_now(run_id: str) -> conversation.Conversation:
    from kernelext._core.process.runtime import get_store

    return conversation.conversation_of(get_store(None).load_effects(run_id).values())


def test_bad_prices_say_what_to_pass(llm: LLMServer) -> None:
    client = OpenAI(base_url=llm.base_url, api_key="EMPTY")
    with pytest.raises(TypeError, match="dollars per million tokens"):
        kx.openai(client, prices={MODEL: 0.15})
    with pytest.raises(TypeError, match="dict of model"):
        kx.openai(client, prices=[0.15, 0.6])
    assert conversation.PRICES == {}
