"""A short script run by a new Python interpreter, for what an ``import`` alone does.

A test that asks what importing kernelext loads, or what a missing extra says, cannot ask
in its own process: pytest and the other tests have imported plenty there already.
"""

from __future__ import annotations

import subprocess
import sys


def printed_by_fresh_python(code: str, timeout: float = 120) -> str:
    """What ``code`` prints when a new interpreter runs it (``python -c code``).

    A script that exits non-zero fails the test with the script's stderr as the message.
    """
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout
