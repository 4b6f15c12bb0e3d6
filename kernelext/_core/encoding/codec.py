"""Safe encoding of state values: JSON for plain values, Arrow IPC for tables.

Pickle is used only when the caller opts in, because loading a pickle runs code.
"""

from __future__ import annotations

import io
import json
import pickle
import sys
from typing import Any

from ...errors import SerializationError
from .type_names import current_module

__all__ = ["check_json_fidelity", "decode", "dumps_json", "encode", "loads_json"]

_PLAIN = "dict, list, tuple, str, int, float, bool, None, bytes"


def dumps_json(value: Any) -> bytes:
    """Compact, deterministic JSON; raises TypeError on values JSON cannot hold."""
    return _ENCODER.encode(value).encode()


def loads_json(data: bytes | str) -> Any:
    return json.loads(data)


def _refuse(obj: object) -> Any:
    raise TypeError(obj)


# What ``json.dumps`` with these options builds at every call (it costs more than encoding
# a small value); an encoder keeps no state between calls, so one serves every thread.
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, default=_refuse)


def encode(value: Any, *, where: str, allow_pickle: bool = False) -> tuple[str, bytes]:
    """Return ``(encoding, payload)`` for one value. ``where`` names it in errors."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "bytes", bytes(value)
    arrow = _arrow_payload(value)
    if arrow is not None:
        return arrow
    try:
        return "json", dumps_json(value)
    except (TypeError, ValueError) as exc:
        culprit = exc.args[0] if exc.args and not isinstance(exc.args[0], str) else value
        if allow_pickle:
            try:
                return "pickle", pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
            except Exception as pexc:
                raise SerializationError(
                    f"{where} holds a {type(value).__name__} that even pickle cannot store: {pexc}"
                ) from None
        raise SerializationError(
            f"{where} holds a {type(culprit).__name__} value ({_excerpt(culprit)}) that kernelext "
            f"cannot store safely. Keep state to plain values ({_PLAIN}), pyarrow Tables or "
            "pandas DataFrames, or pass pickle=True to the agent if every reader of this store "
            "is trusted (loading a pickle runs code)."
        ) from None


def non_string_key(value: Any) -> object:
    """The first dict key JSON would silently turn into a string, or ``_NONE``."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, inner in item.items():
                if not isinstance(key, str):
                    return key
                if isinstance(inner, (dict, list, tuple)):
                    stack.append(inner)
        elif isinstance(item, (list, tuple)):
            stack.extend(v for v in item if isinstance(v, (dict, list, tuple)))
    return _NONE


_NONE = object()


def check_json_fidelity(value: Any, *, where: str, allow_pickle: bool) -> tuple[str, bytes] | None:
    """Refuse (or pickle, when allowed) JSON values whose dict keys are not strings."""
    key = non_string_key(value)
    if key is _NONE:
        return None
    if allow_pickle:
        return "pickle", pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    raise SerializationError(
        f"{where} holds a dict with the {type(key).__name__} key {_excerpt(key)}; JSON would "
        "bring it back as a string. Use string keys, or pass pickle=True to the agent if every "
        "reader of this store is trusted."
    )


def decode(encoding: str, payload: bytes, *, allow_pickle: bool = False) -> Any:
    if encoding == "json":
        return loads_json(payload)
    if encoding == "bytes":
        return payload
    if encoding in ("arrow", "arrow-pandas"):
        import pyarrow as pa

        table = pa.ipc.open_stream(payload).read_all()
        return table.to_pandas() if encoding == "arrow-pandas" else table
    if encoding == "pickle":
        if not allow_pickle:
            raise SerializationError(
                "This snapshot holds a pickled value. Loading a pickle runs code, so kernelext "
                "loads it only for an agent declared with pickle=True."
            )
        return _Unpickler(io.BytesIO(payload)).load()
    raise SerializationError(f"Unknown payload encoding {encoding!r}; upgrade kernelext.")


class _Unpickler(pickle.Unpickler):
    """``pickle.loads``, and a kernelext class pickled before kernelext's engine modules
    moved is found in its module now (see ``type_names``)."""

    def find_class(self, module: str, name: str) -> Any:
        return super().find_class(current_module(module), name)


def _arrow_payload(value: Any) -> tuple[str, bytes] | None:
    # getattr: another thread may be importing pyarrow/pandas right now (a partially
    # initialised module has no Table/DataFrame yet, and then value cannot be one).
    pa_table = getattr(sys.modules.get("pyarrow"), "Table", None)
    pd_frame = getattr(sys.modules.get("pandas"), "DataFrame", None)
    if pa_table is not None and isinstance(value, pa_table):
        table, encoding = value, "arrow"
    elif pd_frame is not None and isinstance(value, pd_frame):
        import pyarrow as pa

        table, encoding = pa.Table.from_pandas(value), "arrow-pandas"
    else:
        return None
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return encoding, bytes(sink.getvalue().to_pybytes())


def _excerpt(obj: object, limit: int = 60) -> str:
    text = repr(obj)
    return text if len(text) <= limit else text[: limit - 3] + "..."
