"""The notebook server's Stop and Force stop route (``kernelext._server``), over real HTTP.

A real Jupyter server (JupyterLab's, with kernelext's extension enabled by the installed
switch file) and an agent run executing in another real process: the route records the
request in the store, the owner honours it (a stop at its next safe point, a force at
once, even while its step blocks in a call), and every bad request is refused with a
message that says what to do, leaving the store as it was. The panel's fallback (a
widget message handled in the kernel) is checked in process.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser import jupyterlab as lab
from support.route import module_lab_server, post  # noqa: F401  (the fixture `server`)

pytestmark = [pytest.mark.slow, pytest.mark.both_backends]

OWNER = textwrap.dedent(
    """
    import sys, time
    import kernelext as kx

    kx.configure(store=sys.argv[1])

    @kx.agent(name="blocking")
    def blocking(run):
        for i in run.steps(range(200), key=str):
            for _ in range(int(float(sys.argv[3]) * 10)):  # Python code a force can cut
                time.sleep(0.1)

    h = blocking.start(run_id=sys.argv[2])
    print("started", flush=True)
    print("status", h.wait(120), flush=True)
    """
)


@pytest.fixture
def owner(store_path: Any) -> Iterator[Any]:
    """Start an agent run in another process; yields a function that starts it."""
    started: list[subprocess.Popen[str]] = []

    def start(run_id: str, step_seconds: float) -> subprocess.Popen[str]:
        process = subprocess.Popen(
            [sys.executable, "-c", OWNER, str(store_path), run_id, str(step_seconds)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        started.append(process)
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "started", process.stderr
        return process

    yield start
    for process in started:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=30)  # reaped, its pipes closed


def wait_status(process: subprocess.Popen[str]) -> str:
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    return out.strip().split()[-1]


def events(store_path: Any, run_id: str) -> list[tuple[str, str | None]]:
    import kernelext as kx

    store = kx.open_store(str(store_path))
    try:
        return [(e["kind"], e.get("source")) for e in store.events(run_id)]
    finally:
        store.close()


def step_rows(store_path: Any, run_id: str) -> list[dict[str, Any]]:
    import kernelext as kx

    store = kx.open_store(str(store_path))
    try:
        return list(store.steps(run_id))
    finally:
        store.close()


def test_stop_through_the_server_reaches_a_run_in_another_process(
    server: lab.LabServer, owner: Any, store_path: Any
) -> None:
    process = owner("by-server", 0.2)
    status, body = post(server, "stop", {"run_id": "by-server", "store": str(store_path)})
    assert status == 200, body
    assert body["status"] == "stopping" and body["source"] == "panel" and body["recorded"]
    assert "stops at its next safe point" in body["message"]
    assert wait_status(process) == "suspended"
    assert ("stop_requested", "panel") in events(store_path, "by-server")


def test_force_through_the_server_cancels_a_blocked_step_in_another_process(
    server: lab.LabServer, owner: Any, store_path: Any
) -> None:
    process = owner("forced-by-server", 60.0)  # each step runs for a minute
    status, body = post(server, "force", {"run_id": "forced-by-server", "store": str(store_path)})
    assert status == 200, body
    assert "Force stop recorded (panel)" in body["message"]
    assert wait_status(process) == "suspended"
    steps = step_rows(store_path, "forced-by-server")
    assert [(s["status"], s["forced"]) for s in steps] == [("cancelled", True)]  # cut, not ended
    kinds = events(store_path, "forced-by-server")
    assert ("force_requested", "panel") in kinds
    assert "stop_forced" in [kind for kind, _ in kinds]  # the run ended as a forced stop


def test_a_stop_from_the_runs_overview_is_recorded_with_its_source(
    server: lab.LabServer, owner: Any, store_path: Any
) -> None:
    process = owner("by-overview", 0.2)
    body = {"run_id": "by-overview", "store": str(store_path)}
    status, answer = post(server, "stop", {**body, "source": "a-script"})
    assert status == 400 and "Unknown source 'a-script'" in answer["message"]
    status, answer = post(server, "stop", {**body, "source": 7})
    assert status == 400
    assert all(kind != "stop_requested" for kind, _ in events(store_path, "by-overview"))
    status, answer = post(server, "stop", {**body, "source": "overview"})
    assert status == 200 and answer["source"] == "overview", answer
    assert "Stop recorded (runs overview)" in answer["message"]
    assert wait_status(process) == "suspended"
    assert ("stop_requested", "overview") in events(store_path, "by-overview")


def test_bad_requests_are_refused_with_what_to_do_and_change_nothing(
    server: lab.LabServer, owner: Any, store_path: Any, tmp_path: Path
) -> None:
    process = owner("untouched", 0.2)
    store = str(store_path)
    status, body = post(server, "stop", {"run_id": "no-such-run", "store": store})
    assert status == 404 and "No run 'no-such-run'" in body["message"]
    if not store.startswith("postgres"):
        missing = tmp_path / "nowhere" / "store.duckdb"
        status, body = post(server, "stop", {"run_id": "untouched", "store": str(missing)})
        assert status == 400 and "No kernelext store at" in body["message"]
        assert not missing.parent.exists()  # nothing was created
        status, body = post(server, "stop", {"run_id": "untouched", "store": "rel.duckdb"})
        assert status == 400 and "must be absolute" in body["message"]
    status, body = post(server, "stop", b"not json")
    assert status == 400 and '"run_id"' in body["message"]
    status, body = post(server, "stop", {"run_id": "", "store": store})
    assert status == 400
    status, _body = post(server, "delete", {"run_id": "untouched", "store": store})
    assert status == 404  # only stop and force are routes
    status, _body = post(server, "stop", {"run_id": "untouched", "store": store}, token=False)
    assert status == 403  # not authenticated: refused before anything is read
    assert all(kind != "stop_requested" for kind, _ in events(store_path, "untouched"))
    status, body = post(server, "stop", {"run_id": "untouched", "store": store})
    assert status == 200 and body["status"] == "stopping"
    assert wait_status(process) == "suspended"
    status, body = post(server, "stop", {"run_id": "untouched", "store": store})
    assert status == 200 and not body["recorded"]
    assert "is suspended: there is nothing to stop" in body["message"]


def test_the_route_says_it_is_there(server: lab.LabServer) -> None:
    assert server.api("/kernelext/api/status") == {
        "route": "kernelext",
        "actions": ["answer", "approve", "force", "reject", "stop"],
    }


def test_a_click_the_server_did_not_take_is_handled_in_the_kernel(store: Any) -> None:
    """The widget message path: the kernel acts and raises ack_seq for the browser."""
    import kernelext as kx
    from kernelext.widgets import panel_for

    release = __import__("threading").Event()

    @kx.agent(name="fallback")
    def fallback(run: kx.Run) -> None:
        for _ in run.steps(range(100), key=str):
            release.wait(60)  # a step lasts until the test has clicked Stop: still live then

    handle = fallback.start(run_id="fallback")
    try:
        panel = panel_for(handle)
        remote = panel.remote
        from kernelext._core.lifecycle.from_elsewhere import store_address

        assert remote.run_id == "fallback" and remote.store == store_address(store)
        assert "kernelext stop fallback" in remote.busy_hint
        remote._handle_message(remote, {"action": "unknown"}, [])
        assert remote.ack_seq == 0  # not an action: ignored, not acknowledged
        remote._handle_message(remote, {"action": "stop"}, [])
        assert remote.ack_seq == 1
    finally:
        release.set()  # the step running ends: the stop lands at its boundary
    assert handle.wait(30) == "suspended"
    assert handle.info()["stop_source"] == "panel"
    panel.refresh()
    assert remote.stop_disabled and remote.force_disabled  # nothing live to stop or force
    assert "there is nothing to stop" in remote.stop_tooltip


def test_a_click_drawn_before_a_resume_is_refused_not_applied_to_the_new_session(
    server: lab.LabServer, owner: Any, store_path: Any
) -> None:
    process = owner("fenced", 0.2)
    epoch = step_epoch(store_path, "fenced")
    body = {"run_id": "fenced", "store": str(store_path), "epoch": epoch + 1}
    status, answer = post(server, "stop", body)  # a panel drawn in another session
    assert status == 409 and "was resumed or taken over" in answer["message"]
    assert all(kind != "stop_requested" for kind, _ in events(store_path, "fenced"))
    status, answer = post(server, "stop", {**body, "epoch": epoch})
    assert status == 200 and answer["status"] == "stopping"
    assert wait_status(process) == "suspended"


def step_epoch(store_path: Any, run_id: str) -> int:
    import kernelext as kx

    store = kx.open_store(str(store_path))
    try:
        return int(store.get_run(run_id)["owner_epoch"])
    finally:
        store.close()


@pytest.mark.duckdb_only
def test_a_duckdb_file_that_is_not_a_store_is_refused_and_left_as_it_was(
    server: lab.LabServer, tmp_path: Path
) -> None:
    import duckdb

    blank = tmp_path / "blank.duckdb"
    duckdb.connect(str(blank)).close()
    before = (blank.stat().st_size, blank.stat().st_mode)
    status, answer = post(server, "stop", {"run_id": "r", "store": str(blank)})
    assert status == 400 and "is not a kernelext store" in answer["message"]
    assert (blank.stat().st_size, blank.stat().st_mode) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blank.duckdb"]


@pytest.mark.duckdb_only
def test_a_store_held_elsewhere_records_the_stop_beside_it_and_never_holds_up_another(
    server: lab.LabServer, owner: Any, store_path: Any, tmp_path: Path
) -> None:
    """The click is recorded beside the held store (``mailbox``) and the run suspends while
    the file is still held; a run the store does not know still answers busy."""
    from support.store_holder import hold_store

    import kernelext as kx

    other = tmp_path / "other" / "store.duckdb"
    other_store = kx.open_store(str(other))
    other_store.close()
    process = owner("held", 0.2)
    holder = hold_store(str(store_path))
    try:
        answers: dict[str, tuple[int, Any]] = {}
        slow = threading.Thread(
            target=lambda: answers.update(
                held=post(server, "stop", {"run_id": "held", "store": str(store_path)})
            )
        )
        slow.start()
        time.sleep(0.3)  # the first click waits a moment for the held file...
        quick = post(server, "stop", {"run_id": "nothing-here", "store": str(other)})
        assert quick[0] == 404  # ...and a click on another store is answered meanwhile
        slow.join(60)
        status, answer = answers["held"]
        assert status == 200 and answer["recorded"], answer
        assert "the store is busy" in answer["message"] and "next safe point" in answer["message"]
        assert process.stdout is not None
        assert process.stdout.readline().split() == ["status", "suspended"]  # file still held
        assert holder.running
        status, answer = post(server, "stop", {"run_id": "unknown", "store": str(store_path)})
        assert status == 503 and "busy in another process" in answer["message"]
        assert answer["route"] == "kernelext"  # the panel then tries the kernel's own route
    finally:
        holder.send("release")
        holder.close()
    process.communicate(timeout=120)  # the owner ends: its records are in the tables
    assert process.returncode == 0
    status, answer = post(server, "stop", {"run_id": "held", "store": str(store_path)})
    assert status == 200 and answer["status"] == "suspended"
    assert events(store_path, "held").count(("stop_requested", "panel")) == 2  # each click


def test_malformed_bodies_get_the_same_clear_refusal(server: lab.LabServer) -> None:
    too_big = json.dumps({"run_id": "r", "store": "x" * (70 * 1024)}).encode()
    status, answer = post(server, "stop", too_big)  # refused by its length, before reading
    assert status == 413 and "larger than 64 KiB" in answer["message"], answer
    deep = b"[" * 30_000 + b"]" * 30_000  # under the limit, too deep to read
    for body in (deep, {"run_id": "r", "store": "/x", "epoch": "1"}):
        status, answer = post(server, "stop", body)
        assert status == 400 and '"run_id"' in answer["message"], answer
        assert answer["route"] == "kernelext"


def test_a_password_in_a_malformed_address_is_never_echoed(server: lab.LabServer) -> None:
    status, answer = post(
        server, "stop", {"run_id": "r", "store": "postgres://kx:s3cr%et@127.0.0.1:1/db"}
    )
    assert status >= 400 and "s3cr" not in json.dumps(answer)
    assert "s3cr" not in server.log_tail(50)


@pytest.mark.duckdb_only
def test_a_force_after_a_stop_dated_by_a_clock_ahead_still_lands(
    server: lab.LabServer, owner: Any, store_path: Any
) -> None:
    """Force requests are counted in the order they were written, not by their dates."""
    import datetime as dt

    from kernelext._store import open_store

    process = owner("skewed", 60.0)
    ahead = open_store(
        str(store_path),
        clock=lambda: (
            dt.datetime.now(dt.timezone.utc).replace(tzinfo=None) + dt.timedelta(seconds=30)
        ),
    )
    try:
        ahead.request_stop("skewed", source="skewed-clock")
    finally:
        ahead.close()
    status, answer = post(server, "force", {"run_id": "skewed", "store": str(store_path)})
    assert status == 200, answer
    assert wait_status(process) == "suspended"
    steps = step_rows(store_path, "skewed")
    assert [(s["status"], s["forced"]) for s in steps] == [("cancelled", True)]


def test_an_approval_decided_through_the_server_resumes_where_the_run_waits(
    server: lab.LabServer, store: Any, store_path: Any
) -> None:
    """Approve is recorded by the server (the kernel may be busy), once; the card then asks
    its kernel to resume the run, which pays exactly once."""
    import kernelext as kx
    from kernelext.widgets._approvals import ApprovalCard

    paid: list[int] = []

    @kx.effect(needs_approval=True)
    def pay(amount: int) -> str:
        paid.append(amount)
        return "paid"

    @kx.agent(name="approver")
    def approver(run: kx.Run) -> None:
        with run.step("pay"):
            pay(500)

    handle = approver.start(run_id="approve-through-server")
    assert handle.wait(60) == "suspended"
    (request,) = kx.approvals("approve-through-server")
    other = {"run_id": "fenced", "store": str(store_path), "request": str(request.id)}
    status, answer = post(server, "approve", other)
    assert status == 404  # a run this store does not hold
    wrong = {**other, "run_id": "approve-through-server", "request": str(uuid.uuid4())}
    status, answer = post(server, "approve", wrong)
    assert status == 400 and "has no approval request" in answer["message"]
    body = {
        "run_id": "approve-through-server",
        "store": str(store_path),
        "request": str(request.id),
        "note": "invoice checked",
    }
    status, answer = post(server, "approve", body)
    assert status == 200, answer
    assert answer["decision"] == "approved" and "goes on as soon as its kernel" in answer["message"]
    status, answer = post(server, "reject", body)  # decided already: one decision wins
    assert status == 409 and answer["route"] == "kernelext"
    assert paid == []  # recorded, not yet resumed: the kernel does that
    (row,) = [r for r in store.approval_rows(run_id="approve-through-server")]
    assert (row["decision"], row["note"]) == ("approved", "invoice checked")
    decided = ApprovalCard(_approval(store, row))
    decided.buttons._handle_message(decided.buttons, {"action": "resume"}, [])
    assert decided.buttons.ack_seq == 1 and decided.buttons.decided
    assert decided.handle is not None and decided.handle.wait(60) == "completed"
    assert paid == [500]


def _approval(store: Any, row: dict[str, Any]) -> Any:
    from kernelext._core.people.approvals import Approval

    return Approval(store, row)


def test_the_fence_is_checked_in_the_transaction_that_records_the_stop(store_path: Any) -> None:
    """A panel's epoch is a fencing token: the store refuses a stop whose epoch is not the
    run's own in the same transaction that would write it (no window between the check and
    the write), and leaves the run as it was."""
    import kernelext as kx
    from kernelext._store import actor
    from kernelext.errors import OwnershipLost

    store = kx.open_store(str(store_path))
    try:
        assert store.create_run("fenced-tx", "agent", owner=actor())
        epoch = int(store.get_run("fenced-tx")["owner_epoch"])
        before = store.get_run("fenced-tx")["status"]
        with pytest.raises(OwnershipLost):
            store.request_stop("fenced-tx", source="panel", epoch=epoch + 1)
        assert store.get_run("fenced-tx")["status"] == before
        assert store.request_stop("fenced-tx", source="panel", epoch=epoch).ok
    finally:
        store.close()
