"""The batch benchmark's external system: a local HTTP server that answers every POST after
a fixed delay, and the two clients every system uses to call it (one thread, one task).

The server runs in a process of its own (``python -m benchmarks.batch_http DELAY_S``; it
prints its port on the first line of stdout), on asyncio, so that serving 32 requests at
once costs the measured process nothing and holds no GIL of it. Every POST is one
delivery; ``GET /stats`` returns ``{"posts": n, "unique": u}`` (``unique``: distinct
``i`` values posted since the last ``POST /reset``), so a run can check that each item
was delivered once. Each request opens its own connection (``Connection: close``) in
every system alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

__all__ = ["apost", "post", "serve", "server_stats"]

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_PORT: list[int] = []  # the running server's port (set by ``serve``)


# -- the clients ----------------------------------------------------------------------------
def _request(i: int, key: str | None) -> bytes:
    body = json.dumps({"i": i}).encode()
    head = (
        f"POST /item HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n"
    )
    if key is not None:
        head += f"Idempotency-Key: {key}\r\n"
    return head.encode() + b"\r\n" + body


def post(i: int, key: str | None = None) -> dict[str, Any]:
    """POST item ``i`` (blocking); returns the server's JSON answer."""
    return post_to(_PORT[0], i, key)


def post_to(port: int, i: int, key: str | None = None) -> dict[str, Any]:
    """POST item ``i`` to the server on ``port`` (blocking, from any process: the Dask
    benchmark's workers); returns the server's JSON answer."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        headers = {"Content-Type": "application/json", "Connection": "close"}
        if key is not None:
            headers["Idempotency-Key"] = key
        conn.request("POST", "/item", body=json.dumps({"i": i}).encode(), headers=headers)
        response = conn.getresponse()
        data = response.read()
        if response.status != 200:
            raise RuntimeError(f"batch server answered {response.status}")
        answer: dict[str, Any] = json.loads(data)
        return answer
    finally:
        conn.close()


async def apost(i: int, key: str | None = None) -> dict[str, Any]:
    """POST item ``i`` on the running event loop (stdlib streams, one connection)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", _PORT[0])
    try:
        writer.write(_request(i, key))
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        data = await reader.readexactly(length)
        if status != 200:
            raise RuntimeError(f"batch server answered {status}")
        answer: dict[str, Any] = json.loads(data)
        return answer
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


def server_stats(reset: bool = False) -> dict[str, int]:
    """The server's counts since the last reset (``reset``: start counting again)."""
    conn = http.client.HTTPConnection("127.0.0.1", _PORT[0], timeout=30)
    try:
        conn.request("POST" if reset else "GET", "/reset" if reset else "/stats", body=b"")
        stats: dict[str, int] = json.loads(conn.getresponse().read())
        return stats
    finally:
        conn.close()


@contextlib.contextmanager
def serve(delay_s: float) -> Iterator[int]:
    """Run the server in a child process for the duration of the block; yields its port."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.batch_http", str(delay_s)],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.strip().isdigit():
            raise RuntimeError(f"the batch server did not start: {line!r}")
        _PORT[:] = [int(line)]
        yield _PORT[0]
    finally:
        _PORT.clear()
        proc.terminate()
        proc.wait(10)


# -- the server -----------------------------------------------------------------------------
class _Counts:
    def __init__(self) -> None:
        self.posts = 0
        self.seen: set[int] = set()


def _answer(body: bytes) -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )


async def _handle(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float, counts: _Counts
) -> None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        method, path = head.split(b" ", 2)[:2]
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        body = await reader.readexactly(length) if length else b""
        if method == b"POST" and path == b"/reset":
            counts.posts, counts.seen = 0, set()
            out = b"{}"
        elif method == b"POST":
            counts.posts += 1
            item = json.loads(body).get("i")
            counts.seen.add(item)
            await asyncio.sleep(delay)
            out = json.dumps({"ok": True, "i": item}).encode()
        else:
            out = json.dumps({"posts": counts.posts, "unique": len(counts.seen)}).encode()
        writer.write(_answer(out))
        await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def _main(delay: float) -> None:
    counts = _Counts()
    server = await asyncio.start_server(
        lambda r, w: _handle(r, w, delay, counts), "127.0.0.1", 0, backlog=1024
    )
    port = server.sockets[0].getsockname()[1]
    sys.stdout.write(f"{port}\n")
    sys.stdout.flush()
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_main(float(sys.argv[1])))
