"""Tagged JSON: what an approver sees (``effects.args``) and what a result is stored as.

Plain JSON values stay as they are; anything else is ``{"$kx": tag, "v": ...}`` (a user dict
with a ``"$kx"`` key, or with keys that are not text, is itself tagged ``dict``, so it cannot
pass for a tag). ``untag`` reverses it for the types a result may have. The tags are those of
``kernelext._core.encoding.canonical``, whose encoding binds the same values in argument hashes.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import enum
import math
import pathlib
import sys
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any

from .canonical import (
    _BUILTINS,
    _LIBRARIES,
    MAX_DEPTH,
    TAG,
    Unencodable,
    _dtype,
    _module_of,
    _qualname,
    canonical,
    dataclass_fields,
    digest,
    is_namedtuple,
    pydantic_state,
    subclass_why,
    zone_name,
)
from .data_args import CELL_LIMIT, table_parts

__all__ = ["tagged", "untag"]

NameRule = Callable[[str], bool]
TextRule = Callable[[str], str]
_BIG_INT_BITS = 4000  # JSON numbers this long are refused by parsers (and by int(str))


def tagged(
    value: Any,
    *,
    result: bool = False,
    secret: NameRule | None = None,
    text: TextRule | None = None,
    redacted: str = "***",
    path: str = "",
    full: bool = False,
) -> Any:
    """``value`` as JSON, tagged where JSON has no such type. ``result=True``: only types
    ``untag`` gives back (anything else is ``Unencodable``); otherwise (what a person sees)
    also enums, dataclasses, models, numpy/pandas/arrow values, summarised (kind, shape,
    columns, hash), or with ``full=True`` (an approval request) with every value up to
    ``data_args.CELL_LIMIT`` cells. ``secret(name)`` redacts values by dict key, field or
    column name, ``text`` scrubs strings."""
    walk = _Tagger(result, secret, text, redacted)
    walk.full = full
    return walk(value, path, 0)


class _Tagger:
    full = False  # data values with every row (see ``kernelext._core.encoding.data_args``)

    def __init__(
        self, result: bool, secret: NameRule | None, text: TextRule | None, redacted: str
    ) -> None:
        self.result, self.secret, self.text, self.redacted = result, secret, text, redacted

    def named(self, name: str, value: Any, path: str, depth: int) -> Any:
        if self.secret is not None and self.secret(name):
            return self.redacted
        return self(value, path, depth)

    def __call__(self, value: Any, path: str, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise Unencodable(path, value, f"nested more than {MAX_DEPTH} levels deep")
        exact = type(value)
        if exact is str:  # the commonest values first: what the checks below would give
            return self.string(value)
        if exact is int:
            return {TAG: "int", "v": hex(value)} if value.bit_length() > _BIG_INT_BITS else value
        if value is None or isinstance(value, bool):
            return value
        if _module_of(value) in _LIBRARIES:
            return self.library(value, path, depth)
        if isinstance(value, enum.Enum):
            inner = self(value.value, path, depth + 1)
            if not self.result:
                return {TAG: "enum", "class": _qualname(type(value)), "v": inner}
            if isinstance(value, (int, str)):  # an IntEnum / StrEnum result: its value, as JSON
                return inner  # always stored it
            raise Unencodable(path, value)
        if (
            isinstance(value, _BUILTINS)
            and type(value) not in _EXACT
            and type(value).__module__ != "pathlib"  # the path classes themselves
        ):
            if self.result:  # the builtin value, read via the base type's own slots
                value = _base_value(value)
            elif not is_namedtuple(value) and type(value) is not OrderedDict:
                raise Unencodable(path, value, subclass_why(value))  # as the hash refuses it
        if type(value) is int:
            n = value
            return {TAG: "int", "v": hex(n)} if n.bit_length() > _BIG_INT_BITS else n
        if type(value) is float:
            x = value
            return x if math.isfinite(x) else {TAG: "float", "v": repr(x)}
        if type(value) is str:
            return self.string(value)
        if type(value) is Decimal:
            return {TAG: "decimal", "v": str(value)}
        if isinstance(value, (bytes, bytearray, memoryview)):
            return {TAG: "bytes", "v": base64.b64encode(self.scrub_bytes(bytes(value))).decode()}
        if not self.result and (is_namedtuple(value) or type(value) is OrderedDict):
            return self.ordered(value, path, depth)
        simple = _simple_tag(value, shown=not self.result)
        if simple is not None:
            return simple
        if isinstance(value, list):
            return [self(v, f"{path}[{i}]", depth + 1) for i, v in enumerate(value)]
        if isinstance(value, tuple):
            return {
                TAG: "tuple",
                "v": [self(v, f"{path}[{i}]", depth + 1) for i, v in enumerate(value)],
            }
        if isinstance(value, Mapping):
            return self.mapping(value, path, depth)
        if isinstance(value, (set, frozenset)):
            items = sorted(value, key=lambda v: canonical(v, path))
            kind = "frozenset" if isinstance(value, frozenset) else "set"
            return {TAG: kind, "v": [self(v, f"{path}{{...}}", depth + 1) for v in items]}
        return self.instance(value, path, depth)

    def string(self, value: str) -> Any:
        """A ``str``: as text (through ``text`` if given); a lone surrogate as tagged bytes."""
        s = self.text(value) if self.text is not None else value
        try:
            s.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: JSON text in UTF-8 cannot hold it
            raw = base64.b64encode(s.encode("utf-8", "surrogatepass")).decode()
            return {TAG: "text", "v": raw}
        return s

    def ordered(self, value: Any, path: str, depth: int) -> Any:
        """A named tuple or an ``OrderedDict`` (arguments only): its type kept."""
        if is_namedtuple(value):
            items = [tuple.__getitem__(value, i) for i in range(tuple.__len__(value))]
            return {
                TAG: "namedtuple",
                "class": _qualname(type(value)),
                "v": {
                    f: self.named(f, v, f"{path}.{f}", depth + 1)
                    for f, v in zip(type(value)._fields, items, strict=True)
                },
            }
        return {
            TAG: "ordered_dict",
            "v": [
                [
                    self(k, f"{path}[{k!r}] (key)", depth + 1),
                    self.named(k, v, f"{path}[{k!r}]", depth + 1)
                    if isinstance(k, str)
                    else self(v, f"{path}[{k!r}]", depth + 1),
                ]
                for k, v in value.items()
            ],
        }

    def instance(self, value: Any, path: str, depth: int) -> Any:
        """A dataclass or pydantic model (arguments only): its class and fields; anything
        else cannot be encoded."""
        if not self.result:
            if dataclasses.is_dataclass(value) and not isinstance(value, type):
                fields = dataclass_fields(value, path)
                inner = {k: self.named(k, v, f"{path}.{k}", depth + 1) for k, v in fields.items()}
                return {TAG: "dataclass", "class": _qualname(type(value)), "v": inner}
            state = pydantic_state(value)
            if state is not None:  # the raw values bound by the hash, not model_dump()
                out: dict[str, Any] = {TAG: "model", "class": _qualname(type(value))}
                for part, label in (("fields", "v"), ("extra", "extra"), ("private", "private")):
                    if part in state:
                        out[label] = {
                            k: self.named(k, v, f"{path}.{k}", depth + 1)
                            for k, v in state[part].items()
                        }
                return out
        raise Unencodable(path, value)

    def mapping(self, value: Mapping[Any, Any], path: str, depth: int) -> Any:
        if all(isinstance(k, str) for k in value) and TAG not in value:
            return {k: self.named(k, v, f"{path}[{k!r}]", depth + 1) for k, v in value.items()}
        pairs = sorted(value.items(), key=lambda kv: canonical(kv[0], path))
        return {
            TAG: "dict",
            "v": [
                [
                    self(k, f"{path}[{k!r}] (key)", depth + 1),
                    self.named(k, v, f"{path}[{k!r}]", depth + 1)
                    if isinstance(k, str)
                    else self(v, f"{path}[{k!r}]", depth + 1),
                ]
                for k, v in pairs
            ],
        }

    def scrub_bytes(self, raw: bytes) -> bytes:
        if self.text is None:
            return raw
        try:
            as_text = raw.decode()
        except UnicodeDecodeError:
            return raw
        clean = self.text(as_text)
        return raw if clean == as_text else clean.encode()

    def library(self, value: Any, path: str, depth: int) -> Any:
        np = sys.modules.get("numpy")
        if self.result:
            # A numpy scalar in a result comes back as the Python number it holds (as
            # np.float64, a float, always did); arrays and frames are refused.
            if np is not None and isinstance(value, np.generic) and value.dtype.kind in "biuf":
                return self(value.item(), path, depth)
            raise Unencodable(path, value)
        canonical(value, path)  # refuses what the hash refuses
        if np is not None and isinstance(value, np.generic) and value.dtype != object:
            return {
                TAG: "numpy",
                "dtype": _dtype(value.dtype),
                "v": self(value.item(), path, depth),
            }
        if np is not None and isinstance(value, np.ndarray):
            out: dict[str, Any] = {TAG: "ndarray", "dtype": _dtype(value.dtype)}
            out["shape"] = list(value.shape)
            if value.size <= (CELL_LIMIT if self.full else 100):
                out["v"] = self(value.tolist(), path, depth + 1)
            else:
                out.update(sha256=digest(value), **({"unseen": True} if self.full else {}))
            return out
        kind = _qualname(type(value))
        if kind.startswith("pandas") and ("Timestamp" in kind or "Timedelta" in kind):
            return {TAG: kind.rsplit(".", 1)[-1].lower(), "v": str(value)}
        parts = table_parts(value, rows=self.full)
        if parts is None:  # pd.NA, pd.NaT: their text
            shown = self.text(str(value)) if self.text is not None else str(value)
            return {TAG: kind, "v": shown[:200], "shape": [], "sha256": digest(value)}
        columns, rows, count = parts
        table: dict[str, Any] = {TAG: kind, "shape": [count, len(columns)], "columns": columns}
        if rows is None:
            table.update(sha256=digest(value), **({"unseen": True} if self.full else {}))
            return table
        hidden = [i for i, c in enumerate(columns) if self.secret is not None and self.secret(c)]
        for row in rows:  # a column named like a secret: its values redacted
            for i in hidden:
                row[i] = self.redacted
        table["rows"] = self(rows, path, depth + 1)
        return table


_EXACT = frozenset({int, float, str, bytes, bytearray, Decimal, list, tuple, dict, set, frozenset})
_EXACT |= {dt.date, dt.datetime, dt.time, dt.timedelta, uuid.UUID}


def _base_value(value: Any) -> Any:
    """A result that subclasses a builtin: the builtin value it holds, read through the base
    type's own slots (not the subclass's overridable methods)."""
    if isinstance(value, pathlib.PurePath):
        return value  # the pathlib classes: as they were
    for base, read in _BASE_READERS:
        if isinstance(value, base):
            return read(value)
    return value


_BASE_READERS: tuple[tuple[type, Callable[[Any], Any]], ...] = (
    (int, int.__int__),
    (float, float.__float__),
    (str, str.__str__),
    (bytes, bytes),
    (Decimal, lambda d: Decimal(Decimal.__str__(d))),
    (list, list.copy),
    (tuple, lambda t: tuple(tuple.__getitem__(t, i) for i in range(tuple.__len__(t)))),
    (dict, dict.copy),
    (set, set.copy),
    (frozenset, frozenset.copy),
)


def _simple_tag(value: Any, shown: bool = False) -> dict[str, Any] | None:
    if isinstance(value, dt.datetime):
        return {TAG: "datetime", "v": value.isoformat()}
    if isinstance(value, dt.date):
        return {TAG: "date", "v": value.isoformat()}
    if isinstance(value, dt.time):
        if shown and value.tzinfo is not None:  # its zone too: a ZoneInfo time has no offset
            return {TAG: "time", "v": value.isoformat(), "zone": zone_name(value.tzinfo)}
        return {TAG: "time", "v": value.isoformat()}
    if isinstance(value, dt.timedelta):
        return {TAG: "timedelta", "v": [value.days, value.seconds, value.microseconds]}
    if isinstance(value, uuid.UUID):
        return {TAG: "uuid", "v": str(value)}
    if isinstance(value, pathlib.PureWindowsPath):
        return {TAG: "windows_path", "v": str(value)}
    if isinstance(value, pathlib.PurePath):
        return {TAG: "path", "v": str(value)}
    return None


_DECODE: dict[str, Callable[[Any], Any]] = {
    "int": lambda v: int(v, 16),
    "float": float,
    "decimal": Decimal,
    "bytes": base64.b64decode,
    "text": lambda v: base64.b64decode(v).decode("utf-8", "surrogatepass"),
    "datetime": dt.datetime.fromisoformat,
    "date": dt.date.fromisoformat,
    "time": dt.time.fromisoformat,
    "timedelta": lambda v: dt.timedelta(days=v[0], seconds=v[1], microseconds=v[2]),
    "uuid": uuid.UUID,
    "path": pathlib.Path,
    "windows_path": pathlib.PureWindowsPath,
}


def untag(obj: Any) -> Any:
    """The value ``tagged(value, result=True)`` stood for. A dict whose ``"$kx"`` names no
    known tag (data an earlier release stored) comes back as it is."""
    if isinstance(obj, list):
        return [untag(v) for v in obj]
    if not isinstance(obj, dict):
        return obj
    tag = obj.get(TAG)
    if isinstance(tag, str) and set(obj) == {TAG, "v"}:
        inner = obj["v"]
        try:
            if tag in _DECODE:
                return _DECODE[tag](inner)
            if tag == "tuple":
                return tuple(untag(v) for v in inner)
            if tag in ("set", "frozenset"):
                items = [untag(v) for v in inner]
                return set(items) if tag == "set" else frozenset(items)
            if tag == "dict":
                return {untag(k): untag(v) for k, v in inner}
        except (TypeError, ValueError, ArithmeticError):
            pass  # not a tag after all: user data that looks like one
    return {k: untag(v) for k, v in obj.items()}
