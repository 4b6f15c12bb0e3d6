"""``thread_in_hold``: an item's thread between its epoch check and its append, that is,
inside a run's fence hold, for as long as the ``with`` block lasts."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["thread_in_hold"]


@contextlib.contextmanager
def thread_in_hold(fence: Any, run_id: str, epoch: int) -> Iterator[threading.Thread]:
    """A thread that holds ``run_id``'s fence (``fence.shared``, which must read ``epoch``)
    from the block's start to its end; it has left the hold once the block is over."""
    inside, leave = threading.Event(), threading.Event()
    seen: list[int | None] = []

    def appending() -> None:
        with fence.shared(run_id) as held:
            seen.append(held)
            inside.set()
            leave.wait(10)

    thread = threading.Thread(target=appending)
    thread.start()
    try:
        assert inside.wait(10), "the thread never got into the hold"
        assert seen == [epoch], f"the hold read epoch {seen}, not {epoch}"
        yield thread
    finally:
        leave.set()
        thread.join(10)
