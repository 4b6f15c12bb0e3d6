"""The test double for external systems must itself count correctly."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from support.http_server import DeliveryServer, post_json, read_log
from support.live import wait_until
from support.llm_server import LLMServer

SERVER_SCRIPT = Path(__file__).parents[1] / "support" / "http_server.py"


def test_counts_every_post(delivery_server: DeliveryServer) -> None:
    url = delivery_server.url
    assert url.startswith("http://127.0.0.1:")
    r1 = post_json(url + "/email", {"to": "a"}, idempotency_key="k1")
    r2 = post_json(url + "/email", {"to": "b"}, idempotency_key="k2")
    r3 = post_json(url + "/sms", {"to": "c"})
    assert [r.status for r in (r1, r2, r3)] == [200, 200, 200]
    assert r1.body["delivery"] == 1 and not r1.replayed
    assert delivery_server.count() == 3
    assert delivery_server.count("k1") == 1
    assert delivery_server.count(path="/email") == 2
    first = delivery_server.deliveries[0]
    assert first["path"] == "/email"
    assert first["body"] == {"to": "a"}
    assert first["idempotency_key"] == "k1"
    assert isinstance(first["time"], float)

    with urllib.request.urlopen(url + "/deliveries", timeout=5) as resp:
        assert json.loads(resp.read()) == delivery_server.deliveries


def test_without_dedupe_repeats_are_new_deliveries(delivery_server: DeliveryServer) -> None:
    for _ in range(3):
        r = post_json(delivery_server.url + "/pay", {"amount": 5}, idempotency_key="same")
        assert r.status == 200 and not r.replayed
    assert delivery_server.count("same") == 3
    assert delivery_server.count_replays() == 0


@pytest.mark.parametrize("delivery_server", [{"dedupe": True}], indirect=True)
def test_dedupe_replays_first_response(delivery_server: DeliveryServer) -> None:
    url = delivery_server.url + "/pay"
    first = post_json(url, {"amount": 5}, idempotency_key="same")
    again = post_json(url, {"amount": 5}, idempotency_key="same")
    other = post_json(url, {"amount": 7}, idempotency_key="other")
    keyless = [post_json(url, {"amount": 1}) for _ in range(2)]
    assert again.status == 200 and again.replayed
    assert again.body == first.body
    assert not first.replayed and not other.replayed
    assert all(r.status == 200 and not r.replayed for r in keyless)
    assert delivery_server.count("same") == 1
    assert delivery_server.count() == 4  # same, other, 2 keyless
    assert delivery_server.count_replays("same") == 1
    with urllib.request.urlopen(delivery_server.url + "/replays", timeout=5) as resp:
        assert len(json.loads(resp.read())) == 1


@pytest.mark.parametrize("delivery_server", [{"dedupe": True}], indirect=True)
def test_log_file_has_one_fsynced_line_per_request(
    delivery_server: DeliveryServer, tmp_path: Path
) -> None:
    log = tmp_path / "deliveries.jsonl"
    post_json(delivery_server.url + "/a", {"n": 1}, idempotency_key="x")
    post_json(delivery_server.url + "/a", {"n": 1}, idempotency_key="x")
    post_json(delivery_server.url + "/b", {"n": 2})
    # Readable before stop(): each line is flushed and fsync'ed when written.
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [rec["kind"] for rec in lines] == ["delivery", "replay", "delivery"]
    assert read_log(log) == delivery_server.deliveries
    assert len(read_log(log, kind="replay")) == 1


def test_injected_failures_and_bad_json_are_not_deliveries(
    delivery_server: DeliveryServer,
) -> None:
    delivery_server.fail_next(2, status=503)
    assert post_json(delivery_server.url + "/x", {}, idempotency_key="k").status == 503
    assert post_json(delivery_server.url + "/x", {}, idempotency_key="k").status == 503
    req = urllib.request.Request(delivery_server.url + "/x", data=b"{not json", method="POST")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=5)
    assert err.value.code == 400
    err.value.close()
    assert delivery_server.count() == 0
    assert post_json(delivery_server.url + "/x", {}, idempotency_key="k").status == 200
    assert delivery_server.count("k") == 1


def test_delay_records_before_responding(delivery_server: DeliveryServer) -> None:
    delivery_server.delay = 2.0
    with pytest.raises(TimeoutError):
        post_json(delivery_server.url + "/slow", {}, idempotency_key="s", timeout=0.3)
    # The effect happened even though the client never saw the answer.
    assert delivery_server.wait_for(1, key="s", timeout=5) == 1


def test_concurrent_posts_are_all_counted(delivery_server: DeliveryServer) -> None:
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(
            pool.map(
                lambda i: post_json(delivery_server.url + "/c", {"i": i}, idempotency_key=str(i)),
                range(40),
            )
        )
    assert all(r.status == 200 for r in results)
    assert delivery_server.count() == 40
    assert sorted(d["seq"] for d in delivery_server.deliveries) == list(range(1, 41))


def test_stop_is_idempotent_and_context_manager(tmp_path: Path) -> None:
    server = DeliveryServer()
    with server:
        post_json(server.url, {"hello": 1})
        assert server.count() == 1
    server.stop()
    with pytest.raises(RuntimeError):
        _ = server.url


@contextlib.contextmanager
def standalone_server(*args: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """The delivery server run as its own script (``python http_server.py ARGS``).

    Yields the process and the URL it printed on start; a process the test left running
    is killed afterwards.
    """
    proc = subprocess.Popen(
        [sys.executable, str(SERVER_SCRIPT), *args], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        yield proc, proc.stdout.readline().strip()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()


def test_standalone_subprocess_log_survives_sigkill(tmp_path: Path) -> None:
    log = tmp_path / "sub.jsonl"
    with standalone_server("--dedupe", "--log", str(log)) as (proc, url):
        assert url.startswith("http://127.0.0.1:")
        assert post_json(url + "/e", {"a": 1}, idempotency_key="k").status == 200
        assert post_json(url + "/e", {"a": 1}, idempotency_key="k").replayed
        assert post_json(url + "/e", {"a": 2}, idempotency_key="k2").status == 200
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    assert [d["idempotency_key"] for d in read_log(log)] == ["k", "k2"]
    assert len(read_log(log, kind="replay")) == 1


def test_standalone_subprocess_stops_on_sigterm(tmp_path: Path) -> None:
    with standalone_server() as (proc, url):
        assert post_json(url + "/x", {}).status == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0


def test_refusals_carry_retry_after_and_are_kept_with_their_time(
    delivery_server: DeliveryServer,
) -> None:
    delivery_server.fail_next(2, status=429, retry_after=1)
    first = post_json(delivery_server.url + "/r", {}, idempotency_key="k")
    second = post_json(delivery_server.url + "/r", {}, idempotency_key="k")
    third = post_json(delivery_server.url + "/r", {}, idempotency_key="k")
    assert (first.status, second.status, third.status) == (429, 429, 200)
    assert first.headers["retry-after"] == "1"
    assert "retry-after" not in third.headers
    assert [r["status"] for r in delivery_server.refusals] == [429, 429]
    assert all(isinstance(r["time"], float) for r in delivery_server.refusals)
    assert delivery_server.count("k") == 1


def test_slow_next_records_at_once_and_answers_late(delivery_server: DeliveryServer) -> None:
    delivery_server.slow_next(1, 2.0)
    with pytest.raises(TimeoutError):
        post_json(delivery_server.url + "/slow", {}, idempotency_key="s", timeout=0.3)
    assert delivery_server.count("s") == 1  # applied, though the client never heard
    # Answered at once while the slow one waits (a busy machine may take seconds to).
    assert post_json(delivery_server.url + "/fast", {}, timeout=30).status == 200


def test_hold_next_records_at_once_and_answers_only_when_released(
    delivery_server: DeliveryServer,
) -> None:
    delivery_server.hold_next(2)
    url = delivery_server.url
    with ThreadPoolExecutor(max_workers=2) as pool:
        held = [pool.submit(post_json, f"{url}/held", {"i": i}) for i in range(2)]
        delivery_server.wait_for(2)  # both recorded while their clients wait
        assert post_json(f"{url}/free", {}).status == 200  # the third is not held
        assert not any(call.done() for call in held)
        delivery_server.release_held()
        assert [call.result(timeout=30).status for call in held] == [200, 200]
    assert [d.get("held", False) for d in delivery_server.deliveries] == [True, True, False]


def test_the_model_logs_a_held_turn_at_once_and_answers_it_only_when_released() -> None:
    def ask(url: str, tool_results: int) -> int:
        messages = [{"role": "user", "content": "refund A-1001"}]
        messages += [{"role": "tool", "content": "done"}] * tool_results
        return post_json(f"{url}/chat/completions", {"messages": messages}, timeout=30).status

    with LLMServer(hold_turns=(1,)) as llm, ThreadPoolExecutor(max_workers=1) as pool:
        assert ask(llm.base_url, 0) == 200  # turn 0 is not held
        held = pool.submit(ask, llm.base_url, 1)
        wait_until(lambda: any(turn == 1 for _, turn in llm.per_turn()), "turn 1 logged")
        assert not held.done()
        llm.release_held()
        assert held.result(timeout=30) == 200
    assert sorted(turn for _, turn in llm.per_turn()) == [0, 1]


def test_peak_in_flight_counts_posts_handled_at_once(delivery_server: DeliveryServer) -> None:
    delivery_server.delay = 1.0  # the four overlap while they wait
    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(lambda i: post_json(delivery_server.url + "/p", {"i": i}), range(4)))
    assert delivery_server.peak_in_flight == 4
    delivery_server.reset()
    post_json(delivery_server.url + "/p", {})
    assert delivery_server.peak_in_flight == 1
