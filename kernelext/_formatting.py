"""How durations, times and steps read, wherever a person reads them.

One style for every surface (the panel, the resume plan, the approvals card, the timeline
and its axis, the command line, messages and status texts):

- a duration: ``<1 ms``, ``250 ms``, ``0.4 s``, ``4.2 s``, ``42 s``, ``3 min 5 s``,
  ``2 h 5 min``, ``6 d 23 h`` (two units at most, a zero tail left out);
- a wall-clock time: ``2026-12-06 12:00:05 UTC``, in the reader's zone with the zone
  named (``13:00:05 CET`` where TZ says Paris; the store keeps UTC); ``precise`` adds
  milliseconds where steps are told apart by them;
- a step: people count from 1, so the step stored with ordinal 0 reads ``step 1``, and
  by what ran (a cell, an item), not by attempt (``step_numbers``),
  ``step 3 of 12`` when the total is known, ``step 3 (fetch-page)`` when its key says
  more than its number. Keys are shown as they are;
- a count: ``1 item``, ``12 items``; a pace: ``35 items/s``, ``2.5 items/s``, ``40 items/min``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from typing import Any

from ._shown import shown

# The step key of effects made outside any step (never shown to a person; the core's
# kernelext._core.encoding.names re-exports it, and this leaf module is where it is defined).
OUTSIDE_STEPS = "__run__"

__all__ = [
    "cell_title",
    "counted",
    "duration_text",
    "moment_text",
    "name_cell",
    "rate_text",
    "reason_text",
    "step_label",
    "step_number",
    "step_numbers",
    "zone_text",
]

_UNITS = ((86400, "d", 3600, "h"), (3600, "h", 60, "min"))


def duration_text(seconds: float | dt.timedelta) -> str:
    """``<1 ms``, ``250 ms``, ``0.4 s``, ``4.2 s``, ``42 s``, ``3 min 20 s``, ``2 h 5 min``,
    ``1 d 3 h`` (a zero tail left out). Under a minute it is rounded; from a minute on,
    the smaller unit is cut, not rounded (``6 d 23 h`` for a week less a second). A negative
    duration reads as its size: the caller says "overdue by" or "ago"."""
    if isinstance(seconds, dt.timedelta):
        seconds = seconds.total_seconds()
    s = abs(float(seconds))
    if s < 0.9995:
        return f"{s * 1000:.0f} ms" if s >= 0.0005 else ("0 s" if s == 0 else "<1 ms")
    if s < 9.95:
        return f"{s:.1f} s"
    if s < 59.5:
        return f"{s:.0f} s"
    whole = max(int(s + 1e-6), 60)  # whole seconds, cut (not rounded): time left never grows
    for size, unit, sub_size, sub in _UNITS:
        if whole >= size:
            rest = whole % size // sub_size
            return f"{whole // size} {unit}" + (f" {rest} {sub}" if rest else "")
    return f"{whole // 60} min" + (f" {whole % 60} s" if whole % 60 else "")


def moment_text(moment: dt.datetime, *, precise: bool = False) -> str:
    """``2026-12-06 12:00:05 UTC``, ``2026-12-06 13:00:05 CET``: in the reader's zone (this
    process's local zone, ``TZ``), always with the zone named (``precise``: with
    milliseconds, ``12:00:05.250 UTC``).

    ``moment`` is a store time (naive UTC); an aware time is read as the instant it names."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.timezone.utc)
    local = moment.astimezone()  # the local zone as it is now (a changed TZ is followed)
    millis = f".{local.microsecond // 1000:03d}" if precise else ""
    return f"{local:%Y-%m-%d %H:%M:%S}{millis} {zone_text(local)}"


def zone_text(moment: dt.datetime) -> str:
    """The zone an aware time is shown in: its abbreviation (``UTC``, ``CET``, ``EDT``), or
    its offset (``UTC+05:30``) where the zone has no letters for it."""
    name = moment.tzname() or ""
    if name.isalpha():
        return name
    offset = moment.utcoffset() or dt.timedelta(0)
    minutes = int(offset.total_seconds() // 60)
    sign = "+" if minutes >= 0 else "-"
    return f"UTC{sign}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"


def step_number(ordinal: int) -> int:
    """The number a person reads for the step stored with ``ordinal`` (counted from 0)."""
    return ordinal + 1


def step_numbers(steps: Iterable[Mapping[str, Any]]) -> dict[int, int]:
    """Stored ordinal -> the ordinal a person counts, for a run's ``steps`` rows (``ordinal``,
    ``key``): steps are counted by what they run (a cell, an item: their key), never by
    attempt, so a cell run three times is one step, and the cell after it is the next.
    Pass the result's values to :func:`step_label` / :func:`step_number` as ordinals."""
    numbers: dict[str, int] = {}
    shown: dict[int, int] = {}
    for row in sorted(steps, key=lambda row: int(row["ordinal"])):
        key = str(row["key"])
        shown[int(row["ordinal"])] = numbers.setdefault(key, len(numbers))
    return shown


def step_label(ordinal: int | None, key: str | None = None, total: int | None = None) -> str:
    """``step 3``, ``step 3 of 12``, ``step 3 (fetch-page)``: the step stored with ordinal
    2; its key is shown (through the display door) unless it is only the ordinal or the
    number again."""
    if ordinal is None:
        if key == OUTSIDE_STEPS:  # an effect made outside steps: no step to name
            return "outside steps"
        return shown(f"step {key!r}") if key is not None else "no step"
    number = step_number(ordinal)
    text = f"step {number}" + (f" of {total}" if total else "")
    if key is None or key in (str(ordinal), str(number)):
        return text
    return f"{text} ({shown(cell_title(key) or key)})"


# A %%agent cell's step key is its notebook cell id (``cell:<id>``) or a hash of its source
# (``src:<hash>``); people know the cell by its first line. This process's magic tells
# them here (``name_cell``); another process shows the key's first eight characters.
_CELL_KEYS = ("cell:", "src:")
_CELL_TITLES: dict[str, str] = {}
TITLE_CHARS = 40


def name_cell(key: str, source: str) -> None:
    """Remember the first line of the ``%%agent`` cell whose step key is ``key``."""
    if not key.startswith(_CELL_KEYS):
        return  # --step NAME: the name says it
    first = next((line.strip() for line in source.splitlines() if line.strip()), "")
    first = first.lstrip("#").strip() or "an empty cell"
    if len(first) > TITLE_CHARS:
        first = first[: TITLE_CHARS - 1].rstrip() + "…"
    _CELL_TITLES[key] = first


def cell_title(key: str) -> str | None:
    """``cell "fetch(url)"``, or ``cell be474f7e`` for a cell this process never ran; None
    for a key that is not a cell's."""
    for prefix in _CELL_KEYS:
        if key.startswith(prefix):
            title = _CELL_TITLES.get(key)
            return f'cell "{title}"' if title else f"cell {key[len(prefix) :][:8]}"
    return None


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """``1 item``, ``12 items``, ``0 items`` (``plural`` when it is not ``noun + "s"``)."""
    return f"{count} {noun if count == 1 else (plural or noun + 's')}"


def rate_text(per_second: float, noun: str = "item") -> str:
    """``35 items/s``, ``2.5 items/s``, ``1 item/s``, ``40 items/min`` (under one a second),
    ``<1 item/min``."""
    if per_second >= 0.995:
        number = f"{per_second:.0f}" if per_second >= 9.95 else f"{per_second:.1f}"
        unit = "s"
    else:
        number, unit = f"{per_second * 60:.0f}", "min"
        if per_second * 60 < 0.995:
            return f"<1 {noun}/min"
    number = number.removesuffix(".0")
    return f"{number} {noun if number == '1' else noun + 's'}/{unit}"


# Why a run waits, as a person reads it (``kernelext.status.Reason`` values), and who stopped it.
_REASONS = {
    "user_stop": "stopped by you",
    "approval": "waiting for an approval",
    "input": "waiting for an answer",
    "decision": "waiting for a decision",
    "rate_limit": "paused by a rate limit",
    "error": "stopped by an error",
    "restart": "a restart, not started yet",
    "other": "paused",
}
_SOURCES = {
    "panel": "panel",
    "overview": "runs overview",
    "interrupt": "■",
    "cli": "terminal",
    "api": "code",
    "magic": "%agent stop",
    "widget": "notebook",
    "engine": "kernelext",
}


def reason_text(reason: str | None, source: str | None = None) -> str:
    """``stopped by you (panel)``, ``waiting for an approval``: a run's ``reason`` (and, for
    a stop, its ``stop_source``) in words; an unknown reason is shown as it is."""
    if not reason:
        return "stopped"
    words = _REASONS.get(str(reason), str(reason))
    if reason == "user_stop" and source:
        words += f" ({_SOURCES.get(str(source), str(source))})"
    return words
