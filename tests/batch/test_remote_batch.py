"""``run.map(..., executor=...)``: items in other processes (a real process pool) record
into the run's PostgreSQL store under the keys an item in the owner's process would use.

The Dask cluster, worker kills and the notebook process's death are in
``test_dask_faults.py``; this file holds the contract itself: what is refused before
anything is dispatched, the keys, the order, what travels (and what never does: the
store's password), the fence, and a stop that reaches the workers.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import pickle
import threading
import urllib.parse
from typing import Any

import pytest
from support.http_server import DeliveryServer, read_log
from support.live import name
from support.pool_calls import (  # noqa: F401  (module_pool: the fixture `pool`)
    item_jobs,
    module_pool,
    post_item_and_pid,
    store_for_workers,
)

import kernelext as kx
from kernelext._core.batch.remote_item import execute_item
from kernelext._core.batch.wire import RemoteTask, loads
from kernelext._core.encoding.keys import effect_key
from kernelext._store import Store

WAIT = 120.0


@kx.effect(name="post_item")
def post_item(url: str, item: int, *, idempotency_key: str | None = None) -> int:
    return post_item_and_pid(url, item, idempotency_key)


def deliver(job: tuple[str, int]) -> dict[str, int]:
    url, item = job
    first = post_item(url, item)
    second = post_item(url, item + 1000)
    return {"item": item, "pid": os.getpid(), "deliveries": first + second}


def boom(job: tuple[str, int]) -> int:
    url, item = job
    post_item(url, item)
    if item == 3:
        raise ValueError(f"item {item} is bad")
    return item


@pytest.mark.postgres
def test_items_run_in_other_processes_with_the_keys_of_an_item_here(
    postgres_url: str,
    monkeypatch: pytest.MonkeyPatch,
    delivery_server: DeliveryServer,
    pool: concurrent.futures.ProcessPoolExecutor,
) -> None:
    store = store_for_workers(monkeypatch, postgres_url)
    jobs = item_jobs(delivery_server, 12)

    @kx.agent(name=name("remote"))
    def remote(run: kx.Run, jobs: list[tuple[str, int]]) -> list[dict[str, int]]:
        return run.map(deliver, jobs, key=lambda job: f"row-{job[1]}", executor=pool)

    @kx.agent(name=name("here"))
    def here(run: kx.Run, jobs: list[tuple[str, int]]) -> list[dict[str, int]]:
        return run.map(deliver, jobs, key=lambda job: f"row-{job[1]}")

    far = remote.start(jobs)
    assert far.wait(WAIT) == "completed", far.error
    near = here.start(jobs)
    assert near.wait(WAIT) == "completed", near.error
    assert [r["item"] for r in far.result] == list(range(12))  # input order
    assert {r["pid"] for r in far.result}.isdisjoint({os.getpid()})  # ran elsewhere
    assert all(r["pid"] == os.getpid() for r in near.result)

    def ledger(run_id: str) -> list[tuple[Any, ...]]:
        return sorted(
            store.read(
                "SELECT key, step_key, tool, call_ordinal, status FROM effects WHERE run_id = ?",
                (run_id,),
            )
        )

    remote_rows, near_rows = ledger(far.run_id), ledger(near.run_id)
    assert len(remote_rows) == 24
    for key, step_key, tool, ordinal, status in remote_rows:
        assert status == "applied"
        assert key == effect_key(far.run_id, step_key, tool, ordinal, 2)
    assert [r[1:] for r in sorted(remote_rows, key=lambda r: r[1:4])] == [
        r[1:] for r in sorted(near_rows, key=lambda r: r[1:4])
    ]
    log = read_log(delivery_server.log_path)
    keys = [entry["idempotency_key"] for entry in log]
    assert len(keys) == 48 and len(set(keys)) == 48  # 24 calls per run, each once
    steps = store.read(
        "SELECT count(*), min(status), max(status) FROM steps WHERE run_id = ?", (far.run_id,)
    )
    assert steps == [(12, "completed", "completed")]


@pytest.mark.postgres
def test_items_from_a_generator_run_in_other_processes_in_input_order(
    postgres_url: str,
    monkeypatch: pytest.MonkeyPatch,
    delivery_server: DeliveryServer,
    pool: concurrent.futures.ProcessPoolExecutor,
) -> None:
    store_for_workers(monkeypatch, postgres_url)
    url = delivery_server.url + "/items"

    @kx.agent(name=name("remote-gen"))
    def remote(run: kx.Run) -> list[dict[str, int]]:
        jobs = ((url, i) for i in range(6))  # read whole before the first dispatch
        return run.map(deliver, jobs, key=lambda job: f"row-{job[1]}", executor=pool)

    far = remote.start()
    assert far.wait(WAIT) == "completed", far.error
    assert [r["item"] for r in far.result] == list(range(6))
    assert delivery_server.count() == 12  # two calls per item, each once


@pytest.mark.postgres
def test_an_item_that_raises_elsewhere_fails_the_run_with_its_error_and_a_resume_runs_the_rest(
    postgres_url: str,
    monkeypatch: pytest.MonkeyPatch,
    delivery_server: DeliveryServer,
    pool: concurrent.futures.ProcessPoolExecutor,
) -> None:
    store = store_for_workers(monkeypatch, postgres_url)
    jobs = item_jobs(delivery_server, 6)

    @kx.agent(name=name("raising"))
    def raising(run: kx.Run, jobs: list[tuple[str, int]]) -> list[int]:
        return run.map(boom, jobs, concurrency=1, executor=pool)

    handle = raising.start(jobs)
    assert handle.wait(WAIT) == "failed"
    assert isinstance(handle.error, kx.ItemFailed) and handle.error.key == "3"
    assert isinstance(handle.error.__cause__, ValueError)
    assert "item 3 is bad" in str(handle.error.__cause__)
    assert any("raised in another process" in n for n in handle.error.__cause__.__notes__)
    failed = store.read(
        "SELECT status, error FROM steps WHERE run_id = ? AND key = '3'", (handle.run_id,)
    )
    assert failed[0][0] == "failed" and "item 3 is bad" in failed[0][1]
    delivered = [entry["body"]["item"] for entry in read_log(delivery_server.log_path)]
    assert sorted(delivered) == [0, 1, 2, 3]  # none after the failure


def test_a_duckdb_store_with_workers_elsewhere_is_refused_before_anything_is_dispatched(
    store: Store, delivery_server: DeliveryServer
) -> None:
    class CountingPool(concurrent.futures.ProcessPoolExecutor):
        submitted = 0

        def submit(self, *args: Any, **kwargs: Any) -> Any:
            CountingPool.submitted += 1
            return super().submit(*args, **kwargs)

    jobs = item_jobs(delivery_server, 3)
    with CountingPool(1) as counting:

        @kx.agent(name=name("duck"))
        def duck(run: kx.Run, jobs: list[tuple[str, int]]) -> list[dict[str, int]]:
            return run.map(deliver, jobs, executor=counting)

        handle = duck.start(jobs)
        assert handle.wait(WAIT) == "failed"
    assert isinstance(handle.error, kx.KernelextError)
    message = str(handle.error)
    assert "PostgreSQL" in message and "DuckDB" in message and "executor=" in message
    assert CountingPool.submitted == 0
    assert store.read("SELECT count(*) FROM steps WHERE run_id = ?", (handle.run_id,)) == [(0,)]
    assert read_log(delivery_server.log_path) == []


def test_a_thread_pool_runs_the_items_here_on_duckdb(
    store: Store, delivery_server: DeliveryServer
) -> None:
    jobs = item_jobs(delivery_server, 5)
    with concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="users-pool") as threads:

        @kx.agent(name=name("threads"))
        def in_threads(run: kx.Run, jobs: list[tuple[str, int]]) -> list[str]:
            return run.map(lambda job: threading.current_thread().name, jobs, executor=threads)

        handle = in_threads.start(jobs)
        assert handle.wait(WAIT) == "completed", handle.error
        assert all(n.startswith("users-pool") for n in handle.result)
        assert threads.submit(lambda: 7).result() == 7  # the caller's pool is left running


def test_an_executor_of_another_kind_is_refused_with_what_it_takes(store: Store) -> None:
    @kx.agent(name=name("odd"))
    def odd(run: kx.Run) -> list[int]:
        return run.map(lambda i: i, [1, 2], executor="dask")

    handle = odd.start()
    assert handle.wait(WAIT) == "failed"
    assert isinstance(handle.error, TypeError)
    assert "concurrent.futures.Executor" in str(handle.error)
    assert "distributed.Client" in str(handle.error)


@pytest.mark.postgres
def test_what_cannot_travel_is_refused_before_the_first_item_is_dispatched(
    postgres_url: str,
    monkeypatch: pytest.MonkeyPatch,
    pool: concurrent.futures.ProcessPoolExecutor,
) -> None:
    store = store_for_workers(monkeypatch, postgres_url)
    lock = threading.Lock()

    @kx.agent(name=name("heavy"))
    def heavy(run: kx.Run) -> list[int]:
        return run.map(lambda item: 1, [1, 2, lock, 4], executor=pool)

    handle = heavy.start()
    assert handle.wait(WAIT) == "failed"
    assert isinstance(handle.error, kx.SerializationError)
    assert "item '2' cannot be sent" in str(handle.error)
    assert "Nothing was dispatched" in str(handle.error)
    assert store.read("SELECT count(*) FROM steps WHERE run_id = ?", (handle.run_id,)) == [(0,)]


@pytest.mark.postgres
def test_the_store_password_never_travels_and_workers_use_their_own_credentials(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch, delivery_server: DeliveryServer
) -> None:
    parts = urllib.parse.urlsplit(postgres_url)
    secret = "s3cr3t-pw-9F2"  # the test server trusts 127.0.0.1: any password connects
    netloc = f"{parts.username}:{secret}@{parts.hostname}:{parts.port}"
    with_password = parts._replace(netloc=netloc)
    url = urllib.parse.urlunsplit(with_password)
    monkeypatch.setenv("KERNELEXT_STORE", url)
    kx.open_store(url)
    sent: list[bytes] = []

    class Recording(concurrent.futures.ThreadPoolExecutor):
        """Runs the worker's side in threads here: what it is handed is what would travel."""

    class Capturing(concurrent.futures.Executor):
        def __init__(self) -> None:
            self._inner = Recording(2)

        def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
            blob = pickle.dumps((fn, args))
            sent.append(blob)
            return self._inner.submit(fn, *args, **kwargs)

        def shutdown(self, wait: bool = True, **kwargs: Any) -> None:
            self._inner.shutdown(wait)

    capturing = Capturing()
    jobs = item_jobs(delivery_server, 3)

    @kx.agent(name=name("creds"))
    def creds(run: kx.Run, jobs: list[tuple[str, int]]) -> list[dict[str, int]]:
        return run.map(deliver, jobs, executor=capturing)

    handle = creds.start(jobs)
    assert handle.wait(WAIT) == "completed", handle.error
    capturing.shutdown()
    assert len(sent) == 3
    for blob in sent:
        assert secret.encode() not in blob
        task: RemoteTask = loads(pickle.loads(blob)[1][0])
        assert secret not in task.url and task.url.startswith("postgresql://")


@pytest.mark.postgres
def test_a_worker_of_a_stale_owner_is_refused_and_sends_nothing(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch, delivery_server: DeliveryServer
) -> None:
    store = store_for_workers(monkeypatch, postgres_url)
    held: list[bytes] = []

    class Holding(concurrent.futures.Executor):
        """Keeps the tasks instead of running them: the owner's items stay in flight."""

        def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
            held.append(args[0])
            return concurrent.futures.Future()

    jobs = item_jobs(delivery_server, 2)

    @kx.agent(name=name("stale"))
    def stale(run: kx.Run, jobs: list[tuple[str, int]]) -> list[dict[str, int]]:
        return run.map(deliver, jobs, executor=Holding())

    handle = stale.start(jobs)
    deadline = 0
    while len(held) < 2 and deadline < 600:
        threading.Event().wait(0.05)
        deadline += 1
    assert len(held) == 2
    task: RemoteTask = loads(held[0])
    owner = store.read("SELECT owner FROM runs WHERE id = ?", (task.run_id,))[0][0]
    # another process takes the run over: a new epoch (what a resume elsewhere does)
    store.write(
        lambda tx: tx.execute(
            "UPDATE runs SET owner_epoch = owner_epoch + 1, owner = 'elsewhere' WHERE id = ?",
            (task.run_id,),
        )
    )
    outcome = loads(execute_item(held[0]))
    assert outcome.kind == "lost"
    error = pickle.loads(outcome.error)
    assert isinstance(error, kx.OwnershipLost) and error.held == task.epoch
    assert read_log(delivery_server.log_path) == []
    assert store.read("SELECT count(*) FROM effects WHERE run_id = ?", (task.run_id,)) == [(0,)]
    store.write(  # the run given back to its owner, which then stops it
        lambda tx: tx.execute(
            "UPDATE runs SET owner_epoch = ?, owner = ? WHERE id = ?",
            (task.epoch, owner, task.run_id),
        )
    )
    handle.force_stop()  # the owner's items in flight: their futures are cancelled
    assert handle.wait(WAIT) == "suspended"
    ended = store.read("SELECT status, forced FROM steps WHERE run_id = ?", (task.run_id,))
    assert ended == [("cancelled", True), ("cancelled", True)]


def five_calls(job: tuple[str, int]) -> int:
    url, item = job
    for call in range(5):
        post_item(url, item * 10 + call)
    return item


@pytest.mark.postgres
@pytest.mark.parametrize("delivery_server", [{"delay": 0.1}], indirect=True)
def test_a_stop_reaches_items_in_other_processes_at_their_next_effect_call(
    postgres_url: str,
    monkeypatch: pytest.MonkeyPatch,
    delivery_server: DeliveryServer,
    pool: concurrent.futures.ProcessPoolExecutor,
) -> None:
    store = store_for_workers(monkeypatch, postgres_url)
    jobs = item_jobs(delivery_server, 6)

    @kx.agent(name=name("stopped"))
    def stopped(run: kx.Run, jobs: list[tuple[str, int]]) -> list[int]:
        return run.map(five_calls, jobs, concurrency=2, executor=pool)

    handle = stopped.start(jobs)
    wait_for = 0
    while len(read_log(delivery_server.log_path)) < 3 and wait_for < 1200:
        threading.Event().wait(0.05)
        wait_for += 1
    handle.stop()
    at_stop = len(read_log(delivery_server.log_path))
    assert handle.wait(WAIT) == "suspended"
    at_suspend = len(read_log(delivery_server.log_path))
    assert at_suspend - at_stop <= 2  # each of the 2 items in flight: at most its call in flight
    assert at_suspend < 30
    steps = dict(
        store.read(
            "SELECT status, count(*) FROM steps WHERE run_id = ? GROUP BY 1", (handle.run_id,)
        )
    )
    assert steps.get("cancelled", 0) >= 1 and steps.get("running", 0) == 0
    resumed = kx.resume(handle.run_id)
    assert resumed.wait(WAIT) == "completed", resumed.error
    assert resumed.result == list(range(6))
    keys = [entry["idempotency_key"] for entry in read_log(delivery_server.log_path)]
    assert len(keys) == 30 and len(set(keys)) == 30  # every call once, across stop and resume


@pytest.mark.postgres
def test_an_item_function_that_holds_the_run_is_refused_with_what_to_send_instead(
    postgres_url: str,
    monkeypatch: pytest.MonkeyPatch,
    pool: concurrent.futures.ProcessPoolExecutor,
) -> None:
    store = store_for_workers(monkeypatch, postgres_url)

    @kx.agent(name=name("holds-run"))
    def holds_run(run: kx.Run) -> list[Any]:
        run.state["threshold"] = 3
        return run.map(lambda item: item > run.state["threshold"], [1, 5], executor=pool)

    handle = holds_run.start()
    assert handle.wait(WAIT) == "failed"
    assert isinstance(handle.error, kx.SerializationError)
    message = str(handle.error)
    assert "fn ('<lambda>') cannot be sent" in message and "kx.Run" in message
    assert "run.state" in message and "Nothing was dispatched" in message
    assert store.read("SELECT count(*) FROM steps WHERE run_id = ?", (handle.run_id,)) == [(0,)]


@pytest.mark.postgres
def test_an_executor_that_was_shut_down_is_named_and_no_step_is_left_running(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = store_for_workers(monkeypatch, postgres_url)
    closed = concurrent.futures.ProcessPoolExecutor(1)
    closed.shutdown()

    @kx.agent(name=name("closed"))
    def uses_closed(run: kx.Run) -> list[int]:
        return run.map(lambda i: i, [1, 2], executor=closed)

    handle = uses_closed.start()
    assert handle.wait(WAIT) == "failed"
    assert "executor=ProcessPoolExecutor): the executor was shut down" in str(handle.error)
    assert "Nothing was dispatched" in str(handle.error)
    assert store.read("SELECT count(*) FROM steps WHERE run_id = ?", (handle.run_id,)) == [(0,)]


@pytest.mark.parametrize(
    "kind", [concurrent.futures.ThreadPoolExecutor, concurrent.futures.ProcessPoolExecutor]
)
def test_an_executor_shut_down_before_the_map_is_refused_with_what_to_pass_instead(
    store: Store, kind: type[concurrent.futures.Executor]
) -> None:
    """On DuckDB too: a shut-down executor is named before the store kind is looked at,
    not concurrent.futures' bare RuntimeError from the middle of the batch."""
    closed = kind(1)
    closed.shutdown()

    @kx.agent(name=name("shut"))
    def uses_closed(run: kx.Run) -> list[int]:
        return run.map(abs, [1, 2], executor=closed)

    handle = uses_closed.start()
    assert handle.wait(WAIT) == "failed"
    assert isinstance(handle.error, kx.KernelextError), handle.error
    message = str(handle.error)
    assert f"run.map(executor={kind.__name__}): the executor was shut down" in message
    assert "leave out executor=" in message and "Nothing was dispatched" in message
    assert store.read("SELECT count(*) FROM steps WHERE run_id = ?", (handle.run_id,)) == [(0,)]


def test_a_thread_pool_shut_down_during_the_map_is_named(store: Store) -> None:
    """Shut down by another thread while the batch dispatches: the next item is refused
    with the same words; the items already started end."""
    pool = concurrent.futures.ThreadPoolExecutor(1)

    def first_shuts_the_pool(i: int) -> int:
        if i == 0:
            pool.shutdown(wait=False)
        return i

    @kx.agent(name=name("shut-later"))
    def uses_pool(run: kx.Run) -> list[int]:
        return run.map(first_shuts_the_pool, [0, 1], executor=pool, concurrency=1)

    handle = uses_pool.start()
    assert handle.wait(WAIT) == "failed"
    assert isinstance(handle.error, kx.KernelextError), handle.error
    assert "the executor was shut down" in str(handle.error)


@pytest.mark.postgres
@pytest.mark.parametrize("delivery_server", [{"delay": 0.05}], indirect=True)
def test_a_process_pool_whose_worker_is_killed_loses_items_and_a_resume_delivers_each_once(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch, delivery_server: DeliveryServer
) -> None:
    store = store_for_workers(monkeypatch, postgres_url)
    jobs = item_jobs(delivery_server, 10)
    pools: list[concurrent.futures.ProcessPoolExecutor] = []

    def new_pool() -> concurrent.futures.ProcessPoolExecutor:
        pools.append(
            concurrent.futures.ProcessPoolExecutor(
                2, mp_context=multiprocessing.get_context("spawn")
            )
        )
        return pools[-1]

    @kx.agent(name=name("broken-pool"))
    def broken_pool(run: kx.Run, jobs: list[tuple[str, int]]) -> list[int]:
        return run.map(five_calls, jobs, concurrency=2, executor=new_pool())

    handle = broken_pool.start(jobs)
    waited = 0
    while len(read_log(delivery_server.log_path)) < 4 and waited < 1200:
        threading.Event().wait(0.05)
        waited += 1
    victim = next(iter(pools[0]._processes))  # one of the pool's worker processes
    os.kill(victim, 9)
    assert handle.wait(WAIT) == "failed"
    assert isinstance(handle.error, kx.ItemFailed)
    assert isinstance(handle.error.__cause__, kx.RemoteItemError)
    assert "worker running it was lost" in str(handle.error.__cause__)
    for _ in range(5):  # decide what the dead worker left unknown, from the server's log
        delivered = {entry["idempotency_key"] for entry in read_log(delivery_server.log_path)}
        for unknown in kx.reconcile(handle.run_id).open:
            if str(unknown.key) in delivered:
                unknown.mark_applied(result=1)
            else:
                unknown.mark_not_applied()
        handle = kx.resume(handle.run_id)
        if handle.wait(WAIT) == "completed":
            break
    assert handle.status == "completed", handle.error
    assert handle.result == list(range(10))
    keys = [entry["idempotency_key"] for entry in read_log(delivery_server.log_path)]
    assert len(keys) == 50 and len(set(keys)) == 50
    for pool in pools:
        pool.shutdown()
    applied = store.read(
        "SELECT count(*) FROM effects WHERE run_id = ? AND status = 'applied'", (handle.run_id,)
    )
    assert applied == [(50,)]


def one_call(job: tuple[str, int]) -> int:
    url, item = job
    post_item(url, item)
    return item


@pytest.mark.postgres
def test_workers_completing_items_of_one_run_at_once_never_deadlock_and_the_count_holds(
    postgres_url: str,
    monkeypatch: pytest.MonkeyPatch,
    delivery_server: DeliveryServer,
    pool: concurrent.futures.ProcessPoolExecutor,
) -> None:
    """Two worker processes complete items of one run at the same moment: neither may hold
    the run's row shared and then ask for it exclusively (the server would break the
    deadlock after a second, every time); the owner keeps the count of completed steps."""
    store = store_for_workers(monkeypatch, postgres_url)
    database = urllib.parse.urlsplit(postgres_url).path.lstrip("/")

    def deadlocks() -> int:
        rows = store.read("SELECT deadlocks FROM pg_stat_database WHERE datname = ?", (database,))
        return int(rows[0][0])

    jobs = item_jobs(delivery_server, 60)

    @kx.agent(name=name("no-deadlock"))
    def no_deadlock(run: kx.Run, jobs: list[tuple[str, int]]) -> list[int]:
        return run.map(one_call, jobs, concurrency=8, executor=pool)

    before = deadlocks()
    handle = no_deadlock.start(jobs)
    assert handle.wait(WAIT) == "completed", handle.error
    assert handle.result == list(range(60))
    assert deadlocks() == before
    counted = store.read("SELECT completed_steps FROM runs WHERE id = ?", (handle.run_id,))
    assert counted == [(60,)]
