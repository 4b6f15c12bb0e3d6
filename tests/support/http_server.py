"""A real local HTTP server: the external system whose deliveries are counted.

Every POST (any path, JSON body) is one *delivery*: it is recorded in memory and,
when ``log_path`` is given, appended to a JSON-lines file and fsync'ed before the
response is sent, so that another process can count deliveries even after the
client (a kernel, a worker) was SIGKILLed half-way.

With ``dedupe=True`` the server behaves like an API that honours
``Idempotency-Key``: a repeated key gets the first response back (status 200,
header ``Idempotent-Replayed: true``) and is *not* recorded as a new delivery;
it is counted as a replay instead.

Stdlib only, so that it can also run standalone in a subprocess::

    python tests/support/http_server.py [--dedupe] [--log FILE] [--port N]

prints its base URL on the first line of stdout, then serves until SIGTERM/SIGINT.

Endpoints: ``POST /<anything>`` records a delivery; ``GET /deliveries`` and
``GET /replays`` return the recorded lists as JSON; ``GET /deliveries?key=K`` looks a
request up by its Idempotency-Key, as payment APIs allow: ``{"key": K, "applied": true,
"deliveries": 1, "first": {...the first delivery...}}`` (``applied`` false, ``first`` null
when none was received); ``GET /health`` returns ``ok``; ``GET /settle`` returns once every
request accepted before it was handled.

Faults, for the next requests: ``fail_next(n, status, retry_after=...)`` answers ``n`` POSTs
with an error status (and a ``Retry-After`` header) without recording a delivery; each is
kept in ``refusals`` with its time. ``slow_next(n, seconds)`` records ``n`` POSTs, then
answers them ``seconds`` later (a client that gives up first sees a timeout after its
request was applied). ``hold_next(n)`` records ``n`` POSTs and answers them only at
``release_held()`` (or when the server stops): their clients are inside their calls until
the test lets them out, however long the test takes meanwhile. ``peak_in_flight`` is the
most POSTs handled at once (with ``delay``, ``slow_next`` or ``hold_next`` they overlap
while they wait to be answered).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["DeliveryServer", "Response", "post_json", "read_log"]

try:
    from support.local_server import (
        JSONHandler,
        LocalHTTPServer,
        ServedLocally,
        serve_until_signalled,
    )
except ImportError:  # run standalone: python tests/support/http_server.py
    from local_server import (  # type: ignore[no-redef]
        JSONHandler,
        LocalHTTPServer,
        ServedLocally,
        serve_until_signalled,
    )

IDEMPOTENCY_HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
HOLD_LIMIT = 300.0  # seconds a held POST waits for release_held() at most (a test that failed)


class _Handler(JSONHandler):
    server: _Server
    _send = JSONHandler.send_body

    def do_GET(self) -> None:
        owner = self.server.owner
        path, _, query = self.path.partition("?")
        keys = urllib.parse.parse_qs(query).get("key")
        if path == "/deliveries" and keys:
            self._send(200, json.dumps(owner.lookup(keys[0])).encode())
        elif path == "/deliveries":
            self._send(200, json.dumps(owner.deliveries).encode())
        elif path == "/replays":
            self._send(200, json.dumps(owner.replays).encode())
        elif path == "/health":
            self._send(200, b'"ok"')
        elif path == "/settle":
            settled = self.server.owner._wait_idle(float(self.headers.get("X-Timeout") or 30))
            self._send(200 if settled else 503, b'"settled"' if settled else b'"busy"')
        else:
            self._send(404, b'{"error": "not found"}')

    def do_POST(self) -> None:
        raw = self.read_body()
        if raw is None:
            return
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            self._send(400, b'{"error": "body is not JSON"}')
            return
        key = self.headers.get(IDEMPOTENCY_HEADER)
        status, payload, headers = self.server.owner._handle_post(self.path, body, key)
        self._send(status, payload, headers)


class _Server(LocalHTTPServer):
    # Many clients connecting at once (a batch of 16 or 32) must not overflow the listen
    # backlog (5 by default): a dropped SYN is sent again a second later, which would
    # delay a request by a second that no client caused.
    request_queue_size = 128
    owner: DeliveryServer

    # Requests in flight are counted from the moment they are accepted, in the
    # serving thread and in order, so that ``settle`` can wait for them.
    def process_request(self, request: Any, client_address: Any) -> None:
        self.owner._enter()
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.owner._leave()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.owner._leave()


@dataclass
class DeliveryServer(ServedLocally):
    """Counts POST deliveries; see the module docstring.

    ``delay`` (seconds) is slept *after* a delivery was recorded and before the
    response is sent: the effect happened but the client may not learn it
    (use it to provoke timeouts / unknown outcomes). ``fail_next(n, status)``
    makes the next ``n`` POSTs fail *without* recording a delivery.
    """

    handler = _Handler
    server_class = _Server
    thread_name = "delivery-server"

    dedupe: bool = False
    log_path: Path | str | None = None
    host: str = "127.0.0.1"
    port: int = 0
    delay: float = 0.0
    deliveries: list[dict[str, Any]] = field(default_factory=list, init=False)
    replays: list[dict[str, Any]] = field(default_factory=list, init=False)
    refusals: list[dict[str, Any]] = field(default_factory=list, init=False)
    peak_in_flight: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._first_response: dict[str, bytes] = {}
        self._fail_queue: list[tuple[int, dict[str, str], bool]] = []
        self._slow_queue: list[float] = []
        self._holds = 0  # POSTs still to hold (hold_next)
        self._released = threading.Event()  # what the POSTs held now wait for
        self._posts = 0  # POSTs being handled now
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._log: Any = None
        self._active = 0

    # -- lifecycle (ServedLocally) -----------------------------------------
    def _log_lock(self) -> Any:
        return self._lock

    # -- queries -----------------------------------------------------------
    def count(self, key: str | None = None, *, path: str | None = None) -> int:
        """Number of recorded deliveries, optionally for one Idempotency-Key / path."""
        with self._lock:
            return sum(1 for d in self.deliveries if _matches(d, key, path))

    def lookup(self, key: str) -> dict[str, Any]:
        """Was a delivery with Idempotency-Key ``key`` received? (``GET /deliveries?key=``)"""
        with self._lock:
            found = [d for d in self.deliveries if d["idempotency_key"] == key]
        return {
            "key": key,
            "applied": bool(found),
            "deliveries": len(found),
            "first": found[0] if found else None,
        }

    def count_replays(self, key: str | None = None) -> int:
        with self._lock:
            return sum(1 for d in self.replays if _matches(d, key, None))

    def wait_for(self, count: int, *, key: str | None = None, timeout: float = 10.0) -> int:
        """Block until at least ``count`` deliveries (for ``key``) were recorded."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                n = sum(1 for d in self.deliveries if _matches(d, key, None))
                if n >= count:
                    return n
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"{n} deliveries after {timeout}s, expected {count}")
                self._changed.wait(remaining)

    def settle(self, timeout: float = 30.0) -> None:
        """Return once every request that reached the server before this call is handled.

        A client killed mid-request may have left its bytes in the socket: the server
        still reads and records them, a moment after the client died. The listening
        socket accepts connections in order, so once this call's own request is
        accepted every earlier one is counted in flight; it then waits for those.
        """
        req = urllib.request.Request(self.url + "/settle", headers={"X-Timeout": str(timeout)})
        with urllib.request.urlopen(req, timeout=timeout + 10) as resp:
            if resp.status != 200:  # pragma: no cover - urlopen raises on 503
                raise TimeoutError(f"requests still in flight after {timeout}s")

    def _enter(self) -> None:
        with self._changed:
            self._active += 1

    def _leave(self) -> None:
        with self._changed:
            self._active -= 1
            self._changed.notify_all()

    def _wait_idle(self, timeout: float) -> bool:
        """In a handler: wait until this request is the only one in flight."""
        with self._changed:
            return self._changed.wait_for(lambda: self._active <= 1, timeout)

    def fail_next(
        self,
        n: int = 1,
        status: int = 503,
        *,
        retry_after: float | str | None = None,
        delivered: bool = False,
        location: str | None = None,
    ) -> None:
        """The next ``n`` POSTs get ``status`` (with ``Retry-After: retry_after``), and are
        kept in ``refusals``, not recorded as deliveries. ``delivered``: recorded as
        deliveries first, then answered ``status``, as a proxy answers after its upstream
        received the request (Envoy's 503 on an upstream reset). ``location``: a
        ``Location`` header, e.g. ``fail_next(1, 303, delivered=True, location=...)``: the
        POST applied and the client sent on (post/redirect/get)."""
        headers = {} if retry_after is None else {"Retry-After": str(retry_after)}
        if location is not None:
            headers["Location"] = location
        with self._lock:
            self._fail_queue.extend([(status, headers, delivered)] * n)

    def slow_next(self, n: int, seconds: float) -> None:
        """The next ``n`` POSTs are recorded at once and answered ``seconds`` later."""
        with self._lock:
            self._slow_queue.extend([seconds] * n)

    def hold_next(self, n: int) -> None:
        """The next ``n`` POSTs are recorded at once (``"held": True``) and answered only
        at ``release_held()``."""
        with self._lock:
            self._holds += n

    def release_held(self) -> None:
        """Answer every POST held now (a later ``hold_next`` holds its own again)."""
        with self._lock:
            self._holds = 0
            self._released.set()
            self._released = threading.Event()

    def stop(self) -> None:
        self.release_held()  # no held answer outlives the server
        super().stop()

    def reset(self) -> None:
        self.release_held()
        with self._lock:
            self.deliveries.clear()
            self.replays.clear()
            self.refusals.clear()
            self._first_response.clear()
            self._fail_queue.clear()
            self._slow_queue.clear()
            self.peak_in_flight = 0

    # -- request handling (called from server threads) ---------------------
    def _handle_post(
        self, path: str, body: Any, key: str | None
    ) -> tuple[int, bytes, dict[str, str]]:
        with self._changed:
            self._posts += 1
            self.peak_in_flight = max(self.peak_in_flight, self._posts)
        try:
            return self._answer_post(path, body, key)
        finally:
            with self._changed:
                self._posts -= 1

    def _answer_post(
        self, path: str, body: Any, key: str | None
    ) -> tuple[int, bytes, dict[str, str]]:
        with self._changed:
            delivered_then_failed = bool(self._fail_queue) and self._fail_queue[0][2]
            if self._fail_queue and not delivered_then_failed:
                status, headers, _ = self._fail_queue.pop(0)
                self.refusals.append(
                    {"path": path, "idempotency_key": key, "status": status, "time": time.time()}
                )
                self._changed.notify_all()
                return status, json.dumps({"error": "injected failure"}).encode(), headers
            slowed = bool(self._slow_queue)  # one of the POSTs slow_next asked for
            slow = self._slow_queue.pop(0) if slowed else self.delay
            hold = None
            if self._holds:  # one of the POSTs hold_next asked for
                self._holds -= 1
                hold = self._released
            record: dict[str, Any] = {
                "path": path,
                "body": body,
                "idempotency_key": key,
                "time": time.time(),
            }
            if slowed:
                record["slowed"] = True
            if hold is not None:
                record["held"] = True
            if self.dedupe and key is not None and key in self._first_response:
                record["kind"] = "replay"
                record["seq"] = len(self.replays) + 1
                self._write_log(record)
                self.replays.append(record)
                self._changed.notify_all()
                return 200, self._first_response[key], {REPLAYED_HEADER: "true"}
            record["kind"] = "delivery"
            record["seq"] = len(self.deliveries) + 1
            self._write_log(record)
            self.deliveries.append(record)
            response = json.dumps(
                {"ok": True, "delivery": record["seq"], "path": path, "idempotency_key": key}
            ).encode()
            if key is not None:
                self._first_response.setdefault(key, response)
            if delivered_then_failed:  # applied upstream; the answer lost on the way back
                status, headers, _ = self._fail_queue.pop(0)
                self.refusals.append({**record, "status": status})
                self._changed.notify_all()
                return status, json.dumps({"error": "upstream reset"}).encode(), headers
            self._changed.notify_all()
        if hold is not None:
            hold.wait(HOLD_LIMIT)
        if slow:
            time.sleep(slow)
        return 200, response, {}


def _matches(record: dict[str, Any], key: str | None, path: str | None) -> bool:
    return (key is None or record["idempotency_key"] == key) and (
        path is None or record["path"] == path
    )


def read_log(path: Path | str, *, kind: str = "delivery") -> list[dict[str, Any]]:
    """Records of ``kind`` ("delivery" or "replay") from a server's log file."""
    out: list[dict[str, Any]] = []
    p = Path(path)
    if not p.exists():
        return out
    for line in p.read_text(encoding="utf-8").splitlines():
        if line.strip():
            rec = json.loads(line)
            if rec.get("kind") == kind:
                out.append(rec)
    return out


@dataclass(frozen=True)
class Response:
    status: int
    headers: dict[str, str]
    body: Any

    @property
    def replayed(self) -> bool:
        return self.headers.get(REPLAYED_HEADER.lower()) == "true"


def post_json(
    url: str, payload: Any, idempotency_key: str | None = None, timeout: float = 5
) -> Response:
    """POST ``payload`` as JSON; HTTP error statuses are returned, not raised."""
    data = json.dumps(payload).encode()
    headers = {"Content-Type": "application/json"}
    if idempotency_key is not None:
        headers[IDEMPOTENCY_HEADER] = idempotency_key
    req = urllib.request.Request(url, data=data, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, hdrs, raw = resp.status, resp.headers, resp.read()
    except urllib.error.HTTPError as err:
        status, hdrs, raw = err.code, err.headers, err.read()
        err.close()
    body = json.loads(raw) if raw else None
    return Response(status, {k.lower(): v for k, v in hdrs.items()}, body)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--dedupe", action="store_true")
    parser.add_argument("--log", type=Path, default=None, help="JSON-lines delivery log")
    parser.add_argument("--delay", type=float, default=0.0)
    args = parser.parse_args(argv)

    server = DeliveryServer(
        dedupe=args.dedupe, log_path=args.log, host=args.host, port=args.port, delay=args.delay
    )
    return serve_until_signalled(server, lambda served: served.url)


if __name__ == "__main__":
    sys.exit(main())
