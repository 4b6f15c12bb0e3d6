"""One event loop per process for the agent frameworks' runs.

A framework's agent holds async clients (``AsyncOpenAI``, an ``httpx.AsyncClient``) whose
pooled connections belong to the event loop they were opened on. An ``async def`` kernelext
agent runs on a loop of its own that is closed when the run ends, so the same agent resumed
in the same kernel would meet connections of a closed loop ("Event loop is closed"). The
frameworks' runs therefore share one loop that lives as long as the process, as they would
in a notebook: :func:`run_on_adapter_loop` runs a coroutine there, in the caller's context
(the current run), and waits for it in the run's own thread.

A stop at a safe point is raised inside the coroutine and comes back as its exception. An
exception raised into the waiting thread (a person's Force stop) cancels the coroutine's
task, waits until it ended (its effects settled: a call cut mid-way is ``unknown``) and
goes on in the thread. A tool call in flight holds a person's Force stop back (up to
``force_call_grace``, ``turns.record_tool_call``), so such a call keeps its real outcome.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["run_on_adapter_loop"]

T = TypeVar("T")
_POLL = 0.1  # seconds: how often the waiting thread can take an exception raised into it
_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None


def _adapter_loop() -> asyncio.AbstractEventLoop:
    global _loop
    with _lock:
        if _loop is None or _loop.is_closed():
            loop = asyncio.new_event_loop()
            thread = threading.Thread(
                target=loop.run_forever, name="kernelext-agent-frameworks", daemon=True
            )
            thread.start()
            _loop = loop
        return _loop


def run_on_adapter_loop(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """``make()``'s coroutine run to its end on the process's framework loop."""
    loop = _adapter_loop()
    context = contextvars.copy_context()
    done: concurrent.futures.Future[T] = concurrent.futures.Future()
    tasks: list[asyncio.Task[T]] = []
    started = threading.Event()

    def launch() -> None:
        task = context.run(lambda: loop.create_task(make()))  # the task copies the context
        tasks.append(task)
        started.set()
        task.add_done_callback(lambda t: _settle(t, done))

    loop.call_soon_threadsafe(launch)
    try:
        return _wait(done)
    except BaseException:
        if not done.done():  # raised into this thread: the coroutine is cancelled
            started.wait()
            loop.call_soon_threadsafe(tasks[0].cancel)
            concurrent.futures.wait([done])
        raise


def _wait(done: concurrent.futures.Future[T]) -> T:
    while True:  # a bounded wait, so that an exception raised into the thread lands
        try:
            return done.result(timeout=_POLL)
        except concurrent.futures.TimeoutError:
            continue


def _settle(task: asyncio.Task[T], done: concurrent.futures.Future[T]) -> None:
    if task.cancelled():
        done.set_exception(asyncio.CancelledError())
    elif (error := task.exception()) is not None:
        done.set_exception(error)
    else:
        done.set_result(task.result())
