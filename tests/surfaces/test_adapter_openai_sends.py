"""``kx.openai`` inside a run: every request the client sends is a recorded model call,
sent once (the ledger's retry rule, not the client's own retries), or refused.

The model is ``support.llm_server.LLMServer`` on 127.0.0.1, which counts every request it
received (failed ones too).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from openai import AsyncOpenAI, OpenAI
from support.live import name
from support.llm_server import LLMServer

import kernelext as kx
from kernelext._store import Store

WAIT = 60.0
MODEL = "scripted"
MESSAGES = [{"role": "user", "content": "hi"}]

pytestmark = pytest.mark.both_backends


@pytest.fixture
def client(llm: LLMServer) -> Any:
    """A client that would retry twice on its own (max_retries=2), closed after the test."""
    with OpenAI(base_url=llm.base_url, api_key="sk-local", max_retries=2) as plain:
        yield kx.openai(plain)


def rows_of(run_id: str) -> list[tuple[str, str, int]]:
    rows = kx.sql("select tool, status, attempts from effects where run_id = ?", [run_id])
    return list(zip(rows["tool"], rows["status"], map(int, rows["attempts"]), strict=True))


RECORDED: dict[str, Callable[[Any], Any]] = {
    "openai:embeddings": lambda c: c.embeddings.create(model=MODEL, input="x"),
    "openai:completions": lambda c: c.completions.create(model=MODEL, prompt="x"),
    "openai:chat.completions": lambda c: c.chat.completions.create(model=MODEL, messages=MESSAGES),
}


@pytest.mark.parametrize("tool", sorted(RECORDED))
def test_each_model_call_is_recorded_and_sent_once(
    store: Store, llm: LLMServer, client: Any, tool: str
) -> None:
    llm.fail_next(3, status=500)  # the client's own retries would send it 3 times
    call = RECORDED[tool]

    @kx.agent(name=name("model-call"))
    def agent(run: kx.Run) -> Any:
        return call(client)

    handle = agent.start()
    assert handle.wait(WAIT) == "failed", handle.error
    assert llm.count() == 1
    assert rows_of(handle.run_id) == [(tool, "failed", 1)]


SENDING: dict[str, Callable[[Any], Any]] = {
    "with_raw_response": lambda c: c.chat.completions.with_raw_response.create(
        model=MODEL, messages=MESSAGES
    ),
    "with_streaming_response": lambda c: c.with_streaming_response.chat.completions.create(
        model=MODEL, messages=MESSAGES
    ),
    "post": lambda c: c.post("/chat/completions", body={"model": MODEL}, cast_to=object),
    "models": lambda c: c.models.list(),
}


@pytest.mark.parametrize("surface", sorted(SENDING))
def test_a_request_that_would_go_unrecorded_is_refused_in_a_run(
    store: Store, llm: LLMServer, client: Any, surface: str
) -> None:
    call = SENDING[surface]

    @kx.agent(name=name("unrecorded"))
    def agent(run: kx.Run) -> Any:
        return call(client)

    handle = agent.start()
    assert handle.wait(WAIT) == "failed"
    assert "client.chat.completions.create" in str(handle.error)  # the recorded way named
    assert "not recorded by kx.openai inside a run" in str(handle.error)
    assert llm.count() == 0
    assert rows_of(handle.run_id) == []
    assert str(client.base_url).startswith(llm.base_url)  # its settings still read


def test_the_plain_client_inside_a_tool_of_ones_own_is_not_refused(
    store: Store, client: Any
) -> None:
    @kx.effect(name="list_models")
    def list_models() -> int:
        return len(client.models.list().data)

    @kx.agent(name=name("own-tool"))
    def agent(run: kx.Run) -> int:
        return list_models()

    handle = agent.start()
    assert handle.wait(WAIT) == "completed", handle.error
    assert isinstance(handle.result, int)


def test_a_model_call_answered_500_is_not_asked_again_on_resume(
    store: Store, llm: LLMServer, client: Any
) -> None:
    """It may have been processed (and billed): on resume it waits in kx.reconcile."""
    llm.fail_next(1, status=500)

    @kx.agent(name=name("model-500"))
    def agent(run: kx.Run) -> Any:
        return client.chat.completions.create(model=MODEL, messages=MESSAGES)

    handle = agent.start()
    assert handle.wait(WAIT) == "failed", handle.error
    resumed = kx.resume(handle.run_id)
    assert resumed.wait(WAIT) == "needs_decision", resumed.error
    assert llm.count() == 1
    assert rows_of(handle.run_id) == [("openai:chat.completions", "unknown", 1)]


def test_an_async_model_call_answered_500_is_not_asked_again_on_resume(
    store: Store, llm: LLMServer
) -> None:
    llm.fail_next(1, status=500)
    plain = AsyncOpenAI(base_url=llm.base_url, api_key="sk-local", max_retries=2)
    client = kx.openai(plain)

    @kx.agent(name=name("async-model-500"))
    async def agent(run: kx.Run) -> Any:
        try:
            return await client.embeddings.create(model=MODEL, input="x")
        finally:
            await plain.close()

    handle = agent.start()
    assert handle.wait(WAIT) == "failed", handle.error
    assert llm.count() == 1
    resumed = kx.resume(handle.run_id)
    assert resumed.wait(WAIT) == "needs_decision", resumed.error
    assert llm.count() == 1
    assert rows_of(handle.run_id) == [("openai:embeddings", "unknown", 1)]
