"""``@kx.effect``: external effects recorded at apply time under a deterministic key.

A call goes through three parts, each a method that the sync path (``_perform``) and the
async one (``ledger_async``, for an ``async def`` tool) share: before the call
(``_prepare``: the stop check, the key, the replay of a recorded call or the durable
intent of a new one, its approval: ``effect_approval``), the call itself, and after it
(``_applied``, ``_failed``, ``_interrupted``: ``effect_outcomes``, with the replay of a
recorded call).
"""

from __future__ import annotations

import functools
import inspect
import uuid
from collections.abc import Callable
from typing import Any, TypeVar, overload

from ..._shown import shows
from ..._validate import check_callable, check_flag, check_name, register
from ..._validate_functions import (
    check_approval_rule,
    check_effect_function,
    is_async_function,
    refuse_unrun_result,
)
from ...errors import (
    EffectArgumentsMismatch,
    EffectFailed,
    ForcedStop,
)
from ...status import EffectStatus
from ..encoding.keys import (
    args_hash,
    call_hashes,
    effect_key,
    hash_for,
    redact,
    stored_result,
)
from ..encoding.names import check_stored_name
from ..encoding.secrets import REDACTED, SECRET_NAME
from ..engine.context import current_run
from ..engine.run_engine import RunEngine, chain_roots
from ..engine.step_info import current_item
from .effect_approval import _SEEN, left_inside
from .effect_async import call_async
from .effect_outcomes import _PERFORM, EffectOutcomes
from .limits import call_limited
from .retries import (
    RetryOn,
    check_retries,
    check_retry_on,
    made_with_retries,
    settled,
)

T = TypeVar("T")

__all__ = [
    "REDACTED",
    "SECRET_NAME",
    "Effect",
    "EffectFailed",
    "args_hash",
    "effect",
    "effect_key",
    "idempotency_key_for",
    "redact",
    "stored_result",
]

ApprovalRule = bool | Callable[..., Any]


def idempotency_key_for(run: RunEngine, step_key: str, tool: str, call_ordinal: int) -> str:
    """The ``idempotency_key`` handed to a tool for one call: the same for that call in
    every run of a restart chain, so that an API that dedupes by key dedupes a call a
    restart makes again (a ``failed`` or ``not_applied`` one). It is the key of the call
    in the chain's root run (the run that was not made by a restart), through
    ``effect_key``, in the run's key scheme (a restarted run keeps its parent's); for a run
    never restarted, its own effect key."""
    root = chain_roots.get(run)  # set when the run starts or is resumed
    if root is None:  # a cell run: read once per run (a run's parent never changes)
        root = run.store.chain_root(run.id)
        chain_roots[run] = root
    return str(effect_key(root, step_key, tool, call_ordinal, run.key_scheme))


class Effect(EffectOutcomes):
    """A recorded external effect. Call it like the function it wraps; for an ``async
    def`` (``is_async``) a call returns a coroutine to await (``ledger_async``)."""

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None,
        resumable: bool,
        retry: bool,
        needs_approval: ApprovalRule = False,
        probe: Callable[..., Any] | None = None,
        limit: str | None = None,
        retries: int = 0,
        retry_on: RetryOn = (),
        injects_key: bool = True,
    ) -> None:
        check_effect_function(fn)
        if name is not None:
            check_name("@kx.effect(name=...)", name)
        self.fn = fn
        self.is_async = is_async_function(fn)  # awaited: see ledger_async
        self.tool = check_stored_name(
            (getattr(fn, "__name__", None) or type(fn).__name__) if name is None else name,
            "tool name",
            hint="Pass @kx.effect(name='send_email') with a short, printable name.",
        )
        self.resumable = check_flag("@kx.effect(resumable=...)", resumable)
        self.retry = check_flag("@kx.effect(retry=...)", retry)
        self.limit = check_name("@kx.effect(limit=...)", limit) if limit is not None else None
        self.retries = check_retries("@kx.effect(retries=...)", retries)
        self.retry_on = check_retry_on("@kx.effect(retry_on=...)", retry_on, self.retries)
        if self.is_async and (self.limit is not None or self.retries):
            raise TypeError(
                f"@kx.effect(limit=..., retries=...) applies to plain functions for now; "
                f"{self.tool} is an async def. Drop the option, or wrap the awaited call in "
                "a plain function (def f(...): return asyncio.run(coro(...))) and decorate that."
            )
        if probe is not None:
            check_callable("@kx.effect(probe=...)", probe, what="a function (key, args)")
        check_approval_rule(needs_approval)
        self.needs_approval = needs_approval
        self.probe = probe
        if probe is not None:
            from . import probes  # asked for only by effects that declare a probe

            probes.register_probe(self.tool, probe)
        try:
            self.signature: inspect.Signature | None = inspect.signature(fn)
        except (TypeError, ValueError):
            self.signature = None
        params = self.signature.parameters if self.signature else {}
        # ``injects_key=False``: a tool the model calls, whose arguments are all the model's
        # (an argument named idempotency_key among them); kernelext hands it no key.
        self.injects_key = injects_key
        self.takes_key = resumable and injects_key and "idempotency_key" in params
        self.dedupes = self.takes_key  # its target dedupes on the key (ledger.retries)
        self._where = f"a call of effect {self.tool}"  # where a swallowed stop is raised again
        functools.update_wrapper(self, fn)

    @shows
    def __repr__(self) -> str:
        approval = ", needs approval" if self.needs_approval is not False else ""
        return f"<kernelext effect {self.tool!r} resumable={self.resumable}{approval}>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.limit is None:
            return self._call(*args, **kwargs)
        return call_limited(  # a slot first (kx.limit), for a call that will be made now
            current_run(), self.limit, self.tool, lambda: self._call(*args, **kwargs), self._where
        )

    def _call(self, *args: Any, **kwargs: Any) -> Any:
        run = current_run()
        if run is None:  # outside a run: a plain call, nothing recorded (documented)
            return self.fn(*args, **kwargs)
        if self.is_async:  # awaited: the same steps, the tool awaited (ledger_async)
            return call_async(self, run, args, kwargs)
        key, call, replayed = self._prepare(run, args, kwargs)
        if not call:
            return replayed
        args, kwargs = self._made_with(key, args, kwargs)
        return self._perform(run, key, args, kwargs)

    def _prepare(
        self,
        run: RunEngine,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        slot: tuple[str, int | None, int] | None = None,
    ) -> tuple[uuid.UUID, bool, Any]:
        """Everything before the call, for sync and async effects alike: the stop check,
        the key, the replay of a recorded call or the durable intent of a new one (and its
        approval). Returns ``(key, True, None)`` when the call is to be made now, else
        ``(key, False, the replayed result)``. Pops ``idempotency_key`` (the engine's).
        ``slot``: the call's ``run.next_call(tool)``, when the caller took it already."""
        run.enforce_stop(self._where)  # a stop the agent's code swallowed is raised again
        if self.injects_key:
            kwargs.pop("idempotency_key", None)
        scheme = run.key_scheme
        # Scheme 2: bound by parameter name with defaults applied; hash and display are
        # of that one mapping, taken at one moment (before the approval rule runs).
        bound = self._bound(args, kwargs) if scheme >= 2 else None
        # Refuses an argument it cannot bind by value before anything is recorded.
        hashes = self._hashes(args, kwargs, scheme, bound)
        digest, old = hashes
        shown = self._redacted_args(args, kwargs, 1 if digest == old else 2, bound)
        gated = self._gated(args, kwargs)
        if gated and digest == old:
            # A scheme-1 run's argument with no faithful encoding: an approval of it would
            # be blind (its old hash holds only the type name). Refused, whatever the scheme.
            args_hash(args, kwargs, 2, tool=self.tool, names=self._positional)
        if callable(self.needs_approval) and self._hashes(args, kwargs, scheme, bound) != hashes:
            raise EffectArgumentsMismatch(
                f"Effect {self.tool}: its needs_approval rule changed the call's arguments "
                "(they were bound and shown before the rule ran, and differ after it). "
                "Nothing was recorded. A needs_approval rule must only read the arguments."
            )
        step_key, step_ordinal, call_ordinal = slot or run.next_call(self.tool)
        key = effect_key(run.id, step_key, self.tool, call_ordinal, scheme)
        if gated:  # what its approval request stores: every value of its data arguments
            full = self._redacted_args(args, kwargs, 1 if digest == old else 2, bound, full=True)
            _SEEN[key] = (full, bound)
        try:
            return self._intent_or_replay(
                run, key, (step_key, step_ordinal, call_ordinal), hashes, shown, gated
            )
        finally:
            _SEEN.pop(key, None)

    def _hashes(
        self,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        scheme: int,
        bound: dict[str, Any] | None,
    ) -> tuple[str, str | None]:
        """The hashes that identify the call (``call_hashes``): of all its arguments; a
        model's turn leaves out what a resume asks again (``kernelext._adapters.asked_again``)."""
        return call_hashes(
            args, kwargs, scheme, tool=self.tool, names=self._positional, bound=bound
        )

    def _intent_or_replay(
        self,
        run: RunEngine,
        key: uuid.UUID,
        slot: tuple[str, int | None, int],
        hashes: tuple[str, str | None],
        shown: str,
        gated: bool,
    ) -> tuple[uuid.UUID, bool, Any]:
        step_key, step_ordinal, call_ordinal = slot
        digest, old = hashes
        row = run.effects.get(key)
        if row is not None:
            expected = self._expected(run, key, row, hash_for(row["args_hash"], digest, old), gated)
            replay = self._replay(run, key, row, expected, gated)
            if replay is not _PERFORM:
                return key, False, replay
        else:
            row = {
                "key": key,
                "run_id": run.id,
                "step_key": step_key,
                "step_ordinal": step_ordinal,
                "tool": self.tool,
                "call_ordinal": call_ordinal,
                "args_hash": digest,
                "args": shown,
                "resumable": self.resumable,
            }
            existing = self._record_intent(run, row, gated)
            if existing is not None:
                known = {**row, **existing}
                expected = hash_for(known["args_hash"], digest, old)
                expected = self._expected(run, key, known, expected, gated)
                replay = self._replay(run, key, known, expected, gated)
                if replay is not _PERFORM:
                    return key, False, replay
        run.note_effect(key, {**row, "status": EffectStatus.PENDING})
        run.notify("effect", (self.tool, key, EffectStatus.PENDING))
        return key, True, None

    # -- the call itself -----------------------------------------------------------
    @staticmethod
    def idempotency_key(run: RunEngine, key: uuid.UUID) -> str:
        """The ``idempotency_key`` handed over for the call recorded under ``key``."""
        row = run.effects[key]
        return idempotency_key_for(run, row["step_key"], row["tool"], int(row["call_ordinal"]))

    def _perform(
        self, run: RunEngine, key: uuid.UUID, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """Make the call and record its outcome. In the run's own thread a person's Force
        stop waits for both (``ForceGate.in_call``); an item of a batch is cut at once."""
        if current_item(run) is not None:
            return self._perform_and_record(run, key, args, kwargs)
        with run.force.in_call(self.tool):
            return self._perform_and_record(run, key, args, kwargs)

    def _perform_and_record(
        self, run: RunEngine, key: uuid.UUID, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        call_kwargs = self._call_kwargs(run, key, kwargs)
        try:  # made again after a transient failure with retries=N (kernelext._core.ledger.retries)
            result = made_with_retries(self, run, key, lambda: self.fn(*args, **call_kwargs))
            refuse_unrun_result(self.tool, result)
        except BaseException as exc:
            if settled(run, key):  # the attempts recorded the outcome (unknown, not_applied)
                raise
            why = left_inside(exc)  # a call made inside waits for approval, or was rejected
            if why is not None:
                _recorded(run, functools.partial(self._not_reached, run, key, why))
            elif isinstance(exc, Exception):
                _recorded(run, functools.partial(self._failed, run, key, exc))
            else:  # a stop, a forced stop, the process going down: nobody knows
                self._interrupted(run, key)
            raise
        return _recorded(run, functools.partial(self._applied, run, key, result))

    # -- before and after the call: shared by the sync and async paths (ledger_async) -----
    def _call_kwargs(
        self, run: RunEngine, key: uuid.UUID, kwargs: dict[str, Any]
    ) -> dict[str, Any]:
        """The keywords the tool is called with: the caller's, and ``idempotency_key``."""
        call_kwargs = dict(kwargs)
        if self.takes_key:  # the same in every run of a restart chain (idempotency_key_for)
            call_kwargs["idempotency_key"] = self.idempotency_key(run, key)
        return call_kwargs


register(Effect=Effect)  # what _validate refuses to wrap twice


@overload
def effect(fn: Callable[..., Any], /) -> Effect: ...


@overload
def effect(
    fn: None = None,
    /,
    *,
    name: str | None = None,
    resumable: bool = True,
    retry: bool = False,
    needs_approval: ApprovalRule = False,
    probe: Callable[..., Any] | None = None,
    limit: str | None = None,
    retries: int = 0,
    retry_on: RetryOn = (),
) -> Callable[[Callable[..., Any]], Effect]: ...


def effect(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    resumable: bool = True,
    retry: bool = False,
    needs_approval: ApprovalRule = False,
    probe: Callable[..., Any] | None = None,
    limit: str | None = None,
    retries: int = 0,
    retry_on: RetryOn = (),
) -> Effect | Callable[[Callable[..., Any]], Effect]:
    """Declare an external effect: ``@kx.effect`` or ``@kx.effect(resumable=False)``.

    On an ``async def``, a call inside a run is awaited (``await fetch(url)``): its intent
    is durable before the tool's first ``await``, its outcome recorded after it; a call
    cancelled mid-way (a forced stop of an async agent) is ``unknown``.

    ``needs_approval=True`` (or a function of the call's arguments, e.g.
    ``lambda to, amount, **kw: amount > 100``): inside a run, a call waits for a person.
    The first call records an approval request bound to the call's key and argument hash
    and suspends the run (reason ``approval``) before anything is sent; after
    ``kx.approvals(run_id)[0].approve()`` the resumed call consumes the approval, once.
    A rejection raises ``kx.EffectRejected`` at the call. ``probe`` registers a function
    that tells whether a call with an unknown outcome happened: ``probe(key, args)``
    returns ``"applied"`` (or ``("applied", result)``), ``"not_applied"`` or ``None``
    (cannot tell); a resume asks it before anything waits for ``kx.reconcile``.

    ``limit="crm"``: each call waits for a slot of the limit declared with
    ``kx.limit("crm", rate="50/s", concurrency=8)``, shared by every run of the process. A
    call waiting for its slot has not started: a stop lands there at once and nothing of
    the call is recorded (the resume makes it, under the same key). Only calls made now
    wait; replays of recorded ones do not. A name not declared when the call is made is
    refused then, before anything is recorded (the limit may be declared after the
    decorator runs).

    ``retries=3``: a call that provably did not reach its target (connection refused, DNS
    failure, connect timeout) is made again, up to 3 more times, under the same key and
    ``idempotency_key``, with exponential backoff and jitter, honouring ``Retry-After``; so
    is a tool that takes ``idempotency_key`` after HTTP 429/500/502/503/504 or no answer.
    Without that parameter a call whose request left is never made again: HTTP 429, 502,
    503, 504 or no answer make it ``unknown`` (decide it with ``kx.reconcile``), other
    answers ``failed``. ``retry_on=(429, 503)``: statuses (and exception classes) this
    target answers before it acts, made again for any tool. ``effects.attempts`` counts
    the attempts; a stop during a wait records the call ``not_applied`` (the resume makes
    it). The rule in full: docs/effects.md.
    """

    if name is not None:  # the options first, so that a bad one is named before any def
        check_name("@kx.effect(name=...)", name)
    check_flag("@kx.effect(resumable=...)", resumable)
    check_flag("@kx.effect(retry=...)", retry)
    if probe is not None:
        check_callable("@kx.effect(probe=...)", probe, what="a function (key, args)")
    check_approval_rule(needs_approval)
    if limit is not None:
        check_name("@kx.effect(limit=...)", limit)
    counted = check_retries("@kx.effect(retries=...)", retries)
    check_retry_on("@kx.effect(retry_on=...)", retry_on, counted)

    def wrap(func: Callable[..., Any]) -> Effect:
        return Effect(
            func,
            name=name,
            resumable=resumable,
            retry=retry,
            needs_approval=needs_approval,
            probe=probe,
            limit=limit,
            retries=retries,
            retry_on=retry_on,
        )

    return wrap(fn) if fn is not None else wrap


def _recorded(run: RunEngine, record: Callable[[], T]) -> T:
    """Record a call's outcome as kernelext's bookkeeping (``ForceGate.critical``): a forced
    stop never lands inside it. One already raised into this thread lands at the section's
    door, before anything was written: the call had ended, so its outcome is recorded
    anyway, and the forced stop goes on after it."""
    try:
        with run.force.critical():
            return record()
    except ForcedStop:
        with run.force.critical():
            record()
        raise
