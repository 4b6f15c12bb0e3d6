"""``run.map``: items as steps, concurrency, a stop that drains, errors, resume, approvals.

Against a real local HTTP server that counts deliveries (127.0.0.1): every item's POST is
delivered once whatever happens to the run.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from support.batch_checks import (
    WAIT,
    assert_approvals_listed_then_resumed,
    assert_drained_then_resumed,
    assert_exceptions_in_place,
    assert_failed_on_item,
    assert_in_order_each_once,
    assert_refused_before_any_item,
    poster,
    resumed_to_completion,
)
from support.http_server import DeliveryServer, post_json
from support.live import name, wait_until

import kernelext as kx
from kernelext._store import Store

pytestmark = pytest.mark.both_backends


def test_results_come_in_input_order_and_each_item_is_delivered_once(
    store: Store, delivery_server: DeliveryServer
) -> None:
    post_item = poster(delivery_server)
    running, peak = 0, 0
    lock = threading.Lock()

    def one(item: int) -> int:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        time.sleep(0.02 * (item % 3))  # finish out of order
        post_item(item)
        with lock:
            running -= 1
        return item * 10

    @kx.agent(name=name("ordered"))
    def ordered(run: kx.Run, items: list[int]) -> list[int]:
        return run.map(one, items, key=lambda i: f"item-{i}", concurrency=6)

    handle = ordered.start(list(range(30)))
    effects = assert_in_order_each_once(store, delivery_server, handle, 30)
    assert 1 < peak <= 6
    # Each effect is keyed under its item's step, call 0 within the item.
    assert {(e["step_key"], e["call_ordinal"]) for e in effects} == {
        (f"item-{i}", 0) for i in range(30)
    }


def test_a_stop_drains_the_items_in_flight_and_a_resume_delivers_the_rest_once(
    store: Store, delivery_server: DeliveryServer
) -> None:
    post_item = poster(delivery_server)
    gate = threading.Event()
    started: list[int] = []
    lock = threading.Lock()

    def one(item: int) -> int:
        with lock:
            started.append(item)
        gate.wait(WAIT)
        post_item(item)
        return item

    @kx.agent(name=name("drain"))
    def drain(run: kx.Run, items: list[int]) -> list[int]:
        return run.map(one, items, concurrency=10)

    handle = drain.start(list(range(40)))
    wait_until(lambda: len(started) == 10, "10 items in flight")
    handle.stop()
    assert_drained_then_resumed(store, delivery_server, handle, started, gate)


def test_an_item_that_raises_fails_the_run_naming_its_key_and_a_resume_runs_only_it(
    store: Store, delivery_server: DeliveryServer
) -> None:
    post_item = poster(delivery_server)
    broken = {"value": True}
    calls: list[int] = []

    def one(item: int) -> int:
        calls.append(item)
        if item == 7 and broken["value"]:
            raise RuntimeError("row 7 is malformed")
        post_item(item)
        return item

    @kx.agent(name=name("raises"))
    def raises(run: kx.Run, items: list[int]) -> list[int]:
        return run.map(one, items, key=lambda i: f"row-{i}", concurrency=1)

    handle = raises.start(list(range(10)))
    error = assert_failed_on_item(store, handle, "row-7")
    assert "row-7" in str(error)
    assert delivery_server.count() == 7  # one at a time: nothing started after row 7

    broken["value"] = False
    calls.clear()
    resumed_to_completion(handle, list(range(10)))
    assert calls == [7, 8, 9]
    assert delivery_server.count() == 10


def test_return_exceptions_puts_the_exception_in_the_items_place(store: Store) -> None:
    def one(item: int) -> int:
        if item % 4 == 0:
            raise ValueError(f"bad {item}")
        return item

    @kx.agent(name=name("exceptions"))
    def exceptions(run: kx.Run, items: list[int]) -> list[Any]:
        return run.map(one, items, concurrency=3, return_exceptions=True)

    assert_exceptions_in_place(exceptions.start(list(range(9))))


@pytest.mark.parametrize(
    ("kwargs", "error", "text"),
    [
        ({"concurrency": 0}, ValueError, "concurrency=0"),
        ({"concurrency": 2.5}, TypeError, "concurrency"),
        ({"key": lambda i: i % 3}, ValueError, "same key"),
        ({"fn": "not a function"}, TypeError, "run.map(fn=...)"),
        ({"key": "id"}, TypeError, "run.map(key=...)"),
    ],
)
def test_bad_arguments_are_refused_before_any_item_runs(
    store: Store, delivery_server: DeliveryServer, kwargs: dict[str, Any], error: type, text: str
) -> None:
    post_item = poster(delivery_server)
    arguments: dict[str, Any] = {"fn": post_item, **kwargs}

    @kx.agent(name=name("refused"))
    def refused(run: kx.Run, items: list[int]) -> list[int]:
        fn = arguments.pop("fn")
        return run.map(fn, items, **arguments)

    handle = refused.start(list(range(6)))
    assert_refused_before_any_item(store, delivery_server, handle, error, text)


def test_run_state_is_not_written_from_inside_an_item(store: Store) -> None:
    @kx.agent(name=name("state"))
    def state(run: kx.Run, items: list[int]) -> Any:
        run.state["seen"] = "before"

        def one(item: int) -> str:
            assert run.state["seen"] == "before"  # reading is fine
            run.state["item"] = item
            return "unreachable"

        return run.map(one, items)

    handle = state.start([1, 2])
    assert handle.wait(WAIT) == "failed"
    assert isinstance(handle.error, kx.ItemFailed)
    cause = handle.error.__cause__
    assert isinstance(cause, kx.StateNotWritable)
    assert "Return the value from the item" in str(cause)


def test_approvals_inside_a_batch_suspend_the_run_once_with_every_request_listed(
    store: Store, delivery_server: DeliveryServer
) -> None:
    @kx.effect(name="pay", needs_approval=lambda item, **kw: item % 2 == 0)
    def pay(item: int, *, idempotency_key: str | None = None) -> int:
        return int(post_json(delivery_server.url + "/pay", {"item": item}).body["delivery"])

    @kx.agent(name=name("approve"))
    def approve(run: kx.Run, items: list[int]) -> list[int]:
        return run.map(lambda i: pay(i) and i, items, key=str, concurrency=4)

    handle = approve.start(list(range(12)))
    assert_approvals_listed_then_resumed(store, delivery_server, handle)


def test_resume_skips_completed_items_and_returns_their_stored_values(
    store: Store, store_path: Path
) -> None:
    calls: list[str] = []
    gate = threading.Event()

    def one(item: dict[str, Any]) -> dict[str, Any]:
        calls.append(item["id"])
        if item["id"] == "c":
            gate.wait(WAIT)
        return {"id": item["id"], "when": (2026, 12, 1), "tags": {"x"}}

    @kx.agent(name=name("stored"))
    def stored(run: kx.Run, items: list[dict[str, Any]]) -> list[Any]:
        return run.map(one, items, key=lambda r: r["id"], concurrency=1)

    items = [{"id": k} for k in "abcde"]
    handle = stored.start(items)
    wait_until(lambda: "c" in calls, "item c running")
    handle.stop()
    gate.set()
    assert handle.wait(WAIT) == "suspended", handle.error
    calls.clear()
    again = kx.resume(handle.run_id)
    assert again.wait(WAIT) == "completed", again.error
    assert calls == ["d", "e"]
    assert again.result == [{"id": k, "when": (2026, 12, 1), "tags": {"x"}} for k in "abcde"]


def test_the_dispatcher_learns_of_every_item_that_ended_until_it_takes_it() -> None:
    """``Flight``: items that ended before or while the dispatcher waits are handed over,
    several at a time, and again by every wait until the dispatcher discards them (a look
    cut off by a forced stop after its wait loses none); with none ended, a wait ends
    after its timeout."""
    import concurrent.futures

    from kernelext._core.batch.items import Flight

    flight = Flight()
    futures = [concurrent.futures.Future[int]() for _ in range(4)]
    futures[0].set_result(0)  # ended before the dispatcher took it in flight
    for future in futures:
        flight.add(future)
    assert flight.wait(5) == {futures[0]} and len(flight) == 4
    assert flight.wait(5) == {futures[0]}  # not taken: handed over again, at once
    flight.discard(futures[0])
    started = time.monotonic()
    assert flight.wait(0.05) == set() and time.monotonic() - started >= 0.04
    futures[2].set_result(2)
    futures[3].set_exception(ValueError("boom"))
    assert flight.wait(5) == {futures[2], futures[3]}
    flight.discard(futures[2])
    flight.discard(futures[3])
    threading.Timer(0.05, futures[1].set_result, (1,)).start()
    assert flight.wait(5) == {futures[1]}  # waits for the next to end
    flight.discard(futures[1])
    assert len(flight) == 0 and flight.wait(0.01) == set()
