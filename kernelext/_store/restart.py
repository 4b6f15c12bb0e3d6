"""Restart: copying what a new run carries over from an old one, in one transaction.

The kept snapshots, completed steps, every applied effect (already keyed for the new
run by the core; the transaction re-checks that the old run's ledger did not change
since) and facts of the old run are copied into a new run in status
``suspended``; payload side files are hard-linked (copied when linking fails), so
the old run's retention removal never touches the new run's payloads. The claims the
old run held are taken again. A ``suspended`` or ``needs_decision`` old run is
superseded: cancelled, with its claims released, in the same transaction. A run that
has a child (``parent_id``) was superseded: the transaction refuses to restart it again
(under the old run's row lock, so of two racing restarts one wins), and the take-over
refuses to resume it (``superseded_error``, one wording for both).

Payload files: the new id is checked free before any file is made; a file is created
exclusively (never overwritten), an existing identical one (a racing restart's, or a
leftover) is used as it is, and only files this restart created are removed when it
fails.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import shutil
import uuid
from dataclasses import dataclass, field
from typing import Any

from ..errors import RunStateError, StoreError
from ..status import FINAL, WAITING, EffectStatus, Reason, Status, StepStatus
from .base import in_list
from .claims import ClaimsMixin
from .duckdb.side_files import blob_folder
from .duckdb.store_files import open_store_file, store_file_reader
from .expiry import ExpiryMixin
from .restart_payloads import needed_blobs, new_blob_id, same_payload
from .runs import RunsMixin
from .steps import StepsMixin
from .writer import Tx

__all__ = [
    "ENDED",
    "RESTART_REASON",
    "SUPERSEDABLE",
    "RestartMixin",
    "RestartPlan",
    "superseded_error",
]

ENDED = FINAL  # restart forks from these as they are
SUPERSEDABLE = WAITING  # restart cancels these first
SUPERSEDED = StepStatus.SUPERSEDED.value  # the event kind: a restart replaced the run
RESTART_REASON = Reason.RESTART  # a new run made by a restart, until it is resumed


@dataclass
class RestartPlan:
    """Everything the core decided about a restart; written in one transaction."""

    old_id: str
    new_id: str
    start_ordinal: int
    steps: list[dict[str, Any]]  # carried completed step rows of the old run
    effects: list[dict[str, Any]]  # ledger rows, already keyed for the new run
    facts: list[dict[str, Any]]  # fact rows of the old run to carry
    deadline: dt.datetime  # of the new run while it waits to be resumed
    source: str = "api"
    who: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)
    questions: list[dict[str, Any]] = field(default_factory=list)  # answered, keyed for the new run


class RestartMixin(ExpiryMixin, ClaimsMixin, StepsMixin, RunsMixin):
    # -- restart -------------------------------------------------------------------

    def restart_steps(self, run_id: str) -> list[dict[str, Any]]:
        """Completed steps of a run with their snapshot (manifest, removed_at), by ordinal."""
        return self.read_dicts(
            "SELECT t.ordinal, t.key, t.name, t.started_at, t.ended_at, t.duration_s, t.forced,"
            " t.snapshot_id, t.result, s.manifest, s.bytes, s.created_at AS snapshot_at,"
            " s.removed_at"
            " FROM steps t LEFT JOIN snapshots s ON s.id = t.snapshot_id"
            " WHERE t.run_id = ? AND t.status = ? ORDER BY t.ordinal",
            (run_id, StepStatus.COMPLETED),
        )

    def fact_rows(self, run_id: str) -> list[dict[str, Any]]:
        """Every column of the run's facts, those outside steps first, then by step and time."""
        return self.read_dicts(
            "SELECT * FROM facts WHERE run_id = ?"
            " ORDER BY step_ordinal NULLS FIRST, recorded_at, name",
            (run_id,),
        )

    def write_restart(self, plan: RestartPlan) -> None:
        """Create the new run (status ``suspended``) with everything carried over."""
        chain = self.blob_chain_ids(plan.old_id)
        needed = needed_blobs(plan.steps, chain)
        mapping = {bid: new_blob_id(plan.new_id, bid) for bid in needed}
        bases = {bid: (mapping[b] if (b := chain.get(bid)) is not None else None) for bid in needed}
        locations = self._blob_locations(plan.old_id, needed)
        copied_files: list[str] = []
        try:
            new_locations = {
                bid: self._copy_payload_file(plan.new_id, mapping[bid], loc, copied_files)
                for bid, loc in locations.items()
            }
            self.write(lambda tx: self._restart_tx(tx, plan, mapping, bases, new_locations))
        except BaseException:
            for path in copied_files:
                with contextlib.suppress(OSError):
                    os.remove(path)
            raise

    def _restart_tx(
        self,
        tx: Tx,
        plan: RestartPlan,
        mapping: dict[uuid.UUID, uuid.UUID],
        bases: dict[uuid.UUID, uuid.UUID | None],
        locations: dict[uuid.UUID, str],
    ) -> None:
        old = tx.fetchone(
            "SELECT status, agent, fingerprint, max_step_seconds, args, total_steps, owner,"
            f" key_scheme FROM runs WHERE id = ?{self.for_update}",
            (plan.old_id,),
        )
        if old is None:
            raise RunStateError(f"No run {plan.old_id!r} in the store at {self.location}.")
        # Decided here, under the old run's row lock: of two racing restarts one wins.
        superseded_error(plan.old_id, self.children_tx(tx, plan.old_id), "restart")
        if tx.fetchone("SELECT 1 FROM runs WHERE id = ?", (plan.new_id,)):
            raise RunStateError(
                f"A run {plan.new_id!r} already exists; pass another new_run_id to kx.restart."
            )
        status = str(old[0])
        if status in SUPERSEDABLE:
            self.transition_tx(
                tx,
                plan.old_id,
                Status.CANCELLED,
                SUPERSEDABLE,
                kind=SUPERSEDED,
                source=plan.source,
                who=plan.who,
                reason=f"superseded by restart {plan.new_id}",
            )
            self.release_run_claims_tx(tx, plan.old_id, SUPERSEDED, source=plan.source)
        elif status not in ENDED:
            raise RunStateError(
                f"Run {plan.old_id!r} became {status} while the restart was prepared; "
                "try again once it has stopped."
            )
        self._check_ledger_tx(tx, plan)
        self._check_snapshots_tx(tx, plan)
        now = self.now()
        tx.execute(
            "INSERT INTO runs (id, agent, status, reason, created_at, updated_at, deadline,"
            " parent_id, fingerprint, max_step_seconds, args, owner, total_steps,"
            " completed_steps, key_scheme) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                plan.new_id,
                old[1],
                Status.SUSPENDED,
                RESTART_REASON,
                now,
                now,
                plan.deadline,
                plan.old_id,
                old[2],
                old[3],
                old[4],
                plan.who or old[6],
                old[5],
                len(plan.steps),
                # The parent's scheme: the carried effects' argument hashes were made with
                # it from arguments that are not stored, so the new run must hash the same.
                old[7] or 1,
            ),
        )
        tx.executemany(
            "INSERT INTO blobs (id, run_id, encoding, sha256, size, location, base_id, data,"
            " created_at) SELECT ?, ?, encoding, sha256, size, ?, ?, data, created_at"
            " FROM blobs WHERE id = ?",
            [(mapping[bid], plan.new_id, locations[bid], bases[bid], bid) for bid in mapping],
        )
        self._copy_steps_tx(tx, plan, mapping)
        self._copy_rows_tx(tx, "effects", plan.new_id, plan.effects)
        self._copy_rows_tx(tx, "facts", plan.new_id, plan.facts)
        self._copy_rows_tx(tx, "questions", plan.new_id, plan.questions)
        for resource, amount in self.last_claims_tx(tx, plan.old_id):
            self.claim_tx(tx, plan.new_id, resource, amount, source="restart")
        self._restart_events_tx(tx, plan)

    @staticmethod
    def _check_snapshots_tx(tx: Tx, plan: RestartPlan) -> None:
        """The snapshots the new run starts from are still kept (retention did not remove
        them while the restart was prepared)."""
        snapshot_ids = [s["snapshot_id"] for s in plan.steps if s["snapshot_id"] is not None]
        if snapshot_ids:
            marks = ", ".join("?" for _ in snapshot_ids)
            kept = tx.fetchone(
                f"SELECT count(*) FROM snapshots WHERE id IN ({marks}) AND removed_at IS NULL",
                snapshot_ids,
            )
            if kept is None or int(kept[0]) != len(snapshot_ids):
                raise StoreError(
                    f"The snapshots of run {plan.old_id!r} were removed (retention period "
                    "ended) while the restart was prepared; it cannot be restarted."
                )

    def _restart_events_tx(self, tx: Tx, plan: RestartPlan) -> None:
        """The new run's ``created`` event and the old run's ``restarted`` one."""
        detail = {
            **plan.detail,
            "parent": plan.old_id,
            "from_step": plan.start_ordinal,
            "carried_steps": len(plan.steps),
            "carried_effects": len(plan.effects),
            "carried_answers": len(plan.questions),
        }
        self.event(
            tx,
            plan.new_id,
            "created",
            to_status=Status.SUSPENDED,
            source=plan.source,
            who=plan.who,
            reason=RESTART_REASON,
            detail=detail,
        )
        self.event(
            tx,
            plan.old_id,
            "restarted",
            source=plan.source,
            who=plan.who,
            reason=f"restarted as {plan.new_id}",
            detail={"new_run": plan.new_id, "from_step": plan.start_ordinal},
        )

    @staticmethod
    def _check_ledger_tx(tx: Tx, plan: RestartPlan) -> None:
        """The old run's ledger is still the one the core read: every applied effect is
        carried and none has an open outcome (a resume in between would show here)."""
        marks, statuses = in_list(
            (EffectStatus.APPLIED, EffectStatus.UNKNOWN, EffectStatus.PENDING)
        )
        rows = tx.fetchall(
            f"SELECT status, count(*) FROM effects WHERE run_id = ? AND status IN {marks}"
            " GROUP BY status",
            (plan.old_id, *statuses),
        )
        found = {str(status): int(n) for status, n in rows}
        applied = found.pop(EffectStatus.APPLIED, 0)
        carried = sum(1 for e in plan.effects if e["status"] == EffectStatus.APPLIED)
        if applied != carried or found:
            raise RunStateError(
                f"The ledger of run {plan.old_id!r} changed while the restart was prepared "
                f"({applied} applied, {found or 'none'} open, {carried} carried); "
                "try again."
            )

    def _copy_steps_tx(
        self, tx: Tx, plan: RestartPlan, mapping: dict[uuid.UUID, uuid.UUID]
    ) -> None:
        step_rows: list[tuple[Any, ...]] = []
        snap_rows: list[tuple[Any, ...]] = []
        for step in plan.steps:
            snapshot_id = None
            if step["snapshot_id"] is not None:
                snapshot_id = uuid.uuid4()
                manifest = {
                    key: mapping[uuid.UUID(hex=h)].hex
                    for key, h in json.loads(step["manifest"]).items()
                }
                snap_rows.append(
                    (
                        snapshot_id,
                        plan.new_id,
                        step["ordinal"],
                        step["snapshot_at"],
                        json.dumps(manifest, sort_keys=True),
                        step["bytes"] or 0,
                    )
                )
            step_rows.append(
                (
                    uuid.uuid4(),
                    plan.new_id,
                    step["ordinal"],
                    step["key"],
                    step["name"],
                    StepStatus.COMPLETED,
                    step["started_at"],
                    step["ended_at"],
                    step["duration_s"],
                    snapshot_id,
                    bool(step["forced"]),
                    step.get("result"),  # a run.map item's stored value: replayed, not run
                )
            )
        tx.executemany(
            "INSERT INTO snapshots (id, run_id, step_ordinal, created_at, manifest, bytes)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            snap_rows,
        )
        tx.executemany(
            "INSERT INTO steps (id, run_id, ordinal, key, name, status, started_at, ended_at,"
            " duration_s, snapshot_id, forced, result)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            step_rows,
        )

    @staticmethod
    def _copy_rows_tx(tx: Tx, table: str, new_id: str, rows: list[dict[str, Any]]) -> None:
        """Insert rows read with ``SELECT *`` (column names come from the database)."""
        if not rows:
            return
        columns = list(rows[0])
        marks = ", ".join("?" for _ in columns)
        tx.executemany(
            f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})",
            [tuple(new_id if c == "run_id" else row[c] for c in columns) for row in rows],
        )

    def chain_root(self, run_id: str) -> str:
        """The first run of ``run_id``'s restart chain (follows ``parent_id``)."""
        current, seen = run_id, {run_id}
        while True:
            rows = self.read("SELECT parent_id FROM runs WHERE id = ?", (current,))
            parent = rows[0][0] if rows else None
            if parent is None or str(parent) in seen:
                return current
            current = str(parent)
            seen.add(current)

    def children_tx(self, tx: Tx, run_id: str) -> list[str]:
        """The runs a restart made of ``run_id`` (oldest first), read in ``tx``."""
        rows = tx.fetchall(
            "SELECT id FROM runs WHERE parent_id = ? ORDER BY created_at, id", (run_id,)
        )
        return [str(r[0]) for r in rows]

    def _blob_locations(self, run_id: str, ids: set[uuid.UUID]) -> dict[uuid.UUID, str]:
        if not ids:
            return {}
        rows = self.read("SELECT id, location FROM blobs WHERE run_id = ?", (run_id,))
        found = {r[0]: str(r[1]) for r in rows if r[0] in ids}
        missing = ids - set(found)
        if missing:
            raise StoreError(
                f"{len(missing)} snapshot payload(s) of run {run_id!r} are missing (removed "
                "after the retention period?); it cannot be restarted from this point."
            )
        return found

    def _copy_payload_file(
        self, new_id: str, new_blob: uuid.UUID, location: str, copied: list[str]
    ) -> str:
        """Link (or copy) an old run's side file into the new run's folder; the new
        location is relative to the blob folder, like every one kernelext writes."""
        if not location.startswith("file:"):
            return location
        source = self.payload_path(location)  # relative, absolute, or of a moved folder
        folder = self.blob_dir(new_id)
        blob_folder(folder)  # the blob folder too, if it is new: 0700, never a link
        target = os.path.join(folder, new_blob.hex)
        taken = RunStateError(
            f"The payload file {target} for run {new_id!r} already exists with other "
            "content; it was left as it is. Pass another new_run_id to kx.restart."
        )
        try:
            os.link(source, target)  # payload files are immutable: share them
        except FileExistsError:
            if not same_payload(source, target):
                raise taken from None  # never overwritten, never removed: not ours
            return self.side_file_location(new_id, new_blob)  # identical: used, not ours
        except FileNotFoundError:
            raise StoreError(
                f"Snapshot payload file {source} is gone (removed after the retention "
                "period?); the run cannot be restarted from this point."
            ) from None
        except OSError:
            try:  # created exclusively: an existing file is never overwritten
                fd = open_store_file(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
            except FileExistsError:
                if not same_payload(source, target):
                    raise taken from None
                return self.side_file_location(new_id, new_blob)
            copied.append(target)  # ours from here on: removed if the restart fails
            with os.fdopen(fd, "wb") as out, store_file_reader(source) as src:
                shutil.copyfileobj(src, out)
                out.flush()
                os.fsync(out.fileno())
            return self.side_file_location(new_id, new_blob)
        copied.append(target)
        return self.side_file_location(new_id, new_blob)


def superseded_error(run_id: str, children: list[str], verb: str) -> None:
    """Refuse to restart or resume a run that a restart superseded (one door for both:
    ``kx.restart`` here and in its transaction, the take-over of every resume)."""
    if not children:
        return
    child = children[-1]
    also = f" (restarts: {', '.join(children)})" if len(children) > 1 else ""
    raise RunStateError(
        f"Run {run_id!r} was restarted as {child!r}{also}; it is superseded and cannot be "
        f"{'restarted' if verb == 'restart' else 'resumed'} again (its applied effects live "
        f"on in {child!r}). Continue the new run: kx.resume({child!r}) if it is suspended or "
        f"stopped, or kx.restart({child!r}) to fork it in turn."
    )
