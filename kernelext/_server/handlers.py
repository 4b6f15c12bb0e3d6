"""The server's routes: ``{action}`` (POST: ``stop``, ``force``) and ``status`` (GET).

One worker thread records every request: the store is opened, written and closed there
(the server never keeps a DuckDB file open between clicks), and the event loop only
awaits it. kernelext's modules are imported on that thread when the server starts, so
the first click does not pay for the import.
"""

from __future__ import annotations

import asyncio
import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado import web

__all__ = ["ROUTE", "install"]

ROUTE = "kernelext/api"
_EXECUTOR = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kernelext-server")


def _warm() -> None:
    from kernelext._core import from_elsewhere  # noqa: F401  (imports the engine once)


class _Handler(APIHandler):
    auth_resource = "kernels"  # stopping a run is as much as acting on a kernel


class RunActionHandler(_Handler):
    """``POST {action}`` with ``{"run_id": RUN_ID, "store": ADDRESS}``: record the request.

    Both travel in the JSON body, never in the path, so any run id arrives as it is. An
    optional ``"source"`` names the buttons clicked (``from_elsewhere.SOURCES``: ``panel``,
    the default, or ``overview``)."""

    @web.authenticated
    @authorized
    async def post(self, action: str) -> None:
        from kernelext._core.from_elsewhere import act, describe_error

        started = time.perf_counter()
        try:
            body = json.loads(self.request.body or b"{}")
        except ValueError:
            body = None
        if (
            not isinstance(body, dict)
            or not all(isinstance(body.get(name), str) for name in ("run_id", "store"))
            or not isinstance(body.get("source", "panel"), str)
        ):
            self.set_status(400)
            message = 'The body must be {"run_id": "<the run>", "store": "<its store>"}.'
            self.finish(json.dumps({"message": message}))
            return
        run_id, source = body["run_id"], body.get("source", "panel")
        loop = asyncio.get_running_loop()
        try:
            result: dict[str, Any] = await loop.run_in_executor(
                _EXECUTOR, lambda: act(action, run_id, body["store"], source=source)
            )
        except Exception as exc:
            status, message = describe_error(exc)
            self.log.warning("kernelext: %s %s refused: %s", action, run_id, message)
            self.set_status(status)
            self.finish(json.dumps({"message": message}))
            return
        result["server_seconds"] = round(time.perf_counter() - started, 4)
        self.log.info(
            "kernelext: %s of run %s recorded in %.3f s (store %.3f s): %s",
            action,
            run_id,
            result["server_seconds"],
            result["seconds"],
            result["status"],
        )
        self.finish(json.dumps(result))


class StatusHandler(_Handler):
    """``GET status``: the route is here (the panel asks before it relies on it)."""

    @web.authenticated
    @authorized
    async def get(self) -> None:
        from kernelext._core.from_elsewhere import ACTIONS

        self.finish(json.dumps({"route": "server", "actions": sorted(ACTIONS)}))


def install(serverapp: Any) -> None:
    """Add the routes to ``serverapp`` and import the engine on the worker thread."""
    base = url_path_join(serverapp.web_app.settings["base_url"], ROUTE)
    serverapp.web_app.add_handlers(
        ".*$",
        [
            (url_path_join(base, r"(stop|force)"), RunActionHandler),
            (url_path_join(base, "status"), StatusHandler),
        ],
    )
    _EXECUTOR.submit(_warm)
    serverapp.log.info("kernelext: Stop and Force stop route at %s", base)
