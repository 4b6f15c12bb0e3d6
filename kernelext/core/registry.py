"""Process-wide registries: agents by name, live runs, resume hooks."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .engine import Agent, Handle
    from .run import Run

__all__ = ["AGENTS", "HANDLES", "LIVE", "RESUME_HOOKS", "live_handle"]

AGENTS: dict[str, Agent] = {}
LIVE: dict[str, Handle] = {}  # run id -> handle of a run executing in this process
# run id -> the newest handle of that run in this process, live or not (panels listen to it)
HANDLES: weakref.WeakValueDictionary[str, Handle] = weakref.WeakValueDictionary()
LIVE_LOCK = threading.Lock()

# Called with (run, store) before a resumed run executes anything; a hook may raise
# NeedsDecision (with a reason) to stop the resume before the first action.
RESUME_HOOKS: list[Callable[[Run, Any], None]] = []
# Called with (run_id, status) whenever a run of this process reaches a final or
# suspended state.
END_HOOKS: list[Callable[[str, str], None]] = []


def live_handle(run_id: str) -> Handle | None:
    with LIVE_LOCK:
        handle = LIVE.get(run_id)
    if handle is not None and not handle.alive:
        return None
    return handle
