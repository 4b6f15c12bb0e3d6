"""``kx.openai_agents``: an OpenAI Agents SDK run stopped, resumed and never repeated.

The model is ``support.llm_server.LLMServer`` on 127.0.0.1 (the Responses API the SDK
speaks), which counts the requests of every conversation turn; the tools POST to the local
``DeliveryServer``, which counts deliveries. A run is stopped while a tool call is held,
resumed in this process or in a new one (``python -m support.sdk_agents``), killed with
SIGKILL right after a payment reached the server, gated by an approval given from the
command line, and ended by the SDK's own errors.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.http_server import DeliveryServer
from support.llm_server import LLMServer
from support.sdk_agents import HOLD, PAY_SCRIPT, close_clients, payer

import kernelext as kx
from kernelext._adapters.openai_agents import MODEL_TOOL
from kernelext._core.process.runtime import runtime
from kernelext.status import EffectStatus, Status

TESTS_DIR = Path(__file__).resolve().parents[1]
TWO_AT_ONCE = [
    {
        "tool_calls": [
            {"name": "pay", "arguments": {"who": "bob", "amount": 10}},
            {"name": "pay", "arguments": {"who": "ann", "amount": 3}},
        ]
    },
    {"content": "paid both"},
]


@pytest.fixture
def llm(tmp_path: Path) -> Any:
    with LLMServer(script=list(PAY_SCRIPT), log_path=tmp_path / "llm.jsonl") as server:
        yield server


@pytest.fixture
def deliveries(tmp_path: Path) -> Any:
    with DeliveryServer(log_path=tmp_path / "deliveries.jsonl") as server:
        yield server


@pytest.fixture(autouse=True)
def _released() -> Any:
    yield
    HOLD.released.set()
    close_clients()


def paid(server: DeliveryServer) -> list[str]:
    return sorted(d["path"] for d in server.deliveries)


def ledger(run_id: str) -> list[tuple[str, str, int, str]]:
    rows = kx.sql(
        "SELECT step_key, tool, call_ordinal, status FROM effects WHERE run_id = ? "
        "ORDER BY step_key, call_ordinal",
        params=[run_id],
    )
    return [tuple(r) for r in rows.itertuples(index=False)]  # type: ignore[misc]


def stopped_at_first_pay(agent: Any, run_id: str) -> kx.Handle:
    """Start the run, hold its first ``pay`` until the Stop was asked, then let it go."""
    HOLD.arm()
    handle = kx.openai_agents.start(agent, "pay bob 10 and ann 3", run_id=run_id)
    assert HOLD.reached.wait(30)
    handle.stop()
    HOLD.released.set()
    assert handle.wait(30) == Status.SUSPENDED
    return handle


def in_new_process(*argv: str, timeout: float = 120) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(TESTS_DIR)}
    done = subprocess.run(
        [sys.executable, "-m", "support.sdk_agents", *argv],
        env=env, capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


# -- Stop and resume ------------------------------------------------------------------------
def test_a_run_stopped_after_its_first_tool_call_is_resumed_in_a_new_process(
    store: Any, llm: LLMServer, deliveries: DeliveryServer
) -> None:
    stopped_at_first_pay(payer(llm.base_url, deliveries.url), "oa-new")
    assert paid(deliveries) == ["/pay/bob"]  # the Stop landed before the next turn
    assert ledger("oa-new") == [
        ("turn 1", MODEL_TOOL, 0, EffectStatus.APPLIED),
        ("turn 1", "pay", 1, EffectStatus.APPLIED),
    ]
    (args,) = kx.sql("SELECT args FROM effects WHERE run_id = 'oa-new' AND tool = 'pay'")["args"]
    assert json.loads(args) == {"who": "bob", "amount": 10}  # by name, as the model gave them
    runtime().close()  # the store file is the new process's now
    ended = in_new_process("resume", "oa-new", llm.base_url, deliveries.url)
    assert ended == {"status": "completed", "result": "paid bob 10 and ann 3"}
    assert paid(deliveries) == ["/pay/ann", "/pay/bob"]  # each once
    assert set(llm.per_turn().values()) == {1}  # no turn asked twice
    assert len(llm.per_turn()) == 3


def test_a_resume_in_the_same_kernel_replays_every_turn_it_had(
    store: Any, llm: LLMServer, deliveries: DeliveryServer
) -> None:
    agent = payer(llm.base_url, deliveries.url)
    handle = kx.openai_agents.start(agent, "pay bob 10 and ann 3", run_id="oa-same")
    assert handle.wait(30) == Status.COMPLETED
    assert handle.result == "paid bob 10 and ann 3"
    # Stopped at the second turn this time: turn 1's answer and tool are replayed, the
    # second turn's request (which holds the first's items) matches its record.
    HOLD.arm(who="ann")
    second = kx.openai_agents.start(agent, "pay bob 10 and ann 3", run_id="oa-same-2")
    assert HOLD.reached.wait(30)
    second.stop()
    HOLD.released.set()
    assert second.wait(30) == Status.SUSPENDED
    resumed = kx.resume("oa-same-2")
    assert resumed.wait(30) == Status.COMPLETED
    assert resumed.result == "paid bob 10 and ann 3"
    assert [s for s in ledger("oa-same-2") if s[1] == "pay"] == [
        ("turn 1", "pay", 1, EffectStatus.APPLIED),
        ("turn 2", "pay", 1, EffectStatus.APPLIED),
    ]
    assert paid(deliveries) == ["/pay/ann", "/pay/ann", "/pay/bob", "/pay/bob"]  # two runs
    assert set(llm.per_turn().values()) == {2}  # each turn once per run
