"""Tracing under attack: what a run's spans may carry, what an exporter may do to a run,
which spans a run makes, and what tracing leaves behind when it is off."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import kernelext as kx
import kernelext.otel as otel


@kx.effect
def atk_ping(x: int) -> dict[str, int]:
    return {"x": x}


@kx.agent(name="atk_steps")
def atk_steps(run: Any, items: list[int]) -> int:
    for i in run.steps(items, key=lambda i: f"item-{i}"):
        atk_ping(i)
    return len(items)


@kx.agent(name="atk_dies_in_step")
def atk_dies_in_step(run: Any) -> None:
    with run.step("doomed"):
        atk_ping(1)
        raise RuntimeError("the step fails")


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    otel.enable(provider)
    yield exporter
    otel.disable()


class _RaisingOnEnd(SpanProcessor):
    def on_end(self, span: ReadableSpan) -> None:
        raise RuntimeError("a span processor that raises")


def test_flush_without_enable_queues_nothing_and_returns_at_once() -> None:
    otel.disable()
    queued = otel._queue.qsize()
    assert otel.flush(timeout=0.5) is True
    assert otel._queue.qsize() == queued


def test_disable_shuts_down_the_provider_enable_made_and_its_thread(store: Any) -> None:
    before = set(threading.enumerate())
    otel.enable(endpoint="http://127.0.0.1:9/v1/traces")  # nobody listens: exports fail
    assert atk_steps.start([1], run_id="atk-own-provider").wait() == "completed"
    otel.disable()
    left = [t for t in set(threading.enumerate()) - before if t.is_alive()]
    assert not [t.name for t in left if "kernelext-writer" not in t.name]


def test_a_raising_span_processor_is_counted_and_survives_disable(store: Any) -> None:
    provider = TracerProvider()
    provider.add_span_processor(_RaisingOnEnd())
    before = otel.failures()
    otel.enable(provider)
    assert atk_steps.start([1, 2], run_id="atk-raising").wait() == "completed"
    assert otel.flush(10)
    otel.disable()  # must not raise, and must not forget what was counted
    assert otel.failures() > before
    assert otel._state == {}


def test_a_run_that_fails_inside_a_step_ends_the_step_span(
    store: Any, spans: InMemorySpanExporter
) -> None:
    assert atk_dies_in_step.start(run_id="atk-dies").wait() == "failed"
    assert otel.flush(10)
    names = {s.name: s for s in spans.get_finished_spans()}
    assert "kernelext.step doomed" in names
    step = names["kernelext.step doomed"]
    run = names["kernelext.run atk-dies"]
    assert step.parent is not None and step.parent.span_id == run.context.span_id
    assert step.attributes is not None and step.attributes["kernelext.status"] == "failed"
    assert not otel._state["steps"]


class _Hanging(SpanExporter):
    def __init__(self) -> None:
        self.release = threading.Event()

    def export(self, spans: Any) -> SpanExportResult:
        self.release.wait()
        return SpanExportResult.SUCCESS


def test_disable_returns_while_an_exporter_hangs_and_tracing_starts_again(store: Any) -> None:
    hanging = _Hanging()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(hanging))
    otel.enable(provider)
    assert atk_steps.start([1, 2], run_id="atk-hanging").wait() == "completed"
    disabled = threading.Event()
    threading.Thread(target=lambda: (otel.disable(), disabled.set()), daemon=True).start()
    try:
        assert disabled.wait(120), "disable() waited on an exporter that never returns"
        exporter = InMemorySpanExporter()
        fresh = TracerProvider()
        fresh.add_span_processor(SimpleSpanProcessor(exporter))
        otel.enable(fresh)
        assert atk_steps.start([3], run_id="atk-after-hang").wait() == "completed"
        assert otel.flush(10)
        names = {s.name for s in exporter.get_finished_spans()}
        assert "kernelext.run atk-after-hang" in names
        assert "kernelext.run atk-hanging" not in names
    finally:
        hanging.release.set()
        otel.disable()


@kx.agent(name="atk_gated")
def atk_gated(run: Any, gate: Any) -> None:
    with run.step("before"):
        atk_ping(1)
    gate.wait(30)
    with run.step("after"):
        atk_ping(2)


@pytest.mark.xfail(
    strict=True,
    reason="spans a provider drops after its shutdown are not seen by kernelext.otel "
    "(the SDK only logs them), so failures() does not count them",
)
def test_spans_lost_to_a_provider_shut_down_mid_run_are_counted(store: Any) -> None:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    otel.enable(provider)
    try:
        gate = threading.Event()
        handle = atk_gated.start(gate, run_id="atk-shut-down")
        assert otel.flush(10)
        provider.shutdown()
        before = otel.failures()
        gate.set()
        assert handle.wait() == "completed"
        otel.flush(10)
        assert otel.failures() > before
    finally:
        otel.disable()
