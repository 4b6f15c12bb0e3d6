"""Checking a payload against the hash recorded for it, and saying what to do when it fails.

Every blob row records ``sha256`` of the exact bytes stored (the full value, or the
appended tail of a delta). A read hashes what it found and compares; ``hashlib`` lets go
of the GIL for large buffers, so other threads run meanwhile.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Iterable, Mapping
from typing import NamedTuple

from .._formatting import step_label, step_number

__all__ = [
    "PayloadUse",
    "damaged_message",
    "digest",
    "missing_message",
    "outside_message",
    "payload_use",
]

SHOWN_HEX = 12  # hash prefix shown in messages


class PayloadUse(NamedTuple):
    """Which snapshots of the run need a blob (directly or as a delta base), and for what."""

    steps: list[int]
    keys: list[str]


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def payload_use(
    bid: uuid.UUID,
    bases: Mapping[uuid.UUID, uuid.UUID | None],
    snapshots: Iterable[tuple[int, str]],
) -> PayloadUse:
    """The step ordinals whose snapshot needs ``bid``, and the state keys it holds there.

    ``bases`` maps each blob of the run to its delta base; ``snapshots`` are
    (step ordinal, manifest JSON) rows.
    """
    steps: list[int] = []
    keys: list[str] = []
    for ordinal, manifest in snapshots:
        hit = [k for k, h in json.loads(manifest).items() if _needs(uuid.UUID(hex=h), bid, bases)]
        if hit:
            steps.append(int(ordinal))
            keys.extend(k for k in hit if k not in keys)
    return PayloadUse(sorted(set(steps)), keys)


def _needs(top: uuid.UUID, bid: uuid.UUID, bases: Mapping[uuid.UUID, uuid.UUID | None]) -> bool:
    current: uuid.UUID | None = top
    seen: set[uuid.UUID] = set()
    while current is not None and current not in seen:
        if current == bid:
            return True
        seen.add(current)
        current = bases.get(current)
    return False


def damaged_message(
    run_id: str, bid: uuid.UUID, use: PayloadUse, where: str, expected: str, found: str
) -> str:
    inline = where == "inline"
    place = "inline in the blobs table" if inline else f"in {where}"
    fix = "Restore the store file" if inline else "Put the original file back"
    return (
        f"{_subject(run_id, bid, use)} {place} does not match the hash recorded for it "
        f"(expected sha256 {expected[:SHOWN_HEX]}…, found {found[:SHOWN_HEX]}…): it was "
        f"changed or damaged after it was written. {_outcome(run_id, use, fix)}"
    )


def missing_message(run_id: str, bid: uuid.UUID, use: PayloadUse, path: str) -> str:
    return (
        f"{_subject(run_id, bid, use)} is missing: no file {path}. "
        f"{_outcome(run_id, use, 'Put the file back there')}"
    )


def outside_message(run_id: str, bid: uuid.UUID, use: PayloadUse, location: str, root: str) -> str:
    return (
        f"{_subject(run_id, bid, use)} has the location {location!r}, which leads out of the "
        f"store's side-file folder {root}: the blobs row was changed, and nothing was read "
        f"from there. {_outcome(run_id, use, 'Restore the store file')}"
    )


def _subject(run_id: str, bid: uuid.UUID, use: PayloadUse) -> str:
    what = ", ".join(f"run.state[{k!r}]" for k in use.keys) or "a snapshot value"
    steps = ""
    if use.steps:
        first, last = use.steps[0], use.steps[-1]
        steps = f", saved at {step_label(first)}"
        steps += f", used up to {step_label(last)}" if last != first else ""
    return (
        f"A snapshot of run {run_id!r} cannot be restored: the stored payload of {what} "
        f"(blob {bid.hex}{steps})"
    )


def _outcome(run_id: str, use: PayloadUse, fix: str) -> str:
    again = f"{fix} (from a backup) and call kx.resume({run_id!r}) again"
    if use.steps:
        step = use.steps[0]
        again += (
            f", or start a new run without it: kx.restart({run_id!r}, from_step={step}) "
            f"{_restart_effect(step)}"
        )
    return f"Nothing was restored from this snapshot. {again}."


def _restart_effect(step: int) -> str:
    """What ``kx.restart(from_step=step)`` (an ordinal) does, with steps counted from 1."""
    if step == 0:
        return f"starts over at {step_label(0)}"
    kept = step_label(0) if step == 1 else f"steps {step_number(0)}-{step_number(step - 1)}"
    return f"keeps {kept} and runs {step_label(step)} again"
