"""The LLM notebooks in JupyterLab in a real browser, against the local model.

``llm_agent`` (kx.openai), ``anthropic_agent`` (kx.anthropic), ``openai_agents`` (the
OpenAI Agents SDK) and ``pydantic_ai_agent`` (Pydantic AI): the kernel reaches the test's
scripted server (``support.llm_server``) through ``OPENAI_BASE_URL`` or
``ANTHROPIC_BASE_URL``, which the notebook reads as "use this model". The panel shows the
run as its conversation (turns, tool calls, tokens, cost where priced) through a Stop and a
Resume clicked in the page, and the internal key of effects made outside steps appears
nowhere in the page.

Screenshots go to tests/artifacts/browser/<test name>/.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.http_server import DeliveryServer
from support.live import wait_until
from support.llm_server import LLMServer

from browser import jupyterlab as lab
from browser.harness import PANEL, REPO_ROOT, lab_root, opened_in_lab
from kernelext._core.encoding.names import OUTSIDE_STEPS

pytestmark = [pytest.mark.browser, pytest.mark.slow]


CONVERSATION = re.compile(
    r"(\d+) turns? · (\d+) tool calls? · ([\d,]+) tokens \(([\d,]+) prompt \+ ([\d,]+) "
    r"completion\)(?: · \$\d+\.\d{4})?"  # priced where the notebook gives prices
)
HELD_TURN = 1  # the model's second answer (after one tool result) waits for the Stop


@pytest.fixture
def llm(tmp_path: Path) -> Iterator[LLMServer]:
    with LLMServer(log_path=tmp_path / "llm.jsonl", hold_turns=(HELD_TURN,)) as server:
        yield server


def asked(llm: LLMServer, turn: int) -> bool:
    """Whether the model was asked ``turn`` (the turn after ``turn`` tool results)."""
    return any(t == turn for _, t in llm.per_turn())


def cell_index(notebook: Path, cell_id: str) -> int:
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    return next(i for i, c in enumerate(cells) if c.get("id") == cell_id)


def model_env(notebook: str, llm: LLMServer) -> tuple[dict[str, str], str]:
    """What points ``notebook`` at the scripted model, and the URL its setup prints."""
    if notebook == "anthropic_agent":
        env = {"ANTHROPIC_BASE_URL": llm.url, "ANTHROPIC_API_KEY": "EMPTY"}
        return {**env, "ANTHROPIC_MODEL": "scripted"}, llm.url
    env = {"OPENAI_BASE_URL": llm.base_url, "OPENAI_API_KEY": "EMPTY", "OPENAI_MODEL": "scripted"}
    # The Agents SDK would send its traces to a server of its own: not from a test.
    return {**env, "OPENAI_AGENTS_DISABLE_TRACING": "1"}, llm.base_url


@pytest.mark.parametrize(
    "notebook", ["llm_agent", "anthropic_agent", "openai_agents", "pydantic_ai_agent"]
)
def test_llm_panel_shows_turns_and_tokens_through_stop_and_resume(
    notebook: str,
    tmp_path: Path,
    store_path: Path,
    delivery_server: DeliveryServer,
    llm: LLMServer,
    page: Any,
    shots_folder: Path,
) -> None:
    from playwright.sync_api import expect

    path = REPO_ROOT / "notebooks" / f"{notebook}.ipynb"
    root = lab_root(tmp_path)
    name = lab.copy_notebook(path, root)
    model, printed = model_env(notebook, llm)
    env = {
        "KERNELEXT_STORE": str(store_path),
        "KERNELEXT_DEMO_OUTBOX": f"{delivery_server.url}/outbox",
        "KERNELEXT_DEMO_OFFLINE": "",
        **model,
    }
    with opened_in_lab(page, shots_folder, root, name, env) as (_server, shot):
        setup = lab.run_cell(page, cell_index(path, "setup"))
        assert f"model: scripted at {printed}" in lab.output_text(setup)
        for cell_id in ("tools", "agent"):
            lab.run_cell(page, cell_index(path, cell_id))
        panel = lab.run_cell(page, cell_index(path, "start")).locator(PANEL)
        status = panel.locator(".kernelext-status")
        # The model answered once and was asked again (that answer is held until the Stop
        # is in): the panel counts the conversation live, with the first answer's tokens.
        wait_until(lambda: asked(llm, HELD_TURN), "the model asked for its second answer")
        expect(panel).to_contain_text(re.compile(r"2 turns · 1 tool call · [\d,]+ tokens"))
        expect(status).to_have_text("running")
        shot("running")

        # Stop while the model thinks over its second answer: the call in flight ends with
        # its answer, and the stop lands just before the next model call: two turns.
        lab.button(panel, "Stop").click()
        expect(status).to_have_text("stopping")
        llm.release_held()
        expect(status).to_have_text("suspended")
        stopped = CONVERSATION.search(panel.inner_text())
        assert stopped is not None, panel.inner_text()
        stopped_turns = int(stopped.group(1))
        assert stopped_turns == 2, panel.inner_text()
        # What a resume does: go on after the second turn, asking no earlier turn again.
        expect(panel.locator(".kernelext-plan-preview")).to_contain_text(
            "the conversation continues after turn 2"
        )
        shot("suspended")

        lab.button(panel, "Resume").click()
        expect(status).to_have_text("completed")
        expect(panel.locator(".kernelext-outcome")).to_contain_text(
            re.compile(r"completed: (4 steps · )?4 turns · 3 tool calls · [\d,]+ tokens")
        )
        expect(panel.locator(".kernelext-conversation")).to_contain_text("last: assistant: ")
        done = CONVERSATION.search(panel.locator(".kernelext-outcome").inner_text())
        assert done is not None
        turns, tools, tokens, prompt, completion = (int(g.replace(",", "")) for g in done.groups())
        assert (turns, tools) == (4, 3) and tokens == prompt + completion > 0
        panel.scroll_into_view_if_needed()
        shot("completed")
        dom = page.content()
        assert OUTSIDE_STEPS not in dom, dom[max(0, dom.find(OUTSIDE_STEPS) - 300) :][:600]

    # each turn was asked of the model once: the resume replayed the first ones
    assert sorted(llm.per_turn().values()) == [1, 1, 1, 1], llm.per_turn()
    delivery_server.settle()
    sent = sorted(d["path"].rsplit("/", 1)[-1] for d in delivery_server.deliveries)
    assert sent == ["email", "refund"], sent
