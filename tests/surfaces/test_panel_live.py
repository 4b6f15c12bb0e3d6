"""An open panel is a live view of its run in the store: a change made by another process
(the command line, another Python process) shows up without any cell running, and nothing
is read while nothing changes. Real stores (a DuckDB file, PostgreSQL), real processes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.cli import kernelext_ok as cli
from support.live import name, wait_until
from support.store_reads import Reads

import kernelext as kx
from kernelext._core.lifecycle import control
from kernelext.widgets import _addons as addons
from kernelext.widgets import panel_for
from kernelext.widgets._approvals import ApprovalCard, ApprovalsBox
from kernelext.widgets._panel import ControlPanel
from kernelext.widgets._plan import PlanPreview
from kernelext.widgets._timeline import LiveTimeline
from kernelext.widgets._watch import watch_of

pytestmark = pytest.mark.both_backends
WAIT = 60.0


@pytest.fixture(autouse=True)
def _addons_installed() -> Iterator[None]:
    addons.install()
    yield


def addon(panel: ControlPanel, kind: type) -> Any:
    (found,) = [
        a for a in (*panel.requests.children, *panel.addons.children) if isinstance(a, kind)
    ]
    return found


def between_looks(watch: Any, reads: Reads) -> tuple[int, int]:
    """(reads, looks) counted while no look is under way."""
    with watch._check_lock:
        return reads.count, watch.checks


def settled(panel: ControlPanel) -> Any:
    """The panel's store watch once what changed before is drawn: two looks of the watch
    since now, the last two found nothing committed (DuckDB) and no redraw is under way."""
    watch = watch_of(panel.handle.store)
    start = watch.checks
    timeline = addon(panel, LiveTimeline)

    def idle() -> bool:
        quiet = watch.quiet >= 2 or panel.handle.store.change_signal() is None
        return (
            watch.checks >= start + 2
            and quiet
            and not panel.throttle.running
            and not timeline.throttle.running
        )

    wait_until(idle, "the panel to settle")
    return watch


def approval_agent(tag: str) -> Any:
    @kx.effect(name=f"{tag}_pay", needs_approval=True)
    def pay(amount: int) -> dict[str, int]:
        return {"paid": amount}

    @kx.effect(name=f"{tag}_note")
    def note(text: str) -> str:
        return text

    @kx.agent(name=f"{tag}-agent")
    def agent(run: kx.Run) -> None:
        for i in run.steps(range(3)):
            note(f"item {i}")
            if i == 1:
                pay(10)

    return agent


def test_an_approval_from_the_command_line_shows_in_an_open_panel(
    store: Any, store_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    tag = name("cli-approve")
    handle = approval_agent(tag).start(run_id=tag, store=store)
    assert handle.wait(WAIT) == "suspended"
    panel = panel_for(handle)
    try:
        box = addon(panel, ApprovalsBox)
        cards = [c for c in box.cards if isinstance(c, ApprovalCard)]
        assert len(cards) == 1 and not cards[0].approve_button.disabled
        assert "waiting for your approval" in box.children[0].value  # first in the panel
        assert panel.children.index(panel.requests) < panel.children.index(panel.step)
        assert panel.resume_button.layout.display == "none"  # the decision replaces Resume
        plan = addon(panel, PlanPreview)
        assert plan.section.get_title(0).startswith("Resume plan: Blocked")
        watch = settled(panel)

        reads = Reads(store, monkeypatch)
        looked = watch.checks
        wait_until(lambda: watch.checks >= looked + 3, "three more looks")
        count, checks = between_looks(watch, reads)
        if store.change_signal() is not None:  # DuckDB: the file's stat, no query at all
            assert count == 0, "nothing is read while nothing changes"
        else:  # PostgreSQL: one small query a look, nothing else
            assert count == checks - looked

        (request,) = kx.approvals(tag, store=store)
        cli("approve", str(request.key), "--note", "from a terminal", store=store_path)
        # no cell runs here: the store watch notices, the panel redraws itself
        wait_until(lambda: not box.cards, "the card of the decided request to go")
        elsewhere = box.children[0].value
        assert "The approval was approved in a terminal by " in elsewhere
        assert "Press Resume to go on" in elsewhere
        wait_until(  # back, now that nothing waits (the redraw goes on after the cards)
            lambda: panel.resume_button.layout.display is None, "Resume to come back"
        )
        wait_until(lambda: "Ready" in plan.section.get_title(0), "the plan to say Ready")
        assert not panel.resume_button.disabled
        panel.resume_button.click()
        assert panel.handle.wait(WAIT) == "completed"
    finally:
        panel.detach()


def test_a_note_typed_in_a_card_survives_a_change_of_the_run_in_the_store(
    store: Any, store_path: Any
) -> None:
    """The panel redraws its cards when the run changes in the store; a card whose request
    still waits is the same card, with the note its reader was typing."""
    tag = name("note-kept")
    handle = approval_agent(tag).start(run_id=tag, store=store)
    assert handle.wait(WAIT) == "suspended"
    panel = panel_for(handle)
    try:
        box = addon(panel, ApprovalsBox)
        (card,) = box.cards
        settled(panel)
        card.note.value = "invoice checked"  # half typed when another process writes
        seen = panel.store_changes
        stop = subprocess.run(  # a stop request of a suspended run: an event, exit 3
            [sys.executable, "-m", "kernelext", "stop", tag, "--store", str(store_path)],
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert "it is suspended" in stop.stdout, stop.stdout + stop.stderr
        wait_until(lambda: panel.store_changes > seen, "the panel to see the change")
        settled(panel)
        assert box.cards == (card,)
        assert card.note.value == "invoice checked"
        card.approve_button.click()
        assert panel.handle.wait(WAIT) == "completed"
        (row,) = store.read("SELECT note FROM approvals WHERE run_id = ?", (tag,))
        assert row == ("invoice checked",)
    finally:
        panel.detach()


def test_a_question_asked_again_with_another_schema_gets_a_new_card(store: Any) -> None:
    """A step run again may ask its question anew under the same key with another answer
    schema: the card is built again for it, not kept with the old input."""
    import json
    import uuid
    from types import SimpleNamespace

    run_id = name("asked-again")
    store.create_run(run_id, "agent")
    store.transition(run_id, "suspended", ("running",), reason="input")
    key = uuid.uuid4()

    def ask(schema: dict[str, Any], prompt: str) -> None:
        store.ask_question(
            {"key": key, "run_id": run_id, "step": "s1", "step_ordinal": 0, "call_ordinal": 0,
             "prompt": prompt, "answer_schema": json.dumps(schema), "default_answer": None,
             "expires_at": None}
        )  # fmt: skip

    ask({"enum": ["red", "blue"]}, "Which colour?")
    panel = SimpleNamespace(
        view=None, store_changes=0, handle=SimpleNamespace(run_id=run_id, store=store)
    )
    box = ApprovalsBox(panel)
    (first,) = box.cards
    ask({"type": "integer", "minimum": 1, "maximum": 9}, "How many?")
    panel.store_changes += 1
    box.refresh()
    (card,) = box.cards
    assert card is not first and "How many?" in card.header.value
    card.input.value = 3
    card.answer_button.click()
    assert "refused" not in card.message.value.lower(), card.message.value
    (row,) = store.read("SELECT answer FROM questions WHERE run_id = ?", (run_id,))
    assert json.loads(row[0]) == 3


def long_step_agent(tag: str, release: threading.Event, last: threading.Event | None = None) -> Any:
    """Three steps, one effect each; the second is long (until ``release``), the third
    begins its effect once ``last`` is set."""

    @kx.effect(name=f"{tag}_send")
    def send(i: int) -> int:
        return i

    @kx.agent(name=f"{tag}-agent")
    def agent(run: kx.Run) -> None:
        for i in run.steps(range(3)):
            if i == 2 and last is not None:
                assert last.wait(WAIT), "the test never let the last step go on"
            send(i)
            if i == 1:
                assert release.wait(WAIT), "the test never let the long step end"

    return agent


def stopped_in_the_long_step(panel: ControlPanel, release: threading.Event, handle: Any) -> None:
    """Stop pressed in the panel while ``long_step_agent``'s long step runs (its two first
    effects applied), then the step let go: the run ends suspended."""
    store = handle.store
    wait_until(lambda: store.effect_counts(handle.run_id).get("applied") == 2, "two effects")
    panel.stop_button.click()
    release.set()
    assert handle.wait(WAIT) == "suspended"


def test_a_stop_from_the_command_line_during_a_long_step_redraws_panel_and_timeline(
    store: Any, store_path: Any
) -> None:
    tag = name("cli-stop")
    release = threading.Event()
    handle = long_step_agent(tag, release).start(run_id=tag, store=store)
    try:
        panel = panel_for(handle)
        timeline = addon(panel, LiveTimeline)
        wait_until(lambda: store.effect_counts(tag).get("applied") == 2, "two effects")
        cli("stop", tag, store=store_path)
        wait_until(lambda: panel.view is not None and panel.view.status == "stopping", "stopping")
        wait_until(
            lambda: (
                "· stopping ·" in timeline.picture.value
                and 'data-kind="stop_request"' in timeline.picture.value
            ),
            "the timeline to say stopping, with the stop drawn",
        )
    finally:
        release.set()
    assert handle.wait(WAIT) == "suspended"
    wait_until(lambda: panel.view is not None and panel.view.status == "suspended", "suspended")
    wait_until(lambda: "· suspended ·" in timeline.picture.value, "the picture to say suspended")
    wait_until(lambda: "2 effects: 2 applied" in panel.effects.value, "the effect counts")
    panel.detach()


def test_effects_and_their_counts_are_kept_across_resume(store: Any) -> None:
    tag = name("counts")
    release, last = threading.Event(), threading.Event()
    handle = long_step_agent(tag, release, last).start(run_id=tag, store=store)
    panel = panel_for(handle)
    try:
        stopped_in_the_long_step(panel, release, handle)
        panel.refresh()
        assert "2 effects: 2 applied" in panel.effects.value
        panel.resume_button.click()  # the resumed run waits before its next effect
        assert panel.handle is not handle and panel.handle.alive
        shown = panel.refresh()
        assert [label for label, _ in shown.effects] == [
            f"{tag}_send [step 1]",
            f"{tag}_send [step 2]",
        ]
        assert "no effects yet" not in panel.effects.value
        assert "2 effects: 2 applied" in panel.effects.value
        last.set()
        assert panel.handle.wait(WAIT) == "completed"
        panel.refresh()
        assert "3 effects: 3 applied" in panel.effects.value
    finally:
        release.set()
        last.set()
        panel.detach()


OTHER_PROCESS = """
import sys
import kernelext as kx

@kx.effect(name="{tag}_send")
def send(i):
    return i

@kx.agent(name="{tag}-agent")
def agent(run):
    for i in run.steps(range(3)):
        send(i)

store = kx.open_store(sys.argv[1])
handle = kx.resume("{tag}", store=store, allow_code_change=True)  # another body
print(handle.wait(120))
"""


def test_a_resume_in_another_python_process_shows_in_an_open_panel(
    store: Any, store_path: Any, tmp_path: Path
) -> None:
    tag = name("elsewhere")
    release = threading.Event()
    handle = long_step_agent(tag, release).start(run_id=tag, store=store)
    panel = panel_for(handle)
    try:
        stopped_in_the_long_step(panel, release, handle)
        settled(panel)
        script = tmp_path / "other.py"
        script.write_text(textwrap.dedent(OTHER_PROCESS.format(tag=tag)))
        done = subprocess.run(
            [sys.executable, str(script), str(store_path)],
            capture_output=True,
            text=True,
            timeout=240,
            env={**os.environ},
        )
        assert done.stdout.strip().endswith("completed"), done.stdout + done.stderr
        wait_until(
            lambda: (
                "completed: 3/3 steps" in panel.outcome.value
                and "3 effects: 3 applied" in panel.effects.value
                and panel.resume_button.disabled
                and panel.stop_button.disabled
            ),
            "the panel to show the run completed elsewhere (its buttons off)",
        )
    finally:
        release.set()
        panel.detach()


def test_a_detached_panel_stops_watching(store: Any) -> None:
    tag = name("detach")
    handle = approval_agent(tag).start(run_id=tag, store=store)
    assert handle.wait(WAIT) == "suspended"
    panel = panel_for(handle)
    watch = watch_of(store)
    assert tag in watch.watched
    panel.detach()
    assert tag not in watch.watched
    handle2 = control.handle_for(tag, store=store)
    assert handle2.run_id == tag


def test_panels_on_one_store_share_one_look(store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    panels = []
    for n in range(3):
        tag = name(f"shared{n}")
        handle = approval_agent(tag).start(run_id=tag, store=store)
        assert handle.wait(WAIT) == "suspended"
        panels.append(panel_for(handle))
    try:
        watch = watch_of(store)
        assert {p.handle.run_id for p in panels} <= set(watch.watched)
        for panel in panels:
            settled(panel)
        reads = Reads(store, monkeypatch)
        with watch._check_lock:
            looked, moved = watch.checks, watch.moved
        wait_until(lambda: watch.checks >= looked + 3, "three more looks")
        with watch._check_lock:
            count, checks, moved = reads.count, watch.checks, watch.moved - moved
        # One query a look for the three runs, and only in a look that found something
        # committed: on DuckDB, where a look reads the file's stat, a look that found
        # nothing committed queries nothing (PostgreSQL has no such signal: every look).
        if store.change_signal() is None:
            assert count == checks - looked == moved
        else:
            assert count == moved <= checks - looked
            assert moved < checks - looked, "a quiet store was looked at without a query"
    finally:
        for panel in panels:
            panel.detach()
