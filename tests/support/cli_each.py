"""``python tests/support/cli_each.py``: the command line's ``main`` run once for each argv
of a JSON list read on stdin, in this one process (a new Python for each of dozens of
commands costs a third of a second of CPU apiece); for each, its exit code and what it
printed on stdout and stderr, as a JSON list on stdout."""

from __future__ import annotations

import contextlib
import io
import json
import sys


def run_each(commands: list[list[str]]) -> list[dict[str, object]]:
    from kernelext._cli import main

    answers: list[dict[str, object]] = []
    for argv in commands:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as exc:  # --help, a usage error found by argparse
                code = exc.code if isinstance(exc.code, int) else 2
        answers.append({"returncode": code, "stdout": out.getvalue(), "stderr": err.getvalue()})
    return answers


if __name__ == "__main__":
    print(json.dumps(run_each(json.load(sys.stdin))))
