"""``kx.langgraph`` (``kernelext[langgraph]``): a compiled LangGraph graph as a kernelext run.

Each superstep is a step and the boundary between two is a safe point: Stop lands once a
superstep's checkpoint (:class:`KernelextSaver`, ``durability="sync"``) is durable, and
``kx.resume`` continues from it. ``interrupt()`` suspends the run with reason ``input`` and
asks each interrupt as a question (a ``questions`` row, as ``run.ask`` does): ``kx.questions``,
``kx.answer``, the panel and ``kernelext answer`` answer it, and the resumed graph gets the
answer as ``Command(resume=...)``. :func:`tool` (``kernelext._adapters.langgraph_tools``)
makes tool calls effects keyed by the LangGraph task, so a node that runs again does not
repeat them. LangGraph is imported on first use.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import uuid
from typing import TYPE_CHECKING, Any, NoReturn, cast

from .._core.encoding.codec import loads_json
from .._core.encoding.secrets import scrub
from .._core.engine.run_engine import RunEngine
from .._core.lifecycle.agent import Agent
from .._core.lifecycle.agent import agent as kx_agent
from .._core.lifecycle.control import resume as kx_resume
from .._core.lifecycle.handle import Handle
from .._core.lifecycle.run import Run, engine_of
from .._core.people.questions import answer as answer_question
from .._core.people.waiting import wait_for_person
from .._core.process.api import open_store
from .._store import Store
from ..errors import AgentError, RunStateError
from ..status import Reason, Status
from .langgraph_tools import require, tool

if TYPE_CHECKING:  # at run time it comes from __getattr__, when first used
    from .langgraph_saver import KernelextSaver

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

INTERRUPT_EVENT = "langgraph_interrupt"  # detail: {"interrupts": [{"id", "key", "value"}], …}
ANSWER_EVENT = "langgraph_answer"  # resumed with an answer; detail: {"interrupt_id", "key"}
_KEYS = uuid.UUID("5d7c2a4e-8f0b-4c61-9a3e-2b6f1d0c7e95")  # the namespace of interrupt keys
_STREAM_MODES = ["checkpoints"]  # a boundary event per superstep, before it runs
_NO_INPUT = object()
_LAUNCH: dict[str, tuple[Any, dict[str, Any] | None]] = {}  # run id -> (input, config)
_CONFIGS: dict[str, dict[str, Any] | None] = {}  # agent name -> config given to agent()


def __getattr__(name: str) -> Any:
    if name == "KernelextSaver":
        return require("kernelext._adapters.langgraph_saver").KernelextSaver
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
        return _drive(engine_of(run), graph, agent_name)

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


def _drive(run: RunEngine, graph: Any, agent_name: str) -> Any:
    """The agent function: stream the graph, one kernelext step per superstep."""
    saver = require("kernelext._adapters.langgraph_saver").KernelextSaver(run.store)
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


def _boundary(run: RunEngine, chunk: dict[str, Any]) -> None:
    """A checkpoint is durable: its superstep is a completed step; a safe point follows."""
    step = int(chunk["metadata"]["step"])
    run.state["superstep"] = step
    run.state["checkpoint_id"] = chunk["config"]["configurable"]["checkpoint_id"]
    following = list(chunk.get("next") or ())
    if following:
        run.begin_step(f"superstep {step + 1}", ", ".join(following))  # safe point first
    else:
        run.finish_open_step()
        run.safe_point()


def _resume_input(run: RunEngine, state: Any) -> Any:
    """None, or ``Command(resume=...)`` with the answers stored for the open interrupts
    (``questions``); none answered yet: ask (again) and suspend."""
    waiting = [str(i.id) for i in getattr(state, "interrupts", ())]
    if not waiting:
        return None
    given: dict[str, Any] = {}
    for interrupt_id in waiting:
        row = run.store.question_row(interrupt_key(run.id, interrupt_id))
        if row is not None and row["answered_at"] is not None:
            given[interrupt_id] = loads_json(row["answer"]) if row["answer"] is not None else None
    if not given:
        _suspend_for_input(run, state)
    for interrupt_id in given:  # the timeline: the graph goes on with this answer
        detail = {"interrupt_id": interrupt_id, "key": str(interrupt_key(run.id, interrupt_id))}
        run.store.record_event(run.id, ANSWER_EVENT, source="langgraph", detail=detail)
    types = require("langgraph.types")
    if len(waiting) == 1:
        return types.Command(resume=given[waiting[0]])
    return types.Command(resume=given)


def _suspend_for_input(run: RunEngine, state: Any) -> NoReturn:
    """Ask every open interrupt that is not asked yet (or whose question expired) as a
    question, then suspend with reason ``input`` until they are answered."""
    interrupts = list(getattr(state, "interrupts", ()))
    if not interrupts:  # a breakpoint (interrupt_before/after): nothing to answer
        note = f"LangGraph stopped at a breakpoint before {list(state.next)}; go on with "
        wait_for_person(run, Reason.INPUT, None, note + f"kx.resume({run.id!r})")
    store, now = run.store, run.store.now()
    fresh, deadlines = [], []
    for index, item in enumerate(interrupts):
        key = interrupt_key(run.id, str(item.id))
        row = store.question_row(key)
        if row is not None and row["answered_at"] is not None:
            continue  # answered: the next resume hands it to the graph
        if row is not None and (row["expires_at"] is None or row["expires_at"] > now):
            deadlines += [row["expires_at"]] if row["expires_at"] is not None else []
            continue  # asked before and still open: not asked again
        fresh.append((index, key, item))
    if fresh:  # the timeline: what the graph asks, its values as JSON
        asked = [{"id": str(i.id), "key": str(k), "value": i.value} for _, k, i in fresh]
        detail = {"interrupts": asked, "next": list(state.next)}
        store.record_event(run.id, INTERRUPT_EVENT, source="langgraph", detail=detail)
    step = run.current.key if run.current is not None else ", ".join(state.next)
    for index, key, item in fresh:
        deadline = store.expiry.deadline(Reason.INPUT, now)  # the runtime's policy
        schema = item.response_schema if isinstance(item.response_schema, dict) else {}
        with run.force.critical():
            store.ask_question(
                {
                    "key": key,
                    "run_id": run.id,
                    "step": step,
                    "step_ordinal": run.current.ordinal if run.current is not None else None,
                    "call_ordinal": index,
                    "prompt": _prompt(item.value),
                    "answer_schema": json.dumps(schema, sort_keys=True, default=str),
                    "default_answer": None,
                    "expires_at": deadline,
                }
            )
        deadlines.append(deadline)
    note = f"LangGraph waits for {len(interrupts)} answer(s): kx.answer({run.id!r}, ...)"
    wait_for_person(run, Reason.INPUT, min(deadlines, default=None), note)


def _prompt(value: Any) -> str:
    """An interrupt's value as the question's text: a string as is, else its JSON."""
    shown = scrub(value)
    if isinstance(shown, str) and shown.strip():
        return shown
    return json.dumps(shown, ensure_ascii=False, default=str)


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
def interrupt_key(run_id: str, interrupt_id: str) -> uuid.UUID:
    """The key of the question (``questions`` row, ``kx.questions``) that asks the interrupt
    ``interrupt_id`` of run ``run_id``; LangGraph gives every ``interrupt()`` call its own id."""
    return uuid.uuid5(_KEYS, f"{run_id}\0{interrupt_id}")


def pending_interrupts(run_id: str, *, store: Store | None = None) -> list[dict[str, Any]]:
    """The interrupts run ``run_id`` waits on and nobody answered: ``[{"id", "key", "value"}]``
    with the interrupt's value as given to ``interrupt()`` (JSON, secrets scrubbed)."""
    store = store or open_store()
    open_keys = {str(row["key"]) for row in store.open_questions(run_id, store.now())}
    asked: dict[str, dict[str, Any]] = {}
    for event in store.events(run_id):
        if event["kind"] == INTERRUPT_EVENT and event.get("detail"):
            for item in json.loads(event["detail"]).get("interrupts") or ():
                asked[str(item.get("id"))] = item
    return [i for i in asked.values() if str(interrupt_key(run_id, i["id"])) in open_keys]


def pending_interrupt(run_id: str, *, store: Store | None = None) -> dict[str, Any] | None:
    """The first interrupt run ``run_id`` waits on (``{"id", "key", "value"}``), else None."""
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
    """Answer the run's ``interrupt()``: ``kx.answer(run_id, value)`` for a LangGraph run,
    which resumes it by default (here also when another process ran it). ``interrupt(...)``
    returns ``value`` in the node (``Command(resume=value)``). With several open interrupts,
    name one with ``interrupt_id`` (see :func:`pending_interrupts`)."""
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
    key = interrupt_key(run_id, chosen)
    handle = answer_question(run_id, value, key=key, store=store, resume=resume)
    if resume and handle is None and not store.open_questions(run_id, store.now()):
        return kx_resume(run_id, store=store)  # a run of another (restarted) kernel goes on here
    return cast("Handle | None", handle)
