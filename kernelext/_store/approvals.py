"""Approval requests for effect calls: all their SQL.

An approval row is bound to one call: the effect's key and its argument hash. It is
decided once (a conditional ``UPDATE … WHERE decision IS NULL``, so of two racing
deciders exactly one wins) and consumed once, just before the intent of the call it
allows is recorded. A newer request for the same key supersedes the older ones that were
not consumed. A decision that cannot be made comes back as a :class:`Decision` saying
why (``kernelext._core.people.approvals`` words it for a person). Questions: ``questions.py``.
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any, NamedTuple

from ..status import TERMINAL
from .base import equal_filters, in_list
from .effects import EffectsMixin
from .records import check_epoch_tx, insert_intent
from .runs import RunsMixin
from .writer import Tx

__all__ = [
    "APPROVAL_COLUMNS",
    "APPROVED",
    "NOT_OPEN",
    "NO_SUCH_REQUEST",
    "REJECTED",
    "SEVERAL_REQUESTS",
    "ApprovalsMixin",
    "Decision",
]

APPROVED = "approved"
REJECTED = "rejected"
APPROVAL_COLUMNS = (
    "id, key, run_id, step, step_ordinal, call_ordinal, tool, args_hash, args, requested_at,"
    " expires_at, decided_at, decision, actor, note, consumed_at, superseded_at, edit,"
    " edited_args, edited_args_hash"
)
_APPROVAL_NAMES = tuple(name.strip() for name in APPROVAL_COLUMNS.split(","))
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


# Why a decision was not made (``Decision.refused``).
NO_SUCH_REQUEST = "no_such_request"  # no request has that id or effect key
SEVERAL_REQUESTS = "several_requests"  # an effect key with several requests: which one?
NOT_OPEN = "not_open"  # decided, consumed, superseded or expired: ``row`` says which


class Decision(NamedTuple):
    """What came of deciding a request: ``refused`` is None when the decision was made
    (``row`` is the decided request), else one of ``NO_SUCH_REQUEST``, ``SEVERAL_REQUESTS`` or
    ``NOT_OPEN``, with the request as it stands and (several requests) every id of its key."""

    row: dict[str, Any] | None
    refused: str | None = None
    ids: tuple[Any, ...] = ()


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

    def approval(self, ident: uuid.UUID) -> dict[str, Any] | None:
        """Request ``ident`` (its id, or the newest request of an effect key)."""
        rows = self.read_dicts(
            f"SELECT {APPROVAL_COLUMNS} FROM approvals WHERE id = ? OR key = ?"
            " ORDER BY id = ? DESC, requested_at DESC LIMIT 1",
            (ident, ident, ident),
        )
        return rows[0] if rows else None

    def previous_approval(self, tool: str, before: dt.datetime) -> dict[str, Any] | None:
        """The newest approved request of ``tool`` requested before ``before`` (any run)."""
        rows = self.read_dicts(
            f"SELECT {APPROVAL_COLUMNS} FROM approvals WHERE tool = ? AND decision = ?"
            " AND requested_at < ? ORDER BY requested_at DESC, id DESC LIMIT 1",
            (tool, APPROVED, before),
        )
        return rows[0] if rows else None

    def approved_edit(self, tool: str, args_hash: str, edited_hash: str) -> bool:
        """Whether a person approved call ``args_hash`` of ``tool`` with edits, and the call
        made was ``edited_hash`` (in any run: a restart carries the call it became)."""
        found = self.read_dicts(
            "SELECT id FROM approvals WHERE tool = ? AND args_hash = ? AND edited_args_hash = ?"
            " LIMIT 1",
            (tool, args_hash, edited_hash),
        )
        return bool(found)

    def approval_rows(
        self, *, run_id: str | None = None, key: uuid.UUID | None = None
    ) -> list[dict[str, Any]]:
        """Every request (decided, consumed and superseded ones too), oldest first."""
        where, params = equal_filters(("run_id", run_id), ("key", key))
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
        detail: dict[str, Any] | None = None,
        edit: dict[str, Any] | None = None,
    ) -> Decision:
        """Approve or reject request ``ident`` (its id, or the key of the effect call:
        then its current request, while that key has had one request). Exactly one
        decision wins; any other attempt (a second decision, a consumed, superseded or
        expired request, an unknown id) changes nothing and is refused in the result.
        ``detail``: more for the decision's event (an approval of data nobody saw, an edit);
        ``edit``: the columns of an approval with edits (``edit``, ``edited_args``)."""
        if decision not in (APPROVED, REJECTED):
            raise ValueError(f"decision must be {APPROVED!r} or {REJECTED!r}, not {decision!r}")

        def job(tx: Tx) -> Decision:
            now = self.now()
            row = _approval_tx(tx, "id = ?", ident)
            if row is None:  # an effect key: only while it has had a single request
                row = _approval_tx(tx, "key = ? AND superseded_at IS NULL", ident)
                if row is not None:
                    ids = tuple(
                        r[0]
                        for r in tx.fetchall(
                            "SELECT id FROM approvals WHERE key = ? ORDER BY requested_at, id",
                            (ident,),
                        )
                    )
                    if len(ids) > 1:
                        return Decision(row, SEVERAL_REQUESTS, ids)
            if row is None:
                return Decision(None, NO_SUCH_REQUEST)
            edited = edit or {"edit": None, "edited_args": None}
            won = tx.fetchone(
                "UPDATE approvals SET decision = ?, decided_at = ?, actor = ?, note = ?,"
                " edit = ?, edited_args = ?"
                f" WHERE id = ? AND decision IS NULL AND {_LIVE} AND {_NOT_EXPIRED}"
                " RETURNING id",
                (decision, now, who, note, edited["edit"], edited["edited_args"], row["id"], now),
            )
            if won is None:  # decided meanwhile (another process), consumed, expired, ...
                return Decision(_approval_tx(tx, "id = ?", row["id"]) or row, NOT_OPEN)
            row.update(decision=decision, decided_at=now, actor=who, note=note, **edited)
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
                    **(detail or {}),
                },
            )
            return Decision(row)

        return self.write(job)

    def _consume_tx(
        self, tx: Tx, approval_id: uuid.UUID, run_id: str, args_hash: str | None = None
    ) -> bool:
        """Use the approval (``args_hash``: the call's, recorded when it was edited)."""
        now = self.now()
        used = tx.fetchone(
            "UPDATE approvals SET consumed_at = ?,"
            " edited_args_hash = CASE WHEN edit IS NULL THEN NULL ELSE ? END"
            f" WHERE id = ? AND decision = ? AND {_LIVE} AND {_NOT_EXPIRED} RETURNING key, tool",
            (now, args_hash, approval_id, APPROVED, now),
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
                return self._consume_tx(tx, approval_id, row["run_id"], row["args_hash"]), None

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
            if not self._consume_tx(tx, approval_id, row["run_id"], row["args_hash"]):
                return False, None
            data["at"] = self.now()
            if not insert_intent(tx, data):  # written meanwhile: nothing is consumed
                tx.execute("UPDATE approvals SET consumed_at = NULL WHERE id = ?", (approval_id,))
                return False, _intent_tx(tx, key, self.for_update)
            return True, None

        return self.write(job)


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
