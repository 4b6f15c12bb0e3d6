"""What the store conformance suite shares: the store factory, a fake clock, record helpers.

A backend's test module subclasses :class:`StoreFactory` (two methods) and yields one
from a ``store_factory`` fixture; the suite modules (``store_suite*.py``) use the rest.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import threading
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from kernelext._store import Blob, Store
from kernelext.status import Status

__all__ = [
    "WAIT",
    "Clock",
    "FakeClock",
    "Gate",
    "StoreFactory",
    "complete",
    "effect_row",
    "events",
    "fact",
    "insert_event_job",
    "make_blob",
    "move",
    "probe_labels",
    "with_runs",
]

Clock = Callable[[], dt.datetime]
WAIT = 60.0  # generous bound for anything the writer thread must do


class StoreFactory:
    """Opens stores for the suite. A backend subclasses it (two methods)."""

    def __init__(self) -> None:
        self.opened: list[Store] = []
        self._locations: dict[int, str] = {}

    # -- what a backend implements ------------------------------------------------
    def fresh_location(self) -> str:
        """A location (path, URL) of a database no test has used yet."""
        raise NotImplementedError

    def open_location(self, location: str, clock: Clock | None) -> Store:
        raise NotImplementedError

    # -- what tests use ---------------------------------------------------------------
    def __call__(self, clock: Clock | None = None) -> Store:
        return self._open(self.fresh_location(), clock)

    def reopen(self, store: Store, clock: Clock | None = None) -> Store:
        location = self._locations[id(store)]
        store.close()
        return self._open(location, clock)

    def close_all(self) -> None:
        for store in self.opened:
            store.close()

    def _open(self, location: str, clock: Clock | None) -> Store:
        store = self.open_location(location, clock)
        self.opened.append(store)
        self._locations[id(store)] = location
        return store


class FakeClock:
    """A clock the test moves by hand (naive UTC, like the store)."""

    def __init__(self, start: dt.datetime | None = None) -> None:
        self.current = start or dt.datetime(2030, 1, 2, 3, 4, 5, 678000)

    def __call__(self) -> dt.datetime:
        return self.current

    def advance(self, seconds: float) -> dt.datetime:
        self.current += dt.timedelta(seconds=seconds)
        return self.current


# -- helpers -----------------------------------------------------------------------------
def make_blob(data: bytes, base: Blob | None = None, encoding: str = "json") -> Blob:
    digest = hashlib.sha256(data).hexdigest()
    return Blob(uuid.uuid4(), encoding, digest, len(data), base.id if base else None, data)


def complete(
    store: Store,
    run_id: str,
    ordinal: int,
    key: str,
    blobs: Sequence[Blob] = (),
    manifest: dict[str, str] | None = None,
) -> uuid.UUID:
    """Begin and complete one step; returns the step id."""
    step_id = uuid.uuid4()
    store.begin_step(run_id, step_id, ordinal, key, f"name-{key}")
    store.complete_step(
        run_id,
        step_id,
        ordinal,
        0.25,
        manifest if manifest is not None else {b.id.hex: b.id.hex for b in blobs},
        list(blobs),
        sum(b.size for b in blobs),
    )
    return step_id


def events(store: Store, run_id: str, kind: str | None = None) -> list[dict[str, Any]]:
    rows = store.events(run_id)
    return [r for r in rows if kind is None or r["kind"] == kind]


def effect_row(run_id: str, tool: str = "send_email", call: int = 0) -> dict[str, Any]:
    return {
        "key": uuid.uuid4(),
        "run_id": run_id,
        "step_key": "s1",
        "step_ordinal": 0,
        "tool": tool,
        "call_ordinal": call,
        "args_hash": "ab" * 16,
        "args": json.dumps({"to": "x@example.org"}),
        "resumable": True,
    }


class Gate:
    """A job that holds the writer thread until released, so later jobs queue up."""

    def __init__(self, store: Store) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.future = store.write_async(self._job)
        assert self.entered.wait(WAIT), "the writer thread never ran the gate job"

    def _job(self, tx: Any) -> None:
        self.entered.set()
        self.release.wait(WAIT)

    def open(self) -> None:
        self.release.set()
        self.future.result(WAIT)


def insert_event_job(store: Store, run_id: str, label: str) -> Callable[[Any], str]:
    def job(tx: Any) -> str:
        store.event(tx, run_id, "probe", source="suite", reason=label)
        return label

    return job


def probe_labels(store: Store, run_id: str) -> list[str]:
    return sorted(str(r["reason"]) for r in events(store, run_id, "probe"))


# A path through the transition table from ``running`` to each status.
PATHS: dict[Status, tuple[Status, ...]] = {
    Status.RUNNING: (),
    Status.STOPPING: (Status.STOPPING,),
    Status.SUSPENDED: (Status.SUSPENDED,),
    Status.NEEDS_DECISION: (Status.NEEDS_DECISION,),
    Status.COMPLETED: (Status.COMPLETED,),
    Status.FAILED: (Status.FAILED,),
    Status.CANCELLED: (Status.CANCELLED,),
    Status.EXPIRED: (Status.SUSPENDED, Status.EXPIRED),
}


def with_runs(store: Store, *run_ids: str) -> Store:
    """``store`` with a new ``running`` run of agent ``agent`` for each of ``run_ids``."""
    for run_id in run_ids:
        store.create_run(run_id, "agent")
    return store


def move(store: Store, run_id: str, status: Status) -> None:
    """Walk a new run from ``running`` to ``status`` (claims and steps are not touched)."""
    for step in PATHS[status]:
        before = store.get_run(run_id)["status"]
        assert store.transition(run_id, step, (before,)).ok


def fact(run_id: str, name: str, value: Any, step: int | None, **extra: Any) -> dict[str, Any]:
    """A row for ``Store.record_fact``: a JSON value re-checked by ``tests.lookup``."""
    row = {
        "run_id": run_id,
        "name": name,
        "kind": "value",
        "value": json.dumps(value),
        "fingerprint": None,
        "check_name": "tests.lookup",
        "check_args": json.dumps([name]),
        "tolerance": None,
        "step_ordinal": step,
        "compare_name": None,
    }
    row.update(extra)
    return row
