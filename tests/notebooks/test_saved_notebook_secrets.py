"""A saved notebook never holds a registered secret: every display reads the store's door.

A real kernel (nbclient) runs a notebook that registers a secret, then agents whose error
message, result, step results, effect arguments and results, approval arguments and
``run.state`` carry it, next to a canary (a plain marker planted through the same paths).
Every kernelext display is shown (the panel and its saved copy, reprs, ``kx.runs()``,
``kx.approvals()``, ``kx.timeline``, ``kx.panel``, ``%%ledger``); the notebook is saved and exported
with nbconvert. The saved JSON, the HTML export and the widget state hold the canary
(the search sees the data) and never the secret. Time: about 15 s (one kernel).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import nbformat
from support.notebooks import execute, notebook

SECRET_TAIL = "QQ7xZ81secretvalue"
CANARY = "canary-MARK-4242"

SETUP = f"""
%load_ext kernelext
import kernelext as kx
SECRET = kx.secrets.register("sk-live-" + "{SECRET_TAIL[:7]}" + "{SECRET_TAIL[7:]}")
CANARY = "canary-" + "{CANARY[7:]}"  # (neither is in the notebook's source)
BOTH = f"{{CANARY}} {{SECRET}}"

@kx.effect
def send(to, body, *, idempotency_key=None):
    return {{"echo": body, "note": f"sent {{body}}"}}

@kx.effect(needs_approval=True)
def pay(to, amount, memo, *, idempotency_key=None):
    return {{"memo": memo}}

@kx.agent
def fails(run, n):
    for i in run.steps(range(n)):
        send("a@example.com", BOTH)
    raise RuntimeError(f"boom {{BOTH}}")

@kx.agent
def returns(run):
    for i in run.steps(range(2)):
        send("b@example.com", BOTH)
    return {{"answer": BOTH}}

@kx.agent
def keeps(run):
    for i in run.steps(range(1)):
        run.state["kept"] = BOTH

@kx.agent
def asks(run):
    pay("c", 5, BOTH)
"""

CELLS = {
    "failed": 'h = fails.start(2, run_id="leak-failed")\nh.wait(60)\nh',
    "again": "print(repr(h), h.status_text)\nh",
    "returned": 'r = returns.start(run_id="leak-result")\nr.wait(60)\nr',
    "state": 'k = keeps.start(run_id="leak-state")\nk.wait(60)\nk',
    "approval": 'a = asks.start(run_id="leak-ask")\na.wait(60)\nkx.approvals()',
    "runs": "kx.runs()",
    "timeline": 'kx.timeline("leak-failed")',
    "panel": 'kx.panel("leak-failed")',
    "ledger": "%%ledger\nSELECT e.run_id, e.args, e.result, s.error FROM effects e "
    "JOIN steps s ON s.run_id = e.run_id AND s.key = e.step_key",
    "steps": "h.steps()[-1]['status'], r.steps()[-1]['status']",
}


def _notebook() -> Any:
    return notebook(("setup", SETUP), *CELLS.items())


def _outputs_of(nb: Any, cell_id: str) -> str:
    cell = next(c for c in nb["cells"] if c.get("id") == cell_id)
    return json.dumps(cell.get("outputs", []))


def test_a_saved_and_exported_notebook_holds_no_registered_secret(tmp_path: Path) -> None:
    from nbconvert import HTMLExporter

    nb = execute(_notebook(), {"KERNELEXT_STORE": str(tmp_path / "s.duckdb")}, tmp_path)
    path = tmp_path / "saved.ipynb"
    nbformat.write(nb, path)
    saved = path.read_text()
    body, _ = HTMLExporter().from_filename(str(path))
    widgets = json.dumps(json.loads(saved)["metadata"].get("widgets", {}))

    for name, text in [("saved notebook", saved), ("HTML export", body), ("widgets", widgets)]:
        assert CANARY in text, f"the search does not see the {name}"
        assert SECRET_TAIL not in text, f"the {name} holds the secret"
    reread = json.loads(saved)
    for cell_id in ["failed", "again", "approval", "runs", "panel", "ledger"]:
        assert CANARY in _outputs_of(reread, cell_id), cell_id  # each path was shown
    assert "boom" in _outputs_of(reread, "failed")  # the error itself is shown, scrubbed
    assert "failed" in _outputs_of(reread, "state")  # run.state refused the secret


HELD = "held-" + "R3G1STER3D" * 2


def test_the_panel_shows_the_error_as_stored_and_h_error_keeps_the_exception(store: Any) -> None:
    """In this process: the panel's text and HTML, the handle's repr and status text show
    the failed run's error as stored (masked); ``h.error`` is still the exception the
    agent raised, for code."""
    import kernelext as kx
    from kernelext._core.encoding.secrets import SECRETS
    from kernelext.widgets._render import to_html, to_text, view_of

    @kx.agent(name="fails-held")
    def fails(run: kx.Run) -> None:
        raise RuntimeError(f"boom {CANARY} {HELD}")

    SECRETS.register(HELD)
    try:
        h = fails.start(run_id="held-secret")
        assert h.wait(30) == "failed"
        view = view_of(h)
        for shown in (to_text(view), to_html(view), repr(h), h.status_text):
            assert HELD not in shown, shown
        assert CANARY in to_text(view) and "boom" in to_html(view)
        assert isinstance(h.error, RuntimeError) and HELD in str(h.error)  # for code
    finally:
        SECRETS.forget(HELD)
