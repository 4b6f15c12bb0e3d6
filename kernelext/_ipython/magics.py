"""The ``Kernelext`` magics: ``%%agent``, ``%agent``, ``%%ledger`` / ``%ledger``, and options.

Every option is a traitlet, so ``%config Kernelext.store = 'other.duckdb'`` works in a
notebook and ``c.Kernelext.store = ...`` in an IPython profile; each is also a keyword of
``kx.configure``, which checks and applies both.
"""

from __future__ import annotations

import re
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class, no_var_expand
from IPython.core.magic_arguments import MagicArgumentParser
from traitlets import Bool, Dict, Float, TraitError, Unicode, validate

from .._core import control
from .._core.api import configure, runs, sql
from .._core.cell_runs import complete_cell_run
from .._core.credentials import CredentialError
from .._core.runtime import runtime
from .._validate import check_duration
from ..errors import AgentError, KernelextError, RunNotFound, RunStateError, StoreError
from ..status import Status
from .cells import run_agent_cell
from .options import NOTEBOOK_OPTIONS, did_you_mean, notebook_option

__all__ = ["Kernelext"]

_OUT = re.compile(r"^\s*(?:-o|--out)\s+([A-Za-z_][A-Za-z0-9_]*)\s*(.*)$", re.DOTALL)
# {name} in a %%ledger query, outside literals, quoted names and comments: a notebook
# variable, bound as the parameter $name (never pasted into the text).
_VARIABLE = re.compile(
    r"""(?P<str>'(?:[^']|'')*')|(?P<ident>"(?:[^"]|"")*")|(?P<line>--[^\n]*)"""
    r"""|(?P<block>/\*.*?\*/)|\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)\}""",
    re.DOTALL,
)
_QUOTED_VARIABLE = re.compile(r"^'\{[A-Za-z_][A-Za-z0-9_]*\}'$")
SUBCOMMANDS = ("stop", "resume", "status", "complete", "list")
# Every option is also a keyword of kx.configure, which checks and applies it.
OPTIONS = (
    "store",
    "expiry",
    "retention_seconds",
    "check_timeout",
    "max_step_seconds",
    "soft_interrupt",
    "interrupt_window",
    "allow_files",
)


def _cell_parser() -> MagicArgumentParser:
    parser = MagicArgumentParser(  # type: ignore[no-untyped-call]
        prog="%%agent", add_help=False, description="Run this cell as one step of run RUN_ID."
    )
    parser.add_argument("run_id", help="the run this cell is a step of")
    parser.add_argument(
        "--step", default=None, help="a stable name for this step (default: the notebook's cell id)"
    )
    parser.add_argument("--max-step-seconds", type=float, default=None, dest="max_step_seconds")
    parser.add_argument(
        "--rerun", action="store_true", help="run a cell that already completed (or changed) again"
    )
    return parser


def _line_parser() -> MagicArgumentParser:
    parser = MagicArgumentParser(  # type: ignore[no-untyped-call]
        prog="%agent", add_help=False, description="Control a run: " + ", ".join(SUBCOMMANDS)
    )
    parser.add_argument("command")  # checked by _agent_command, which suggests the nearest
    parser.add_argument("run_id", nargs="?", default=None)
    return parser


@magics_class
class Kernelext(Magics):
    """kernelext in IPython: options (``%config Kernelext``) and magics."""

    store = Unicode(
        None,
        allow_none=True,
        help=(
            "Where runs are recorded: a DuckDB file path or a postgresql:// URL. Default: "
            "$KERNELEXT_STORE, else .kernelext/store.duckdb in the project."
        ),
    ).tag(config=True)
    expiry = Dict(
        help=(
            "How long a suspended run lives, per reason, in seconds: e.g. "
            "{'user_stop': 7 * 86400, 'rate_limit': 3600}. Reasons: user_stop, approval, "
            "rate_limit, error, decision (a run waiting in needs_decision), other."
        )
    ).tag(config=True)
    retention_seconds = Float(
        None, allow_none=True, help=("How long the snapshot of an expired run is kept.")
    ).tag(config=True)
    check_timeout = Float(
        None,
        allow_none=True,
        help=("Seconds a fact's re-check may take on resume before it counts as a contradiction."),
    ).tag(config=True)
    max_step_seconds = Float(
        NOTEBOOK_OPTIONS["max_step_seconds"],
        allow_none=True,
        help=("Default time bound of one %%agent cell (overridden by --max-step-seconds)."),
    ).tag(config=True)
    soft_interrupt = Bool(
        NOTEBOOK_OPTIONS["soft_interrupt"],
        help=(
            "While an agent runs in the background, the notebook's interrupt button asks it to "
            "stop at its next safe point (a second press within interrupt_window forces it)."
        ),
    ).tag(config=True)
    interrupt_window = Float(
        NOTEBOOK_OPTIONS["interrupt_window"],
        help=("Seconds within which a second interrupt forces the stop."),
    ).tag(config=True)
    allow_files = Bool(
        NOTEBOOK_OPTIONS["allow_files"],
        help=(
            "Let %%ledger queries read files outside the store (read_csv, glob, "
            "'data.parquet'); off by default, like kx.sql(..., allow_files=True)."
        ),
    ).tag(config=True)

    def __init__(self, shell: Any = None, **kwargs: Any) -> None:
        self.interrupt: Any = None  # set by the extension once installed
        super().__init__(shell=shell, **kwargs)  # profile config goes through _configure

    # -- options ------------------------------------------------------------------------
    @validate(*OPTIONS)
    def _configure(self, proposal: Any) -> Any:
        """``%config Kernelext.<name> = value`` is ``kx.configure(<name>=value)``: the same
        checks, the same setting. A refused value leaves the option as it was."""
        value = proposal["value"]
        try:
            configure(**{proposal["trait"].name: value})
        except (TypeError, ValueError, RunStateError) as exc:
            raise TraitError(str(exc)) from None
        return value

    # -- %%agent / %agent -------------------------------------------------------------------
    @line_cell_magic
    def agent(self, line: str, cell: str | None = None) -> Any:
        """``%%agent RUN_ID [--step NAME] [--max-step-seconds N] [--rerun]``: this cell is
        one step of run RUN_ID. Completed cells are skipped; a stop takes effect at the
        boundary before the next cell.

        ``%agent stop|resume|status|complete RUN_ID`` and ``%agent list`` control runs.
        """
        try:
            if cell is None:
                return self._agent_command(line)
            args = _cell_parser().parse_argstring(line)  # type: ignore[no-untyped-call]
            limit = (
                args.max_step_seconds
                if args.max_step_seconds is not None
                else notebook_option("max_step_seconds")
            )
            if limit is not None:  # NaN and inf are refused too (ValueError -> UsageError)
                limit = check_duration("%%agent --max-step-seconds", limit)
            run_agent_cell(
                self.shell,
                args.run_id,
                cell,
                step=args.step,
                max_step_seconds=limit,
                rerun=args.rerun,
            )
        except (
            ValueError,
            RunStateError,
            AgentError,
            StoreError,
            RunNotFound,
            CredentialError,
        ) as exc:
            raise UsageError(str(exc)) from None
        return None

    def _agent_command(self, line: str) -> Any:
        args = _line_parser().parse_argstring(line)  # type: ignore[no-untyped-call]
        command: str = args.command
        if command not in SUBCOMMANDS:
            raise UsageError(
                f"%agent has no sub-command {command!r}"
                f"{did_you_mean(command, SUBCOMMANDS) or '.'} "
                "Use %agent stop|resume|status|complete RUN_ID, or %agent list."
            )
        if command == "list":
            return runs()
        if not args.run_id:
            raise UsageError(f"%agent {command} needs a run id: %agent {command} RUN_ID")
        run_id: str = args.run_id
        store = runtime().settings.store()
        row = store.find_run(run_id)
        if row is None:
            known = [str(r["id"]) for r in store.list_runs()]
            raise UsageError(
                f"No run {run_id!r} in the store at {store.location}"
                f"{did_you_mean(run_id, known) or '.'} List runs with %agent list."
            )
        cells = control.is_cell_run(row)
        if command == "stop":
            status = control.stop(run_id, source="magic", store=store)
            print(f"kernelext: stop requested for run {run_id!r}; it is {status}.")
            return None
        if command == "resume":
            handle = control.resume(run_id, source="magic", store=store)
            if cells and handle.status == Status.NEEDS_DECISION:
                print(
                    f"kernelext: run {run_id!r} needs a decision before its cells go on: "
                    f"{handle.store.get_run(run_id).get('reason')}"
                )
                return handle
            if cells:
                print(
                    f"kernelext: run {run_id!r} is {handle.status}; run its %%agent cells "
                    "again (completed ones are skipped)."
                )
                return None
            return handle
        if command == "complete":
            if not cells:
                raise UsageError(f"Run {run_id!r} is an agent run; it completes by itself.")
            if row["status"] == Status.COMPLETED:
                print(f"kernelext: run {run_id!r} is already completed.")
                return None
            done = complete_cell_run(run_id, store=store, source="magic")
            print(f"kernelext: run {run_id!r} is {done}.")
            return None
        return control.handle_for(run_id, store=store)

    # -- %%ledger / %ledger ------------------------------------------------------------------
    @no_var_expand  # {name} is bound as a parameter here, never pasted by IPython
    @line_cell_magic
    def ledger(self, line: str, cell: str | None = None) -> Any:
        """Read-only SQL on the kernelext store: ``%ledger SELECT ...`` or a ``%%ledger``
        cell. ``-o NAME`` also saves the result (a DataFrame) in the variable NAME.

        ``{name}`` in the query is the notebook variable ``name``, bound as a parameter
        (``WHERE run_id = {run_id}``, without quotes). Files outside the store are read
        only after ``%config Kernelext.allow_files = True``."""
        out: str | None = None
        head = line
        match = _OUT.match(line)
        if match:
            out, head = match.group(1), match.group(2)
        elif line.strip().startswith("-"):
            raise UsageError("Usage: %%ledger [-o NAME] then the query; %ledger [-o NAME] QUERY")
        query = "\n".join(part for part in (head, cell or "") if part.strip()).strip()
        query, params = self._bind_variables(query)
        try:
            result = sql(query, params, allow_files=bool(notebook_option("allow_files")))
        except KernelextError as exc:
            raise UsageError(str(exc)) from None
        except Exception as exc:  # the backend's own message names the problem in the query
            raise UsageError(f"The ledger query failed: {exc}") from None
        if out is not None and self.shell is not None:
            self.shell.user_ns[out] = result
        return result

    def _bind_variables(self, query: str) -> tuple[str, dict[str, Any] | None]:
        """``{name}`` -> ``$name``, with the notebook's ``name`` as that parameter's value."""
        namespace: dict[str, Any] = self.shell.user_ns if self.shell is not None else {}
        params: dict[str, Any] = {}

        def bind(match: re.Match[str]) -> str:
            name = match.group("name")
            if name is None:
                if match.group("str") and _QUOTED_VARIABLE.match(match.group("str")):
                    raise UsageError(
                        f"%%ledger binds {match.group('str')[1:-1]} as a value: write it "
                        "without quotes, e.g. WHERE run_id = {run_id}"
                    )
                return match.group(0)
            if name not in namespace:
                raise UsageError(
                    f"%%ledger: {{{name}}} names no variable of this notebook. Define {name} "
                    "first; its value is bound as a parameter, never pasted into the query."
                )
            params[name] = namespace[name]
            return "$" + name

        text = _VARIABLE.sub(bind, query)
        return text, (params or None)
