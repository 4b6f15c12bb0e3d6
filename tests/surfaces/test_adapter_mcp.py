"""MCP tools as effects (issue 15, part 3): ``kx.mcp(ClientSession(...))``.

Everything here is real: an MCP server process over stdio built with the ``mcp``
package's server side (tests/support/mcp_server.py), the SDK's own ``stdio_client`` and
``ClientSession``, a DuckDB store file, and the DeliveryServer on 127.0.0.1 that counts
each POST the server's ``deliver`` tool makes. "Not called again" is read from that
count, never from a mock.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.fresh_python import printed_by_fresh_python
from support.http_server import DeliveryServer
from support.live import name, wait_until
from support.mcp_server import SCRIPT, SERVER_NAME, McpClient

import kernelext as kx
from kernelext._adapters.mcp import result_json, wrap_mcp
from kernelext._store import Store
from kernelext.status import EffectStatus, Reason, Status, StepStatus

TESTS_DIR = Path(__file__).resolve().parents[1]
WAIT = 60.0  # generous: a loaded 2-core machine
DELIVER = f"mcp:{SERVER_NAME}/deliver"
ADD = f"mcp:{SERVER_NAME}/add"

# What the agent reaches from its worker thread, in this process or in a worker process:
# the client (its loop holds the session), the wrapped session, and what to do once the
# tool answered (here: wait for GATE; in a worker: say so, then wait to be killed).
CONTEXT: dict[str, Any] = {}
RESULTS: list[Any] = []  # every result call_tool gave the agent, in order
GATE = threading.Event()


@kx.agent(name="mcp-adapter")
def mcp_agent(run: kx.Run, channel: str, text: str) -> dict[str, Any]:
    client: McpClient = CONTEXT["client"]
    session = CONTEXT["session"]
    with run.step("deliver"):
        result = client.call(session.call_tool("deliver", {"channel": channel, "text": text}))
        RESULTS.append(result)
        run.state["reply"] = result_json(result)["structuredContent"]
        CONTEXT["after_call"]()
        run.checkpoint()  # a stop that arrived during the call lands here, mid-step
    with run.step("add"):
        total = client.call(session.call_tool("add", {"a": 2, "b": 3}))
        run.state["sum"] = result_json(total)["structuredContent"]["result"]
    return {"reply": run.state["reply"], "sum": run.state["sum"]}


async def deliver_twice(errlog: Path) -> list[Any]:
    """A session of the step's own, on the step's own loop; two calls at once."""
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    params = StdioServerParameters(
        command=sys.executable,
        args=[str(SCRIPT)],
        env={"KERNELEXT_MCP_DELIVERY_URL": CONTEXT["url"]},
    )
    with open(errlog, "a") as log:
        async with (
            stdio_client(params, errlog=log) as (read, write),
            wrap_mcp(ClientSession(read, write), server="mail") as session,
        ):
            await session.initialize()
            first = session.call_tool("deliver", {"channel": "a", "text": "one"})
            second = session.call_tool("deliver", {"channel": "b", "text": "two"})
            return list(await asyncio.gather(first, second))


@kx.agent(name="mcp-adapter-own-loop")
def own_loop_agent(run: kx.Run, errlog: str) -> list[int]:
    with run.step("both"):
        replies = asyncio.run(deliver_twice(Path(errlog)))
        RESULTS.append(replies)
        CONTEXT["after_call"]()
        run.checkpoint()
    return [result_json(r)["structuredContent"]["delivery"] for r in replies]


def worker_main(argv: list[str]) -> None:
    """The crash test's worker process: start the run, note when the tool answered, and
    wait there to be SIGKILLed."""
    store_path, run_id, url, hold, marker = argv
    store = kx.open_store(store_path)
    client = McpClient(url, hold=float(hold), errlog=Path(marker).with_suffix(".log")).start()

    def after_call() -> None:
        Path(marker).write_text("called")
        time.sleep(3600)

    CONTEXT.update(client=client, session=wrap_mcp(client.session), after_call=after_call)
    mcp_agent.start("ops", "hello", run_id=run_id, store=store).wait()


# the worker imports this module from its folder, and `support` from tests/
WORKER = "import os, sys; sys.path[:0] = sys.argv[1].split(os.pathsep); " + (
    "import test_adapter_mcp as t; t.worker_main(sys.argv[2:])"
)


WORKER_PATH = os.pathsep.join([str(Path(__file__).resolve().parent), str(TESTS_DIR)])


@pytest.fixture
def mcp_client(delivery_server: DeliveryServer, tmp_path: Path) -> Iterator[McpClient]:
    with McpClient(delivery_server.url, errlog=tmp_path / "mcp_server.log") as client:
        yield client


@pytest.fixture
def agent_context(mcp_client: McpClient, delivery_server: DeliveryServer) -> Iterator[None]:
    RESULTS.clear()
    GATE.clear()
    CONTEXT.update(
        client=mcp_client,
        session=wrap_mcp(mcp_client.session),
        url=delivery_server.url,
        after_call=lambda: GATE.wait(WAIT),
    )
    yield
    GATE.set()
    CONTEXT.clear()


def ledger(store: Store, run_id: str) -> list[dict[str, Any]]:
    rows = store.load_effects(run_id).values()
    return sorted(rows, key=lambda r: (r["step_key"], r["call_ordinal"]))


# -- packaging -------------------------------------------------------------------------------
def test_kernelext_does_not_import_mcp_and_a_missing_sdk_names_the_extra() -> None:
    code = textwrap.dedent(
        """
        import sys
        import kernelext
        import kernelext._adapters.mcp as adapter
        assert "mcp" not in sys.modules, "importing kernelext loaded the MCP SDK"
        sys.modules["mcp"] = None  # as if it were not installed
        try:
            adapter.wrap_mcp(object())
        except ImportError as exc:
            print(exc)
        """
    )
    assert "pip install 'kernelext[mcp]'" in printed_by_fresh_python(code, timeout=WAIT)


# -- outside a run ---------------------------------------------------------------------------
def test_outside_a_run_it_is_the_plain_session(
    store: Store, mcp_client: McpClient, delivery_server: DeliveryServer
) -> None:
    session = wrap_mcp(mcp_client.session)
    first = mcp_client.call(session.call_tool("deliver", {"channel": "ops", "text": "hi"}))
    second = mcp_client.call(session.call_tool("deliver", {"channel": "ops", "text": "hi"}))
    assert delivery_server.count() == 2  # nothing recorded, so nothing replayed
    assert type(first).__name__ == "CallToolResult"
    assert [result_json(r)["structuredContent"]["delivery"] for r in (first, second)] == [1, 2]
    listed = mcp_client.call(session.list_tools())  # any other method: the session's own
    assert {"deliver", "add"} <= {tool.name for tool in listed.tools}
    assert session.tool_name("deliver") == DELIVER  # named after the server's serverInfo
    assert store.read("SELECT count(*) FROM effects")[0][0] == 0


# -- stop and resume in this process -----------------------------------------------------------
def test_a_run_stopped_after_the_call_resumes_without_calling_the_tool_again(
    store: Store, delivery_server: DeliveryServer, agent_context: None
) -> None:
    run_id = name("mcp-stop")
    handle = mcp_agent.start("ops", "hello", run_id=run_id)
    wait_until(lambda: len(RESULTS) == 1, "the tool's answer", WAIT)
    handle.stop()
    GATE.set()
    assert handle.wait(WAIT) == Status.SUSPENDED
    assert delivery_server.count() == 1
    # The stop landed inside the step: it runs again on resume, call and all.
    assert ("deliver", StepStatus.COMPLETED) not in [
        (s["key"], s["status"]) for s in handle.steps()
    ]
    (row,) = ledger(store, run_id)
    assert (row["tool"], row["status"]) == (DELIVER, EffectStatus.APPLIED)
    assert json.loads(row["args"]) == {"arguments": {"channel": "ops", "text": "hello"}}

    resumed = kx.resume(run_id)
    assert resumed.wait(WAIT) == Status.COMPLETED, resumed.error
    assert delivery_server.count() == 1  # the replay did not reach the server
    first, replayed = RESULTS
    assert type(replayed) is type(first)  # a CallToolResult again, rebuilt from the ledger
    assert result_json(replayed) == result_json(first)
    assert resumed.result == {"reply": result_json(first)["structuredContent"], "sum": 5}
    assert [(r["tool"], r["status"]) for r in ledger(store, run_id)] == [
        (ADD, EffectStatus.APPLIED),
        (DELIVER, EffectStatus.APPLIED),
    ]


def test_a_session_on_the_steps_own_loop_records_concurrent_calls_in_call_order(
    store: Store, delivery_server: DeliveryServer, agent_context: None, tmp_path: Path
) -> None:
    run_id = name("mcp-own-loop")
    handle = own_loop_agent.start(str(tmp_path / "own_server.log"), run_id=run_id)
    wait_until(lambda: len(RESULTS) == 1, "both answers", WAIT)
    handle.stop()
    GATE.set()
    assert handle.wait(WAIT) == Status.SUSPENDED
    rows = ledger(store, run_id)
    # Keyed in the order the agent made the calls, whichever answered first.
    assert [(r["tool"], r["call_ordinal"], json.loads(r["args"])) for r in rows] == [
        ("mcp:mail/deliver", 0, {"arguments": {"channel": "a", "text": "one"}}),
        ("mcp:mail/deliver", 1, {"arguments": {"channel": "b", "text": "two"}}),
    ]
    resumed = kx.resume(run_id)  # a new server process; nothing is sent to it
    assert resumed.wait(WAIT) == Status.COMPLETED, resumed.error
    assert delivery_server.count() == 2
    assert sorted(resumed.result) == [1, 2]
    assert [result_json(r) for r in RESULTS[1]] == [result_json(r) for r in RESULTS[0]]


def test_approval_rules_are_kept_by_tool_name() -> None:
    """The hook for ``needs_approval``: which calls would wait for a person (decided
    without the session, so any object stands in for it here)."""
    plain = object()
    by_name = wrap_mcp(plain, needs_approval={"deliver"})
    by_full_name = wrap_mcp(plain, SERVER_NAME, needs_approval=[DELIVER])
    by_rule = wrap_mcp(plain, needs_approval=lambda tool, args: args.get("channel") == "ops")
    for session in (by_name, by_full_name):
        assert session.approval_required("deliver", {}) and not session.approval_required("add", {})
    assert by_rule.approval_required("deliver", {"channel": "ops"})
    assert not by_rule.approval_required("deliver", {"channel": "dev"})
    assert wrap_mcp(plain, needs_approval=True).approval_required("add", {})
    assert not wrap_mcp(plain).approval_required("deliver", {})
    assert wrap_mcp(plain, needs_approval="deliver").approval_required("deliver", {})


def test_a_tool_that_needs_approval_waits_and_is_called_once_approved(
    store: Store, delivery_server: DeliveryServer, agent_context: None, mcp_client: McpClient
) -> None:
    """``needs_approval`` by tool name: the run suspends before the call goes out, the
    request names the MCP tool, and once approved the tool is called exactly once."""
    CONTEXT["session"] = wrap_mcp(mcp_client.session, needs_approval={"deliver"})
    GATE.set()
    run_id = name("mcp-approval")
    handle = mcp_agent.start("ops", "pay me", run_id=run_id)
    assert handle.wait(WAIT) == Status.SUSPENDED
    assert store.get_run(run_id)["reason"] == Reason.APPROVAL
    assert delivery_server.count() == 0  # nothing left before a person said yes
    (request,) = kx.approvals(run_id)
    assert request.tool == DELIVER
    request.approve(note="checked")  # the run was started here: it resumes at once
    wait_until(lambda: store.get_run(run_id)["status"] == Status.COMPLETED, "completion", WAIT)
    assert delivery_server.count() == 1
    assert [(r["tool"], r["status"]) for r in ledger(store, run_id)] == [
        (ADD, EffectStatus.APPLIED),
        (DELIVER, EffectStatus.APPLIED),
    ]


# -- a worker process SIGKILLed and resumed here -------------------------------------------------
@pytest.mark.crash
@pytest.mark.parametrize("kill", ["after_the_call", "during_the_call"])
def test_a_killed_worker_resumes_without_calling_the_tool_again(
    kill: str,
    store_path: Path,
    delivery_server: DeliveryServer,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    run_id = name("mcp-kill")
    marker = tmp_path / "called"
    hold = "600" if kill == "during_the_call" else "0"  # the tool answers after 10 minutes
    args = [str(store_path), run_id, delivery_server.url, hold, str(marker)]
    with open(tmp_path / "worker.err", "w") as err:
        worker = subprocess.Popen(
            [sys.executable, "-c", WORKER, WORKER_PATH, *args], stderr=err, cwd=TESTS_DIR
        )
    try:
        if kill == "after_the_call":
            wait_until(lambda: marker.exists() or worker.poll() is not None, "the call", WAIT)
            assert marker.exists(), (tmp_path / "worker.err").read_text()
        else:
            delivery_server.wait_for(1, timeout=WAIT)  # delivered; the answer is held
    finally:
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait(WAIT)
    assert delivery_server.count() == 1

    store: Store = request.getfixturevalue("store")  # opened once the worker is gone
    request.getfixturevalue("agent_context")
    GATE.set()
    handle = kx.resume(run_id)
    if kill == "during_the_call":  # nobody knows whether it happened: a person decides
        assert handle.wait(WAIT) == Status.NEEDS_DECISION
        (unknown,) = kx.reconcile(run_id)
        assert unknown.tool == DELIVER
        seq = delivery_server.deliveries[0]["seq"]  # what the server's log says happened
        unknown.mark_applied(result={"ok": True, "delivery": seq})
        handle = kx.resume(run_id)
    assert handle.wait(WAIT) == Status.COMPLETED, handle.error
    assert delivery_server.count() == 1
    assert handle.result["reply"]["delivery"] == 1 and handle.result["sum"] == 5
    (replayed,) = RESULTS
    assert type(replayed).__name__ == "CallToolResult"
    assert {r["tool"]: r["status"] for r in ledger(store, run_id)} == {
        DELIVER: EffectStatus.APPLIED,
        ADD: EffectStatus.APPLIED,
    }
