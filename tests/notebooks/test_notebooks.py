"""The notebooks in notebooks/, and kernel deaths, through nbclient and real kernels.

Every notebook runs headless with ``store_widget_state=True``; effects go to the
local delivery server so that what reached the outside world is counted there, not
in the kernel that may die. The notebooks press none of their own buttons: the clicks a
person makes (Stop, Resume, a decision) are cells this harness inserts
(``support.clicks``).
"""

from __future__ import annotations

import copy
import json
import re
import time
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbclient.exceptions import CellExecutionError, DeadKernelError
from nbconvert import HTMLExporter
from support.clicks import with_clicks
from support.http_server import DeliveryServer
from support.kernels import KernelSession
from support.notebooks import execute, text_of
from support.postgres import find_postgres_bin

from kernelext._store import open_store

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]
POSTGRES_NOTEBOOKS = {"dask_batch"}  # a PostgreSQL store shared with worker processes: below
NOTEBOOKS = sorted(
    p for p in (REPO_ROOT / "notebooks").glob("*.ipynb") if p.stem not in POSTGRES_NOTEBOOKS
)
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
# Seconds per step where the default 0.3 s is too short for the test's Stop to land before
# the run ends on a busy machine: the batch's five waves of 32 items, the model's 4 answers.
PACE = dict.fromkeys(
    ["batch", "llm_agent", "openai_agents", "anthropic_agent", "pydantic_ai_agent"], "1.0"
)


@pytest.fixture
def env(store_path: Path, delivery_server: DeliveryServer) -> dict[str, str]:
    return {
        "KERNELEXT_STORE": str(store_path),
        "KERNELEXT_DEMO_STEP_SECONDS": "0.3",
        "KERNELEXT_DEMO_OUTBOX": delivery_server.url + "/outbox",
        "KERNELEXT_DEMO_OFFLINE": "1",  # llm_agent: the local scripted model, never a real API
    }


def deliveries_per_key(server: DeliveryServer) -> dict[str, int]:
    counts: dict[str, int] = {}
    for record in server.deliveries:
        key = record["idempotency_key"]
        counts[key] = counts.get(key, 0) + 1
    return counts


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_every_notebook_runs_headless(
    path: Path, env: dict[str, str], tmp_path: Path, delivery_server: DeliveryServer
) -> None:
    paced = {**env, "KERNELEXT_DEMO_STEP_SECONDS": PACE.get(path.stem, "0.3")}
    nb = execute(with_clicks(nbformat.read(path, as_version=4), path.stem), paced, tmp_path)
    delivery_server.settle()
    counts = deliveries_per_key(delivery_server)
    assert set(counts.values()) <= {1}, counts  # nothing delivered twice
    if path.stem == "quickstart":
        assert len(counts) == 12
        # The click shows the stop pending, unless the run reached its next step boundary
        # (0.3 s away at most) before the panel redrew: then the stop has landed already.
        # Which one a busy machine shows is its scheduling; either way the stop was taken.
        clicked = text_of(nb, "click-stop")
        assert "stop pending since" in clicked or "is suspended already" in clicked, clicked
        # Either way the stop was the panel's, soft, landed at a step boundary: nothing forced.
        store = open_store(env["KERNELEXT_STORE"])
        try:
            (run_id,) = [row[0] for row in store.read("SELECT id FROM runs")]
            kinds = [(e["kind"], e["source"]) for e in store.events(run_id)]
        finally:
            store.close()
        assert kinds.count(("stop_requested", "panel")) == 1, kinds
        assert not [k for k, _ in kinds if k in ("force_requested", "stop_forced")], kinds
        assert "'suspended'" in text_of(nb, "wait")
        assert "'completed'" in text_of(nb, "click-resume")
        state = json.dumps(nb.metadata["widgets"][WIDGET_STATE]["state"])
        assert "kernelext-panel" in state and "completed: 12/12 steps" in state
        # the start cell shows the saved copy of the panel, then the live widget
        saved, start = [
            o["data"] for o in next(c for c in nb.cells if c.get("id") == "start").outputs
        ]
        assert set(saved) == {"text/html"} and "completed" in saved["text/html"]
        assert {"application/vnd.jupyter.widget-view+json", "text/html"} <= set(start)
        assert_static_html_shows_the_panel(nb)
        plan_cell = next(c for c in nb.cells if c.get("id") == "plan").outputs[0]["data"]
        assert "text/html" in plan_cell and "suspended" in text_of(nb, "plan")
        picture = next(c for c in nb.cells if c.get("id") == "timeline").outputs[0]["data"]
        assert "<svg" in picture["text/html"] and "kx-step" in picture["text/html"]
    if path.stem in ("llm_agent", "anthropic_agent"):
        assert len(counts) == 2
        assert "'suspended'" in text_of(nb, "wait")
        assert "'completed'" in text_of(nb, "click-resume")
        assert "{0: 1, 1: 1, 2: 1, 3: 1}" in text_of(nb, "check")  # one request per turn
        state = json.dumps(nb.metadata["widgets"][WIDGET_STATE]["state"], ensure_ascii=False)
        # the panel shows the conversation: 4 turns, the 3 tool calls, tokens and their cost
        assert re.search(r"4 turns · 3 tool calls · [\d,]+ tokens \(", state), state[:2000]
        assert "· $0.0" in state and "__run__" not in state  # nor in the timeline
        assert "4 turns · 3 tool calls" in text_of(nb, "check")
    if path.stem in ("openai_agents", "pydantic_ai_agent"):
        assert len(counts) == 2  # the refund and the email, each once (above)
        assert "'suspended'" in text_of(nb, "wait")
        assert "'completed'" in text_of(nb, "click-resume")
        assert "{0: 1, 1: 1, 2: 1, 3: 1}" in text_of(nb, "check")  # one request per turn
        assert "4 turns · 3 tool calls" in text_of(nb, "check")
        state = json.dumps(nb.metadata["widgets"][WIDGET_STATE]["state"], ensure_ascii=False)
        assert re.search(r"4 turns · 3 tool calls · [\d,]+ tokens \(", state), state[:2000]
        assert "· $0.0" in state or path.stem == "pydantic_ai_agent"  # priced: the Agents SDK
    if path.stem == "batch":
        assert len(counts) == 160  # every item delivered, none twice (above)
        stopped = text_of(nb, "wait")
        assert "suspended" in stopped and "of 160 items done" in stopped
        assert int(stopped.split(" of 160")[0].split()[-1]) < 160  # the stop left items
        assert "'completed'" in text_of(nb, "click-resume")
        assert "160 results, in input order: ['cust-000', 'cust-001', 'cust-002']" in text_of(
            nb, "results"
        )
        assert "160 of 160 items updated, each once" in text_of(nb, "check")
    if path.stem == "agent_cells":
        assert len(counts) == 2
        assert "completed" in text_of(nb, "complete")


@pytest.mark.postgres
def test_dask_batch_notebook_runs_on_a_local_cluster(
    request: pytest.FixtureRequest,
    env: dict[str, str],
    tmp_path: Path,
    delivery_server: DeliveryServer,
) -> None:
    """notebooks/dask_batch.ipynb on a real PostgreSQL database and a LocalCluster of 2
    worker processes: stopped, resumed, each item published once, by the workers."""
    pytest.importorskip("distributed", reason="needs Dask: pip install -e '.[dask]'")
    if find_postgres_bin() is None:
        pytest.skip(
            "dask_batch.ipynb needs a PostgreSQL server and PostgreSQL is not installed "
            "(no initdb): apt-get install postgresql, or make system-deps"
        )
    url = str(request.getfixturevalue("postgres_url"))
    path = REPO_ROOT / "notebooks" / "dask_batch.ipynb"
    nb = with_clicks(nbformat.read(path, as_version=4), path.stem)
    nb = execute(nb, {**env, "KERNELEXT_DASK_STORE": url}, tmp_path)
    delivery_server.settle()
    counts = deliveries_per_key(delivery_server)
    assert len(counts) == 24 and set(counts.values()) == {1}, counts  # each item once
    stopped = text_of(nb, "wait")
    assert "suspended" in stopped and "of 24 items done" in stopped, stopped
    assert int(stopped.split(" of 24")[0].split()[-1]) < 24  # the stop left items to resume
    assert "'completed'" in text_of(nb, "click-resume")
    resumed = text_of(nb, "results")
    assert "completed" in resumed
    assert "24 results, in input order: ['doc-00', 'doc-01', 'doc-02']" in resumed
    assert "worker processes: 2" in resumed and "in this process: False" in resumed
    assert "24 of 24 items published, each once" in text_of(nb, "check")
    assert "cluster closed" in text_of(nb, "close")


def assert_static_html_shows_the_panel(nb: Any) -> None:
    """nbconvert: with the saved widget state the live widget is embedded; without it
    (an untrusted or stripped notebook) the panel's static HTML is shown instead."""
    body, _ = HTMLExporter().from_notebook_node(copy.deepcopy(nb))
    assert "application/vnd.jupyter.widget-state+json" in body
    stripped = copy.deepcopy(nb)
    del stripped.metadata["widgets"]
    body, _ = HTMLExporter().from_notebook_node(stripped)
    assert 'class="kernelext-panel kernelext-static"' in body and "static snapshot" in body


def test_agent_cells_survive_a_kernel_death(
    env: dict[str, str], tmp_path: Path, delivery_server: DeliveryServer
) -> None:
    original = nbformat.read(REPO_ROOT / "notebooks" / "agent_cells.ipynb", as_version=4)
    dying = copy.deepcopy(original)
    archive = next(c for c in dying.cells if c.get("id") == "archive")
    head, body = archive.source.split("\n", 1)
    archive.source = f"{head}\nimport os\nos._exit(1)  # the kernel dies mid-cell\n{body}"
    with pytest.raises(DeadKernelError):
        execute(dying, env, tmp_path)
    delivery_server.settle()
    assert delivery_server.count() == 1  # the report was posted before the kernel died
    nb = execute(copy.deepcopy(original), env, tmp_path)
    delivery_server.settle()
    assert sorted(d["body"]["channel"] for d in delivery_server.deliveries) == [
        "#archive",
        "#sales",
    ]  # #sales not posted twice
    for skipped in ("fetch", "summarise", "post"):
        assert "already completed" in text_of(nb, skipped)
    assert "'posted': True" in text_of(nb, "archive")
    steps = text_of(nb, "steps")
    assert steps.count("completed") == 4  # each cell completed once, in order


def test_run_all_stops_at_a_skipped_agent_cell(env: dict[str, str], tmp_path: Path) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(s)
        for s in (
            "%load_ext kernelext",
            "%%agent halt --step one\nx = 1",
            "%agent stop halt",
            "%%agent halt --step two\nx = 2",
            "print('Run All went on')",
        )
    ]
    with pytest.raises(CellExecutionError) as caught:
        execute(nb, env, tmp_path)
    error = caught.value
    assert error.ename == "AgentCellStopped"
    assert "%agent resume halt" in error.evalue
    traceback = nb.cells[3].outputs[0]["traceback"]
    assert len(traceback) == 1 and "this cell was not run" in traceback[0]  # one line
    assert nb.cells[4].outputs == [] and nb.cells[4].get("execution_count") is None


AGENT_CELLS = """
import json, os, urllib.request, time
import kernelext as kx

URL = {url!r}
GO_ON = {go_on!r}  # T12 and later wait for it: the first kernel dies before it exists

@kx.effect
def notify(ticket, *, idempotency_key=None):
    deadline = time.monotonic() + 120
    while int(ticket[1:]) >= 12 and not os.path.exists(GO_ON):
        assert time.monotonic() < deadline, "nobody created " + GO_ON
        time.sleep(0.01)
    request = urllib.request.Request(
        URL, data=json.dumps({{"ticket": ticket}}).encode(),
        headers={{"Content-Type": "application/json", "Idempotency-Key": idempotency_key}})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())["delivery"]

@kx.agent(name="crashy")
def crashy(run, tickets):
    for t in run.steps(tickets):
        notify(t)
        time.sleep(0.02)
"""

RECONCILE = """
def delivered(key):
    with urllib.request.urlopen({deliveries!r}, timeout=10) as response:
        return any(d["idempotency_key"] == key for d in json.loads(response.read()))

h = kx.resume("crash-1")
if h.status == "needs_decision":  # the kernel died during a call: ask the receiving side
    for item in kx.reconcile("crash-1"):
        if delivered(str(item.key)):
            item.mark_applied(result="0")
        else:
            item.mark_not_applied()
    h = kx.resume("crash-1")
print(h.wait(60))
"""


def test_started_agent_survives_a_kernel_death(
    store_path: Path, delivery_server: DeliveryServer, tmp_path: Path
) -> None:
    go_on = tmp_path / "go-on"
    setup = AGENT_CELLS.format(url=delivery_server.url + "/notify", go_on=str(go_on))
    with KernelSession() as first:
        first.run("%load_ext kernelext").ok()
        first.run(setup).ok()
        first.run("h = crashy.start([f'T{i}' for i in range(30)], run_id='crash-1')").ok()
        first.send(
            "while h.info()['completed_steps'] < 8:\n    time.sleep(0.005)\n"
            "import os\nos._exit(1)  # dies while the agent is in the middle of its run"
        )
        deadline = time.monotonic() + 60
        while first.km.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not first.km.is_alive()
    delivery_server.settle()
    before = deliveries_per_key(delivery_server)
    # The kernel died with steps certainly left: T12 waits for the marker, created only now.
    assert 8 <= len(before) <= 12 and set(before.values()) == {1}, before
    go_on.touch()
    with KernelSession() as second:
        second.run("%load_ext kernelext").ok()
        second.run(setup).ok()
        reply = second.run(RECONCILE.format(deliveries=delivery_server.url + "/deliveries"))
        assert reply.ok().stdout.strip().splitlines()[-1] == "completed"
        completed = second.run(
            "print(kx.sql(\"SELECT key, count(*) AS n FROM steps WHERE run_id = 'crash-1' AND "
            "status = 'completed' GROUP BY key HAVING count(*) > 1\").shape[0])"
        ).ok()
        assert completed.stdout.strip() == "0"  # no completed step ran twice
    delivery_server.settle()
    after = deliveries_per_key(delivery_server)
    assert len(after) == 30 and set(after.values()) == {1}  # no effect delivered twice


def test_cell_id_from_the_front_end_is_the_step_identity(store_path: Path) -> None:
    with KernelSession() as session:
        session.run("%load_ext kernelext").ok()
        session.run("%%agent ids\nn = 1", metadata={"cellId": "c-1"}).ok()
        session.run("%%agent ids\nn = 1", metadata={"cellId": "c-1"}).ok()
        edited = session.run("%%agent ids\nn = 2", metadata={"cellId": "c-1"})
        assert edited.status == "error" and edited.error is not None
        assert edited.error["ename"] == "AgentCellStopped"
        assert "changed since it completed" in edited.error["traceback"][0]
        session.run("%%agent ids\nn = 1", metadata={"cellId": "c-2"}).ok()
        keys = session.run(
            "import kernelext as kx\n"
            "print(kx.sql(\"SELECT key FROM steps WHERE run_id = 'ids' "
            "ORDER BY ordinal\")['key'].tolist())"
        ).ok()
        assert keys.stdout.strip() == "['cell:c-1', 'cell:c-2']"


def test_the_quickstart_is_paced_for_a_person_to_click_stop(
    store_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Opened as it ships (no pace in the environment), the quickstart's steps are slow
    enough that a person reading the panel can still click Stop mid-run."""
    monkeypatch.delenv("KERNELEXT_DEMO_STEP_SECONDS", raising=False)
    nb = nbformat.read(REPO_ROOT / "notebooks" / "quickstart.ipynb", as_version=4)
    setup = [c.source for c in nb.cells if "setup" in c.get("metadata", {}).get("tags", [])]
    with KernelSession({"KERNELEXT_STORE": str(store_path)}) as kernel:
        for source in setup:
            kernel.run(source).ok()
        paced = kernel.run("print(STEP_SECONDS, len(tickets))").ok().stdout.split()
    step_seconds, steps = float(paced[0]), int(paced[1])
    assert step_seconds >= 3  # a step is long enough to see it running and click
    assert step_seconds * steps >= 30  # the whole run leaves time to read the cells first


def test_the_quickstart_run_all_without_a_click_completes_and_says_what_to_do(
    env: dict[str, str], tmp_path: Path, delivery_server: DeliveryServer
) -> None:
    """Run All with nobody clicking: no cell needs a click to have happened. The run
    completes, the cell after Stop says so, and the plan says there is nothing to resume
    and how to start again, instead of a bare status or an error."""
    nb = nbformat.read(REPO_ROOT / "notebooks" / "quickstart.ipynb", as_version=4)
    nb = execute(nb, env, tmp_path)
    delivery_server.settle()
    counts = deliveries_per_key(delivery_server)
    assert len(counts) == 12 and set(counts.values()) == {1}
    assert "'completed'" in text_of(nb, "wait")
    assert "start a new run with the agent's .start(...)" in text_of(nb, "plan")
    assert "completed, 12/12 steps" in text_of(nb, "summary")
