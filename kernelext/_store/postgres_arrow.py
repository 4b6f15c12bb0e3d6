"""A PostgreSQL result as a pyarrow Table (what ``kx.sql`` returns on a PostgreSQL store):
each column typed from its type oid; a column Arrow cannot type is kept as text."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

__all__ = ["to_arrow"]

_OID_TYPES = {
    16: "bool_",
    17: "binary",
    20: "int64",
    21: "int16",
    23: "int32",
    26: "int64",
    700: "float32",
    701: "float64",
    1082: "date32",
    1114: "timestamp",
    1184: "timestamptz",
    1186: "duration",
    19: "string",
    25: "string",
    1042: "string",
    1043: "string",
    114: "string",
    3802: "string",
    2950: "string",
}


def _arrow_type(pa: Any, oid: int) -> Any:
    name = _OID_TYPES.get(oid)
    if name is None:
        return None
    if name == "timestamp":
        return pa.timestamp("us")
    if name == "timestamptz":
        return pa.timestamp("us", tz="UTC")
    if name == "duration":
        return pa.duration("us")
    if name == "binary":
        return pa.binary()
    return getattr(pa, name)()


def _plain(value: Any) -> Any:
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, (dict, list)):
        import json

        return json.dumps(value, default=str)
    if isinstance(value, memoryview):
        return bytes(value)
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value.astimezone(dt.timezone.utc)
    return value


def to_arrow(columns: list[Any], rows: list[tuple[Any, ...]]) -> Any:
    import pyarrow as pa

    arrays = []
    names = []
    for index, column in enumerate(columns):
        values = [_plain(row[index]) for row in rows]
        kind = _arrow_type(pa, column.type_code)
        try:
            arrays.append(pa.array(values, type=kind) if kind is not None else pa.array(values))
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            arrays.append(pa.array([None if v is None else str(v) for v in values], pa.string()))
        names.append(column.name)
    return pa.Table.from_arrays(arrays, names=names)
