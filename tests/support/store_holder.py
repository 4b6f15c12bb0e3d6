"""Other processes on one DuckDB store: one that holds the store file, and a line protocol.

``python tests/support/store_holder.py STORE`` opens the store, keeps the file (its
connection open under the backend's lock, so it is never handed over), prints ``holding``
and holds it until a line arrives on stdin; then prints ``released`` and closes.
``python tests/support/store_holder.py STORE SQL`` holds it while ``kx.sql(SQL)`` runs
instead (printing ``holding``, then ``done`` when the query ends).

``Child`` starts such a script (or ``-c`` code) and reads its output line by line.
"""

from __future__ import annotations

import contextlib
import os
import queue
import subprocess
import sys
import threading
from pathlib import Path

__all__ = ["HOLDER", "Child", "hold_store"]

HOLDER = Path(__file__).resolve()
SUPPORT = HOLDER.parent
LINE_WAIT = 120.0  # generous: a loaded 2-core machine


class Child:
    """A Python script in a process of its own: lines in on stdin, lines out on stdout."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        environment = {**os.environ, "KERNELEXT_STORE_WAIT": "600", **(env or {})}
        environment["PYTHONPATH"] = os.pathsep.join(
            [str(SUPPORT.parent), environment.get("PYTHONPATH", "")]
        )
        self.proc = subprocess.Popen(
            [sys.executable, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=environment,
            text=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        self.ended = False  # its output ended (the process exited)
        self._cursor = 0  # lines of ``seen`` that ``expect`` looked at
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.strip())
        self.lines.put(None)

    def _take(self, timeout: float | None) -> bool:
        """Move one line from the process into ``seen``; False when there is none (yet)."""
        if self.ended:
            return False
        try:
            line = self.lines.get(timeout=timeout) if timeout else self.lines.get_nowait()
        except queue.Empty:
            return False
        if line is None:
            self.ended = True
            return False
        self.seen.append(line)
        return True

    def expect(self, word: str) -> str:
        """The next output line (after the last one ``expect`` returned) that starts with
        ``word``; fails when the process ends first."""
        while True:
            while self._cursor < len(self.seen):
                line = self.seen[self._cursor]
                self._cursor += 1
                if line.startswith(word):
                    return line
            if not self._take(LINE_WAIT):
                why = f"ended (exit {self.proc.wait()})" if self.ended else "printed nothing"
                raise AssertionError(
                    f"{self.proc.args} {why} before printing {word!r}; it printed {self.seen}"
                )

    def printed(self, word: str) -> bool:
        """Has a line starting with ``word`` come out so far (never waits)?"""
        while self._take(None):
            pass
        return any(line.startswith(word) for line in self.seen)

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._reader.join(LINE_WAIT)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):  # (a broken pipe: it was killed)
                    pipe.close()


def hold_store(store: str, sql: str | None = None) -> Child:
    """A process that holds the store file (see the module docstring), once it holds it."""
    holder = Child(str(HOLDER), store, *([sql] if sql is not None else []))
    holder.expect("holding")
    return holder


def main() -> int:
    import kernelext as kx

    store = kx.open_store(sys.argv[1])
    with store.backend._mutex:  # type: ignore[attr-defined]  # no hand-over until released
        store.backend.read("SELECT 1")  # the file is open from here on
        print("holding", flush=True)
        if len(sys.argv) > 2:
            kx.sql(sys.argv[2], store=store)
            print("done", flush=True)
        else:
            sys.stdin.readline()
    print("released", flush=True)
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
