"""The client of a pool's fork server (``fork_server.py``): workers forked from a process
that has already imported the worker script, instead of a fresh ``python`` each.

``ForkServer(script, env, stderr)`` starts the server; ``start(stderr)`` forks one
worker and returns a ``ForkedProcess``, which ``Worker`` uses as it would use a
``subprocess.Popen``: its ``stdin`` and ``stdout`` are pipes to the worker, ``pid`` is
the worker's own, ``send_signal`` signals that process (a SIGKILL kills the worker), and
``wait``/``poll`` give the exit code the server reaped (``-9`` after a SIGKILL).
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO

__all__ = ["FORKS", "ForkServer", "ForkedProcess"]

SERVER = Path(__file__).resolve().parent / "fork_server.py"
# Where a pool forks its workers from a fork server; KERNELEXT_CRASH_FORK=0 starts each
# worker as a fresh ``python`` instead.
FORKS = sys.platform == "linux" and os.environ.get("KERNELEXT_CRASH_FORK", "1") != "0"
START_TIMEOUT = 120.0  # the server imports kernelext first: a loaded 2-core machine


class ForkServer:
    """One fork server for the worker script ``script``, its stderr in ``stderr``."""

    def __init__(self, script: Path, env: dict[str, str], stderr: IO[bytes]) -> None:
        self._sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._stderr = stderr
        with theirs:
            self.proc = subprocess.Popen(
                [sys.executable, str(SERVER), str(script), str(theirs.fileno())],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                env=env,
                pass_fds=(theirs.fileno(),),
            )
        self._replies: queue.Queue[tuple[str, int | None]] = queue.Queue()
        self._exits: dict[int, int] = {}
        self._ended = threading.Condition()
        self._gone = False
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._loaded = False

    def _read(self) -> None:
        while True:
            try:
                data, fds, _, _ = socket.recv_fds(self._sock, 256, 1)
            except OSError:
                data, fds = b"", []
            if not data:
                break
            message = data.decode()
            kind, _, rest = message.partition(" ")
            with self._ended:
                if kind == "exit":
                    pid, code = rest.split()
                    self._exits[int(pid)] = int(code)
                    self._ended.notify_all()
                elif kind == "pid":  # a new worker: an old one's code under a reused pid goes
                    self._exits.pop(int(rest), None)
            if kind != "exit":
                self._replies.put((message, fds[0] if fds else None))
        with self._ended:
            self._gone = True
            self._ended.notify_all()
        self._replies.put(("error the fork server ended", None))

    def _reply(self, expected: str) -> tuple[str, int | None]:
        try:
            reply, fd = self._replies.get(timeout=START_TIMEOUT)
        except queue.Empty:
            reply, fd = f"error no answer in {START_TIMEOUT}s", None
        if not reply.startswith(expected):
            raise AssertionError(f"fork server {self.proc.pid}: {reply}\n{self._stderr_text()}")
        return reply, fd

    def start(self, stderr: IO[bytes]) -> ForkedProcess:
        """Fork one worker, its stderr to ``stderr``."""
        if not self._loaded:
            self._reply("loaded")
            self._loaded = True
        stdin_r, stdin_w = os.pipe()
        stdout_r, stdout_w = os.pipe()
        try:
            socket.send_fds(self._sock, [b"fork"], [stdin_r, stdout_w, stderr.fileno()])
        finally:
            os.close(stdin_r)
            os.close(stdout_w)
        stdin = open(stdin_w, "w", buffering=1)  # noqa: SIM115 - closed by Worker
        stdout = open(stdout_r)  # noqa: SIM115 - closed by Worker
        try:
            reply, pidfd = self._reply("pid ")
            assert pidfd is not None, f"fork server {self.proc.pid}: {reply} without its pidfd"
        except BaseException:
            stdin.close()
            stdout.close()
            raise
        return ForkedProcess(self, int(reply.split()[1]), pidfd, stdin, stdout)

    def exit_code(self, pid: int, timeout: float | None) -> int | None:
        """``pid``'s exit code once the server reaped it, waiting up to ``timeout``."""
        with self._ended:
            self._ended.wait_for(lambda: pid in self._exits or self._gone, timeout)
            if pid not in self._exits and self._gone:
                raise AssertionError(
                    f"fork server {self.proc.pid} ended before worker {pid} did\n"
                    + self._stderr_text()
                )
            return self._exits.pop(pid, None)

    def close(self) -> None:
        """Hang up; the server ends (workers still waiting for ``go`` were quit first).

        ``shutdown`` first: a ``close`` alone does not hang up while the reader thread is
        inside ``recv`` on the socket (the call keeps it open), and the server waited on."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(timeout=30)

    def _stderr_text(self) -> str:
        self._stderr.flush()
        try:
            with open(self._stderr.name, "rb") as file:
                return file.read().decode(errors="replace")[-4000:]
        except (OSError, TypeError):
            return ""


class ForkedProcess:
    """A forked worker, seen through the ``subprocess.Popen`` calls ``Worker`` makes."""

    def __init__(
        self, server: ForkServer, pid: int, pidfd: int, stdin: IO[str], stdout: IO[str]
    ) -> None:
        self._server = server
        self.pid = pid
        self._pidfd: int | None = pidfd
        self.stdin: IO[str] | None = stdin
        self.stdout: IO[str] | None = stdout
        self.returncode: int | None = None

    def send_signal(self, signum: int) -> None:
        """Signal the worker (through its pidfd): nothing if it has ended already."""
        if self._pidfd is None:
            return
        with contextlib.suppress(ProcessLookupError):  # ended, not reaped or reported yet
            signal.pidfd_send_signal(self._pidfd, signum)

    def poll(self) -> int | None:
        if self.returncode is not None:
            return self.returncode
        return self._ended(self._server.exit_code(self.pid, 0))

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is not None:
            return self.returncode
        code = self._ended(self._server.exit_code(self.pid, timeout))
        if code is None:
            raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout or 0)
        return code

    def _ended(self, code: int | None) -> int | None:
        if self.returncode is None and code is not None:
            self.returncode = code
            if self._pidfd is not None:
                os.close(self._pidfd)
                self._pidfd = None
        return self.returncode
