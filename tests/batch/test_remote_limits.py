"""``kx.limit`` and ``run.map(executor=...)``: a limit counts one process's calls, so a
limited call in an item on another process is refused with the reason, nothing sent.

Real worker processes (a spawned process pool) record into a real PostgreSQL store; the
deliveries reach a real HTTP server on 127.0.0.1, whose log is counted.
"""

from __future__ import annotations

import concurrent.futures
import os

import pytest
from support.http_server import DeliveryServer, read_log
from support.live import name
from support.pool_calls import (  # noqa: F401  (module_pool: the fixture `pool`)
    item_jobs,
    module_pool,
    store_for_workers,
)

import kernelext as kx

WAIT = 120.0
# Declared at import: in the notebook's process and, as the module is imported there, in
# every worker too, where it would count that worker's calls alone.
kx.limit("crm-remote", rate="2/min", concurrency=1)


@kx.effect(name="post_limited", limit="crm-remote")
def post_limited(url: str, item: int, *, idempotency_key: str | None = None) -> int:
    from support.http_server import post_json

    response = post_json(url, {"item": item, "pid": os.getpid()}, idempotency_key=idempotency_key)
    return int(response.body["delivery"])


def deliver(job: tuple[str, int]) -> int:
    url, item = job
    return post_limited(url, item)


@pytest.mark.postgres
def test_a_limited_call_in_an_item_on_a_worker_is_refused_with_the_reason(
    postgres_url: str,
    monkeypatch: pytest.MonkeyPatch,
    delivery_server: DeliveryServer,
    pool: concurrent.futures.ProcessPoolExecutor,
) -> None:
    store = store_for_workers(monkeypatch, postgres_url)
    jobs = item_jobs(delivery_server, 4)

    @kx.agent(name=name("limited-remote"))
    def limited(run: kx.Run, jobs: list[tuple[str, int]]) -> list[int]:
        return run.map(deliver, jobs, key=lambda job: f"row-{job[1]}", executor=pool)

    try:
        h = limited.start(jobs)
        assert h.wait(WAIT) == "failed"
        message = str(h.error)
        assert "crm-remote" in message and "counts the calls of one process" in message, message
        assert "run.map(concurrency=...)" in message  # what to do instead
        assert read_log(delivery_server.log_path) == []  # nothing was sent
        recorded = store.read("SELECT count(*) FROM effects WHERE run_id = ?", (h.run_id,))
        assert recorded == [(0,)]  # nor recorded
    finally:
        store.close()
