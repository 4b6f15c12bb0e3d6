"""Process-wide registries: agents by name, live runs and their handles, resume guards."""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from ..errors import RunStateError

if TYPE_CHECKING:
    from .agent import Agent
    from .handle import Handle

__all__ = ["AGENTS", "ARGS_CACHE", "END_HOOKS", "HANDLES", "LIVE_RUNS", "live_handle", "resuming"]

AGENTS: dict[str, Agent] = {}
LIVE_RUNS: dict[str, Handle] = {}  # run id -> handle of a run executing in this process
# run id -> the newest handle of that run in this process, live or not (panels listen to it)
HANDLES: weakref.WeakValueDictionary[str, Handle] = weakref.WeakValueDictionary()
LIVE_LOCK = threading.Lock()
# run id -> (thread, depth) of the one resume of that run under way in this process
_RESUMING: dict[str, tuple[int, int]] = {}
_RESUMING_LOCK = threading.Lock()

# Arguments that are not JSON can only be reused for a resume in this same process.
ARGS_CACHE: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {}
# Called with (run_id, status) whenever a run of this process reaches a final or
# suspended state.
END_HOOKS: list[Callable[[str, str], None]] = []


def live_handle(run_id: str) -> Handle | None:
    with LIVE_LOCK:
        handle = LIVE_RUNS.get(run_id)
    if handle is not None and not handle.alive:
        return None
    return handle


@contextlib.contextmanager
def resuming(run_id: str) -> Iterator[None]:
    """Hold ``run_id`` for one resume in this process: check, take over, launch.

    A second thread that tries to resume the same run meanwhile gets ``RunStateError``
    at once (it does not wait: one resume wins, the other is told so). The thread that
    holds it may enter again (a resume that hands over to the ``%%agent`` path).
    Across processes the run's lease decides (see ``lease.check_takeover``).
    """
    me = threading.get_ident()
    with _RESUMING_LOCK:
        holder, depth = _RESUMING.get(run_id, (me, 0))
        if holder != me:
            raise RunStateError(
                f"Run {run_id!r} is already being resumed in this process (by another "
                "thread). Use the handle that call returns; wait for the run with its .wait()."
            )
        _RESUMING[run_id] = (me, depth + 1)
    try:
        yield
    finally:
        with _RESUMING_LOCK:
            holder, depth = _RESUMING[run_id]
            if depth > 1:
                _RESUMING[run_id] = (holder, depth - 1)
            else:
                del _RESUMING[run_id]
