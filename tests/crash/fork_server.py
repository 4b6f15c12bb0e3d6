"""The fork server of a ``WorkerPool``: ``python fork_server.py SCRIPT FD``.

It runs the top of the worker script ``SCRIPT`` once, as ``__main__``, the way
``python SCRIPT`` would (its imports: kernelext, duckdb, the agent's definitions), all
but the closing ``if __name__ == "__main__":`` block. It opens no store and starts no
thread. Then, for each request on the socket ``FD`` (``crash/forked.py`` is the
client), it forks a child that takes the three file descriptors sent with the request
as its stdin, stdout and stderr and runs that closing block: the worker, in a process
of its own, whose pid the client gets back (and kills with SIGKILL when it wants). The
server reaps its children and sends each one's exit code (``-9`` after a SIGKILL, as
``subprocess.Popen.returncode`` says it).

Messages on the socket (SOCK_SEQPACKET, one message each): ``fork`` with three file
descriptors from the client; ``loaded``, ``pid <pid>``, ``exit <pid> <code>`` and
``error <text>`` from the server; ``pid`` comes with a pidfd of the worker, through which
the client signals it: a pidfd never names another process, even once the worker ended,
was reaped and its pid was given to a new one. The server ends when the client hangs up.
"""

from __future__ import annotations

import ast
import contextlib
import gc
import os
import select
import signal
import socket
import sys
import threading
import types
from typing import Any

ForkedStdio = tuple[int, int, int]


def split_script(path: str) -> tuple[types.CodeType, types.CodeType]:
    """The script's code without its closing ``if __name__ == "__main__":`` block, and
    that block alone (both keep the script's file name and line numbers)."""
    with open(path, encoding="utf-8") as source:
        tree = ast.parse(source.read(), filename=path)
    last = tree.body[-1] if tree.body else None
    if not (isinstance(last, ast.If) and ast.unparse(last.test) in _GUARDS):
        raise SystemExit(f"{path} does not end with an `if __name__ == '__main__':` block")
    top = ast.Module(body=tree.body[:-1], type_ignores=[])
    guard = ast.Module(body=[last], type_ignores=[])
    return compile(top, path, "exec"), compile(guard, path, "exec")


_GUARDS = ("__name__ == '__main__'", '__name__ == "__main__"')


def load_script(path: str, top: types.CodeType) -> dict[str, Any]:
    """Run ``top`` as the ``__main__`` module of ``python path``; its globals."""
    module = types.ModuleType("__main__")
    module.__file__ = path
    sys.modules["__main__"] = module
    sys.argv = [path]
    sys.path[0] = os.path.dirname(path)
    exec(top, module.__dict__)
    return module.__dict__


def threads_running() -> int:
    """Threads of this process, Python's and native ones (Linux: /proc)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def send(ctl: socket.socket, text: str) -> None:
    with contextlib.suppress(OSError):  # the client is gone: the loop sees it next read
        ctl.send(text.encode())


def reap(ctl: socket.socket) -> None:
    """Report every child that ended."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        send(ctl, f"exit {pid} {os.waitstatus_to_exitcode(status)}")


def serve(ctl: socket.socket) -> ForkedStdio | None:
    """Fork a child per request until the client hangs up (then None). Returns in each
    forked child too: the file descriptors that become its stdin, stdout and stderr."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    while True:
        ready, _, _ = select.select([ctl.fileno(), wake_r], [], [])
        if wake_r in ready:
            os.read(wake_r, 4096)
            reap(ctl)
        if ctl.fileno() not in ready:
            continue
        message, fds, _, _ = socket.recv_fds(ctl, 64, 3)
        if not message:
            return None
        if message != b"fork" or len(fds) != 3:
            send(ctl, f"error bad request {message!r} with {len(fds)} descriptors")
        elif threads_running() != 1:
            send(ctl, f"error the fork server runs {threads_running()} threads: fork is unsafe")
        else:
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                for fd in (wake_r, wake_w, ctl.detach()):
                    os.close(fd)
                return fds[0], fds[1], fds[2]
            pidfd = os.pidfd_open(pid)  # before any reaping: it names this process only
            with contextlib.suppress(OSError):
                socket.send_fds(ctl, [f"pid {pid}".encode()], [pidfd])
            os.close(pidfd)
        for fd in fds:
            os.close(fd)


def become_worker(stdio: ForkedStdio) -> None:
    """In the forked child: take the stdio the client sent, drop the server's copies.
    (The objects of the imports stay frozen out of the collector: the worker shares them.)"""
    for target, fd in enumerate(stdio):
        os.dup2(fd, target)
    for fd in set(stdio) - {0, 1, 2}:
        os.close(fd)


def main() -> types.CodeType | None:
    """Serve; the code the caller runs as the worker in a forked child, else None."""
    script, ctl = os.path.abspath(sys.argv[1]), socket.socket(fileno=int(sys.argv[2]))
    top, guard = split_script(script)
    load_script(script, top)
    gc.freeze()  # the children share these pages instead of copying them at each collection
    send(ctl, "loaded")
    stdio = serve(ctl)
    if stdio is None:
        return None
    become_worker(stdio)
    return guard


if __name__ == "__main__":
    WORKER = main()
    if WORKER is None:
        os._exit(0)  # the server's own exit: nothing of the worker's runs here
    exec(WORKER, sys.modules["__main__"].__dict__)
