"""``%load_ext kernelext`` starts the kernel's periodic sweeper; ``%unload_ext`` stops it.

A real in-process ``InteractiveShell`` (as in test_magics.py) with a short sweep interval:
a suspended run past its deadline expires, and its ``kx.on_expire`` callback is called,
while no cell runs.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from IPython.core.interactiveshell import InteractiveShell
from support.live import finish_live_runs

import kernelext as kx
from kernelext._core.process.runtime import runtime
from kernelext._ipython import extension

WAIT = 30.0


@pytest.fixture
def ip(store_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[InteractiveShell]:
    monkeypatch.setattr(extension, "SWEEP_INTERVAL_S", 0.05)
    shell = InteractiveShell.instance()
    runtime().settings.use_store(str(store_path))
    shell.run_line_magic("load_ext", "kernelext")
    yield shell
    finish_live_runs()
    shell.run_line_magic("unload_ext", "kernelext")
    runtime().close()


def wait_for(predicate: Any, timeout: float = WAIT) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.02)


def test_the_extension_sweeps_periodically_and_stops_on_unload(ip: InteractiveShell) -> None:
    sweeper = extension.sweeper()
    assert sweeper is not None and sweeper.running and sweeper.interval_s == 0.05
    kx.configure(expiry={"rate_limit": 0.2})
    calls: list[str] = []
    kx.on_expire(lambda info: calls.append(info.run_id))

    @kx.agent(name=f"idle-{uuid.uuid4().hex[:6]}")
    def idle(run: kx.Run) -> None:
        with run.step("only"):
            run.suspend("rate_limit")

    assert idle.start(run_id="idle").wait(WAIT) == "suspended"
    # No cell runs and nobody calls kx.sweep(): the kernel's sweeper expires it.
    wait_for(lambda: calls == ["idle"])
    assert kx.sql("select status from runs where id = 'idle'")["status"][0] == "expired"
    assert sweeper.last_error is None
    ip.run_line_magic("unload_ext", "kernelext")
    assert not sweeper.running and extension.sweeper() is None
    ip.run_line_magic("load_ext", "kernelext")  # the fixture unloads it again
    assert extension.sweeper() is not None and extension.sweeper() is not sweeper


def test_loading_the_extension_does_not_open_the_store(store_path: Path) -> None:
    shell = InteractiveShell.instance()
    runtime().close()
    assert not runtime().settings.store_open
    shell.run_line_magic("load_ext", "kernelext")
    try:
        sweeper = extension.sweeper()
        assert sweeper is not None
        assert sweeper.sweep_once() is None  # the store is not open: nothing swept
        assert not runtime().settings.store_open
    finally:
        shell.run_line_magic("unload_ext", "kernelext")
