"""``kx.runs()`` in a notebook is a live overview of the store's runs; in code it is the table.

In process, on a real store (DuckDB, and PostgreSQL where the module runs on both): runs in
several statuses (running, stopping, suspended for a stop, for an approval and for an
answer, needs_decision on unknown effects, failed, completed, a %%agent cell run); the
overview's rows, their texts and their buttons; a stop and a new run made by other
processes show up without any cell running; nothing is read while nothing changes. The
table people query stays a DataFrame, and frames derived from it are plain ones.
"""

from __future__ import annotations

import pickle
import re
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from typing import Any

import pandas as pd
import pytest
from IPython.core.interactiveshell import InteractiveShell
from support.live import name, wait_until
from support.store_reads import Reads

import kernelext as kx
from kernelext._core.encoding.names import CELL_AGENT
from kernelext._core.process.runtime import runtime
from kernelext._ipython import extension
from kernelext.widgets._panel import ControlPanel
from kernelext.widgets._runs import (
    RunsOverview,
    close_open_overviews,
    feed_of,
    runs_mimebundle,
)
from kernelext.widgets._watch import watch_of

pytestmark = pytest.mark.both_backends
WAIT = 60.0
WIDGET = "application/vnd.jupyter.widget-view+json"


class Lost(BaseException):
    """Stands for the process going away in the middle of a call."""


@kx.effect(name="overview_ship")
def ship(order: int, *, idempotency_key: str | None = None) -> None:
    raise Lost


@kx.agent(name="overview-unknowns")
def unknowns(run: kx.Run) -> None:
    with run.step("ship"):
        for order in range(2):
            try:
                ship(order)
            except Lost:
                continue
    raise RuntimeError("the process went away")


@kx.effect(name="overview_pay", needs_approval=True)
def pay(amount: int) -> dict[str, int]:
    return {"paid": amount}


@kx.agent(name="overview-payer")
def payer(run: kx.Run) -> None:
    for _ in run.steps(range(2)):
        pay(10)


@kx.agent(name="overview-asker")
def asker(run: kx.Run) -> None:
    with run.step("ask"):
        run.state["boxes"] = run.ask("How many boxes ship today?", schema=int)


@kx.agent(name="overview-quick")
def quick(run: kx.Run) -> None:
    for _ in run.steps(range(3)):
        pass


@kx.agent(name="overview-failing")
def failing(run: kx.Run) -> None:
    with run.step("only"):
        raise ValueError("the CRM said no")


def gated(tag: str, gate: threading.Event, *, quick_steps: int = 3) -> Any:
    """Ten steps: the first ``quick_steps`` take 50 ms each, the others wait for ``gate``."""

    @kx.agent(name=f"{tag}-gated")
    def agent(run: kx.Run) -> None:
        for i in run.steps(range(10)):
            if i < quick_steps:
                threading.Event().wait(0.05)
            else:
                assert gate.wait(WAIT), "the test never opened the gate"

    return agent


def cli(*args: str, store: Any) -> subprocess.CompletedProcess[str]:
    """``python -m kernelext --store STORE ARGS`` in a process of its own (a terminal)."""
    return subprocess.run(
        [sys.executable, "-m", "kernelext", "--store", str(store), *args],
        capture_output=True,
        text=True,
        timeout=240,
    )


@pytest.fixture
def views() -> Iterator[list[RunsOverview]]:
    made: list[RunsOverview] = []
    yield made
    for view in made:
        view.detach()


def overview(store: Any, made: list[RunsOverview], status: str | None = None) -> RunsOverview:
    view = RunsOverview(store, status)
    made.append(view)
    return view


def row_text(view: RunsOverview, run_id: str) -> str:
    """What a person reads in the row (the HTML cells, tags and entities dropped)."""
    cells = view.rows[run_id].cells
    text = " | ".join(re.sub(r"<[^>]+>", " ", c.value) for c in cells)
    return re.sub(r"\s+", " ", text.replace("&#x27;", "'").replace("&quot;", '"')).strip()


def status_of(view: RunsOverview, run_id: str) -> str | None:
    found = view.overview
    rows = [r for r in found.rows if r.run_id == run_id] if found is not None else []
    return rows[0].status if rows else None


def test_the_rows_say_status_progress_time_left_and_what_each_run_waits_for(
    store: Any, views: list[RunsOverview]
) -> None:
    tag = name("rows")
    assert quick.start(run_id=f"{tag}-done", store=store).wait(WAIT) == "completed"
    assert payer.start(run_id=f"{tag}-approval", store=store).wait(WAIT) == "suspended"
    assert asker.start(run_id=f"{tag}-answer", store=store).wait(WAIT) == "suspended"
    assert failing.start(run_id=f"{tag}-failed", store=store).wait(WAIT) == "failed"
    assert unknowns.start(run_id=f"{tag}-decide", store=store).wait(WAIT) == "failed"
    assert kx.resume(f"{tag}-decide", store=store).status == "needs_decision"
    store.create_run(f"{tag}-cells", CELL_AGENT)  # a %%agent run between two cells
    gate = threading.Event()
    live = gated(tag, gate).start(run_id=f"{tag}-live", store=store)
    wait_until(lambda: store.get_run(f"{tag}-live")["completed_steps"] == 3, "three steps")

    view = overview(store, views)
    assert [r.run_id for r in view.overview.rows] == [  # oldest first, as the table
        f"{tag}-{s}" for s in ("done", "approval", "answer", "failed", "decide", "cells", "live")
    ]
    assert view.overview.summary() == (
        "7 runs: 2 running, 2 suspended, 1 needs_decision, 1 completed, 1 failed"
    )
    expiry = r"expires in (2 d 23 h|3 d)"
    assert re.fullmatch(
        rf"{tag}-approval \[overview-payer\] \| suspended \| 0/2 steps \| — \| "
        rf"an approval of overview_pay · {expiry}",
        row_text(view, f"{tag}-approval"),
    ), row_text(view, f"{tag}-approval")
    assert re.search(
        rf"suspended \| 0 steps \| — \| an answer: How many boxes ship today\? · {expiry}",
        row_text(view, f"{tag}-answer"),
    ), row_text(view, f"{tag}-answer")
    decide, failed = row_text(view, f"{tag}-decide"), row_text(view, f"{tag}-failed")
    assert re.search(r"needs_decision \| .* \| a decision on 2 unknown effects · expires", decide)
    assert "a resume or a restart (ValueError: the CRM said no)" in failed
    assert re.search(r"completed \| 3/3 steps \| — \| —$", row_text(view, f"{tag}-done"))
    running = row_text(view, f"{tag}-live")
    assert re.search(r"running \| 3/10 steps \| about [\d.]+ (ms|s) left \| —$", running), running

    buttons = {run_id: row.buttons for run_id, row in view.rows.items()}
    assert not buttons[f"{tag}-live"].stop_disabled and not buttons[f"{tag}-live"].force_disabled
    cells = buttons[f"{tag}-cells"]  # a %%agent run: Stop, but a force is the notebook's ■
    assert not cells.stop_disabled and cells.force_disabled and "■" in cells.force_tooltip
    for waiting in ("approval", "answer", "decide", "failed", "done"):
        found = buttons[f"{tag}-{waiting}"]
        assert found.stop_disabled and found.force_disabled, waiting
        assert "there is nothing to stop" in found.stop_tooltip
    assert {b.source for b in buttons.values()} == {"overview"}  # recorded as its source
    assert {b.store for b in buttons.values()} == {view.address}

    # a Stop the notebook server could not take: handled in the kernel, source "overview"
    live_buttons = buttons[f"{tag}-live"]
    live_buttons._handle_message(live_buttons, {"action": "stop"}, [])
    assert live_buttons.ack_seq == 1 and "Stop recorded (runs overview)" in live_buttons.kernel_note
    assert status_of(view, f"{tag}-live") == "stopping"
    text = row_text(view, f"{tag}-live")
    assert "stop pending (overview)" in text and "stops after step 4" in text, text
    assert live_buttons.stop_disabled is False and "pending" in live_buttons.stop_tooltip
    gate.set()
    assert live.wait(WAIT) == "suspended"
    assert live.info()["stop_source"] == "overview"
    view.refresh()
    assert re.search(
        r"suspended \| 4/10 steps \| — \| a resume · expires in", row_text(view, f"{tag}-live")
    ), row_text(view, f"{tag}-live")
    assert live_buttons.stop_disabled and live_buttons.force_disabled

    # Panel opens the run's control panel under the table; again hides it
    row = view.rows[f"{tag}-approval"]
    row.open_button.click()
    panel = view.opened.children[-1]
    assert isinstance(panel, ControlPanel) and panel.handle.run_id == f"{tag}-approval"
    assert row.open_button.description == "Hide panel"
    row.open_button.click()
    assert view.opened.children == () and row.open_button.description == "Panel"

    only = overview(store, views, "suspended")  # kx.runs("suspended")
    assert only.overview.summary() == "3 suspended runs"
    assert set(only.rows) == {f"{tag}-approval", f"{tag}-answer", f"{tag}-live"}


def test_a_batch_row_counts_its_items_and_its_pace(store: Any, views: list[RunsOverview]) -> None:
    tag = name("batch")
    gate = threading.Event()

    def item(i: int) -> int:
        if i >= 8:
            assert gate.wait(WAIT), "the test never opened the gate"
        return i

    @kx.agent(name=f"{tag}-agent")
    def agent(run: kx.Run) -> None:
        run.state["out"] = run.map(item, list(range(20)), concurrency=4)

    handle = agent.start(run_id=tag, store=store)
    wait_until(lambda: store.get_run(tag)["completed_steps"] >= 8, "eight items done")
    view = overview(store, views)
    text = row_text(view, tag)
    assert re.search(
        r"running \| batch: 8/20 done, [1-4] in flight \| [\d.]+ items/(s|min)", text
    ), text
    gate.set()
    assert handle.wait(WAIT) == "completed"
    view.refresh()
    assert re.search(r"completed \| 20/20 steps \| — \| —$", row_text(view, tag))


def test_changes_made_by_other_processes_show_up_without_a_cell_running(
    store: Any, store_path: Any, views: list[RunsOverview]
) -> None:
    tag = name("elsewhere")
    gate = threading.Event()
    handle = gated(tag, gate, quick_steps=1).start(run_id=tag, store=store)
    wait_until(lambda: store.get_run(tag)["completed_steps"] == 1, "a first step")
    view = overview(store, views)
    assert status_of(view, tag) == "running"
    feed = feed_of(store, None)
    seen = feed.changes

    done = cli("stop", tag, store=store_path)  # a terminal: kernelext stop RUN
    assert done.returncode in (0, 3), done.stdout + done.stderr
    wait_until(lambda: status_of(view, tag) == "stopping", "the row to say stopping", 10.0)
    assert feed.changes > seen  # noticed by the store watch, not by a cell
    assert "stop pending (cli)" in row_text(view, tag)
    gate.set()
    assert handle.wait(WAIT) == "suspended"
    wait_until(lambda: status_of(view, tag) == "suspended", "the row to say suspended", 10.0)

    other = name("other-process")  # a run another process starts appears as a new row
    script = textwrap.dedent(
        f"""
        import kernelext as kx
        kx.configure(store={str(store_path)!r})

        @kx.agent(name="elsewhere")
        def elsewhere(run):
            for _ in run.steps(range(2)):
                pass

        print(elsewhere.start(run_id={other!r}).wait(60))
        """
    )
    made = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=240
    )
    assert made.stdout.strip() == "completed", made.stdout + made.stderr
    wait_until(lambda: status_of(view, other) == "completed", "the new run's row", 10.0)
    assert row_text(view, other).startswith(f"{other} [elsewhere] | completed | 2/2 steps")


def test_nothing_is_read_while_nothing_changes(
    store: Any, views: list[RunsOverview], monkeypatch: pytest.MonkeyPatch
) -> None:
    tag = name("quiet")
    assert payer.start(run_id=tag, store=store).wait(WAIT) == "suspended"
    view = overview(store, views)
    feed, watch = feed_of(store, None), watch_of(store)
    start = watch.checks

    def settled() -> bool:
        # Four looks found nothing committed: the process let the DuckDB file go (1 s after
        # it last used it, a checkpoint that moves the signal once) and its reads that
        # followed were drawn; reads alone never move the signal.
        if store.change_signal() is None:  # PostgreSQL: each look reads the runs' rows
            return watch.checks >= start + 4
        quiet_looks = max(4, round(4.0 / watch.interval))  # about four seconds of quiet
        return (
            watch.checks >= start + quiet_looks
            and watch.quiet >= quiet_looks
            and not feed.throttle.running
        )

    wait_until(settled, "a settled feed")
    reads, full = Reads(store, monkeypatch), feed.full_reads
    looked = watch.checks
    wait_until(lambda: watch.checks >= looked + 3, "three more looks")
    with watch._check_lock:
        count, checks = reads.count, watch.checks
    if store.change_signal() is not None:  # DuckDB: the file's stat, no query at all
        assert count == 0, "nothing is read while nothing changes"
    else:  # PostgreSQL: the runs' rows once a look, nothing more
        assert count <= 2 * (checks - looked) + 2
    assert feed.full_reads == full  # the rows were as before: nothing else was read
    (request,) = kx.approvals(tag, store=store)
    request.approve(resume=False)
    view.refresh()
    assert "a resume (no open approval) · expires in" in row_text(view, tag)  # decided


def test_kx_runs_is_still_the_table_and_shows_live_only_with_the_extension(
    store: Any, store_path: Any
) -> None:
    assert quick.start(run_id="table-1", store=store).wait(WAIT) == "completed"
    assert failing.start(run_id="table-2", store=store).wait(WAIT) == "failed"
    runs = kx.runs()
    assert isinstance(runs, pd.DataFrame) and len(runs) == 2
    assert runs["status"].tolist() == ["completed", "failed"]
    assert runs.set_index("id").loc["table-2", "status"] == "failed"
    assert list(kx.runs("failed")["id"]) == ["table-2"]
    for derived in (runs.head(), runs[runs.status == "failed"], runs.copy(), runs.T, runs[["id"]]):
        assert type(derived) is pd.DataFrame  # derived frames are plain tables
    assert type(pickle.loads(pickle.dumps(runs))) is pd.DataFrame
    assert runs.equals(pd.DataFrame(runs)) and repr(runs) == repr(pd.DataFrame(runs))

    shell = InteractiveShell.instance()
    data, _ = shell.display_formatter.format(runs)
    assert WIDGET not in data and "<table" in data["text/html"]  # without the extension
    shell.run_line_magic("load_ext", "kernelext")
    try:
        assert runtime().settings.runs_renderer is extension.runs_bundle
        data, _ = shell.display_formatter.format(kx.runs())
        assert WIDGET in data, sorted(data)
        assert "kernelext-runs" in data["text/html"] and "table-2" in data["text/html"]
        assert data["text/plain"] == repr(pd.DataFrame(runs))
        data, _ = shell.display_formatter.format(kx.runs().head())
        assert WIDGET not in data  # a derived frame is a table
    finally:
        shell.run_line_magic("unload_ext", "kernelext")
    assert runtime().settings.runs_renderer is None
    data, _ = shell.display_formatter.format(kx.runs())
    assert WIDGET not in data
    bundle = runs_mimebundle(kx.runs(store=store))
    assert WIDGET in bundle and "table-1" in bundle["text/html"]
    close_open_overviews()


def test_a_run_waiting_for_you_is_shown_however_many_newer_runs_ended(store: Any) -> None:
    """One run waits for an approval, then more runs than the overview shows complete:
    the waiting run keeps its row (its wait and its buttons), the oldest completed go."""
    from kernelext._core.lifecycle.overview import SHOWN, read_overview

    waiting = payer.start(run_id=name("waits-for-you"))
    assert waiting.wait(WAIT) == "suspended"
    for _ in range(SHOWN + 5):
        assert quick.start(run_id=name("ended")).wait(WAIT) == "completed"
    found = read_overview(store)
    shown = [row.run_id for row in found.rows]
    assert waiting.run_id in shown and len(shown) == SHOWN
    row = next(r for r in found.rows if r.run_id == waiting.run_id)
    assert "approval" in row.waits_for
    assert "live or waiting for you" in found.summary()


def test_a_row_carries_the_owner_epoch_so_a_stale_overview_stops_nothing(
    store: Any, views: list[RunsOverview]
) -> None:
    gate = threading.Event()
    handle = gated("fenced-row", gate).start(run_id=name("fenced-row"))
    try:
        view = overview(store, views)
        wait_until(lambda: handle.run_id in view.rows, "the run's row", WAIT)
        buttons = view.rows[handle.run_id].buttons
        epoch = int(store.get_run(handle.run_id)["owner_epoch"])
        assert buttons.epoch == epoch
        note = view.on_action(handle.run_id, "stop", epoch + 1)  # drawn before a take-over
        assert note is not None and "OwnershipLost" in note
        assert store.get_run(handle.run_id)["status"] == "running"
    finally:
        gate.set()
        handle.wait(WAIT)


def test_a_run_of_the_same_id_in_another_store_is_not_the_one_stopped(
    store: Any, tmp_path: Any
) -> None:
    """A run executing here and a run of the same id in another store: a stop addressed to
    the other store is recorded there and leaves this one running."""
    from kernelext._store import actor, open_store

    gate = threading.Event()
    run_id = name("twin")
    handle = gated("twin", gate).start(run_id=run_id)
    other = open_store(str(tmp_path / "other.duckdb"))  # not made the current store
    try:
        assert other.create_run(run_id, "elsewhere", owner=actor())
        assert kx.stop(run_id, store=other, source="test") == "stopping"
        assert other.get_run(run_id)["status"] == "stopping"
        assert handle.alive and store.get_run(run_id)["status"] == "running"
    finally:
        other.close()
        gate.set()
        handle.wait(WAIT)


def test_a_stop_records_who_asked(store: Any) -> None:
    from kernelext._store import actor

    run_id = name("who-asked")
    assert store.create_run(run_id, "elsewhere", owner=actor())
    kx.stop(run_id, store=store, source="panel", who="alice")
    (event,) = [e for e in store.events(run_id) if e["kind"] == "stop_requested"]
    assert event["actor"] == "alice"
