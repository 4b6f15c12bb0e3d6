"""Several kernels and processes on one embedded store (issue: beyond one kernel)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.manager import KernelManager
from support.http_server import DeliveryServer
from support.kernels import kernel_manager

pytestmark = pytest.mark.slow

AGENT_CODE = """
import time, json, urllib.request
import kernelext as kx

URL = {url!r}
PAUSE = {pause}

@kx.effect
def deliver(item, *, idempotency_key=None):
    req = urllib.request.Request(URL + "/deliver", data=json.dumps({{"item": item}}).encode(),
                                 headers={{"Idempotency-Key": idempotency_key,
                                          "Content-Type": "application/json"}})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return resp.status

@kx.agent(name="worker")
def worker(run, items):
    for item in run.steps(items):
        deliver(item)
        run.state["done"] = run.state.get("done", 0) + 1
        time.sleep(PAUSE)
"""


def _run(kc: BlockingKernelClient, code: str, timeout: float = 120) -> str:
    out: list[str] = []

    def hook(msg: dict[str, Any]) -> None:
        kind = msg["msg_type"]
        if kind == "stream":
            out.append(msg["content"]["text"])
        elif kind == "error":
            out.append("\n".join(msg["content"]["traceback"]))
        elif kind == "execute_result":
            out.append(msg["content"]["data"].get("text/plain", ""))

    reply = kc.execute_interactive(textwrap.dedent(code), timeout=timeout, output_hook=hook)
    text = "".join(out)
    assert reply["content"]["status"] == "ok", text
    return text


def _define_worker(kc: BlockingKernelClient, server: DeliveryServer, *, pause: float) -> None:
    """The agent ``worker`` defined in the kernel, its items delivered to ``server``."""
    _run(kc, AGENT_CODE.format(url=server.url, pause=pause))


def _started(
    kc: BlockingKernelClient,
    server: DeliveryServer,
    *,
    pause: float,
    items: int,
    run_id: str,
    delivered: int,
) -> None:
    """``h``: the run ``run_id`` of ``items`` items started in the kernel, once ``server``
    got ``delivered`` of them."""
    _define_worker(kc, server, pause=pause)
    _run(kc, f"h = worker.start([f'i{{n}}' for n in range({items})], run_id='{run_id}')")
    server.wait_for(delivered, timeout=60)


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty project folder; the kernels use the *default* store inside it."""
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "pyproject.toml").write_text("[project]\nname = 'demo'\n")
    monkeypatch.delenv("KERNELEXT_STORE", raising=False)
    return folder


@pytest.fixture
def kernels(project: Path) -> Iterator[list[tuple[KernelManager, BlockingKernelClient]]]:
    env = {k: v for k, v in os.environ.items() if k != "KERNELEXT_STORE"}
    started: list[tuple[KernelManager, BlockingKernelClient]] = []
    try:
        for _ in range(2):
            km = kernel_manager(KernelManager)
            km.start_kernel(cwd=str(project), env=env)
            kc = km.client()
            started.append((km, kc))
            kc.start_channels()
            kc.wait_for_ready(timeout=60)
        yield started
    finally:
        for km, kc in started:
            kc.stop_channels()
            km.shutdown_kernel(now=True)


def _query(project: Path, sql: str) -> str:
    code = f"import kernelext as kx; print(kx.sql({sql!r}).to_csv(index=False))"
    env = {k: v for k, v in os.environ.items() if k != "KERNELEXT_STORE"}
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return done.stdout


def test_two_kernels_run_agents_at_once_on_the_default_store(
    project: Path,
    kernels: list[tuple[KernelManager, BlockingKernelClient]],
    delivery_server: DeliveryServer,
) -> None:
    for index, (_, kc) in enumerate(kernels):
        _define_worker(kc, delivery_server, pause=0.01)
        _run(kc, f"h = worker.start([f'k{index}-{{i}}' for i in range(40)], run_id='run-{index}')")
    for _, kc in kernels:
        assert "completed" in _run(kc, "print(h.wait())")

    assert (project / ".kernelext" / "store.duckdb").exists()
    assert len(delivery_server.deliveries) == 80
    keys = [d["idempotency_key"] for d in delivery_server.deliveries]
    assert len(set(keys)) == 80
    # While the other kernel holds the store file, h.wait() gives the status the run's
    # journaled end sets, and its last records reach the tables when their own kernel
    # next gets the file; other processes read the tables. A read in the run's kernel
    # waits for that fold (each process reads its own writes), so after it every
    # process sees both runs whole.
    for index, (_, kc) in enumerate(kernels):
        own = _run(
            kc,
            f"print(kx.sql(\"SELECT count(*) AS n FROM steps WHERE run_id = 'run-{index}'"
            f" AND status = 'completed'\")['n'].tolist())",
        )
        assert "[40]" in own
    steps = _query(
        project,
        "SELECT run_id, count(*) AS n FROM steps WHERE status = 'completed' "
        "GROUP BY run_id ORDER BY run_id",
    )
    assert steps.split() == ["run_id,n", "run-0,40", "run-1,40"]
    effects = _query(
        project, "SELECT run_id, status, count(*) AS n FROM effects GROUP BY ALL ORDER BY run_id"
    )
    assert effects.split() == ["run_id,status,n", "run-0,applied,40", "run-1,applied,40"]
    events = _query(project, "SELECT run_id, kind FROM events ORDER BY id")
    for run in ("run-0", "run-1"):
        assert f"{run},created" in events and f"{run},completed" in events
    # Each kernel sees both runs through its own kx.sql.
    for _, kc in kernels:
        seen = _run(kc, "print(sorted(kx.sql('SELECT id FROM runs')['id']))")
        assert "['run-0', 'run-1']" in seen


def test_stop_from_another_process_and_resume_in_another_kernel(
    project: Path,
    kernels: list[tuple[KernelManager, BlockingKernelClient]],
    delivery_server: DeliveryServer,
) -> None:
    (_, first), (_, second) = kernels
    _started(first, delivery_server, pause=0.2, items=30, run_id="shared", delivered=2)
    env = {k: v for k, v in os.environ.items() if k != "KERNELEXT_STORE"}
    stopped = subprocess.run(
        [sys.executable, "-c", "import kernelext as kx; print(kx.stop('shared', source='cli'))"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert stopped.stdout.strip() == "stopping"
    assert "suspended" in _run(first, "print(h.wait(60))")
    done_before = len(delivery_server.deliveries)
    assert done_before < 30

    # While the first kernel holds a live run, a second resume is refused.
    _define_worker(second, delivery_server, pause=0.0)
    _run(second, "h2 = kx.resume('shared'); print(h2.wait(120))")
    assert len(delivery_server.deliveries) == 30
    assert len({d["idempotency_key"] for d in delivery_server.deliveries}) == 30
    kinds = _query(project, "SELECT kind, source FROM events WHERE run_id = 'shared' ORDER BY id")
    assert "stop_requested,cli" in kinds
    assert kinds.strip().splitlines()[-1].startswith("completed")


def test_a_live_run_cannot_be_resumed_twice(
    project: Path,
    kernels: list[tuple[KernelManager, BlockingKernelClient]],
    delivery_server: DeliveryServer,
) -> None:
    (_, first), (_, second) = kernels
    _started(first, delivery_server, pause=0.3, items=20, run_id="busy", delivered=1)
    _define_worker(second, delivery_server, pause=0.0)
    text = _run(
        second,
        """
        try:
            kx.resume('busy')
        except kx.RunStateError as exc:
            print("refused:", exc)
    """,
    )
    assert "refused:" in text and "is live in" in text and str(os.getpid()) not in text
    _run(first, "h.stop(); print(h.wait(60))")
