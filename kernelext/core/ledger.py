"""``@kx.effect``: external effects recorded at apply time under a deterministic key."""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import uuid
import weakref
from collections.abc import Callable
from typing import Any, overload

from ..errors import (
    EffectArgumentsMismatch,
    EffectRejected,
    LedgerError,
    NeedsDecision,
    SerializationError,
)
from ..status import EffectStatus, Reason
from ..store.approvals import APPROVED, REJECTED
from .asking import wait_for_person
from .codec import dumps_json, loads_json
from .context import current_run
from .run import Run
from .runtime import runtime
from .secrets import REDACTED, SECRET_NAME, is_secret_name, scrub, scrub_text

__all__ = [
    "REDACTED",
    "SECRET_NAME",
    "Effect",
    "EffectFailed",
    "effect",
    "effect_key",
    "idempotency_key_for",
    "redact",
]

ApprovalRule = bool | Callable[..., Any]


class EffectFailed(LedgerError):
    """An effect failed before; by default it is not retried silently on resume."""


def effect_key(run_id: str, step_key: str, tool: str, call_ordinal: int) -> uuid.UUID:
    """The deterministic 128-bit key of one call: run, step, tool and ordinal in the step."""
    raw = "\0".join((run_id, step_key, tool, str(call_ordinal))).encode()
    return uuid.UUID(bytes=hashlib.sha256(raw).digest()[:16])


_ROOTS: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()  # run -> chain root


def idempotency_key_for(run: Run, step_key: str, tool: str, call_ordinal: int) -> str:
    """The ``idempotency_key`` handed to a tool for one call: the same for that call in
    every run of a restart chain, so that an API that dedupes by key dedupes a call a
    restart makes again (a ``failed`` or ``not_applied`` one). It is the key of the call
    in the chain's root run (the run that was not made by a restart), through
    ``effect_key``; for a run never restarted, its own effect key."""
    root = _ROOTS.get(run)
    if root is None:  # read once per run: a run's parent never changes
        root = run.store.chain_root(run.id)
        _ROOTS[run] = root
    return str(effect_key(root, step_key, tool, call_ordinal))


def _stable(obj: object) -> Any:
    return f"<{type(obj).__module__}.{type(obj).__qualname__}>"


def args_hash(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    text = json.dumps(
        {"a": list(args), "k": kwargs}, sort_keys=True, default=_stable, separators=(",", ":")
    )
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def redact(value: Any, name: str = "") -> Any:
    """An argument as stored: secrets by name become ``***redacted***``, secrets inside
    text ``***`` (see ``kernelext.core.secrets``), other objects a ``<type>`` placeholder."""
    if name and is_secret_name(name):
        return REDACTED
    if isinstance(value, dict):
        return {str(k): redact(v, str(k)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact(v) for v in value]
    if isinstance(value, str):
        return scrub_text(value)
    if isinstance(value, (int, float, bool)) or value is None:
        return value
    return _stable(value)


def stored_result(result: Any) -> str:
    """The JSON a result is stored (and replayed on resume) as: keys named like a secret
    redacted (not a bare ``token``: model answers have those), registered secrets and URL
    passwords masked. The caller gets it unchanged."""
    return dumps_json(scrub(result, heuristics=False, result=True)).decode()


class Effect:
    """A recorded external effect. Call it like the function it wraps."""

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None,
        resumable: bool,
        retry: bool,
        needs_approval: ApprovalRule = False,
        probe: Callable[..., Any] | None = None,
    ) -> None:
        self.fn = fn
        self.tool = name or fn.__name__
        self.resumable = resumable
        self.retry = retry
        if not isinstance(needs_approval, bool) and not callable(needs_approval):
            raise TypeError(
                f"@kx.effect(needs_approval=...) takes True/False or a function of the call's "
                f"arguments that returns whether it needs approval, not {needs_approval!r}."
            )
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
        self.takes_key = resumable and "idempotency_key" in params
        self._where = f"a call of effect {self.tool}"  # where a swallowed stop is raised again
        functools.update_wrapper(self, fn)

    def __repr__(self) -> str:
        approval = ", needs approval" if self.needs_approval is not False else ""
        return f"<kernelext effect {self.tool!r} resumable={self.resumable}{approval}>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        run = current_run()
        if run is None:  # outside a run: a plain call, nothing recorded (documented)
            return self.fn(*args, **kwargs)
        run.enforce_stop(self._where)  # a stop the agent's code swallowed is raised again
        kwargs.pop("idempotency_key", None)
        step_key, step_ordinal, call_ordinal = run.next_call()
        key = effect_key(run.id, step_key, self.tool, call_ordinal)
        digest = args_hash(args, kwargs)
        gated = self._gated(args, kwargs)
        row = run.effects.get(key)
        if row is not None:
            replay = self._replay(run, key, row, digest, gated)
            if replay is not _PERFORM:
                return replay
        else:
            row = {
                "key": key,
                "run_id": run.id,
                "step_key": step_key,
                "step_ordinal": step_ordinal,
                "tool": self.tool,
                "call_ordinal": call_ordinal,
                "args_hash": digest,
                "args": self._redacted_args(args, kwargs),
                "resumable": self.resumable,
            }
            existing = self._record_intent(run, row, gated)
            if existing is not None:
                replay = self._replay(run, key, {**row, **existing}, digest, gated)
                if replay is not _PERFORM:
                    return replay
        run.effects[key] = {**row, "status": EffectStatus.PENDING}
        run.notify("effect", (self.tool, key, EffectStatus.PENDING))
        return self._perform(run, key, args, kwargs)

    # -- approval: one approved request, bound to key and arguments, per call ---------------
    def _gated(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        rule = self.needs_approval
        return bool(rule(*args, **kwargs)) if callable(rule) else rule

    def _record_intent(self, run: Run, row: dict[str, Any], gated: bool) -> dict[str, Any] | None:
        """Record the intent (durable before the call); a gated call first consumes its
        approval. Returns the ledger row when the call has an intent already."""
        if not gated:
            with run.critical():
                return run.store.write_intent(row)
        for _ in range(2):  # an approval that lapsed meanwhile: the second look asks again
            grant = self._approval(run, row)
            with run.critical():
                consumed, existing = run.store.write_intent_consuming_approval(row, grant)
            if existing is not None or consumed:
                return existing
        raise LedgerError(f"The approval of {self.tool} (key {row['key']}) could not be used.")

    def _retry(self, run: Run, row: dict[str, Any], gated: bool) -> None:
        """Make a decided call again under its key; a gated one needs a new approval."""
        key = row["key"]
        if gated:
            for _ in range(2):
                grant = self._approval(run, row)
                with run.critical():
                    if run.store.consume_approval(grant, run.id):
                        break
            else:
                raise LedgerError(f"The approval of {self.tool} (key {key}) could not be used.")
        run.store.retry_intent(key)

    def _approval(self, run: Run, row: dict[str, Any]) -> Any:
        """The id of the approved request for this very call (key and argument hash).

        Otherwise the run suspends here (reason ``approval``) before anything is sent:
        after recording a request when none is open for these arguments, or again while
        the open one waits. A rejected request raises ``EffectRejected``.
        """
        store, key = run.store, row["key"]
        now = store.now()
        current = store.current_approval(key)
        if current is not None and current["args_hash"] == row["args_hash"]:
            if current["decision"] == REJECTED:
                note = current["note"]
                raise EffectRejected(
                    f"{self.tool} (key {key}) was rejected by {current['actor']}"
                    + (f": {note}" if note else "")
                    + ". The call was not made. Catch kx.EffectRejected in the agent to take "
                    "another path (an LLM agent can tell the model the user declined).",
                    key=str(key),
                    tool=self.tool,
                    note=note,
                )
            expires = current["expires_at"]
            if expires is None or expires > now:
                if current["decision"] == APPROVED:
                    return current["id"]
                wait_for_person(run, Reason.APPROVAL, expires, self._waiting(run))
        deadline = runtime().settings.expiry.deadline(Reason.APPROVAL, now)
        with run.critical():
            store.request_approval(
                {
                    "key": key,
                    "run_id": run.id,
                    "step": row["step_key"],
                    "step_ordinal": row.get("step_ordinal"),
                    "call_ordinal": row["call_ordinal"],
                    "tool": self.tool,
                    "args_hash": row["args_hash"],
                    "args": row.get("args"),
                    "expires_at": deadline,
                }
            )
        run.notify("approval", (self.tool, key, "requested"))
        wait_for_person(run, Reason.APPROVAL, deadline, self._waiting(run))

    def _waiting(self, run: Run) -> str:
        return f"{self.tool} waits for approval: kx.approvals({run.id!r})"

    # -- the call itself -----------------------------------------------------------
    @staticmethod
    def idempotency_key(run: Run, key: uuid.UUID) -> str:
        """The ``idempotency_key`` handed over for the call recorded under ``key``."""
        row = run.effects[key]
        return idempotency_key_for(run, row["step_key"], row["tool"], int(row["call_ordinal"]))

    def _perform(
        self, run: Run, key: uuid.UUID, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        call_kwargs = dict(kwargs)
        if self.takes_key:  # the same in every run of a restart chain (idempotency_key_for)
            call_kwargs["idempotency_key"] = self.idempotency_key(run, key)
        try:
            result = self.fn(*args, **call_kwargs)
        except Exception as exc:
            run.store.write_outcome(key, EffectStatus.FAILED, error=_describe(exc))
            run.effects[key]["status"] = EffectStatus.FAILED
            run.notify("effect", (self.tool, key, EffectStatus.FAILED))
            raise
        except BaseException:
            # A forced stop (or the process going down) mid-call: nobody knows.
            run.store.write_outcome(
                key, EffectStatus.UNKNOWN, error="interrupted during the call", wait=True
            )
            run.store.record_event(
                run.id,
                "effect_unknown",
                wait=False,
                source="engine",
                reason="interrupted during the call",
                detail={"key": str(key), "tool": self.tool},
            )
            run.effects[key]["status"] = EffectStatus.UNKNOWN
            run.notify("effect", (self.tool, key, EffectStatus.UNKNOWN))
            raise
        try:
            encoded = stored_result(result)
        except (TypeError, ValueError):
            run.store.write_outcome(
                key,
                EffectStatus.APPLIED,
                error=f"result of type {type(result).__name__} not stored",
            )
            run.effects[key]["status"] = EffectStatus.APPLIED
            raise SerializationError(
                f"Effect {self.tool} (key {key}) was applied, but its result, a "
                f"{type(result).__name__}, cannot be stored as JSON, so a resume could not "
                "return it. Make the tool return plain values (dict, list, str, numbers)."
            ) from None
        run.store.write_outcome(key, EffectStatus.APPLIED, result=encoded)
        run.effects[key].update(status=EffectStatus.APPLIED, result=encoded)
        run.notify("effect", (self.tool, key, EffectStatus.APPLIED))
        return result

    def _replay(
        self, run: Run, key: uuid.UUID, row: dict[str, Any], digest: str, gated: bool
    ) -> Any:
        if row["args_hash"] != digest:
            raise EffectArgumentsMismatch(
                f"Effect key {key} ({self.tool}, call {row.get('call_ordinal')} of step "
                f"{row.get('step_key')!r} in run {run.id!r}) was first used with other "
                "arguments. A key stands for one call; the same step must make the same calls "
                'on resume. Restore the original arguments (the recorded call: kx.sql("select '
                f"args from effects where key = '{key}'\")). kx.restart does not help: it "
                "carries this applied call and stops here the same way. To make a different "
                "call deliberately, make it in a new step (another step key) or a new run."
            )
        status = row["status"]
        if status == EffectStatus.APPLIED:
            run.notify("effect", (self.tool, key, "replayed"))
            if row.get("result") is None and row.get("error"):
                raise SerializationError(
                    f"Effect {self.tool} (key {key}) was applied but its result was not stored "
                    f"({row['error']}). Reconcile it with a result, or make the tool return JSON."
                )
            return loads_json(row["result"]) if row.get("result") is not None else None
        if status in (EffectStatus.UNKNOWN, EffectStatus.PENDING):
            raise NeedsDecision(
                f"Effect {self.tool} (key {key}) has an unknown outcome. Decide it with "
                f"kx.reconcile({run.id!r}) before the run goes on."
            )
        if status == EffectStatus.NOT_APPLIED:
            self._retry(run, {**row, "key": key}, gated)
            return _PERFORM
        if status == EffectStatus.FAILED:
            if not self.resumable:
                # Listed by kx.reconcile from now on, so that it can be decided.
                run.store.mark_failed_unknown(
                    key, f"resumable=False call failed ({row.get('error')}); may have happened"
                )
                row["status"] = EffectStatus.UNKNOWN
                raise NeedsDecision(
                    f"Effect {self.tool} (key {key}) is declared resumable=False and failed "
                    f"before ({row.get('error')}); it may have half-happened. Decide it with "
                    f"kx.reconcile({run.id!r})."
                )
            if self.retry:
                self._retry(run, {**row, "key": key}, gated)
                return _PERFORM
            raise EffectFailed(
                f"Effect {self.tool} (key {key}) failed before: {row.get('error')}. It is not "
                "retried silently. Declare @kx.effect(retry=True) to retry failed calls on resume."
            )
        raise LedgerError(f"Effect {self.tool} (key {key}) is {status}; the run cannot go on.")

    def _redacted_args(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        named: dict[str, Any]
        if self.signature is not None:
            try:
                named = dict(self.signature.bind_partial(*args, **kwargs).arguments)
            except TypeError:
                named = {"args": list(args), **kwargs}
        else:
            named = {"args": list(args), **kwargs}
        return json.dumps({k: redact(v, k) for k, v in named.items()}, default=_stable)


_PERFORM = object()


def _describe(exc: BaseException) -> str:
    """The error text stored for a failed call: scrubbed, then cut (never the other way
    round, which could leave the start of a secret behind)."""
    return scrub_text(f"{type(exc).__name__}: {exc}")[:2000]


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
) -> Effect | Callable[[Callable[..., Any]], Effect]:
    """Declare an external effect: ``@kx.effect`` or ``@kx.effect(resumable=False)``.

    ``needs_approval=True`` (or a function of the call's arguments, e.g.
    ``lambda to, amount, **kw: amount > 100``): inside a run, a call waits for a person.
    The first call records an approval request bound to the call's key and argument hash
    and suspends the run (reason ``approval``) before anything is sent; after
    ``kx.approvals(run_id)[0].approve()`` the resumed call consumes the approval, once.
    A rejection raises ``kx.EffectRejected`` at the call. ``probe`` registers a function
    that tells whether a call with an unknown outcome happened (see ``kernelext.core.probes``).
    """

    def wrap(func: Callable[..., Any]) -> Effect:
        return Effect(
            func,
            name=name,
            resumable=resumable,
            retry=retry,
            needs_approval=needs_approval,
            probe=probe,
        )

    return wrap(fn) if fn is not None else wrap
