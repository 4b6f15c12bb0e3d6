"""A real MCP server over stdio (the ``mcp`` package's server side), and a client that
holds a session to it open.

Server, started by the client as ``python tests/support/mcp_server.py``; its name is
``SERVER_NAME``. Tools:

* ``deliver(channel, text)``: POSTs ``{"channel", "text"}`` to
  ``$KERNELEXT_MCP_DELIVERY_URL/mcp/deliver`` (the test's DeliveryServer, which counts
  deliveries) and returns the answer (``{"ok", "delivery", ...}``). With
  ``KERNELEXT_MCP_HOLD`` (seconds) it waits that long after delivering before it answers,
  so that a client can die while the call is in flight.
* ``add(a, b)``: pure, touches nothing.

The server exits when the process that started it is gone (a SIGKILLed worker), even
while a tool call is held.

Client: ``McpClient(url)`` starts the server and keeps one initialized ``ClientSession``
open on an event loop in a thread of its own, the way a notebook kernel's loop holds a
session; an agent's worker thread hands it awaitables with ``client.call(...)``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
import urllib.request
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

__all__ = ["SERVER_NAME", "McpClient", "main"]

SERVER_NAME = "kernelext-test"
SCRIPT = Path(__file__).resolve()
WAIT = 60.0  # generous: a loaded 2-core machine


# -- the server ------------------------------------------------------------------------------
def _exit_when_orphaned(parent: int) -> None:
    while True:
        if os.getppid() != parent:
            os._exit(0)
        time.sleep(0.1)


def main() -> None:
    """Serve the tools over stdio until stdin closes or the parent process is gone."""
    try:  # mcp 2
        from mcp.server.mcpserver import MCPServer as Server
    except ImportError:  # mcp 1
        from mcp.server.fastmcp import FastMCP as Server

    url = os.environ["KERNELEXT_MCP_DELIVERY_URL"]
    hold = float(os.environ.get("KERNELEXT_MCP_HOLD") or 0)
    app = Server(SERVER_NAME)

    @app.tool()
    def deliver(channel: str, text: str) -> dict[str, Any]:
        """Deliver a message on a channel (one POST to the delivery server)."""
        body = json.dumps({"channel": channel, "text": text}).encode()
        request = urllib.request.Request(
            url + "/mcp/deliver",
            data=body,
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=WAIT) as response:
            answer: dict[str, Any] = json.loads(response.read())
        time.sleep(hold)
        return answer

    @app.tool()
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    threading.Thread(target=_exit_when_orphaned, args=(os.getppid(),), daemon=True).start()
    app.run("stdio")


# -- the client --------------------------------------------------------------------------------
class McpClient:
    """The server in a subprocess and one open, initialized ``ClientSession`` to it.

    ``session`` is the plain ``ClientSession``; ``call(awaitable)`` runs an awaitable on
    the client's loop from any thread and returns its result.
    """

    def __init__(self, url: str, *, hold: float = 0.0, errlog: Path | None = None) -> None:
        self.url = url
        self.hold = hold
        self.errlog = errlog
        self.session: Any = None
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._closing: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._serve, name="mcp-client", daemon=True)

    def start(self) -> McpClient:
        self._thread.start()
        if not self._ready.wait(WAIT):
            raise AssertionError(f"the MCP server did not answer within {WAIT}s")
        if self._failure is not None:
            raise AssertionError(f"the MCP client could not start: {self._failure!r}")
        return self

    def call(self, awaitable: Awaitable[Any]) -> Any:
        """Await ``awaitable`` on the client's loop; block this thread until it is done."""

        async def wait() -> Any:
            return await awaitable

        return asyncio.run_coroutine_threadsafe(wait(), self.loop).result(WAIT)

    def close(self) -> None:
        closing = self._closing
        if closing is not None and self._thread.is_alive():
            self.loop.call_soon_threadsafe(closing.set)
        self._thread.join(WAIT)
        if not self._thread.is_alive():
            self.loop.close()

    def __enter__(self) -> McpClient:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._hold())
        except BaseException as exc:
            self._failure = exc
        finally:
            self._ready.set()

    async def _hold(self) -> None:
        from mcp import ClientSession, StdioServerParameters
        from mcp.client.stdio import stdio_client

        params = StdioServerParameters(
            command=sys.executable,
            args=[str(SCRIPT)],
            env={"KERNELEXT_MCP_DELIVERY_URL": self.url, "KERNELEXT_MCP_HOLD": str(self.hold)},
        )
        self._closing = asyncio.Event()
        errlog = open(self.errlog, "a") if self.errlog else sys.stderr  # noqa: SIM115
        try:
            async with (
                stdio_client(params, errlog=errlog) as (read, write),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                self.session = session
                self._ready.set()
                await self._closing.wait()
        finally:
            if errlog is not sys.stderr:
                errlog.close()


if __name__ == "__main__":
    main()
