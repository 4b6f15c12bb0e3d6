"""The server's routes: ``{action}`` (POST: ``stop``, ``force``, ``approve``, ``reject``,
``answer``) and ``status`` (GET).

One worker thread records every request: the store is opened, written and closed there
(the server never keeps a DuckDB file open between clicks), and the event loop only
awaits it. kernelext's modules are imported on that thread when the server starts, so
the first click does not pay for the import.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from jupyter_core.paths import jupyter_runtime_dir
from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado import web

from .._shown import shown

__all__ = ["ROUTE", "install"]

ROUTE = "kernelext/api"
MAX_BODY = 64 * 1024  # a click's body is a few hundred bytes
ANSWER_SECONDS = 10.0  # a click is answered within this, recorded or not
# Clicks on different stores never wait for each other; two on one DuckDB store take
# turns at its file lock. A store that hangs holds one thread, not the route.
_EXECUTOR = ThreadPoolExecutor(max_workers=8, thread_name_prefix="kernelext-server")
PER_STORE = 2  # clicks that may hold a thread for one store (file or database host) at once
_TURNS: dict[str, asyncio.Semaphore] = {}


async def _in_turn(key: str, work: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run ``work`` on a thread once fewer than ``PER_STORE`` clicks hold one for ``key``.

    The turn ends when the thread is done, not when the click stops waiting for it: a
    store that hangs keeps its own turns, never every thread of the route."""
    if len(_TURNS) > 1024:  # addresses seen once: forget those nobody waits on
        for name in [name for name, turn in _TURNS.items() if not turn.locked()]:
            del _TURNS[name]
    turn = _TURNS.setdefault(key, asyncio.Semaphore(PER_STORE))
    await turn.acquire()
    try:
        job = asyncio.get_running_loop().run_in_executor(_EXECUTOR, work)
    except BaseException:
        turn.release()
        raise
    job.add_done_callback(lambda _done: turn.release())
    return await asyncio.shield(job)


def _warm() -> None:
    from kernelext._core.lifecycle import from_elsewhere  # noqa: F401  (imports the engine once)


class _Handler(APIHandler):
    auth_resource = "kernels"  # stopping a run is as much as acting on a kernel


@web.stream_request_body
class RunActionHandler(_Handler):
    """``POST {action}`` with ``{"run_id": RUN_ID, "store": ADDRESS, "epoch": N}``.

    Everything travels in the JSON body, never in the path, so any run id arrives as it
    is. Every answer is JSON naming this route (``"route": "kernelext"``), so the panel
    tells a refusal from a server without the extension. Only a store that a notebook of
    this user showed is opened (``shown_stores``, in Jupyter's runtime folder): a body
    naming any other is refused before a file is opened or a connection made. A click
    never waits longer than ``ANSWER_SECONDS``; the store's own waits are shorter
    (``from_elsewhere``). An optional ``"source"`` names the buttons clicked
    (``from_elsewhere.SOURCES``: ``panel``, the default, or ``overview``). ``approve`` /
    ``reject`` name the ``"request"``; ``answer`` names the question's ``"key"`` and
    carries the ``"answer"`` (a JSON value, or the text typed when ``"typed": true``).

    The body is read as it arrives, never more than ``MAX_BODY`` bytes of it: a body
    announced larger (``Content-Length``) is refused (413) before any of it is read, and
    tornado stops reading one sent in chunks once it passes the limit."""

    _chunks: list[bytes]
    _size: int = 0

    async def prepare(self) -> None:  # type: ignore[override]  # as APIHandler.prepare
        self._chunks, self._size = [], 0
        self.request.connection.set_max_body_size(MAX_BODY)  # type: ignore[union-attr]
        await super().prepare()  # who is asking: an unknown client gets 403 here
        if self._finished:
            return
        length = self.request.headers.get("Content-Length", "0")
        if not length.isdigit() or int(length) > MAX_BODY:
            message = (
                f"The body is larger than {MAX_BODY // 1024} KiB (Content-Length: "
                f"{length[:20]}); a click is a few hundred bytes of JSON. Nothing was read."
            )
            self._answer(413, {"message": message})

    def data_received(self, chunk: bytes) -> None:
        self._size += len(chunk)
        if self._size <= MAX_BODY:
            self._chunks.append(chunk)

    @web.authenticated
    @authorized
    async def post(self, action: str) -> None:
        from kernelext._core.lifecycle.from_elsewhere import act, describe_error
        from kernelext._core.process.click_stores import busy_key

        started = time.perf_counter()
        body = _body(b"".join(self._chunks) if self._size <= MAX_BODY else None)
        if body is None:
            message = (
                'The body must be {"run_id": "<the run>", "store": "<its store>"} '
                f"(JSON, at most {MAX_BODY // 1024} KiB; epoch: an integer)."
            )
            self._answer(400, {"message": message})
            return
        run_id, address, epoch = body["run_id"], body["store"], body.get("epoch")
        source = body.get("source", "panel")
        who = _user_name(self.current_user)
        shown_in = jupyter_runtime_dir()  # where this user's kernels note the stores shown
        job = _in_turn(
            busy_key(address),
            lambda: act(
                action,
                run_id,
                address,
                shown_in=shown_in,
                source=source,
                epoch=epoch,
                request=body.get("request"),
                note=body.get("note"),
                who=who,
                key=body.get("key", body.get("question")),
                value=body.get("answer"),
                typed=body.get("typed") is True,
            ),
        )
        try:
            result: dict[str, Any] = await asyncio.wait_for(job, ANSWER_SECONDS)
        except asyncio.TimeoutError:
            message = (
                f"The store did not answer within {ANSWER_SECONDS:g} s (it is busy, or other "
                "clicks on it still wait); nothing is known to be recorded. Press ■, or run "
                f"`kernelext stop {run_id}` in a terminal."
            )
            self._answer(504, {"message": message})
            return
        except Exception as exc:
            status, message = describe_error(exc, address)
            self.log.warning("kernelext: %s refused: %s", shown(action), shown(message))
            self._answer(status, {"message": message})
            return
        result["server_seconds"] = round(time.perf_counter() - started, 4)
        self.log.info(
            "kernelext: %s of run %s recorded in %.3f s (store %.3f s): %s",
            shown(action),
            shown(run_id),
            result["server_seconds"],
            result["seconds"],
            shown(result["status"]),
        )
        self._answer(200, result)

    def _answer(self, status: int, body: dict[str, Any]) -> None:
        self.set_status(status)
        self.finish(json.dumps({**body, "route": "kernelext"}))


def _user_name(user: Any) -> str | None:
    """Who clicked, when the server knows them by name (a hub's or a password login's
    user); None for the anonymous user of a token (the OS user who runs the server then)."""
    name = str(getattr(user, "username", "") or "")
    if not name or re.fullmatch(r"[0-9a-f]{32}", name) or name.startswith("anonymous"):
        return None
    return name[:200]


def _body(raw: bytes | None) -> dict[str, Any] | None:
    """The request's JSON body when it is well formed and small, else None."""
    if raw is None or len(raw) > MAX_BODY:
        return None
    try:
        body = json.loads(raw or b"{}")
    except (ValueError, RecursionError):
        return None
    if not isinstance(body, dict):
        return None
    if not all(isinstance(body.get(name), str) for name in ("run_id", "store")):
        return None
    if not isinstance(body.get("source", "panel"), str):
        return None
    epoch = body.get("epoch")
    if epoch is not None and (not isinstance(epoch, int) or isinstance(epoch, bool)):
        return None
    return body


class StatusHandler(_Handler):
    """``GET status``: the route is here (the panel asks before it relies on it)."""

    @web.authenticated
    @authorized
    async def get(self) -> None:
        from kernelext._core.lifecycle.from_elsewhere import ACTIONS

        self.finish(json.dumps({"route": "kernelext", "actions": sorted(ACTIONS)}))


def install(serverapp: Any) -> None:
    """Add the routes to ``serverapp`` and import the engine on the worker thread."""
    base = url_path_join(serverapp.web_app.settings["base_url"], ROUTE)
    serverapp.web_app.add_handlers(
        ".*$",
        [
            (url_path_join(base, r"(stop|force|approve|reject|answer)"), RunActionHandler),
            (url_path_join(base, "status"), StatusHandler),
        ],
    )
    _EXECUTOR.submit(_warm)
    serverapp.log.info("kernelext: Stop and Force stop route at %s", shown(base))
