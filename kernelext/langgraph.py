"""``kx.langgraph`` (``pip install 'kernelext[langgraph]'``): a compiled LangGraph graph as a
kernelext run.

``kx.langgraph.start(graph, input, run_id=...)`` runs the graph, one superstep a step, and
returns the run's handle; Stop lands once a superstep's checkpoint is durable and
``kx.resume`` continues from it. ``kx.langgraph.tool(fn)`` makes a tool's calls effects
keyed by the LangGraph task, so a node that runs again does not repeat them.
``interrupt()`` asks a question (``kx.questions``, ``kx.answer``). After a kernel restart,
build the graph again and call ``kx.langgraph.agent(graph)`` before ``kx.resume(run_id)``.
``KernelextSaver`` is the checkpointer ``start`` uses. LangGraph itself is imported on first
use, never by ``import kernelext``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._adapters import langgraph as _adapter
from ._adapters.langgraph import (
    ANSWER_EVENT,
    INTERRUPT_EVENT,
    agent,
    answer,
    interrupt_key,
    pending_interrupt,
    pending_interrupts,
    start,
    tool,
)

if TYPE_CHECKING:  # at run time it comes from __getattr__, when first used
    from ._adapters.langgraph_saver import KernelextSaver

__all__ = [
    "ANSWER_EVENT",
    "INTERRUPT_EVENT",
    "KernelextSaver",
    "agent",
    "answer",
    "interrupt_key",
    "pending_interrupt",
    "pending_interrupts",
    "start",
    "tool",
]


def __getattr__(name: str) -> Any:
    if name == "KernelextSaver":
        return _adapter.KernelextSaver  # imports LangGraph (ImportError naming the extra)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
