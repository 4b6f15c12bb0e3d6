"""LangGraph checkpoints, their channel values and pending writes (``kx.langgraph``).

Three tables, on every backend (migration 6):

* ``langgraph_checkpoints``: one row per checkpoint of a thread and namespace; the
  checkpoint itself without its channel values (serialized by LangGraph's serializer), its
  metadata as JSON (secrets scrubbed), and readable columns for SQL (``step``, ``source``,
  ``graph_run_id``, ``channel_versions``). A graph started with ``kx.langgraph.start`` uses
  the kernelext run id as its ``thread_id``.
* ``langgraph_blobs``: one value per channel version, written once and shared by every
  checkpoint that holds that version (a checkpoint rewrites only the channels it changed).
* ``langgraph_writes``: the pending writes of a checkpoint's tasks.

The store knows no LangGraph type: the saver (``kernelext._adapters.langgraph_saver``)
serializes, this mixin stores bytes and text.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from .base import StoreBase
from .writer import Tx

__all__ = ["CHECKPOINT_COLUMNS", "CheckpointsMixin"]

CHECKPOINT_COLUMNS = (
    "thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, encoding, checkpoint,"
    " metadata, channel_versions"
)
_WRITE_COLUMNS = (
    "thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, encoding, value"
)
_INSERT_WRITE = (
    f"INSERT INTO langgraph_writes ({_WRITE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_WRITE_KEY = "(thread_id, checkpoint_ns, checkpoint_id, task_id, idx)"
_SAME_CHECKPOINT = (
    "c.thread_id = langgraph_writes.thread_id AND c.checkpoint_ns = langgraph_writes.checkpoint_ns"
    " AND c.checkpoint_id = langgraph_writes.checkpoint_id"
)


def _marks(values: Sequence[Any]) -> str:
    return ", ".join("?" for _ in values)


class CheckpointsMixin(StoreBase):
    """SQL for LangGraph's checkpoint saver contract (put, writes, get, list, delete, copy)."""

    # -- writes ------------------------------------------------------------------------------
    def put_graph_checkpoint(
        self, row: dict[str, Any], blobs: Sequence[tuple[str, str, str, bytes | None]]
    ) -> None:
        """Store one checkpoint (replacing one with the same id) and its new channel values.

        ``row``: thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, encoding,
        checkpoint (bytes), metadata (a JSON-able dict), channel_versions ({channel: version
        as text}). ``blobs``: (channel, version, encoding, value) of the versions this
        checkpoint wrote; a version stored before is kept as it is.
        """
        metadata = dict(row["metadata"])  # scrubbed by the write path (store/columns.py)
        step = metadata.get("step")
        values = (
            row["thread_id"],
            row["checkpoint_ns"],
            row["checkpoint_id"],
            row["parent_checkpoint_id"],
            step if isinstance(step, int) and not isinstance(step, bool) else None,
            _text_or_none(metadata.get("source")),
            _text_or_none(metadata.get("run_id")),
            row["encoding"],
            row["checkpoint"],
            json.dumps(metadata, ensure_ascii=False, default=str, sort_keys=True),
            json.dumps(row["channel_versions"], sort_keys=True),
            self.now(),
        )
        blob_rows = [(row["thread_id"], row["checkpoint_ns"], *blob) for blob in blobs]

        def job(tx: Tx) -> None:
            if blob_rows:
                tx.executemany(
                    "INSERT INTO langgraph_blobs (thread_id, checkpoint_ns, channel, version,"
                    " encoding, value) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                    blob_rows,
                )
            tx.execute(
                "INSERT INTO langgraph_checkpoints (thread_id, checkpoint_ns, checkpoint_id,"
                " parent_checkpoint_id, step, source, graph_run_id, encoding, checkpoint,"
                " metadata, channel_versions, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id) DO UPDATE SET"
                " parent_checkpoint_id = excluded.parent_checkpoint_id, step = excluded.step,"
                " source = excluded.source, graph_run_id = excluded.graph_run_id,"
                " encoding = excluded.encoding, checkpoint = excluded.checkpoint,"
                " metadata = excluded.metadata, channel_versions = excluded.channel_versions",
                values,
            )

        self.write(job)

    def put_graph_writes(
        self, keep: Sequence[Sequence[Any]], replace: Sequence[Sequence[Any]]
    ) -> None:
        """Store pending writes, rows in ``_WRITE_COLUMNS`` order, in one transaction.

        ``keep``: ordinary writes, stored once (a task that saves them again changes
        nothing). ``replace``: special writes (error, interrupt, resume), the newest wins.
        """

        def job(tx: Tx) -> None:
            if keep:
                tx.executemany(f"{_INSERT_WRITE} ON CONFLICT DO NOTHING", keep)
            if replace:
                tx.executemany(
                    f"{_INSERT_WRITE} ON CONFLICT {_WRITE_KEY} DO UPDATE SET"
                    " task_path = excluded.task_path, channel = excluded.channel,"
                    " encoding = excluded.encoding, value = excluded.value",
                    replace,
                )

        self.write(job)

    def delete_graph_threads(self, thread_ids: Sequence[str]) -> None:
        """Remove every checkpoint, value and write of these threads."""
        ids = [str(t) for t in thread_ids]
        if not ids:
            return
        where = f"thread_id IN ({_marks(ids)})"

        def job(tx: Tx) -> None:
            for table in ("langgraph_writes", "langgraph_blobs", "langgraph_checkpoints"):
                tx.execute(f"DELETE FROM {table} WHERE {where}", ids)

        self.write(job)

    def delete_graph_runs(self, graph_run_ids: Sequence[str]) -> None:
        """Remove the checkpoints (and their writes) that LangGraph runs ``graph_run_ids`` made."""
        ids = [str(r) for r in graph_run_ids]
        if not ids:
            return
        marks = _marks(ids)

        def job(tx: Tx) -> None:
            tx.execute(
                "DELETE FROM langgraph_writes WHERE EXISTS (SELECT 1 FROM langgraph_checkpoints c"
                f" WHERE {_SAME_CHECKPOINT} AND c.graph_run_id IN ({marks}))",
                ids,
            )
            tx.execute(f"DELETE FROM langgraph_checkpoints WHERE graph_run_id IN ({marks})", ids)

        self.write(job)

    def copy_graph_thread(self, source: str, target: str) -> None:
        """Copy every checkpoint, value and write of thread ``source`` to thread ``target``."""
        params = (str(target), str(source))
        now = self.now()

        def job(tx: Tx) -> None:
            tx.execute(
                "INSERT INTO langgraph_checkpoints (thread_id, checkpoint_ns, checkpoint_id,"
                " parent_checkpoint_id, step, source, graph_run_id, encoding, checkpoint,"
                " metadata, channel_versions, created_at) SELECT ?, checkpoint_ns, checkpoint_id,"
                " parent_checkpoint_id, step, source, graph_run_id, encoding, checkpoint, metadata,"
                " channel_versions, ? FROM langgraph_checkpoints WHERE thread_id = ?"
                " ON CONFLICT DO NOTHING",
                (params[0], now, params[1]),
            )
            tx.execute(
                "INSERT INTO langgraph_blobs (thread_id, checkpoint_ns, channel, version, encoding,"
                " value) SELECT ?, checkpoint_ns, channel, version, encoding, value"
                " FROM langgraph_blobs WHERE thread_id = ? ON CONFLICT DO NOTHING",
                params,
            )
            tx.execute(
                f"INSERT INTO langgraph_writes ({_WRITE_COLUMNS}) SELECT ?, checkpoint_ns,"
                " checkpoint_id, task_id, task_path, idx, channel, encoding, value"
                " FROM langgraph_writes WHERE thread_id = ? ON CONFLICT DO NOTHING",
                params,
            )

        self.write(job)

    def prune_graph_threads(self, thread_ids: Sequence[str]) -> None:
        """Keep only the newest checkpoint of each namespace of these threads (with its
        writes and the channel values it holds); everything older goes."""
        ids = [str(t) for t in thread_ids]
        if not ids:
            return
        marks = _marks(ids)

        def job(tx: Tx) -> None:
            tx.execute(
                f"DELETE FROM langgraph_checkpoints WHERE thread_id IN ({marks}) AND checkpoint_id"
                " < (SELECT max(c.checkpoint_id) FROM langgraph_checkpoints c"
                " WHERE c.thread_id = langgraph_checkpoints.thread_id"
                " AND c.checkpoint_ns = langgraph_checkpoints.checkpoint_ns)",
                ids,
            )
            tx.execute(
                f"DELETE FROM langgraph_writes WHERE thread_id IN ({marks}) AND NOT EXISTS"
                f" (SELECT 1 FROM langgraph_checkpoints c WHERE {_SAME_CHECKPOINT})",
                ids,
            )
            kept = tx.fetchall(
                "SELECT thread_id, checkpoint_ns, channel_versions FROM langgraph_checkpoints"
                f" WHERE thread_id IN ({marks})",
                ids,
            )
            held = {
                (str(thread), str(ns), str(channel), str(version))
                for thread, ns, versions in kept
                for channel, version in json.loads(versions or "{}").items()
            }
            stored = tx.fetchall(
                "SELECT thread_id, checkpoint_ns, channel, version FROM langgraph_blobs"
                f" WHERE thread_id IN ({marks})",
                ids,
            )
            unused = [tuple(str(v) for v in row) for row in stored if tuple(row) not in held]
            tx.executemany(
                "DELETE FROM langgraph_blobs WHERE thread_id = ? AND checkpoint_ns = ?"
                " AND channel = ? AND version = ?",
                unused,
            )

        self.write(job)

    # -- reads -------------------------------------------------------------------------------
    def graph_checkpoints(
        self,
        *,
        thread_id: str | None = None,
        checkpoint_ns: str | None = None,
        checkpoint_id: str | None = None,
        before: str | None = None,
        limit: int | None = None,
    ) -> list[dict[str, Any]]:
        """Checkpoint rows, newest first (``metadata`` and ``channel_versions`` decoded)."""
        where: list[str] = []
        params: list[Any] = []
        for column, value, op in (
            ("thread_id", thread_id, "="),
            ("checkpoint_ns", checkpoint_ns, "="),
            ("checkpoint_id", checkpoint_id, "="),
            ("checkpoint_id", before, "<"),
        ):
            if value is not None:
                where.append(f"{column} {op} ?")
                params.append(str(value))
        sql = f"SELECT {CHECKPOINT_COLUMNS} FROM langgraph_checkpoints"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY checkpoint_id DESC"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(int(limit))
        rows = self.read_dicts(sql, params)
        for row in rows:
            row["metadata"] = json.loads(row["metadata"]) if row["metadata"] else {}
            row["channel_versions"] = json.loads(row["channel_versions"] or "{}")
            row["checkpoint"] = _as_bytes(row["checkpoint"])
        return rows

    def graph_blobs(
        self, thread_id: str, checkpoint_ns: str, versions: dict[str, str]
    ) -> list[dict[str, Any]]:
        """The stored values of ``versions`` ({channel: version}) of one thread/namespace."""
        if not versions:
            return []
        pairs = sorted(versions.items())
        params: list[Any] = [thread_id, checkpoint_ns]
        for channel, version in pairs:
            params.extend((channel, version))
        match = " OR ".join("(channel = ? AND version = ?)" for _ in pairs)
        rows = self.read_dicts(
            "SELECT channel, version, encoding, value FROM langgraph_blobs"
            f" WHERE thread_id = ? AND checkpoint_ns = ? AND ({match})",
            params,
        )
        for row in rows:
            row["value"] = _as_bytes(row["value"])
        return rows

    def graph_writes(
        self, thread_id: str, checkpoint_ns: str, checkpoint_id: str
    ) -> list[dict[str, Any]]:
        """The pending writes of one checkpoint, in LangGraph's order (task path, task, idx)."""
        rows = self.read_dicts(
            "SELECT task_id, task_path, idx, channel, encoding, value FROM langgraph_writes"
            " WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?",
            (thread_id, checkpoint_ns, checkpoint_id),
        )
        for row in rows:
            row["value"] = _as_bytes(row["value"])
        rows.sort(key=lambda r: (r["task_path"] or "", r["task_id"], r["idx"]))
        return rows

    # -- helpers -----------------------------------------------------------------------------


def _text_or_none(value: Any) -> str | None:
    return None if value is None else str(value)


def _as_bytes(value: Any) -> bytes | None:
    if value is None:
        return None
    return bytes(value)
