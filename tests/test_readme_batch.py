"""The README's "Batches" example runs as it is, and prints what the README says."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


@pytest.mark.usefixtures("store")
def test_the_readme_batch_example_runs_and_delivers_each_row_once() -> None:
    text = README.read_text(encoding="utf-8")
    match = re.search(
        r"<!-- batch-example -->\n```python\n(.*?)```\n<!-- /batch-example -->", text, re.S
    )
    assert match, "README.md lost its Batches example (between the batch-example markers)"
    out = io.StringIO()
    namespace: dict[str, object] = {"__name__": "readme_batch"}
    with contextlib.redirect_stdout(out):
        exec(compile(match.group(1), "README.md", "exec"), namespace)
    first, second = out.getvalue().splitlines()
    assert first.startswith("suspended ") and first.endswith(" items done")
    done = int(first.split()[1])
    assert 0 < done < 100
    assert second == "completed 100 100"
    crm = namespace["CRM"]
    assert isinstance(crm, list) and sorted(crm) == sorted(f"cust-{i}" for i in range(100))
