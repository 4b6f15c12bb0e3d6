"""The snapshot payloads a restart carries: which blobs the kept steps need (with the
blobs they are deltas of), the id each gets in the new run, and whether a payload file
already there holds exactly the same payload (then it is used as it is)."""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from typing import Any

from .duckdb.store_files import store_file_reader

__all__ = ["needed_blobs", "new_blob_id", "same_payload"]


def same_payload(source: str, target: str) -> bool:
    """Whether ``target`` already holds exactly the payload of ``source`` (the same file,
    or a complete copy: a racing restart's, or a leftover of a killed one), so that it can
    be used as it is. It is then not this restart's file: never removed by it."""
    try:
        if os.path.samefile(source, target):
            return True
        if os.path.getsize(source) != os.path.getsize(target):
            return False
        with store_file_reader(source) as a, store_file_reader(target) as b:
            while True:
                chunk = a.read(1 << 20)
                if chunk != b.read(1 << 20):
                    return False
                if not chunk:
                    return True
    except OSError:
        return False


def needed_blobs(
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


def new_blob_id(new_run_id: str, old_blob: uuid.UUID) -> uuid.UUID:
    digest = hashlib.sha256(b"restart\0" + new_run_id.encode() + b"\0" + old_blob.bytes)
    return uuid.UUID(bytes=digest.digest()[:16])
