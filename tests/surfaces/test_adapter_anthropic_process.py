"""``kx.anthropic`` across processes: a tool-using loop stopped in one process is resumed
in another, and a model call cut short by a SIGKILL waits for a person in ``kx.reconcile``.

Every attempt runs in a fresh worker process (``tests/crash/anthropic_agent_worker.py``:
the real ``anthropic`` client against the scripted model server's ``/v1/messages``, the
tool posting to the delivery server on 127.0.0.1), so a resume has only the DuckDB file.
The servers count what reached them: each model turn and each delivery.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from crash import CRASH_DIR, WorkerPool
from crash.anthropic_agent_worker import DELIVERIES, MODEL_CALLS, SCRIPT
from support.http_server import DeliveryServer
from support.llm_server import LLMServer

import kernelext as kx
from kernelext._adapters.anthropic import MESSAGES_TOOL
from kernelext._store import open_store
from kernelext.status import EffectStatus

ANSWER = "All three parcels are delivered."
pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def llm(tmp_path: Path) -> Iterator[LLMServer]:
    with LLMServer(script=SCRIPT, log_path=tmp_path / "llm.jsonl") as server:
        yield server


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[WorkerPool]:
    workers = WorkerPool(CRASH_DIR / "anthropic_agent_worker.py", tmp_path)
    yield workers
    workers.close()


class Attempts:
    """Each attempt a new worker process on the same store, model and delivery servers."""

    def __init__(self, pool: WorkerPool, store: Path, llm: LLMServer, delivery: DeliveryServer):
        self.pool, self.store, self.llm, self.delivery = pool, store, llm, delivery
        self.count = 0

    def go(self, run_id: str, *, stop_after: int = 0) -> Any:
        self.count += 1
        worker = self.pool.take()
        worker.go(
            store=str(self.store), run_id=run_id, attempt=self.count, llm_url=self.llm.url,
            delivery_url=self.delivery.url, stop_after=stop_after,
        )  # fmt: skip
        return worker


def deliveries_per_key(delivery: DeliveryServer) -> Counter[str]:
    delivery.settle()
    return Counter(str(d["idempotency_key"]) for d in delivery.deliveries)


def test_a_stopped_tool_loop_resumes_in_a_new_process_asking_no_turn_twice(
    tmp_path: Path, llm: LLMServer, delivery_server: DeliveryServer, pool: WorkerPool
) -> None:
    attempts = Attempts(pool, tmp_path / "store.duckdb", llm, delivery_server)
    first = attempts.go("parcels", stop_after=1)  # stops after the first tool call
    first.expect("ready")
    assert "suspended" in first.expect("ended"), first.stderr()
    assert first.reap() == 3
    assert sum(llm.per_turn().values()) == 1 and delivery_server.count() == 1

    second = attempts.go("parcels")  # a new process: only the store is left
    second.expect("ready")
    state = json.loads(second.expect("done").split(" ", 1)[1])
    assert second.reap() == 0, second.stderr()
    assert state["answer"] == ANSWER
    assert list(llm.per_turn("messages").values()) == [1] * MODEL_CALLS  # no turn asked twice
    delivered = deliveries_per_key(delivery_server)
    assert len(delivered) == DELIVERIES and set(delivered.values()) == {1}
    with open_store(str(tmp_path / "store.duckdb")) as store:
        rows = store.load_effects("parcels").values()
        tools = Counter(r["tool"] for r in rows)
        assert {r["status"] for r in rows} == {EffectStatus.APPLIED}
    assert tools == {MESSAGES_TOOL: MODEL_CALLS, "deliver": DELIVERIES}
    assert set(delivered) == {str(r["key"]) for r in rows if r["tool"] == "deliver"}


def test_a_model_call_cut_short_by_a_kill_is_decided_in_reconcile_then_asked_again(
    tmp_path: Path, llm: LLMServer, delivery_server: DeliveryServer, pool: WorkerPool
) -> None:
    attempts = Attempts(pool, tmp_path / "store.duckdb", llm, delivery_server)
    first = attempts.go("cut", stop_after=1)
    first.expect("ready")
    assert "suspended" in first.expect("ended")
    assert first.reap() == 3

    llm.delay = 60.0  # the model "thinks": the request has arrived, no answer comes
    killed = attempts.go("cut")
    killed.expect("ready")
    deadline = time.monotonic() + 60
    while sum(llm.per_turn().values()) < 2:  # the streamed turn 1 reached the server
        assert time.monotonic() < deadline, killed.stderr()
        time.sleep(0.05)
    assert killed.kill()
    llm.delay = 0.0

    waiting = attempts.go("cut")  # a resume in a new process: the outcome is unknown
    assert waiting.expect("needs_decision", "ready").startswith("needs_decision")
    assert waiting.reap() == 0
    with open_store(str(tmp_path / "store.duckdb")) as store:
        (unknown,) = kx.reconcile("cut", store=store)
        assert unknown.tool == MESSAGES_TOOL
        unknown.mark_not_applied(note="the answer never reached the run: ask the model again")

    last = attempts.go("cut")
    last.expect("ready")
    state = json.loads(last.expect("done").split(" ", 1)[1])
    assert last.reap() == 0, last.stderr()
    assert state["answer"] == ANSWER
    asked = llm.per_turn("messages")
    turns = sorted(asked)  # (conversation, turn): the cut turn twice, the others once
    assert [asked[t] for t in turns] == [1, 2, 1]
    cut_keys = [r["idempotency_key"] for r in llm.requests if r["turn"] == turns[1][1]]
    assert cut_keys == [str(unknown.key)] * 2  # asked again under the same key
    delivered = deliveries_per_key(delivery_server)
    assert len(delivered) == DELIVERIES and set(delivered.values()) == {1}
