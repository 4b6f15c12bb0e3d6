"""The effect ledger's rows: intent, outcome, unknowns and human decisions."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

from ..errors import LedgerError
from ..status import LIVE, WAITING, EffectStatus, Status, StepStatus
from .base import StoreBase
from .records import check_epoch_tx, insert_intent
from .runs import RunsMixin
from .writer import Tx

__all__ = ["DECISIONS", "GIVEN_UP", "GIVE_UP", "EffectsMixin"]

EFFECT_COLUMNS = (
    "key, run_id, step_key, step_ordinal, tool, call_ordinal, args_hash, args, status, resumable,"
    " result, error, intent_at, outcome_at, decided_by, decision_note, attempts"
)
# The three decisions on an unknown effect, and the status each gives it: "it happened"
# (applied), "it did not happen" (not_applied: called again on resume), and giving up on
# the run, which cancels it and leaves the effect ``given_up``.
GIVE_UP = "give_up"
GIVEN_UP = EffectStatus.GIVEN_UP
DECISIONS: dict[str, str] = {
    EffectStatus.APPLIED: EffectStatus.APPLIED,
    EffectStatus.NOT_APPLIED: EffectStatus.NOT_APPLIED,
    GIVE_UP: GIVEN_UP,
}


class EffectsMixin(RunsMixin, StoreBase):
    # Intents this store journaled (key -> status, args hash, result, error): a repeated
    # intent is answered from here without a read. The run's lease keeps other
    # processes from writing the same keys meanwhile.
    _journaled_intents: dict[uuid.UUID, dict[str, Any]]

    def load_effects(self, run_id: str) -> dict[uuid.UUID, dict[str, Any]]:
        """Every ledger row of a run, in one query."""
        rows = self.read_dicts(f"SELECT {EFFECT_COLUMNS} FROM effects WHERE run_id = ?", (run_id,))
        return {row["key"]: row for row in rows}

    def load_replayable_effects(self, run_id: str) -> dict[uuid.UUID, dict[str, Any]]:
        """The ledger rows a resume can meet: those of steps not completed (and calls made
        outside steps). Completed steps are skipped, so their rows are never consulted."""
        rows = self.read_dicts(
            f"SELECT {EFFECT_COLUMNS} FROM effects WHERE run_id = ? AND step_key NOT IN"
            " (SELECT key FROM steps WHERE run_id = ? AND status = ?)",
            (run_id, run_id, StepStatus.COMPLETED),
        )
        return {row["key"]: row for row in rows}

    def step_effects(self, run_id: str, step_key: str) -> dict[uuid.UUID, dict[str, Any]]:
        """The ledger rows of one step key of a run (every attempt of a ``run.map`` item)."""
        rows = self.read_dicts(
            f"SELECT {EFFECT_COLUMNS} FROM effects WHERE run_id = ? AND step_key = ?",
            (run_id, step_key),
        )
        return {row["key"]: row for row in rows}

    def lost_intents_unknown(
        self, run_id: str, step_key: str, epoch: int, reason: str
    ) -> list[uuid.UUID]:
        """An item's ``pending`` rows become ``unknown`` (the attempt that recorded them is
        gone mid-call), fenced by ``epoch``: refused (``OwnershipLost``) for a stale owner."""
        lock = self.backend.for_share

        def job(tx: Tx) -> list[uuid.UUID]:
            check_epoch_tx(tx, run_id, epoch, lock=lock, what="effect outcome")
            rows = tx.fetchall(
                "UPDATE effects SET status = ?, outcome_at = ? WHERE run_id = ? AND"
                " step_key = ? AND status = ? RETURNING key, tool",
                (EffectStatus.UNKNOWN, self.now(), run_id, step_key, EffectStatus.PENDING),
            )
            for key, tool in rows:
                detail = {"key": str(key), "tool": tool}
                self.event(tx, run_id, "effect_unknown", reason=reason, detail=detail)
            return [row[0] for row in rows]

        return self.write(job)

    def effect(self, key: uuid.UUID) -> dict[str, Any] | None:
        rows = self.read_dicts(f"SELECT {EFFECT_COLUMNS} FROM effects WHERE key = ?", (key,))
        return rows[0] if rows else None

    def write_intent(self, row: dict[str, Any]) -> dict[str, Any] | None:
        """Durably record ``pending`` before the call. Returns the existing row if any.

        With a journal (DuckDB) the row is appended and fsynced under the run's fence; the
        process owns the run (its ownership epoch), so no other writer can have made the
        same call meanwhile. A run taken over since raises ``OwnershipLost`` before
        anything is written (PostgreSQL: in the intent's transaction, the run row locked
        shared, so a take-over and an intent are ordered).
        """
        data = {
            name: row[name]
            for name in (
                "key",
                "run_id",
                "step_key",
                "step_ordinal",
                "tool",
                "call_ordinal",
                "args_hash",
                "args",
                "resumable",
            )
        }
        data["at"] = self.now()
        self._intent_runs[row["key"]] = row["run_id"]
        epoch = self.held_epoch(row["run_id"])
        if self.hot_path is not None:
            known = self._journaled_intents.get(row["key"])
            if known is not None:
                return dict(known)
            # Remembered only once durable: an append that failed (disk full) leaves
            # nothing behind, so a retry writes the intent again.
            self.record("intent", data, sync=True)
            self._journaled_intents[row["key"]] = {
                "status": EffectStatus.PENDING,
                "args_hash": row["args_hash"],
                "result": None,
                "error": None,
            }
            return None

        lock = self.backend.for_share

        def job(tx: Tx) -> dict[str, Any] | None:
            if epoch is not None:
                check_epoch_tx(tx, row["run_id"], epoch, lock=lock, what="effect intent")
            if insert_intent(tx, data):  # the usual case: one round trip
                return None
            existing = tx.fetchone(
                "SELECT status, args_hash, result, error FROM effects"
                f" WHERE key = ?{self.for_update}",
                (row["key"],),
            )
            assert existing is not None  # rows are never deleted from the ledger
            names = ("status", "args_hash", "result", "error")
            return dict(zip(names, existing, strict=True))

        return self.write(job)

    def forget_intents(self, keys: Iterable[uuid.UUID]) -> None:
        """Let go of what this store remembers of calls whose step completed (a completed
        step is never run again, so no repeated intent can come for them)."""
        for key in keys:
            self._journaled_intents.pop(key, None)
            self._intent_runs.pop(key, None)

    def retry_intent(self, key: uuid.UUID) -> None:
        """A row decided ``not_applied`` (or ``failed`` with retry) goes back to ``pending``
        (the intent of the call made again): refused (``OwnershipLost``) once the run was
        taken over from this process, before the call."""
        lock = self.backend.for_share

        def job(tx: Tx) -> None:
            found = tx.fetchone("SELECT run_id FROM effects WHERE key = ?", (key,))
            held = self.held_epoch(str(found[0])) if found is not None else None
            if found is not None and held is not None:
                check_epoch_tx(tx, str(found[0]), held, lock=lock, what="effect intent (retry)")
            tx.execute(
                "UPDATE effects SET status = ?, intent_at = ?, outcome_at = NULL,"
                " error = NULL WHERE key = ?",
                (EffectStatus.PENDING, self.now(), key),
            )

        self.write(job)
        known = self._journaled_intents.get(key)
        if known is not None:
            known.update(status=EffectStatus.PENDING, result=None, error=None)

    def write_outcome(
        self,
        key: uuid.UUID,
        status: str,
        *,
        result: str | None = None,
        error: str | None = None,
        attempts: int | None = None,
        wait: bool = False,
    ) -> None:
        """Record ``applied`` / ``failed`` / ``unknown`` (``not_applied``: a call stopped
        between two attempts). Queued unless ``wait``. ``attempts``: how many times the call
        was made under its key (None: not counted, the column keeps its value)."""
        data = {"key": key, "status": status, "result": result, "error": error, "at": self.now()}
        if attempts is not None:
            data["attempts"] = attempts
        self.record("outcome", data, sync=wait)

    def mark_pending_unknown(self, tx: Tx, run_id: str) -> list[uuid.UUID]:
        """On resume: every ``pending`` row of the run has an unknown outcome."""
        rows = tx.fetchall(
            "UPDATE effects SET status = ?, outcome_at = ? WHERE run_id = ?"
            " AND status = ? RETURNING key, tool",
            (EffectStatus.UNKNOWN, self.now(), run_id, EffectStatus.PENDING),
        )
        for key, tool in rows:
            self.event(
                tx,
                run_id,
                "effect_unknown",
                reason="intent recorded, outcome not",
                detail={"key": str(key), "tool": tool},
            )
        return [r[0] for r in rows]

    def mark_failed_unknown(
        self, key: uuid.UUID, reason: str, *, status: str = EffectStatus.FAILED
    ) -> None:
        """A ``failed`` row whose call may have half-happened (``resumable=False``) is unknown;
        so is (``status="applied"``) an applied one whose result was not stored."""

        def job(tx: Tx) -> None:
            rows = tx.fetchall(
                "UPDATE effects SET status = ?, outcome_at = ? WHERE key = ?"
                " AND status = ? RETURNING run_id, tool",
                (EffectStatus.UNKNOWN, self.now(), key, status),
            )
            for run_id, tool in rows:
                self.event(
                    tx,
                    run_id,
                    "effect_unknown",
                    reason=reason,
                    detail={"key": str(key), "tool": tool},
                )

        self.write(job)

    def unknown_keys_tx(self, tx: Tx, run_id: str) -> list[uuid.UUID]:
        rows = tx.fetchall(
            "SELECT key FROM effects WHERE run_id = ? AND status = ?",
            (run_id, EffectStatus.UNKNOWN),
        )
        return [r[0] for r in rows]

    def open_unknowns(self, run_id: str) -> list[dict[str, Any]]:
        return self.read_dicts(
            f"SELECT {EFFECT_COLUMNS} FROM effects WHERE run_id = ? AND status = ?"
            " ORDER BY intent_at, call_ordinal",
            (run_id, EffectStatus.UNKNOWN),
        )

    def decide_effect(
        self,
        key: uuid.UUID,
        decision: str,
        *,
        result: str | None,
        who: str,
        note: str | None,
        source: str = "api",
    ) -> str:
        """Apply a human decision (``DECISIONS``) to an ``unknown`` row. Returns the run id."""
        new_status = DECISIONS[decision]

        def job(tx: Tx) -> str:
            row = tx.fetchone(
                f"SELECT run_id, status, tool FROM effects WHERE key = ?{self.for_update}", (key,)
            )
            if row is None:
                raise LedgerError(f"No effect with key {key} in the ledger.")
            run_id, status, tool = row
            if status != EffectStatus.UNKNOWN:
                raise LedgerError(
                    f"Effect {key} ({tool}) is {status!r}, not {EffectStatus.UNKNOWN.value!r};"
                    " only unknown effects are reconciled. See kx.reconcile(run_id) for the"
                    " open ones."
                )
            tx.execute(
                "UPDATE effects SET status = ?, result = ?, outcome_at = ?, decided_by = ?,"
                " decision_note = ? WHERE key = ?",
                (
                    new_status,
                    result if decision == EffectStatus.APPLIED else None,
                    self.now(),
                    who,
                    note,
                    key,
                ),
            )
            self.event(
                tx,
                run_id,
                "effect_decided",
                source=source,
                who=who,
                reason=note,
                detail={"key": str(key), "tool": tool, "decision": decision},
            )
            if decision == GIVE_UP:
                self.transition_tx(
                    tx,
                    run_id,
                    Status.CANCELLED,
                    (*WAITING, *LIVE, Status.FAILED),
                    kind=Status.CANCELLED,
                    source=source,
                    who=who,
                    reason=f"gave up on unknown effect {tool}",
                )
            return str(run_id)

        return self.write(job)
