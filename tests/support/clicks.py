"""What a person clicks in the demo notebooks, as cells a headless run inserts.

Run with Run All, a demo notebook presses none of its own buttons: a markdown cell asks the
person to click Stop, Resume, a decision or Restart in the run's panel. nbclient has nobody
to click, so the tests insert these cells where the person would click. Each one presses the
panel's own button (``button.click()`` runs the handler a click that reaches the kernel
runs), waits for what the click started, and prints what the tests read. The inserted cells
are tagged ``drive``; the notebooks' own cells are untouched.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import nbformat

__all__ = ["CLICKS", "Click", "with_clicks"]

DRIVE_TAG = "drive"


@dataclass(frozen=True)
class Click:
    """The person clicks ``button`` after the cell ``after`` (where a markdown cell asks for
    it); ``source`` does the same in the kernel, in an inserted cell named ``cell_id``."""

    after: str
    cell_id: str
    button: str
    source: str


# -- Stop ---------------------------------------------------------------------------------
STOP_AT_ONCE = """
from kernelext.widgets import panel_for

panel = panel_for(h)
if h.status == "running":
    panel.stop_button.click()
# No stop pending: the run already ended or waits; the answer says what to do instead.
print(panel.view.stop_text() or h.stop().notice or panel.view.status)
"""


def stop_after(done: int) -> str:
    """Stop once ``done`` steps (items) of ``h`` completed."""
    return f"""
import time
from kernelext.widgets import panel_for

panel = panel_for(h)
while h.status == "running" and h.info()["completed_steps"] < {done}:
    time.sleep(0.05)  # let the first items complete
if h.status == "running":
    panel.stop_button.click()
print(h.status_text)
"""


FORCE_STOP_IN_THE_SECOND_CALL = """
import time
from kernelext.widgets import panel_for


def calls_begun():
    \"\"\"The calls of this run in the ledger: each intent is recorded before its call.\"\"\"
    return int(kx.sql("SELECT count(*) AS n FROM effects WHERE run_id = ?", [RUN_ID])["n"][0])


while calls_begun() < 2 and h.alive:  # the second call has begun: its intent is recorded
    time.sleep(0.02)
panel = panel_for(h)
panel.force_button.click()  # the first press waits for the call in flight to return...
while panel.force_wait_text() is None and h.alive:
    time.sleep(0.02)
panel.force_button.click()  # ...the second cuts it in the middle
"""

# -- Resume, decisions, Restart --------------------------------------------------------------
RESUME = """
from kernelext.widgets import panel_for

panel = panel_for(h)
if not panel.handle.alive and panel.handle.status == "suspended":
    panel.resume_button.click()  # the same as kx.resume(RUN_ID)
elif panel.handle.status == "completed":  # nothing to resume: the plan says what to do
    print(*kx.plan(panel.handle.run_id).blockers, sep="\\n")
print(repr(panel.handle.wait()))
"""

ACCEPT = """
from kernelext.widgets import decision_widget

widget = decision_widget(panel)  # the revalidation widget inside the panel
if widget is not None and not widget.accept_button.disabled:
    widget.note.value = "flour is dearer; still within the approved budget"
    widget.accept_button.click()
print(panel.handle.wait())  # the panel follows the resumed run
"""

DECIDE_WITH_THE_CARRIER = """
import json
from kernelext.widgets import decision_widget

widget = decision_widget(panel)  # the reconciliation widget inside the panel
if widget is not None:
    for index, item in enumerate(widget.rec):
        widget.picker.value = index
        record = carrier_received(str(item.key))
        if record is not None:  # the carrier has it: it happened
            receipt = {"order": record["body"]["order"], "receipt": record["seq"]}
            widget.result.value = json.dumps(receipt)
            widget.note.value = f"carrier receipt {record['seq']}"
            widget.happened_button.click()
        else:
            widget.note.value = "the carrier has no parcel under this key"
            widget.retry_button.click()
        print(f"{item.tool} {item.step_key}: {item.decision}")
print(panel.handle.wait())  # after the last decision the panel resumed the run
"""

RESTART = """
if banner.new_handle is None:
    banner.restart_button.click()
new = banner.new_handle
assert panel.handle is new  # the panel now shows the restarted run
print(new.run_id, "parent:", new.info()["parent_id"], "->", new.wait(), "result:", new.result)
"""


def stop_then_resume(stop: str = STOP_AT_ONCE) -> tuple[Click, ...]:
    """Most notebooks' two clicks: Stop under the ``start`` cell (``stop`` says when), then
    Resume in the panel."""
    return (
        Click("start", "click-stop", "Stop", stop),
        Click("panel", "click-resume", "Resume", RESUME),
    )


CLICKS: dict[str, tuple[Click, ...]] = {
    "quickstart": stop_then_resume(),
    "batch": stop_then_resume(stop_after(1)),
    "llm_agent": stop_then_resume(),
    "anthropic_agent": stop_then_resume(),
    "pydantic_ai_agent": stop_then_resume(),
    "openai_agents": stop_then_resume(),
    "dask_batch": stop_then_resume(stop_after(4)),
    "reconcile_unknowns": (
        Click("start", "click-force-stop", "Force stop", FORCE_STOP_IN_THE_SECOND_CALL),
        Click("carrier-says", "decide", "It happened", DECIDE_WITH_THE_CARRIER),
    ),
    "revalidation": (Click("side-by-side", "click-accept", "Accept and continue", ACCEPT),),
    "expiry_and_restart": (Click("about-restart", "click-restart", "Restart", RESTART),),
}


def with_clicks(nb: Any, name: str) -> Any:
    """A copy of notebook ``nb`` (``notebooks/<name>.ipynb``) with the person's clicks
    inserted; a click after a cell the copy does not hold is left out."""
    clicked = copy.deepcopy(nb)
    for click in CLICKS.get(name, ()):
        ids = [c.get("id") for c in clicked.cells]
        if click.after not in ids:
            continue
        made = nbformat.v4.new_code_cell(click.source.strip("\n"))
        made["id"] = click.cell_id
        made.metadata["tags"] = [DRIVE_TAG]
        clicked.cells.insert(ids.index(click.after) + 1, made)
    return clicked
