"""Snapshots of ``run.state``: one blob per top-level key, written only when it changed.

A list that only grew since the last snapshot is stored as a delta (its new tail)
on top of the previous blob, so storage grows with changes, not with steps.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..._store import Blob, Store
from ..._store.steps import StagedPayload, discard_staged
from ..encoding.codec import check_json_fidelity, decode, encode, loads_json

__all__ = ["Snapshotter"]

MAX_CHAIN = 256  # after this many deltas a full copy is written
Stage = Callable[[bytes], StagedPayload | None]


@dataclass
class _Entry:
    blob_id: uuid.UUID
    encoding: str  # encoding of the full value
    full: bytes  # the full encoded value, to detect changes and appends
    depth: int


class Snapshotter:
    """Turns ``run.state`` into blobs + a manifest, and back."""

    def __init__(self, run_id: str, *, allow_pickle: bool = False) -> None:
        self.run_id = run_id
        self.allow_pickle = allow_pickle
        self._prev: dict[str, _Entry] = {}

    def take(
        self, state: dict[str, Any], stage: Stage | None = None
    ) -> tuple[dict[str, str], list[Blob], int]:
        """Encode ``state``. Returns (manifest, blobs to write, bytes written).

        ``stage(payload)`` (the store's ``stage_payload``) starts writing a large payload
        while it is hashed here; the store finishes the job when the step completes.
        """
        manifest: dict[str, str] = {}
        new: list[Blob] = []
        entries: dict[str, _Entry] = {}
        written = 0
        try:
            written = self._take(state, stage, manifest, new, entries)
        except BaseException:
            discard_staged(new)
            raise
        self._pending = entries
        return manifest, new, written

    def _take(
        self,
        state: dict[str, Any],
        stage: Stage | None,
        manifest: dict[str, str],
        new: list[Blob],
        entries: dict[str, _Entry],
    ) -> int:
        written = 0
        for key, value in state.items():
            if not isinstance(key, str):
                from ...errors import SerializationError

                raise SerializationError(
                    f"run.state keys must be strings; got {type(key).__name__} key {key!r}."
                )
            encoding, full = encode(
                value, where=f"run.state[{key!r}]", allow_pickle=self.allow_pickle
            )
            prev = self._prev.get(key)
            if prev is not None and prev.encoding == encoding and prev.full == full:
                entries[key] = prev
            else:
                if encoding == "json":
                    swapped = check_json_fidelity(
                        value, where=f"run.state[{key!r}]", allow_pickle=self.allow_pickle
                    )
                    if swapped is not None:
                        encoding, full = swapped
                blob, depth = self._blob(encoding, full, prev, stage)
                new.append(blob)
                written += blob.size
                entries[key] = _Entry(blob.id, encoding, full, depth)
            manifest[key] = entries[key].blob_id.hex
        return written

    def committed(self) -> None:
        """The snapshot from the last ``take`` is durable: it becomes the base."""
        self._prev = self._pending

    def _blob(
        self, encoding: str, full: bytes, prev: _Entry | None, stage: Stage | None = None
    ) -> tuple[Blob, int]:
        base: _Entry | None = None
        payload = full
        stored_encoding = encoding
        if (
            prev is not None
            and encoding == "json"
            and prev.encoding == "json"
            and prev.depth < MAX_CHAIN
            and len(prev.full) > 2
            and full[:1] == b"["
            and len(full) > len(prev.full)
            and full.startswith(prev.full[:-1])
            and full[len(prev.full) - 1 : len(prev.full)] == b","
        ):
            base = prev
            payload = b"[" + full[len(prev.full) :]
            stored_encoding = "json+append"
        staged = stage(payload) if stage is not None else None  # the disk works meanwhile
        digest = hashlib.sha256(payload).digest()
        ident = hashlib.sha256(
            b"\0".join(
                [
                    self.run_id.encode(),
                    stored_encoding.encode(),
                    base.blob_id.bytes if base else b"",
                    digest,
                ]
            )
        ).digest()[:16]
        blob = Blob(
            uuid.UUID(bytes=ident),
            stored_encoding,
            digest.hex(),
            len(payload),
            base.blob_id if base else None,
            payload,
            staged,
        )
        return blob, (base.depth + 1 if base else 0)

    def restore(self, store: Store, manifest: dict[str, str]) -> dict[str, Any]:
        """Rebuild the state a manifest describes, and make it the base for deltas."""
        ids = {key: uuid.UUID(hex=h) for key, h in manifest.items()}
        blobs = store.load_blobs(self.run_id, ids.values())
        state: dict[str, Any] = {}
        self._prev = {}
        for key, bid in ids.items():
            encoding, full, depth = _assemble(blobs, bid)
            state[key] = decode(encoding, full, allow_pickle=self.allow_pickle)
            self._prev[key] = _Entry(bid, encoding, full, depth)
        return state


def _assemble(blobs: dict[uuid.UUID, Blob], bid: uuid.UUID) -> tuple[str, bytes, int]:
    chain: list[Blob] = []
    current: uuid.UUID | None = bid
    while current is not None:
        blob = blobs.get(current)
        if blob is None:
            from ...errors import StoreError

            raise StoreError(
                f"Snapshot payload {current} is missing (removed after its retention period?)."
            )
        chain.append(blob)
        current = blob.base_id
    chain.reverse()
    base = chain[0]
    if len(chain) == 1:
        return base.encoding, base.data, 0
    items: list[Any] = loads_json(base.data)
    for delta in chain[1:]:
        items.extend(loads_json(delta.data))
    from ..encoding.codec import dumps_json

    return "json", dumps_json(items), len(chain) - 1
