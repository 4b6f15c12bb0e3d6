"""The commands about the runs in a store: ``runs``, ``show``, ``stop``, ``sweep``, ``sql``."""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from .._core.batch.view import stored_batch
from .._core.encoding.keys import call_text
from .._core.encoding.secrets import shown_json
from .._core.engine.stop_estimate import estimate_stop
from .._core.lifecycle import control, expiry
from .._core.lifecycle.stop_answer import StopAnswer, busy_answer
from .._core.views.conversation import conversation_of, step_text
from .._formatting import duration_text, step_number, step_numbers
from .._store import Store
from .._store.posted_stops import post_stop_at
from ..errors import RunNotFound
from ..status import LIVE, Status, StepStatus
from .common import (
    RUN_ID,
    AddCommand,
    CommandUsageError,
    Exit,
    cell_text,
    emit_json,
    require_run,
    status_exit_code,
    table,
)

__all__ = [
    "cmd_runs",
    "cmd_show",
    "cmd_sql",
    "cmd_stop",
    "cmd_sweep",
    "register",
    "run_details",
    "sql_params",
    "waiting_notes",
]

SOURCE = "cli"  # recorded as the source of stop requests and expiries


def cmd_runs(args: argparse.Namespace, store: Store) -> int:
    """``kernelext runs [--status S]``: the runs in the store, oldest first."""
    rows = store.list_runs(args.status)
    if args.json:
        emit_json(rows)
        return Exit.DONE
    if not rows:
        print("no runs" + (f" with status {args.status}" if args.status else ""))
        return Exit.DONE
    for row in rows:
        total = row.get("total_steps")
        row["steps"] = f"{row['completed_steps']}/{total}" if total else row["completed_steps"]
    print(table(rows, ("id", "agent", "status", "steps", "updated_at", "reason")))
    return Exit.DONE


def run_details(store: Store, run_id: str) -> dict[str, Any]:
    """One run with its steps, effects (in intent order), facts and events."""
    run = require_run(store, run_id)
    effects = sorted(
        store.load_effects(run_id).values(), key=lambda e: (e["intent_at"], e["call_ordinal"])
    )
    return {
        "run": run,
        "steps": store.steps(run_id),
        "effects": effects,
        "facts": store.facts(run_id),
        "events": store.events(run_id),
    }


def cmd_show(args: argparse.Namespace, store: Store) -> int:
    """``kernelext show RUN_ID``: one run in detail; the exit code tells its status."""
    details = run_details(store, args.run_id)
    run = details["run"]
    estimate = estimate_stop(run["id"], store, run=run, steps=details["steps"])
    details["stop_estimate"] = estimate.as_dict() if estimate is not None else None
    batch = None  # a run.map with items in flight: how many, and how a stop drains
    if run["status"] in LIVE:
        found = stored_batch(details["steps"], details["events"], store.now())
        batch = found if found is not None and found.running else None
    counts = batch.counts(stopping=run["status"] == Status.STOPPING) if batch else None
    details["batch"] = (
        {**asdict(counts), "text": counts.text, "in_flight_keys": list(batch.running)}
        if counts is not None and batch is not None
        else None
    )
    if args.json:
        emit_json(details)
        return status_exit_code(run["status"])
    total = run.get("total_steps")
    print(f"run {run['id']}  agent {run['agent']}  status {run['status']}")
    if run.get("reason"):
        print(f"  reason: {run['reason']}")
    print(f"  steps completed: {run['completed_steps']}" + (f" of {total}" if total else ""))
    talk = conversation_of(details["effects"]) if not total else None
    if talk is not None and (talk.turns or talk.tool_calls):
        print(f"  conversation: {talk.text()}")
        if talk.last:
            print(f"  last: {talk.last}")
    print(f"  created {cell_text(run['created_at'])}, updated {cell_text(run['updated_at'])}")
    if run.get("deadline"):
        print(f"  expires {cell_text(run['deadline'])}")
    if run.get("stop_requested_at"):
        print(f"  stop requested {cell_text(run['stop_requested_at'])} by {run['stop_source']}")
    waiting = waiting_notes(store, run)
    for note in dict.fromkeys(waiting.values()):  # what a person does to let it go on
        verbs = "kernelext answer RUN VALUE" if "answer" in note else "kernelext approve ID"
        listing = f"kernelext approvals --run {run['id']}"
        print(f"  {note}: `{listing}` lists it, `{verbs}` lets it go on")
    if counts is not None:
        print(f"  {counts.text}")  # "stopping: 12 items in flight, about 3 s (40/100 done)"
    elif estimate is not None:
        print(f"  {estimate.text}")
    sections: list[tuple[str, Sequence[str]]] = [
        ("steps", ("step", "key", "name", "status", "took", "note")),
        (
            "effects",
            ("tool", "step", "step_key", "call_ordinal", "status", "key", "result", "error"),
        ),
        ("facts", ("name", "kind", "value", "check_name", "check_status", "recorded_at")),
        ("events", ("occurred_at", "kind", "from_status", "to_status", "source", "reason")),
    ]
    numbers = step_numbers(details["steps"])  # by cell or item, not by attempt
    for step in details["steps"]:  # numbered as people count (and as the panel and plan do)
        step["step"] = step_number(numbers[int(step["ordinal"])])
        took = step.get("duration_s")
        step["took"] = duration_text(float(took)) if took is not None else None
    for step in reversed(details["steps"]):  # the latest attempt is the one that waits
        cancelled = step["status"] == StepStatus.CANCELLED  # the status as stored
        waits = waiting.pop(int(step["ordinal"]), None) if cancelled else None
        step["note"] = waits or step.get("error")
    for fact in details["facts"]:
        fact["value"] = shown_json(fact.get("value"))  # stored exact; shown masked by name
    for effect in details["effects"]:
        effect["result"] = shown_json(effect.get("result"))
        ordinal = effect.get("step_ordinal")
        shown = numbers.get(int(ordinal), int(ordinal)) if ordinal is not None else None
        effect["step"] = step_number(shown) if shown is not None else None
        effect["step_key"] = step_text(str(effect.get("step_key")))
        effect["call_ordinal"] = call_text(effect.get("call_ordinal"))  # "1 (2nd)": a repeat
    for name, columns in sections:
        rows = details[name]
        print(f"\n{name} ({len(rows)})")
        if rows:
            print(table(rows, columns, width=36))
    return status_exit_code(run["status"])


def waiting_notes(store: Store, run: dict[str, Any]) -> dict[int, str]:
    """For a suspended run waiting for a person: step ordinal -> what it waits for
    ("waiting for approval of publish"). The step's attempt is
    stored ``cancelled`` (it runs again on resume); "stopped" would hide the reason."""
    if run["status"] != Status.SUSPENDED:
        return {}
    notes: dict[int, str] = {}
    now = store.now()
    for request in store.open_approvals(run["id"], now):
        if request.get("step_ordinal") is not None:
            notes.setdefault(
                int(request["step_ordinal"]),
                f"waiting for approval of {request['tool']}",
            )
    for question in store.open_questions(run["id"], now):
        if question.get("step_ordinal") is not None:
            notes.setdefault(int(question["step_ordinal"]), "waiting for an answer")
    return notes


def cmd_stop(args: argparse.Namespace, store: Store) -> int:
    """``kernelext stop RUN_ID [--wait]``: ask a run to stop at its next safe point."""
    try:  # a store file kept busy elsewhere: recorded beside it, answered at once
        status = control.stop(args.run_id, source=SOURCE, store=store)
    except RunNotFound:
        require_run(store, args.run_id)  # an unknown id: the usual answer, closest id named
        raise
    if isinstance(status, StopAnswer) and status.busy is not None:
        return _stopped_while_busy(args, status)
    if args.wait:  # read the run's status from the store: waiting never opens the run
        deadline = time.monotonic() + args.timeout
        while status in LIVE and time.monotonic() < deadline:
            time.sleep(0.1)
            status = str(store.get_run(args.run_id)["status"])
    if args.json:
        emit_json({"run_id": args.run_id, "status": status, "source": SOURCE})
    elif status == Status.STOPPING:
        print(
            f"stop requested for run {args.run_id}; it is stopping. The process that runs it "
            "suspends it at its next safe point."
            + (f" It did not within {duration_text(args.timeout)}." if args.wait else "")
        )
    else:
        print(f"stop recorded for run {args.run_id}; it is {status}.")
    return status_exit_code(status)


def stop_while_busy(args: argparse.Namespace) -> int | None:
    """``kernelext stop`` before the store is opened: while another process keeps the
    DuckDB file (a long query) the request is recorded beside it and answered at once;
    None when the file is free (the command opens the store as usual)."""
    posted = post_stop_at(args.store, args.run_id, source=SOURCE)
    if posted is None:
        return None
    return _stopped_while_busy(args, busy_answer(args.run_id, posted))


def _stopped_while_busy(args: argparse.Namespace, answer: StopAnswer) -> int:
    if args.json:
        emit_json({"run_id": args.run_id, "status": answer, "source": SOURCE, "busy": answer.busy})
    else:
        wait = " (--wait needs the store file: not waited for)" if args.wait else ""
        print(f"{answer.busy}{wait}")
    return status_exit_code(answer)


def cmd_sweep(args: argparse.Namespace, store: Store) -> int:
    """``kernelext sweep``: expire waiting runs past their deadline; drop old snapshots."""
    result = expiry.sweep(store=store, source=SOURCE)
    if args.json:
        emit_json(
            {
                "now": result.now,
                "busy": result.busy,
                str(Status.EXPIRED): [e._asdict() for e in result.expired],
                "removed": [r._asdict() for r in result.removed],
                "callback_errors": result.callback_errors,
            }
        )
    else:
        print(result.text())
    return Exit.DONE


def cmd_sql(args: argparse.Namespace, store: Store) -> int:
    """``kernelext sql QUERY [--param NAME=VALUE]``: one read-only query."""
    params = sql_params(args.param or [])
    result = store.read_arrow(args.query, params or None, allow_files=args.allow_files)
    rows = result.to_pylist()
    if args.json:
        emit_json(rows)
    elif not rows:
        print("(no rows) columns: " + ", ".join(result.column_names))
    else:
        print(table(rows, result.column_names, width=60))
    return Exit.DONE


def sql_params(items: Sequence[str]) -> dict[str, str]:
    """``--param NAME=VALUE`` options as the query's ``$NAME`` parameters (strings)."""
    params: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.isidentifier():
            raise CommandUsageError(
                f"--param takes NAME=VALUE (for $NAME in the query), not {item!r}: "
                'e.g. kernelext sql "SELECT * FROM runs WHERE id = $run" --param run=nightly'
            )
        params[name] = value
    return params


def register(add: AddCommand) -> None:
    """Add ``runs``, ``show``, ``stop``, ``sweep`` and ``sql`` to the command line."""
    sub = add("runs", cmd_runs, "List the runs in the store, oldest first.")
    sub.add_argument("--status", choices=[str(s) for s in Status], help="only runs in this status")

    sub = add("show", cmd_show, "Show one run: its steps, effects, facts and events.")
    sub.add_argument("run_id", metavar="RUN_ID", type=RUN_ID)

    sub = add(
        "stop",
        cmd_stop,
        "Ask a run to stop at its next safe point (recorded at once, source 'cli').",
    )
    sub.add_argument("run_id", metavar="RUN_ID", type=RUN_ID)
    sub.set_defaults(before_open=stop_while_busy)
    sub.add_argument("--wait", action="store_true", help="wait until the run has stopped")
    sub.add_argument(
        "--timeout", type=float, default=60.0, help="seconds --wait waits (default 60)"
    )

    add("sweep", cmd_sweep, "Expire suspended runs past their deadline; drop old snapshots.")

    sub = add("sql", cmd_sql, "Run one read-only query on the store.")
    sub.add_argument(
        "query",
        metavar="QUERY",  # an empty one is refused by the SQL guard, as on every path (exit 2)
        help='e.g. "SELECT status, count(*) FROM runs"',
    )
    sub.add_argument(
        "--param",
        action="append",
        metavar="NAME=VALUE",
        help="bind VALUE (a string) to $NAME in the query, never pasted into it; repeatable",
    )
    sub.add_argument(
        "--allow-files",
        action="store_true",
        help="let the query read files outside the store (read_csv, glob, 'data.parquet')",
    )
