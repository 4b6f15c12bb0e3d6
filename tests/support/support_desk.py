"""The customer-support agent's tools of the ``kx.openai`` and ``kx.anthropic`` tests.

``Gate``: a ``lookup_order`` tool that waits, the first time, until the test asked for a
Stop (``Gate(open=True)`` never waits; ``placed`` adds an order date to its answer).
``support_tools(gate)``: ``refund`` and ``send_email`` (effects) and the gate's
``lookup_order`` (a plain tool). ``stop_at_the_gate``: the Stop asked while the tool waits.
``chat_with_tools``: the Chat Completions tool loop an agent runs on them.
"""

from __future__ import annotations

import datetime
import threading
from typing import Any

import kernelext as kx
from kernelext._adapters.tools import Tools
from kernelext.status import Status


class Gate:
    """A tool that waits, the first time, until the test asked for a stop."""

    def __init__(self, *, open: bool = False, placed: datetime.date | None = None) -> None:
        self.reached, self.opened = threading.Event(), threading.Event()
        self.placed = placed
        if open:
            self.opened.set()

    def lookup_order(self, order_id: str) -> dict[str, Any]:
        self.reached.set()
        assert self.opened.wait(30)
        order: dict[str, Any] = {"order": order_id, "total": 25.0, "email": "ada@example.com"}
        if self.placed is not None:
            order["placed"] = self.placed
        return order


def support_tools(gate: Gate, *, keyed_refund: bool = False) -> Tools:
    """The agent's tools; with ``keyed_refund`` the refund takes the ledger's key."""

    @kx.effect
    def refund(order_id: str, amount: float) -> Any:
        return {"refunded": amount, "order": order_id}

    @kx.effect(name="refund")
    def keyed(order_id: str, amount: float, *, idempotency_key: str | None = None) -> Any:
        return {"refunded": amount, "order": order_id}

    @kx.effect
    def send_email(to: str, subject: str, body: str) -> Any:
        return {"sent": to}

    tools = Tools()
    tools.add(keyed if keyed_refund else refund, name="refund")
    tools.add(send_email)
    tools.add(gate.lookup_order, name="lookup_order")
    return tools


def chat_with_tools(client: Any, model: str, tools: Tools, question: str, seen: list[Any]) -> str:
    """The Chat Completions loop people write: asks ``question`` with ``tools`` and makes
    the calls the model asks for until it answers in words; each reply goes to ``seen``."""
    messages: list[Any] = [{"role": "user", "content": question}]
    while True:
        reply = client.chat.completions.create(model=model, messages=messages, tools=tools)
        seen.append(reply)
        messages.append(reply.choices[0].message)  # the object, as people append it
        if not reply.choices[0].message.tool_calls:
            return str(reply.choices[0].message.content)
        messages += tools.call_all(reply.choices[0].message)


def stop_at_the_gate(handle: kx.Handle, gate: Gate) -> None:
    assert gate.reached.wait(30)
    handle.stop()
    gate.opened.set()
    assert handle.wait(30) == Status.SUSPENDED
