"""A scripted OpenAI-compatible model server on 127.0.0.1: the model whose requests are counted.

``POST /v1/chat/completions``, ``POST /v1/responses`` and Anthropic's ``POST /v1/messages``
(``llm_anthropic.py``; ``Anthropic(base_url=server.url)``) answer from a *script*: a list of
replies, each either ``{"tool_calls": [{"name": ..., "arguments": {...}}, ...]}`` or
``{"content": "..."}``. Which reply a request gets depends only on the conversation it
sends (the server keeps no session), so a request asked again gets the same answer:

* the *conversation* is named by a hash of its first user message;
* its *turn* is the number of tool results it already holds (chat: ``role == "tool"``
  messages; responses: ``function_call_output`` items, plus those of the response named by
  ``previous_response_id``). Reply ``i`` answers the turn that follows the tool calls of
  replies ``0..i-1``: a reply with two tool calls moves the next turn on by two.

``fail_next(n, status)`` makes the next ``n`` requests fail (logged, not answered from the
script). ``hold_stream`` (a ``threading.Event``) holds every stream after its first event
until the event is set (at most 30 s; ``held`` records whether it was set in time), so a
test can tell that the client saw a chunk before the stream ended. A request for one of the
``hold_turns`` is logged, then answered only at ``release_held()`` (or when the server
stops): the model is "thinking" for as long as the test needs, whatever the machine's speed.

``"stream": true`` answers with server-sent events (chat: ``chat.completion.chunk``
objects, then ``[DONE]``; a usage chunk last when ``stream_options.include_usage``;
responses: ``response.created``, text deltas, ``response.output_item.done`` and
``response.completed``). Token usage is counted in words, so it is the same every time.

Every request is counted per (conversation, turn) and, when ``log_path`` is given,
appended to a JSON-lines file and fsync'ed *before* the reply is sent, so that another
process can count requests even after the client was SIGKILLed half-way. A log line holds
the endpoint, conversation, turn, ``stream``, the ``Idempotency-Key`` header and whether
an ``Authorization`` header came (never its value).

Stdlib only, so that it also runs standalone (the notebooks start it this way)::

    python tests/support/llm_server.py [--port N] [--log FILE] [--script FILE.json]
                                       [--delay S] [--chunk-delay S] [--until-stdin-closes]

prints its base URL (``http://127.0.0.1:PORT/v1``, what ``OpenAI(base_url=...)`` takes) on
the first line of stdout, then serves until SIGTERM/SIGINT. ``GET /v1/models``,
``GET /requests`` (the log) and ``GET /health`` are there too.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["DEMO_SCRIPT", "LLMServer", "read_requests"]

try:
    from support.llm_anthropic import messages
    from support.local_server import (
        JSONHandler,
        LocalHTTPServer,
        ServedLocally,
        serve_until_signalled,
    )
except ImportError:  # run standalone: python tests/support/llm_server.py
    from llm_anthropic import messages  # type: ignore[no-redef]
    from local_server import (  # type: ignore[no-redef]
        JSONHandler,
        LocalHTTPServer,
        ServedLocally,
        serve_until_signalled,
    )

HOLD_LIMIT = 300.0  # seconds a held request waits for release_held() at most (a failed test)
CREATED = 1_700_000_000  # a fixed timestamp: the same request gets the same bytes back

# A customer-support conversation: look the order up, refund it, write to the customer.
EMAIL = {"to": "ada@example.com", "subject": "Your refund", "body": "We refunded 25.00 EUR."}
DEMO_SCRIPT: list[dict[str, Any]] = [
    {"tool_calls": [{"name": "lookup_order", "arguments": {"order_id": "A-1001"}}]},
    {"tool_calls": [{"name": "refund", "arguments": {"order_id": "A-1001", "amount": 25.0}}]},
    {"tool_calls": [{"name": "send_email", "arguments": EMAIL}]},
    {"content": "Order A-1001 was refunded (25.00 EUR) and the customer was told by email."},
]


class _Handler(JSONHandler):
    server: _Server
    # Headers and body go out in two sends; without this, Nagle's algorithm holds the
    # second one for the client's delayed ACK (about 40 ms a request).
    disable_nagle_algorithm = True

    def _send(self, status: int, payload: Any) -> None:
        self.send_body(status, json.dumps(payload).encode())

    def do_GET(self) -> None:
        owner = self.server.owner
        path = self.path.split("?", 1)[0]
        if path == "/v1/models":
            model = {"id": "scripted", "object": "model", "created": CREATED, "owned_by": "test"}
            self._send(200, {"object": "list", "data": [model]})
        elif path == "/requests":
            with owner.lock:
                self._send(200, list(owner.requests))
        elif path == "/health":
            self._send(200, "ok")
        else:
            self._send(404, {"error": {"message": f"no route {path}", "type": "not_found"}})

    def do_POST(self) -> None:
        raw = self.read_body()
        if raw is None:
            return
        try:
            body = json.loads(raw)
        except ValueError:
            self._send(400, {"error": {"message": "body is not JSON", "type": "bad_request"}})
            return
        path = self.path.split("?", 1)[0]
        owner = self.server.owner
        failure = owner.take_failure()
        if failure is not None:
            owner.note_failure(path, failure, self.headers)
            self._send(failure, {"error": {"message": "injected failure", "type": "server"}})
            return
        if path == "/v1/chat/completions":
            events, reply = owner.chat(body, self.headers)
        elif path == "/v1/responses":
            events, reply = owner.respond(body, self.headers)
        elif path == "/v1/messages":
            events, reply = messages(owner, body, self.headers)
        else:
            self._send(404, {"error": {"message": f"no route {path}", "type": "not_found"}})
            return
        if owner.delay:
            time.sleep(owner.delay)
        if not body.get("stream"):
            self._send(200, reply)
            return
        self.send_response(200)  # server-sent events until the connection closes
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        for n, (name, data) in enumerate(events):
            head = f"event: {name}\n" if name else ""
            self.wfile.write(f"{head}data: {data}\n\n".encode())
            self.wfile.flush()
            if n == 0 and owner.hold_stream is not None:
                held = owner.hold_stream.wait(30)
                with owner.lock:
                    owner.held.append(held)
            if owner.chunk_delay:
                time.sleep(owner.chunk_delay)


class _Server(LocalHTTPServer):
    owner: LLMServer


@dataclass
class LLMServer(ServedLocally):
    """The scripted model server; see the module docstring.

    ``delay`` (seconds) is slept after a request was logged and before its reply is
    sent (a model thinking); ``chunk_delay`` between two streamed events.
    """

    handler = _Handler
    server_class = _Server

    script: list[dict[str, Any]] = field(default_factory=lambda: list(DEMO_SCRIPT))
    log_path: Path | str | None = None
    host: str = "127.0.0.1"
    port: int = 0
    delay: float = 0.0
    chunk_delay: float = 0.0
    hold_stream: threading.Event | None = None
    hold_turns: tuple[int, ...] = ()  # requests for these turns wait for release_held()
    requests: list[dict[str, Any]] = field(default_factory=list, init=False)
    held: list[bool] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        self.lock = threading.Lock()
        self._fail_queue: list[int] = []
        self._responses: dict[str, tuple[str, int]] = {}  # id -> (first message, results)
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._log: Any = None
        self._released = threading.Event()

    # -- lifecycle (ServedLocally) -----------------------------------------
    def _log_lock(self) -> Any:
        return self.lock

    def stop(self) -> None:
        self.release_held()  # no held answer outlives the server
        super().stop()

    @property
    def base_url(self) -> str:
        """What ``OpenAI(base_url=...)`` takes."""
        return self.url + "/v1"

    # -- queries -----------------------------------------------------------
    def per_turn(self, endpoint: str | None = None) -> Counter[tuple[str, int]]:
        """How many requests each (conversation, turn) got."""
        with self.lock:
            return Counter(
                (r["conversation"], r["turn"])
                for r in self.requests
                if "failed" not in r and (endpoint is None or r["endpoint"] == endpoint)
            )

    def count(self, key: str | None = None) -> int:
        """Number of requests, optionally of one ``Idempotency-Key``."""
        with self.lock:
            return sum(1 for r in self.requests if key is None or r["idempotency_key"] == key)

    def fail_next(self, n: int = 1, status: int = 500) -> None:
        """The next ``n`` requests get ``status`` (logged as ``failed``)."""
        with self.lock:
            self._fail_queue.extend([status] * n)

    def release_held(self) -> None:
        """Answer the requests held for ``hold_turns`` (and every later one at once)."""
        self._released.set()

    def take_failure(self) -> int | None:
        with self.lock:
            return self._fail_queue.pop(0) if self._fail_queue else None

    # -- the endpoints (server threads) ------------------------------------
    def chat(self, body: dict[str, Any], headers: Any) -> tuple[list[tuple[str, str]], Any]:
        messages = body.get("messages") or []
        first = next((m.get("content") for m in messages if m.get("role") == "user"), "")
        results = sum(1 for m in messages if m.get("role") == "tool")
        conversation, turn, reply = self._note("chat.completions", body, headers, first, results)
        ident, model = f"chatcmpl-{conversation}-{turn}", body.get("model") or "scripted"
        calls = [
            {"id": f"call_{conversation}_{turn + i}", "type": "function",
             "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])}}
            for i, c in enumerate(reply.get("tool_calls") or [])
        ]  # fmt: skip
        message = {"role": "assistant", "content": reply.get("content")}
        message.update({"tool_calls": calls} if calls else {})
        usage = _usage(body, reply, "prompt_tokens", "completion_tokens")
        head = {"id": ident, "object": "chat.completion", "created": CREATED, "model": model}
        finish = "tool_calls" if calls else "stop"
        choice = {"index": 0, "message": message, "finish_reason": finish}
        completion = {**head, "choices": [choice], "usage": usage}
        head["object"] = "chat.completion.chunk"
        deltas: list[tuple[dict[str, Any], str | None]] = [
            ({"role": "assistant", "content": ""}, None)
        ]
        deltas += [({"content": word}, None) for word in _words(reply.get("content") or "")]
        for i, call in enumerate(calls):
            named = {**call, "index": i, "function": {**call["function"], "arguments": ""}}
            arguments = {"index": i, "function": {"arguments": call["function"]["arguments"]}}
            deltas += [({"tool_calls": [named]}, None), ({"tool_calls": [arguments]}, None)]
        deltas.append(({}, finish))
        chunks = [
            {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": reason}]}
            for delta, reason in deltas
        ]
        if (body.get("stream_options") or {}).get("include_usage"):
            chunks.append({**head, "choices": [], "usage": usage})
        return [("", json.dumps(c)) for c in chunks] + [("", "[DONE]")], completion

    def respond(self, body: dict[str, Any], headers: Any) -> tuple[list[tuple[str, str]], Any]:
        items = body.get("input")
        items = [{"role": "user", "content": items}] if isinstance(items, str) else items or []
        first = next((_text(i.get("content")) for i in items if i.get("role") == "user"), "")
        results = sum(1 for i in items if i.get("type") == "function_call_output")
        previous = body.get("previous_response_id")
        if previous:  # a chained request carries only what is new: the rest is ours
            with self.lock:
                earlier, before = self._responses.get(previous, (first, 0))
            first, results = first or earlier, results + before
        conversation, turn, reply = self._note("responses", body, headers, first, results)
        ident, text = f"resp_{conversation}_{turn}", reply.get("content")
        output: list[dict[str, Any]] = [
            {"type": "function_call", "id": f"fc_{conversation}_{turn + i}",
             "call_id": f"call_{conversation}_{turn + i}", "name": c["name"],
             "arguments": json.dumps(c["arguments"]), "status": "completed"}
            for i, c in enumerate(reply.get("tool_calls") or [])
        ]  # fmt: skip
        if text is not None:
            part = {"type": "output_text", "text": text, "annotations": []}
            output.append(
                {"type": "message", "id": f"msg_{conversation}_{turn}", "role": "assistant",
                 "status": "completed", "content": [part]}
            )  # fmt: skip
        with self.lock:
            self._responses[ident] = (first, results)
        response = {
            "id": ident, "object": "response", "created_at": CREATED,
            "model": body.get("model") or "scripted", "status": "completed", "output": output,
            "parallel_tool_calls": True, "tool_choice": "auto", "tools": body.get("tools") or [],
            "usage": _usage(body, reply, "input_tokens", "output_tokens"),
        }  # fmt: skip
        pending = {**response, "status": "in_progress", "output": [], "usage": None}
        events = [{"type": "response.created", "response": pending}]
        for index, item in enumerate(output):
            events += [
                {"type": "response.output_text.delta", "item_id": item["id"], "logprobs": [],
                 "output_index": index, "content_index": 0, "delta": word}
                for word in (_words(text or "") if item["type"] == "message" else [])
            ]  # fmt: skip
            events.append(
                {"type": "response.output_item.done", "output_index": index, "item": item}
            )
        events.append({"type": "response.completed", "response": response})
        sse = [(e["type"], json.dumps({**e, "sequence_number": n})) for n, e in enumerate(events)]
        return sse, response

    def note_failure(self, path: str, status: int, headers: Any) -> None:
        record = {"endpoint": path, "failed": status, "conversation": None, "turn": None}
        record["idempotency_key"] = headers.get("Idempotency-Key")
        self._append(record)

    def _append(self, record: dict[str, Any]) -> None:
        with self.lock:
            record["seq"] = len(self.requests) + 1
            self._write_log(record)
            self.requests.append(record)

    def _note(
        self, endpoint: str, body: dict[str, Any], headers: Any, first: str, results: int
    ) -> tuple[str, int, dict[str, Any]]:
        """Log and count one request (fsync'ed before any reply); pick its reply (a turn of
        ``hold_turns``: once ``release_held()`` was called)."""
        conversation = hashlib.sha256(str(first).encode()).hexdigest()[:10]
        turn, reply = _reply_for(self.script, results)
        record = {
            "endpoint": endpoint,
            "conversation": conversation,
            "turn": turn,
            "stream": bool(body.get("stream")),
            "model": body.get("model"),
            "idempotency_key": headers.get("Idempotency-Key"),
            "authorized": headers.get("Authorization") is not None,
            "time": time.time(),
        }
        self._append(record)
        if turn in self.hold_turns:
            self._released.wait(HOLD_LIMIT)
        return conversation, turn, reply


def _reply_for(script: list[dict[str, Any]], results: int) -> tuple[int, dict[str, Any]]:
    """The turn (tool results so far) and the reply that answers it."""
    seen = 0
    for reply in script:
        if seen >= results:
            return seen, reply
        seen += len(reply.get("tool_calls") or [])
    return seen, script[-1]


def _words(text: str) -> list[str]:
    """``text`` cut into streamed pieces (each word with its following space)."""
    pieces = text.split(" ")
    return [p + " " for p in pieces[:-1]] + [pieces[-1]] if text else []


def _text(content: Any) -> str:
    if isinstance(content, list):  # responses input parts: [{"type": "input_text", ...}]
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content or "")


def _usage(body: dict[str, Any], reply: dict[str, Any], prompt: str, completion: str) -> Any:
    asked = len(json.dumps(body.get("messages") or body.get("input") or "").split())
    answered = len(json.dumps(reply).split())
    return {prompt: asked, completion: answered, "total_tokens": asked + answered}


def read_requests(path: Path | str) -> list[dict[str, Any]]:
    """The requests logged to ``path`` (torn last lines of a killed server skipped)."""
    out: list[dict[str, Any]] = []
    p = Path(path)
    if not p.exists():
        return out
    for line in p.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--log", type=Path, default=None, help="JSON-lines request log")
    parser.add_argument("--script", type=Path, default=None, help="JSON list of replies")
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--chunk-delay", type=float, default=0.0)
    parser.add_argument(
        "--until-stdin-closes", action="store_true", help="exit when the parent goes away"
    )
    args = parser.parse_args(argv)
    script = json.loads(args.script.read_text()) if args.script else list(DEMO_SCRIPT)

    server = LLMServer(
        script=script,
        log_path=args.log,
        host=args.host,
        port=args.port,
        delay=args.delay,
        chunk_delay=args.chunk_delay,
    )
    # until_stdin_closes: a notebook's kernel that dies takes its server along
    return serve_until_signalled(
        server, lambda served: served.base_url, until_stdin_closes=args.until_stdin_closes
    )


if __name__ == "__main__":
    sys.exit(main())
