"""run.map(executor=...) under attack: two attempts of one item at once, a late copy of an
item, and workers still inside their calls when the run is taken over.

Real parts: PostgreSQL, a process pool of worker processes (spawned), the local HTTP
server counting deliveries by Idempotency-Key. The executors below run every item
attempt twice, as Dask does when it runs a task again elsewhere while the worker it
presumed gone still runs it.
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from support.http_server import DeliveryServer
from support.pool_calls import WAIT, deliver_effect, per_key


class TwiceAtOnce(concurrent.futures.Executor):
    """Submits every call twice; hands back the first copy's future."""

    def __init__(self, pool: concurrent.futures.Executor) -> None:
        self.pool = pool
        self.copies: list[concurrent.futures.Future[Any]] = []

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        first = self.pool.submit(fn, *args, **kwargs)
        self.copies.append(self.pool.submit(fn, *args, **kwargs))
        return first


class LastCopyAnswers(TwiceAtOnce):
    """Submits every call twice; the answer is the copy that finished last (the re-run
    whose result the executor keeps); ``FirstCopyAnswers``: the first to finish."""

    ANSWERS_AFTER = 2

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        answer: concurrent.futures.Future[Any] = concurrent.futures.Future()
        finished: list[concurrent.futures.Future[Any]] = []
        lock = threading.Lock()

        def done(copy: concurrent.futures.Future[Any]) -> None:
            with lock:
                finished.append(copy)
                if len(finished) == self.ANSWERS_AFTER:
                    answer.set_result(copy.result())

        for _ in range(2):
            copy = self.pool.submit(fn, *args, **kwargs)
            self.copies.append(copy)
            copy.add_done_callback(done)
        return answer


class FirstCopyAnswers(LastCopyAnswers):
    ANSWERS_AFTER = 1


def one_item_started(
    one: Callable[[str], Any],
    executor: concurrent.futures.Executor,
    store_url: str,
    *,
    agent: str,
    run_id: str,
) -> Any:
    """Starts run ``run_id`` (on the store at ``store_url``) of an agent that maps ``one``
    over the single item ``"a"`` on ``executor``; returns its handle."""
    import kernelext as kx

    @kx.agent(name=agent)
    def mapping(run: Any, items: list[str]) -> Any:
        return run.map(one, items, executor=executor)

    kx.configure(store=store_url)
    return mapping.start(["a"], run_id=run_id)


def test_two_attempts_of_one_item_at_once_make_a_retried_call_once(
    postgres_url: str,
    delivery_server: DeliveryServer,
    spawned_pool: concurrent.futures.ProcessPoolExecutor,
    tmp_path: Path,
) -> None:
    """Both attempts read the item's ``failed`` (retry=True) row before either retries
    it: one makes the call again, the other does not."""
    import kernelext as kx

    deliver = deliver_effect(kx, delivery_server.url, retry=True)
    meet = str(tmp_path / "meet")

    def one(item: str) -> Any:
        import os
        import time
        import uuid

        if os.path.isdir(meet):  # both attempts have read the ledger: go on together
            open(os.path.join(meet, uuid.uuid4().hex), "w").close()
            end = time.monotonic() + WAIT
            while len(os.listdir(meet)) < 2 and time.monotonic() < end:
                time.sleep(0.02)
        return deliver(item)["delivery"]

    chosen: dict[str, Any] = {"executor": spawned_pool}

    @kx.agent(name="twice_at_once")
    def agent(run: Any, items: list[str]) -> Any:
        return run.map(one, items, executor=chosen["executor"])

    kx.configure(store=postgres_url)
    delivery_server.fail_next(1, 500)
    assert agent.start(["a"], run_id="twice").wait(WAIT) == "failed"
    assert delivery_server.count() == 0
    os.mkdir(meet)
    chosen["executor"] = twice = TwiceAtOnce(spawned_pool)
    status = kx.resume("twice").wait(WAIT)
    concurrent.futures.wait(twice.copies, timeout=WAIT)
    assert list(per_key(delivery_server).values()) == [1]
    if status != "completed":  # the copy that lost the race ended the item: once more
        assert status in ("needs_decision", "suspended")
        chosen["executor"] = spawned_pool
        assert kx.resume("twice").wait(WAIT) == "completed"
    assert list(per_key(delivery_server).values()) == [1]


def test_a_late_copy_of_an_item_never_changes_its_completed_step(
    postgres_url: str,
    delivery_server: DeliveryServer,
    spawned_pool: concurrent.futures.ProcessPoolExecutor,
    tmp_path: Path,
) -> None:
    """The copy began while the step was running, reaches its effect call once the run
    completed: it ends there (the run is not live), and the step stays completed."""
    import kernelext as kx

    deliver = deliver_effect(kx, delivery_server.url)
    marks = str(tmp_path / "marks")
    os.mkdir(marks)
    run_id = f"late-{uuid.uuid4().hex[:6]}"

    def one(item: str) -> Any:
        import os
        import time

        import psycopg

        end = time.monotonic() + WAIT
        try:
            os.close(os.open(os.path.join(marks, "first"), os.O_CREAT | os.O_EXCL))
        except FileExistsError:  # the late copy: its call comes once the run completed
            open(os.path.join(marks, "second"), "w").close()
            status = None
            while status != "completed" and time.monotonic() < end:
                time.sleep(0.05)
                with psycopg.connect(postgres_url) as con:
                    row = con.execute("SELECT status FROM runs WHERE id = %s", (run_id,))
                    status = row.fetchone()[0]
        else:  # the first attempt completes once the copy is under way
            while not os.path.exists(os.path.join(marks, "second")) and time.monotonic() < end:
                time.sleep(0.02)
        return deliver(item)["delivery"]

    twice = FirstCopyAnswers(spawned_pool)

    handle = one_item_started(one, twice, postgres_url, agent="late_copy", run_id=run_id)
    assert handle.wait(WAIT) == "completed"
    assert handle.result == [1]
    concurrent.futures.wait(twice.copies, timeout=WAIT)
    [step] = handle.steps()
    assert (step["status"], step["result"]) == ("completed", "1")
    assert delivery_server.count() == 1


def test_a_resume_after_a_forced_stop_asks_no_probe_while_workers_are_in_their_calls(
    postgres_url: str,
    delivery_server: DeliveryServer,
    spawned_pool: concurrent.futures.ProcessPoolExecutor,
    tmp_path: Path,
) -> None:
    """A forced stop cancels the futures, not the calls the workers are making: a resume
    right after it must not let a probe ("not delivered yet") make those calls again."""
    import json
    import urllib.request

    import kernelext as kx

    url = delivery_server.url
    gate = str(tmp_path / "go")

    def lookup(key: str, args: Any) -> str:
        with urllib.request.urlopen(f"{url}/deliveries?key={key}", timeout=5) as answer:
            return "applied" if json.loads(answer.read())["applied"] else "not_applied"

    deliver = deliver_effect(kx, url, gate, probe=lookup)

    def one(item: str) -> Any:
        return deliver(item)["delivery"]

    @kx.agent(name="forced_in_calls")
    def agent(run: Any, items: list[str]) -> Any:
        return run.map(one, items, executor=spawned_pool)

    kx.configure(store=postgres_url)
    handle = agent.start(["a", "b"], run_id="forced")
    end = time.monotonic() + WAIT
    pending = 0
    while pending < 2 and time.monotonic() < end:
        time.sleep(0.02)
        with psycopg.connect(postgres_url) as con:
            row = con.execute("SELECT count(*) FROM effects WHERE status = 'pending'").fetchone()
            pending = row[0] if row else 0
    assert pending == 2
    handle.force_stop()
    assert handle.wait(WAIT) == "suspended"
    resumed = kx.resume("forced")  # taken over: the probes answer now, or later
    Path(gate).touch()  # the workers' requests arrive now
    delivery_server.wait_for(2, timeout=WAIT)  # the calls of the forced-stopped attempts
    status = resumed.wait(WAIT)
    delivery_server.settle()
    assert sorted(per_key(delivery_server).values()) == [1, 1]
    assert status == "needs_decision"


def test_run_map_returns_the_value_the_step_keeps_when_two_attempts_completed_it(
    postgres_url: str, spawned_pool: concurrent.futures.ProcessPoolExecutor, tmp_path: Path
) -> None:
    """The first attempt completes the step; the second one's value (computed without an
    effect, so it differs) comes back from the executor: run.map returns the stored one."""
    import json

    marks = str(tmp_path / "marks")
    os.mkdir(marks)
    run_id = f"kept-{uuid.uuid4().hex[:6]}"

    def one(item: str) -> str:
        import os
        import time
        import uuid

        import psycopg

        try:
            os.close(os.open(os.path.join(marks, "first"), os.O_CREAT | os.O_EXCL))
        except FileExistsError:  # the second attempt answers once the first completed
            end, status = time.monotonic() + WAIT, None
            while status != "completed" and time.monotonic() < end:
                time.sleep(0.05)
                with psycopg.connect(postgres_url) as con:
                    row = con.execute("SELECT status FROM steps WHERE run_id = %s", (run_id,))
                    found = row.fetchone()
                    status = found[0] if found else None
        return f"{item}:{uuid.uuid4().hex}"

    twice = LastCopyAnswers(spawned_pool)

    handle = one_item_started(one, twice, postgres_url, agent="value_kept", run_id=run_id)
    assert handle.wait(WAIT) == "completed"
    [step] = handle.steps()
    assert step["status"] == "completed"
    assert handle.result == [json.loads(step["result"])]


def _count(url: str, query: str) -> int:
    with psycopg.connect(url) as con:
        row = con.execute(query).fetchone()
    return int(row[0]) if row else 0


class CopyOnceInCall(TwiceAtOnce):
    """Submits a second copy of the first call once that one is inside its effect call
    (its intent pending): the re-run of a task whose worker looked gone mid-call. Later
    calls are submitted once."""

    def __init__(self, spawned_pool: concurrent.futures.Executor, url: str) -> None:
        super().__init__(spawned_pool)
        self.url = url
        self.threads: list[threading.Thread] = []

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        first = self.pool.submit(fn, *args, **kwargs)
        if self.threads:
            return first

        def copy() -> None:
            end = time.monotonic() + WAIT
            query = "SELECT count(*) FROM effects WHERE status = 'pending'"
            while not _count(self.url, query) and time.monotonic() < end:
                time.sleep(0.02)
            self.copies.append(self.pool.submit(fn, *args, **kwargs))

        thread = threading.Thread(target=copy)
        thread.start()
        self.threads.append(thread)
        return first


def test_a_call_a_second_attempt_took_for_lost_keeps_the_outcome_its_maker_recorded(
    postgres_url: str,
    delivery_server: DeliveryServer,
    spawned_pool: concurrent.futures.ProcessPoolExecutor,
    tmp_path: Path,
) -> None:
    """The second attempt starts while the first is inside its call: it turns the
    pending intent unknown and ends the item waiting. The call then returns: its applied
    outcome is kept, the run does not complete on a step that did not, and a resume
    replays the call."""
    import kernelext as kx

    gate = str(tmp_path / "go")
    deliver = deliver_effect(kx, delivery_server.url, gate)

    def one(item: str) -> Any:
        return deliver(item)["delivery"]

    twice = CopyOnceInCall(spawned_pool, postgres_url)

    handle = one_item_started(one, twice, postgres_url, agent="taken_for_lost", run_id="lost")
    end = time.monotonic() + WAIT
    unknown = "SELECT count(*) FROM effects WHERE status = 'unknown'"
    while not _count(postgres_url, unknown) and time.monotonic() < end:
        time.sleep(0.02)  # the second attempt took the call for lost
    assert _count(postgres_url, unknown) == 1
    Path(gate).touch()  # the first attempt's call is answered now
    status = handle.wait(WAIT)
    for thread in twice.threads:
        thread.join()
    concurrent.futures.wait(twice.copies, timeout=WAIT)
    assert delivery_server.count() == 1
    assert _count(postgres_url, "SELECT count(*) FROM effects WHERE status = 'applied'") == 1
    [step] = handle.steps()
    assert status != "completed" or step["status"] == "completed"
    if status != "completed":
        assert kx.resume("lost").wait(WAIT) == "completed"
    assert delivery_server.count() == 1
