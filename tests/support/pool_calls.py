"""What the tests of run.map items in worker processes share: a spawned process pool of two
workers, the effect that POSTs one item to the local delivery server, and the count of
deliveries per Idempotency-Key."""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import time
from collections.abc import Iterator
from typing import Any

import pytest

from support.http_server import DeliveryServer

__all__ = ["WAIT", "deliver_effect", "per_key", "spawned_pool"]

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
            raise RuntimeError(f"HTTP {exc.code}") from None

    return kx.effect(**options)(deliver)


def per_key(server: DeliveryServer) -> dict[str, int]:
    """Idempotency-Key -> how many times the server received it."""
    counts: dict[str, int] = {}
    for row in server.deliveries:
        counts[row["idempotency_key"]] = counts.get(row["idempotency_key"], 0) + 1
    return counts
