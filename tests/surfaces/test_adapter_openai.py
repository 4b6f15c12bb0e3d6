"""``kx.openai`` and ``kx.tools``: the real ``openai`` client against a scripted local server.

The model is ``support.llm_server.LLMServer`` on 127.0.0.1 (chat completions and
responses, tool calls, streaming), which counts the requests of every conversation turn.
An agent is stopped mid-conversation (a tool waits until the test asked for the stop,
which lands at the next model call) and resumed: completed turns are replayed from the
ledger, so the server sees each turn once. The crash test SIGKILLs a tool-calling agent
in a worker process 50 times and resumes it each time.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import random
import subprocess
import sys
import threading
import time
from collections import Counter, deque
from enum import Enum
from pathlib import Path
from typing import Any, Literal, Optional

import pytest
from crash import CRASH_DIR, Worker, WorkerPool, attempt_run, kill_landed
from crash.llm_agent_worker import (
    CRASH_SCRIPT,
    DELIVERIES,
    MODEL_CALLS,
    converse,
    message_from_chunks,
)
from openai import AsyncOpenAI, OpenAI
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response
from support.clients import closed_after
from support.http_server import DeliveryServer
from support.llm_server import LLMServer
from support.support_desk import Gate, chat_with_tools, stop_at_the_gate, support_tools

import kernelext as kx
from kernelext._adapters.openai import CHAT_TOOL, RESPONSES_TOOL, wrap_openai
from kernelext._adapters.tools import Tools
from kernelext._core.encoding.secrets import SECRETS
from kernelext._store import open_store
from kernelext.status import EffectStatus, Status

MODEL = "scripted"
API_KEY = "sk-test-" + "S3CR3T" * 6
HEADER_SECRET = "hdr-" + "H1DD3N" * 5
CALL_SECRET = "call-" + "PR1V4T3" * 4
PLACED = datetime.date(2024, 5, 1)  # not JSON: a plain tool's result still records


def client_for(server: LLMServer, **options: Any) -> Any:
    plain = OpenAI(base_url=server.base_url, api_key=API_KEY, max_retries=0, **options)
    return wrap_openai(closed_after(plain))


def model_rows(run_id: str) -> Any:
    return kx.sql(
        "SELECT tool, status, args, result FROM effects WHERE run_id = ? AND tool LIKE 'openai:%' "
        "ORDER BY intent_at",
        [run_id],
    )


def test_a_stopped_conversation_resumes_without_asking_completed_turns_again(
    store: Any, llm: LLMServer
) -> None:
    gate, client = Gate(placed=PLACED), client_for(llm)
    tools = support_tools(gate, keyed_refund=True)
    seen: list[Any] = []

    @kx.agent(name="openai-chat")
    def support(run: kx.Run, question: str) -> str:
        return chat_with_tools(client, MODEL, tools, question, seen)

    stop_at_the_gate(support.start("refund A-1001", run_id="chat"), gate)
    assert sum(llm.per_turn().values()) == 1  # the stop landed at the second model call
    handle = kx.resume("chat")
    assert handle.wait(30) == Status.COMPLETED, repr(handle.error)
    assert handle.result.startswith("Order A-1001 was refunded")
    assert list(llm.per_turn().values()) == [1, 1, 1, 1]  # each turn asked once
    assert all(type(r) is ChatCompletion for r in seen)
    assert seen[0].to_dict() == seen[1].to_dict()  # turn 1 live, then replayed
    rows = model_rows("chat")
    assert list(rows["status"]) == [EffectStatus.APPLIED] * 4
    keys = kx.sql("SELECT key FROM effects WHERE tool = ? ORDER BY intent_at", [CHAT_TOOL])
    assert [r["idempotency_key"] for r in llm.requests] == [str(k) for k in keys["key"]]


def test_streaming_passes_chunks_live_and_replays_them(store: Any, llm: LLMServer) -> None:
    gate, client = Gate(placed=PLACED), client_for(llm)
    tools, streams = support_tools(gate, keyed_refund=True), []
    llm.hold_stream = threading.Event()

    @kx.agent(name="openai-stream")
    def streamer(run: kx.Run, question: str) -> str:
        messages: list[Any] = [{"role": "user", "content": question}]
        while True:
            stream = client.chat.completions.create(
                model=MODEL, messages=messages, tools=tools, stream=True,
                stream_options={"include_usage": True},
            )  # fmt: skip
            chunks = []
            for chunk in stream:
                llm.hold_stream.set()  # the server holds the rest until we saw this chunk
                chunks.append(chunk)
            streams.append(chunks)
            message = message_from_chunks(chunks)
            messages.append(message)
            if not message.get("tool_calls"):
                return str(message["content"])
            messages += tools.call_all(message["tool_calls"])

    stop_at_the_gate(streamer.start("refund A-1001", run_id="stream"), gate)
    assert llm.held == [True]  # the first chunk reached the agent while the stream was open
    handle = kx.resume("stream")
    assert handle.wait(30) == Status.COMPLETED, handle.error
    assert list(llm.per_turn().values()) == [1, 1, 1, 1]
    assert [c.to_dict() for c in streams[0]] == [c.to_dict() for c in streams[1]]
    assert all(type(c) is ChatCompletionChunk for c in streams[1])
    stored = json.loads(model_rows("stream")["result"][0])
    assert stored["stream"] == [c.to_dict() for c in streams[0]]
    assert stored["usage"] == streams[0][-1].usage.to_dict()


def test_responses_api_and_the_async_client_are_recorded_and_replayed(
    store: Any, llm: LLMServer
) -> None:
    gate = Gate(placed=PLACED)
    tools = support_tools(gate, keyed_refund=True)
    seen: list[Any] = []

    async def ask(question: str) -> str:
        async with wrap_openai(AsyncOpenAI(base_url=llm.base_url, api_key=API_KEY)) as client:
            return await converse_async(client, question)

    async def converse_async(client: Any, question: str) -> str:
        previous, items = None, [{"role": "user", "content": question}]
        for turn in range(10):
            if turn % 2:  # streamed: the final response comes in the last event
                events = []
                async for event in await client.responses.create(
                    model=MODEL, input=items, tools=tools.for_responses(), stream=True,
                    previous_response_id=previous,
                ):  # fmt: skip
                    events.append(event)
                response = events[-1].response
            else:
                response = await client.responses.create(
                    model=MODEL, input=items, tools=tools.for_responses(),
                    previous_response_id=previous,
                )  # fmt: skip
            seen.append(response)
            calls = [item for item in response.output if item.type == "function_call"]
            if not calls:
                return str(response.output_text)
            previous, items = response.id, tools.call_all(response)
        raise AssertionError("no answer")

    @kx.agent(name="openai-responses")
    def agent(run: kx.Run, question: str) -> str:
        return asyncio.run(ask(question))

    stop_at_the_gate(agent.start("refund A-1001", run_id="responses"), gate)
    handle = kx.resume("responses")
    assert handle.wait(30) == Status.COMPLETED, handle.error
    assert handle.result.startswith("Order A-1001 was refunded")
    assert list(llm.per_turn("responses").values()) == [1, 1, 1, 1]
    assert all(isinstance(r, Response) for r in seen)
    assert seen[0].to_dict() == seen[1].to_dict()
    rows = model_rows("responses")
    assert set(kx.sql("SELECT tool FROM effects WHERE tool LIKE 'openai:%'")["tool"]) == {
        RESPONSES_TOOL
    }
    assert list(rows["status"]) == [EffectStatus.APPLIED] * 4


def test_outside_a_run_it_is_the_plain_client(store: Any, llm: LLMServer) -> None:
    client = client_for(llm)
    reply = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])
    assert type(reply) is ChatCompletion and reply.choices[0].message.tool_calls
    chunks = list(
        client.with_options(timeout=20).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "x"}], stream=True
        )
    )
    assert type(chunks[0]) is ChatCompletionChunk
    assert [m.id for m in client.models.list()] == ["scripted"]  # passes through
    assert client.api_key == API_KEY and isinstance(client.wrapped, OpenAI)
    assert llm.count() == 2 and llm.requests[0]["idempotency_key"] is None
    assert len(kx.sql("SELECT * FROM effects")) == 0


def test_a_model_call_answered_500_waits_for_a_person_on_resume(store: Any, llm: LLMServer) -> None:
    """The server may have processed it (and billed it): a resume does not ask it again
    until a person decided it did not happen (kx.reconcile)."""
    client = client_for(llm)
    tools = support_tools(Gate(open=True, placed=PLACED), keyed_refund=True)

    @kx.agent(name="openai-retry")
    def agent(run: kx.Run, question: str) -> str:
        return converse(client, tools, question, stream_every=0)

    llm.fail_next(1, 500)
    handle = agent.start("refund A-1001", run_id="retry")
    assert handle.wait(30) == Status.FAILED and "500" in str(handle.error)
    assert model_rows("retry")["status"][0] == EffectStatus.FAILED
    handle = kx.resume("retry")
    assert handle.wait(30) == Status.NEEDS_DECISION, handle.error
    assert llm.count() == 1
    (unknown,) = kx.reconcile("retry")
    unknown.mark_not_applied()
    handle = kx.resume("retry")
    assert handle.wait(30) == Status.COMPLETED, handle.error
    assert list(llm.per_turn().values()) == [1, 1, 1, 1] and llm.count() == 5


def test_a_model_call_timed_out_after_sending_is_sent_once_and_unknown(
    store: Any, llm: LLMServer
) -> None:
    # The client's own retries (max_retries=2 by default) are the ledger's: counted, and
    # never made for a request that left.
    client = wrap_openai(closed_after(OpenAI(base_url=llm.base_url, api_key=API_KEY, timeout=0.5)))
    llm.delay = 2.0

    @kx.agent(name="openai-timeout")
    def agent(run: kx.Run) -> str:
        reply = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "refund A-1001"}]
        )
        return str(reply.choices[0].message.content)

    handle = agent.start(run_id="timeout")
    assert handle.wait(30) == Status.NEEDS_DECISION, handle.error
    time.sleep(1.0)  # an SDK retry would have been sent by now
    assert llm.count() == 1
    row = kx.sql("SELECT status, attempts, error FROM effects WHERE run_id = 'timeout'")
    assert (row["status"][0], int(row["attempts"][0])) == (EffectStatus.UNKNOWN, 1)
    assert "no answer came" in row["error"][0]


def test_a_model_call_never_sent_is_asked_again_and_counted(
    store: Any, llm: LLMServer, closed_url: str
) -> None:
    down = wrap_openai(
        closed_after(OpenAI(base_url=closed_url + "/v1", api_key=API_KEY, max_retries=2))
    )

    @kx.agent(name="openai-down")
    def agent(run: kx.Run) -> str:
        return str(down.chat.completions.create(model=MODEL, messages=[]).id)

    handle = agent.start(run_id="down")
    assert handle.wait(30) == Status.FAILED
    row = kx.sql("SELECT status, attempts FROM effects WHERE run_id = 'down'")
    assert (row["status"][0], int(row["attempts"][0])) == (EffectStatus.FAILED, 3)


class Speed(Enum):
    SLOW, FAST = "slow", "fast"


def test_a_call_cut_short_waits_for_a_decision_then_the_model_is_asked_again(
    store: Any, llm: LLMServer
) -> None:
    patience = {"seconds": 0.2}
    llm.delay = 1.0

    async def ask() -> str:
        async with wrap_openai(AsyncOpenAI(base_url=llm.base_url, api_key=API_KEY)) as client:
            call = client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hello"}]
            )
            reply = await asyncio.wait_for(call, patience["seconds"])  # cancelled mid-call
            return str(reply.choices[0].message.tool_calls[0].function.name)

    @kx.agent(name="openai-cut")
    def agent(run: kx.Run) -> str:
        return asyncio.run(ask())

    assert agent.start(run_id="cut").wait(30) == Status.FAILED
    handle = kx.resume("cut")
    assert handle.wait(30) == Status.NEEDS_DECISION and handle.thread is None
    (unknown,) = kx.reconcile("cut")
    assert unknown.tool == CHAT_TOOL
    unknown.mark_applied()  # "it happened", but nobody knows what the model answered
    patience["seconds"], llm.delay = 30, 0.0
    handle = kx.resume("cut")
    assert handle.wait(30) == Status.COMPLETED, handle.error
    assert handle.result == "lookup_order"
    assert llm.count(str(unknown.key)) == 2  # asked again under the same key
    row = json.loads(model_rows("cut")["result"][0])
    assert row["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "lookup_order"


def test_tool_schemas_come_from_signatures_hints_and_docstrings() -> None:
    def ship(
        parcel: int,
        weight: float,
        fragile: bool,
        tags: list[str],
        meta: dict[str, int],
        note: Optional[str] = None,  # noqa: UP045 - the typing spelling must work too
        carrier: Literal["dhl", "ups"] = "dhl",
        speed: Speed = Speed.SLOW,
        *,
        idempotency_key: str | None = None,
    ) -> None:
        """Ship one parcel.

        Args:
            parcel: Its number.
            weight: In kg,
                rounded up.
        """

    def cancel(order_id: str) -> None:
        """Cancel an order.

        :param order_id: The order to cancel.
        """

    tools = Tools(ship, cancel)
    ship_schema = tools[0]["function"]
    assert ship_schema["name"] == "ship" and ship_schema["description"] == "Ship one parcel."
    props = ship_schema["parameters"]["properties"]
    assert props == {
        "parcel": {"type": "integer", "description": "Its number."},
        "weight": {"type": "number", "description": "In kg, rounded up."},
        "fragile": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "meta": {"type": "object", "additionalProperties": {"type": "integer"}},
        "note": {"type": ["string", "null"]},
        "carrier": {"type": "string", "enum": ["dhl", "ups"]},
        "speed": {"type": "string", "enum": ["slow", "fast"]},
    }
    assert ship_schema["parameters"]["required"] == ["parcel", "weight", "fragile", "tags", "meta"]
    assert tools[1]["function"]["parameters"]["properties"]["order_id"]["description"] == (
        "The order to cancel."
    )
    assert tools.for_responses()[1] == {"type": "function", **tools[1]["function"]}


def test_bad_tool_calls_come_back_as_error_messages() -> None:
    from openai.types.chat import ChatCompletionMessageFunctionToolCall
    from openai.types.responses import ResponseFunctionToolCall

    def refund(order_id: str, amount: float) -> dict[str, Any]:
        return {"refunded": amount}

    tools = Tools(refund)

    def content(name: str, arguments: str) -> str:
        call = {"id": "c1", "type": "function", "function": {"name": name, "arguments": arguments}}
        message = tools.call(call)
        assert message["role"] == "tool" and message["tool_call_id"] == "c1"
        return str(message["content"])

    assert content("refund", '{"order_id": "A", "amount": 2}') == '{"refunded": 2.0}'
    assert content("wire", "{}").startswith("Error: there is no tool named 'wire'")
    assert "not valid JSON" in content("refund", "{order")
    assert "needs the argument 'amount'" in content("refund", '{"order_id": "A"}')
    assert "no argument 'iban'" in content("refund", '{"order_id": "A", "amount": 1, "iban": 1}')
    assert "'amount' must be number" in content("refund", '{"order_id": "A", "amount": "lots"}')
    assert "must be a JSON object" in content("refund", "[1]")
    typed = ChatCompletionMessageFunctionToolCall.model_validate(
        {"id": "c2", "type": "function", "function": {"name": "refund", "arguments": "{}"}}
    )
    assert tools.call(typed)["content"].startswith("Error: refund needs the argument")
    item = ResponseFunctionToolCall.model_validate(
        {"type": "function_call", "call_id": "c3", "name": "refund",
         "arguments": '{"order_id": "A", "amount": 1.5}'}
    )  # fmt: skip
    assert tools.call(item) == {
        "type": "function_call_output",
        "call_id": "c3",
        "output": '{"refunded": 1.5}',
    }


def test_secrets_and_usage(store: Any, store_path: Path, llm: LLMServer) -> None:
    """The client's key and headers never reach the store; usage can be summed per run."""
    client = client_for(llm, default_headers={"X-Api-Key": HEADER_SECRET, "X-Team": "blue"})
    tools = support_tools(Gate(open=True, placed=PLACED), keyed_refund=True)

    @kx.agent(name="openai-secrets")
    def agent(run: kx.Run, question: str) -> str:
        extra = {"Authorization": f"Bearer {CALL_SECRET}"}
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], extra_headers=extra
        )
        return converse(client, tools, question)

    try:
        assert agent.start("refund A-1001", run_id="secrets").wait(30) == Status.COMPLETED
        assert all(r["authorized"] for r in llm.requests)  # the client still sent its key
        stored = kx.sql("SELECT args, result, error FROM effects").to_json()
        stored += kx.sql("SELECT reason, detail FROM events").to_json()
        assert "blue" not in stored and "X-Team" not in stored  # no header is stored at all
        usage = kx.sql(USAGE_SQL)
        assert usage["calls"].tolist() == [5] and usage["total_tokens"][0] > 0
        store.close()
        files = [p for p in store_path.parent.rglob("*") if p.is_file()]
        for secret in (API_KEY, HEADER_SECRET, CALL_SECRET):
            assert secret not in stored
            assert not [p for p in files if secret.encode() in p.read_bytes()]
    finally:
        for secret in (API_KEY, HEADER_SECRET):
            SECRETS.forget(secret)


USAGE_SQL = """
SELECT run_id, count(*) AS calls,
       sum(coalesce(result->>'$.usage.prompt_tokens', result->>'$.usage.input_tokens')::BIGINT)
           AS input_tokens,
       sum(coalesce(result->>'$.usage.completion_tokens',
                    result->>'$.usage.output_tokens')::BIGINT) AS output_tokens,
       sum((result->>'$.usage.total_tokens')::BIGINT) AS total_tokens
FROM effects WHERE tool LIKE 'openai:%' AND status = 'applied' GROUP BY run_id
"""


def test_core_does_not_import_openai_and_a_missing_openai_says_what_to_install() -> None:
    code = (
        "import sys\n"
        "import kernelext, kernelext._adapters.openai, kernelext._adapters.tools\n"
        "assert 'openai' not in sys.modules, 'imported openai'\n"
        "sys.modules['openai'] = None\n"
        "try:\n"
        "    kernelext._adapters.openai.wrap_openai(object())\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "pip install 'kernelext[openai]'" in out.stdout


# -- SIGKILL: a tool-calling agent killed 50 times, resumed each time ------------------------
KILLS = int(os.environ.get("KERNELEXT_CRASH_LLM_KILLS", "50"))
SEED = int(os.environ.get("KERNELEXT_CRASH_SEED", "20240611"))
EARLY_KILL_SHARE = 0.1  # aimed at the store's opening and the resume's bookkeeping
LATE_KILL_MAX = 0.25  # seconds after the run executes (a whole run takes about 0.2 s)


class Pool(WorkerPool):
    """Keeps two workers warm: an attempt is often shorter than a worker's start."""

    def __init__(self, script: Path, workdir: Path) -> None:
        super().__init__(script, workdir)
        self.queue: deque[Worker] = deque()

    def take(self) -> Worker:
        while len(self.queue) < 2:
            self.queue.append(self._spawn())
        worker = self.queue.popleft()
        worker.expect("loaded")
        self.queue.append(self._spawn())
        return worker

    def close(self) -> None:
        while self.queue:
            self.queue.popleft().quit()
        super().close()


def decide_unknowns(
    store: Any, run_id: str, deliveries: DeliveryServer, decisions: list[dict[str, Any]]
) -> None:
    """A model call cut short is asked again (nobody saw its answer); a delivery is decided
    from the delivery server's log. Every decision is kept for the final tally."""
    for item in kx.reconcile(run_id, store=store):
        key = str(item.key)
        if item.tool == CHAT_TOOL:
            item.mark_not_applied(note="the answer never reached the run: ask the model again")
            decisions.append({"key": key, "tool": item.tool, "decision": "not_applied"})
            continue
        assert item.tool == "deliver", item.tool
        received = [d for d in deliveries.deliveries if d["idempotency_key"] == key]
        if received:
            first = received[0]
            result = {"ok": True, "delivery": first["seq"], "path": first["path"]}
            item.mark_applied(result={**result, "idempotency_key": key})
        else:
            item.mark_not_applied(note="the delivery server never received this key")
        decision = "applied" if received else "not_applied"
        decisions.append({"key": key, "tool": item.tool, "decision": decision})


@pytest.mark.slow
@pytest.mark.crash
@pytest.mark.timeout(600)
def test_sigkilled_llm_agent_repeats_no_completed_turn_and_no_delivery(
    tmp_path: Path, delivery_server: DeliveryServer
) -> None:
    rng = random.Random(SEED)
    store_path = tmp_path / "store" / "llm.duckdb"
    decisions: list[dict[str, Any]] = []
    runs: list[str] = []
    kills = attempts = 0
    pool = Pool(CRASH_DIR / "llm_agent_worker.py", tmp_path)
    server = LLMServer(script=CRASH_SCRIPT, log_path=tmp_path / "llm.jsonl", delay=0.02)
    try:
        server.start()
        while kills < KILLS:
            run_id = f"llm-{len(runs)}"
            runs.append(run_id)
            for _ in range(100):
                with open_store(str(store_path)) as store:
                    row = store.find_run(run_id)
                    if row is not None and row["status"] == Status.COMPLETED:
                        break
                    if row is not None:
                        decide_unknowns(store, run_id, delivery_server, decisions)
                attempts += 1
                outcome = attempt_run(
                    pool.take(),
                    rng,
                    kills < KILLS,
                    late=(0, LATE_KILL_MAX),
                    early_share=EARLY_KILL_SHARE,
                    early=(0, 0.1),
                    store=str(store_path),
                    run_id=run_id,
                    attempt=attempts,
                    llm_url=server.base_url,
                    delivery_url=delivery_server.url,
                    pause_ms=3.0,
                )
                kills += kill_landed(outcome, attempts, delivery_server) is not None
            else:
                pytest.fail(f"run {run_id} did not complete in 100 attempts")
        with open_store(str(store_path)) as store:
            rows = [r for run_id in runs for r in store.load_effects(run_id).values()]
            assert all(not kx.reconcile(run_id, store=store) for run_id in runs)
    finally:
        pool.close()
        server.stop()

    assert {r["status"] for r in rows} == {EffectStatus.APPLIED}
    tools = Counter(r["tool"] for r in rows)
    assert tools == {CHAT_TOOL: MODEL_CALLS * len(runs), "deliver": DELIVERIES * len(runs)}
    # 0 duplicate deliveries: each delivery key reached the server exactly once.
    delivered = Counter(d["idempotency_key"] for d in delivery_server.deliveries)
    assert set(delivered) == {str(r["key"]) for r in rows if r["tool"] == "deliver"}
    assert set(delivered.values()) == {1}, "a parcel was delivered twice"
    # 0 repeated model requests for completed turns: a turn is asked again only after its
    # call was cut short and decided "not applied"; each key is one (conversation, turn).
    asked = Counter(r["idempotency_key"] for r in server.requests)
    again = Counter(d["key"] for d in decisions if d["tool"] == CHAT_TOOL)
    model_keys = {str(r["key"]) for r in rows if r["tool"] == CHAT_TOOL}
    assert set(asked) == model_keys
    repeated = {k: n for k, n in asked.items() if n > 1 + again[k]}
    assert not repeated, f"completed turns asked again: {repeated}"
    turns = {(r["conversation"], r["turn"]) for r in server.requests}
    assert len(turns) == len(model_keys) == MODEL_CALLS * len(runs)
    summary = {
        "runs": len(runs),
        "attempts": attempts,
        "kills": kills,
        "model_calls_decided_again": sum(again.values()),
        "deliveries_decided": Counter(d["decision"] for d in decisions if d["tool"] == "deliver"),
        "model_requests": len(server.requests),
    }
    print("\nllm agent crash matrix:", json.dumps(summary, default=dict))
    assert kills >= KILLS and again, "no kill landed while the model was answering"
