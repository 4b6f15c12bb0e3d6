"""The write path against a model of its contract (ARCHITECTURE.md, "The write path").

A ``hypothesis`` state machine interleaves, on one store and one real local HTTP server
(no dedupe, so a repeated delivery shows): starting runs, running them to the end, a
stop, a forced stop, a SIGKILL of the worker process, a fold that fails because another
process holds the store file, human reconciliation of unknown effects, and reopening
the store. Every run executes in a worker process (``tests/crash/model_worker.py``):
one step per item, one ``@kx.effect`` POST per step, with the ledger's key as
``Idempotency-Key``; or, for a batch run, one ``run.map`` over the items, two or three
at once in threads, each item one step with one POST, returning the server's delivery
number. The worker reports each point of a call on stdout and can be told to wait at
one, so that the stop, the forced stop or the kill lands exactly there: between steps,
after the intent before the call, after the call before the outcome, after the effect
returned before the step completed.

In a batch the items' records interleave in one journal (item begin, intent, outcome,
``item_complete``) and their syncs are shared (group commit). A pause holds one or two
items at a chosen point while the others run on, so a kill, a stop (the items in flight
drain) or a forced stop (they are cancelled, their open calls ``unknown``) lands with
several items in flight. What the model knows of a batch item: that it began, what was
acknowledged of its effect (as above, and ``delivered``: the server answered, the tool
has not returned), and that it completed (``item_done``: its step and value are on disk,
so its outcome, written before, is too). The fold fault is left to the step-per-item
runs (its model of which records are due needs their order).

One rule, ``act``, draws the action (so that hypothesis's swarm testing does not leave a
kind of fault out of the short budget); an action whose precondition does not hold does
nothing. Lines the worker prints are also checked as they come: a completed step never
runs again, a call is made only for an item with no intent or one decided "not applied",
and a resume that must wait for a decision does (and delivers nothing).

The model knows, per run, how far it got (steps acknowledged completed: the agent
reached the next step) and, per item, what was acknowledged of its effect: nothing, its
intent (the tool was entered), that it returned, or that it is applied for good (it
returned and a later write was synced, or a person decided so). After every action:

1. no idempotency key reached the server twice;
2. nothing acknowledged is missing: each acknowledged intent, each delivery the server
   saw and each step acknowledged completed is in the tables or still in a journal file
   nobody folded yet; once no journal is left, the ledger says exactly what the model
   allows (``applied`` for what is applied, ``pending``/``unknown`` for an outcome not
   acknowledged, no row for a call never made, ``applied`` only for keys the server saw)
   and the completed steps are exactly those acknowledged (in a batch: at least those
   acknowledged, only items that began, each with its effect ``applied`` and with the
   value the server answered for it stored as its result).

At the end of each example every run is resumed to completion (unknowns decided from
the server's log, as a person would) and every item must have been delivered once; a
batch returns the server's delivery numbers of all its items, in input order.

Derandomized, without shrinking (it would replay worker processes for minutes); about a
minute and a half on two cores. KERNELEXT_MODEL_EXAMPLES / KERNELEXT_MODEL_STEPS change the budget.
"""

from __future__ import annotations

import glob
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from crash import CRASH_DIR, LINE_TIMEOUT, Worker, WorkerPool
from hypothesis import HealthCheck, Phase, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)
from support.http_server import DeliveryServer

import kernelext as kx
from kernelext._core.ledger.effect import effect_key
from kernelext._store import Store, open_store
from kernelext._store.duckdb.journal import scan_journal

pytestmark = [pytest.mark.slow, pytest.mark.crash]

MAX_OPEN_RUNS = 3  # runs not completed at one time
MAX_ITEMS = 4
MAX_BATCH_ITEMS = 6
BATCH_SHARE = 2  # one new run in this many is a batch
TOOL = "deliver_item"
POINTS = ("step", "intent", "delivered", "returned")
STORE_WAIT = 0.2  # KERNELEXT_STORE_WAIT in the workers: a held file fails folds quickly
FINISH_ATTEMPTS = 6
# The actions, each as often as it appears here: see ``WritePathModel.turn``.
ACTIONS = (
    "sigkill",
    "stop",
    "fold_failure",
    "sigkill",
    "force_stop",
    "run_to_the_end",
    "sigkill",
    "stop",
    "reconcile",
    "force_stop",
    "new_run",
    "reopen",
)
PHASES = [Phase.explicit, Phase.reuse, Phase.generate]
SETTINGS = settings(
    max_examples=int(os.environ.get("KERNELEXT_MODEL_EXAMPLES", "30")),
    stateful_step_count=int(os.environ.get("KERNELEXT_MODEL_STEPS", "12")),
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    # Shrinking replays worker processes for minutes; the failing example (at most
    # stateful_step_count rules, each with the worker's lines in its notes) reads well as
    # it is. KERNELEXT_MODEL_SHRINK=1 shrinks it.
    phases=list(Phase) if os.environ.get("KERNELEXT_MODEL_SHRINK") else PHASES,
)

# Another process holds the store file: a DuckDB client of its own (not kernelext), which
# asks for its turn the way kernelext processes do (a shared lock on `<store>.want`, see
# ARCHITECTURE.md), then keeps the file until the test kills it. (A long `kx.sql` query in
# another kernelext process holds it too, but only from the moment the query starts: the
# running agent's stop watcher wants the file every 0.1 s, so the agent may get it back in
# between, and then folds while the test believes it cannot.)
HOLDER = """
import fcntl, os, sys, time
import duckdb
path = sys.argv[1]
want = os.open(path + ".want", os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(want, fcntl.LOCK_SH)
while True:
    try:
        con = duckdb.connect(path, read_only=True)
        break
    except duckdb.IOException as exc:
        if "lock" not in str(exc).lower():
            raise
        time.sleep(0.002)
fcntl.flock(want, fcntl.LOCK_UN)
con.sql("SELECT count(*) FROM runs").fetchall()
print("holding", flush=True)
sys.stdin.read()
"""


# -- the model ------------------------------------------------------------------------------
# What is acknowledged of one item's effect, in order of knowledge:
NONE = "none"  # no intent was acknowledged: the tool was never entered
INTENT = "intent"  # the intent is durable, the outcome was not acknowledged
DELIVERED = "delivered"  # batches: the server answered, the tool has not returned yet
RETURNED = "returned"  # the effect returned to the agent; its outcome may not be synced yet
APPLIED = "applied"  # applied for good: returned and synced since, or decided so
NOT_APPLIED = "not_applied"  # decided "it did not happen"; the next resume calls again

ALLOWED = {  # ledger statuses each state allows once every journal is folded
    INTENT: {"pending", "unknown"},
    # Another item's sync may carry the outcome written after it (a kill there, unpaused).
    DELIVERED: {"applied", "pending", "unknown"},
    RETURNED: {"applied", "pending", "unknown"},
    APPLIED: {"applied"},
    NOT_APPLIED: {"not_applied"},
}


@dataclass
class RunModel:
    run_id: str
    items: int
    concurrency: int = 0  # a batch (run.map, this many at once); 0: one step per item
    created: bool = False
    done: int = 0  # steps 0 .. done-1 are acknowledged completed
    effects: list[str] = field(default_factory=list)
    statuses: frozenset[str] = frozenset()  # what the run row may say now
    began: set[int] = field(default_factory=set)  # batch items whose body began
    finished: set[int] = field(default_factory=set)  # batch items completed on disk

    def __post_init__(self) -> None:
        self.effects = [NONE] * self.items

    @property
    def completed(self) -> bool:
        if self.concurrency:
            return len(self.finished) == self.items and "completed" in self.statuses
        return self.done == self.items and "completed" in self.statuses

    def left(self) -> list[int]:
        """The items (steps) not acknowledged completed."""
        if self.concurrency:
            return [i for i in range(self.items) if i not in self.finished]
        return list(range(self.done, self.items))

    def item_finished(self, item: int) -> None:
        """Batch item ``item`` completed on disk: its outcome, written before, is too."""
        assert self.effects[item] in (RETURNED, APPLIED), (
            f"{self.run_id}: item {item} completed, its effect {self.effects[item]}"
        )
        self.finished.add(item)
        self.effects[item] = APPLIED

    def all_completed(self) -> None:
        """The run completed."""
        if self.concurrency:
            for item in range(self.items):
                if item not in self.finished:
                    self.item_finished(item)
        else:
            self.completed_steps(self.items)

    def key(self, item: int) -> str:
        return str(effect_key(self.run_id, str(item), TOOL, 0))

    def must_decide(self) -> bool:
        """A resume must stop in needs_decision: an outcome nobody knows."""
        return INTENT in self.effects

    def may_decide(self) -> bool:
        """... or may: an outcome written but not synced before the process died."""
        return self.must_decide() or any(
            e in (DELIVERED, RETURNED) and i in self.left() for i, e in enumerate(self.effects)
        )

    def completed_steps(self, done: int) -> None:
        """Steps before ``done`` completed durably: so did the outcomes written before."""
        self.done = max(self.done, done)
        for item in range(self.done):
            if self.effects[item] == RETURNED:
                self.effects[item] = APPLIED

    def points(self, item: int) -> tuple[str, ...]:
        """The points a resume passes in step ``item``: a recorded effect is replayed."""
        first = item in self.left() if self.concurrency else item == self.done
        if first and self.effects[item] in (RETURNED, APPLIED):
            return ("step", "returned")
        return POINTS

    def pausable_items(self) -> list[int]:
        """Batch items a resume surely reaches with known points (not one whose outcome a
        kill left open: whether it is replayed or waits for a decision is not known)."""
        return [i for i in self.left() if self.effects[i] in (NONE, NOT_APPLIED, RETURNED, APPLIED)]


def later(run: RunModel, first: int) -> list[tuple[int, str]]:
    """The (item, point) pairs after the start of step ``first`` where a run holding on to
    the store file has journaled something since (so a fold was due, and failed)."""
    fresh = run.points(first) == POINTS  # a replayed call appends nothing
    pairs = [(first, p) for p in POINTS[1:] if fresh]
    return pairs + [(i, p) for i in range(first + 1, run.items) for p in POINTS]


# -- the choices of one action ----------------------------------------------------------------
# Each action draws one list of numbers of a fixed length and makes its choices from it.
# Hypothesis requires a replayed prefix of choices to draw the same way again; what a batch
# did (which items completed before a kill, whether a stop found items left to start) is
# up to its threads, and choices drawn from it would differ between replays.
NUMBERS = st.lists(st.integers(0, 2**16 - 1), min_size=16, max_size=16)


class Draws:
    """Choices made from an action's numbers (0 once they run out)."""

    def __init__(self, numbers: list[int]) -> None:
        self.numbers = deque(numbers)

    def integer(self, low: int, high: int, label: str) -> int:
        value = low + (self.numbers.popleft() if self.numbers else 0) % (high - low + 1)
        note(f"{label}: {value}")
        return value

    def one_of(self, options: list[Any], label: str) -> Any:
        chosen = options[self.integer(0, len(options) - 1, f"{label} (index)")]
        note(f"{label}: {chosen}")
        return chosen


# -- one worker process running (or resuming) one run -----------------------------------------
class Attempt:
    """A worker driving one run, its stdout applied to the model as it arrives."""

    TERMINAL = ("done", "needs_decision", "completed")

    def __init__(self, machine: WritePathModel, run: RunModel, pauses: list[tuple[int, str]]):
        self.machine = machine
        self.run = run
        self.worker: Worker = machine.pool.take()
        self.deliveries_before = len(machine.server.deliveries)
        self.ready = False
        self.pauses: deque[str] = deque()
        self.terminal: str | None = None
        self.fold_failures = 0
        self.eof = False
        self.log: list[str] = []
        self.result: Any = None  # what the agent returned (from ``done``)
        self.worker.go(
            store=str(machine.store_path),
            run_id=run.run_id,
            items=run.items,
            concurrency=run.concurrency,
            url=machine.server.url,
            store_wait=STORE_WAIT,
            pauses=[list(p) for p in pauses],
        )
        machine.live.append(self)

    # -- reading -----------------------------------------------------------------------
    def _read(self, timeout: float = LINE_TIMEOUT) -> None:
        try:
            line = self.worker.lines.get(timeout=timeout)
        except queue.Empty:
            self.worker.kill()
            raise AssertionError(
                f"worker said nothing for {timeout:.0f}s; so far {self.log}\n{self.stderr()}"
            ) from None
        if line is None:
            self.eof = True
            return
        self.log.append(line)
        self.machine.observe(self.run, line)
        word = line.split(" ", 1)[0]
        if word == "ready":
            self.ready = True
        elif word == "paused":
            self.pauses.append(line)
        elif word == "fold_failed":
            self.fold_failures += 1
        elif word in self.TERMINAL:
            self.terminal = line

    def _until(self, done: Any, what: str) -> None:
        while not done():
            if self.eof:
                raise AssertionError(
                    f"worker ended while waiting for {what}; it said {self.log}\n{self.stderr()}"
                )
            self._read()

    def start(self) -> str:
        """``ready``, or the line that says nothing executes."""
        self._until(lambda: self.ready or self.terminal is not None, "ready")
        return "ready" if self.ready else str(self.terminal)

    def pause(self, item: int, point: str, *, fault: bool = True, or_end: bool = False) -> bool:
        """Wait until the run pauses there (True); with ``or_end``, it may end first (False)."""
        self._until(lambda: self.pauses or self.terminal is not None, f"pause {item} {point}")
        if not self.pauses and or_end:
            return False
        assert self.pauses, f"the run ended before pausing at {item} {point}: {self.log}"
        assert self.pauses.popleft() == f"paused {item} {point}", self.log
        if fault:  # the fault of this action comes here
            self.machine.landed[f"{self.machine.action}@{point}"] += 1
        return True

    def pause_all(self, pairs: list[tuple[int, str]]) -> None:
        """Wait until the run pauses at every one of ``pairs`` (batch items: any order)."""
        expected = {f"paused {item} {point}" for item, point in pairs}
        self._until(
            lambda: expected <= set(self.pauses) or self.terminal is not None,
            f"pauses {sorted(expected)}",
        )
        assert expected <= set(self.pauses), f"the run ended before pausing: {self.log}"
        for line in expected:
            self.pauses.remove(line)
        flight = len(self.run.began - self.run.finished)
        for _, point in pairs:
            self.machine.landed[f"batch {self.machine.action}@{point}"] += 1
        self.machine.landed[f"batch {self.machine.action}, {flight} in flight"] += 1

    def end(self) -> tuple[str, str]:
        """(status, error type) from ``done``; the worker must exit cleanly."""
        self._until(lambda: self.terminal is not None, "the end of the run")
        assert self.terminal is not None
        self.reap()
        word, status, error, result = [*self.terminal.split(" "), "", "", ""][:4]
        assert word == "done", self.log
        self.result = json.loads(result) if result else None
        return status, error

    def wait_fold_failure(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.fold_failures:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no fold failed while the file was held: {self.log}"
            assert not self.eof and self.terminal is None, self.log
            self._read(remaining)

    def send(self, *commands: str) -> None:
        stdin = self.worker.proc.stdin
        assert stdin is not None
        stdin.write("".join(c + "\n" for c in commands))
        stdin.flush()

    # -- ending --------------------------------------------------------------------------
    def kill(self) -> None:
        """SIGKILL; then read what it printed before dying."""
        assert self.worker.kill(), "the worker was not alive to kill"
        while not self.eof:
            self._read()
        self._forget()

    def reap(self) -> None:
        while not self.eof:
            self._read()
        code = self.worker.reap()
        self._forget()
        assert code == 0, f"worker exit code {code}: {self.log}\n{self.stderr()}"

    def stderr(self) -> str:
        """The end of the workers' stderr file (also once this worker was reaped)."""
        try:
            return self.worker.stderr_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def _forget(self) -> None:
        if self in self.machine.live:
            self.machine.live.remove(self)
        note(f"{self.run.run_id}: {' | '.join(self.log)}")


class Holder:
    """Another process holding the store file (see ``HOLDER``), until killed."""

    def __init__(self, store_path: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(store_path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        assert line == "holding", f"the holder said {line!r}"

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=LINE_TIMEOUT)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()


# -- the state machine ------------------------------------------------------------------------
class WritePathModel(RuleBasedStateMachine):
    pool: WorkerPool  # set by the test: one warm worker process at all times
    workdir: Path
    fold_failures = 0  # over all examples: the fold fault really happened
    actions: Counter[str]  # actions that did something
    decisions: Counter[str]  # unknown effects decided "applied" / "not_applied"
    landed: Counter[str]  # "action@point": where the run was when the fault came
    seconds: Counter[str]  # time spent per action

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="example-", dir=self.workdir))
        self.store_path = self.dir / "store" / "model.duckdb"
        self.store_path.parent.mkdir()
        self.server = DeliveryServer(log_path=self.dir / "deliveries.jsonl").start()
        assert not self.server.dedupe, "duplicates must be visible"
        self.runs: dict[str, RunModel] = {}
        self.live: list[Attempt] = []
        self.holders: list[Holder] = []
        self.busy = False  # a rule or check is under way (a failure skips the final checks)
        self.action = ""
        self.turns = 0

    # -- helpers -------------------------------------------------------------------------
    def open_runs(self) -> list[RunModel]:
        return [r for r in self.runs.values() if not r.completed]

    def pausable(self) -> list[RunModel]:
        """Open runs with a step still to run (one stopped after its last step has none)."""
        return [r for r in self.open_runs() if r.left()]

    def pick(self, data: Draws, runs: list[RunModel]) -> RunModel:
        return data.one_of(sorted(runs, key=lambda r: r.run_id), "run")

    def observe(self, run: RunModel, line: str) -> None:
        """Apply one line of the worker to the model, checking it is a possible line."""
        parts = line.split(" ")
        word = parts[0]
        if word == "ready":
            run.created = True
        if word == "item_done":
            assert run.concurrency, line
            item = int(parts[1])
            assert item in run.began, f"{run.run_id}: item {item} completed, never began"
            run.item_finished(item)
            return
        if word not in POINTS:
            return
        item = int(parts[1])
        assert 0 <= item < run.items, line
        if run.concurrency and word == "step":
            assert item not in run.finished, f"{run.run_id}: item {item} ran again after completing"
            run.created = True
            run.began.add(item)
            return
        if word == "step":
            # A completed step never runs again, and steps run in order.
            assert item >= run.done, f"{run.run_id}: step {item} ran again after completing"
            run.created = True
            run.completed_steps(item)
            return
        assert parts[2] == run.key(item), f"{run.run_id}: key of item {item} is {parts[2]}"
        state = run.effects[item]
        if word == "intent":
            # A call is made only when no outcome is known and none can be pending.
            assert state in (NONE, NOT_APPLIED), f"{run.run_id}: item {item} called again ({state})"
            run.effects[item] = INTENT
        elif word == "delivered":
            assert state == INTENT, line
            if run.concurrency:
                run.effects[item] = DELIVERED
        else:  # returned: a fresh call, or a recorded result replayed
            assert state in (INTENT, DELIVERED, RETURNED, APPLIED), f"{line}: item was {state}"
            if state in (INTENT, DELIVERED):
                run.effects[item] = RETURNED

    def attempt(self, run: RunModel, pauses: list[tuple[int, str]]) -> Attempt | None:
        """Start or resume ``run`` in a worker; None when it may not execute (and did not)."""
        must, may = run.must_decide(), run.may_decide()  # before its lines change the model
        attempt = Attempt(self, run, pauses)
        first = attempt.start()
        if first == "ready":
            assert not must, f"{run.run_id} ran past an unknown outcome"
            return attempt
        assert first.startswith("needs_decision"), f"{run.run_id}: {first}"
        assert may, f"{run.run_id} waits for a decision the model does not expect"
        attempt.reap()
        assert len(self.server.deliveries) == attempt.deliveries_before
        run.statuses = frozenset({"needs_decision"})
        return None

    def kill(self, attempt: Attempt) -> None:
        attempt.kill()
        # Bytes a dead client left in a socket are still delivered: let the server
        # handle them before anyone reads or decides against its log.
        self.server.settle()
        attempt.run.statuses = frozenset({"running"})

    def decide_first(self, run: RunModel) -> None:
        """A run seen refusing already is decided by its user before a fault is tried on
        it (another refusal adds nothing; ``run_to_the_end`` tries refusals)."""
        if run.statuses == {"needs_decision"}:
            with open_store(str(self.store_path)) as store:
                self.decide_unknowns(store, run)

    def pause_plan(self, data: Draws, run: RunModel) -> tuple[int, str]:
        self.decide_first(run)
        item = data.integer(run.done, run.items - 1, "item")
        return item, self.choose_point(data, run.points(item))

    def choose_point(self, data: Draws, points: tuple[str, ...]) -> str:
        """Where the fault lands (see ``turn``)."""
        return self.turn(data, points, "the fault comes at")

    def turn(self, data: Draws, options: tuple[str, ...], what: str) -> str:
        """An option drawn, then turned by the number of choices made so far in this example.

        Hypothesis draws the first option far more often than the others (a kill after the
        call and before its outcome would be rare); the turn makes each example go through
        every option, and stays the same when hypothesis replays the example.
        """
        drawn = data.integer(0, len(options) - 1, "turn")
        self.turns += 1
        chosen = options[(drawn + self.turns) % len(options)]
        note(f"{what}: {chosen}")
        return chosen

    def decide_unknowns(self, store: Store, run: RunModel) -> int:
        """Decide each unknown from the server's log, exactly as a person would."""
        self.server.settle()
        received = {d["idempotency_key"]: d for d in self.server.deliveries}
        unknowns = kx.reconcile(run.run_id, store=store)
        listed = {int(u.step_key) for u in unknowns}
        must = {i for i, e in enumerate(run.effects) if e == INTENT}
        assert must <= listed, f"{run.run_id}: outcomes not acknowledged but not unknown"
        for unknown in unknowns:
            item = int(unknown.step_key)
            key = str(unknown.key)
            assert key == run.key(item) and unknown.tool == TOOL
            assert run.effects[item] in (INTENT, DELIVERED, RETURNED), (
                f"{run.run_id}: item {item} is unknown in the ledger, {run.effects[item]} in fact"
            )
            delivery = received.get(key)
            if delivery is not None:
                unknown.mark_applied(
                    result={
                        "ok": True,
                        "delivery": delivery["seq"],
                        "path": delivery["path"],
                        "idempotency_key": key,
                    },
                    note=f"the server log has delivery #{delivery['seq']}",
                )
                run.effects[item] = APPLIED
                self.decisions["applied"] += 1
            else:
                unknown.mark_not_applied(note="the server never received this key")
                run.effects[item] = NOT_APPLIED
                self.decisions["not_applied"] += 1
        return len(unknowns)

    @initialize(numbers=NUMBERS)
    def first_run(self, numbers: list[int]) -> None:
        self.runs["run-0"] = self.draw_run(Draws(numbers), "run-0")

    def draw_run(self, data: Draws, run_id: str) -> RunModel:
        """A run of one step per item, or (one in ``BATCH_SHARE``) a batch."""
        if self.turn(data, ("steps",) * (BATCH_SHARE - 1) + ("batch",), "run kind") == "steps":
            return RunModel(run_id, data.integer(1, MAX_ITEMS, "items"))
        items = data.integer(3, MAX_BATCH_ITEMS, "items")
        return RunModel(run_id, items, concurrency=data.integer(2, 3, "at once"))

    # -- rules -----------------------------------------------------------------------------
    # One rule draws the action: hypothesis's own rule choice turns whole rules off per
    # example (swarm testing), which leaves some faults out of a short budget entirely.
    @rule(numbers=NUMBERS)
    def act(self, numbers: list[int]) -> None:
        data = Draws(numbers)
        self.busy = True
        self.action = action = self.turn(data, ACTIONS, "action")
        started = time.monotonic()
        if getattr(self, action)(data):
            self.actions[action] += 1
            self.seconds[action] += time.monotonic() - started
        self.busy = False

    def new_run(self, data: Draws) -> bool:
        if len(self.open_runs()) >= MAX_OPEN_RUNS:
            return False
        run_id = f"run-{len(self.runs)}"
        self.runs[run_id] = self.draw_run(data, run_id)
        return True

    def run_to_the_end(self, data: Draws) -> bool:
        if not self.open_runs():
            return False
        run = self.pick(data, self.open_runs())
        attempt = self.attempt(run, [])
        if attempt is not None:
            self.end_completed(attempt)
        return True

    def end_completed(self, attempt: Attempt) -> None:
        """The attempt runs to the end: completed; a batch returns every item's value."""
        assert attempt.end() == ("completed", "-"), attempt.log
        attempt.run.statuses = frozenset({"completed"})
        self.check_result(attempt)

    def check_result(self, attempt: Attempt) -> None:
        run = attempt.run
        run.all_completed()
        if run.concurrency:
            seqs = {d["idempotency_key"]: d["seq"] for d in self.server.deliveries}
            assert attempt.result == [seqs[run.key(i)] for i in range(run.items)], (
                f"{run.run_id}: run.map returned {attempt.result}",
                attempt.log,
            )

    def stop(self, data: Draws) -> bool:
        """Stop (the Stop button): the step under way completes, the run suspends."""
        if not self.pausable():
            return False
        run = self.pick(data, self.pausable())
        if run.concurrency:
            return self.batch_fault(data, run, "stop")
        item, point = self.pause_plan(data, run)
        attempt = self.attempt(run, [(item, point)])
        if attempt is not None:
            attempt.pause(item, point)
            attempt.send("stop", "release")
            assert attempt.end() == ("suspended", "-"), attempt.log
            assert f"step {item + 1}" not in attempt.log
            run.completed_steps(item + 1)
            run.statuses = frozenset({"suspended"})
        return True

    def force_stop(self, data: Draws) -> bool:
        """Force stop: raised into the step where it waits; an open call becomes unknown."""
        if not self.pausable():
            return False
        run = self.pick(data, self.pausable())
        if run.concurrency:
            return self.batch_fault(data, run, "force")
        item, point = self.pause_plan(data, run)
        attempt = self.attempt(run, [(item, point)])
        if attempt is not None:
            attempt.pause(item, point)
            attempt.send("force")
            assert attempt.end() == ("suspended", "-"), attempt.log
            assert run.done == item, "a forced step must not count as completed"
            run.statuses = frozenset({"suspended"})
        return True

    def sigkill(self, data: Draws) -> bool:
        """SIGKILL the worker at a chosen point of a call."""
        if not self.pausable():
            return False
        run = self.pick(data, self.pausable())
        if run.concurrency:
            return self.batch_fault(data, run, "kill")
        item, point = self.pause_plan(data, run)
        attempt = self.attempt(run, [(item, point)])
        if attempt is not None:
            attempt.pause(item, point)
            self.kill(attempt)
        return True

    def batch_fault(self, data: Draws, run: RunModel, fault: str) -> bool:
        """A kill, a stop or a forced stop on a batch, once one or two items are held at
        chosen points; the items not held run on meanwhile (they may be anywhere)."""
        self.decide_first(run)
        items = run.pausable_items()
        if not items:  # only outcomes a kill left open: resume (or refuse) as it comes
            attempt = self.attempt(run, [])
            if attempt is not None:
                self.end_completed(attempt)
            return True
        most = min(2, len(items), run.concurrency)
        held: list[int] = []
        for _ in range(data.integer(1, most, "items held")):
            held.append(data.one_of([i for i in items if i not in held], "held"))
        pairs = [(item, self.choose_point(data, run.points(item))) for item in held]
        attempt = self.attempt(run, pairs)
        if attempt is None:
            return True
        attempt.pause_all(pairs)
        if fault == "kill":
            self.kill(attempt)
        elif fault == "stop":  # no new item starts; those in flight (the held ones) drain
            attempt.send("stop", *["release"] * len(pairs))
            status, error = attempt.end()
            assert error == "-" and status in ("suspended", "completed"), attempt.log
            for item, _ in pairs:
                assert item in run.finished, f"{run.run_id}: item {item} did not drain"
            run.statuses = frozenset({status})
            if status == "completed":  # nothing was left to start
                self.check_result(attempt)
        else:  # forced: the items in flight are cancelled, their open calls unknown
            attempt.send("force")
            assert attempt.end() == ("suspended", "-"), attempt.log
            for item, _ in pairs:
                assert item not in run.finished, f"{run.run_id}: forced item {item} completed"
            run.statuses = frozenset({"suspended"})
        return True

    def fold_failure(self, data: Draws) -> bool:
        """Another process holds the store file while the run goes on: every fold fails.

        The run keeps going on its journal; then it is killed, or stopped (the end cannot
        be recorded: a clear error, ``wait()`` returns), or the file comes free again.
        """
        # A run that may refuse to start (an unknown outcome) is left to the other actions,
        # unless it was seen refusing: then it is decided first.
        candidates = [
            r
            for r in self.open_runs()
            if not r.concurrency
            and r.done < r.items
            and (r.statuses == {"needs_decision"} or not r.may_decide())
        ]
        if not candidates:
            return False
        run = self.pick(data, candidates)
        self.decide_first(run)
        if not any(later(run, i) for i in range(run.done, run.items)):
            return False  # one step left, and its call is replayed: no fold would be due
        firsts = [i for i in range(run.done, run.items) if later(run, i)]
        first = data.one_of(firsts, "held from the start of step")
        pairs = later(run, first)
        item = data.one_of(sorted({i for i, _ in pairs}), "item")
        point = self.choose_point(data, tuple(p for i, p in pairs if i == item))
        ending = self.turn(data, ("kill", "stop", "recover"), "ending")
        attempt = self.attempt(run, [(first, "step"), (item, point)])
        assert attempt is not None, "the model says this run need not wait for a decision"
        attempt.pause(first, "step", fault=False)
        holder = Holder(self.store_path)
        self.holders.append(holder)
        retry = run.effects[first] == NOT_APPLIED  # decided "did not happen": called again
        attempt.send("release")
        if not attempt.pause(item, point, or_end=retry):
            # Calling again first puts the intent back to pending by a write to the tables
            # (not the journal), which the held file refuses: the run ends cleanly, before
            # the call, with a clear error (the file is held). Its end is journaled, so the
            # error kept is that one, not a second one about recording the end.
            status, error = attempt.end()
            holder.kill()
            self.holders.remove(holder)
            assert (status, error) == ("failed", "StoreLockedError"), attempt.log
            assert run.effects[first] == NOT_APPLIED, "it was called all the same"
            run.statuses = frozenset({"running", "failed"})
            self.landed["fold_failure/retry_refused"] += 1
            return True
        attempt.wait_fold_failure()
        WritePathModel.fold_failures += 1
        self.landed[f"fold_failure/{ending}"] += 1
        if ending == "kill":
            self.kill(attempt)
            holder.kill()
        elif ending == "stop":
            attempt.send("stop", "release")
            status, error = attempt.end()  # wait() returned although nothing can be written
            holder.kill()
            if status == "suspended":
                run.statuses = frozenset({"suspended"})
            else:
                assert (status, error) == ("failed", "StoreWriteError"), attempt.log
                run.statuses = frozenset({"running", "stopping"})
            run.completed_steps(item + 1)  # its completion is in the journal
        else:
            holder.kill()
            attempt.send("release")
            assert attempt.end() == ("completed", "-"), attempt.log
            run.statuses = frozenset({"completed"})
            run.completed_steps(run.items)
        self.holders.remove(holder)
        return True

    def reconcile(self, data: Draws) -> bool:
        """A person decides the unknown effects of a run that waits for a decision."""
        waiting = [r for r in self.runs.values() if r.statuses == {"needs_decision"}]
        if not waiting:
            return False
        run = self.pick(data, waiting)
        with open_store(str(self.store_path)) as store:
            self.decide_unknowns(store, run)
        return True

    def reopen(self, data: Draws) -> bool:
        """Open the store as anyone would: the journals of dead processes are folded."""
        if not self.journals():
            return False
        with open_store(str(self.store_path)) as store:
            store.flush()
        assert not self.journals(), "a journal is left after the store was folded"
        return True

    # -- invariants ---------------------------------------------------------------------------
    def journals(self) -> list[str]:
        return sorted(glob.glob(glob.escape(str(self.store_path)) + ".journal.*"))

    @invariant()
    def no_effect_twice_and_nothing_acknowledged_lost(self) -> None:
        self.busy = True
        started = time.monotonic()
        deliveries = list(self.server.deliveries)
        counts = Counter(d["idempotency_key"] for d in deliveries)
        repeated = {k: n for k, n in counts.items() if n > 1}
        assert not repeated, f"applied more than once: {repeated}"
        keys = {run.key(i): (run, i) for run in self.runs.values() for i in range(run.items)}
        for key in counts:
            assert key in keys, f"the server received a key no call has: {key}"
            run, item = keys[key]
            assert run.effects[item] != NONE, f"{run.run_id}: item {item} delivered, no intent"
        if self.store_path.exists():
            self.check_store(set(counts))
        self.seconds["(checks)"] += time.monotonic() - started
        self.busy = False

    def check_store(self, received: set[str]) -> None:
        """Tables (read-only: nothing folds) plus journal files nobody folded yet."""
        journals = self.journals()
        assert not os.path.exists(str(self.store_path) + ".quarantine")
        with open_store(str(self.store_path), read_only=True) as store:
            ledger = {
                (r[0], r[1]): (str(r[2]), r[3])
                for r in store.read("SELECT run_id, step_key, key, status FROM effects")
            }
            results = {
                (r[0], r[1]): r[2]
                for r in store.read(
                    "SELECT run_id, key, result FROM steps WHERE status = 'completed'"
                )
            }
            steps = set(results)
            statuses = dict(store.read("SELECT id, status FROM runs"))
            assert store.read("SELECT count(*) FROM quarantine")[0][0] == 0
        intents: set[str] = set()
        for path in journals:
            scan = scan_journal(path)
            assert not scan.damage and not scan.unreadable, path
            begun: dict[Any, tuple[str, str]] = {}
            for _seq, kind, data in scan.records:
                if kind == "intent":
                    intents.add(str(data["key"]))
                elif kind == "step_begin":
                    begun[data["id"]] = (data["run_id"], data["key"])
                elif kind == "step_complete":
                    steps.add(begun[data["step_id"]])
                elif kind == "item_complete":
                    steps.add(begun[data["step_id"]])
                    results[begun[data["step_id"]]] = data["result"]
        for run in self.runs.values():
            if run.concurrency:
                self.learn_batch(run, steps, results, ledger, intents)
            for item in range(run.items):
                key = run.key(item)
                row = ledger.get((run.run_id, str(item)))
                if run.effects[item] != NONE or key in received:
                    assert row is not None or key in intents, (
                        f"{run.run_id}: the acknowledged call of item {item} is lost"
                    )
                if item < run.done:
                    assert (run.run_id, str(item)) in steps, (
                        f"{run.run_id}: step {item} was acknowledged completed and is lost"
                    )
            if journals:
                continue  # the rest once they are folded
            got = {int(k) for r, k in steps if r == run.run_id}
            done = run.finished if run.concurrency else set(range(run.done))
            assert got == done, f"{run.run_id}: completed steps {sorted(got)}"
            for item in range(run.items):
                row = ledger.get((run.run_id, str(item)))
                state = run.effects[item]
                if state == NONE:
                    assert row is None, f"{run.run_id}: item {item} has a row, no call: {row}"
                    continue
                assert row is not None and row[0] == run.key(item)
                assert row[1] in ALLOWED[state], f"{run.run_id} item {item}: {row[1]}, {state}"
                if row[1] == "applied":
                    assert row[0] in received, f"{run.run_id}: item {item} applied, not sent"
            if run.created:
                assert statuses[run.run_id] in run.statuses, (
                    f"{run.run_id} is {statuses[run.run_id]}, expected one of {run.statuses}"
                )
            else:
                assert run.run_id not in statuses

    def learn_batch(
        self,
        run: RunModel,
        steps: set[tuple[str, str]],
        results: dict[tuple[str, str], str],
        ledger: dict[tuple[str, str], tuple[str, str]],
        intents: set[str],
    ) -> None:
        """A batch's items on disk (tables plus journals), checked against the model; what
        a kill or a forced stop left of items in flight not held is learnt here.

        Every item acknowledged completed is on disk; only items that began completed;
        each completed item stores the value the server answered for its call, and its
        effect was returned (so its outcome, written before its completion, is on disk
        too). An item completed before its ``item_done`` line was printed, or an intent
        stored (or a decided call made again) before its ``intent`` line, is known from now
        on.
        """
        durable = {int(k) for r, k in steps if r == run.run_id}
        lost = run.finished - durable
        assert not lost, f"{run.run_id}: items acknowledged completed are lost: {sorted(lost)}"
        assert durable <= run.began, f"{run.run_id}: items completed that never began"
        seqs = {d["idempotency_key"]: d["seq"] for d in self.server.deliveries}
        for item in sorted(durable):
            stored = results.get((run.run_id, str(item)))
            assert stored is not None and json.loads(stored) == seqs.get(run.key(item)), (
                f"{run.run_id}: item {item} stored {stored}, the server answered "
                f"{seqs.get(run.key(item))}"
            )
            if item not in run.finished:
                run.item_finished(item)
                self.landed["batch: completed, not yet acknowledged"] += 1
        for item in sorted(run.began - run.finished):
            row = ledger.get((run.run_id, str(item)))
            state = run.effects[item]
            if state == NONE and (row is not None or run.key(item) in intents):
                run.effects[item] = INTENT
                self.landed["batch: intent stored, not yet acknowledged"] += 1
            elif state == NOT_APPLIED and row is not None and row[1] in ("pending", "unknown"):
                # Called again: the row went back to pending (a write to the tables), and a
                # kill or a forced stop came before the tool was entered, or inside it.
                run.effects[item] = INTENT
                self.landed["batch: called again, not yet acknowledged"] += 1

    # -- the end of an example ------------------------------------------------------------
    def teardown(self) -> None:
        try:
            for attempt in list(self.live):
                attempt.worker.kill()
            for holder in self.holders:
                holder.kill()
            if not self.busy:
                started = time.monotonic()
                self.finish_every_run()
                self.seconds["(finish)"] += time.monotonic() - started
        finally:
            self.server.stop()
            shutil.rmtree(self.dir, ignore_errors=True)

    def finish_every_run(self) -> None:
        """Resume each run to completion; each item must be delivered exactly once."""
        for run in self.runs.values():
            for _ in range(FINISH_ATTEMPTS):
                if run.completed:
                    break
                if run.statuses == {"needs_decision"}:
                    with open_store(str(self.store_path)) as store:
                        self.decide_unknowns(store, run)
                attempt = self.attempt(run, [])
                if attempt is not None:
                    self.end_completed(attempt)
            assert run.completed, f"{run.run_id} did not complete"
        with open_store(str(self.store_path)) as store:  # fold what dead processes left
            store.flush()
        self.no_effect_twice_and_nothing_acknowledged_lost()
        counts = Counter(d["idempotency_key"] for d in self.server.deliveries)
        for run in self.runs.values():
            assert run.effects == [APPLIED] * run.items
            for item in range(run.items):
                assert counts[run.key(item)] == 1, f"{run.run_id} item {item}"
        assert sum(counts.values()) == sum(r.items for r in self.runs.values())
        assert not self.journals()


@pytest.mark.timeout(900)
def test_write_path_against_its_model(tmp_path: Path) -> None:
    pool = WorkerPool(CRASH_DIR / "model_worker.py", tmp_path)
    WritePathModel.pool = pool
    WritePathModel.workdir = tmp_path
    WritePathModel.fold_failures = 0
    WritePathModel.actions = Counter()
    WritePathModel.decisions = Counter()
    WritePathModel.landed = Counter()
    WritePathModel.seconds = Counter()
    started = time.monotonic()
    try:
        run_state_machine_as_test(WritePathModel, settings=SETTINGS)
    finally:
        pool.close()
    print(
        f"\nwrite-path model: {time.monotonic() - started:.1f}s, "
        f"{pool.spawned} worker processes, actions {dict(WritePathModel.actions)}, "
        f"{WritePathModel.fold_failures} fold failures, decisions "
        f"{dict(WritePathModel.decisions)}, faults landed at "
        f"{dict(sorted(WritePathModel.landed.items()))}, seconds per action "
        f"{ {k: round(v, 1) for k, v in WritePathModel.seconds.items()} }"
    )
    # With the default settings every kind of fault is exercised (derandomized: always
    # the same examples). Far fewer examples (KERNELEXT_MODEL_EXAMPLES) may miss one.
    assert WritePathModel.fold_failures > 0, "no example made a fold fail"
    for name in ("run_to_the_end", "stop", "force_stop", "sigkill", "fold_failure"):
        assert WritePathModel.actions[name] > 0, f"no example ran {name}"
    for decision in ("applied", "not_applied"):
        assert WritePathModel.decisions[decision] > 0, f"no unknown was decided {decision}"
