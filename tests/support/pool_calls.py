"""What the tests of run.map items in worker processes share: a spawned process pool of two
workers, the effect that POSTs one item to the local delivery server (and the POST of an
item's number and its process's pid that test modules' own effects make), and the count of
deliveries per Idempotency-Key (and per item)."""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

from support.http_server import DeliveryServer, post_json

__all__ = [
    "WAIT",
    "deliver_effect",
    "item_jobs",
    "module_pool",
    "per_item",
    "per_key",
    "post_item_and_pid",
    "spawned_pool",
    "store_for_workers",
]

WAIT = 60.0  # seconds a worker waits for its turn before going on anyway


@pytest.fixture
def spawned_pool() -> Iterator[concurrent.futures.ProcessPoolExecutor]:
    """Two worker processes started fresh (spawn), both up."""
    executor = concurrent.futures.ProcessPoolExecutor(
        2, mp_context=multiprocessing.get_context("spawn")
    )
    list(executor.map(time.sleep, [0.01, 0.01]))  # both worker processes up
    yield executor
    executor.shutdown(cancel_futures=True)


@pytest.fixture(scope="module", name="pool")
def module_pool() -> Iterator[concurrent.futures.ProcessPoolExecutor]:
    """Two real worker processes, started fresh (spawn): nothing of this process in them;
    one pool for all the tests of a module (the fixture ``pool``)."""
    with concurrent.futures.ProcessPoolExecutor(
        2, mp_context=multiprocessing.get_context("spawn")
    ) as executor:
        yield executor


def store_for_workers(monkeypatch: pytest.MonkeyPatch, url: str) -> Any:
    """The store at ``url`` opened here and made the default (``KERNELEXT_STORE``) of the
    worker processes the test starts."""
    import kernelext as kx

    monkeypatch.setenv("KERNELEXT_STORE", url)
    return kx.open_store(url)


def item_jobs(server: DeliveryServer, count: int) -> list[tuple[str, int]]:
    """``count`` jobs of (the server's ``/items`` address, item number)."""
    return [(server.url + "/items", i) for i in range(count)]


def post_item_and_pid(url: str, item: int, idempotency_key: str | None) -> int:
    """POSTs ``item`` and the pid of the process making the call to ``url``, which must
    answer 200; returns the delivery number the server gave it (the body of the effects
    whose items run in worker processes)."""
    response = post_json(url, {"item": item, "pid": os.getpid()}, idempotency_key=idempotency_key)
    assert response.status == 200, response
    return int(response.body["delivery"])


def deliver_effect(kx: Any, url: str, gate: str | None = None, **options: Any) -> Any:
    """The effect: one POST to the delivery server (after ``gate`` exists, when given:
    the request is on its way until then)."""

    def deliver(item: str, *, idempotency_key: str | None = None) -> Any:
        import json
        import os
        import time
        import urllib.error
        import urllib.request

        end = time.monotonic() + WAIT
        while gate is not None and not os.path.exists(gate) and time.monotonic() < end:
            time.sleep(0.02)
        request = urllib.request.Request(
            url + "/d",
            data=json.dumps({"item": item}).encode(),
            headers={"Content-Type": "application/json", "Idempotency-Key": idempotency_key or ""},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                return json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            exc.close()  # its connection
            raise RuntimeError(f"HTTP {exc.code}") from None

    return kx.effect(**options)(deliver)


def per_key(server: DeliveryServer) -> dict[str, int]:
    """Idempotency-Key -> how many times the server received it."""
    counts: dict[str, int] = {}
    for row in server.deliveries:
        counts[row["idempotency_key"]] = counts.get(row["idempotency_key"], 0) + 1
    return counts


def per_item(server: DeliveryServer) -> dict[str, int]:
    """Each delivery's ``item`` -> how many times the server received it, once every
    request that reached the server is handled (``settle``)."""
    server.settle()
    counts: dict[str, int] = {}
    for row in server.deliveries:
        counts[row["body"]["item"]] = counts.get(row["body"]["item"], 0) + 1
    return counts
