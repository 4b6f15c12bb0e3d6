"""Clients of the test's local servers, closed when the test ends.

``closed_after(client)`` returns ``client`` (an ``OpenAI``, an ``Anthropic``: anything whose
``close()`` closes its connections) and closes it once the test is over (the autouse
fixture ``_clients_closed`` of tests/conftest.py calls ``close_clients_made``), so that no
connection of it is left open to a server the test stopped. Async clients are closed by
their test (``async with``), on the loop their connections belong to.
"""

from __future__ import annotations

from typing import Any, Protocol, TypeVar

__all__ = ["close_clients_made", "closed_after"]


class Closable(Protocol):
    def close(self) -> Any: ...


C = TypeVar("C", bound=Closable)

_MADE: list[Closable] = []


def closed_after(client: C) -> C:
    """``client``, closed when the test that made it ends."""
    _MADE.append(client)
    return client


def close_clients_made() -> None:
    """Close every client ``closed_after`` was given, the last made first."""
    while _MADE:
        _MADE.pop().close()
