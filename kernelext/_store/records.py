"""Hot-path records and how each is applied to the tables.

Every record is idempotent: applying it twice leaves the tables as applying it once,
so the journal can be folded again after a crash without harm.

The records an owner writes for its run (``FENCED``) carry the run's ownership ``epoch``
(``runs.owner_epoch`` when the process took the run over). A record whose epoch is no
longer the run's is refused (``stale``) unless it is already in the tables (the same record
applied before: folding twice stays harmless). Records without an epoch (older journals)
are applied as before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import OwnershipLost
from ..status import EffectStatus, StepStatus
from .run_end import END_STATUSES, fold_run_end
from .run_end import REQUIRED_FIELDS as RUN_END_FIELDS
from .run_end import already_applied as run_end_applied
from .stop_record import FORCE_REQUESTED, STOP_REQUESTED, stop_request
from .writer import Tx

__all__ = [
    "APPLY",
    "FENCED",
    "FORCE_REQUESTED",
    "STOP_REQUESTED",
    "WHAT",
    "apply_record",
    "check_epoch_tx",
    "check_record",
    "fact",
    "insert_intent",
    "intent_row",
    "outcome",
    "split_stale",
    "step_begin_row",
    "stop_request",
    "values",
]


STEP_BEGIN = (
    "INSERT INTO steps (id, run_id, ordinal, key, name, status, started_at)",
    " ON CONFLICT (id) DO NOTHING",
)


def step_begin_row(d: dict[str, Any]) -> tuple[Any, ...]:
    return (
        d["id"],
        d["run_id"],
        d["ordinal"],
        d["key"],
        d["name"],
        StepStatus.RUNNING.value,
        d["started_at"],
    )


def _step_begin(tx: Tx, d: dict[str, Any]) -> None:
    insert_rows(tx, *STEP_BEGIN, [step_begin_row(d)])


def _step_complete(tx: Tx, d: dict[str, Any]) -> None:
    blobs = d["blobs"]
    for row in blobs:
        tx.execute(
            "INSERT INTO blobs (id, run_id, encoding, sha256, size, location, base_id, data,"
            " created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
            # Blob ids are content-addressed: a value seen before maps to an existing blob.
            " ON CONFLICT (id) DO NOTHING",
            (*row, d["at"]),
        )
    tx.execute(
        "INSERT INTO snapshots (id, run_id, step_ordinal, created_at, manifest, bytes)"
        " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING",
        (d["snapshot_id"], d["run_id"], d["ordinal"], d["at"], d["manifest"], d["bytes"]),
    )
    tx.execute(
        "UPDATE steps SET status = ?, ended_at = ?, duration_s = ?, snapshot_id = ? WHERE id = ?",
        (StepStatus.COMPLETED.value, d["at"], d["duration_s"], d["snapshot_id"], d["step_id"]),
    )
    tx.execute(
        "UPDATE runs SET updated_at = greatest(updated_at, ?), completed_steps ="
        " (SELECT count(*) FROM steps WHERE run_id = ? AND status = ?) WHERE id = ?",
        (d["at"], d["run_id"], StepStatus.COMPLETED.value, d["run_id"]),
    )


def _item_complete(tx: Tx, d: dict[str, Any]) -> None:
    """A ``run.map`` item's step completed with the value it returned (no snapshot: the
    agent's state is not an item's to change). Only a step still ``running`` completes: a
    late result (a worker the owner declared lost, a second copy of the item) never
    overwrites a step that ended, nor the value a completed one stored."""
    tx.execute(
        "UPDATE steps SET status = ?, ended_at = ?, duration_s = ?, result = ? WHERE id = ?"
        " AND status = ?",
        (
            StepStatus.COMPLETED.value,
            d["at"],
            d["duration_s"],
            d["result"],
            d["step_id"],
            StepStatus.RUNNING.value,
        ),
    )
    if d.get("count", True):  # a worker's completion: the owner counts (recount_completed)
        tx.execute(
            "UPDATE runs SET updated_at = greatest(updated_at, ?), completed_steps ="
            " (SELECT count(*) FROM steps WHERE run_id = ? AND status = ?) WHERE id = ?",
            (d["at"], d["run_id"], StepStatus.COMPLETED.value, d["run_id"]),
        )


INTENT = (
    "INSERT INTO effects (key, run_id, step_key, step_ordinal, tool, call_ordinal,"
    " args_hash, args, status, resumable, intent_at)",
    " ON CONFLICT (key) DO NOTHING",
)


def intent_row(d: dict[str, Any]) -> tuple[Any, ...]:
    return (
        d["key"],
        d["run_id"],
        d["step_key"],
        d["step_ordinal"],
        d["tool"],
        d["call_ordinal"],
        d["args_hash"],
        d["args"],
        EffectStatus.PENDING.value,
        d["resumable"],
        d["at"],
    )


def _intent(tx: Tx, d: dict[str, Any]) -> None:
    insert_rows(tx, *INTENT, [intent_row(d)])


def insert_intent(tx: Tx, d: dict[str, Any]) -> bool:
    """Insert one intent in one round trip; False when a row with its key exists."""
    head, tail = INTENT
    row = intent_row(d)
    return tx.fetchone(f"{head} VALUES {values(len(row), 1)}{tail} RETURNING key", row) is not None


def outcome(tx: Tx, d: dict[str, Any]) -> None:
    """The outcome of a call lands on its pending row, or on one made ``unknown`` while
    the call was in flight and not decided since (another attempt of the same ``run.map``
    item took the call for lost: the attempt that made it knows better). A stale owner's
    outcome never gets here (fenced by its epoch)."""
    tx.execute(
        "UPDATE effects SET status = ?, result = ?, error = ?, outcome_at = ?,"
        " attempts = coalesce(?, attempts) WHERE key = ? AND (status = ? OR"
        " (status = ? AND decided_by IS NULL))",
        (
            d["status"],
            d["result"],
            d["error"],
            d["at"],
            d.get("attempts"),
            d["key"],
            EffectStatus.PENDING.value,
            EffectStatus.UNKNOWN.value,
        ),
    )


_FACT = (
    "INSERT INTO facts (run_id, name, kind, value, fingerprint, check_name, check_args, tolerance,"
    " step_ordinal, recorded_at, compare_name) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (run_id, name) DO UPDATE SET kind = excluded.kind, value = excluded.value,"
    " fingerprint = excluded.fingerprint, check_name = excluded.check_name,"
    " check_args = excluded.check_args, tolerance = excluded.tolerance,"
    " step_ordinal = least(facts.step_ordinal, excluded.step_ordinal),"
    " recorded_at = excluded.recorded_at,"
    " compare_name = excluded.compare_name, checked_at = NULL, current_value = NULL,"
    " check_status = NULL, check_detail = NULL"
)


def fact(tx: Tx, d: dict[str, Any]) -> None:
    tx.execute(
        _FACT,
        (
            d["run_id"],
            d["name"],
            d["kind"],
            d["value"],
            d["fingerprint"],
            d["check_name"],
            d["check_args"],
            d["tolerance"],
            d["step_ordinal"],
            d["at"],
            d["compare_name"],
        ),
    )


APPLY: dict[str, Callable[[Tx, dict[str, Any]], None]] = {
    "step_begin": _step_begin,
    "step_complete": _step_complete,
    "item_complete": _item_complete,
    "intent": _intent,
    "outcome": outcome,
    "fact": fact,
    "stop_request": stop_request,
    "run_end": fold_run_end,
}


REQUIRED: dict[str, tuple[str, ...]] = {
    "step_begin": ("id", "run_id", "ordinal", "key", "started_at"),
    "step_complete": ("step_id", "run_id", "ordinal", "at", "snapshot_id", "manifest", "bytes"),
    "item_complete": ("step_id", "run_id", "at", "result"),
    "intent": ("key", "run_id", "step_key", "tool", "call_ordinal", "args_hash", "resumable", "at"),
    "outcome": ("key", "status", "at"),
    "fact": ("run_id", "name", "kind", "at"),
    "stop_request": ("run_id", "source", "who", "at", "request"),
    "run_end": RUN_END_FIELDS,
}


def check_record(kind: str, data: dict[str, Any]) -> None:
    """Refuse a record the tables would reject, before it is made durable."""
    if kind not in APPLY:
        raise ValueError(f"unknown record kind {kind!r}")
    missing = [name for name in REQUIRED[kind] if data.get(name) is None]
    if missing:
        raise ValueError(f"a {kind} record needs {', '.join(missing)}")
    if kind == "step_complete" and not isinstance(data["bytes"], int):
        raise ValueError("a step_complete record needs an integer byte count")
    if kind == "run_end" and data["status"] not in END_STATUSES:
        raise ValueError(
            f"a run_end record moves a run to one of {', '.join(sorted(END_STATUSES))},"
            f" not {data['status']!r}"
        )


# Records whose transaction also updates the run's row (its count of completed steps):
# their read of the epoch locks the row for update at once, rather than shared first and
# exclusively after. (Items completing in other processes do not count themselves: a
# writer's group of jobs holds the row shared from its first job on, so two workers that
# both upgraded would deadlock until the server broke one; their owner recounts.)
UPDATES_RUN = frozenset({"step_complete", "item_complete"})


def apply_record(
    tx: Tx, kind: str, data: dict[str, Any], *, lock: str = "", update_lock: str = ""
) -> None:
    """Apply one record; a stale one (``FENCED``) raises ``OwnershipLost`` unless it was
    applied before. ``lock``: appended to the read of the run's epoch (PostgreSQL:
    `` FOR SHARE``, so a take-over waits for this transaction and it for a take-over);
    ``update_lock`` (`` FOR UPDATE``) instead for a record that updates the run's row."""
    epoch = data.get("epoch")
    if kind in UPDATES_RUN and update_lock and data.get("count", True):
        lock = update_lock
    if kind in FENCED and epoch is not None and isinstance(data.get("run_id"), str):
        current = tx.fetchone(
            f"SELECT owner_epoch, owner, updated_at FROM runs WHERE id = ?{lock}",
            (data["run_id"],),
        )
        if current is not None and current[0] != epoch:
            if _present(tx, kind, data):
                return
            raise OwnershipLost(
                data["run_id"],
                owner=current[1],
                since=current[2],
                epoch=current[0],
                held=epoch,
                what=WHAT[kind],
            )
    APPLY[kind](tx, data)


# -- ownership epochs ----------------------------------------------------------------
FENCED = (
    "step_begin",
    "step_complete",
    "item_complete",
    "intent",
    "outcome",
    "fact",
    "run_end",
)
WHAT = {
    "fact": "fact",
    "step_begin": "step start",
    "step_complete": "step completion (and its snapshot)",
    "item_complete": "batch item completion (and its result)",
    "intent": "effect intent",
    "outcome": "effect outcome",
    "run_end": "end of the run (its suspension, completion or failure)",
}


def check_epoch_tx(tx: Tx, run_id: str, epoch: int, *, lock: str = "", what: str = "write") -> None:
    """Refuse (``OwnershipLost``) unless run ``run_id`` is still at ownership ``epoch``."""
    current = tx.fetchone(
        f"SELECT owner_epoch, owner, updated_at FROM runs WHERE id = ?{lock}", (run_id,)
    )
    if current is not None and current[0] != epoch:
        raise OwnershipLost(
            run_id, owner=current[1], since=current[2], epoch=current[0], held=epoch, what=what
        )


def _present(tx: Tx, kind: str, d: dict[str, Any]) -> bool:
    """This very record was applied before (a fold again after a crash, or a take-over that
    folded a previous owner's journal first)."""
    if kind == "step_begin":
        row = tx.fetchone("SELECT 1 FROM steps WHERE id = ?", (d["id"],))
    elif kind == "item_complete":
        row = tx.fetchone(
            "SELECT 1 FROM steps WHERE id = ? AND status = ?",
            (d["step_id"], StepStatus.COMPLETED.value),
        )
    elif kind == "step_complete":
        row = tx.fetchone(
            "SELECT 1 FROM steps WHERE id = ? AND snapshot_id = ?", (d["step_id"], d["snapshot_id"])
        )
    elif kind == "intent":
        row = tx.fetchone(
            "SELECT 1 FROM effects WHERE key = ? AND intent_at = ?", (d["key"], d["at"])
        )
    elif kind == "run_end":
        return run_end_applied(tx, d)
    elif kind == "fact":
        row = tx.fetchone(
            "SELECT 1 FROM facts WHERE run_id = ? AND name = ? AND recorded_at = ?",
            (d["run_id"], d["name"], d["at"]),
        )
    else:
        row = tx.fetchone(
            "SELECT 1 FROM effects WHERE key = ? AND outcome_at = ? AND status = ?",
            (d["key"], d["at"], d["status"]),
        )
    return row is not None


Record = tuple[int, str, dict[str, Any]]


def split_stale(tx: Tx, records: list[Record]) -> tuple[list[Record], list[Record]]:
    """``(to_apply, refused)``: records whose epoch is no longer their run's are refused,
    unless applied before (then they are left out: applying twice is as once)."""
    runs = {
        d["run_id"]
        for _, kind, d in records
        if kind in FENCED and d.get("epoch") is not None and isinstance(d.get("run_id"), str)
    }
    if not runs:
        return records, []
    ids = sorted(runs)
    marks = ", ".join("?" for _ in ids)
    epochs = dict(tx.fetchall(f"SELECT id, owner_epoch FROM runs WHERE id IN ({marks})", ids))
    keep: list[Record] = []
    refused: list[Record] = []
    for record in records:
        _, kind, d = record
        epoch = d.get("epoch")
        current = epochs.get(d.get("run_id")) if kind in FENCED and epoch is not None else None
        if current is None or current == epoch:
            keep.append(record)
        elif not _present(tx, kind, d):
            refused.append(record)
    return keep, refused


# -- folding many records at once (the journal's path) -------------------------------------
_CHUNK = 200


def values(width: int, count: int) -> str:
    row = "(" + ", ".join("?" for _ in range(width)) + ")"
    return ", ".join(row for _ in range(count))


def insert_rows(tx: Tx, head: str, tail: str, rows: list[tuple[Any, ...]]) -> None:
    for start in range(0, len(rows), _CHUNK):
        chunk = rows[start : start + _CHUNK]
        params = [value for row in chunk for value in row]
        tx.execute(f"{head} VALUES {values(len(chunk[0]), len(chunk))}{tail}", params)
