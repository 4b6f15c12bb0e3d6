"""``kx.restart`` supersedes the run it restarts, keeps a call's idempotency key across
the restart chain, never touches payload files it did not create, and carries answers.

Deliveries are counted on the real local HTTP server (tests/support/http_server.py).
"""

from __future__ import annotations

import errno
import os
import threading
from typing import Any

import pytest
from support.clocks import TickingClock, store_on_clock  # noqa: F401  (the fixture `store`)
from support.http_server import DeliveryServer, post_json
from support.live import name as unique
from support.pool_calls import per_item

import kernelext as kx
from kernelext._core.ledger.effect import effect_key, idempotency_key_for
from kernelext._store import Store
from kernelext._store.restart_payloads import new_blob_id
from kernelext._store.runs import KEY_SCHEME

pytestmark = pytest.mark.both_backends

WAIT = 60.0


@pytest.fixture
def clock() -> TickingClock:
    return TickingClock(milliseconds=1)


def sender(url: str, fail_on: set[str] | None = None) -> kx.Agent:
    """Steps a, b, c, each sending its item; an item in ``fail_on`` raises after it."""
    fail_on = fail_on if fail_on is not None else set()

    @kx.effect
    def send(item: str, *, idempotency_key: str | None = None) -> Any:
        return post_json(url + "/send", {"item": item}, idempotency_key=idempotency_key).body

    @kx.agent(name=unique("sender"))
    def agent(run: kx.Run) -> Any:
        for item in run.steps(["a", "b", "c"], key=str):
            send(item)
            if item in fail_on:
                raise RuntimeError(f"the step {item} broke")
        return "done"

    return agent


def failed_once_at(item: str, server: DeliveryServer, *, run_id: str) -> None:
    """Run ``run_id`` of ``sender``, failed at the step of ``item`` (after its send); the
    step does not break again, so a restart goes on from there."""
    fail_on = {item}
    assert sender(server.url, fail_on).start(run_id=run_id).wait(WAIT) == "failed"
    fail_on.clear()


# -- B1: a restarted run is superseded -------------------------------------------------------
def test_a_failed_run_that_was_restarted_cannot_be_resumed(
    store: Store, delivery_server: DeliveryServer
) -> None:
    failed_once_at("c", delivery_server, run_id="broke")
    child = kx.restart("broke")
    assert child.wait(WAIT) == "completed"
    assert per_item(delivery_server) == {"a": 1, "b": 1, "c": 1}
    with pytest.raises(kx.RunStateError, match=r"restarted as 'broke-restart1'.*kx\.resume"):
        kx.resume("broke")
    with pytest.raises(kx.RunStateError, match=r"kx\.restart\('broke-restart1'\)"):
        kx.restart("broke")
    assert store.get_run("broke")["status"] == "failed"
    assert per_item(delivery_server) == {"a": 1, "b": 1, "c": 1}
    assert store.children("broke") == ["broke-restart1"]


def test_the_restart_transaction_lets_one_of_two_racing_restarts_win(
    store: Store, delivery_server: DeliveryServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    failed_once_at("b", delivery_server, run_id="raced")
    first = kx.restart("raced", new_run_id="x1")
    # The second restart read the run before the first committed: only its transaction
    # can tell (the core's early check sees no child).
    monkeypatch.setattr(store, "children", lambda run_id: [])
    with pytest.raises(kx.RunStateError, match=r"restarted as 'x1'"):
        kx.restart("raced", new_run_id="x2")
    monkeypatch.undo()
    assert store.find_run("x2") is None
    assert first.wait(WAIT) == "completed"
    assert per_item(delivery_server) == {"a": 1, "b": 1, "c": 1}


def test_two_threads_restarting_one_run_start_one_child(
    store: Store, delivery_server: DeliveryServer
) -> None:
    failed_once_at("b", delivery_server, run_id="twins")
    barrier = threading.Barrier(2)
    out: list[Any] = [None, None]

    def go(i: int) -> None:
        barrier.wait()
        try:
            out[i] = kx.restart("twins", new_run_id=f"twin{i}")
        except kx.RunStateError as exc:
            out[i] = exc

    threads = [threading.Thread(target=go, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    handles = [o for o in out if isinstance(o, kx.Handle)]
    assert len(handles) == 1, out
    assert handles[0].wait(WAIT) == "completed"
    assert per_item(delivery_server) == {"a": 1, "b": 1, "c": 1}
    assert len(store.children("twins")) == 1


# -- B2: the idempotency key stays the same across the restart chain ------------------------
def test_a_call_made_again_by_restarts_keeps_its_idempotency_key(store: Store) -> None:
    seen: list[str] = []
    with DeliveryServer(dedupe=True) as server:
        fail = {"on": True}

        @kx.effect
        def charge(item: str, *, idempotency_key: str | None = None) -> Any:
            assert idempotency_key is not None
            seen.append(idempotency_key)
            post_json(server.url + "/charge", {"item": item}, idempotency_key=idempotency_key)
            if fail["on"]:
                raise TimeoutError("read timed out")  # the server did process it
            return "charged"

        @kx.agent(name=unique("charger"))
        def charger(run: kx.Run) -> Any:
            with run.step("pay"):
                return charge("40")

        assert charger.start(run_id="root").wait(WAIT) == "failed"
        one = kx.restart("root")
        assert one.wait(WAIT) == "failed"  # still timing out: restarted again
        fail["on"] = False
        two = kx.restart(one.run_id)
        assert two.wait(WAIT) == "completed"
        server.settle()
        assert len(server.deliveries) == 1 and len(server.replays) == 2
    assert seen == [str(effect_key("root", "pay", "charge", 0))] * 3
    # Each run's ledger keeps its own key; only the key handed to the tool is the root's.
    assert effect_key(two.run_id, "pay", "charge", 0) in store.load_effects(two.run_id)
    run: Any = _RunLike(two.run_id, store)
    assert idempotency_key_for(run, "pay", "charge", 0) == seen[0]


class _RunLike:
    def __init__(self, run_id: str, store: Store) -> None:
        self.id, self.store = run_id, store
        self.key_scheme = KEY_SCHEME


# -- B4: a refused restart never touches another run's payload files ------------------------
def side_file_agent(url: str) -> kx.Agent:
    @kx.effect
    def send(item: str, *, idempotency_key: str | None = None) -> Any:
        return post_json(url + "/send", {"item": item}, idempotency_key=idempotency_key).body

    @kx.agent(name=unique("heavy"))
    def heavy(run: kx.Run) -> Any:
        for item in run.steps(["a", "b"], key=str):
            send(item)
            run.state[item] = os.urandom(100_000)  # a side file
        return "done"

    return heavy


def files_of(store: Store, run_id: str) -> dict[str, bytes]:
    folder = store.blob_dir(run_id)
    if not os.path.isdir(folder):
        return {}
    out = {}
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name), "rb") as f:
            out[name] = f.read()
    return out


@pytest.mark.parametrize("links", [True, False], ids=["links", "no-links"])
def test_a_refused_restart_leaves_other_files_alone(
    store: Store,
    delivery_server: DeliveryServer,
    monkeypatch: pytest.MonkeyPatch,
    links: bool,
) -> None:
    if store.backend.side_files is None:
        pytest.skip("this backend keeps every payload inline")
    agent = side_file_agent(delivery_server.url)
    assert agent.start(run_id="solo").wait(WAIT) == "completed"
    assert agent.start(run_id="taken").wait(WAIT) == "completed"
    before = files_of(store, "taken")
    assert before
    if not links:  # a filesystem without hard links: the copy fallback

        def no_link(src: Any, dst: Any) -> None:
            raise OSError(errno.EPERM, "Operation not permitted")

        monkeypatch.setattr(os, "link", no_link)
    with pytest.raises(kx.RunStateError, match="'taken' already exists"):
        kx.restart("solo", new_run_id="taken")
    assert files_of(store, "taken") == before
    # A file at a target name with other content (not this restart's) is neither
    # overwritten nor removed.
    [(blob,)] = store.read(
        "SELECT id FROM blobs WHERE run_id = ? ORDER BY size DESC LIMIT 1", ("solo",)
    )
    folder = store.blob_dir("fresh")
    os.makedirs(folder, exist_ok=True)
    stranger = os.path.join(folder, new_blob_id("fresh", blob).hex)
    with open(stranger, "wb") as f:
        f.write(b"someone else's bytes")
    with pytest.raises(kx.RunStateError, match="already exists with other content"):
        kx.restart("solo", new_run_id="fresh")
    with open(stranger, "rb") as f:
        assert f.read() == b"someone else's bytes"
    assert store.find_run("fresh") is None
    os.remove(stranger)
    monkeypatch.undo()
    assert kx.restart("solo", new_run_id="fresh", from_step=1).wait(WAIT) == "completed"
    assert per_item(delivery_server) == {"a": 2, "b": 2}


# -- H1: an answered question is carried -----------------------------------------------------
def test_an_answered_question_is_replayed_by_the_restart(
    store: Store, clock: TickingClock, delivery_server: DeliveryServer
) -> None:
    url = delivery_server.url

    @kx.effect
    def send(item: str, *, idempotency_key: str | None = None) -> Any:
        return post_json(url + "/send", {"item": item}, idempotency_key=idempotency_key).body

    @kx.effect(needs_approval=True)
    def pay(item: str, *, idempotency_key: str | None = None) -> Any:
        return post_json(url + "/pay", {"item": item}, idempotency_key=idempotency_key).body

    asked: list[str] = []

    @kx.agent(name=unique("asker"))
    def asker(run: kx.Run) -> Any:
        with run.step("only"):
            amount = run.ask("How much?", schema=int)
            asked.append("answered")
            send(f"amount {amount}")
            pay(f"pay {amount}")
        return amount

    assert asker.start(run_id="asked").wait(WAIT) == "suspended"
    handle = kx.answer("asked", 100)
    assert handle.wait(WAIT) == "suspended"  # now waiting for the approval
    clock.advance(days=8)
    assert "asked" in kx.sweep().expired_ids
    child = kx.restart("asked")
    assert child.wait(WAIT) == "suspended"
    assert store.get_run(child.run_id)["reason"] == "approval"  # not asked again
    assert list(kx.questions(child.run_id)) == []
    [request] = kx.approvals(child.run_id)
    resumed = request.approve()
    assert resumed.wait(WAIT) == "completed" and resumed.result == 100
    assert per_item(delivery_server) == {"amount 100": 1, "pay 100": 1}
