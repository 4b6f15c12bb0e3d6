"""The ``kernelext`` console script in shells: ``plan`` from a terminal, listing
commands exit 0, a pipe closed early is quiet. Real subprocesses on a real store
(DuckDB file, and PostgreSQL: the module runs on both backends)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from kernelext._cli.main import build_parser

pytestmark = pytest.mark.both_backends

SCRIPT = str(Path(sys.executable).with_name("kernelext"))

AGENT = """
import sys
import kernelext as kx

@kx.effect(needs_approval=True)
def publish(item, *, idempotency_key=None):
    return item

@kx.agent(name="enrich")
def enrich(run, items):
    for item in run.steps(items, key=str):
        run.state["last"] = item  # a state, kept small: a long run is cheap to make
        if item == len(items) - 1:
            publish(item)  # waits for a person's approval: the run suspends

kx.open_store()
print(enrich.run(list(range(int(sys.argv[2]))), run_id=sys.argv[1]).status)
"""


def kernelext(*args: str, store: Path | str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SCRIPT, *args, "--store", str(store)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def suspended_run(tmp_path: Path, store: Path | str, run_id: str, steps: int = 3) -> None:
    module = tmp_path / "enrich_agent.py"
    module.write_text(AGENT)
    done = subprocess.run(
        [sys.executable, str(module), run_id, str(steps)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "KERNELEXT_STORE": str(store)},
    )
    assert done.stdout.strip() == "suspended", done.stderr[-800:]


def command_names() -> list[str]:
    return list(build_parser().command_names)


def test_plan_from_a_terminal_shows_the_plan_and_exits_0(tmp_path: Path, store_path: Path) -> None:
    suspended_run(tmp_path, store_path, "enrich-1")
    shown = kernelext("plan", "enrich-1", store=store_path)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    # what truly blocks is the open approval, named as the terminal clears it
    assert "Blocked: 1 open approval request(s)" in shown.stdout
    assert "kernelext approve ID" in shown.stdout
    assert "not defined in this process" not in shown.stdout
    assert "notebook/kernel that defines the agent" in shown.stdout
    assert "kx.approvals(" not in shown.stdout


def test_listing_commands_exit_0_also_when_empty(tmp_path: Path, store_path: Path) -> None:
    listing = [n for n in command_names() if n in {"runs", "list", "approvals", "questions"}]
    assert "runs" in listing and "approvals" in listing
    for name in listing:
        empty = kernelext(name, store=store_path)
        assert empty.returncode == 0, (name, empty.stdout, empty.stderr)
    suspended_run(tmp_path, store_path, "enrich-2")
    for name in listing:
        full = kernelext(name, store=store_path)
        assert full.returncode == 0, (name, full.stdout, full.stderr)


def closed_pipe_run(*args: str) -> subprocess.CompletedProcess[str]:
    """``kernelext ARGS`` writing into a pipe whose reader already closed it."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(
            [SCRIPT, *args], stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120
        )
    finally:
        os.close(write_end)


def test_a_pipe_closed_early_is_quiet_for_every_command() -> None:
    for name in command_names():
        shut = closed_pipe_run(name, "--help")
        assert shut.stderr == "", (name, shut.stderr)
        assert shut.returncode == 0, name


def test_a_pipe_closed_early_is_quiet_for_a_long_show(tmp_path: Path, store_path: Path) -> None:
    suspended_run(tmp_path, store_path, "enrich-3", steps=2500)
    shut = closed_pipe_run("show", "enrich-3", "--store", str(store_path))
    assert shut.stderr == "" and shut.returncode == 0
    # and through a shell, as people type it: show prints more than a pipe holds (64 KiB),
    # so it is still writing when head has read its line and gone
    shown = kernelext("show", "enrich-3", store=store_path)
    assert len(shown.stdout.encode()) > 65536, len(shown.stdout)
    store = shlex.quote(str(store_path))
    line = f"{shlex.quote(SCRIPT)} show enrich-3 --store {store} | head -1"
    piped = subprocess.run(
        ["bash", "-o", "pipefail", "-c", line], capture_output=True, text=True, timeout=120
    )
    assert piped.stderr == "" and piped.returncode == 0
    assert piped.stdout.startswith("run enrich-3")


def test_show_prints_the_stored_step_status_and_what_a_waiting_step_waits_for(
    tmp_path: Path, store_path: Path
) -> None:
    suspended_run(tmp_path, store_path, "enrich-4")
    query = "SELECT status, error FROM steps WHERE run_id = 'enrich-4' AND ordinal = 2"
    stored = kernelext("sql", query, "--json", store=store_path)
    assert stored.returncode == 0, stored.stderr
    (row,) = json.loads(stored.stdout)
    shown = kernelext("show", "enrich-4", store=store_path)
    assert shown.returncode == 3, shown.stderr  # exit 3: suspended
    (waiting,) = [line for line in shown.stdout.splitlines() if line.startswith("3 ")]
    assert row["status"] in waiting.split()  # the table's value, exactly as stored
    assert "waiting for approval of publish" in waiting
    assert "stopped" not in waiting
    assert "kernelext approvals --run enrich-4" in shown.stdout
    assert "kernelext approve ID" in shown.stdout
