"""Crash injection: worker processes that the tests SIGKILL, and the harness around them.

A worker (``engine_worker.py``, ``ledger_worker.py``) is started ahead of time: it
imports kernelext, defines its agent and prints ``loaded``, then waits for one JSON
line on stdin (``go``) before it touches the store. So the next process is already
warm while the previous one runs, and the only cost of a kill is the kill itself.

After ``go`` a worker prints ``ready <status>`` once the run executes (or
``needs_decision`` / ``completed`` when there is nothing to execute) and
``done <json state>`` when the run finished. The test kills it at a random moment
in between, or lets it finish.

On Linux a pool forks its workers from a fork server (``forked.py``): a process that has
run the worker script's imports and definitions once, and opened no store. Each worker
is still a process of its own that the test SIGKILLs, and it opens the store itself
after ``go``; what it no longer does is import kernelext and DuckDB again.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, BinaryIO, TextIO

from .forked import FORKS, ForkedProcess, ForkServer

__all__ = [
    "CRASH_DIR",
    "Worker",
    "WorkerPool",
    "append_line",
    "attempt_run",
    "delivered",
    "go_command",
    "go_with_kill_point",
    "kill_landed",
    "open_checked",
    "read_go",
    "serve_one_run",
    "take_go_fields",
    "whole_lines",
]

CRASH_DIR = Path(__file__).resolve().parent
TESTS_DIR = CRASH_DIR.parent
LINE_TIMEOUT = 120.0  # generous: a loaded 2-core CI machine


def append_line(path: str, line: str, *, sync: bool = True) -> None:
    """Append one line with a single ``write``, then fsync.

    A SIGKILL can cut a write short where it crosses a page boundary of the file, so
    the line starts with a newline of its own: a torn line never runs into the next
    one, and readers skip lines that are not whole (``whole_lines``).
    """
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, ("\n" + line + "\n").encode())
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def whole_lines(path: Path, pattern: str) -> list[re.Match[str]]:
    """The lines of a file written by ``append_line`` that match ``pattern`` whole."""
    if not path.exists():
        return []
    whole = re.compile(pattern)
    return [m for m in map(whole.fullmatch, path.read_text().splitlines()) if m is not None]


def go_command(**fields: Any) -> str:
    return json.dumps({"go": True, **fields})


def read_go(stream: TextIO) -> dict[str, Any] | None:
    """Worker side: wait for the ``go`` line; None means the test wants us to quit."""
    line = stream.readline()
    if not line.strip():
        return None
    command: dict[str, Any] = json.loads(line)
    return command if command.get("go") else None


class Worker:
    """One worker process, its stdout lines in a queue, its stderr in a file."""

    def __init__(
        self,
        script: Path,
        stderr_path: Path,
        env: dict[str, str],
        server: ForkServer | None = None,
    ) -> None:
        """``python script``, or a fork of ``server`` (which loaded ``script``) if given."""
        self.stderr_path = stderr_path
        self._stderr = open(stderr_path, "ab")  # noqa: SIM115 - closed in reap()
        self.proc: subprocess.Popen[str] | ForkedProcess
        if server is not None:
            self.proc = server.start(self._stderr)
        else:
            self.proc = subprocess.Popen(
                [sys.executable, str(script)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._stderr,
                env=env,
                text=True,
                bufsize=1,
            )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.killed = False
        self.last_line = ""  # the last line ``expect`` took

    def _read(self) -> None:
        assert self.proc.stdout is not None
        # kill/reap/quit close the pipe once the worker ended; the reader may still be in it
        with contextlib.suppress(ValueError):  # "I/O operation on closed file"
            for line in self.proc.stdout:
                self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def expect(self, *prefixes: str, timeout: float = LINE_TIMEOUT) -> str:
        """The next stdout line, which must start with one of ``prefixes``."""
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            self.kill()
            raise AssertionError(
                f"worker {self.proc.pid} printed nothing for {timeout}s\n{self.stderr()}"
            ) from None
        if line is None or not line.startswith(prefixes):
            self.reap()
            raise AssertionError(
                f"worker {self.proc.pid} printed {line!r}, expected one of {prefixes} "
                f"(exit code {self.proc.returncode})\n{self.stderr()}"
            )
        self.last_line = line
        return line

    def go(self, **fields: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(go_command(**fields) + "\n")
        self.proc.stdin.flush()

    def next_line(self, timeout: float) -> str | None:
        """The next stdout line within ``timeout`` seconds, else None (also at EOF)."""
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            return None

    def kill(self) -> bool:
        """SIGKILL the worker if it is still alive; True if this call killed it."""
        if self.proc.poll() is not None:
            return False
        self.proc.send_signal(signal.SIGKILL)  # a worker that just ended is not signalled
        self.proc.wait(timeout=LINE_TIMEOUT)
        self.killed = self.proc.returncode == -signal.SIGKILL
        self._close()
        return self.killed

    def reap(self, timeout: float = LINE_TIMEOUT) -> int:
        """Wait for a worker that ends by itself; return its exit code."""
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(
                f"worker {self.proc.pid} did not exit within {timeout}s\n{self.stderr()}"
            ) from None
        self._close()
        return code

    def quit(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
        self._close()

    def _close(self) -> None:
        """Close the pipes of a worker that ended: its reader first reads to the end."""
        if self._reader is not threading.current_thread():
            self._reader.join(timeout=5)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        self._stderr.close()

    def stderr(self) -> str:
        if not self._stderr.closed:  # closed once the worker was reaped or killed
            self._stderr.flush()
        try:
            return self.stderr_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""


class WorkerPool:
    """Keeps one warm worker (imported, agent defined, waiting for ``go``); ``fork``: the
    workers are forked from a fork server of the pool (``forked.py``), not started anew."""

    def __init__(
        self,
        script: Path,
        workdir: Path,
        env: dict[str, str] | None = None,
        *,
        fork: bool = FORKS,
    ) -> None:
        self.script = script
        self.workdir = workdir
        self.env = {**os.environ, "PYTHONPATH": _pythonpath(), **(env or {})}
        self.env.pop("KERNELEXT_STORE", None)  # workers get the store path in ``go``
        self.spawned = 0
        self._warm: Worker | None = None
        self._server_stderr: BinaryIO | None = None
        self.server: ForkServer | None = None
        if fork:
            self._server_stderr = open(workdir / "workers.stderr", "ab")  # noqa: SIM115
            self.server = ForkServer(script, self.env, self._server_stderr)

    def take(self) -> Worker:
        """A loaded worker; a fresh one is started at once to warm up in the background."""
        worker = self._warm or self._spawn()
        worker.expect("loaded")
        self._warm = self._spawn()
        return worker

    def _spawn(self) -> Worker:
        self.spawned += 1
        return Worker(self.script, self.workdir / "workers.stderr", self.env, self.server)

    def close(self) -> None:
        if self._warm is not None:
            self._warm.quit()
            self._warm = None
        if self.server is not None:
            self.server.close()
            self.server = None
        if self._server_stderr is not None:
            self._server_stderr.close()


def drive_run(store: Any, run_id: str, start: Callable[[], Any]) -> int:
    """The worker's side of the protocol: start the run (or resume it after a kill), say
    ``ready``, wait, then print ``done <state>`` (0), ``ended …`` (3), ``completed`` (0,
    nothing left to do) or ``needs_decision …`` (0, unknown effects wait for a decision)."""
    import kernelext as kx

    row = store.find_run(run_id)
    if row is not None and row["status"] == "completed":
        print("completed", flush=True)
        return 0
    if row is None:
        handle = start()
    else:
        handle = kx.resume(run_id, store=store)
        if handle.thread is None:  # nothing launched: unknown effects wait for a decision
            print(f"needs_decision {handle.status}", flush=True)
            return 0
    print(f"ready {handle.status}", flush=True)
    status = handle.wait()
    if status != "completed":
        print(f"ended {status} {handle.error!r}", flush=True)
        return 3
    print("done " + json.dumps(handle.run.state, sort_keys=True), flush=True)
    return 0


def attempt_run(
    worker: Worker,
    rng: random.Random,
    kill: bool,
    *,
    late: tuple[float, float],
    early_share: float = 0.0,
    early: tuple[float, float] = (0.0, 0.1),
    ends: tuple[str, ...] = ("needs_decision", "completed"),
    **go: Any,
) -> str:
    """One attempt of ``worker``: "killed", or how it ended ("done", or one of ``ends``).

    With ``kill``, a share ``early_share`` of the kills lands ``early`` seconds after
    ``go`` (store open, resume bookkeeping), the others ``late`` seconds after ``ready``.
    """
    worker.go(**go)
    line = None
    if kill and early_share and rng.random() < early_share:
        time.sleep(rng.uniform(*early))
    else:
        line = worker.expect("ready", *ends)
        if not line.startswith("ready"):
            assert worker.reap() == 0, worker.stderr()
            return line.split(" ", 1)[0]
        if kill:
            time.sleep(rng.uniform(*late))
    if kill and worker.kill():
        return "killed"
    if line is None:
        line = worker.expect("ready", *ends, "done")
    if line.startswith("ready"):
        line = worker.expect("done")
    assert worker.reap() == 0, worker.stderr()
    return line.split(" ", 1)[0]


def delivered(url: str, body: Any, idempotency_key: str | None) -> Any:
    """POST ``body`` to the test's delivery server at ``url`` under the ledger's key (60 s
    to answer); the body of its answer. A refusal (not HTTP 200) raises."""
    from support.http_server import post_json

    response = post_json(url, body, idempotency_key=idempotency_key, timeout=60)
    if response.status != 200:
        raise RuntimeError(f"delivery refused: HTTP {response.status}")
    return response.body


def kill_landed(outcome: str, attempt: int, server: Any) -> int | None:
    """``attempt`` when a SIGKILL ended it (``outcome`` of ``attempt_run``), else None.

    After a kill the delivery ``server`` settles first: bytes a dead client left in a
    socket are still delivered, so nothing is decided against its log before they are.
    """
    if outcome != "killed":
        return None
    server.settle()
    return attempt


def open_checked(path: Path | str, query: str | None = None) -> Any:
    """Open the store as a user would after a crash; the schema must be intact (and
    ``query``, when given, must run)."""
    from kernelext._store import open_store
    from kernelext._store.schema import MIGRATIONS

    store = open_store(str(path))
    try:
        assert store.schema_version() == MIGRATIONS[-1].version
        if query is not None:
            store.read(query)
    except BaseException:
        store.close()
        raise
    return store


GO_FIELDS = ("markers", "attempt", "pause_ms", "url")


def take_go_fields(config: dict[str, Any]) -> Callable[[Mapping[str, Any]], None]:
    """Worker side: copy the ``go`` line's markers file, attempt, pause and URL into ``config``."""
    return lambda command: config.update({k: command[k] for k in GO_FIELDS})


def go_with_kill_point(config: dict[str, Any]) -> dict[str, Any] | None:
    """Worker side: say ``loaded``, wait for ``go`` (None: quit) and copy its URL and its
    ``kill_at`` (the point where the worker kills itself, "" for none) into ``config``."""
    print("loaded", flush=True)
    command = read_go(sys.stdin)
    if command is not None:
        config.update(url=command["url"], kill_at=command.get("kill_at") or "")
    return command


def serve_one_run(
    start: Callable[[Mapping[str, Any], Any], Any],
    prepare: Callable[[Mapping[str, Any]], None],
    rng: random.Random | None = None,
) -> int:
    """A worker's ``main``, whole: say ``loaded``, wait for ``go``, hand the command to
    ``prepare``, seed ``rng`` (the pauses) from the run and the attempt, open the store
    the command names and drive the run (``start(command, store)`` when it is new)."""
    from kernelext._store import open_store

    print("loaded", flush=True)
    command = read_go(sys.stdin)
    if command is None:
        return 0
    prepare(command)
    run_id = command["run_id"]
    if rng is not None:
        rng.seed(f"{run_id}/{command['attempt']}")
    store = open_store(command["store"])
    try:
        return drive_run(store, run_id, lambda: start(command, store))
    finally:
        store.close()


def _pythonpath() -> str:
    parts = [str(TESTS_DIR)]
    if os.environ.get("PYTHONPATH"):
        parts.append(os.environ["PYTHONPATH"])
    return os.pathsep.join(parts)


def sleep_until(deadline: float) -> None:
    remaining = deadline - time.monotonic()
    if remaining > 0:
        time.sleep(remaining)
