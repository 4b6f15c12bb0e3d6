"""LangGraph with its SQLite checkpointer (SqliteSaver), as users set it up.

``durability="sync"`` makes every checkpoint durable before the next super-step
starts, which is what kernelext guarantees for a step; LangGraph's default
(``"async"``) writes the checkpoint while the next step already runs.
"""

from __future__ import annotations

import operator
import os
import sqlite3
import time
from typing import Annotated, Any, Literal, TypedDict

from .common import MARKS, dir_bytes
from .kx_agents import bare_call, message

__all__ = ["effect_calls_ms", "steps_marks", "storage_bytes", "version"]


def version() -> str:
    from importlib.metadata import version as dist_version

    return f"langgraph {dist_version('langgraph')}, checkpoint-sqlite " + dist_version(
        "langgraph-checkpoint-sqlite"
    )


def _saver(path: str) -> Any:
    from langgraph.checkpoint.sqlite import SqliteSaver

    return SqliteSaver(sqlite3.connect(path, check_same_thread=False))


class _Counter(TypedDict):
    i: int


class _Chat(TypedDict):
    messages: Annotated[list[dict[str, str]], operator.add]
    i: int


def steps_marks(
    folder: str, n: int, durability: Literal["sync", "async", "exit"] = "sync"
) -> list[float]:
    """A StateGraph looping ``n`` super-steps over one no-op node; returns node timestamps."""
    from langgraph.graph import END, START, StateGraph

    def step(state: _Counter) -> dict[str, int]:
        MARKS.append(time.perf_counter())
        return {"i": state["i"] + 1}

    def route(state: _Counter) -> str:
        return END if state["i"] >= n else "step"

    graph = StateGraph(_Counter)
    graph.add_node("step", step)
    graph.add_edge(START, "step")
    graph.add_conditional_edges("step", route, ["step", END])
    saver = _saver(os.path.join(folder, "langgraph.sqlite"))
    app = graph.compile(checkpointer=saver)
    MARKS.clear()
    config: Any = {"configurable": {"thread_id": "bench"}, "recursion_limit": n + 10}
    app.invoke({"i": 0}, config, durability=durability)
    saver.conn.close()
    return list(MARKS)


def storage_bytes(folder: str, n: int) -> dict[str, int]:
    """Append one message per super-step for ``n`` steps; bytes of the SQLite files."""
    from langgraph.graph import END, START, StateGraph

    def step(state: _Chat) -> dict[str, Any]:
        return {"messages": [message(state["i"])], "i": state["i"] + 1}

    def route(state: _Chat) -> str:
        return END if state["i"] >= n else "step"

    graph = StateGraph(_Chat)
    graph.add_node("step", step)
    graph.add_edge(START, "step")
    graph.add_conditional_edges("step", route, ["step", END])
    path = os.path.join(folder, "langgraph-storage.sqlite")
    saver = _saver(path)
    app = graph.compile(checkpointer=saver)
    config: Any = {"configurable": {"thread_id": "bench"}, "recursion_limit": n + 10}
    final = app.invoke({"messages": [], "i": 0}, config, durability="sync")
    assert len(final["messages"]) == n
    con = saver.conn
    logical = sum(
        int(row[0] or 0)
        for row in con.execute(
            "SELECT sum(length(checkpoint)) + sum(length(metadata)) FROM checkpoints"
            " UNION ALL SELECT sum(length(value)) FROM writes"
        )
    )
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    files = sum(dir_bytes(path + suffix) for suffix in ("", "-wal", "-shm"))
    return {"file_bytes": files, "logical_bytes": logical}


def effect_calls_ms(folder: str, calls: int, spacing_s: float) -> list[float]:
    """A functional-API entrypoint calling one task per external call (SqliteSaver)."""
    from langgraph.func import entrypoint, task

    @task
    def ping(i: int) -> dict[str, Any]:
        return bare_call(i)

    saver = _saver(os.path.join(folder, "langgraph-effects.sqlite"))

    @entrypoint(checkpointer=saver)
    def workflow(count: int) -> int:
        for i in range(count):
            if spacing_s:
                time.sleep(spacing_s)
            start = time.perf_counter()
            ping(i).result()
            MARKS.append(time.perf_counter() - start)
        return count

    MARKS.clear()
    workflow.invoke(calls, {"configurable": {"thread_id": "bench"}}, durability="sync")
    saver.conn.close()
    return [m * 1000.0 for m in MARKS]
