"""``kx.langgraph`` (``kernelext[langgraph]``): a compiled LangGraph graph as a kernelext run.

Each superstep is a step and the boundary between two is a safe point: Stop lands once a
superstep's checkpoint (:class:`KernelextSaver`, ``durability="sync"``) is durable, and
``kx.resume`` continues from it. ``interrupt()`` suspends the run with reason ``input``;
:func:`answer` resumes it. :func:`tool` makes tool calls effects keyed by the LangGraph
task, so a node that runs again does not repeat them. LangGraph is imported on first use.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import hashlib
import importlib
import inspect
import json
import threading
import uuid
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from ..core.agent import Agent
from ..core.agent import agent as kx_agent
from ..core.api import open_store
from ..core.context import current_run, reset_current_run, set_current_run
from ..core.control import resume as kx_resume
from ..core.handle import Handle
from ..core.ledger import effect as kx_effect
from ..core.run import Run
from ..errors import AgentError, RunStateError, StopRequested
from ..status import Reason, Status
from ..store import Store, actor

if TYPE_CHECKING:  # at run time it comes from __getattr__, when first used
    from .langgraph_saver import KernelextSaver

__all__ = [
    "ANSWER_EVENT",
    "INTERRUPT_EVENT",
    "KernelextSaver",
    "agent",
    "answer",
    "pending_interrupt",
    "pending_interrupts",
    "start",
    "tool",
]

INTERRUPT_EVENT = "langgraph_interrupt"  # detail: {"interrupts": [{"id", "value"}], "next"}
ANSWER_EVENT = "langgraph_answer"  # detail: {"interrupt_id", "value"}
_STREAM_MODES = ["checkpoints"]  # a boundary event per superstep, before it runs
INSTALL = "pip install 'kernelext[langgraph]'"
_NO_INPUT = object()
_LAUNCH: dict[str, tuple[Any, dict[str, Any] | None]] = {}  # run id -> (input, config)
_CONFIGS: dict[str, dict[str, Any] | None] = {}  # agent name -> config given to agent()
_TOOL_CALL: contextvars.ContextVar[str | None] = contextvars.ContextVar("kx_call", default=None)
_EXTRAS: contextvars.ContextVar[dict[str, Any]] = contextvars.ContextVar("kx_tool_extras")
_CALLS: weakref.WeakKeyDictionary[Any, dict[tuple[str, int], int]] = weakref.WeakKeyDictionary()
_CALLS_LOCK = threading.Lock()
_EXTRA_NAMES = frozenset({"config", "callbacks", "run_manager"})


def _require(module: str) -> Any:
    """Import ``module`` (LangGraph, LangChain, or the saver that needs them)."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        if str(exc).endswith(INSTALL):  # the saver's own message already says it
            raise
        raise ImportError(
            f"kx.langgraph needs LangGraph ({exc}). Install the extra: {INSTALL}"
        ) from exc


def __getattr__(name: str) -> Any:
    if name == "KernelextSaver":
        return _require("kernelext.adapters.langgraph_saver").KernelextSaver
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# -- running a graph as a run ------------------------------------------------------------
def agent(
    graph: Any,
    *,
    name: str | None = None,
    config: dict[str, Any] | None = None,
    max_step_seconds: float | None = None,
) -> Agent:
    """Register ``graph`` (compiled) as a kernelext agent, so ``kx.resume`` can continue its
    runs. :func:`start` does this; after a kernel restart, build the graph again and call
    ``kx.langgraph.agent(graph)`` before ``kx.resume(run_id)``. ``config`` is used by every
    run that :func:`start` gave none (kept in this process, never stored)."""
    if not hasattr(graph, "stream") or not hasattr(graph, "copy"):
        raise TypeError(
            f"kx.langgraph needs a compiled graph (builder.compile()), not {type(graph).__name__}."
        )
    agent_name = name or f"langgraph:{getattr(graph, 'name', None) or 'LangGraph'}"

    def drive(run: Run) -> Any:
        return _drive(run, graph, agent_name)

    made = kx_agent(name=agent_name, max_step_seconds=max_step_seconds)(drive)
    made.fingerprint = _fingerprint(graph)  # the graph's nodes and wiring, not this module
    if config is not None:
        _CONFIGS[agent_name] = config
    return made


def start(
    graph: Any,
    input: Any,
    *,
    run_id: str | None = None,
    config: dict[str, Any] | None = None,
    name: str | None = None,
    store: Store | None = None,
    max_step_seconds: float | None = None,
) -> Handle:
    """Run ``graph`` on ``input`` as run ``run_id`` (its thread id); returns the handle at
    once: ``h.stop()``, ``h.wait()``, ``kx.resume`` and the panel work as for any run.
    ``config`` is LangGraph's (``recursion_limit``, ``configurable`` …), kept in this process."""
    made = agent(graph, name=name, max_step_seconds=max_step_seconds)
    run_id = run_id or f"{made.name.replace(':', '-')}-{uuid.uuid4().hex[:8]}"
    _LAUNCH[run_id] = (input, config)
    return made.start(run_id=run_id, store=store)


def _drive(run: Run, graph: Any, agent_name: str) -> Any:
    """The agent function: stream the graph, one kernelext step per superstep."""
    saver = _require("kernelext.adapters.langgraph_saver").KernelextSaver(run.store)
    compiled = graph.copy(update={"checkpointer": saver})
    given, user_config = _LAUNCH.get(run.id, (_NO_INPUT, _CONFIGS.get(agent_name)))
    config = _run_config(run.id, user_config)
    if saver.get_tuple(config) is None:
        if given is _NO_INPUT:
            raise AgentError(
                f"Run {run.id!r} has no LangGraph checkpoint yet and its input is not in this "
                "process. Start it again with kx.langgraph.start(graph, input, run_id=...)."
            )
        feed = given
        _LAUNCH[run.id] = (_NO_INPUT, user_config)  # LangGraph's first checkpoint holds it
    else:
        feed = _resume_input(run, compiled.get_state(config))
    chunks = compiled.stream(feed, config, stream_mode=_STREAM_MODES, durability="sync")
    with contextlib.closing(chunks):
        for mode, chunk in chunks:
            if mode == "checkpoints":
                _boundary(run, chunk)
    state = compiled.get_state(config)
    if state.next:  # an interrupt() or a breakpoint: wait for a person
        _suspend_for_input(run, state)
    return state.values


def _run_config(run_id: str, user: dict[str, Any] | None) -> dict[str, Any]:
    configurable = dict((user or {}).get("configurable") or {})
    theirs = configurable.setdefault("thread_id", run_id)
    if str(theirs) != run_id:
        raise ValueError(
            f"The LangGraph thread id of run {run_id!r} is the run id, not {theirs!r}: drop "
            f"thread_id from config, or pass run_id={theirs!r}."
        )
    return {**(user or {}), "configurable": configurable}


def _boundary(run: Run, chunk: dict[str, Any]) -> None:
    """A checkpoint is durable: its superstep is a completed step; a safe point follows."""
    step = int(chunk["metadata"]["step"])
    run.state["superstep"] = step
    run.state["checkpoint_id"] = chunk["config"]["configurable"]["checkpoint_id"]
    following = list(chunk.get("next") or ())
    if following:
        run.begin_step(f"superstep {step + 1}", ", ".join(following))  # safe point first
    else:
        run.finish_open_step()
        run.checkpoint()


def _resume_input(run: Run, state: Any) -> Any:
    """None, or ``Command(resume=...)`` with the answers; no answer yet: suspend again."""
    waiting = [str(i.id) for i in getattr(state, "interrupts", ())]
    if not waiting:
        return None
    answers = _interrupt_log(run.store, run.id)[1]
    given = {i: answers[i] for i in waiting if i in answers}
    if not given:
        _suspend_for_input(run, state, again=True)
    types = _require("langgraph.types")
    if len(waiting) == 1:
        return types.Command(resume=given[waiting[0]])
    return types.Command(resume=given)


def _suspend_for_input(run: Run, state: Any, *, again: bool = False) -> None:
    interrupts = [{"id": str(i.id), "value": i.value} for i in getattr(state, "interrupts", ())]
    if not again:  # the event says what the person is asked; a resume asks again silently
        detail = {"interrupts": interrupts, "next": list(state.next)}
        run.store.record_event(run.id, INTERRUPT_EVENT, source="langgraph", detail=detail)
    how = f"kx.langgraph.answer({run.id!r}, …)" if interrupts else f"kx.resume({run.id!r})"
    what = f"{len(interrupts)} interrupt(s)" if interrupts else f"a breakpoint before {state.next}"
    note = f"LangGraph waits for input ({what}); go on with {how}"
    run.suspend_request = (Reason.INPUT, None, note)
    raise StopRequested(Reason.INPUT)


def _fingerprint(graph: Any) -> str:
    """A hash of the graph's nodes (their code) and wiring: a resume refuses another graph."""
    parts: list[str] = []
    for node_name, node in sorted(getattr(graph, "nodes", {}).items()):
        bound = getattr(node, "bound", None)
        func = getattr(bound, "func", None) or bound
        try:
            code = inspect.getsource(func) if func is not None else ""
        except (OSError, TypeError):
            code = f"{type(bound).__module__}.{type(bound).__qualname__}"
        parts += [node_name, code, repr(sorted(map(str, getattr(node, "triggers", ()))))]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


# -- interrupts and answers ----------------------------------------------------------------
def pending_interrupts(run_id: str, *, store: Store | None = None) -> list[dict[str, Any]]:
    """The interrupts run ``run_id`` waits on and nobody answered: ``[{"id", "value"}]``."""
    asked, answers = _interrupt_log(store or open_store(), run_id)
    return [i for i in asked if str(i.get("id")) not in answers]


def pending_interrupt(run_id: str, *, store: Store | None = None) -> dict[str, Any] | None:
    """The first interrupt run ``run_id`` waits on (``{"id", "value"}``), else None."""
    waiting = pending_interrupts(run_id, store=store)
    return waiting[0] if waiting else None


def answer(
    run_id: str,
    value: Any,
    *,
    interrupt_id: str | None = None,
    resume: bool = True,
    store: Store | None = None,
) -> Handle | None:
    """Answer the run's ``interrupt()`` and (by default) resume it: ``interrupt(...)`` returns
    ``value`` in the node (``Command(resume=value)``). The answer is an ``events`` row
    (``langgraph_answer``, JSON, secrets scrubbed) until the resume consumes it. With several
    open interrupts, name one with ``interrupt_id`` (see :func:`pending_interrupts`)."""
    store = store or open_store()
    row = store.get_run(run_id)
    waiting = pending_interrupts(run_id, store=store)
    if row["status"] != Status.SUSPENDED or not waiting:
        raise RunStateError(
            f"Run {run_id!r} is {row['status']} and waits for no answer. See its events "
            f"(kx.sql(\"SELECT * FROM events WHERE run_id = '{run_id}'\"))."
        )
    ids = [str(i["id"]) for i in waiting]
    chosen = ids[0] if interrupt_id is None and len(ids) == 1 else str(interrupt_id)
    if chosen not in ids:
        raise ValueError(
            f"Run {run_id!r} waits on interrupts {ids}, not {interrupt_id!r}: pass one as "
            "interrupt_id= (kx.langgraph.pending_interrupts shows their values)."
        )
    detail = {"interrupt_id": chosen, "value": value}
    store.record_event(run_id, ANSWER_EVENT, source="api", who=actor(), detail=detail)
    return kx_resume(run_id, store=store) if resume else None


def _interrupt_log(store: Store, run_id: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The newest ``langgraph_interrupt`` event's interrupts; answers since (id -> value)."""
    asked: list[dict[str, Any]] = []
    answers: dict[str, Any] = {}
    for event in store.events(run_id):
        detail = json.loads(event["detail"]) if event.get("detail") else {}
        if event["kind"] == INTERRUPT_EVENT:
            asked, answers = list(detail.get("interrupts") or []), {}
        elif event["kind"] == ANSWER_EVENT:
            answers[str(detail.get("interrupt_id"))] = detail.get("value")
    return asked, answers


# -- tools as effects ----------------------------------------------------------------------
def tool(
    fn: Any = None, /, *, name: str | None = None, retry: bool = False, resumable: bool = True
) -> Any:
    """Record a tool's calls as effects: ``kx.langgraph.tool(send_email)`` or a decorator.

    Takes a LangChain ``@tool``/``StructuredTool`` or a plain function; returns a
    ``StructuredTool`` for ``ToolNode``/``bind_tools`` that can also be called like the
    function. In a run each call is a ledger row keyed by the LangGraph task (and the tool
    call id), so a node that runs again replays applied calls; unknown outcomes go to
    ``kx.reconcile``. Outside a run it is a plain call. ``retry``/``resumable``: ``kx.effect``.
    """

    def wrap(target: Any) -> Any:
        tools = _require("langchain_core.tools")
        extras = set(_EXTRA_NAMES)
        if isinstance(target, tools.StructuredTool) and target.func is not None:
            tool_name = name or target.name
            call = _recorder(target.func, tool_name, extras, retry=retry, resumable=resumable)
            fields = {k: getattr(target, k) for k in type(target).model_fields}
            made = _tool_class()(**{**fields, "name": tool_name, "func": call, "coroutine": None})
        elif callable(target) and not isinstance(target, tools.BaseTool):
            tool_name = str(name or getattr(target, "__name__", "tool"))
            call = _recorder(target, tool_name, extras, retry=retry, resumable=resumable)
            sig = inspect.signature(target)  # the model never sees kernelext's key argument
            hidden = [p for n, p in sig.parameters.items() if n != "idempotency_key"]
            call.__signature__ = sig.replace(parameters=hidden)  # type: ignore[attr-defined]
            doc = inspect.getdoc(target) or tool_name
            made = _tool_class().from_function(call, name=tool_name, description=doc)
        else:
            raise TypeError(
                f"kx.langgraph.tool records plain functions and tools made from a sync function "
                f"(@tool, StructuredTool), not {target!r}: wrap the function it calls."
            )
        extras.update(_injected(made))
        return made

    return wrap(fn) if fn is not None else wrap


def _injected(made: Any) -> set[str]:
    """Arguments LangGraph injects (state, tool call id, runtime): not part of the key."""
    try:
        shown = set(made.tool_call_schema.model_json_schema().get("properties", {}))
        return set(made.args) - shown
    except Exception:  # a schema given as JSON: nothing is injected
        return set()


def _recorder(
    fn: Callable[..., Any], tool_name: str, extras: set[str], *, retry: bool, resumable: bool
) -> Callable[..., Any]:
    """``fn`` as a recorded effect whose key comes from the LangGraph task calling it."""

    @functools.wraps(fn)
    def inner(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs, **_EXTRAS.get({}))

    effect = kx_effect(name=tool_name, retry=retry, resumable=resumable)(inner)

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        run = current_run()
        if run is None:
            return fn(*args, **kwargs)
        token = _EXTRAS.set({k: kwargs.pop(k) for k in list(kwargs) if k in extras})
        site = _call_site(run)
        outer = set_current_run(cast(Run, _AtCallSite(run, site))) if site else None
        try:
            return effect(*args, **kwargs)
        finally:
            if outer is not None:
                reset_current_run(outer)
            _EXTRAS.reset(token)

    return call


def _call_site(run: Any) -> tuple[str, int | None, int] | None:
    """(step key, step ordinal, call ordinal) of a call in a LangGraph task, else None. The
    key names the task (its id derives from the checkpoint it follows: the same when it
    runs again) and the tool call id under a ``ToolNode``; the ordinal counts per attempt."""
    try:
        config = _require("langgraph.config").get_config()
    except RuntimeError:  # not inside a graph
        return None
    conf = config.get("configurable") or {}
    task_id = conf.get("__pregel_task_id")
    if not task_id:
        return None
    meta = config.get("metadata") or {}
    info = getattr(conf.get("__pregel_runtime"), "execution_info", None)
    attempt = int(getattr(info, "node_attempt", 1) or 1)
    step_key = f"{meta.get('langgraph_node')}@{meta.get('langgraph_step')}:{task_id}"
    call_id = _TOOL_CALL.get()
    if call_id:
        step_key += f"/{call_id}"
    base = run.base if isinstance(run, _AtCallSite) else run
    with _CALLS_LOCK:
        counts = _CALLS.setdefault(base, {})
        ordinal = counts.get((step_key, attempt), 0)
        counts[(step_key, attempt)] = ordinal + 1
    current = base.current
    return step_key, current.ordinal if current is not None else None, ordinal


class _AtCallSite:
    """The run as one recorded call sees it: the LangGraph call site, else the run's own."""

    def __init__(self, run: Any, site: tuple[str, int | None, int]) -> None:
        self.base: Any = run.base if isinstance(run, _AtCallSite) else run
        self._site = site

    def next_call(self) -> tuple[str, int | None, int]:
        return self._site

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.base, attr)


@functools.cache
def _tool_class() -> Any:
    """A ``StructuredTool`` that knows its tool call id as it runs; callable as its function."""
    _require("langchain_core.tools")
    from langchain_core.tools import StructuredTool

    class RecordedTool(StructuredTool):
        def run(self, tool_input: Any, *args: Any, **kwargs: Any) -> Any:
            token = _TOOL_CALL.set(kwargs.get("tool_call_id"))
            try:
                return super().run(tool_input, *args, **kwargs)
            finally:
                _TOOL_CALL.reset(token)

        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            assert self.func is not None  # every RecordedTool has the recorded function
            return self.func(*args, **kwargs)

    return RecordedTool
