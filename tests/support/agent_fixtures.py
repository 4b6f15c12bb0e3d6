"""What the agent-framework adapter tests share (OpenAI Agents SDK, Pydantic AI, streamed or not).

Fixtures (tests/surfaces/conftest.py offers them to its folder, with ``llm``, the scripted
model server of support.llm_fixtures: a module sets ``LLM_SCRIPT = PAY_SCRIPT``):
``deliveries``, the delivery server the ``pay`` tool posts to; ``released_hold`` (taken by
a module's ``pytest.mark.usefixtures``): after each test a held ``pay`` is let go and the
model clients closed. Reads: ``paid(server)``, the paths paid; ``ledger(run_id)``, the
run's effects in order; ``streamed(llm)``, whether each model request asked for a stream.
Runs: ``stopped_at_pay``, a run on ``PROMPT`` stopped while a ``pay`` is held;
``resumed_to_the_answer``, such a run resumed to its end, each payment made once.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support.agent_parts import HOLD, PAY_SCRIPT, close_clients
from support.http_server import DeliveryServer
from support.llm_server import LLMServer

PROMPT = "pay bob 10 and ann 3"
TWO_AT_ONCE: list[dict[str, Any]] = [
    {
        "tool_calls": [
            {"name": "pay", "arguments": {"who": "bob", "amount": 10}},
            {"name": "pay", "arguments": {"who": "ann", "amount": 3}},
        ]
    },
    {"content": "paid both"},
]


@pytest.fixture
def deliveries(tmp_path: Path) -> Iterator[DeliveryServer]:
    with DeliveryServer(log_path=tmp_path / "deliveries.jsonl") as server:
        yield server


@pytest.fixture
def released_hold() -> Iterator[None]:
    """After each test: a ``pay`` still held is let go, the model clients are closed."""
    yield
    HOLD.released.set()
    close_clients()


def paid(server: DeliveryServer) -> list[str]:
    """The paths paid on ``server``, sorted."""
    return sorted(d["path"] for d in server.deliveries)


def ledger(run_id: str) -> list[tuple[str, str, int, str]]:
    """The run's effects as ``(step_key, tool, call_ordinal, status)``, in order."""
    import kernelext as kx

    rows = kx.sql(
        "SELECT step_key, tool, call_ordinal, status FROM effects WHERE run_id = ? "
        "ORDER BY step_key, call_ordinal",
        params=[run_id],
    )
    return [tuple(r) for r in rows.itertuples(index=False)]  # type: ignore[misc]


def streamed(llm: LLMServer) -> list[bool]:
    """Whether each request the model server got, in order, asked for a stream."""
    return [r["stream"] for r in sorted(llm.requests, key=lambda r: r["seq"])]


def held_at_pay(
    framework: Any,
    agent: Any,
    run_id: str,
    *,
    who: str | None = None,
    prompt: str = PROMPT,
    **options: Any,
) -> Any:
    """Start the run through ``framework`` (``kx.openai_agents``, ``kx.pydantic_ai``) on
    ``prompt`` and return its handle once a ``pay`` (of ``who``, else the first) is held
    (until ``HOLD.released``). ``options`` go to ``framework.start``."""
    HOLD.arm(who=who)
    handle = framework.start(agent, prompt, run_id=run_id, **options)
    assert HOLD.reached.wait(30)
    return handle


def stopped_at_pay(framework: Any, agent: Any, run_id: str, **options: Any) -> Any:
    """The run of ``held_at_pay`` (``options`` are its: ``who``, ``prompt`` and what goes to
    ``framework.start``), stopped while its ``pay`` is held, which is then let go; the run
    must be suspended."""
    from kernelext.status import Status

    handle = held_at_pay(framework, agent, run_id, **options)
    handle.stop()
    HOLD.released.set()
    assert handle.wait(30) == Status.SUSPENDED, handle.error
    return handle


def resumed_to_the_answer(run_id: str, llm: LLMServer, deliveries: DeliveryServer) -> Any:
    """Resume the run stopped at a ``pay`` of ``PAY_SCRIPT``: it completes with the script's
    answer, bob and ann are paid once each, and no turn of the model is asked twice."""
    import kernelext as kx
    from kernelext.status import Status

    resumed = kx.resume(run_id)
    assert resumed.wait(30) == Status.COMPLETED, resumed.error
    assert resumed.result == PAY_SCRIPT[-1]["content"]
    assert paid(deliveries) == ["/pay/ann", "/pay/bob"]  # each once
    assert set(llm.per_turn().values()) == {1} and len(llm.per_turn()) == 3  # none twice
    return resumed
