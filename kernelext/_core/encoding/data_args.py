"""Data arguments (numpy arrays, pandas and Arrow tables) as an approver sees them: every value.

An approval request stores each data argument whole (``approvals.args``, scrubbed like every
argument): its kind, shape, columns and every row, the rows read from the same value at the
same moment as the argument hash that binds the call, so what is approved is what passes.

- a table (``pandas.DataFrame`` / ``Series``, ``pyarrow.Table`` / ``RecordBatch`` / arrays):
  ``{"$kx": kind, "shape": [rows, columns], "columns": [...], "rows": [[...], ...]}``, its
  rows as Arrow reads them (the hash binds the same Arrow table; a pandas index that is not
  the default is a column, ``__index_level_0__``);
- a numpy array: ``{"$kx": "ndarray", "dtype": ..., "shape": [...], "v": nested lists}``.

A value of more than :data:`CELL_LIMIT` cells keeps no rows (``"unseen": true`` and its
``sha256``): it is approved only knowingly, ``approve(unseen=True)`` /
``kernelext approve ID --unseen-data``, and the decision's event says so. The ledger's
``effects.args`` keeps a summary only (kind, shape, columns, ``sha256``).

:class:`DataArgument` reads one back (its rows, a text table, CSV); :func:`data_diff` compares
it with the same argument of the previously approved call of the tool.
"""

from __future__ import annotations

import csv
import json
import math
import re
import sys
import unicodedata
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..._shown import shown, shows
from .canonical import TAG

__all__ = [
    "CELL_LIMIT",
    "DataArgument",
    "DataDiff",
    "argument_text",
    "cell_text",
    "changes",
    "compact",
    "compact_text",
    "data_arguments",
    "data_diff",
    "no_formula",
    "table_parts",
    "unseen_data",
    "unseen_refusal",
]

CELL_LIMIT = 100_000  # cells of one data argument stored and shown with its request


def table_parts(
    value: Any, *, rows: bool = True
) -> tuple[list[str], list[list[Any]] | None, int] | None:
    """``(columns, rows, row count)`` of a pandas or Arrow value, read through the Arrow table
    the argument hash binds (``rows`` None beyond :data:`CELL_LIMIT` cells, or when not
    asked for); None for any other value."""
    pd, pa = sys.modules.get("pandas"), sys.modules.get("pyarrow")
    if pa is None:
        return None
    if pd is not None and isinstance(value, (pd.Series, pd.DataFrame)):
        frame = value.to_frame() if isinstance(value, pd.Series) else value
        index = frame.index  # shown as a column unless it is the default 0, 1, 2, ...
        plain = isinstance(index, pd.RangeIndex) and (index.start, index.step) == (0, 1)
        keep = None if plain and index.name is None else True
        table = pa.Table.from_pandas(frame, preserve_index=keep)
    elif isinstance(value, pa.RecordBatch):
        table = pa.Table.from_batches([value])
    elif isinstance(value, pa.Table):
        table = value
    elif isinstance(value, (pa.Array, pa.ChunkedArray)):
        table = pa.table({"v": value})
    else:
        return None
    columns = [str(name) for name in table.column_names]
    if not rows or table.num_rows * max(table.num_columns, 1) > CELL_LIMIT:
        return columns, None, table.num_rows
    values = [column.to_pylist() for column in table.columns]
    every = [list(row) for row in zip(*values, strict=True)] if values else []
    return columns, every, table.num_rows


def cell_text(value: Any) -> str:
    """One stored cell as a person reads it: text as it is, a tagged value (a decimal, a
    time) as its text, anything else as JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and TAG in value and isinstance(value.get("v"), (str, int)):
        return str(value["v"])
    return json.dumps(value, ensure_ascii=False)


def _is_data(value: Any) -> bool:
    if not isinstance(value, dict) or not isinstance(value.get(TAG), str):
        return False
    tag = value[TAG]
    # a table's tag carries its columns (an earlier release's: a non-empty shape); pandas
    # scalars (pd.NA, pd.NaT) are not data
    tabular = "columns" in value or bool(value.get("shape"))
    return tag == "ndarray" or (tag.startswith(("pandas.", "pyarrow.")) and tabular)


@dataclass
class DataArgument:
    """One data argument of an approval request, as stored: every row, or none (unseen)."""

    name: str
    kind: str
    shape: list[int]
    columns: list[str] | None  # None: a numpy array
    rows: list[Any] | None  # None: more than CELL_LIMIT cells, not stored
    dtype: str | None = None
    sha256: str | None = None

    @classmethod
    def read(cls, name: str, value: dict[str, Any]) -> DataArgument:
        shape = [int(n) for n in value.get("shape") or []]
        if value[TAG] == "ndarray":
            rows = value.get("v")
            if rows is not None and not isinstance(rows, list):
                rows = [rows]  # a 0-d array: its one value
            return cls(name, "numpy.ndarray", shape, None, rows, value.get("dtype"))
        rows = value.get("rows")
        columns = [str(c) for c in value.get("columns") or []]
        return cls(name, str(value[TAG]), shape, columns, rows, sha256=value.get("sha256"))

    @property
    def row_count(self) -> int:
        return self.shape[0] if self.shape else len(self.rows or [])

    @property
    def cells(self) -> int:
        return math.prod(self.shape) if self.shape else len(self.rows or [])

    @property
    def unseen(self) -> bool:
        """Its values were not stored with the request (too large), so nobody saw them."""
        return self.rows is None

    @property
    def header(self) -> list[str]:
        if self.columns is not None:
            return self.columns
        width = self.shape[1] if len(self.shape) == 2 else 1
        return [str(i) for i in range(width)] if width > 1 else ["value"]

    @shows
    def summary(self) -> str:
        """``pandas.DataFrame: 1,000 rows × 2 columns (name, amount)``."""
        if self.columns is not None:
            what = (
                f"{self.row_count:,} {'row' if self.row_count == 1 else 'rows'} × "
                f"{len(self.columns)} {'column' if len(self.columns) == 1 else 'columns'} "
                f"({', '.join(self.columns)})"
            )
        else:
            dims = " × ".join(f"{n:,}" for n in self.shape) or "a scalar"
            what = f"{self.dtype or ''} shape {dims} ({self.cells:,} values)".strip()
        if self.unseen:
            what += f"; values not shown: more than {CELL_LIMIT:,} cells"
        return f"{self.kind}: {what}"

    def table_rows(self) -> Iterator[list[str]]:
        """Every row as cell texts (a row of a 3-d array: its JSON)."""
        for row in self.rows or []:
            cells = row if isinstance(row, list) and self.columns is not None else None
            if cells is None and isinstance(row, list) and len(self.shape) == 2:
                cells = row
            yield [cell_text(c) for c in cells] if cells is not None else [cell_text(row)]

    def lines(self) -> list[str]:
        """Every row, numbered from 1, in aligned columns under the header: each cell as the
        display door shows it, laid out by the columns it takes on a terminal."""
        body = [[str(i), *cells] for i, cells in enumerate(self.table_rows(), start=1)]
        grid = [[shown(c) for c in row] for row in [["#", *self.header], *body]]
        widths = [
            max(_columns(r[i]) if i < len(r) else 0 for r in grid) for i in range(len(grid[0]))
        ]
        return [
            "  ".join(c + " " * (w - _columns(c)) for c, w in zip(r, widths, strict=False)).rstrip()
            for r in grid
        ]

    def write_csv(self, path: Path) -> None:
        """The rows as CSV, a cell a spreadsheet would run as a formula made text."""
        with path.open("w", newline="", encoding="utf-8") as out:
            writer = csv.writer(out)
            writer.writerow([no_formula(c) for c in self.header])
            writer.writerows([no_formula(c) for c in row] for row in self.table_rows())


_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")


def no_formula(cell: str) -> str:
    """``cell`` as a spreadsheet reads it as text (OWASP, "CSV injection"): one starting
    with ``=``, ``+``, ``-``, ``@``, a tab or a carriage return gets a leading ``'``; a
    plain number (``-5``, ``+1.5e3``) and every other cell stay as they are."""
    if cell.startswith(_FORMULA_STARTS) and not _NUMBER.fullmatch(cell):
        return "'" + cell
    return cell


def _columns(text: str) -> int:
    """The terminal columns ``text`` takes: a wide (CJK) character two, a mark none."""
    return sum(
        0 if unicodedata.combining(c) else 2 if unicodedata.east_asian_width(c) in "WF" else 1
        for c in text
    )


def data_arguments(arguments: Any, path: str = "") -> dict[str, DataArgument]:
    """Every data argument in a request's stored arguments, by name (nested ones by path:
    ``batch['rows']``)."""
    found: dict[str, DataArgument] = {}
    if _is_data(arguments):
        found[path or "value"] = DataArgument.read(path or "value", arguments)
    elif isinstance(arguments, dict):
        for key, inner in arguments.items():
            found.update(data_arguments(inner, f"{path}[{key!r}]" if path else str(key)))
    elif isinstance(arguments, list):
        for i, inner in enumerate(arguments):
            found.update(data_arguments(inner, f"{path}[{i}]"))
    return found


def unseen_data(arguments: Any) -> list[DataArgument]:
    """The data arguments whose values were not stored with the request (too large)."""
    return [data for data in data_arguments(arguments).values() if data.unseen]


@dataclass
class DataDiff:
    """What changed in one data argument since the previously approved call of the tool."""

    name: str
    added: list[list[str]] = field(default_factory=list)
    removed: list[list[str]] = field(default_factory=list)
    changed: list[tuple[list[str], list[str]]] = field(default_factory=list)
    note: str = ""

    @property
    def same(self) -> bool:
        return not (self.added or self.removed or self.changed or self.note)

    @shows
    def text(self, examples: int = 5) -> str:
        """``rows: 1 row changed (row 501: amount 10 -> 250000), 0 added, 0 removed``."""
        if self.note:
            return f"{self.name}: {self.note}"
        if self.same:
            return f"{self.name}: the same rows"
        shown = [f"{_row_text(old)} -> {_row_text(new)}" for old, new in self.changed[:examples]]
        shown += [f"+ {_row_text(row)}" for row in self.added[: max(examples - len(shown), 0)]]
        shown += [f"- {_row_text(row)}" for row in self.removed[: max(examples - len(shown), 0)]]
        total = len(self.changed) + len(self.added) + len(self.removed)
        more = f"; {total - len(shown)} more" if total > len(shown) else ""
        counts = (
            f"{len(self.changed)} changed, {len(self.added)} added, {len(self.removed)} removed"
        )
        return f"{self.name}: {counts}: " + "; ".join(shown) + more


def _row_text(row: list[str]) -> str:
    return "(" + ", ".join(row) + ")"


def data_diff(old: DataArgument, new: DataArgument) -> DataDiff:
    """Rows added, removed and changed from ``old`` to ``new``: rows are matched by their
    first column when it is unique in both tables of the same columns (by position for two
    arrays of one shape), else compared as a multiset (added and removed only). A pandas
    index that only one of them has as a column (rows were dropped) is left out."""
    diff = DataDiff(new.name)
    if old.unseen or new.unseen:
        diff.note = "not compared: the values of one of them were not stored"
        return diff
    (head, before), (head_after, after) = _comparable(old, new)
    if head != head_after:
        diff.note = f"columns changed from ({', '.join(head)}) to ({', '.join(head_after)})"
        return diff
    keyed = _keys(old, before)
    keys_after = _keys(new, after) if keyed is not None else None
    if keyed is None or keys_after is None:
        extra, missing = Counter(map(tuple, after)), Counter(map(tuple, before))
        diff.added = [list(r) for r in (extra - missing).elements()]
        diff.removed = [list(r) for r in (missing - extra).elements()]
        return diff
    by_key = dict(zip(keyed, before, strict=True))
    for key, row in zip(keys_after, after, strict=True):
        was = by_key.pop(key, None)
        if was is None:
            diff.added.append(row)
        elif was != row:
            diff.changed.append((was, row))
    diff.removed = list(by_key.values())
    return diff


_INDEX = re.compile(r"__index_level_\d+__")


def _comparable(
    old: DataArgument, new: DataArgument
) -> tuple[tuple[list[str], list[list[str]]], tuple[list[str], list[list[str]]]]:
    """Each side's header and rows, without the index columns when they are the only
    difference between the headers."""
    sides = [(data.header, list(data.table_rows())) for data in (old, new)]
    plain = [[i for i, name in enumerate(head) if not _INDEX.fullmatch(name)] for head, _ in sides]
    named = [[sides[s][0][i] for i in plain[s]] for s in (0, 1)]
    if sides[0][0] == sides[1][0] or named[0] != named[1]:
        return sides[0], sides[1]
    kept = [(named[s], [[row[i] for i in plain[s]] for row in sides[s][1]]) for s in (0, 1)]
    return kept[0], kept[1]


def _keys(data: DataArgument, rows: list[list[str]]) -> list[str] | None:
    if data.columns is None:
        return [str(i) for i in range(len(rows))]  # an array: by position
    keys = [row[0] for row in rows if row]
    return keys if len(keys) == len(rows) and len(set(keys)) == len(keys) else None


def _loaded(args: str | None) -> Any:
    try:
        return json.loads(args) if args else {}
    except ValueError:
        return {}


def compact(arguments: Any) -> Any:
    """Stored arguments with each data argument as its summary (one line for a listing)."""
    if _is_data(arguments):
        return DataArgument.read("", arguments).summary()
    if isinstance(arguments, dict):
        return {key: compact(inner) for key, inner in arguments.items()}
    if isinstance(arguments, list):
        return [compact(inner) for inner in arguments]
    return arguments


def argument_text(value: Any) -> str:
    """One stored argument for a ``name = value`` line: a data argument as its summary,
    anything else as JSON (data inside it summarised)."""
    if _is_data(value):
        return DataArgument.read("", value).summary()
    return json.dumps(compact(value), ensure_ascii=False, default=str)


def compact_text(args: str | None) -> str:
    """``approvals.args`` for one line: as stored, each data argument as its summary."""
    loaded = _loaded(args)
    if not data_arguments(loaded):
        return args or ""
    return json.dumps(compact(loaded), ensure_ascii=False)


def changes(previous: str | None, args: str | None) -> list[DataDiff]:
    """How each data argument differs from the one of the same name in ``previous`` (the
    arguments of the previously approved call of the tool)."""
    before = data_arguments(_loaded(previous))
    return [
        data_diff(before[name], data)
        for name, data in data_arguments(_loaded(args)).items()
        if name in before
    ]


def unseen_refusal(what: str, blind: list[DataArgument], ident: Any) -> str:
    """Why a plain approve of a request with data nobody saw is refused, and what to do."""
    named = "; ".join(f"{data.name} ({data.summary()})" for data in blind)
    rows = sum(data.row_count for data in blind)
    return (
        f"{what} has data too large to show ({named}): its values were not stored with the "
        f"request, so nobody has seen them. Approve it only knowingly, as approving unseen "
        f"data of {rows:,} rows: kx.approve('{ident}', unseen=True) (or .approve(unseen=True)), "
        f"or `kernelext approve {ident} --unseen-data`; the decision records it. Or reject it "
        f"and pass the data in parts of at most {CELL_LIMIT:,} cells."
    )
