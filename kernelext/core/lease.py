"""Liveness leases: a live run is owned by one process, which renews its lease.

Another process may take a ``running``/``stopping`` run over only when its lease has
lapsed or its owner is a process on this host that no longer exists (a killed kernel).
"""

from __future__ import annotations

import datetime as dt
import os
import socket
from typing import Any

from ..errors import RunStateError
from ..status import LIVE
from ..store import actor

__all__ = ["LEASE_SECONDS", "RENEW_SECONDS", "check_takeover", "lease_until", "owner_alive"]

LEASE_SECONDS = 30.0
RENEW_SECONDS = 10.0


def lease_until(now: dt.datetime) -> dt.datetime:
    return now + dt.timedelta(seconds=LEASE_SECONDS)


def owner_alive(owner: str | None) -> bool | None:
    """True/False for an owner on this host; None when it cannot be told from here."""
    if not owner or "@" not in owner or ":" not in owner:
        return None
    host_pid = owner.rsplit("@", 1)[1]
    host, _, pid_text = host_pid.rpartition(":")
    if host != socket.gethostname() or not pid_text.isdigit():
        return None
    try:
        os.kill(int(pid_text), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
    if lease is not None and lease <= now and alive is None:
        return
    if lease is None and alive is None:
        return
    until = f" (lease until {lease:%H:%M:%S} UTC)" if lease is not None else ""
    raise RunStateError(
        f"Run {row['id']!r} is live in {owner}{until}. It cannot be resumed twice at once. "
        f"Stop it there (kx.stop({row['id']!r}) or `kernelext stop {row['id']}`), or, if that "
        "process is gone, resume again after its lease lapses."
    )
