"""``kernelext plan RUN_ID [--json]``: what a resume of the run would do, changing nothing.

Prints the plan as text (or as JSON with ``--json``). The exit code tells the run's
status, as ``kernelext show`` does: 0 running or completed, 3 suspended, 4 needs a
decision, 5 expired, failed or cancelled.
"""

from __future__ import annotations

import argparse

from .._core.plan import plan
from .._store import Store
from .common import RUN_ID, AddCommand, emit_json, require_run, status_exit_code

__all__ = ["plan_command", "register"]


def plan_command(args: argparse.Namespace, store: Store) -> int:
    """The ``plan`` command: ``args.run_id`` and ``args.json``."""
    require_run(store, args.run_id)
    preview = plan(args.run_id, store)
    if args.json:
        emit_json(preview.to_dict())
    else:
        print(preview.text())
    return status_exit_code(preview.status)


def register(add: AddCommand) -> None:
    """Add ``plan`` to the command line."""
    sub = add(
        "plan",
        plan_command,
        "Show what resuming a run would do (steps, effects, facts, code), changing nothing.",
    )
    sub.add_argument("run_id", metavar="RUN_ID", type=RUN_ID)
