"""Recorded facts (with how to re-check them) and the revalidation decisions on them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import RunStateError
from ..status import Status, StepStatus
from .base import StoreBase
from .runs import RunsMixin
from .writer import Tx

__all__ = ["FACT_COLUMNS", "SUPERSEDED_STEP", "FactsMixin"]

FACT_COLUMNS = (
    "run_id, name, kind, value, fingerprint, check_name, check_args, tolerance, step_ordinal,"
    " recorded_at, checked_at, current_value, check_status, check_detail, compare_name"
)
# The status of a completed step that a re-plan sent back to run again (no longer counted).
SUPERSEDED_STEP = StepStatus.SUPERSEDED


class FactsMixin(RunsMixin, StoreBase):
    def record_fact(self, row: dict[str, Any]) -> None:
        """Record a fact (insert, or replace the run's fact of that name).

        It is a hot-path record (journaled on DuckDB, queued elsewhere), so it is stored
        no later than the completion of the step that recorded it. A fact recorded again
        keeps the earliest step that recorded it, so that it is re-checked as long as any
        completed step relied on it.
        """
        data = {
            name: row[name]
            for name in (
                "run_id",
                "name",
                "kind",
                "value",
                "fingerprint",
                "check_name",
                "check_args",
                "tolerance",
                "step_ordinal",
                "compare_name",
            )
        }
        data["at"] = self.now()
        self.record("fact", data, sync=False)

    def facts(self, run_id: str) -> list[dict[str, Any]]:
        return self.read_dicts(
            f"SELECT {FACT_COLUMNS} FROM facts WHERE run_id = ?"
            " ORDER BY step_ordinal NULLS FIRST, recorded_at, name",
            (run_id,),
        )

    def save_fact_checks(
        self, run_id: str, results: Sequence[dict[str, Any]], *, event_kind: str = "facts_checked"
    ) -> None:
        """Store the outcome of re-checking facts (one transaction, one event)."""
        if not results:
            return
        rows = [
            (
                r["checked_at"],
                r["current_value"],
                r["status"],
                r["detail"],
                r["fingerprint"],
                run_id,
                r["name"],
            )
            for r in results
        ]
        counts: dict[str, int] = {}
        for r in results:
            counts[r["status"]] = counts.get(r["status"], 0) + 1

        def job(tx: Tx) -> None:
            tx.executemany(
                "UPDATE facts SET checked_at = ?, current_value = ?, check_status = ?,"
                " check_detail = ?, fingerprint = coalesce(?, fingerprint)"
                " WHERE run_id = ? AND name = ?",
                rows,
            )
            self.event(tx, run_id, event_kind, source="revalidation", detail=counts)

        self.write(job)

    # -- decisions (composed into one transaction by kernelext._core.lifecycle.revalidation) --
    def lock_for_decision_tx(self, tx: Tx, run_id: str) -> str:
        """The run's status, locked; refuses unless the run waits for a decision."""
        row = tx.fetchone(f"SELECT status FROM runs WHERE id = ?{self.for_update}", (run_id,))
        status = str(row[0]) if row else "missing"
        if status != Status.NEEDS_DECISION:
            raise RunStateError(
                f"Run {run_id!r} is {status}, not needs_decision: there is no revalidation to "
                f"decide. Look at it with kx.revalidation({run_id!r}) or resume it with "
                f"kx.resume({run_id!r})."
            )
        return status

    def accept_facts_tx(self, tx: Tx, run_id: str, names: Sequence[str]) -> None:
        """The re-checked values become the recorded facts."""
        tx.executemany(
            "UPDATE facts SET value = CASE WHEN check_status = 'changed' THEN current_value"
            " ELSE value END, recorded_at = CASE WHEN check_status = 'changed' THEN checked_at"
            " ELSE recorded_at END, check_status = 'accepted' WHERE run_id = ? AND name = ?",
            [(run_id, name) for name in names],
        )

    def supersede_steps_tx(self, tx: Tx, run_id: str, from_ordinal: int) -> int:
        """Completed steps at or after ``from_ordinal`` no longer count: they run again."""
        rows = tx.fetchall(
            "UPDATE steps SET status = ? WHERE run_id = ? AND status = ?"
            " AND ordinal >= ? RETURNING id",
            (SUPERSEDED_STEP, run_id, StepStatus.COMPLETED, from_ordinal),
        )
        tx.execute(
            "UPDATE facts SET check_status = ? WHERE run_id = ? AND step_ordinal >= ?",
            (SUPERSEDED_STEP, run_id, from_ordinal),
        )
        done = tx.fetchone(
            "SELECT count(*) FROM steps WHERE run_id = ? AND status = ?",
            (run_id, StepStatus.COMPLETED),
        )
        tx.execute(
            "UPDATE runs SET completed_steps = ?, updated_at = greatest(updated_at, ?)"
            " WHERE id = ?",
            (int(done[0]) if done else 0, self.now(), run_id),
        )
        return len(rows)

    def effects_from_step(self, run_id: str, from_ordinal: int) -> list[dict[str, Any]]:
        """Ledger rows of steps at or after ``from_ordinal`` (kept as they are on re-plan)."""
        return self.read_dicts(
            "SELECT key, tool, step_key, step_ordinal, call_ordinal, status, args, intent_at"
            " FROM effects WHERE run_id = ? AND step_ordinal >= ?"
            " ORDER BY step_ordinal, call_ordinal",
            (run_id, from_ordinal),
        )
