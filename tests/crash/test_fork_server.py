"""The crash tests' workers, forked from their pool's fork server (``crash/forked.py``).

Each worker must be what a fresh ``python engine_worker.py`` was: a process of its own
(its own pid, which the step bodies log and its journal is named after), that a SIGKILL
ends (exit code -9), while the server it was forked from runs one thread and holds no
file of the store.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from support.engine_crash import ENGINE_WORKER

from crash import WorkerPool, whole_lines
from crash.forked import FORKS

pytestmark = [
    pytest.mark.crash,
    pytest.mark.skipif(not FORKS, reason="workers are forked from a fork server on Linux only"),
]

RUN = "forked"
STEPS = 60


def logged_pids(side_log: Path, attempt: int, timeout: float = 60.0) -> set[int]:
    """The pids that logged a step of ``attempt`` (waiting for the first one)."""
    deadline = time.monotonic() + timeout
    while True:
        lines = whole_lines(side_log, rf"{RUN},s\d{{3}},{attempt}-(\d+)")
        if lines or time.monotonic() > deadline:
            return {int(m[1]) for m in lines}
        time.sleep(0.02)


def parent_of(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:")))


def open_files(pid: int) -> list[str]:
    folder = Path(f"/proc/{pid}/fd")
    return [os.readlink(fd) for fd in folder.iterdir() if fd.exists()]


@pytest.mark.timeout(300)
def test_each_forked_worker_is_a_process_of_its_own_that_a_sigkill_ends(tmp_path: Path) -> None:
    store = tmp_path / "store" / "forked.duckdb"
    side_log = tmp_path / "side.log"
    pool = WorkerPool(ENGINE_WORKER, tmp_path)
    try:
        assert pool.server is not None
        server = pool.server.proc.pid
        go = {"store": str(store), "run_id": RUN, "steps": STEPS, "side_log": str(side_log)}
        killed: list[int] = []
        for attempt in (1, 2):
            worker = pool.take()
            pid = worker.proc.pid
            assert pid not in (os.getpid(), server, *killed)
            assert parent_of(pid) == server
            worker.go(attempt=attempt, pause_ms=200, **go)
            worker.expect("ready")
            assert logged_pids(side_log, attempt) == {pid}, "the step ran in another process"
            assert list(store.parent.glob(f"{store.name}.journal.{pid}.*")), "no journal of its own"
            assert worker.kill() and worker.proc.returncode == -signal.SIGKILL
            killed.append(pid)

        assert len(os.listdir(f"/proc/{server}/task")) == 1, "the fork server runs threads"
        held = [path for path in open_files(server) if str(store) in path]
        assert not held, f"the fork server holds files of the store: {held}"

        worker = pool.take()
        worker.go(attempt=3, pause_ms=0, **go)
        worker.expect("ready")
        worker.expect("done")
        assert worker.reap() == 0, worker.stderr()
        assert logged_pids(side_log, 3) == {worker.proc.pid}
    finally:
        pool.close()


@pytest.mark.timeout(120)
def test_a_signal_to_a_worker_that_ended_and_was_reaped_reaches_no_process(tmp_path: Path) -> None:
    """The test may signal a worker the moment it ends by itself: its pid may be free (or a
    new process's) by then, so the signal goes through the worker's pidfd, and is dropped."""
    pool = WorkerPool(ENGINE_WORKER, tmp_path)
    try:
        worker = pool.take()
        pid = worker.proc.pid
        assert worker.proc.stdin is not None
        worker.proc.stdin.close()  # no ``go``: the worker ends by itself, exit code 0
        deadline = time.monotonic() + 60
        while Path(f"/proc/{pid}").exists():  # reaped by the server, not yet seen here
            assert time.monotonic() < deadline, f"worker {pid} did not end"
            time.sleep(0.01)
        worker.proc.send_signal(signal.SIGKILL)
        assert not worker.kill(), "a worker that ended by itself was not killed"
        assert worker.reap() == 0, worker.stderr()
    finally:
        pool.close()
