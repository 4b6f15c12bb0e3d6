"""An asyncio HTTP client for the local test servers: ``await apost_json(url, payload)``.

Stdlib only (``asyncio.open_connection``), one connection per request (``Connection:
close``), so that a cancelled request is a socket closed half-way, as with any async
client. Returns the ``Response`` of ``support.http_server`` (HTTP error statuses are
returned, not raised).
"""

from __future__ import annotations

import asyncio
import json
import urllib.parse
from typing import Any

from support.http_server import IDEMPOTENCY_HEADER, Response

__all__ = ["apost_json"]


async def apost_json(
    url: str, payload: Any, idempotency_key: str | None = None, timeout: float = 30
) -> Response:
    """POST ``payload`` as JSON to ``url`` (``http://127.0.0.1:PORT/path``)."""
    parts = urllib.parse.urlsplit(url)
    body = json.dumps(payload).encode()
    headers = {
        "Host": parts.netloc,
        "Content-Type": "application/json",
        "Content-Length": str(len(body)),
        "Connection": "close",
    }
    if idempotency_key is not None:
        headers[IDEMPOTENCY_HEADER] = idempotency_key
    head = f"POST {parts.path or '/'} HTTP/1.1\r\n" + "".join(
        f"{k}: {v}\r\n" for k, v in headers.items()
    )
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection(parts.hostname, parts.port), timeout
    )
    try:
        writer.write(head.encode() + b"\r\n" + body)
        await writer.drain()
        status_line = await asyncio.wait_for(reader.readline(), timeout)
        status = int(status_line.split()[1])
        received: dict[str, str] = {}
        while True:
            line = await asyncio.wait_for(reader.readline(), timeout)
            if line in (b"\r\n", b"\n", b""):
                break
            name, _, value = line.decode().partition(":")
            received[name.strip().lower()] = value.strip()
        length = int(received.get("content-length") or 0)
        raw = await asyncio.wait_for(reader.readexactly(length), timeout) if length else b""
    finally:
        writer.close()
    return Response(status, received, json.loads(raw) if raw else None)
