"""``run.map`` under attack: each test is a way its promises were broken, kept broken-proof.

Against a real store and a real local HTTP server (127.0.0.1) counting deliveries: a stop
that lands while the dispatcher hands out items, a map inside a step, a forced stop and
an item past ``max_step_seconds``, items that swallow a stop, functions run.map cannot
run, a key kernelext keeps for itself, and ``run.state`` written through a nested value.

No timing assertions: the tests wait for gates, events and statuses (generous bounds).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from support.batch_checks import poster
from support.http_server import DeliveryServer, post_json
from support.live import name, stall_after_each_force, wait_until

import kernelext as kx
import kernelext._core.batch.tasks as tasks_module
import kernelext._core.batch.threads as batch_module
from kernelext._core.engine.step_info import ITEM
from kernelext._store import Store

WAIT = 60.0

pytestmark = pytest.mark.both_backends


def kinds(store: Store, run_id: str) -> list[str]:
    return [str(e["kind"]) for e in store.events(run_id)]


def spin_until(event: threading.Event) -> None:
    """Pure Python, no kernelext call: only the event (or a forced stop) ends it."""
    while not event.is_set():
        time.sleep(0.005)


@pytest.mark.xfail(
    strict=False,
    reason="narrowed, not closed: a stop after an item's last check still lets it run",
)
def test_a_stop_starts_no_item_the_dispatcher_had_not_handed_out(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 20 asks for the stop while other items end and the dispatcher hands out the
    next ones (as a Stop click does). An item handed out after ``h.stop()`` returned must
    not run (the dispatcher decided to start it before it saw the stop)."""
    lock = threading.Lock()
    seen: dict[str, Any] = {"handle": None, "stopped": False, "late": set(), "ran": []}
    hand_out = batch_module.new_item

    def noting(engine: Any, batch: Any, key: str, index: int) -> Any:
        with lock:
            if seen["stopped"]:
                seen["late"].add(index)
        return hand_out(engine, batch, key, index)

    monkeypatch.setattr(batch_module, "new_item", noting)

    def one(i: int) -> int:
        with lock:
            if i in seen["late"]:
                seen["ran"].append(i)
        if i == 20:
            with lock:
                seen["handle"].stop(source="test")
                seen["stopped"] = True
        time.sleep(0.001 * (i % 3))
        return i

    @kx.agent(name=name("stop-race"))
    def race(run: kx.Run, n: int) -> list[int]:
        return run.map(one, range(n), concurrency=4)

    late = 0
    for _ in range(200):  # the race is narrow: tries until it was hit a few times
        if late >= 3:
            break
        seen.update(stopped=False, late=set(), ran=[])
        handle = seen["handle"] = race.start(200)
        assert handle.wait(WAIT) == "suspended", handle.error
        assert not seen["ran"], f"items handed out after the stop ran: {seen['ran']}"
        late += bool(seen["late"])
        completed = {s["key"] for s in store.steps(handle.run_id) if s["status"] == "completed"}
        assert "20" in completed and len(completed) < 30
    assert late > 0, "no stop landed while the dispatcher handed items out: nothing was tried"


@pytest.mark.parametrize("where", ["with run.step", "run.steps loop"])
def test_run_map_inside_a_step_is_refused_before_any_item(
    store: Store, delivery_server: DeliveryServer, where: str
) -> None:
    """A map inside a step used to complete the step first: a stop mid-map, and the
    resume skipped the step, so the items not done never ran (and the run completed)."""
    post_item = poster(delivery_server)

    @kx.agent(name=name("map-in-step"))
    def nested(run: kx.Run, items: list[int]) -> Any:
        if where == "with run.step":
            with run.step("outer"):
                run.state["values"] = run.map(post_item, items)
        else:
            for chunk in run.steps([items], key=lambda c: "chunk"):
                run.state["values"] = run.map(post_item, chunk)
        return run.state["values"]

    handle = nested.start(list(range(4)))
    assert handle.wait(WAIT) == "failed"
    assert isinstance(handle.error, kx.KernelextError)
    text = str(handle.error)
    assert "run.map cannot be called inside step" in text and "Nothing ran" in text
    assert delivery_server.count() == 0
    assert {s["key"] for s in store.steps(handle.run_id)} == {
        "outer" if "with" in where else "chunk"
    }


def test_a_forced_stop_is_recorded_as_one_and_each_cut_call_waits_for_a_decision(
    store: Store, delivery_server: DeliveryServer
) -> None:
    release = threading.Event()
    inside: set[int] = set()

    @kx.effect(name="slow_post")
    def slow_post(item: int, *, idempotency_key: str | None = None) -> int:
        if item >= 4:
            inside.add(item)
            spin_until(release)  # after the intent, before the POST
        body = post_json(
            delivery_server.url + "/i", {"item": item}, idempotency_key=idempotency_key
        )
        return int(body.body["delivery"])

    @kx.agent(name=name("force-batch"))
    def forced(run: kx.Run, n: int) -> list[int]:
        return run.map(slow_post, range(n), key=lambda i: f"i{i}", concurrency=4)

    handle = forced.start(8)
    wait_until(lambda: len(inside) == 4, "items 4..7 inside their call")
    handle.force_stop()
    assert handle.wait(WAIT) == "suspended", handle.error
    effects = {e["step_key"]: e["status"] for e in store.load_effects(handle.run_id).values()}
    assert effects == {
        **{f"i{i}": "applied" for i in range(4)},
        **{f"i{i}": "unknown" for i in range(4, 8)},
    }
    steps = {s["key"]: (s["status"], bool(s["forced"])) for s in store.steps(handle.run_id)}
    assert steps == {
        **{f"i{i}": ("completed", False) for i in range(4)},
        **{f"i{i}": ("cancelled", True) for i in range(4, 8)},
    }
    events = kinds(store, handle.run_id)
    assert events.count("force_raised") == 4, events  # one per item cut
    assert events[-1] == "stop_forced", events  # not a plain "suspended"
    release.set()
    assert kx.resume(handle.run_id).thread is None  # the unknown calls wait for a person
    for unknown in kx.reconcile(handle.run_id):
        unknown.mark_not_applied(note="the server never received it")
    again = kx.resume(handle.run_id)
    assert again.wait(WAIT) == "completed", again.error
    assert delivery_server.count() == 8
    assert sorted(d["body"]["item"] for d in delivery_server.deliveries) == list(range(8))


def steps_of(store: Store, run_id: str) -> dict[str, tuple[str, bool]]:
    """Each step's (status, forced), by key."""
    return {s["key"]: (s["status"], bool(s["forced"])) for s in store.steps(run_id)}


def counted_calls(monkeypatch: pytest.MonkeyPatch, module: Any, function: str) -> list[None]:
    """One entry per call of ``module.function`` (the dispatcher's step each tick), which
    still runs as it is; a function the module does not have is counted all the same."""
    calls: list[None] = []
    real = getattr(module, function, None)

    def counted(*args: Any) -> Any:
        try:
            return real(*args) if real is not None else None
        finally:
            calls.append(None)

    monkeypatch.setattr(module, function, counted, raising=False)
    return calls


def aged() -> None:
    """The item calling this passes its bound at once: its step began, as the monitor reads
    it, 10 min ago. An item that does not keeps its real start, so no duration of the test
    decides which item is past its bound."""
    item = ITEM.get()
    assert item is not None
    item.started -= 600.0


def stop_with_items_past_their_bound(
    store: Store,
    handle: kx.Handle,
    entered: list[int],
    ticks: list[None],
    second: threading.Event,
    drained: threading.Event,
) -> None:
    """Items 0 and 1 passed their bound (item 1 waits on ``second``), item 2 within it waits
    on ``drained``: once both are reported, item 2 starts, the stop comes, and item 2 is
    held until item 0 was forced and the dispatcher took that in (three ticks later it has,
    and acted on it); item 0 was forced for its own overrun, so item 2 is left to finish."""
    reported = lambda: kinds(store, handle.run_id).count("step_overran") >= 2  # noqa: E731
    wait_until(reported, "items 0 and 1 reported")
    second.set()
    wait_until(lambda: 2 in entered, "item 2 in flight")
    handle.stop()
    forced = lambda: steps_of(store, handle.run_id).get("0") == ("cancelled", True)  # noqa: E731
    wait_until(forced, "item 0 forced")
    seen = len(ticks)
    wait_until(lambda: len(ticks) >= seen + 3, "three more looks of the dispatcher")
    drained.set()
    assert handle.wait(WAIT) == "suspended", handle.error


def test_max_step_seconds_bounds_each_item(
    store: Store, delivery_server: DeliveryServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An item past max_step_seconds is reported; after a stop it is forced while the
    others drain, so a stop never waits for a hung item (and the hung item's forced end
    cuts no other item)."""
    post_item = poster(delivery_server)
    looks = counted_calls(monkeypatch, batch_module, "look")
    never = threading.Event()  # set only at the end: the hung item never ends by itself
    second, drained = threading.Event(), threading.Event()
    entered: list[int] = []

    def one(i: int) -> int:
        entered.append(i)
        if i in (0, 1):
            aged()
        if i == 0:
            spin_until(never)
        if i == 1:
            second.wait(WAIT)  # item 2 begins once item 0 overran
        if i == 2:
            drained.wait(WAIT)  # in flight at the stop, well within its bound
        return post_item(i)

    @kx.agent(name=name("overrun"), max_step_seconds=60.0)
    def overrun(run: kx.Run, n: int) -> list[int]:
        return run.map(one, range(n), concurrency=2)

    handle = overrun.start(4)
    try:
        stop_with_items_past_their_bound(store, handle, entered, looks, second, drained)
    finally:
        never.set()
    assert sorted(entered) == [0, 1, 2]
    steps = steps_of(store, handle.run_id)
    assert steps == {"0": ("cancelled", True), "1": ("completed", False), "2": ("completed", False)}
    events = kinds(store, handle.run_id)
    overran = [e for e in store.events(handle.run_id) if e["kind"] == "step_overran"]
    # Items 0 and 1 (which waited for item 0 to overrun) were reported, each once.
    assert sorted(str(e["reason"]).split(" passed")[0] for e in overran) == ["step 1", "step 2"]
    assert events.count("force_raised") == 1 and events[-1] == "stop_forced", events
    assert delivery_server.count() == 2  # items 1 and 2; item 0 was cut before its call
    again = kx.resume(handle.run_id)
    assert again.wait(WAIT) == "completed", again.error
    assert delivery_server.count() == 4


def test_max_step_seconds_bounds_each_item_of_run_amap_too(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``run.amap``'s items have the same bound: after a stop an item task past it is
    cancelled as forced, and the others drain (a soft stop never waits for a hung task)."""
    never, second, drained = threading.Event(), threading.Event(), threading.Event()
    entered: list[int] = []
    # the async dispatcher's looks at the items in flight, one a tick
    ticks = counted_calls(monkeypatch, tasks_module, "police_overruns")

    async def until(event: threading.Event) -> None:
        while not event.is_set():
            await asyncio.sleep(0.01)

    async def one(i: int) -> int:
        entered.append(i)
        if i in (0, 1):
            aged()
        await until({0: never, 1: second, 2: drained}.get(i, drained))
        return i

    @kx.agent(name=name("overrun-async"), max_step_seconds=60.0)
    async def overrun(run: kx.Run, n: int) -> list[int]:
        return await run.amap(one, range(n), concurrency=2)

    handle = overrun.start(4)
    try:
        stop_with_items_past_their_bound(store, handle, entered, ticks, second, drained)
    finally:
        never.set()
        second.set()
        drained.set()
    assert sorted(entered) == [0, 1, 2]
    steps = steps_of(store, handle.run_id)
    assert steps == {"0": ("cancelled", True), "1": ("completed", False), "2": ("completed", False)}
    assert kinds(store, handle.run_id)[-1] == "stop_forced"
    again = kx.resume(handle.run_id)
    assert again.wait(WAIT) == "completed", again.error
    assert again.result == [0, 1, 2, 3]


@pytest.mark.xfail(
    strict=True,
    reason="open: a stop swallowed in an item is raised again, not recorded",
)
def test_an_item_that_swallows_the_stop_meets_it_again_and_the_swallow_is_recorded(
    store: Store, delivery_server: DeliveryServer
) -> None:
    post_item = poster(delivery_server)
    go = threading.Event()
    caught: list[str] = []

    @kx.agent(name=name("swallow"))
    def swallow(run: kx.Run, n: int) -> list[int]:
        def one(i: int) -> int:
            if i == 0:
                go.wait(WAIT)
                try:
                    run.checkpoint()
                except BaseException as exc:  # the agent's bare except
                    caught.append(type(exc).__name__)
                return post_item(i)  # raised again here: nothing is sent
            return i

        return run.map(one, range(n), concurrency=2)

    handle = swallow.start(2)
    wait_until(lambda: any(s["key"] == "1" for s in store.steps(handle.run_id)), "item 1 ran")
    handle.stop()
    go.set()
    assert handle.wait(WAIT) == "suspended", handle.error
    assert caught == ["StopRequested"]
    assert delivery_server.count() == 0
    assert kinds(store, handle.run_id).count("stop_swallowed") == 1


@pytest.mark.xfail(
    strict=True,
    reason="open: a forced stop swallowed in an item is raised again, not recorded",
)
def test_an_item_that_swallows_a_forced_stop_meets_it_again_and_the_swallow_is_recorded(
    store: Store, delivery_server: DeliveryServer
) -> None:
    post_item = poster(delivery_server)
    spinning = threading.Event()
    never = threading.Event()
    caught: list[str] = []

    def one(i: int) -> int:
        if i == 0:
            try:
                spinning.set()
                spin_until(never)
            except BaseException as exc:  # the agent's bare except
                caught.append(type(exc).__name__)
            return post_item(i)  # raised again here: nothing is sent
        return i

    @kx.agent(name=name("swallow-force"))
    def swallow(run: kx.Run, n: int) -> list[int]:
        return run.map(one, range(n), concurrency=2)

    handle = swallow.start(2)
    spinning.wait(WAIT)
    try:
        handle.force_stop()
        assert handle.wait(WAIT) == "suspended", handle.error
    finally:
        never.set()
    assert caught == ["ForcedStop"]
    assert delivery_server.count() == 0
    steps = {s["key"]: s["status"] for s in store.steps(handle.run_id)}
    assert steps["0"] == "cancelled"
    events = kinds(store, handle.run_id)
    assert events.count("force_swallowed") == 1 and events[-1] == "stop_forced", events


async def fetch_async(item: int) -> int:
    await asyncio.sleep(0)
    return item


def numbers(item: int) -> Iterator[int]:
    yield item


@pytest.mark.parametrize(
    ("fn", "text"),
    [(fetch_async, "got the async def"), (numbers, "is a generator function")],
)
def test_functions_run_map_cannot_run_are_refused_before_any_item(
    store: Store, fn: Any, text: str
) -> None:
    @kx.agent(name=name("unrunnable"))
    def unrunnable(run: kx.Run, n: int) -> list[Any]:
        return run.map(fn, range(n))

    handle = unrunnable.start(3)
    assert handle.wait(WAIT) == "failed"
    assert isinstance(handle.error, TypeError), handle.error
    assert text in str(handle.error) and "Nothing ran" in str(handle.error)
    assert store.steps(handle.run_id) == []


@pytest.mark.parametrize("how", ["run.map", "run.step"])
def test_the_key_of_calls_outside_any_step_is_refused_as_a_step_key(
    store: Store, delivery_server: DeliveryServer, how: str
) -> None:
    """A step keyed "__run__" had its calls keyed like those made outside any step: its
    first call was replayed from the outside call's row and never made."""
    post_item = poster(delivery_server)

    @kx.agent(name=name("outside-key"))
    def outside(run: kx.Run) -> Any:
        post_item(1)  # outside any step
        if how == "run.map":
            return run.map(lambda _: post_item(1), ["__run__"], key=str)
        with run.step("__run__"):
            return post_item(1)

    handle = outside.start()
    assert handle.wait(WAIT) == "failed"
    assert "the key kernelext gives effects called outside any step" in str(handle.error)
    assert delivery_server.count() == 1  # the outside call only
    assert store.steps(handle.run_id) == []


@pytest.mark.xfail(
    strict=True,
    reason="ItemState refuses writes to run.state itself, but hands out the agent's own "
    "nested values: run.state['seen'].append(...) in an item writes the run's state in "
    "completion order (a deep read-only view is not a small change)",
)
def test_an_item_cannot_write_run_state_through_a_nested_value(store: Store) -> None:
    @kx.agent(name=name("nested-state"))
    def nested(run: kx.Run, n: int) -> Any:
        with run.step("init"):
            run.state["seen"] = []

        def one(i: int) -> int:
            run.state["seen"].append(i)
            return i

        return run.map(one, range(n), concurrency=4)

    handle = nested.start(4)
    assert handle.wait(WAIT) == "failed"
    assert isinstance(handle.error, kx.ItemFailed)
    assert isinstance(handle.error.__cause__, kx.StateNotWritable)


def test_an_item_s_force_is_shown_before_the_suspension_however_late_it_is_recorded(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An item past ``max_step_seconds`` when a stop comes is forced by the batch, which
    records ``force_raised`` after the raise; held up there, it must still come before the
    run's ``stop_forced`` in the events."""
    stall_after_each_force(monkeypatch)  # the run ends meanwhile
    entered = threading.Event()

    def spin(i: int) -> int:
        entered.set()
        for _ in range(6000):  # no safe point for ~60 s
            time.sleep(0.01)
        return i

    @kx.agent(name=name("held-up-items"), max_step_seconds=0.3)
    def held_up(run: kx.Run) -> list[int]:
        return run.map(spin, range(1), concurrency=1)

    handle = held_up.start()
    assert entered.wait(WAIT)
    handle.stop()  # the item is past its bound: the batch forces that item
    assert handle.wait(WAIT) == "suspended", handle.error
    wait_until(lambda: "force_raised" in kinds(store, handle.run_id), "the force_raised event")
    events = kinds(store, handle.run_id)
    assert events.index("force_raised") < events.index("stop_forced"), events
