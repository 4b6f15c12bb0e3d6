"""The Stop lands whatever the kernel is doing, clicked as a person in real JupyterLab.

- Run → Run All Cells over ``%%agent`` cells, the panel's Stop clicked during a cell: the
  click travels through the notebook server (kernelext's server extension), not the
  kernel's queue, so the request is in the store at once, the panel says "stop pending"
  while the cell still runs, and the queued ``%%agent`` cells do not run.
- A background agent stopped from its panel while the kernel sleeps in the user's cell.
- The notebook's ■ on a ``%%agent`` cell: once lets the cell finish and skips the next
  ``%%agent`` cells; twice cancels the cell.
- Force stop pressed while a recorded call blocks: the panel says it waits for the call,
  and the call that returns keeps its real outcome (``applied``).

Each test prints the measured times (click → request in the store, click → "stop
pending" on screen); screenshots go to tests/artifacts/browser/<test name>/.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

from browser import jupyterlab as lab
from browser.harness import (
    PANEL,
    click,
    executing,
    lab_root,
    opened_in_lab,
    output,
    run_all,
    run_to_panel,
    sleeping_until,
    start_sleeping,
    store_report,
    write_notebook,
)

pytestmark = [pytest.mark.browser, pytest.mark.slow]

PENDING = re.compile(r"stop pending since .* \((panel|interrupt)\)")


def interrupt(page: Any) -> None:
    """The notebook toolbar's ■ (Interrupt the kernel)."""
    page.locator(f"{lab.NOTEBOOK} jp-button[data-command='notebook:interrupt-kernel']").click()


LONG_GATE = "long-cell.done"  # in the notebook's folder: made after the test's checks


def run_all_cells(gate: Path) -> list[str]:
    return [
        "%load_ext kernelext\nimport os, time",
        "%%agent runall --step first\nrun.state['done'] = ['first']",
        "%agent status runall",
        "%%agent runall --step long\nprint('long cell started', flush=True)\n"
        f"deadline = time.monotonic() + 120\nwhile not os.path.exists({str(gate)!r})"
        " and time.monotonic() < deadline:\n    time.sleep(0.1)\n"
        "run.state['done'].append('long')",
        "%%agent runall --step third\nrun.state['done'].append('third')\nprint('third ran')",
        "%%agent runall --step fourth\nrun.state['done'].append('fourth')\nprint('fourth ran')",
    ]


def test_run_all_stop_clicked_during_a_cell_skips_the_queued_cells(
    tmp_path: Path, store_path: Path, page: Any, shots_folder: Path
) -> None:
    root = lab_root(tmp_path)
    gate = root / LONG_GATE
    name = write_notebook(root, "run_all.ipynb", run_all_cells(gate))
    env = {"KERNELEXT_STORE": str(store_path)}
    with opened_in_lab(page, shots_folder, root, name, env) as (server, shot):
        run_all(page)
        long_cell = lab.cell(page, 3)
        output(long_cell).get_by_text("long cell started").wait_for()
        panel = lab.cell(page, 2).locator(PANEL)
        clicked, click_t = click(lab.button(panel, "Stop"))
        panel.get_by_text(re.compile("Stop recorded \\(panel\\)")).wait_for(timeout=5_000)
        note_s = time.monotonic() - click_t
        panel.get_by_text(PENDING).wait_for(timeout=5_000)
        pending_s = time.monotonic() - click_t
        assert executing(long_cell), "the stop must show while the long cell still runs"
        shot("stop-pending-while-the-cell-runs")
        gate.touch()  # the long cell ends: the stop lands after it

        third = lab.cell(page, 4)
        output(third).get_by_text(re.compile(r"run 'runall' is suspended")).wait_for()
        lab.wait_kernel_idle(page)
        assert "third ran" not in lab.output_text(third)
        assert "fourth ran" not in lab.output_text(lab.cell(page, 5))
        assert "completed; run 'runall' is now suspended" in lab.output_text(long_cell)
        panel.get_by_text(re.compile(r"suspended")).first.wait_for()
        shot("suspended-and-the-queued-cells-skipped")

        stops, steps = store_report(page, "runall")
        server_line = re.findall(
            r"kernelext: stop of run runall recorded in .*", server.log_tail(400)
        )
        assert [s for s, _ in stops] == ["panel"]
        in_store_s = (stops[0][1] - clicked).total_seconds()
        assert steps == [("first", "completed"), ("long", "completed")]
    print(
        f"\nRun All + panel Stop: request in the store {in_store_s:.3f} s after the click; "
        f"the click's answer shown after {note_s:.3f} s; 'stop pending' in the panel after "
        f"{pending_s:.3f} s; server: {server_line}"
    )


SLEEPER_GATE = "sleeper.done"  # in the notebook's folder: made after the test's checks


def background_cells(gate: Path) -> list[str]:
    return [
        "%load_ext kernelext\nimport time\nimport kernelext as kx",
        """@kx.agent(name="slow-steps")
def slow_steps(run):
    for i in run.steps(range(600), key=str):  # 5 min: running at the click, however slow
        time.sleep(0.5)""",
        'h = slow_steps.start(run_id="background")\nh',
        sleeping_until(gate),
    ]


def test_background_agent_stops_from_its_panel_while_the_kernel_sleeps(
    tmp_path: Path, store_path: Path, page: Any, shots_folder: Path
) -> None:
    root = lab_root(tmp_path)
    gate = root / SLEEPER_GATE
    name = write_notebook(root, "background.ipynb", background_cells(gate))
    env = {"KERNELEXT_STORE": str(store_path)}
    with opened_in_lab(page, shots_folder, root, name, env) as (_server, shot):
        panel = run_to_panel(page, 3)
        sleeper = start_sleeping(page, 3)
        clicked, click_t = click(lab.button(panel, "Stop"))
        panel.get_by_text(PENDING).or_(
            panel.get_by_text("suspended: stopped by you (panel)")
        ).first.wait_for(timeout=5_000)
        shown_s = time.monotonic() - click_t
        panel.get_by_text("suspended: stopped by you (panel)").first.wait_for(timeout=10_000)
        suspended_s = time.monotonic() - click_t
        assert executing(sleeper), "the run must stop while the user's cell still sleeps"
        shot("suspended-while-the-kernel-sleeps")
        gate.touch()  # the user's cell ends
        lab.wait_cell_done(sleeper, 60_000)
        stops, _steps = store_report(page, "background")
        assert [s for s, _ in stops] == ["panel"]
        in_store_s = (stops[0][1] - clicked).total_seconds()
    print(
        f"\nbackground agent, kernel in time.sleep: request in the store {in_store_s:.3f} s "
        f"after the click; pending or suspended shown after {shown_s:.3f} s; suspended "
        f"after {suspended_s:.3f} s"
    )


SOFT_GATE = "slow-cell.done"  # in the notebook's folder: made once the stop shows in the cell


def interrupt_cells(gate: Path) -> list[str]:
    # The window is the test's own: it is about two presses, not about how long the
    # window lasts, and a loaded machine can take seconds to show the first press.
    return [
        "%load_ext kernelext\nimport os, time\n%config Kernelext.interrupt_window = 60",
        "%%agent soft --step slow\nprint('slow cell started', flush=True)\n"
        f"deadline = time.monotonic() + 120\nwhile not os.path.exists({str(gate)!r})"
        " and time.monotonic() < deadline:\n    time.sleep(0.1)\nprint('slow cell finished')",
        "%%agent soft --step after\nprint('after ran')",
        "%%agent hard --step stuck\nprint('stuck cell started', flush=True)\ntime.sleep(60)\n"
        "print('stuck cell finished')",
    ]


def test_interrupt_once_is_a_soft_stop_and_twice_cancels_the_cell(
    tmp_path: Path, store_path: Path, page: Any, shots_folder: Path
) -> None:
    root = lab_root(tmp_path)
    gate = root / SOFT_GATE
    name = write_notebook(root, "interrupt.ipynb", interrupt_cells(gate))
    env = {"KERNELEXT_STORE": str(store_path)}
    with opened_in_lab(page, shots_folder, root, name, env) as (_server, shot):
        run_all(page)
        slow = lab.cell(page, 1)
        output(slow).get_by_text("slow cell started").wait_for()
        interrupt(page)
        output(slow).get_by_text(re.compile(r"stop requested \(■\)")).wait_for(timeout=5_000)
        assert executing(slow), "the stop must show while the slow cell still runs"
        gate.touch()  # the slow cell ends: the stop lands after it
        output(slow).get_by_text("slow cell finished").wait_for()
        after = lab.cell(page, 2)
        output(after).get_by_text(re.compile(r"run 'soft' is suspended")).wait_for()
        lab.wait_kernel_idle(page)
        assert "after ran" not in lab.output_text(after)
        assert "KeyboardInterrupt" not in lab.output_text(slow)
        shot("soft-stop-after-one-press")

        stuck = lab.select_cell(page, 3)
        page.keyboard.press("Control+Enter")
        output(stuck).get_by_text("stuck cell started").wait_for()
        pressed = time.monotonic()
        interrupt(page)
        output(stuck).get_by_text(re.compile(r"stop requested \(■\)")).wait_for(timeout=5_000)
        interrupt(page)
        output(stuck).get_by_text(re.compile(r"interrupted: .* was cancelled")).wait_for(
            timeout=10_000
        )
        cancelled_s = time.monotonic() - pressed
        assert "stuck cell finished" not in lab.output_text(stuck)
        shot("cancelled-after-two-presses")
        _stops, steps = store_report(page, "hard")
        assert steps == [("stuck", "cancelled")]
    print(f"\n■ twice on a %%agent cell: cancelled {cancelled_s:.3f} s after the first press")


def test_notebook_7_stop_lands_while_the_kernel_sleeps(
    tmp_path: Path, store_path: Path, page: Any, shots_folder: Path
) -> None:
    """The same click in Notebook 7's interface (the route is the server's, not Lab's)."""
    root = lab_root(tmp_path)
    gate = root / SLEEPER_GATE
    name = write_notebook(root, "notebook7.ipynb", background_cells(gate))
    env = {"KERNELEXT_STORE": str(store_path)}
    with opened_in_lab(page, shots_folder, root, name, env, lab.open_notebook_7) as (_server, shot):
        panel = run_to_panel(page, 3)
        sleeper = start_sleeping(page, 3)
        _clicked, click_t = click(lab.button(panel, "Stop"))
        panel.get_by_text("suspended: stopped by you (panel)").first.wait_for(timeout=10_000)
        suspended_s = time.monotonic() - click_t
        assert executing(sleeper), "the run must stop while the user's cell still sleeps"
        shot("notebook-7-suspended-while-the-kernel-sleeps")
        gate.touch()  # the user's cell ends
    print(
        f"\nNotebook 7, kernel in time.sleep: suspended shown {suspended_s:.3f} s after the click"
    )


FORCE_CELLS = [
    "%load_ext kernelext\nimport json, time, urllib.request\nimport kernelext as kx",
    """@kx.effect
def pay(amount):
    request = urllib.request.Request(
        "{url}/pay", data=json.dumps({{"amount": amount}}).encode(),
        headers={{"Content-Type": "application/json"}},
    )
    with urllib.request.urlopen(request, timeout=60) as answer:
        return answer.status

@kx.agent(name="payer")
def payer(run):
    with run.step("pay"):
        pay(120)
    for i in run.steps(range(40), key=str):
        time.sleep(0.5)""",
    'h = payer.start(run_id="forced")\nh',
    "print('sleeping', flush=True)\ntime.sleep(20)\nprint('slept')",
]
EFFECTS = """import json
import kernelext as kx
rows = kx.sql("SELECT tool, status, result FROM effects WHERE run_id = 'forced'")
print("EFFECTS", json.dumps(list(zip(rows.tool, rows.status, rows.result))))"""


def test_force_stop_during_a_blocking_call_that_returns_keeps_its_outcome(
    tmp_path: Path, store_path: Path, page: Any, shots_folder: Path
) -> None:
    """Force stop pressed while ``pay`` blocks on a slow answer: the panel says it waits for
    the call, the call returns, and the ledger records it ``applied`` (not ``unknown``)."""
    from support.http_server import DeliveryServer

    root = lab_root(tmp_path)
    with DeliveryServer() as server_of_payments:
        server_of_payments.hold_next(1)  # answered once the panel says it waits for it
        cells = [
            FORCE_CELLS[0],
            FORCE_CELLS[1].format(url=server_of_payments.url),
            *FORCE_CELLS[2:],
        ]
        name = write_notebook(root, "force.ipynb", cells)
        env = {"KERNELEXT_STORE": str(store_path)}
        with opened_in_lab(page, shots_folder, root, name, env) as (_server, shot):
            panel = run_to_panel(page, 3)
            sleeper = start_sleeping(page, 3)
            deadline = time.monotonic() + 30
            while not server_of_payments.deliveries and time.monotonic() < deadline:
                time.sleep(0.05)
            assert server_of_payments.deliveries, "the payment never reached the server"
            # the call now blocks on its answer, held by the test
            _clicked, click_t = click(lab.button(panel, "Force stop"))
            panel.get_by_text(
                re.compile(r"Force stop is waiting for pay to return")
            ).first.wait_for(timeout=5_000)
            waiting_s = time.monotonic() - click_t
            shot("force-stop-waits-for-the-call")
            server_of_payments.release_held()  # the call returns
            panel.get_by_text(re.compile(r"suspended: ")).first.wait_for(timeout=20_000)
            suspended_s = time.monotonic() - click_t
            shot("suspended-after-the-call-returned")
            lab.wait_cell_done(sleeper, 60_000)
            out = lab.output_text(lab.add_cell_at_end(page, EFFECTS))
            line = next(row for row in out.splitlines() if row.startswith("EFFECTS "))
            effects = json.loads(line[len("EFFECTS ") :])
        assert len(server_of_payments.deliveries) == 1
    assert effects == [["pay", "applied", "200"]]
    print(
        f"\nForce stop during a held call: 'waiting for pay' shown {waiting_s:.3f} s after the "
        f"click; suspended {suspended_s:.3f} s after it (the call returned), recorded applied"
    )
