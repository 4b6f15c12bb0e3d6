"""One runtime object: settings, registries and the open store of kernelext, swappable.

Two runtimes used in one process do not see each other's agents, live runs, options,
checks, callbacks or store; ``use_runtime`` puts the previous runtime back and closes
the store the other one opened. Real DuckDB files, real worker threads.
"""

from __future__ import annotations

import datetime as dt
import threading
from pathlib import Path

import pytest
from support.live import wait_until

import kernelext as kx
from kernelext._core.process.runtime import Runtime, runtime, use_runtime
from kernelext.errors import AgentError, RunNotFound
from kernelext.status import Status

WAIT = 60.0


def test_two_runtimes_one_after_the_other_share_nothing(tmp_path: Path) -> None:
    first, second = Runtime(), Runtime()
    with use_runtime(first):
        kx.configure(store=str(tmp_path / "a.duckdb"), check_timeout=1.5, expiry={"user_stop": 60})
        kx.checks.register("price:*", lambda name: 1)
        kx.on_expire(lambda info: None)

        @kx.agent(name="only-in-first")
        def only_in_first(run: kx.Run, n: int) -> int:
            return n + 1

        done = only_in_first.run(1, run_id="first-1")
        assert done.wait(WAIT) == Status.COMPLETED and done.result == 2
        first_store = kx.open_store()
        assert first_store.expiry.durations["user_stop"] == dt.timedelta(seconds=60)

    with use_runtime(second):
        assert runtime() is second
        assert "only-in-first" not in second.agents and second.expire_callbacks == []
        assert second.settings.check_timeout == 10.0 and kx.checks.names() == []
        kx.configure(store=str(tmp_path / "b.duckdb"))
        assert kx.open_store().location != first_store.location
        assert kx.open_store().expiry.durations["user_stop"] == dt.timedelta(days=7)
        with pytest.raises(RunNotFound):
            kx.resume("first-1")  # not in this runtime's store
        second_only = kx.agent(name="only-in-second")(lambda run: None)
        assert second.agents == {"only-in-second": second_only}

    assert "only-in-second" not in first.agents and first.checks.names() == ["price:*"]
    assert first.settings.check_timeout == 1.5 and len(first.expire_callbacks) == 1


def test_a_live_run_belongs_to_the_runtime_that_started_it(tmp_path: Path) -> None:
    started, release = threading.Event(), threading.Event()
    first = Runtime()
    with use_runtime(first):
        kx.configure(store=str(tmp_path / "a.duckdb"))

        @kx.agent(name="waits")
        def waits(run: kx.Run) -> str:
            with run.step("wait"):
                started.set()
                release.wait(WAIT)
            return "done"

        handle = waits.start(run_id="live-1")
        assert started.wait(WAIT)
        assert runtime().live_handle("live-1") is handle
        with use_runtime(Runtime()) as other:
            kx.configure(store=str(tmp_path / "b.duckdb"))
            assert other.live_handle("live-1") is None and other.live_handles() == []
            with pytest.raises(RunNotFound):
                kx.stop("live-1")  # not live here, and not in this runtime's store
            kx.open_store().create_run("waits-2", "waits")  # a run of that agent, here
            with pytest.raises(AgentError, match="not defined in this process"):
                kx.resume("waits-2")  # the agent was defined in `first` only
        assert runtime() is first and first.live_handle("live-1") is handle
        release.set()
        assert handle.wait(WAIT) == Status.COMPLETED
        wait_until(lambda: first.live_runs == {}, "the worker to leave its runtime")


def test_use_runtime_restores_the_previous_one_and_closes_the_store_it_opened(
    tmp_path: Path,
) -> None:
    before = runtime()
    with use_runtime(Runtime()) as rt:
        assert runtime() is rt and rt is not before
        store = kx.open_store(str(tmp_path / "opened.duckdb"))
        assert not store.closed and rt.settings.store_open
    assert runtime() is before
    assert store.closed and not rt.settings.store_open

    switch = use_runtime(rt)  # a plain setter (embedding): current until restored
    assert runtime() is rt
    switch.restore()
    switch.restore()  # once only
    assert runtime() is before
    with pytest.raises(TypeError, match="takes a Runtime"):
        use_runtime(object())  # type: ignore[arg-type]


def test_a_new_runtime_may_keep_the_definitions_but_none_of_the_state() -> None:
    base = Runtime()
    with use_runtime(base):
        made = kx.agent(name="defined")(lambda run: None)
        kx.credentials.register("token", refresh=lambda: "t")
        runtime().args_cache["r"] = ((1,), {})
        runtime().end_hooks.append(lambda run_id, status: None)
    copy = Runtime(definitions_from=base)
    assert copy.agents == {"defined": made} and copy.credentials.names() == ["token"]
    assert copy.args_cache == {} and copy.end_hooks == []
    copy.agents.clear()
    assert base.agents == {"defined": made}  # a copy, not the same table
