"""``kx.limit``: a rate never exceeded in any window, a concurrency bound, shared by every run
of the process, and a stop that lands while calls wait for their slot.

Against a real local HTTP server (127.0.0.1) that records when each request arrived and
how many it handled at once.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
import urllib.request
from typing import Any

import pytest
from support.clients import closed_after
from support.http_server import DeliveryServer
from support.ledger_checks import assert_refused_before_any_call
from support.live import name, wait_until

import kernelext as kx
from kernelext._core.ledger.limits import Limit, Slot
from kernelext._store import Store

WAIT = 60.0

pytestmark = pytest.mark.both_backends


def sender(server: DeliveryServer, limit: str, tool: str = "send") -> kx.Effect:
    """An effect under ``limit`` that POSTs ``{"item": i, "sent": <time it was sent>}``."""

    @kx.effect(name=tool, limit=limit)
    def send(item: Any, *, idempotency_key: str | None = None) -> int:
        body = json.dumps({"item": item, "sent": time.time()}).encode()
        headers = {"Content-Type": "application/json", "Idempotency-Key": idempotency_key or ""}
        request = urllib.request.Request(
            server.url + "/send", data=body, headers=headers, method="POST"
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            return int(json.loads(response.read())["delivery"])

    return send


def busiest_window(stamps: list[float], seconds: float) -> int:
    """The most sends stamped in any window ``[t, t + seconds)``. The stamps are the
    limit's own, taken as each call is sent: no pause between a stamp and the request (a
    thread waiting for the GIL) can move one into a window it was not sent in."""
    times = sorted(stamps)
    return max(sum(1 for u in times if t <= u < t + seconds) for t in times)


def test_a_rate_is_never_exceeded_in_any_one_second_window(
    store: Store, delivery_server: DeliveryServer, limit_stamps: list[float]
) -> None:
    limit = name("crm")
    kx.limit(limit, rate="10/s")
    send = sender(delivery_server, limit)

    mapped_at: list[float] = []

    @kx.agent(name=name("rated"))
    def rated(run: kx.Run, items: list[int]) -> list[int]:
        mapped_at.append(time.time())
        return run.map(send, items, concurrency=16)

    handle = rated.start(list(range(40)))
    assert handle.wait(WAIT) == "completed", handle.error
    assert delivery_server.count() == 40
    assert sorted(d["body"]["item"] for d in delivery_server.deliveries) == list(range(40))
    assert len(limit_stamps) == 40  # each call stamped once, as it was sent
    assert busiest_window(limit_stamps, 1.0) <= 10, sorted(limit_stamps)
    # The limit was what held the batch back: 16 at once would send 40 well within a second.
    # Calls 1, 11, 21 and 31 go out each a window apart, the first after the map began (a
    # time read before any slot was taken, so no delay of a call makes the span look short).
    sent = sorted(d["body"]["sent"] for d in delivery_server.deliveries)
    assert sent[-1] - mapped_at[0] >= 3.0, (mapped_at, sent)


def test_each_call_is_stamped_after_its_intent_is_durable_and_sent_right_after(
    store: Store, delivery_server: DeliveryServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rate window counts a call from its stamp, so nothing may come between the stamp
    and the request: no store write (which can wait for the store), nothing else of the
    call. And the intent is durable before the stamp, as before any call. Each thread's
    steps are recorded in order by wrapping the store's doors, ``Limit.stamp`` and the
    effect's body; the pattern is read per thread, so no clock is compared."""
    limit = name("ordered")
    kx.limit(limit, rate="50/s")
    steps: list[tuple[int, str]] = []

    def mark(what: str) -> None:
        steps.append((threading.get_ident(), what))

    record, write, stamp = Store.record, Store.write, Limit.stamp
    write_intent = Store.write_intent

    def recorded(self: Store, kind: str, data: dict[str, Any], *, sync: bool) -> int | None:
        mark(f"{kind} record")
        return record(self, kind, data, sync=sync)

    def intent_written(self: Store, row: dict[str, Any]) -> dict[str, Any] | None:
        existing = write_intent(self, row)
        mark("intent durable")  # it returns once the intent is durable, on either backend
        return existing

    def written(self: Store, job: Any) -> Any:
        mark("write")
        return write(self, job)

    def stamped(self: Limit, slot: Slot) -> None:
        stamp(self, slot)
        mark("stamp")

    monkeypatch.setattr(Store, "record", recorded)
    monkeypatch.setattr(Store, "write", written)
    monkeypatch.setattr(Store, "write_intent", intent_written)
    monkeypatch.setattr(Limit, "stamp", stamped)

    @kx.effect(name="ordered_send", limit=limit)
    def send(item: int) -> int:
        mark("request")
        body = json.dumps({"item": item}).encode()
        request = urllib.request.Request(delivery_server.url + "/send", data=body, method="POST")
        with urllib.request.urlopen(request, timeout=30) as response:
            return int(json.loads(response.read())["delivery"])

    @kx.agent(name=name("ordering"))
    def ordering(run: kx.Run, items: list[int]) -> list[int]:
        return run.map(send, items, concurrency=8)

    handle = ordering.start(list(range(24)))
    assert handle.wait(WAIT) == "completed", handle.error
    assert delivery_server.count() == 24
    by_thread: dict[int, list[str]] = {}
    for thread, what in list(steps):
        by_thread.setdefault(thread, []).append(what)
    calls = 0
    for seen in by_thread.values():
        for at, what in enumerate(seen):
            if what != "stamp":
                continue
            calls += 1
            assert seen[at + 1 : at + 2] == ["request"], seen  # sent right after its stamp
            assert "intent durable" in seen[:at], seen
            last_intent = max(i for i, w in enumerate(seen[:at]) if w == "intent durable")
            assert "request" not in seen[last_intent + 1 : at], seen  # this call's intent
    assert calls == 24  # every call stamped once, in the thread that sent it


def test_one_limit_is_shared_by_every_run_of_the_process(
    store: Store, delivery_server: DeliveryServer, limit_stamps: list[float]
) -> None:
    limit = name("shared")
    kx.limit(limit, rate="8/s")
    send = sender(delivery_server, limit)

    @kx.agent(name=name("sharing"))
    def sharing(run: kx.Run, items: list[str]) -> list[int]:
        return run.map(send, items, concurrency=16)

    one = sharing.start([f"a{i}" for i in range(16)])
    two = sharing.start([f"b{i}" for i in range(16)])
    assert one.wait(WAIT) == "completed", one.error
    assert two.wait(WAIT) == "completed", two.error
    assert delivery_server.count() == 32
    runs = {str(d["body"]["item"])[0] for d in delivery_server.deliveries}
    assert runs == {"a", "b"}
    assert len(limit_stamps) == 32
    # the two runs together, not 8 each
    assert busiest_window(limit_stamps, 1.0) <= 8, sorted(limit_stamps)


def test_concurrency_bounds_the_calls_in_flight_at_once(
    store: Store, delivery_server: DeliveryServer
) -> None:
    limit = name("narrow")
    kx.limit(limit, concurrency=3)
    delivery_server.delay = 0.3  # each request is answered 0.3 s after it arrived
    send = sender(delivery_server, limit)

    @kx.agent(name=name("narrow"))
    def narrow(run: kx.Run, items: list[int]) -> list[int]:
        return run.map(send, items, concurrency=16)

    handle = narrow.start(list(range(12)))
    assert handle.wait(WAIT) == "completed", handle.error
    assert delivery_server.count() == 12
    assert 1 < delivery_server.peak_in_flight <= 3


def test_a_stop_lands_at_once_on_calls_waiting_for_their_slot(
    store: Store, delivery_server: DeliveryServer
) -> None:
    limit = name("one")
    kx.limit(limit, concurrency=1)
    delivery_server.hold_next(1)  # the first call holds the only slot until let out
    send = sender(delivery_server, limit)

    @kx.agent(name=name("waiting"))
    def waiting(run: kx.Run, items: list[int]) -> list[int]:
        return run.map(send, items, concurrency=8)

    handle = waiting.start(list(range(8)))
    wait_until(lambda: delivery_server.count() == 1, "the first call in flight")
    handle.stop()
    # The slot was held until the stop had been asked for, however long the test took to
    # ask: every other call was still waiting for it when the stop landed.
    delivery_server.release_held()
    assert handle.wait(WAIT) == "suspended", handle.error
    assert delivery_server.count() == 1  # the waiting calls were not made
    effects = list(store.load_effects(handle.run_id).values())
    # The call in flight finished (the drain); those that waited recorded nothing.
    assert [e["status"] for e in effects] == ["applied"]
    steps = store.steps(handle.run_id)
    assert sum(s["status"] == "completed" for s in steps) == 1
    # Items handed out before the stop landed wait for the slot and are cancelled; how many
    # were handed out depends on scheduling, not on the promise: none of them ran.
    assert all(s["status"] in ("completed", "cancelled") for s in steps)

    again = kx.resume(handle.run_id)
    assert again.wait(WAIT) == "completed", again.error
    assert delivery_server.count() == 8
    assert sorted(d["body"]["item"] for d in delivery_server.deliveries) == list(range(8))
    statuses = [e["status"] for e in store.load_effects(handle.run_id).values()]
    assert statuses == ["applied"] * 8


def test_a_forced_stop_lands_on_calls_waiting_for_their_slot(
    store: Store, delivery_server: DeliveryServer
) -> None:
    limit = name("forced")
    kx.limit(limit, rate="1/min")  # one call, then every other waits a minute
    send = sender(delivery_server, limit)

    @kx.agent(name=name("forced"))
    def forced(run: kx.Run, items: list[int]) -> list[int]:
        return run.map(send, items, concurrency=4)

    handle = forced.start(list(range(4)))
    wait_until(
        lambda: any(s["status"] == "completed" for s in store.steps(handle.run_id)),
        "the one call the rate allows, completed",
    )  # the three others wait for their slot (a minute)
    handle.force_stop(cut_calls=True)
    assert handle.wait(WAIT) == "suspended", handle.error
    assert delivery_server.count() == 1
    effects = list(store.load_effects(handle.run_id).values())
    assert [e["status"] for e in effects] == ["applied"]  # nothing pending, nothing unknown


def test_a_slot_is_taken_only_for_calls_made_now_not_for_replays(
    store: Store, delivery_server: DeliveryServer
) -> None:
    limit = name("replay")
    kx.limit(limit, rate="2/min")
    send = sender(delivery_server, limit)
    gate = threading.Event()

    @kx.agent(name=name("replays"))
    def replays(run: kx.Run) -> list[int]:
        with run.step("both"):
            first = send("x")
            gate.wait(WAIT)
            run.checkpoint()
            second = send("y")
        return [first, second]

    handle = replays.start()
    wait_until(lambda: delivery_server.count() == 1, "the first call")
    handle.stop()
    gate.set()
    assert handle.wait(WAIT) == "suspended", handle.error
    # The resume replays "x" (no slot) and sends "y": the second slot of the minute.
    again = kx.resume(handle.run_id)
    assert again.wait(WAIT) == "completed", again.error
    assert again.result == [1, 2]
    assert delivery_server.count() == 2


def test_declaring_a_limit_again_changes_it_in_place(store: Store) -> None:
    limit = name("again")
    first = kx.limit(limit, rate="5/s")
    second = kx.limit(limit, rate="3000/min", concurrency=4)
    assert second is first
    assert first.rate == "3000/min" and first.concurrency == 4
    assert repr(first) == f"<kx.limit {limit!r}: 3000/min, at most 4 at once; 0 in flight>"


def test_an_unknown_limit_is_refused_at_the_call_before_anything_is_recorded(
    store: Store, delivery_server: DeliveryServer
) -> None:
    limit = name("declared")
    kx.limit(limit, rate="5/s")
    send = sender(delivery_server, limit[:-1] + "x")  # a typo, found when a call is made

    @kx.agent(name=name("typo"))
    def typo(run: kx.Run) -> int:
        return send(1)

    handle = typo.start()
    assert handle.wait(WAIT) == "failed"
    assert isinstance(handle.error, ValueError)
    assert f"Did you mean {limit!r}?" in str(handle.error)
    assert "nothing was recorded" in str(handle.error)
    assert delivery_server.count() == 0
    assert store.load_effects(handle.run_id) == {}


@pytest.mark.parametrize(
    ("kwargs", "error", "text"),
    [
        ({"rate": "fast"}, ValueError, "'fast' is not a rate"),
        ({"rate": "0/s"}, ValueError, "allows no call"),
        ({"rate": "5/fortnight"}, ValueError, "not a rate"),
        ({"rate": 50}, TypeError, "as text"),
        ({"concurrency": 0}, ValueError, "concurrency=0"),
        ({"concurrency": 2.5}, TypeError, "whole number"),
        ({"concurrency": True}, TypeError, "whole number"),
        ({}, ValueError, "limits nothing"),
    ],
)
def test_bad_limits_are_refused_before_anything_is_recorded(
    store: Store,
    delivery_server: DeliveryServer,
    kwargs: dict[str, Any],
    error: type,
    text: str,
) -> None:
    limit = name("bad")

    @kx.agent(name=name("refused"))
    def refused(run: kx.Run) -> int:
        kx.limit(limit, **kwargs)
        return sender(delivery_server, limit)(1)

    assert_refused_before_any_call(store, delivery_server, refused.start(), error, text)
    with pytest.raises(ValueError, match="no limit named"):
        sender(delivery_server, limit)(1)  # nothing was declared under that name


def test_a_bad_limit_name_is_refused_where_it_is_declared_or_used() -> None:
    with pytest.raises(kx.InvalidName):
        kx.limit("", rate="5/s")
    with pytest.raises(kx.NameNotText):
        kx.effect(limit=3)  # type: ignore[call-overload]
    with pytest.raises(kx.NameNotText):
        kx.openai(object(), limit=3)  # type: ignore[arg-type]


def test_model_calls_of_a_limited_client_wait_for_their_slot(store: Store) -> None:
    from openai import AsyncOpenAI, OpenAI
    from support.llm_server import LLMServer

    limit = name("llm")
    kx.limit(limit, concurrency=1)
    script = [{"content": "ok"}]
    with LLMServer(script=script, delay=0.3) as llm:
        plain = closed_after(OpenAI(base_url=llm.base_url, api_key="none", max_retries=0))
        client = kx.openai(plain, limit=limit)

        def ask(question: str) -> str:
            messages = [{"role": "user", "content": question}]
            reply = client.chat.completions.create(model="m", messages=messages)
            return str(reply.choices[0].message.content)

        async def ask_all(questions: list[str]) -> list[str]:
            aplain = AsyncOpenAI(base_url=llm.base_url, api_key="none", max_retries=0)
            async with kx.openai(aplain, limit=limit) as aclient:

                async def one(question: str) -> str:
                    messages = [{"role": "user", "content": question}]
                    reply = await aclient.chat.completions.create(model="m", messages=messages)
                    return str(reply.choices[0].message.content)

                return list(await asyncio.gather(*(one(q) for q in questions)))

        @kx.agent(name=name("models"))
        def models(run: kx.Run, questions: list[str]) -> list[str]:
            answers = run.map(ask, questions, key=str, concurrency=4)
            with run.step("async"):
                answers += asyncio.run(ask_all([f"async {q}" for q in questions]))
            return answers

        handle = models.start([f"q{i}" for i in range(4)])
        assert handle.wait(WAIT) == "completed", handle.error
        plain.close()
        assert handle.result == ["ok"] * 8
        arrivals = sorted(r["time"] for r in llm.requests)
    assert len(arrivals) == 8
    # One at a time: each request arrived after the previous one was answered (0.3 s on).
    assert all(b - a >= 0.3 for a, b in itertools.pairwise(arrivals))


@pytest.mark.duckdb_only
@pytest.mark.parametrize("options", [{"limit": "crm"}, {"retries": 2}])
def test_limit_and_retries_on_an_async_effect_are_refused_at_decoration(
    options: dict[str, Any],
) -> None:
    async def fetch(url: str) -> str:
        return url

    with pytest.raises(TypeError, match="plain functions for now"):
        kx.effect(**options)(fetch)
