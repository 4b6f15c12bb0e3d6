"""``run.map`` on a real Dask cluster, with faults: stops, SIGKILLed workers, a SIGKILLed
notebook, a stale owner's worker, and a store workers cannot share.

Real parts only: a PostgreSQL server (tests/support/postgres.py), a ``LocalCluster`` of two
worker processes under nannies in a process of its own (tests/support/dask_cluster.py), and
the 127.0.0.1 DeliveryServer without dedupe, whose JSON-lines log is the ground truth. Each
item is one ``@kx.effect`` POST keyed by the ledger (tests/support/dask_items.py); the
notebook is this process, or a child process (tests/support/dask_owner.py) when the test
kills it. Every unknown effect is decided from the server's log, as a person would.

Checked at the end of every run: each item delivered exactly once (by key and by item), the
ledger has one applied row per item under the item's step, each item is one completed step,
and ``run.map`` returned the server's answers in input order.
"""

from __future__ import annotations

import concurrent.futures
import os
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from crash import Worker
from support import dask_items
from support.dask_cluster import ClusterHolder, WorkerKiller, cluster_env, worker_pids
from support.dask_items import attempts, decide_from_log, in_flight, release
from support.http_server import DeliveryServer, read_log

import kernelext as kx
from kernelext._core.ledger.effect import effect_key
from kernelext._core.lifecycle.resume import load_run
from kernelext._store import Store

SUPPORT = Path(__file__).resolve().parents[1] / "support"
KILLS = int(os.environ.get("KERNELEXT_DASK_KILLS", "20"))
SEED = int(os.environ.get("KERNELEXT_DASK_SEED", "2323"))
AGENT = "dask-deliveries"
WAIT = 120.0  # the longest any one run, line or attempt may take on a loaded machine


# -- fixtures ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterHolder]:
    """One LocalCluster (2 worker processes, 2 threads each) for the module's tests."""
    log = tmp_path_factory.mktemp("dask") / "cluster.log"
    with ClusterHolder(log) as holder:
        yield holder


@pytest.fixture
def client(cluster: ClusterHolder) -> Iterator[Any]:
    opened = cluster.client()
    yield opened
    dask_items.EXECUTOR.clear()
    opened.close()


@pytest.fixture
def pg(postgres_url: str) -> Iterator[Store]:
    """The notebook's store: a fresh PostgreSQL database (the default store too)."""
    from support.live import finish_live_runs

    from kernelext._core.process.runtime import runtime

    opened = kx.open_store(postgres_url)
    yield opened
    finish_live_runs()
    runtime().close()


@pytest.fixture
def gates(tmp_path: Path) -> Iterator[Path]:
    """Where held items wait; every one is let go at the end (workers are shared)."""
    folder = tmp_path / "gates"
    folder.mkdir()
    yield folder
    release(folder)


# -- checks ----------------------------------------------------------------------------------
def item_key(run_id: str, item: int) -> str:
    return str(effect_key(run_id, f"item-{item}", dask_items.TOOL, 0))


def completed_items(store: Store, run_id: str) -> set[int]:
    return {
        int(step["key"].removeprefix("item-"))
        for step in store.completed_steps(run_id)
        if step["key"].startswith("item-")
    }


def check_delivered_once(store: Store, run_id: str, server: DeliveryServer, items: int) -> None:
    """The run completed; each item delivered exactly once, recorded once, returned in order."""
    assert store.get_run(run_id)["status"] == "completed"
    server.settle()
    mine = [d for d in read_log(server.log_path or "") if d["body"]["run"] == run_id]
    by_key = Counter(d["idempotency_key"] for d in mine)
    by_item = Counter(d["body"]["item"] for d in mine)
    assert {k: n for k, n in by_key.items() if n != 1} == {}, f"{run_id}: delivered twice"
    assert {i: n for i, n in by_item.items() if n != 1} == {}, f"{run_id}: an item twice"
    assert sorted(by_item) == list(range(items)), f"{run_id}: items never delivered"
    assert set(by_key) == {item_key(run_id, i) for i in range(items)}

    rows = store.load_effects(run_id).values()
    assert sorted((r["step_key"], r["call_ordinal"], r["status"]) for r in rows) == sorted(
        (f"item-{i}", 0, "applied") for i in range(items)
    ), f"{run_id}: one applied ledger row per item, under the item's step"
    completed = Counter(s["key"] for s in store.completed_steps(run_id))
    assert completed == Counter([f"item-{i}" for i in range(items)] + ["results"])

    seq = {d["body"]["item"]: d["seq"] for d in mine}
    state = load_run(store, run_id, AGENT, None, False).state
    assert state["results"] == [
        {"item": i, "delivery": seq[i], "key": item_key(run_id, i)} for i in range(items)
    ], "run.map returns the server's answer for every item, in input order"


def wait_until(condition: Any, what: str, *, owner: Any = None) -> None:
    """Wait for ``condition``; fail at once when ``owner`` (a run's handle here, or a
    notebook process) ended meanwhile, else after ``WAIT`` seconds."""
    deadline = time.monotonic() + WAIT
    while not condition():
        if isinstance(owner, Worker) and owner.proc.poll() is not None:
            pytest.fail(f"{what}: the notebook process exited\n{owner.stderr()}")
        if owner is not None and not isinstance(owner, Worker) and not owner.alive:
            pytest.fail(f"{what}: the run ended {owner.status}: {owner.error!r}")
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {WAIT}s")
        time.sleep(0.02)


def until_delivered(server: DeliveryServer, count: int, owner: Any, key: str | None = None) -> None:
    wait_until(lambda: server.count(key) >= count, f"{count} deliveries", owner=owner)


# -- owners in processes of their own ---------------------------------------------------------
def owner_process(tmp_path: Path, name: str) -> Worker:
    """A notebook process, loaded and waiting for its ``go`` (tests/support/dask_owner.py)."""
    owner = Worker(SUPPORT / "dask_owner.py", tmp_path / f"{name}.stderr", cluster_env())
    owner.expect("loaded")
    return owner


def owned(owner: Worker, **go: Any) -> int:
    """Send ``go``; returns the epoch the owner holds once it owns the run."""
    owner.go(**go)
    return int(owner.expect("ready").split()[1])


def finished(owner: Worker) -> dict[str, Any]:
    import json

    line = owner.expect("done", timeout=WAIT)
    assert owner.reap() == 0, owner.stderr()
    result: dict[str, Any] = json.loads(line.split(" ", 1)[1])
    return result


def resume_until_completed(
    tmp_path: Path, pg: Store, run_id: str, server: DeliveryServer, go: dict[str, Any]
) -> Counter[str]:
    """Decide unknowns from the log and resume from new owner processes until completed."""
    decided: Counter[str] = Counter()
    for attempt in range(10):
        status = pg.get_run(run_id)["status"]
        if status == "completed":
            return decided
        decided += decide_from_log(run_id, server, store=pg)
        owner = owner_process(tmp_path, f"resume-{attempt}")
        owned(owner, **go, mode="resume")
        finished(owner)
    pytest.fail(f"{run_id} did not complete in 10 resumes: {pg.get_run(run_id)['status']}")


# -- 1. a stop and a resume ---------------------------------------------------------------
@pytest.mark.postgres
@pytest.mark.timeout(180)
def test_each_item_is_delivered_once_across_a_stop_and_a_resume(
    pg: Store, client: Any, delivery_server: DeliveryServer, tmp_path: Path, gates: Path
) -> None:
    items, markers, held = 40, tmp_path / "markers.txt", (2, 5)
    dask_items.EXECUTOR["executor"] = client  # a distributed.Client, as it is
    handle = dask_items.deliveries.start(
        delivery_server.url, items, 8, pause=0.05, markers=str(markers), gates=str(gates),
        held=held, run_id="stop-1", store=pg,
    )  # fmt: skip
    until_delivered(delivery_server, items // 4, handle)
    wait_until(
        lambda: {a.item for a in in_flight(markers)} >= set(held), "held items begun", owner=handle
    )
    kx.stop("stop-1")
    wait_until(lambda: pg.get_run("stop-1")["stop_requested_at"] is not None, "the stop")
    for item in held:  # inside fn on a worker, before their call: they reach it only now
        release(gates, item, 1)
    assert handle.wait(WAIT) == "suspended"

    assert in_flight(markers) == [], "the run suspends once every dispatched item ended"
    ended = {a.item: a.outcome for a in attempts(markers)}
    assert {ended[item] for item in held} == {"StopRequested"}, "a worker's item stops at its call"
    steps = {s["key"]: s["status"] for s in pg.steps("stop-1")}
    assert {steps[f"item-{item}"] for item in held} == {"cancelled"}
    delivery_server.settle()
    delivered = {d["body"]["item"] for d in delivery_server.deliveries}
    assert 0 < len(delivered) < items and not delivered & set(held), "stopped mid-batch"
    assert completed_items(pg, "stop-1") == delivered, "a delivered item is a completed one"
    assert list(kx.reconcile("stop-1", store=pg)) == [], "a stop leaves no unknown effect"

    begun = len(attempts(markers))
    again = kx.resume("stop-1", store=pg)
    assert again.wait(WAIT) == "completed", again.error
    rerun = {a.item for a in attempts(markers)[begun:]} & delivered
    assert rerun == set(), "the resume runs only the items that did not complete"
    check_delivered_once(pg, "stop-1", delivery_server, items)


@pytest.mark.postgres
@pytest.mark.timeout(180)
def test_a_force_stop_cancels_the_items_in_flight_and_keeps_no_late_result(
    pg: Store, client: Any, delivery_server: DeliveryServer, tmp_path: Path, gates: Path
) -> None:
    items, markers = 12, tmp_path / "markers.txt"
    dask_items.EXECUTOR["executor"] = client
    handle = dask_items.deliveries.start(
        delivery_server.url, items, 4, pause=0.02, markers=str(markers), gates=str(gates),
        held=(0,), held_after=(1,), run_id="forced", store=pg,
    )  # fmt: skip
    until_delivered(delivery_server, 1, handle, item_key("forced", 1))
    wait_until(
        lambda: {a.item for a in in_flight(markers)} >= {0, 1}, "held items begun", owner=handle
    )
    handle.force_stop()
    assert handle.wait(WAIT) == "suspended"
    assert {a.item for a in in_flight(markers)} >= {0, 1}, "the run did not wait for them"
    steps = {s["key"]: s["status"] for s in pg.steps("forced")}
    assert (steps["item-0"], steps["item-1"]) == ("cancelled", "cancelled"), steps

    release(gates, 0, 1)  # it calls only now, in a run that is not live
    release(gates, 1, 1, after=True)  # it returns only now: a late result
    wait_until(lambda: not {a.item for a in in_flight(markers)} & {0, 1}, "held items end")
    ended = {a.item: a.outcome for a in attempts(markers)}
    assert ended[0] == "StopRequested" and ended[1] == "ok", ended
    delivery_server.settle()
    assert delivery_server.count(item_key("forced", 0)) == 0, "the late call was not made"
    steps = {s["key"]: s["status"] for s in pg.steps("forced")}
    assert steps["item-1"] == "cancelled", "a late result does not overwrite an ended step"

    decide_from_log("forced", delivery_server, store=pg)
    again = kx.resume("forced", store=pg)
    assert again.wait(WAIT) == "completed", again.error
    check_delivered_once(pg, "forced", delivery_server, items)


# -- 2. SIGKILL of worker processes, again and again --------------------------------------
@pytest.mark.postgres
@pytest.mark.timeout(300)
def test_sigkilled_workers_rerun_items_without_a_duplicate_delivery(
    pg: Store, client: Any, delivery_server: DeliveryServer, tmp_path: Path, gates: Path
) -> None:
    items, markers = 40, tmp_path / "markers.txt"
    delivery_server.delay = 0.03  # calls stay open a while: kills land inside them too
    dask_items.EXECUTOR["executor"] = client.get_executor()  # a concurrent.futures.Executor
    live: list[Any] = []
    killer = WorkerKiller(client, lambda: bool(live) and live[0].alive, KILLS, seed=SEED)
    runs: list[str] = []
    ends: Counter[str] = Counter()
    decided: Counter[str] = Counter()
    killer.start()
    try:
        while not runs or pg.get_run(runs[-1])["status"] != "completed" or not killer.done:
            if not runs or pg.get_run(runs[-1])["status"] == "completed":
                runs.append(f"kill-{len(runs)}")
                handle = dask_items.deliveries.start(
                    delivery_server.url, items, 8, pause=0.03, markers=str(markers),
                    gates=str(gates), run_id=runs[-1], store=pg,
                )  # fmt: skip
            else:
                wait_until(lambda: not in_flight(markers, alive_only=True), "items in flight")
                decided += decide_from_log(runs[-1], delivery_server, store=pg)
                handle = kx.resume(runs[-1], store=pg)
            live[:] = [handle]
            status = handle.wait(WAIT)
            assert status != "running", f"{runs[-1]} still running after {WAIT}s"
            ends[status] += 1
            assert not killer.errors, killer.errors
            assert sum(ends.values()) < 20 * len(runs), f"no progress: {dict(ends)}"
    finally:
        killer.stop()
    assert not killer.errors, killer.errors

    print(f"\nkills {len(killer.kills)}, runs {len(runs)}, ends {dict(ends)}, {dict(decided)}")
    assert len(killer.kills) >= KILLS
    assert all(kill.tasks > 0 for kill in killer.kills), "every kill landed mid-batch"
    tried = attempts(markers)
    cut = [a for a in tried if a.outcome is None]
    assert cut, "kills cut items short"
    assert {a.pid for a in cut} <= {kill.pid for kill in killer.kills}, "only killed ones"
    for a in cut:
        later = [b for b in tried if (b.run_id, b.item) == (a.run_id, a.item)]
        assert later[-1].attempt > a.attempt and later[-1].outcome == "ok", (
            f"{a}: the item cut short ran again, elsewhere, to its end"
        )
    assert decided["applied"] > 0, "some kills left a delivered call unknown; reconciled"
    for run_id in runs:
        check_delivered_once(pg, run_id, delivery_server, items)


def set_allowed_failures(client: Any, n: int) -> int:
    """Worker deaths a task may see before Dask gives up on it (``KilledWorker``); returns
    the previous setting."""

    def swap(dask_scheduler: Any) -> int:
        before = int(dask_scheduler.allowed_failures)
        dask_scheduler.allowed_failures = n
        return before

    return int(client.run_on_scheduler(swap))


def lose_an_item_mid_call(
    pg: Store, client: Any, server: DeliveryServer, markers: Path, run_id: str
) -> tuple[Any, int, set[int]]:
    """A run whose worker is SIGKILLed inside an item's call (the server has the call, and
    answers it later), with Dask told to give up on a task at its worker's first death.
    Returns the run's handle, once the run ended, that item, and every item the killed
    worker was running (the worker runs several at once: any of them may be inside its
    call too)."""
    before = set_allowed_failures(client, 0)
    server.slow_next(1, 3.0)
    try:
        handle = dask_items.deliveries.start(
            server.url, 12, 4, pause=0.02, markers=str(markers), run_id=run_id, store=pg
        )
        until_delivered(server, 1, handle)
        item = int(server.deliveries[0]["body"]["item"])
        (attempt,) = [a for a in in_flight(markers) if a.item == item]
        os.kill(attempt.pid, signal.SIGKILL)
        assert handle.wait(WAIT) == "failed"
    finally:
        set_allowed_failures(client, before)
    with_it = {a.item for a in in_flight(markers) if a.pid == attempt.pid}
    return handle, item, with_it


@pytest.mark.postgres
@pytest.mark.timeout(180)
def test_an_item_dask_gives_up_on_fails_the_run_and_a_resume_runs_it_again(
    pg: Store, client: Any, delivery_server: DeliveryServer, tmp_path: Path
) -> None:
    markers = tmp_path / "markers.txt"
    dask_items.EXECUTOR["executor"] = client
    handle, item, _ = lose_an_item_mid_call(pg, client, delivery_server, markers, "given-up")
    assert isinstance(handle.error, kx.ItemFailed), handle.error
    steps = {s["key"]: s["status"] for s in pg.steps("given-up")}
    assert steps[handle.error.key] == "failed", "the lost item's step ended"
    assert steps[f"item-{item}"] == "failed", steps
    assert [a.item for a in attempts(markers)].count(item) == 1, "Dask gave up: no re-run"

    done_before = completed_items(pg, "given-up")
    begun = len(attempts(markers))
    decided: Counter[str] = Counter()
    for _ in range(5):
        again = kx.resume("given-up", store=pg)
        if again.wait(WAIT) != "needs_decision":
            break
        decided += decide_from_log("given-up", delivery_server, store=pg)
    assert again.status == "completed", again.error
    assert decided["applied"] >= 1, "the call cut short was decided from the server's log"
    assert not {a.item for a in attempts(markers)[begun:]} & done_before, "only the rest ran"
    check_delivered_once(pg, "given-up", delivery_server, 12)


@pytest.mark.postgres
@pytest.mark.timeout(180)
def test_a_call_lost_with_its_worker_can_be_decided_before_any_resume(
    pg: Store, client: Any, delivery_server: DeliveryServer, tmp_path: Path
) -> None:
    dask_items.EXECUTOR["executor"] = client
    handle, item, with_it = lose_an_item_mid_call(
        pg, client, delivery_server, tmp_path / "markers.txt", "lost-call"
    )
    assert "kx.reconcile" in str(handle.error.__cause__), "the error says where to decide"
    listed = {u.step_key for u in kx.reconcile("lost-call", store=pg)}
    assert f"item-{item}" in listed, "the call the server has, unanswered, is listed"
    assert listed <= {f"item-{i}" for i in with_it}, "only calls in the killed worker are listed"


# -- 3. SIGKILL of the notebook itself -----------------------------------------------------
@pytest.mark.postgres
@pytest.mark.timeout(240)
def test_a_sigkilled_notebook_is_resumed_from_a_new_process_without_a_duplicate(
    pg: Store, postgres_url: str, cluster: ClusterHolder, delivery_server: DeliveryServer,
    tmp_path: Path, gates: Path,
) -> None:  # fmt: skip
    items, markers, held = 30, tmp_path / "markers.txt", (1, 4)
    delivery_server.delay = 0.05
    args = {
        "url": delivery_server.url, "items": items, "concurrency": 8, "pause": 0.2,
        "markers": str(markers), "gates": str(gates), "held": list(held),
    }  # fmt: skip
    go = {"store": postgres_url, "scheduler": cluster.address, "run_id": "notebook-kill"}
    first, second = owner_process(tmp_path, "first"), owner_process(tmp_path, "second")
    epoch = owned(first, **go, mode="start", args=args)
    until_delivered(delivery_server, 6, first)
    # In this order: the held items are on the workers (inside fn, before their call, until
    # released), and only then are two calls held inside the server, so that the kill
    # lands while all four are in flight, however long each wait took.
    wait_until(
        lambda: {a.item for a in in_flight(markers)} >= set(held), "held items begun", owner=first
    )
    delivery_server.hold_next(2)  # two calls the server has, answered after the take-over

    def inside_calls() -> int:  # items inside one of those two calls
        inside = {d["body"]["item"] for d in delivery_server.deliveries if d.get("held")}
        return sum(a.item in inside for a in in_flight(markers))

    wait_until(lambda: inside_calls() >= 2, "calls the server has, unanswered", owner=first)
    assert first.kill(), "the notebook was SIGKILLed mid-batch"
    old = {(a.item, a.attempt) for a in in_flight(markers)}
    assert len(old) >= len(held) + 2, "the notebook died with items in flight on the workers"

    try:
        assert owned(second, **go, mode="resume") > epoch, "the new notebook holds a newer epoch"
        assert finished(second)["status"] == "needs_decision", "calls in flight became unknown"
    finally:
        delivery_server.release_held()  # the dead notebook's two calls are answered only now
    for item in held:  # the dead notebook's held items go on to their POST only now
        release(gates, item, 1)
    wait_until(
        lambda: not {(a.item, a.attempt) for a in in_flight(markers)} & old,
        "the dead notebook's items in flight end",
    )
    ended = {(a.item, a.attempt): a.outcome for a in attempts(markers)}
    for item in held:
        assert ended[(item, 1)] == "OwnershipLost", "a stale owner's item is refused"
    decided = resume_until_completed(tmp_path, pg, "notebook-kill", delivery_server, go)
    print(f"\nin flight at the kill {sorted(old)}: {[ended[a] for a in sorted(old)]}; {decided}")
    assert sum(decided.values()) > 0, "the unknowns were decided from the server's log"
    check_delivered_once(pg, "notebook-kill", delivery_server, items)


# -- 4. a worker of a stale owner ------------------------------------------------------------
def stale_task(store: Store, url: str, run_id: str, item: int, epoch: int, fn: Any) -> bytes:
    """The task of ``item``'s running step, as an owner holding ``epoch`` would send it."""
    from kernelext._core.batch.wire import RemoteTask, dumps

    (step,) = [
        s for s in store.steps(run_id) if (s["key"], s["status"]) == (f"item-{item}", "running")
    ]
    row = store.get_run(run_id)
    task = RemoteTask(
        url=url, run_id=run_id, epoch=epoch, agent=row["agent"], key_scheme=row["key_scheme"],
        chain_root=store.chain_root(run_id), step_id=step["id"], key=step["key"],
        ordinal=step["ordinal"], name=step["name"], max_step_seconds=None,
        fn_blob=dumps(fn), item_blob=dumps(item),
    )  # fmt: skip
    return dumps(task)


@pytest.mark.postgres
@pytest.mark.timeout(180)
def test_a_worker_holding_a_stale_epoch_is_refused_and_delivers_nothing(
    pg: Store, postgres_url: str, cluster: ClusterHolder, client: Any,
    delivery_server: DeliveryServer, tmp_path: Path, gates: Path,
) -> None:  # fmt: skip
    from kernelext._core.batch.remote_item import execute_item
    from kernelext._core.batch.wire import error_from_wire, loads

    markers = tmp_path / "markers.txt"
    args = {
        "url": delivery_server.url, "items": 4, "concurrency": 4, "markers": str(markers),
        "gates": str(gates), "held": [0], "hold_attempts": 2,
    }  # fmt: skip
    go = {"store": postgres_url, "scheduler": cluster.address, "run_id": "stale"}
    first, second = owner_process(tmp_path, "first"), owner_process(tmp_path, "second")
    old_epoch = owned(first, **go, mode="start", args=args)
    until_delivered(delivery_server, 3, first)  # items 1..3; item 0 waits in a worker
    wait_until(
        lambda: [(a.item, a.attempt) for a in in_flight(markers)] == [(0, 1)], "item 0", owner=first
    )
    assert first.kill()
    assert owned(second, **go, mode="resume") > old_epoch, "the new owner holds a newer epoch"
    wait_until(
        lambda: (0, 2) in {(a.item, a.attempt) for a in in_flight(markers)},
        "the new owner's attempt of item 0",
        owner=second,
    )

    # A task of the old epoch for the step the new owner runs now: refused before fn runs.
    stale = stale_task(pg, postgres_url, "stale", 0, old_epoch, dask_items.Deliver(
        delivery_server.url, "stale"))  # fmt: skip
    some_worker = sorted(worker_pids(client))[:1]  # run there at once, not queued as a task
    (answer,) = client.run(execute_item, stale, workers=some_worker).values()
    outcome = loads(answer)
    assert outcome.kind == "lost", outcome
    assert isinstance(error_from_wire(outcome.error), kx.OwnershipLost), outcome

    # The dead owner's attempt, held inside fn, calls only now: refused at its call.
    release(gates, 0, 1)
    wait_until(lambda: (0, 1) not in {(a.item, a.attempt) for a in in_flight(markers)}, "end")
    ended = {(a.item, a.attempt): a.outcome for a in attempts(markers)}
    assert ended[(0, 1)] == "OwnershipLost", "the stale owner's worker is refused at its call"
    delivery_server.settle()
    assert delivery_server.count(item_key("stale", 0)) == 0, "no stale worker delivered it"
    (step,) = [s for s in pg.steps("stale") if s["status"] == "running"]
    assert step["key"] == "item-0", "the new owner's step was not touched"

    release(gates, 0, 2)
    assert finished(second)["status"] == "completed"
    check_delivered_once(pg, "stale", delivery_server, 4)


# -- 5. DuckDB cannot be shared with other processes ------------------------------------------
@pytest.mark.parametrize("kind", ["process_pool", "dask_client"])
@pytest.mark.timeout(120)
def test_a_duckdb_store_with_an_out_of_process_executor_is_refused_before_dispatch(
    kind: str, cluster: ClusterHolder, delivery_server: DeliveryServer, tmp_path: Path
) -> None:
    markers = tmp_path / "markers.txt"
    store = kx.open_store(str(tmp_path / "store" / "kernelext.duckdb"))
    executor: Any = (
        concurrent.futures.ProcessPoolExecutor(2) if kind == "process_pool" else cluster.client()
    )
    dask_items.EXECUTOR["executor"] = executor
    try:
        handle = dask_items.deliveries.start(
            delivery_server.url, 5, 2, markers=str(markers), run_id="duck", store=store
        )
        assert handle.wait(WAIT) == "failed"
    finally:
        dask_items.EXECUTOR.clear()
        if kind == "process_pool":
            executor.shutdown()
        else:
            executor.close()
    assert isinstance(handle.error, kx.KernelextError), handle.error
    assert "PostgreSQL" in str(handle.error), str(handle.error)
    delivery_server.settle()
    assert delivery_server.deliveries == [], "no item was delivered"
    assert attempts(markers) == [], "no item ran anywhere"
    assert [s["key"] for s in store.steps("duck") if s["key"].startswith("item-")] == []
