"""Run rows and their status transitions. Every transition writes one event row."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Iterable
from typing import Any, NamedTuple

from .._did_you_mean import did_you_mean
from ..errors import RunNotFound, RunStateError
from ..status import FINAL, LIVE, WAITING, Status, waiting_reason
from .base import StoreBase, actor, in_list
from .run_end import apply_run_end
from .transitions import Transition, move_tx
from .writer import Tx

__all__ = ["RunsMixin", "StepEnd", "Transition"]

RUN_COLUMNS = (
    "id, agent, status, reason, created_at, updated_at, deadline, parent_id, fingerprint, "
    "max_step_seconds, args, stop_requested_at, stop_source, owner, lease_until, total_steps, "
    "completed_steps, error, key_scheme, owner_epoch"
)


class StepEnd(NamedTuple):
    """The step a run's end leaves behind, ended with it (``RunsMixin.end_run``)."""

    id: uuid.UUID
    status: str  # cancelled or failed
    error: str | None
    forced: bool
    duration_s: float | None


# How effect keys and argument hashes of new runs are derived (see kernelext._core.encoding.keys);
# a run row with key_scheme NULL was recorded before schema 7: scheme 1.
KEY_SCHEME = 2


class RunsMixin(StoreBase):
    def create_run(
        self,
        run_id: str,
        agent: str,
        *,
        fingerprint: str | None = None,
        max_step_seconds: float | None = None,
        args: str | None = None,
        parent_id: str | None = None,
        owner: str | None = None,
        total_steps: int | None = None,
        source: str = "api",
        key_scheme: int = KEY_SCHEME,
    ) -> bool:
        """Insert a run in status ``running``. Returns False if the id is taken."""

        def job(tx: Tx) -> bool:
            now = self.now()
            # One statement: two processes creating the same id at once get one winner.
            inserted = tx.fetchone(
                "INSERT INTO runs (id, agent, status, created_at, updated_at, parent_id,"
                " fingerprint, max_step_seconds, args, owner, total_steps, completed_steps,"
                " key_scheme, owner_epoch) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0, ?, 1)"
                " ON CONFLICT (id) DO NOTHING RETURNING id",
                (
                    run_id,
                    agent,
                    Status.RUNNING.value,
                    now,
                    now,
                    parent_id,
                    fingerprint,
                    max_step_seconds,
                    args,
                    owner,
                    total_steps,
                    key_scheme,
                ),
            )
            if inserted is None:
                return False
            if self.backend.fence is not None:  # a fresh start is ownership epoch 1
                self.backend.fence.advance(run_id, 1)
            self.event(
                tx,
                run_id,
                "created",
                to_status=Status.RUNNING,
                source=source,
                detail={"parent": parent_id} if parent_id else None,
            )
            return True

        created: bool = self.write(job)
        if created and owner == actor():
            self.hold_epoch(run_id, 1)
        return created

    def advance_epoch_tx(self, tx: Tx, run_id: str) -> int:
        """A take-over: the run's ownership epoch goes up by one, in the caller's
        transaction; every write of a previous owner is refused from its commit on.

        With a journal (DuckDB) the run's fence is advanced first (``duckdb/fence.py``: no
        intent of an older epoch is appended after it), then what previous owners journaled
        for the run and may not have folded is folded here, under their epoch, before the
        take-over looks at the run's steps and effects."""
        row = tx.fetchone(f"SELECT owner_epoch FROM runs WHERE id = ?{self.for_update}", (run_id,))
        if row is None:
            raise RunNotFound(f"No run {run_id!r} in the store at {self.location}.")
        epoch = int(row[0] or 0) + 1
        fence = self.backend.fence
        if fence is not None:
            fence.advance(run_id, epoch)
        self.backend.fold_foreign_tx(tx, run_id)
        tx.execute("UPDATE runs SET owner_epoch = ? WHERE id = ?", (epoch, run_id))
        return epoch

    def get_run(self, run_id: str) -> dict[str, Any]:
        rows = self.read_dicts(f"SELECT {RUN_COLUMNS} FROM runs WHERE id = ?", (run_id,))
        if not rows:
            raise RunNotFound(
                f"No run {run_id!r} in the store at {self.location}."
                f"{did_you_mean(run_id, self.run_ids())} "
                "List runs with kx.runs() (or `kernelext runs`)."
            )
        return rows[0]

    def run_ids(self, limit: int = 10_000) -> list[str]:
        """The newest ``limit`` run ids (for suggestions when an id is mistyped)."""
        rows = self.read_dicts("SELECT id FROM runs ORDER BY created_at DESC LIMIT ?", (limit,))
        return [str(r["id"]) for r in rows]

    def find_run(self, run_id: str) -> dict[str, Any] | None:
        rows = self.read_dicts(f"SELECT {RUN_COLUMNS} FROM runs WHERE id = ?", (run_id,))
        return rows[0] if rows else None

    def list_runs(self, status: str | None = None) -> list[dict[str, Any]]:
        if status:
            return self.read_dicts(
                f"SELECT {RUN_COLUMNS} FROM runs WHERE status = ? ORDER BY created_at", (status,)
            )
        return self.read_dicts(f"SELECT {RUN_COLUMNS} FROM runs ORDER BY created_at")

    def transition_tx(
        self,
        tx: Tx,
        run_id: str,
        to_status: Status,
        allowed_from: Iterable[str],
        *,
        kind: str = "transition",
        source: str | None = None,
        reason: str | None = None,
        who: str | None = None,
        detail: dict[str, Any] | None = None,
        fields: dict[str, Any] | None = None,
        epoch: int | None = None,
    ) -> Transition:
        """Move a run to ``to_status`` if it is in one of ``allowed_from``: the one door
        every status change goes through (``transitions.move_tx``: the table is checked,
        the event written, a waiting status gets its deadline from the expiry policy).

        ``epoch``: the owner's ownership epoch; a run taken over since raises
        ``OwnershipLost`` and nothing changes."""
        return move_tx(
            tx,
            run_id,
            to_status,
            allowed_from,
            now=self.now(),
            kind=kind,
            for_update=self.for_update,
            policy=self.expiry,
            source=source,
            reason=reason,
            who=who,
            detail=detail,
            fields=fields,
            actor=actor(),
            location=self.location,
            epoch=epoch,
        )

    def transition(
        self, run_id: str, to_status: Status, allowed_from: Iterable[str], **kwargs: Any
    ) -> Transition:
        allowed = tuple(allowed_from)
        return self.write(lambda tx: self.transition_tx(tx, run_id, to_status, allowed, **kwargs))

    def end_run(
        self,
        run_id: str,
        status: Status,
        *,
        kind: str,
        source: str,
        reason: str | None = None,
        detail: dict[str, Any] | None = None,
        deadline: dt.datetime | None = None,
        step: StepEnd | None = None,
    ) -> str:
        """Record how a run live in this process ended (``run_end.py``): suspended,
        completed, failed or needs_decision, with ``step`` (the step left open) ended and,
        for a final status, the run's claims released. Returns the status it moves to.

        On DuckDB nothing here waits for the store file: the record is journaled (durable
        after one ``fdatasync``) and folded once the file is free; ``journaled_end`` gives
        the status meanwhile. On PostgreSQL it commits at once. Refused (``OwnershipLost``)
        once the run was taken over from this process.
        """
        now = self.now()
        if status in WAITING and deadline is None:
            deadline = self.expiry.deadline(waiting_reason(status, reason), now)
        detail = dict(detail or {})
        if status == Status.SUSPENDED and deadline is not None:
            detail.setdefault("deadline", deadline.isoformat())
        data: dict[str, Any] = {
            "run_id": run_id,
            "status": Status(status).value,
            "kind": str(kind),
            "source": source,
            "who": actor(),
            "reason": reason,
            "detail": json.dumps(detail, sort_keys=True, default=str) if detail else None,
            "deadline": deadline,
            "at": now,
            "claims": status in FINAL,
        }
        if step is not None:
            data.update(
                step_id=step.id,
                step_status=str(step.status),
                step_error=step.error,
                step_forced=step.forced,
                step_duration_s=step.duration_s,
            )
        if self.hot_path is None:  # no journal, and no file to wait for
            ready, _ = self.prepare_record("run_end", data)
            lock = self.for_update
            return str(self.write(lambda tx: apply_run_end(tx, ready, for_update=lock)))
        seq = self.record("run_end", data, sync=True)
        if seq is not None:
            self._journaled_ends[run_id] = (seq, data["status"])
        return str(data["status"])

    def journaled_end(self, run_id: str) -> str | None:
        """The status this process's journaled end of run ``run_id`` gives it, while that
        record is not in the tables yet; None once it is (or when there is none).

        Waits for the fold unless it cannot happen now (another process holds the store
        file, or the store refuses writes): then the status is given at once."""
        pending = self._journaled_ends.get(run_id)
        if pending is None or self.hot_path is None:
            return None
        if not self.hot_path.settle(pending[0]):
            return pending[1]
        if self._journaled_ends.get(run_id) == pending:
            del self._journaled_ends[run_id]
        return None

    def update_run(self, run_id: str, **fields: Any) -> None:
        def job(tx: Tx) -> None:
            self.update_run_tx(tx, run_id, **fields)

        self.write(job)

    def update_run_tx(self, tx: Tx, run_id: str, **fields: Any) -> None:
        if "status" in fields:
            raise RunStateError("A run's status changes only through Store.transition_tx.")
        fields.setdefault("updated_at", self.now())
        # never dated back: a move is dated after updated_at (see transitions.move_tx)
        assignments = ", ".join(
            "updated_at = greatest(updated_at, ?)" if name == "updated_at" else f"{name} = ?"
            for name in fields
        )
        tx.execute(f"UPDATE runs SET {assignments} WHERE id = ?", (*fields.values(), run_id))

    def record_event(
        self, run_id: str | None, kind: str, *, wait: bool = True, **kwargs: Any
    ) -> None:
        """Write one event; ``wait=False`` queues it. It is dated now, when it happened, not
        when its queued write runs (a run's end, journaled later, is dated after it)."""
        kwargs.setdefault("at", self.now())

        def job(tx: Tx) -> None:
            self.event(tx, run_id, kind, **kwargs)

        if wait:
            self.write(job)
        else:
            self.write_async(job)

    def renew_lease(self, run_id: str, until: dt.datetime, owner: str) -> None:
        """Queue a lease renewal for a live run (ignored once the run is no longer live)."""

        marks, live = in_list(LIVE)
        held = self.held_epoch(run_id)
        fenced = " AND owner_epoch = ?" if held is not None else ""  # never a taker's lease

        def job(tx: Tx) -> None:
            tx.execute(
                "UPDATE runs SET lease_until = ?, owner = ? WHERE id = ?"
                f" AND status IN {marks}{fenced}",
                (until, owner, run_id, *live, *((held,) if held is not None else ())),
            )

        self.write_async(job)

    def lease_tx(self, tx: Tx, run_id: str) -> dict[str, Any] | None:
        """The run's status, owner and lease, locked for the rest of the transaction.

        What other processes journaled for the run is folded first, their end of it
        included (``run_end``): a run whose owner suspended it while another process held
        the store file is seen ``suspended``, not live, though its owner's fold waits."""
        self.backend.fold_foreign_tx(tx, run_id, ends=True)
        row = tx.fetchone(
            "SELECT id, status, owner, lease_until, owner_epoch, agent FROM runs WHERE id = ?"
            f"{self.for_update}",
            (run_id,),
        )
        if row is None:
            return None
        names = ("id", "status", "owner", "lease_until", "owner_epoch", "agent")
        return dict(zip(names, row, strict=True))

    def runs_table(self, status: str | None = None) -> Any:
        """The runs as a pyarrow Table (newest last), optionally only one status."""
        where = ""
        if status is not None:
            where = " WHERE status = '" + status.replace("'", "''") + "'"
        return self.read_arrow(
            "SELECT id, agent, status, reason, completed_steps, total_steps, created_at,"
            f" updated_at, deadline, parent_id FROM runs{where} ORDER BY created_at"
        )

    def run_liveness(self, run_id: str) -> tuple[Any, ...] | None:
        """(status, owner_epoch, stop_requested_at, stop_source) of a run, one indexed read:
        what an item running in another process checks at each effect call."""
        rows = self.backend.read(
            "SELECT status, owner_epoch, stop_requested_at, stop_source FROM runs WHERE id = ?",
            (run_id,),
        )
        return tuple(rows[0]) if rows else None
