"""``kernelext run NOTEBOOK.ipynb [--run-id ID]``: execute an agent notebook headlessly.

The contract with the notebook:

- The kernel gets ``KERNELEXT_RUN_ID`` (the run id) and ``KERNELEXT_STORE`` (the
  store) in its environment. The notebook reads the id with
  ``RUN_ID = os.environ.get("KERNELEXT_RUN_ID", "some-default")``.
- Its ``%%agent {RUN_ID}`` cells (IPython expands ``{RUN_ID}``) are the steps of the
  run. If the kernel dies, run the same command again: the cells without
  ``%%agent`` (imports, definitions) run again, completed ``%%agent`` cells are
  skipped, and the interrupted one is taken over and runs again. A suspended run
  is resumed. When every cell ran, the command marks the run completed.
- A notebook that runs an ``@kx.agent`` instead starts it with ``run_id=RUN_ID``,
  goes on where it stopped when the run exists, and waits for it::

      try:
          h = my_agent.start(..., run_id=RUN_ID)
      except kx.RunStateError:  # the command was run again: go on where it stopped
          h = kx.resume(RUN_ID)
      h.wait()

Without ``--run-id`` the id is derived from the notebook's path, so rerunning the
same command finds the same run; once that run is finished, the next command
starts a new one (``-2``, ``-3``, ...). Progress (cell i/n) goes to stderr.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
from typing import Any

from .._core.lifecycle import control
from .._core.lifecycle.cell_runs import complete_cell_run
from .._core.process.lease import check_takeover
from .._store import Store
from ..errors import RunStateError
from ..status import LIVE, TERMINAL, Status
from .common import (
    EPILOG,
    STATUS_EXIT,
    AddCommand,
    CommandUsageError,
    Exit,
    emit_json,
    open_cli_store,
    say,
    status_exit_code,
)

__all__ = ["derive_run_id", "register", "run_notebook_command"]

SOURCE = "cli"

RUN_CONTRACT = """\
the notebook's side: the kernel gets KERNELEXT_RUN_ID and KERNELEXT_STORE.
  RUN_ID = os.environ.get("KERNELEXT_RUN_ID", "my-run")   # in the first cell
  %%agent {RUN_ID}                                        # each step cell
Completed %%agent cells are skipped on a rerun; when every cell ran, the run is
marked completed. A notebook that runs an @kx.agent starts it with
run_id=RUN_ID, calls kx.resume(RUN_ID) when that raises RunStateError (the run
exists), and waits with h.wait().
"""


def derive_run_id(path: str) -> str:
    """``<notebook stem>-<8 hex of its absolute path>``: the same for every rerun."""
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", os.path.splitext(os.path.basename(path))[0])
    digest = hashlib.sha256(os.path.abspath(path).encode()).hexdigest()[:8]
    return f"{stem.strip('-') or 'notebook'}-{digest}"


def choose_run_id(store: Store, path: str) -> str:
    """The derived id, or the first ``-N`` variant whose run is not finished."""
    base = derive_run_id(path)
    number = 1
    while True:
        run_id = base if number == 1 else f"{base}-{number}"
        row = store.find_run(run_id)
        if row is None or row["status"] not in TERMINAL:
            return run_id
        number += 1


PRELUDE = f"""\
# kernelext run: resume the run before the notebook's cells (removed from --output)
import os as _kx_os
import kernelext._core.lifecycle.control as _kx_control
_kx_control.resume(_kx_os.environ["KERNELEXT_RUN_ID"], source={SOURCE!r})
del _kx_os, _kx_control
"""


def prepare(store: Store, run_id: str) -> tuple[int | None, str | None]:
    """Check the run before executing: (exit code to stop with, code to run first)."""
    row = store.find_run(run_id)
    if row is None:
        return None, None
    status = row["status"]
    if status == Status.COMPLETED:
        say(f"kernelext: run {run_id} is already completed; nothing to do.")
        return Exit.DONE, None
    if status in TERMINAL:  # expired or cancelled
        say(
            f"kernelext: run {run_id} is {status}; it cannot go on. Start a new run with "
            f"another --run-id, or fork it deliberately with kx.restart({run_id!r})."
        )
        return Exit.FAILED, None
    if status == Status.NEEDS_DECISION:
        say(
            f"kernelext: run {run_id} needs a decision first: kernelext reconcile {run_id} "
            "(then run this command again)."
        )
        return Exit.NEEDS_DECISION, None
    if status in LIVE:
        try:
            check_takeover(row, store.now())
        except RunStateError as exc:
            say(f"kernelext: {exc}")
            return Exit.ERROR, None
        say(f"kernelext: run {run_id} was interrupted; going on where it stopped")
        return None, None
    if control.is_cell_run(row):  # suspended or failed: the kernel resumes it first
        say(f"kernelext: resuming run {run_id} (completed cells are skipped)")
        return None, PRELUDE
    return None, None


def execute(args: argparse.Namespace, run_id: str, prelude: str | None) -> dict[str, Any]:
    """Run the notebook in a fresh kernel; say how far it got and how it ended."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, DeadKernelError

    path = os.path.abspath(args.notebook)
    nb: Any = nbformat.read(path, as_version=4)  # type: ignore[no-untyped-call]
    if prelude is not None:
        nb.cells.insert(0, nbformat.v4.new_code_cell(prelude))  # type: ignore[no-untyped-call]
    first = 1 if prelude is not None else 0
    code = [
        i
        for i, c in enumerate(nb.cells)
        if i >= first and c.cell_type == "code" and c.source.strip()
    ]
    outcome: dict[str, Any] = {"cells": len(code), "executed": 0, "error": None, "died": False}

    def on_cell_start(cell: Any, cell_index: int) -> None:
        if cell_index not in code:
            return
        position = code.index(cell_index) + 1
        outcome["executed"] = position
        first = next((ln for ln in cell.source.splitlines() if ln.strip()), "")
        say(f"[{position}/{len(code)}] {first[:70]}")

    kernel = args.kernel or (nb.metadata.get("kernelspec") or {}).get("name") or "python3"
    client = NotebookClient(
        nb,
        timeout=args.timeout,
        kernel_name=kernel,
        resources={"metadata": {"path": os.path.dirname(path)}},
        on_cell_start=on_cell_start,
    )
    client.km = client.create_kernel_manager()
    client.km.transport = "ipc"  # local sockets: nothing on the network, no TCP warning
    os.environ["KERNELEXT_RUN_ID"] = run_id
    os.environ["KERNELEXT_STORE"] = args.store
    try:
        client.execute()
    except DeadKernelError as exc:
        outcome["died"] = True
        outcome["error"] = f"the kernel died: {exc}"
    except CellExecutionError as exc:
        outcome["error"] = f"{exc.ename}: {exc.evalue}"
    finally:
        if prelude is not None:
            del nb.cells[0]
        if args.output:
            nbformat.write(nb, args.output)  # type: ignore[no-untyped-call]
    return outcome


def run_notebook_command(args: argparse.Namespace, store: Store) -> int:
    """``kernelext run NOTEBOOK.ipynb``: execute (or go on with) a notebook's run."""
    if not os.path.isfile(args.notebook):
        raise CommandUsageError(f"No notebook at {args.notebook!r}.")
    if "://" not in args.store:
        args.store = os.path.abspath(args.store)
    run_id = args.run_id or choose_run_id(store, args.notebook)
    stop_code, prelude = prepare(store, run_id)
    if stop_code is not None:
        return stop_code
    store.close()  # an embedded store is the kernel's while the notebook runs
    say(f"kernelext: run {run_id}: {args.notebook} (store {args.store})")
    outcome = execute(args, run_id, prelude)
    store = open_cli_store(args.store)
    try:
        row = store.find_run(run_id)
        if (
            row is not None
            and outcome["error"] is None
            and control.is_cell_run(row)
            and row["status"] == Status.RUNNING
        ):
            complete_cell_run(run_id, store=store, source=SOURCE)
            row = store.find_run(run_id)
        status = row["status"] if row else None
    finally:
        store.close()
    return report(args, run_id, status, outcome)


def report(
    args: argparse.Namespace, run_id: str, status: str | None, outcome: dict[str, Any]
) -> int:
    """Tell how the run ended (stderr, or JSON on stdout); return the exit code."""
    if outcome["died"]:
        code = Exit.FAILED
    elif status is not None and status in STATUS_EXIT:
        code = status_exit_code(status)
    elif outcome["error"] is not None:
        code = Exit.FAILED
    else:
        code = status_exit_code(status)
    if args.json:
        emit_json(
            {
                "run_id": run_id,
                "notebook": args.notebook,
                "status": status,
                **outcome,
                "exit_code": code,
            }
        )
        return code
    where = f"cell {outcome['executed']}/{outcome['cells']}"
    if outcome["died"]:
        say(
            f"kernelext: the kernel died during {where}. Run the same command again to resume "
            f"run {run_id}: completed steps and %%agent cells are skipped."
        )
    elif status == Status.SUSPENDED:
        say(
            f"kernelext: run {run_id} is suspended (at {where}). Run the same command again to "
            "resume it."
        )
    elif status == Status.NEEDS_DECISION:
        say(f"kernelext: run {run_id} needs a decision: kernelext reconcile {run_id}")
    elif outcome["error"] is not None:
        say(f"kernelext: {where} failed: {outcome['error']}")
    else:
        say(f"kernelext: run {run_id} is {status or 'done'} ({outcome['cells']} cells)")
    return code


def register(add: AddCommand) -> None:
    """Add ``run`` to the command line."""
    sub = add(
        "run",
        run_notebook_command,
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
