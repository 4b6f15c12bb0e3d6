"""What run.map and run.amap promise alike, checked on a run against the delivery server."""

from __future__ import annotations

import threading
import time
from typing import Any

import kernelext as kx
from support.http_server import DeliveryServer, post_json
from support.live import wait_until

WAIT = 60.0


def poster(server: DeliveryServer) -> kx.Effect:
    """The effect ``post_item``: one POST of the item to the server's ``/items``, which must
    answer 200; returns the delivery number the server gave it."""

    @kx.effect(name="post_item")
    def post_item(item: Any, *, idempotency_key: str | None = None) -> int:
        response = post_json(server.url + "/items", {"item": item}, idempotency_key=idempotency_key)
        assert response.status == 200, response
        return int(response.body["delivery"])

    return post_item


def delivered_items(server: DeliveryServer) -> list[int]:
    """The items the server received, in order of item."""
    return sorted(d["body"]["item"] for d in server.deliveries)


def assert_in_order_each_once(
    store: Any, server: DeliveryServer, handle: Any, items: int
) -> list[dict[str, Any]]:
    """The run completed with ``items`` results in input order, each item delivered once
    and completed as its step ``item-<i>``; returns the run's effects."""
    assert handle.wait(WAIT) == "completed", handle.error
    assert handle.result == [i * 10 for i in range(items)]
    assert server.count() == items
    assert delivered_items(server) == list(range(items))
    steps = {s["key"]: s for s in store.steps(handle.run_id)}
    assert set(steps) == {f"item-{i}" for i in range(items)}
    assert all(s["status"] == "completed" for s in steps.values())
    return list(store.load_effects(handle.run_id).values())


def assert_drained_then_resumed(
    store: Any, server: DeliveryServer, handle: Any, started: list[int], gate: threading.Event
) -> None:
    """Stop asked with 10 of 40 items in flight: no item starts after it, the 10 finish and
    the run is suspended; a resume delivers the other 30, each once."""
    time.sleep(0.2)  # a stop starts no new item, even while those in flight go on
    assert len(started) == 10
    gate.set()
    assert handle.wait(WAIT) == "suspended", handle.error
    assert len(started) == 10
    assert server.count() == 10
    steps = store.steps(handle.run_id)
    assert sum(s["status"] == "completed" for s in steps) == 10

    resumed_to_completion(handle, list(range(40)))
    assert server.count() == 40
    assert delivered_items(server) == list(range(40))
    assert len(started) == 40  # the 10 completed items did not run again


def assert_failed_on_item(store: Any, handle: Any, key: str) -> kx.ItemFailed:
    """The run failed on the item ``key`` (a RuntimeError), named in the run's reason."""
    assert handle.wait(WAIT) == "failed"
    error = handle.error
    assert isinstance(error, kx.ItemFailed)
    assert error.key == key
    assert isinstance(error.__cause__, RuntimeError)
    assert key in (store.get_run(handle.run_id)["reason"] or "")
    return error


def resumed_to_completion(handle: Any, result: list[Any]) -> Any:
    """Resume the run; it completes with ``result``."""
    again = kx.resume(handle.run_id)
    assert again.wait(WAIT) == "completed", again.error
    assert again.result == result
    return again


def assert_exceptions_in_place(handle: Any) -> None:
    """Items 0, 4 and 8 of 9 raised ``ValueError("bad <i>")``: their places hold it."""
    assert handle.wait(WAIT) == "completed", handle.error
    result = handle.result
    assert [type(r) for r in result] == [ValueError if i % 4 == 0 else int for i in range(9)]
    assert str(result[4]) == "bad 4"


def assert_approvals_listed_then_resumed(store: Any, server: DeliveryServer, handle: Any) -> None:
    """12 items, the even ones waiting for approval: one suspension lists all six; the odd
    ones went on; approving all resumes the run once and every item is delivered once."""
    assert handle.wait(WAIT) == "suspended", handle.error
    assert store.get_run(handle.run_id)["reason"] == "approval"
    requests = kx.approvals(handle.run_id)
    assert sorted(int(r.step) for r in requests) == [0, 2, 4, 6, 8, 10]
    assert server.count() == 6  # the odd ones went on
    for request in requests:
        request.approve()  # the last decision resumes the run here (nothing else open)
    wait_until(lambda: store.get_run(handle.run_id)["status"] == "completed", "completed")
    assert server.count() == 12
    assert delivered_items(server) == list(range(12))
    resumed = [e for e in store.events(handle.run_id) if e["kind"] == "resumed"]
    assert len(resumed) == 1  # one review, one resume


def assert_refused_before_any_item(
    store: Any, server: DeliveryServer, handle: Any, error: type, text: str
) -> None:
    """The run failed with ``error`` saying ``text``, before any item ran or delivered."""
    assert handle.wait(WAIT) == "failed"
    assert isinstance(handle.error, error), handle.error
    assert text in str(handle.error)
    assert server.count() == 0
    assert store.steps(handle.run_id) == []
