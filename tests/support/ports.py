"""A port of 127.0.0.1 where nothing listens, kept so for as long as a test needs it."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator

import pytest

__all__ = ["closed_url", "refusing_port"]


@contextlib.contextmanager
def refusing_port() -> Iterator[int]:
    """A port bound by this process and not listening: a connection to it is refused for
    as long as the block lasts. A port closed again at once could be taken meanwhile by a
    parallel test's server, or picked as a client's own port (on Linux a connection to a
    free port of the ephemeral range can meet itself); a bound one can be neither."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield int(sock.getsockname()[1])


@pytest.fixture
def closed_url() -> Iterator[str]:
    """``http://127.0.0.1:<port>`` where every connection is refused during the test."""
    with refusing_port() as port:
        yield f"http://127.0.0.1:{port}"
