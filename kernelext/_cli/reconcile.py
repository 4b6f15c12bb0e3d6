"""``kernelext reconcile RUN_ID``: decide effects whose outcome is unknown.

In a terminal it asks, effect by effect: applied, not applied, give up, or skip.
Scripts pass the decision as flags::

    kernelext reconcile RUN --key K --applied [--result JSON] [--note N]
    kernelext reconcile RUN --key K --not-applied
    kernelext reconcile RUN --key K --give-up

Without a decision and without a terminal it lists the open unknowns. Exit code:
0 when no unknown effect is left, 4 when some still wait for a decision.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .._core.people.reconcile import Reconciliation, UnknownEffect, reconcile
from .._formatting import moment_text
from .._store import Store
from ..status import EffectStatus, Status
from .common import (
    RUN_ID,
    AddCommand,
    CommandUsageError,
    Exit,
    emit_json,
    nonblank,
    require_run,
    say,
)

__all__ = ["check_arguments", "reconcile_command", "register"]

UNSET = object()
SOURCE = "cli"
GIVE_UP = "give_up"
APPLIED = EffectStatus.APPLIED
NOT_APPLIED = EffectStatus.NOT_APPLIED
# After the last decision, these can be resumed where the agent is defined.
RESUMABLE_AFTER = (Status.NEEDS_DECISION, Status.SUSPENDED, Status.FAILED)


def describe(item: UnknownEffect) -> str:
    """One line about an unknown effect: the call, its key, step and intent time."""
    line = (
        f"{item.tool}({item.args or ''})  key={item.key}  {item.step_text}  "
        f"intent {moment_text(item.intent_at)}"
    )
    return f"{line}\n    caution: {item.caution}" if item.caution else line


def summary(rec: Reconciliation, store: Store) -> dict[str, Any]:
    """The run's status and its unknown effects with their decisions (for ``--json``)."""
    status = store.get_run(rec.run_id)["status"]
    return {
        "run_id": rec.run_id,
        "status": status,
        str(EffectStatus.UNKNOWN): [
            {
                "key": item.key,
                "tool": item.tool,
                "step_key": item.step_key,
                "args": item.args,
                "intent_at": item.intent_at,
                "decision": item.decision,
                "worker_running": item.worker_running,
            }
            for item in rec
        ],
        "open": len(rec.open),
    }


def finish(args: argparse.Namespace, rec: Reconciliation, store: Store) -> int:
    """Print what is left to decide; exit 4 while an unknown effect waits, else 0."""
    info = summary(rec, store)
    cancelled = info["status"] == Status.CANCELLED  # given up: nothing is left to decide
    if args.json:
        emit_json(info)
    else:
        if cancelled:
            print(f"run {rec.run_id} is {Status.CANCELLED}.")
        elif rec.open:
            print(f"run {rec.run_id}: {len(rec.open)} effect(s) still wait for a decision:")
            for item in rec.open:
                print("  " + describe(item))
            print(
                f"decide with: kernelext reconcile {rec.run_id} --key KEY "
                "--applied [--result JSON] | --not-applied | --give-up"
            )
        elif info["status"] in RESUMABLE_AFTER:
            print(
                f"run {rec.run_id}: no unknown effect left (status {info['status']}). Resume it "
                f"where its agent is defined: kx.resume({rec.run_id!r}) or "
                f"%agent resume {rec.run_id}."
            )
        else:
            print(f"run {rec.run_id}: no unknown effect (status {info['status']}).")
    return Exit.NEEDS_DECISION if rec.open and not cancelled else Exit.DONE


def find(rec: Reconciliation, key: str) -> UnknownEffect:
    """The open unknown effect whose key starts with ``key``; a usage error otherwise."""
    wanted = key.strip().lower()
    matches = [item for item in rec.open if str(item.key).startswith(wanted)]
    if len(matches) == 1:
        return matches[0]
    keys = ", ".join(str(item.key) for item in rec.open) or "none"
    if not matches:
        raise CommandUsageError(
            f"Run {rec.run_id} has no open unknown effect with key {key!r}. Open ones: {keys}."
        )
    raise CommandUsageError(f"Key prefix {key!r} matches several effects; give more of it: {keys}.")


def decide(item: UnknownEffect, decision: str, result: Any, note: str | None) -> None:
    """Record ``decision`` (applied, not applied or give up) on ``item``."""
    if decision == APPLIED:
        item.mark_applied(None if result is UNSET else result, note=note, source=SOURCE)
    elif decision == NOT_APPLIED:
        item.mark_not_applied(note=note, source=SOURCE)
    else:
        item.give_up(note=note, source=SOURCE)


def spoken(decision: str) -> str:
    """``not_applied`` -> ``not applied``."""
    return str(decision).replace("_", " ")


def reconcile_command(args: argparse.Namespace, store: Store) -> int:
    """``kernelext reconcile RUN_ID``: decide by flags, ask in a terminal, or list."""
    require_run(store, args.run_id)
    rec = reconcile(args.run_id, store=store)
    decision = (
        APPLIED
        if args.applied
        else NOT_APPLIED
        if args.not_applied
        else GIVE_UP
        if args.give_up
        else None
    )
    if decision is not None:
        if not args.key:
            raise CommandUsageError(
                "Say which effect with --key KEY; open ones: "
                + (", ".join(f"{i.key} ({i.tool})" for i in rec.open) or "none")
            )
        result: Any = UNSET if args.result is None else json.loads(args.result)  # checked
        item = find(rec, args.key)
        decide(item, decision, result, args.note)
        if not args.json:
            print(f"effect {item.tool} key={item.key}: {spoken(decision)}")
        return finish(args, rec, store)
    if args.key:
        raise CommandUsageError("--key needs a decision: --applied, --not-applied or --give-up.")
    if sys.stdin.isatty() and not args.json and rec.open:
        interactive(rec)
    return finish(args, rec, store)


def ask(prompt: str) -> str | None:
    """``input(prompt)``, or ``None`` at the end of input."""
    try:
        return input(prompt)
    except EOFError:
        return None


def interactive(rec: Reconciliation) -> None:
    """Ask about each open unknown effect in turn (a, n, g or s)."""
    items = rec.open
    print(f"run {rec.run_id}: {len(items)} effect(s) with an unknown outcome")
    for number, item in enumerate(items, 1):
        print(f"\n[{number}/{len(items)}] {describe(item)}")
        while True:
            answer = ask(
                "  Did it happen? [a]pplied / [n]ot applied / [g]ive up the run / [s]kip: "
            )
            if answer is None:
                return
            choice = answer.strip().lower()[:1]
            if choice in ("a", "n", "g", "s"):
                break
            say("  answer a, n, g or s")
        if choice == "s":
            continue
        result: Any = UNSET
        if choice == "a":
            while True:
                text = ask("  What did it return, as JSON (empty: nothing)? ")
                if text is None or not text.strip():
                    break
                try:
                    result = json.loads(text)
                    break
                except json.JSONDecodeError as exc:
                    say(f"  not JSON: {exc}")
        note = ask("  Note (optional): ")
        decision = {"a": APPLIED, "n": NOT_APPLIED, "g": GIVE_UP}[choice]
        decide(item, decision, result, (note or "").strip() or None)
        print(f"  -> {spoken(decision)}")
        if decision == GIVE_UP:
            return


def check_arguments(args: argparse.Namespace) -> str | None:
    """What is wrong with the flags before the store is opened, or ``None``."""
    if args.result is None:
        return None
    if not args.applied:
        return "--result goes with --applied"
    try:
        json.loads(args.result)
    except json.JSONDecodeError as exc:
        return f"--result must be JSON ({exc}), e.g. --result '{{\"id\": 7}}'"
    return None


def register(add: AddCommand) -> None:
    """Add ``reconcile`` to the command line."""
    sub = add(
        "reconcile",
        reconcile_command,
        "Decide effects whose outcome is unknown: interactive in a terminal, or with flags.",
    )
    sub.set_defaults(check=check_arguments)
    sub.add_argument("run_id", metavar="RUN_ID", type=RUN_ID)
    sub.add_argument(
        "--key",
        type=nonblank("--key", "pass an effect key or a unique prefix (kernelext show RUN_ID)"),
        help="the effect's key (or a unique prefix of it)",
    )
    decision = sub.add_mutually_exclusive_group()
    decision.add_argument("--applied", action="store_true", help="it happened")
    decision.add_argument(
        "--not-applied", action="store_true", help="it did not happen: redo it on resume"
    )
    decision.add_argument(
        "--give-up", action="store_true", help="abandon the run (it is cancelled)"
    )
    sub.add_argument(
        "--result", help="with --applied: what the call returned, as JSON (replayed on resume)"
    )
    sub.add_argument("--note", help="why you decided so (kept in the ledger)")
