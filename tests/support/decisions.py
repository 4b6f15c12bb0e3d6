"""Deciding an unknown effect from what the delivery server received under its key."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

APPLIED_NOTE = "server log has delivery #{seq} for this key"
NOT_APPLIED_NOTE = "the server never received this key"


def decide_from_deliveries(
    unknown: Any,
    received: list[dict[str, Any]],
    *,
    applied_note: str = APPLIED_NOTE,
    not_applied_note: str = NOT_APPLIED_NOTE,
) -> bool:
    """Mark ``unknown`` applied with the server's answer when ``received`` (the deliveries
    under its key) holds one, else not applied; True when it was applied."""
    key = str(unknown.key)
    if not received:
        unknown.mark_not_applied(note=not_applied_note)
        return False
    first = received[0]
    unknown.mark_applied(
        result={
            "ok": True,
            "delivery": first["seq"],
            "path": first["path"],
            "idempotency_key": key,
        },
        note=applied_note.format(seq=first["seq"]),
    )
    return True


def unknowns_decided_from(
    deliveries: list[dict[str, Any]], run_id: str, *, store: Any = None, **notes: str
) -> Iterator[tuple[Any, list[dict[str, Any]]]]:
    """Each unknown effect of ``run_id`` with the deliveries received under its key (from a
    delivery server's ``deliveries`` or its log); once the caller has looked at the pair, the
    effect is decided from them (``decide_from_deliveries``, with ``notes``)."""
    import kernelext as kx

    for unknown in kx.reconcile(run_id, store=store):
        received = [d for d in deliveries if d["idempotency_key"] == str(unknown.key)]
        yield unknown, received
        decide_from_deliveries(unknown, received, **notes)
