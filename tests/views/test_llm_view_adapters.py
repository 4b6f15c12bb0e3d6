"""The conversation view of runs made with the MCP and LangGraph adapters.

Real parts: the MCP server over stdio (``support.mcp_server``), the scripted model
server (``support.llm_server``), LangGraph's own graph (``support.langgraph_graphs``),
the delivery server on 127.0.0.1 and a DuckDB store file.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openai import OpenAI
from support.clients import closed_after
from support.http_server import DeliveryServer
from support.llm_server import LLMServer
from support.mcp_server import SERVER_NAME, McpClient

import kernelext as kx
from kernelext._adapters.mcp import wrap_mcp
from kernelext._core.encoding.names import OUTSIDE_STEPS
from kernelext._core.views import conversation
from kernelext.status import Status
from kernelext.widgets._render import to_text, view_of

WAIT = 60.0


@pytest.fixture
def mcp_client(delivery_server: DeliveryServer, tmp_path: Path) -> Iterator[McpClient]:
    with McpClient(delivery_server.url, errlog=tmp_path / "mcp_server.log") as client:
        yield client


def tool_rows(run_id: str) -> list[str]:
    rows = kx.sql(f"SELECT tool FROM effects WHERE run_id = '{run_id}' ORDER BY intent_at")
    return [str(t) for t in rows["tool"]]


def test_mcp_tool_calls_count_as_tool_calls_of_the_conversation(
    store: Any, llm: LLMServer, mcp_client: McpClient, delivery_server: DeliveryServer
) -> None:
    client = kx.openai(closed_after(OpenAI(base_url=llm.base_url, api_key="EMPTY", max_retries=0)))
    session = wrap_mcp(mcp_client.session)

    @kx.agent(name="mcp-talk")
    def talk(run: kx.Run) -> str:
        reply = client.chat.completions.create(
            model="scripted", messages=[{"role": "user", "content": "refund A-1001"}]
        )
        mcp_client.call(session.call_tool("deliver", {"channel": "ops", "text": "refund"}))
        mcp_client.call(session.call_tool("add", {"a": 2, "b": 3}))
        return str(reply.id)

    handle = talk.start(run_id="mcp-talk")
    assert handle.wait(WAIT) == Status.COMPLETED, repr(handle.error)
    tools = tool_rows("mcp-talk")
    mcp_calls = [t for t in tools if t.startswith(f"mcp:{SERVER_NAME}/")]
    assert len(mcp_calls) == 2 and len(tools) == 3, tools
    delivery_server.settle()
    assert delivery_server.count() == 1  # the deliver tool reached the outside once

    summary = handle.text_summary()
    assert "1 turn · 2 tool calls · " in summary, summary
    panel = to_text(view_of(handle))
    assert "1 turn · 2 tool calls" in panel and f"last: tool call mcp:{SERVER_NAME}/add" in panel
    assert OUTSIDE_STEPS not in summary + panel


def test_a_langgraph_run_shows_its_supersteps_and_tool_calls_not_zero_turns(
    store: Any, delivery_server: DeliveryServer
) -> None:
    from support.langgraph_graphs import build_graph, orders_input

    handle = kx.langgraph.start(
        build_graph(delivery_server.url), orders_input("A", "B"), run_id="lg-view"
    )
    assert handle.wait(WAIT) == Status.COMPLETED, repr(handle.error)
    tools = tool_rows("lg-view")
    assert len(tools) == 2, tools  # one deliver call per order
    steps = int(kx.sql("SELECT count(*) AS n FROM steps WHERE run_id = 'lg-view'")["n"][0])
    assert steps >= 3  # model, tools, model
    talk = conversation.conversation_of(store.load_effects("lg-view").values())
    assert (talk.turns, talk.tool_calls) == (0, 2)

    summary = handle.text_summary()
    panel = to_text(view_of(handle))
    plan = str(kx.plan("lg-view"))
    for shown in (summary, panel):
        assert f"{steps} steps" in shown and "2 tool calls" in shown, shown
    for shown in (summary, panel, plan):
        assert "turn" not in shown and "tokens" not in shown, shown
        assert OUTSIDE_STEPS not in shown, shown
