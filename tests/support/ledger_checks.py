"""What the effect ledger's tests check alike on a run against the delivery server."""

from __future__ import annotations

from typing import Any

from support.http_server import DeliveryServer

__all__ = ["assert_refused_before_any_call"]

WAIT = 60.0


def assert_refused_before_any_call(
    store: Any, server: DeliveryServer, handle: Any, error: type, text: str
) -> None:
    """The run failed with ``error`` saying ``text``, before any effect was called or
    recorded."""
    assert handle.wait(WAIT) == "failed"
    assert isinstance(handle.error, error), handle.error
    assert text in str(handle.error)
    assert server.count() == 0
    assert store.load_effects(handle.run_id) == {}
