"""``@kx.effect``: external effects recorded at apply time under a deterministic key."""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import uuid
from collections.abc import Callable
from typing import Any, overload

from ..errors import EffectArgumentsMismatch, LedgerError, NeedsDecision, SerializationError
from .codec import dumps_json, loads_json
from .context import current_run
from .run import Run
from .secrets import REDACTED, SECRET_NAME, is_secret_name, scrub, scrub_text

__all__ = ["REDACTED", "SECRET_NAME", "Effect", "EffectFailed", "effect", "effect_key", "redact"]


class EffectFailed(LedgerError):
    """An effect failed before; by default it is not retried silently on resume."""


def effect_key(run_id: str, step_key: str, tool: str, call_ordinal: int) -> uuid.UUID:
    """The deterministic 128-bit key of one call: run, step, tool and ordinal in the step."""
    raw = "\0".join((run_id, step_key, tool, str(call_ordinal))).encode()
    return uuid.UUID(bytes=hashlib.sha256(raw).digest()[:16])


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
        self, fn: Callable[..., Any], *, name: str | None, resumable: bool, retry: bool
    ) -> None:
        self.fn = fn
        self.tool = name or fn.__name__
        self.resumable = resumable
        self.retry = retry
        try:
            self.signature: inspect.Signature | None = inspect.signature(fn)
        except (TypeError, ValueError):
            self.signature = None
        params = self.signature.parameters if self.signature else {}
        self.takes_key = resumable and "idempotency_key" in params
        self._where = f"a call of effect {self.tool}"  # where a swallowed stop is raised again
        functools.update_wrapper(self, fn)

    def __repr__(self) -> str:
        return f"<kernelext effect {self.tool!r} resumable={self.resumable}>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        run = current_run()
        if run is None:  # outside a run: a plain call, nothing recorded (documented)
            return self.fn(*args, **kwargs)
        run.enforce_stop(self._where)  # a stop the agent's code swallowed is raised again
        kwargs.pop("idempotency_key", None)
        step_key, step_ordinal, call_ordinal = run.next_call()
        key = effect_key(run.id, step_key, self.tool, call_ordinal)
        digest = args_hash(args, kwargs)
        row = run.effects.get(key)
        if row is not None:
            replay = self._replay(run, key, row, digest)
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
            with run.critical():
                existing = run.store.write_intent(row)
            if existing is not None:
                replay = self._replay(run, key, {**row, **existing}, digest)
                if replay is not _PERFORM:
                    return replay
        run.effects[key] = {**row, "status": "pending"}
        run.notify("effect", (self.tool, key, "pending"))
        return self._perform(run, key, args, kwargs)

    # -- the call itself -----------------------------------------------------------
    def _perform(
        self, run: Run, key: uuid.UUID, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        call_kwargs = dict(kwargs)
        if self.takes_key:
            call_kwargs["idempotency_key"] = str(key)
        try:
            result = self.fn(*args, **call_kwargs)
        except Exception as exc:
            run.store.write_outcome(key, "failed", error=_describe(exc))
            run.effects[key]["status"] = "failed"
            run.notify("effect", (self.tool, key, "failed"))
            raise
        except BaseException:
            # A forced stop (or the process going down) mid-call: nobody knows.
            run.store.write_outcome(key, "unknown", error="interrupted during the call", wait=True)
            run.store.record_event(
                run.id,
                "effect_unknown",
                wait=False,
                source="engine",
                reason="interrupted during the call",
                detail={"key": str(key), "tool": self.tool},
            )
            run.effects[key]["status"] = "unknown"
            run.notify("effect", (self.tool, key, "unknown"))
            raise
        try:
            encoded = stored_result(result)
        except (TypeError, ValueError):
            run.store.write_outcome(
                key, "applied", error=f"result of type {type(result).__name__} not stored"
            )
            run.effects[key]["status"] = "applied"
            raise SerializationError(
                f"Effect {self.tool} (key {key}) was applied, but its result, a "
                f"{type(result).__name__}, cannot be stored as JSON, so a resume could not "
                "return it. Make the tool return plain values (dict, list, str, numbers)."
            ) from None
        run.store.write_outcome(key, "applied", result=encoded)
        run.effects[key].update(status="applied", result=encoded)
        run.notify("effect", (self.tool, key, "applied"))
        return result

    def _replay(self, run: Run, key: uuid.UUID, row: dict[str, Any], digest: str) -> Any:
        if row["args_hash"] != digest:
            raise EffectArgumentsMismatch(
                f"Effect key {key} ({self.tool}, call {row.get('call_ordinal')} of step "
                f"{row.get('step_key')!r} in run {run.id!r}) was first used with other "
                "arguments. A key stands for one call; the same step must make the same calls "
                "on resume. Restore the original arguments, or restart the run with kx.restart."
            )
        status = row["status"]
        if status == "applied":
            run.notify("effect", (self.tool, key, "replayed"))
            if row.get("result") is None and row.get("error"):
                raise SerializationError(
                    f"Effect {self.tool} (key {key}) was applied but its result was not stored "
                    f"({row['error']}). Reconcile it with a result, or make the tool return JSON."
                )
            return loads_json(row["result"]) if row.get("result") is not None else None
        if status in ("unknown", "pending"):
            raise NeedsDecision(
                f"Effect {self.tool} (key {key}) has an unknown outcome. Decide it with "
                f"kx.reconcile({run.id!r}) before the run goes on."
            )
        if status == "not_applied":
            run.store.retry_intent(key)
            return _PERFORM
        if status == "failed":
            if not self.resumable:
                # Listed by kx.reconcile from now on, so that it can be decided.
                run.store.mark_failed_unknown(
                    key, f"resumable=False call failed ({row.get('error')}); may have happened"
                )
                row["status"] = "unknown"
                raise NeedsDecision(
                    f"Effect {self.tool} (key {key}) is declared resumable=False and failed "
                    f"before ({row.get('error')}); it may have half-happened. Decide it with "
                    f"kx.reconcile({run.id!r})."
                )
            if self.retry:
                run.store.retry_intent(key)
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
    fn: None = None, /, *, name: str | None = None, resumable: bool = True, retry: bool = False
) -> Callable[[Callable[..., Any]], Effect]: ...


def effect(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    resumable: bool = True,
    retry: bool = False,
) -> Effect | Callable[[Callable[..., Any]], Effect]:
    """Declare an external effect: ``@kx.effect`` or ``@kx.effect(resumable=False)``."""

    def wrap(func: Callable[..., Any]) -> Effect:
        return Effect(func, name=name, resumable=resumable, retry=retry)

    return wrap(fn) if fn is not None else wrap
