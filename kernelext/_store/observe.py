"""Observers of what the store writes: every hot-path record (after it is checked and
scrubbed) and every run transition pass through here. Nothing is observed, and nothing
costs more than one empty-list test, until someone subscribes (``kernelext.otel``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["OBSERVERS", "failures", "notify", "subscribe", "unsubscribe"]

Observer = Callable[[str, dict[str, Any]], None]
OBSERVERS: list[Observer] = []
_failures = [0]


def subscribe(observer: Observer) -> None:
    if observer not in OBSERVERS:
        OBSERVERS.append(observer)


def unsubscribe(observer: Observer) -> None:
    if observer in OBSERVERS:
        OBSERVERS.remove(observer)


def failures() -> int:
    """How many observer calls raised (each swallowed: an observer never breaks a write)."""
    return _failures[0]


def notify(kind: str, data: dict[str, Any]) -> None:
    for observer in list(OBSERVERS):
        try:
            observer(kind, data)
        except Exception:
            _failures[0] += 1
