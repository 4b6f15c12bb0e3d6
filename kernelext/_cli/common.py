"""What every command of the ``kernelext`` command line shares: exit codes, JSON and table
output, messages on stderr, opening the store, and did-you-mean suggestions."""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import decimal
import enum
import io
import json
import sys
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TextIO

from .._did_you_mean import did_you_mean
from .._formatting import moment_text
from .._shown import shown
from .._store import Store, default_store_path, open_store
from ..status import Status

__all__ = [
    "EPILOG",
    "STATUS_EXIT",
    "AddCommand",
    "CommandUsageError",
    "Exit",
    "Handler",
    "cell_text",
    "emit_json",
    "jsonable",
    "nonblank",
    "open_cli_store",
    "require_run",
    "say",
    "shown_output",
    "status_exit_code",
    "store_location",
    "table",
]


class Exit(enum.IntEnum):
    """The exit codes of every command."""

    DONE = 0
    ERROR = 1  # the store cannot be opened, a query failed, ...
    USAGE = 2  # bad arguments, an unknown run, a query that writes
    SUSPENDED = 3
    NEEDS_DECISION = 4
    FAILED = 5  # failed, expired or cancelled
    INTERRUPTED = 130  # Ctrl-C


# The runs whose status is not a plain success; a running or completed run exits 0.
STATUS_EXIT: dict[Status, Exit] = {
    Status.SUSPENDED: Exit.SUSPENDED,
    Status.NEEDS_DECISION: Exit.NEEDS_DECISION,
    Status.FAILED: Exit.FAILED,
    Status.EXPIRED: Exit.FAILED,
    Status.CANCELLED: Exit.FAILED,
}

EPILOG = (
    "exit codes: 0 done, 1 error, 2 usage, 3 suspended, 4 needs decision, "
    "5 expired, failed or cancelled"
)

Handler = Callable[[argparse.Namespace, Store], int]
AddCommand = Callable[[str, Handler, str], argparse.ArgumentParser]


def nonblank(what: str, hint: str) -> Callable[[str], str]:
    """An argparse ``type`` that refuses an empty or blank value (exit code 2), before the
    store is opened: an empty key would match every key as a prefix."""

    def check(value: str) -> str:
        if not value.strip():
            raise argparse.ArgumentTypeError(f"{what} must not be empty; {hint}")
        return value

    check.__name__ = what
    return check


RUN_ID = nonblank("RUN_ID", "pass a run id (kernelext runs lists them)")


class CommandUsageError(Exception):
    """The arguments do not fit the store's contents (exit code 2)."""


def status_exit_code(status: str | None) -> Exit:
    """The exit code that tells a run's status (``Exit.DONE`` for running or completed)."""
    if status is None:
        return Exit.DONE
    return STATUS_EXIT.get(Status(status), Exit.DONE)


# -- output -----------------------------------------------------------------------------
def jsonable(value: Any) -> Any:
    """``value`` with dates, UUIDs, decimals and bytes turned into JSON types."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, enum.Enum):
        return jsonable(value.value)
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
    """Print ``value`` as indented JSON on stdout (``--json``)."""
    json.dump(jsonable(value), sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")


def cell_text(value: Any, width: int = 40) -> str:
    """One table cell: times as everywhere (``2026-12-06 12:00:05 UTC``), short numbers,
    cut to ``width`` characters."""
    if value is None:
        return ""
    if isinstance(value, dt.datetime):
        return moment_text(value)
    if isinstance(value, float):
        return f"{value:.3f}".rstrip("0").rstrip(".") if abs(value) < 1e12 else f"{value:g}"
    text = str(jsonable(value)).replace("\n", " ")
    # cut first, then through the door: its escapes and flags are never cut off
    return shown(text if len(text) <= width else text[: width - 1] + "…")


def table(rows: Sequence[dict[str, Any]], columns: Sequence[str], width: int = 40) -> str:
    """``rows`` as a plain-text table of ``columns``, with a header line."""
    cells = [[cell_text(row.get(c), width) for c in columns] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(lines)


class ShownStream(io.TextIOBase):
    """A terminal stream whose every write passes the display door (``kernelext._shown``):
    what a command prints cannot draw something other than what is stored."""

    def __init__(self, raw: TextIO) -> None:
        self.raw = raw

    def write(self, text: str) -> int:
        self.raw.write(shown(text, lines=True))
        return len(text)

    def flush(self) -> None:
        self.raw.flush()

    def fileno(self) -> int:
        return self.raw.fileno()

    def isatty(self) -> bool:
        return self.raw.isatty()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return str(getattr(self.raw, "encoding", "utf-8"))


@contextlib.contextmanager
def shown_output() -> Iterator[None]:
    """stdout and stderr through the display door while a command runs (``main``)."""
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = ShownStream(out), ShownStream(err)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = out, err


def say(message: str) -> None:
    """A message for the person at the terminal (stderr, so stdout stays parseable)."""
    print(message, file=sys.stderr, flush=True)


# -- the store ----------------------------------------------------------------------------
def store_location(value: str | None) -> str:
    """``--store`` if given, else ``$KERNELEXT_STORE``, else the project's default file."""
    return value or default_store_path()


def open_cli_store(location: str) -> Store:
    """Open the store a command works on (``KernelextError`` says why it cannot)."""
    return open_store(location)


def require_run(store: Store, run_id: str) -> dict[str, Any]:
    """The row of run ``run_id``; an unknown id is a usage error that names the closest id."""
    row = store.find_run(run_id)
    if row is not None:
        return row
    hint = did_you_mean(run_id, (str(r["id"]) for r in store.list_runs()))
    if hint:
        raise CommandUsageError(f"No run {run_id!r}.{hint} (store: {store.location})")
    raise CommandUsageError(
        f"No run {run_id!r} in the store at {store.location}. List its runs with "
        "`kernelext runs`, or name another store with --store."
    )
