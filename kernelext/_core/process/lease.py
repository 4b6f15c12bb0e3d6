"""Liveness leases: a live run is owned by one process, which renews its lease.

Another process may take a ``running``/``stopping`` run over only when its lease has
lapsed or its owner is a process on this host that no longer exists (a killed kernel).

An owner is ``user@host:pid.start``: ``start`` is the process start time (Linux
``/proc/<pid>/stat`` field 22), so a PID reused by another process after the owner died is
not taken for the owner. Owners written by older releases (``user@host:pid``, no start
time) are still read: their PID alone says whether they live.

Agent runs (a worker thread renews their lease every ``RENEW_SECONDS``): a lapsed lease is
taken over even when the owner's PID lives (a frozen process: SIGSTOP, a debugger, a
suspended laptop; or an older release's owner whose PID was reused), and the take-over
raises the run's ownership epoch, so whatever the old owner still tries to write for the
run is refused (``OwnershipLost``).

``%%agent`` cell runs have no renewal thread: their liveness is the kernel process. A cell
run whose owner is a live process of this host (PID alive, start time matching) is never
taken over, however old its lease (a kernel in a long cell, or idle between cells); end
that kernel, or stop the run there. A cell run owned on another host, whose liveness
cannot be told from here, is taken over once its lease lapses, like an agent run; such a
take-over never asks probes (``takeover.py``): the old owner may still be inside a call.

A live run whose owner is gone (:func:`owner_gone`: its lease lapsed, and its PID is gone
where this host can tell) is shown as such by the overview and the panel, and a stop of it
is honoured at once (``takeover.stop_gone_owner``): nobody is left to reach a safe point.

A run in ``needs_decision`` is not live: it is taken over without a lease check, even
while the process that moved it there is alive. The epoch keeps that ordered: the earlier
owner's writes are refused from the take-over's commit on.
"""

from __future__ import annotations

import datetime as dt
import os
import socket
from collections.abc import Mapping
from typing import Any

from ..._formatting import moment_text
from ..._store import actor
from ..._store.base import process_start
from ...errors import RunStateError
from ...status import LIVE
from ..encoding.names import CELL_AGENT  # the agent name of cell runs

__all__ = [
    "LEASE_SECONDS",
    "RENEW_SECONDS",
    "check_takeover",
    "gone_text",
    "last_heard",
    "lease_until",
    "owner_alive",
    "owner_gone",
    "parse_owner",
]

LEASE_SECONDS = 30.0
RENEW_SECONDS = 10.0


def lease_until(now: dt.datetime) -> dt.datetime:
    return now + dt.timedelta(seconds=LEASE_SECONDS)


def parse_owner(owner: str) -> tuple[str, int, int | None] | None:
    """``(host, pid, start)`` of ``user@host:pid[.start]``; None when it is not one.

    The user name may hold ``@`` or ``:`` (the last ``@`` starts the host)."""
    if "@" not in owner:
        return None
    host, sep, tail = owner.rsplit("@", 1)[1].rpartition(":")
    if not sep:
        return None
    pid_text, dot, start_text = tail.partition(".")
    if not pid_text.isdigit() or (dot and not start_text.isdigit()):
        return None
    return host, int(pid_text), int(start_text) if dot else None


def owner_alive(owner: str | None) -> bool | None:
    """True/False for an owner on this host; None when it cannot be told from here.

    With a start time in the owner, a live PID that started at another time is a reused
    PID: the owner is gone."""
    parsed = parse_owner(owner) if owner else None
    if parsed is None:
        return None
    host, pid, start = parsed
    if host != socket.gethostname():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    if start is not None:
        now_start = process_start(pid)
        if now_start is not None and now_start != start:
            return False  # the PID was reused
    return True


def owner_gone(row: Mapping[str, Any], now: dt.datetime) -> bool:
    """Is ``row`` a live run nobody executes any more? Its owner is another process, the
    run could be taken over (``check_takeover``), its lease lapsed, and its owner is not a
    live process of this host (its PID is gone, or it runs on a host this one cannot ask)."""
    owner = row.get("owner")
    if row.get("status") not in LIVE or not owner or owner == actor():
        return False
    lease = row.get("lease_until")
    if not isinstance(lease, dt.datetime) or lease > now or owner_alive(str(owner)) is True:
        return False
    try:
        check_takeover(dict(row), now)
    except RunStateError:
        return False
    return True


def last_heard(row: Mapping[str, Any]) -> dt.datetime | None:
    """When the run's owner last renewed its lease (the lease runs ``LEASE_SECONDS``)."""
    lease = row.get("lease_until")
    if not isinstance(lease, dt.datetime):
        return None
    return lease - dt.timedelta(seconds=LEASE_SECONDS)


def gone_text(row: Mapping[str, Any]) -> str:
    """``running, but its process is gone (last heard 12:03:05 CET): resume it with ...``."""
    heard = last_heard(row)
    when = f" (last heard {moment_text(heard)})" if heard is not None else ""
    return (
        f"{row['status']}, but its process is gone{when}: resume it with "
        f"kx.resume({str(row['id'])!r}) or stop it here"
    )


def check_takeover(row: dict[str, Any], now: dt.datetime) -> None:
    """Refuse to take over a run that another live process holds."""
    if row["status"] not in LIVE:
        return
    owner = row.get("owner")
    if not owner or owner == actor():
        return
    alive = owner_alive(owner)
    if alive is False:
        return
    lease = row.get("lease_until")
    if alive is True and row.get("agent") == CELL_AGENT:
        raise RunStateError(
            f"Run {row['id']!r} is live in {owner}. It cannot be resumed twice at once: a "
            "kernel's %%agent cell runs are never taken over while it lives, whatever their "
            "lease (it may be inside a cell's call now). Stop it there "
            f"(kx.stop({row['id']!r}) or `kernelext stop {row['id']}`), or end that kernel, "
            "then resume."
        )
    if lease is not None and lease <= now:
        return  # lapsed: the owner is gone or frozen; the epoch fences what it still writes
    if lease is None and alive is None:
        return
    until = f" (lease until {moment_text(lease)})" if lease is not None else ""
    raise RunStateError(
        f"Run {row['id']!r} is live in {owner}{until}. It cannot be resumed twice at once. "
        f"Stop it there (kx.stop({row['id']!r}) or `kernelext stop {row['id']}`), or, if that "
        "process is gone, resume again after its lease lapses."
    )
