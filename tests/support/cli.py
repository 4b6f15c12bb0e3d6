"""The ``kernelext`` command line in a process of its own, as typed in a terminal:
``kernelext_cli(*args, store=...)`` runs ``kernelext ARGS --store STORE`` and returns how it
ended; ``kernelext_ok`` the same, which must succeed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def kernelext_cli(
    *args: str,
    store: Path | str,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 240,
) -> subprocess.CompletedProcess[str]:
    """``kernelext ARGS --store STORE`` (``env`` added to this process's environment)."""
    return subprocess.run(
        [sys.executable, "-m", "kernelext", *args, "--store", str(store)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        cwd=cwd,
    )


def kernelext_ok(*args: str, store: Path | str) -> subprocess.CompletedProcess[str]:
    """``kernelext ARGS --store STORE``, which must exit 0."""
    done = kernelext_cli(*args, store=store)
    assert done.returncode == 0, done.stdout + done.stderr
    return done
