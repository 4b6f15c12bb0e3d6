"""The "Batches" page's example (docs/batches.md) runs as it is, and prints what it says."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

BATCHES_PAGE = Path(__file__).resolve().parents[2] / "docs" / "batches.md"


@pytest.mark.usefixtures("store")
def test_the_documented_batch_example_runs_and_delivers_each_row_once() -> None:
    text = BATCHES_PAGE.read_text(encoding="utf-8")
    match = re.search(
        r"<!-- batch-example -->\n```python\n(.*?)```\n<!-- /batch-example -->", text, re.S
    )
    assert match, "docs/batches.md lost its example (between the batch-example markers)"
    out = io.StringIO()
    namespace: dict[str, object] = {"__name__": "readme_batch"}
    with contextlib.redirect_stdout(out):
        exec(compile(match.group(1), "docs/batches.md", "exec"), namespace)
    first, second = out.getvalue().splitlines()
    assert first.startswith("suspended ") and first.endswith(" items done")
    done = int(first.split()[1])
    assert 0 < done < 100
    assert second == "completed 100 100"
    crm = namespace["CRM"]
    assert isinstance(crm, list) and sorted(crm) == sorted(f"cust-{i}" for i in range(100))
