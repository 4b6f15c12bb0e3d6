"""notebooks/expiry_and_restart.ipynb in a real kernel through nbclient.

The run suspends for an approval, the sweeper expires it, its panel says expired,
and the Restart button on the expired banner (clicked where the notebook asks the person
to, ``support.clicks``) starts a new run that sends only the emails the old run had not
sent (counted on the local delivery server).
"""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest
from support.clicks import with_clicks
from support.http_server import DeliveryServer
from support.notebooks import execute, text_of

pytestmark = pytest.mark.slow

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "expiry_and_restart.ipynb"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


def test_expired_panel_and_restart_button(
    store_path: Path, tmp_path: Path, delivery_server: DeliveryServer
) -> None:
    nb = with_clicks(nbformat.read(NOTEBOOK, as_version=4), NOTEBOOK.stem)
    env = {"KERNELEXT_STORE": str(store_path), "KERNELEXT_DEMO_OUTBOX": delivery_server.url}
    execute(nb, env, tmp_path)

    assert "suspended approval - deadline" in text_of(nb, "deadline")
    swept = text_of(nb, "sweep")
    assert "1 run(s) expired" in swept and "(deadline:approval" in swept
    assert "on_expire callbacks got: ['approvals-" in swept
    assert "claims still held: 0" in swept
    panel = text_of(nb, "panel")
    assert panel.splitlines()[0] == "expired" and "expired: deadline:approval" in panel
    assert "kx.restart(" in text_of(nb, "resume-refused")
    restarted = text_of(nb, "click-restart")
    assert "-restart1 parent: approvals-" in restarted and "-> completed" in restarted
    assert "result: 6" in restarted  # six tickets handled: three carried, three sent anew
    summary = text_of(nb, "summary")
    assert "restarted as approvals-" in summary and "completed, 6/6 steps" in summary

    # The widgets were really drawn: the banner with its Restart button, and the panel.
    state = json.dumps(nb.metadata["widgets"][WIDGET_STATE]["state"])
    assert "kernelext-expired" in state and '"description": "Restart"' in state
    assert "kernelext-panel" in state

    # Six tickets, six emails: the restart sent only T3..T5, each exactly once.
    bodies = sorted(d["body"]["body"] for d in delivery_server.deliveries)
    assert bodies == [f"ticket T{i} handled" for i in range(6)]
    keys = [d["idempotency_key"] for d in delivery_server.deliveries]
    assert len(set(keys)) == 6
