"""``run.map`` over a generator reads its items as it dispatches them: a stop or a forced
stop lands at the next item the generator yields, a huge or endless generator is not read
first, a duplicate key found late ends the batch with nothing applied twice, and a resume
reads the generator again from its start, running only what did not complete.

Against a real DuckDB file and a real local HTTP server that counts deliveries.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.http_server import DeliveryServer, post_json
from support.live import name, wait_until

import kernelext as kx
from kernelext._store import Store

WAIT = 60.0


class Pages:
    """A generator source that counts what was read from it, and can hold before a yield
    (as a slow page fetch does) until released."""

    def __init__(self, count: int | None, *, hold_after: int | None = None) -> None:
        self.count = count
        self.hold_after = hold_after
        self.pulled = 0
        self.holding = threading.Event()
        self.release = threading.Event()

    def __call__(self) -> Iterator[int]:
        numbers = range(self.count) if self.count is not None else itertools.count()
        for i in numbers:
            if self.hold_after is not None and i == self.hold_after:
                self.holding.set()
                self.release.wait(WAIT)  # a slow page: nothing is yielded meanwhile
            self.pulled += 1
            yield i


@pytest.mark.parametrize("how", ["stop", "force_stop"])
def test_a_stop_lands_at_the_next_yield_of_a_slow_generator_and_a_resume_repeats_nothing(
    store: Store, how: str
) -> None:
    pages = Pages(8, hold_after=3)
    ran: list[int] = []

    def one(i: int) -> int:
        ran.append(i)
        return i * 10

    @kx.agent(name=name("slow-pages"))
    def slow(run: kx.Run) -> list[int]:
        return run.map(one, pages(), concurrency=1)  # made in the agent: read again on resume

    handle = slow.start()
    wait_until(lambda: pages.holding.is_set() and len(ran) == 3, "items 0-2 run", wait=20)
    getattr(handle, how)()
    pages.release.set()  # the generator yields item 3: the stop lands there
    assert handle.wait(WAIT) == "suspended", handle.error
    assert ran == [0, 1, 2]  # item 3 was read, never started
    assert pages.pulled == 4  # and nothing after it was read
    assert sum(s["status"] == "completed" for s in store.steps(handle.run_id)) == 3

    pages.hold_after = None
    again = kx.resume(handle.run_id)
    assert again.wait(WAIT) == "completed", again.error
    assert again.result == [i * 10 for i in range(8)]
    assert ran == [0, 1, 2, 3, 4, 5, 6, 7]  # the completed items did not run again


def test_an_endless_generator_is_read_as_its_items_run(store: Store) -> None:
    pages = Pages(None)
    pulled_at_first: list[int] = []
    done = threading.Event()
    ran: list[int] = []

    def one(i: int) -> int:
        if not pulled_at_first:
            pulled_at_first.append(pages.pulled)
        ran.append(i)
        if len(ran) >= 20:
            done.set()
        return i

    @kx.agent(name=name("endless"))
    def endless(run: kx.Run) -> list[int]:
        return run.map(one, pages(), concurrency=2)

    handle = endless.start()
    assert done.wait(20), "the endless generator was read before the first item"
    assert "+ done" in handle.status_text  # the items read so far, more to come
    handle.stop()
    assert handle.wait(WAIT) == "suspended", handle.error
    assert pulled_at_first[0] <= 2  # the first item started after at most `concurrency` reads
    assert pages.pulled <= len(ran) + 3  # read one item ahead of the dispatch, not more


def test_a_duplicate_key_found_late_ends_the_batch_and_nothing_is_applied_twice(
    store: Store, delivery_server: DeliveryServer
) -> None:
    @kx.effect(name="post_page")
    def post_page(key: str, *, idempotency_key: str | None = None) -> int:
        url = delivery_server.url + "/pages"
        response = post_json(url, {"key": key}, idempotency_key=idempotency_key)
        assert response.status == 200, response
        return int(response.body["delivery"])

    def keys() -> Iterator[str]:
        yield from ["a", "b", "c", "a", "d"]

    @kx.agent(name=name("dup-late"))
    def dup(run: kx.Run) -> list[Any]:
        return run.map(post_page, keys(), key=lambda k: k, concurrency=1)

    handle = dup.start()
    assert handle.wait(WAIT) == "failed"
    assert "items 0 and 3 have the same key 'a'" in str(handle.error)
    assert "The items before it ran once; nothing after it started" in str(handle.error)
    assert sorted(d["body"]["key"] for d in delivery_server.deliveries) == ["a", "b", "c"]

    again = kx.resume(handle.run_id)  # the same generator: refused again, nothing repeated
    assert again.wait(WAIT) == "failed"
    assert "same key 'a'" in str(again.error)
    assert delivery_server.count() == 3


def test_a_generator_already_read_to_its_end_is_refused(store: Store) -> None:
    @kx.agent(name=name("read-before"))
    def read_before(run: kx.Run) -> list[int]:
        pages = (i for i in range(3))
        list(pages)
        return run.map(lambda i: i, pages)

    handle = read_before.start()
    assert handle.wait(WAIT) == "failed"
    assert "already read to its end" in str(handle.error)
    assert "Make the generator inside the agent" in str(handle.error)


def test_a_resume_refuses_a_generator_made_before_it_that_positions_would_mismatch(
    store: Store,
) -> None:
    gate = threading.Event()
    ran: list[int] = []
    made_once = (i for i in range(6))  # outlives the run: not made again on resume

    def one(i: int) -> int:
        ran.append(i)
        if i == 1:
            gate.wait(WAIT)
        return i

    @kx.agent(name=name("made-before"))
    def made_before(run: kx.Run) -> list[int]:
        return run.map(one, made_once, concurrency=1)

    handle = made_before.start()
    wait_until(lambda: ran == [0, 1], "item 1 running")
    handle.stop()
    gate.set()
    assert handle.wait(WAIT) == "suspended", handle.error
    again = kx.resume(handle.run_id)
    assert again.wait(WAIT) == "failed"
    assert "already partly read" in str(again.error)
    assert ran == [0, 1]  # item 2 (read before, its key '0' completed) was not run as '0'


def test_amap_reads_a_generator_as_its_items_run(store: Store) -> None:
    pages = Pages(50)
    pulled_at_first: list[int] = []

    async def one(i: int) -> int:
        if not pulled_at_first:
            pulled_at_first.append(pages.pulled)
        return i + 1

    @kx.agent(name=name("amap-pages"))
    async def amap_pages(run: kx.Run) -> list[int]:
        return await run.amap(one, pages(), concurrency=4)

    handle = amap_pages.start()
    assert handle.wait(WAIT) == "completed", handle.error
    assert handle.result == [i + 1 for i in range(50)]
    assert pulled_at_first[0] <= 4


def test_a_generator_that_raises_ends_the_batch_with_its_error_after_the_items_before_it(
    store: Store,
) -> None:
    ran: list[int] = []

    def pages() -> Iterator[int]:
        yield 0
        yield 1
        raise ConnectionError("page 3 could not be fetched")

    def one(i: int) -> int:
        ran.append(i)
        return i

    @kx.agent(name=name("broken-pages"))
    def broken(run: kx.Run) -> list[int]:
        return run.map(one, pages(), concurrency=2)

    handle = broken.start()
    assert handle.wait(WAIT) == "failed"
    assert "page 3 could not be fetched" in str(handle.error)
    assert sorted(ran) == [0, 1]
    assert sorted(s["key"] for s in store.steps(handle.run_id) if s["status"] == "completed") == [
        "0",
        "1",
    ]


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    keys=st.lists(st.sampled_from("abcdefghij"), min_size=1, max_size=12),
    concurrency=st.integers(1, 4),
)
def test_keys_read_from_a_generator_are_checked_as_they_appear(
    store: Store, keys: list[str], concurrency: int
) -> None:
    """Whatever the keys and the concurrency: without a duplicate every item runs once, in
    input order; with one, the items before the first repeat ran once and none after it."""
    ran: list[str] = []
    lock = threading.Lock()

    def one(k: str) -> str:
        with lock:
            ran.append(k)
        return k.upper()

    @kx.agent(name=name("keys"))
    def keyed(run: kx.Run) -> list[str]:
        return run.map(one, (k for k in keys), key=lambda k: k, concurrency=concurrency)

    handle = keyed.start()
    repeat = next((j for j, k in enumerate(keys) if k in keys[:j]), None)
    if repeat is None:
        assert handle.wait(WAIT) == "completed", handle.error
        assert handle.result == [k.upper() for k in keys]
        assert sorted(ran) == sorted(keys)
    else:
        assert handle.wait(WAIT) == "failed"
        first = keys.index(keys[repeat])
        assert f"items {first} and {repeat} have the same key {keys[repeat]!r}" in str(handle.error)
        assert sorted(ran) == sorted(keys[:repeat])  # each once, none after the repeat
