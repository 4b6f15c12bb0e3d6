"""Restart: copying what a new run carries over from an old one, in one transaction.

The kept snapshots, completed steps, every applied effect (already keyed for the new
run by the core; the transaction re-checks that the old run's ledger did not change
since) and facts of the old run are copied into a new run in status
``suspended``; payload side files are hard-linked (copied when linking fails), so
the old run's retention removal never touches the new run's payloads. The claims the
old run held are taken again. A ``suspended`` or ``needs_decision`` old run is
superseded: cancelled, with its claims released, in the same transaction.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
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
from .duckdb.side_files import private_dirs
from .expiry import ExpiryMixin
from .runs import RunsMixin
from .steps import StepsMixin
from .writer import Tx

__all__ = ["ENDED", "RESTART_REASON", "SUPERSEDABLE", "RestartMixin", "RestartPlan"]

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


class RestartMixin(ExpiryMixin, ClaimsMixin, StepsMixin, RunsMixin):
    # -- restart -------------------------------------------------------------------

    def restart_steps(self, run_id: str) -> list[dict[str, Any]]:
        """Completed steps of a run with their snapshot (manifest, removed_at), by ordinal."""
        return self.read_dicts(
            "SELECT t.ordinal, t.key, t.name, t.started_at, t.ended_at, t.duration_s, t.forced,"
            " t.snapshot_id, s.manifest, s.bytes, s.created_at AS snapshot_at, s.removed_at"
            " FROM steps t LEFT JOIN snapshots s ON s.id = t.snapshot_id"
            " WHERE t.run_id = ? AND t.status = ? ORDER BY t.ordinal",
            (run_id, StepStatus.COMPLETED),
        )

    def fact_rows(self, run_id: str) -> list[dict[str, Any]]:
        return self.read_dicts("SELECT * FROM facts WHERE run_id = ?", (run_id,))

    def write_restart(self, plan: RestartPlan) -> None:
        """Create the new run (status ``suspended``) with everything carried over."""
        chain = self.blob_chain_ids(plan.old_id)
        needed = _needed_blobs(plan.steps, chain)
        mapping = {bid: _new_blob_id(plan.new_id, bid) for bid in needed}
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
        for resource, amount in self.last_claims_tx(tx, plan.old_id):
            self.claim_tx(tx, plan.new_id, resource, amount, source="restart")
        detail = {
            **plan.detail,
            "parent": plan.old_id,
            "from_step": plan.start_ordinal,
            "carried_steps": len(plan.steps),
            "carried_effects": len(plan.effects),
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
        if applied != len(plan.effects) or found:
            raise RunStateError(
                f"The ledger of run {plan.old_id!r} changed while the restart was prepared "
                f"({applied} applied, {found or 'none'} open, {len(plan.effects)} carried); "
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
                )
            )
        tx.executemany(
            "INSERT INTO snapshots (id, run_id, step_ordinal, created_at, manifest, bytes)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            snap_rows,
        )
        tx.executemany(
            "INSERT INTO steps (id, run_id, ordinal, key, name, status, started_at, ended_at,"
            " duration_s, snapshot_id, forced) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
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
        private_dirs(folder)  # the blob folder too, if it is new: 0700
        target = os.path.join(folder, new_blob.hex)
        try:
            os.link(source, target)  # payload files are immutable: share them
        except FileNotFoundError:
            raise StoreError(
                f"Snapshot payload file {source} is gone (removed after the retention "
                "period?); the run cannot be restarted from this point."
            ) from None
        except OSError:
            shutil.copyfile(source, target)
            fd = os.open(target, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        copied.append(target)
        return self.side_file_location(new_id, new_blob)


def _needed_blobs(
    steps: list[dict[str, Any]], chain: dict[uuid.UUID, uuid.UUID | None]
) -> set[uuid.UUID]:
    needed: set[uuid.UUID] = set()
    for step in steps:
        if step.get("manifest") is None:
            continue
        for h in json.loads(step["manifest"]).values():
            current: uuid.UUID | None = uuid.UUID(hex=h)
            while current is not None and current not in needed:
                needed.add(current)
                current = chain.get(current)
    return needed


def _new_blob_id(new_run_id: str, old_blob: uuid.UUID) -> uuid.UUID:
    digest = hashlib.sha256(b"restart\0" + new_run_id.encode() + b"\0" + old_blob.bytes)
    return uuid.UUID(bytes=digest.digest()[:16])
