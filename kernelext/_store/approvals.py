"""Approval requests for effect calls and questions to a person: all their SQL.

An approval row is bound to one call: the effect's key and its argument hash. It is
decided once (a conditional ``UPDATE … WHERE decision IS NULL``, so of two racing
deciders exactly one wins) and consumed once, just before the intent of the call it
allows is recorded. A newer request for the same key supersedes the older ones that were
not consumed. A question (``inputs``) is answered once; its answer is replayed.
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from .._formatting import moment_text
from ..errors import LedgerError, RunStateError
from ..status import TERMINAL
from .base import in_list
from .effects import EffectsMixin
from .records import check_epoch_tx, insert_intent
from .runs import RunsMixin
from .writer import Tx

__all__ = ["APPROVAL_COLUMNS", "APPROVED", "INPUT_COLUMNS", "REJECTED", "ApprovalsMixin"]

APPROVED = "approved"
REJECTED = "rejected"
APPROVAL_COLUMNS = (
    "id, key, run_id, step, step_ordinal, call_ordinal, tool, args_hash, args, requested_at,"
    " expires_at, decided_at, decision, actor, note, consumed_at, superseded_at"
)
INPUT_COLUMNS = (
    "key, run_id, step, step_ordinal, call_ordinal, prompt, answer_schema, default_answer,"
    " asked_at, expires_at, answer, answered_at, actor, note"
)
_APPROVAL_NAMES = tuple(name.strip() for name in APPROVAL_COLUMNS.split(","))
_INPUT_NAMES = tuple(name.strip() for name in INPUT_COLUMNS.split(","))
_LIVE = "consumed_at IS NULL AND superseded_at IS NULL"
_NOT_EXPIRED = "(expires_at IS NULL OR expires_at > ?)"
_INTENT_FIELDS = (
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


def _stamp(value: Any) -> str:
    return moment_text(value) if isinstance(value, dt.datetime) else str(value)


def several_requests(row: dict[str, Any], ids: list[Any]) -> str:
    """Why a decision by effect key is refused once that key has had several requests."""
    return (
        f"Effect key {row['key']} ({row['tool']} in run {row['run_id']!r}) has had "
        f"{len(ids)} approval requests ({', '.join(str(i) for i in ids)}): its arguments "
        "changed between them, so the key does not say which call you saw. Decide by request "
        f"id (the newest, {ids[-1]}, has arguments {row['args']}); see "
        f"kx.approvals({row['run_id']!r}) or `kernelext approvals`."
    )


def refusal(row: dict[str, Any], now: dt.datetime) -> str:
    """Why the approval request ``row`` cannot be decided now, and what to do instead."""
    what = f"Approval {row['id']} ({row['tool']} in run {row['run_id']!r}, key {row['key']})"
    listing = f"See the open requests with kx.approvals({row['run_id']!r})."
    if row["consumed_at"] is not None:
        return (
            f"{what} was approved and its call used it at {_stamp(row['consumed_at'])}; an "
            "approval allows one call. A new call of the effect asks again. " + listing
        )
    if row["superseded_at"] is not None:
        return (
            f"{what} was replaced at {_stamp(row['superseded_at'])} by a newer request for the "
            "same call (its arguments changed, or the request expired). Decide the newer "
            "one. " + listing
        )
    if row["decision"] is not None:
        return (
            f"{what} was already {row['decision']} by {row['actor']} at "
            f"{_stamp(row['decided_at'])}; a request is decided once. " + listing
        )
    if row["expires_at"] is not None and row["expires_at"] <= now:
        return (
            f"{what} expired at {_stamp(row['expires_at'])} with its run's deadline and can no "
            f"longer be decided. kx.restart({row['run_id']!r}) starts a new run from its "
            "snapshot, which asks again."
        )
    return f"{what} cannot be decided now. " + listing


class ApprovalsMixin(EffectsMixin, RunsMixin):
    # -- approval requests ------------------------------------------------------------
    def request_approval(self, row: dict[str, Any]) -> dict[str, Any]:
        """Record a request to approve one call (``row``: key, run_id, step, step_ordinal,
        call_ordinal, tool, args_hash, args, expires_at). Requests of the same key that
        were not consumed are superseded in the same transaction. Returns the new row."""
        new: dict[str, Any] = {name: None for name in _APPROVAL_NAMES}
        new.update({name: row[name] for name in _APPROVAL_NAMES if name in row})
        new["id"] = uuid.uuid4()

        def job(tx: Tx) -> dict[str, Any]:
            now = self.now()
            new["requested_at"] = now
            replaced = tx.fetchall(
                f"UPDATE approvals SET superseded_at = ? WHERE key = ? AND {_LIVE} RETURNING id",
                (now, new["key"]),
            )
            tx.execute(
                "INSERT INTO approvals (id, key, run_id, step, step_ordinal, call_ordinal, tool,"
                " args_hash, args, requested_at, expires_at) VALUES"
                " (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                tuple(
                    new[name]
                    for name in (
                        "id",
                        "key",
                        "run_id",
                        "step",
                        "step_ordinal",
                        "call_ordinal",
                        "tool",
                        "args_hash",
                        "args",
                        "requested_at",
                        "expires_at",
                    )
                ),
            )
            detail: dict[str, Any] = {"id": str(new["id"]), "key": str(new["key"])}
            detail.update(tool=new["tool"], step=new["step"], args_hash=new["args_hash"])
            if replaced:
                detail["replaces"] = [str(r[0]) for r in replaced]
            self.event(tx, new["run_id"], "approval_requested", source="ledger", detail=detail)
            return dict(new)

        return self.write(job)

    def current_approval(self, key: uuid.UUID) -> dict[str, Any] | None:
        """The request of effect ``key`` that is neither consumed nor superseded (at most one)."""
        rows = self.read_dicts(
            f"SELECT {APPROVAL_COLUMNS} FROM approvals WHERE key = ? AND {_LIVE}"
            " ORDER BY requested_at DESC LIMIT 1",
            (key,),
        )
        return rows[0] if rows else None

    def approval_rows(
        self, *, run_id: str | None = None, key: uuid.UUID | None = None
    ) -> list[dict[str, Any]]:
        """Every request (decided, consumed and superseded ones too), oldest first."""
        where, params = _filters(("run_id", run_id), ("key", key))
        return self.read_dicts(
            f"SELECT {APPROVAL_COLUMNS} FROM approvals{where} ORDER BY requested_at, id", params
        )

    def open_approvals(self, run_id: str | None, now: dt.datetime) -> list[dict[str, Any]]:
        """Requests waiting for a decision, not expired, of runs that can still go on."""
        cols = ", ".join(f"a.{name}" for name in _APPROVAL_NAMES)
        ended, terminal = in_list(TERMINAL)
        sql = (
            f"SELECT {cols} FROM approvals a JOIN runs r ON r.id = a.run_id"
            " WHERE a.decision IS NULL AND a.consumed_at IS NULL AND a.superseded_at IS NULL"
            " AND (a.expires_at IS NULL OR a.expires_at > ?)"
            f" AND r.status NOT IN {ended}"
        )
        params: list[Any] = [now, *terminal]
        if run_id is not None:
            sql += " AND a.run_id = ?"
            params.append(run_id)
        return self.read_dicts(sql + " ORDER BY a.requested_at, a.id", params)

    def decide_approval(
        self,
        ident: uuid.UUID,
        decision: str,
        *,
        who: str,
        note: str | None,
        source: str = "api",
    ) -> dict[str, Any]:
        """Approve or reject request ``ident`` (its id, or the key of the effect call:
        then its current request). Exactly one decision wins; any other attempt (a second
        decision, a consumed, superseded or expired request, an unknown id) raises
        ``LedgerError`` saying why. Returns the decided row."""
        if decision not in (APPROVED, REJECTED):
            raise ValueError(f"decision must be {APPROVED!r} or {REJECTED!r}, not {decision!r}")

        def job(tx: Tx) -> dict[str, Any]:
            now = self.now()
            row = _approval_tx(tx, "id = ?", ident)
            if row is None:  # an effect key: only while it has had a single request
                row = _approval_tx(tx, "key = ? AND superseded_at IS NULL", ident)
                if row is not None:
                    ids = [
                        r[0]
                        for r in tx.fetchall(
                            "SELECT id FROM approvals WHERE key = ? ORDER BY requested_at, id",
                            (ident,),
                        )
                    ]
                    if len(ids) > 1:
                        raise LedgerError(several_requests(row, ids))
            if row is None:
                raise LedgerError(
                    f"No approval request with id or effect key {ident} in the store at "
                    f"{self.location}. List the open ones with kx.approvals() (or "
                    "`kernelext approvals`)."
                )
            won = tx.fetchone(
                "UPDATE approvals SET decision = ?, decided_at = ?, actor = ?, note = ?"
                f" WHERE id = ? AND decision IS NULL AND {_LIVE} AND {_NOT_EXPIRED}"
                " RETURNING id",
                (decision, now, who, note, row["id"], now),
            )
            if won is None:  # decided meanwhile (another process), consumed, expired, ...
                fresh = _approval_tx(tx, "id = ?", row["id"]) or row
                raise LedgerError(refusal(fresh, now))
            row.update(decision=decision, decided_at=now, actor=who, note=note)
            self.event(
                tx,
                row["run_id"],
                "approval_decided",
                source=source,
                who=who,
                reason=note,
                detail={
                    "id": str(row["id"]),
                    "key": str(row["key"]),
                    "tool": row["tool"],
                    "decision": decision,
                    "args_hash": row["args_hash"],
                },
            )
            return row

        return self.write(job)

    def _consume_tx(self, tx: Tx, approval_id: uuid.UUID, run_id: str) -> bool:
        now = self.now()
        used = tx.fetchone(
            "UPDATE approvals SET consumed_at = ? WHERE id = ? AND decision = ?"
            f" AND {_LIVE} AND {_NOT_EXPIRED} RETURNING key, tool",
            (now, approval_id, APPROVED, now),
        )
        if used is None:
            return False
        self.event(
            tx,
            run_id,
            "approval_consumed",
            source="ledger",
            detail={"id": str(approval_id), "key": str(used[0]), "tool": used[1]},
        )
        return True

    def consume_approval(self, approval_id: uuid.UUID, run_id: str) -> bool:
        """Use an approved request (committed at once); False if it cannot be used (any
        more): not approved, used, superseded or expired. Before a call decided
        ``not_applied`` (or failed, with retry) is made again under its key."""
        return self.write(lambda tx: self._consume_tx(tx, approval_id, run_id))

    def write_intent_consuming_approval(
        self, row: dict[str, Any], approval_id: uuid.UUID
    ) -> tuple[bool, dict[str, Any] | None]:
        """Consume approval ``approval_id`` and record the intent of the call it allows.

        Returns ``(consumed, existing)``: ``existing`` is the ledger row when the call has
        an intent already (nothing is consumed then); ``consumed`` is False when the
        approval can no longer be used (expired, superseded, used), and then no intent is
        written. On a backend without a journal both happen in one transaction. With a
        journal (DuckDB) the consumption commits first, then the intent is appended and
        fsynced: a crash between the two leaves a used approval and no intent, so the call
        was not made and its next attempt asks for approval again (never a second call).
        """
        key = row["key"]
        if self.hot_path is not None:
            known = self._journaled_intents.get(key)
            if known is not None:
                return False, dict(known)

            def consume(tx: Tx) -> tuple[bool, dict[str, Any] | None]:
                existing = _intent_tx(tx, key, "")
                if existing is not None:
                    return False, existing
                return self._consume_tx(tx, approval_id, row["run_id"]), None

            consumed, existing = self.write(consume)
            if existing is not None or not consumed:
                return False, existing
            return True, self.write_intent(row)

        data = {name: row[name] for name in _INTENT_FIELDS}
        epoch = self.held_epoch(row["run_id"])
        self._intent_runs[key] = row["run_id"]

        def job(tx: Tx) -> tuple[bool, dict[str, Any] | None]:
            if epoch is not None:
                check_epoch_tx(
                    tx, row["run_id"], epoch, lock=self.backend.for_share, what="effect intent"
                )
            existing = _intent_tx(tx, key, self.for_update)
            if existing is not None:
                return False, existing
            if not self._consume_tx(tx, approval_id, row["run_id"]):
                return False, None
            data["at"] = self.now()
            if not insert_intent(tx, data):  # written meanwhile: nothing is consumed
                tx.execute("UPDATE approvals SET consumed_at = NULL WHERE id = ?", (approval_id,))
                return False, _intent_tx(tx, key, self.for_update)
            return True, None

        return self.write(job)

    # -- questions (run.ask) ------------------------------------------------------------
    def ask_input(self, row: dict[str, Any]) -> None:
        """Record a question (or ask an unanswered one again, with a new deadline)."""
        names = (
            "key",
            "run_id",
            "step",
            "step_ordinal",
            "call_ordinal",
            "prompt",
            "answer_schema",
            "default_answer",
            "asked_at",
            "expires_at",
        )

        def job(tx: Tx) -> None:
            values = {**row, "asked_at": self.now()}
            tx.execute(
                f"INSERT INTO inputs ({', '.join(names)}) VALUES"
                f" ({', '.join('?' for _ in names)}) ON CONFLICT (key) DO UPDATE SET"
                " prompt = excluded.prompt, answer_schema = excluded.answer_schema,"
                " default_answer = excluded.default_answer, asked_at = excluded.asked_at,"
                " expires_at = excluded.expires_at",
                tuple(values.get(name) for name in names),
            )
            self.event(
                tx,
                row["run_id"],
                "input_requested",
                source="agent",
                detail={"key": str(row["key"]), "step": row["step"], "prompt": row["prompt"]},
            )

        self.write(job)

    def input_row(self, key: uuid.UUID) -> dict[str, Any] | None:
        rows = self.read_dicts(f"SELECT {INPUT_COLUMNS} FROM inputs WHERE key = ?", (key,))
        return rows[0] if rows else None

    def input_rows(self, run_id: str | None = None) -> list[dict[str, Any]]:
        """Every question (answered ones too), oldest first."""
        where, params = _filters(("run_id", run_id))
        return self.read_dicts(
            f"SELECT {INPUT_COLUMNS} FROM inputs{where} ORDER BY asked_at, key", params
        )

    def open_inputs(self, run_id: str | None, now: dt.datetime) -> list[dict[str, Any]]:
        """Questions waiting for an answer, not expired, of runs that can still go on."""
        cols = ", ".join(f"i.{name}" for name in _INPUT_NAMES)
        ended, terminal = in_list(TERMINAL)
        sql = (
            f"SELECT {cols} FROM inputs i JOIN runs r ON r.id = i.run_id"
            " WHERE i.answered_at IS NULL AND (i.expires_at IS NULL OR i.expires_at > ?)"
            f" AND r.status NOT IN {ended}"
        )
        params: list[Any] = [now, *terminal]
        if run_id is not None:
            sql += " AND i.run_id = ?"
            params.append(run_id)
        return self.read_dicts(sql + " ORDER BY i.asked_at, i.key", params)

    def answer_input(
        self, key: uuid.UUID, answer: str, *, who: str, note: str | None, source: str = "api"
    ) -> dict[str, Any]:
        """Store the answer (JSON) to question ``key``: once; an answered, expired or unknown
        question raises ``RunStateError`` saying why. Returns the answered row."""

        def job(tx: Tx) -> dict[str, Any]:
            now = self.now()
            found = tx.fetchone(f"SELECT {INPUT_COLUMNS} FROM inputs WHERE key = ?", (key,))
            if found is None:
                raise RunStateError(
                    f"No question with key {key} in the store at {self.location}. List the "
                    "open ones with kx.questions() (or `kernelext approvals`)."
                )
            row = dict(zip(_INPUT_NAMES, found, strict=True))
            won = tx.fetchone(
                "UPDATE inputs SET answer = ?, answered_at = ?, actor = ?, note = ?"
                f" WHERE key = ? AND answered_at IS NULL AND {_NOT_EXPIRED} RETURNING key",
                (answer, now, who, note, key, now),
            )
            if won is None:
                again = tx.fetchone(f"SELECT {INPUT_COLUMNS} FROM inputs WHERE key = ?", (key,))
                latest = dict(zip(_INPUT_NAMES, again or found, strict=True))
                raise RunStateError(_answer_refusal(latest))
            row.update(answer=answer, answered_at=now, actor=who, note=note)
            self.event(
                tx,
                row["run_id"],
                "input_answered",
                source=source,
                who=who,
                reason=note,
                detail={"key": str(key), "step": row["step"]},
            )
            return row

        return self.write(job)


def _answer_refusal(row: dict[str, Any]) -> str:
    what = f"The question {row['prompt']!r} of run {row['run_id']!r}"
    if row["answered_at"] is not None:
        return (
            f"{what} was already answered by {row['actor']} at {_stamp(row['answered_at'])}; "
            "its answer is kept and replayed on resume."
        )
    return (
        f"{what} expired at {_stamp(row['expires_at'])} with its run's deadline and can no "
        f"longer be answered. kx.restart({row['run_id']!r}) starts a new run from its "
        "snapshot, which asks again."
    )


def _approval_tx(tx: Tx, where: str, value: Any) -> dict[str, Any] | None:
    found = tx.fetchone(
        f"SELECT {APPROVAL_COLUMNS} FROM approvals WHERE {where}"
        " ORDER BY requested_at DESC LIMIT 1",
        (value,),
    )
    return dict(zip(_APPROVAL_NAMES, found, strict=True)) if found else None


def _intent_tx(tx: Tx, key: uuid.UUID, lock: str) -> dict[str, Any] | None:
    found = tx.fetchone(
        f"SELECT status, args_hash, result, error FROM effects WHERE key = ?{lock}", (key,)
    )
    names = ("status", "args_hash", "result", "error")
    return dict(zip(names, found, strict=True)) if found else None


def _filters(*pairs: tuple[str, Any]) -> tuple[str, list[Any]]:
    used = [(name, value) for name, value in pairs if value is not None]
    if not used:
        return "", []
    return " WHERE " + " AND ".join(f"{name} = ?" for name, _ in used), [v for _, v in used]
