"""The notebook server's memory while a click's body over the limit arrives.

A real Jupyter server with kernelext's extension gets ``POST kernelext/api/stop`` announcing
a 200 MiB body, which is then sent in 1 MiB chunks; the server's resident memory (with its
children) is sampled every 20 ms. The route refuses such a body by its ``Content-Length``
before reading it (413), so the peak stays near the idle size; a route that read the body
first grew by about the body's size. Run: ``.venv/bin/python -m benchmarks.route_body``.
"""

from __future__ import annotations

import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

BODY_MIB = 200


def _rss_mib(pid: int) -> float:
    process = psutil.Process(pid)
    family = [process, *process.children(recursive=True)]
    return sum(p.memory_info().rss for p in family) / 2**20


def _post_large(url: str, token: str) -> tuple[bytes, float]:
    """Send the head and as much of the body as the server takes; its status line."""
    host, port = url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=60)
    head = (
        f"POST /kernelext/api/stop HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Authorization: token {token}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {BODY_MIB * 2**20}\r\n\r\n"
    ).encode()

    def send() -> None:
        try:
            sock.sendall(head)
            for _ in range(BODY_MIB):
                sock.sendall(b" " * 2**20)
        except OSError:  # the server closed the connection: the body was refused
            pass

    sender = threading.Thread(target=send)
    started = time.monotonic()
    sender.start()
    line = sock.recv(65536).split(b"\r\n", 1)[0]
    answered = time.monotonic() - started
    sender.join(60)
    sock.close()
    return line, answered


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from browser import jupyterlab as lab

    with tempfile.TemporaryDirectory() as tmp:
        root, home = Path(tmp, "root"), Path(tmp, "home")
        root.mkdir()
        home.mkdir()
        with lab.running_jupyterlab(root, home) as server:
            pid = server.process.pid
            time.sleep(2)
            before = _rss_mib(pid)
            peak = [before]
            done = threading.Event()

            def watch() -> None:
                while not done.is_set():
                    peak[0] = max(peak[0], _rss_mib(pid))
                    time.sleep(0.02)

            watcher = threading.Thread(target=watch)
            watcher.start()
            line, answered = _post_large(server.url, server.token)
            time.sleep(1)
            done.set()
            watcher.join()
            print(f"answer: {line.decode()} after {answered:.2f} s")
            print(f"server RSS: {before:.0f} MiB idle, {peak[0]:.0f} MiB at most")


if __name__ == "__main__":
    main()
