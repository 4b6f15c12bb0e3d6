"""The "Batches" page's example (docs/batches.md) runs as it is, and prints what it says."""

from __future__ import annotations

import contextlib
import io
import re
import threading
from pathlib import Path
from typing import Any

import pytest
from support.live import wait_until

BATCHES_PAGE = Path(__file__).resolve().parents[2] / "docs" / "batches.md"
# The example stops its batch 0.1 s in. Here the stop comes once an item is done, and items
# cust-40 and later wait until the stop was asked: so the run is certainly suspended with
# some items done and some left, however a busy machine schedules its threads.
STOP_AFTER = ("time.sleep(0.1)\nh.stop()", "ONE_DONE(h)\nh.stop(); ASKED.set()")
HOLD_IN = ("    time.sleep(0.05)\n", "    time.sleep(0.05)\n    HOLD(row)\n")


def runnable(example: str) -> tuple[str, dict[str, Any]]:
    """The example's code with the two changes above, and the namespace they use."""
    for old, new in (STOP_AFTER, HOLD_IN):
        assert example.count(old) == 1, f"the example no longer has {old!r}"
        example = example.replace(old, new)
    asked = threading.Event()

    def hold(row: dict[str, str]) -> None:
        if int(row["id"].removeprefix("cust-")) >= 40:
            assert asked.wait(60), "the example never stopped its run"

    def one_done(h: Any) -> None:
        wait_until(lambda: h.info()["completed_steps"] >= 1, "an item done")

    return example, {"ASKED": asked, "HOLD": hold, "ONE_DONE": one_done}


@pytest.mark.usefixtures("store")
def test_the_documented_batch_example_runs_and_delivers_each_row_once() -> None:
    text = BATCHES_PAGE.read_text(encoding="utf-8")
    match = re.search(
        r"<!-- batch-example -->\n```python\n(.*?)```\n<!-- /batch-example -->", text, re.S
    )
    assert match, "docs/batches.md lost its example (between the batch-example markers)"
    code, namespace = runnable(match.group(1))
    namespace["__name__"] = "readme_batch"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "docs/batches.md", "exec"), namespace)
    first, second = out.getvalue().splitlines()
    assert first.startswith("suspended ") and first.endswith(" items done")
    done = int(first.split()[1])
    assert 0 < done <= 40 + 16  # those done before the stop, and the 16 in flight at most
    assert second == "completed 100 100"
    crm = namespace["CRM"]
    assert isinstance(crm, list) and sorted(crm) == sorted(f"cust-{i}" for i in range(100))
