"""``@kx.effect(retries=N)``: transient failures made again, under the same key.

The attempts of one call run inside the ledger's ``_perform``, between its intent (written
once) and its outcome (written once, with ``attempts``: how many times the call was made
under its key, across resumes too). Its invariants:

1. **Only what did not happen, or what cannot happen twice, is made again.** A failure is
   classified by :func:`classify` (see ``KINDS``): a request refused before the server
   acted (HTTP 429 or 503, a connection refused, a connect timeout) is retried for every
   tool; one the server may have acted on (HTTP 500, 502 or 504; a timeout or a reset
   after the request left) only for a tool that takes ``idempotency_key`` (the same key
   every attempt, so an API that dedupes applies it once). Without that parameter an
   answered 5xx is ``failed`` as without retries, and a request that got no answer is
   ``unknown``: kernelext cannot know whether it happened (``NeedsDecision``; decide it
   with ``kx.reconcile``). Any other exception is ``failed`` at once.
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
4. **``retries=0`` changes nothing**: the call is made once and any exception is
   ``failed``, as before.

``tenacity`` was looked at for the loop: its hooks (``retry=``, ``wait=``, ``sleep=``)
would each be custom here (the ledger's classification, ``Retry-After``, a wait that a
stop interrupts and that records the row), so the loop is written out below.
"""

from __future__ import annotations

import email.utils
import http.client
import math
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from ..errors import NeedsDecision, StopRequested
from ..status import EffectStatus
from . import limits
from .secrets import scrubbed_excerpt

if TYPE_CHECKING:
    from .ledger import Effect
    from .run_engine import RunEngine

__all__ = [
    "KINDS",
    "MAX_RETRY_AFTER",
    "Failure",
    "backoff",
    "check_retries",
    "classify",
    "made_with_retries",
    "settled",
]

T = TypeVar("T")

BASE_DELAY = 0.5  # seconds before the first retry (before jitter)
MAX_DELAY = 30.0  # the longest wait between two attempts, unless the server asks for more
MAX_RETRY_AFTER = 300.0  # a server asking for a longer wait gets the failure instead
REFUSED, ANSWERED, NO_ANSWER = "refused", "answered", "no answer"
KINDS = {
    REFUSED: "the request was refused before the server acted: retried for every tool",
    ANSWERED: "the server answered with an error after it may have acted: retried only for "
    "a tool that takes idempotency_key, else failed",
    NO_ANSWER: "the request left and no answer came: retried only for a tool that takes "
    "idempotency_key, else unknown",
}
STATUSES = {429: REFUSED, 503: REFUSED, 500: ANSWERED, 502: ANSWERED, 504: ANSWERED}
# Clients' exception classes by name (and their bases), from these packages only.
CLIENTS = frozenset({"httpx", "httpcore", "openai", "requests", "urllib3", "aiohttp"})
NOT_SENT_NAMES = frozenset({"ConnectError", "ConnectTimeout", "PoolTimeout", "NewConnectionError"})
NO_ANSWER_NAMES = frozenset(
    {
        "ReadTimeout",
        "WriteTimeout",
        "ReadError",
        "WriteError",
        "RemoteProtocolError",
        "ProtocolError",
        "APITimeoutError",
        "APIConnectionError",
        "TimeoutException",
        "Timeout",
        "ServerDisconnectedError",
    }
)
_NO_ANSWER_TYPES = (
    TimeoutError,
    ConnectionResetError,
    ConnectionAbortedError,
    BrokenPipeError,
    http.client.IncompleteRead,
)


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


@dataclass(frozen=True)
class Failure:
    """A transient failure: its kind (``KINDS``) and the wait the server asked for."""

    kind: str
    retry_after: float | None = None
    status: int | None = None


def _attr(holder: object, name: str) -> object:
    """``holder.name``, or None: a client's property may raise when unset (httpx's
    ``request``), and classifying must never fail the call a second time."""
    try:
        return getattr(holder, name, None)
    except Exception:
        return None


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and what it wraps (its cause, a ``reason``, an exception as first argument)."""
    seen: list[BaseException] = []
    todo: list[BaseException] = [exc]
    while todo and len(seen) < 8:
        item = todo.pop(0)
        if any(item is s for s in seen):
            continue
        seen.append(item)
        for inner in (item.__cause__, _attr(item, "reason"), *item.args[:1]):
            if isinstance(inner, BaseException):
                todo.append(inner)
    return seen


def _status(exc: BaseException) -> int | None:
    for holder in (exc, _attr(exc, "response")):
        for name in ("status_code", "status", "code"):
            value = _attr(holder, name)
            if isinstance(value, int) and not isinstance(value, bool) and 100 <= value <= 599:
                return value
    return None


def retry_after(exc: BaseException) -> float | None:
    """Seconds the server asked to wait (``Retry-After``: seconds or an HTTP date;
    ``retry-after-ms``), from the exception's headers or its response's."""
    for holder in (exc, _attr(exc, "response")):
        getter = _attr(_attr(holder, "headers"), "get")
        if not callable(getter):
            continue
        millis = getter("retry-after-ms") or getter("Retry-After-Ms")
        if millis is not None:
            try:
                return max(float(millis) / 1000, 0.0)
            except (TypeError, ValueError):
                pass
        value = getter("Retry-After") or getter("retry-after")
        if value is None:
            continue
        try:
            return max(float(value), 0.0)
        except (TypeError, ValueError):
            pass
        try:
            when = email.utils.parsedate_to_datetime(str(value))
        except (TypeError, ValueError):
            continue
        return max(when.timestamp() - time.time(), 0.0)
    return None


def _transport(exc: BaseException) -> str | None:
    if isinstance(exc, ConnectionRefusedError):
        return REFUSED
    if type(exc).__module__.split(".")[0] in CLIENTS:
        names = {cls.__name__ for cls in type(exc).__mro__}
        if names & NOT_SENT_NAMES:
            return REFUSED
        if names & NO_ANSWER_NAMES:
            return NO_ANSWER
    if isinstance(exc, _NO_ANSWER_TYPES):
        return NO_ANSWER
    return None


def classify(exc: BaseException) -> Failure | None:
    """The transient failure ``exc`` is, or ``None`` (not transient: not retried).

    HTTP statuses (``exc.status_code``, ``exc.code``, ``exc.response.status_code``): 429 and
    503 refused, 500, 502 and 504 answered. Transport errors, the innermost one wrapped
    deciding: a connection refused and a connect timeout refused; a timeout, a reset, a
    broken pipe or a truncated answer after the request left, no answer.
    """
    chain = _chain(exc)
    for item in chain:
        status = _status(item)
        if status is not None:
            kind = STATUSES.get(status)
            return Failure(kind, retry_after(item), status) if kind is not None else None
    for item in reversed(chain):
        kind = _transport(item)
        if kind is not None:
            return Failure(kind)
    return None


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
    """``call()``, made again after transient failures as the module says."""
    row = run.effects[key]
    before = int(row.get("attempts") or 0)
    attempt = 0
    while True:
        attempt += 1
        row["attempts"] = before + attempt
        try:
            limits.sent()  # the rate window counts the call from now (kx.limit)
            return call()
        except Exception as exc:
            failure = classify(exc) if effect.retries else None
            if failure is None:
                raise
            if failure.kind == NO_ANSWER and not effect.takes_key:
                raise _unknown(effect, run, key, exc) from exc
            if failure.kind == ANSWERED and not effect.takes_key:
                raise
            delay = backoff(attempt, failure)
            if attempt > effect.retries or delay is None:
                raise
            try:
                _pause(run, delay)
                limits.rate_slot(run)
            except StopRequested:
                _not_applied(effect, run, key, exc, attempt)
                raise


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


def _unknown(effect: Effect, run: RunEngine, key: uuid.UUID, exc: BaseException) -> NeedsDecision:
    """The request left and no answer came, for a tool without ``idempotency_key``."""
    note = scrubbed_excerpt(
        f"{_text(exc)}: the request may have been applied (it left, no answer came); not "
        "made again, the tool takes no idempotency_key",
        2000,
    )
    with run.force.critical():
        run.store.write_outcome(
            key,
            EffectStatus.UNKNOWN,
            error=note,
            attempts=int(run.effects[key]["attempts"]),
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
        f"Effect {effect.tool} (key {key}) may have happened: {_text(exc)} after the request "
        "left, and no answer came. It is recorded as unknown and not made again, since the "
        "tool takes no idempotency_key (an API that dedupes by it would apply a retry once). "
        f"Decide it with kx.reconcile({run.id!r}): mark_applied(result=...) if it happened, "
        "mark_not_applied() to make it again on resume."
    )
