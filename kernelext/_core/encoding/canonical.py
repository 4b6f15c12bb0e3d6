"""One canonical, type-tagged encoding of values: argument hashes, what an approver sees,
and results that come back as the type they were.

``canonical(value)`` is injective bytes (a one-byte tag, an 8-byte length, the payload;
containers concatenate their self-delimiting parts), so two values share an argument hash
only if they are the same value. The rule: values of the same type that compare equal in
Python encode equally (``Decimal('1.0')`` and ``Decimal('1.00')``, ``0.0`` and ``-0.0``,
``{1, 2}`` and ``frozenset({2, 1})``, ``b"a"`` and ``bytearray(b"a")``), and NaN equals NaN;
values of different types never do (``1``, ``1.0``, ``True``, ``"1"``, ``Decimal(1)``,
``np.int64(1)`` are six different arguments; a list is not a tuple). Exception: an aware
datetime is its wall time *and* its UTC offset, so the same instant written in another zone
is another argument (the approver saw the zone); an aware time is its wall time and its zone
(IANA key, or fixed offset).

Only the exact builtin types are encoded as themselves: a subclass of int, float, str,
Decimal, bytes, list, tuple, dict, set, date/time, UUID or Path is refused (its overridable
methods could show and bind one value and deliver another), except enums (qualname and
value), named tuples (qualname, field names, values) and ``OrderedDict`` (ordered, not a
dict). A dataclass is its fields (one with other attributes is refused); a pydantic model is
its raw field values, extra and private attributes (never ``model_dump``, which the model
controls). ``np.matrix`` and masked arrays are refused.

What is stored and shown uses the same tags in JSON (``kernelext._core.encoding.tagged``). A value
with no faithful encoding is refused with ``Unencodable``, never reduced to its type name.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import hashlib
import math
import pathlib
import sys
import uuid
from collections import OrderedDict
from decimal import Decimal
from typing import Any

from .type_names import type_name

__all__ = ["MAX_DEPTH", "TAG", "Unencodable", "canonical", "digest", "frame"]

MAX_DEPTH = 100  # containers nested deeper are refused (and cycles with them)
TAG = "$kx"


class Unencodable(Exception):
    """``value`` at ``path`` has no faithful encoding (or is nested too deep)."""

    def __init__(self, path: str, value: object, why: str = "") -> None:
        self.path = path
        self.type_name = _qualname(type(value))
        self.why = why or f"a {self.type_name} has no faithful encoding"
        super().__init__(f"{path or 'the value'}: {self.why}")


def frame(*parts: str | bytes | int) -> bytes:
    """A prefix-free, injective encoding of a tuple of texts, bytes and ints: each part is
    its kind, its length in 8 bytes and its bytes (texts as UTF-8)."""
    out = bytearray()
    for part in parts:
        if isinstance(part, str):
            kind, raw = b"s", part.encode("utf-8", "surrogatepass")
        elif isinstance(part, bytes):
            kind, raw = b"b", part
        else:
            kind, raw = b"i", _int_bytes(part)
        out += kind + len(raw).to_bytes(8, "big") + raw
    return bytes(out)


def digest(value: Any) -> str:
    """The SHA-256 (hex) of ``canonical(value)``."""
    return hashlib.sha256(canonical(value)).hexdigest()


def canonical(value: Any, path: str = "") -> bytes:
    """The injective, type-tagged bytes of ``value`` (see the module docstring)."""
    return _enc(value, path, 0)


def _int_bytes(n: int) -> bytes:
    return n.to_bytes(n.bit_length() // 8 + 1, "big", signed=True)


def _qualname(cls: type) -> str:
    return type_name(cls)


def _item(tag: bytes, payload: bytes) -> bytes:
    return tag + len(payload).to_bytes(8, "big") + payload


def _float_text(x: float) -> str:
    if math.isnan(x):
        return "nan"
    return (x + 0.0).hex()  # -0.0 + 0.0 is 0.0: equal floats, one encoding


def _decimal_text(d: Decimal) -> str:
    """Exact and equal for equal values: digits without trailing zeros and an exponent
    (``Decimal.normalize`` would round to the context's precision)."""
    if d.is_nan():
        return "sNaN" if d.is_snan() else "NaN"
    if d.is_infinite():
        return "-Inf" if d < 0 else "+Inf"
    sign, digits, exponent = d.as_tuple()
    assert isinstance(exponent, int)
    numbers = list(digits)
    while len(numbers) > 1 and numbers[-1] == 0:
        numbers.pop()
        exponent += 1
    if numbers == [0]:
        return "0"
    return ("-" if sign else "") + "".join(map(str, numbers)) + "e" + str(exponent)


_LIBRARIES = frozenset({"numpy", "pandas", "pyarrow"})


def _module_of(value: Any) -> str:
    return type(value).__module__.split(".", 1)[0]


def _enc(value: Any, path: str, depth: int) -> bytes:
    if depth > MAX_DEPTH:
        raise Unencodable(path, value, f"nested more than {MAX_DEPTH} levels deep")
    if value is None:
        return _item(b"N", b"")
    if _module_of(value) in _LIBRARIES:  # before float: np.float64 is a float subclass
        return _enc_library(value, path, depth)
    if isinstance(value, enum.Enum):
        inner = _enc(value.value, path + ".value", depth + 1)
        return _item(b"M", frame(_qualname(type(value))) + inner)
    kind = type(value)
    if kind is bool:
        return _item(b"B", b"\x01" if value else b"\x00")
    if kind is int:
        return _item(b"I", _int_bytes(value))
    if kind is float:
        return _item(b"F", _float_text(value).encode())
    if kind is str:
        return _item(b"S", value.encode("utf-8", "surrogatepass"))
    if kind is Decimal:
        return _item(b"Q", _decimal_text(value).encode())
    if kind is memoryview and value.format not in ("B", "b", "c"):
        # a view of ints or floats is not those bytes (Python: not ==): format and shape too
        return _item(b"V", frame(value.format, *(value.shape or ()), value.tobytes()))
    if kind in (bytes, bytearray, memoryview):
        return _item(b"Y", bytes(value))
    if kind is dt.datetime:
        return _item(b"T" if value.tzinfo is None else b"t", value.isoformat().encode())
    if kind is dt.date:
        return _item(b"d", value.isoformat().encode())
    if kind is dt.time:
        if value.tzinfo is None:
            return _item(b"h", value.isoformat().encode())
        # an aware time: its zone too (a ZoneInfo time has no offset without a date)
        return _item(b"H", frame(value.isoformat(), zone_name(value.tzinfo)))
    if kind is dt.timedelta:
        return _item(b"D", frame(value.days, value.seconds, value.microseconds))
    if kind is uuid.UUID:
        return _item(b"U", value.bytes)
    if isinstance(value, pathlib.PurePath) and kind.__module__ == "pathlib":
        flavour = "windows" if isinstance(value, pathlib.PureWindowsPath) else "posix"
        return _item(b"P", frame(flavour, str(value)))
    if kind is list:
        return _item(b"L", _seq(value, path, depth))
    if kind is tuple:
        return _item(b"R", _seq(value, path, depth))
    if is_namedtuple(value):
        items = [tuple.__getitem__(value, i) for i in range(tuple.__len__(value))]
        names = frame(_qualname(kind), *kind._fields)
        return _item(b"r", names + _seq(items, path, depth))
    if kind is dict:
        pairs = sorted(_pair(k, v, path, depth) for k, v in value.items())
        return _item(b"{", b"".join(pairs))
    if kind is OrderedDict:  # its order is part of it (== compares it with another one)
        pairs = [_pair(k, v, path, depth) for k, v in value.items()]
        return _item(b"o", b"".join(pairs))
    if kind in (set, frozenset):
        items = sorted(_enc(v, f"{path}{{...}}", depth + 1) for v in value)
        return _item(b"E", b"".join(items))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = dataclass_fields(value, path)
        inner = _enc(fields, path, depth + 1)
        return _item(b"C", frame(_qualname(kind)) + inner)
    model = pydantic_state(value)
    if model is not None:
        return _item(b"m", frame(_qualname(kind)) + _enc(model, path, depth + 1))
    if isinstance(value, _BUILTINS):
        raise Unencodable(path, value, subclass_why(value))
    raise Unencodable(path, value)


def _seq(values: Any, path: str, depth: int) -> bytes:
    return b"".join(_enc(v, f"{path}[{i}]", depth + 1) for i, v in enumerate(values))


def _pair(k: Any, v: Any, path: str, depth: int) -> bytes:
    return _enc(k, f"{path}[{k!r}] (key)", depth + 1) + _enc(v, f"{path}[{k!r}]", depth + 1)


# Subclasses of these are refused: their dunders (``__int__``, ``__str__``, ``__iter__``,
# ``items``) are theirs to override, and their instance state would not be bound.
_BUILTINS = (
    int, float, str, bytes, bytearray, Decimal, list, tuple, dict, set, frozenset,
    dt.date, dt.time, dt.timedelta, uuid.UUID, pathlib.PurePath,
)  # fmt: skip


def subclass_why(value: Any) -> str:
    base = next(b for b in _BUILTINS if isinstance(value, b))
    return (
        f"a {_qualname(type(value))} is a subclass of {base.__name__}, which could show and "
        f"bind one value and deliver another (its methods are its own); pass a plain "
        f"{base.__name__} (e.g. {base.__name__}(value)), an enum, a dataclass or a model"
    )


def is_namedtuple(value: Any) -> bool:
    """A ``collections.namedtuple`` / ``typing.NamedTuple`` instance with no other state."""
    kind = type(value)
    fields = getattr(kind, "_fields", None)
    return (
        isinstance(value, tuple)
        and isinstance(fields, tuple)
        and all(type(f) is str for f in fields)
        and len(fields) == tuple.__len__(value)
        and not getattr(value, "__dict__", None)
    )


def zone_name(tz: dt.tzinfo) -> str:
    """A time zone as bound and shown: its IANA key, or its fixed offset."""
    key = getattr(tz, "key", None)
    if isinstance(key, str):
        return key
    offset = tz.utcoffset(None)
    return str(offset) if offset is not None else repr(tz)


def dataclass_fields(value: Any, path: str) -> dict[str, Any]:
    """A dataclass instance's fields; one with other attributes (set after ``__init__``) is
    refused, since those would be neither bound nor shown."""
    names = [f.name for f in dataclasses.fields(value)]
    extra = sorted(set(getattr(value, "__dict__", {})) - set(names))
    if extra:
        raise Unencodable(
            path,
            value,
            f"a {_qualname(type(value))} has attributes that are not fields "
            f"({', '.join(extra)}); they would be neither bound nor shown",
        )
    return {n: getattr(value, n) for n in names}


def pydantic_state(value: Any) -> dict[str, Any] | None:
    """A pydantic model as bound and shown: the raw values of its fields, its extra and its
    private attributes, never what its serializers (``model_dump``) make of them."""
    base = getattr(sys.modules.get("pydantic"), "BaseModel", None)
    if base is None or not isinstance(value, base):
        return None
    raw = object.__getattribute__(value, "__dict__")
    fields = {name: raw[name] for name in type(value).model_fields if name in raw}
    state: dict[str, Any] = {"fields": fields}
    extra = getattr(value, "__pydantic_extra__", None)
    if extra:
        state["extra"] = dict(extra)
    private = getattr(value, "__pydantic_private__", None)
    if private:
        state["private"] = dict(private)
    return state


def _enc_library(value: Any, path: str, depth: int) -> bytes:
    """numpy, pandas and pyarrow values: type, dtype or schema, shape and data bytes."""
    np = sys.modules.get("numpy")
    pd = sys.modules.get("pandas")
    pa = sys.modules.get("pyarrow")
    if np is not None and isinstance(value, np.generic) and value.dtype != object:
        return _item(b"n", frame(_dtype(value.dtype), bytes(value.tobytes())))
    if np is not None and isinstance(value, np.ndarray):
        if type(value) is not np.ndarray:  # np.matrix, a masked array (its mask), ...
            raise Unencodable(
                path,
                value,
                f"a {_qualname(type(value))} is an ndarray subclass with its own state "
                "(a mask, matrix semantics); pass a plain array (np.asarray, or "
                "the .data and .mask of a masked array as two arguments)",
            )
        shape = frame(*value.shape)
        if value.dtype == object:
            return _item(b"a", frame("O") + shape + _seq(value.ravel().tolist(), path, depth))
        data = np.ascontiguousarray(value).tobytes()
        return _item(b"A", frame(_dtype(value.dtype)) + shape + frame(data))
    if pd is not None:
        if value is pd.NA:
            return _item(b"x", b"NA")
        if value is pd.NaT:
            return _item(b"x", b"NaT")
        if isinstance(value, pd.Timestamp):
            return _item(b"p", frame(value.isoformat(), str(value.tz)))
        if isinstance(value, pd.Timedelta):
            return _item(b"q", frame(int(value.value)))
        if isinstance(value, (pd.Series, pd.DataFrame)) and pa is not None:
            frame_ = value.to_frame() if isinstance(value, pd.Series) else value
            kind = b"s" if isinstance(value, pd.Series) else b"f"
            try:
                table = pa.Table.from_pandas(frame_)
            except Exception as exc:
                raise Unencodable(
                    path, value, f"a pandas value Arrow cannot hold ({exc})"
                ) from None
            return _item(kind, _arrow_bytes(pa, table))
    if pa is not None and isinstance(value, (pa.Table, pa.RecordBatch)):
        table = pa.Table.from_batches([value]) if isinstance(value, pa.RecordBatch) else value
        return _item(b"W", _arrow_bytes(pa, table))
    if pa is not None and isinstance(value, (pa.Array, pa.ChunkedArray)):
        return _item(b"w", _arrow_bytes(pa, pa.table({"v": value})))
    raise Unencodable(path, value)


def _dtype(dtype: Any) -> str:
    return str(dtype.descr) if dtype.fields else str(dtype.str)


def _arrow_bytes(pa: Any, table: Any) -> bytes:
    """One chunk per column, then Arrow IPC: equal tables, equal bytes (same pyarrow)."""
    table = table.combine_chunks()
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())
