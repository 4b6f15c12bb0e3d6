"""One owner per run across real processes (issue 19 item 4), with the real HTTP server.

Two kernels on one ``%%agent`` run, and an agent-run owner frozen past its lease
(SIGSTOP), taken over by another process, then let go again (SIGCONT): each call is made
exactly once, and the stale owner gets a clear ``OwnershipLost``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from support.http_server import DeliveryServer
from support.kernels import KernelSession

pytestmark = [pytest.mark.slow, pytest.mark.both_backends]

PAY = """
import json, urllib.request
import kernelext as kx

@kx.effect
def pay(to, amount, *, idempotency_key=None):
    body = json.dumps({{"to": to, "amount": amount}}).encode()
    req = urllib.request.Request({url!r} + "/pay", data=body, headers={{
        "Idempotency-Key": idempotency_key, "Content-Type": "application/json"}})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return resp.status
"""


def _kernel(store_path: Any, url: str) -> KernelSession:
    kernel = KernelSession(env={"KERNELEXT_STORE": str(store_path)})
    kernel.run("%load_ext kernelext").ok()
    kernel.run(PAY.format(url=url)).ok()
    return kernel


def _error_text(reply: Any) -> str:
    error = reply.error or {}
    return f"{error.get('ename')}: {error.get('evalue')}\n{reply.stdout}{reply.stderr}"


def test_two_kernels_on_one_cell_run_pay_once(
    store_path: Any, delivery_server: DeliveryServer
) -> None:
    """The issue as seen on main: A stops the run, B resumes it and pays, A (trusting its
    cached state) runs the same cell: refused, nothing sent, and A is told who owns it."""
    with contextlib.ExitStack() as stack:
        first = stack.enter_context(_kernel(store_path, delivery_server.url))
        second = stack.enter_context(_kernel(store_path, delivery_server.url))
        first.run("%%agent payroll --step setup\nrun.state['n'] = 1").ok()
        assert "suspended" in first.run("print(kx.stop('payroll'))").ok().text
        second.run("%agent resume payroll").ok()
        second.run("%%agent payroll --step pay\npay('bob', 500)").ok()
        assert delivery_server.count(path="/pay") == 1

        stale = first.run("%%agent payroll --step pay\npay('bob', 500)")
        text = _error_text(stale)
        assert stale.status == "error", text
        assert "is owned by" in text and "%agent resume payroll" in text, text
        assert "ownership epoch 2" in text, text
        # Its next cell, whatever it is, is refused too: nothing half-done.
        again = first.run("%%agent payroll --step other\npay('carol', 1)")
        said = _error_text(again)
        assert again.status == "error" and ("is owned by" in said or "is live in" in said)
        time.sleep(0.5)
        assert delivery_server.count(path="/pay") == 1
        keys = {d["idempotency_key"] for d in delivery_server.deliveries}
        assert len(keys) == 1
        # The ledger has the one call, applied, and the run goes on in the second kernel.
        rows = second.run(
            "print(kx.sql(\"SELECT tool, status FROM effects WHERE run_id = 'payroll'\")"
            ".to_dict('records'))"
        ).ok()
        assert "[{'tool': 'pay', 'status': 'applied'}]" in rows.text
        second.run("%%agent payroll --step after\nrun.state['n'] = 2").ok()


SCRIPT = """
import os, sys, time
import kernelext as kx
import kernelext._core.lifecycle.worker as worker
import kernelext._core.process.lease as lease

lease.LEASE_SECONDS = 1.5  # lapsed while it waits in step "a"
if sys.argv[1] == "first":
    # Its lease is renewed at the start only, as if frozen from then on (the monitor would
    # renew it 10 s in: before the second process, slow to start, took the run over).
    renew, renewed = worker._renew_lease, set()

    def renew_once(store, run_id):
        if run_id not in renewed:
            renewed.add(run_id)
            renew(store, run_id)

    worker._renew_lease = renew_once
{pay}

@kx.agent(name="payer")
def payer(run, items):
    for item in run.steps(items):
        if sys.argv[1] == "first":
            print("ready", item, flush=True)
            # Frozen in here (SIGSTOP), past its lease, until the test lets it go on
            # (the marker is created just before SIGCONT).
            deadline = time.monotonic() + 60
            while not os.path.exists(sys.argv[2]):
                if time.monotonic() > deadline:
                    print("the test never let step a go on", flush=True)
                    os._exit(3)  # not a pass by timeout
                time.sleep(0.01)
        pay(item, 100)

if sys.argv[1] == "first":
    h = payer.start(["a", "b", "c"], run_id="frozen")
else:
    h = kx.resume("frozen")
status = h.wait(120)
print("status", status, type(h.error).__name__ if h.error else None, flush=True)
print("error", h.error, flush=True)
"""


def _holder(store_path: Any) -> int | None:
    """The PID holding the DuckDB store file (its lock file names it)."""
    try:
        info = json.loads(Path(f"{store_path}.lock").read_text() or "{}")
    except (OSError, ValueError):
        return None
    pid = info.get("pid")
    return pid if isinstance(pid, int) else None


def _stopped(pid: int) -> bool:
    """Has every thread of ``pid`` stopped (SIGSTOP takes effect a moment after kill)?"""
    states = []
    for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
        with contextlib.suppress(OSError):
            states.append(stat.read_text().rpartition(")")[2].split()[0])
    return bool(states) and all(state in "Tt" for state in states)


def _freeze_once_handed_over(first: int, second: int, store_path: Any) -> None:
    """SIGSTOP ``first`` at a moment the DuckDB file is not its own: the first process
    still looks into the store for stops, so the file goes back and forth between them."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        while _holder(store_path) != second and time.monotonic() < deadline:
            time.sleep(0.002)
        os.kill(first, signal.SIGSTOP)
        while not _stopped(first) and time.monotonic() < deadline:
            time.sleep(0.002)
        if _holder(store_path) != first:
            return
        os.kill(first, signal.SIGCONT)  # it took the file back just before: again
    raise AssertionError("the second process never took the store file over")


def test_an_owner_frozen_past_its_lease_cannot_pay_after_a_take_over(
    store_path: Any, delivery_server: DeliveryServer, tmp_path: Path
) -> None:
    script = tmp_path / "payer.py"
    script.write_text(SCRIPT.format(pay=PAY.format(url=delivery_server.url)))
    env = {**os.environ, "KERNELEXT_STORE": str(store_path)}
    go_on = tmp_path / "go-on"  # the first process stays in step "a" until this exists
    first = subprocess.Popen(
        [sys.executable, str(script), "first", str(go_on)],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert first.stdout is not None
        assert first.stdout.readline().strip() == "ready a"
        time.sleep(2.0)  # its lease (1.5 s) lapsed while it waits in step "a"
        postgres = str(store_path).startswith("postgresql")
        if postgres:
            os.kill(first.pid, signal.SIGSTOP)  # frozen
        second = subprocess.Popen(
            [sys.executable, str(script), "second"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        if not postgres:
            # A process frozen while it holds the DuckDB file blocks every other one (they
            # wait KERNELEXT_STORE_WAIT, then StoreLockedError): freeze the first process
            # once it handed the file over to the second.
            _freeze_once_handed_over(first.pid, second.pid, store_path)
        said, err = second.communicate(timeout=120)
        assert "status completed None" in said, said + err
        assert delivery_server.count(path="/pay") == 3
        go_on.touch()
        os.kill(first.pid, signal.SIGCONT)
        out, _ = first.communicate(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(first.pid, signal.SIGCONT)
        if first.poll() is None:
            first.kill()
            first.wait()
        if first.stdout is not None:
            first.stdout.close()
    assert "OwnershipLost" in out, out
    assert "is owned by" in out and "kx.resume('frozen')" in out, out
    assert "effect intent was refused" in out, out
    time.sleep(0.3)
    assert delivery_server.count(path="/pay") == 3
    assert len({d["idempotency_key"] for d in delivery_server.deliveries}) == 3


SLOW_PAY = """
import json, os, time, urllib.request
import kernelext as kx
import kernelext._core.process.lease as lease
lease.LEASE_SECONDS = 1.5  # a take-over's lease; cell runs never renew it

def lookup(key, args):
    with urllib.request.urlopen({url!r} + "/deliveries?key=" + str(key), timeout=10) as r:
        return "applied" if json.load(r)["applied"] else "not_applied"

@kx.effect(probe=lookup)
def slow_pay(to, *, idempotency_key=None):
    time.sleep({slow})  # a slow API: the request goes out late
    body = json.dumps({{"to": to}}).encode()
    req = urllib.request.Request({url!r} + "/pay", data=body, headers={{
        "Idempotency-Key": idempotency_key, "Content-Type": "application/json"}})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return resp.status
"""


def test_a_live_kernel_inside_a_call_is_not_taken_over_when_its_lease_lapses(
    store_path: Any, delivery_server: DeliveryServer
) -> None:
    """A kernel resumed a cell run (its lease is never renewed) and is inside a slow call
    when the lease lapses: another kernel's resume is refused (the owner is alive), so the
    call is made once, by the kernel that recorded its intent."""
    with contextlib.ExitStack() as stack:
        kernels = []
        for slow in (4.0, 0.0):
            kernel = stack.enter_context(KernelSession(env={"KERNELEXT_STORE": str(store_path)}))
            kernel.run("%load_ext kernelext").ok()
            kernel.run(SLOW_PAY.format(url=delivery_server.url, slow=slow)).ok()
            kernels.append(kernel)
        first, second = kernels
        second.run("%%agent payroll --step setup\nrun.state['n'] = 1").ok()
        second.run("%agent stop payroll").ok()
        first.run("%agent resume payroll").ok()
        cell = "%%agent payroll --step pay\nslow_pay('bob')"
        request = first.send(cell)  # intent written, the POST 4 s later
        time.sleep(2.5)  # the lease (1.5 s) lapsed; the first kernel is alive, in the call
        taken = second.run("%agent resume payroll")
        said = _error_text(taken)
        assert "never taken over while it lives" in said, said
        again = second.run(cell)
        assert again.status == "error", _error_text(again)
        assert first.collect(request, timeout=30).status == "ok"
        time.sleep(0.5)
        assert delivery_server.count(path="/pay") == 1
