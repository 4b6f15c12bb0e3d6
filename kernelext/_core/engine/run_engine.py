"""The engine side of a run: its steps, its state, and the safe points between them.

The agent gets the façade (``kernelext._core.lifecycle.run.Run``, ``kx.Run``); everything kernelext
itself needs of a run lives here, in ``RunEngine``: the store, the ledger rows loaded for
it, the open step, the stop flag, the listeners (the panel). The ledger, the worker, the
adapters and the widgets all work with the engine (``current_run()`` is the engine too);
``engine_of(run)`` gets it from the façade, ``engine.facade`` the other way round. A
forced stop is the ``ForceGate``'s (``forced_stop``); skipping a completed
``with run.step(...)`` block is ``step_skip``'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterable
from typing import Any, NoReturn

from ..._store import Store
from ..._store.runs import KEY_SCHEME
from ..._store.steps import StagedPayload
from ...errors import ForcedStop, KernelextError, NeedsDecision, StopRequested
from ...status import StepStatus
from ..encoding.names import OUTSIDE_STEPS, check_stored_name
from .forced_stop import ForceGate
from .snapshot import Snapshotter
from .step_info import RunningBatch, StepInfo, current_item

__all__ = ["OUTSIDE_STEPS", "STOP_POLL_SECONDS", "RunEngine", "StepInfo", "StopFlag", "chain_roots"]

STOP_POLL_SECONDS = 0.1  # how often a safe point looks for a stop recorded by another process


class StopFlag(threading.Event):
    """The run's stop flag. ``delivered`` remembers the stop kernelext raised into the agent
    (``StopRequested`` or ``ForcedStop``) so that it is raised again at every later safe
    point and effect call if the agent's code swallows it; clearing the flag forgets it."""

    def __init__(self) -> None:
        super().__init__()
        self.delivered: type[StopRequested] | None = None
        self.swallowed_noted: set[str] = set()  # events already recorded for this stop

    def clear(self) -> None:
        self.delivered = None
        self.swallowed_noted = set()
        super().clear()


# run -> the first run of its restart chain (the idempotency keys handed to tools derive
# from it: ``ledger.idempotency_key_for``); set where a run starts or is resumed.
chain_roots: weakref.WeakKeyDictionary[RunEngine, str] = weakref.WeakKeyDictionary()


class RunEngine:
    """One run as kernelext executes it; the agent sees it through ``facade``."""

    # Whether the calls made here are the calls of every process of the run: not for an
    # item on a worker of ``run.map(executor=...)`` (``kx.limit`` refuses to count there).
    one_process = True

    def __init__(
        self,
        store: Store,
        run_id: str,
        agent: str,
        *,
        max_step_seconds: float | None,
        allow_pickle: bool = False,
        total_steps: int | None = None,
        key_scheme: int | None = KEY_SCHEME,
    ) -> None:
        self.store = store
        self.id = run_id
        # How this run's effect keys and argument hashes are derived (encoding.keys):
        # a run row's key_scheme, NULL (scheme 1) for a run recorded by an earlier release.
        self.key_scheme = key_scheme or 1
        self.agent = agent
        self.max_step_seconds = max_step_seconds
        self.state: dict[str, Any] = {}
        self.total_steps = total_steps
        self.snapshotter = Snapshotter(run_id, allow_pickle=allow_pickle)
        self.completed: dict[str, int] = {}
        self.effects: dict[uuid.UUID, dict[str, Any]] = {}
        self._current: StepInfo | None = None
        self.batch: RunningBatch | None = None  # the run.map in progress (batch.Batch)
        self.loop: asyncio.AbstractEventLoop | None = None  # an async def agent's (worker)
        self.last_completed: StepInfo | None = None
        self._outside_calls = 0
        self._ordinal = 0
        self._top_ordinal: int | None = None  # highest ordinal completed or begun
        self._seen: set[str] = set()
        self.stop_event = StopFlag()
        # time.monotonic() of a safe point's last look at the store's stop flag. Only safe
        # points count: a look by the monitor that began before a request landed must not
        # let the next safe point skip its own look.
        self._stop_polled = 0.0
        self.stop_source: str | None = None
        self._force = ForceGate(self._force_landed)
        self.listeners: list[Callable[[str, Any], None]] = []
        self.suspend_request: tuple[str, Any, str | None] | None = None
        self._facade: Any = None  # the Run the agent function receives (see facade)

    @property
    def facade(self) -> Any:
        """The ``Run`` the agent function receives. ``Run(engine)`` attaches itself, right
        where kernelext makes the engine of a run it executes; an item of ``run.map`` in a
        worker process has none (its ``fn`` receives the item)."""
        if self._facade is None:
            raise RuntimeError(f"run {self.id!r} has no façade here: nothing makes a Run of it")
        return self._facade

    @facade.setter
    def facade(self, run: Any) -> None:
        self._facade = run

    @property
    def run_id(self) -> str:
        return self.id

    @property
    def epoch(self) -> int | None:
        """The ownership epoch this process holds for the run (None: it never took it
        over); its writes carry it and are refused once another process took the run."""
        return self.store.held_epoch(self.id)

    @property
    def current(self) -> StepInfo | None:
        """The step executing: inside a ``run.map`` item, that item (each item's thread or
        task sees its own); elsewhere the agent's open step."""
        item = current_item(self)
        return item if item is not None else self._current

    @current.setter
    def current(self, info: StepInfo | None) -> None:
        self._current = info

    @property
    def force(self) -> ForceGate:
        """Where a forced stop may land: inside an item, the item's own gate."""
        item = current_item(self)
        if item is not None and item.force is not None:
            return item.force
        return self._force

    @property
    def overrunning_after_force(self) -> float | None:
        """Seconds since a forced stop was raised into a step that still runs, else None."""
        return self.force.overrunning(self.current is not None)

    def notify(self, what: str, value: Any = None) -> None:
        for listener in list(self.listeners):
            try:
                listener(what, value)
            except Exception:
                continue

    # -- steps ---------------------------------------------------------------------
    def count_steps(self, items: Iterable[Any]) -> None:
        """The run's total steps, from the first ``run.steps(items)`` whose items have a
        length (steps completed before the loop, by ``run.step``, count too)."""
        if self.total_steps is not None:
            return
        try:
            total = len(items)  # type: ignore[arg-type]
        except TypeError:
            return
        total += len(self.completed)
        self.total_steps = total
        self.store.write_async(lambda tx: self.store.update_run_tx(tx, self.id, total_steps=total))
        self.notify("total", total)

    def begin_step(self, key: str, name: str | None) -> bool:
        """Open a step. Returns False when it completed before (resume)."""
        if current_item(self) is not None:
            raise KernelextError(
                f"run.steps and run.step cannot be used inside a run.map item (step {key!r}): "
                "an item is one step, and steps do not nest. Do the work in the item itself, "
                "or call run.map for the items from the agent."
            )
        if key == OUTSIDE_STEPS:
            raise ValueError(
                f"The step key {key!r} is the key kernelext gives effects called outside any "
                "step: a step with it would have its calls keyed like those. Nothing ran; "
                "use another key."
            )
        self.finish_open_step()
        check_stored_name(
            key,
            "step key",
            hint="Give run.steps(key=...) a function that returns a short printable text "
            "(or int) for each item, or run.step() such a name.",
        )
        self.safe_point()
        if key in self._seen:
            raise KernelextError(
                f"Step key {key!r} is used twice in run {self.id!r}. Step keys must be unique "
                "within a run: pass key= to run.steps() or use distinct names in run.step()."
            )
        self._seen.add(key)
        ordinal = self.claim_ordinal(key)
        if ordinal is None:
            return False
        info = StepInfo(uuid.uuid4(), key, ordinal, name)
        with self.force.critical():
            self.store.begin_step(self.id, info.id, ordinal, key, name)
            self.current = info
        self.notify("step", info)
        return True

    def claim_ordinal(self, key: str) -> int | None:
        """The ordinal of the next step (None: ``key`` completed before, a resume)."""
        ordinal = self._ordinal
        self._ordinal += 1
        if key in self.completed:
            return None
        # A new step never reuses the ordinal of a step completed before a resume (the
        # items may come in another order now): snapshots are ordered by step ordinal.
        if self._top_ordinal is None:
            self._top_ordinal = max(self.completed.values(), default=-1)
        ordinal = max(ordinal, self._top_ordinal + 1)
        self._top_ordinal = ordinal
        return ordinal

    def _stage(self, payload: bytes) -> StagedPayload | None:
        return self.store.stage_payload(self.id, payload)

    def finish_open_step(self) -> None:
        info = self._current  # never an item: items complete with their value (batch)
        if info is None or current_item(self) is not None:
            return
        with self.force.critical():
            manifest, blobs, size = self.snapshotter.take(self.state, self._stage)
            self.store.complete_step(
                self.id, info.id, info.ordinal, info.elapsed, manifest, blobs, size
            )
            self.snapshotter.committed()
            self.completed[info.key] = info.ordinal
            self.current = None
            self.last_completed = info
        self.notify(StepStatus.COMPLETED, info)

    def next_call(self, tool: str | None = None) -> tuple[str, int | None, int]:
        """The (step key, step ordinal, call ordinal) for the next effect call. ``tool`` (the
        effect's name) is not read here: a step counts all its calls; a recorded call's site
        counts them by name (``kernelext._adapters.turns.CallSite``)."""
        info = self.current
        if info is None:
            ordinal = self._outside_calls
            self._outside_calls += 1
            return OUTSIDE_STEPS, None, ordinal
        ordinal = info.calls
        info.calls += 1
        return info.key, info.ordinal, ordinal

    def peek_call(self, tool: str | None = None) -> tuple[str, int]:
        """The (step key, call ordinal) ``next_call(tool)`` would give now, without taking it."""
        info = self.current
        return (OUTSIDE_STEPS, self._outside_calls) if info is None else (info.key, info.calls)

    def note_effect(self, key: uuid.UUID, row: dict[str, Any]) -> None:
        """Keep the ledger row of a call being made (``effects``). A ``run.map`` item's rows
        are let go when it completes (``forget_item_effects``): a completed step is never
        consulted again, so a batch of 100,000 items holds only the rows of those in flight."""
        self.effects[key] = row
        item = current_item(self)
        if item is not None:
            item.effect_keys.append(key)

    def forget_item_effects(self, item: StepInfo) -> None:
        for key in item.effect_keys:
            self.effects.pop(key, None)
        self.store.forget_intents(item.effect_keys)
        item.effect_keys = []

    # -- stops: honoured at safe points, raised again when swallowed ------------------
    def safe_point(self) -> None:
        if self.force.pending:  # a forced stop the agent's code swallowed: raised again here
            self.force.check("a safe point")
        if self.id in self.store.quarantined_runs:
            raise NeedsDecision(
                f"A record of run {self.id!r} was refused by the store and quarantined; the "
                "run waits for a decision. See kx.sql('SELECT * FROM quarantine') and the "
                "run's events."
            )
        if not self.stop_event.is_set():
            self.poll_external_stop()
        if self.stop_event.is_set():
            self.enforce_stop("a safe point")  # swallowed before: raised again, and recorded
            self._deliver(StopRequested)

    def enforce_stop(self, where: str) -> None:
        """Raise again a stop that the agent's code swallowed (a bare ``except:``).

        Called at every safe point, every effect call and when the agent function returns.
        Once kernelext raised a stop into the agent, each of them raises it again, so a
        swallowed stop costs at most the rest of one step. Cheap when nothing is pending.
        """
        if self.force.pending:
            self.force.check(where)
        flag = self.stop_event
        item = current_item(self)
        if item is not None:  # a stop raised into this item and swallowed by its code
            if item.stop_delivered is not None:
                self._deliver(item.stop_delivered)
            if flag.delivered is not ForcedStop:  # drained: items in flight go on
                return
        if flag.delivered is not None and flag.is_set():
            forced = flag.delivered is ForcedStop
            self._note_swallowed("force_swallowed" if forced else "stop_swallowed", where)
            self._deliver(flag.delivered)

    def _deliver(self, kind: type[StopRequested]) -> NoReturn:
        """Raise ``kind`` into the agent, remembering it (see ``StopFlag``)."""
        flag = self.stop_event
        item = current_item(self)
        if item is not None:  # the item ends here; the others drain
            item.stop_delivered = kind
        elif flag.delivered is not ForcedStop:  # a forced stop stays forced
            flag.delivered = kind
        raise kind(self.stop_source or "stop")

    def _force_landed(self, swallowed_at: str | None) -> None:
        """The forced stop goes on up to the agent (see ``ForceGate``)."""
        if swallowed_at is not None:
            self._note_swallowed("force_swallowed", swallowed_at)
        self.stop_event.delivered = ForcedStop

    def _note_swallowed(self, kind: str, where: str) -> None:
        """One events row per stop: the agent's code caught it and went on."""
        flag = self.stop_event
        if kind in flag.swallowed_noted:
            return
        flag.swallowed_noted.add(kind)
        what = "a forced stop (ForcedStop)" if kind == "force_swallowed" else "the stop"
        reason = (
            f"the agent's code caught {what} and went on (a bare except:, except "
            f"BaseException, or a finally block calling kernelext); raised again at {where}"
        )
        info = self.current
        detail = {"step": info.key} if info is not None else None
        with self.force.critical():  # queued, never waited for; no forced stop lands in it
            with contextlib.suppress(Exception):  # a store hiccup must not hold the stop back
                self.store.record_event(
                    self.id, kind, wait=False, source="engine", reason=reason, detail=detail
                )
            self.notify(kind, where)

    def poll_external_stop(self, *, wait: bool = False) -> bool:
        """Raise the flag when another process recorded a stop in the store.

        ``kernelext stop`` or ``kx.stop`` in another kernel only writes the request into
        the store. The run's monitor thread reads it (``wait=True``, it may wait for the
        store); a safe point also looks, at most every ``STOP_POLL_SECONDS`` and only if
        the store answers at once, so safe points stay cheap. A safe point at least
        ``STOP_POLL_SECONDS`` after the previous one always looks, so a stop recorded
        before it is honoured there, within the step that was running.
        """
        now = time.monotonic()
        if not wait and now - self._stop_polled < STOP_POLL_SECONDS:
            return False
        try:
            request = self.store.stop_request(self.id, wait=wait)
        except Exception:  # a store hiccup must not break the agent; poll again later
            return False
        if request is None:  # the store was busy: try again at the next chance
            return False
        if not wait:
            self._stop_polled = now
        requested_at, source = request
        if requested_at is None or self.stop_event.is_set():
            return False
        if self.stop_source is None:
            self.stop_source = source or "external"
        self.stop_event.set()
        self.notify("stop", self.stop_source)
        return True
