"""The notebook's interrupt button (SIGINT in a real kernel) as a soft stop.

``km.interrupt_kernel()`` is what JupyterLab's interrupt button does. Agents in these
tests block on events that later cells set, so every ordering is decided by the test,
not by timing.
"""

from __future__ import annotations

import ast
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from ipykernel.kernelbase import Kernel
from support.kernels import KernelSession

pytestmark = pytest.mark.slow

AGENT = """
import pathlib, threading, time
import kernelext as kx
from kernelext.widgets import panel_for
go = threading.Event()
release = threading.Event()
entered = threading.Event()

@kx.effect
def hold():
    entered.set()
    while not release.is_set():   # a long call; a forced stop lands between bytecodes
        time.sleep(0.01)
    return "done"

@kx.agent(name="gated")
def gated(run, n):
    for i in run.steps(range(n)):
        entered.set()
        go.wait(60)

@kx.agent(name="holding")
def holding(run):
    with run.step("call"):
        hold()

handler = get_ipython().kernel.saved_sigint_handler

def watch_presses(folder):
    # Touch folder/press-<k> once the handler recorded its k-th press.
    def watch():
        seen = 0
        while True:
            while len(handler.presses) > seen:
                seen += 1
                pathlib.Path(folder, f"press-{seen}").touch()
            time.sleep(0.01)
    threading.Thread(target=watch, daemon=True, name="test-presses").start()
"""


@pytest.fixture
def kernel(store_path: Path) -> Iterator[KernelSession]:
    with KernelSession() as session:
        session.run("%load_ext kernelext").ok()
        session.run(AGENT).ok()
        yield session


def events(session: KernelSession, run_id: str) -> list[tuple[str, str]]:
    """(kind, source) of every event of ``run_id``, read inside the kernel."""
    reply = session.run(
        "from kernelext._core.process.runtime import get_store\n"
        f"print([(e['kind'], e['source']) for e in get_store().events({run_id!r})])"
    )
    return list(ast.literal_eval(reply.ok().stdout.strip()))


def start_busy_cell(session: KernelSession, marker: Path) -> str:
    """Start a long cell and return once it is executing (it touches ``marker``)."""
    request = session.send(
        f"import pathlib, time\npathlib.Path({str(marker)!r}).touch()\ntime.sleep(60)"
    )
    deadline = time.monotonic() + 60
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert marker.exists(), "the long cell never started"
    return request


def wait_entered(session: KernelSession) -> None:
    session.run("assert entered.wait(30); entered.clear()").ok()


def press(session: KernelSession, folder: Path, k: int) -> None:
    """Press the interrupt button for the ``k``-th time and return once the handler recorded
    that press (``watch_presses``). Nothing is sent to the kernel meanwhile:
    a cell started while the SIGINT waits to be handled would take it as its own."""
    session.interrupt()
    marker = folder / f"press-{k}"
    deadline = time.monotonic() + 60
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert marker.exists(), f"press {k} was never handled"


# -- the ipykernel internals this relies on ---------------------------------------------------
def test_ipykernel_saves_and_restores_the_sigint_handler_around_each_message() -> None:
    """kernelext puts its handler in ``kernel.saved_sigint_handler``; ipykernel must keep
    installing ``default_int_handler`` for a message and restore the saved one after."""
    kernel = Kernel()
    previous = signal.getsignal(signal.SIGINT)

    def ours(signum: int, frame: object) -> None:
        pass

    try:
        signal.signal(signal.SIGINT, ours)
        kernel.pre_handler_hook()
        assert kernel.saved_sigint_handler is ours
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        kernel.saved_sigint_handler = signal.SIG_IGN  # what the extension replaces
        kernel.post_handler_hook()
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


def test_extension_takes_the_slot_in_a_real_kernel_and_gives_it_back(kernel: KernelSession) -> None:
    reply = kernel.run(
        "import signal\n"
        "print(type(handler).__name__, signal.getsignal(signal.SIGINT) is "
        "signal.default_int_handler)"
    ).ok()
    assert reply.stdout.split() == ["InterruptHandler", "True"]  # a cell still gets ^C
    kernel.run("%unload_ext kernelext").ok()
    reply = kernel.run("print(get_ipython().kernel.saved_sigint_handler == signal.SIG_IGN)")
    assert reply.ok().stdout.strip() == "True"
    kernel.run("h = gated.start(2, run_id='after-unload')").ok()
    wait_entered(kernel)
    kernel.interrupt()  # no longer ours: ipykernel ignores SIGINT between messages
    time.sleep(0.3)
    assert kernel.run("print(h.status); go.set(); print(h.wait(30))").ok().stdout.split() == [
        "running",
        "completed",
    ]


# -- soft stop, force, and the usual behaviour ----------------------------------------------
def test_first_press_is_a_soft_stop(kernel: KernelSession, tmp_path: Path) -> None:
    kernel.run(f"watch_presses({str(tmp_path)!r})").ok()
    kernel.run("h = gated.start(3, run_id='soft')\nh").ok()
    wait_entered(kernel)
    press(kernel, tmp_path, 1)
    reply = kernel.run(
        "handler.wait_idle()\npanel = panel_for(h)\nprint(h.status)\n"
        "print(panel.refresh().stop_text())"
    ).ok()
    status, badge = reply.stdout.strip().splitlines()
    assert status == "stopping"
    assert badge.startswith("stop pending since ") and badge.endswith("(interrupt)")
    reply = kernel.run("go.set(); print(h.wait(30)); print(handler.presses[-1][1])").ok()
    assert reply.stdout.split() == ["suspended", "stop"]
    assert events(kernel, "soft") == [
        ("created", "api"),
        ("stop_requested", "interrupt"),
        ("suspended", "interrupt"),
    ]
    assert "suspended" in kernel.run("print(panel.refresh().status)").ok().stdout


def test_a_second_press_forces_the_stop_and_a_third_cuts_the_call_in_flight(
    kernel: KernelSession, tmp_path: Path
) -> None:
    # Each press is handled before the next is made (two SIGINTs that arrive before the
    # main thread looks are handled as one), and all three fall within the window however
    # long a busy machine takes between them.
    kernel.run("%config Kernelext.interrupt_window = 60").ok()
    kernel.run(f"watch_presses({str(tmp_path)!r})").ok()
    kernel.run("h = holding.start(run_id='forced')").ok()
    wait_entered(kernel)
    press(kernel, tmp_path, 1)
    press(kernel, tmp_path, 2)  # forces: it waits for the call in flight to return...
    press(kernel, tmp_path, 3)  # ...and a press again cuts it
    reply = kernel.run(
        "try:\n    print(h.wait(30))\nfinally:\n    release.set()\n"
        "print([p[1] for p in handler.presses])\n"
        "from kernelext._core.lifecycle.run import engine_of\n"
        "print([e['status'] for e in engine_of(h.run).effects.values()])\n"
        "print([s['forced'] for s in h.steps()])"
    ).ok()
    assert reply.stdout.splitlines() == [
        "suspended",
        "['stop', 'force', 'force']",
        "['unknown']",
        "[True]",
    ]
    kinds = events(kernel, "forced")
    assert ("force_requested", "interrupt") in kinds and ("stop_forced", "interrupt") in kinds


def test_a_press_after_the_window_is_another_soft_stop(
    kernel: KernelSession, tmp_path: Path
) -> None:
    kernel.run("%config Kernelext.interrupt_window = 0.3").ok()
    kernel.run(f"watch_presses({str(tmp_path)!r})").ok()
    kernel.run("h = gated.start(2, run_id='slow-presses')").ok()
    wait_entered(kernel)
    press(kernel, tmp_path, 1)
    # The window counts from the first press as the handler stamped it, not from when it
    # was sent: wait in the kernel until it has passed (a press handled late shortens it).
    kernel.run("while time.monotonic() - handler.presses[-1][0] <= 0.3:\n    time.sleep(0.01)").ok()
    press(kernel, tmp_path, 2)
    # Each press's stop is recorded by a worker thread: both recorded before the run goes on.
    reply = kernel.run(
        "handler.wait_idle(60); print([p[1] for p in handler.presses]); go.set(); print(h.wait(30))"
    ).ok()
    assert reply.stdout.splitlines() == ["['stop', 'stop']", "suspended"]
    kinds = [k for k, _ in events(kernel, "slow-presses")]
    assert "force_requested" not in kinds and kinds.count("stop_requested") == 2


def test_without_a_live_agent_the_button_behaves_as_usual(
    kernel: KernelSession, tmp_path: Path
) -> None:
    kernel.interrupt()  # idle, nothing running: ignored
    time.sleep(0.3)
    assert kernel.run("print('still here')").ok().stdout.strip() == "still here"
    request = start_busy_cell(kernel, tmp_path / "busy")
    kernel.interrupt()
    reply = kernel.collect(request)
    assert reply.status == "error" and reply.error is not None
    assert reply.error["ename"] == "KeyboardInterrupt"


def test_a_running_cell_owns_the_press_even_while_an_agent_runs(
    kernel: KernelSession, tmp_path: Path
) -> None:
    kernel.run("h = gated.start(2, run_id='busy')").ok()
    wait_entered(kernel)
    request = start_busy_cell(kernel, tmp_path / "busy")
    kernel.interrupt()
    reply = kernel.collect(request)
    assert reply.error is not None and reply.error["ename"] == "KeyboardInterrupt"
    assert kernel.run("print(h.status); go.set(); print(h.wait(30))").ok().stdout.split() == [
        "running",
        "completed",
    ]


def test_loaded_at_kernel_start_the_handler_is_installed_directly(
    store_path: Path, tmp_path: Path
) -> None:
    with KernelSession(extra_arguments=["--IPKernelApp.extensions=kernelext"]) as session:
        session.run(AGENT).ok()
        session.run(f"watch_presses({str(tmp_path)!r})").ok()
        session.run("h = gated.start(2, run_id='at-start')").ok()
        wait_entered(session)
        press(session, tmp_path, 1)
        reply = session.run(
            "handler.wait_idle(); print(type(handler).__name__, h.status); "
            "go.set(); print(h.wait(30))"
        ).ok()
        assert reply.stdout.split() == ["InterruptHandler", "stopping", "suspended"]
