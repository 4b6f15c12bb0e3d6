"""A stop from another process reaches a run while its process keeps the store file busy.

Real processes on one real DuckDB file: an owner executes an agent run and then runs a
long ``kx.sql`` query (``tests/support/sql_owner.py``); ``kernelext stop`` and the notebook
server's Stop / Force stop (``from_elsewhere.act``) are asked from other processes. The
request is recorded beside the store (``_store/duckdb/mailbox.py``), answered at once, and
the run suspends while the query still runs. Timings: ``benchmarks/stop_while_busy.py``.
"""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

from support.store_holder import SUPPORT, Child, hold_store

import kernelext as kx

QUERY_SECONDS = "20"  # the owner's query: far longer than a stop needs to land


def owner(store: Path, run_id: str, step_seconds: float = 0.02) -> Child:
    child = Child(
        str(SUPPORT / "sql_owner.py"), str(store), run_id, QUERY_SECONDS, str(step_seconds)
    )
    child.expect("querying")
    return child


def cli_stop(store: Path, run_id: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(SUPPORT.parent)}
    return subprocess.Popen(
        [sys.executable, "-m", "kernelext", "stop", run_id, "--store", str(store)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def answer_then_kill(store: Path, run_id: str) -> str:
    """``kernelext stop``'s answer; the process is SIGKILLed right after it answered."""
    stop = cli_stop(store, run_id)
    assert stop.stdout is not None and stop.stderr is not None
    answer = stop.stdout.readline()  # the request is durable once this is printed
    stop.send_signal(signal.SIGKILL)
    stop.wait()
    stop.stdout.close()
    stop.stderr.close()
    return answer


def events(store: Path, run_id: str) -> list[dict[str, object]]:
    """The run's events, once every journal left beside the store is folded (an open)."""
    opened = kx.open_store(str(store))
    try:
        rows: list[dict[str, object]] = opened.events(run_id)
        status = opened.get_run(run_id)["status"]
    finally:
        opened.close()
    assert not glob.glob(f"{store}.journal.*"), "every journal is folded and removed"
    return [*rows, {"kind": "(status)", "status": status}]


def kinds(rows: list[dict[str, object]], kind: str, source: str | None = None) -> int:
    return sum(1 for r in rows if r["kind"] == kind and source in (None, r.get("source")))


def test_kernelext_stop_answers_at_once_and_the_run_suspends_during_the_query(
    tmp_path: Path,
) -> None:
    store = tmp_path / "s.duckdb"
    run = owner(store, "q1")
    try:
        answer = answer_then_kill(store, "q1")
        assert "stop recorded for run q1" in answer and "store is busy" in answer, answer
        assert "safe point" in answer
        assert not run.printed("query ended"), "answered while the query still ran"
        suspended = float(run.expect("suspended").split()[1])
        ended = float(run.expect("query ended").split()[2])
        assert suspended < ended, "the run suspended while its process ran the query"
        assert run.expect("status") == "status suspended cli"
        run.proc.wait(120)
    finally:
        run.close()
    rows = events(store, "q1")
    assert kinds(rows, "stop_requested", "cli") == 1  # its own copy and the posted one: one
    assert kinds(rows, "suspended") == 1
    assert rows[-1]["status"] == "suspended"


def test_the_exit_code_and_words_of_a_stop_while_busy(tmp_path: Path) -> None:
    store = tmp_path / "s.duckdb"
    run = owner(store, "q2")
    try:
        first = cli_stop(store, "q2").communicate(timeout=120)
        again = cli_stop(store, "q2")  # a second stop: recorded too, changes nothing more
        out, err = again.communicate(timeout=120)
        assert again.returncode == 0, err
        assert "stop recorded for run q2" in first[0] and "stop recorded" in out, (first, out)
        assert not run.printed("query ended")
        run.expect("suspended")
        run.expect("query ended")
        run.proc.wait(120)
    finally:
        run.close()
    rows = events(store, "q2")
    assert kinds(rows, "stop_requested", "cli") == 2  # each request is one event
    assert kinds(rows, "suspended") == 1
    assert rows[-1]["status"] == "suspended"


FORCE = textwrap.dedent(
    """
    import sys, tempfile, time
    from kernelext._core.process import shown_stores
    from kernelext._core.lifecycle.from_elsewhere import act
    shown_in = tempfile.mkdtemp()
    shown_stores.record(shown_in, sys.argv[1])  # as the run's panel notes its store
    began = time.time()
    done = act("force", sys.argv[2], sys.argv[1], shown_in=shown_in)
    print("answer", done["recorded"], done["status"], round(time.time() - began, 3))
    print("message", done["message"])
    """
)


def test_a_force_stop_through_the_server_route_while_busy(tmp_path: Path) -> None:
    store = tmp_path / "s.duckdb"
    run = owner(store, "q3", step_seconds=8.0)  # a soft stop would wait for the step
    try:
        click = Child("-c", FORCE, str(store), "q3")
        answer = click.expect("answer")
        assert answer.startswith("answer True stopping"), answer
        assert "force stop recorded" in click.expect("message")
        click.close()
        assert not run.printed("query ended")
        suspended = float(run.expect("suspended").split()[1])
        assert suspended < float(run.expect("query ended").split()[2])
        run.proc.wait(120)
    finally:
        run.close()
    rows = events(store, "q3")
    assert kinds(rows, "force_requested", "panel") == 1
    assert kinds(rows, "stop_requested", "panel") == 1
    assert kinds(rows, "stop_forced") == 1


KILLED_OWNER = textwrap.dedent(
    """
    import sys, time
    import kernelext as kx
    kx.configure(store=sys.argv[1])
    @kx.agent(name="ticker")
    def ticker(run):
        for _ in run.steps(range(1_000_000), key=str):
            time.sleep(0.02)
    h = ticker.start(run_id=sys.argv[2])
    time.sleep(0.5)
    kx.sql("SELECT 1")
    print("running", flush=True)
    time.sleep(600)
    """
)


def test_a_posted_stop_is_durable_and_folded_by_the_next_opener(tmp_path: Path) -> None:
    store = tmp_path / "s.duckdb"
    gone = Child("-c", KILLED_OWNER, str(store), "q4")
    gone.expect("running")
    gone.close()  # SIGKILL: the run stays ``running`` in the store, nobody executes it
    holder = hold_store(str(store))
    try:
        answer = answer_then_kill(store, "q4")
        assert "stop recorded for run q4" in answer, answer
        assert glob.glob(f"{store}.journal.*"), "the request waits beside the store"
        holder.send("")
        holder.expect("released")
    finally:
        holder.close()
    rows = events(store, "q4")
    assert kinds(rows, "stop_requested", "cli") == 1
    assert rows[-1]["status"] == "stopping"


def test_an_agent_cell_run_takes_the_posted_stop_at_its_next_boundary(tmp_path: Path) -> None:
    """A ``%%agent`` run of this process: ``kernelext stop`` elsewhere while another process
    keeps the file is taken at the next cell boundary, before the file is free again."""
    from kernelext._core.encoding.names import source_hash
    from kernelext._core.lifecycle.cell_runs import forget_cell_runs, open_cell_run

    store = kx.open_store(str(tmp_path / "s.duckdb"))
    cell = open_cell_run("cells", store=store)
    try:
        assert cell.run_step("one", source_hash("one"), lambda: None).kind == "completed"
        store.flush()
        holder = hold_store(store.location)
        try:
            answer = answer_then_kill(tmp_path / "s.duckdb", "cells")
            assert "stop recorded for run cells" in answer, answer
            rows: list[dict[str, object]] = []
            boundary = threading.Thread(target=lambda: rows.append(cell.boundary()))
            boundary.start()
            assert cell.run.stop_event.wait(60), "taken at the boundary, the file still held"
            assert holder.running and boundary.is_alive()  # (its row read waits for the file)
            holder.send("release")
            holder.expect("released")
            boundary.join(120)
        finally:
            holder.close()
        assert rows and rows[0]["status"] == "suspended"
    finally:
        forget_cell_runs("cells")
        store.close()
    rows = events(tmp_path / "s.duckdb", "cells")
    assert kinds(rows, "stop_requested", "cli") == 1
    assert kinds(rows, "suspended", "cli") == 1


def test_the_reader_takes_each_posted_stop_once_from_what_was_appended(tmp_path: Path) -> None:
    """``ForeignStops`` reads other journals from the last offset: a frame cut short is
    taken once it is whole, a journal truncated after a fold is read again from its start,
    each request is taken once, and only for the runs asked about and made since."""
    import datetime as dt

    from kernelext._store.duckdb.journal import Journal, frame
    from kernelext._store.duckdb.mailbox import ForeignStops

    store = str(tmp_path / "s.duckdb")
    now = dt.datetime(2026, 1, 1, 12, 0)

    def stop(run_id: str, request: str, at: dt.datetime = now) -> dict[str, object]:
        return {"run_id": run_id, "source": "cli", "who": "u", "at": at, "request": request}

    own, other = Journal(store), Journal(store)
    reader = ForeignStops(store, own.path)
    try:
        own.append("stop_request", stop("r1", "mine"), sync=True, enqueue=lambda: None)
        other.append("fact", {"run_id": "r1", "name": "n"}, sync=True, enqueue=lambda: None)
        other.append("stop_request", stop("r1", "a"), sync=True, enqueue=lambda: None)
        other.append("stop_request", stop("r2", "b"), sync=True, enqueue=lambda: None)
        old = stop("r1", "stale", now - dt.timedelta(seconds=1))
        other.append("stop_request", old, sync=True, enqueue=lambda: None)
        assert [d["request"] for d in reader.poll(("r1",), now)] == ["a"]
        assert reader.poll(("r1",), now) == []  # nothing changed: nothing read
        whole = frame(99, "stop_request", stop("r1", "torn"))
        with open(other.path, "ab") as out:  # an append caught half-way
            out.write(whole[:10])
        assert reader.poll(("r1",), now) == []
        with open(other.path, "ab") as out:
            out.write(whole[10:])
        assert [d["request"] for d in reader.poll(("r1",), now)] == ["torn"]
        os.truncate(other.path, 0)  # folded and truncated, then appended again: longer
        with open(other.path, "ab") as out:
            out.write(frame(1, "stop_request", stop("r1", "after", now) | {"reason": "x" * 900}))
            out.write(frame(2, "stop_request", stop("r1", "a")))  # taken before: not again
        assert [d["request"] for d in reader.poll(("r1",), now)] == ["after"]
    finally:
        own.close()
        other.close()
