"""A ``%%ledger`` table reads as the store holds it: NULL empty, whole numbers whole."""

from __future__ import annotations

import re
from pathlib import Path

from support.kernels import KernelSession

SETUP = """
@kx.agent
def batch(run):
    return run.map(lambda i: i * 2, list(range(12)))
@kx.agent
def single(run):
    return 1
batch.start(run_id='with-total').wait()
single.start(run_id='without-total').wait()
"""

QUERY = "%%ledger -o raw\nSELECT id, total_steps, error FROM runs ORDER BY id"


def _rows(text: str) -> dict[str, str]:
    """Each run id's table row (text/plain)."""
    rows = {}
    for line in text.splitlines():
        for run_id in ("with-total", "without-total"):
            if f" {run_id} " in f"{line} ":
                rows[run_id] = line
    return rows


def test_ledger_table_shows_nulls_empty_and_integers_without_a_fraction(tmp_path: Path) -> None:
    with KernelSession() as kernel:
        kernel.run("%load_ext kernelext").ok()
        kernel.run(f"%config Kernelext.store = {str(tmp_path / 's.duckdb')!r}").ok()
        kernel.run("import kernelext as kx\n" + SETUP).ok()
        reply = kernel.run(QUERY).ok()
        plain, html = reply.results[0]["text/plain"], reply.results[0]["text/html"]
        rows = _rows(plain)
        assert rows["with-total"].split()[:3] == ["0", "with-total", "12"], plain
        assert rows["without-total"].split() == ["1", "without-total"], plain
        for shown in (plain, html):
            assert "NaN" not in shown and "None" not in shown and "12.0" not in shown, shown
        assert "<td>12</td>" in html and "<td></td>" in html, html
        # Only the display changed: the values are pandas' own, in -o and in the result.
        values = kernel.run(
            "import pandas as pd\n"
            "shown = _\n"
            "print(isinstance(shown, pd.DataFrame), shown.equals(raw))\n"
            "print(raw['total_steps'].dtype, raw['total_steps'].isna().tolist())\n"
            "print(type(shown['total_steps'] + 1).__name__)"
        ).ok()
        assert values.stdout.splitlines() == [
            "True True",
            "float64 [False, True]",
            "Series",
        ], values.stdout


def test_agent_list_shows_nulls_empty(tmp_path: Path) -> None:
    with KernelSession() as kernel:
        kernel.run("%load_ext kernelext").ok()
        kernel.run(f"%config Kernelext.store = {str(tmp_path / 's.duckdb')!r}").ok()
        kernel.run("import kernelext as kx\n" + SETUP).ok()
        shown = kernel.run("%agent list").ok().results[0]
        for text in (shown["text/plain"], shown["text/html"]):
            # a count shown as a float (12.0), not a time whose seconds read 12.0...
            assert "NaN" not in text and not re.search(r"(?<![:\d])12\.0(?!\d)", text), text
