"""Journal frames: how one record becomes bytes on disk (``journal`` writes and scans them).

Frames: ``version (1 byte) | payload length (4) | crc32 (4) | payload`` where the payload
is ``[seq, kind, data]`` as JSON (a ``uuid.UUID`` as ``{"$u": hex}``, a ``datetime`` as
``{"$t": isoformat}``, bytes as ``{"$b": base64}``). Frames of the first release had no
version byte; their first byte is the high byte of a length under 16 MiB, so 0, which
reads as version 0.

A record is encoded in two parts: ``encode_body`` (``,kind,data]``, the costly part) by the
appending thread before it takes the journal's lock, and ``frame_body`` (the sequence number
and the header) under it. A flat record (what the hot path writes: texts, numbers, flags,
ids, timestamps) is encoded by ``orjson``; any other (nested values, a number JSON cannot
hold as it is, a key that is no text) by the standard library, as every frame was before.
Both read back as the same record (``parse``).
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import struct
import uuid
import zlib
from typing import Any

import orjson

__all__ = [
    "FORMAT_VERSION",
    "HEADER",
    "LEGACY",
    "Record",
    "encode_body",
    "encode_payload",
    "frame",
    "frame_body",
    "parse",
]

Record = tuple[int, str, dict[str, Any]]  # (seq, kind, data)
FORMAT_VERSION = 1
HEADER = struct.Struct(">BII")  # version, payload length, crc32
LEGACY = struct.Struct(">II")  # version 0: payload length, crc32


def _encode(obj: Any) -> Any:
    if isinstance(obj, uuid.UUID):
        return {"$u": obj.hex}
    if isinstance(obj, dt.datetime):
        return {"$t": obj.isoformat()}
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return {"$b": base64.b64encode(bytes(obj)).decode()}
    raise TypeError(f"cannot journal {type(obj).__name__}")


def _decode(obj: dict[str, Any]) -> Any:
    if len(obj) == 1:
        if "$u" in obj:
            return uuid.UUID(hex=obj["$u"])
        if "$t" in obj:
            return dt.datetime.fromisoformat(obj["$t"])
        if "$b" in obj:
            return base64.b64decode(obj["$b"])
    return obj


# One encoder for every record (``json.dumps`` with options builds one per call).
_ENCODER = json.JSONEncoder(default=_encode, separators=(",", ":"))
_INT_RANGE = range(-(2**63), 2**64)  # what orjson writes as a JSON integer (else it raises)
_UUID, _DATETIME = uuid.UUID, dt.datetime


def _flat(data: dict[str, Any]) -> dict[str, Any] | None:
    """``data`` with its ids and timestamps tagged, for orjson; None unless every value is
    a text, a flag, None, an integer orjson writes, a finite float, an id or a timestamp.
    (A key that is no text makes orjson raise: ``encode_body`` then takes the other way.)"""
    out = dict(data)
    for name, value in data.items():
        kind = type(value)
        if kind is str or value is None or kind is bool:
            continue
        if kind is _UUID or kind is _DATETIME:
            out[name] = _encode(value)  # the tags the standard library's way writes
        elif kind is int:
            if value not in _INT_RANGE:
                return None
        elif kind is float:
            if value - value != 0.0:  # NaN or an infinity: orjson would write null
                return None
        elif not isinstance(value, str):
            return None  # nested, bytes, another type: the standard library's way
    return out


def encode_body(kind: str, data: dict[str, Any]) -> bytes:
    """The payload after its sequence number: ``,"kind",{data}]``."""
    flat = _flat(data)
    if flat is not None:
        try:
            return b"," + orjson.dumps(kind) + b"," + orjson.dumps(flat) + b"]"
        except orjson.JSONEncodeError:  # a key that is no text, a lone surrogate in a text
            pass
    return f",{_ENCODER.encode(kind)},{_ENCODER.encode(data)}]".encode()


def frame_body(seq: int, body: bytes) -> bytes:
    """The whole frame of record ``seq`` whose payload ends with ``body`` (``encode_body``)."""
    payload = b"[%d" % seq + body
    return HEADER.pack(FORMAT_VERSION, len(payload), zlib.crc32(payload)) + payload


def encode_payload(seq: int, kind: str, data: dict[str, Any]) -> bytes:
    return b"[%d" % seq + encode_body(kind, data)


def frame(seq: int, kind: str, data: dict[str, Any]) -> bytes:
    return frame_body(seq, encode_body(kind, data))


def parse(payload: bytes) -> Record | None:
    """The record a payload holds, or None when it is not one."""
    try:
        seq, kind, data = json.loads(payload, object_hook=_decode)
    except (ValueError, TypeError):
        return None
    if not isinstance(seq, int) or not isinstance(kind, str) or not isinstance(data, dict):
        return None
    return seq, kind, data
