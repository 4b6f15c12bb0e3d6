"""Applying many journal records at once: a few statements per batch, not per record.

A batch usually holds whole steps (begun and completed) and whole effect calls (intent and
outcome). Those are inserted in their final state, so the tables see one INSERT per kind
instead of an INSERT followed by an UPDATE per row (an UPDATE of an indexed DuckDB table
rewrites the row). What is left (a completion whose begin was folded before, an outcome
whose intent was) is applied with one ``UPDATE … FROM`` per kind. Every statement stays
idempotent, so folding a journal twice after a crash is harmless.

Rows reach DuckDB as one list per column, unnested in SQL (``SELECT unnest(?) AS id, …``):
the statement's text is the same for any number of rows, so it is read once (by DuckDB and
by the scrubbing door, ``columns.param_columns``, which scrubs each element of a list as
its column), and binding a few lists costs about half of binding a ``VALUES`` list of as
many values.
"""

from __future__ import annotations

from typing import Any

from ...status import EffectStatus, StepStatus
from ..records import (
    Record,
    fact,
    intent_row,
    outcome,
    split_stale,
    step_begin_row,
    stop_request,
)
from ..run_end import fold_run_end
from ..writer import Tx

__all__ = ["apply_records"]

_CHUNK = 5_000  # rows per statement (a fold holds what was journaled meanwhile)


def unnested(columns: str) -> str:
    """``SELECT unnest(?) AS a, unnest(?) AS b …``: the rows of a batch, one list per column."""
    return "SELECT " + ", ".join(f"unnest(?) AS {c.strip()}" for c in columns.split(","))


def _lists(rows: list[tuple[Any, ...]], width: int) -> list[list[Any]]:
    return [list(column) for column in zip(*rows, strict=True)] if rows else [[]] * width


def _insert_new(
    tx: Tx,
    table: str,
    columns: str,
    key: str,
    rows: list[tuple[Any, ...]],
    *,
    skipped: bool = False,
) -> list[tuple[Any, ...]]:
    """Insert the rows whose ``key`` is not in ``table`` yet (folding twice is harmless).

    An anti-join costs about a quarter less than ``ON CONFLICT DO NOTHING`` on DuckDB; rows
    are made unique by key first, as a batch must not hold one key twice. With ``skipped``,
    returns the rows that were not inserted (their key was there): the caller tells a
    record applied before from a second writer of the key.
    """
    width = columns.count(",") + 1
    unique = list({row[0]: row for row in reversed(rows)}.values())[::-1]  # first one wins
    sql = (
        f"INSERT INTO {table} ({columns}) SELECT * FROM ({unnested(columns)}) AS v"
        f" ANTI JOIN {table} AS t ON t.{key} = v.{key}"
    )
    left: list[tuple[Any, ...]] = []
    for start in range(0, len(unique), _CHUNK):
        chunk = unique[start : start + _CHUNK]
        params = _lists(chunk, width)
        if not skipped:
            tx.execute(sql, params)
            continue
        inserted = {r[0] for r in tx.fetchall(f"{sql} RETURNING {key}", params)}
        left.extend(row for row in chunk if row[0] not in inserted)
    return left


def _update_from(
    tx: Tx,
    head: tuple[str, tuple[Any, ...]],
    columns: str,
    where: tuple[str, tuple[Any, ...]],
    rows: list[tuple[Any, ...]],
) -> None:
    """``head`` (an ``UPDATE … SET … = v.…``) applied from ``rows``, unnested as ``v``.

    ``head`` and ``where`` are SQL text with the values of their own placeholders.
    """
    width = columns.count(",") + 1
    (head_sql, head_params), (where_sql, where_params) = head, where
    for start in range(0, len(rows), _CHUNK):
        chunk = rows[start : start + _CHUNK]
        tx.execute(
            f"{head_sql} FROM ({unnested(columns)}) AS v WHERE {where_sql}",
            [*head_params, *_lists(chunk, width), *where_params],
        )


_STEP_COLUMNS = "id, run_id, ordinal, key, name, status, started_at"
_EFFECT_COLUMNS = (
    "key, run_id, step_key, step_ordinal, tool, call_ordinal, args_hash, args, status,"
    " resumable, intent_at"
)


def apply_records(tx: Tx, records: list[Record]) -> list[Record]:
    """Apply records in bulk, in dependency order (steps and intents before what refers to
    them); within a kind, journal order. Returns the records refused: those of an owner
    whose ownership epoch is over (``records.split_stale``), and intents whose key another
    call wrote first. The caller keeps them (quarantine); nothing refused is dropped."""
    records, refused = split_stale(tx, records)
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for _, kind, data in records:
        by_kind.setdefault(kind, []).append(data)
    completions = by_kind.get("step_complete", [])
    items = by_kind.get("item_complete", [])
    _steps(tx, by_kind.get("step_begin", []), completions, items)
    clashes = _effects(tx, by_kind.get("intent", []), by_kind.get("outcome", []))
    if clashes:
        refused.extend(
            r for r in records if r[1] in ("intent", "outcome") and r[2]["key"] in clashes
        )
    if completions:
        _snapshots(tx, completions)
    if completions or items:
        _completed_counts(tx, completions + items)
    for d in by_kind.get("fact", []):
        fact(tx, d)
    for d in by_kind.get("stop_request", []):
        stop_request(tx, d)
    for d in by_kind.get("run_end", []):  # last: after the stop and the steps it ends
        fold_run_end(tx, d)
    return refused


_ALL_STEP_COLUMNS = _STEP_COLUMNS + ", ended_at, duration_s, snapshot_id, result"


def _steps(
    tx: Tx,
    begins: list[dict[str, Any]],
    completions: list[dict[str, Any]],
    items: list[dict[str, Any]],
) -> None:
    """Steps begun in this batch are inserted in one statement: completed (with their
    snapshot, or a ``run.map`` item's result) when their completion is in the batch too,
    else running. A completion of a step begun before is one ``UPDATE … FROM`` per kind."""
    done = {d["step_id"]: d for d in completions}
    results = {d["step_id"]: d for d in items}
    rows: list[tuple[Any, ...]] = []
    for d in begins:
        head = step_begin_row(d)
        if (c := done.get(d["id"])) is not None:
            rows.append((*head[:5], StepStatus.COMPLETED, d["started_at"], c["at"],
                         c["duration_s"], c["snapshot_id"], None))  # fmt: skip
        elif (c := results.get(d["id"])) is not None:
            rows.append((*head[:5], StepStatus.COMPLETED, d["started_at"], c["at"],
                         c["duration_s"], None, c["result"]))  # fmt: skip
        else:
            rows.append((*head, None, None, None, None))
    if rows:
        _insert_new(tx, "steps", _ALL_STEP_COLUMNS, "id", rows)
    begun = {d["id"] for d in begins}
    _update_from(
        tx,
        (
            "UPDATE steps SET status = ?, ended_at = v.ended_at,"
            " duration_s = v.duration_s, snapshot_id = v.snapshot_id",
            (StepStatus.COMPLETED,),
        ),
        "id, ended_at, duration_s, snapshot_id",
        ("steps.id = v.id", ()),
        [
            (c["step_id"], c["at"], c["duration_s"], c["snapshot_id"])
            for c in completions
            if c["step_id"] not in begun
        ],
    )
    _update_from(
        tx,
        (
            "UPDATE steps SET status = ?, ended_at = v.ended_at, duration_s = v.duration_s,"
            " result = CAST(v.result AS TEXT)",
            (StepStatus.COMPLETED,),
        ),
        "id, ended_at, duration_s, result",
        ("steps.id = v.id", ()),
        [
            (d["step_id"], d["at"], d["duration_s"], d["result"])
            for d in items
            if d["step_id"] not in begun
        ],
    )


def _effects(tx: Tx, intents: list[dict[str, Any]], outcomes: list[dict[str, Any]]) -> set[Any]:
    """Returns the keys of intents refused: a row with the key was there, written by
    another call (not this very record applied before: its ``intent_at`` differs)."""
    first: dict[Any, dict[str, Any]] = {}
    extra: list[dict[str, Any]] = []  # a second outcome of one key (after a retry): in order
    for d in outcomes:
        if d["key"] in first:
            extra.append(d)
        else:
            first[d["key"]] = d
    rows: list[tuple[Any, ...]] = []  # pending, or with their outcome: one statement
    for d in intents:
        o = first.pop(d["key"], None)
        row = intent_row(d)
        if o is None:
            rows.append((*row, None, None, None, None))
        else:
            rows.append(
                (*row[:8], o["status"], *row[9:], o["result"], o["error"], o["at"],
                 o.get("attempts"))
            )  # fmt: skip
    skipped: list[tuple[Any, ...]] = []
    if rows:
        skipped = _insert_new(
            tx,
            "effects",
            _EFFECT_COLUMNS + ", result, error, outcome_at, attempts",
            "key",
            rows,
            skipped=True,
        )
    clashes = _clashes(tx, skipped)
    rest = [
        (d["key"], d["status"], d["result"], d["error"], d["at"], d.get("attempts"))
        for d in first.values()
    ]
    _update_from(
        tx,
        (
            "UPDATE effects SET status = v.status, result = CAST(v.result AS TEXT),"
            " error = CAST(v.error AS TEXT), outcome_at = v.outcome_at,"
            " attempts = coalesce(CAST(v.attempts AS INTEGER), effects.attempts)",
            (),
        ),
        "key, status, result, error, outcome_at, attempts",
        ("effects.key = v.key AND effects.status = ?", (EffectStatus.PENDING,)),
        rest,
    )
    for d in extra:
        outcome(tx, d)
    return clashes


def _clashes(tx: Tx, skipped: list[tuple[Any, ...]]) -> set[Any]:
    """Of intents whose key was in the table, those written by another call (a second
    caller: refused, never dropped silently); the same record applied before is not one."""
    clashes: set[Any] = set()
    for row in skipped:  # rare: a fold again after a crash, or a second writer
        key, at = row[0], row[10]
        if tx.fetchone("SELECT 1 FROM effects WHERE key = ? AND intent_at = ?", (key, at)) is None:
            clashes.add(key)
    return clashes


def _snapshots(tx: Tx, completions: list[dict[str, Any]]) -> None:
    blobs = [(*row, d["at"]) for d in completions for row in d["blobs"]]
    if blobs:  # content-addressed: a value seen before maps to an existing blob
        _insert_new(
            tx,
            "blobs",
            "id, run_id, encoding, sha256, size, location, base_id, data, created_at",
            "id",
            blobs,
        )
    _insert_new(
        tx,
        "snapshots",
        "id, run_id, step_ordinal, created_at, manifest, bytes",
        "id",
        [
            (d["snapshot_id"], d["run_id"], d["ordinal"], d["at"], d["manifest"], d["bytes"])
            for d in completions
        ],
    )


def _completed_counts(tx: Tx, completions: list[dict[str, Any]]) -> None:
    latest: dict[str, Any] = {}
    for d in completions:
        latest[d["run_id"]] = d["at"]
    for run_id, at in latest.items():
        tx.execute(
            "UPDATE runs SET updated_at = greatest(updated_at, ?), completed_steps ="
            " (SELECT count(*) FROM steps WHERE run_id = ? AND status = ?) WHERE id = ?",
            (at, run_id, StepStatus.COMPLETED, run_id),
        )
