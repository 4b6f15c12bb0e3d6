"""``kernelext approvals | approve KEY | reject KEY | answer RUN_ID VALUE``: a person's side.

Proposed as kernelext/_cli/approvals.py (issue 13); wire it with one line in
kernelext/_cli/main.py: ``from . import approvals, notebook, plan, reconcile, runs`` and
``approvals.register`` in ``REGISTER`` (after ``reconcile.register``).

``approvals`` lists the requests and questions that wait (exit 0, also when none wait).
``approve``/``reject`` take a request id or an effect key, whole or a unique prefix
(exit 0; 2 when there is no such open request, or it was decided, used or expired).
``answer`` reads VALUE as the question's schema asks (a number, true/false, a choice,
JSON) and exits 2 when it does not fit. A decision made here never runs the agent: the
run goes on at its next resume, where its agent is defined.
"""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path
from typing import Any

from .._core.encoding.data_args import DataArgument, argument_text, compact_text
from .._core.people import approvals, questions
from .._store import Store
from ..errors import LedgerError, RunStateError
from .common import RUN_ID, AddCommand, CommandUsageError, Exit, emit_json, nonblank, table

__all__ = ["register"]


def approvals_command(args: argparse.Namespace, store: Store) -> int:
    """The ``approvals`` command: ``args.run`` (optional), ``args.json``, ``args.show`` (one
    request with every value of its data arguments) and ``args.out``."""
    if getattr(args, "show", None) is not None:
        return show_command(args, store)
    if getattr(args, "out", None) is not None:
        raise CommandUsageError("--out FILE writes a request's data: pass --show ID with it.")
    requests = approvals.approvals(args.run, store=store)
    asked = questions.questions(args.run, store=store)
    if args.json:
        emit_json({"approvals": [r.row for r in requests], "questions": [q.row for q in asked]})
        return Exit.DONE  # a listing: 0, also when some wait or none do
    rows: list[dict[str, Any]] = [
        {"id": r.id, "run": r.run_id, "step": r.step_text, "tool": r.tool} for r in requests
    ]
    if rows:
        print(table(rows, ("id", "run", "step", "tool"), width=48))
        for r in requests:  # every argument by name, untruncated up to a generous limit
            print(f"request {r.id} ({r.tool}) arguments:")
            for line in argument_lines(r.arguments):
                print("  " + line)
            if r.data:
                print(f"  every row: kernelext approvals --show {r.id} [--out FILE.csv]")
        print("decide with: kernelext approve ID [--note TEXT]  |  kernelext reject ID")
    for q in asked:
        print(f"question of run {q.run_id} ({q.step_text}): {q.prompt}  [{q.time_left}]")
        # Its key always: a run in a batch (run.map) can wait on several questions at once.
        print(f"  answer with: kernelext answer {shlex.quote(q.run_id)} VALUE --key {q.key}")
    if not rows and not asked:
        print("nothing waits for a person")
    return Exit.DONE  # a listing: 0, also when some wait or none do


def argument_lines(arguments: dict[str, Any]) -> list[str]:
    """``name = value`` for each argument, its JSON as stored and never cut short: a cut
    could hide an amount or a recipient the approval lets through (data arguments are shown
    as kind, rows and columns; ``--show ID`` prints every row)."""
    if not arguments:
        return ["(none)"]
    return [f"{name} = {argument_text(value)}" for name, value in arguments.items()]


def show_command(args: argparse.Namespace, store: Store) -> int:
    """``approvals --show ID``: one request, every value of its data arguments, and how they
    differ from the previously approved call of the tool; ``--out FILE`` writes them (CSV)."""
    try:
        ident = approvals.find_approval(args.show, store=store)
    except LedgerError as exc:
        raise CommandUsageError(str(exc)) from None
    row = store.approval(ident)
    if row is None:
        raise CommandUsageError(f"No approval request {args.show}: see `kernelext approvals`.")
    item = approvals.Approval(store, row)
    data, diffs = item.data, item.changes
    written = _write_data(data, Path(args.out)) if args.out is not None else []
    if args.json:
        changes = [diff.text() for diff in diffs]
        emit_json({"approval": row, "arguments": item.arguments, "changes": changes})
        return Exit.DONE
    state = item.decision or f"waiting, {item.time_left}"
    print(f"request {item.id}: {item.tool} of run {item.run_id}, {item.step_text}, {state}")
    for line in argument_lines(item.arguments):
        print("  " + line)
    for one in data.values():
        print(f"{one.name}: {one.summary()}")
        for line in one.lines():
            print("  " + line)
    previous = item.previous if data else None
    if previous is not None:
        print(f"since the approved request {previous.id} (run {previous.run_id}):")
        for diff in diffs:
            print("  " + diff.text())
    for path in written:
        print(f"written: {path}")
    if any(one.unseen for one in data.values()):
        print(f"approve it knowingly: kernelext approve {item.id} --unseen-data")
    return Exit.DONE


def _write_data(data: dict[str, DataArgument], out: Path) -> list[Path]:
    """Each data argument as CSV: to ``out`` (one), or ``out``'s stem + ``.NAME`` (several)."""
    if not data:
        raise CommandUsageError("--out: this request has no data argument (array or table).")
    unseen = [one.name for one in data.values() if one.unseen]
    if unseen:
        raise CommandUsageError(
            f"--out: the values of {', '.join(unseen)} were not stored (too large to show)."
        )
    paths = []
    for one in data.values():
        path = out if len(data) == 1 else out.with_name(f"{out.stem}.{one.name}{out.suffix}")
        try:
            one.write_csv(path)
        except OSError as exc:
            raise CommandUsageError(f"--out: cannot write {path}: {exc.strerror}") from None
        paths.append(path)
    return paths


def _decide(args: argparse.Namespace, store: Store, decide: Any) -> int:
    extras: dict[str, Any] = {"unseen": True} if getattr(args, "unseen_data", False) else {}
    if getattr(args, "edit", None):
        extras["edit"] = dict(args.edit)
    try:
        # never resumes: the run goes on where its agent is defined (see the module text)
        item = decide(args.key, note=args.note, store=store, source="cli", resume=False, **extras)
    except LedgerError as exc:
        raise CommandUsageError(str(exc)) from None
    if args.json:
        emit_json(item.row)
    else:
        print(
            f"{item.tool} of run {item.run_id} (request {item.id}): {item.decision}, with "
            + (
                f"edited arguments {compact_text(item.edited_args)} (requested: "
                f"{compact_text(item.args)})"
                if item.edited_args
                else f"arguments {compact_text(item.args) or '{}'}"
            )
            + ". The run "
            f"goes on at its next resume: kx.resume({item.run_id!r}) where its agent is "
            f"defined, or %agent resume {item.run_id}."
        )
    return Exit.DONE


def approve_command(args: argparse.Namespace, store: Store) -> int:
    return _decide(args, store, approvals.approve)


def reject_command(args: argparse.Namespace, store: Store) -> int:
    return _decide(args, store, approvals.reject)


def answer_command(args: argparse.Namespace, store: Store) -> int:
    """The ``answer`` command: ``args.run_id``, ``args.value``, ``args.key``, ``args.note``."""
    try:
        questions.answer(
            args.run_id,
            args.value,
            key=args.key,
            note=args.note,
            text=True,
            store=store,
            source="cli",
        )
    except (ValueError, LedgerError, RunStateError) as exc:
        raise CommandUsageError(str(exc)) from None
    if args.json:
        emit_json({"run_id": args.run_id, "answered": True})
    else:
        print(f"answer stored for run {args.run_id}; it goes on at its next resume.")
    return Exit.DONE


def edit_pair(text: str) -> tuple[str, Any]:
    """``amount=100`` -> ``("amount", 100)``; a VALUE that is not JSON is text."""
    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(
            f"--edit takes NAME=VALUE (e.g. --edit amount=100), not {text!r}"
        )
    try:
        return name.strip(), json.loads(value)
    except ValueError:
        return name.strip(), value


def register(add: AddCommand) -> None:
    """Add ``approvals``, ``approve``, ``reject`` and ``answer`` to the command line."""
    sub = add("approvals", approvals_command, "List approval requests and questions that wait.")
    sub.add_argument("--run", type=RUN_ID, help="only this run's")
    sub.add_argument(
        "--show",
        metavar="ID",
        type=nonblank("--show", "pass a request id (`kernelext approvals` lists them)"),
        help="one request: every row of its data arguments, and the changes since the "
        "previously approved call of its tool",
    )
    sub.add_argument("--out", metavar="FILE", help="with --show: write its data as CSV")
    for verb, handler in (("approve", approve_command), ("reject", reject_command)):
        sub = add(
            verb,
            handler,
            f"{verb.capitalize()} one waiting call (its request id or effect key, or a unique "
            "prefix of either).",
        )
        sub.add_argument(
            "key",
            metavar="KEY",
            type=nonblank("KEY", "pass a request id or effect key (`kernelext approvals`)"),
        )
        sub.add_argument("--note", help="why (kept with the decision)")
        if verb == "approve":
            sub.add_argument(
                "--edit",
                metavar="NAME=VALUE",
                action="append",
                type=edit_pair,
                help="make the call with this argument changed (VALUE read as JSON, else "
                "as text); repeat for several; the request keeps the original",
            )
            sub.add_argument(
                "--unseen-data",
                action="store_true",
                help="approve data too large to show (its rows were not stored), knowingly; "
                "the decision records it",
            )
    sub = add(
        "answer",
        answer_command,
        "Answer a run's open question (run.ask); VALUE is read as its schema asks.",
    )
    sub.add_argument("run_id", metavar="RUN_ID", type=RUN_ID)
    sub.add_argument("value", metavar="VALUE")  # "" may be a valid answer (a str schema)
    sub.add_argument(
        "--key",
        type=nonblank("--key", "pass the question's key (kernelext approvals lists them)"),
        help="which question, when several wait",
    )
    sub.add_argument("--note", help="kept with the answer")
