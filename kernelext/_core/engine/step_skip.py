"""Skipping the body of a ``with run.step(...)`` block that completed before (a resume).

A ``with`` statement cannot skip its own body, so a completed step's body is jumped over
the way debuggers jump: ``__enter__`` makes the calling frame traced and gives it a trace
function that raises ``_SkipBody`` at the body's first line event; ``__exit__`` swallows
exactly that exception. The invariants ``StepContext`` keeps:

1. **Nothing of a completed step runs again.** Its body raises ``_SkipBody`` before its
   first line executes; its effects are not called, its state changes are not made (the
   state is the snapshot the step completed with).
2. **Only the one frame is traced, only for the body.** The trace is installed after the
   step is known to be completed (``begin_step`` returned False: no bookkeeping runs
   traced) and removed in ``__exit__``: the frame's ``f_trace`` is cleared and the
   thread's previous trace function (a debugger's, a coverage tool's) is put back.
   ``sys.settrace`` is per thread: other threads never see it.
3. **``_SkipBody`` never escapes.** ``__exit__`` swallows ``_SkipBody`` and nothing else;
   any other exception (a stop, an error) goes on as it would have.
4. **A step that runs is completed only when its body ends normally.** An exception
   leaves it open for the worker to end (cancelled, failed) with the run; a safe point
   follows at the next step.

While a body is skipped, the thread is traced: a forced stop raised then must land, never
be cancelled (see ``forced_stop``, invariant 5).
"""

from __future__ import annotations

import sys
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .run_engine import RunEngine

__all__ = ["StepContext"]


class _SkipBody(Exception):
    pass


class StepContext:
    """Context manager behind ``run.step``; skips its body when already completed."""

    def __init__(self, engine: RunEngine, key: str, name: str) -> None:
        self._engine = engine
        self.key = key
        self.name = name
        self.skipped = False
        self._old_trace: Any = None

    def __enter__(self) -> StepContext:
        if self._engine.begin_step(self.key, self.name):
            return self
        # Completed before: skip the body (the same technique debuggers use to jump).
        self.skipped = True
        self._old_trace = sys.gettrace()
        frame = sys._getframe(1)
        sys.settrace(lambda *args: None)
        frame.f_trace = self._skip
        return self

    def _skip(self, frame: FrameType, event: str, arg: Any) -> Any:
        raise _SkipBody

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        if self.skipped:
            sys.settrace(self._old_trace)
            frame = sys._getframe(1)
            frame.f_trace = None
            return kind is _SkipBody
        if kind is None:
            self._engine.finish_open_step()
        return False
