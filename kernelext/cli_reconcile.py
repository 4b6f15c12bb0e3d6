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

from .cli import EXIT, CommandUsageError, emit_json, say
from .core.reconcile import Reconciliation, UnknownEffect, reconcile
from .store import Store

__all__ = ["reconcile_command"]

UNSET = object()


def describe(item: UnknownEffect) -> str:
    return (
        f"{item.tool}({item.args or ''})  key={item.key}  step={item.step_key!r}  "
        f"intent {item.intent_at:%Y-%m-%d %H:%M:%S} UTC"
    )


def summary(rec: Reconciliation, store: Store) -> dict[str, Any]:
    status = store.get_run(rec.run_id)["status"]
    return {
        "run_id": rec.run_id,
        "status": status,
        "unknown": [
            {
                "key": item.key,
                "tool": item.tool,
                "step_key": item.step_key,
                "args": item.args,
                "intent_at": item.intent_at,
                "decision": item.decision,
            }
            for item in rec
        ],
        "open": len(rec.open),
    }


def finish(args: argparse.Namespace, rec: Reconciliation, store: Store) -> int:
    info = summary(rec, store)
    cancelled = info["status"] == "cancelled"  # given up: nothing is left to decide
    if args.json:
        emit_json(info)
    else:
        if cancelled:
            print(f"run {rec.run_id} is cancelled.")
        elif rec.open:
            print(f"run {rec.run_id}: {len(rec.open)} effect(s) still wait for a decision:")
            for item in rec.open:
                print("  " + describe(item))
            print(
                f"decide with: kernelext reconcile {rec.run_id} --key KEY "
                "--applied [--result JSON] | --not-applied | --give-up"
            )
        elif info["status"] in ("needs_decision", "suspended", "failed"):
            print(
                f"run {rec.run_id}: no unknown effect left (status {info['status']}). Resume it "
                f"where its agent is defined: kx.resume({rec.run_id!r}) or "
                f"%agent resume {rec.run_id}."
            )
        else:
            print(f"run {rec.run_id}: no unknown effect (status {info['status']}).")
    return EXIT["needs_decision"] if rec.open and not cancelled else EXIT["done"]


def find(rec: Reconciliation, key: str) -> UnknownEffect:
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
    if decision == "applied":
        item.mark_applied(None if result is UNSET else result, note=note, source="cli")
    elif decision == "not_applied":
        item.mark_not_applied(note=note, source="cli")
    else:
        item.give_up(note=note, source="cli")


def reconcile_command(args: argparse.Namespace, store: Store) -> int:
    rec = reconcile(args.run_id, store=store)
    decision = (
        "applied"
        if args.applied
        else "not_applied"
        if args.not_applied
        else "give_up"
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
            print(f"effect {item.tool} key={item.key}: {decision.replace('_', ' ')}")
        return finish(args, rec, store)
    if args.key:
        raise CommandUsageError("--key needs a decision: --applied, --not-applied or --give-up.")
    if sys.stdin.isatty() and not args.json and rec.open:
        interactive(rec)
    return finish(args, rec, store)


def ask(prompt: str) -> str | None:
    try:
        return input(prompt)
    except EOFError:
        return None


def interactive(rec: Reconciliation) -> None:
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
        decision = {"a": "applied", "n": "not_applied", "g": "give_up"}[choice]
        decide(item, decision, result, (note or "").strip() or None)
        print(f"  -> {decision.replace('_', ' ')}")
        if decision == "give_up":
            return
