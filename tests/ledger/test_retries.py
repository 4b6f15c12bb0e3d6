"""``@kx.effect(retries=N, retry_on=...)``: a call made again only when that cannot repeat it
(never sent, a target that dedupes on ``idempotency_key``, or a failure the effect declares
safe), waits that honour ``Retry-After`` and that a stop interrupts, each attempt counted.

Against a real local HTTP server (127.0.0.1) that refuses, delays or dedupes requests as
told and records when each arrived.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import httpx
import openai
import pytest
from support.http_server import DeliveryServer
from support.ledger_checks import assert_refused_before_any_call
from support.live import name, wait_until

import kernelext as kx
from kernelext._core.ledger.retries import ANSWERED, NO_ANSWER, NOT_SENT, Failure, backoff, classify
from kernelext._store import Store

WAIT = 60.0

pytestmark = pytest.mark.both_backends


def post(server: DeliveryServer, item: Any, key: str | None, timeout: float = 30) -> int:
    """POST ``item``; an error status raises ``urllib.error.HTTPError`` (with its headers)."""
    body = json.dumps({"item": item}).encode()
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Idempotency-Key"] = key
    request = urllib.request.Request(server.url + "/r", data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return int(json.loads(response.read())["delivery"])
    except urllib.error.HTTPError as error:
        error.close()  # its status and headers stay readable
        raise


def attempts_of(run_id: str) -> list[tuple[str, int | None]]:
    """``kx.sql("select attempts from effects")``, for one run."""
    rows = kx.sql("select status, attempts from effects where run_id = ?", [run_id])
    pairs = zip(rows["status"], rows["attempts"], strict=True)
    return [(str(s), None if a != a else int(a)) for s, a in pairs]  # NaN: NULL


def test_retry_after_from_the_server_is_honoured_and_each_attempt_counted(
    store: Store, delivery_server: DeliveryServer
) -> None:
    delivery_server.fail_next(2, status=429, retry_after=1)

    @kx.effect(name="charge", retries=3)
    def charge(item: int, *, idempotency_key: str | None = None) -> int:
        return post(delivery_server, item, idempotency_key)

    @kx.agent(name=name("patient"))
    def patient(run: kx.Run) -> int:
        return charge(7)

    handle = patient.start()
    assert handle.wait(WAIT) == "completed", handle.error
    assert handle.result == 1
    assert delivery_server.count() == 1
    refused = [r["time"] for r in delivery_server.refusals]
    delivered = delivery_server.deliveries[0]["time"]
    assert len(refused) == 2
    assert refused[1] - refused[0] >= 1.0  # each retry waited what the server asked
    assert delivered - refused[1] >= 1.0
    keys = {r["idempotency_key"] for r in delivery_server.refusals}
    assert keys == {delivery_server.deliveries[0]["idempotency_key"]}  # one key, every attempt
    assert attempts_of(handle.run_id) == [("applied", 3)]


def test_a_failure_that_is_not_transient_is_not_retried(
    store: Store, delivery_server: DeliveryServer
) -> None:
    delivery_server.fail_next(1, status=400)

    @kx.effect(name="strict", retries=5)
    def strict(item: int, *, idempotency_key: str | None = None) -> int:
        return post(delivery_server, item, idempotency_key)

    @kx.agent(name=name("strict"))
    def agent(run: kx.Run) -> int:
        return strict(1)

    handle = agent.start()
    assert handle.wait(WAIT) == "failed"
    assert isinstance(handle.error, urllib.error.HTTPError)
    assert len(delivery_server.refusals) == 1
    assert attempts_of(handle.run_id) == [("failed", 1)]


def test_a_503_after_the_target_received_the_request_is_unknown_not_sent_again(
    store: Store, delivery_server: DeliveryServer
) -> None:
    # A proxy (Envoy, Istio) answers 503 on an upstream reset: its upstream has the request.
    delivery_server.fail_next(3, status=503, retry_after=0, delivered=True)

    @kx.effect(name="charge_card", retries=3)
    def charge_card(item: int) -> int:
        return post(delivery_server, item, None)

    @kx.agent(name=name("charger"))
    def agent(run: kx.Run) -> int:
        return charge_card(1)

    handle = agent.start()
    assert handle.wait(WAIT) == "needs_decision", handle.error
    assert delivery_server.count() == 1  # charged once, never again by a retry
    assert attempts_of(handle.run_id) == [("unknown", 1)]
    (unknown,) = kx.reconcile(handle.run_id)
    assert "HTTP 503 came back" in unknown.row["error"]
    assert "@kx.effect(retries=3, retry_on=(503,))" in unknown.row["error"]


@pytest.mark.parametrize("delivery_server", [{"dedupe": True}], indirect=True)
def test_a_503_after_delivery_is_retried_under_the_same_key_for_a_target_that_dedupes(
    store: Store, delivery_server: DeliveryServer
) -> None:
    delivery_server.fail_next(1, status=503, retry_after=0, delivered=True)

    @kx.effect(name="charge_keyed", retries=3)
    def charge_keyed(item: int, *, idempotency_key: str | None = None) -> int:
        return post(delivery_server, item, idempotency_key)

    @kx.agent(name=name("keyed"))
    def agent(run: kx.Run) -> int:
        return charge_keyed(1)

    handle = agent.start()
    assert handle.wait(WAIT) == "completed", handle.error
    assert handle.result == 1  # the first delivery's answer, replayed under its key
    assert delivery_server.count() == 1 and delivery_server.count_replays() == 1
    (replay,) = delivery_server.replays
    assert replay["idempotency_key"] == delivery_server.deliveries[0]["idempotency_key"]
    assert attempts_of(handle.run_id) == [("applied", 2)]


def test_retry_on_declares_a_status_safe_and_retries_that_run_out_leave_the_call_failed(
    store: Store, delivery_server: DeliveryServer
) -> None:
    delivery_server.fail_next(5, status=503, retry_after=0)

    @kx.effect(name="flaky", retries=2, retry_on=(503,))
    def flaky(item: int) -> int:
        return post(delivery_server, item, None)

    @kx.agent(name=name("flaky"))
    def agent(run: kx.Run) -> int:
        return flaky(1)

    handle = agent.start()
    assert handle.wait(WAIT) == "failed"
    assert len(delivery_server.refusals) == 3  # declared safe: retried without a key
    assert delivery_server.count() == 0
    assert attempts_of(handle.run_id) == [("failed", 3)]
    events = [e["kind"] for e in store.events(handle.run_id)]
    assert "effect_reached" not in events  # declared: answered before the target acted


def test_a_request_never_sent_is_retried_for_any_tool_until_the_server_is_up(
    store: Store, delivery_server: DeliveryServer, closed_url: str
) -> None:
    targets = ["http://kernelext-test.invalid", closed_url, delivery_server.url]

    @kx.effect(name="notify", retries=3)
    def notify(item: int) -> int:
        url = targets.pop(0)  # a name that does not resolve, a closed port, the server
        request = urllib.request.Request(url + "/r", data=b'{"item": 1}', method="POST")
        with urllib.request.urlopen(request, timeout=30) as response:
            return int(json.loads(response.read())["delivery"])

    @kx.agent(name=name("notify"))
    def agent(run: kx.Run) -> int:
        return notify(1)

    handle = agent.start()
    assert handle.wait(WAIT) == "completed", handle.error
    assert delivery_server.count() == 1
    assert attempts_of(handle.run_id) == [("applied", 3)]


@pytest.mark.parametrize("delivery_server", [{"dedupe": True}], indirect=True)
def test_a_timeout_after_send_is_retried_with_an_idempotency_key_as_a_replay(
    store: Store, delivery_server: DeliveryServer
) -> None:
    delivery_server.slow_next(1, 3.0)  # applied at once, answered too late
    # Only the first attempt gives up before its answer; the replay is answered at once by
    # the server, so it waits as long as a busy machine may take to answer it.
    timeouts = [0.5]

    @kx.effect(name="book", retries=2)
    def book(item: int, *, idempotency_key: str | None = None) -> int:
        timeout = timeouts.pop(0) if timeouts else 30
        return post(delivery_server, item, idempotency_key, timeout=timeout)

    @kx.agent(name=name("book"))
    def agent(run: kx.Run) -> int:
        return book(1)

    handle = agent.start()
    assert handle.wait(WAIT) == "completed", handle.error
    assert handle.result == 1  # the first delivery's answer, replayed by the server
    assert delivery_server.count() == 1
    assert delivery_server.count_replays() == 1
    assert attempts_of(handle.run_id) == [("applied", 2)]


def test_a_timeout_after_send_without_an_idempotency_key_is_unknown_not_retried(
    store: Store, delivery_server: DeliveryServer
) -> None:
    delivery_server.slow_next(1, 3.0)

    @kx.effect(name="blind", retries=3)
    def blind(item: int) -> int:
        return post(delivery_server, item, None, timeout=0.5)

    @kx.agent(name=name("blind"))
    def agent(run: kx.Run) -> int:
        return blind(1)

    handle = agent.start()
    assert handle.wait(WAIT) == "needs_decision", handle.error
    wait_until(lambda: delivery_server.count() == 1, "the one delivery")
    assert attempts_of(handle.run_id) == [("unknown", 1)]
    (unknown,) = kx.reconcile(handle.run_id)
    assert "may have been applied" in (unknown.row["error"] or "")
    unknown.mark_applied(result=1)
    again = kx.resume(handle.run_id)
    assert again.wait(WAIT) == "completed", again.error
    assert delivery_server.count() == 1


def test_a_server_error_is_retried_only_for_a_tool_that_takes_an_idempotency_key(
    store: Store, delivery_server: DeliveryServer
) -> None:
    @kx.effect(name="keyed", retries=2)
    def keyed(item: int, *, idempotency_key: str | None = None) -> int:
        return post(delivery_server, item, idempotency_key)

    @kx.effect(name="keyless", retries=2)
    def keyless(item: int) -> int:
        return post(delivery_server, item, None)

    @kx.agent(name=name("fivexx"))
    def agent(run: kx.Run, tool: str) -> int:
        return (keyed if tool == "keyed" else keyless)(1)

    delivery_server.fail_next(1, status=502, retry_after=0)
    first = agent.start("keyed")
    assert first.wait(WAIT) == "completed", first.error
    assert attempts_of(first.run_id) == [("applied", 2)]

    delivery_server.fail_next(1, status=500)
    second = agent.start("keyless")
    assert second.wait(WAIT) == "failed"  # answered: failed, as without retries
    assert attempts_of(second.run_id) == [("failed", 1)]
    assert delivery_server.count() == 1


def test_a_stop_during_the_wait_lands_at_once_and_the_resume_makes_the_call(
    store: Store, delivery_server: DeliveryServer
) -> None:
    delivery_server.fail_next(1, status=503, retry_after=120)  # a long wait, cut by the stop

    @kx.effect(name="later", retries=3)
    def later(item: int, *, idempotency_key: str | None = None) -> int:
        return post(delivery_server, item, idempotency_key)

    @kx.agent(name=name("later"))
    def agent(run: kx.Run) -> int:
        return later(1)

    handle = agent.start()
    wait_until(lambda: len(delivery_server.refusals) == 1, "the first attempt refused")
    handle.stop()
    assert handle.wait(WAIT) == "suspended", handle.error
    assert delivery_server.count() == 0
    # The last attempt failed and nothing is in flight: not pending, not unknown.
    assert attempts_of(handle.run_id) == [("not_applied", 1)]
    (row,) = store.load_effects(handle.run_id).values()
    assert "stop came while it waited" in row["error"]

    again = kx.resume(handle.run_id)
    assert again.wait(WAIT) == "completed", again.error
    assert delivery_server.count() == 1
    assert len(delivery_server.refusals) == 1  # no attempt was made during the wait
    assert attempts_of(handle.run_id) == [("applied", 2)]  # across the resume


def test_each_retry_waits_for_a_rate_slot_of_its_limit(
    store: Store, delivery_server: DeliveryServer, limit_stamps: list[float]
) -> None:
    limit = name("paced")
    kx.limit(limit, rate="2/s")
    delivery_server.fail_next(3, status=503, retry_after=0)

    @kx.effect(name="paced", retries=3, limit=limit)
    def paced(item: int, *, idempotency_key: str | None = None) -> int:
        return post(delivery_server, item, idempotency_key)

    @kx.agent(name=name("paced"))
    def agent(run: kx.Run) -> int:
        return paced(1)

    handle = agent.start()
    assert handle.wait(WAIT) == "completed", handle.error
    assert len(delivery_server.refusals) == 3 and delivery_server.count() == 1
    # Each attempt is stamped as it is sent (the limit's own clock): two fit in a window,
    # the third waits a whole window after the first and the fourth after the second. The
    # server asks for no wait (Retry-After: 0), so only the limit can make these gaps.
    assert len(limit_stamps) == 4, limit_stamps
    assert limit_stamps[2] - limit_stamps[0] >= 1.0 - 1e-9, limit_stamps
    assert limit_stamps[3] - limit_stamps[1] >= 1.0 - 1e-9, limit_stamps
    assert attempts_of(handle.run_id) == [("applied", 4)]


@pytest.mark.parametrize(
    ("retries", "error", "text"),
    [
        (-1, ValueError, "-1 is not a number of retries"),
        ("3", TypeError, "whole number of retries"),
        (True, TypeError, "whole number of retries"),
        (1.5, TypeError, "whole number of retries"),
    ],
)
def test_bad_retries_are_refused_before_anything_is_recorded(
    store: Store, delivery_server: DeliveryServer, retries: Any, error: type, text: str
) -> None:
    @kx.agent(name=name("refused"))
    def refused(run: kx.Run) -> int:
        @kx.effect(retries=retries)
        def send(item: int) -> int:
            return post(delivery_server, item, None)

        return send(1)

    assert_refused_before_any_call(store, delivery_server, refused.start(), error, text)


@pytest.mark.parametrize(
    ("options", "error", "text"),
    [
        ({"retries": 3, "retry_on": "503"}, TypeError, "'503' is neither"),
        ({"retries": 3, "retry_on": (99,)}, TypeError, "whole numbers 100-599"),
        ({"retries": 3, "retry_on": (True,)}, TypeError, "True is neither"),
        ({"retries": 3, "retry_on": (ValueError, "x")}, TypeError, "'x' is neither"),
        ({"retry_on": (503,)}, ValueError, "retries=0 makes the call once"),
    ],
)
def test_bad_retry_on_is_refused_saying_what_to_give(
    options: dict[str, Any], error: type, text: str
) -> None:
    with pytest.raises(error, match=r"retry_on=") as caught:
        kx.effect(**options)(lambda item: item)
    assert text in str(caught.value)
    declared = kx.effect(retries=2, retry_on=(503, ConnectionResetError))(lambda item: item)
    assert declared.retry_on == (503, ConnectionResetError)


# -- which failures are transient: real exceptions of the clients ---------------------------
def test_http_statuses_are_classified_with_the_wait_the_server_asked_for(
    delivery_server: DeliveryServer,
) -> None:
    delivery_server.fail_next(1, status=429, retry_after=2)
    with pytest.raises(urllib.error.HTTPError) as caught:
        post(delivery_server, 1, None)
    found = classify(caught.value)
    assert found == Failure(ANSWERED, 2.0, 429)

    request = httpx.Request("POST", delivery_server.url)
    for status in (503, 500, 502, 504, 404):  # every status is an answer: the request left
        response = httpx.Response(status, headers={"Retry-After": "0.5"}, request=request)
        error = httpx.HTTPStatusError("status", request=request, response=response)
        assert classify(error) == Failure(ANSWERED, 0.5, status)

    response = httpx.Response(429, headers={"retry-after-ms": "1500"}, request=request)
    limited = openai.RateLimitError("slow down", response=response, body=None)
    assert classify(limited) == Failure(ANSWERED, 1.5, 429)
    dated = httpx.Response(503, headers={"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"})
    found = classify(httpx.HTTPStatusError("s", request=request, response=dated))
    assert found is not None and found.retry_after == 0.0  # a date in the past: at once
    assert classify(ValueError("bad input")) is None


def test_transport_failures_tell_a_request_never_sent_from_one_without_an_answer(
    delivery_server: DeliveryServer, closed_url: str
) -> None:
    with pytest.raises(urllib.error.URLError) as refused:
        urllib.request.urlopen(closed_url, timeout=5)
    assert classify(refused.value) == Failure(NOT_SENT)
    with pytest.raises(httpx.ConnectError) as connect:
        httpx.post(closed_url, timeout=5)
    assert classify(connect.value) == Failure(NOT_SENT)
    with pytest.raises(urllib.error.URLError) as unresolved:
        urllib.request.urlopen("http://kernelext-test.invalid/", timeout=5)
    assert classify(unresolved.value) == Failure(NOT_SENT)  # a DNS failure: never sent

    delivery_server.slow_next(2, 2.0)
    with pytest.raises(TimeoutError) as timed_out:
        post(delivery_server, 1, None, timeout=0.3)
    found = classify(timed_out.value)
    assert found is not None and found.kind == NO_ANSWER
    with pytest.raises(httpx.ReadTimeout) as read_timeout:
        httpx.post(delivery_server.url + "/r", json={}, timeout=0.3)
    found = classify(read_timeout.value)
    assert found is not None and found.kind == NO_ANSWER
    wrapped = openai.APITimeoutError(request=httpx.Request("POST", delivery_server.url))
    found = classify(wrapped)
    assert found is not None and found.kind == NO_ANSWER
    assert classify(ConnectionResetError()) == classify(wrapped)


def test_backoff_grows_with_jitter_and_never_waits_past_a_long_retry_after() -> None:
    from kernelext._core.ledger.retries import MAX_DELAY

    plain = Failure(NOT_SENT)
    waits = [backoff(n, plain) for n in range(1, 12)]
    assert all(w is not None for w in waits)
    assert 0.25 <= (waits[0] or 0) <= 0.5
    assert 2.0 <= (waits[3] or 0) <= 4.0
    assert all((w or 0) <= MAX_DELAY for w in waits)
    asked = backoff(1, Failure(NOT_SENT, retry_after=3.0))
    assert asked is not None and 3.0 <= asked <= 3.3
    assert backoff(1, Failure(NOT_SENT, retry_after=3600.0)) is None
