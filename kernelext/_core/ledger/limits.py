"""``kx.limit``: named limits on effect calls, shared by every run in the process.

``kx.limit("crm", rate="50/s", concurrency=8)`` declares the limit ``crm``;
``@kx.effect(limit="crm")`` and ``kx.openai(client, limit="crm")`` make each call wait for
a slot of it. Its invariants:

1. **A rate is a sliding window, never exceeded, by when calls are sent.** ``rate="50/s"``
   lets at most 50 calls be sent in any one-second window of this process (any window,
   not calendar seconds). A call takes its rate slot before its intent is written and is
   stamped when it is sent, after the intent is durable (``sent``): a slot taken and not
   sent yet counts as in every window, so the time the intent takes to become durable
   (an fsync, a commit: it varies) never lets more through. ``concurrency=8``: at most 8
   calls of the limit in flight at once, from their slot to their outcome (retries of a
   call keep its place, and each retry takes a rate slot of its own: it is another
   request).
2. **A call waiting for its slot has not started.** The slot is taken before the call's
   intent is written, and only for a call that will be made (a replay of an applied call
   waits for nothing). A stop (a forced one too) lands while a call waits: it raises
   there, nothing of the call is recorded (no intent, no call ordinal spent), and a resume
   makes the call under the same key.
3. **Slots are kernelext's bookkeeping.** Taking one runs inside the run's ``ForceGate``
   critical section; it is given back whatever happens to the call (``Slot.release``).
4. **One limit a name, per process.** Declaring a name again changes that limit in place
   (a notebook cell run twice): the calls in flight and those of the current window go on
   counting. A name no limit was declared under is refused when a call is made, before
   anything is recorded, with the declared names it may have meant.
5. **A limit counts the calls of one process, so an item on a worker is refused one.**
   ``run.map(executor=...)`` runs items in other processes, each with limits of its own:
   ``rate="50/s"`` there would let 50/s through per worker. Such a call raises
   ``KernelextError`` before anything is recorded, with the reason and what to do instead.

``pyrate-limiter`` (its in-memory sliding-window log, tried first) and ``limits`` (its
moving window, read) both count a call when its slot is taken; here the intent's
durability comes between the slot and the request, and its time varies, so with the
former the server saw 16 to 18 requests in one second under ``rate="10/s"`` (a batch of
16 at once). Counting a call from
when it is sent, with the slots taken but not sent counted in every window, needs the
reservation below, which neither offers; ``limits``' memory storage also reads the wall
clock. The window is a deque of monotonic send times, at most ``count`` long.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import re
import threading
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from ..._did_you_mean import did_you_mean
from ..._shown import shows
from ..._validate import check_name
from ...errors import ForcedStop, KernelextError
from ...status import EffectStatus
from ..encoding.keys import effect_key
from ..process.runtime import runtime

if TYPE_CHECKING:
    from ..engine.run_engine import RunEngine

__all__ = [
    "HELD",
    "TICK",
    "Limit",
    "Slot",
    "call_limited",
    "call_limited_async",
    "limit",
    "limit_named",
    "parse_rate",
    "rate_slot",
    "sent",
    "take",
]

T = TypeVar("T")

TICK = 0.05  # the longest a waiting call sleeps before it looks for a stop again
PERIODS = {  # the periods a rate may name, in seconds
    "s": 1, "sec": 1, "second": 1,
    "min": 60, "minute": 60,
    "h": 3600, "hour": 3600,
    "d": 86400, "day": 86400,
}  # fmt: skip
_RATE = re.compile(r"^\s*(\d+)\s*/\s*([a-z]+)\s*$")
_EXAMPLE = 'like "50/s" or "3000/min" (calls per s, min, h or day)'


def parse_rate(where: str, rate: object) -> tuple[int, int]:
    """``"50/s"`` -> ``(50, 1000)``: calls, and the window in milliseconds."""
    if not isinstance(rate, str):
        raise TypeError(
            f"{where} takes the calls allowed per period as text, {_EXAMPLE}, not "
            f"{type(rate).__name__} {rate!r}."
        )
    match = _RATE.match(rate.lower())
    if match is None or match[2] not in PERIODS:
        raise ValueError(f"{where}: {rate!r} is not a rate. Give one {_EXAMPLE}.")
    count = int(match[1])
    if count < 1:
        raise ValueError(
            f"{where}: {rate!r} allows no call at all. Give at least 1 call per period, {_EXAMPLE}."
        )
    return count, PERIODS[match[2]] * 1000


def _check_concurrency(where: str, concurrency: object) -> int | None:
    if concurrency is None:
        return None
    if isinstance(concurrency, bool) or not isinstance(concurrency, int):
        raise TypeError(
            f"{where} takes a whole number of calls in flight at once (>= 1), or None, not "
            f"{type(concurrency).__name__} {concurrency!r}."
        )
    if concurrency < 1:
        raise ValueError(
            f"{where.replace('...', str(concurrency))} would let no call through: give a "
            "whole number >= 1 "
            "(1 makes the calls one at a time), or leave it out for no bound."
        )
    return concurrency


class Limit:
    """A named limit of this process (what ``kx.limit`` returns): how many calls may be
    sent in a window (``rate``) and how many may be in flight at once (``concurrency``)."""

    def __init__(self, name: str, rate: str | None, concurrency: int | None) -> None:
        self.name = name
        self._cond = threading.Condition()
        self.in_flight = 0
        self._sent: collections.deque[float] = collections.deque()  # monotonic, in order
        self._reserved = 0  # rate slots taken, their calls not sent yet
        self.rate: str | None = None
        self.concurrency: int | None = None
        self._window: tuple[int, float] | None = None
        self.configure(rate, concurrency)

    def configure(self, rate: str | None, concurrency: int | None) -> None:
        """Set the rate and the concurrency (checked before); the calls sent in the current
        window and those in flight go on counting."""
        window = parse_rate("kx.limit(rate=...)", rate) if rate is not None else None
        with self._cond:
            self._window = (window[0], window[1] / 1000) if window is not None else None
            self.rate = rate.strip() if rate is not None else None
            self.concurrency = concurrency
            self._cond.notify_all()

    def try_take(self, slot: Slot, *, first: bool = True) -> float | None:
        """Take a slot now if there is one: ``None`` when taken (``slot`` holds it), else
        the seconds to wait before trying again. ``first``: the call's first attempt, which
        also takes its place among the calls in flight (a retry keeps that place and takes
        a rate slot only)."""
        with self._cond:
            full = self.concurrency is not None and self.in_flight >= self.concurrency
            if first and full:
                return TICK  # until a call in flight ends (it notifies)
            if self._window is not None and not slot.reserved:
                count, seconds = self._window
                now = time.monotonic()
                sent = self._sent
                while sent and sent[0] <= now - seconds:
                    sent.popleft()  # out of every window from now on
                over = len(sent) + self._reserved - count
                if over >= 0:
                    if over >= len(sent):  # slots taken, calls not sent yet: soon
                        return TICK
                    return max(sent[over] + seconds - now, 0.0) + 0.001
                self._reserved += 1
                slot.reserved = True
            if first and slot.limit is None:
                self.in_flight += 1
            slot.limit = self
            return None

    def stamp(self, slot: Slot) -> None:
        """The call of ``slot`` is sent now: from here its rate slot counts in the window
        (invariant 1: a window counts calls by when they were sent)."""
        with self._cond:
            if slot.reserved:
                slot.reserved = False
                self._reserved -= 1
                self._sent.append(time.monotonic())

    def give_back(self, slot: Slot) -> None:
        """The call of ``slot`` ended: its place in flight is free. A rate slot never
        stamped counts as sent now (a call may have gone out by a path that did not say
        so: counting it errs on the safe side)."""
        with self._cond:
            if slot.reserved:
                slot.reserved = False
                self._reserved -= 1
                self._sent.append(time.monotonic())
            if slot.limit is self:
                slot.limit = None
                self.in_flight -= 1
            self._cond.notify_all()

    def pause(self, seconds: float) -> None:
        """Sleep up to ``seconds`` (at most ``TICK``), woken early when a call ends."""
        with self._cond:
            self._cond.wait(min(seconds, TICK))

    @shows
    def __repr__(self) -> str:
        parts = [self.rate] if self.rate else []
        if self.concurrency is not None:
            parts.append(f"at most {self.concurrency} at once")
        return f"<kx.limit {self.name!r}: {', '.join(parts)}; {self.in_flight} in flight>"


def limit(name: str, *, rate: str | None = None, concurrency: int | None = None) -> Limit:
    """Declare the named limit ``name`` for this process: ``kx.limit("crm", rate="50/s")``.

    ``rate``: calls allowed per period, ``"50/s"``, ``"3000/min"``, ``"10000/h"`` or
    ``"100000/day"``: never more in any window of that length (a sliding window). Each
    attempt of a call counts.
    ``concurrency``: at most this many calls of the limit in flight at once.

    ``@kx.effect(limit="crm")`` and ``kx.openai(client, limit="crm")`` make each call wait
    for a slot: every run of the process (and calls outside runs) share it. A call waiting
    for its slot has not started: a stop lands there at once, with nothing of the call
    recorded, and the resume makes it. Replays of recorded calls wait for nothing.

    Declaring a name again changes that limit in place (a cell run twice): calls in flight
    and the calls of the current window go on counting. Returns the limit; its repr says
    what it allows and how many calls are in flight.
    """
    check_name("kx.limit(name=...)", name)
    if rate is not None:
        parse_rate("kx.limit(rate=...)", rate)
    checked = _check_concurrency("kx.limit(concurrency=...)", concurrency)
    if rate is None and checked is None:
        raise ValueError(
            f"kx.limit({name!r}) limits nothing: give rate= (calls per period, {_EXAMPLE}) "
            "or concurrency= (calls in flight at once), or both."
        )
    rt = runtime()
    with rt.lock:
        found = rt.limits.get(name)
        if not isinstance(found, Limit):  # None: the runtime holds only Limits
            found = rt.limits[name] = Limit(name, rate, checked)
            return found
    found.configure(rate, checked)
    return found


def _counted_here(run: RunEngine | None, name: str, where: str) -> None:
    """Refuse a limit for a call of an item on another process (see invariant 5)."""
    if run is None or run.one_process:
        return
    raise KernelextError(
        f"{where}: kx.limit {name!r} counts the calls of one process, and this call runs "
        f"in a worker of run.map(executor=...) of run {run.id!r}: each worker would count "
        "alone, letting the rate through once per worker. Nothing was recorded for this "
        "call. Bound the workers' calls by the batch instead (run.map(concurrency=...), "
        "the cluster's number of workers), or make limited calls in the notebook's process "
        "(run.map without executor=)."
    )


def limit_named(name: str, where: str) -> Limit:
    """The limit declared as ``name``; else a ``ValueError`` that names the declared ones."""
    rt = runtime()
    with rt.lock:
        found = rt.limits.get(name)
        names = sorted(rt.limits)
    if isinstance(found, Limit):  # else None: the runtime holds only Limits
        return found
    known = f" The limits declared are {', '.join(map(repr, names))}." if names else ""
    raise ValueError(
        f"{where}: no limit named {name!r} is declared in this process.{did_you_mean(name, names)}"
        f'{known} Declare it first, e.g. kx.limit({name!r}, rate="50/s"); nothing was '
        "recorded for this call."
    )


class Slot:
    """The slot one call holds: its place among the calls in flight (``limit``) and a rate
    slot not yet stamped as sent (``reserved``); given back once, when the call ends."""

    __slots__ = ("limit", "reserved")

    def __init__(self) -> None:
        self.limit: Limit | None = None
        self.reserved = False

    def release(self, run: RunEngine | None) -> None:
        """Give the slot back, also when a forced stop is on its way (it then lands after,
        never in between: the counts stay right)."""
        held = self.limit
        if held is None:
            return
        if run is None:
            held.give_back(self)
            return
        try:
            with run.force.critical():
                held.give_back(self)
        except ForcedStop:  # it landed on entering the section, before the slot was given
            held.give_back(self)
            raise


# The slot the call made in this thread (or task) holds, for ``sent`` and the retries.
HELD: contextvars.ContextVar[Slot | None] = contextvars.ContextVar(
    "kernelext_limit_slot", default=None
)


def sent() -> None:
    """The call holding a slot is sent now (called just before each attempt is made)."""
    slot = HELD.get()
    if slot is not None and slot.limit is not None:
        slot.limit.stamp(slot)


def will_make_call(run: RunEngine, tool: str) -> bool:
    """Whether the next call of ``tool`` in ``run`` will be made now (not replayed): the
    slot is taken only for such a call."""
    step_key, ordinal = run.peek_call(tool)
    row = run.effects.get(effect_key(run.id, step_key, tool, ordinal, run.key_scheme))
    if row is None:
        return True
    status = row.get("status")
    if status == EffectStatus.APPLIED:
        return row.get("result") is None  # decided applied without its answer: asked again
    return status in (EffectStatus.NOT_APPLIED, EffectStatus.FAILED)


def _try(run: RunEngine | None, found: Limit, slot: Slot, first: bool) -> float | None:
    if run is None:
        return found.try_take(slot, first=first)
    run.safe_point()  # a stop lands here, before the call started
    with run.force.critical():
        return found.try_take(slot, first=first)


def take(run: RunEngine | None, found: Limit, slot: Slot, *, first: bool = True) -> None:
    """Wait for a slot of ``found`` (``first``: with a place among the calls in flight).
    Inside a run a stop lands while waiting (``StopRequested``; a forced one too)."""
    while (wait := _try(run, found, slot, first)) is not None:
        found.pause(wait)


async def take_async(run: RunEngine | None, found: Limit, slot: Slot) -> None:
    """``take`` for a coroutine: the loop goes on with other tasks while this one waits."""
    while (wait := _try(run, found, slot, True)) is not None:
        await asyncio.sleep(min(wait, TICK))


def call_limited(
    run: RunEngine | None, name: str, tool: str, call: Callable[[], T], where: str
) -> T:
    """``call()`` once it has a slot of the limit ``name`` (if it will be made now), the
    slot given back when it returns or raises. Outside a run the call is sent at once;
    inside one, when the ledger makes it (``sent``), after its intent is durable."""
    _counted_here(run, name, where)
    found = limit_named(name, where)
    slot = Slot()
    token = HELD.set(slot)
    try:
        if run is None or will_make_call(run, tool):
            take(run, found, slot)
        if run is None:
            found.stamp(slot)
        return call()
    finally:
        HELD.reset(token)
        slot.release(run)


async def call_limited_async(
    run: RunEngine | None, name: str, tool: str, call: Callable[[], Awaitable[T]], where: str
) -> T:
    """``call_limited`` for a call awaited: the slot is held until the answer came."""
    _counted_here(run, name, where)
    found = limit_named(name, where)
    slot = Slot()
    token = HELD.set(slot)
    try:
        if run is None or will_make_call(run, tool):
            await take_async(run, found, slot)
        if run is None:
            found.stamp(slot)
        return await call()
    finally:
        HELD.reset(token)
        slot.release(run)


def rate_slot(run: RunEngine | None) -> None:
    """Wait for a rate slot for the next attempt of the call holding a slot (a retry: it
    keeps its place in flight)."""
    slot = HELD.get()
    if slot is not None and slot.limit is not None:
        take(run, slot.limit, slot, first=False)
