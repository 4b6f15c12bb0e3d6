"""Runs as OpenTelemetry spans (``kernelext.otel``), checked with the SDK's in-memory
exporter."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
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


def _by_name(exporter: InMemorySpanExporter) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for span in exporter.get_finished_spans():
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
    finished = spans.get_finished_spans()
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
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "[]"
