"""The ``kernelext`` command line, run as users run it: ``python -m kernelext ...`` in a
subprocess, on a real DuckDB store; notebooks execute in real kernels (nbclient)."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook
from support.cli import kernelext_cli as cli

from kernelext._store import open_store

COMMANDS = ("runs", "show", "stop", "sweep", "sql", "reconcile", "run")

# An agent module shared by the processes of a test (same source: same fingerprint).
AGENTS = """
import os, sys, time
import kernelext as kx

@kx.effect
def send(to, *, idempotency_key=None):
    if os.environ.get("CRASH_IN_SEND"):
        os._exit(1)  # the call may or may not have happened: nobody knows
    return {"sent": to}

@kx.agent(name="cli-mail")
def mail(run, people):
    for person in run.steps(people, key=lambda p: p):
        send(person)
        run.state["sent"] = run.state.get("sent", 0) + 1

@kx.agent(name="cli-fail")
def fail(run):
    for _ in run.steps(range(1)):
        raise ValueError("boom")

@kx.agent(name="cli-approval")
def approval(run):
    for _ in run.steps(range(1)):
        pass
    run.suspend("approval", deadline=0.05)

def main(mode, run_id, *args):
    kx.open_store()
    if mode == "resume":
        print(kx.resume(run_id).wait(60))
    else:
        agent = {"mail": mail, "fail": fail, "approval": approval}[mode]
        print(agent.run(*[json.loads(a) for a in args], run_id=run_id).status)

if __name__ == "__main__":
    import json
    main(*sys.argv[1:])
"""


@pytest.fixture
def agents(tmp_path: Path, store_path: Path) -> Any:
    """Run the shared agent module in a fresh process: ``agents("mail", run_id, ...)``."""
    module = tmp_path / "cli_agents.py"
    module.write_text(AGENTS)

    def run(mode: str, run_id: str, *args: Any, env: dict[str, str] | None = None) -> str:
        proc = subprocess.run(
            [sys.executable, str(module), mode, run_id, *[json.dumps(a) for a in args]],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "KERNELEXT_STORE": str(store_path), **(env or {})},
        )
        return proc.stdout.strip() or f"exit {proc.returncode}: {proc.stderr[-500:]}"

    return run


def make_unknown(agents: Any, run_id: str) -> None:
    """A run whose process died inside an effect, then resumed: needs_decision."""
    assert agents("mail", run_id, ["ann"], env={"CRASH_IN_SEND": "1"}) == "exit 1: "
    assert agents("resume", run_id) == "needs_decision"


# -- help and usage ---------------------------------------------------------------------------
def test_every_command_has_help_and_usage_errors_exit_2(store_path: Path) -> None:
    top = cli("--help", store=store_path)
    assert top.returncode == 0
    for command in COMMANDS:
        assert command in top.stdout
        helped = cli(command, "--help", store=store_path)
        assert helped.returncode == 0, command
        assert "exit codes" in helped.stdout and "--json" in helped.stdout
    assert cli("bogus", store=store_path).returncode == 2
    assert cli("runs", "--status", "sleeping", store=store_path).returncode == 2
    assert cli("show", store=store_path).returncode == 2  # RUN_ID missing
    missing = cli("show", "no-such-run", store=store_path)
    assert missing.returncode == 2 and "No run 'no-such-run'" in missing.stderr


def test_console_script_is_installed(store_path: Path) -> None:
    script = Path(sys.executable).with_name("kernelext")
    proc = subprocess.run(
        [str(script), "runs", "--store", str(store_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "no runs"


# -- runs, show, sql ---------------------------------------------------------------------------
def test_runs_and_show_in_text_and_json_with_status_exit_codes(
    agents: Any, store_path: Path
) -> None:
    assert agents("mail", "mail-1", ["ann", "bob"]) == "completed"
    assert agents("fail", "fail-1") == "failed"
    text = cli("runs", store=store_path)
    assert text.returncode == 0
    assert "mail-1" in text.stdout and "fail-1" in text.stdout and "completed" in text.stdout
    only = json.loads(cli("runs", "--status", "failed", "--json", store=store_path).stdout)
    assert [r["id"] for r in only] == ["fail-1"]

    shown = cli("show", "mail-1", "--json", store=store_path)
    assert shown.returncode == 0
    details = json.loads(shown.stdout)
    assert details["run"]["status"] == "completed"
    assert [s["key"] for s in details["steps"]] == ["ann", "bob"]
    assert [(e["tool"], e["status"]) for e in details["effects"]] == [("send", "applied")] * 2
    assert details["facts"] == []
    assert [e["kind"] for e in details["events"]] == ["created", "completed"]
    text = cli("show", "mail-1", store=store_path)
    assert "status completed" in text.stdout and "effects (2)" in text.stdout

    failed = cli("show", "fail-1", store=store_path)
    assert failed.returncode == 5 and "boom" in failed.stdout


def test_sql_reads_and_refuses_writes(agents: Any, store_path: Path) -> None:
    assert agents("mail", "sql-1", ["ann"]) == "completed"
    rows = cli(
        "sql",
        "SELECT tool, status, count(*) AS n FROM effects GROUP BY ALL",
        "--json",
        store=store_path,
    )
    assert rows.returncode == 0
    assert json.loads(rows.stdout) == [{"tool": "send", "status": "applied", "n": 1}]
    table = cli("sql", "SELECT id, status FROM runs", store=store_path)
    assert table.returncode == 0 and "sql-1" in table.stdout
    write = cli("sql", "DELETE FROM runs", store=store_path)
    assert write.returncode == 2 and "read-only" in write.stderr
    broken = cli("sql", "SELECT nope FROM runs", store=store_path)
    assert broken.returncode == 1 and "nope" in broken.stderr
    assert broken.stderr.startswith("kernelext: The query was not run: the database says:")
    assert "Exception" not in broken.stderr and "DESCRIBE <table>" in broken.stderr
    assert json.loads(cli("runs", "--json", store=store_path).stdout)[0]["id"] == "sql-1"


def test_a_store_held_by_another_process_is_a_clear_error(store_path: Path) -> None:
    open_store(str(store_path)).close()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import duckdb, sys; c = duckdb.connect(sys.argv[1]); print('held', flush=True);"
            " sys.stdin.readline()",
            str(store_path),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    with holder:
        assert holder.stdout is not None and holder.stdin is not None
        assert holder.stdout.readline().strip() == "held"
        proc = cli("runs", store=store_path, env={"KERNELEXT_STORE_WAIT": "1"})
        holder.stdin.write("\n")
        holder.stdin.flush()
    assert proc.returncode == 1
    assert f"is held by process {holder.pid}" in proc.stderr
    assert "KERNELEXT_STORE" in proc.stderr


# -- stop and sweep ------------------------------------------------------------------------------
def test_stop_records_the_request_with_source_cli(agents: Any, store_path: Path) -> None:
    assert agents("approval", "stop-1") == "suspended"
    proc = cli("stop", "stop-1", "--json", store=store_path)
    assert proc.returncode == 3  # it is suspended
    assert json.loads(proc.stdout) == {"run_id": "stop-1", "status": "suspended", "source": "cli"}
    with open_store(str(store_path)) as store:
        request = store.events("stop-1")[-1]
    assert (request["kind"], request["source"], request["to_status"]) == (
        "stop_requested",
        "cli",
        None,
    )
    assert cli("stop", "missing", store=store_path).returncode == 2


def test_sweep_expires_due_runs(agents: Any, store_path: Path) -> None:
    assert agents("approval", "due-1") == "suspended"
    time.sleep(0.1)  # its deadline (50 ms) passes
    proc = cli("sweep", "--json", store=store_path)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert [e["run_id"] for e in result["expired"]] == ["due-1"]
    assert result["busy"] is False
    again = cli("sweep", store=store_path)
    assert again.returncode == 0 and "0 run(s) expired" in again.stdout
    assert cli("show", "due-1", store=store_path).returncode == 5


# -- reconcile ------------------------------------------------------------------------------------
def test_reconcile_with_flags(agents: Any, store_path: Path) -> None:
    make_unknown(agents, "rec-1")
    listed = cli("reconcile", "rec-1", "--json", store=store_path)
    assert listed.returncode == 4
    info = json.loads(listed.stdout)
    assert info["open"] == 1 and info["status"] == "needs_decision"
    key = info["unknown"][0]["key"]
    assert info["unknown"][0]["tool"] == "send"

    usage = cli(
        "reconcile", "rec-1", "--key", key, "--not-applied", "--result", "1", store=store_path
    )
    assert usage.returncode == 2 and "--result goes with --applied" in usage.stderr
    wrong = cli("reconcile", "rec-1", "--key", "ffff", "--applied", store=store_path)
    assert wrong.returncode == 2 and key in wrong.stderr
    done = cli(
        "reconcile",
        "rec-1",
        "--key",
        key[:8],
        "--applied",
        "--result",
        '{"id": 7}',
        "--note",
        "saw it in the outbox",
        store=store_path,
    )
    assert done.returncode == 0, done.stderr
    with open_store(str(store_path)) as store:
        effect = next(iter(store.load_effects("rec-1").values()))
        decided = [e for e in store.events("rec-1") if e["kind"] == "effect_decided"]
    assert (effect["status"], json.loads(effect["result"])) == ("applied", {"id": 7})
    assert effect["decision_note"] == "saw it in the outbox"
    assert [e["source"] for e in decided] == ["cli"]
    assert agents("resume", "rec-1") == "completed"  # the recorded result is replayed

    make_unknown(agents, "rec-2")
    key2 = json.loads(cli("reconcile", "rec-2", "--json", store=store_path).stdout)["unknown"][0]
    gave_up = cli("reconcile", "rec-2", "--key", key2["key"], "--give-up", store=store_path)
    assert gave_up.returncode == 0 and "cancelled" in gave_up.stdout
    assert cli("show", "rec-2", store=store_path).returncode == 5


def test_reconcile_interactively_in_a_terminal(agents: Any, store_path: Path) -> None:
    make_unknown(agents, "rec-tty")
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "kernelext", "reconcile", "rec-tty", "--store", str(store_path)],
        stdin=follower,
        stdout=follower,
        stderr=follower,
        close_fds=True,
    )
    os.close(follower)
    transcript = b""
    answers = [b"a\n", b'{"ok": true}\n', b"checked by hand\n"]
    try:
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                chunk = os.read(leader, 4096)
            except OSError:
                break
            transcript += chunk
            if answers and chunk.rstrip().endswith((b":", b"?", b"?)")):
                os.write(leader, answers.pop(0))
        assert proc.wait(60) == 0, transcript.decode(errors="replace")
    finally:
        proc.kill()
        os.close(leader)
    assert b"Did it happen?" in transcript and b"-> applied" in transcript
    with open_store(str(store_path)) as store:
        effect = next(iter(store.load_effects("rec-tty").values()))
    assert (effect["status"], effect["result"], effect["decision_note"]) == (
        "applied",
        '{"ok":true}',
        "checked by hand",
    )


# -- run NOTEBOOK -------------------------------------------------------------------------------
SETUP = textwrap.dedent(
    """\
    import os, time
    %load_ext kernelext
    RUN_ID = os.environ["KERNELEXT_RUN_ID"]
    LOG = os.path.abspath("cells.log")
    def note(text):
        with open(LOG, "a") as handle:
            handle.write(text + "\\n")
    """
)


def write_notebook(folder: Path, *bodies: str) -> Path:
    cells = [new_markdown_cell("An agent notebook"), new_code_cell(SETUP)]
    cells += [new_code_cell("%%agent {RUN_ID}\n" + body) for body in bodies]
    nb = new_notebook(
        cells=cells,
        metadata={
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}
        },
    )
    path = folder / "agent.ipynb"
    nbformat.write(nb, str(path))
    return path


def log_lines(folder: Path) -> list[str]:
    log = folder / "cells.log"
    return log.read_text().split() if log.exists() else []


@pytest.mark.slow
def test_run_executes_a_notebook_with_progress_and_json(tmp_path: Path, store_path: Path) -> None:
    path = write_notebook(tmp_path, "note('one')", "note('two')")
    proc = cli("run", str(path), "--run-id", "nb-1", "--json", store=store_path, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "[1/3]" in proc.stderr and "[3/3] %%agent {RUN_ID}" in proc.stderr
    result = json.loads(proc.stdout)
    assert (result["run_id"], result["status"], result["cells"]) == ("nb-1", "completed", 3)
    assert log_lines(tmp_path) == ["one", "two"]
    again = cli("run", str(path), "--run-id", "nb-1", store=store_path, cwd=tmp_path)
    assert again.returncode == 0 and "already completed" in again.stderr
    assert log_lines(tmp_path) == ["one", "two"]
    missing = cli("run", str(tmp_path / "nope.ipynb"), store=store_path)
    assert missing.returncode == 2


@pytest.mark.slow
@pytest.mark.crash
def test_rerun_after_the_kernel_died_resumes_and_does_not_start_over(
    tmp_path: Path, store_path: Path
) -> None:
    path = write_notebook(
        tmp_path,
        "note('a')",
        "if not os.path.exists('died.marker'):\n"
        "    open('died.marker', 'w').close()\n"
        "    os._exit(1)\n"
        "note('b')",
        "note('c')",
    )
    first = cli("run", str(path), store=store_path, cwd=tmp_path)
    assert first.returncode == 5, first.stderr
    assert "kernel died" in first.stderr and "Run the same command again" in first.stderr
    assert log_lines(tmp_path) == ["a"]
    second = cli("run", str(path), "--json", store=store_path, cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    result = json.loads(second.stdout)
    assert log_lines(tmp_path) == ["a", "b", "c"]  # cell "a" was not run again
    assert result["status"] == "completed"
    with open_store(str(store_path)) as store:
        steps = store.steps(result["run_id"])
    completed = [s["key"] for s in steps if s["status"] == "completed"]
    assert len(completed) == len(set(completed)) == 3
    # The interrupted cell's step row, if its start was committed before the kernel died.
    assert {s["status"] for s in steps} - {"completed"} <= {"abandoned"}
    # The derived run id is the same for the rerun; a finished run makes the next one new.
    third = cli("run", str(path), "--json", store=store_path, cwd=tmp_path)
    assert third.returncode == 0
    assert json.loads(third.stdout)["run_id"] == result["run_id"] + "-2"


@pytest.mark.slow
def test_stop_from_the_terminal_suspends_a_notebook_run_and_rerun_resumes(
    tmp_path: Path, store_path: Path
) -> None:
    path = write_notebook(
        tmp_path,
        "note('a')\nopen('started.marker', 'w').close()\n"
        "while not os.path.exists('release.marker'):\n    time.sleep(0.05)",
        "note('b')",
    )
    with subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kernelext",
            "run",
            str(path),
            "--run-id",
            "nb-stop",
            "--store",
            str(store_path),
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as running:
        deadline = time.monotonic() + 120
        while not (tmp_path / "started.marker").exists():
            assert running.poll() is None, running.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        stop = cli("stop", "nb-stop", store=store_path)
        (tmp_path / "release.marker").touch()
        _, err = running.communicate(timeout=240)
    assert stop.returncode == 0 and "stopping" in stop.stdout, stop.stderr
    assert running.returncode == 3, err
    assert "suspended" in err
    assert log_lines(tmp_path) == ["a"]
    resumed = cli("run", str(path), "--run-id", "nb-stop", store=store_path, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert log_lines(tmp_path) == ["a", "b"]
    with open_store(str(store_path)) as store:
        events = store.events("nb-stop")
    stops = [e for e in events if e["kind"] == "stop_requested"]
    assert [e["source"] for e in stops] == ["cli"]
    assert [e["kind"] for e in events if e["kind"] == "resumed"] == ["resumed"]
