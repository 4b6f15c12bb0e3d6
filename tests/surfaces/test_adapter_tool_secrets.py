"""A ``kx.tools`` result holding a registered secret: the live run hands the model the value,
the ledger stores it masked, and a resume refuses to go on from that record, saying why and
what to do (as a Pydantic AI tool's result does), instead of handing the model ``***`` and
failing at the next model call with ``EffectArgumentsMismatch``.

Every shape ``kx.tools`` serves (Anthropic ``tool_use`` blocks, chat completions tool calls,
Responses ``function_call`` items), for a plain function and an ``@kx.effect``, against the
real SDKs and the scripted model server on 127.0.0.1 (``support.llm_server``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from support.llm_server import LLMServer
from support.model_loops import LOOPS

import kernelext as kx

SECRET = "S3CRET-TOOL-" + "QWZ" * 4
SCRIPT = [{"tool_calls": [{"name": "token", "arguments": {}}]}, {"content": "ok"}]
CRASHED: set[str] = set()


@pytest.fixture
def llm() -> Iterator[LLMServer]:
    with LLMServer(script=list(SCRIPT)) as server:
        yield server


def crash_after_the_second_turn(turn: int) -> None:
    if turn == 1 and "loop" not in CRASHED:
        CRASHED.add("loop")
        raise RuntimeError("a bug, fixed before the resume")


def plain_token() -> str:
    """A token."""
    return f"the token is {SECRET}"


@kx.effect(name="token")
def effect_token() -> dict[str, str]:
    """A token."""
    return {"token": SECRET}


def tools_of(kind: str) -> Any:
    tools = kx.tools()
    tools.add(plain_token if kind == "plain" else effect_token, name="token")
    return tools


@pytest.mark.parametrize("kind", ["plain", "effect"])
@pytest.mark.parametrize("shape", sorted(LOOPS))
def test_a_tool_result_with_a_secret_is_refused_clearly_on_resume(
    store: Any, llm: LLMServer, shape: str, kind: str
) -> None:
    CRASHED.discard("loop")
    kx.secrets.register(SECRET)
    loop = LOOPS[shape](
        llm, tools_of(kind), lambda: "Be brief.", lambda: "go", crash_after_the_second_turn
    )
    agent = kx.agent(name=f"secret-{shape}-{kind}")(loop)
    run_id = f"secret-{shape}-{kind}"

    assert agent.start("go", run_id=run_id).wait(timeout=30) == "failed"
    resumed = kx.resume(run_id)
    resumed.wait(timeout=30)

    assert str(resumed.status) == "failed"
    assert isinstance(resumed.error, kx.LedgerError), resumed.error
    assert not isinstance(resumed.error, kx.EffectArgumentsMismatch), resumed.error
    message = str(resumed.error)
    assert f"The result of tool token in run {run_id!r} held a registered secret" in message
    assert "Start it again under a new run id" in message
    stored = kx.sql("SELECT result FROM effects WHERE tool = 'token'").iloc[0, 0]
    assert SECRET not in str(stored)  # the scrubbing door held


@pytest.mark.parametrize("kind", ["plain", "effect"])
def test_in_the_live_run_the_model_gets_the_value(store: Any, kind: str) -> None:
    kx.secrets.register(SECRET)
    got: list[str] = []
    tools = tools_of(kind)

    @kx.agent(name=f"live-{kind}")
    def ask(run: kx.Run, _: str) -> None:
        call = {"type": "tool_use", "id": "t1", "name": "token", "input": {}}
        got.append(tools.call(call)["content"])

    assert ask.start("go", run_id=f"live-{kind}").wait(timeout=30) == "completed"
    assert SECRET in got[0] and "kernelext_masked" not in got[0]


@pytest.mark.parametrize("kind", ["plain", "effect"])
def test_a_result_without_a_secret_replays(store: Any, llm: LLMServer, kind: str) -> None:
    CRASHED.discard("loop")
    loop = LOOPS["anthropic"](
        llm, tools_of(kind), lambda: "Be brief.", lambda: "go", crash_after_the_second_turn
    )
    agent = kx.agent(name=f"no-secret-{kind}")(loop)

    assert agent.start("go", run_id=f"clear-{kind}").wait(timeout=30) == "failed"
    resumed = kx.resume(f"clear-{kind}")
    resumed.wait(timeout=30)

    assert (str(resumed.status), resumed.result) == ("completed", "ok"), resumed.error
    assert set(llm.per_turn().values()) == {1}


def test_an_effect_given_to_kx_tools_is_the_same_effect_called_elsewhere(store: Any) -> None:
    kx.secrets.register(SECRET)
    tools_of("effect")
    got: list[Any] = []

    @kx.agent(name="effect-elsewhere")
    def direct(run: kx.Run, _: str) -> None:
        got.append(effect_token())  # not through kx.tools: the effect as it is

    assert direct.start("go", run_id="elsewhere").wait(timeout=30) == "completed"
    assert got == [{"token": SECRET}]
