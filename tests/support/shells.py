"""The IPython shell of the tests of ``%%agent`` cells: ``cell_shell(store_path)``, the shell
with kernelext loaded on a store, put back as it was after the test."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from IPython.core.interactiveshell import InteractiveShell

from support.live import finish_live_runs


@contextmanager
def cell_shell(store_path: Path, *, forget: tuple[str, ...] = ()) -> Iterator[InteractiveShell]:
    """The shell with kernelext loaded on the store at ``store_path``. After: kernelext
    unloaded, the names ``forget`` out of the shell's namespace, no cell run remembered or
    left running, and the store closed and forgotten."""
    from kernelext._core.lifecycle.cell_runs import forget_cell_runs
    from kernelext._core.process.runtime import runtime

    ip = InteractiveShell.instance()
    runtime().settings.use_store(str(store_path))
    ip.run_line_magic("load_ext", "kernelext")
    yield ip
    ip.run_line_magic("unload_ext", "kernelext")
    for key in forget:
        ip.user_ns.pop(key, None)
    forget_cell_runs()
    finish_live_runs()
    runtime().settings.close()
    runtime().settings.use_store(None)
