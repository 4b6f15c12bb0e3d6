"""The ``kernelext`` command line (also ``python -m kernelext``): the parser and dispatch.

Every command takes ``--store`` (a DuckDB path or a ``postgresql://`` URL; default:
``$KERNELEXT_STORE``, else ``.kernelext/store.duckdb`` in the project, like the
library; the flag, its help and its check come from the ``store`` option of
``kernelext/_core/process/options.py``) and ``--json`` (machine-readable output on stdout).

Exit codes: 0 done, 1 error (the store cannot be opened, the query failed, ...),
2 usage (bad arguments, unknown run, a query that writes), 3 suspended,
4 needs a decision, 5 expired, failed or cancelled. For the commands about one run
(``show``, ``stop``, ``run``) the code tells the run's status afterwards; a running
or completed run is 0. Listing commands (``runs``, ``approvals``, ...) and ``plan`` exit 0
when they printed what they list, also when the list is empty. A reader that closes
the pipe early (``| head -1``) ends any command quietly with 0.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from .._core.process.options import OPTIONS, Option
from .._did_you_mean import did_you_mean
from ..errors import KernelextError, ReadOnlyError, RunNotFound
from . import approvals, notebook, plan, reconcile, runs
from .common import (
    EPILOG,
    AddCommand,
    CommandUsageError,
    Exit,
    Handler,
    nonblank,
    open_cli_store,
    say,
    shown_output,
    store_location,
)

__all__ = ["build_parser", "main", "typed_command"]

CLI_OPTIONS = tuple(option for option in OPTIONS if option.cli)  # flags every command takes

# Each adds its group of commands, in the order --help lists them.
REGISTER: tuple[Callable[[AddCommand], None], ...] = (
    runs.register,
    plan.register,
    reconcile.register,
    approvals.register,
    notebook.register,
)


class CommandLineParser(argparse.ArgumentParser):
    """The top-level parser; it knows its command names (for did-you-mean)."""

    command_names: list[str]


def build_parser() -> CommandLineParser:
    """The parser of every command, each with ``--store``, ``--json`` and the exit codes."""
    common = CommandLineParser(add_help=False)
    for option in CLI_OPTIONS:  # --store: the option of the same name, with its check
        common.add_argument(
            str(option.cli),
            dest=option.name,
            default=argparse.SUPPRESS,
            type=option_flag(option),
            help=plain(f"{option.meaning} (default: {option.default_text})"),
        )
    common.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="print JSON for scripts"
    )
    parser = CommandLineParser(
        prog="kernelext",
        description="Inspect, stop and run kernelext agents from a terminal.",
        epilog=EPILOG,
        parents=[common],
    )
    parser.command_names = []
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def add(name: str, handler: Handler, text: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(
            name, help=text, description=text, epilog=EPILOG, parents=[common]
        )
        sub.set_defaults(handler=handler)
        parser.command_names.append(name)
        return sub

    for register in REGISTER:
        register(add)
    return parser


def typed_command(argv: Sequence[str]) -> str | None:
    """The command word in ``argv``: its first argument that is neither an option nor
    the value of an option's flag (``--store``)."""
    skip = False
    for token in argv:
        if skip:
            skip = False
        elif token == "--":
            return None
        elif token.startswith("--") and "=" not in token and _flag_with_value(token):
            skip = len(token) > 2  # --store VALUE (or an abbreviation of it)
        elif not token.startswith("-"):
            return token
    return None


def _flag_with_value(token: str) -> bool:
    return any(str(option.cli).startswith(token) for option in CLI_OPTIONS)


def plain(text: str) -> str:
    """``text`` without Markdown's code marks (the declaration's texts are Markdown)."""
    return text.replace("`", "")


def option_flag(option: Option[Any]) -> Callable[[str], Any]:
    """The argparse ``type`` of ``option``'s flag: not blank, then the option's own check
    (a bad value is a usage error, exit code 2, before the store is opened)."""
    flag = str(option.cli)
    blank = nonblank(flag, plain(f"pass {option.meaning}, or leave {flag} out"))

    def check(value: str) -> Any:
        try:
            return option.check(flag, blank(value))
        except (TypeError, ValueError) as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    check.__name__ = flag
    return check


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; return its exit code (see ``kernelext --help``).

    All it prints on stdout and stderr passes the display door (``kernelext._shown``).
    A reader that closes the pipe early (``kernelext show X | head -1``) ends the
    command quietly with exit 0: stdout is pointed at devnull so the interpreter's
    final flush raises nothing (as Python's documentation of SIGPIPE recommends).
    """
    try:
        try:
            with shown_output():  # every text printed passes the display door
                code = _main(argv)
        finally:  # also after --help (SystemExit): the output is written here or fails here
            sys.stdout.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return int(Exit.DONE)
    return code


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    typed = typed_command(argv)
    if typed is not None and typed not in parser.command_names:
        hint = did_you_mean(typed, parser.command_names)
        if hint:
            parser.error(f"unknown command {typed!r}.{hint}")
    args = parser.parse_args(argv)
    args.json = getattr(args, "json", False)
    args.store = store_location(getattr(args, "store", None))
    check = getattr(args, "check", None)
    problem = check(args) if check is not None else None
    if problem is not None:
        parser.error(problem)
    before_open = getattr(args, "before_open", None)
    if before_open is not None:  # a command that may answer without the store file
        try:
            answered = before_open(args)
        except KernelextError as exc:
            say(f"kernelext: {exc}")
            return int(Exit.ERROR)
        if answered is not None:
            return int(answered)
    try:
        store = open_cli_store(args.store)
    except KernelextError as exc:
        say(f"kernelext: {exc}")
        return int(Exit.ERROR)
    try:
        return int(args.handler(args, store))
    except (RunNotFound, ReadOnlyError, CommandUsageError) as exc:
        say(f"kernelext: {exc}")
        return int(Exit.USAGE)
    except KernelextError as exc:
        say(f"kernelext: {exc}")
        return int(Exit.ERROR)
    except BrokenPipeError:
        raise  # main ends it quietly
    except KeyboardInterrupt:
        say("kernelext: interrupted")
        return int(Exit.INTERRUPTED)
    except Exception as exc:  # a query error from the backend: its message names the problem
        say(f"kernelext: {type(exc).__name__}: {exc}")
        return int(Exit.ERROR)
    finally:
        if not store.closed:
            store.close()
