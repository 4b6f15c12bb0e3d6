"""``@kx.effect(retries=N, retry_on=...)``: a call made again only when that cannot repeat it.

The attempts of one call run inside the ledger's ``_perform``, between its intent (written
once) and its outcome (written once, with ``attempts``: how many times the call was made
under its key, across resumes too). Its invariants:

1. **Retries never guess.** A failure is classified by :func:`classify` (``KINDS``) and
   judged by :func:`judge`. A call is made again only when it provably did not reach its
   target (``not sent``: the connection was never established: refused, a DNS failure, a
   connect timeout; and it was the call's only connection, as what the call did on the
   network shows (``kernelext._core.ledger.evidence``): a redirect to a host that is down fails
   the same way after the first request was received), when the tool takes
   ``idempotency_key`` (the same key every attempt, so a target that dedupes on it applies
   the call once: HTTP 429, 500, 502, 503, 504 and a request with no answer are retried),
   or when the effect says the failure is safe (``retry_on=(429, 503)``: statuses and
   exception classes the user knows the target answers before it acts). Without a key,
   any other failure after the request left is not made again: HTTP 429, 502, 503 or 504
   (a proxy answers so after its upstream may have received the request), a timeout, a
   reset, a truncated answer and a failed connection not proven the call's only one
   (``may have been sent``) make the call
   ``unknown`` (``NeedsDecision``: a person or a probe decides it with ``kx.reconcile``);
   any other answer (a 500, a 4xx) is ``failed`` and marked as having reached its target
   (the ``effect_reached`` event), so ``kx.restart`` carries it as ``unknown`` instead of
   making it again, and so is an exception that is no network error raised after the call
   sent a request or opened a connection (``went_on_the_network``: a ``KeyError`` reading
   the answer); one raised with nothing sent stays plainly ``failed``. This holds with
   ``retries=0`` too: the call is then made once.
2. **Waits are exponential, jittered, and honour the server.** Attempt ``n`` fails, then
   the call waits ``0.5 s × 2^(n-1)`` (at most 30 s) times a random factor in [0.5, 1];
   a ``Retry-After`` (or ``retry-after-ms``) header on the exception (``exc.headers``,
   ``exc.response.headers``: urllib, httpx, requests, the OpenAI SDK) replaces that wait,
   plus up to 10 % of jitter. A ``Retry-After`` over ``MAX_RETRY_AFTER`` is not waited
   for: the call fails with the server's error. Each retry waits for a rate slot of the
   effect's ``limit`` too.
3. **A stop lands in a wait.** The call's last attempt failed and nothing is in flight:
   the row is recorded ``not_applied`` (its error says which failure and that a stop came
   during the wait), so nothing is pending and a resume makes the call again under the
   same key and idempotency key. A forced stop lands there the same way.

``tenacity`` was looked at for the loop: its hooks (``retry=``, ``wait=``, ``sleep=``)
would each be custom here (the ledger's classification, ``Retry-After``, a wait that a
stop interrupts and that records the row), so the loop is written out below.
"""

from __future__ import annotations

import json
import math
import random
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from ...errors import NeedsDecision, StopRequested
from ...status import EffectStatus
from ..encoding.secrets import scrubbed_excerpt
from . import limits
from .effect_approval import left_inside
from .evidence import Evidence, proves_not_sent, watching, went_on_the_network
from .failures import (
    ANSWERED,
    KINDS,
    NO_ANSWER,
    NOT_SENT,
    UNPROVEN,
    Failure,
    classify,
    retry_after,
    wrapped_chain,
)

if TYPE_CHECKING:
    from ..engine.run_engine import RunEngine
    from .effect import Effect

__all__ = [
    "ANSWERED",
    "KINDS",
    "MAX_RETRY_AFTER",
    "NOT_SENT",
    "NO_ANSWER",
    "REACHED_EVENT",
    "UNPROVEN",
    "Failure",
    "backoff",
    "check_retries",
    "check_retry_on",
    "classify",
    "held_on_resume",
    "judge",
    "judged_once",
    "made_with_retries",
    "settled",
]

T = TypeVar("T")
RetryOn = tuple[int | type[BaseException], ...]  # retry_on: statuses, exception classes

BASE_DELAY = 0.5  # seconds before the first retry (before jitter)
MAX_DELAY = 30.0  # the longest wait between two attempts, unless the server asks for more
MAX_RETRY_AFTER = 300.0  # a server asking for a longer wait gets the failure instead
# The verdicts of ``judge``: made again, unknown (not made again), failed, or failed after
# the request may have reached its target (kx.restart carries it as unknown).
RETRY, UNKNOWN, FAILED, REACHED = "make again", "outcome unknown", "no retry", "may have reached"
REACHED_EVENT = "effect_reached"  # a failed key-less call that may have reached its target
DEDUPED_STATUSES = frozenset({429, 500, 502, 503, 504})  # retried when the target dedupes
UNKNOWN_STATUSES = frozenset({429, 502, 503, 504})  # a proxy's answer: the upstream may have it


def check_retries(where: str, value: object) -> int:
    """A whole number of retries, >= 0."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f"{where} takes a whole number of retries (0 or more; 0: the call is made once), "
            f"not {type(value).__name__} {value!r}."
        )
    if value < 0:
        raise ValueError(
            f"{where}: {value} is not a number of retries. Give 0 or more (3: a call that "
            "fails transiently is made at most 4 times)."
        )
    return value


def check_retry_on(where: str, value: object, retries: int) -> RetryOn:
    """HTTP statuses (100-599) and exception classes, as a tuple (one alone is accepted)."""
    items = tuple(value) if isinstance(value, (tuple, list, set, frozenset)) else (value,)
    for item in items:
        status = isinstance(item, int) and not isinstance(item, bool) and 100 <= item <= 599
        if not status and not (isinstance(item, type) and issubclass(item, Exception)):
            raise TypeError(
                f"{where} takes HTTP statuses and exception classes that the target answers "
                "before it acts, e.g. retry_on=(429, 503) or retry_on=(MyApiBusy,); "
                f"{item!r} is neither (statuses are whole numbers 100-599)."
            )
    if items and not retries:
        raise ValueError(
            f"{where}={items!r} names failures to make again, but retries=0 makes the call "
            "once. Give retries too: @kx.effect(retries=3, retry_on=...)."
        )
    return items


def _declared(retry_on: RetryOn, chain: list[BaseException], failure: Failure | None) -> bool:
    """The effect's ``retry_on`` names this failure (its status or one of its exceptions)."""
    status = failure.status if failure is not None else None
    for item in retry_on:
        if isinstance(item, int):
            if item == status:
                return True
        elif any(isinstance(exc, item) for exc in chain):
            return True
    return False


def judge(effect: Effect, exc: BaseException, evidence: Evidence | None) -> tuple[str, Failure]:
    """What the rule (the module's invariant 1) makes of ``exc``: ``RETRY``, ``UNKNOWN``,
    ``FAILED`` or ``REACHED``, with the failure (its wait, its status). ``evidence``: what
    the attempt did on the network (``None``: nothing seen, so never proven unsent)."""
    failure = classify(exc)
    found = failure or Failure("other", retry_after(exc))
    chain = wrapped_chain(exc)
    if _declared(effect.retry_on, chain, failure):
        return RETRY, found
    if failure is None:  # no network error: the tool's own, before or after it sent
        went_out = not effect.dedupes and went_on_the_network(evidence)
        return (REACHED if went_out else FAILED), found
    if failure.kind == NOT_SENT:
        if proves_not_sent(evidence, chain):
            return RETRY, failure
        failure = Failure(UNPROVEN, failure.retry_after)
    if effect.dedupes:
        again = failure.kind in (NO_ANSWER, UNPROVEN) or failure.status in DEDUPED_STATUSES
        return (RETRY if again else FAILED), failure
    if failure.kind in (NO_ANSWER, UNPROVEN) or failure.status in UNKNOWN_STATUSES:
        return UNKNOWN, failure
    return REACHED, failure


def backoff(attempt: int, failure: Failure) -> float | None:
    """Seconds to wait after attempt ``attempt`` failed (``None``: the server asked for
    more than ``MAX_RETRY_AFTER``)."""
    if failure.retry_after is not None:
        if failure.retry_after > MAX_RETRY_AFTER:
            return None
        return failure.retry_after * (1 + 0.1 * random.random())
    grown = BASE_DELAY * 2.0 ** min(attempt - 1, 32)
    return float(min(MAX_DELAY, grown) * random.uniform(0.5, 1.0))


def settled(run: RunEngine, key: uuid.UUID) -> bool:
    """The attempts recorded the call's outcome themselves (a stop in a wait, a call that
    may have happened): the ledger writes no other."""
    return bool(run.effects[key]["status"] != EffectStatus.PENDING)


def made_with_retries(effect: Effect, run: RunEngine, key: uuid.UUID, call: Callable[[], T]) -> T:
    """``call()``, made again as the module says."""
    row = run.effects[key]
    before = int(row.get("attempts") or 0)
    attempt = 0
    while True:
        attempt += 1
        row["attempts"] = before + attempt
        evidence: Evidence | None = None
        try:
            limits.sent()  # the rate window counts the call from now (kx.limit)
            with watching() as evidence:  # what proves a failed attempt never left
                return call()
        except Exception as exc:
            if left_inside(exc) is not None:  # a call made inside was rejected: no failure
                raise
            verdict, failure = judge(effect, exc, evidence)
            if verdict == UNKNOWN:
                raise _unknown(effect, run, key, exc, failure) from exc
            delay = backoff(attempt, failure) if verdict == RETRY else None
            if delay is None or attempt > effect.retries:
                if verdict == REACHED:
                    _reached(effect, run, key, failure)
                raise
            try:
                _pause(run, delay)
                limits.rate_slot(run)
            except StopRequested:
                _not_applied(effect, run, key, exc, attempt)
                raise


def judged_once(
    effect: Effect, run: RunEngine, key: uuid.UUID, exc: BaseException, evidence: Evidence | None
) -> NeedsDecision | None:
    """The rule for a call that is made once (an ``async def`` tool): ``unknown`` recorded
    and its ``NeedsDecision`` returned, or ``None`` (the ledger records ``failed``)."""
    verdict, failure = judge(effect, exc, evidence)
    if verdict == UNKNOWN:
        return _unknown(effect, run, key, exc, failure)
    if verdict == REACHED:
        _reached(effect, run, key, failure)
    return None


class Deduping(Protocol):
    """What the rule reads of an effect: its tool, and whether its target dedupes."""

    tool: str
    dedupes: bool


def held_on_resume(effect: Deduping, run: RunEngine, key: uuid.UUID, row: dict[str, Any]) -> None:
    """A failed call that ``retry=True`` would make again on resume: refused when it may
    have reached its target (no ``idempotency_key``, and answered after its request left:
    ``REACHED_EVENT``). It becomes ``unknown`` and waits for a person (``kx.reconcile``),
    as ``kx.restart`` carries it: ``retry=True`` makes again only a call provably never
    sent, or one whose target dedupes on its key."""
    if effect.dedupes or not _reached_before(run, key):
        return
    note = f"failed after its request may have reached the target ({row.get('error')})"
    run.store.mark_failed_unknown(key, scrubbed_excerpt(note, 2000))
    row["status"] = EffectStatus.UNKNOWN
    raise NeedsDecision(
        f"Effect {effect.tool} (key {key}) {note}; retry=True does not make it again, since "
        "the tool takes no idempotency_key and the target may have applied it. It is now "
        f"unknown: decide it with kx.reconcile({run.id!r}): mark_applied(result=...) if it "
        "happened, mark_not_applied() to make it again on the next resume."
    )


def _reached_before(run: RunEngine, key: uuid.UUID) -> bool:
    for event in run.store.events(run.id):
        if event["kind"] == REACHED_EVENT:
            detail = event.get("detail")
            found = json.loads(detail) if isinstance(detail, str) else detail or {}
            if str(found.get("key")) == str(key):
                return True
    return False


def _pause(run: RunEngine, seconds: float) -> None:
    """Sleep ``seconds``; a stop lands at once (``StopRequested``)."""
    deadline = time.monotonic() + seconds
    while True:
        run.safe_point()
        left = deadline - time.monotonic()
        if left <= 0 or math.isnan(left):
            return
        run.stop_event.wait(min(left, limits.TICK))


def _text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _not_applied(
    effect: Effect, run: RunEngine, key: uuid.UUID, exc: BaseException, attempt: int
) -> None:
    """A stop during the wait after attempt ``attempt`` failed: nothing is in flight, and
    a resume makes the call again (``not_applied``)."""
    note = scrubbed_excerpt(
        f"{_text(exc)} (attempt {attempt}); a stop came while it waited to be made again: "
        "made again on resume, under the same key",
        2000,
    )
    with run.force.critical():
        run.store.write_outcome(
            key,
            EffectStatus.NOT_APPLIED,
            error=note,
            attempts=int(run.effects[key]["attempts"]),
            wait=True,
        )
        run.effects[key].update(status=EffectStatus.NOT_APPLIED, error=note)
    run.notify("effect", (effect.tool, key, EffectStatus.NOT_APPLIED))


def _reached(effect: Effect, run: RunEngine, key: uuid.UUID, failure: Failure) -> None:
    """A key-less call answered with an error after the request left: it is ``failed``
    (the ledger writes that next), and it may have reached its target, which
    ``kx.restart`` reads here (``REACHED_EVENT``) to carry it as unknown."""
    with run.force.critical():
        run.store.record_event(
            run.id,
            REACHED_EVENT,
            wait=True,
            source="engine",
            reason=(
                f"answered HTTP {failure.status} after the request left"
                if failure.status is not None
                else "raised after a request went out (a connection was opened)"
            ),
            detail={"key": str(key), "tool": effect.tool, "status": failure.status},
        )


def _after_sending(failure: Failure) -> str:
    if failure.kind == UNPROVEN:
        return (
            "a connection failed after the call had made another (a redirect followed, "
            "a second request), or nothing showed it was the only one"
        )
    if failure.status is not None:
        return (
            f"the request left and HTTP {failure.status} came back (a proxy answers so "
            "after its upstream may have received the request)"
        )
    return "the request left and no answer came"


def _unknown(
    effect: Effect, run: RunEngine, key: uuid.UUID, exc: BaseException, failure: Failure
) -> NeedsDecision:
    """A call without ``idempotency_key`` that may have been applied: ``unknown``."""
    why = _after_sending(failure)
    declare = f"retry_on=({failure.status},)" if failure.status else "retry_on=(TheError,)"
    hint = (
        "if this target answers so only before it acts, say so: "
        f"@kx.effect(retries={effect.retries or 3}, {declare})"
    )
    note = scrubbed_excerpt(
        f"{_text(exc)}: the request may have been applied ({why}); not made again, the "
        f"tool takes no idempotency_key ({hint})",
        2000,
    )
    with run.force.critical():
        run.store.write_outcome(
            key,
            EffectStatus.UNKNOWN,
            error=note,
            attempts=run.effects[key].get("attempts"),
            wait=True,
        )
        run.effects[key]["status"] = EffectStatus.UNKNOWN
        run.store.record_event(
            run.id,
            "effect_unknown",
            wait=False,
            source="engine",
            reason=note,
            detail={"key": str(key), "tool": effect.tool},
        )
    run.notify("effect", (effect.tool, key, EffectStatus.UNKNOWN))
    return NeedsDecision(
        f"Effect {effect.tool} (key {key}) may have happened: {_text(exc)}; {why}. It is "
        "recorded as unknown and not made again, since the tool takes no idempotency_key "
        "(a target that dedupes by it would apply a retry once). Decide it with "
        f"kx.reconcile({run.id!r}): mark_applied(result=...) if it happened, "
        f"mark_not_applied() to make it again on resume; {hint}."
    )
