"""``KernelextSaver``: a LangGraph checkpointer on the kernelext store (DuckDB or PostgreSQL).

Checkpoints, channel values and pending writes live in the store's ``langgraph_*`` tables
(``kernelext/_store/checkpoints.py``), next to the runs, steps and effect ledger, so one
``kx.sql`` query sees a graph's checkpoints and the effects its tools applied. A channel
value is stored once per version; a checkpoint rewrites only the channels it changed.

The async methods run the sync ones in a worker thread (the store has its own writer
thread; nothing here blocks an event loop for longer than a thread hand-off).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from .._store import Store
from .._store import open_store as _open_store

try:
    from langchain_core.runnables import RunnableConfig
    from langgraph.checkpoint.base import (
        WRITES_IDX_MAP,
        BaseCheckpointSaver,
        ChannelVersions,
        Checkpoint,
        CheckpointMetadata,
        CheckpointTuple,
        PendingWrite,
        get_checkpoint_id,
        get_serializable_checkpoint_metadata,
    )
    from langgraph.checkpoint.serde.base import SerializerProtocol
except ImportError as exc:  # pragma: no cover - exercised without the extra installed
    raise ImportError(
        "kx.langgraph needs the langgraph package, which is not installed. Install the "
        "extra: pip install 'kernelext[langgraph]'"
    ) from exc

__all__ = ["KernelextSaver"]

EMPTY = "empty"  # the encoding of a channel that has a version but no value


class KernelextSaver(BaseCheckpointSaver[str]):
    """LangGraph checkpoints in the kernelext store.

    ``KernelextSaver()`` uses the current store (``kx.open_store()``); pass a ``Store``
    (``kx.open_store(...)``) or a location (a DuckDB path or ``postgresql://`` URL, opened
    for this saver and closed by :meth:`close`) to use another one::

        graph = builder.compile(checkpointer=kx.langgraph.KernelextSaver())
        graph.invoke(inputs, {"configurable": {"thread_id": "t-1"}})

    Metadata is stored as JSON with secrets scrubbed (keys named like a secret, registered
    ``kx.secrets``), so an API key passed in ``configurable`` never reaches the store.
    """

    def __init__(
        self, store: Store | str | None = None, *, serde: SerializerProtocol | None = None
    ) -> None:
        super().__init__(serde=serde)
        self._owns_store = isinstance(store, str)
        if isinstance(store, str):
            self.store = _open_store(store)
        elif store is None:
            from .._core.process.api import open_store  # the current store (kx.open_store())

            self.store = open_store()
        else:
            self.store = store

    def close(self) -> None:
        """Close the store if this saver opened it (a location was given)."""
        if self._owns_store:
            self.store.close()

    # -- reads ---------------------------------------------------------------------------
    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint ``config`` names (its ``checkpoint_id``), else the thread's newest."""
        conf = config["configurable"]
        rows = self.store.graph_checkpoints(
            thread_id=str(conf["thread_id"]),
            checkpoint_ns=str(conf.get("checkpoint_ns", "")),
            checkpoint_id=get_checkpoint_id(config),
            limit=1,
        )
        return self._tuple(rows[0]) if rows else None

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """Checkpoints newest first: of one thread (and namespace, when ``config`` names one),
        whose metadata has every ``filter`` item, older than ``before``, at most ``limit``."""
        conf = config["configurable"] if config else {}
        rows = self.store.graph_checkpoints(
            thread_id=str(conf["thread_id"]) if conf.get("thread_id") is not None else None,
            checkpoint_ns=str(conf["checkpoint_ns"]) if "checkpoint_ns" in conf else None,
            checkpoint_id=get_checkpoint_id(config) if config else None,
            before=get_checkpoint_id(before) if before else None,
            limit=None if filter else limit,
        )
        given = 0
        for row in rows:
            if limit is not None and given >= limit:
                return
            if filter and any(row["metadata"].get(k) != v for k, v in filter.items()):
                continue
            given += 1
            yield self._tuple(row)

    def _tuple(self, row: dict[str, Any]) -> CheckpointTuple:
        thread_id, ns = str(row["thread_id"]), str(row["checkpoint_ns"])
        checkpoint: Checkpoint = self.serde.loads_typed((row["encoding"], row["checkpoint"]))
        values: dict[str, Any] = {}
        for blob in self.store.graph_blobs(thread_id, ns, row["channel_versions"]):
            if blob["encoding"] != EMPTY:
                values[blob["channel"]] = self.serde.loads_typed((blob["encoding"], blob["value"]))
        checkpoint = {**checkpoint, "channel_values": values}
        writes: list[PendingWrite] = [
            (w["task_id"], w["channel"], self.serde.loads_typed((w["encoding"], w["value"])))
            for w in self.store.graph_writes(thread_id, ns, str(row["checkpoint_id"]))
        ]
        parent = row["parent_checkpoint_id"]
        return CheckpointTuple(
            config=_config(thread_id, ns, str(row["checkpoint_id"])),
            checkpoint=checkpoint,
            metadata=row["metadata"],
            parent_config=_config(thread_id, ns, str(parent)) if parent else None,
            pending_writes=writes,
        )

    # -- writes --------------------------------------------------------------------------
    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store a checkpoint and the channel values of ``new_versions``."""
        conf = config["configurable"]
        thread_id, ns = str(conf["thread_id"]), str(conf.get("checkpoint_ns", ""))
        bare = {k: v for k, v in checkpoint.items() if k != "channel_values"}
        values = checkpoint.get("channel_values", {})
        blobs: list[tuple[str, str, str, bytes | None]] = []
        for channel, version in new_versions.items():
            if channel in values:
                encoding, data = self.serde.dumps_typed(values[channel])
                blobs.append((channel, str(version), encoding, data))
            else:
                blobs.append((channel, str(version), EMPTY, None))
        encoding, data = self.serde.dumps_typed(bare)
        self.store.put_graph_checkpoint(
            {
                "thread_id": thread_id,
                "checkpoint_ns": ns,
                "checkpoint_id": checkpoint["id"],
                "parent_checkpoint_id": conf.get("checkpoint_id"),
                "encoding": encoding,
                "checkpoint": data,
                "metadata": dict(get_serializable_checkpoint_metadata(config, metadata)),
                "channel_versions": {
                    str(k): str(v) for k, v in checkpoint["channel_versions"].items()
                },
            },
            blobs,
        )
        return _config(thread_id, ns, checkpoint["id"])

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Store a task's writes against the checkpoint ``config`` names."""
        conf = config["configurable"]
        head = (str(conf["thread_id"]), str(conf.get("checkpoint_ns", "")))
        keep: list[tuple[Any, ...]] = []
        replace: list[tuple[Any, ...]] = []
        for index, (channel, value) in enumerate(writes):
            idx = WRITES_IDX_MAP.get(channel, index)
            encoding, data = self.serde.dumps_typed(value)
            row = (*head, str(conf["checkpoint_id"]), task_id, task_path, idx, channel)
            (replace if idx < 0 else keep).append((*row, encoding, data))
        self.store.put_graph_writes(keep, replace)

    def delete_thread(self, thread_id: str) -> None:
        """Delete every checkpoint and write of ``thread_id``."""
        self.store.delete_graph_threads([thread_id])

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints (and their writes) made by these LangGraph run ids."""
        self.store.delete_graph_runs(list(run_ids))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint and write of one thread to another."""
        self.store.copy_graph_thread(source_thread_id, target_thread_id)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """``keep_latest``: keep each namespace's newest checkpoint; ``delete``: drop all.

        ``keep_latest`` keeps no ancestors, so a graph that uses LangGraph's (beta)
        ``DeltaChannel`` loses the history those channels are rebuilt from: do not prune
        such threads.
        """
        if strategy == "keep_latest":
            self.store.prune_graph_threads(list(thread_ids))
        elif strategy == "delete":
            self.store.delete_graph_threads(list(thread_ids))
        else:
            raise ValueError(f"Unknown prune strategy {strategy!r}: use 'keep_latest' or 'delete'.")

    def get_next_version(self, current: str | None, channel: None) -> str:
        """A version that sorts after ``current``; the random part keeps two forks apart."""
        if current is None:
            number = 0
        elif isinstance(current, int):
            number = current
        else:
            number = int(str(current).split(".")[0])
        return f"{number + 1:032}.{random.random():016}"

    # -- async: the same work, in a worker thread -------------------------------------------
    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await asyncio.to_thread(self.get_tuple, config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        def collect() -> list[CheckpointTuple]:
            return [*self.list(config, filter=filter, before=before, limit=limit)]

        for item in await asyncio.to_thread(collect):
            yield item

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return await asyncio.to_thread(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        await asyncio.to_thread(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        await asyncio.to_thread(self.delete_thread, thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await asyncio.to_thread(self.delete_for_runs, run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await asyncio.to_thread(self.copy_thread, source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await asyncio.to_thread(self.prune, thread_ids, strategy=strategy)


def _config(thread_id: str, checkpoint_ns: str, checkpoint_id: str) -> RunnableConfig:
    return {
        "configurable": {
            "thread_id": thread_id,
            "checkpoint_ns": checkpoint_ns,
            "checkpoint_id": checkpoint_id,
        }
    }
