"""Step rows, snapshots and the payload blobs they point at."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple, Protocol

from ..errors import IntegrityError, OwnershipLost, StoreError
from ..status import StepStatus
from .base import StoreBase
from .integrity import (
    PayloadUse,
    damaged_message,
    digest,
    missing_message,
    outside_message,
    payload_use,
)
from .records import check_epoch_tx
from .writer import Tx

__all__ = ["Blob", "StagedPayload", "StepsMixin", "discard_staged"]


class StagedPayload(Protocol):
    """A large payload already being written to its side file (see ``stage_payload``)."""

    def commit(self, path: str) -> None: ...

    def discard(self) -> None: ...


class Blob(NamedTuple):
    id: uuid.UUID
    encoding: str
    sha256: str
    size: int
    base_id: uuid.UUID | None
    data: bytes
    staged: StagedPayload | None = None  # its side file, already being written


class StepsMixin(StoreBase):
    # -- steps -----------------------------------------------------------------
    def begin_step(
        self,
        run_id: str,
        step_id: uuid.UUID,
        ordinal: int,
        key: str,
        name: str | None,
        *,
        wait: bool = False,
    ) -> None:
        """Record that a step started (journaled, not waited for; ``wait``: durable on
        return, for an item another process completes)."""
        data = {
            "id": step_id,
            "run_id": run_id,
            "ordinal": ordinal,
            "key": key,
            "name": name,
            "started_at": self.now(),
        }
        self.record("step_begin", data, sync=wait)

    def complete_step(
        self,
        run_id: str,
        step_id: uuid.UUID,
        ordinal: int,
        duration_s: float,
        manifest: dict[str, Any],
        new_blobs: Sequence[Blob],
        snapshot_bytes: int,
    ) -> uuid.UUID:
        """Durably mark a step completed together with its snapshot (one record)."""
        try:
            rows = [list(self._blob_row(run_id, blob)) for blob in new_blobs]
        except BaseException:
            discard_staged(new_blobs)
            raise
        snapshot_id = uuid.uuid4()
        data = {
            "step_id": step_id,
            "run_id": run_id,
            "ordinal": ordinal,
            "at": self.now(),
            "duration_s": duration_s,
            "snapshot_id": snapshot_id,
            "manifest": json.dumps(manifest, sort_keys=True),
            "bytes": snapshot_bytes,
            "blobs": rows,
        }
        try:
            self.record("step_complete", data, sync=True)
        except OwnershipLost:  # refused before anything was written: no side file kept
            discard_staged(new_blobs)
            raise
        return snapshot_id

    def complete_item(
        self, run_id: str, step_id: uuid.UUID, duration_s: float, result: str
    ) -> None:
        """Durably mark a ``run.map`` item's step completed with its stored result (the
        encoding effect results use). Items completing at once share one ``fdatasync``."""
        data: dict[str, Any] = {
            "step_id": step_id,
            "run_id": run_id,
            "at": self.now(),
            "duration_s": duration_s,
            "result": result,
        }
        if not self.counts_items:  # a worker's store: the run's owner counts completions
            data["count"] = False
        self.record("item_complete", data, sync=True)

    def recount_completed(self, run_id: str) -> None:
        """Queue the run's count of completed steps, read from its steps: the owner of a
        batch whose items complete in other processes (``counts_items`` off there)."""
        now = self.now()

        def job(tx: Tx) -> None:
            tx.execute(
                "UPDATE runs SET updated_at = greatest(updated_at, ?), completed_steps ="
                " (SELECT count(*) FROM steps WHERE run_id = ? AND status = ?) WHERE id = ?",
                (now, run_id, StepStatus.COMPLETED, run_id),
            )

        self.write_async(job)

    def item_results(self, run_id: str, keys: Iterable[str]) -> dict[str, str]:
        """The stored results of the completed steps among ``keys`` (``run.map`` items)."""
        wanted = set(keys)
        rows = self.read(
            "SELECT key, result FROM steps WHERE run_id = ? AND status = ? AND result IS NOT NULL",
            (run_id, StepStatus.COMPLETED),
        )
        found: dict[str, str] = dict(rows)
        if found.keys() <= wanted:  # one run.map in the run: nothing to leave out
            return found
        return {key: found[key] for key in wanted if key in found}

    def step_status(self, step_id: uuid.UUID) -> tuple[str, str | None] | None:
        """(status, stored result) of one step attempt; None when there is none."""
        rows = self.read("SELECT status, result FROM steps WHERE id = ?", (step_id,))
        return (str(rows[0][0]), rows[0][1]) if rows else None

    def end_step(
        self,
        run_id: str,
        step_id: uuid.UUID,
        status: str,
        *,
        error: str | None = None,
        forced: bool = False,
        duration_s: float | None = None,
    ) -> bool:
        """Mark a step that did not complete (``failed``, ``cancelled``, ``abandoned``).
        Refused (``OwnershipLost``) once the run was taken over from this process. Only a
        step still ``running`` is ended: a late attempt (a second copy of a ``run.map``
        item) never changes a step that completed or ended meanwhile. True when this call
        ended it; False when it had ended already (its row says how)."""
        epoch, lock = self.held_epoch(run_id), self.backend.for_share

        def job(tx: Tx) -> bool:
            if epoch is not None:
                check_epoch_tx(tx, run_id, epoch, lock=lock, what="step end")
            ended = tx.fetchall(
                "UPDATE steps SET status = ?, ended_at = ?, duration_s = ?, error = ?, forced = ?"
                " WHERE id = ? AND status = ? RETURNING id",
                (status, self.now(), duration_s, error, forced, step_id, StepStatus.RUNNING),
            )
            return bool(ended)

        return self.write(job)

    def abandon_running_steps(self, tx: Tx, run_id: str) -> int:
        """Steps left ``running`` by a dead process become ``abandoned``."""
        rows = tx.fetchall(
            "UPDATE steps SET status = ?, ended_at = ? WHERE run_id = ? AND"
            " status = ? RETURNING id",
            (StepStatus.ABANDONED, self.now(), run_id, StepStatus.RUNNING),
        )
        return len(rows)

    def completed_step_ordinals(self, run_id: str) -> dict[str, int]:
        """key -> ordinal of the run's completed steps (a resume skips them): two columns
        read as tuples, so that a run of 100,000 items resumes in a fraction of a second."""
        rows = self.read(
            "SELECT key, ordinal FROM steps WHERE run_id = ? AND status = ? ORDER BY ordinal",
            (run_id, StepStatus.COMPLETED),
        )
        return dict(rows)

    def completed_step_count(self, run_id: str) -> int:
        """How many steps of the run completed (a completed step stays completed)."""
        rows = self.read(
            "SELECT count(*) FROM steps WHERE run_id = ? AND status = ?",
            (run_id, StepStatus.COMPLETED),
        )
        return int(rows[0][0])

    def completed_steps(self, run_id: str) -> list[dict[str, Any]]:
        return self.read_dicts(
            "SELECT ordinal, key, name, started_at, ended_at, duration_s, snapshot_id"
            " FROM steps WHERE run_id = ? AND status = ? ORDER BY ordinal",
            (run_id, StepStatus.COMPLETED),
        )

    def steps(self, run_id: str) -> list[dict[str, Any]]:
        return self.read_dicts(
            "SELECT * FROM steps WHERE run_id = ? ORDER BY started_at, ordinal", (run_id,)
        )

    # -- snapshots -------------------------------------------------------------
    def latest_snapshot(
        self, run_id: str, before_ordinal: int | None = None
    ) -> dict[str, Any] | None:
        """The newest kept snapshot, or the newest one taken before ``before_ordinal``."""
        sql = (
            "SELECT s.id, s.step_ordinal, s.manifest, s.removed_at FROM snapshots s"
            " JOIN steps t ON t.snapshot_id = s.id AND t.status = ?"
            " WHERE s.run_id = ?"
        )
        params: list[Any] = [StepStatus.COMPLETED, run_id]
        if before_ordinal is not None:
            sql += " AND s.step_ordinal < ?"
            params.append(before_ordinal)
        rows = self.read_dicts(
            sql + " ORDER BY s.step_ordinal DESC, s.created_at DESC LIMIT 1", params
        )
        if not rows:
            return None
        row = rows[0]
        row["manifest"] = json.loads(row["manifest"])
        return row

    def load_blobs(self, run_id: str, ids: Iterable[uuid.UUID]) -> dict[uuid.UUID, Blob]:
        """Fetch blobs and every delta base they build on, in one query.

        Every payload is checked against its recorded sha256: a changed, damaged or
        missing one raises :class:`IntegrityError` saying which value, step and file.
        """
        wanted = list(dict.fromkeys(ids))
        if not wanted:
            return {}
        marks = ", ".join("?" for _ in wanted)
        rows = self.read(
            "WITH RECURSIVE chain(id) AS ("
            f" SELECT id FROM blobs WHERE run_id = ? AND id IN ({marks})"
            " UNION SELECT b.base_id FROM blobs b JOIN chain c ON b.id = c.id"
            " WHERE b.run_id = ? AND b.base_id IS NOT NULL)"
            " SELECT b.id, b.encoding, b.sha256, b.size, b.location, b.base_id, b.data"
            " FROM blobs b WHERE b.run_id = ? AND b.id IN (SELECT id FROM chain)",
            (run_id, *wanted, run_id, run_id),
        )
        found: dict[uuid.UUID, Blob] = {}
        for bid, encoding, sha, size, location, base_id, data in rows:
            payload = self._read_payload(run_id, bid, sha, location, data)
            found[bid] = Blob(bid, encoding, sha, size, base_id, payload)
        return found

    def blob_chain_ids(self, run_id: str) -> dict[uuid.UUID, uuid.UUID | None]:
        rows = self.read("SELECT id, base_id FROM blobs WHERE run_id = ?", (run_id,))
        return {r[0]: r[1] for r in rows}

    # -- large payloads --------------------------------------------------------
    def stage_payload(self, run_id: str, data: bytes) -> StagedPayload | None:
        """Start writing a payload that will go to a side file; None if it stays inline."""
        files = self.backend.side_files
        if files is None or len(data) <= self.backend.inline_limit:
            return None
        staged: StagedPayload = files.stage(run_id, data)
        return staged

    def _files(self) -> Any:
        files = self.backend.side_files
        if files is None:
            raise StoreError(f"The store at {self.location} keeps every payload inline.")
        return files

    def blob_dir(self, run_id: str) -> str:
        """The folder of a run's side files."""
        return str(self._files().run_dir(run_id))

    def side_file_location(self, run_id: str, blob_id: uuid.UUID) -> str:
        """The ``blobs.location`` of a side file, relative to :attr:`blob_root`."""
        return str(self._files().location(run_id, blob_id))

    @property
    def blob_root(self) -> str:
        """The folder of the store's side files, beside the store file."""
        return str(self._files().root)

    def payload_path(self, location: str) -> str:
        """The path of a side file from its ``blobs.location`` (``file:...``), found where
        the store is now: relative locations, and absolute ones of a moved folder.

        Every use of a location (read, restart link, retention removal) goes through this;
        a relative location leading out of :attr:`blob_root` raises
        :class:`IntegrityError`."""
        return str(self._files().locate(location))

    def _blob_row(self, run_id: str, blob: Blob) -> tuple[Any, ...]:
        # A server backend (PostgreSQL) keeps every payload in the database: a side
        # file on one host could not be read by a resume on another host.
        files = self.backend.side_files
        if files is None or blob.size <= self.backend.inline_limit:
            return (
                blob.id,
                run_id,
                blob.encoding,
                blob.sha256,
                blob.size,
                "inline",
                blob.base_id,
                blob.data,
            )
        location = files.store(run_id, blob.id, blob.data, blob.staged)
        return (
            blob.id,
            run_id,
            blob.encoding,
            blob.sha256,
            blob.size,
            location,
            blob.base_id,
            None,
        )

    def _read_payload(
        self, run_id: str, bid: uuid.UUID, sha: str, location: str, data: bytes | None
    ) -> bytes:
        """The payload, checked against its recorded hash."""
        if location == "inline":
            where, payload = "inline", bytes(data or b"")
        else:
            try:
                where, found = self._files().read(location)
            except IntegrityError:  # a location leading out of the blob folder
                use = self._payload_use(run_id, bid)
                message = outside_message(run_id, bid, use, location, self.blob_root)
                raise IntegrityError(message) from None
            if found is None:
                use = self._payload_use(run_id, bid)
                raise IntegrityError(missing_message(run_id, bid, use, where))
            payload = found
        actual = digest(payload)
        if actual != sha:
            use = self._payload_use(run_id, bid)
            raise IntegrityError(damaged_message(run_id, bid, use, where, sha, actual))
        return payload

    def _payload_use(self, run_id: str, bid: uuid.UUID) -> PayloadUse:
        """Which steps and state keys need a blob (for an error message only)."""
        snapshots = self.read(
            "SELECT step_ordinal, manifest FROM snapshots WHERE run_id = ? AND removed_at IS NULL"
            " ORDER BY step_ordinal",
            (run_id,),
        )
        return payload_use(bid, self.blob_chain_ids(run_id), snapshots)


def discard_staged(blobs: Iterable[Blob]) -> None:
    """Remove the temporary side files of blobs that will not be stored."""
    for blob in blobs:
        if blob.staged is not None:
            blob.staged.discard()
