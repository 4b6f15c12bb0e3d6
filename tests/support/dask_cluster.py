"""A real Dask cluster for the fault tests, in a process of its own, and SIGKILLs for it.

``ClusterHolder`` starts this file as a script: a ``distributed.LocalCluster`` of two
worker processes (``processes=True``, two threads each, each worker under a nanny that
restarts it when it dies), listening on 127.0.0.1 only, no dashboard. The script prints the
scheduler's address on its first line and serves until its stdin closes or it gets SIGTERM.
The cluster lives outside the process that owns the runs, so a test can SIGKILL the owner
(a notebook) and the cluster goes on; the holder gets SIGTERM when the test process dies,
however it dies, and its workers die with it (Dask's worker processes watch their parent).

Workers import the tests' own modules (``support.dask_items``) to run the items:
``PYTHONPATH`` holds ``tests/`` for the holder and so for every worker it spawns.

``worker_pids`` asks the scheduler which worker processes exist (address -> pid) and what
each is processing; ``WorkerKiller`` SIGKILLs busy worker processes at random moments while
the test says a batch runs, and waits for the nanny to bring each one back before the next.

Standalone: ``python tests/support/dask_cluster.py`` prints the address and serves.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = ["N_WORKERS", "ClusterHolder", "Kill", "WorkerKiller", "busy_workers", "worker_pids"]

TESTS_DIR = Path(__file__).resolve().parent.parent
N_WORKERS = 2
THREADS_PER_WORKER = 2
START_TIMEOUT = 120.0  # a loaded 2-core machine


def _die_with_parent() -> None:
    """In the holder (before exec): SIGTERM when the test process goes away."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def cluster_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of the holder and its workers: ``tests/`` importable."""
    env = dict(os.environ)
    paths = [str(TESTS_DIR), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


class ClusterHolder:
    """``with ClusterHolder(log) as holder: holder.address, holder.client()``."""

    def __init__(self, log_path: Path, *, allowed_failures: int = 3) -> None:
        self.log_path = Path(log_path)
        self.allowed_failures = allowed_failures
        self.address = ""
        self._proc: subprocess.Popen[str] | None = None

    def start(self) -> ClusterHolder:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "support.dask_cluster",
                    "--allowed-failures",
                    str(self.allowed_failures),
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                env=cluster_env(),
                cwd=str(TESTS_DIR),
                preexec_fn=_die_with_parent,
            )
        line = _first_line(self._proc, START_TIMEOUT)
        if not line:
            self.stop()
            raise RuntimeError(f"the Dask cluster did not start:\n{self.log()[-3000:]}")
        self.address = str(json.loads(line)["address"])
        return self

    def client(self) -> Any:
        """A new ``distributed.Client`` of this cluster (the caller closes it)."""
        from distributed import Client

        client = Client(self.address, set_as_default=False, timeout=START_TIMEOUT)
        client.wait_for_workers(N_WORKERS, timeout=START_TIMEOUT)
        return client

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(OSError):
            assert proc.stdin is not None
            proc.stdin.close()  # the holder closes its cluster and exits
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)
        if proc.stdout is not None:
            proc.stdout.close()

    def log(self) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")
        return ""

    def __enter__(self) -> ClusterHolder:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _first_line(proc: subprocess.Popen[str], timeout: float) -> str:
    lines: queue.Queue[str] = queue.Queue()
    assert proc.stdout is not None
    stdout = proc.stdout
    threading.Thread(target=lambda: lines.put(stdout.readline()), daemon=True).start()
    try:
        return lines.get(timeout=timeout).strip()
    except queue.Empty:
        return ""


# -- the workers, as the scheduler sees them ----------------------------------------------
_PIDS: dict[str, int] = {}  # worker address -> pid (a restarted worker has a new address)


def worker_pids(client: Any) -> dict[str, int]:
    """Worker address -> pid of its process, for every worker the scheduler knows (each
    new worker is asked once; one that died meanwhile is left out)."""
    addresses = list(client.scheduler_info(n_workers=-1)["workers"])
    new = [a for a in addresses if a not in _PIDS]
    if new:
        answers = client.run(os.getpid, workers=new, on_error="return")
        _PIDS.update({a: pid for a, pid in answers.items() if isinstance(pid, int)})
    return {a: _PIDS[a] for a in addresses if a in _PIDS}


def busy_workers(client: Any) -> dict[str, int]:
    """Worker address -> number of tasks it is processing (only workers with some)."""
    return {address: len(keys) for address, keys in client.processing().items() if keys}


@dataclass
class Kill:
    pid: int
    address: str
    tasks: int  # tasks the scheduler had on that worker when it was killed
    at: float


@dataclass
class WorkerKiller:
    """SIGKILLs a busy worker process while ``batch_running()`` says so, ``target`` times.

    Before each kill it waits until every worker is back (the nanny restarted the last one
    killed) and one of them is processing items, then a random pause in ``pause``; it kills
    one busy worker at random. ``kills`` lists every kill that landed.
    """

    client: Any
    batch_running: Callable[[], bool]
    target: int
    seed: int = 23
    pause: tuple[float, float] = (0.05, 0.4)
    kills: list[Kill] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="worker-killer", daemon=True)

    @property
    def done(self) -> bool:
        return len(self.kills) >= self.target

    def start(self) -> WorkerKiller:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)

    def _loop(self) -> None:
        try:
            while not self._stop.is_set() and not self.done:
                self._kill_one()
        except BaseException as exc:  # reported by the test
            self.errors.append(exc)

    def _kill_one(self) -> None:
        if not self._wait(lambda: len(worker_pids(self.client)) >= N_WORKERS):
            return
        if not self._wait(lambda: self.batch_running() and bool(busy_workers(self.client))):
            return
        if self._stop.wait(self._rng.uniform(*self.pause)):
            return
        busy = busy_workers(self.client)
        pids = worker_pids(self.client)
        candidates = sorted(a for a in busy if a in pids)
        if not candidates or not self.batch_running():
            return
        address = self._rng.choice(candidates)
        pid = pids[address]
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        self.kills.append(Kill(pid, address, busy[address], time.monotonic()))
        # The scheduler forgets the dead worker before the nanny's new one is counted.
        self._wait(lambda: pid not in worker_pids(self.client).values())

    def _wait(self, condition: Callable[[], bool], timeout: float = START_TIMEOUT) -> bool:
        deadline = time.monotonic() + timeout
        while not self._stop.is_set():
            if condition():
                return True
            if time.monotonic() > deadline:
                raise TimeoutError(f"{condition} did not hold within {timeout}s")
            self._stop.wait(0.02)
        return False


# -- the holder process ---------------------------------------------------------------------
def serve(allowed_failures: int) -> int:
    import logging

    import dask
    from distributed import LocalCluster

    dask.config.set(
        {
            "distributed.scheduler.allowed-failures": allowed_failures,
            # A LocalCluster closes a worker's nanny when no worker of that name is back
            # this long after one was removed; killed again and again, a worker is often
            # between two lives at that moment. The nannies restart them: never close one.
            "distributed.deploy.lost-worker-timeout": "1h",
        }
    )
    finished = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: finished.set())

    def until_stdin_closes() -> None:
        sys.stdin.read()
        finished.set()

    with LocalCluster(
        n_workers=N_WORKERS,
        threads_per_worker=THREADS_PER_WORKER,
        processes=True,
        host="127.0.0.1",
        scheduler_port=0,
        dashboard_address=None,
        worker_dashboard_address=None,
        silence_logs=logging.WARNING,
    ) as cluster:
        print(json.dumps({"address": cluster.scheduler_address}), flush=True)
        threading.Thread(target=until_stdin_closes, daemon=True).start()
        finished.wait()
    return 0


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="A LocalCluster of two worker processes.")
    parser.add_argument("--allowed-failures", type=int, default=3)
    sys.exit(serve(parser.parse_args().allowed_failures))
