"""What a decorated function may be, and what an effect's function may return: the checks
behind ``@kx.effect`` and ``@kx.agent`` (a generator function is refused, an ``async def``
is awaited, a result that is work not yet run is refused)."""

from __future__ import annotations

import asyncio
import collections.abc
import concurrent.futures
import contextlib
import functools
import inspect

from ._validate import _kind, _shown

__all__ = [
    "check_agent_function",
    "check_approval_rule",
    "check_effect_function",
    "is_async_function",
    "refuse_unrun_result",
]


def _async_call(fn: object) -> bool:
    """A callable object whose ``__call__`` is ``async def``."""
    if inspect.isroutine(fn) or isinstance(fn, type):
        return False
    call = type(fn).__dict__.get("__call__") or getattr(type(fn), "__call__", None)  # noqa: B004
    return inspect.iscoroutinefunction(call)


def is_async_function(fn: object) -> bool:
    """An ``async def`` (or a partial of one, a callable whose ``__call__`` is one, an
    async effect): calling it gives a coroutine to await."""
    Effect = _kind("Effect")
    if Effect is not None and isinstance(fn, Effect):
        return bool(getattr(fn, "is_async", False))
    if isinstance(fn, (staticmethod, classmethod)):
        fn = fn.__func__
    while isinstance(fn, functools.partial):
        fn = fn.func
    return inspect.iscoroutinefunction(fn) or _async_call(fn)


def check_effect_function(fn: object) -> None:
    """What ``@kx.effect`` may wrap: a function or callable, plain or ``async def``.

    A generator function returns without running its body, so the ledger would record
    ``applied`` for work that never happened: refused here. An ``async def`` is awaited
    by the effect itself (``ledger.effect_async``): the intent is durable before the tool's first
    ``await``, the outcome recorded once it returned.
    """
    Effect = _kind("Effect")
    if Effect is not None and isinstance(fn, Effect):
        raise TypeError(
            f"{fn!r} is already an effect: wrapping it again would record each call twice. "
            "To give it another name, wrap its function: kx.effect(name=...)(effect.fn)."
        )
    if isinstance(fn, (staticmethod, classmethod)):  # judge the function it holds
        fn = fn.__func__
    while isinstance(fn, functools.partial):
        fn = fn.func
    if not callable(fn):
        raise TypeError(
            "kx.effect takes the function to record (use it as @kx.effect above a def, or "
            f"kx.effect(fn)), not {type(fn).__name__} {_shown(fn)}. Options are keywords: "
            "@kx.effect(name='send', resumable=False)."
        )
    name = getattr(fn, "__name__", type(fn).__name__)
    if inspect.isasyncgenfunction(fn) or inspect.isgeneratorfunction(fn):
        raise TypeError(
            f"@kx.effect cannot wrap {name}: it is a generator function, whose body runs only "
            "when the generator is iterated, after the ledger would have recorded it as "
            "applied. Make the effect a plain function that does the work and returns its "
            "result (e.g. return list(...)), and iterate in the agent."
        )


def check_approval_rule(rule: object) -> None:
    """``@kx.effect(needs_approval=...)``: a bool, or a function of the call's arguments."""
    if not isinstance(rule, bool) and not callable(rule):
        raise TypeError(
            "@kx.effect(needs_approval=...) takes True/False or a function of the call's "
            f"arguments that returns whether it needs approval, not {_shown(rule)}."
        )


def refuse_unrun_result(tool: str, result: object) -> None:
    """An effect's function returned work that has not run: a coroutine, a generator, any
    awaitable (``__await__``), a future, or a lazy one-shot iterator (``map``, ``filter``,
    ``zip``, ``itertools`` objects, any ``Iterator``).

    The object is closed or cancelled where it can be (so nothing of it runs later) and
    ``TypeError`` raised; the ledger records the call ``failed`` with this error. An
    iterator cannot be replayed from the ledger either: return a list instead.
    """
    kind = type(result).__name__
    if inspect.iscoroutine(result) or inspect.isgenerator(result):
        result.close()
    elif inspect.isasyncgen(result):
        pass
    elif isinstance(result, (concurrent.futures.Future, asyncio.Future)):
        cancelled = result.cancel()
        raise TypeError(
            f"Effect {tool} returned a {kind} instead of doing its work: a future is work "
            f"that may not have finished{' (it is cancelled now)' if cancelled else ''}, and "
            "the call is recorded as failed. Wait for it inside the effect and return its "
            "result (future.result()); for a coroutine, make the effect an async def that "
            "awaits it."
        )
    elif inspect.isawaitable(result):
        close = getattr(result, "close", None)
        if callable(close):
            with contextlib.suppress(Exception):  # best effort; the refusal stands
                close()
        raise TypeError(
            f"Effect {tool} returned an awaitable {kind} instead of doing its work: it was "
            "never awaited, so nothing was sent, and the call is recorded as failed. Make the "
            "effect an async def that awaits it and returns its result."
        )
    elif isinstance(result, collections.abc.Iterator):
        raise TypeError(
            f"Effect {tool} returned a lazy iterator ({kind}) instead of its result: its "
            "work runs only when it is iterated, after the ledger would have recorded the "
            "call as applied, and an iterator cannot be replayed. The call is recorded as "
            "failed; return a list instead (return list(...))."
        )
    else:
        return
    raise TypeError(
        f"Effect {tool} returned a {kind} instead of doing its work: the {kind} was never "
        "run (it is closed now), so nothing was sent, and the call is recorded as failed. "
        "An effect must do the work before it returns: make it an async def that awaits the "
        "coroutine (kernelext awaits the effect), or return list(generator)."
    )


def check_agent_function(fn: object) -> None:
    """What ``@kx.agent`` may wrap: a function that takes the run first, plain or
    ``async def`` (run on an event loop of its own in the run's worker thread)."""
    if not callable(fn) or isinstance(fn, type):
        raise TypeError(
            "kx.agent takes the agent function, def f(run, ...) (use it as @kx.agent above a "
            f"def), not {type(fn).__name__} {_shown(fn)}. Options are keywords: "
            "@kx.agent(name='triage', max_step_seconds=60)."
        )
    if inspect.isasyncgenfunction(fn) or inspect.isgeneratorfunction(fn):
        raise TypeError(
            f"@kx.agent cannot run {getattr(fn, '__name__', fn)!r}: it is a generator function, "
            "whose body would never run. Make it a plain def that loops over run.steps(...)."
        )
