"""LangGraph graphs for the ``kx.langgraph`` tests (imported in the test process and in
real kernels): a scripted "model" node and a ``ToolNode`` whose tool POSTs to the local
delivery server.

The model asks for one ``deliver`` call per order in the first human message, in one
turn (so the ``ToolNode`` runs them in parallel threads), then answers ``done``. The
tool POSTs ``/orders/<order>`` and then waits until the file ``gate`` exists (a
confirmation that takes a while): a test stops or interrupts the run while the tool waits,
after the delivery happened and before the node's writes are saved.

:func:`asking_graph` is a one-node graph whose node asks a person with ``interrupt()``.
"""

from __future__ import annotations

import os
import time
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool as langchain_tool
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode
from langgraph.types import interrupt

from support.http_server import post_json

__all__ = ["Asked", "State", "asking_graph", "build_graph", "orders_input"]


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def orders_input(*orders: str) -> dict[str, Any]:
    """The graph's input: one human message naming the orders to deliver."""
    return {"messages": [HumanMessage(content="deliver " + " ".join(orders))]}


def build_graph(
    url: str, gate: str | None = None, *, checkpointer: Any = None, record: bool = True
) -> Any:
    """The compiled graph. ``record``: the tool is ``kx.langgraph.tool`` (its calls are
    effects); otherwise LangChain's plain ``@tool``."""

    def deliver(order: str) -> dict[str, Any]:
        """Deliver one order to the shop."""
        response = post_json(f"{url}/orders/{order}", {"order": order})
        while gate is not None and not os.path.exists(gate):
            time.sleep(0.01)
        return {"order": order, "delivery": response.body["delivery"]}

    if record:
        from kernelext._adapters import langgraph as kx_langgraph

        tool = kx_langgraph.tool(deliver)
    else:
        tool = langchain_tool(deliver)

    def model(state: State) -> dict[str, Any]:
        last = state["messages"][-1]
        if isinstance(last, ToolMessage):
            return {"messages": [AIMessage(content="done")]}
        orders = str(last.content).split()[1:]
        calls = [
            {"name": "deliver", "args": {"order": o}, "id": f"call_{o}", "type": "tool_call"}
            for o in orders
        ]
        return {"messages": [AIMessage(content="", tool_calls=calls)]}

    def route(state: State) -> str:
        last = state["messages"][-1]
        return "tools" if isinstance(last, AIMessage) and last.tool_calls else END

    builder = StateGraph(State)
    builder.add_node("model", model)
    builder.add_node("tools", ToolNode([tool]))
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", route, ["tools", END])
    builder.add_edge("tools", "model")
    return builder.compile(checkpointer=checkpointer, name="deliveries")


class Asked(TypedDict):
    log: list[str]


def asking_graph(*, twice: bool = False) -> Any:
    """``approve`` asks whether to ship order A; ``twice``: then how many boxes (an integer
    of at least 1, LangGraph's ``response_schema``), in the same node."""

    def approve(state: Asked) -> Asked:
        log = [*state["log"], f"A:{interrupt({'question': 'ship order A?', 'order': 'A'})}"]
        if twice:
            boxes = interrupt("How many boxes?", response_schema={"type": "integer", "minimum": 1})
            log.append(f"boxes:{boxes}")
        return {"log": log}

    builder = StateGraph(Asked)
    builder.add_node("approve", approve)
    builder.add_edge(START, "approve")
    builder.add_edge("approve", END)
    return builder.compile(name="asking")
