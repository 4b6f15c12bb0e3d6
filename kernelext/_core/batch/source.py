"""Where a batch's items come from: read up front (a list) or as they are dispatched (a
generator or any other iterator), keyed and checked as they are read.

- **A collection** (list, tuple, range, dict keys, a DataFrame's rows as a list …) is read
  whole when ``run.map`` is called: every key is computed and checked before any item runs
  (duplicates are refused, nothing ran), and the values of items completed before (a
  resume) are loaded at once.
- **An iterator** (a generator, ``map(...)``, a file, ``iter(...)``) is read as items are
  dispatched: one item more each time a slot frees up, never the whole of it first, so a
  huge or endless generator starts at once and a stop, a forced stop or a wait for a person
  lands at the next item it yields (a generator slow between two yields is not cut short
  inside its own code). Each key is checked as it appears: a duplicate found late ends the
  batch with a ``ValueError`` naming both positions once the items in flight finished; the
  items before it ran once, nothing after it started.
- **On resume** the agent runs again, and with it the code that makes the generator:
  ``run.map`` reads it again from its start, returns the stored values of the items whose
  key completed and runs the rest. So it must give the same items in the same order (the
  default key is an item's position), or pass ``key=``. A generator already read to its end
  is refused (it would give no item), and so is one partly read before when a resume finds
  its positional keys completed (its items would take the stored values of others).
"""

from __future__ import annotations

import collections
import inspect
from collections.abc import Callable, Collection, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from ...errors import KernelextError
from ..encoding.keys import load_result
from ..encoding.names import OUTSIDE_STEPS, check_stored_name, step_key_of

if TYPE_CHECKING:
    from ..engine.run_engine import RunEngine
    from .core import Batch

__all__ = ["LOAD_CHUNK", "ItemSource"]

LOAD_CHUNK = 256  # items completed before (a resume) whose values are read in one query


class ItemSource:
    """The items of one batch, read whole (``read_all``) or one at a time (``next_todo``)."""

    def __init__(
        self,
        engine: RunEngine,
        where: str,
        items: Iterable[Any],
        key: Callable[[Any], Any] | None,
        batch: Batch,
    ) -> None:
        self.engine, self.where, self.key, self.batch = engine, where, key, batch
        self.lazy = not isinstance(items, Collection)
        # a generator partly read before: with positional keys, a resume would pair the
        # items with the keys of others (refused in _check_key)
        self._partly_read = False
        if self.lazy:
            self._partly_read = _check_readable(where, items)
        self._items: Iterator[Any] = iter(items)
        self.values: list[Any] = []
        self.keys: list[str] = []
        self.results: list[Any] = []
        self._first: dict[str, int] = {}
        self._todo: collections.deque[int] = collections.deque()  # read, not yet handed out
        self._loads: list[int] = []  # completed before: their stored values, to read
        self.handed = 0  # items handed to the dispatcher
        self.exhausted = False
        self.error: BaseException | None = None  # the iterator or a key raised it

    # -- reading -----------------------------------------------------------------------------
    def read_all(self, may_go: Callable[[], bool] | None = None) -> list[int]:
        """Read every item (a collection, or an iterator an executor needs whole); the
        indices still to run. ``may_go``: read on while it allows (a stop ends the read)."""
        while not self.exhausted and self.error is None:
            if may_go is not None:
                if not may_go():
                    break
                self.engine.poll_external_stop()
            self._read_one()
        self._flush()
        if self.error is not None:
            raise self.error
        if not self.lazy:
            self.engine._seen.update(self.keys)
        return list(self._todo)

    def next_todo(self, may_go: Callable[[], bool]) -> int | None:
        """The next item to start (its index), reading on as needed; None: none now (the
        items are all read, one was refused, or ``may_go`` says stop)."""
        while not self._todo and not self.exhausted and self.error is None:
            if not may_go():
                break
            self.engine.poll_external_stop()  # (at most every STOP_POLL_SECONDS)
            self._read_one()
            if len(self._loads) >= LOAD_CHUNK:
                self._flush()
        self._flush()
        if not self._todo or not may_go():
            return None
        self.handed += 1
        return self._todo.popleft()

    def _read_one(self) -> None:
        try:
            value = next(self._items)
        except StopIteration:
            self.exhausted = True
            self.batch.reading = False
            return
        except Exception as exc:  # the generator itself raised: the batch ends with it
            self.error = exc
            return
        index = len(self.values)
        try:
            k = step_key_of(self.key(value), self.where) if self.key is not None else str(index)
            self._check_key(index, k)
        except Exception as exc:
            self.error = exc
            return
        self.values.append(value)
        self.keys.append(k)
        self.results.append(None)
        if self.lazy:  # (a collection's keys: once all of them passed, in read_all)
            self.engine._seen.add(k)
        with self.batch.lock:
            self.batch.total = len(self.values)
        if k in self.engine.completed:
            self._loads.append(index)
        else:
            self._todo.append(index)

    def _flush(self) -> None:
        """Read the stored values of the items completed before (one query per chunk)."""
        if not self._loads:
            return
        loads, self._loads = self._loads, []
        engine = self.engine
        stored = engine.store.item_results(engine.id, [self.keys[i] for i in loads])
        for i in loads:
            text = stored.get(self.keys[i])
            if text is None:
                self.error = KernelextError(
                    f"Step {self.keys[i]!r} of run {engine.id!r} completed before without a "
                    f"stored value (a run.steps or run.step step with this key?), so "
                    f"{self.where} cannot return it. Give {self.where} keys of its own (key=...)."
                )
                return
            self.results[i] = load_result(text)
        with self.batch.lock:
            self.batch.done += len(loads)
            self.batch.done_before += len(loads)

    # -- what the dispatcher asks ------------------------------------------------------------
    def may_have_todo(self) -> bool:
        return bool(self._todo) or (not self.exhausted and self.error is None)

    def pool_size(self, concurrency: int) -> int:
        return min(concurrency, len(self._todo)) if self.exhausted else concurrency

    def unfinished(self, ended: int) -> bool:
        """Whether items are left for a resume: not read yet, read but not started, or
        handed out and not ended (a stop came as they were)."""
        return bool(self._todo) or not self.exhausted or ended < self.handed

    # -- keys --------------------------------------------------------------------------------
    def _check_key(self, index: int, k: str) -> None:
        where = self.where
        given = self.key is not None
        hint = (
            f"Give {where}(key=...) a function that returns a short printable text (or int) "
            "unique to each item."
        )
        before = (
            "The items before it ran once; nothing after it started (of a generator, "
            "the items are read as they run). "
            if self.lazy
            else "Nothing ran. "
        )
        check_stored_name(k, "step key", hint=hint)
        if self._partly_read and not given and k in self.engine.completed:
            # a resume, and the generator does not start at the start: positions are off
            raise ValueError(_readable_text(where, "partly read") + " Nothing ran from it.")
        if k == OUTSIDE_STEPS:
            raise ValueError(
                f"{where}: the key of item {index} is {k!r}, the key kernelext gives effects "
                "called outside any step: an item with it would have its calls keyed like "
                f"those. {before}Use another key. " + hint
            )
        if k in self._first:
            raise ValueError(
                f"{where}: items {self._first[k]} and {index} have the same key {k!r}. Each "
                f"item is one step of the run and its key must be unique. {before}" + hint
            )
        self._first[k] = index
        if k in self.engine._seen:
            raise ValueError(
                f"{where}: the key {k!r} of item {index} is the key of a step this run already "
                f"went through (step keys are unique within a run). {before}"
                + (hint if given else "Pass key=... (the default key is the item's position).")
            )


def _readable_text(where: str, what: str) -> str:
    return (
        f"{where}(items=...) got a generator that was already {what}: {where} reads the "
        "items of a generator as they run, and again from its start on resume (the items "
        "of completed keys give their stored values). Make the generator inside the agent "
        f"({where}(fn, pages()), not a generator made before), pass key=... (a key of the "
        "item's own, not its position), or pass a list."
    )


def _check_readable(where: str, items: Iterable[Any]) -> bool:
    """Refuse a generator read to its end (it gives no item: the batch would return
    nothing, silently); whether the generator was partly read before."""
    if not inspect.isgenerator(items):
        return False
    state = inspect.getgeneratorstate(items)
    if state == inspect.GEN_CLOSED:
        raise ValueError(_readable_text(where, "read to its end") + " Nothing ran.")
    return state != inspect.GEN_CREATED
