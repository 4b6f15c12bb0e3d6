"""What changed in the code since a run ran: the agent's version (its fingerprint) or each
``%%agent`` cell's source, with a short diff when this process saw both sources.

The sources are remembered as agents are defined and cells run (``remember_agent_source``,
``remember_cell_source``); ``kernelext._core.plan.resume_plan`` asks :func:`agent_change` and
:func:`cell_changes` when it computes a plan.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Mapping
from typing import Any

from ..encoding.names import SOURCE_PREFIX, source_hash
from ..process.runtime import runtime
from .items import UNSEEN, CodeChange, StepItem

__all__ = [
    "agent_change",
    "cell_changes",
    "cell_state",
    "how_to_define",
    "remember_agent_source",
    "remember_cell_source",
    "short_diff",
]

DIFF_LINES = 12


def remember_agent_source(fingerprint: str, fn: Callable[..., Any] | str) -> None:
    """Keep the source of an agent version, so that a later plan can show a diff."""
    text = fn if isinstance(fn, str) else _source_of(fn)
    if text is not None:
        rt = runtime()
        with rt.lock:
            rt.agent_sources[fingerprint] = text


def remember_cell_source(run_id: str, key: str, source: str) -> None:
    """The current source of the ``%%agent`` cell that is step ``key`` of run ``run_id``."""
    rt = runtime()
    with rt.lock:
        rt.cell_sources[(run_id, key)] = source
        rt.cell_sources_by_hash[source_hash(source)] = source


def _source_of(fn: Callable[..., Any]) -> str | None:
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):
        return None


def short_diff(old: str | None, new: str | None) -> str:
    if old is None or new is None:
        return ""
    lines = [
        line
        for line in difflib.unified_diff(old.splitlines(), new.splitlines(), lineterm="", n=1)
        if not line.startswith(("---", "+++"))
    ]
    if len(lines) > DIFF_LINES:
        lines = [*lines[:DIFF_LINES], f"... ({len(lines) - DIFF_LINES} more lines)"]
    return "\n".join(lines)


def agent_change(agent_name: str, recorded: str | None) -> CodeChange:
    """How the agent ``agent_name`` defined now compares with the version the run ran
    (``recorded``, its fingerprint), with a short diff when both sources were seen here."""
    rt = runtime()
    agent = rt.agents.get(agent_name)
    if agent is None:
        return CodeChange("agent", agent_name, recorded, None, UNSEEN)
    current = str(agent.fingerprint)
    remember_agent_source(current, agent.fn)
    if not recorded or recorded == current:
        return CodeChange("agent", agent_name, recorded, current, "same")
    with rt.lock:
        old, new = rt.agent_sources.get(recorded), rt.agent_sources.get(current)
    return CodeChange("agent", agent_name, recorded, current, "changed", short_diff(old, new))


def cell_state(key: str, name: str | None, sources: Mapping[str, str]) -> str:
    """``same``, ``changed`` or UNSEEN: the source of cell ``key`` now against the hash its
    completed step recorded (in the step's name)."""
    recorded = name[len(SOURCE_PREFIX) :] if name and name.startswith(SOURCE_PREFIX) else None
    if key not in sources or recorded is None:
        return UNSEEN
    return "same" if source_hash(sources[key]) == recorded else "changed"


def cell_changes(completed: list[StepItem], sources: Mapping[str, str]) -> list[CodeChange]:
    """The code change of each completed ``%%agent`` cell, with a short diff when changed."""
    changes = []
    for step in completed:
        name = step.name or ""
        recorded = name[len(SOURCE_PREFIX) :] if name.startswith(SOURCE_PREFIX) else None
        state = cell_state(step.key, step.name, sources)
        source = sources.get(step.key)
        current = source_hash(source) if source is not None else None
        diff = ""
        if state == "changed":
            rt = runtime()
            with rt.lock:
                old = rt.cell_sources_by_hash.get(recorded or "")
            diff = short_diff(old, source)
        changes.append(CodeChange("cell", step.key, recorded, current, state, diff))
    return changes


# A framework's agent is handed over by the adapter's call, named after its framework.
_HANDED_OVER = (
    ("openai_agents:", "the Agents SDK Agent", "kx.openai_agents.agent(agent)"),
    ("pydantic_ai:", "the Pydantic AI Agent", "kx.pydantic_ai.agent(agent)"),
    ("langgraph:", "the compiled LangGraph graph", "kx.langgraph.agent(graph)"),
)


def how_to_define(agent: str) -> str:
    """What makes agent ``agent`` known to this process (a sentence, no full stop): its
    ``@kx.agent``, or for a framework's agent the adapter's call that hands it over."""
    for prefix, what, call in _HANDED_OVER:
        if agent.startswith(prefix):
            return (
                f"Run the code (or notebook cell) that builds {what} and hand it over with "
                f"{call} (the same name= if you gave one)"
            )
    return (
        f"Run the code (or notebook cell) that defines @kx.agent(name={agent!r}), or that "
        f"hands a framework's agent over with kx.<framework>.agent(..., name={agent!r})"
    )
