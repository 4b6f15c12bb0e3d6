"""Attacks on the shared hold of a run's fence and on the fold interval.

Real DuckDB files, real threads: each test is a way the fence or the fold was made to
break a promise (an acknowledged record lost, a take-over kept out, a thread kept waiting).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.fence_holder import thread_in_hold
from support.intents import bare_intent

from kernelext._store import Store, actor, open_store
from kernelext._store.duckdb import fence as fence_module
from kernelext._store.duckdb import fold
from kernelext._store.duckdb.fence import FenceFiles


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened = open_store(str(tmp_path / "s.duckdb"))
    assert opened.create_run("r", "agent", owner=actor())
    yield opened
    opened.close()


def test_an_intent_acknowledged_while_this_process_takes_the_run_over_is_seen_by_it(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An item thread of this process appends an intent under the old epoch while this
    process's own take-over waits for the fence: the intent was acknowledged (the call is
    made next), so the take-over must fold it before it moves the epoch, as it does for
    another process's journal, never leave it to a later fold that refuses it as stale."""
    monkeypatch.setattr(fold, "FOLD_INTERVAL", 30.0)  # only what must fold, folds
    fence: Any = store.backend.fence
    inside, go, appended = threading.Event(), threading.Event(), threading.Event()
    key: list[uuid.UUID] = []

    def item() -> None:  # between its epoch check and its append, then appends
        with fence.shared("r") as epoch:
            assert epoch == 1
            inside.set()
            go.wait(10)
            intent = bare_intent("r", 1)
            store.write_intent(intent)  # acknowledged: durable, the call may go
            key.append(intent["key"])
            appended.set()

    seen: dict[str, int] = {}

    def take_over_job(tx: Any) -> int:
        epoch = store.advance_epoch_tx(tx, "r")
        row = tx.fetchone("SELECT count(*) FROM effects WHERE run_id = 'r'")
        seen["effects"] = int(row[0])
        return epoch

    worker = threading.Thread(target=item)
    worker.start()
    assert inside.wait(10)
    taker = threading.Thread(target=lambda: seen.setdefault("epoch", store.write(take_over_job)))
    taker.start()
    time.sleep(0.3)  # the take-over is in, waiting for the fence
    go.set()
    assert appended.wait(10)
    worker.join(10)
    taker.join(10)
    assert seen["epoch"] == 2
    assert seen["effects"] == 1, "the take-over did not see an intent acknowledged before it"
    store.flush()
    effect = store.effect(key[0])
    assert effect is not None and effect["status"] == "pending"


def test_an_interrupt_landing_as_a_thread_enters_the_fence_never_blocks_the_others(
    tmp_path: Path,
) -> None:
    """A KeyboardInterrupt (or a forced stop) raised into an item thread lands at any
    bytecode: here just as the fence's own lock has been taken to join the hold. The
    other threads of the process must still get through (none waits on that lock for
    good)."""
    fence = FenceFiles(str(tmp_path / "s.duckdb"))
    fence.advance("r", 1)
    enter = threading.Condition.__enter__.__code__

    def landing(frame: Any, event: str, arg: Any) -> Any:  # raise as Condition.__enter__ returns
        if event == "call" and frame.f_code is enter:
            return on_return
        return None

    def on_return(frame: Any, event: str, arg: Any) -> Any:
        if event == "return":
            sys.settrace(None)
            raise KeyboardInterrupt
        return on_return

    sys.settrace(landing)
    try:
        with fence.shared("r"):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        sys.settrace(None)
    got: list[int | None] = []
    other = threading.Thread(target=lambda: got.append(fence.read("r")), daemon=True)
    other.start()
    other.join(5)
    assert got == [1], "another thread waits for good on the fence's lock"
    fence.close()


def test_a_check_begun_after_a_take_over_of_a_removed_fence_never_sees_the_old_epoch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``rm -r <store>.fence`` while the owner's threads hold the run's fence, then a
    take-over (another process: a ``FenceFiles`` of its own) makes a new file. A thread of
    the owner that checks after the take-over returned must see the new epoch, not join
    the hold begun on the removed file (it takes newcomers for ``HOLD_SECONDS``)."""
    monkeypatch.setattr(fence_module, "HOLD_SECONDS", 0.3)
    path = str(tmp_path / "s.duckdb")
    owner, taker = FenceFiles(path), FenceFiles(path)
    taker.advance("r", 1)
    seen: list[int | None] = []
    with thread_in_hold(owner, "r", 1):
        shutil.rmtree(f"{path}.fence")
        taker.advance("r", 2)
        later = threading.Thread(target=lambda: seen.append(owner.read("r")))
        later.start()  # a check after the take-over
        time.sleep(0.1)
    later.join(10)
    assert seen == [2], "a check after the take-over joined the hold of the removed file"
    owner.close()
    taker.close()


def test_a_store_closed_while_a_thread_holds_a_fence_never_lets_go_of_another_files_lock(
    tmp_path: Path,
) -> None:
    """The store is closed while an item thread is between its check and its append. The
    thread's unlock must not land on a descriptor closed under it: the number goes to the
    next file opened (another store's journal or hand-over lock), whose ``flock`` it would
    let go; nor may the thread fail on a closed descriptor."""
    fence = FenceFiles(str(tmp_path / "s.duckdb"))
    fence.advance("r", 1)
    inside, leave = threading.Event(), threading.Event()
    failed: list[BaseException] = []

    def appending() -> None:
        try:
            with fence.shared("r"):
                inside.set()
                leave.wait(10)
        except BaseException as exc:  # (reported below)
            failed.append(exc)

    worker = threading.Thread(target=appending)
    worker.start()
    assert inside.wait(10)
    held = fence._holds["r"].fd
    fence.close()
    other = str(tmp_path / "other.lock")
    opened = [os.open(other, os.O_RDWR | os.O_CREAT)]
    while opened[-1] != held and len(opened) < 64:  # the file opened next: the hold's number
        opened.append(os.open(other, os.O_RDWR))  # if it was closed under the hold
    fd, probe = opened[-1], os.open(other, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        leave.set()
        worker.join(10)
        assert not failed, failed
        with pytest.raises(BlockingIOError):  # still locked by ``fd``
            fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        for each in (probe, *opened):
            os.close(each)
