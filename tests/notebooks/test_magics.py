"""The extension in an in-process IPython shell: loading, options, %%agent, %ledger.

A real ``InteractiveShell`` runs real cells against a real DuckDB store (one per test).
Kernel-only behaviour (cell ids, the interrupt button, nbclient) is in
test_notebooks.py and test_interrupt.py.
"""

from __future__ import annotations

import datetime as dt
import inspect
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import ExecutionResult, InteractiveShell

import kernelext as kx
from kernelext._core.encoding.names import CELL_AGENT
from kernelext._core.lifecycle.cell_runs import forget_cell_runs
from kernelext._core.lifecycle.run import AGENT_API
from kernelext._core.process.runtime import runtime
from kernelext._ipython import extension
from kernelext._ipython.interrupt import InterruptHandler
from kernelext._ipython.magics import Kernelext
from kernelext._ipython.options import notebook_option, saved
from kernelext.errors import AgentCellStopped

EFFECTS = """
import kernelext as kx
SENT = []

@kx.effect
def send(x):
    SENT.append(x)
    return {"sent": x}
"""


@pytest.fixture
def ip(store_path: Path) -> Iterator[InteractiveShell]:
    shell = InteractiveShell.instance()
    shell.config.pop("Kernelext", None)  # %config in one test must not reach the next
    runtime().settings.use_store(str(store_path))
    shell.run_line_magic("load_ext", "kernelext")
    assert shell.run_cell(EFFECTS).success
    yield shell
    with runtime().live_lock:
        handles = list(runtime().live_runs.values())
    for handle in handles:
        handle.wait(30)
    shell.run_line_magic("unload_ext", "kernelext")
    for name in ("SENT", "send", "run", "h", "df", "out"):
        shell.user_ns.pop(name, None)
    shell.config.pop("Kernelext", None)
    forget_cell_runs()
    runtime().settings.close()
    runtime().settings.use_store(None)


def cell(ip: InteractiveShell, source: str) -> ExecutionResult:
    return ip.run_cell(source)


def sent(ip: InteractiveShell) -> list[Any]:
    return list(ip.user_ns["SENT"])


# -- loading --------------------------------------------------------------------------------
def test_load_registers_and_unload_undoes_everything(ip: InteractiveShell) -> None:
    magics = ip.magics_manager.magics
    assert {"agent", "ledger"} <= set(magics["line"]) and {"agent", "ledger"} <= set(magics["cell"])
    assert any(isinstance(c, Kernelext) for c in ip.configurables)
    assert runtime().settings.handle_renderer is extension.render_handle
    ip.run_line_magic("unload_ext", "kernelext")
    assert "agent" not in magics["line"] and "ledger" not in magics["cell"]
    assert not any(isinstance(c, Kernelext) for c in ip.configurables)
    assert runtime().settings.handle_renderer is None
    assert extension.loaded() is None
    result = cell(ip, "%ledger SELECT 1")
    assert isinstance(result.error_in_exec, UsageError)  # the magic is gone
    ip.run_line_magic("load_ext", "kernelext")
    assert cell(ip, "%ledger SELECT 1 AS one").result["one"].tolist() == [1]


def test_loading_does_not_open_the_store(store_path: Path) -> None:
    shell = InteractiveShell.instance()
    runtime().settings.close()
    runtime().settings.use_store(str(store_path))
    shell.run_line_magic("load_ext", "kernelext")
    try:
        assert runtime().settings._store is None and not store_path.exists()
        assert cell(shell, "%ledger SELECT count(*) AS n FROM runs").result["n"].tolist() == [0]
        assert store_path.exists()
    finally:
        shell.run_line_magic("unload_ext", "kernelext")
        runtime().settings.close()
        runtime().settings.use_store(None)
    assert runtime().settings._store is None  # opened lazily by the extension, closed by unloading


def test_config_options_reach_the_settings(ip: InteractiveShell, tmp_path: Path) -> None:
    other = tmp_path / "other.duckdb"
    assert cell(ip, f"%config Kernelext.store = {str(other)!r}").success
    assert runtime().settings.store().location == str(other)
    assert cell(ip, "%config Kernelext.expiry = {'user_stop': 3600}").success
    assert runtime().settings.expiry.durations["user_stop"] == dt.timedelta(hours=1)
    assert cell(ip, "%config Kernelext.check_timeout = 2.5").success
    assert runtime().settings.check_timeout == 2.5
    assert cell(ip, "%config Kernelext.max_step_seconds = 12.0").success
    assert cell(ip, "%%agent cfg\nx = 1").success
    assert runtime().settings.store().get_run("cfg")["max_step_seconds"] == 12.0
    magics = extension.loaded()
    assert magics is not None and magics.store == str(other)


def test_store_switch_is_refused_while_a_run_executes(
    ip: InteractiveShell, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    before = runtime().settings.store().location
    assert cell(
        ip,
        """
import threading
gate = threading.Event()
@kx.agent(name="blocked")
def blocked(run):
    with run.step("wait"):
        gate.wait(30)
h = blocked.start(run_id="blocked-1")
""",
    ).success
    try:
        cell(ip, f"%config Kernelext.store = {str(tmp_path / 'x.duckdb')!r}")  # logs the error
    finally:
        ip.user_ns["gate"].set()
    assert "Stop them first" in caplog.text
    assert ip.user_ns["h"].wait(30) == "completed"
    assert runtime().settings.store().location == before


# -- %%agent ---------------------------------------------------------------------------------
def test_agent_cell_is_one_step_and_is_skipped_once_completed(
    ip: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    ip.user_ns["run"] = "mine"
    source = "%%agent nightly --step a\nrun.state['n'] = 1\nsend('a')\nseen = type(run).__name__"
    assert cell(ip, source).success
    assert ip.user_ns["seen"] == "Run" and ip.user_ns["run"] == "mine"  # restored after
    assert cell(ip, source).success
    assert "skipped" in capsys.readouterr().out
    assert sent(ip) == ["a"]
    row = runtime().settings.store().get_run("nightly")
    assert row["agent"] == CELL_AGENT and row["status"] == "running"
    steps = runtime().settings.store().completed_steps("nightly")
    assert [s["key"] for s in steps] == ["a"]


def test_an_agent_cell_sees_the_run_facade_only(ip: InteractiveShell) -> None:
    source = (
        "%%agent facade --step a\nkind = type(run)\n"
        "names = sorted(n for n in dir(run) if not n.startswith('_'))"
    )
    assert cell(ip, source).success
    assert ip.user_ns["kind"] is kx.Run
    assert ip.user_ns["names"] == sorted(AGENT_API)
    for name in ("kind", "names"):
        ip.user_ns.pop(name)


def test_changed_cell_is_reported_not_rerun(ip: InteractiveShell) -> None:
    assert cell(ip, "%%agent r --step a\nsend('a')").success
    result = cell(ip, "%%agent r --step a\nsend('a')\nsend('again')")
    error = result.error_in_exec
    assert isinstance(error, AgentCellStopped)
    lines = error._render_traceback_()
    assert len(lines) == 1 and "changed since it completed" in lines[0] and "--rerun" in lines[0]
    assert sent(ip) == ["a"]
    assert cell(ip, "%%agent r --step a --rerun\nsend('a')\nsend('again')").success
    assert sent(ip) == ["a", "again"]  # the first call was replayed from the ledger


def test_stop_skips_the_next_cell_until_resumed(
    ip: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cell(ip, "%%agent job --step one\nsend(1)").success
    assert cell(ip, "%agent stop job").success
    assert "suspended" in capsys.readouterr().out
    result = cell(ip, "%%agent job --step two\nsend(2)")
    assert isinstance(result.error_in_exec, AgentCellStopped)
    assert "%agent resume job" in str(result.error_in_exec)
    assert sent(ip) == [1]
    assert cell(ip, "%agent resume job").success
    assert cell(ip, "%%agent job --step one\nsend(1)").success  # completed: skipped
    assert cell(ip, "%%agent job --step two\nsend(2)").success
    assert sent(ip) == [1, 2]
    kinds = [e["kind"] for e in runtime().settings.store().events("job")]
    assert kinds == ["created", "stop_requested", "suspended", "resumed"]


def test_failed_cell_restores_state_and_does_not_repeat_effects(ip: InteractiveShell) -> None:
    assert cell(ip, "%%agent f --step a\nrun.state['n'] = 1").success
    result = cell(ip, "%%agent f --step b\nrun.state['n'] = 99\nsend('b')\n1/0")
    assert isinstance(result.error_in_exec, AgentCellStopped)
    assert "failed (ZeroDivisionError" in str(result.error_in_exec)
    assert cell(ip, "%%agent f --step b\nseen = run.state['n']\nsend('b')").success
    assert ip.user_ns["seen"] == 1  # the failed cell's change was rolled back
    assert sent(ip) == ["b"]  # applied once; the re-run replayed it
    statuses = [s["status"] for s in runtime().settings.store().steps("f")]
    assert statuses == ["completed", "failed", "completed"]


def test_run_suspend_inside_a_cell(ip: InteractiveShell) -> None:
    result = cell(
        ip, "%%agent s --step ask\nrun.state['asked'] = True\nrun.suspend(reason='approval')"
    )
    assert isinstance(result.error_in_exec, AgentCellStopped)
    row = runtime().settings.store().get_run("s")
    assert row["status"] == "suspended" and row["reason"] == "approval"
    assert [s["key"] for s in runtime().settings.store().completed_steps("s")] == ["ask"]


def test_interrupt_inside_a_cell_suspends_and_unknown_effect_needs_decision(
    ip: InteractiveShell,
) -> None:
    assert cell(
        ip,
        """
@kx.effect
def hang(x):
    raise KeyboardInterrupt  # what the interrupt button does in the middle of a call
""",
    ).success
    result = cell(ip, "%%agent k --step a\nhang(1)")
    assert isinstance(result.error_in_exec, AgentCellStopped)
    assert "interrupted" in str(result.error_in_exec)
    store = runtime().settings.store()
    assert store.get_run("k")["status"] == "suspended"
    assert [e["status"] for e in store.load_effects("k").values()] == ["unknown"]
    assert any(e["kind"] == "stop_forced" and e["source"] == "interrupt" for e in store.events("k"))
    assert cell(ip, "%agent resume k").success
    blocked = cell(ip, "%%agent k --step a\nhang(1)")
    assert isinstance(blocked.error_in_exec, AgentCellStopped)
    assert "needs_decision" in str(blocked.error_in_exec) and "kx.reconcile" in str(
        blocked.error_in_exec
    )


def test_a_new_process_takes_over_and_skips_completed_cells(ip: InteractiveShell) -> None:
    assert cell(ip, "%%agent t --step a\nrun.state['n'] = 5\nsend('a')").success
    store = runtime().settings.store()
    store.update_run("t", owner="someone@elsewhere:1")  # as if the kernel had died
    forget_cell_runs()
    assert cell(ip, "%%agent t --step a\nrun.state['n'] = 5\nsend('a')").success
    assert cell(ip, "%%agent t --step b\nseen = run.state['n']\nsend('b')").success
    assert ip.user_ns["seen"] == 5 and sent(ip) == ["a", "b"]
    assert "resumed" in [e["kind"] for e in store.events("t")]


def test_a_run_owned_by_a_live_process_is_not_taken_over(ip: InteractiveShell) -> None:
    assert cell(ip, "%%agent live --step a\nsend('a')").success
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        owner = f"someone@{socket.gethostname()}:{other.pid}"  # another kernel on this host
        runtime().settings.store().update_run("live", owner=owner)
        forget_cell_runs()
        result = cell(ip, "%%agent live --step b\nsend('b')")
        assert isinstance(result.error_in_exec, UsageError)
        assert "is live in" in str(result.error_in_exec)
    finally:
        other.kill()
        other.wait()
    assert cell(ip, "%%agent live --step b\nsend('b')").success  # its owner is gone now
    assert sent(ip) == ["a", "b"]


def test_effects_in_agent_cells_use_the_ledger(ip: InteractiveShell) -> None:
    assert cell(ip, "%%agent L --step a\nsend(1)\nsend(2)").success
    rows = kx.sql("SELECT step_key, call_ordinal, status FROM effects ORDER BY call_ordinal")
    assert rows.values.tolist() == [["a", 0, "applied"], ["a", 1, "applied"]]


def test_usage_errors(ip: InteractiveShell) -> None:
    for source in (
        "%%agent\nx = 1",
        "%%agent r --bogus\nx = 1",
        "%agent frobnicate r",
        "%agent stop",
        "%agent stop no-such-run",
        "%%agent r --max-step-seconds -1\nx",
        "%ledger",
        "%ledger DELETE FROM runs",
        "%ledger SELEC 1",
        "%ledger -x SELECT 1",
    ):
        result = cell(ip, source)
        assert isinstance(result.error_in_exec, UsageError), source
    assert cell(
        ip,
        """
@kx.agent(name="plain")
def plain(run):
    pass
plain.run(run_id="plain-1")
""",
    ).success
    result = cell(ip, "%%agent plain-1\nx = 1")
    assert isinstance(result.error_in_exec, UsageError)
    assert "not to %%agent cells" in str(result.error_in_exec)


def test_complete_and_list(ip: InteractiveShell, capsys: pytest.CaptureFixture[str]) -> None:
    assert cell(ip, "%%agent c --step a\nx = 1").success
    assert cell(ip, "%agent complete c").success
    assert cell(ip, "%agent complete c").success
    assert "already completed" in capsys.readouterr().out
    assert cell(ip, "%%agent c --step a\nx = 1").success  # done before: skipped
    result = cell(ip, "%%agent c --step b\nx = 2")
    assert isinstance(result.error_in_exec, AgentCellStopped) and "completed" in str(
        result.error_in_exec
    )
    listed = cell(ip, "%agent list").result
    assert listed["id"].tolist() == ["c"]


# -- %ledger --------------------------------------------------------------------------------------
def test_ledger_line_cell_and_output_variable(ip: InteractiveShell) -> None:
    assert cell(ip, "%%agent q --step a\nsend(1)").success
    line = cell(ip, "%ledger SELECT tool, status FROM effects")
    assert line.result.values.tolist() == [["send", "applied"]]
    assert cell(ip, "%%ledger -o out\nSELECT count(*) AS n\nFROM effects").success
    assert ip.user_ns["out"]["n"].tolist() == [1]
    assert cell(ip, "%ledger -o df SELECT id FROM runs").success
    assert ip.user_ns["df"]["id"].tolist() == ["q"]


def test_ledger_shows_what_the_database_refused_as_one_message(ip: InteractiveShell) -> None:
    failed = cell(ip, "%ledger SELECT * FROM nosuchtable")
    assert isinstance(failed.error_in_exec, UsageError)
    message = str(failed.error_in_exec)
    assert message.startswith("The query was not run: the database says: Catalog Error")
    assert "nosuchtable" in message and "SHOW TABLES" in message


# -- display ------------------------------------------------------------------------------------
def test_handle_displays_as_panel_with_fallbacks(ip: InteractiveShell) -> None:
    assert cell(
        ip,
        """
@kx.agent(name="shown")
def shown(run):
    for i in run.steps(range(3)):
        send(i)
h = shown.run(run_id="shown-1")
""",
    ).success
    data, _ = ip.display_formatter.format(ip.user_ns["h"])
    assert "application/vnd.jupyter.widget-view+json" in data
    assert 'class="kernelext-panel' in data["text/html"] and "completed" in data["text/html"]
    assert data["text/plain"].startswith("run shown-1 [shown]: completed")
    status = cell(ip, "%agent status shown-1").result
    assert status is ip.user_ns["h"] or status.run_id == "shown-1"


# -- did you mean -------------------------------------------------------------------------------
def test_an_unknown_sub_command_names_the_nearest(ip: InteractiveShell) -> None:
    result = cell(ip, "%agent stpo nightly")
    assert isinstance(result.error_in_exec, UsageError)
    assert "no sub-command 'stpo'. Did you mean 'stop'?" in str(result.error_in_exec)
    result = cell(ip, "%agent frobnicate nightly")
    assert isinstance(result.error_in_exec, UsageError)
    assert "Did you mean" not in str(result.error_in_exec)
    assert "%agent stop|resume|status|complete RUN_ID" in str(result.error_in_exec)


def test_an_unknown_run_id_names_the_nearest(ip: InteractiveShell) -> None:
    assert cell(ip, "%%agent nightly-report --step a\nx = 1").success
    location = runtime().settings.store().location
    for command in ("stop", "resume", "status", "complete"):
        result = cell(ip, f"%agent {command} nightly-reprot")
        assert isinstance(result.error_in_exec, UsageError), command
        assert str(result.error_in_exec) == (
            f"No run 'nightly-reprot' in the store at {location}. Did you mean "
            "'nightly-report'? List runs with %agent list."
        )
    result = cell(ip, "%agent status zzz")
    assert isinstance(result.error_in_exec, UsageError)
    assert str(result.error_in_exec) == (
        f"No run 'zzz' in the store at {location}. List runs with %agent list."
    )


# -- kx.configure = %config Kernelext ------------------------------------------------------------
def test_configure_takes_every_config_option(ip: InteractiveShell, tmp_path: Path) -> None:
    keywords = set(inspect.signature(kx.configure).parameters) - {"others"}
    assert keywords == set(Kernelext.class_trait_names(config=True))
    other = tmp_path / "other.duckdb"
    secret = tmp_path / "notes.txt"
    secret.write_text("read through %%ledger")
    kx.configure(
        store=str(other),
        expiry={"user_stop": 60},
        retention_seconds=5,
        check_timeout=1.5,
        max_step_seconds=7,
        soft_interrupt=False,
        interrupt_window=0.5,
        allow_files=True,
    )
    assert runtime().settings.store().location == str(other)
    assert runtime().settings.expiry.durations["user_stop"] == dt.timedelta(minutes=1)
    assert (runtime().settings.retention_seconds, runtime().settings.check_timeout) == (5.0, 1.5)
    assert cell(ip, "%%agent cfg-api\nx = 1").success
    assert runtime().settings.store().get_run("cfg-api")["max_step_seconds"] == 7.0
    ip.user_ns["path"] = str(secret)
    try:
        read = cell(ip, "%ledger SELECT content FROM read_text({path})")
    finally:
        ip.user_ns.pop("path", None)
    assert read.success, read.error_in_exec
    assert read.result["content"].tolist() == ["read through %%ledger"]
    assert (notebook_option("soft_interrupt"), notebook_option("interrupt_window")) == (False, 0.5)


def test_configure_refuses_an_unknown_option_or_a_bad_value_and_changes_nothing() -> None:
    nearest = r"no option 'retention'\. Did you mean 'retention_seconds'\?"
    with pytest.raises(TypeError, match=nearest):
        kx.configure(retention=60)
    with pytest.raises(TypeError, match=r"no option 'stor'\. Did you mean 'store'"):
        kx.configure(stor="x.duckdb")
    before = (
        runtime().settings.retention_seconds,
        dict(runtime().settings.expiry.durations),
        saved(),
    )
    with pytest.raises(TypeError, match=r"allow_files=\.\.\.\) takes True or False"):
        kx.configure(retention_seconds=60, allow_files="yes")
    with pytest.raises(TypeError, match="takes a number of seconds"):
        kx.configure(max_step_seconds="30")
    with pytest.raises(ValueError, match="positive number of seconds"):
        kx.configure(expiry={"approval": 60, "user_stop": -1}, interrupt_window=9)
    assert (
        runtime().settings.retention_seconds,
        dict(runtime().settings.expiry.durations),
        saved(),
    ) == before


def test_config_goes_through_the_same_checks(
    ip: InteractiveShell, caplog: pytest.LogCaptureFixture
) -> None:
    assert cell(ip, "%config Kernelext.allow_files = True").success
    assert notebook_option("allow_files") is True
    ip.run_line_magic("unload_ext", "kernelext")  # unloading puts the options back
    assert notebook_option("allow_files") is False
    ip.config.pop("Kernelext", None)
    ip.run_line_magic("load_ext", "kernelext")
    magics = extension.loaded()
    assert magics is not None
    before = dict(runtime().settings.expiry.durations)
    cell(ip, "%config Kernelext.expiry = {'approval': -5}")  # IPython logs the refusal
    assert "positive number of seconds" in caplog.text
    assert magics.expiry == before == runtime().settings.expiry.durations  # left as it was


def test_interrupt_options_are_read_at_each_press(ip: InteractiveShell) -> None:
    assert cell(
        ip,
        """
import threading
gate, entered = threading.Event(), threading.Event()
@kx.agent(name="pressed")
def pressed(run):
    for i in run.steps(range(2)):
        if i == 0:
            entered.set()
            gate.wait(30)
h = pressed.start(run_id="pressed-1")
""",
    ).success
    # Pressed while the run is inside its first step: a stop asked before it got there
    # lands at that step's boundary, and the run is no longer live for the next press.
    assert ip.user_ns["entered"].wait(30)

    class Kernel:  # what ipykernel offers the handler
        saved_sigint_handler: Any = signal.SIG_IGN

        def pre_handler_hook(self) -> None: ...

        def post_handler_hook(self) -> None: ...

    delegated: list[int] = []
    handler = InterruptHandler(Kernel())
    handler.original = lambda signum, frame: delegated.append(signum)
    try:
        kx.configure(soft_interrupt=False)
        handler(signal.SIGINT, None)  # as if kernelext were not there
        assert delegated == [signal.SIGINT] and handler.presses == []
        kx.configure(soft_interrupt=True, interrupt_window=0.0)
        handler(signal.SIGINT, None)
        handler(signal.SIGINT, None)  # outside a window of 0 s: another soft stop
        kx.configure(interrupt_window=60.0)
        handler(signal.SIGINT, None)  # within 60 s of the last press: forced
        handler.wait_idle()
    finally:
        ip.user_ns["gate"].set()
    assert [kind for _, kind in handler.presses] == ["stop", "stop", "force"]
    assert ip.user_ns["h"].wait(30) == "suspended"
