"""One owner per run, fenced by the ownership epoch (issue 19 item 4).

Unit and store-level tests: a stale-epoch write of each kind is refused on both backends;
every take-over raises the epoch; owner identity carries the process start time.
"""

from __future__ import annotations

import datetime as dt
import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.intents import bare_intent

import kernelext as kx
from kernelext._core.lifecycle.takeover import take_over
from kernelext._core.process.lease import check_takeover, owner_alive, parse_owner
from kernelext._store import actor
from kernelext._store.base import process_start
from kernelext.errors import OwnershipLost, RunStateError
from kernelext.status import EffectStatus, Status

pytestmark = pytest.mark.both_backends


def _taken_elsewhere(store: Any, run_id: str) -> int:
    """What another process's take-over does to the tables (and the fence), leaving this
    store's held epoch as it was."""
    epoch: int = store.write(lambda tx: store.advance_epoch_tx(tx, run_id))
    store.update_run(run_id, owner="someone@elsewhere:4242.7")
    return epoch


def test_a_start_holds_epoch_one_and_each_take_over_raises_it(store: Any) -> None:
    assert store.create_run("r", "agent", owner=actor())
    assert store.held_epoch("r") == 1 and store.get_run("r")["owner_epoch"] == 1
    store.transition("r", Status.SUSPENDED, (Status.RUNNING,), epoch=1)
    taken = take_over(store, "r", "api")
    assert taken.epoch == 2 and store.held_epoch("r") == 2
    assert store.get_run("r")["owner_epoch"] == 2


def test_a_stale_write_of_each_kind_is_refused(store: Any, backend: str) -> None:
    assert store.create_run("r", "agent", owner=actor())
    step = uuid.uuid4()
    store.begin_step("r", step, 0, "s0", None)
    done = uuid.uuid4()
    store.write_intent(bare_intent("r", key=done))
    store.write_outcome(done, EffectStatus.APPLIED, result="1", wait=True)
    pending = uuid.uuid4()
    store.write_intent(bare_intent("r", 1, pending))
    store.flush()
    assert _taken_elsewhere(store, "r") == 2
    lease_before = store.get_run("r")["lease_until"]

    with pytest.raises(OwnershipLost) as lost:  # the effect intent: before any call
        store.write_intent(bare_intent("r", 2))
    text = str(lost.value)
    assert "someone@elsewhere:4242.7" in text and "epoch 2" in text
    assert "%agent resume r" in text and "kx.resume('r')" in text
    with pytest.raises(OwnershipLost):  # a step's completion and its snapshot
        store.complete_step("r", step, 0, 0.1, {"format": 1, "keys": {}}, [], 0)
    with pytest.raises(OwnershipLost):  # a step's end
        store.end_step("r", step, "failed", error="x")
    with pytest.raises(OwnershipLost):  # a status change
        store.transition("r", Status.SUSPENDED, (Status.RUNNING,), epoch=1)
    # A step's start: refused at the append (DuckDB: under the fence) or in its
    # transaction, which commits in the background (PostgreSQL): no row either way.
    try:
        store.begin_step("r", uuid.uuid4(), 1, "s1", None)
    except OwnershipLost:
        assert backend == "duckdb"
    # An effect's outcome (the call was made): refused in its transaction (PostgreSQL) or
    # by the fold, which keeps it in quarantine (DuckDB); never applied.
    try:
        store.write_outcome(pending, EffectStatus.APPLIED, result="2", wait=True)
    except OwnershipLost:
        assert backend == "postgres"
    fact = {
        "run_id": "r",
        "name": "price",
        "kind": "value",
        "value": "1",
        "fingerprint": None,
        "check_name": None,
        "check_args": None,
        "tolerance": None,
        "step_ordinal": 0,
        "compare_name": None,
    }
    try:  # a fact: like a step start
        store.record_fact(fact)
    except OwnershipLost:
        assert backend == "duckdb"
    store.renew_lease("r", dt.datetime(2099, 1, 1), actor())
    store.flush()
    assert store.read("SELECT count(*) FROM facts WHERE run_id = 'r'") == [(0,)]

    run = store.get_run("r")
    assert run["status"] == Status.RUNNING and run["owner"] == "someone@elsewhere:4242.7"
    assert run["lease_until"] == lease_before  # a stale owner never renews the taker's lease
    assert store.effect(pending)["status"] == EffectStatus.PENDING
    assert [s["key"] for s in store.steps("r")] == ["s0"]
    assert store.steps("r")[0]["status"] == "running"
    assert len(store.load_effects("r")) == 2


def test_a_stale_outcome_journaled_is_kept_in_quarantine_not_applied(
    store: Any, backend: str
) -> None:
    if backend != "duckdb":
        pytest.skip("PostgreSQL refuses it at the call (previous test)")
    assert store.create_run("r", "agent", owner=actor())
    key = uuid.uuid4()
    store.write_intent(bare_intent("r", key=key))
    store.flush()
    _taken_elsewhere(store, "r")
    store.write_outcome(key, EffectStatus.APPLIED, result="1", wait=True)
    store.flush()
    assert store.effect(key)["status"] == EffectStatus.PENDING
    rows = kx.sql("SELECT kind, run_id FROM quarantine").to_dict("records")
    assert rows == [{"kind": "outcome", "run_id": "r"}]
    assert store.get_run("r")["status"] == Status.RUNNING  # the new owner is not held


def test_a_take_over_folds_what_the_previous_owner_journaled(store: Any, backend: str) -> None:
    """An intent appended (durable) but not folded when the take-over happens is seen by
    the take-over: it becomes unknown instead of being made again."""
    if backend != "duckdb":
        pytest.skip("no journal on PostgreSQL")
    from kernelext._store.duckdb.journal import frame

    assert store.create_run("r", "agent", owner=actor())
    store.transition("r", Status.SUSPENDED, (Status.RUNNING,), epoch=1)
    key = uuid.uuid4()
    data = {**bare_intent("r", key=key), "at": store.now(), "epoch": 1}
    journal = f"{store.location}.journal.999999.deadbeef"  # another live process's
    Path(journal).write_bytes(frame(1, "intent", data))
    taken = take_over(store, "r", "api")
    assert taken.status == Status.NEEDS_DECISION and taken.unknown == [key]
    assert store.effect(key)["status"] == EffectStatus.UNKNOWN
    # Its own process folds it again later: the same record is applied as once.
    from kernelext._store.duckdb.bulk import apply_records

    refused = store.write(lambda tx: apply_records(tx, [(1, "intent", data)]))
    assert refused == [] and store.effect(key)["status"] == EffectStatus.UNKNOWN
    # A stale intent the take-over did not see (appended after it) is refused, kept.
    late = {**bare_intent("r", 1), "at": store.now(), "epoch": 1}
    refused = store.write(lambda tx: apply_records(tx, [(2, "intent", late)]))
    assert [r[2]["key"] for r in refused] == [late["key"]]
    assert store.effect(late["key"]) is None


def test_an_intent_with_a_known_key_from_another_call_is_refused(store: Any, backend: str) -> None:
    if backend != "duckdb":
        pytest.skip("the fold is DuckDB's; PostgreSQL returns the existing row to the caller")
    from kernelext._store.duckdb.bulk import apply_records

    assert store.create_run("r", "agent", owner=actor())
    key = uuid.uuid4()
    first = {**bare_intent("r", key=key), "at": store.now(), "epoch": 1}
    assert store.write(lambda tx: apply_records(tx, [(1, "intent", first)])) == []
    again = store.write(lambda tx: apply_records(tx, [(1, "intent", first)]))
    assert again == []  # the same record twice: as once
    other = {**first, "at": first["at"] + dt.timedelta(seconds=1)}
    refused = store.write(lambda tx: apply_records(tx, [(2, "intent", other)]))
    assert [r[2]["at"] for r in refused] == [other["at"]]


# -- owner identity -------------------------------------------------------------------
def test_owner_identity_carries_the_process_start_time() -> None:
    me = actor()
    start = process_start(os.getpid())
    if start is None:
        pytest.skip("no /proc here")
    assert me.endswith(f":{os.getpid()}.{start}")
    assert parse_owner(me) == (socket.gethostname(), os.getpid(), start)
    assert owner_alive(me) is True


@pytest.mark.parametrize(
    "owner, parsed",
    [
        ("a@b@host:12.34", ("host", 12, 34)),
        ("do:main\\user@host:12", ("host", 12, None)),
        ("u:x@host:12.3", ("host", 12, 3)),
        ("u@host:12.x", None),
        ("nohost", None),
        ("u@host", None),
    ],
)
def test_owner_strings_with_at_or_colon_in_the_user_name(
    owner: str, parsed: tuple[str, int, int | None] | None
) -> None:
    assert parse_owner(owner) == parsed


@pytest.fixture
def live_process() -> Iterator[tuple[int, int]]:
    """Another live process on this host, as ``(pid, start)``: an owner that is alive.

    ``start`` is the process's start time as owners record it; the test is skipped where
    there is no /proc to read it from.
    """
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        start = process_start(other.pid)
        if start is None:
            pytest.skip("no /proc here")
        yield other.pid, start
    finally:
        other.kill()
        other.wait()


def test_a_reused_pid_never_blocks_a_take_over(live_process: tuple[int, int]) -> None:
    pid, start = live_process
    now = dt.datetime(2026, 1, 1, 12, 0, 0)
    host = socket.gethostname()
    live = {"id": "r", "status": Status.RUNNING, "lease_until": now + dt.timedelta(seconds=20)}
    # The very process, lease current: refused, with the full UTC date-time.
    with pytest.raises(RunStateError, match="lease until 2026-01-01 12:00:20 UTC"):
        check_takeover({**live, "owner": f"u@{host}:{pid}.{start}"}, now)
    # The same PID with another start time: the owner died and the PID was reused.
    check_takeover({**live, "owner": f"u@{host}:{pid}.{start + 1}"}, now)
    # An older release's owner (no start time) naming a live PID: once the lease
    # lapsed it is taken over (the epoch fences whatever that process still writes).
    old = f"u@{host}:{pid}"
    with pytest.raises(RunStateError):
        check_takeover({**live, "owner": old}, now)
    check_takeover({**live, "owner": old, "lease_until": now - dt.timedelta(seconds=1)}, now)


# -- attacks ------------------------------------------------------------------------
def test_two_take_overs_at_one_instant_leave_one_writer(store: Any, store_path: Any) -> None:
    """Two store objects (as two processes would) take the run over at one instant: each
    take-over raises the epoch once, and only the last one's writes go through."""
    import threading

    if not str(store_path).startswith("postgresql"):
        pytest.skip("two writers on one DuckDB file take turns through one process's hand-over")
    from kernelext._store import open_store

    other = open_store(str(store_path))  # not the runtime's: a second, independent writer
    try:
        assert store.create_run("r", "agent", owner=actor())
        store.transition("r", Status.SUSPENDED, (Status.RUNNING,), epoch=1)
        barrier = threading.Barrier(2)
        results: dict[str, Any] = {}

        def resume(name: str, s: Any) -> None:
            barrier.wait()
            results[name] = take_over(s, "r", "api")

        threads = [
            threading.Thread(target=resume, args=(n, s)) for n, s in (("a", store), ("b", other))
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        epochs = sorted(r.epoch for r in results.values())
        assert epochs == [2, 3] and store.get_run("r")["owner_epoch"] == 3
        last, first = (other, store) if other.held_epoch("r") == 3 else (store, other)
        with pytest.raises(OwnershipLost):
            first.write_intent(bare_intent("r"))
        assert last.write_intent(bare_intent("r")) is None
    finally:
        other.close()


def test_an_old_journal_folded_after_a_take_over_is_kept_not_applied(
    store: Any, backend: str
) -> None:
    """A dead owner's journal, folded by the next open after another process took the run
    over: what the take-over did not see is refused, kept in quarantine, the run not held."""
    if backend != "duckdb":
        pytest.skip("no journal on PostgreSQL")
    from kernelext._store.duckdb.journal import frame

    location = store.location
    assert store.create_run("r", "agent", owner=actor())
    _taken_elsewhere(store, "r")
    key = uuid.uuid4()
    stale = {**bare_intent("r", key=key), "at": store.now(), "epoch": 1}
    legacy_key = uuid.uuid4()  # a record of an older release (no epoch) is applied as before
    legacy = {**bare_intent("r", 1, legacy_key), "at": store.now()}
    Path(f"{location}.journal.999998.cafef00d").write_bytes(
        frame(1, "intent", stale) + frame(2, "intent", legacy)
    )
    from kernelext._core.process.runtime import runtime

    runtime().close()
    reopened = kx.open_store(location)
    assert reopened.effect(key) is None
    assert reopened.effect(legacy_key)["status"] == EffectStatus.PENDING
    rows = kx.sql("SELECT kind, run_id FROM quarantine").to_dict("records")
    assert rows == [{"kind": "intent", "run_id": "r"}]
    assert reopened.get_run("r")["status"] == Status.RUNNING


def test_a_take_over_waits_for_an_intent_being_appended_then_refuses(tmp_path: Path) -> None:
    from kernelext._store.duckdb.fence import FenceFiles

    fence = FenceFiles(str(tmp_path / "s.duckdb"))
    fence.advance("r", 1)
    with fence.shared("r") as epoch:  # an owner between its check and its append
        assert epoch == 1
        with pytest.raises(RunStateError, match="cannot be taken over now"):
            fence.advance("r", 2, wait=0.2)
    fence.advance("r", 2, wait=0.2)
    assert fence.read("r") == 2
    fence.start("r", 1)  # never overwrites an epoch a take-over wrote
    assert fence.read("r") == 2
    fence.close()


def test_a_run_without_a_fence_file_falls_back_to_the_tables(store: Any, backend: str) -> None:
    if backend != "duckdb":
        pytest.skip("fence files are DuckDB's")
    import shutil

    assert store.create_run("r", "agent", owner=actor())
    store.backend.fence.close()
    shutil.rmtree(f"{store.location}.fence")
    assert store.write_intent(bare_intent("r")) is None  # epoch 1 from the tables
    _taken_elsewhere(store, "r")
    with pytest.raises(OwnershipLost):
        store.write_intent(bare_intent("r", 1))


def test_fence_descriptors_stay_few_over_many_runs(tmp_path: Path) -> None:
    from kernelext._store.duckdb.fence import KEEP_OPEN, FenceFiles

    fence = FenceFiles(str(tmp_path / "s.duckdb"))
    for n in range(KEEP_OPEN * 3):
        fence.advance(f"r{n}", n + 1)
        assert fence.read(f"r{n}") == n + 1
        assert len(fence._fds) <= KEEP_OPEN + 1
    fence.close()


def test_a_stale_retry_of_a_call_decided_not_applied_is_refused(store: Any) -> None:
    assert store.create_run("r", "agent", owner=actor())
    key = uuid.uuid4()
    store.write_intent(bare_intent("r", key=key))
    store.write_outcome(key, EffectStatus.FAILED, error="boom", wait=True)
    store.flush()
    _taken_elsewhere(store, "r")
    with pytest.raises(OwnershipLost):
        store.retry_intent(key, expected=EffectStatus.FAILED)
    assert store.effect(key)["status"] == EffectStatus.FAILED


def test_a_fence_folder_removed_while_the_owner_runs_still_refuses_a_stale_intent(
    store: Any, backend: str
) -> None:
    """The owner keeps its fence descriptor open; the folder is removed and a take-over
    writes a new file by path: the owner's next check sees the new file, not the old one."""
    if backend != "duckdb":
        pytest.skip("fence files are DuckDB's")
    import shutil

    assert store.create_run("r", "agent", owner=actor())
    assert store.write_intent(bare_intent("r")) is None  # descriptor now kept
    shutil.rmtree(f"{store.location}.fence")
    assert store.write_intent(bare_intent("r", 1)) is None  # the tables: epoch 1
    shutil.rmtree(f"{store.location}.fence")
    assert _taken_elsewhere(store, "r") == 2  # recreates the file by path, epoch 2
    with pytest.raises(OwnershipLost):
        store.write_intent(bare_intent("r", 2))
    assert store.backend.fence.read("r") == 2


def test_a_stale_kernel_cannot_complete_or_move_the_run(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``%agent complete`` and a resume step's move (needs_decision / suspended) carry the
    held epoch: a kernel taken over meanwhile is refused and the new owner's run stays."""
    import types

    import kernelext._core.lifecycle.resume_steps as steps
    from kernelext._core.encoding.names import CELL_AGENT
    from kernelext._core.lifecycle.cell_runs import complete_cell_run
    from kernelext.errors import NeedsDecision

    assert store.create_run("r", CELL_AGENT, owner=actor())
    _taken_elsewhere(store, "r")
    with pytest.raises(OwnershipLost):
        complete_cell_run("r", store=store)
    assert store.get_run("r")["status"] == Status.RUNNING

    run = types.SimpleNamespace(id="r")
    for error in (RuntimeError("credential refresh failed"), NeedsDecision("facts changed")):

        def fail(*_: Any, error: BaseException = error) -> None:
            raise error

        monkeypatch.setattr(steps, "refresh_credentials", fail)
        with pytest.raises(OwnershipLost):
            steps.before_first_action(run, store)  # type: ignore[arg-type]
        assert store.get_run("r")["status"] == Status.RUNNING


def test_a_live_kernel_s_cell_run_is_never_taken_over_by_lease_lapse(
    live_process: tuple[int, int],
) -> None:
    """Cell runs have no renewal thread: their owner's liveness is the kernel process. An
    agent run's lapsed lease is still taken over while its PID lives (it renews: frozen)."""
    pid, start = live_process
    now = dt.datetime(2026, 1, 1, 12, 0, 0)
    owner = f"u@{socket.gethostname()}:{pid}.{start}"
    lapsed = {
        "id": "r",
        "status": Status.RUNNING,
        "owner": owner,
        "lease_until": now - dt.timedelta(minutes=5),
    }
    with pytest.raises(RunStateError, match="never taken over while it lives"):
        check_takeover({**lapsed, "agent": "%%agent"}, now)
    check_takeover({**lapsed, "agent": "payroll"}, now)  # an agent run: frozen, taken
    # The kernel gone (same PID, another start time): taken over.
    gone = f"u@{socket.gethostname()}:{pid}.{start + 1}"
    check_takeover({**lapsed, "agent": "%%agent", "owner": gone}, now)


def test_no_probe_is_asked_while_the_previous_owner_may_still_be_calling(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A take-over from an owner not known to be gone (another host, lease lapsed) leaves
    the unknowns to a person: the probe would answer "not applied" for a call still on its
    way. A later resume asks the probe once the grace period has passed."""
    import kernelext._core.lifecycle.takeover as takeover
    from kernelext._core.ledger.probes import register_probe

    asked: list[str] = []

    def probe(key: str, args: Any) -> str:
        asked.append(key)
        return "not_applied"

    register_probe("pay", probe)
    assert store.create_run("r", "agent", owner=actor())
    key = uuid.uuid4()
    store.write_intent(bare_intent("r", key=key))  # the call is on its way
    store.flush()
    _taken_elsewhere(store, "r")  # owned on another host now, its lease lapsed
    store.update_run("r", lease_until=store.now() - dt.timedelta(seconds=1))

    taken = take_over(store, "r", "api")
    assert taken.status == Status.NEEDS_DECISION and taken.previous_owner is not None
    assert asked == [] and store.effect(key)["status"] == EffectStatus.UNKNOWN
    reason = store.get_run("r")["reason"]
    assert "someone@elsewhere:4242.7 may still be making this call" in reason

    again = take_over(store, "r", "api")  # at once: still within the grace period
    assert again.status == Status.NEEDS_DECISION and asked == []

    monkeypatch.setattr(takeover, "PROBE_GRACE_SECONDS", 0.0)
    later = take_over(store, "r", "api")
    assert asked == [str(key)] and later.status == Status.RUNNING
    assert store.effect(key)["status"] == EffectStatus.NOT_APPLIED


def test_the_stale_owner_is_told_its_accepted_calls_may_have_been_made() -> None:
    step = str(OwnershipLost("r", owner="o", epoch=2, held=1, what="step start"))
    assert "nothing was sent" not in step and "may have been called" in step
    assert "unknown" in step
    intent = str(OwnershipLost("r", owner="o", epoch=2, held=1, what="effect intent"))
    assert "nothing was sent for it" in intent
    outcome = str(OwnershipLost("r", owner="o", epoch=2, held=1, what="effect outcome"))
    assert "the call was made" in outcome and "nothing was sent" not in outcome
