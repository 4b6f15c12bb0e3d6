"""The README opens with a notebook quickstart for people, and its cells work as written.

The quickstart is the first section of README.md and at most 40 lines: install, load the
extension, start an agent and show its panel, Stop, Resume, ``%%agent`` cells and
``%agent complete``, ``%%ledger``. Its cells run here in a real kernel, in order, with the
clicks it asks for made on the panel's own buttons; only the agent's thinking time is
changed: the first ticket's thinking lasts until Stop was clicked (the others are instant).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support.kernels import KernelSession

README = Path(__file__).resolve().parents[2] / "README.md"
QUICKSTART = "## Quickstart in a notebook"
MOST_LINES = 40
THINKING = "time.sleep(3)"  # the agent's step in the README: a person's time to click Stop
# Here the thinking lasts until the test clicked Stop: the run is certainly still running
# when the Stop cell runs, however long the kernel takes to get there, and the click's
# stop lands at the end of the first ticket (the click waits until that ticket began: a
# stop asked before it would land before any). After that, thinking takes no time.
CLICKED = "import threading\nCLICKED, STARTED = threading.Event(), threading.Event()"
THINKING_HERE = "STARTED.set() or CLICKED.wait(120)"


def quickstart() -> str:
    """The quickstart section: from its heading to the next ``## `` heading."""
    text = README.read_text(encoding="utf-8")
    assert QUICKSTART in text, "README.md lost its quickstart"
    return QUICKSTART + text.split(QUICKSTART, 1)[1].split("\n## ", 1)[0]


def cells(section: str) -> list[str]:
    """The notebook cells the quickstart shows (its ```ipython blocks), in order."""
    return re.findall(r"^```ipython\n(.*?)^```", section, flags=re.S | re.M)


def test_the_readme_opens_with_the_quickstart_of_at_most_40_lines() -> None:
    text = README.read_text(encoding="utf-8")
    headings = [line for line in text.splitlines() if line.startswith("## ")]
    assert headings[0] == QUICKSTART
    before = text.split(QUICKSTART, 1)[0].strip().splitlines()
    assert before[0] == "# kernelext" and len(before) <= 6  # a title and one short paragraph
    section = quickstart().rstrip("\n").splitlines()
    assert len(section) <= MOST_LINES, f"the quickstart has {len(section)} lines"


@pytest.mark.parametrize(
    "what",
    [
        "pip install kernelext",
        "%load_ext kernelext",
        "**Stop**",
        "**Resume**",
        "%%agent ",
        "%agent complete ",
        "%%ledger",
        "`kernelext._server`",  # why Stop lands while the kernel is busy
        "■ on a `%%agent` cell is a soft stop",
        "twice within 2 s, the cell is",
    ],
)
def test_the_quickstart_says(what: str) -> None:
    assert what in quickstart()


@pytest.mark.slow
def test_the_quickstart_cells_run_in_a_kernel_with_stop_and_resume_clicked(
    store_path: Path,
) -> None:
    section = quickstart()
    agent, agent_cell, ledger = [c.strip("\n") for c in cells(section)]
    complete = re.findall(r"`(%agent complete \w+)`", section)[0]
    assert THINKING in agent and agent.splitlines()[-1].split("#")[0].strip() == "h"
    with KernelSession({"KERNELEXT_STORE": str(store_path)}) as kernel:
        kernel.run(CLICKED).ok()
        shown = kernel.run(agent.replace(THINKING, THINKING_HERE)).ok()
        assert any("application/vnd.jupyter.widget-view+json" in r for r in shown.results)
        stopped = kernel.run(  # the person clicks Stop in the panel
            "from kernelext.widgets import panel_for\n"
            "assert STARTED.wait(120)\n"
            "panel = panel_for(h)\n"
            "panel.stop_button.click()\n"
            "CLICKED.set()\n"
            "print(h.wait(), h.info()['completed_steps'])\n"
            "print(kx.sql(\"SELECT source FROM events WHERE kind = 'stop_requested'\")"
            "['source'].tolist())"
        ).ok()
        # Suspended after the current ticket, the first: a Stop lands between two steps.
        assert stopped.stdout.split() == ["suspended", "1", "['panel']"]
        resumed = kernel.run(  # then Resume
            "panel.resume_button.click()\nprint(panel.handle.wait())"
        ).ok()
        assert resumed.stdout.strip() == "completed"

        kernel.run(agent_cell).ok()
        assert "completed" in kernel.run(complete).ok().text
        table = kernel.run(ledger).ok().text
        assert re.search(r"triage-1\s+send_email\s+applied\s+20", table), table
        assert "weekly" not in table  # the %%agent cell made no call
        twice = kernel.run(
            "print(len(kx.sql(\"SELECT key FROM effects WHERE status = 'applied' "
            'GROUP BY key HAVING count(*) > 1")))'
        ).ok()
        assert twice.stdout.strip() == "0"  # no email sent twice
