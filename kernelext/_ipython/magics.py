"""The ``Kernelext`` magics: ``%%agent``, ``%agent``, ``%%ledger`` / ``%ledger``, and options.

Every option declared in ``kernelext/_core/process/options.py`` is a traitlet of :class:`Kernelext`
(made from the declaration), so ``%config Kernelext.store = 'other.duckdb'`` works in a
notebook and ``c.Kernelext.store = ...`` in an IPython profile. The trait takes any value
and hands it to ``kx.configure``: the option's own check is the only check, and the values
set at once (a profile) are all checked before any is applied. Reading
``%config Kernelext.<name>`` shows the runtime's current setting.
"""

from __future__ import annotations

import ast
import re
import weakref
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class, no_var_expand
from IPython.core.magic_arguments import MagicArgumentParser
from traitlets import TraitError, TraitType
from traitlets.config import Config
from traitlets.config.loader import DeferredConfig, LazyConfigValue

from .._core.facts.credentials import CredentialError
from .._core.lifecycle import control
from .._core.lifecycle.cell_runs import complete_cell_run
from .._core.process.api import configure, runs, sql
from .._core.process.options import OPTIONS, Option
from .._core.process.runtime import runtime
from .._did_you_mean import did_you_mean
from .._validate import check_duration
from ..errors import AgentError, KernelextError, RunNotFound, RunStateError, StoreError
from ..status import Status
from .cells import run_agent_cell
from .ledger_display import for_display
from .options import NOTEBOOK_OPTIONS, notebook_option

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


class OptionTrait(TraitType[Any, Any]):
    """One declared option as a trait: any value is handed to ``kx.configure`` (the
    option's check refuses a bad one, nothing is set then); reading it gives the runtime's
    current setting, so it never keeps a copy of its own. ``None`` leaves the option as it
    is, as in ``kx.configure``."""

    info_text = "any value the option's check takes"

    def __init__(self, option: Option[Any] | None) -> None:
        help_text = option.help if option is not None else ""
        super().__init__(default_value=None, allow_none=True, help=help_text, config=True)
        self.option = option

    def from_string(self, s: str) -> Any:
        """A command-line value: a Python literal (``5``, ``True``, ``{'approval': 60}``),
        else the text itself (a store path)."""
        try:
            return ast.literal_eval(s)
        except (ValueError, SyntaxError):
            return s

    def get(self, obj: Any, cls: Any = None) -> Any:
        return None if self.option is None else self.option.current(runtime().settings)

    def validate(self, obj: Any, value: Any) -> Any:
        _configure({str(self.name): value})
        return value

    def default_value_repr(self) -> str:
        return "None" if self.option is None else self.option.default_text.replace("`", "")


# The ``Kernelext`` config values (profile, ``%config``) applied in each runtime. IPython
# keeps every ``%config Kernelext.<name>`` in ``shell.config`` for good, so loading the
# extension again would apply them again: an old store would silently replace the one a
# later ``kx.configure`` chose (and be refused while runs execute). A value applied before
# is not applied again; unloading forgets the notebook options it puts back.
_APPLIED: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()


def forget_notebook_options() -> None:
    """After unloading put the notebook options back: the next load applies them again."""
    applied = _APPLIED.get(runtime())
    if applied is not None:
        for name in NOTEBOOK_OPTIONS:
            applied.pop(name, None)


def _same(before: Any, now: Any) -> bool:
    try:
        return before is now or bool(before == now)
    except Exception:  # a value that cannot be compared: apply it
        return False


def _configure(values: dict[str, Any]) -> None:
    """``kx.configure(**values)``, a refusal as the ``TraitError`` ``%config`` reports."""
    try:
        configure(**values)
    except (TypeError, ValueError, RunStateError) as exc:
        raise TraitError(str(exc)) from None


def option_traits() -> dict[str, OptionTrait]:
    """A configurable trait for each option of ``kernelext/_core/process/options.py``, with
    its help."""
    return {option.name: OptionTrait(option) for option in OPTIONS}


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

    vars().update(option_traits())  # one trait per declared option: ``%config Kernelext.<name>``

    def __init__(self, shell: Any = None, **kwargs: Any) -> None:
        self.interrupt: Any = None  # set by the extension once installed
        super().__init__(shell=shell, **kwargs)  # profile config goes through _configure

    # -- options ------------------------------------------------------------------------
    def _load_config(
        self, cfg: Config, section_names: list[str] | None = None, traits: Any = None
    ) -> None:
        """Profile or ``%config`` values are one ``kx.configure`` call: all checked before
        any is applied (traitlets would set them one by one), an unknown name is refused
        naming the nearest option."""
        values: dict[str, Any] = {}
        applied = _APPLIED.setdefault(runtime(), {})
        raw: dict[str, Any] = {}
        for name, value in self._find_my_config(cfg).items():
            if isinstance(value, Config):  # a section of its own, not an option
                continue
            if name in applied and _same(applied[name], value):
                continue  # applied before (a reload): a later kx.configure stays in force
            raw[name] = value
            if isinstance(value, LazyConfigValue):  # c.Kernelext.expiry.update(...)
                value = value.get_value(getattr(self, name))
            elif isinstance(value, DeferredConfig):  # --Kernelext.<name>=... on a command line
                value = value.get_value(self.traits().get(name) or OptionTrait(None))
            values[name] = value
        if values:
            _configure(values)
            applied.update(raw)

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
                f"%agent has no sub-command {command!r}."
                f"{did_you_mean(command, SUBCOMMANDS)} "
                "Use %agent stop|resume|status|complete RUN_ID, or %agent list."
            )
        if command == "list":
            return for_display(runs())
        if not args.run_id:
            raise UsageError(f"%agent {command} needs a run id: %agent {command} RUN_ID")
        run_id: str = args.run_id
        store = runtime().settings.store()
        row = store.find_run(run_id)
        if row is None:
            known = [str(r["id"]) for r in store.list_runs()]
            raise UsageError(
                f"No run {run_id!r} in the store at {store.location}."
                f"{did_you_mean(run_id, known)} List runs with %agent list."
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
        return for_display(result)

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
