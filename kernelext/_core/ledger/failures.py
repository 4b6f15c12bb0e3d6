"""What a failed call shows about whether its request reached the target (``classify``).

Read by the retry rule (``kernelext._core.ledger.retries``): an HTTP status is an answer (the
request left and something received it); a transport error either proves the connection
was never established (``not sent``) or came after the request left (``no answer``);
anything else shows nothing (``None``). Exceptions are read by their wrapped chain (cause,
``reason``, first argument), the innermost transport error deciding, and client classes
by name, from the clients in ``CLIENTS`` only, so no client has to be installed.
"""

from __future__ import annotations

import email.utils
import http.client
import socket
import time
from dataclasses import dataclass

__all__ = [
    "ANSWERED",
    "KINDS",
    "NOT_SENT",
    "NO_ANSWER",
    "UNPROVEN",
    "Failure",
    "classify",
    "retry_after",
    "wrapped_chain",
]

NOT_SENT, ANSWERED, NO_ANSWER = "not sent", "answered", "no answer"
UNPROVEN = "may have been sent"
KINDS = {
    NOT_SENT: "the connection was never established (refused, DNS failure, connect "
    "timeout) and it was the call's only one (kernelext._core.ledger.evidence): the target "
    "never saw the request; retried for every tool",
    UNPROVEN: "a connection failed, but the call had made another before it (a redirect "
    "followed, a second request) or nothing showed it was the only one: the request may "
    "have reached its target",
    ANSWERED: "an HTTP status came back after the request left: the target (or a proxy "
    "before it) received it",
    NO_ANSWER: "the request left and no answer came (a timeout, a reset, a truncated "
    "answer): it may have been applied",
}
# Clients' exception classes by name (and their bases), from these packages only.
CLIENTS = frozenset(
    {
        "httpx",
        "httpcore",
        "httpx2",
        "httpcore2",
        "openai",
        "anthropic",
        "requests",
        "urllib3",
        "aiohttp",
    }
)
NOT_SENT_NAMES = frozenset(
    {
        "ConnectError",
        "ConnectTimeout",
        "PoolTimeout",
        "NewConnectionError",
        "NameResolutionError",
        "ClientConnectorError",
    }
)
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
_NOT_SENT_TYPES = (ConnectionRefusedError, socket.gaierror)
_NO_ANSWER_TYPES = (
    TimeoutError,
    ConnectionResetError,
    ConnectionAbortedError,
    BrokenPipeError,
    http.client.IncompleteRead,
)


@dataclass(frozen=True)
class Failure:
    """A failure the rule knows: its kind (``KINDS``), the wait the server asked for, and
    its HTTP status if one came back."""

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


def wrapped_chain(exc: BaseException) -> list[BaseException]:
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
    if isinstance(exc, _NOT_SENT_TYPES):
        return NOT_SENT
    if type(exc).__module__.split(".")[0] in CLIENTS:
        names = {cls.__name__ for cls in type(exc).__mro__}
        if names & NOT_SENT_NAMES:
            return NOT_SENT
        if names & NO_ANSWER_NAMES:
            return NO_ANSWER
    if isinstance(exc, _NO_ANSWER_TYPES):
        return NO_ANSWER
    return None


def classify(exc: BaseException) -> Failure | None:
    """The failure ``exc`` is, or ``None`` (nothing shows whether the request left).

    An HTTP status (``exc.status_code``, ``exc.code``, ``exc.response.status_code``) is an
    answer. Transport errors, the innermost one wrapped deciding: a connection refused, a
    DNS failure and a connect timeout were never sent; a timeout, a reset, a broken pipe or
    a truncated answer came after the request left (no answer).
    """
    chain = wrapped_chain(exc)
    for item in chain:
        status = _status(item)
        if status is not None:
            return Failure(ANSWERED, retry_after(item), status)
    for item in reversed(chain):
        kind = _transport(item)
        if kind is not None:
            return Failure(kind)
    return None
