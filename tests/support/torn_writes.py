"""Real torn writes of a store file: a process whose Nth multi-page ``pwrite`` of the file
writes one page and then dies of SIGKILL (``tear_write.c``, loaded with LD_PRELOAD)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

_SOURCE = Path(__file__).with_name("tear_write.c")


def tear_library(folder: Path) -> Path:
    """The shim, compiled into ``folder`` (the test is skipped without a C compiler)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None or not sys.platform.startswith("linux"):
        pytest.skip("needs Linux and a C compiler")
    out = folder / "tear_write.so"
    subprocess.run(
        [cc, "-shared", "-fPIC", "-O2", "-o", str(out), str(_SOURCE), "-ldl"],
        check=True,
        capture_output=True,
    )
    return out


def run_torn(
    library: Path,
    store: Path,
    code: str,
    *,
    tear_at: int = 0,
    log: Path | None = None,
    extra: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a new Python whose ``tear_at``-th multi-page write of ``store`` is torn
    (0: none; ``log`` gets every such write as "n offset size"; ``extra``: more of the
    shim's settings, e.g. TEAR_ARM, see tear_write.c)."""
    env = {
        **os.environ,
        "KERNELEXT_STORE": str(store),
        "TEAR_PATH": str(store),
        "TEAR_AT": str(tear_at),
        "LD_PRELOAD": str(library),
    }
    if log is not None:
        env["TEAR_LOG"] = str(log)
    env.update(extra or {})
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )


def writes(log: Path) -> list[tuple[int, int]]:
    """(n, offset) of each multi-page write logged."""
    if not log.exists():
        return []
    return [
        (int(n), int(o))
        for n, o, _ in (line.split() for line in log.read_text().split("\n") if line)
    ]


def rewrites(log: Path) -> list[int]:
    """The numbers of the writes that rewrote a block written before (in place)."""
    seen: set[int] = set()
    found = []
    for n, offset in writes(log):
        if offset in seen:
            found.append(n)
        seen.add(offset)
    return found


AT_ONCE = 4  # torn processes at a time: each mostly idles while its writer lingers


def each_tear(numbers: Iterable[int], check: Callable[[int], None]) -> None:
    """``check(n)`` for each write number ``n`` (each tears its own copy of the store in a
    process of its own), ``AT_ONCE`` at a time; the first failure, in order, is raised."""
    with ThreadPoolExecutor(AT_ONCE) as pool:
        for future in [pool.submit(check, n) for n in numbers]:
            future.result()
