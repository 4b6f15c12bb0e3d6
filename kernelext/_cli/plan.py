"""``kernelext plan RUN_ID [--json]``: what a resume of the run would do, changing nothing.

Prints the plan as text (or as JSON with ``--json``) and exits 0 when it was shown
(2 for an unknown run, 1 when the store cannot be read). A terminal never defines
the agent, so "not defined in this process" is information here (resume it from the
notebook or kernel that defines it), not a blocker; what truly blocks (open
approvals, questions, unknown outcomes) names the ``kernelext`` command that clears it.
"""

from __future__ import annotations

import argparse
import dataclasses

from .._core.plan.items import UNSEEN
from .._core.plan.resume_plan import ResumePlan, plan
from .._store import Store
from .common import RUN_ID, AddCommand, Exit, emit_json, require_run

__all__ = ["plan_command", "register"]


def plan_command(args: argparse.Namespace, store: Store) -> int:
    """The ``plan`` command: ``args.run_id`` and ``args.json``."""
    require_run(store, args.run_id)
    preview = for_terminal(plan(args.run_id, store))
    if args.json:
        emit_json(preview.to_dict())
    else:
        print(preview.text())
    return Exit.DONE


def for_terminal(preview: ResumePlan) -> ResumePlan:
    """``preview`` as a terminal sees it: an agent unseen here is a note, and each
    blocker names the ``kernelext`` command (not the Python call) that clears it."""
    rid = preview.run_id
    unseen = [c.name for c in preview.code if c.kind == "agent" and c.state == UNSEEN]
    cli = {
        f"kx.approvals({rid!r})": f"kernelext approvals {rid} (then kernelext approve ID)",
        f"kx.reconcile({rid!r})": f"kernelext reconcile {rid}",
        f"kx.answer({rid!r}, value)": f"kernelext answer {rid} VALUE",
    }
    blockers = []
    for text in preview.blockers:
        if any(f"agent {name!r} is not defined in this process" in text for name in unseen):
            continue
        for python, command in cli.items():
            text = text.replace(python, command)
        blockers.append(text)
    notes = [
        f"agent {name!r} is defined in a notebook or kernel, not here: resume it from the "
        "notebook/kernel that defines the agent (kx.resume)"
        for name in unseen
    ]
    return dataclasses.replace(preview, blockers=blockers, warnings=[*preview.warnings, *notes])


def register(add: AddCommand) -> None:
    """Add ``plan`` to the command line."""
    sub = add(
        "plan",
        plan_command,
        "Show what resuming a run would do (steps, effects, facts, code), changing nothing.",
    )
    sub.add_argument("run_id", metavar="RUN_ID", type=RUN_ID)
