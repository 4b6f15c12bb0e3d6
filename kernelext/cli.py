"""The ``kernelext`` command line (also ``python -m kernelext``).

Every command takes ``--store`` (a DuckDB path or a ``postgresql://`` URL; default:
``$KERNELEXT_STORE``, else ``.kernelext/store.duckdb`` in the project, like the
library) and ``--json`` (machine-readable output on stdout).

Exit codes: 0 done, 1 error (the store cannot be opened, the query failed, ...),
2 usage (bad arguments, unknown run, a query that writes), 3 suspended,
4 needs a decision, 5 expired, failed or cancelled. For the commands about one run
(``show``, ``stop``, ``run``) the code tells the run's status afterwards; a running
or completed run is 0.
"""

from __future__ import annotations

import argparse
import datetime as dt
import decimal
import json
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from .errors import KernelextError, ReadOnlyError, RunNotFound
from .store import Store, default_store_path, open_store

__all__ = ["EXIT", "CommandUsageError", "main", "status_exit_code"]

EXIT = {"done": 0, "error": 1, "usage": 2, "suspended": 3, "needs_decision": 4, "failed": 5}
STATUSES = (
    "running",
    "stopping",
    "suspended",
    "needs_decision",
    "completed",
    "failed",
    "expired",
    "cancelled",
)
EPILOG = (
    "exit codes: 0 done, 1 error, 2 usage, 3 suspended, 4 needs decision, "
    "5 expired, failed or cancelled"
)


class CommandUsageError(Exception):
    """The arguments do not fit the store's contents (exit code 2)."""


RUN_CONTRACT = """\
the notebook's side: the kernel gets KERNELEXT_RUN_ID and KERNELEXT_STORE.
  RUN_ID = os.environ.get("KERNELEXT_RUN_ID", "my-run")   # in the first cell
  %%agent {RUN_ID}                                        # each step cell
Completed %%agent cells are skipped on a rerun; when every cell ran, the run is
marked completed. A notebook that runs an @kx.agent starts it with
run_id=RUN_ID, calls kx.resume(RUN_ID) when that raises RunStateError (the run
exists), and waits with h.wait().
"""


def status_exit_code(status: str | None) -> int:
    """The exit code that tells a run's status."""
    if status == "suspended":
        return EXIT["suspended"]
    if status == "needs_decision":
        return EXIT["needs_decision"]
    if status in ("failed", "expired", "cancelled"):
        return EXIT["failed"]
    return EXIT["done"]


# -- output -----------------------------------------------------------------------------
def jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, decimal.Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return f"<{len(bytes(value))} bytes>"
    return value


def emit_json(value: Any) -> None:
    json.dump(jsonable(value), sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")


def cell_text(value: Any, width: int = 40) -> str:
    if value is None:
        return ""
    if isinstance(value, dt.datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(value, float):
        return f"{value:.3f}".rstrip("0").rstrip(".") if abs(value) < 1e12 else f"{value:g}"
    text = str(jsonable(value)).replace("\n", " ")
    return text if len(text) <= width else text[: width - 1] + "…"


def table(rows: Sequence[dict[str, Any]], columns: Sequence[str], width: int = 40) -> str:
    cells = [[cell_text(row.get(c), width) for c in columns] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(lines)


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- commands ---------------------------------------------------------------------------
def cmd_runs(args: argparse.Namespace, store: Store) -> int:
    rows = store.list_runs(args.status)
    if args.json:
        emit_json(rows)
        return 0
    if not rows:
        print("no runs" + (f" with status {args.status}" if args.status else ""))
        return 0
    for row in rows:
        total = row.get("total_steps")
        row["steps"] = f"{row['completed_steps']}/{total}" if total else row["completed_steps"]
    print(table(rows, ("id", "agent", "status", "steps", "updated_at", "reason")))
    return 0


def run_details(store: Store, run_id: str) -> dict[str, Any]:
    run = store.get_run(run_id)
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
    details = run_details(store, args.run_id)
    run = details["run"]
    if args.json:
        emit_json(details)
        return status_exit_code(run["status"])
    total = run.get("total_steps")
    print(f"run {run['id']}  agent {run['agent']}  status {run['status']}")
    if run.get("reason"):
        print(f"  reason: {run['reason']}")
    print(f"  steps completed: {run['completed_steps']}" + (f" of {total}" if total else ""))
    print(f"  created {cell_text(run['created_at'])} UTC, updated {cell_text(run['updated_at'])}")
    if run.get("deadline"):
        print(f"  expires {cell_text(run['deadline'])} UTC")
    if run.get("stop_requested_at"):
        print(f"  stop requested {cell_text(run['stop_requested_at'])} by {run['stop_source']}")
    sections: list[tuple[str, Sequence[str]]] = [
        ("steps", ("ordinal", "key", "name", "status", "duration_s", "error")),
        ("effects", ("tool", "step_key", "call_ordinal", "status", "key", "result", "error")),
        ("facts", ("name", "kind", "value", "check_name", "check_status", "recorded_at")),
        ("events", ("occurred_at", "kind", "from_status", "to_status", "source", "reason")),
    ]
    for name, columns in sections:
        rows = details[name]
        print(f"\n{name} ({len(rows)})")
        if rows:
            print(table(rows, columns, width=36))
    return status_exit_code(run["status"])


def cmd_stop(args: argparse.Namespace, store: Store) -> int:
    from .core.api import stop

    status = stop(args.run_id, source="cli", store=store)
    if args.wait:
        deadline = time.monotonic() + args.timeout
        while status in ("running", "stopping") and time.monotonic() < deadline:
            time.sleep(0.1)
            status = str(store.get_run(args.run_id)["status"])
    if args.json:
        emit_json({"run_id": args.run_id, "status": status, "source": "cli"})
    elif status == "stopping":
        print(
            f"stop requested for run {args.run_id}; it is stopping. The process that runs it "
            "suspends it at its next safe point."
            + (f" It did not within {args.timeout:g}s." if args.wait else "")
        )
    else:
        print(f"stop recorded for run {args.run_id}; it is {status}.")
    return status_exit_code(status)


def cmd_sweep(args: argparse.Namespace, store: Store) -> int:
    from .core import expiry

    result = expiry.sweep(store=store, source="cli")
    if args.json:
        emit_json(
            {
                "now": result.now,
                "busy": result.busy,
                "expired": [e._asdict() for e in result.expired],
                "removed": [r._asdict() for r in result.removed],
                "callback_errors": result.callback_errors,
            }
        )
    else:
        print(result.text())
    return 0


def cmd_sql(args: argparse.Namespace, store: Store) -> int:
    params = sql_params(args.param or [])
    result = store.read_arrow(args.query, params or None, allow_files=args.allow_files)
    rows = result.to_pylist()
    if args.json:
        emit_json(rows)
    elif not rows:
        print("(no rows) columns: " + ", ".join(result.column_names))
    else:
        print(table(rows, result.column_names, width=60))
    return 0


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


def cmd_reconcile(args: argparse.Namespace, store: Store) -> int:
    from .cli_reconcile import reconcile_command

    return reconcile_command(args, store)


def cmd_run(args: argparse.Namespace, store: Store) -> int:
    from .cli_notebook import run_notebook_command

    return run_notebook_command(args, store)


# -- parser -------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--store",
        default=argparse.SUPPRESS,
        help="a DuckDB file or a postgresql:// URL (default: $KERNELEXT_STORE, else "
        ".kernelext/store.duckdb in the project)",
    )
    common.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="print JSON for scripts"
    )
    parser = argparse.ArgumentParser(
        prog="kernelext",
        description="Inspect, stop and run kernelext agents from a terminal.",
        epilog=EPILOG,
        parents=[common],
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def add(name: str, handler: Callable[..., int], text: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(
            name, help=text, description=text, epilog=EPILOG, parents=[common]
        )
        sub.set_defaults(handler=handler)
        return sub

    sub = add("runs", cmd_runs, "List the runs in the store, oldest first.")
    sub.add_argument("--status", choices=STATUSES, help="only runs in this status")

    sub = add("show", cmd_show, "Show one run: its steps, effects, facts and events.")
    sub.add_argument("run_id", metavar="RUN_ID")

    sub = add(
        "stop",
        cmd_stop,
        "Ask a run to stop at its next safe point (recorded at once, source 'cli').",
    )
    sub.add_argument("run_id", metavar="RUN_ID")
    sub.add_argument("--wait", action="store_true", help="wait until the run has stopped")
    sub.add_argument(
        "--timeout", type=float, default=60.0, help="seconds --wait waits (default 60)"
    )

    add("sweep", cmd_sweep, "Expire suspended runs past their deadline; drop old snapshots.")

    sub = add("sql", cmd_sql, "Run one read-only query on the store.")
    sub.add_argument("query", metavar="QUERY", help='e.g. "SELECT status, count(*) FROM runs"')
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

    sub = add(
        "reconcile",
        cmd_reconcile,
        "Decide effects whose outcome is unknown: interactive in a terminal, or with flags.",
    )
    sub.add_argument("run_id", metavar="RUN_ID")
    sub.add_argument("--key", help="the effect's key (or a unique prefix of it)")
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

    sub = add(
        "run",
        cmd_run,
        "Execute an agent notebook headlessly. Rerunning the same command after the kernel "
        "died resumes the run.",
    )
    sub.formatter_class = argparse.RawDescriptionHelpFormatter
    sub.epilog = RUN_CONTRACT + "\n" + EPILOG
    sub.add_argument("notebook", metavar="NOTEBOOK.ipynb")
    sub.add_argument(
        "--run-id",
        help="the run id (default: derived from the notebook's path; a finished run gets a "
        "new one)",
    )
    sub.add_argument("--timeout", type=float, default=None, help="seconds a cell may take")
    sub.add_argument("--kernel", default=None, help="kernel name (default: the notebook's)")
    sub.add_argument("--output", default=None, help="save the executed notebook here")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.json = getattr(args, "json", False)
    args.store = getattr(args, "store", None) or default_store_path()
    if args.handler is cmd_reconcile and args.result is not None:
        if not args.applied:
            parser.error("--result goes with --applied")
        try:
            json.loads(args.result)
        except json.JSONDecodeError as exc:
            parser.error(f"--result must be JSON ({exc}), e.g. --result '{{\"id\": 7}}'")
    try:
        store = open_store(args.store)
    except KernelextError as exc:
        say(f"kernelext: {exc}")
        return EXIT["error"]
    try:
        code: int = args.handler(args, store)
        return code
    except (RunNotFound, ReadOnlyError, CommandUsageError) as exc:
        say(f"kernelext: {exc}")
        return EXIT["usage"]
    except KernelextError as exc:
        say(f"kernelext: {exc}")
        return EXIT["error"]
    except KeyboardInterrupt:
        say("kernelext: interrupted")
        return 130
    except Exception as exc:  # a query error from the backend: its message names the problem
        say(f"kernelext: {type(exc).__name__}: {exc}")
        return EXIT["error"]
    finally:
        if not store.closed:
            store.close()
