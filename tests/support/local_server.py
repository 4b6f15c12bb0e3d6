"""What the tests' local HTTP servers share: a threaded server on 127.0.0.1 that forgives
clients that give up, its quiet JSON handler, start/stop with a JSON-lines log, and serving
as a script of its own until signalled.

Stdlib only: ``http_server.py`` and ``llm_server.py`` also run standalone.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar, TypeVar

__all__ = ["JSONHandler", "LocalHTTPServer", "ServedLocally", "serve_until_signalled"]

S = TypeVar("S", bound="ServedLocally")


class JSONHandler(BaseHTTPRequestHandler):
    """Answers in JSON, logs nothing to stderr, and reads a body only when it came whole."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # silence stderr noise
        pass

    def send_body(self, status: int, body: bytes, extra: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for name, value in (extra or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def read_body(self) -> bytes | None:
        """The request's body; None when the client died mid-request (like a real API,
        nothing happened then)."""
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        return None if len(raw) < length else raw


class LocalHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    owner: Any

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that gave up (timeout, SIGKILL) is part of what we test.
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return
        super().handle_error(request, client_address)


class ServedLocally:
    """Start, stop and address of a server whose state is this object (the dataclass's
    ``log_path``, ``host`` and ``port``); records go to its JSON-lines log, fsync'ed."""

    handler: ClassVar[type[JSONHandler]]
    server_class: ClassVar[type[LocalHTTPServer]] = LocalHTTPServer
    thread_name: ClassVar[str | None] = None
    log_path: Path | str | None
    host: str
    port: int
    _server: LocalHTTPServer | None
    _thread: threading.Thread | None
    _log: Any

    def _log_lock(self) -> Any:
        """The lock that the writers of the log hold."""
        raise NotImplementedError

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT`` (the server root)."""
        if self._server is None:
            raise RuntimeError(f"{type(self).__name__} is not started")
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self: S) -> S:
        if self._server is not None:
            return self
        if self.log_path is not None:
            self.log_path = Path(self.log_path)
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log = open(self.log_path, "a", encoding="utf-8")  # noqa: SIM115
        server = self.server_class((self.host, self.port), self.handler)
        server.owner = self
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=self.thread_name,
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        with self._log_lock():
            if self._log is not None:
                self._log.close()
                self._log = None

    def __enter__(self: S) -> S:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _write_log(self, record: dict[str, Any]) -> None:
        """Append ``record`` to the log, fsync'ed (the caller holds the log's lock)."""
        if self._log is None:
            return
        self._log.write(json.dumps(record, sort_keys=True) + "\n")
        self._log.flush()
        os.fsync(self._log.fileno())


def serve_until_signalled(
    server: S, address: Callable[[S], str], *, until_stdin_closes: bool = False
) -> int:
    """A server run as a script of its own: start ``server``, print its ``address``, serve
    until SIGTERM or SIGINT (with ``until_stdin_closes``, also until stdin closes: the
    parent went away), then stop it; the script's exit code."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    if until_stdin_closes:
        threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    with server:
        print(address(server), flush=True)
        while not stop.wait(0.2):
            pass
    return 0
