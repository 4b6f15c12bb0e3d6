"""What a recorded call did on the network: the evidence that proves a request never left.

A connection refused, a DNS failure or a connect timeout proves a request was never sent
only when that failed connection was the call's only one. A client that follows a
redirect (a ``303``/``307`` to a host that is down), or a tool that makes a second
request after its first, fails with the same error after its first request was received.
So the retry rule (``kernelext._core.ledger.retries``) asks :func:`proves_not_sent`, which reads
what the call did, noted by one process-wide audit hook (``sys.addaudithook``, installed
once, on the first recorded call) while the ledger watches the call (:func:`watching`,
a ``ContextVar``: per thread and per asyncio task):

- ``http.client.send``: a request went out (urllib, and requests through urllib3);
- ``socket.connect``: a connection was attempted, to that address;
- ``socket.getaddrinfo``: a host name was looked up.

Not sent is proven only when no request went out, something of the failing attempt was
seen, connections went to one port (one host, unless a single lookup named it) and
lookups to one host, and a DNS failure came before any connection. Anything else is
"may have reached its target". What the hook cannot see is treated the same way: a
lookup or a connection made in another thread (an async client's name lookup runs in
the loop's executor; a tool's own thread pool) leaves no evidence, so such a failure is
not proven. One case stays blind: a client that reuses a pooled connection for its
request (no connect, no ``http.client.send``: httpx) and then follows a redirect to a
host that is down shows only the one refused connection.

A failure that is no network error (the tool's own ``KeyError`` reading an answer) is read
by :func:`went_on_the_network`: a request sent or a connection opened means it may have
come after the request reached its target. Nothing seen keeps it a plain failure (the
blind cases above: a pooled connection, another thread's sockets). Documented in
docs/effects.md.
"""

from __future__ import annotations

import contextlib
import socket
import sys
import threading
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Evidence",
    "absorb",
    "inside_recorded_call",
    "proves_not_sent",
    "watching",
    "went_on_the_network",
]

_WATCHED = frozenset({"http.client.send", "socket.connect", "socket.getaddrinfo"})
_CURRENT: ContextVar[Evidence | None] = ContextVar("kernelext_network_evidence", default=None)
_INSTALLED: list[bool] = []
_LOCK = threading.Lock()


@dataclass
class Evidence:
    """What one attempt of a recorded call did on the network (see the module text)."""

    sent: bool = False  # an ``http.client.send``: a request went out
    connects: list[tuple[str, object]] = field(default_factory=list)  # (host, port)
    lookups: list[str] = field(default_factory=list)  # host names looked up

    def note(self, event: str, args: tuple[Any, ...]) -> None:
        if event == "http.client.send":
            self.sent = True
        elif event == "socket.connect":
            address = args[1] if len(args) > 1 else None
            if isinstance(address, tuple) and len(address) >= 2:
                self.connects.append((str(address[0]), address[1]))
            else:  # a Unix socket path or an unknown shape: its own destination
                self.connects.append((str(address), None))
        elif event == "socket.getaddrinfo":
            host = args[0] if args else None
            self.lookups.append(host.decode() if isinstance(host, bytes) else str(host))


def _hook(event: str, args: tuple[Any, ...]) -> None:
    if event in _WATCHED:
        evidence = _CURRENT.get()
        if evidence is not None:
            try:
                evidence.note(event, args)
            except Exception:  # noting must never fail the call it watches
                evidence.sent = True  # and what was not noted proves nothing


def _install() -> None:
    with _LOCK:
        if not _INSTALLED:
            sys.addaudithook(_hook)
            _INSTALLED.append(True)


@contextlib.contextmanager
def watching() -> Iterator[Evidence]:
    """Note what the code inside does on the network (this thread or task, and the tasks
    it starts), into the ``Evidence`` yielded."""
    if not _INSTALLED:
        _install()
    evidence = Evidence()
    token = _CURRENT.set(evidence)
    try:
        yield evidence
    finally:
        _CURRENT.reset(token)


def absorb(seen: Evidence | None) -> None:
    """Add what a request made before the watched code did (``seen``) to the evidence of
    the call watched here: a request sent first and settled by the ledger after."""
    current = _CURRENT.get()
    if current is None:
        return
    if seen is None:  # nothing was watched: nothing proves the request never left
        current.sent = True
        return
    current.sent = current.sent or seen.sent
    current.connects.extend(seen.connects)
    current.lookups.extend(seen.lookups)


def inside_recorded_call() -> bool:
    """A recorded call's tool is running here (the ledger watches it)."""
    return _CURRENT.get() is not None


def went_on_the_network(evidence: Evidence | None) -> bool:
    """The call sent a request or opened a connection: a failure that is no network error
    (the tool's own ``KeyError`` reading the answer) may have come after its request
    reached the target. A name looked up alone sends nothing; nothing seen (``None``, or
    another thread's sockets) keeps such a failure ``failed``, made again by
    ``retry=True``."""
    return evidence is not None and (evidence.sent or bool(evidence.connects))


def proves_not_sent(evidence: Evidence | None, chain: list[BaseException]) -> bool:
    """The failing connection was the call's only one: its request never left."""
    if evidence is None or evidence.sent:
        return False
    if not evidence.connects and not evidence.lookups:
        return False  # nothing seen (another thread, an unwatched client): not proven
    ports = {port for _, port in evidence.connects}
    hosts = set(evidence.lookups)
    if len(ports) > 1 or len(hosts) > 1:
        return False  # a second destination: a redirect, or a second request
    if not hosts and len({host for host, _ in evidence.connects}) > 1:
        return False  # two addresses no single lookup explains
    dns_failed = any(isinstance(exc, socket.gaierror) for exc in chain)
    return not (dns_failed and evidence.connects)  # a lookup that failed after a connection
