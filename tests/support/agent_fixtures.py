"""What the agent-framework adapter tests share (OpenAI Agents SDK, Pydantic AI, streamed or not).

Fixtures (tests/surfaces/conftest.py offers them to its folder): ``llm``, the scripted
model server answering ``PAY_SCRIPT`` (or the script of
``@pytest.mark.parametrize("llm", [SCRIPT], indirect=True)``); ``deliveries``, the delivery
server the ``pay`` tool posts to; ``released_hold`` (taken by a module's
``pytest.mark.usefixtures``): after each test a held ``pay`` is let go and the model clients
closed. Reads: ``paid(server)``, the paths paid; ``ledger(run_id)``, the run's effects in
order; ``streamed(llm)``, whether each model request asked for a stream.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support.agent_parts import HOLD, PAY_SCRIPT, close_clients
from support.http_server import DeliveryServer
from support.llm_server import LLMServer

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
def llm(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LLMServer]:
    script = getattr(request, "param", PAY_SCRIPT)
    with LLMServer(script=list(script), log_path=tmp_path / "llm.jsonl") as server:
        yield server


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
