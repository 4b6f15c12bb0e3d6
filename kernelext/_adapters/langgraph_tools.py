"""``kx.langgraph.tool``: a LangGraph tool's calls as kernelext effects.

Each call of a tool made by :func:`tool` is a ledger row keyed by the LangGraph task that
calls it (and the tool call id under a ``ToolNode``), so a node that runs again replays the
applied calls instead of repeating them. :func:`require` imports LangGraph or LangChain on
first use and names the extra to install when they are missing.
"""

from __future__ import annotations

import contextvars
import functools
import importlib
import inspect
import threading
import weakref
from collections.abc import Callable
from typing import Any, cast

from .._core.engine.context import current_run, reset_current_run, set_current_run
from .._core.engine.run_engine import RunEngine
from .._core.ledger.effect import Effect
from .turns import CallSite

__all__ = ["INSTALL", "require", "tool"]

INSTALL = "pip install 'kernelext[langgraph]'"
_TOOL_CALL: contextvars.ContextVar[str | None] = contextvars.ContextVar("kx_call", default=None)
_EXTRAS: contextvars.ContextVar[dict[str, Any]] = contextvars.ContextVar("kx_tool_extras")
_CALLS: weakref.WeakKeyDictionary[Any, dict[tuple[str, int], int]] = weakref.WeakKeyDictionary()
_CALLS_LOCK = threading.Lock()
_EXTRA_NAMES = frozenset({"config", "callbacks", "run_manager"})


def require(module: str) -> Any:
    """Import ``module`` (LangGraph, LangChain, or the saver that needs them); missing, an
    ``ImportError`` that names the extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        if str(exc).endswith(INSTALL):  # the saver's own message already says it
            raise
        raise ImportError(
            f"kx.langgraph needs LangGraph ({exc}). Install the extra: {INSTALL}"
        ) from exc


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
        tools = require("langchain_core.tools")
        extras = set(_EXTRA_NAMES)
        if isinstance(target, tools.StructuredTool) and target.func is not None:
            tool_name = name or target.name
            own = "idempotency_key" in (_shown(target) or ())  # the model gives it: not kernelext's
            call = _recorder(
                target.func,
                tool_name,
                extras,
                retry=retry,
                resumable=resumable,
                injects_key=not own,
            )
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
    shown = _shown(made)
    return set() if shown is None else set(made.args) - shown


def _shown(made: Any) -> set[str] | None:
    """The arguments the model is shown (and gives) for a tool; None: not known."""
    try:
        return set(made.tool_call_schema.model_json_schema().get("properties", {}))
    except Exception:  # a schema given as JSON
        return None


def _recorder(
    fn: Callable[..., Any],
    tool_name: str,
    extras: set[str],
    *,
    retry: bool,
    resumable: bool,
    injects_key: bool = True,
) -> Callable[..., Any]:
    """``fn`` as a recorded effect whose key comes from the LangGraph task calling it
    (``injects_key=False``: an ``idempotency_key`` argument is the model's, handed as given)."""

    @functools.wraps(fn)
    def inner(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs, **_EXTRAS.get({}))

    effect = Effect(
        inner, name=tool_name, resumable=resumable, retry=retry, injects_key=injects_key
    )

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        run = current_run()
        if run is None:
            return fn(*args, **kwargs)
        token = _EXTRAS.set({k: kwargs.pop(k) for k in list(kwargs) if k in extras})
        site = _call_site(run)
        outer = set_current_run(cast(RunEngine, CallSite(run, site))) if site else None
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
        config = require("langgraph.config").get_config()
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
    base = run.base if isinstance(run, CallSite) else run
    with _CALLS_LOCK:
        counts = _CALLS.setdefault(base, {})
        ordinal = counts.get((step_key, attempt), 0)
        counts[(step_key, attempt)] = ordinal + 1
    current = base.current
    return step_key, current.ordinal if current is not None else None, ordinal


@functools.cache
def _tool_class() -> Any:
    """A ``StructuredTool`` that knows its tool call id as it runs; callable as its function."""
    require("langchain_core.tools")
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
