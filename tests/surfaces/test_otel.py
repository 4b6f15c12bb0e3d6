"""Runs as OpenTelemetry spans (``kernelext.otel``), checked with the SDK's in-memory
exporter."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
from support.clients import closed_after
from support.fresh_python import printed_by_fresh_python
from support.live import name

import kernelext as kx
from kernelext import otel
from kernelext._store import Store

WAIT = 60.0


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    otel.enable(tracer_provider=provider)
    try:
        yield exporter
    finally:
        otel.disable()
        provider.shutdown()


def finished_spans(exporter: InMemorySpanExporter) -> Any:
    assert otel.flush()
    return exporter.get_finished_spans()


def _by_name(exporter: InMemorySpanExporter) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for span in finished_spans(exporter):
        out.setdefault(span.name, []).append(span)
    return out


def test_a_stopped_and_resumed_run_is_one_trace_of_steps_and_effects(
    store: Store, spans: InMemorySpanExporter
) -> None:
    at_two, go = threading.Event(), threading.Event()

    @kx.effect
    def send(i: int, *, idempotency_key: str | None = None) -> int:
        return i * 10

    @kx.agent(name=name("traced"))
    def traced(run: kx.Run) -> None:
        for i in run.steps(range(4)):
            send(i)
            if i == 1:
                at_two.set()
                go.wait(WAIT)

    handle = traced.start(run_id="traced-1")
    assert at_two.wait(WAIT)
    handle.stop(source="button")
    go.set()
    assert handle.wait(WAIT) == "suspended"
    assert kx.resume("traced-1").wait(WAIT) == "completed"

    named = _by_name(spans)
    runs = named["kernelext.run traced-1"]
    assert len(runs) == 2  # the first run span (suspended) and the resumed one
    assert {r.attributes["kernelext.status"] for r in runs} == {"suspended", "completed"}
    assert len({r.context.trace_id for r in runs}) == 1  # one trace, derived from the run id
    first = next(r for r in runs if r.attributes["kernelext.status"] == "suspended")
    second = next(r for r in runs if r.attributes["kernelext.status"] == "completed")
    first_events = [e.name for e in first.events]
    assert "kernelext.stop_requested" in first_events
    assert first_events[-1] == "kernelext.suspended"
    assert any(e.name == "kernelext.resumed" for e in second.events)

    steps = [s for key, ss in named.items() if key.startswith("kernelext.step ") for s in ss]
    assert sorted(s.attributes["kernelext.step_key"] for s in steps) == ["0", "1", "2", "3"]
    run_of = {r.context.span_id: r for r in runs}
    for step in steps:
        assert step.parent is not None and step.parent.span_id in run_of
        assert step.attributes["kernelext.status"] == "completed"
    step_ids = {s.context.span_id: s for s in steps}
    effects = [s for key, ss in named.items() if key.startswith("kernelext.effect ") for s in ss]
    assert len(effects) == 4  # each effect once: nothing re-performed on resume
    for effect in effects:
        assert effect.attributes["kernelext.status"] == "applied"
        assert effect.attributes["kernelext.run_id"] == "traced-1"
        parent = step_ids[effect.parent.span_id]
        assert parent.attributes["kernelext.step_key"] == effect.attributes["kernelext.step_key"]
        assert effect.attributes["kernelext.effect_key"]


def test_a_secret_in_an_effect_argument_never_reaches_a_span(
    store: Store, spans: InMemorySpanExporter
) -> None:
    secret = "sk-live-4f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c"
    kx.secrets.register(secret)

    @kx.effect
    def call(token: str, *, idempotency_key: str | None = None) -> str:
        raise RuntimeError(f"refused token {token}")

    @kx.agent(name=name("secretive"))
    def secretive(run: kx.Run) -> None:
        with run.step(f"use {secret}"):
            call(secret)

    try:
        assert secretive.start(run_id="secretive-1").wait(WAIT) == "failed"
    finally:
        kx.secrets.forget(secret)
    finished = finished_spans(spans)
    assert finished
    for span in finished:
        texts = [span.name, str(span.status.description), *map(str, span.attributes.values())]
        for event in span.events:
            texts += [event.name, *map(str, (event.attributes or {}).values())]
        assert all(secret not in t for t in texts), span.name


def test_without_enable_nothing_is_imported_from_opentelemetry(tmp_path: Any) -> None:
    code = (
        "import sys, kernelext as kx\n"
        f"kx.open_store({str(tmp_path / 's.duckdb')!r})\n"
        "@kx.agent(name='plain')\n"
        "def plain(run):\n"
        "    for i in run.steps(range(2)): pass\n"
        "assert plain.start(run_id='plain-1').wait(60) == 'completed'\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n"
    )
    assert printed_by_fresh_python(code).strip() == "[]"


def test_an_approval_decision_is_in_the_run_trace(
    store: Store, spans: InMemorySpanExporter
) -> None:
    @kx.effect(needs_approval=True)
    def pay(to: str, amount: int, *, idempotency_key: str | None = None) -> str:
        return f"paid {to}"

    @kx.agent(name=name("payer"))
    def payer(run: kx.Run) -> None:
        with run.step("bob"):
            pay("bob", 500)

    assert payer.start(run_id="payer-1").wait(WAIT) == "suspended"
    [request] = kx.approvals("payer-1")
    resumed = request.approve(note="checked")
    assert resumed is not None and resumed.wait(WAIT) == "completed"
    finished = finished_spans(spans)
    trace_ids = {s.context.trace_id for s in finished}
    assert len(trace_ids) == 1
    names = {s.name for s in finished} | {e.name for s in finished for e in s.events}
    assert {"kernelext.approval_requested", "kernelext.approval_decided"} <= names
    [effect] = [s for s in finished if s.name.startswith("kernelext.effect ")]
    assert effect.attributes["kernelext.status"] == "applied"


def test_batch_items_are_step_spans(store: Store, spans: InMemorySpanExporter) -> None:
    def double(i: int) -> int:
        return i * 2

    @kx.agent(name=name("batch"))
    def batch(run: kx.Run) -> None:
        run.state["out"] = run.map(double, [1, 2, 3], key=str, concurrency=2)

    assert batch.start(run_id="batch-1").wait(WAIT) == "completed"
    steps = [s for s in finished_spans(spans) if s.name.startswith("kernelext.step ")]
    assert {
        s.attributes["kernelext.step_key"]: s.attributes["kernelext.status"] for s in steps
    } == {
        "1": "completed",
        "2": "completed",
        "3": "completed",
    }


def test_a_model_call_carries_the_gen_ai_attributes(
    store: Store, spans: InMemorySpanExporter, tmp_path: Any
) -> None:
    from openai import OpenAI
    from support.llm_server import LLMServer

    with LLMServer(log_path=tmp_path / "llm.jsonl") as server:
        plain = closed_after(OpenAI(base_url=server.base_url, api_key="sk-x", max_retries=0))
        client = kx.openai(plain)

        @kx.agent(name=name("chatty"))
        def chatty(run: kx.Run) -> None:
            client.chat.completions.create(
                model="scripted", messages=[{"role": "user", "content": "hello there"}]
            )

        assert chatty.start(run_id="chatty-1").wait(WAIT) == "completed"
    [call] = [s for s in finished_spans(spans) if "gen_ai.request.model" in s.attributes]
    assert call.attributes["gen_ai.request.model"] == "scripted"
    assert call.attributes["kernelext.status"] == "applied"
    assert call.attributes["gen_ai.usage.input_tokens"] > 0
    assert call.attributes["gen_ai.usage.output_tokens"] >= 0


class _Collector:
    """An OTLP/HTTP collector on 127.0.0.1: keeps every ``POST /v1/traces`` body."""

    def __init__(self) -> None:
        import http.server

        bodies = self.bodies = []  # type: list[bytes]

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                size = int(self.headers.get("Content-Length", 0))
                if self.path == "/v1/traces":
                    bodies.append(self.rfile.read(size))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"

    def spans(self) -> list[Any]:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        out = []
        for body in self.bodies:
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            for resource in request.resource_spans:
                for scope in resource.scope_spans:
                    out.extend(scope.spans)
        return out

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _simple_run(run_id: str) -> str:
    @kx.effect
    def touch(i: int, *, idempotency_key: str | None = None) -> int:
        return i

    @kx.agent(name=name("otlp"))
    def otlp(run: kx.Run) -> None:
        for i in run.steps(range(2)):
            touch(i)

    return otlp.start(run_id=run_id).wait(WAIT)


def test_spans_arrive_at_an_otlp_http_collector(store: Store) -> None:
    collector = _Collector()
    provider = otel.enable(endpoint=collector.endpoint)
    try:
        assert _simple_run("otlp-1") == "completed"
        assert otel.flush()
    finally:
        otel.disable()
        provider.shutdown()
        collector.close()
    names = [s.name for s in collector.spans()]
    assert "kernelext.run otlp-1" in names
    assert sum(n.startswith("kernelext.step ") for n in names) == 2
    assert sum(n.startswith("kernelext.effect ") for n in names) == 2


def test_a_collector_that_is_down_neither_fails_the_run_nor_goes_unnoticed(store: Store) -> None:
    collector = _Collector()
    endpoint = collector.endpoint
    collector.close()  # nobody listens there now
    before = otel.failures()
    provider = otel.enable(endpoint=endpoint)
    try:
        assert _simple_run("otlp-down") == "completed"
        otel.flush()
    finally:
        otel.disable()
        provider.shutdown()
    assert otel.failures() > before
    assert kx.sql("SELECT status FROM runs WHERE id = 'otlp-down'")["status"].tolist() == [
        "completed"
    ]
