"""``run.map(..., executor=...)``: an item in another process that ended (waiting for a
person, or completed), whose worker died before it answered the owner.

The item's step is in the store as the worker left it (``cancelled``, waiting for a
person); the executor runs the item again (as Dask does when a worker died), and that
second attempt finds the step no longer running and answers ``ended``. The owner settles
that answer from what the store says the step ended as: the run suspends for the approval
exactly as it does when the same batch runs in the owner's process, and after the
approval a resume runs the item, its call delivered once. An item that completed before
its worker died, when the executor gives up on it instead of running it again (Dask's
``KilledWorker``), is settled from its step just as well: its value, never a failure.

Real parts: a PostgreSQL store, spawned worker processes (one SIGKILLed by the test), and
the 127.0.0.1 DeliveryServer, whose log counts the calls.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

import pytest
from support.http_server import DeliveryServer, read_log
from support.live import name
from support.pool_calls import post_item_and_pid

import kernelext as kx
from kernelext._core.batch.wire import loads
from kernelext._store import Store

WAIT = 120.0
NEEDS_APPROVAL = 1  # the one item whose call waits for a person


@kx.effect(name="remote_pay", needs_approval=lambda url, item, **kw: item == NEEDS_APPROVAL)
def remote_pay(url: str, item: int, *, idempotency_key: str | None = None) -> int:
    return post_item_and_pid(url, item, idempotency_key)


def one_at_a_time(
    agent: str,
    item: Callable[[tuple[str, int]], int],
    jobs: list[tuple[str, int]],
    executor: concurrent.futures.Executor | None = None,
) -> kx.Handle:
    """Starts a run of a new agent (named after ``agent``) that maps ``item`` over ``jobs``
    one at a time, each step keyed by the job's item number; on ``executor``, or in this
    process without one."""

    @kx.agent(name=name(agent))
    def batch(run: kx.Run, jobs: list[tuple[str, int]]) -> list[int]:
        return run.map(item, jobs, key=lambda job: str(job[1]), concurrency=1, executor=executor)

    return batch.start(jobs)


def pay_item(job: tuple[str, int]) -> int:
    url, item = job
    remote_pay(url, item)
    return item


def answer_held_when(call: Any, blob: bytes, held: str, kind: str) -> bytes:
    """In a worker: run the item attempt; when it ended as ``kind`` (``waiting`` for a
    person, ``done``), note this process's id in ``held`` and keep the answer until the
    process is killed."""
    answer: bytes = call(blob)
    if loads(answer).kind == kind:
        written = Path(held + ".part")
        written.write_text(str(os.getpid()))
        written.rename(held)  # whole: the test reads it as soon as it exists
        time.sleep(WAIT)  # the test kills this process well before
    return answer


class RerunningPool(concurrent.futures.Executor):
    """Spawned worker processes that run an item again when the process running it died,
    as a Dask cluster does: the attempts of a broken pool go to a fresh one. Until the
    first process dies, an attempt that ended as ``hold`` keeps its answer (``held``).
    With ``rerun=False`` the pool gives up on the attempts the dead process had (their
    futures fail, as Dask's do with ``KilledWorker``) and runs new items in a fresh one."""

    def __init__(self, held: Path, hold: str = "waiting", *, rerun: bool = True) -> None:
        self.held, self.hold, self.rerun = held, hold, rerun
        self.pools = [self._new_pool()]
        self.reruns = 0
        self._lock = threading.Lock()

    @staticmethod
    def _new_pool() -> concurrent.futures.ProcessPoolExecutor:
        return concurrent.futures.ProcessPoolExecutor(
            2, mp_context=multiprocessing.get_context("spawn")
        )

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future[Any]:
        outer: Future[Any] = Future()
        outer.set_running_or_notify_cancel()
        with self._lock:
            first = len(self.pools) == 1
            pool = self.pools[-1]
        if first:
            inner = pool.submit(answer_held_when, fn, args[0], str(self.held), self.hold)
        else:
            inner = pool.submit(fn, *args)
        inner.add_done_callback(lambda done: self._passed_on(done, outer, fn, args))
        return outer

    def _passed_on(self, done: Future[Any], outer: Future[Any], fn: Any, args: Any) -> None:
        error = done.exception()
        if isinstance(error, BrokenProcessPool) and not self.rerun:
            with self._lock:  # new items go to a fresh pool; this one is given up on
                if len(self.pools) == 1:
                    self.pools.append(self._new_pool())
            outer.set_exception(error)
        elif isinstance(error, BrokenProcessPool):
            threading.Thread(target=self._rerun, args=(outer, fn, args), daemon=True).start()
        elif error is not None:
            outer.set_exception(error)
        else:
            outer.set_result(done.result())

    def _rerun(self, outer: Future[Any], fn: Any, args: Any) -> None:
        with self._lock:
            if len(self.pools) == 1:
                self.pools.append(self._new_pool())
            pool = self.pools[-1]
            self.reruns += 1
        try:
            outer.set_result(pool.submit(fn, *args).result())
        except BaseException as exc:
            outer.set_exception(exc)

    def shutdown(self, wait: bool = True, **kwargs: Any) -> None:
        for pool in self.pools:
            pool.shutdown(wait)


@pytest.fixture
def pg(postgres_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Store]:
    """The run's store: a fresh PostgreSQL database, which the workers open too."""
    from support.live import finish_live_runs

    from kernelext._core.process.runtime import runtime

    monkeypatch.setenv("KERNELEXT_STORE", postgres_url)
    opened = kx.open_store(postgres_url)
    yield opened
    finish_live_runs()
    runtime().close()


def until(condition: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {WAIT}s")
        time.sleep(0.02)


def step_rows(store: Store, run_id: str, key: str) -> list[tuple[Any, ...]]:
    return store.read(
        "SELECT status, error FROM steps WHERE run_id = ? AND key = ? ORDER BY started_at",
        (run_id, key),
    )


@pytest.mark.postgres
@pytest.mark.timeout(300)
def test_an_item_whose_worker_died_after_it_ended_waiting_suspends_the_run_for_its_approval(
    pg: Store, delivery_server: DeliveryServer, tmp_path: Path
) -> None:
    url = delivery_server.url + "/pay"
    jobs = [(url, i) for i in range(3)]
    waiting = str(NEEDS_APPROVAL)

    # The same batch in the owner's process: what a run waiting for the approval is.
    here = one_at_a_time("pay-here", pay_item, jobs)
    assert here.wait(WAIT) == "suspended", here.error
    expected = pg.get_run(here.run_id)
    assert expected["reason"] == "approval"
    assert [r.step for r in kx.approvals(here.run_id)] == [waiting]

    held = tmp_path / "held-answer"
    pool = RerunningPool(held)
    try:
        handle = one_at_a_time("pay-remote", pay_item, jobs, executor=pool)
        until(held.exists, "the item waiting for its approval")
        # The worker recorded the step's end before it answered; it dies with the answer.
        assert step_rows(pg, handle.run_id, waiting) == [("cancelled", "waits for a person")]
        os.kill(int(held.read_text()), signal.SIGKILL)

        assert handle.wait(WAIT) == "suspended", handle.error
        assert pool.reruns == 1  # the executor ran the item again; it answered `ended`
        run = pg.get_run(handle.run_id)
        assert (run["status"], run["reason"]) == (expected["status"], expected["reason"])
        [request] = kx.approvals(handle.run_id)
        assert request.step == waiting
        assert step_rows(pg, handle.run_id, "2")[-1][0] == "completed"  # the others went on
        remote_items = [d["body"]["item"] for d in read_log(delivery_server.log_path or "")]
        assert sorted(remote_items) == [0, 0, 2, 2]  # both runs: nothing sent for item 1

        request.approve(resume=False)
        resumed = kx.resume(handle.run_id)
        assert resumed.wait(WAIT) == "completed", resumed.error
        assert resumed.result == [0, 1, 2]
    finally:
        pool.shutdown()

    log = read_log(delivery_server.log_path or "")
    mine = [d for d in log if d["body"]["pid"] != os.getpid()]  # the remote run's calls
    assert sorted(d["body"]["item"] for d in mine) == [0, 1, 2]  # each call once
    assert len({d["idempotency_key"] for d in mine}) == 3
    applied = pg.read(
        "SELECT count(*) FROM effects WHERE run_id = ? AND status = 'applied'", (handle.run_id,)
    )
    assert applied == [(3,)]


@pytest.mark.postgres
@pytest.mark.timeout(300)
def test_an_item_whose_worker_died_after_it_completed_keeps_its_value_when_the_executor_gives_up(
    pg: Store, delivery_server: DeliveryServer, tmp_path: Path
) -> None:
    url = delivery_server.url + "/done"
    jobs = [(url, i) for i in range(3)]
    held = tmp_path / "held-answer"
    pool = RerunningPool(held, "done", rerun=False)
    try:
        handle = one_at_a_time("done-lost", one_post, jobs, executor=pool)
        until(held.exists, "the first item completed in its worker")
        # The worker recorded the item's completion; it dies with the answer, and the
        # executor gives up on that attempt (no second one): the owner sees it lost.
        assert step_rows(pg, handle.run_id, "0") == [("completed", None)]
        os.kill(int(held.read_text()), signal.SIGKILL)

        assert handle.wait(WAIT) == "completed", handle.error
        assert handle.result == [0, 1, 2]
    finally:
        pool.shutdown()
    assert pool.reruns == 0 and len(pool.pools) == 2  # given up on: item 0 ran once
    assert [rows[-1][0] for rows in (step_rows(pg, handle.run_id, str(i)) for i in range(3))] == [
        "completed"
    ] * 3
    log = read_log(delivery_server.log_path or "")
    assert sorted(d["body"]["item"] for d in log) == [0, 1, 2]  # each call once
    assert kx.reconcile(handle.run_id).open == []  # nothing was left unknown


@kx.effect(name="remote_done")
def remote_done(url: str, item: int, *, idempotency_key: str | None = None) -> int:
    return post_item_and_pid(url, item, idempotency_key)


def one_post(job: tuple[str, int]) -> int:
    url, item = job
    remote_done(url, item)
    return item
