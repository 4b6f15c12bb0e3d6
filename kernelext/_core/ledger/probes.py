"""Effect probes: ask the external system whether an effect with an unknown outcome happened.

``@kx.effect(probe=fn)`` (or ``register_probe(tool, fn)``) gives a tool a probe,
``fn(key, args)``, where ``key`` is the idempotency key the tool was called with and
``args`` its arguments as stored (a dict; secrets redacted). It answers:

* ``"applied"``: the system has the request (a payment API found it by its key);
  ``("applied", result)`` also gives what the call returned, replayed on resume;
* ``"not_applied"``: the system never received it; the resume calls it again, same key;
* ``None``: the system cannot tell.

``settle_unknowns(run_id, store)`` calls the probe of each unknown effect of the run, each
in a thread with a time bound, and records every answer as the decision a person would
make (``Store.decide_effect``, one ``effect_decided`` event), with actor ``probe:<tool>``.
A probe that raises, times out, answers ``None`` or something else leaves its effect
unknown for ``kx.reconcile`` and writes one log line. The resume calls it after taking the
run over and before the run waits for a person.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from ..._store import Store
from ...errors import LedgerError
from ...status import EffectStatus
from ..encoding.codec import dumps_json
from ..process.checks import call_bounded
from ..process.runtime import runtime

__all__ = [
    "PROBE_SOURCE",
    "Probe",
    "Settled",
    "probe_actor",
    "probe_for",
    "register_probe",
    "settle_unknowns",
    "unregister_probe",
]

Probe = Callable[[str, Any], Any]
PROBE_SOURCE = "probe"  # the ``source`` of the events a probe's decision writes
_log = logging.getLogger("kernelext")


@dataclass(frozen=True)
class Settled:
    """One unknown effect a probe decided."""

    key: str
    tool: str
    step_key: str
    decision: str  # ``applied`` or ``not_applied``
    result: Any = None


def register_probe(tool: str, fn: Probe) -> Probe:
    """Give effect ``tool`` a probe ``fn(key, args)`` (see the module docstring)."""
    if not isinstance(tool, str) or not tool:
        raise ValueError(f"A probe belongs to a tool name (a non-empty string), not {tool!r}.")
    if not callable(fn):
        raise TypeError(
            f"The probe of effect {tool!r} must be a function fn(key, args) returning "
            f"{EffectStatus.APPLIED.value!r}, {EffectStatus.NOT_APPLIED.value!r} or None, "
            f"not {type(fn).__name__}."
        )
    rt = runtime()
    with rt.lock:
        rt.probes[tool] = fn
    return fn


def unregister_probe(tool: str) -> None:
    rt = runtime()
    with rt.lock:
        rt.probes.pop(tool, None)


def probe_for(tool: str) -> Probe | None:
    """The probe registered for ``tool`` in this runtime, if any."""
    rt = runtime()
    with rt.lock:
        return rt.probes.get(tool)


def probe_actor(tool: str) -> str:
    """The actor a probe's decision is recorded under: ``probe:<tool>``."""
    return f"probe:{tool}"


def settle_unknowns(
    run_id: str, store: Store, *, timeout: float | None = None, skip: Collection[str] = ()
) -> list[Settled]:
    """Ask the probes of run ``run_id``'s unknown effects; record each clear answer.

    ``timeout`` bounds each probe (default: the ``check_timeout`` setting, 10 s). Returns
    the effects decided; the others stay unknown for ``kx.reconcile``. ``skip``: keys not
    asked now (an earlier owner may still be inside their calls, ``takeover.py``).
    """
    asked = [
        (row, fn)
        for row in store.open_unknowns(run_id)
        if (fn := probe_for(row["tool"])) and str(row["key"]) not in skip
    ]
    if not asked:
        return []
    limit = runtime().settings.check_timeout if timeout is None else timeout
    calls = [_bind(fn, str(row["key"]), _stored_args(row.get("args"))) for row, fn in asked]
    settled: list[Settled] = []
    for (row, _fn), outcome in zip(asked, call_bounded(calls, limit), strict=True):
        tool, key = str(row["tool"]), row["key"]
        if outcome.status != "ok":
            what = "timed out" if outcome.status == "timeout" else f"raised {outcome.detail}"
            _unsettled(run_id, tool, key, what)
            continue
        answer = _answer(outcome.value)
        if answer is None:
            _unsettled(run_id, tool, key, f"could not tell (answered {outcome.value!r})")
            continue
        decision, result = answer
        encoded = dumps_json(result).decode()  # scrubbed by the store's write path
        try:
            store.decide_effect(
                key,
                decision,
                result=encoded,
                who=probe_actor(tool),
                note=f"the probe of {tool} answered {decision}",
                source=PROBE_SOURCE,
            )
        except LedgerError as exc:  # decided meanwhile (a person, another process)
            _unsettled(run_id, tool, key, f"answered {decision}, not recorded: {exc}")
            continue
        settled.append(Settled(str(key), tool, str(row["step_key"]), decision, result))
    return settled


def _bind(fn: Probe, key: str, args: Any) -> Callable[[], Any]:
    return lambda: fn(key, args)


def _stored_args(text: str | None) -> Any:
    if text is None:
        return {}
    try:
        return json.loads(text)
    except ValueError:
        return text


def _answer(value: Any) -> tuple[str, Any] | None:
    """``(decision, result)`` for a clear answer, None for anything else."""
    result: Any = None
    if isinstance(value, tuple) and len(value) == 2 and value[0] == EffectStatus.APPLIED:
        value, result = value
    if value == EffectStatus.APPLIED:
        return str(EffectStatus.APPLIED), result
    if value == EffectStatus.NOT_APPLIED:
        return str(EffectStatus.NOT_APPLIED), None
    return None


def _unsettled(run_id: str, tool: str, key: Any, what: str) -> None:
    _log.warning(
        "kernelext: the probe of effect %s (key %s, run %r) %s; it stays unknown: decide it "
        "with kx.reconcile(%r)",
        tool,
        key,
        run_id,
        what,
        run_id,
    )
