"""The notebook's interrupt button as a soft stop while an agent runs in the background.

Both of Jupyter's interrupt modes end as a SIGINT in the kernel's main thread.
ipykernel (checked on 6.29-7.4, ``kernelbase.py``) swaps handlers around every
shell message::

    def pre_handler_hook(self):
        self.saved_sigint_handler = signal(SIGINT, default_int_handler)

    def post_handler_hook(self):
        signal(SIGINT, self.saved_sigint_handler)

so while a cell runs, SIGINT raises ``KeyboardInterrupt`` in that cell (the interrupt
belongs to it), and between messages the handler in ``saved_sigint_handler`` is
active (ipykernel's own is ``SIG_IGN``). :class:`InterruptHandler` takes that slot.
While no agent of this process is live (or the ``soft_interrupt`` option is off) it does
what the handler it replaced did; while one is, the first press asks every live run to
stop at its next safe point and a second press within ``interrupt_window`` seconds forces
the stop. Both options are read at each press. ``tests/lifecycle/test_interrupt.py`` pins the
ipykernel internals this relies on.

While a ``%%agent`` cell runs, the main thread is the run's: :func:`cell_interrupts`
takes SIGINT for the cell's duration. The first press records a stop (source
``interrupt``): the cell runs to its end, the run suspends at the boundary after it, and
the queued ``%%agent`` cells are skipped. A second press within ``interrupt_window``
raises ``KeyboardInterrupt`` in the cell, which cancels it as Jupyter's interrupt always
did (effects in flight become ``unknown``). With ``soft_interrupt`` off, the first press
does that.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Iterator
from types import FrameType
from typing import Any

from .._core.process.runtime import runtime
from .._shown import shows
from .options import notebook_option

__all__ = [
    "SOURCE",
    "CellInterrupt",
    "InterruptHandler",
    "cell_interrupts",
    "kernel_supports_soft_interrupt",
    "live_handles",
]

SOURCE = "interrupt"


def kernel_supports_soft_interrupt(kernel: Any) -> bool:
    """True when ``kernel`` restores SIGINT handlers the way this module expects."""
    return all(
        callable(getattr(kernel, name, None)) for name in ("pre_handler_hook", "post_handler_hook")
    )


def live_handles() -> list[Any]:
    """Handles of runs executing in a worker thread of this process (its runtime)."""
    return list(runtime().live_handles())


class InterruptHandler:
    """A SIGINT handler: soft stop on the first press, force on a quick second press."""

    def __init__(self, kernel: Any, window: float | None = None) -> None:
        self.kernel = kernel
        self.window = window  # None: the interrupt_window option at each press
        self.original: Any = signal.SIG_IGN
        self.installed = False
        self.last_press: float | None = None
        self.presses: list[tuple[float, str]] = []  # (monotonic time, "stop" | "force")
        self._workers: list[threading.Thread] = []
        self._last_targets: set[int] = set()

    # -- installing -------------------------------------------------------------------
    def install(self) -> bool:
        """Take the slot ipykernel restores between messages. False if this kernel lacks it."""
        if self.installed:
            return True
        if not kernel_supports_soft_interrupt(self.kernel):
            return False
        current = signal.getsignal(signal.SIGINT)
        in_handler = current is signal.default_int_handler and hasattr(
            self.kernel, "saved_sigint_handler"
        )
        if in_handler:  # %load_ext inside a cell: ipykernel puts ours back after the cell
            self.original = self.kernel.saved_sigint_handler
        else:  # loaded at kernel start (c.InteractiveShellApp.extensions): set it directly
            self.original = current
            if threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGINT, self)
        self.kernel.saved_sigint_handler = self
        self.installed = True
        return True

    def uninstall(self) -> None:
        if not self.installed:
            return
        if getattr(self.kernel, "saved_sigint_handler", None) is self:
            self.kernel.saved_sigint_handler = self.original
        active = signal.getsignal(signal.SIGINT) is self
        if active and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, self.original)
        self.installed = False

    # -- a press ------------------------------------------------------------------------
    def __call__(self, signum: int, frame: FrameType | None) -> None:
        handles = live_handles()
        if not handles or not notebook_option("soft_interrupt"):
            self.last_press = None
            self._delegate(signum, frame)
            return
        now = time.monotonic()
        targets = {id(h) for h in handles}
        force = (
            self.last_press is not None
            and now - self.last_press <= self.current_window
            and bool(targets & self._last_targets)
        )  # the same runs as the first press
        self.last_press = now
        self._last_targets = targets
        self.presses.append((now, "force" if force else "stop"))
        # A signal handler interrupts the main thread at any bytecode; the store calls
        # (locks, a commit) are done by a short-lived thread instead.
        worker = threading.Thread(
            target=self._act, args=(handles, force), daemon=True, name="kernelext-interrupt"
        )
        self._workers = [w for w in self._workers if w.is_alive()] + [worker]
        worker.start()

    def _act(self, handles: list[Any], force: bool) -> None:
        for handle in handles:
            try:
                if force:
                    handle.force_stop(source=SOURCE)
                else:
                    handle.stop(source=SOURCE)
            except Exception:  # one run's store error must not hide the others
                continue

    @property
    def current_window(self) -> float:
        """Seconds within which a second press forces the stop."""
        if self.window is not None:
            return self.window
        return float(notebook_option("interrupt_window"))

    def wait_idle(self, timeout: float = 5.0) -> None:
        """Wait until the stop requests sent so far are recorded (for tests)."""
        for worker in list(self._workers):
            worker.join(timeout)

    def _delegate(self, signum: int, frame: FrameType | None) -> None:
        original = self.original
        if original is signal.SIG_IGN or original is None:
            return
        if original is signal.SIG_DFL:
            signal.default_int_handler(signum, frame)
            return
        original(signum, frame)

    @shows
    def __repr__(self) -> str:
        return f"<kernelext interrupt handler window={self.current_window}s>"


class CellInterrupt:
    """SIGINT while a ``%%agent`` cell runs: a stop on the first press, a cancel on the second."""

    def __init__(self, run_id: str, store: Any, window: float | None = None) -> None:
        self.run_id = run_id
        self.store = store
        self.window = window
        self.first_press: float | None = None
        self.worker: threading.Thread | None = None
        self.in_body = False  # the cell's own code runs: a cancel may land there

    @contextlib.contextmanager
    def body(self) -> Iterator[None]:
        """The cell's own code: the only place a second press raises KeyboardInterrupt.
        Before and after it kernelext records the step, which a press never cuts."""
        self.in_body = True
        try:
            yield
        finally:
            self.in_body = False

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        now = time.monotonic()
        window = self.window if self.window is not None else notebook_option("interrupt_window")
        second = self.first_press is not None and now - self.first_press <= float(window)
        if (second or not notebook_option("soft_interrupt")) and self.in_body:
            signal.default_int_handler(signum, frame)  # KeyboardInterrupt: the cell is cancelled
        if self.first_press is not None:
            return  # pressed again: the stop is pending already
        self.first_press = now
        # The store call runs on a thread: a signal handler lands at any bytecode of the
        # main thread, perhaps inside kernelext's own locks.
        self.worker = threading.Thread(target=self._stop, daemon=True, name="kernelext-interrupt")
        self.worker.start()

    def _stop(self) -> None:
        from .._core.lifecycle import control

        window = self.window if self.window is not None else notebook_option("interrupt_window")
        try:
            control.stop(self.run_id, source=SOURCE, store=self.store)
        except Exception as exc:  # say it in the cell; a second press still cancels
            print(f"kernelext: the stop could not be recorded ({type(exc).__name__}: {exc}).")
            return
        print(
            f"kernelext: stop requested (■): this cell runs to its end, then run "
            f"{self.run_id!r} suspends and the next %%agent cells are skipped. Press ■ again "
            f"within {float(window):g} s to cancel this cell now."
        )


@contextlib.contextmanager
def cell_interrupts(run_id: str, store: Any = None) -> Iterator[CellInterrupt]:
    """SIGINT is the cell's :class:`CellInterrupt` inside (``store``: None, the current one);
    the handler before is put back. Taken for the whole ``%%agent`` cell, its bookkeeping
    included: a press there is a soft stop, never a cut."""
    if threading.current_thread() is not threading.main_thread():
        yield CellInterrupt(run_id, store)  # signals reach the main thread only: not taken
        return
    handler = CellInterrupt(run_id, store)
    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield handler
    finally:
        signal.signal(signal.SIGINT, previous)
