"""Run ``quickstart.ipynb`` headless (as ``make demo`` does) and print what happened.

The notebook starts an agent and leaves Stop and Resume to the person reading it. Here
nobody reads it, so this script presses them: it runs the notebook in a fresh kernel with
a throwaway store, with two cells of its own inserted where a person would click (Stop
in the run's panel after the start, Resume in the panel shown again after the plan). Then
it reads that store and prints the run, its events and the ledger.

    python notebooks/run_demo.py [--step-seconds 0.2] [--keep DIR]

To watch it live instead, open the notebook in JupyterLab:
``jupyter lab notebooks/quickstart.ipynb``, and click Stop / Resume in the panel.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

HERE = Path(__file__).resolve().parent
NOTEBOOK = HERE / "quickstart.ipynb"

# The person's clicks: (the notebook cell they follow, the inserted cell's id, its code).
PRESS_STOP = """\
from kernelext.widgets import panel_for

time.sleep(2 * STEP_SECONDS)  # two tickets go out before the click
panel_for(h).stop_button.click()
print(panel_for(h).view.stop_text() or panel_for(h).view.status)"""
PRESS_RESUME = """\
if panel.handle.status == "suspended":
    panel.resume_button.click()
print(panel.handle.wait())"""
CLICKS = (("start", "click-stop", PRESS_STOP), ("panel", "click-resume", PRESS_RESUME))


def cell_text(cell: nbformat.NotebookNode) -> str:
    parts = []
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream":
            parts.append(out["text"])
        elif "data" in out:
            parts.append(str(out["data"].get("text/plain", "")) + "\n")
    return "".join(parts).rstrip()


def with_clicks(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """``nb`` with the person's clicks inserted as cells (tagged ``drive``)."""
    for after, cell_id, source in CLICKS:
        index = next(i for i, c in enumerate(nb.cells) if c.get("id") == after)
        cell = nbformat.v4.new_code_cell(source)
        cell["id"] = cell_id
        cell.metadata["tags"] = ["drive"]
        nb.cells.insert(index + 1, cell)
    return nb


def execute(folder: str, step_seconds: float) -> nbformat.NotebookNode:
    nb = with_clicks(nbformat.read(NOTEBOOK, as_version=4))
    env = {
        **os.environ,
        "KERNELEXT_STORE": os.path.join(folder, "demo.duckdb"),
        "KERNELEXT_DEMO_STEP_SECONDS": str(step_seconds),
    }
    env.pop("KERNELEXT_DEMO_OUTBOX", None)
    client = NotebookClient(
        nb,
        timeout=300,
        kernel_name="python3",
        store_widget_state=True,
        resources={"metadata": {"path": folder}},
    )
    started = time.monotonic()
    client.execute(env=env)
    print(
        f"Executed {NOTEBOOK.name} in {time.monotonic() - started:.1f} s "
        f"({len(nb.cells)} cells, store {env['KERNELEXT_STORE']}).\n"
    )
    return nb


def report(nb: nbformat.NotebookNode, store: str) -> None:
    import kernelext as kx

    for cell_id, title in (
        ("click-stop", "Stop pressed"),
        ("wait", "After the safe point"),
        ("click-resume", "Resume pressed"),
        ("summary", "Summary"),
    ):
        cell = next(c for c in nb.cells if c.get("id") == cell_id)
        print(f"[{title}] {cell_text(cell)}")
    kx.open_store(store)
    queries = {
        "Run": "SELECT id, agent, status, completed_steps, total_steps FROM runs",
        "Events": "SELECT id, kind, from_status, to_status, source, reason FROM events ORDER BY id",
        "Ledger": "SELECT tool, status, count(*) AS calls, count(DISTINCT step_key) AS tickets "
        "FROM effects GROUP BY ALL",
    }
    for title, query in queries.items():
        table = kx.sql(query)
        text = table.to_string(index=False) if hasattr(table, "to_string") else str(table)
        print(f"\n{title}:\n{text}")
    twice = kx.sql(
        "SELECT step_key FROM effects WHERE status = 'applied' "
        "GROUP BY step_key HAVING count(*) > 1"
    )
    print(f"\nEmails sent twice: {len(twice)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--step-seconds",
        type=float,
        default=0.2,
        help="how long each agent step takes (the notebook's default is 5, paced for a person)",
    )
    parser.add_argument(
        "--keep",
        metavar="DIR",
        default=None,
        help="keep the store and the executed notebook in DIR",
    )
    args = parser.parse_args(argv)
    folder = args.keep or tempfile.mkdtemp(prefix="kernelext-demo-")
    os.makedirs(folder, exist_ok=True)
    try:
        nb = execute(folder, args.step_seconds)
    except CellExecutionError as exc:
        print(f"The quickstart notebook failed:\n{exc}", file=sys.stderr)
        return 1
    if args.keep:
        nbformat.write(nb, os.path.join(folder, "quickstart.executed.ipynb"))
    report(nb, os.path.join(folder, "demo.duckdb"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
