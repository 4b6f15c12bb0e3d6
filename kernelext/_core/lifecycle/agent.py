"""``@kx.agent``: declare an agent; ``Agent.start`` runs it in a worker thread."""

from __future__ import annotations

import functools
import hashlib
import inspect
from collections.abc import Callable
from typing import Any, overload

from ..._shown import shows
from ..._store import Store
from ..._validate import check_duration, check_flag, check_name, check_store
from ..._validate_functions import check_agent_function
from ..plan.code import remember_agent_source
from ..process.runtime import runtime
from .handle import Handle
from .starting import start_run

__all__ = ["Agent", "agent", "fingerprint"]


def fingerprint(fn: Callable[..., Any]) -> str:
    """A hash of the agent's source (or bytecode when the source is not available)."""
    try:
        text = inspect.getsource(fn).encode()
    except (OSError, TypeError):
        code = getattr(fn, "__code__", None)
        text = code.co_code if code is not None else repr(fn).encode()
    return hashlib.sha256(text).hexdigest()[:16]


class Agent:
    """What ``@kx.agent`` returns: call ``.start(...)`` to run it in the background."""

    def __init__(
        self, fn: Callable[..., Any], name: str, max_step_seconds: float | None, pickle: bool
    ) -> None:
        check_agent_function(fn)
        self.fn = fn
        self.name = check_name("kx.Agent(name)", name)
        self.max_step_seconds = check_duration(
            "kx.Agent(max_step_seconds)", max_step_seconds, allow_none=True
        )
        self.pickle = check_flag("kx.Agent(pickle)", pickle)
        self.fingerprint = fingerprint(fn)
        remember_agent_source(self.fingerprint, fn)  # kx.plan shows a diff once it changes
        functools.update_wrapper(self, fn)

    def start(
        self, *args: Any, run_id: str | None = None, store: Store | None = None, **kwargs: Any
    ) -> Handle:
        """Start a new run in a worker thread and return its handle at once."""
        if run_id is not None:
            check_name(f"{self.name}.start(run_id=...)", run_id)
        check_store(f"{self.name}.start(store=...)", store)
        return start_run(self, args, kwargs, run_id=run_id, store=store)

    def run(
        self, *args: Any, run_id: str | None = None, store: Store | None = None, **kwargs: Any
    ) -> Handle:
        """Start and wait: for scripts and tests."""
        handle = self.start(*args, run_id=run_id, store=store, **kwargs)
        handle.wait()
        return handle

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    @shows
    def __repr__(self) -> str:
        return f"<kernelext agent {self.name!r}>"


@overload
def agent(fn: Callable[..., Any], /) -> Agent: ...


@overload
def agent(
    fn: None = None,
    /,
    *,
    name: str | None = None,
    max_step_seconds: float | None = None,
    pickle: bool = False,
) -> Callable[[Callable[..., Any]], Agent]: ...


def agent(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    max_step_seconds: float | None = None,
    pickle: bool = False,
) -> Agent | Callable[[Callable[..., Any]], Agent]:
    """Declare an agent: ``@kx.agent(name="triage", max_step_seconds=60)``.

    An ``async def`` agent runs on an event loop of its own in the run's worker thread,
    never on the caller's (a kernel's) loop; it awaits ``run.amap`` for a batch.
    """
    if name is not None:  # the options first, so that a bad one is named before any def
        check_name("@kx.agent(name=...)", name)
    max_step_seconds = check_duration(
        "@kx.agent(max_step_seconds=...)", max_step_seconds, allow_none=True
    )
    check_flag("@kx.agent(pickle=...)", pickle)

    def wrap(func: Callable[..., Any]) -> Agent:
        check_agent_function(func)
        made = Agent(func, name or func.__name__, max_step_seconds, pickle)
        runtime().agents[made.name] = made
        return made

    return wrap(fn) if fn is not None else wrap
