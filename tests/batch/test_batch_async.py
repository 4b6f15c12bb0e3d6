"""Async, first class: ``async def`` agents, ``await run.amap(...)`` and ``async def`` effects.

Against a real local HTTP server that counts deliveries (127.0.0.1), reached with an
asyncio client (``support.async_http``): every item's POST is delivered once whatever
happens to the run; a forced stop cancels the items' tasks and their calls in flight
become ``unknown``.
"""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import pytest
from support.async_http import apost_json
from support.batch_checks import (
    WAIT,
    assert_approvals_listed_then_resumed,
    assert_drained_then_resumed,
    assert_exceptions_in_place,
    assert_failed_on_item,
    assert_in_order_each_once,
    assert_refused_before_any_item,
    delivered_items,
    resumed_to_completion,
)
from support.http_server import DeliveryServer
from support.live import name, wait_until

import kernelext as kx
from kernelext._store import Store
from kernelext.status import EffectStatus, Status, StepStatus

pytestmark = pytest.mark.both_backends


def async_poster(server: DeliveryServer, path: str = "/items") -> kx.Effect:
    @kx.effect(name="apost_item")
    async def apost_item(item: int, *, idempotency_key: str | None = None) -> int:
        response = await apost_json(server.url + path, {"item": item}, idempotency_key)
        assert response.status == 200, response
        return int(response.body["delivery"])

    return apost_item


def test_async_agent_amap_and_async_effect_deliver_each_item_once_in_order(
    store: Store, delivery_server: DeliveryServer
) -> None:
    post_item = async_poster(delivery_server)
    running, peak = 0, 0

    async def one(item: int) -> int:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.01 * (item % 3))  # finish out of order
        await post_item(item)
        running -= 1
        return item * 10

    @kx.agent(name=name("amap"))
    async def amap(run: kx.Run, items: list[int]) -> list[int]:
        results = await run.amap(one, items, key=lambda i: f"item-{i}", concurrency=6)
        run.state["n"] = len(results)
        return results

    handle = amap.start(list(range(30)))
    effects = assert_in_order_each_once(store, delivery_server, handle, 30)
    assert 1 < peak <= 6
    assert {(e["step_key"], e["call_ordinal"], e["status"]) for e in effects} == {
        (f"item-{i}", 0, EffectStatus.APPLIED) for i in range(30)
    }
    # The key the tool got is the ledger's, for every delivery.
    keys = {str(e["key"]) for e in effects}
    assert {d["idempotency_key"] for d in delivery_server.deliveries} == keys


def test_an_async_effect_records_its_intent_before_the_tool_first_awaits(
    store: Store, delivery_server: DeliveryServer
) -> None:
    seen: dict[str, Any] = {}

    @kx.effect(name="observed")
    async def observed(item: int, *, idempotency_key: str | None = None) -> int:
        # The tool has not awaited anything yet: its intent must be in the store already.
        rows = [r for r in store.load_effects(seen["run"]).values() if r["tool"] == "observed"]
        seen["before_await"] = [(r["status"], r["args"], str(r["key"])) for r in rows]
        seen["key"] = idempotency_key
        response = await apost_json(delivery_server.url + "/observed", {"item": item})
        return int(response.body["delivery"])

    @kx.agent(name=name("intent"))
    async def intent(run: kx.Run) -> int:
        seen["run"] = run.id
        with run.step("only"):
            value = await observed(7)
        return value

    handle = intent.start()
    assert handle.wait(WAIT) == "completed", handle.error
    (row,) = seen["before_await"]
    assert row[0] == EffectStatus.PENDING
    assert json.loads(row[1]) == {"item": 7}
    assert row[2] == seen["key"]  # the tool was handed that intent's key
    (after,) = store.load_effects(handle.run_id).values()
    assert after["status"] == EffectStatus.APPLIED
    assert delivery_server.count() == 1


def test_a_stop_mid_amap_drains_the_items_in_flight_and_a_resume_delivers_the_rest_once(
    store: Store, delivery_server: DeliveryServer
) -> None:
    post_item = async_poster(delivery_server)
    gate = threading.Event()
    started: list[int] = []

    async def one(item: int) -> int:
        started.append(item)
        while not gate.is_set():  # held until the test has asked for the stop
            await asyncio.sleep(0.01)
        await post_item(item)
        return item

    @kx.agent(name=name("adrain"))
    async def adrain(run: kx.Run, items: list[int]) -> list[int]:
        return await run.amap(one, items, concurrency=10)

    handle = adrain.start(list(range(40)))
    wait_until(lambda: len(started) == 10, "10 items in flight")
    handle.stop()
    wait_until(lambda: handle.run.stop_requested, "the stop flag")
    assert_drained_then_resumed(store, delivery_server, handle, started, gate)


def test_an_item_that_raises_fails_the_run_naming_its_key_and_a_resume_runs_only_it(
    store: Store, delivery_server: DeliveryServer
) -> None:
    post_item = async_poster(delivery_server)
    broken = {"value": True}
    calls: list[int] = []

    async def one(item: int) -> int:
        calls.append(item)
        await post_item(item)
        if item == 7 and broken["value"]:
            raise RuntimeError("row 7 is malformed")
        return item

    @kx.agent(name=name("araises"))
    async def araises(run: kx.Run, items: list[int]) -> list[int]:
        return await run.amap(one, items, key=lambda i: f"row-{i}", concurrency=1)

    handle = araises.start(list(range(10)))
    error = assert_failed_on_item(store, handle, "row-7")
    assert "run.amap: item 'row-7' raised RuntimeError" in str(error)
    assert delivery_server.count() == 8  # one at a time: nothing started after row 7

    broken["value"] = False
    calls.clear()
    resumed_to_completion(handle, list(range(10)))
    assert calls == [7, 8, 9]
    assert delivery_server.count() == 10  # row 7's POST was replayed, not sent again
    assert delivered_items(delivery_server) == list(range(10))


def test_return_exceptions_puts_the_exception_in_the_items_place(store: Store) -> None:
    async def one(item: int) -> int:
        await asyncio.sleep(0)
        if item % 4 == 0:
            raise ValueError(f"bad {item}")
        return item

    @kx.agent(name=name("aexceptions"))
    async def aexceptions(run: kx.Run, items: list[int]) -> list[Any]:
        return await run.amap(one, items, concurrency=3, return_exceptions=True)

    assert_exceptions_in_place(aexceptions.start(list(range(9))))


@pytest.mark.parametrize("delivery_server", [{"delay": 30.0}], indirect=True)
def test_a_force_stop_cancels_the_items_in_flight_their_calls_become_unknown(
    store: Store, delivery_server: DeliveryServer
) -> None:
    post_item = async_poster(delivery_server)
    started: list[int] = []

    async def one(item: int) -> int:
        started.append(item)
        return await post_item(item)  # the server delivers, then holds its answer

    @kx.agent(name=name("aforce"))
    async def aforce(run: kx.Run, items: list[int]) -> list[int]:
        return await run.amap(one, items, concurrency=4)

    handle = aforce.start(list(range(12)))
    delivery_server.wait_for(4, timeout=WAIT)
    handle.force_stop()
    assert handle.wait(WAIT) == "suspended", handle.error
    assert sorted(started) == [0, 1, 2, 3]  # no item started after the stop
    effects = store.load_effects(handle.run_id)
    assert sorted((e["step_key"], e["status"]) for e in effects.values()) == [
        (str(i), EffectStatus.UNKNOWN) for i in range(4)
    ]
    steps = store.steps(handle.run_id)
    assert sorted((s["key"], s["status"]) for s in steps) == [
        (str(i), StepStatus.CANCELLED) for i in range(4)
    ]
    kinds = [e["kind"] for e in store.events(handle.run_id)]
    assert kinds.count("effect_unknown") == 4
    assert kinds[-1] == "stop_forced"

    # Decided against the server's log (each was delivered), then the rest runs once.
    delivery_server.delay = 0.0
    for unknown in kx.reconcile(handle.run_id):
        (delivery,) = [
            d for d in delivery_server.deliveries if d["idempotency_key"] == str(unknown.key)
        ]
        unknown.mark_applied(result=delivery["seq"], note="the server has it")
    again = kx.resume(handle.run_id)
    assert again.wait(WAIT) == "completed", again.error
    assert delivery_server.count() == 12
    assert delivered_items(delivery_server) == list(range(12))
    assert again.result == [
        {d["body"]["item"]: d["seq"] for d in delivery_server.deliveries}[i] for i in range(12)
    ]


@pytest.mark.parametrize("delivery_server", [{"delay": 30.0}], indirect=True)
def test_a_force_stop_of_an_async_agent_outside_a_batch_cancels_its_awaited_call(
    store: Store, delivery_server: DeliveryServer
) -> None:
    post_item = async_poster(delivery_server)

    @kx.agent(name=name("aforce1"))
    async def aforce1(run: kx.Run) -> None:
        for i in run.steps(range(3)):
            await post_item(i)

    handle = aforce1.start()
    delivery_server.wait_for(1, timeout=WAIT)
    handle.force_stop()
    assert handle.wait(WAIT) == "suspended", handle.error
    (effect,) = store.load_effects(handle.run_id).values()
    assert effect["status"] == EffectStatus.UNKNOWN
    (step,) = store.steps(handle.run_id)
    assert step["status"] == StepStatus.CANCELLED
    assert [e["kind"] for e in store.events(handle.run_id)][-1] == "stop_forced"


@pytest.mark.parametrize(
    ("kwargs", "error", "text"),
    [
        ({"concurrency": 0}, ValueError, "run.amap(concurrency=0)"),
        ({"concurrency": 2.5}, TypeError, "run.amap(concurrency=...)"),
        ({"key": lambda i: i % 3}, ValueError, "same key"),
        ({"fn": "not a function"}, TypeError, "run.amap(fn=...)"),
        ({"key": "id"}, TypeError, "run.amap(key=...)"),
        ({"return_exceptions": 1}, TypeError, "return_exceptions"),
    ],
)
def test_bad_arguments_are_refused_before_any_delivery(
    store: Store, delivery_server: DeliveryServer, kwargs: dict[str, Any], error: type, text: str
) -> None:
    post_item = async_poster(delivery_server)
    arguments: dict[str, Any] = {"fn": post_item, **kwargs}

    @kx.agent(name=name("arefused"))
    async def arefused(run: kx.Run, items: list[int]) -> list[int]:
        fn = arguments.pop("fn")
        return await run.amap(fn, items, **arguments)

    handle = arefused.start(list(range(6)))
    assert_refused_before_any_item(store, delivery_server, handle, error, text)


def test_amap_from_a_plain_agent_and_map_with_an_async_fn_are_refused_saying_which_to_use(
    store: Store, delivery_server: DeliveryServer
) -> None:
    post_item = async_poster(delivery_server)

    async def one(item: int) -> int:
        return await post_item(item)

    @kx.agent(name=name("plain"))
    def plain(run: kx.Run, items: list[int]) -> Any:
        return run.amap(one, items)

    @kx.agent(name=name("mixed"))
    async def mixed(run: kx.Run, items: list[int]) -> Any:
        return run.map(one, items)

    @kx.agent(name=name("mixed-lambda"))
    def mixed_lambda(run: kx.Run, items: list[int]) -> Any:
        return run.map(lambda i: one(i), items, concurrency=1)

    @kx.agent(name=name("plain-fn"))
    async def plain_fn(run: kx.Run, items: list[int]) -> Any:
        return await run.amap(lambda i: i, items, concurrency=1)

    @kx.agent(name=name("ownloop"))
    def ownloop(run: kx.Run, items: list[int]) -> Any:
        async def main() -> Any:
            return await run.amap(one, items)

        return asyncio.run(main())

    handle = plain.start([1, 2])
    assert handle.wait(WAIT) == "failed"
    assert isinstance(handle.error, kx.KernelextError)
    assert "is a plain def: call run.map(fn, items) instead" in str(handle.error)
    handle = mixed.start([1, 2])
    assert handle.wait(WAIT) == "failed"
    assert isinstance(handle.error, TypeError)
    assert "await run.amap(fn, items)" in str(handle.error)
    handle = ownloop.start([1, 2])
    assert handle.wait(WAIT) == "failed"
    assert "is a plain def" in str(handle.error)
    handle = mixed_lambda.start([1, 2])
    assert handle.wait(WAIT) == "failed"
    assert isinstance(handle.error, kx.ItemFailed)
    assert "nothing awaits: in an async def agent, await run.amap" in str(handle.error)
    handle = plain_fn.start([1, 2])
    assert handle.wait(WAIT) == "failed"
    assert isinstance(handle.error, kx.ItemFailed)
    assert "type int for item '0', not a coroutine to await" in str(handle.error)
    assert delivery_server.count() == 0


def test_run_state_is_read_only_inside_an_amap_item(store: Store) -> None:
    @kx.agent(name=name("astate"))
    async def astate(run: kx.Run, items: list[int]) -> Any:
        run.state["seen"] = "before"

        async def one(item: int) -> str:
            assert run.state["seen"] == "before"  # reading is fine
            run.state["item"] = item
            return "unreachable"

        return await run.amap(one, items)

    handle = astate.start([1, 2])
    assert handle.wait(WAIT) == "failed"
    assert isinstance(handle.error, kx.ItemFailed)
    assert isinstance(handle.error.__cause__, kx.StateNotWritable)


def test_approvals_inside_amap_suspend_the_run_once_with_every_request_listed(
    store: Store, delivery_server: DeliveryServer
) -> None:
    @kx.effect(name="apay", needs_approval=lambda item, **kw: item % 2 == 0)
    async def apay(item: int, *, idempotency_key: str | None = None) -> int:
        response = await apost_json(delivery_server.url + "/pay", {"item": item})
        return int(response.body["delivery"])

    async def one(item: int) -> int:
        await apay(item)
        return item

    @kx.agent(name=name("aapprove"))
    async def aapprove(run: kx.Run, items: list[int]) -> list[int]:
        return await run.amap(one, items, key=str, concurrency=4)

    handle = aapprove.start(list(range(12)))
    assert_approvals_listed_then_resumed(store, delivery_server, handle)


def test_an_async_agent_never_runs_on_the_loop_of_the_code_that_started_it(
    store: Store,
) -> None:
    """Started from a running event loop (a kernel's): that loop goes on while the agent
    awaits; the agent waits for a signal only a task on the caller's loop gives."""
    signal = threading.Event()
    loops: dict[str, Any] = {}

    @kx.agent(name=name("ownloop"))
    async def own(run: kx.Run) -> str:
        loops["agent"] = asyncio.get_running_loop()
        while not signal.is_set():
            await asyncio.sleep(0.01)
        return "done"

    async def caller() -> str:
        loops["caller"] = asyncio.get_running_loop()
        handle = own.start()
        await asyncio.sleep(0.05)
        signal.set()  # this line runs only while the caller's loop is free
        while handle.alive:
            await asyncio.sleep(0.01)
        return str(handle.status)

    assert asyncio.run(caller()) == Status.COMPLETED
    assert loops["agent"] is not loops["caller"]
    assert loops["agent"].is_closed()


def test_async_openai_calls_inside_amap_items_are_recorded_and_replayed(
    store: Store, tmp_path: Path
) -> None:
    from openai import AsyncOpenAI
    from support.llm_server import LLMServer

    from kernelext._adapters.openai import CHAT_TOOL

    broken = {"value": True}
    asked: list[str] = []

    async def one(client: Any, ticket: str) -> str:
        asked.append(ticket)
        reply = await client.chat.completions.create(
            model="scripted", messages=[{"role": "user", "content": f"ticket {ticket}"}]
        )
        if ticket == "t3" and broken["value"]:
            # The first failure stops new items from starting: it fails once every item has
            # started, so that each one's call is recorded whatever order they ran in.
            while len(asked) < 6:
                await asyncio.sleep(0.01)
            raise RuntimeError("the triage rules are broken")
        return str(reply.choices[0].message.tool_calls[0].function.name)

    @kx.agent(name=name("aopenai"))
    async def triage(run: kx.Run, base_url: str, tickets: list[str]) -> list[str]:
        raw = AsyncOpenAI(base_url=base_url, api_key="sk-local", max_retries=0)
        async with kx.openai(raw) as client:
            return await run.amap(lambda t: one(client, t), tickets, key=str, concurrency=3)

    with LLMServer(log_path=tmp_path / "llm.jsonl") as llm:
        tickets = [f"t{i}" for i in range(6)]
        handle = triage.start(llm.base_url, tickets)
        assert handle.wait(WAIT) == "failed"
        assert isinstance(handle.error, kx.ItemFailed) and handle.error.key == "t3"
        assert llm.count() == 6
        rows = store.load_effects(handle.run_id).values()
        assert sorted((r["step_key"], r["tool"], r["status"]) for r in rows) == [
            (t, CHAT_TOOL, EffectStatus.APPLIED) for t in tickets
        ]
        # Each request carried its ledger key.
        assert {r["idempotency_key"] for r in llm.requests} == {str(r["key"]) for r in rows}

        broken["value"] = False
        asked.clear()
        again = kx.resume(handle.run_id)
        assert again.wait(WAIT) == "completed", again.error
        assert asked == ["t3"]  # only the item that failed ran again...
        assert llm.count() == 6  # ...and its model call was replayed, not asked again
        assert again.result == ["lookup_order"] * 6


@pytest.mark.duckdb_only
def test_mcp_tool_calls_inside_amap_items_are_recorded_and_replayed(
    store: Store, delivery_server: DeliveryServer, tmp_path: Path
) -> None:
    import sys

    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client
    from support.mcp_server import SCRIPT, SERVER_NAME

    from kernelext._adapters.mcp import result_json

    broken = {"value": True}
    ran: list[str] = []

    async def one(session: Any, channel: str) -> int:
        ran.append(channel)
        result = await session.call_tool("deliver", {"channel": channel, "text": "hello"})
        if channel == "c3" and broken["value"]:
            raise RuntimeError("channel c3 is misconfigured")
        return int(result_json(result)["structuredContent"]["delivery"])

    @kx.agent(name=name("amcp"))
    async def notify(run: kx.Run, channels: list[str]) -> list[int]:
        params = StdioServerParameters(
            command=sys.executable,
            args=[str(SCRIPT)],
            env={"KERNELEXT_MCP_DELIVERY_URL": delivery_server.url},
        )
        with open(tmp_path / "mcp_server.log", "a") as log:
            async with (
                stdio_client(params, errlog=log) as (read, write),
                kx.mcp(ClientSession(read, write)) as session,
            ):
                await session.initialize()
                return await run.amap(lambda c: one(session, c), channels, key=str, concurrency=3)

    channels = [f"c{i}" for i in range(6)]
    handle = notify.start(channels)
    assert handle.wait(WAIT) == "failed", handle.error
    assert isinstance(handle.error, kx.ItemFailed) and handle.error.key == "c3"
    assert delivery_server.count() == 6
    rows = store.load_effects(handle.run_id).values()
    assert sorted((r["step_key"], r["tool"], r["status"]) for r in rows) == [
        (c, f"mcp:{SERVER_NAME}/deliver", EffectStatus.APPLIED) for c in channels
    ]

    broken["value"] = False
    ran.clear()
    again = kx.resume(handle.run_id)
    assert again.wait(WAIT) == "completed", again.error
    assert ran == ["c3"]
    assert delivery_server.count() == 6  # c3's tool call was replayed, not made again
    by_channel = {d["body"]["channel"]: d["seq"] for d in delivery_server.deliveries}
    assert again.result == [by_channel[c] for c in channels]


def test_a_stop_raised_inside_a_task_group_suspends_the_run(
    store: Store, delivery_server: DeliveryServer
) -> None:
    """A stop that reaches the agent through a task group (anyio's, asyncio.TaskGroup,
    ``async with stdio_client(...)``) comes out wrapped in an exception group: the run
    still suspends, and a resume goes on from the steps completed."""
    import anyio

    post_item = async_poster(delivery_server)
    reached = threading.Event()

    @kx.agent(name=name("agroup"))
    async def agroup(run: kx.Run) -> int:
        async with anyio.create_task_group() as group:
            group.start_soon(anyio.sleep, 0.01)
            for i in run.steps(range(4), key=lambda i: f"s{i}"):
                await post_item(i)
                if i == 1:
                    reached.set()
                    while not run.stop_requested:
                        await anyio.sleep(0.01)
        return delivery_server.count()

    handle = agroup.start()
    assert reached.wait(WAIT)
    handle.stop()
    assert handle.wait(WAIT) == "suspended", handle.error
    assert delivery_server.count() == 2
    again = kx.resume(handle.run_id)
    assert again.wait(WAIT) == "completed", again.error
    assert delivered_items(delivery_server) == [0, 1, 2, 3]


def test_an_async_effect_is_an_amap_function_itself(
    store: Store, delivery_server: DeliveryServer
) -> None:
    post_item = async_poster(delivery_server)

    @kx.agent(name=name("adirect"))
    async def adirect(run: kx.Run, items: list[int]) -> list[int]:
        return await run.amap(post_item, items, concurrency=4)

    handle = adirect.start(list(range(8)))
    assert handle.wait(WAIT) == "completed", handle.error
    by_item = {d["body"]["item"]: d["seq"] for d in delivery_server.deliveries}
    assert handle.result == [by_item[i] for i in range(8)]
    assert delivery_server.count() == 8


@pytest.mark.parametrize("delivery_server", [{"delay": 30.0}], indirect=True)
def test_an_item_that_swallows_the_cancellation_meets_the_forced_stop_again(
    store: Store, delivery_server: DeliveryServer
) -> None:
    """A forced stop's ``CancelledError`` caught by the item's code (a bare except): the
    item's next kernelext call raises the forced stop again, so nothing more is sent."""
    post_item = async_poster(delivery_server)
    swallowed: list[int] = []

    async def one(item: int) -> int:
        try:
            await post_item(item)
        except BaseException:  # what the test is about: a bare except
            swallowed.append(item)
        return await post_item(item + 100)  # never sent: the forced stop again

    @kx.agent(name=name("aswallow"))
    async def aswallow(run: kx.Run, items: list[int]) -> list[int]:
        return await run.amap(one, items, concurrency=2)

    handle = aswallow.start(list(range(6)))
    delivery_server.wait_for(2, timeout=WAIT)
    handle.force_stop()
    assert handle.wait(WAIT) == "suspended", handle.error
    assert sorted(swallowed) == [0, 1]
    assert delivered_items(delivery_server) == [0, 1]
    effects = store.load_effects(handle.run_id).values()
    assert sorted((e["step_key"], e["status"]) for e in effects) == [
        ("0", EffectStatus.UNKNOWN),
        ("1", EffectStatus.UNKNOWN),
    ]
    assert [e["kind"] for e in store.events(handle.run_id)][-1] == "stop_forced"
