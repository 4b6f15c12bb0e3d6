"""Steps are numbered as a person counts them: by cell (or item), not by attempt. A cell
that failed and ran again is still step 2, and the cell after it is step 3, in the cell's
message, the panel, ``kernelext show``, the timeline and the resume plan."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from IPython.core.interactiveshell import InteractiveShell
from support.shells import cell_shell
from test_formatting import step_rows

from kernelext._cli.runs import cmd_show
from kernelext._core.plan.resume_plan import plan
from kernelext._core.process.runtime import get_store
from kernelext._core.views.timeline import timeline


@pytest.fixture
def shell(store_path: Path) -> Iterator[InteractiveShell]:
    with cell_shell(store_path) as ip:
        yield ip


def test_the_count_goes_by_key_in_the_order_steps_first_ran() -> None:
    from kernelext._formatting import step_numbers

    rows = [
        {"ordinal": 0, "key": "a"},
        {"ordinal": 3, "key": "c"},
        {"ordinal": 1, "key": "b"},
        {"ordinal": 2, "key": "b"},
        {"ordinal": 4, "key": "b"},
    ]
    assert step_numbers(rows) == {0: 0, 1: 1, 2: 1, 3: 2, 4: 1}
    assert step_numbers([]) == {}


def test_a_cell_run_again_keeps_its_number_on_every_surface(
    shell: InteractiveShell, capsys: Any
) -> None:
    run_id = "counted-cells"
    shell.run_cell(f"%%agent {run_id} --step fetch\nrun.state['rows'] = 3\n")
    for _ in range(2):  # the second cell fails twice: two attempts of one step
        shell.run_cell(f"%%agent {run_id} --step load\nraise ValueError('not yet')\n")
        assert f"step 2 of run {run_id!r} failed" in capsys.readouterr().out
    shell.run_cell(f"%%agent {run_id} --step load\nrun.state['loaded'] = True\n")
    shell.run_cell(  # the panel, read while the third cell runs
        f"%%agent {run_id} --step report\n"
        "from kernelext._core.lifecycle.cell_runs import cell_handle\n"
        "from kernelext.widgets._render import view_of\n"
        f"panel_step = view_of(cell_handle({run_id!r})).step_text()\n"
    )
    capsys.readouterr()
    assert shell.user_ns["panel_step"].startswith("step 3 (report): ")
    store = get_store(None)
    assert [s["ordinal"] for s in store.steps(run_id)] == [0, 1, 2, 3, 4]  # attempts, stored

    cmd_show(argparse.Namespace(run_id=run_id, json=False), store)
    shown = capsys.readouterr().out.splitlines()
    rows = step_rows(shown)
    assert rows["fetch"]["step"] == "1" and rows["report"]["step"] == "3"
    numbers = [line.split()[0] for line in shown if " load " in f" {line} "]
    assert numbers == ["2", "2", "2"]  # three attempts, one step

    bars = {bar.ordinal: bar.title.splitlines()[0] for bar in timeline(run_id, store).bars}
    assert bars[4].startswith("step 3 (report)")
    assert bars[1].startswith("step 2 (load)") and bars[3].startswith("step 2 (load)")

    previewed = plan(run_id, store)
    assert "step 1 (fetch), step 2 (load), step 3 (report)" in previewed.text()
