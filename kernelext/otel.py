"""Runs as OpenTelemetry traces (the ``kernelext[otel]`` extra).

``kernelext.otel.enable()`` subscribes to the store's one write door (every hot-path
record and every run transition): a run is a span, each step (and batch item) a child span,
each effect a child span of its step with its status; stops, suspensions, resumes and
decisions are span events. Attributes carry the run id, step key, tool, effect key and
status under a ``kernelext.`` prefix; every string is scrubbed by kernelext's secret
scrubbing first. The run's trace id is derived from the run id, so a resumed run's spans
join the same trace. Nothing is imported from ``opentelemetry`` until ``enable`` is called.
"""

from __future__ import annotations

import hashlib
import json
import queue
import threading
from typing import Any

from ._core.encoding.secrets import scrub_text
from ._store import observe
from .status import FINAL, WAITING, EffectStatus, StepStatus
from .status import Status as RunStatus

__all__ = ["disable", "enable", "failures", "flush"]

_lock = threading.Lock()
_state: dict[str, Any] = {}
_queue: queue.SimpleQueue[tuple[str, dict[str, Any]]] = queue.SimpleQueue()
_exports_failed = [0]
_DISABLE_WAIT = 5.0  # seconds disable() gives each of: the spans in hand, the thread, the lock
_spans_failed = [0]  # kept across disable(): a count the caller reads after it


def failures() -> int:
    """How many span writes failed (each swallowed: tracing never breaks a run)."""
    return observe.failures() + _spans_failed[0] + _exports_failed[0]


def enable(tracer_provider: Any = None, *, endpoint: str | None = None) -> Any:
    """Trace every run of this process to ``tracer_provider`` (default: the global one,
    ``opentelemetry.trace.get_tracer_provider()``), or, with ``endpoint``
    (``http://host:4318/v1/traces``), to an OTLP/HTTP collector through a provider of its
    own (returned, so it can be shut down). Calling it again replaces the provider.

    Spans are made on a thread of their own from a queue: the run never waits for them, and
    a failed export is counted (``failures()``), never raised."""
    from opentelemetry import trace

    disable()
    own = _otlp_provider(endpoint) if endpoint is not None else None
    provider = own or tracer_provider or trace.get_tracer_provider()
    global _queue, _lock
    # A queue and lock of its own: a thread an exporter still holds keeps the old ones.
    _queue, _lock = queue.SimpleQueue(), threading.Lock()
    with _lock:
        _state.update(tracer=provider.get_tracer("kernelext"), runs={}, steps={}, effects={})
        _state.update(provider=provider, own=own, queue=_queue)
        _state["thread"] = threading.Thread(
            target=_drain, args=(_queue, _lock), name="kernelext-otel", daemon=True
        )
        _state["thread"].start()
    observe.subscribe(_observe)
    return provider


def flush(timeout: float = 30.0) -> bool:
    """Wait until every record seen so far is a span handed to the provider, then flush the
    provider; True if done within ``timeout`` seconds (at once when tracing is off)."""
    thread = _state.get("thread")
    if thread is None or not thread.is_alive():
        return True
    done = threading.Event()
    _queue.put(("__flush__", {"done": done}))
    if not done.wait(timeout):
        return False
    provider = _state.get("provider")
    flush_provider = getattr(provider, "force_flush", None)
    return bool(flush_provider(int(timeout * 1000))) if flush_provider else True


def disable() -> None:
    """Stop tracing (open spans are ended; the provider ``enable(endpoint=...)`` made is
    shut down, its export thread with it)."""
    observe.unsubscribe(_observe)
    thread = _state.get("thread")
    if thread is not None:
        flush(_DISABLE_WAIT)
        _queue.put(("__stop__", {}))
        thread.join(_DISABLE_WAIT)
    # An exporter that hangs holds the thread (and the lock) it was called on: give up on
    # it after a bounded wait; the thread ends when the exporter returns.
    locked = _lock.acquire(timeout=_DISABLE_WAIT)
    try:
        if locked:
            for table in ("effects", "steps", "runs"):
                for span in _state.get(table, {}).values():
                    _end(span)
        elif thread is not None:
            _spans_failed[0] += 1
        own = _state.get("own")
        _state.clear()
    finally:
        if locked:
            _lock.release()
    if own is not None:
        _shut_down(own)


def _end(span: Any) -> None:
    try:
        span.end()
    except Exception:
        _spans_failed[0] += 1


def _shut_down(provider: Any) -> None:
    """Shut down a provider of our own: its exporter first, so a retry waiting on an absent
    collector gives up at once instead of holding the caller."""
    try:
        for processor in provider._active_span_processor._span_processors:
            exporter = getattr(processor, "span_exporter", None) or getattr(
                getattr(processor, "_batch_processor", None), "_exporter", None
            )
            if exporter is not None:
                exporter.shutdown()
        provider.shutdown()
    except Exception:
        _spans_failed[0] += 1


class _Counted:
    """An exporter whose failures are counted instead of only logged."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def export(self, spans: Any) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        try:
            result = self.inner.export(spans)
        except Exception:
            result = SpanExportResult.FAILURE
        if result != SpanExportResult.SUCCESS:
            _exports_failed[0] += 1
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return bool(self.inner.force_flush(timeout_millis))


def _otlp_provider(endpoint: str) -> Any:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": "kernelext"}))
    exporter = _Counted(OTLPSpanExporter(endpoint=endpoint, timeout=5))
    provider.add_span_processor(BatchSpanProcessor(exporter))  # type: ignore[arg-type]
    return provider


def _drain(q: queue.SimpleQueue[tuple[str, dict[str, Any]]], lock: threading.Lock) -> None:
    while True:
        kind, data = q.get()
        if kind == "__stop__":
            return
        if kind == "__flush__":
            data["done"].set()
            continue
        with lock:
            if _state.get("queue") is not q:  # disabled, or another enable() since
                continue
            try:
                _translate(kind, data)
            except Exception:
                _spans_failed[0] += 1


def _clean(value: Any) -> Any:
    if isinstance(value, (bool, int, float)):
        return value
    return scrub_text(str(value))


def _attrs(**values: Any) -> dict[str, Any]:
    return {f"kernelext.{k}": _clean(v) for k, v in values.items() if v is not None}


def _context(run_id: str) -> Any:
    from opentelemetry import trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    digest = hashlib.sha256(run_id.encode()).digest()
    trace_id = int.from_bytes(digest[:16], "big") or 1
    span_id = int.from_bytes(digest[16:24], "big") or 1
    parent = SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(1))
    return trace.set_span_in_context(NonRecordingSpan(parent))


def _run_span(run_id: str) -> Any:
    runs = _state["runs"]
    span = runs.get(run_id)
    if span is None:
        span = _state["tracer"].start_span(
            f"kernelext.run {run_id}", context=_context(run_id), attributes=_attrs(run_id=run_id)
        )
        runs[run_id] = span
    return span


def _in(span: Any) -> Any:
    from opentelemetry import trace

    return trace.set_span_in_context(span)


def _observe(kind: str, data: dict[str, Any]) -> None:
    _queue.put((kind, dict(data)))


def _translate(kind: str, d: dict[str, Any]) -> None:
    from opentelemetry.trace import Status, StatusCode

    tracer, steps, effects = _state["tracer"], _state["steps"], _state["effects"]
    run_id = d.get("run_id")
    if kind == "step_begin":
        run = _run_span(d["run_id"])
        steps[d["id"]] = tracer.start_span(
            f"kernelext.step {_clean(d['key'])}",
            context=_in(run),
            attributes=_attrs(run_id=run_id, step_key=d["key"], step_ordinal=d.get("ordinal")),
        )
    elif kind in ("step_complete", "item_complete"):
        span = steps.pop(d["step_id"], None)
        if span is not None:
            span.set_attribute("kernelext.status", StepStatus.COMPLETED.value)
            span.end()
    elif kind == "intent":
        parent = _step_for(d) or _run_span(d["run_id"])
        effects[d["key"]] = tracer.start_span(
            f"kernelext.effect {_clean(d['tool'])}",
            context=_in(parent),
            attributes=_attrs(
                run_id=run_id,
                step_key=d["step_key"],
                tool=d["tool"],
                effect_key=d["key"],
                call_ordinal=d["call_ordinal"],
                status=EffectStatus.PENDING.value,
            ),
        )
        _model_request(effects[d["key"]], d.get("args"))
    elif kind == "outcome":
        span = effects.pop(d["key"], None)
        if span is not None:
            span.set_attribute("kernelext.status", _clean(d["status"]))
            _model_response(span, d.get("result"))
            if d["status"] == EffectStatus.FAILED:
                failed = EffectStatus.FAILED.value
                span.set_status(Status(StatusCode.ERROR, _clean(d.get("error") or failed)))
            span.end()
    elif kind == "stop_request":
        _state.setdefault("stops", set()).add(d["run_id"])
        _run_span(d["run_id"]).add_event(
            "kernelext.stop_requested", _attrs(source=d.get("source"), who=d.get("who"))
        )
    elif kind == "run_end":
        _transition({**d, "to_status": d["status"]})
    elif kind == "event" and d.get("run_id"):
        _decision(d)
    elif kind == "transition":
        # The journal's fold repeats moves the records above already told: a transition
        # adds to an open run span, and only a move to running opens one.
        if d["kind"] == "stop_requested" and d["run_id"] in _state.get("stops", ()):
            return
        if d["run_id"] in _state["runs"] or d["to_status"] == RunStatus.RUNNING:
            _transition(d)


def _step_for(d: dict[str, Any]) -> Any:
    for span in _state["steps"].values():
        attrs = getattr(span, "attributes", None) or {}
        if attrs.get("kernelext.run_id") == d["run_id"] and attrs.get(
            "kernelext.step_key"
        ) == _clean(d["step_key"]):
            return span
    return None


_ENDS = {s.value for s in FINAL | WAITING}


def _transition(d: dict[str, Any]) -> None:
    from opentelemetry.trace import Status, StatusCode

    run = _run_span(d["run_id"])
    to = d["to_status"]
    run.add_event(
        f"kernelext.{d['kind']}",
        _attrs(
            from_status=d.get("from_status"),
            status=to,
            source=d.get("source"),
            reason=d.get("reason"),
        ),
    )
    if to in _ENDS:
        _end_children(d["run_id"], to)
        run.set_attribute("kernelext.status", to)
        if to == RunStatus.FAILED:
            failed = RunStatus.FAILED.value
            run.set_status(Status(StatusCode.ERROR, _clean(d.get("reason") or failed)))
        del _state["runs"][d["run_id"]]  # first: a raising processor leaves no ended span
        run.end()


def _end_children(run_id: str, status: str) -> None:
    """A run that ends inside a step (failed, suspended, ...) ends the spans it left open:
    its steps take the run's status, its effects keep the one they had (pending)."""
    mine = _clean(run_id)
    for table in ("effects", "steps"):
        spans = _state[table]
        for key in [k for k, s in spans.items() if _run_of(s) == mine]:
            span = spans.pop(key)
            if table == "steps":
                span.set_attribute("kernelext.status", status)
            _end(span)


def _run_of(span: Any) -> Any:
    return (getattr(span, "attributes", None) or {}).get("kernelext.run_id")


def _decision(d: dict[str, Any]) -> None:
    """An audit event (approval asked or decided, reconciliation, revalidation, ...): an
    event of the open run span, else a short span of its own in the run's trace."""
    attrs = _attrs(run_id=d["run_id"], source=d.get("source"), who=d.get("who"))
    attrs.update(_attrs(reason=d.get("reason")))
    name = f"kernelext.{_clean(d['kind'])}"
    run = _state["runs"].get(d["run_id"])
    if run is not None:
        run.add_event(name, attrs)
    else:
        _state["tracer"].start_span(name, context=_context(d["run_id"]), attributes=attrs).end()


def _json(value: Any) -> Any:
    if isinstance(value, (bytes, str)):
        try:
            return json.loads(value)
        except ValueError:
            return None
    return value


def _model_request(span: Any, args: Any) -> None:
    """OpenTelemetry GenAI attributes of a model call (from its scrubbed recorded request)."""
    request = _json(args)
    if isinstance(request, dict):
        request = request.get("kwargs", request)
    if isinstance(request, dict) and isinstance(request.get("model"), str):
        span.set_attribute("gen_ai.operation.name", "chat")
        span.set_attribute("gen_ai.request.model", _clean(request["model"]))


def _model_response(span: Any, result: Any) -> None:
    response = _json(result)
    if not isinstance(response, dict):
        return
    usage = response.get("usage")
    if isinstance(response.get("model"), str):
        span.set_attribute("gen_ai.response.model", _clean(response["model"]))
    if isinstance(usage, dict):
        for ours, theirs in (
            ("gen_ai.usage.input_tokens", ("prompt_tokens", "input_tokens")),
            ("gen_ai.usage.output_tokens", ("completion_tokens", "output_tokens")),
        ):
            for name in theirs:
                if isinstance(usage.get(name), int):
                    span.set_attribute(ours, usage[name])
                    break
