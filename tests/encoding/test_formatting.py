"""Durations, times and step numbers read the same on every surface (issue 20, item 3).

The formatter itself first, then real runs on a real DuckDB file seen through the panel,
the resume plan, the approval card, the timeline and ``kernelext show``: the same time left,
the same wall-clock time, the same step duration and the same step number, word for word.
The store's clock is held still once the run waits, so every surface reads the same now.
"""

from __future__ import annotations

import argparse
import datetime as dt
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.live import finish_live_runs, name
from support.zones import in_zone

import kernelext as kx
from kernelext._cli.runs import cmd_show
from kernelext._core.plan.resume_plan import plan
from kernelext._core.views.timeline import timeline
from kernelext._did_you_mean import closest, did_you_mean
from kernelext._formatting import duration_text, moment_text, step_label, step_number
from kernelext._store import Store, open_store, utcnow

WAIT = 60.0


# -- the formatter ---------------------------------------------------------------------------
def test_a_duration_reads_in_one_style() -> None:
    seconds = (0, 0.0001, 0.25, 0.4, 4.21, 42, 59.7, 185, 200, 3600, 3725, 90000)
    assert [duration_text(s) for s in seconds] == [
        "0 s", "<1 ms", "250 ms", "400 ms", "4.2 s", "42 s", "1 min", "3 min 5 s",
        "3 min 20 s", "1 h", "1 h 2 min", "1 d 1 h",
    ]  # fmt: skip
    week_less_a_second = dt.timedelta(days=7) - dt.timedelta(seconds=1)
    assert duration_text(week_less_a_second) == "6 d 23 h"  # time left is cut, never rounded up
    assert duration_text(-3725) == "1 h 2 min"  # the caller says "overdue by" or "ago"


def test_a_time_reads_with_its_date_and_zone() -> None:
    moment = dt.datetime(2026, 12, 6, 12, 0, 5, 250_000)
    aware = dt.datetime(2026, 12, 6, 13, 0, 5, tzinfo=dt.timezone(dt.timedelta(hours=1)))
    with in_zone("UTC"):
        assert moment_text(moment) == "2026-12-06 12:00:05 UTC"
        assert moment_text(moment, precise=True) == "2026-12-06 12:00:05.250 UTC"
        assert moment_text(aware) == "2026-12-06 12:00:05 UTC"


@pytest.mark.parametrize(
    ("zone", "winter", "summer"),
    [
        ("UTC", "2026-12-06 03:01:05 UTC", "2026-07-06 03:01:05 UTC"),
        ("Europe/Paris", "2026-12-06 04:01:05 CET", "2026-07-06 05:01:05 CEST"),
        ("America/New_York", "2026-12-05 22:01:05 EST", "2026-07-05 23:01:05 EDT"),
        ("Asia/Kolkata", "2026-12-06 08:31:05 IST", "2026-07-06 08:31:05 IST"),
        ("America/Sao_Paulo", "2026-12-06 00:01:05 UTC-03:00", "2026-07-06 00:01:05 UTC-03:00"),
    ],
)
def test_a_time_reads_in_the_readers_zone_with_the_zone_named(
    zone: str, winter: str, summer: str
) -> None:
    """The store keeps UTC; a person reads their own zone, and which zone it is."""
    with in_zone(zone):
        assert moment_text(dt.datetime(2026, 12, 6, 3, 1, 5)) == winter
        assert moment_text(dt.datetime(2026, 7, 6, 3, 1, 5)) == summer
        aware = dt.datetime(2026, 12, 6, 4, 1, 5, tzinfo=dt.timezone(dt.timedelta(hours=1)))
        assert moment_text(aware) == winter  # the instant it names, in the reader's zone


def test_steps_are_counted_from_one() -> None:
    assert step_number(0) == 1
    assert step_label(0) == "step 1"
    assert step_label(2, "2") == step_label(2, "3") == "step 3"  # a key that is only a number
    assert step_label(2, "fetch", 12) == "step 3 of 12 (fetch)"
    assert step_label(None, "fetch") == "step 'fetch'"


def test_one_did_you_mean_for_every_name() -> None:
    assert closest("stpo", ["stop", "status", "resume"]) == ["stop"]
    assert closest("res", ["resume", "runs"]) == ["resume"]  # a unique prefix wins
    assert closest("zzz", ["stop"]) == []
    assert did_you_mean("retention", ["retention_seconds", "store"]) == (
        " Did you mean 'retention_seconds'?"
    )
    assert did_you_mean("zzz", ["stop"]) == ""


# -- the same run on every surface -------------------------------------------------------------
class HeldClock:
    """Real time until held; then the store reads one instant."""

    def __init__(self) -> None:
        self.held: dt.datetime | None = None

    def __call__(self) -> dt.datetime:
        return self.held if self.held is not None else utcnow()


@pytest.fixture
def clock() -> HeldClock:
    return HeldClock()


@pytest.fixture
def store(store_path: Path, clock: HeldClock) -> Iterator[Store]:
    opened = open_store(str(store_path), clock=clock)
    yield opened
    finish_live_runs()
    opened.close()


def shown(store: Store, run_id: str, capsys: Any) -> list[str]:
    """What ``kernelext show RUN_ID`` prints."""
    cmd_show(argparse.Namespace(run_id=run_id, json=False), store)
    return capsys.readouterr().out.splitlines()


def step_rows(lines: list[str]) -> dict[str, dict[str, str]]:
    """The rows of the steps table of ``kernelext show``, by key, as column -> cell."""
    rows = table_rows(lines, "steps", ["step", "key", "name", "status", "took", "note"])
    return {row["key"]: row for row in rows}


def table_rows(lines: list[str], section: str, names: list[str]) -> list[dict[str, str]]:
    """The rows of one table of ``kernelext show``, as column -> cell."""
    start = lines.index(next(ln for ln in lines if ln.startswith(f"{section} (")))
    header = lines[start + 1]
    columns = [(m.group(), m.start()) for m in re.finditer(r"\S+", header)]
    assert [c for c, _ in columns] == names
    rows = []
    for line in lines[start + 2 :]:
        if not line.strip():
            break
        ends = [at for _, at in columns[1:]] + [len(line)]
        rows.append({c: line[at:end].strip() for (c, at), end in zip(columns, ends, strict=True)})
    return rows


@pytest.fixture
def in_paris() -> Iterator[None]:
    """The reader is in Paris (CET, CEST in summer): a zone other than the store's UTC."""
    with in_zone("Europe/Paris"):
        yield


def test_a_deadline_and_a_step_duration_read_the_same_everywhere(
    store: Store, clock: HeldClock, capsys: Any, in_paris: None
) -> None:
    from kernelext.widgets._approvals import ApprovalCard
    from kernelext.widgets._render import view_of
    from kernelext.widgets._static import saved_html

    transfer = kx.effect(name=name("transfer"), needs_approval=True)(lambda to: {"to": to})

    @kx.agent(name=name("same-words"))
    def payer(run: kx.Run) -> None:
        with run.step("quote"):
            run.state["quoted"] = 120
        with run.step("pay"):
            transfer("acme")

    run_id = name("same-words")
    handle = payer.start(run_id=run_id, store=store)
    assert handle.wait(WAIT) == "suspended"
    row = store.get_run(run_id)
    deadline: dt.datetime = row["deadline"]
    clock.held = deadline - dt.timedelta(days=2, hours=23, minutes=30, seconds=10)
    left, when = duration_text(deadline - clock.held), moment_text(deadline)
    assert left == "2 d 23 h"  # two units at most, the smaller one cut
    local = deadline.replace(tzinfo=dt.timezone.utc).astimezone()
    assert when == f"{local:%Y-%m-%d %H:%M:%S} {local.tzname()}"  # the reader's zone, named
    assert when.endswith((" CET", " CEST"))

    # the panel, and its saved copy stamped with the time it was read
    view = view_of(handle)
    assert f"; expires in {left} ({when})" in (view.outcome_text() or "")
    assert view.now is not None
    assert f"as of {moment_text(view.now)}" in saved_html(view)
    assert moment_text(view.now).endswith((" CET", " CEST"))
    # the resume plan
    previewed = plan(run_id, store)
    assert f"  deadline: {when}, in {left}" in previewed.text().splitlines()
    assert f"computed {moment_text(clock.held)}" in previewed.text()
    # the approval card (the request expires with the run)
    (request,) = kx.approvals(run_id, store=store)
    assert request.expires_at == deadline
    assert request.time_left == f"expires in {left}"
    assert f"waiting, expires in {left}" in ApprovalCard(request).header.value
    # the command line
    lines = shown(store, run_id, capsys)
    assert f"  expires {when}" in lines
    # the same step, timed on the timeline and in `kernelext show`
    (quote,) = [s for s in store.steps(run_id) if s["key"] == "quote"]
    took = duration_text(float(quote["duration_s"]))
    assert step_rows(lines)["quote"]["took"] == took
    (bar,) = [b for b in timeline(run_id, store).bars if b.key == "quote"]
    assert bar.title.splitlines()[:2] == ["step 1 (quote): completed", took]


def test_a_step_has_one_number_in_the_panel_the_timeline_the_plan_and_the_cli(
    store: Store, capsys: Any
) -> None:
    from kernelext.widgets._render import view_of

    in_third, go = threading.Event(), threading.Event()

    @kx.agent(name=name("numbered"))
    def numbered(run: kx.Run) -> None:
        for item in run.steps(["a", "b", "c", "d"], key=str):
            if item == "c":
                kx.stop(run.id, source="test")
                in_third.set()
                assert go.wait(WAIT)

    run_id = name("numbered")
    handle = numbered.start(run_id=run_id, store=store)
    try:
        assert in_third.wait(WAIT)
        # the third item, stored with ordinal 2, is "step 3" wherever it is read
        assert view_of(handle).step_text().startswith("step 3 of 4 (c): ")
        (bar,) = [b for b in timeline(run_id, store).bars if b.key == "c"]
        assert bar.ordinal == 2 and bar.title.startswith("step 3 (c): running")
        lines = shown(store, run_id, capsys)
        assert any(ln.startswith("  stops after step 3 (c)") for ln in lines)
        assert step_rows(lines)["c"]["step"] == "3"
    finally:
        go.set()
    assert handle.wait(WAIT) == "suspended"
    rows = step_rows(shown(store, run_id, capsys))
    assert [rows[k]["step"] for k in "abc"] == ["1", "2", "3"]
    previewed = plan(run_id, store)
    assert [s.ordinal for s in previewed.completed] == [0, 1, 2]
    assert previewed.next_step is not None and previewed.next_step.ordinal == 3
    assert previewed.next_step.note == "step 4 of 4: the first item not completed"
    assert "  next step: step 4 of 4: the first item not completed" in str(previewed)


def test_a_step_by_its_default_key_reads_from_one_on_every_surface(
    store: Store, capsys: Any
) -> None:
    """``run.steps(items)`` keys its steps by the ordinal ("0", "1"): no surface shows that
    key for a number, every one reads ``step 1``, ``step 2``."""
    from kernelext._cli.approvals import approvals_command
    from kernelext.widgets._approvals import ApprovalCard, QuestionCard
    from kernelext.widgets._render import view_of

    note = kx.effect(name=name("note"))(lambda to: {"noted": to})
    pay = kx.effect(name=name("pay"), needs_approval=True)(lambda to: {"paid": to})

    @kx.agent(name=name("by-ordinal"))
    def payer(run: kx.Run) -> None:
        for item in run.steps(["a", "b"]):
            (note if item == "a" else pay)(item)

    paid = name("by-ordinal")
    handle = payer.start(run_id=paid, store=store)
    assert handle.wait(WAIT) == "suspended"
    assert [s["key"] for s in store.steps(paid)] == ["0", "1"]  # the stored keys stay

    assert f"run={paid} step 2 " in repr(kx.approvals(paid, store=store))
    (request,) = kx.approvals(paid, store=store)
    assert request.step == "1" and request.step_text == "step 2"
    assert " · step 2 · " in ApprovalCard(request).header.value
    text = plan(paid, store).text().splitlines()
    assert any(ln.startswith("  open approvals: ") and ln.endswith(" in step 2") for ln in text)
    assert "  skipped (completed steps): 1: step 1" in text
    effects = dict(view_of(handle).effects)
    assert [label.split(" [")[1] for label in effects] == ["step 1]"]
    effect_columns = ["tool", "step", "step_key", "call_ordinal", "status", "key", "result"]
    (noted,) = table_rows(shown(store, paid, capsys), "effects", [*effect_columns, "error"])
    assert (noted["step"], noted["step_key"]) == ("1", "0")  # the number, next to the raw key
    ticks = timeline(paid, store).ticks
    assert [t.title.splitlines()[0].split(" [")[1].split("]")[0] for t in ticks] == ["step 1"]

    @kx.agent(name=name("asks-by-ordinal"))
    def asker(run: kx.Run) -> None:
        for _ in run.steps(["a"]):
            run.ask("which?", schema=str)

    asked = name("asks-by-ordinal")
    assert asker.start(run_id=asked, store=store).wait(WAIT) == "suspended"
    assert f"'which?' run={asked} step 1 " in repr(kx.questions(asked, store=store))
    (question,) = kx.questions(asked, store=store)
    assert question.step_text == "step 1"
    assert " · step 1 · " in QuestionCard(question).header.value
    text = plan(asked, store).text().splitlines()
    assert "  runs again: step 1 (cancelled: runs again)" in text
    assert "  next step: step 1 again" in text
    assert "  open questions: which? in step 1" in text

    approvals_command(argparse.Namespace(run=None, json=False), store)
    out = capsys.readouterr().out
    assert f"question of run {asked} (step 1): which?" in out
    (row,) = [ln for ln in out.splitlines() if paid in ln and str(request.id)[:8] in ln]
    assert re.search(rf"{re.escape(paid)}\s+step 2\s", row)


def test_the_retention_period_reads_as_a_duration(
    store: Store, clock: HeldClock, capsys: Any
) -> None:
    kx.configure(retention_seconds=30 * 86400)

    @kx.agent(name=name("kept"))
    def kept(run: kx.Run) -> None:
        with run.step("hold"):
            run.state["blob"] = b"x" * 64
        run.suspend("approval")

    run_id = name("kept")
    assert kept.start(run_id=run_id, store=store).wait(WAIT) == "suspended"
    deadline: dt.datetime = store.get_run(run_id)["deadline"]
    clock.held = deadline + dt.timedelta(seconds=1)
    assert kx.sweep(store=store).expired_ids == [run_id]
    clock.held = deadline + dt.timedelta(days=30, seconds=2)
    assert kx.sweep(store=store).removed_ids == [run_id]
    reasons = store.read(
        "SELECT reason FROM events WHERE run_id = ? AND kind = 'snapshots_removed'", (run_id,)
    )
    assert reasons == [("retention period of 30 d ended",)]
    assert any("retention period of 30 d ended" in ln for ln in shown(store, run_id, capsys))


def test_a_cell_step_is_named_by_its_first_line_never_by_its_id() -> None:
    from kernelext._formatting import name_cell, reason_text

    key = "cell:be474f7e-0000-4000-8000-000000000001"
    assert step_label(1, key) == "step 2 (cell be474f7e)"  # a cell this process never ran
    name_cell(key, "\n# fetch every page\nfor url in urls:\n    fetch(url)\n")
    assert step_label(1, key) == 'step 2 (cell "fetch every page")'
    name_cell("src:0123456789abcdef", "x = compute_a_really_long_name_for_something(arg, other)")
    assert step_label(0, "src:0123456789abcdef") == (
        'step 1 (cell "x = compute_a_really_long_name_for_some…")'
    )
    name_cell("load-data", "irrelevant")  # --step NAME: the name is the title
    assert step_label(0, "load-data") == "step 1 (load-data)"
    assert reason_text("user_stop", "panel") == "stopped by you (panel)"
    assert reason_text("user_stop", "interrupt") == "stopped by you (■)"
    assert reason_text("approval") == "waiting for an approval"
    assert reason_text("something_new") == "something_new"
