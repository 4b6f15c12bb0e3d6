"""What every agent framework's adapter shares: model turns as steps, a model turn recorded
and replayed as one effect, and a tool call as an effect keyed by its turn and its place.

An agent framework runs a loop of model turns and tool calls. Under kernelext:

- each model turn opens a step ``turn N`` (a safe point first, so a Stop lands between two
  turns, never inside one); a resumed run's completed turns are not steps again;
- the model's answer is one effect (ordinal 0 of the turn), recorded as JSON and rebuilt as
  the framework's own type on replay, so a model server never sees a turn twice;
- each tool call the model asked for is an effect of the tool's name, at ordinal
  ``1 + its place among the turn's calls`` (parallel calls are keyed by the model's order,
  not by which finished first), so a resumed run replays applied calls instead of making
  them again, an unknown outcome waits in ``kx.reconcile`` and an approval is asked once;
  a person's Force stop waits for a tool call in flight (up to ``force_call_grace``) and
  lands once its real outcome is recorded, as for a sync ``@kx.effect`` call;
- the effects a tool's body calls are made at its call's place too (:class:`CallSite`),
  counted per effect name: two calls of one effect there are two calls, each keyed apart.

kernelext's own refusals (a call that needs a decision, arguments that no longer match the
recorded ones) must not reach a framework's error handling, which would hand them to the
model as text: :class:`Carried` takes them through as a ``BaseException`` and
:func:`unwrapped` raises the original again where the framework's run returned.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import threading
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from .._core.encoding.keys import load_result, repeated_call, stored_result
from .._core.engine.context import current_run, reset_current_run, set_current_run
from .._core.engine.run_engine import RunEngine
from .._core.ledger.effect import Effect, effect_key
from .._core.views.conversation import turn_step
from ..errors import EffectRejected, KernelextError, LedgerError
from ..status import EffectStatus
from .asked_again import TurnAnswer

__all__ = [
    "CallSite",
    "Carried",
    "ToolResult",
    "Turn",
    "Turns",
    "approved_call",
    "at_call_site",
    "in_tool_call",
    "marked_if_masked",
    "record_tool_call",
    "record_turn",
    "recorded_result",
    "refuse_masked",
    "unwrapped",
]

T = TypeVar("T")
Site = tuple[str, int | None, int]
MASKED = "kernelext_masked"  # in a recorded answer: a registered secret was masked in it
_IN_TOOL: contextvars.ContextVar[bool] = contextvars.ContextVar("kx_in_tool", default=False)
# The results of the tool call made in this context (a list per ToolResult), for its caller.
_LIVE: contextvars.ContextVar[list[Any] | None] = contextvars.ContextVar("kx_live", default=None)
_APPROVED: contextvars.ContextVar[bool] = contextvars.ContextVar("kx_approved", default=False)


class Carried(BaseException):
    """A kernelext error on its way through a framework that would hand an ``Exception``
    to the model; :func:`unwrapped` raises ``error`` again outside the framework."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


@contextlib.contextmanager
def unwrapped() -> Iterator[None]:
    """Around a framework's run: a :class:`Carried` error is raised as itself."""
    try:
        yield
    except Carried as carried:
        raise carried.error.with_traceback(carried.error.__traceback__) from None


class CallSite:
    """The run as one recorded call sees it: at a fixed (step key, step ordinal, ordinal).
    The call itself and every effect its body calls are made there; each effect's calls are
    counted by name (``next_call``), from 0 each time the body runs, so the first call of
    each keeps the site's ordinal and a later one gets one of its own (``repeated_call``).
    Everything else is the run's own, read and written (a suspension for an approval sets
    the run's ``suspend_request``)."""

    _OWN = frozenset({"base", "_site", "_counts", "_lock"})
    base: Any
    _site: Site
    _counts: dict[str | None, int]
    _lock: threading.Lock

    def __init__(self, run: Any, site: Site) -> None:
        object.__setattr__(self, "base", run.base if isinstance(run, CallSite) else run)
        object.__setattr__(self, "_site", site)
        object.__setattr__(self, "_counts", {})  # calls made here so far, by effect name
        object.__setattr__(self, "_lock", threading.Lock())

    def next_call(self, tool: str | None = None) -> Site:
        """The site of the next call of ``tool`` (an effect's name; ``None`` for a call that
        names none, as ``run.ask``'s, counted apart from every effect's)."""
        step_key, step_ordinal, ordinal = self._site
        with self._lock:
            earlier = self._counts.get(tool, 0)
            code = repeated_call(ordinal, earlier)  # refuses before counting a call too many
            self._counts[tool] = earlier + 1
        return step_key, step_ordinal, code

    def peek_call(self, tool: str | None = None) -> tuple[str, int]:
        """The (step key, call ordinal) ``next_call(tool)`` would give now, without taking it."""
        step_key, _, ordinal = self._site
        with self._lock:
            return step_key, repeated_call(ordinal, self._counts.get(tool, 0))

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.base, attr)

    def __setattr__(self, attr: str, value: Any) -> None:
        if attr in self._OWN:
            object.__setattr__(self, attr, value)
        else:
            setattr(self.base, attr, value)


@contextlib.contextmanager
def at_call_site(run: Any, site: Site) -> Iterator[None]:
    """Effects called inside are keyed at ``site`` instead of the run's next call."""
    token = set_current_run(CallSite(run, site))  # type: ignore[arg-type]
    try:
        yield
    finally:
        reset_current_run(token)


@dataclass
class Turn:
    """One model turn: its step key and ordinal, and the ids of the tool calls it asked for."""

    number: int
    ordinal: int | None
    calls: list[str] = field(default_factory=list)
    extra: int = 0  # calls whose id the model's answer did not list (keyed after those)
    in_flight: set[asyncio.Future[None]] = field(default_factory=set)  # calls being made

    async def settle_others(self, mine: asyncio.Future[None]) -> None:
        """Wait until the turn's other calls in flight ended (a framework that meets one
        call's error cancels the others: a call cut half-way would become ``unknown``)."""
        self.in_flight.discard(mine)
        if not mine.done():
            mine.set_result(None)
        others = list(self.in_flight)
        if others:
            await asyncio.wait(others)

    @property
    def key(self) -> str:
        return turn_step(self.number)

    def site_of(self, call_id: str | None) -> Site:
        if call_id is not None and call_id in self.calls:
            return self.key, self.ordinal, 1 + self.calls.index(call_id)
        self.extra += 1
        return self.key, self.ordinal, 1 + len(self.calls) + self.extra


class Turns:
    """The model turns of one run of a framework's agent, counted from its start."""

    def __init__(self, run: RunEngine) -> None:
        self.run = run
        self.current: Turn | None = None
        self.count = 0
        # A framework's run starts again from its input on resume: the calls of completed
        # turns are replayed too, so their ledger rows are loaded with the others.
        for key, row in run.store.load_effects(run.id).items():
            run.effects.setdefault(key, row)

    def begin(self, name: str | None) -> Turn:
        """Open the next turn's step (a safe point first: a pending Stop lands here)."""
        self.count += 1
        key = turn_step(self.count)
        if self.run.begin_step(key, name):
            ordinal = self.run.current.ordinal if self.run.current is not None else None
        else:  # completed before this resume: replayed, not a step again
            ordinal = self.run.completed.get(key)
        self.current = Turn(self.count, ordinal)
        return self.current


def in_tool_call() -> bool:
    """True inside a recorded tool call: a model asked there belongs to the tool (a nested
    agent), recorded with the call's result, not as a turn of the run."""
    return _IN_TOOL.get()


async def record_turn(
    turn: Turn,
    tool: str,
    request: Any,
    ask: Callable[[], Awaitable[T]],
    dump: Callable[[T], Any],
    load: Callable[[Any], T],
    *,
    instructions: Any = None,
) -> T:
    """The model's answer for ``turn``: asked now (``ask``) and recorded as ``dump`` of it,
    or rebuilt with ``load`` from the record of an earlier run. ``request`` (JSON: the
    conversation and the tools) identifies the call: a replay whose request differs is
    refused. ``instructions`` (JSON: the system prompt) are recorded with it, and asked
    again on resume (``asked_again``: a change is noted, not refused)."""
    run = current_run()
    assert run is not None  # only called inside a run
    live: list[T] = []

    async def asked(request: Any, instructions: Any = None) -> Any:
        value = await ask()
        live.append(value)
        return marked_if_masked(dump(value))

    effect = TurnAnswer(asked, name=tool, resumable=True, retry=True)
    try:
        with at_call_site(run, (turn.key, turn.ordinal, 0)):
            out = await effect(request=request, instructions=instructions)
    except KernelextError as exc:  # the ledger's (an unknown answer): past the framework
        raise Carried(exc) from exc
    if live:
        return live[0]
    try:
        refuse_masked(out, f"The model's answer in {turn.key} of run {run.id!r}")
    except LedgerError as exc:
        raise Carried(exc) from exc
    return load(out)


def marked_if_masked(data: Any, *, wrap: bool = False) -> Any:
    """A model's answer (or, ``wrap``, a tool's result) as recorded: marked when the ledger
    stores it with a registered secret masked, since its replay would not be what the model
    said (or was given)."""
    try:
        faithful = _same(load_result(stored_result(data)), data)
    except Exception:  # not storable as it is: the ledger's own door says so
        return data
    if faithful:
        return data
    if wrap or not isinstance(data, dict):
        return {MASKED: True, "value": data}
    return {**data, MASKED: True}


def _same(stored: Any, given: Any) -> bool:
    """Whether the stored value is the given one (a float NaN is itself: no secret there)."""
    if isinstance(stored, float) and isinstance(given, float) and stored != stored:
        return given != given
    if isinstance(stored, dict) and isinstance(given, dict):
        return stored.keys() == given.keys() and all(_same(stored[k], given[k]) for k in given)
    if isinstance(stored, (list, tuple)) and isinstance(given, (list, tuple)):
        return len(stored) == len(given) and all(map(_same, stored, given))
    return bool(stored == given)


class ToolResult:
    """Around one recorded tool call: its result, the value the tool returned when the call
    is made now (its function returns :func:`recorded_result`), else the recorded one,
    refused when the ledger stored it with a secret masked (``of``). One door for every
    tool a model calls: a framework's (:func:`record_tool_call`) and ``kx.tools``'."""

    def __enter__(self) -> ToolResult:
        self.live: list[Any] = []
        self._token = _LIVE.set(self.live)
        return self

    def __exit__(self, *_exc: object) -> None:
        _LIVE.reset(self._token)

    def of(self, out: Any, what: str) -> Any:
        """The result ``out`` of the call made inside (``what`` names it in a refusal)."""
        if self.live:
            return self.live[-1]
        refuse_masked(out, what)
        return out


def recorded_result(value: Any) -> Any:
    """What a recorded tool call's function gives the ledger: ``value``, marked when it is
    stored with a registered secret masked; the :class:`ToolResult` around it keeps
    ``value`` itself for the caller."""
    live = _LIVE.get()
    if live is not None:
        live.append(value)
    return marked_if_masked(value, wrap=True)


def refuse_masked(data: Any, what: str) -> None:
    """Refuse to replay a recorded answer that was stored with a secret masked: the tool
    calls it asked for would get ``***`` instead of the value (``what`` names the answer)."""
    if isinstance(data, dict) and data.get(MASKED):
        raise LedgerError(
            f"{what} held a registered secret (kx.secrets), which the ledger stores masked: "
            "replayed, it would hand *** where the secret was, so the run cannot go on from "
            "its record. Start it again under a new run id, and keep secrets out of what "
            "the model reads (give them to the tools in code, and out of what they return)."
        )


class AsksApproval(Exception):
    """A tool's answer that a person must approve the call first (Pydantic AI's
    ``ApprovalRequired``): the attempt is recorded ``failed`` with it (nothing was done),
    and the call is made again, gated, once a person approved it through kernelext."""


async def record_tool_call(
    turn: Turn,
    call_id: str | None,
    tool: str,
    arguments: dict[str, Any],
    call: Callable[[dict[str, Any]], Awaitable[Any]],
    *,
    needs_approval: bool = False,
    asks_approval: Callable[[Any], bool] | None = None,
) -> Any:
    """One tool call the model asked for in ``turn``, as an effect named ``tool`` with the
    model's ``arguments`` (what a person approves is what ``call`` is given). A call that
    ``needs_approval``, or whose result ``asks_approval`` says the tool wants a person's
    approval first, is asked through kernelext (``kx.approvals``, the panel, ``kernelext
    approve``); :func:`approved_call` tells ``call`` a person approved it."""
    run = current_run()
    assert run is not None  # only called inside a run
    site = turn.site_of(call_id)
    gated = needs_approval or _asked_before(run, site, tool)

    async def called(**given: Any) -> Any:
        token, approved = _IN_TOOL.set(True), _APPROVED.set(gated)
        try:
            value = await call(given)
        finally:
            _APPROVED.reset(approved)
            _IN_TOOL.reset(token)
        if not gated and asks_approval is not None and asks_approval(value):
            raise AsksApproval(f"{tool} asked for a person's approval; asked through kernelext")
        return recorded_result(value)

    called.__name__ = tool
    # Bound, shown and approved by the model's argument names, as the tool's own call.
    called.__signature__ = _signature_of(arguments)  # type: ignore[attr-defined]
    mine: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    turn.in_flight.add(mine)
    try:  # a person's Force stop waits for the call and its outcome, as for a @kx.effect
        with run.force.in_call(tool), ToolResult() as result:
            try:
                out = await _made_at(run, site, _tool_effect(called, tool, gated), arguments)
            except AsksApproval:  # recorded failed: made again once a person approved it
                gated = True
                out = await _made_at(run, site, _tool_effect(called, tool, gated), arguments)
        return result.of(out, f"The result of {tool} in {turn.key} of run {run.id!r}")
    except EffectRejected:  # a person's answer: the adapter tells the model
        raise
    except asyncio.CancelledError:
        raise
    except BaseException as exc:  # lands once the turn's other calls ended
        await turn.settle_others(mine)
        if isinstance(exc, KernelextError):  # the ledger's, not the tool's: past the framework
            raise Carried(exc) from exc
        raise
    finally:
        turn.in_flight.discard(mine)
        if not mine.done():
            mine.set_result(None)


async def _made_at(run: Any, site: Site, effect: Effect, arguments: dict[str, Any]) -> Any:
    """One attempt of a tool call at ``site``, its calls counted from 0 (``CallSite``): an
    attempt made again is the same call under its key, and its body's calls replay by theirs."""
    with at_call_site(run, site):
        return await effect(**arguments)


def approved_call() -> bool:
    """True inside a tool call that a person approved through kernelext."""
    return _APPROVED.get()


def _tool_effect(called: Callable[..., Any], tool: str, gated: bool) -> Effect:
    # A call that raised is asked again on resume once the ledger knows it never reached its
    # target; one that may have is left to a person in kx.reconcile (the retry rule). A
    # gated call made again needs an approval of its own. Its arguments are the model's, all
    # of them: one named idempotency_key is the model's value, not a key kernelext hands over.
    return Effect(
        called, name=tool, resumable=True, retry=True, needs_approval=gated, injects_key=False
    )


def _asked_before(run: Any, site: Site, tool: str) -> bool:
    """Whether the call at ``site`` asked for a person's approval in an earlier attempt
    (:class:`AsksApproval`): a resume asks through kernelext at once, without calling
    the tool unapproved again."""
    step_key, _ordinal, call_ordinal = site
    row = run.effects.get(effect_key(run.id, step_key, tool, call_ordinal, run.key_scheme))
    return bool(
        row is not None
        and row.get("status") == EffectStatus.FAILED
        and str(row.get("error") or "").startswith(AsksApproval.__name__ + ":")
    )


def _signature_of(arguments: dict[str, Any]) -> inspect.Signature:
    """A tool call's arguments as keyword parameters, so that the ledger, an approval request
    and an approval's edits name them as the model did (``{"who": "bob"}``); arguments whose
    names are no Python names are kept as one mapping, ``given``."""
    keyword = inspect.Parameter.KEYWORD_ONLY
    try:
        return inspect.Signature([inspect.Parameter(name, keyword) for name in arguments])
    except (TypeError, ValueError):
        return inspect.Signature([inspect.Parameter("given", inspect.Parameter.VAR_KEYWORD)])
