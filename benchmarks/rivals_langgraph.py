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

__all__ = [
    "batch_e2e",
    "effect_calls_ms",
    "effects_e2e",
    "steps_e2e",
    "steps_marks",
    "storage_bytes",
    "version",
]


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


def _counter_app(folder: str, n: int) -> tuple[Any, Any]:
    """A StateGraph looping ``n`` super-steps over one no-op node, and its saver."""
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
    return graph.compile(checkpointer=saver), saver


def _config(n: int) -> Any:
    return {"configurable": {"thread_id": "bench"}, "recursion_limit": n + 10}


def steps_marks(
    folder: str, n: int, durability: Literal["sync", "async", "exit"] = "sync"
) -> list[float]:
    """Run the counter graph for ``n`` super-steps; returns node timestamps."""
    app, saver = _counter_app(folder, n)
    MARKS.clear()
    app.invoke({"i": 0}, _config(n), durability=durability)
    saver.conn.close()
    return list(MARKS)


def _until_final(app: Any, config: Any, expected: int) -> int:
    """Read the thread's latest checkpoint until it shows the final value; returns reads."""
    reads = 0
    while True:
        reads += 1
        state = app.get_state(config)
        values = state.values
        value = values.get("i") if isinstance(values, dict) else values
        if value == expected and not state.next:
            return reads
        if reads >= 10_000:
            raise RuntimeError(f"LangGraph: final checkpoint never readable ({state})")
        time.sleep(0.001)


def steps_e2e(folder: str, n: int) -> dict[str, Any]:
    """``n`` super-steps with ``durability="sync"``, until the final checkpoint is readable.

    The saver's tables are created before the clock starts (kernelext's store is open too).
    """
    app, saver = _counter_app(folder, n)
    saver.setup()
    config = _config(n)
    MARKS.clear()
    start = time.perf_counter()
    app.invoke({"i": 0}, config, durability="sync")
    reads = _until_final(app, config, n)
    total = time.perf_counter() - start
    saver.conn.close()
    return {"total_s": total, "marks": list(MARKS), "reads": reads}


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


def effects_e2e(folder: str, calls: int) -> dict[str, Any]:
    """``calls`` tasks (SqliteSaver, ``durability="sync"``) until the final checkpoint is
    readable; MARKS gets a timestamp after each task."""
    from langgraph.func import entrypoint, task

    @task
    def ping(i: int) -> dict[str, Any]:
        return bare_call(i)

    saver = _saver(os.path.join(folder, "langgraph-effects.sqlite"))
    saver.setup()

    @entrypoint(checkpointer=saver)
    def workflow(count: int) -> int:
        for i in range(count):
            ping(i).result()
            MARKS.append(time.perf_counter())
        return count

    config: Any = {"configurable": {"thread_id": "bench"}}
    MARKS.clear()
    start = time.perf_counter()
    workflow.invoke(calls, config, durability="sync")
    reads = _until_final(workflow, config, calls)
    total = time.perf_counter() - start
    saver.conn.close()
    return {"total_s": total, "marks": list(MARKS), "reads": reads}


class _Batch(TypedDict):
    n: int
    results: Annotated[list[bool], operator.add]


def batch_e2e(folder: str, n: int, concurrency: int) -> dict[str, Any]:
    """``n`` POSTs as a ``Send`` fan-out (one node run per item, ``max_concurrency``),
    SqliteSaver, ``durability="sync"``, until the final checkpoint holds every result."""
    from langgraph.graph import END, START, StateGraph
    from langgraph.types import Send

    from .batch_http import post

    def fan_out(state: _Batch) -> list[Any]:  # (not list[Send]: LangGraph reads it)
        return [Send("post", {"i": i}) for i in range(state["n"])]

    def post_node(arg: dict[str, int]) -> dict[str, Any]:
        return {"results": [bool(post(arg["i"])["ok"])]}

    graph = StateGraph(_Batch)
    graph.add_node("post", post_node)  # type: ignore[call-overload]
    graph.add_conditional_edges(START, fan_out, ["post"])
    graph.add_edge("post", END)
    saver = _saver(os.path.join(folder, "langgraph-batch.sqlite"))
    saver.setup()
    app = graph.compile(checkpointer=saver)
    config: Any = {"configurable": {"thread_id": "bench"}, "max_concurrency": concurrency}
    start = time.perf_counter()
    app.invoke({"n": n, "results": []}, config, durability="sync")
    reads = 0
    while True:
        reads += 1
        state = app.get_state(config)
        if len(state.values.get("results", [])) == n and not state.next:
            break
        if reads >= 10_000:
            raise RuntimeError("LangGraph: the batch's final checkpoint never readable")
        time.sleep(0.001)
    total = time.perf_counter() - start
    saver.conn.close()
    return {"total_s": total, "reads": reads}
