"""``kx.anthropic`` and ``kx.tools``' Anthropic shapes: the real ``anthropic`` client against
the scripted local model server's ``/v1/messages`` (``support.llm_server``), which counts
the requests of every conversation turn.

An agent is stopped mid-conversation (a tool waits until the test asked for the stop,
which lands at the next model call) and resumed: completed turns, streamed or not, sync
or async, are replayed from the ledger as the SDK's own types, so the server sees each
turn once.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from anthropic import Anthropic, AsyncAnthropic
from anthropic.types import Message, ToolUseBlock
from support.clients import closed_after
from support.live import wait_until
from support.llm_server import LLMServer
from support.support_desk import Gate, stop_at_the_gate, support_tools

import kernelext as kx
from kernelext._adapters.anthropic import MESSAGES_TOOL
from kernelext._adapters.tools import Tools
from kernelext._core.encoding.secrets import SECRETS
from kernelext._core.views import conversation
from kernelext.status import EffectStatus, Status

MODEL = "scripted"
API_KEY = "sk-ant-test-" + "S3CR3T" * 6
ANSWER = "Order A-1001 was refunded (25.00 EUR) and the customer was told by email."


def client_for(llm: LLMServer, **options: Any) -> Any:
    plain = closed_after(Anthropic(base_url=llm.url, api_key=API_KEY, max_retries=0))
    return kx.anthropic(plain, **options)


def text_of(message: Any) -> str:
    return "".join(block.text for block in message.content if block.type == "text")


def test_streamed_calls_are_recorded_as_their_events_and_replayed(
    store: Any, llm: LLMServer
) -> None:
    gate, client = Gate(), client_for(llm)
    tools, streams = support_tools(gate), []

    @kx.agent(name="anthropic-stream")
    def agent(run: kx.Run, question: str) -> str:
        messages: list[Any] = [{"role": "user", "content": question}]
        for turn in range(10):
            ask = {"model": MODEL, "max_tokens": 512, "messages": messages}
            if turn % 2 == 0:  # the raw events, as create(stream=True) gives them
                events = list(
                    client.messages.create(**ask, tools=tools.for_anthropic(), stream=True)
                )
                streams.append(events)
                with client.messages.stream(**ask, tools=tools.for_anthropic()) as again:
                    assert [e.type for e in again] != []  # the SDK's own MessageStream
                reply = again.get_final_message()
            else:
                reply = client.messages.create(**ask, tools=tools.for_anthropic())
            messages.append({"role": "assistant", "content": reply.content})
            if reply.stop_reason != "tool_use":
                return text_of(reply)
            messages.append({"role": "user", "content": tools.call_all(reply)})
        raise AssertionError("no answer")

    stop_at_the_gate(agent.start("refund A-1001", run_id="stream"), gate)
    assert sum(llm.per_turn().values()) == 2  # turn 0, streamed twice (two calls)
    handle = kx.resume("stream")
    assert handle.wait(30) == Status.COMPLETED, repr(handle.error)
    assert handle.result == ANSWER
    asked = llm.per_turn("messages")
    assert [asked[t] for t in sorted(asked, key=lambda t: t[1])] == [2, 1, 2, 1]  # none again
    live, replayed = streams[0], streams[1]
    assert [e.to_dict() for e in live] == [e.to_dict() for e in replayed]
    assert [type(e) for e in live] == [type(e) for e in replayed]
    assert type(replayed[0]).__name__ == "RawMessageStartEvent"
    rows = kx.sql(
        "SELECT status, result FROM effects WHERE run_id = 'stream' AND tool = ? "
        "ORDER BY intent_at",
        [MESSAGES_TOOL],
    )
    assert list(rows["status"]) == [EffectStatus.APPLIED] * 6
    first = conversation._json(rows["result"][0])
    assert first["stream"] == [e.to_dict() for e in live]
    assert first["usage"]["input_tokens"] > 0 and first["usage"]["output_tokens"] > 1


def test_the_async_client_is_recorded_and_replayed(store: Any, llm: LLMServer) -> None:
    gate, seen = Gate(), []
    tools = support_tools(gate)

    async def converse(question: str) -> str:
        plain = AsyncAnthropic(base_url=llm.url, api_key=API_KEY)
        async with kx.anthropic(plain) as client:
            messages: list[Any] = [{"role": "user", "content": question}]
            for turn in range(10):
                ask = {"model": MODEL, "max_tokens": 512, "messages": messages}
                if turn % 2:
                    async with client.messages.stream(**ask, tools=tools.for_anthropic()) as s:
                        reply = await s.get_final_message()
                else:
                    reply = await client.messages.create(**ask, tools=tools.for_anthropic())
                seen.append(reply)
                messages.append({"role": "assistant", "content": reply.content})
                if reply.stop_reason != "tool_use":
                    return text_of(reply)
                messages.append({"role": "user", "content": tools.call_all(reply)})
        raise AssertionError("no answer")

    @kx.agent(name="anthropic-async")
    def agent(run: kx.Run, question: str) -> str:
        return asyncio.run(converse(question))

    stop_at_the_gate(agent.start("refund A-1001", run_id="async"), gate)
    handle = kx.resume("async")
    assert handle.wait(30) == Status.COMPLETED, repr(handle.error)
    assert handle.result == ANSWER
    assert list(llm.per_turn("messages").values()) == [1, 1, 1, 1]
    assert type(seen[1]) is Message and seen[0].to_dict() == seen[1].to_dict()  # replayed
    rows = kx.sql(
        "SELECT tool, status FROM effects WHERE run_id = 'async' AND tool = ?", [MESSAGES_TOOL]
    )
    assert list(rows["status"]) == [EffectStatus.APPLIED] * 4


def test_outside_a_run_it_is_the_plain_client(store: Any, llm: LLMServer) -> None:
    client = client_for(llm)
    ask = {"model": MODEL, "max_tokens": 64, "messages": [{"role": "user", "content": "x"}]}
    reply = client.messages.create(**ask)
    assert type(reply) is Message and reply.stop_reason == "tool_use"
    with client.with_options(timeout=20).messages.stream(**ask) as stream:
        streamed = stream.get_final_message()
    assert (streamed.id, streamed.content) == (reply.id, reply.content)
    assert client.api_key == API_KEY and isinstance(client.wrapped, Anthropic)
    assert llm.count() == 2 and llm.requests[0]["idempotency_key"] is None
    assert len(kx.sql("SELECT * FROM effects")) == 0


ASK = {"model": MODEL, "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}
SENDING: dict[str, Callable[[Any], Any]] = {
    "messages.count_tokens": lambda c: c.messages.count_tokens(model=MODEL, messages=[]),
    "messages.batches": lambda c: c.messages.batches.list(),
    "messages.with_raw_response": lambda c: c.messages.with_raw_response.create(**ASK),
    "beta": lambda c: c.beta.messages.create(**ASK),
    "models": lambda c: c.models.list(),
    "post": lambda c: c.post("/v1/messages", body=ASK, cast_to=object),
}


@pytest.mark.parametrize("surface", sorted(SENDING))
def test_a_request_that_would_go_unrecorded_is_refused_in_a_run(
    store: Any, llm: LLMServer, surface: str
) -> None:
    client, call = client_for(llm), SENDING[surface]

    @kx.agent(name="anthropic-unrecorded")
    def agent(run: kx.Run) -> Any:
        return call(client)

    handle = agent.start()
    assert handle.wait(30) == Status.FAILED
    assert "not recorded by kx.anthropic inside a run" in str(handle.error)
    assert "client.messages.create" in str(handle.error)  # the recorded way named
    assert "@kx.effect" in str(handle.error)  # and what to do instead
    assert llm.count() == 0 and len(kx.sql("SELECT * FROM effects")) == 0


def test_a_stream_with_an_output_format_says_what_to_pass_instead(
    store: Any, llm: LLMServer
) -> None:
    from pydantic import BaseModel

    class Order(BaseModel):
        order_id: str

    client = client_for(llm)

    @kx.agent(name="anthropic-format")
    def agent(run: kx.Run) -> Any:
        with client.messages.stream(**ASK, output_format=Order) as stream:
            return stream.get_final_text()

    handle = agent.start()
    assert handle.wait(30) == Status.FAILED
    assert "output_config={'format'" in str(handle.error)
    assert llm.count() == 0


def test_a_call_answered_500_waits_in_reconcile_on_resume(store: Any, llm: LLMServer) -> None:
    """The server may have processed it (and billed it): not asked again until a person
    decided it did not happen; then it is asked under the same key."""
    client = client_for(llm)

    @kx.agent(name="anthropic-500")
    def agent(run: kx.Run) -> str:
        return str(client.messages.create(**ASK).id)

    llm.fail_next(1, 500)
    handle = agent.start(run_id="a500")
    assert handle.wait(30) == Status.FAILED and "500" in str(handle.error)
    assert kx.resume("a500").wait(30) == Status.NEEDS_DECISION
    assert llm.count() == 1
    (unknown,) = kx.reconcile("a500")
    assert unknown.tool == MESSAGES_TOOL
    unknown.mark_not_applied()
    handle = kx.resume("a500")
    assert handle.wait(30) == Status.COMPLETED, repr(handle.error)
    assert handle.result.startswith("msg_") and llm.count(str(unknown.key)) == 2


def test_the_api_key_never_reaches_the_store(store: Any, store_path: Path, llm: LLMServer) -> None:
    client = client_for(llm)

    @kx.agent(name="anthropic-secrets")
    def agent(run: kx.Run) -> str:
        return str(client.messages.create(**ASK).id)

    try:
        assert agent.start(run_id="secrets").wait(30) == Status.COMPLETED
        assert API_KEY not in str(SECRETS.scrub(f"key={API_KEY}"))
        store.close()
        files = [p for p in store_path.parent.rglob("*") if p.is_file()]
        assert files and not [p for p in files if API_KEY.encode() in p.read_bytes()]
    finally:
        SECRETS.forget(API_KEY)


def test_bad_input_says_what_to_do(llm: LLMServer) -> None:
    from openai import OpenAI

    with pytest.raises(TypeError, match=r"kx.anthropic wraps an anthropic.Anthropic .* kx.openai"):
        kx.anthropic(closed_after(OpenAI(base_url=llm.base_url, api_key="EMPTY")))
    with pytest.raises(TypeError, match="not a dict"):
        kx.anthropic({"api_key": "x"})
    plain = closed_after(Anthropic(base_url=llm.url, api_key="EMPTY"))
    with pytest.raises(TypeError, match=r"kx.anthropic\(prices=...\).*dollars per million"):
        kx.anthropic(plain, prices={"claude": 3.0})
    with pytest.raises(TypeError, match="dict of model"):
        kx.anthropic(plain, prices=[3.0, 15.0])
    with pytest.raises((TypeError, ValueError), match=r"kx.anthropic\(limit=...\)"):
        kx.anthropic(plain, limit=42)
    assert "claude" not in conversation.PRICES


def test_a_missing_anthropic_says_what_to_install() -> None:
    code = (
        "import sys\n"
        "import kernelext, kernelext._adapters.anthropic\n"
        "assert 'anthropic' not in sys.modules, 'imported anthropic'\n"
        "sys.modules['anthropic'] = None\n"
        "try:\n"
        "    kernelext.anthropic(object())\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "pip install 'kernelext[anthropic]'" in out.stdout


def test_tools_take_anthropic_tool_use_blocks_and_give_tool_results() -> None:
    def refund(order_id: str, amount: float) -> dict[str, Any]:
        """Refund an order.

        Args:
            order_id: The order.
        """
        return {"refunded": amount}

    tools = Tools(refund)
    assert tools.for_anthropic() == [
        {
            "name": "refund",
            "description": "Refund an order.",
            "input_schema": {
                "type": "object",
                "properties": {
                    "order_id": {"type": "string", "description": "The order."},
                    "amount": {"type": "number"},
                },
                "required": ["order_id", "amount"],
            },
        }
    ]
    block = ToolUseBlock(
        id="tu_1", name="refund", input={"order_id": "A", "amount": 2}, type="tool_use"
    )
    assert tools.call(block) == {
        "type": "tool_result", "tool_use_id": "tu_1", "content": '{"refunded": 2.0}'
    }  # fmt: skip
    as_dict = {"type": "tool_use", "id": "tu_2", "name": "wire", "input": {}}
    assert tools.call(as_dict)["content"].startswith("Error: there is no tool named 'wire'")
    bad = {"type": "tool_use", "id": "tu_3", "name": "refund", "input": {"order_id": "A"}}
    assert "needs the argument 'amount'" in tools.call(bad)["content"]
    message = Message.model_validate(
        {"id": "msg_1", "type": "message", "role": "assistant", "model": MODEL,
         "stop_reason": "tool_use", "usage": {"input_tokens": 1, "output_tokens": 1},
         "content": [{"type": "text", "text": "Refunding."}, block.model_dump(),
                     {**as_dict, "id": "tu_4", "name": "refund",
                      "input": {"order_id": "B", "amount": 1}}]}
    )  # fmt: skip
    results = tools.call_all(message)
    assert [r["tool_use_id"] for r in results] == ["tu_1", "tu_4"]  # the text block is skipped
    assert tools.call_all(message.to_dict()) == results
    with pytest.raises(TypeError, match="Anthropic tool_use block"):
        tools.call({"type": "text", "text": "hi"})


def test_the_anthropic_clients_failures_tell_never_sent_from_no_answer(
    llm: LLMServer, closed_url: str
) -> None:
    """The retry rule reads the SDK's own exceptions (and its transport's, ``httpx2``)."""
    import anthropic
    import httpx2

    from kernelext._core.ledger.failures import NO_ANSWER, NOT_SENT, classify

    with pytest.raises(anthropic.APIConnectionError) as refused:
        closed_after(
            Anthropic(base_url=closed_url, api_key="EMPTY", max_retries=0)
        ).messages.create(**ASK)
    assert classify(refused.value).kind == NOT_SENT  # type: ignore[union-attr]
    llm.delay = 2.0
    slow = closed_after(Anthropic(base_url=llm.url, api_key="EMPTY", max_retries=0, timeout=0.3))
    with pytest.raises(anthropic.APITimeoutError) as timed_out:
        slow.messages.create(**ASK)
    assert classify(timed_out.value).kind == NO_ANSWER  # type: ignore[union-attr]
    request = httpx2.Request("POST", llm.url)
    for bare in (anthropic.APITimeoutError(request=request), httpx2.ReadTimeout("t")):
        assert classify(bare).kind == NO_ANSWER, bare  # type: ignore[union-attr]
    assert classify(httpx2.ConnectError("refused")).kind == NOT_SENT  # type: ignore[union-attr]


def test_a_model_call_timed_out_after_sending_is_sent_once_and_unknown(
    store: Any, llm: LLMServer
) -> None:
    client = kx.anthropic(closed_after(Anthropic(base_url=llm.url, api_key=API_KEY, timeout=0.5)))
    llm.delay = 2.0

    @kx.agent(name="anthropic-timeout")
    def agent(run: kx.Run) -> str:
        return str(client.messages.create(**ASK).id)

    handle = agent.start(run_id="timeout")
    assert handle.wait(30) == Status.NEEDS_DECISION, repr(handle.error)
    row = kx.sql("SELECT status, attempts FROM effects WHERE run_id = 'timeout'")
    assert (row["status"][0], int(row["attempts"][0])) == (EffectStatus.UNKNOWN, 1)
    # The server logs a request when its handler runs, which a busy machine may let happen
    # after the client gave up: wait for it, then for as long as its answer took, by when a
    # retry of the client's own would have arrived too.
    wait_until(lambda: llm.count() >= 1, "the request at the model server")
    time.sleep(llm.delay)
    assert llm.count() == 1  # the client's own two retries were not made


def test_a_model_call_never_sent_is_asked_again_and_counted(store: Any, closed_url: str) -> None:
    down = kx.anthropic(
        closed_after(Anthropic(base_url=closed_url, api_key=API_KEY, max_retries=2))
    )

    @kx.agent(name="anthropic-down")
    def agent(run: kx.Run) -> str:
        return str(down.messages.create(**ASK).id)

    assert agent.start(run_id="down").wait(30) == Status.FAILED
    row = kx.sql("SELECT status, attempts FROM effects WHERE run_id = 'down'")
    assert (row["status"][0], int(row["attempts"][0])) == (EffectStatus.FAILED, 3)
