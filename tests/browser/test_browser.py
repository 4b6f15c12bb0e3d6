"""JupyterLab in a real browser (Debian's Chromium driven by Playwright).

The harness test proves the mechanics on a tiny notebook in tests/browser/: a
widget updated from a worker thread while the kernel is idle, and a click that
reaches the kernel. The click-through drives notebooks/quickstart.ipynb as a
user would: run the cells that start the agent, click Stop, Resume, then ask
``%%ledger`` whether anything happened twice.

Screenshots of every state go to tests/artifacts/browser/<test name>/.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from support.http_server import DeliveryServer
from support.live import wait_until

from browser import jupyterlab as lab
from browser.harness import (
    PANEL,
    REPO_ROOT,
    TESTS_DIR,
    lab_root,
    opened_in_lab,
)
from browser.text_watch import TextWatch

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_widget_round_trip_in_jupyterlab(
    tmp_path: Path, store_path: Path, page: Any, shots_folder: Path
) -> None:
    root = lab_root(tmp_path)
    name = lab.copy_notebook(TESTS_DIR / "browser" / "widget_roundtrip.ipynb", root)
    env = {"KERNELEXT_STORE": str(store_path)}
    with opened_in_lab(page, shots_folder, root, name, env) as (_server, shot):
        shot("opened")

        env_cell = lab.run_cell(page, 1)
        assert f"store: {store_path}" in lab.output_text(env_cell)

        panel = lab.run_cell(page, 2).locator(".roundtrip-panel")
        panel.get_by_text("status: running").wait_for()
        lab.button(panel, "Stop").click()
        panel.get_by_text("stop pending").wait_for()
        panel.get_by_text("status: suspended").wait_for()
        shot("suspended")

        typed = lab.add_cell_at_end(page, 'print(f"worker stopped: {stop_flag.is_set()}")')
        assert "worker stopped: True" in lab.output_text(typed)
        shot("typed-cell")


QUICKSTART = REPO_ROOT / "notebooks" / "quickstart.ipynb"
STEP_SECONDS = "1.0"  # the agent's step length: long enough to see "stop pending"
PANEL_TEXTS = {
    "stop pending": r"stop pending since \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC \(panel\)",
    "suspended": "suspended",
    "completed": "completed",
}
# The panel's step line while a step (not the first or the last ones) runs: steps are
# counted from 1.
STEP_BEGAN = r"step [2-9]( of \d+)? \([^)]*\): "
VERDICT = """%%ledger
SELECT 'applied=' || count(*) AS "check" FROM effects WHERE status = 'applied'
UNION ALL SELECT 'not_applied=' || count(*) FROM effects WHERE status <> 'applied'
UNION ALL SELECT 'steps_with_email=' || count(DISTINCT step_key) FROM effects
UNION ALL SELECT 'completed_steps=' || count(*) FROM steps WHERE status = 'completed'"""
VERDICT_ROWS = ("applied={n}", "not_applied=0", "steps_with_email={n}", "completed_steps={n}")


def tagged_cells(notebook: Path, tag: str) -> list[int]:
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    found = [i for i, c in enumerate(cells) if tag in c.get("metadata", {}).get("tags", [])]
    assert found, f"{notebook.name} has no cell tagged {tag!r}; the browser test runs cells by tag"
    return found


def test_quickstart_stop_resume_click_through(
    tmp_path: Path,
    store_path: Path,
    delivery_server: DeliveryServer,
    page: Any,
    shots_folder: Path,
) -> None:
    from playwright.sync_api import expect

    root = lab_root(tmp_path)
    name = lab.copy_notebook(QUICKSTART, root)
    env = {
        "KERNELEXT_STORE": str(store_path),
        "KERNELEXT_DEMO_OUTBOX": f"{delivery_server.url}/outbox",
        "KERNELEXT_DEMO_STEP_SECONDS": STEP_SECONDS,
    }
    with opened_in_lab(page, shots_folder, root, name, env) as (_server, shot):
        shot("opened")

        # 1. run the cells that start the agent
        for index in tagged_cells(QUICKSTART, "setup"):
            lab.run_cell(page, index)
        (start,) = tagged_cells(QUICKSTART, "start")
        panel = lab.run_cell(page, start).locator(PANEL)
        status = panel.locator(".kernelext-status")
        expect(status).to_have_text("running")
        total = int(re.findall(r"\d+/(\d+) steps", panel.inner_text())[0])  # one email a step
        shot("running")
        # A step after the first one began: its email is held by the test, so the step is
        # still running, however slowly the page answers, until "stop pending" was seen.
        TextWatch(panel, {"began": STEP_BEGAN}).wait("began")
        delivery_server.hold_next(1)
        wait_until(
            lambda: any(d.get("held") for d in delivery_server.deliveries),
            "a step's email held by the test",
        )
        watch = TextWatch(panel, PANEL_TEXTS)

        # 2. Stop: "stop pending" at once, then "suspended" at the step boundary
        lab.button(panel, "Stop").click()
        pending_at = watch.wait("stop pending")
        # The step ends: the stop lands at its boundary. Let go at once: the notebook's
        # request gives up after 10 s (the screenshot shows the pending state regardless).
        delivery_server.release_held()
        shot("stop-pending")
        expect(status).to_have_text("suspended")
        seen = watch.seen()
        assert seen["click:Stop"] <= pending_at < seen["suspended"], seen
        outcome = panel.locator(".kernelext-outcome")
        expect(outcome).to_contain_text("suspended: stopped by you (panel), after")
        done = int(re.findall(rf"after (\d+)/{total} steps", outcome.inner_text())[0])
        assert 1 <= done < total
        assert delivery_server.count() == done  # stopped between steps: one email per step
        # The plan of the waiting run, above Resume: what a resume will skip and replay.
        expect(panel.locator(".kernelext-plan-preview")).to_contain_text("suspended")
        shot("suspended")

        # 3. Resume: the run continues and completes
        lab.button(panel, "Resume").click()
        expect(status).to_have_text("completed")
        expect(outcome).to_have_text(f"completed: {total}/{total} steps")
        shot("completed")

        # The timeline: one bar per step attempt, visible in the page.
        (picture_cell,) = tagged_cells(QUICKSTART, "timeline")
        picture = lab.run_cell(page, picture_cell).locator("svg.kx-timeline").first
        expect(picture).to_be_visible()
        assert picture.locator("rect.kx-step").count() >= total
        picture.scroll_into_view_if_needed()
        shot("timeline")

        # 4. the ledger: nothing applied twice
        for index in tagged_cells(QUICKSTART, "ledger"):
            if lab.cell_source(page, index).startswith("%%ledger"):
                lab.run_cell(page, index)
        checked = lab.add_cell_at_end(page, 'print(f"emails sent twice: {len(sent_twice)}")')
        assert "emails sent twice: 0" in lab.output_text(checked)
        verdict = lab.add_cell_at_end(page, VERDICT)
        for row in VERDICT_ROWS:
            expect(verdict.locator(".jp-OutputArea td")).to_contain_text([row.format(n=total)])
        verdict.locator(".jp-OutputArea").scroll_into_view_if_needed()
        shot("ledger")

    # After the kernel is gone: the outside world saw every email exactly once,
    # under the key the ledger recorded.
    keys = [d["idempotency_key"] for d in delivery_server.deliveries]
    assert len(keys) == total and len(set(keys)) == total, keys
    assert_store_consistent(store_path, set(keys))


def assert_store_consistent(store_path: Path, delivered_keys: set[str]) -> None:
    import duckdb

    con = duckdb.connect(str(store_path), read_only=True)
    try:
        ledger_keys = {
            str(row[0])
            for row in con.execute(
                "SELECT key FROM effects WHERE tool = 'send_email' AND status = 'applied'"
            ).fetchall()
        }
        kinds = [r[0] for r in con.execute("SELECT kind FROM events ORDER BY id").fetchall()]
        cancelled = con.execute("SELECT count(*) FROM steps WHERE status <> 'completed'").fetchone()
    finally:
        con.close()
    assert ledger_keys == delivered_keys
    assert "suspended" in kinds and "stop_forced" not in kinds, kinds
    assert cancelled == (0,)  # the stop took hold between steps, no step was cut short


REVALIDATION = REPO_ROOT / "notebooks" / "revalidation.ipynb"


def test_revalidation_accept_click_through(
    tmp_path: Path,
    store_path: Path,
    delivery_server: DeliveryServer,
    page: Any,
    shots_folder: Path,
) -> None:
    """Resume a run whose fact changed; click "Accept and continue" in the revalidation
    widget inside the run's panel; the run goes on from the same panel and completes."""
    from playwright.sync_api import expect

    root = lab_root(tmp_path)
    name = lab.copy_notebook(REVALIDATION, root)
    env = {
        "KERNELEXT_STORE": str(store_path),
        "KERNELEXT_DEMO_OUTBOX": f"{delivery_server.url}/outbox",
    }
    with opened_in_lab(page, shots_folder, root, name, env) as (_server, shot):
        for tag in ("setup", "start", "world-changes"):
            for index in tagged_cells(REVALIDATION, tag):
                lab.run_cell(page, index)

        (resume,) = tagged_cells(REVALIDATION, "resume")
        panel = lab.run_cell(page, resume).locator(PANEL)
        status = panel.locator(".kernelext-status")
        expect(status).to_have_text("needs_decision")
        facts = panel.locator(".kernelext-revalidation table")
        expect(facts).to_contain_text("price:flour")
        flour = facts.locator("tr").filter(has_text="price:flour")
        expect(flour).to_contain_text("2.4")
        expect(flour).to_contain_text("2.65")
        expect(flour).to_contain_text("changed")
        panel.scroll_into_view_if_needed()
        shot("needs-decision")

        lab.button(panel, "Accept and continue").click()
        expect(status).to_have_text("completed")
        expect(panel.locator(".kernelext-revalidation")).to_have_count(0)  # decided: gone
        expect(panel.locator(".kernelext-outcome")).to_have_text(
            "completed: 6 steps · 3 tool calls"
        )
        panel.scroll_into_view_if_needed()
        shot("completed")

    delivery_server.settle()
    assert sorted(d["body"]["sku"] for d in delivery_server.deliveries) == [
        "flour",
        "sugar",
        "yeast",
    ]
    import duckdb

    con = duckdb.connect(str(store_path), read_only=True)
    try:
        statuses = con.execute("SELECT status FROM runs").fetchall()
        decisions = con.execute(
            "SELECT source, actor FROM events WHERE kind = 'revalidation_decision'"
        ).fetchall()
        flour_fact = con.execute("SELECT value FROM facts WHERE name = 'price:flour'").fetchone()
    finally:
        con.close()
    assert statuses == [("completed",)]
    [(source, who)] = decisions
    assert source == "widget" and who  # the click in the browser, recorded with who
    assert flour_fact == ("2.65",)


APPROVE_NOTEBOOK = TESTS_DIR / "browser" / "approve_payment.ipynb"


def test_approve_click_sends_the_payment_exactly_once(
    tmp_path: Path,
    store_path: Path,
    delivery_server: DeliveryServer,
    page: Any,
    shots_folder: Path,
) -> None:
    """A payment above the threshold waits for approval in the run's panel; clicking
    Approve resumes the run, and the payment reaches the server once."""
    from playwright.sync_api import expect

    root = lab_root(tmp_path)
    name = lab.copy_notebook(APPROVE_NOTEBOOK, root)
    env = {
        "KERNELEXT_STORE": str(store_path),
        "KERNELEXT_TEST_PAY_URL": f"{delivery_server.url}/pay",
    }
    with opened_in_lab(page, shots_folder, root, name, env) as (_server, shot):
        lab.run_cell(page, 0)
        panel = lab.run_cell(page, 1).locator(PANEL)
        expect(panel.locator(".kernelext-status")).to_have_text("suspended")
        card = panel.locator(".kernelext-approval")
        expect(card).to_contain_text("pay")
        expect(card).to_contain_text("bob")
        assert delivery_server.count() == 1  # ann's 40 went out; bob's 500 waits
        shot("waiting-for-approval")

        card.locator(".kernelext-approval-note input").fill("invoice checked")
        lab.button(card, "Approve").click()
        expect(panel.locator(".kernelext-status")).to_have_text("completed")
        shot("approved-and-completed")

    delivery_server.settle()
    bodies = [d["body"] for d in delivery_server.deliveries]
    assert sorted(b["to"] for b in bodies) == ["ann", "bob"], bodies  # each exactly once
    import duckdb

    with duckdb.connect(str(store_path), read_only=True) as db:
        row = db.execute(
            "SELECT decision, note, consumed_at IS NOT NULL FROM approvals WHERE run_id = ?",
            ["pay-browser"],
        ).fetchall()
    assert row == [("approved", "invoice checked", True)]


BATCH = REPO_ROOT / "notebooks" / "batch.ipynb"
BATCH_TEXTS = {
    "stopping": r"stopping: \d+ items? in flight",
    "suspended": "suspended",
    "completed": "completed",
}


def test_batch_stop_drains_and_resume_finishes_each_item_once(
    tmp_path: Path,
    store_path: Path,
    delivery_server: DeliveryServer,
    page: Any,
    shots_folder: Path,
) -> None:
    """Stop clicked during a 32-wide batch: the panel shows the drain (stopping, items in
    flight finishing), then suspended; Resume finishes it; each item delivered once."""
    from playwright.sync_api import expect

    root = lab_root(tmp_path)
    name = lab.copy_notebook(BATCH, root)
    env = {
        "KERNELEXT_STORE": str(store_path),
        "KERNELEXT_DEMO_OUTBOX": f"{delivery_server.url}/outbox",
        "KERNELEXT_DEMO_STEP_SECONDS": "1.0",  # each item's call: long enough to see the drain
    }
    with opened_in_lab(page, shots_folder, root, name, env) as (_server, shot):
        for index in tagged_cells(BATCH, "setup"):
            lab.run_cell(page, index)
        (start,) = tagged_cells(BATCH, "start")
        panel = lab.run_cell(page, start).locator(PANEL)
        status = panel.locator(".kernelext-status")
        expect(status).to_have_text("running")
        delivery_server.wait_for(32, timeout=60)  # the first wave of 32 went out
        shot("running")
        # The next calls are held by the test: an item in flight stays in flight, however
        # slowly the page answers, until the drain was seen.
        delivery_server.hold_next(32)
        wait_until(
            lambda: any(d.get("held") for d in delivery_server.deliveries),
            "an item's call held by the test",
        )
        watch = TextWatch(panel, BATCH_TEXTS)
        lab.button(panel, "Stop").click()
        stopping_at = watch.wait("stopping")
        drain = panel.locator(".kx-batch-drain")
        expect(drain).to_contain_text("items in flight")
        # The items in flight finish: the drain ends. Let go at once: the notebook's requests
        # give up after 10 s (the screenshot shows the drain's last state regardless).
        delivery_server.release_held()
        shot("stopping")
        expect(status).to_have_text("suspended", timeout=60_000)
        seen = watch.seen()
        assert seen["click:Stop"] <= stopping_at < seen["suspended"], seen
        shot("suspended")
        delivery_server.settle()
        stopped_with = delivery_server.count()
        assert 32 <= stopped_with < 160
        # Every item that started finished its call: one completed step per delivery.
        expect(panel.locator(".kernelext-outcome")).to_contain_text(f"after {stopped_with}/160")

        lab.button(panel, "Resume").click()
        expect(status).to_have_text("completed", timeout=60_000)
        shot("completed")
        for index in tagged_cells(BATCH, "ledger"):
            lab.run_cell(page, index)
        checked = lab.add_cell_at_end(
            page, 'print(f"items sent twice: {int((per_item.calls > 1).sum())}")'
        )
        assert "items sent twice: 0" in lab.output_text(checked)

    keys = [d["idempotency_key"] for d in delivery_server.deliveries]
    assert len(keys) == 160 and len(set(keys)) == 160
    rows = sorted(d["body"]["id"] for d in delivery_server.deliveries)
    assert rows == sorted(f"cust-{i:03d}" for i in range(160))
