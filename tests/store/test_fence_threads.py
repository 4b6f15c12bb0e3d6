"""The fence with many threads of one owner appending at once (a ``run.map``).

``flock`` locks belong to the open file, not to a thread: the threads of a process share
one hold of the run's shared lock, taken by the first and let go by the last, so a
take-over (``advance``, on a descriptor of its own as another process's is) waits for
every thread between its check and its append, and still gets in while the run is busy.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from support.fence_holder import thread_in_hold

from kernelext._store.duckdb import fence as fence_module
from kernelext._store.duckdb.fence import FenceFiles
from kernelext.errors import RunStateError


def test_a_take_over_waits_for_every_thread_between_its_check_and_its_append(
    tmp_path: Path,
) -> None:
    fence = FenceFiles(str(tmp_path / "s.duckdb"))
    fence.advance("r", 1)
    with thread_in_hold(fence, "r", 1):
        with fence.shared("r") as epoch:  # another item's thread, in and out meanwhile
            assert epoch == 1
        with pytest.raises(RunStateError, match="cannot be taken over now"):
            fence.advance("r", 2, wait=0.2)
    fence.advance("r", 2, wait=0.2)
    assert fence.read("r") == 2
    fence.close()


def test_a_take_over_gets_in_while_the_owner_keeps_appending(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Threads whose holds overlap without a gap: the hold ends after ``HOLD_SECONDS``
    and the lock is left free for ``YIELD_SECONDS``; then every check sees the new epoch."""
    monkeypatch.setattr(fence_module, "HOLD_SECONDS", 0.1)
    fence = FenceFiles(str(tmp_path / "s.duckdb"))
    fence.advance("r", 1)
    done = threading.Event()
    seen: list[int | None] = []

    def appending() -> None:
        while not done.is_set():
            with fence.shared("r") as epoch:
                seen.append(epoch)
                time.sleep(0.004)

    threads = [threading.Thread(target=appending) for _ in range(4)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(0.2)
        fence.advance("r", 2, wait=3.0)
        taken = len(seen)
        time.sleep(0.1)
    finally:
        done.set()
        for thread in threads:
            thread.join(10)
    assert set(seen[:taken]) <= {1, 2} and 1 in seen[:taken]
    assert seen[-1] == 2 and len(seen) > taken  # after the take-over: its epoch
    fence.close()


def test_one_thread_inside_the_hold_enters_it_again_without_waiting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fence_module, "HOLD_SECONDS", 0.0)  # closed to newcomers at once
    fence = FenceFiles(str(tmp_path / "s.duckdb"))
    fence.advance("r", 3)
    with fence.shared("r") as outer, fence.shared("r") as inner:
        assert outer == inner == 3
    fence.advance("r", 4, wait=0.2)  # let go of entirely
    assert fence.read("r") == 4
    fence.close()


def test_a_hold_whose_holder_never_left_is_joined_after_the_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A thread cut off inside the hold (a KeyboardInterrupt between joining and leaving)
    leaves the lock taken, as before; the other threads still append, after the wait."""
    monkeypatch.setattr(fence_module, "HOLD_SECONDS", 0.0)
    monkeypatch.setattr(fence_module, "WAIT_SECONDS", 0.2)
    fence = FenceFiles(str(tmp_path / "s.duckdb"))
    fence.advance("r", 1)
    cut_off = fence.shared("r")
    assert cut_off.__enter__() == 1  # never left
    got: list[int | None] = []
    later = threading.Thread(target=lambda: got.append(fence.read("r")))
    later.start()
    later.join(5)
    assert got == [1]
    with pytest.raises(RunStateError):
        fence.advance("r", 2, wait=0.1)
    cut_off.__exit__(None, None, None)  # (only so that the test leaves nothing behind)
    fence.advance("r", 2, wait=0.1)
    fence.close()
