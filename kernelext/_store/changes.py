"""How a reader learns that runs changed, whichever process changed them.

Two levels, so that watching costs nothing while nothing changes:

- ``change_signal()``: the backend's free signal. DuckDB: the store file's and its WAL's
  ``stat`` (every commit of any process appends to the WAL or, at a checkpoint, rewrites the
  file; reads change neither), so nothing is opened or read. ``None`` where no such signal
  exists (PostgreSQL): then ask ``run_versions``.
- ``run_versions(run_ids)``: one query for a group of runs, a value per run that changes
  whenever anything a person sees of the run changes (its row: status, reason, progress,
  stop request, owner; its steps, effects, approvals, questions and events).

And what a view of a run shows besides its row: ``last_effects`` and ``effect_counts``
(read from the tables, so a resume in another process or kernel keeps them), the step
executing in whatever process (``open_step``). The overview of every run (``kx.runs()`` in
a notebook) reads ``overview_runs`` (the columns it shows, no arguments), and only for the
runs that need it ``unknown_counts`` and ``step_pace``.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Any

from ..status import EffectStatus, StepStatus
from .base import StoreBase

__all__ = ["ChangesMixin"]

# What the overview of the runs shows of each run's row (never its arguments)
OVERVIEW_COLUMNS = (
    "id, agent, status, reason, created_at, updated_at, deadline, stop_requested_at,"
    " stop_source, total_steps, completed_steps, error, max_step_seconds, owner_epoch, owner,"
    " lease_until"
)
PACE_OF = 64  # the latest completed steps of a run its pace is taken from

# (table, aggregates per run): what of a run's rows in each table moves when it changes
_GROUPED: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("steps", ("count(*)", "max(started_at)", "max(ended_at)")),
    ("effects", ("count(*)", "max(intent_at)", "max(outcome_at)", "max(decided_by)")),
    ("approvals", ("count(*)", "max(requested_at)", "max(decided_at)", "max(superseded_at)")),
    ("{questions}", ("count(*)", "max(asked_at)", "max(answered_at)")),
    ("events", ("max(id)",)),
)


class ChangesMixin(StoreBase):
    def change_signal(self) -> Hashable | None:
        """Free to read (no query); it moves whenever any process committed anything.
        ``None``: this backend offers none (call :meth:`run_versions`)."""
        return self.backend.change_signal()

    def run_versions(self, run_ids: Iterable[str]) -> dict[str, tuple[Any, ...]]:
        """Run id -> a value that changes with everything shown of the run (one query;
        a run not in the store is left out)."""
        ids = tuple(sorted(set(run_ids)))
        if not ids:
            return {}
        marks = "(" + ", ".join("?" for _ in ids) + ")"
        joins, columns, params = [], [], []
        for n, (table, aggregates) in enumerate(_GROUPED):
            name = table.format(questions=self.questions_table)
            alias = f"g{n}"
            named = ", ".join(f"{agg} AS c{i}" for i, agg in enumerate(aggregates))
            joins.append(
                f" LEFT JOIN (SELECT run_id, {named} FROM {name}"
                f" WHERE run_id IN {marks} GROUP BY run_id) {alias} ON {alias}.run_id = r.id"
            )
            columns += [f"{alias}.c{i}" for i in range(len(aggregates))]
            params += list(ids)
        sql = (
            "SELECT r.id, r.status, r.reason, r.updated_at, r.completed_steps, r.total_steps,"
            " r.stop_requested_at, r.owner, r.owner_epoch, r.error, "
            + ", ".join(columns)
            + " FROM runs r"
            + "".join(joins)
            + f" WHERE r.id IN {marks}"
        )
        rows = self.read(sql, (*params, *ids))
        return {str(row[0]): tuple(row[1:]) for row in rows}

    def last_effects(self, run_id: str, limit: int = 5) -> list[dict[str, Any]]:
        """The run's latest effects (oldest first), over every process and resume."""
        rows = self.read_dicts(
            "SELECT key, tool, step_key, step_ordinal, status FROM effects WHERE run_id = ?"
            " ORDER BY coalesce(outcome_at, intent_at) DESC, intent_at DESC LIMIT ?",
            (run_id, limit),
        )
        return rows[::-1]

    def effect_counts(self, run_id: str) -> dict[str, int]:
        """Effect status -> how many of the run's effects have it."""
        rows = self.read(
            "SELECT status, count(*) FROM effects WHERE run_id = ? GROUP BY status ORDER BY status",
            (run_id,),
        )
        return {str(status): int(n) for status, n in rows}

    def open_step(self, run_id: str) -> dict[str, Any] | None:
        """The run's step that began and has not ended (the latest one), in any process."""
        rows = self.read_dicts(
            "SELECT key, ordinal, started_at FROM steps WHERE run_id = ? AND status = ?"
            " ORDER BY started_at DESC LIMIT 1",
            (run_id, StepStatus.RUNNING.value),
        )
        return rows[0] if rows else None

    def overview_runs(self, status: str | None = None) -> list[dict[str, Any]]:
        """The runs as the overview shows them, oldest first (one query)."""
        where, params = ("", ()) if status is None else (" WHERE status = ?", (status,))
        return self.read_dicts(
            f"SELECT {OVERVIEW_COLUMNS} FROM runs{where} ORDER BY created_at, id", params
        )

    def unknown_counts(self, run_ids: Iterable[str]) -> dict[str, int]:
        """Run id -> how many of its effects have an unknown outcome (runs with none left out)."""
        ids = tuple(sorted(set(run_ids)))
        if not ids:
            return {}
        marks = "(" + ", ".join("?" for _ in ids) + ")"
        rows = self.read(
            f"SELECT run_id, count(*) FROM effects WHERE status = ? AND run_id IN {marks}"
            " GROUP BY run_id",
            (EffectStatus.UNKNOWN.value, *ids),
        )
        return {str(run_id): int(n) for run_id, n in rows}

    def step_pace(self, run_ids: Iterable[str]) -> dict[str, tuple[int, float | None, Any, Any]]:
        """Run id -> (n, mean duration in seconds, first end, last end) of its latest
        completed steps (at most ``PACE_OF``): how fast it goes, items at once included."""
        ids = tuple(sorted(set(run_ids)))
        if not ids:
            return {}
        marks = "(" + ", ".join("?" for _ in ids) + ")"
        rows = self.read(
            "SELECT run_id, count(*), avg(duration_s), min(ended_at), max(ended_at) FROM ("
            " SELECT run_id, duration_s, ended_at, row_number() OVER"
            " (PARTITION BY run_id ORDER BY ended_at DESC) AS latest FROM steps"
            f" WHERE status = ? AND ended_at IS NOT NULL AND run_id IN {marks}) recent"
            " WHERE latest <= ? GROUP BY run_id",
            (StepStatus.COMPLETED.value, *ids, PACE_OF),
        )
        return {
            str(run_id): (int(n), None if mean is None else float(mean), first, last)
            for run_id, n, mean, first, last in rows
        }
