"""A person's Stop or Force stop that reaches a run without its kernel's help.

A panel's buttons are drawn in the browser; a click on an ipywidgets button is handled
by the kernel's main thread, after every cell queued before it (Run All) and after the
user's own long cell. The notebook server is never busy that way: the panel sends Stop
and Force stop to the server (``kernelext._server``), which calls :func:`act` here. It
records the request in the store through the same door as ``kernelext stop``
(``control.stop`` / ``control.force_stop``), and the run honours it at its next safe
point, whichever process executes it: a background agent's watch thread reads the
store within a fraction of a second; a ``%%agent`` run reads it at the boundary after
the running cell, so the queued ``%%agent`` cells are skipped.

What travels from the kernel to the browser and back is :func:`store_address`: a
DuckDB store's absolute path, or a PostgreSQL URL without its password (the server
connects with its own credentials, as a worker process does), and only to a store a
notebook of the same user showed (``shown_stores``). :func:`act` admits only
the actions in ``ACTIONS`` and never creates a store: a path with no store file is
refused, so a click can only ever reach a store that exists. The request is recorded
with the source of the buttons clicked, one of ``SOURCES``: a run's panel, or the
overview of the runs (``kx.runs()`` in a notebook).
"""

from __future__ import annotations

import os
import time
import urllib.parse
from typing import Any

from ..._formatting import moment_text
from ..._store import Store, is_postgres
from ..._validate import RUN_ID
from ...errors import (
    KernelextError,
    OwnershipLost,
    RunNotFound,
    RunStateError,
    StoreError,
    StoreLockedError,
)
from ...status import FINAL, LIVE, Status
from ..people.decide_elsewhere import DECISIONS, answer, decide
from ..process.click_stores import open_for_click, passwords_in, post_click_stop
from ..process.lease import last_heard, owner_gone
from . import control
from .stop_answer import busy_answer

__all__ = ["ACTIONS", "BUTTONS", "SOURCES", "act", "check_texts", "describe_error", "store_address"]

ACTIONS: dict[str, str] = {
    "stop": "stop at the next safe point",
    "force": "stop now: cancel the current step",
    "approve": "approve one waiting call (decide_elsewhere)",
    "reject": "reject one waiting call (decide_elsewhere)",
    "answer": "answer one open question (decide_elsewhere)",
}
SOURCES: dict[str, str] = {  # where a click may come from -> how its answer names it
    "panel": "panel",
    "overview": "runs overview",
}
MAX_DEPTH = 64  # levels of lists and objects in an answer
BUTTONS: dict[str, frozenset[str]] = {  # action -> the sources that have its button
    "stop": frozenset({"panel", "overview"}),
    "force": frozenset({"panel", "overview"}),
    "approve": frozenset({"panel"}),
    "reject": frozenset({"panel"}),
    "answer": frozenset({"panel"}),
}


def store_address(store: Store) -> str:
    """Where another process finds ``store``: an absolute path, or a URL without password."""
    location = str(store.location)
    if is_postgres(location):
        from ..._store.postgres_backend import url_without_password  # psycopg: PostgreSQL only

        url = getattr(store.backend, "url", location)
        return url_without_password(str(url))
    return os.path.abspath(location)


def act(
    action: str,
    run_id: str,
    address: str,
    *,
    shown_in: str | os.PathLike[str],
    source: str = "panel",
    epoch: int | None = None,
    request: object = None,
    note: object = None,
    who: str | None = None,
    key: object = None,
    value: object = None,
    typed: bool = False,
) -> dict[str, Any]:
    """Record ``action`` for run ``run_id`` in the store at ``address``; say what happened.

    ``shown_in``: the folder of the stores this user's notebooks showed (``shown_stores``);
    an address none of them showed is refused before anything is opened.

    ``epoch``: the run's ``owner_epoch`` the clicked panel showed (a fencing token); a click
    that arrives after the run was resumed or taken over is refused (``RunStateError``), never
    applied to the new session. Returns ``run_id``, ``action``, ``status`` (the run's status
    after the request), ``source``, ``recorded`` (True when the request reached a live
    run), ``message`` (a sentence for the person who clicked) and ``seconds``.

    ``approve`` / ``reject`` decide approval ``request`` of the run (``note``, ``who``:
    for the record; ``decide_elsewhere``). ``answer`` answers question ``key`` with
    ``value`` (``typed``: text read as its schema asks), one answer wins.
    """
    _check_button(action, source)
    fields = {"run_id": run_id, "store": address, "request": request, "note": note}
    check_texts({**fields, "key": key, "answer": value})
    RUN_ID("run_id", run_id)
    started = time.perf_counter()
    if action in ("stop", "force"):
        busy = _recorded_while_busy(action, run_id, address, shown_in, source, epoch, who)
        if busy is not None:
            return {**busy, "seconds": _since(started)}
    store = open_for_click(address, shown_in=shown_in)
    try:
        row = store.get_run(run_id)
        before = str(row["status"])
        if epoch is not None and row.get("owner_epoch") is not None and row["owner_epoch"] != epoch:
            raise RunStateError(_stale(run_id, row["owner_epoch"], epoch, before))
        gone = action in ("stop", "force") and owner_gone(row, store.now())
        if action in DECISIONS or action == "answer":
            decided = (
                answer(store, run_id, key, value, typed=typed, note=note, who=who, source=source)
                if action == "answer"
                else decide(store, action, run_id, request, note=note, who=who, source=source)
            )
            said = {"run_id": run_id, "action": action, "status": before, "source": source}
            return {**said, "recorded": True, **decided, "seconds": _since(started)}
        door = control.force_stop if action == "force" else control.stop
        try:  # the fence is checked again in the transaction that writes the request
            status = door(run_id, source=source, store=store, epoch=epoch, who=who)
        except OwnershipLost as exc:
            raise RunStateError(_stale(run_id, exc.epoch, epoch, before)) from None
        row = store.get_run(run_id)
    finally:
        store.close()
    cell = control.is_cell_run(row)
    recorded = before in LIVE and status in LIVE | {Status.SUSPENDED, Status.NEEDS_DECISION}
    where = SOURCES[source]
    return {
        "run_id": run_id,
        "action": action,
        "status": status,
        "source": source,
        "recorded": recorded,
        "message": (
            _gone_message(run_id, row, status, where)
            if gone and status not in LIVE
            else _message(action, run_id, before, status, cell, where)
        ),
        "seconds": _since(started),
    }


def _recorded_while_busy(
    action: str,
    run_id: str,
    address: str,
    shown_in: str | os.PathLike[str],
    source: str,
    epoch: int | None,
    who: str | None,
) -> dict[str, Any] | None:
    """A Stop or Force stop recorded beside a DuckDB store another process keeps busy (a
    long query), without waiting for its file; None when the file is free."""
    force = action == "force"
    try:
        posted = post_click_stop(
            address, run_id, shown_in=shown_in, source=source, who=who, epoch=epoch, force=force
        )
    except OwnershipLost as exc:
        raise RunStateError(_stale(run_id, exc.epoch, epoch)) from None
    if posted is None:
        return None
    answer = busy_answer(run_id, posted, force=force)
    return {
        "run_id": run_id,
        "action": action,
        "status": str(answer),
        "source": source,
        "recorded": True,
        "message": f"{answer.busy} ({SOURCES[source]})",
    }


def _check_button(action: str, source: str) -> None:
    """A known action, from a surface that has its button."""
    if action not in ACTIONS:
        raise ValueError(f"Unknown action {action!r}: one of {', '.join(sorted(ACTIONS))}.")
    if source not in SOURCES:
        raise ValueError(f"Unknown source {source!r}: one of {', '.join(sorted(SOURCES))}.")
    if source not in BUTTONS[action]:
        raise ValueError(
            f"The {SOURCES[source]} has no {action} button: a click from it cannot {action} "
            f"(sent from: {', '.join(sorted(BUTTONS[action]))})."
        )


def _since(started: float) -> float:
    return round(time.perf_counter() - started, 4)


def check_texts(fields: dict[str, object]) -> None:
    """Refuse a text no store keeps (a NUL character, a lone surrogate: not UTF-8), in
    any field of a click, before anything is opened; nested values (an answer) too."""
    for name, value in fields.items():
        for text in _texts(value):
            if "\x00" in text:
                raise ValueError(
                    f"The {name} holds a NUL character (\\x00), which no store keeps: "
                    "remove it and send again; nothing was recorded."
                )
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError(
                    f"The {name} holds a lone surrogate (half of a UTF-16 pair), which is "
                    "not text a store keeps: send it as valid Unicode; nothing was recorded."
                ) from None


def _texts(value: object, depth: int = 0) -> list[str]:
    if isinstance(value, str):
        return [value]
    if depth > MAX_DEPTH:
        raise ValueError(
            f"A value of the click is nested more than {MAX_DEPTH} levels deep: send a "
            "flatter one; nothing was recorded."
        )
    if isinstance(value, dict):
        return [t for k, v in value.items() for t in (*_texts(k, depth + 1), *_texts(v, depth + 1))]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _texts(item, depth + 1)]
    return []


def _gone_message(run_id: str, row: dict[str, Any], status: str, where: str) -> str:
    heard = last_heard(row)
    when = f" (last heard {moment_text(heard)})" if heard is not None else ""
    if status == Status.NEEDS_DECISION:
        return (
            f"Stopped by you ({where}): the process that ran {run_id} is gone{when}, so the "
            "run was stopped here at once. Calls it left in flight have an unknown outcome: "
            f"decide them (kx.reconcile({run_id!r})) before it goes on."
        )
    return (
        f"Stopped by you ({where}): the process that ran {run_id} is gone{when}, so the run "
        f"was stopped here at once and is {status}; resume it with kx.resume({run_id!r})."
    )


def _stale(run_id: str, now: object, shown: object, status: str = "") -> str:
    if status in FINAL:
        return (
            f"Run {run_id} has ended ({status}) since this panel drew it; nothing was done. "
            "Look at the panel again."
        )
    return (
        f"Run {run_id} was resumed or taken over since this panel drew it (its owner epoch "
        f"is {now}, the panel showed {shown}); nothing was done. Look at the panel again and "
        "press the button there."
    )


def _message(
    action: str, run_id: str, before: str, status: str, cell: bool, where: str = "panel"
) -> str:
    if before not in LIVE:
        return f"Run {run_id} is {before}: there is nothing to stop."
    if status == Status.SUSPENDED:
        return f"Stopped by you ({where}): run {run_id} is suspended."
    if action == "force" and cell:
        return (
            f"Stop recorded ({where}): the running %%agent cell of {run_id} finishes first, then "
            "the run suspends. To cancel the cell now, press the notebook's ■ twice."
        )
    if action == "force":
        return (
            f"Force stop recorded ({where}): run {run_id} stops now. A recorded sync call in "
            "flight is waited for (up to force_call_grace) and keeps its outcome; press again "
            "to cut it."
        )
    if cell:
        return (
            f"Stop recorded ({where}): run {run_id} suspends when the running cell ends; "
            "the next %%agent cells are skipped."
        )
    return f"Stop recorded ({where}): run {run_id} stops at its next safe point."


def describe_error(exc: BaseException, address: str = "") -> tuple[int, str]:
    """(HTTP status, message) for an error :func:`act` raised; a password in ``address``
    never appears in the message, even when the URL could not be parsed."""
    if isinstance(exc, RunNotFound):
        status, text = 404, str(exc)
    elif isinstance(exc, (ValueError, TypeError)):
        status, text = 400, str(exc)
    elif isinstance(exc, StoreLockedError):
        status, text = 503, f"The store is busy in another process: {exc}"
    elif isinstance(exc, StoreError) and is_postgres(str(address)):
        status, text = (
            503,
            (
                f"The notebook server could not open the PostgreSQL store: {exc} It connects "
                "with its own credentials (PGPASSWORD or ~/.pgpass in the environment of the "
                "process that runs `jupyter lab`), never the kernel's password."
            ),
        )
    elif isinstance(exc, KernelextError):
        status, text = 409, f"{type(exc).__name__}: {exc}"
    else:
        status, text = 500, f"{type(exc).__name__}: {exc}"
    return status, _without_password(text, str(address))


def _without_password(text: str, address: str) -> str:
    for secret in passwords_in(address):
        for form in {secret, urllib.parse.quote(secret, safe=""), urllib.parse.unquote(secret)}:
            if form:
                text = text.replace(form, "***")
    return text
