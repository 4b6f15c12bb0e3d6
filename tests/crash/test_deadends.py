"""Every dead end has an exit (issue 19 item 7): bad input is refused up front with an
error that says what to do, and the store stays intact; faults under a running process
(the store file replaced or deleted, a side file that meets a full disk) end the run with
``StoreWriteError``, nothing acknowledged lost."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import glob
import math
import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.small_disk import fill

import kernelext as kx
from kernelext import _validate
from kernelext._cli.main import main as cli
from kernelext._store import Store, open_store
from kernelext._store.base import StoreBase
from kernelext._store.duckdb.journal import scan_journal
from kernelext._validate_functions import is_async_function
from kernelext.errors import StoreWriteError


def ledger(store: Store, run_id: str) -> list[tuple[str, str, str | None]]:
    rows = store.read(
        "SELECT tool, status, error FROM effects WHERE run_id = ? ORDER BY intent_at", (run_id,)
    )
    return [(str(r[0]), str(r[1]), r[2]) for r in rows]


def row_counts(store: Store) -> dict[str, int]:
    tables = ("runs", "steps", "effects", "events", "approvals", "questions", "facts", "snapshots")
    return {t: int(store.read(f"SELECT count(*) FROM {t}")[0][0]) for t in tables}


# -- 1. generator / async effects ----------
def test_a_generator_function_is_refused_as_an_effect_and_an_async_one_accepted() -> None:
    def gen(x: int) -> Iterator[int]:
        yield x

    async def agen(x: int) -> Any:
        yield x

    async def coro(x: int) -> int:
        return x

    class AsyncCallable:
        async def __call__(self, x: int) -> int:
            return x

    for fn in (gen, agen):
        with pytest.raises(TypeError, match="generator function"):
            kx.effect(fn)
        with pytest.raises(TypeError, match="generator function"):
            kx.effect(name="x")(fn)
    for fn in (coro, AsyncCallable()):  # awaited by the effect (tests/batch/test_batch_async.py)
        assert kx.effect(fn).is_async
    assert kx.effect(retry=True)(coro).is_async


def test_an_effect_is_never_wrapped_twice_and_the_checks_know_each_kernelext_kind() -> None:
    """A second ``@kx.effect`` would record each call twice: refused, whatever module the
    classes live in (each kind is registered by its own module, never looked up by path)."""

    def tool(x: int) -> int:
        return x

    async def coro(x: int) -> int:
        return x

    for fn in (tool, coro):
        once = kx.effect(fn)
        for wrap in (kx.effect, kx.effect(name="again"), kx.effect(retry=True)):
            with pytest.raises(TypeError, match="already an effect"):
                wrap(once)
    assert is_async_function(kx.effect(coro)) and not is_async_function(kx.effect(tool))
    known = {name: _validate._kind(name) for name in _validate.KINDS}
    assert known == {"Effect": kx.Effect, "ResumePlan": kx.ResumePlan, "StoreBase": StoreBase}
    with pytest.raises(TypeError, match="none of"):
        _validate.register(Effects=kx.Effect)  # a misspelt kind fails at import, loudly


def test_an_effect_that_returns_a_coroutine_is_recorded_failed_not_applied(store: Store) -> None:
    ran: list[str] = []

    async def send() -> str:
        ran.append("sent")  # never runs
        return "ok"

    @kx.effect
    def sneaky() -> Any:
        return send()

    @kx.effect
    def lazy() -> Any:
        return (ran.append("item") for _ in range(2))

    @kx.agent(name="returns_coro")
    def agent(run: kx.Run, which: str) -> None:
        with run.step("one"):
            (sneaky if which == "coro" else lazy)()

    for which, tool in (("coro", "sneaky"), ("gen", "lazy")):
        handle = agent.start(which, run_id=f"unrun-{which}")
        assert handle.wait(30) == "failed"
        assert isinstance(handle.error, TypeError)
        assert "never run" in str(handle.error) and "nothing was sent" in str(handle.error)
        [(name, status, error)] = ledger(store, f"unrun-{which}")
        assert (name, status) == (tool, "failed") and "never run" in (error or "")
    assert ran == []


# -- 4. the command line refuses empty keys ----------
@pytest.mark.parametrize(
    "argv",
    [
        ["approve", ""],
        ["approve", "  "],
        ["reject", ""],
        ["reconcile", "r", "--key", ""],
        ["show", ""],
        ["stop", " "],
        ["plan", ""],
        ["answer", "", "x"],
    ],
)
def test_the_command_line_refuses_an_empty_key_with_exit_2(
    argv: list[str], store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    before = row_counts(store)
    with pytest.raises(SystemExit) as done:
        cli([*argv, "--store", store.location])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert "must not be empty" in err
    assert row_counts(store) == before


def test_an_empty_key_does_not_approve_the_only_open_request(
    store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    @kx.effect(needs_approval=True)
    def pay(amount: int) -> int:
        return amount

    @kx.agent(name="pays_once")
    def agent(run: kx.Run) -> None:
        with run.step("pay"):
            pay(5)

    assert agent.start(run_id="pay-empty").wait(30) == "suspended"
    [request] = kx.approvals("pay-empty")
    with pytest.raises(SystemExit) as done:
        cli(["approve", "", "--store", store.location])
    assert done.value.code == 2
    assert "must not be empty" in capsys.readouterr().err
    assert [r.decision for r in kx.approvals("pay-empty")] == [None]
    assert request.decision is None
    # answer "" stays a valid answer for a str question (not refused by the parser)
    assert cli(["answer", "pay-empty", "", "--store", store.location]) == 2  # no question
    assert "must not be empty" not in capsys.readouterr().err


# -- 5. folder modes ----------
def test_the_folders_kernelext_creates_are_private(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        path = tmp_path / "proj" / ".kernelext" / "store.duckdb"
        store = open_store(str(path))
        try:
            store.write(lambda tx: None)
            folder = store.backend.side_files.run_dir("r")
            store.backend.side_files.store("r", __import__("uuid").uuid4(), b"x" * 10, None)
        finally:
            store.close()
        for created in (path.parent, Path(folder).parent, Path(folder)):
            assert stat.S_IMODE(created.stat().st_mode) == 0o700, created
        # the quarantine folder (a damaged journal of a dead process is moved there)
        journal = Path(f"{path}.journal.999999.dead")
        journal.write_bytes(b"\x07garbage that is not a frame")
        open_store(str(path)).close()
        quarantine = Path(f"{path}.quarantine")
        assert quarantine.is_dir()
        assert stat.S_IMODE(quarantine.stat().st_mode) == 0o700
    finally:
        os.umask(old)


def test_a_large_state_value_makes_its_blob_folder_private(store: Store) -> None:
    @kx.agent(name="big_state")
    def agent(run: kx.Run) -> None:
        with run.step("big"):
            run.state["big"] = b"x" * (100 << 10)

    assert agent.start(run_id="big-modes").wait(30) == "completed"
    root = Path(store.location + ".blobs")
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    for sub in root.iterdir():
        assert stat.S_IMODE(sub.stat().st_mode) == 0o700


# -- 6. options ----------
DURATIONS = ("retention_seconds", "check_timeout", "max_step_seconds", "interrupt_window")


@pytest.mark.parametrize("name", DURATIONS)
@pytest.mark.parametrize(
    "value", [math.nan, math.inf, -math.inf, -1, dt.timedelta(seconds=-5), "10", True, [1]]
)
def test_configure_refuses_a_bad_duration(name: str, value: Any) -> None:
    before = getattr(kx._core.process.runtime.runtime().settings, name)
    with pytest.raises((TypeError, ValueError)) as caught:
        kx.configure(**{name: value})
    assert name in str(caught.value)
    assert getattr(kx._core.process.runtime.runtime().settings, name) == before


def test_configure_takes_numpy_and_timedelta_durations_and_zero_where_it_means_off() -> None:
    np = pytest.importorskip("numpy")
    kx.configure(check_timeout=np.float64(2.5), max_step_seconds=dt.timedelta(minutes=1))
    settings = kx._core.process.runtime.runtime().settings
    assert settings.check_timeout == 2.5 and type(settings.check_timeout) is float
    assert settings.max_step_seconds == 60.0
    kx.configure(retention_seconds=0, interrupt_window=0)
    with pytest.raises(ValueError, match="check_timeout"):
        kx.configure(check_timeout=0)
    with pytest.raises(ValueError, match="check_timeout"):
        kx.configure(check_timeout=np.float64("nan"))


@pytest.mark.parametrize(
    "value", [math.nan, math.inf, 0, -3, dt.timedelta(0), dt.timedelta(days=-1), "1", 1e300]
)
def test_configure_refuses_a_bad_expiry_duration_and_changes_nothing(value: Any) -> None:
    policy = kx._core.process.runtime.runtime().settings.expiry
    before = dict(policy.durations)
    with pytest.raises(ValueError, match="approval"):
        kx.configure(expiry={"user_stop": 5, "approval": value})
    assert policy.durations == before
    kx.configure(expiry={"my_own_reason": 60})  # custom reasons are a feature
    assert policy.durations["my_own_reason"] == dt.timedelta(seconds=60)


def test_configure_refuses_a_folder_as_the_store(tmp_path: Path) -> None:
    for value in (tmp_path, str(tmp_path), ""):
        with pytest.raises((ValueError, TypeError), match="store"):
            kx.configure(store=value)
    with pytest.raises(ValueError, match="folder"):
        kx.open_store(str(tmp_path))
    assert kx._core.process.runtime.runtime().settings.store_location is None


def test_config_magic_refuses_the_same_values(tmp_path: Path) -> None:
    pytest.importorskip("IPython")
    from traitlets import TraitError

    from kernelext._ipython.magics import Kernelext

    magics = Kernelext(shell=None)
    for name in DURATIONS:
        with pytest.raises(TraitError, match=name):
            setattr(magics, name, math.nan)
        with pytest.raises(TraitError, match=name):
            setattr(magics, name, -1.0)
    with pytest.raises(TraitError, match="folder"):
        magics.store = str(tmp_path)
    with pytest.raises(TraitError, match="approval"):
        magics.expiry = {"approval": math.inf}


# -- 7. decorators and kx.sql ----------
@pytest.mark.parametrize(
    "call, error, words",
    [
        (lambda: kx.effect(42), TypeError, "kx.effect takes the function"),
        (lambda: kx.effect(name=5), TypeError, "name"),
        (lambda: kx.effect(name=""), ValueError, "name"),
        (lambda: kx.effect(resumable="no"), TypeError, "resumable"),
        (lambda: kx.effect(probe=3), TypeError, "probe"),
        (lambda: kx.effect(needs_approval="yes"), TypeError, "needs_approval"),
        (lambda: kx.agent(max_step_seconds="a"), TypeError, "max_step_seconds"),
        (lambda: kx.agent(max_step_seconds=math.nan), ValueError, "max_step_seconds"),
        (lambda: kx.agent(max_step_seconds=0), ValueError, "max_step_seconds"),
        (lambda: kx.agent(max_step_seconds=-1), ValueError, "max_step_seconds"),
        (lambda: kx.agent(max_step_seconds=math.inf), ValueError, "max_step_seconds"),
        (lambda: kx.agent(max_step_seconds=True), TypeError, "max_step_seconds"),
        (lambda: kx.agent(name=""), ValueError, "name"),
        (lambda: kx.agent(42), TypeError, "kx.agent takes the agent function"),
        (lambda: kx.sql(None), TypeError, "query"),
        (lambda: kx.sql("SELECT 1", params=5), TypeError, "params"),
        (lambda: kx.sql("SELECT 1", params="abc"), TypeError, "params"),
        (lambda: kx.runs(status="nope"), ValueError, "status"),
    ],
)
def test_decorators_and_sql_refuse_bad_arguments_up_front(
    call: Any, error: type[Exception], words: str
) -> None:
    with pytest.raises(error) as caught:
        call()
    assert words in str(caught.value)


def test_an_async_agent_is_accepted_at_decoration() -> None:
    async def agent(run: kx.Run) -> None:  # run on a loop of its own (test_batch_async.py)
        await asyncio.sleep(0)

    assert kx.agent(agent).fn is agent


# -- 3. a side file on a full disk ----------
def test_a_side_file_that_meets_a_full_disk_is_a_store_write_error(small_disk: Path) -> None:
    store = open_store(str(small_disk / "store.duckdb"))
    filler = small_disk / "filler"

    @kx.agent(name="big_on_full_disk")
    def agent(run: kx.Run) -> None:
        with run.step("small"):
            run.state["n"] = 1
        with run.step("big"):
            fill(filler, leave=256 << 10)  # room for the journal, not for the payload
            run.state["big"] = os.urandom(2 << 20)

    try:
        handle = agent.start(run_id="side-full", store=store)
        assert handle.wait(60) == "failed"
        assert isinstance(handle.error, StoreWriteError), repr(handle.error)
        message = str(handle.error)
        assert "side file" in message and "kx.resume" in message
        leftovers = glob.glob(str(small_disk / "store.duckdb.blobs" / "*" / "*.tmp"))
        assert leftovers == []
        filler.unlink()
        assert store.get_run("side-full")["completed_steps"] == 1
    finally:
        store.close()


# -- 2. the store file replaced or deleted under a running run ----------
@pytest.mark.parametrize("how", ["replaced", "deleted", "truncated", "overwritten in place"])
def test_a_store_file_replaced_or_deleted_mid_run_ends_it_with_a_store_write_error(
    tmp_path: Path, how: str
) -> None:
    path = tmp_path / "store.duckdb"
    other = tmp_path / "other.duckdb"
    open_store(str(other)).close()  # a valid kernelext store of its own
    store = open_store(str(path))
    calls: list[int] = []
    gone = threading.Event()

    @kx.effect(name=f"deliver_{how.split()[0]}")
    def deliver(item: int) -> int:
        calls.append(item)
        if item == 3:
            if how == "replaced":
                os.replace(other, path)
            elif how == "truncated":  # same inode, os.truncate(store, 0)
                os.truncate(path, 0)
            elif how == "overwritten in place":  # same inode and size, header gone
                with open(path, "r+b") as f:
                    f.write(b"\0" * 4096)
            else:
                os.remove(path)
                for extra in glob.glob(f"{path}.wal"):
                    os.remove(extra)
            gone.set()
        return item

    @kx.agent(name=f"store_{how.split()[0]}")
    def agent(run: kx.Run, items: list[int]) -> None:
        for item in run.steps(items, key=str):
            deliver(item)
            if gone.is_set():
                gone.wait()
                import time

                time.sleep(0.05)  # let the fold of this outcome meet the missing file

    try:
        handle = agent.start(list(range(20)), run_id=f"file-{how.split()[0]}", store=store)
        status = handle.wait(60)
        assert status == "failed", (status, handle.error)
        assert isinstance(handle.error, StoreWriteError), repr(handle.error)
        message = str(handle.error)
        assert how.split()[0] in message and "kx.open_store" in message and "journal" in message
        assert len(calls) < 20  # it did not run to the end against a file nobody can open
        journal = store.hot_path.path if store.hot_path is not None else ""
    finally:
        store.close()
    # nothing acknowledged is lost: the journal was kept, with every applied outcome
    assert os.path.exists(journal), "the journal must be kept while the store file is gone"
    outcomes = [
        r
        for r in scan_journal(journal).records
        if r[1] == "outcome" and r[2]["status"] == "applied"
    ]
    assert len(outcomes) >= 1
    if how == "deleted":
        assert not path.exists()  # never silently created again


@contextlib.contextmanager
def let_go(path: Path) -> Iterator[Store]:
    """The store at ``path``, written to once, then letting go of its file (as it does
    after its linger); closed at the end."""
    store = open_store(str(path))
    try:
        store.write(lambda tx: None)
        store.backend._release()
        yield store
    finally:
        store.close()


def test_a_store_file_replaced_while_this_process_let_go_of_it_is_refused_at_reconnect(
    tmp_path: Path,
) -> None:
    path = tmp_path / "store.duckdb"
    with let_go(path) as store:  # as after its linger, or when handing over to a waiter
        open_store(str(tmp_path / "other.duckdb")).close()
        os.replace(tmp_path / "other.duckdb", path)
        with pytest.raises(StoreWriteError, match="replaced by another file"):
            store.write(lambda tx: None)
        os.remove(path)
        with pytest.raises(StoreWriteError, match="replaced"):  # the first cause is kept
            store.read("SELECT 1")
        assert not path.exists()  # never created anew behind the user's back
    reopened = open_store(str(tmp_path / "fresh.duckdb"))  # a new Store object works
    reopened.close()


def test_a_store_file_truncated_while_this_process_let_go_of_it_is_refused_at_reconnect(
    tmp_path: Path,
) -> None:
    path = tmp_path / "store.duckdb"
    with let_go(path) as store:  # another process may shrink it by a checkpoint: allowed
        os.truncate(path, 0)  # but not lose DuckDB's header
        with pytest.raises(StoreWriteError, match="overwritten in place"):
            store.write(lambda tx: None)


def test_a_store_that_grows_and_shrinks_by_its_own_checkpoints_is_not_refused(
    tmp_path: Path,
) -> None:
    path = tmp_path / "store.duckdb"
    store = open_store(str(path))
    sizes = []
    try:
        for _ in range(2):  # a WAL past 16 MB: DuckDB checkpoints at the commit
            store.write(
                lambda tx: tx.execute("CREATE TABLE big AS SELECT range i FROM range(3000000)")
            )
            sizes.append(path.stat().st_size)
            store.write(lambda tx: tx.execute("DROP TABLE big"))
            sizes.append(path.stat().st_size)
        store.write(lambda tx: None)
        assert store.backend.lost is None, (store.backend.lost, sizes)
    finally:
        store.close()
    assert min(sizes[1:]) < max(sizes), sizes  # it did shrink, and nothing was refused


def test_checked_arguments_reach_the_function_as_it_uses_them(store: Store) -> None:
    np = pytest.importorskip("numpy")

    @kx.agent(name="quick_args")
    def agent(run: kx.Run) -> None:
        with run.step("one"):
            run.state["x"] = 1

    handle = agent.start(run_id="quick-args")
    assert handle.wait(dt.timedelta(seconds=30)) == "completed"
    assert handle.wait(np.float64(5)) == "completed"
    assert kx.plan("quick-args", stale_after=dt.timedelta(hours=1)).status == "completed"
    with pytest.raises(ValueError, match="timeout"):
        handle.wait(-1)


def test_kernelext_store_naming_a_folder_is_refused_before_anything_is_created(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kernelext.errors import StoreError

    folder = tmp_path / "stores"
    folder.mkdir()
    monkeypatch.setenv("KERNELEXT_STORE", str(folder))
    with pytest.raises(StoreError, match="is a folder"):
        kx.open_store()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stores"]  # no .lock, no .want
    assert list(folder.iterdir()) == []


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0"])
def test_an_agent_cell_refuses_a_bad_step_bound(store: Store, value: str) -> None:
    shell_module = pytest.importorskip("IPython.core.interactiveshell")
    shell = shell_module.InteractiveShell.instance()
    shell.run_line_magic("load_ext", "kernelext")
    try:
        before = row_counts(store)
        result = shell.run_cell(f"%%agent cell-bound --max-step-seconds {value}\nx = 1\n")
        assert not result.success
        assert "max-step-seconds" in str(result.error_in_exec)
        assert row_counts(store) == before
    finally:
        shell.run_line_magic("unload_ext", "kernelext")


# -- review 2: B1 a refused start keeps the run's own arguments --------------------------
def test_a_refused_start_does_not_swap_the_arguments_a_resume_uses(store: Store) -> None:
    class Acct:  # not JSON: only the runtime's cache holds it
        def __init__(self, who: str) -> None:
            self.who = who

    seen: list[tuple[int, str]] = []

    @kx.agent(name="keeps_args")
    def agent(run: kx.Run, acct: Acct) -> None:
        for i in run.steps(range(2)):
            seen.append((i, acct.who))
            if i == 0 and len(seen) == 1:
                run.suspend("pause")

    assert agent.start(Acct("alice"), run_id="keeps").wait(30) == "suspended"
    with pytest.raises(kx.RunStateError, match="already exists"):
        agent.start(Acct("mallory"), run_id="keeps")
    assert kx.resume("keeps").wait(30) == "completed"
    assert seen == [(0, "alice"), (1, "alice")]


# -- review 2: B3 an effect that returns other never-run work -----------------------------
def test_an_effect_returning_an_awaitable_a_future_or_an_iterator_is_recorded_failed(
    store: Store,
) -> None:
    import concurrent.futures

    ran: list[str] = []

    class Aw:
        def __await__(self) -> Any:
            ran.append("awaited")  # never runs
            yield

    def loop_future() -> Any:
        loop = asyncio.new_event_loop()
        try:
            return loop.create_future()
        finally:
            loop.close()

    makers = {
        "aw": (Aw, "never awaited"),
        "map": (lambda: map(ran.append, ["m"]), "return a list instead"),
        "filter": (lambda: filter(ran.append, ["f"]), "return a list instead"),
        "zip": (lambda: zip([1], [2], strict=True), "return a list instead"),
        "iter": (lambda: iter([1, 2]), "return a list instead"),
        "afut": (loop_future, "future"),
        "cfut": (concurrent.futures.Future, "future"),
    }
    effects = {name: kx.effect(name=f"unrun_{name}")(make) for name, (make, _) in makers.items()}

    @kx.agent(name="returns_unrun")
    def agent(run: kx.Run, which: str) -> None:
        with run.step("one"):
            effects[which]()

    for which, (_, says) in makers.items():
        handle = agent.start(which, run_id=f"unrun2-{which}")
        assert handle.wait(30) == "failed", which
        assert isinstance(handle.error, TypeError) and says in str(handle.error), which
        [(name, status, error)] = ledger(store, f"unrun2-{which}")
        assert (name, status) == (f"unrun_{which}", "failed") and says in (error or "")
    assert ran == []


def test_plain_results_an_effect_returns_are_still_applied(store: Store) -> None:
    results = {"list": [1, 2], "dict": {"a": 1}, "tuple": (1, 2), "text": "ok", "none": None}
    effects = {k: kx.effect(name=f"plain_{k}")(lambda v=v: v) for k, v in results.items()}

    @kx.agent(name="returns_plain")
    def agent(run: kx.Run) -> None:
        for which in run.steps(list(results)):
            effects[which]()

    assert agent.start(run_id="plain").wait(30) == "completed"
    assert {status for _, status, _ in ledger(store, "plain")} == {"applied"}


# -- review 2: B4 staticmethod / classmethod wrappers are judged by what they hold --------
def test_a_static_or_class_method_is_judged_by_the_function_it_holds() -> None:
    async def coro(x: int) -> int:
        return x

    def gen(x: int) -> Iterator[int]:
        yield x

    for wrap in (staticmethod, classmethod):
        assert kx.effect(wrap(coro)).is_async  # judged by the async def it holds
        with pytest.raises(TypeError, match="generator function"):
            kx.effect(name="x")(wrap(gen))
    kx.effect(name="fine")(staticmethod(lambda x: x))  # a sync one is still fine


# -- review 2: B5 huge durations are a ValueError, not an OverflowError -------------------
@pytest.mark.parametrize("value", [10**400, 1e300, 1000 * 366 * 86400, dt.timedelta.max])
def test_every_duration_is_capped_at_1000_years(store: Store, value: Any) -> None:
    for name in DURATIONS:
        with pytest.raises(ValueError, match=rf"{name}.*at most 1000 years"):
            kx.configure(**{name: value})
    with pytest.raises(ValueError, match=r"max_step_seconds.*at most 1000 years"):
        kx.agent(max_step_seconds=value)

    @kx.agent(name="quick")
    def agent(run: kx.Run) -> None:
        pass

    handle = agent.start(run_id=f"quick-{type(value).__name__}")
    with pytest.raises(ValueError, match="at most 1000 years"):
        handle.wait(value)
    assert handle.wait(30) == "completed"
    kx.configure(retention_seconds=999 * 365 * 86400)  # the longest is still accepted
    kx.sweep()


# -- review 2: B8/B10 store paths DuckDB would read differently --------------------------
@pytest.mark.parametrize("name", ["newdir/", "a\\b.duckdb"])
def test_a_store_path_ending_in_a_separator_or_holding_a_backslash_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    path = str(tmp_path) + "/" + name
    with pytest.raises(ValueError, match=r"separator|backslash"):
        kx.open_store(path)
    monkeypatch.setenv("KERNELEXT_STORE", path)
    with pytest.raises(kx.KernelextError, match=r"separator|backslash"):
        open_store()
    assert os.listdir(tmp_path) == []  # no file, no .lock / .want beside it


# -- review 2: B9 an empty --store is a usage error ---------------------------------------
@pytest.mark.parametrize("value", ["", "  "])
def test_the_command_line_refuses_an_empty_store_with_exit_2(
    store: Store, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for argv in (["--store", value, "runs"], ["runs", "--store", value]):
        with pytest.raises(SystemExit) as done:
            cli(argv)
        assert done.value.code == 2
        assert "--store must not be empty" in capsys.readouterr().err


# -- review 2: B7 run.ask refuses schema types it cannot check; answers must be storable --
@pytest.mark.parametrize(
    "schema",
    [
        {"type": "bogus"},
        {"type": ["string", "bogus"]},
        {"type": 5},
        {"type": "object", "properties": {"n": {"type": "int"}}},
        {"type": "array", "items": {"type": "str"}},
    ],
)
def test_run_ask_refuses_an_unknown_schema_type(store: Store, schema: Any) -> None:
    @kx.agent(name="asks_bogus")
    def agent(run: kx.Run) -> Any:
        with run.step("q"):
            return run.ask("how many?", schema=schema)

    handle = agent.start(run_id="bogus-schema")
    assert handle.wait(30) == "failed"
    assert isinstance(handle.error, ValueError)
    assert "supported types are 'string', 'integer'" in str(handle.error)
    assert int(store.read("SELECT count(*) FROM questions")[0][0]) == 0


def test_an_answer_that_cannot_be_stored_is_refused_naming_the_value(store: Store) -> None:
    @kx.agent(name="asks_any")
    def agent(run: kx.Run) -> Any:
        with run.step("q"):
            return run.ask("anything?")

    assert agent.start(run_id="any-answer").wait(30) == "suspended"
    [question] = kx.questions("any-answer")
    with pytest.raises(TypeError, match=r"answer\(value=\.\.\.\).*stored as JSON.*Nothing was"):
        question.answer(object(), resume=False)
    with pytest.raises(TypeError, match=r"answer\(value=\.\.\.\)"):
        kx.answer("any-answer", {1, 2}, resume=False)
    [still_open] = kx.questions("any-answer")  # nothing was stored
    still_open.answer({"n": 1}, resume=False)
    assert len(kx.questions("any-answer")) == 0


# -- review 2: B6 run.suspend(deadline=...) is checked where it is given ------------------
@pytest.mark.parametrize(
    ("deadline", "error", "says"),
    [
        ("tomorrow", TypeError, "takes a datetime"),
        (-5, ValueError, "positive"),
        (math.nan, ValueError, "finite"),
        (10**400, ValueError, "at most 1000 years"),
        (
            dt.datetime(9999, 12, 31, 23, 59, tzinfo=dt.timezone(dt.timedelta(hours=-5))),
            ValueError,
            "year 9999",
        ),
    ],
)
def test_run_suspend_refuses_a_bad_deadline(
    store: Store, deadline: Any, error: type, says: str
) -> None:
    @kx.agent(name="suspends_bad")
    def agent(run: kx.Run) -> None:
        run.suspend("x", deadline=deadline)

    handle = agent.start(run_id="bad-deadline")
    assert handle.wait(30) == "failed"
    assert isinstance(handle.error, error) and says in str(handle.error)
    assert "run.suspend(deadline=...)" in str(handle.error)


def test_run_suspend_reads_a_naive_deadline_as_utc_and_accepts_one_in_the_past(
    store: Store,
) -> None:
    deadlines = {
        "naive": dt.datetime(2100, 1, 1, 12, 0),
        "aware": dt.datetime(2100, 1, 1, 7, 0, tzinfo=dt.timezone(dt.timedelta(hours=-5))),
        "past": dt.datetime(2000, 1, 1),
    }

    @kx.agent(name="suspends_until")
    def agent(run: kx.Run, which: str) -> None:
        run.suspend("x", deadline=deadlines[which])

    for which in deadlines:
        assert agent.start(which, run_id=f"until-{which}").wait(30) == "suspended"
    got = dict(store.read("SELECT id, deadline FROM runs WHERE id LIKE 'until-%'"))
    assert got["until-naive"] == got["until-aware"] == dt.datetime(2100, 1, 1, 12, 0)
    assert got["until-past"] == dt.datetime(2000, 1, 1)


def test_a_failed_open_leaves_no_lock_files_behind(tmp_path: Path) -> None:
    bad = tmp_path / "bad.duckdb"
    bad.write_bytes(b"not a duckdb file" * 100)
    with pytest.raises(kx.KernelextError, match="not a valid DuckDB"):
        open_store(str(bad))
    assert sorted(os.listdir(tmp_path)) == ["bad.duckdb"]
    good = open_store(str(tmp_path / "good.duckdb"))  # files another open holds are kept
    try:
        (tmp_path / "bad.duckdb.lock").write_text("")  # someone else's, from before
        with pytest.raises(kx.KernelextError):
            open_store(str(bad))
        assert (tmp_path / "bad.duckdb.lock").exists()
        assert not (tmp_path / "bad.duckdb.want").exists()
    finally:
        good.close()
    assert (tmp_path / "good.duckdb.want").exists()
