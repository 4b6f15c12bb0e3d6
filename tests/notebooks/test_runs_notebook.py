"""``kx.runs()`` in a real kernel (nbclient): the live overview with the extension loaded,
the plain table without it, and the table's uses in code unchanged. About 15 s (one kernel).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support.notebooks import FINISH, execute, notebook, text_of

pytestmark = pytest.mark.slow
WIDGET = "application/vnd.jupyter.widget-view+json"

PLAIN = """
import kernelext as kx
kx.runs()
"""
LOADED = """
%load_ext kernelext
import threading

gate = threading.Event()

@kx.agent
def count(run, n):
    for i in run.steps(range(n)):
        if i >= 1:
            gate.wait(60)

gate.set()
print(count.start(2, run_id="nb-done").wait(60))
gate.clear()
h = count.start(5, run_id="nb-live")
"""
OVERVIEW = "kx.runs()\n"
DERIVED = "kx.runs().head()\n"
QUERY = """
runs = kx.runs()
print("QUERY", len(runs), runs["status"].tolist(), type(runs.head()).__name__)
"""


def outputs(nb: Any, cell_id: str) -> list[dict[str, Any]]:
    return list(next(c for c in nb.cells if c["id"] == cell_id).outputs)


def results(nb: Any, cell_id: str) -> list[dict[str, Any]]:
    return [o["data"] for o in outputs(nb, cell_id) if o.get("output_type") == "execute_result"]


def test_kx_runs_in_a_notebook_is_the_live_overview_with_a_saved_copy(tmp_path: Path) -> None:
    env = {"KERNELEXT_STORE": str(tmp_path / "runs.duckdb")}
    nb = notebook(
        ("plain", PLAIN),
        ("loaded", LOADED),
        ("overview", OVERVIEW),
        ("derived", DERIVED),
        ("query", QUERY),
        ("finish", FINISH),
    )
    execute(nb, env, tmp_path)

    (plain,) = results(nb, "plain")  # no extension: the DataFrame as pandas shows it
    assert WIDGET not in plain and "<table" in plain["text/html"]

    (shown,) = results(nb, "overview")
    assert WIDGET in shown, sorted(shown)
    static = shown["text/html"]  # the fallback nbconvert and a saved notebook show
    assert "kernelext-runs kernelext-static" in static
    assert "nb-done" in static and "nb-live" in static and ">running<" in static
    assert "id" in shown["text/plain"] and "nb-live" in shown["text/plain"]  # the table
    saved = [
        o["data"]["text/html"]
        for o in outputs(nb, "overview")
        if o.get("output_type") == "display_data" and "text/html" in o.get("data", {})
    ]
    assert len(saved) == 1 and "kernelext-runs-saved" in saved[0] and "nb-live" in saved[0]

    (derived,) = results(nb, "derived")
    assert WIDGET not in derived and "<table" in derived["text/html"]
    assert "QUERY 2 ['completed', 'running'] DataFrame" in text_of(nb, "query")
    assert "completed" in text_of(nb, "finish")

    state = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    buttons = {
        model["state"]["run_id"]: model["state"]
        for model in state.values()
        if model["state"].get("source") == "overview"
    }
    assert set(buttons) == {"nb-done", "nb-live"}, json.dumps(buttons)[:2000]
    assert buttons["nb-done"]["stop_disabled"] and buttons["nb-done"]["force_disabled"]
    assert buttons["nb-live"]["store"] == str(tmp_path / "runs.duckdb")
